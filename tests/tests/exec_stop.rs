//! Every fact the supervisor checks at the exec stop fails a launch for real. A test-only hook
//! (`CHIO_TEST_HOOK`, in builds with the `test-hooks` feature) skips or undoes one step inside the
//! cage, so the fact is false in the kernel's own state; the launch must end `BootstrapFailed` at
//! the observe stage naming that fact, and the target — which would create a file in the
//! workspace — must never run. The control is the same launch without the hook: it runs and
//! creates the file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};

use chio_tests::{copy_executable, parse, CageRun, Scratch, Suite};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

/// `/probe write /workspace/ran` in a cage, with `hook` (if any) and `extra` flags.
fn launch(e: &Suite, ws: &Scratch, hook: Option<&str>, extra: &[&str]) -> CageRun {
    launch_of(e, "/probe", ws, hook, extra)
}

/// `TARGET write /workspace/ran` in a cage, with `hook` (if any) and `extra` flags.
fn launch_of(e: &Suite, target: &str, ws: &Scratch, hook: Option<&str>, extra: &[&str]) -> CageRun {
    parse(launch_command(e, &[], target, ws, hook, extra).output().unwrap())
}

/// The command of [`launch_of`], run under `wrap` (a program and its arguments) if any.
fn launch_command(e: &Suite, wrap: &[&str], target: &str, ws: &Scratch, hook: Option<&str>, extra: &[&str]) -> Command {
    let mut cmd = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&e.chio);
            c
        }
        None => Command::new(&e.chio),
    };
    cmd.args(["cage", "run", "--json", "--rootfs", e.rootfs.to_str().unwrap(), "--workspace"])
        .arg(&ws.0)
        .args(extra)
        .args(["--", target, "write", "/workspace/ran"])
        .stdin(Stdio::null());
    if let Some(h) = hook {
        cmd.env("CHIO_TEST_HOOK", h);
    }
    cmd
}

/// The hooked launch fails at the exec stop naming `fact`, the target never ran, and the same
/// launch without the hook runs.
fn fact_fails(test: &str, hook: &str, extra: &[&str], fact: &str) {
    let Some(e) = Suite::new(test, PROBE) else { return };
    let ws = Scratch::new("exec-stop");
    if !extra.contains(&"--uid") {
        ws.give_to_nobody();
    }
    let run = launch(&e, &ws, Some(hook), extra);
    assert_eq!(run.state(), "BootstrapFailed", "{hook}: {}", run.stderr);
    let failure = &run.record["failure"];
    assert_eq!(
        (failure["stage"].as_str(), failure["code"].as_str()),
        (Some("observe"), Some("fact_mismatch")),
        "{hook}"
    );
    let detail = failure["detail"].as_str().unwrap();
    assert!(detail.contains(fact), "{hook}: the failure names {fact:?}: {detail}");
    assert!(!ws.join("ran").exists(), "{hook}: the target ran");
    assert_eq!(run.code, 125);
    let control = launch(&e, &ws, None, extra);
    assert_eq!(control.state(), "FullyEnforced", "control for {hook}: {}", control.stderr);
    assert!(ws.join("ran").exists(), "control for {hook}: the target runs and writes");
}

/// `/workspace/probe write /workspace/ran` in a cage, the probe a copy in the workspace that
/// the target's uid may write, with `hook` (if any) and `extra` flags.
fn launch_copy(e: &Suite, ws: &Scratch, hook: Option<&str>, extra: &[&str]) -> CageRun {
    let copy = ws.join("probe");
    copy_executable(Path::new(PROBE), &copy);
    std::os::unix::fs::chown(&copy, Some(65534), Some(65534)).unwrap();
    launch_of(e, "/workspace/probe", ws, hook, extra)
}

