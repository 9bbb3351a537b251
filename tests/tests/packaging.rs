//! `packaging/`: every unit's command lines parse with the real binary; unprivileged units meet
//! the hardening baseline and privileged ones say why each capability; `systemd-analyze verify`
//! passes on every unit; the Debian package holds the binaries, units, sysusers/tmpfiles files,
//! man pages and completions, and its binary runs; `chio` is the launch path alone and hands the
//! rest to `chio-full`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use chio_tests::{chio_bin, copy_executable, privileged, skip, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn units() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("packaging/systemd"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "service" || x == "timer"))
        .collect();
    v.sort();
    assert!(v.len() >= 4, "{v:?}");
    v
}

/// `Key=value` lines of a unit (comments and sections left out), `%i` as `demo`.
fn directives(unit: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(unit)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('[') && l.contains('='))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.trim().to_string(), v.trim().replace("%i", "demo"))
        })
        .collect()
}

fn comments(unit: &Path) -> String {
    std::fs::read_to_string(unit).unwrap().lines().filter(|l| l.starts_with('#')).collect::<Vec<_>>().join("\n")
}

/// Each chio command line in `exec` (an `Exec*=` value): the whole line, and a chio command it
/// wraps after `--` on its own.
fn chio_command_lines(exec: &str) -> Vec<Vec<String>> {
    let words: Vec<String> =
        exec.trim_start_matches(['-', '@', '+', '!']).split_whitespace().map(String::from).collect();
    (0..words.len())
        .filter(|&i| words[i] == "/usr/bin/chio" && (i == 0 || words[i - 1] == "--"))
        .map(|i| words[i + 1..].to_vec())
        .collect()
}

