//! What a one-shot launch keeps off its cage's critical path, checked in the supervisor's own
//! system calls (`strace` of the supervisor alone: following its children would trace the
//! target, which the supervisor seizes itself).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use chio_tests::{Scratch, Suite};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

/// Once the cage's init is cloned, the supervisor looks no path up through sysfs: the cgroup
/// mount was opened before, and the launch cgroup is made, limited, joined, read, swept beside
/// and removed from descriptors. An absolute path under `/sys/fs/cgroup` takes sysfs's lock for
/// `fs` and `cgroup`, and the init takes that lock as a writer at the same moment, to register
/// its new network namespace's loopback device (`tests/bench/trace/waits.py` measured ~130 µs a
/// launch of the two waiting on each other). Control: the same trace does see the supervisor's
/// sysfs lookups before the clone.
#[test]
fn nothing_is_looked_up_through_sysfs_once_the_init_is_cloned() {
    let Some(e) = Suite::new("sysfs_after_clone", PROBE) else { return };
    let dir = Scratch::new("sysfs-trace");
    let trace = dir.join("strace");
    let out = Command::new("strace")
        .args(["-qq", "-o", trace.to_str().unwrap(), "-e", "trace=%file,clone,clone3", "--"])
        .arg(&e.chio)
        .args(["cage", "run", "--json", "--timeout", "60s", "--rootfs", e.rootfs.to_str().unwrap()])
        .args(["--", "/probe", "euid"])
        .stdin(Stdio::null())
        .output()
        .expect("strace (apt-get install strace)");
    let run = chio_tests::parse(out);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    let calls = std::fs::read_to_string(&trace).unwrap();
    let (before, after) = calls.split_once("CLONE_NEWPID").expect("the trace shows the init's clone");
    let sysfs = |part: &str| part.lines().filter(|l| l.contains("\"/sys/")).map(str::to_string).collect::<Vec<_>>();
    assert!(!sysfs(before).is_empty(), "control: the trace shows sysfs lookups before the clone:\n{before}");
    assert_eq!(sysfs(after), Vec::<String>::new(), "sysfs looked up after the init's clone");
}

/// The CPUs `status` (a `/proc/PID/status` text) allows.
fn cpus_allowed(status: &str) -> String {
    let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
    line.expect("a Cpus_allowed_list line").trim().to_string()
}

/// The init starts on another CPU than its supervisor's (the supervisor narrows the init's CPUs
/// for a moment, `sys::start_elsewhere`), and the cage keeps every CPU its supervisor may run
/// on: the init, seen from the host while the cage runs, and the target, seen from inside.
#[test]
fn the_cage_keeps_every_cpu_of_its_supervisor() {
    let Some(e) = Suite::new("cage_cpus", PROBE) else { return };
    let ours = cpus_allowed(&std::fs::read_to_string("/proc/thread-self/status").unwrap());
    let run = e.caged(&[], &["dump-status"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(cpus_allowed(&run.stdout), ours, "the target's CPUs");

    let tag = format!("chio-cpus-{}", std::process::id());
    let mut sup = Command::new(&e.chio)
        .args(["cage", "run", "--timeout", "3s", "--rootfs", e.rootfs.to_str().unwrap()])
        .args(["--", "/probe", "sleeper", &tag])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(sup.stdout.take().unwrap()).lines().next().unwrap().unwrap();
    assert_eq!(line, "SLEEPING");
    let init = chio_tests::child_named(sup.id(), "chio-init").expect("the cage's init");
    let status = std::fs::read_to_string(format!("/proc/{init}/status")).unwrap();
    sup.wait().unwrap();
    assert_eq!(cpus_allowed(&status), ours, "the init's CPUs");
}