/// A file the cage's uid may write, changed in place after the supervisor described it and
/// before the exec (another writer of the workspace could), is hashed at the exec stop, when the
/// kernel lets no one write it: `--expect-sha256` of the file as it was refuses the file that
/// would run, and the record's digest is of those bytes. The hook appends a byte to the target's
/// copy of the probe; the control runs the same copy untouched under the same digest.
#[test]
fn a_file_changed_after_it_was_described_is_hashed_as_it_runs() {
    let Some(e) = Suite::new("changed_after_hash", PROBE) else { return };
    let ws = Scratch::new("exec-stop-touch");
    ws.give_to_nobody();
    let was = sha256_file(PROBE);
    let run = launch_copy(&e, &ws, Some("touch"), &["--expect-sha256", &was]);
    assert_eq!(run.state(), "BootstrapFailed", "{}", run.stderr);
    let failure = &run.record["failure"];
    assert_eq!((failure["stage"].as_str(), failure["code"].as_str()), (Some("verify"), Some("digest_mismatch")));
    assert_eq!(run.record["target"]["sha256"], sha256_file(ws.join("probe")).as_str(), "the bytes that would run");
    assert_ne!(run.record["target"]["sha256"], was.as_str());
    assert!(!ws.join("ran").exists(), "the changed file ran");
    let control = launch_copy(&e, &ws, None, &["--expect-sha256", &was]);
    assert_eq!(control.state(), "FullyEnforced", "control: {}", control.stderr);
    assert!(ws.join("ran").exists(), "control: the target runs and writes");
}

/// The supervisor hashes its guess of the target while the cage sets up; a file changed in
/// place before the target opens it is hashed again, never vouched for by the early digest:
/// `--expect-sha256` of the file as it was refuses the file as it is. Control: untouched, the
/// same digest runs.
#[test]
fn a_file_changed_before_it_was_opened_is_hashed_again() {
    let Some(e) = Suite::new("changed_before_open", PROBE) else { return };
    let ws = Scratch::new("exec-stop-touch-early");
    ws.give_to_nobody();
    let was = sha256_file(PROBE);
    let run = launch_copy(&e, &ws, Some("touch_before_open"), &["--expect-sha256", &was]);
    assert_eq!(run.state(), "BootstrapFailed", "{}", run.stderr);
    assert_eq!(run.record["failure"]["code"], "digest_mismatch", "{}", run.record["failure"]);
    assert_eq!(run.record["target"]["sha256"], sha256_file(ws.join("probe")).as_str());
    assert!(!ws.join("ran").exists(), "the changed file ran");
    let control = launch_copy(&e, &ws, None, &["--expect-sha256", &was]);
    assert_eq!(control.state(), "FullyEnforced", "control: {}", control.stderr);
    assert!(ws.join("ran").exists(), "control: the target runs and writes");
}

fn sha256_file(p: impl AsRef<std::path::Path>) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(p).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn exe_identity() {
    fact_fails("exe_identity", "exe=/probe-suid", &[], "executed file is");
}

#[test]
fn no_new_privs() {
    fact_fails("no_new_privs", "no_new_privs", &[], "NoNewPrivs is 0");
}

#[test]
fn seccomp_mode() {
    fact_fails("seccomp_mode", "seccomp", &[], "Seccomp is 0");
}

#[test]
fn bounding_set() {
    fact_fails("bounding_set", "bounding", &[], "CapBnd is");
}

/// As uid 0 without the bounding drop and securebits, exec hands root its capabilities back.
#[test]
fn permitted_and_effective_sets() {
    fact_fails("permitted_effective", "bounding", &["--uid", "0", "--gid", "0"], "CapEff is");
    fact_fails("permitted_effective", "bounding", &["--uid", "0", "--gid", "0"], "CapPrm is");
}

#[test]
fn inheritable_set() {
    fact_fails("inheritable_set", "caps", &[], "CapInh is");
}

#[test]
fn uids() {
    fact_fails("uids", "uid", &[], "uids are");
}

#[test]
fn gids() {
    fact_fails("gids", "gid", &[], "gids are");
}

#[test]
fn supplementary_groups() {
    fact_fails("groups", "groups", &[], "supplementary groups");
}

#[test]
fn net_namespace() {
    fact_fails("net_ns", "ns=net", &[], "net namespace");
}

#[test]
fn ipc_namespace() {
    fact_fails("ipc_ns", "ns=ipc", &[], "ipc namespace");
}

#[test]
fn uts_namespace() {
    fact_fails("uts_ns", "ns=uts", &[], "uts namespace");
}

#[test]
fn cgroup_namespace() {
    fact_fails("cgroup_ns", "ns=cgroup", &[], "cgroup namespace");
}

#[test]
fn launch_cgroup() {
    fact_fails("launch_cgroup", "cgroup", &[], "not in the launch cgroup");
}

#[test]
fn open_fds() {
    fact_fails("open_fds", "fd", &[], "open fds are");
}

