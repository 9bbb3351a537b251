//! Fail-closed behaviour: a failure injected at any setup stage stops the launch before the
//! target runs, and bad targets, digests, rootfs paths and missing host features each yield the
//! right state, code and exit status.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use chio_tests::{chio_bin, parse, privileged, shared_rootfs, CageRun, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

struct Env {
    chio: PathBuf,
    rootfs: &'static Path,
}

fn env(test: &str) -> Option<Env> {
    if !privileged(test) {
        return None;
    }
    let probe = PathBuf::from(PROBE);
    Some(Env { chio: chio_bin(&probe), rootfs: shared_rootfs(&probe) })
}

impl Env {
    fn run(&self, vars: &[(&str, &str)], flags: &[&str], argv: &[&str]) -> CageRun {
        let mut cmd = Command::new(&self.chio);
        cmd.args(["cage", "run", "--json", "--rootfs", self.rootfs.to_str().unwrap()]).args(flags).arg("--").args(argv);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        parse(cmd.stdin(Stdio::null()).output().unwrap())
    }
}

fn assert_failed(run: &CageRun, state: &str, stage: &str, code: &str, exit: i32) {
    assert_eq!(run.state(), state, "{}", run.stderr);
    assert_eq!(run.record["failure"]["stage"], stage, "{}", run.stderr);
    assert_eq!(run.record["failure"]["code"], code, "{}", run.stderr);
    assert_eq!(run.code, exit, "{}", run.stderr);
    let reason = run.stderr.lines().find(|l| l.starts_with("chio: ")).unwrap_or_default();
    assert!(reason.contains(code), "one-line reason names the code: {}", run.stderr);
}

const SETUP_STAGES: [&str; 14] = [
    "resolve",
    "cgroup",
    "namespaces",
    "mounts",
    "pivot",
    "network",
    "identity",
    "capabilities",
    "landlock",
    "target",
    "seccomp",
    "verify",
    "exec",
    "observe",
];

