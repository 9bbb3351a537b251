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

/// Run `chio cage run` on a cgroup v2 hierarchy as a service manager's delegation leaves it:
/// in a mount namespace of its own `/sys/fs/cgroup` is a cgroup2 mount, and chio starts in the
/// cgroup `sub` (or `sub/inner` with `inner`), marked delegated as systemd marks it (`mark`:
/// `trusted.delegate`), its `cgroup.procs` given to nobody with `foreign`, its leaf `supervisor`
/// made already (a daemon restarted in its unit) with `leaf`. Returns the run, the
/// directories left under `sub` once chio is gone, and (`foreign`) whether nobody could pull a
/// root process out of a cgroup below `sub` ("1"; "missing" without `foreign`).
fn run_delegated(sub: &str, setup: &[&str], argv: &[&str]) -> (CageRun, String, String) {
    let probe = PathBuf::from(PROBE);
    let (chio, rootfs) = (chio_bin(&probe), shared_rootfs(&probe));
    let script = r#"set -e
sub="$1"; setup="$2"; shift 2
mount -t cgroup2 none /sys/fs/cgroup
D=/sys/fs/cgroup/$sub
mkdir "$D" "$D/inner"
case "$setup" in *leaf*) mkdir "$D/supervisor";; esac
case "$setup" in *mark*) python3 -c 'import os, sys; os.setxattr(sys.argv[1], "trusted.delegate", b"1")' "$D";; esac
case "$setup" in *foreign*)
  chown 65534 "$D/cgroup.procs" "$D/inner/cgroup.procs"
  # The control: nobody pulls a root process out of a cgroup below theirs into one of theirs.
  mkdir "$D/held"; sleep 30 & held=$!; echo $held > "$D/held/cgroup.procs"
  setpriv --reuid 65534 --regid 65534 --clear-groups sh -c "echo $held > $D/inner/cgroup.procs" 2>/dev/null || true
  echo "PULLED: $(grep -c "^0::/$sub/inner$" /proc/$held/cgroup)" >&2
  kill $held; wait $held 2>/dev/null || true; rmdir "$D/held";;
esac
start="$D"; case "$setup" in *inner*) start="$D/inner";; esac
code=0
(echo 0 > "$start/cgroup.procs"; exec "$@") || code=$?
echo "TREE: $(cd "$D" && find . -mindepth 1 -type d | sort | tr '\n' ' ')" >&2
find "$D" -depth -type d -exec rmdir {} +; rmdir /sys/fs/cgroup/chio 2>/dev/null || true
exit $code
"#;
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh", sub, &setup.join(",")])
        .arg(&chio)
        .args(["cage", "run", "--json", "--rootfs", rootfs.to_str().unwrap()])
        .args(["--memory", "none", "--pids", "none", "--cpus", "none", "--"])
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let said = |key: &str| stderr.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("missing").trim().to_string();
    let (tree, pulled) = (said("TREE:"), said("PULLED:"));
    let mut o = out;
    let own = |l: &&str| !l.starts_with("TREE:") && !l.starts_with("PULLED:");
    o.stderr = stderr.lines().filter(own).collect::<Vec<_>>().join("\n").into_bytes();
    (parse(o), tree, pulled)
}

/// Under a service manager that delegated chio's cgroup to it (systemd's `Delegate=yes`, which
/// marks the unit's cgroup `trusted.delegate`), the launch cgroup goes inside it, under its
/// `launches`: the unit's accounting, limits and final kill then cover the cage. chio, started
/// in that cgroup itself, first moves into its leaf `supervisor` (v2 hands controllers only to
/// the children of a cgroup without processes); started below it, it stays. Controls: the same
/// cgroup unmarked, or marked but with its `cgroup.procs` another user's, puts the launch under
/// `/sys/fs/cgroup/chio` — and that user, the control shows, could pull a root process out of
/// a cgroup below theirs (and a cage out of its ceilings).
#[test]
fn v2_launch_cgroups_go_inside_a_delegated_cgroup_that_root_owns() {
    if !privileged("cgroup_v2_delegated") {
        return;
    }
    let tag = format!("chio-test-deleg-{}", std::process::id());
    for (i, (case, setup, root, tree)) in [
        ("delegated", &["mark"][..], "launches", "./inner ./launches ./supervisor"),
        ("delegated, chio below it", &["mark", "inner"][..], "launches", "./inner ./launches"),
        ("delegated, its leaf there", &["mark", "leaf"][..], "launches", "./inner ./launches ./supervisor"),
        ("not delegated", &[][..], "/sys/fs/cgroup/chio", "./inner"),
        ("delegated, another user's", &["mark", "foreign"][..], "/sys/fs/cgroup/chio", "./inner"),
    ]
    .into_iter()
    .enumerate()
    {
        let sub = format!("{tag}-{i}");
        let (run, left, pulled) = run_delegated(&sub, setup, &["/probe", "euid"]);
        let foreign = setup.contains(&"foreign");
        assert_eq!(pulled, if foreign { "1" } else { "missing" }, "{case}: the control");
        assert_eq!(run.state(), "FullyEnforced", "{case}: {}", run.stderr);
        let path = run.record["cgroup"]["paths"][0].as_str().unwrap();
        let name = path.rsplit('/').next().unwrap();
        assert!(name.starts_with("chio-"), "{case}: {path}");
        let expected =
            if root == "launches" { format!("/sys/fs/cgroup/{sub}/launches/{name}") } else { format!("{root}/{name}") };
        assert_eq!(path, expected, "{case}");
        let cage = run.record["observed"]["cgroup"].as_str().unwrap();
        let rel = expected.trim_start_matches("/sys/fs/cgroup");
        assert!(cage.lines().any(|l| l == format!("0::{rel}")), "{case}: the target ran in {cage}");
        assert_eq!(left, tree, "{case}: what is left under the delegated cgroup");
    }
}
