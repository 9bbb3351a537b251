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

/// The largest buffer the supervisor's `read`s and `recvmsg`s ask for in `strace` output.
fn largest_read(trace: &str) -> usize {
    let size = |l: &str| -> Option<usize> {
        if l.starts_with("recvmsg(") {
            let at = l.find("iov_len=")? + "iov_len=".len();
            l[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        } else if l.starts_with("read(") {
            // `read(8, "…"..., 4096)      = 4096`: the last argument before the result.
            l.rsplit_once('=')?.0.trim_end().strip_suffix(')')?.rsplit(", ").next()?.parse().ok()
        } else {
            None
        }
    };
    trace.lines().filter_map(size).max().unwrap_or(0)
}

/// What the supervisor reads is sized to what comes: a status message into a buffer of its
/// length (peeked first), the target's output in reads that start at a page and grow while
/// they come back full. A zeroed 64 KiB buffer for each message and each stream was sixteen
/// fresh pages to fault in apiece, in the supervisor and again in the init (~45 page faults a
/// launch). Control: a command writing 2 MiB to stderr is read 64 KiB at a time, all of it.
#[test]
fn the_supervisor_reads_a_little_output_in_little_reads() {
    let Some(e) = Suite::new("small_reads", PROBE) else { return };
    let dir = Scratch::new("reads-trace");
    let traced = |name: &str, argv: &[&str]| {
        let trace = dir.join(name);
        let out = Command::new("strace")
            .args(["-qq", "-s", "1", "-o", trace.to_str().unwrap(), "-e", "trace=read,recvmsg", "--"])
            .arg(&e.chio)
            .args(["cage", "run", "--json", "--timeout", "60s", "--rootfs", e.rootfs.to_str().unwrap()])
            .arg("--")
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .expect("strace (apt-get install strace)");
        (chio_tests::parse(out), std::fs::read_to_string(&trace).unwrap())
    };
    let (run, quiet) = traced("quiet", &["/probe", "euid"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(quiet.contains("MSG_PEEK|MSG_TRUNC"), "control: the trace shows the status channel's reads:\n{quiet}");
    let largest = largest_read(&quiet);
    assert!(largest > 0 && largest < 64 << 10, "a read of {largest} bytes for a command that wrote a line:\n{quiet}");
    let (run, loud) = traced("loud", &["/probe", "flood-stderr", "2"]);
    let outcome = &run.record["outcome"];
    let read = outcome["stderr_bytes"].as_u64().unwrap() + outcome["stderr_dropped"].as_u64().unwrap();
    assert_eq!(read, 2 << 20, "all of the 2 MiB read (relayed up to the output limit, the rest dropped): {outcome}");
    assert_eq!(largest_read(&loud), 64 << 10, "control: a command writing 2 MiB is read 64 KiB at a time");
}