#[test]
fn working_directory() {
    fact_fails("cwd", "cwd", &[], "cwd is");
}

#[test]
fn status_channel_eof() {
    fact_fails("status_channel", "channel", &[], "still holds the status channel");
}

/// The pid namespace cannot be left shared by a hook (the cage's pid 1 depends on it); its check
/// is covered by the unit tests of `observe::violations`. A hook is refused by a build without
/// the feature, and an unknown one by every build.
#[test]
fn an_unknown_hook_is_refused() {
    let Some(e) = Suite::new("unknown_hook", PROBE) else { return };
    let out = Command::new(&e.chio)
        .args(["cage", "run", "--", "/bin/true"])
        .env("CHIO_TEST_HOOK", "ns=pid")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("names no hook"));
}

/// A target killed from the host at its exec stop (the OOM killer, an operator) is a traced
/// zombie: the cage's init cannot finish dying until its tracer reaps it, and a supervisor that
/// only failed to detach and went on to wait for the init waited forever. The launch must end,
/// promptly, with the target's death by SIGKILL. (Control: the same launch without the hook.)
#[test]
fn a_target_killed_at_its_exec_stop_ends_the_launch() {
    let Some(e) = Suite::new("killed_at_exec_stop", PROBE) else { return };
    let ws = Scratch::new("exec-stop-killed");
    ws.give_to_nobody();
    let child = launch_command(&e, &[], "/probe", &ws, Some("kill_at_exec_stop"), &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let within = std::time::Duration::from_secs(20);
    let run = parse(chio_tests::output_within(child, within, "the launch whose target died at its exec stop"));
    assert_eq!(run.record["outcome"]["signal"], 9, "{}", run.record);
    assert_eq!(run.code, 137, "{}", run.stderr);
    assert!(!ws.join("ran").exists(), "the target ran");
    let control = launch(&e, &ws, None, &[]);
    assert_eq!((control.state(), control.code), ("FullyEnforced", 0), "control: {}", control.stderr);
}

/// An init that did not get a mount namespace of its own (a hook skips the unshare) must make no
/// mount at all: a pivot_root there, and the detach of the old root, would take the supervisor's
/// root away — the host's, for a one-shot launch. The launch fails at the namespaces stage before
/// the first mount. chio runs here in a private mount namespace of the test's, so that were the
/// guard ever gone, only that namespace would lose its root. Control: the same, without the hook.
#[test]
fn a_cage_never_mounts_in_its_supervisors_mount_namespace() {
    let Some(e) = Suite::new("mnt_ns_guard", PROBE) else { return };
    let ws = Scratch::new("exec-stop-mnt");
    ws.give_to_nobody();
    let private = ["unshare", "--mount", "--propagation", "private"];
    let run = |hook| parse(launch_command(&e, &private, "/probe", &ws, hook, &[]).output().unwrap());
    let hooked = run(Some("ns=mnt"));
    assert_eq!(hooked.state(), "BootstrapFailed", "{}", hooked.stderr);
    let failure = &hooked.record["failure"];
    assert_eq!((failure["stage"].as_str(), failure["code"].as_str()), (Some("namespaces"), Some("namespace_failed")));
    assert!(failure["detail"].as_str().unwrap().contains("supervisor's mount namespace"), "{failure}");
    assert!(!ws.join("ran").exists(), "the target ran");
    let control = run(None);
    assert_eq!(control.state(), "FullyEnforced", "control: {}", control.stderr);
    assert!(ws.join("ran").exists(), "control: the target runs and writes");
}

/// The init sheds its privileges (rlimits, bounding set, ids, capabilities, no_new_privs) once
/// the target exists; if any step fails it must end the cage — kill the target, held at its
/// exec stop, before one instruction runs — rather than stay in it privileged. A hook makes the
/// shedding fail. Its exit closes the status channel as a successful shedding does, but the
/// supervisor reads the init at the exec stop and finds it ended (or without its filter): the
/// launch fails before the target runs, and is never recorded FullyEnforced. Control: the same
/// launch without the hook.
#[test]
fn an_init_that_cannot_shed_its_privileges_ends_the_cage() {
    let Some(e) = Suite::new("init_shed_fails", PROBE) else { return };
    let ws = Scratch::new("exec-stop-shed");
    ws.give_to_nobody();
    let run = launch(&e, &ws, Some("init_shed_fails"), &[]);
    assert_eq!((run.state(), run.code), ("BootstrapFailed", 125), "{}", run.stderr);
    let failure = &run.record["failure"];
    if failure["stage"] == "observe" {
        let detail = failure["detail"].as_str().unwrap();
        assert!(detail.contains("the cage's init"), "the failure names the init: {detail}");
    }
    assert!(!ws.join("ran").exists(), "the target ran under an init that kept its privileges");
    let control = launch(&e, &ws, None, &[]);
    assert_eq!((control.state(), control.code), ("FullyEnforced", 0), "control: {}", control.stderr);
    assert!(ws.join("ran").exists(), "control: the target runs and writes");
}

/// An init that aborts under its filter when the target has ended (as a bug in it would: a
/// hook) ends the launch then, with an outcome and nothing left running — not at the deadline.
/// It once spun instead: `abort()`, refused the signal calls by the init's filter, faults on
/// purpose, and the supervisor's stack-overflow handler it inherited, refused in turn, went
/// back to the fault, again and again, a CPU's worth until the 60 s deadline. Control: the
/// same launch without the hook.
#[test]
fn an_init_that_aborts_ends_the_launch() {
    let Some(e) = Suite::new("init_aborts", PROBE) else { return };
    let ws = Scratch::new("exec-stop-aborts");
    ws.give_to_nobody();
    let started = std::time::Instant::now();
    let run = launch(&e, &ws, Some("init_aborts"), &["--timeout", "60s"]);
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(20), "the launch took {took:?}: {}", run.stderr);
    assert!(ws.join("ran").exists(), "the target ran before the init aborted");
    assert_eq!(run.record["outcome"]["signal"], libc::SIGKILL, "no report from the init: {}", run.record);
    assert!(run.record["outcome"]["limit_hit"].as_array().is_none_or(|l| l.is_empty()), "{}", run.record);
    assert!(chio_tests::lasting_orphaned_inits(std::time::Duration::from_secs(5)).is_empty());
    let control = launch(&e, &ws, None, &["--timeout", "60s"]);
    assert_eq!((control.state(), control.code), ("FullyEnforced", 0), "control: {}", control.stderr);
    assert_eq!(control.record["outcome"]["exit_code"], 0, "control: {}", control.record);
}