#[test]
fn every_exec_line_parses_with_the_real_binary() {
    let chio = chio_bin(Path::new(PROBE));
    let mut checked = 0;
    for unit in units() {
        for (k, v) in directives(&unit).iter().filter(|(k, _)| k.starts_with("Exec")) {
            let lines = chio_command_lines(v);
            assert!(!lines.is_empty(), "{}: {k} runs no chio command: {v}", unit.display());
            for args in lines {
                let out = Command::new(&chio).args(["internal", "parse", "--"]).args(&args).output().unwrap();
                assert!(
                    out.status.success(),
                    "{}: {k}: chio {args:?}: {}",
                    unit.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "{checked}");
    // The check fails on a line that does not parse.
    let out =
        Command::new(&chio).args(["internal", "parse", "--", "security", "preflight", "--bogus"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The hardening every unprivileged unit meets.
const BASELINE: &[(&str, &str)] = &[
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("ProtectHome", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectControlGroups", "yes"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("SystemCallArchitectures", "native"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("UMask", "0077"),
    ("LimitCORE", "0"),
];

fn seconds(v: &str) -> u64 {
    v.trim_end_matches('s').parse().unwrap()
}

#[test]
fn unprivileged_units_meet_the_baseline_and_privileged_ones_say_why() {
    let mut unprivileged = 0;
    for unit in units().into_iter().filter(|u| u.extension().is_some_and(|x| x == "service")) {
        let d = directives(&unit);
        let get = |k: &str| d.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let caps = get("CapabilityBoundingSet").unwrap_or("(unset)");
        if get("User").is_some_and(|u| u != "root") {
            unprivileged += 1;
            for (k, want) in BASELINE {
                assert_eq!(get(k), Some(*want), "{}: {k}", unit.display());
            }
            let grace = d.iter().filter(|(k, _)| k.starts_with("Exec")).find_map(|(_, v)| {
                let w: Vec<&str> = v.split_whitespace().collect();
                w.iter().position(|x| *x == "--stop-grace").map(|i| seconds(w[i + 1]))
            });
            let timeout = get("TimeoutStopSec").map(seconds).expect("TimeoutStopSec");
            assert!(
                timeout >= grace.unwrap_or(10) + 5,
                "{}: TimeoutStopSec below the stop grace + 5 s",
                unit.display()
            );
        } else {
            // A privileged unit names its capabilities, and its comments say why each.
            assert_ne!(caps, "(unset)", "{}: no CapabilityBoundingSet", unit.display());
            let why = comments(&unit) + &comments(&unit.with_file_name("chio-preflight.service"));
            for cap in caps.split_whitespace() {
                assert!(why.contains(cap), "{}: {cap} is granted without a reason", unit.display());
            }
            assert_eq!(get("NoNewPrivileges"), Some("yes"), "{}", unit.display());
        }
    }
    assert!(unprivileged >= 1);
}

#[test]
fn systemd_analyze_verify_passes_on_every_unit() {
    if !privileged("systemd_analyze") {
        return;
    }
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        skip("systemd_analyze", "systemd-analyze is missing (apt-get install systemd; .ci/run does)");
        return;
    }
    let root = Scratch::new("units-root");
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::create_dir_all(root.join("etc/systemd/system")).unwrap();
    std::fs::create_dir_all(root.join("usr/lib/systemd")).unwrap();
    // The host's own units (sysinit.target, …) so dependencies resolve inside the root.
    let cp =
        Command::new("cp").args(["-a", "/usr/lib/systemd/system"]).arg(root.join("usr/lib/systemd")).status().unwrap();
    assert!(cp.success());
    let mut names = Vec::new();
    for unit in units() {
        let name = unit.file_name().unwrap().to_string_lossy().replace("@.", "@demo.");
        std::fs::copy(&unit, root.join("etc/systemd/system").join(unit.file_name().unwrap())).unwrap();
        names.push(name);
    }
    let verify = |names: &[String]| {
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(format!("--root={}", root.0.display()))
            .args(names)
            .output()
            .unwrap()
    };
    // Without the binary the verification fails (it checks every ExecStart's executable)...
    let out = verify(&names);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/usr/bin/chio is not executable"), "{out:?}");
    // ... and with it, every unit passes.
    copy_executable(&chio_bin(Path::new(PROBE)), &root.join("usr/bin/chio"));
    let out = verify(&names);
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_debian_package_holds_everything_and_its_binary_runs() {
    if Command::new("dpkg-deb").arg("--version").output().is_err() {
        skip("debian_package", "dpkg-deb is missing");
        return;
    }
    let out_dir = Scratch::new("deb");
    let chio = chio_bin(Path::new(PROBE));
    let built = Command::new(repo().join("packaging/deb/build-deb.sh"))
        .args(["--binary", chio.to_str().unwrap(), "--out", out_dir.0.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let deb = PathBuf::from(String::from_utf8(built.stdout).unwrap().trim());
    let listing = String::from_utf8(Command::new("dpkg-deb").arg("-c").arg(&deb).output().unwrap().stdout).unwrap();
    for want in [
        "-rwxr-xr-x root/root",
        "./usr/bin/chio\n",
        "./usr/bin/chio-full\n",
        "./usr/lib/systemd/system/chio-preflight.service",
        "./usr/lib/systemd/system/chio-supervisor.service",
        "./usr/lib/systemd/system/chio-tool@.service",
        "./usr/lib/systemd/system/chio-edge@.service",
        "./usr/lib/systemd/system/chio-edge-preflight@.service",
        "./usr/lib/systemd/system/chio-receipts-verify.timer",
        "./usr/lib/sysusers.d/chio.conf",
        "./usr/lib/tmpfiles.d/chio.conf",
        "./usr/share/chio/examples/make-material.sh",
        "./usr/share/man/man1/chio.1.gz",
        "./usr/share/man/man1/chio-security-preflight.1.gz",
        "./usr/share/man/man1/chio-security-supervise.1.gz",
        "./usr/share/man/man1/chio-supervisor-serve.1.gz",
        "./usr/share/bash-completion/completions/chio",
        "./usr/share/zsh/vendor-completions/_chio",
        "./usr/share/fish/vendor_completions.d/chio.fish",
    ] {
        assert!(listing.contains(want), "{want} missing:\n{listing}");
    }
    let x = out_dir.join("x");
    assert!(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x).status().unwrap().success());
    // `--version` is chio-full's: `chio` finds it beside itself.
    let v = Command::new(x.join("usr/bin/chio")).arg("--version").output().unwrap();
    assert!(v.status.success() && String::from_utf8_lossy(&v.stdout).starts_with("chio "), "{v:?}");
    let completion = std::fs::read_to_string(x.join("usr/share/bash-completion/completions/chio")).unwrap();
    assert!(completion.contains("preflight") && completion.contains("supervise"));
}

/// The privileged units' capability set is exactly what a launch needs: preflight passes with
/// it, and fails without any one of them.
#[test]
fn the_privileged_units_grant_exactly_what_a_launch_needs() {
    if !privileged("unit_capabilities") {
        return;
    }
    let unit = repo().join("packaging/systemd/chio-preflight.service");
    let d = directives(&unit);
    let caps: Vec<String> = d
        .iter()
        .find(|(k, _)| k == "CapabilityBoundingSet")
        .unwrap()
        .1
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect();
    let chio = chio_bin(Path::new(PROBE));
    let preflight = |keep: &[&String]| {
        let set: Vec<String> = keep.iter().map(|c| format!("+{c}")).collect();
        Command::new("setpriv")
            .arg(format!("--bounding-set=-all,{}", set.join(",")))
            .arg("--")
            .arg(&chio)
            .args(["security", "preflight", "--require-enforcement", "--json"])
            .output()
            .unwrap()
    };
    let all: Vec<&String> = caps.iter().collect();
    let out = preflight(&all);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    for drop in &caps {
        let fewer: Vec<&String> = caps.iter().filter(|c| *c != drop).collect();
        let out = preflight(&fewer);
        assert_ne!(out.status.code(), Some(0), "preflight passed without {drop}: the unit grants it for nothing");
    }
}

/// The test suites' switches, each with a value that would act in their build.
const TEST_SWITCHES: [(&str, &str); 6] = [
    ("CHIO_TEST_HOOK", "seccomp"),
    ("CHIO_TEST_FAIL_STAGE", "landlock"),
    ("CHIO_TEST_LANDLOCK_ABI", "0"),
    ("CHIO_TEST_CRASH", "after_snapshot"),
    ("CHIO_TEST_GIT_DEADLINE_MS", "1"),
    ("CHIO_TEST_ANYTHING_ELSE", "1"),
];

/// `cargo build` at the workspace root builds the default members, which leave the test suites'
/// crate out: its `test-hooks` feature is not unified into `chio`. Control: with `--workspace`
/// (what `cargo test --workspace` builds) it is.
#[test]
fn a_build_at_the_workspace_root_has_no_test_hooks() {
    let tree = |extra: &[&str]| {
        let out = Command::new(env!("CARGO"))
            .args(["tree", "--locked", "--offline", "-e", "features", "-i", "chio-cage"])
            .args(extra)
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let users = tree(&[]);
    assert!(users.contains("chio-cli") && !users.contains("test-hooks"), "{users}");
    assert!(tree(&["--workspace"]).contains("test-hooks"), "control: the test suites' build has the hooks");
}

/// `chio` is the launch path alone: it links none of the daemon (tokio), the gateway (rustls),
/// the OCI runtime (oci-spec, regex) or the report (maud) — `chio-full` does, the control — and a
/// copy of it with no `chio-full` beside it still launches. Every other command line is handed
/// to the `chio-full` beside it, with its arguments and `argv[0]` (a `chio-runc` link keeps its
/// name); without one, the refusal names what is missing.
#[test]
fn chio_is_the_launch_path_and_hands_the_rest_to_chio_full() {
    let chio = chio_bin(Path::new(PROBE));
    let full = chio.with_file_name("chio-full");
    let symbols = |bin: &Path| {
        let out = Command::new("nm").arg("-C").arg(bin).output().expect("nm (binutils)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let (small, all) = (symbols(&chio), symbols(&full));
    for crate_path in ["tokio::runtime::", "rustls::", "oci_spec::", "regex_automata::", "maud::"] {
        assert!(!small.contains(crate_path), "chio links {crate_path}");
        assert!(all.contains(crate_path), "control: chio-full links {crate_path}");
    }
    // The README's first command, `cargo run -p chio-cli -- cage run …`, names no binary: the
    // package's default is `chio` (without it cargo refuses: two binaries).
    let meta = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--offline", "--format-version", "1"])
        .current_dir(repo())
        .output()
        .unwrap();
    let meta: serde_json::Value = serde_json::from_slice(&meta.stdout).unwrap();
    let cli = meta["packages"].as_array().unwrap().iter().find(|p| p["name"] == "chio-cli").unwrap();
    assert_eq!(cli["default_run"], "chio", "{cli}");
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(readme.contains("cargo run --release -p chio-cli -- cage run"), "the README's first command changed");
    let dir = Scratch::new("launch-binary");
    let alone = dir.join("chio");
    copy_executable(&chio, &alone);
    let help = |bin: &Path| Command::new(bin).args(["cage", "run", "--help"]).output().unwrap();
    let (own, full_help) = (help(&alone), help(&full));
    assert!(own.status.success() && own.stdout == full_help.stdout, "{own:?}");
    let out = Command::new(&alone).args(["receipt", "list", "--help"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("cannot run {}", dir.join("chio-full").display())), "{err}");
    assert!(err.contains("installed beside chio") && out.stdout.is_empty(), "{err}");
    if privileged("launch_binary_alone") {
        let out = Command::new(&alone).args(["cage", "run", "--json", "--", "/bin/true"]).output().unwrap();
        let record = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && record.contains("\"state\":\"FullyEnforced\""), "{record}");
    }
    copy_executable(&full, &dir.join("chio-full"));
    let out = Command::new(&alone).args(["receipt", "list", "--help"]).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("--receipt-db"), "{out:?}");
    // Through a link named chio-runc (as engines are pointed at it): runc's command line.
    let runc = dir.join("chio-runc");
    std::os::unix::fs::symlink(&alone, &runc).unwrap();
    let out = Command::new(&runc).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("chio-runc version"), "{out:?}");
}

/// The installable artifact (`packaging/build-release`, the .deb's binaries) refuses to start
/// with any `CHIO_TEST_*` variable set, naming it, whatever the command and whichever binary. Controls: the same artifact
/// without them launches; the test suites' build acts on the same switch (the launch fails at the
/// stage it names).
#[test]
fn the_release_artifact_refuses_every_test_switch() {
    if !privileged("release_artifact_switches") {
        return;
    }
    let built = Command::new(repo().join("packaging/build-release")).output().unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let artifact = PathBuf::from(String::from_utf8(built.stdout).unwrap().trim());
    let true_bin = "/bin/true";
    for (name, value) in TEST_SWITCHES {
        for (bin, args) in [
            (&artifact, &["cage", "run", "--json", "--", true_bin][..]),
            (&artifact, &["--version"][..]),
            (&artifact.with_file_name("chio-full"), &["cage", "run", "--json", "--", true_bin][..]),
        ] {
            let out = Command::new(bin).args(args).env(name, value).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} with {args:?}: {err}");
            assert!(err.contains(name) && err.contains("production build"), "{name}: {err}");
            assert!(out.stdout.is_empty() && !err.contains("schema"), "{name}: it ran: {err}");
        }
    }
    let clean = Command::new(&artifact).args(["cage", "run", "--json", "--", true_bin]).output().unwrap();
    // The launch record goes to stderr (stdout is the command's).
    let record = String::from_utf8_lossy(&clean.stderr);
    assert!(record.contains("\"state\":\"FullyEnforced\""), "control: {record}");
    let hooked = Command::new(chio_bin(Path::new(PROBE)))
        .args(["cage", "run", "--json", "--", true_bin])
        .env("CHIO_TEST_FAIL_STAGE", "landlock")
        .output()
        .unwrap();
    let record = String::from_utf8_lossy(&hooked.stderr);
    assert!(record.contains("\"stage\":\"landlock\""), "control: the switch acts in the test build: {record}");
}

/// `packaging/kubernetes/`: the containerd snippet parses with containerd's own configuration
/// loader and gives the `chio` handler the runc v2 shim with chio's runtime as its binary; the
/// RuntimeClass fits the Kubernetes API's models (the official client's, generated from its
/// OpenAPI schema: no unknown field, every value of its type, the required handler present and
/// a DNS-1123 label) and names that same handler.
#[test]
fn the_kubernetes_manifests_fit_containerd_and_the_api() {
    let dir = repo().join("packaging/kubernetes");
    if Command::new("containerd").arg("--version").output().is_err() {
        return skip("kubernetes manifests", "containerd is not installed (apt-get install containerd)");
    }
    let python = repo().join("target/k8s-venv/bin/python");
    if !python.exists() {
        return skip("kubernetes manifests", "no target/k8s-venv (.ci/run makes it: pip install kubernetes pyyaml)");
    }
    let scratch = Scratch::new("k8s-manifests");
    let config = scratch.join("config.toml");
    let snippet = std::fs::read_to_string(dir.join("containerd-chio.toml")).unwrap();
    std::fs::write(&config, format!("version = 2\n{snippet}")).unwrap();
    let dump = Command::new("containerd").arg("--config").arg(&config).args(["config", "dump"]).output().unwrap();
    assert!(dump.status.success(), "{dump:?}");
    let dump = String::from_utf8_lossy(&dump.stdout);
    let handler = dump
        .split("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.chio]")
        .nth(1)
        .unwrap_or_else(|| panic!("containerd does not list the chio handler:\n{dump}"));
    let handler = handler.split("\n        [plugins.").take(2).collect::<Vec<_>>().join("\n");
    for want in [
        "runtime_type = \"io.containerd.runc.v2\"",
        "BinaryName = \"/usr/local/bin/chio-runc\"",
        "SystemdCgroup = false",
    ] {
        assert!(handler.contains(want), "{want} in the chio handler:\n{handler}");
    }
    let check = Command::new(&python)
        .arg(repo().join("tests/tools/check_k8s_manifests.py"))
        .arg(dir.join("runtimeclass.yaml"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{said} {}", String::from_utf8_lossy(&check.stderr));
    assert!(said.contains("RuntimeClass chio handler=chio"), "the handler containerd has: {said}");
    // The check refuses what the API would: an unknown field, and a handler that is no label.
    let rc = std::fs::read_to_string(dir.join("runtimeclass.yaml")).unwrap();
    for (bad, why) in [
        (rc.replace("nodeSelector:", "nodeSelecter:"), "has no such field"),
        (rc.replace("handler: chio", "handler: Chio_1"), "DNS-1123"),
    ] {
        let f = scratch.join("bad.yaml");
        std::fs::write(&f, bad).unwrap();
        let c = Command::new(&python).arg(repo().join("tests/tools/check_k8s_manifests.py")).arg(&f).output().unwrap();
        assert!(!c.status.success() && String::from_utf8_lossy(&c.stdout).contains(why), "{c:?}");
    }
}
