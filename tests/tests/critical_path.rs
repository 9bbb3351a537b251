//! What a one-shot launch keeps off its cage's critical path, checked in the supervisor's own
//! system calls (`strace` of the supervisor alone: following its children would trace the
//! target, which the supervisor seizes itself).

#![allow(clippy::unwrap_used, clippy::expect_used)]

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
