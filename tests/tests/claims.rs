//! The claims docs/cage-run.md makes about a launch, each shown on a real cage: bind destinations under `/proc`
//! and `/dev` refused, nested binds resolved inside the new root, the fixed rlimits and hostname,
//! the CPU ceiling, the record's CPU time, default signals, umask and personality, no real-time
//! scheduling, the stderr cap, landlock's abstract-socket scoping on its own, and the init's own
//! identity and filter.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::linux::net::SocketAddrExt;
use std::process::{Command, Stdio};

use chio_tests::{build_rootfs, cage, parse, CageRun, Scratch, Suite};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn env(test: &str) -> Option<Suite> {
    Suite::new(test, PROBE)
}

#[test]
fn proc_and_dev_are_refused_as_bind_destinations() {
    let Some(e) = env("bind_proc_dev") else { return };
    let s = Scratch::new("bind-dest");
    for dest in ["/proc/sys", "/dev/null", "/proc", "/dev"] {
        let bind = format!("{}:{dest}", s.0.display());
        let run = e.caged(&["--ro-bind", &bind], &["euid"]);
        Suite::assert_stopped(&run, "path_refused");
        assert!(run.record["failure"]["detail"].as_str().unwrap().contains("which the cage owns"), "{dest}");
    }
    // Control: the same source elsewhere is bound.
    let run = e.caged(&["--ro-bind", &format!("{}:/data", s.0.display())], &["stat", "/data"]);
    assert!(run.stdout.starts_with("ESCAPED"), "{}", run.stdout);
}

/// A deeper bind destination is resolved inside the new root: an image symlink to a host path
/// leads nowhere on the host.
#[test]
fn nested_binds_resolve_inside_the_new_root() {
    let Some(e) = env("nested_bind") else { return };
    let s = Scratch::new("nested");
    let root = s.join("root");
    build_rootfs(&root, &e.probe);
    let host_dir = Scratch::new("nested-host");
    std::fs::create_dir_all(host_dir.join("sub")).unwrap();
    std::fs::create_dir_all(root.join("real/sub")).unwrap();
    std::os::unix::fs::symlink("/real", root.join("via")).unwrap();
    std::os::unix::fs::symlink(&host_dir.0, root.join("out")).unwrap();
    let src = Scratch::new("nested-src");
    std::fs::write(src.join("marker"), "bound").unwrap();
    let r = root.to_str().unwrap();
    // Through an image symlink inside the image: lands at /real/sub.
    let bind = format!("{}:/via/sub", src.0.display());
    let run = cage(&e.chio, &["--rootfs", r, "--ro-bind", &bind], &["/probe", "read", "/real/sub/marker", "bound"]);
    assert!(run.stdout.starts_with("ESCAPED"), "{}", run.stderr);
    // Through an image symlink naming a host directory: resolved in the cage, where it does not
    // exist — the launch fails and nothing is mounted on the host directory.
    let bind = format!("{}:/out/sub", src.0.display());
    let run = cage(&e.chio, &["--rootfs", r, "--ro-bind", &bind], &["/probe", "euid"]);
    assert_eq!(run.state(), "BootstrapFailed", "{}", run.stderr);
    assert!(run.stdout.is_empty());
    assert!(!host_dir.join("sub/marker").exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(host_dir.0.to_str().unwrap()));
}