/// An init that stays in the cage privileged (a hook skips its shedding; it goes on to
/// supervise as if it had shed) is refused at the exec stop, where the supervisor reads the
/// init as it reads the target: root, every capability, no no_new_privs.
#[test]
fn an_init_left_privileged_is_refused_at_the_exec_stop() {
    fact_fails("init_privileged", "init_privileged", &[], "the cage's init runs with uids [0, 0, 0, 0]");
}

/// A target that never reaches its exec stop (its exec of a file on a file system that does
/// not answer, say) must not hold the supervisor — or a daemon's launch slot — for good: the
/// wait for the exec stop has a deadline, after which the target and its cage are killed and
/// the launch fails `setup_timeout`. A hook makes the target sleep instead of its exec and
/// shortens that deadline to 1 s. Control: the same launch without the hook.
#[test]
fn a_target_that_never_reaches_its_exec_ends_the_launch() {
    let Some(e) = Suite::new("stall_before_exec", PROBE) else { return };
    let ws = Scratch::new("exec-stop-stall");
    ws.give_to_nobody();
    let tag = format!("CHIO_TEST_STALL={}", std::process::id());
    let (key, value) = tag.split_once('=').unwrap();
    let mut cmd = launch_command(&e, &[], "/probe", &ws, Some("stall_before_exec"), &[]);
    let mut child = cmd.env(key, value).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let run = parse(child.wait_with_output().unwrap());
    assert_eq!((run.state(), run.code), ("BootstrapFailed", 125), "the launch ended: {}", run.stderr);
    let failure = &run.record["failure"];
    assert_eq!((failure["stage"].as_str(), failure["code"].as_str()), (Some("exec"), Some("setup_timeout")));
    let left = chio_tests::wait_untagged(&tag, std::time::Duration::from_secs(5));
    assert!(left.is_empty(), "cage processes left: {left:?}");
    assert!(!ws.join("ran").exists(), "the target ran");
    let control = launch(&e, &ws, None, &[]);
    assert_eq!((control.state(), control.code), ("FullyEnforced", 0), "control: {}", control.stderr);
    assert!(ws.join("ran").exists(), "control: the target runs and writes");
}
