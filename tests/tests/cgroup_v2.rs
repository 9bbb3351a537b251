//! cgroup v2 mechanics in a private cgroup2 mount (these hosts run a v1 hybrid; production hosts
//! run v2). The launch cgroup is created under the forced v2 root, the target is observed in it,
//! and it is killed and removed at the end. Ceilings whose controller the v2 tree lacks make an
//! enforced launch Unsupported instead of silently unlimited.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use chio_tests::{chio_bin, parse, privileged, shared_rootfs, CageRun, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

/// Run chio inside `unshare -m` with a fresh cgroup2 mount at `mnt`; prints the v2 root listing
/// after chio exits on a line starting with `LEFT:`.
fn run_v2(mnt: &std::path::Path, flags: &[&str], argv: &[&str]) -> (CageRun, String) {
    let probe = PathBuf::from(PROBE);
    let chio = chio_bin(&probe);
    let rootfs = shared_rootfs(&probe);
    let script = r#"set -e
mnt="$1"; sub="$2"; shift 2
mount -t cgroup2 none "$mnt"
mkdir -p "$mnt/$sub"
CHIO_CGROUP_V2_ROOT="$mnt/$sub" "$@" || code=$?
echo "LEFT: $(ls "$mnt/$sub" | grep '^chio-' || true)" >&2
rmdir "$mnt/$sub"
exit ${code:-0}
"#;
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(mnt)
        // The cgroup2 hierarchy is one per host: each run gets its own subtree.
        .arg(mnt.file_name().unwrap())
        .arg(&chio)
        .args(["cage", "run", "--json", "--rootfs", rootfs.to_str().unwrap()])
        .args(flags)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let left = stderr.lines().find_map(|l| l.strip_prefix("LEFT:")).unwrap_or("missing").trim().to_string();
    // Drop the LEFT line so the record is the last line again.
    let mut o = out;
    o.stderr = stderr.lines().filter(|l| !l.starts_with("LEFT:")).collect::<Vec<_>>().join("\n").into_bytes();
    (parse(o), left)
}

#[test]
fn v2_launch_cgroup_is_created_observed_and_removed() {
    if !privileged("cgroup_v2") {
        return;
    }
    let mnt = Scratch::new("cg2");
    let (run, left) = run_v2(&mnt.0, &["--memory", "none", "--pids", "none", "--cpus", "none"], &["/probe", "euid"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(run.record["cgroup"]["version"], "v2");
    let path = run.record["cgroup"]["paths"][0].as_str().unwrap().to_string();
    let name = path.rsplit('/').next().unwrap();
    let lines = run.record["observed"]["cgroup"].as_str().unwrap();
    assert!(
        lines.lines().any(|l| l.starts_with("0::")
            && l.ends_with(&format!("/{}/{name}", mnt.0.file_name().unwrap().to_str().unwrap()))),
        "{lines}"
    );
    assert_eq!(left, "", "launch cgroup left behind in the v2 tree");
}

#[test]
fn v2_without_the_memory_controller_is_unsupported_when_a_ceiling_is_asked() {
    if !privileged("cgroup_v2_missing") {
        return;
    }
    let available = std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers").unwrap_or_default();
    if available.split_whitespace().any(|c| c == "memory") {
        chio_tests::skip("cgroup_v2_missing", "this host's v2 tree has the memory controller");
        return;
    }
    let mnt = Scratch::new("cg2-missing");
    let (run, left) = run_v2(&mnt.0, &["--memory", "64M"], &["/probe", "euid"]);
    assert_eq!(run.state(), "Unsupported", "{}", run.stderr);
    assert_eq!(run.record["failure"]["code"], "cgroup_controller_missing");
    assert!(run.stdout.is_empty(), "the target ran");
    assert_eq!(left, "");
    // Control: shadow mode runs it and says the ceiling was not applied.
    let (run, _) = run_v2(&mnt.0, &["--memory", "64M", "--mode", "shadow"], &["/probe", "euid"]);
    assert_eq!(run.state(), "NotConfined", "{}", run.stderr);
    assert!(run.stdout.starts_with("REFUSED: euid is 65534"));
}