#[test]
fn injected_failure_at_every_stage_stops_the_target() {
    let Some(e) = env("inject") else { return };
    for stage in SETUP_STAGES {
        let ws = Scratch::new("inject");
        ws.give_to_nobody();
        let run = e.run(
            &[("CHIO_TEST_FAIL_STAGE", stage)],
            &["--workspace", ws.0.to_str().unwrap()],
            &["/probe", "write", "/workspace/ran"],
        );
        // An injected observation failure goes through the real mismatch path.
        let code = if stage == "observe" { "fact_mismatch" } else { "injected_failure" };
        assert_failed(&run, "BootstrapFailed", stage, code, 125);
        assert!(!ws.join("ran").exists(), "stage {stage}: the target ran");
        assert!(run.stdout.is_empty(), "stage {stage}: the target printed {:?}", run.stdout);
        let cg = run.record["cgroup"]["paths"].as_array().cloned().unwrap_or_default();
        for p in cg {
            assert!(!Path::new(p.as_str().unwrap()).exists(), "stage {stage}: cgroup {p} left behind");
        }
    }
    // Control: without the injection the same launch runs the target.
    let ws = Scratch::new("inject-control");
    ws.give_to_nobody();
    let run = e.run(&[], &["--workspace", ws.0.to_str().unwrap()], &["/probe", "write", "/workspace/ran"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(ws.join("ran").exists());
}

/// Whatever way a launch fails before its target runs — each setup stage made to fail, a launch
/// withdrawn after its target was seized, evidence that cannot be recorded at the exec stop —
/// the launch has killed and reaped its cage's init (and its janitor) by the time it returns:
/// the calling process, which goes on living (a daemon's), has no child left, not even a zombie.
/// (A janitor that has removed the cgroup and said so exits on its own; the next launch reaps it.)
#[test]
fn a_failed_launch_leaves_no_process_behind() {
    let Some(e) = env("teardown") else { return };
    let once = env!("CARGO_BIN_EXE_chio-launch-once");
    let run = |how: &str| {
        let out = Command::new(once)
            .args([e.rootfs.to_str().unwrap(), how, "--", "/probe", "euid"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{how}: {}", String::from_utf8_lossy(&out.stderr));
        // The target's own output (the control's) comes first; the probe's line is the last.
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut line: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
        assert_eq!(line["children_before"], serde_json::json!([]), "{how}: {line}");
        let left: Vec<serde_json::Value> = line["children_after"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| !c.as_str().unwrap().contains(" (chio-janitor) "))
            .cloned()
            .collect();
        line["children_after"] = serde_json::Value::Array(left);
        line
    };
    let mut hows: Vec<&str> = SETUP_STAGES.to_vec();
    hows.extend(["withdrawn", "evidence"]);
    for how in hows {
        let line = run(how);
        assert_eq!(line["state"], "BootstrapFailed", "{how}: {line}");
        let expected = match how {
            "observe" => "fact_mismatch",
            "withdrawn" => "withdrawn",
            "evidence" => "evidence_not_recorded",
            _ => "injected_failure",
        };
        assert_eq!(line["failure"]["code"], expected, "{how}: {line}");
        assert_eq!(line["children_after"], serde_json::json!([]), "{how}: the launch left a process: {line}");
    }
    // Control: the same launch, not made to fail, runs its target (and leaves nothing either).
    let line = run("none");
    assert_eq!(line["state"], "FullyEnforced", "{line}");
    assert_eq!(line["children_after"], serde_json::json!([]), "{line}");
}

#[test]
fn target_not_found_is_127() {
    let Some(e) = env("not_found") else { return };
    assert_failed(&e.run(&[], &[], &["/nonexistent"]), "BootstrapFailed", "target", "target_not_found", 127);
    assert_failed(&e.run(&[], &[], &["no-such-command"]), "BootstrapFailed", "target", "target_not_found", 127);
    // The target looks for its command while the supervisor seizes it and sends its go; one
    // that did not find it has said so and ended before a late go, whose send then fails: the
    // launch's failure is still what the target said (it was `setup_failed`, a broken pipe).
    let late = e.run(&[("CHIO_TEST_HOOK", "go_late")], &[], &["/nonexistent"]);
    assert_failed(&late, "BootstrapFailed", "target", "target_not_found", 127);
}

#[test]
fn target_not_executable_is_126() {
    let Some(e) = env("not_executable") else { return };
    assert_failed(&e.run(&[], &[], &["/not-exec"]), "BootstrapFailed", "exec", "target_not_executable", 126);
    assert_failed(&e.run(&[], &[], &["/lib"]), "BootstrapFailed", "target", "target_not_executable", 126);
}

#[test]
fn script_without_interpreter_is_126() {
    let Some(e) = env("no_interp") else { return };
    let run = e.run(&[], &[], &["/no-interp.sh"]);
    assert_failed(&run, "BootstrapFailed", "target", "target_not_executable", 126);
    // The detail names the script and its missing interpreter.
    let detail = run.record["failure"]["detail"].as_str().unwrap();
    assert!(detail.contains("/no-interp.sh: interpreter") && detail.contains("/nonexistent/interpreter"), "{detail}");
}

#[test]
fn script_with_interpreter_runs_and_records_both() {
    let Some(e) = env("script") else { return };
    let run = e.run(&[], &[], &["/script.sh"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(run.stdout.starts_with("REFUSED: euid is 65534"), "{}", run.stdout);
    assert_eq!(run.record["target"]["path"], "/script.sh");
    assert_eq!(run.record["target"]["interpreter"]["path"], "/probe");
}

fn sha256_of(p: &Path) -> String {
    let out = Command::new("sha256sum").arg(p).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}

#[test]
fn wrong_digest_is_refused_before_exec() {
    let Some(e) = env("digest") else { return };
    let ws = Scratch::new("digest");
    ws.give_to_nobody();
    let w = ws.0.to_str().unwrap();
    let wrong = "0".repeat(64);
    let run = e.run(&[], &["--workspace", w, "--expect-sha256", &wrong], &["/probe", "write", "/workspace/ran"]);
    assert_failed(&run, "BootstrapFailed", "verify", "digest_mismatch", 125);
    assert!(!ws.join("ran").exists());
    let right = sha256_of(&e.rootfs.join("probe"));
    let run = e.run(&[], &["--workspace", w, "--expect-sha256", &right], &["/probe", "write", "/workspace/ran"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(run.record["target"]["sha256"], right);
    assert!(ws.join("ran").exists());
}

#[test]
fn malformed_digest_is_rejected() {
    let Some(e) = env("bad_digest") else { return };
    // Too short though hex, the right length but not lowercase hex: each alone is malformed.
    for bad in ["abc".to_string(), "A".repeat(64)] {
        let run = e.run(&[], &["--expect-sha256", &bad], &["/probe", "euid"]);
        assert_failed(&run, "Rejected", "resolve", "bad_digest", 125);
    }
}

#[test]
fn missing_rootfs_is_reported() {
    let Some(e) = env("missing_rootfs") else { return };
    let out = Command::new(&e.chio)
        .args(["cage", "run", "--json", "--rootfs", "/nonexistent/rootfs", "--", "/probe"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run = parse(out);
    assert_failed(&run, "BootstrapFailed", "resolve", "path_not_found", 125);
    assert!(run.record["failure"]["detail"].as_str().unwrap().contains("/nonexistent/rootfs"));
}

#[test]
fn old_landlock_is_unsupported_in_enforced_mode_and_noted_in_shadow() {
    let Some(e) = env("landlock_abi") else { return };
    let run = e.run(&[("CHIO_TEST_LANDLOCK_ABI", "3")], &[], &["/probe", "euid"]);
    assert_failed(&run, "Unsupported", "landlock", "landlock_unsupported", 125);
    assert!(run.stdout.is_empty());
    let run = e.run(&[("CHIO_TEST_LANDLOCK_ABI", "3")], &["--mode", "shadow"], &["/probe", "euid"]);
    assert_eq!(run.state(), "NotConfined", "{}", run.stderr);
    assert!(run.stdout.starts_with("REFUSED: euid is 65534"), "the target ran: {}", run.stdout);
    let why = run.record["not_confined"].to_string();
    assert!(why.contains("landlock_unsupported"), "{why}");
    assert!(run.stderr.contains("NOT CONFINED"));
}

#[test]
fn no_landlock_at_all_is_unsupported() {
    let Some(e) = env("no_landlock") else { return };
    let run = e.run(&[("CHIO_TEST_LANDLOCK_ABI", "0")], &[], &["/probe", "euid"]);
    assert_failed(&run, "Unsupported", "landlock", "landlock_unsupported", 125);
}

#[test]
fn exit_status_and_signal_pass_through() {
    let Some(e) = env("exit_status") else { return };
    let run = e.run(&[], &[], &["/probe", "euid"]);
    assert_eq!((run.state(), run.code), ("FullyEnforced", 1));
    assert_eq!(run.record["outcome"]["exit_code"], 1);
    let run = e.run(&[], &["--timeout", "1s"], &["/probe", "sleeper", "x"]);
    assert_eq!(run.code, 137);
    assert_eq!(run.record["outcome"]["signal"], 9);
}

#[test]
fn record_file_matches_the_json_line() {
    let Some(e) = env("record_file") else { return };
    let s = Scratch::new("record");
    let file = s.join("record.json");
    let run = e.run(&[], &["--record", file.to_str().unwrap()], &["/probe", "euid"]);
    let from_file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(from_file, run.record);
    assert_eq!(from_file["schema"], "chio.cage.launch-record.v1");
    let observed = &from_file["observed"];
    assert_eq!(observed["no_new_privs"], 1);
    assert_eq!(observed["seccomp"], 2);
    assert_eq!(observed["fds"], serde_json::json!([0, 1, 2]));
    assert_eq!(observed["status_channel_eof"], true);
    assert_eq!(observed["exe_inode"], from_file["target"]["inode"]);
    // What the cage reports of itself, as the record carries it.
    let reported = &from_file["reported"];
    assert_eq!(
        (reported["proc_verified"].as_bool(), reported["capabilities_cleared"].as_bool()),
        (Some(true), Some(true))
    );
    let mounts = reported["mounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m.as_str().unwrap().starts_with("/tmp tmpfs size=")), "{mounts:?}");
    assert!(mounts.iter().any(|m| m.as_str().unwrap().starts_with("/dev/null device node")), "{mounts:?}");
    let sha = reported["seccomp_filter_sha256"].as_str().unwrap();
    assert!(sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()), "{sha}");
    // Landlock ABI 4 and later handle every file right chio asks for: the file class is whole.
    if reported["landlock_abi"].as_u64().unwrap() >= 4 {
        assert_eq!(reported["landlock_fs"], "FullyEnforced", "{reported}");
    }
}

#[test]
fn dotted_cwd_is_rejected() {
    let Some(e) = env("bad_cwd") else { return };
    let run = e.run(&[], &["--cwd", "/lib/../etc"], &["/probe", "euid"]);
    assert_failed(&run, "Rejected", "resolve", "bad_cwd", 125);
    let run = e.run(&[], &["--cwd", "/lib/"], &["/probe", "euid"]);
    assert_eq!(run.state(), "FullyEnforced", "a trailing slash is normalized: {}", run.stderr);
    assert_eq!(run.record["observed"]["cwd"], "/lib");
}

/// A record file that cannot be created refuses the launch before the target runs (it used to
/// be written only afterwards, turning the command's status into 125).
#[test]
fn an_unwritable_record_file_refuses_before_the_target_runs() {
    let Some(e) = env("record_unwritable") else { return };
    let ws = Scratch::new("record-ws");
    ws.give_to_nobody();
    let bad = ws.join("no/such/dir/record.json");
    let flags = ["--record", bad.to_str().unwrap(), "--workspace", ws.0.to_str().unwrap()];
    let run = e.run(&[], &flags, &["/probe", "write", "/workspace/ran"]);
    assert_eq!(run.code, 125, "{}", run.stderr);
    assert!(run.stderr.contains("cannot create the record file"), "{}", run.stderr);
    assert!(!ws.join("ran").exists(), "the target ran although its record could not be kept");
    // Control: a writable path keeps the record and the command's own status.
    let good = ws.join("record.json");
    let flags = ["--record", good.to_str().unwrap(), "--workspace", ws.0.to_str().unwrap()];
    let run = e.run(&[], &flags, &["/probe", "write", "/workspace/ran"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(ws.join("ran").exists());
    assert!(std::fs::read_to_string(&good).unwrap().contains("FullyEnforced"));
}

/// Limits no launch can work under are refused up front, naming the flag and the floor; the
/// floors themselves launch.
#[test]
fn limits_below_their_floor_are_refused_naming_the_flag() {
    let Some(e) = env("limit_floors") else { return };
    for (flags, says) in [
        (["--memory", "4K"], "--memory"),
        (["--memory", "0"], "--memory"),
        (["--pids", "1"], "--pids"),
        (["--cpus", "0.001"], "--cpus"),
        (["--uid", "4294967295"], "unchanged"),
        (["--gid", "4294967295"], "unchanged"),
    ] {
        let run = e.run(&[], &flags, &["/probe", "euid"]);
        assert_eq!(run.state(), "Rejected", "{flags:?}: {}", run.stderr);
        assert!(run.record["failure"]["detail"].as_str().unwrap().contains(says), "{flags:?}: {}", run.stderr);
        assert!(run.stdout.is_empty());
    }
    for flags in [["--memory", "1M"], ["--pids", "2"], ["--cpus", "0.01"]] {
        let run = e.run(&[], &flags, &["/probe", "euid"]);
        assert_eq!(run.state(), "FullyEnforced", "{flags:?}: {}", run.stderr);
    }
}

/// A supervisor without CAP_KILL (a unit's bounding set, setpriv) could not kill a cage running
/// as another uid at its deadline, and the target would run on: it refuses to launch instead,
/// naming what it lacks. The control, with CAP_KILL, is killed at its deadline.
#[test]
fn a_supervisor_without_cap_kill_refuses_to_launch() {
    let Some(e) = env("no_cap_kill") else { return };
    let run = |bounding: &str| {
        let out = Command::new("setpriv")
            .arg(format!("--bounding-set={bounding}"))
            .arg("--")
            .arg(&e.chio)
            .args(["cage", "run", "--json", "--timeout", "1s", "--rootfs", e.rootfs.to_str().unwrap()])
            .args(["--", "/probe", "sleeper", "chio-no-cap-kill"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        parse(out)
    };
    let started = std::time::Instant::now();
    let refused = run("-kill");
    assert_failed(&refused, "Rejected", "resolve", "supervisor_capabilities", 125);
    assert!(refused.record["failure"]["detail"].as_str().unwrap().contains("CAP_KILL"), "{}", refused.stderr);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let control = run("+all");
    assert_eq!(control.state(), "FullyEnforced", "{}", control.stderr);
    assert_eq!(control.record["outcome"]["limit_hit"], serde_json::json!(["wall_time"]));
}

/// A bind onto the cage's `/` itself is refused before anything is built, and named.
#[test]
fn a_bind_onto_the_root_is_refused() {
    let Some(e) = env("bind_onto_root") else { return };
    let run = e.run(&[], &["--ro-bind", "/etc:/"], &["/probe", "euid"]);
    assert_failed(&run, "BootstrapFailed", "resolve", "path_refused", 125);
    assert!(run.record["failure"]["detail"].as_str().unwrap().contains("absolute path below /"), "{}", run.stderr);
}

/// Stack `layers` landlock domains on the process about to exec (each handles only TCP bind, so
/// mounts, ptrace and files stay as they were): a host whose service manager or parent sandbox
/// already confined chio.
fn with_landlock_layers(cmd: &mut Command, layers: usize) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let attr: [u64; 2] = [0, 1]; // handled_access_fs: none, handled_access_net: BIND_TCP
            for _ in 0..layers {
                let fd = libc::syscall(libc::SYS_landlock_create_ruleset, attr.as_ptr(), 16usize, 0u32);
                if fd < 0 || libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd as i32);
            }
            Ok(())
        });
    }
}

/// Landlock allows 16 nested domains. A chio already under 16 cannot add the cage's ruleset:
/// the launch must fail at the landlock stage before the target runs, not go on unconfined by
/// landlock. The control, one layer fewer, leaves room for the cage's: FullyEnforced.
#[test]
fn a_ruleset_that_cannot_be_enforced_fails_the_launch() {
    let Some(e) = env("landlock_nesting_limit") else { return };
    let ws = Scratch::new("landlock-limit");
    ws.give_to_nobody();
    let launch = |layers: usize| {
        let mut cmd = Command::new(&e.chio);
        cmd.args([
            "cage",
            "run",
            "--json",
            "--rootfs",
            e.rootfs.to_str().unwrap(),
            "--workspace",
            ws.0.to_str().unwrap(),
        ]);
        cmd.args(["--", "/probe", "write", "/workspace/ran"]);
        with_landlock_layers(&mut cmd, layers);
        parse(cmd.stdin(Stdio::null()).output().unwrap())
    };
    let run = launch(16);
    assert_failed(&run, "BootstrapFailed", "landlock", "landlock_failed", 125);
    assert!(run.stderr.contains("Argument list too long") || run.stderr.contains("E2BIG"), "{}", run.stderr);
    assert!(!ws.join("ran").exists(), "the target ran");
    let control = launch(15);
    assert_eq!(control.state(), "FullyEnforced", "{}", control.stderr);
    assert!(ws.join("ran").exists());
}

/// Install `n` allow-everything seccomp filters on the process about to exec: what a service
/// manager's `SystemCallArchitectures=`, `LockPersonality=`… leave on chio under systemd.
fn with_inherited_filters(cmd: &mut Command, n: usize) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe prctl calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let allow = [libc::sock_filter {
                code: (libc::BPF_RET | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k: libc::SECCOMP_RET_ALLOW,
            }];
            let prog = libc::sock_fprog { len: 1, filter: allow.as_ptr() as *mut libc::sock_filter };
            for _ in 0..n {
                if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// A supervisor running under its service manager's filters: the target carries those and the
/// cage's, and the observation accepts exactly that (the cage's filter still refuses).
#[test]
fn filters_the_supervisor_runs_under_are_counted_and_ours_still_applies() {
    let Some(e) = env("inherited_filters") else { return };
    let launch = |n: usize| {
        let mut cmd = Command::new(&e.chio);
        cmd.args(["cage", "run", "--json", "--rootfs", e.rootfs.to_str().unwrap(), "--", "/probe", "unshare", "user"]);
        with_inherited_filters(&mut cmd, n);
        parse(cmd.stdin(Stdio::null()).output().unwrap())
    };
    for n in [0, 3] {
        let run = launch(n);
        assert_eq!(run.state(), "FullyEnforced", "{n}: {}", run.stderr);
        let o = &run.record["observed"];
        assert_eq!(
            (o["seccomp_filters"].as_u64(), o["seccomp_filters_inherited"].as_u64()),
            (Some(n as u64 + 1), Some(n as u64))
        );
        assert!(run.stdout.starts_with("REFUSED") && run.stdout.contains("errno=1"), "{n}: {}", run.stdout);
    }
}

/// The host's ephemeral port range, written back when dropped if a launch changed it.
struct PortRange(String);

impl PortRange {
    const PATH: &'static str = "/proc/sys/net/ipv4/ip_local_port_range";
    const RESERVED: &'static str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

    fn now() -> (String, String) {
        (std::fs::read_to_string(Self::PATH).unwrap(), std::fs::read_to_string(Self::RESERVED).unwrap())
    }
}

impl Drop for PortRange {
    fn drop(&mut self) {
        if std::fs::read_to_string(Self::PATH).unwrap_or_default() != self.0 {
            let _ = std::fs::write(Self::PATH, &self.0);
            let _ = std::fs::write(Self::RESERVED, "\n");
        }
    }
}

/// A cage granted no TCP bind port gets no ephemeral port either: the init writes its network
/// namespace's range and reservation through the cage's procfs, and `/proc/sys/net` is the
/// writer's namespace's. An init still in its supervisor's network namespace (a test hook here;
/// a reordering of its setup for real) would close the host's ephemeral ports: it refuses
/// instead, naming the namespace, and the host's range and reservation are what they were. The
/// same launch without the hook runs.
#[test]
fn the_cages_network_sysctls_are_never_written_in_the_supervisors_namespace() {
    let Some(e) = env("netns_kept") else { return };
    let before = PortRange::now();
    let _restore = PortRange(before.0.clone());
    let refused = e.run(&[("CHIO_TEST_HOOK", "netns_kept")], &[], &["/probe", "euid"]);
    assert_eq!(PortRange::now(), before, "the host's ephemeral ports were changed");
    assert_failed(&refused, "BootstrapFailed", "namespaces", "namespace_failed", 125);
    let detail = refused.record["failure"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("supervisor's network namespace"), "{detail}");
    let control = e.run(&[], &[], &["/probe", "euid"]);
    assert_eq!(control.state(), "FullyEnforced", "{}", control.stderr);
}