fn cat(e: &Suite, flags: &[&str], path: &str) -> CageRun {
    let run = e.caged(flags, &["cat", path]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    run
}

/// Ignore `sig` with the raw syscall (glibc refuses its own 32 and 33).
fn ignore(sig: libc::c_int) -> std::io::Result<()> {
    let act: [u64; 4] = [libc::SIG_IGN as u64, 0, 0, 0]; // the kernel's struct sigaction
                                                         // SAFETY: rt_sigaction with a local kernel sigaction, no old action; SIG_IGN installs no
                                                         // handler (async-signal-safe between fork and exec).
    match unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, act.as_ptr(), std::ptr::null_mut::<u8>(), 8usize) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// The command starts with no signal blocked and none ignored but what its own start-up sets
/// (the probe is a Rust program: SIGPIPE), whatever its invoker ignored — an ignored signal
/// survives an exec. The invoker here ignores SIGINT, SIGUSR1, the two real-time signals glibc
/// keeps for itself (32, 33: its `signal` refuses them) and the last one (64), its umask is
/// 0077 and it runs without address-space randomisation: the command's umask is 0022 and its
/// personality Linux's own all the same. Control: outside a cage the probe, started the same
/// way, has them all ignored, the umask 0077 and `ADDR_NO_RANDOMIZE`.
#[test]
fn the_command_starts_with_default_signals_umask_and_personality() {
    use std::os::unix::process::CommandExt;
    let Some(e) = env("default_signals") else { return };
    let ignored = [libc::SIGINT, libc::SIGUSR1, 32, 33, 64];
    let started = |program: &std::path::Path, args: &[&str]| {
        let mut c = Command::new(program);
        c.args(args).stdin(Stdio::null());
        // SAFETY: only rt_sigaction, umask and personality between fork and exec.
        unsafe {
            c.pre_exec(move || {
                libc::umask(0o077);
                libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
                ignored.iter().try_for_each(|&s| ignore(s))
            })
        };
        c.output().unwrap()
    };
    // /proc/PID/status: signal sets in hex, the umask in octal.
    let field = |text: &str, k: &str| -> u64 {
        let v = text.lines().find_map(|l| l.strip_prefix(&format!("{k}:"))).unwrap_or_else(|| panic!("{k}: {text}"));
        u64::from_str_radix(v.trim(), if k == "Umask" { 8 } else { 16 }).unwrap()
    };
    let root = e.rootfs.to_str().unwrap();
    let out = started(&e.chio, &["cage", "run", "--rootfs", root, "--", "/probe", "cat", "/proc/self/status"]);
    let status = String::from_utf8_lossy(&out.stdout);
    let sigpipe = 1u64 << (libc::SIGPIPE - 1);
    assert_eq!((field(&status, "SigBlk"), field(&status, "SigIgn")), (0, sigpipe), "{status}");
    // And the invoker's umask (0077 here, a daemon's unit's) is not the command's: 0022.
    assert_eq!(field(&status, "Umask"), 0o022, "{status}");
    let control = started(&e.probe, &["cat", "/proc/self/status"]);
    let control = String::from_utf8_lossy(&control.stdout);
    let all = ignored.iter().fold(0u64, |m, &s| m | 1 << (s - 1));
    assert_eq!(field(&control, "SigIgn") & all, all, "control: {control}");
    assert_eq!(field(&control, "Umask"), 0o077, "control: {control}");
    // The invoker ran without address-space randomisation (`setarch -R`); the command does not.
    let out = started(&e.chio, &["cage", "run", "--rootfs", root, "--", "/probe", "cat", "/proc/self/personality"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "00000000");
    let control = started(&e.probe, &["cat", "/proc/self/personality"]);
    assert_eq!(String::from_utf8_lossy(&control.stdout).trim(), "00040000", "control");
}

/// A cage never runs real-time: chio started under `chrt -f` (as a unit's
/// `CPUSchedulingPolicy=fifo` would start it) launches, and the command's policy is SCHED_OTHER.
/// It once failed at the cgroup step instead (EINVAL: a real-time task cannot join a launch
/// cgroup without a real-time budget on this kernel), and on a kernel without RT group
/// scheduling the command would have run real-time. Control: the probe under the same `chrt`
/// is SCHED_FIFO.
#[test]
fn a_cage_never_runs_real_time() {
    let Some(e) = env("realtime") else { return };
    // Field 41 of /proc/PID/stat, the scheduling policy (0 SCHED_OTHER, 1 SCHED_FIFO).
    let policy = |stat: &str| -> u32 {
        let rest = stat.rsplit_once(") ").unwrap_or_else(|| panic!("{stat}")).1;
        rest.split_whitespace().nth(41 - 3).unwrap().parse().unwrap()
    };
    let root = e.rootfs.to_str().unwrap();
    let out = Command::new("chrt")
        .args(["-f", "10"])
        .arg(&e.chio)
        .args(["cage", "run", "--json", "--rootfs", root, "--", "/probe", "cat", "/proc/self/stat"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run = chio_tests::parse(out);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(policy(&run.stdout), libc::SCHED_OTHER as u32, "{}", run.stdout);
    let control = Command::new("chrt").args(["-f", "10"]).arg(&e.probe).args(["cat", "/proc/self/stat"]).output();
    assert_eq!(policy(&String::from_utf8(control.unwrap().stdout).unwrap()), libc::SCHED_FIFO as u32, "control");
}

#[test]
fn fixed_rlimits_and_hostname() {
    let Some(e) = env("rlimits_hostname") else { return };
    let limits = cat(&e, &[], "/proc/self/limits").stdout;
    let line = |name: &str| {
        limits.lines().find(|l| l.starts_with(name)).unwrap().split_whitespace().collect::<Vec<_>>().join(" ")
    };
    assert!(line("Max open files").starts_with("Max open files 128 128"), "{limits}");
    assert!(line("Max core file size").starts_with("Max core file size 0 0"), "{limits}");
    assert!(line("Max file size").starts_with("Max file size 16777216 16777216"), "{limits}");
    assert!(line("Max pending signals").starts_with("Max pending signals 256 256"), "{limits}");
    assert!(line("Max locked memory").starts_with("Max locked memory 65536 65536"), "{limits}");
    // No real-time or raised priority, whatever the invoker's limits (0 on this machine's root
    // too, which cannot raise them: without CAP_SYS_RESOURCE no invoker here can show the
    // difference).
    assert!(line("Max realtime priority").starts_with("Max realtime priority 0 0"), "{limits}");
    assert!(line("Max nice priority").starts_with("Max nice priority 0 0"), "{limits}");
    assert_eq!(cat(&e, &[], "/proc/sys/kernel/hostname").stdout.trim(), "chio");
    // Control: the host's own limits and name differ.
    let host_limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    assert!(!host_limits.lines().any(|l| l
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .starts_with("Max pending signals 256 ")));
}

#[test]
fn the_cpu_ceiling_holds() {
    let Some(e) = env("cpus") else { return };
    let run = e.caged(&["--cpus", "0.2"], &["spin", "1500"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    let o = &run.record["outcome"];
    let (cpu, wall) = (o["cpu_ms"].as_u64().unwrap(), o["wall_ms"].as_u64().unwrap());
    assert!(cpu * 100 <= wall * 35, "0.2 CPU: {cpu} ms of CPU in {wall} ms");
    // Control: a whole CPU lets it spin all the time.
    let run = e.caged(&["--cpus", "1"], &["spin", "1500"]);
    let o = &run.record["outcome"];
    assert!(o["cpu_ms"].as_u64().unwrap() * 100 >= o["wall_ms"].as_u64().unwrap() * 60, "{o}");
}

/// The record's CPU time is the command's own (the launch cgroup's accounting; the init's
/// rusage report stands in only where a cgroup gave none): a probe that spends over a second of
/// CPU, part of it in the kernel, counts it itself, and the record says the same — it may add
/// only what the probe spent after counting, and the init's share.
#[test]
fn the_records_cpu_time_is_the_commands() {
    let Some(e) = env("cpu_time") else { return };
    let run = e.caged(&[], &["burn", "1200"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    let field = |k: &str| -> i64 {
        let v = run.stdout.split_whitespace().find_map(|w| w.strip_prefix(&format!("{k}=")));
        v.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{k} in {:?}", run.stdout))
    };
    let (user, sys) = (field("user_us"), field("sys_us"));
    assert!(sys >= 20_000, "the probe spent {sys} µs in the kernel: too little to tell its sign");
    let own_ms = (user + sys) / 1000;
    let recorded = run.record["outcome"]["cpu_ms"].as_i64().unwrap();
    assert!((own_ms..=own_ms + 25).contains(&recorded), "the record says {recorded} ms; the probe counted {own_ms} ms");
}

#[test]
fn stderr_is_capped_like_stdout() {
    let Some(e) = env("stderr_cap") else { return };
    let run = e.caged(&["--output-limit", "64K"], &["flood-stderr", "4"]);
    assert_eq!(run.state(), "FullyEnforced");
    let o = &run.record["outcome"];
    assert_eq!(o["stderr_bytes"], 64 << 10);
    assert_eq!(o["stderr_dropped"], (4 << 20) - (64 << 10));
    assert!(o["limit_hit"].to_string().contains("output"));
    // What reached chio's stderr: 64 KiB of the target's, then the record.
    assert!(run.stderr.bytes().filter(|b| *b == b'e').count() >= 64 << 10);
    assert!(run.stderr.len() < (64 << 10) + 16384, "{} bytes", run.stderr.len());
}

/// Landlock's abstract-unix-socket scope on its own: with the cage left in the host's network
/// namespace (a test hook, shadow mode), connecting to a host abstract socket is still refused;
/// with landlock off too it connects.
#[test]
fn landlock_scoping_alone_refuses_host_abstract_sockets() {
    let Some(e) = env("landlock_scope") else { return };
    let name = format!("chio-scope-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let launch = |env: &[(&str, &str)]| {
        let out = Command::new(&e.chio)
            .args(["cage", "run", "--json", "--mode", "shadow", "--rootfs", e.rootfs.to_str().unwrap()])
            .args(["--", "/probe", "abstract-connect", &name])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        parse(out)
    };
    let run = launch(&[("CHIO_TEST_HOOK", "ns=net")]);
    assert!(run.record["not_confined"].to_string().contains("net namespace"), "{}", run.stderr);
    assert!(run.stdout.starts_with("REFUSED") && run.stdout.trim_end().ends_with("errno=1"), "{}", run.stdout);
    let run = launch(&[("CHIO_TEST_HOOK", "ns=net"), ("CHIO_TEST_LANDLOCK_ABI", "0")]);
    assert!(run.stdout.starts_with("ESCAPED"), "control: {}", run.stdout);
}

/// Landlock's signal scope on its own: the cage's init runs as the target's uid in the target's
/// pid namespace, so neither the uid nor the namespace stops the target signalling it — only the
/// scope does (the init is outside the target's landlock domain). Control: landlock capped at ABI
/// 5, which has no scoping (shadow mode), and the same kill is permitted.
#[test]
fn landlock_signal_scope_alone_keeps_the_target_from_its_init() {
    let Some(e) = env("landlock_signal_scope") else { return };
    let launch = |env: &[(&str, &str)]| {
        let out = Command::new(&e.chio)
            .args(["cage", "run", "--json", "--mode", "shadow", "--rootfs", e.rootfs.to_str().unwrap()])
            .args(["--", "/probe", "kill", "1"])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        parse(out)
    };
    let run = launch(&[]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(run.stdout.starts_with("REFUSED") && run.stdout.trim_end().ends_with("errno=1"), "{}", run.stdout);
    let run = launch(&[("CHIO_TEST_LANDLOCK_ABI", "5")]);
    assert!(run.stdout.starts_with("ESCAPED"), "control: {}", run.stdout);
}

/// The init sheds its privileges too: the target's uid, no capabilities, no_new_privs and a
/// seccomp filter of its own.
#[test]
fn the_init_runs_as_the_target_with_its_own_filter() {
    let Some(e) = env("init_identity") else { return };
    let status = cat(&e, &[], "/proc/1/status").stdout;
    let field = |k: &str| {
        status.lines().find_map(|l| l.strip_prefix(k)).unwrap().split_whitespace().collect::<Vec<_>>().join(" ")
    };
    assert_eq!(field("Uid:"), "65534 65534 65534 65534");
    assert_eq!(field("Gid:"), "65534 65534 65534 65534");
    for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(cap), "0000000000000000", "{cap}");
    }
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2");
    assert_eq!(field("Name:"), "chio-init");
}
