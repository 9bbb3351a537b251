//! The repository engine SIGKILLed at each stage of `execute` — before the launch, during the
//! command, while a snapshot object is half written, before and after the head moves (the
//! receipts, with the retained result, come last in one transaction), during the command with
//! its janitor killed first — and `chio repository recover` after it: no process or launch cgroup left, the
//! workspace exactly the last snapshot the receipts attest, the operation never run again, the
//! receipt chain intact; and a mount below the state directory, which recover names and leaves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chio_tests::{chio_bin, orphaned_inits, privileged, Scratch};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");
const ORIGINAL: &str = "def add(a, b):\n    return a - b\n";

fn chio() -> Command {
    let mut c = Command::new(chio_bin(&PathBuf::from(PROBE)));
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn run(args: &[&str]) -> Output {
    chio().args(args).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The tests here take turns: every launch sweeps away launch cgroups whose supervisor is gone,
/// and one test's launch would otherwise remove what another leaves for `recover` to find.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Fixture {
    _turn: std::sync::MutexGuard<'static, ()>,
    _dir: Scratch,
    state: PathBuf,
    public: PathBuf,
}

/// A workspace over a one-file repository with one committed transition already made.
fn fixture(tag: &str) -> Fixture {
    let turn = TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = Scratch::new(tag);
    let repo = dir.join("src");
    std::fs::create_dir_all(repo.join("package")).unwrap();
    std::fs::write(repo.join("package/calc.py"), ORIGINAL).unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .current_dir(&repo)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .output()
            .unwrap();
        assert!(ok.status.success());
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-qm", "base"]);
    let key = dir.join("key");
    assert!(run(&["keys", "generate", "--out", s(&key)]).status.success());
    let state = dir.join("ws");
    let seed = key.join("signing.seed");
    let out = run(&[
        "repository",
        "init",
        "--state",
        s(&state),
        "--repository",
        s(&repo),
        "--revision",
        "HEAD",
        "--source-path",
        "package",
        "--kernel-key",
        s(&seed),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let f = Fixture { state, public: key.join("public.key"), _dir: dir, _turn: turn };
    assert_eq!(execute(&f, "setup", "echo one > package/one.txt", None).status.code(), Some(0));
    f
}

fn execute(f: &Fixture, key: &str, command: &str, crash: Option<&str>) -> Output {
    let mut c = chio();
    c.args([
        "repository",
        "execute",
        "--state",
        s(&f.state),
        "--operation-key",
        key,
        "--deadline",
        "60",
        "--",
        command,
    ]);
    if let Some(point) = crash {
        c.env("CHIO_TEST_CRASH", point);
    }
    c.output().unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Every launch cgroup the receipts name.
fn recorded_cgroups(f: &Fixture) -> Vec<String> {
    let out = run(&[
        "receipt",
        "list",
        "--receipt-db",
        s(&f.state.join("receipts.db")),
        "--kind",
        "launch_enforcement",
        "--limit",
        "1000",
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .flat_map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["receipt"]["body"]["launch_record"]["cgroup"]["paths"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|p| p.as_str().unwrap().to_string())
        })
        .collect()
}

/// After the crash: nothing runs before recovery; recover, then check everything the issue asks.
fn recover_and_check(f: &Fixture, calc_after: &str, marker: Option<&str>) -> Value {
    let early = execute(f, "early", "echo early > package/early.txt", None);
    assert_eq!(early.status.code(), Some(3), "{}", String::from_utf8_lossy(&early.stderr));
    assert!(String::from_utf8_lossy(&early.stderr).contains("recover"));
    let out = run(&["repository", "recover", "--state", s(&f.state)]);
    assert_eq!(out.status.code(), Some(0), "recover: {}", String::from_utf8_lossy(&out.stderr));
    let report = json(&out);
    assert_eq!(report["left_in_place"], Value::Array(vec![]), "{report}");
    // No process, no cgroup.
    let until = Instant::now() + Duration::from_secs(5);
    while !orphaned_inits().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(orphaned_inits(), Vec::<u32>::new(), "cage inits outlived the engine");
    for p in recorded_cgroups(f) {
        assert!(!Path::new(&p).exists(), "launch cgroup {p} left behind");
    }
    if let Some(m) = marker {
        let live = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .any(|c| String::from_utf8_lossy(&c).contains(m));
        assert!(!live, "the command's process {m} is still running");
    }
    // The workspace is the snapshot the receipts attest; nothing half-written remains.
    let live = f.state.join("workspace/package");
    assert_eq!(std::fs::read_to_string(live.join("calc.py")).unwrap(), calc_after);
    assert_eq!(std::fs::read_to_string(live.join("one.txt")).unwrap(), "one\n");
    assert!(!live.join("started.txt").exists());
    let tmp_objects = walk_names(&f.state.join("objects")).into_iter().filter(|n| n.starts_with(".tmp-")).count();
    assert_eq!(tmp_objects, 0, "half-written objects remain");
    assert_eq!(std::fs::read_dir(f.state.join("tmp")).unwrap().count(), 0);
    // The chain verifies under the kernel key.
    let out = run(&[
        "receipt",
        "verify-chain",
        "--receipt-db",
        s(&f.state.join("receipts.db")),
        "--trusted-key",
        s(&f.public),
    ]);
    assert!(out.status.success(), "chain: {}", String::from_utf8_lossy(&out.stdout));
    // Never run twice under its key.
    let again = execute(f, "crash", "echo again > package/again.txt", None);
    assert_eq!(again.status.code(), Some(4), "{}", String::from_utf8_lossy(&again.stderr));
    let again = execute(f, "crash", "echo changed > package/calc.py", None);
    assert_eq!(again.status.code(), Some(4), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(!live.join("again.txt").exists());
    let st = json(&run(&["repository", "status", "--state", s(&f.state), "--json"]));
    assert_eq!(st["operations"]["outcome_unknown"], 1, "{st}");
    // And the workspace goes on.
    assert_eq!(execute(f, "next", "echo two > package/two.txt", None).status.code(), Some(0));
    report
}

fn walk_names(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            v.extend(walk_names(&e.path()));
        } else {
            v.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    v
}

fn crash_at(point: &str, calc_after: &str) {
    if !privileged(point) {
        return;
    }
    let f = fixture(&format!("crash-{point}"));
    let out = execute(&f, "crash", "echo changed > package/calc.py", Some(point));
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{point}: the crash point was not reached");
    let report = recover_and_check(&f, calc_after, None);
    // The report says what recovery found: a head that had moved past the receipts, and the
    // half-written object it removed.
    assert_eq!(report["head_was"].is_string(), point == "committed", "{point}: {report}");
    if point == "snapshot" {
        assert!(report["temporary_removed"].as_u64() >= Some(1), "{report}");
    }
}

#[test]
fn killed_before_the_launch() {
    crash_at("dispatched", ORIGINAL);
}

#[test]
fn killed_while_a_snapshot_object_is_half_written() {
    crash_at("snapshot", ORIGINAL);
}

#[test]
fn killed_before_the_receipt_is_appended() {
    crash_at("receipt", ORIGINAL);
}

/// The head moved, the receipts not yet appended: the receipts are the authority.
#[test]
fn killed_after_the_head_moved_before_the_receipts() {
    crash_at("committed", ORIGINAL);
}

#[test]
fn killed_during_the_command() {
    killed_mid_command("during", false);
}

/// The engine's janitor — which removes the launch cgroup when the engine dies — killed first:
/// `recover` removes the cgroup the enforcement receipt names.
#[test]
fn killed_with_its_janitor_during_the_command() {
    if let Some(removed) = killed_mid_command("during_with_janitor", true) {
        assert!(!removed.as_array().unwrap().is_empty(), "recover removed no launch cgroup: {removed}");
    }
}

/// The engine's children named `chio-janitor`.
fn janitors_of(engine: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let ppid = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            comm.trim_end() == "chio-janitor" && ppid == Some(engine)
        })
        .collect()
}

/// SIGKILL the engine (its janitor first, when `janitor`) while the command runs, recover, and
/// check; the cgroups recover removed (None: not privileged, nothing ran).
fn killed_mid_command(tag: &str, janitor: bool) -> Option<Value> {
    if !privileged(tag) {
        return None;
    }
    let f = fixture(&format!("crash-{tag}"));
    let marker = format!("sleep 30.{}", std::process::id());
    let mut child = chio()
        .args(["repository", "execute", "--state", s(&f.state), "--operation-key", "crash", "--deadline", "60", "--"])
        .arg(format!("echo changed > package/calc.py; echo > package/started.txt; {marker}"))
        .spawn()
        .unwrap();
    let started = f.state.join("workspace/package/started.txt");
    let until = Instant::now() + Duration::from_secs(20);
    while !started.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(started.exists(), "the command never started");
    if janitor {
        let janitors = janitors_of(child.id());
        assert_eq!(janitors.len(), 1, "the engine's janitor: {janitors:?}");
        // SAFETY: kill on a process of the engine this test started.
        assert_eq!(unsafe { libc::kill(janitors[0], libc::SIGKILL) }, 0);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    if janitor {
        // With no janitor, the cgroup outlives the engine until recover removes it (or the next
        // launch's sweep of launch cgroups whose supervisor is gone: none runs meanwhile, the
        // tests here take turns).
        std::thread::sleep(Duration::from_millis(300));
        let left: Vec<String> = recorded_cgroups(&f).into_iter().filter(|p| Path::new(p).exists()).collect();
        assert!(!left.is_empty(), "no launch cgroup outlived the engine and its janitor");
    }
    Some(recover_and_check(&f, ORIGINAL, Some(&marker))["cgroups_removed"].clone())
}

/// A mount point below the state directory is none of chio's: `recover` leaves it in place and
/// says so (exit 3), naming it as it is named (a space in it, which the mount table writes as
/// `\040`) — and one where recover removes temporaries, in `tmp`, is left with what is on it:
/// before, the host directory bound there was emptied. Run in a mount namespace of its own,
/// which takes the mounts away with it; the same recover without the mounts is clean.
#[test]
fn recover_names_a_mount_it_did_not_make() {
    if !privileged("recover_mount") {
        return;
    }
    let f = fixture("recover-mount");
    let host = f.state.with_extension("host");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("kept"), "host").unwrap();
    for dir in ["extra", "tmp/left over", "tmp/restore/deep"] {
        std::fs::create_dir_all(f.state.join(dir)).unwrap();
    }
    // What a crash leaves beside the mount: removed, and counted.
    for file in ["tmp/restore/deep/f", "tmp/git-scratch", "head.tmp", "snapshots/s.tmp"] {
        std::fs::write(f.state.join(file), "half").unwrap();
    }
    let script = "mount -t tmpfs chio-test \"$1/extra\" && mount --bind \"$3\" \"$1/tmp/left over\" && \
                  exec \"$2\" repository recover --state \"$1\"";
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script, "sh", s(&f.state)])
        .arg(chio_bin(&PathBuf::from(PROBE)))
        .arg(&host)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let report = json(&out);
    let mount = |m: &str| format!("mount point {}: not made by chio; unmount it yourself", f.state.join(m).display());
    assert_eq!(report["left_in_place"], serde_json::json!([mount("extra"), mount("tmp/left over")]), "{report}");
    assert_eq!(std::fs::read_to_string(host.join("kept")).unwrap(), "host", "the bound host directory");
    assert_eq!(report["temporary_removed"], 4, "{report}");
    for gone in ["tmp/restore", "tmp/git-scratch", "head.tmp", "snapshots/s.tmp"] {
        assert!(!f.state.join(gone).exists(), "{gone} is left");
    }
    std::fs::remove_dir_all(&host).unwrap();
    std::fs::remove_dir(f.state.join("tmp/left over")).unwrap();
    // Control: the same recover, no mount.
    let out = run(&["repository", "recover", "--state", s(&f.state)]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json(&out)["left_in_place"], serde_json::json!([]));
}
