//! The cage security round: escapes through the host side of what a cage touches — bind and
//! workspace sources, files a cage leaves for the host, host-global `/proc` and `/dev` inodes,
//! the supervisor's own stdin and output, the target file, and host-wide pools. Every probe is
//! refused in a cage and paired with a control showing the same action works without the
//! restriction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;

use chio_tests::Control::{Nobody, NobodyInUserns};
use chio_tests::{assert_escaped, cage, host, host_as, relay_data, Overlay, Scratch, Stalling, Suite};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn env(test: &str) -> Option<Suite> {
    Suite::new(test, PROBE)
}

// ---- operator paths never follow a symlink --------------------------------------------------

/// One cage plants `W/next -> /` in its workspace; a later launch given `--workspace W/next`
/// (or a bind of it, or a path through it) must be refused, naming the link.
#[test]
fn planted_symlink_is_never_a_bind_source() {
    let Some(e) = env("planted_symlink") else { return };
    let ws = Scratch::new("plant");
    ws.give_to_nobody();
    let w = ws.0.to_str().unwrap();
    let plant = e.caged(&["--workspace", w], &["symlink", "/", "/workspace/next"]);
    assert!(plant.stdout.starts_with("ESCAPED"), "the first cage may create a symlink: {}", plant.stdout);
    let next = ws.join("next");
    let n = next.to_str().unwrap();
    // Control: on the host, the planted link leads to the host's root.
    assert_escaped("planted link", host(&e.probe, &["read", &format!("{n}/etc/hostname")]));
    let bind = format!("{n}:/mnt");
    let through = format!("{n}/etc:/mnt");
    for flags in [vec!["--workspace", n], vec!["--bind", &bind], vec!["--ro-bind", &bind], vec!["--ro-bind", &through]]
    {
        let run = e.caged(&flags, &["read", "/workspace/etc/shadow"]);
        Suite::assert_stopped(&run, "path_refused");
        let detail = run.record["failure"]["detail"].as_str().unwrap();
        assert!(detail.contains(&format!("{n} is a symbolic link")), "{flags:?}: names the link: {detail}");
    }
    let run = cage(&e.chio, &["--rootfs", n], &["/bin/true"]);
    Suite::assert_stopped(&run, "path_refused");
}

#[test]
fn the_record_names_each_source_by_device_and_inode() {
    let Some(e) = env("source_identity") else { return };
    let ws = Scratch::new("identity");
    let extra = Scratch::new("identity-ro");
    let bind = format!("{}:/data", extra.0.display());
    let run = e.caged(&["--workspace", ws.0.to_str().unwrap(), "--ro-bind", &bind], &["euid"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    let sources = run.record["reported"]["sources"].as_array().unwrap();
    for (dest, dir, writable) in
        [("/workspace", &ws.0, true), ("/data", &extra.0, false), ("/", &e.rootfs.into(), false)]
    {
        let m = std::fs::metadata(dir).unwrap();
        let s = sources.iter().find(|s| s["dest"] == dest).unwrap_or_else(|| panic!("{dest} in {sources:?}"));
        // 64-bit identifiers are decimal strings in the record (exact in canonical JSON).
        let id = (
            s["device"].as_str().unwrap().parse::<u64>().unwrap(),
            s["inode"].as_str().unwrap().parse::<u64>().unwrap(),
        );
        assert_eq!(id, (m.dev(), m.ino()), "{dest}");
        assert_eq!(s["writable"], writable, "{dest}");
    }
}

/// A read-only bind does not stop connect(): a socket file as a source is refused.
#[test]
fn a_unix_socket_is_never_a_bind_source() {
    let Some(e) = env("socket_bind") else { return };
    let s = Scratch::new("sock");
    let path = s.join("service.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let bind = format!("{}:/run/service.sock", path.display());
    let run = e.caged(&["--ro-bind", &bind], &["stat", "/run/service.sock"]);
    Suite::assert_stopped(&run, "path_refused");
    assert!(run.record["failure"]["detail"].as_str().unwrap().contains("unix socket"), "{}", run.stderr);
    // Control: the socket is reachable by path.
    assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
}

// ---- the supervisor's own stdin and output -----------------------------------------------------

/// `chio cage run` with `stdin` as its stdin, the probe rootfs, and `args`; returns the run.
fn with_stdin(
    e: &Suite,
    stdin: std::process::Stdio,
    flags: &[&str],
    args: &[&str],
    feed: Option<&[u8]>,
) -> chio_tests::CageRun {
    use std::io::Write;
    let mut cmd = std::process::Command::new(&e.chio);
    cmd.args(["cage", "run", "--json", "--rootfs", e.rootfs.to_str().unwrap()]).args(flags).arg("--").arg("/probe");
    let mut child = cmd
        .args(args)
        .stdin(stdin)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if let (Some(data), Some(mut w)) = (feed, child.stdin.take()) {
        w.write_all(data).unwrap();
    }
    chio_tests::parse(child.wait_with_output().unwrap())
}

#[test]
fn stdin_is_never_the_hosts_file_description() {
    let Some(e) = env("stdin_host") else { return };
    // A pipe holding data: the target reads EOF from its own /dev/null.
    let run = with_stdin(&e, std::process::Stdio::piped(), &[], &["read-stdin"], Some(b"host secret\n"));
    run.assert_refused("stdin pipe");
    // A terminal: the target's stdin is not it.
    let (_master, slave) = chio_tests::pty();
    let run = with_stdin(&e, slave.try_clone().unwrap().into(), &[], &["stdin-tty"], None);
    run.assert_refused("stdin terminal");
    // Controls: the probe itself, given the same pipe or terminal, reads and sees them.
    let out = std::process::Command::new(&e.probe).arg("stdin-tty").stdin(slave).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ESCAPED"), "control: stdin is a terminal");
    let mut c = std::process::Command::new(&e.probe)
        .arg("read-stdin")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut c.stdin.take().unwrap(), b"host secret\n").unwrap();
    assert!(String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).starts_with("ESCAPED"));
}

#[test]
fn dash_i_feeds_stdin_through_a_pipe() {
    let Some(e) = env("stdin_feed") else { return };
    let run = with_stdin(&e, std::process::Stdio::piped(), &["-i"], &["read-stdin"], Some(b"fed line\n"));
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(run.stdout.contains("fed line"), "{}", run.stdout);
    // Even with -i the target's fd 0 is a pipe of the supervisor's, never the terminal.
    let (_master, slave) = chio_tests::pty();
    let run = with_stdin(&e, slave.into(), &["-i"], &["stdin-tty"], None);
    run.assert_refused("stdin terminal with -i");
}

/// A reader that never reads chio's stdout (a full pipe, a stopped terminal) must not hold the
/// supervisor past the deadline. What chio read but the reader never took is dropped, not
/// counted as delivered: the record's `stdout_bytes` is what the pipe holds, to the byte.
#[test]
fn the_deadline_fires_whatever_the_output_side_does() {
    let Some(e) = env("deadline_output") else { return };
    let (master, slave) = chio_tests::pty();
    let (mut pipe_r, pipe_w) = pipe();
    for (what, out) in [("unread pipe", std::process::Stdio::from(pipe_w)), ("unread terminal", slave.into())] {
        let flags = ["--output-limit", "256M"];
        let (status, took, rec) =
            against_a_2s_deadline(&e, what, &flags, &["flood", "64"], std::process::Stdio::null(), out);
        assert_eq!(status.code(), Some(137), "{what}");
        let hit = rec["outcome"]["limit_hit"].to_string();
        assert!(hit.contains("wall_time"), "{what}: {hit}");
        assert!(took < std::time::Duration::from_secs(8), "{what}: took {took:?}");
        if what == "unread pipe" {
            // Every writer is gone with chio: this reads what the pipe held, then EOF.
            let mut held = Vec::new();
            std::io::Read::read_to_end(&mut pipe_r, &mut held).unwrap();
            let o = &rec["outcome"];
            assert_eq!(o["stdout_bytes"], held.len(), "{what}: {o}");
            assert!(o["stdout_dropped"].as_u64().is_some_and(|d| d > 0), "{what}: {o}");
        }
    }
    drop((master, pipe_r));
}

/// `chio cage run --json --timeout 2s FLAGS -- /probe ARGS` with this stdin and stdout, waited
/// for at most 20 s (one still running then fails the test; it is killed, not waited for: it may
/// be held in the kernel until the test's file system goes): its status, how long it took and
/// its record.
fn against_a_2s_deadline(
    e: &Suite,
    what: &str,
    flags: &[&str],
    args: &[&str],
    stdin: std::process::Stdio,
    stdout: std::process::Stdio,
) -> (std::process::ExitStatus, std::time::Duration, serde_json::Value) {
    let err = Scratch::new("deadline-err");
    let started = std::time::Instant::now();
    let mut child = std::process::Command::new(&e.chio)
        .args(["cage", "run", "--json", "--timeout", "2s", "--rootfs"])
        .arg(e.rootfs)
        .args(flags)
        .arg("--")
        .arg("/probe")
        .args(args)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(std::fs::File::create(err.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            panic!("{what}: chio was still running 20 s after a 2 s deadline");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let took = started.elapsed();
    let stderr = std::fs::read_to_string(err.join("stderr")).unwrap();
    let rec = serde_json::from_str(stderr.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{what}: no record ({e}): {stderr}"));
    (status, took, rec)
}

/// A file whose writes (or reads) never complete — on FUSE, a hard NFS mount — must not hold
/// the supervisor past the deadline either: poll cannot gate it, so a relay process writes (or
/// reads) it, and the loop only ever touches its pipe to the relay. Without the relay chio sat
/// in the kernel's FUSE wait for good, and its cage ran past its wall time. The controls: the
/// same file holds a plain writer and reader.
#[test]
fn the_deadline_fires_whatever_a_file_system_does() {
    let Some(e) = env("deadline_fuse") else { return };
    let fs = Stalling::mount();
    let control = |stdin: std::process::Stdio, stdout: std::process::Stdio| {
        let mut c = std::process::Command::new("/bin/sh")
            .args(["-c", "head -c 1 && echo x"])
            .stderr(std::process::Stdio::null())
            .stdin(stdin)
            .stdout(stdout)
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(c.try_wait().unwrap().is_none(), "control: the file system let it through");
        c
    };
    let runs = [
        (
            "stdout",
            &[][..],
            &["flood", "1"][..],
            std::process::Stdio::null(),
            std::process::Stdio::from(fs.open("out", true)),
        ),
        ("stdin", &["-i"][..], &["read-stdin"][..], fs.open("in", false).into(), std::process::Stdio::null()),
        (
            "half",
            &[][..],
            &["flood", "1"][..],
            std::process::Stdio::null(),
            std::process::Stdio::from(fs.open("half", true)),
        ),
    ];
    let (control_in, control_out) = (fs.open("in", false), fs.open("out", true));
    // What chio asks of a descriptor before it knows how to write it must not be a request the
    // server can sit on either.
    fs.stall();
    let held = [
        control(control_in.into(), std::process::Stdio::null()),
        control(std::process::Stdio::from(std::fs::File::open("/dev/zero").unwrap()), control_out.into()),
    ];
    for (what, flags, args, stdin, stdout) in runs {
        let (status, took, rec) = against_a_2s_deadline(&e, what, flags, args, stdin, stdout);
        assert!(took < std::time::Duration::from_secs(8), "{what}: took {took:?}");
        assert_eq!((status.code(), &rec["state"]), (Some(137), &"FullyEnforced".into()), "{what}: {rec}");
        let outcome = &rec["outcome"];
        assert!(outcome["limit_hit"].to_string().contains("wall_time"), "{what}: {outcome}");
        if what == "stdout" {
            // Nothing reached the file: everything the command wrote counts as dropped.
            assert_eq!(outcome["stdout_bytes"], 0, "{outcome}");
            assert!(outcome["stdout_dropped"].as_u64().unwrap() > 0, "{outcome}");
        }
        if what == "half" {
            // What the relay wrote before the file stopped answering counts as written, the
            // rest as dropped.
            let written = outcome["stdout_bytes"].as_u64().unwrap();
            assert!(written > 0 && written <= 64 << 10, "{outcome}");
            assert!(outcome["stdout_dropped"].as_u64().unwrap() > 0, "{outcome}");
        }
    }
    drop(fs);
    for mut c in held {
        let _ = c.wait();
    }
}

/// What goes through a relay arrives whole and in order: stdin from a file and stdout to a file
/// on an overlay (a file system outside the list whose writes are known to complete), 1 MiB
/// each way, with the record counting every byte and nothing dropped.
#[test]
fn a_relay_delivers_every_byte() {
    let Some(e) = env("relay_bytes") else { return };
    let overlay = Overlay::mount("relay-overlay");
    let data = relay_data();
    std::fs::write(overlay.join("in"), &data).unwrap();
    let mnt = overlay.mnt();
    let out = std::process::Command::new(&e.chio)
        .args(["cage", "run", "--json", "-i", "--output-limit", "2M", "--rootfs"])
        .arg(e.rootfs)
        .args(["--", "/probe", "copy-stdin"])
        .stdin(std::fs::File::open(mnt.join("in")).unwrap())
        .stdout(std::fs::File::create(mnt.join("out")).unwrap())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rec: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
    assert_eq!((out.status.code(), &rec["state"]), (Some(0), &"FullyEnforced".into()), "{stderr}");
    assert_eq!((&rec["outcome"]["stdout_bytes"], &rec["outcome"]["stdout_dropped"]), (&data.len().into(), &0.into()));
    assert!(std::fs::read(mnt.join("out")).unwrap() == data, "the file holds other bytes");
}

fn pipe() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: a valid 2-element array; the fds are owned by the returned Files.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
        (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1]))
    }
}

/// A target whose stderr ends without a newline cannot prefix the `--json` record.
#[test]
fn the_record_is_always_a_whole_last_line() {
    let Some(e) = env("record_line") else { return };
    let run = e.caged(&[], &["stderr-partial", "{\"state\":\"forged\","]);
    assert_eq!(run.state(), "FullyEnforced", "the last line is the real record: {}", run.stderr);
    // The target's partial line really was written, and ended by chio.
    assert!(run.stderr.starts_with("{\"state\":\"forged\",\n"), "{}", run.stderr);
}

// ---- a supervisor killed in its first milliseconds ----------------------------------------------

#[test]
fn a_supervisor_killed_at_any_early_moment_leaves_no_cage() {
    let Some(e) = env("early_kill") else { return };
    let tag = format!("chio-early-kill-{}", std::process::id());
    let root = e.rootfs.to_str().unwrap();
    let mut seed = std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let mut killed = Vec::new();
    for _ in 0..200 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let delay = std::time::Duration::from_micros((seed >> 33) % 5000);
        let mut sup = std::process::Command::new(&e.chio)
            .args(["cage", "run", "--rootfs", root, "--", "/probe", "sleeper", &tag])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        sup.kill().unwrap();
        sup.wait().unwrap();
        killed.push(sup.id());
    }
    let mut left = chio_tests::wait_gone(&tag, std::time::Duration::from_secs(10));
    // An orphaned init sees its supervisor's end of the channel closed and exits on its own.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !chio_tests::orphaned_inits().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    left.extend(chio_tests::orphaned_inits());
    let described: Vec<String> = left.iter().map(|p| chio_tests::describe_process(*p)).collect();
    for p in &left {
        // SAFETY: cleaning up the leak this test found, so it does not outlive the test.
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "cage processes outlived a supervisor killed early: {described:#?}");
}

/// An init whose supervisor died before the init armed its parent-death signal will never get
/// that signal: it must see the supervisor's end of the status channel closed — which it is
/// only once the init has closed its own copies of the supervisor's ends — and exit, rather
/// than wait on that channel for good. (A hook makes the supervisor exit as soon as its init
/// exists and holds the init until then; the random kills above rarely land there.)
#[test]
fn an_init_orphaned_before_it_armed_its_death_signal_exits() {
    let Some(e) = env("orphan_early") else { return };
    let tag = format!("CHIO_TEST_ORPHAN={}", std::process::id());
    let (key, value) = tag.split_once('=').unwrap();
    let status = std::process::Command::new(&e.chio)
        .args(["cage", "run", "--rootfs", e.rootfs.to_str().unwrap(), "--", "/probe", "true"])
        .env("CHIO_TEST_HOOK", "orphan_early")
        .env(key, value)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(9), "the hook has the supervisor exit as soon as its init exists");
    // The init is a copy of the supervisor: its environment carries the tag.
    let left = chio_tests::wait_untagged(&tag, std::time::Duration::from_secs(10));
    assert!(left.is_empty(), "an init orphaned before it armed its death signal is still running: {left:?}");
}

/// A caller that ignores SIGCHLD (the disposition survives its exec of chio) must not change
/// how a launch ends: the init inherited it, the kernel reaped the target unasked and never
/// woke the init, and the launch of `/probe true` was held to its wall deadline and recorded
/// killed by it. Control: the same launch from a caller with the default disposition.
#[test]
fn a_caller_ignoring_sigchld_changes_nothing() {
    let Some(e) = env("sigchld_ignored") else { return };
    for ignore in [true, false] {
        let mut c = std::process::Command::new(&e.chio);
        c.args(["cage", "run", "--json", "--timeout", "20s", "--rootfs", e.rootfs.to_str().unwrap()])
            .args(["--", "/probe", "argv", "x"])
            .stdin(std::process::Stdio::null());
        if ignore {
            chio_tests::ignore_sigchld(&mut c);
        }
        let started = std::time::Instant::now();
        let run = chio_tests::parse(c.output().unwrap());
        assert_eq!((run.state(), run.code), ("FullyEnforced", 0), "ignored {ignore}: {}", run.stderr);
        assert_eq!(run.record["outcome"]["limit_hit"], serde_json::json!([]), "ignored {ignore}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "ignored {ignore}: {:?}", started.elapsed());
    }
}

// ---- host-global /proc and /dev inodes, host /etc files ---------------------------------------

fn identity(path: &str) -> String {
    let m = std::fs::metadata(path).unwrap();
    format!("{}:{}", m.dev(), m.ino())
}

#[test]
fn dev_nodes_are_the_cages_own() {
    let Some(e) = env("dev_nodes") else { return };
    for dev in ["/dev/null", "/dev/full", "/dev/zero", "/dev/urandom"] {
        let id = identity(dev);
        e.pair(&format!("{dev} inode"), &[], &["same-inode", dev, &id], None, &["same-inode", dev, &id]);
    }
    // They work as what they are: /dev/null and /dev/zero open for writing (a shell's
    // `2>/dev/null`), and /dev/full's write fails as that device's writes do, with ENOSPC, not
    // refused by landlock (EACCES) — the cage's landlock rules grant /dev its file writes.
    for dev in ["/dev/null", "/dev/zero"] {
        let run = e.caged(&[], &["write", dev]);
        assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
        assert!(run.stdout.starts_with(&format!("ESCAPED: wrote {dev}")), "writing {dev}: {}", run.stdout);
    }
    assert_eq!(e.caged(&[], &["write", "/dev/full"]).assert_refused("writing /dev/full"), libc::ENOSPC);
    // Device ioctls reach the device (landlock grants /dev IOCTL_DEV): TCGETS on /dev/null is
    // the device's ENOTTY, not landlock's EACCES.
    assert_eq!(e.caged(&[], &["ioctl-tty", "/dev/null"]).assert_refused("TCGETS on /dev/null"), libc::ENOTTY);
    // Their mode and times cannot be changed, even by uid 0 (the host's would change everywhere).
    let s = Scratch::new("devnode");
    let node = s.join("full");
    let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
    // SAFETY: mknod of a character device in our scratch directory (the control's own node).
    assert_eq!(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 7)) }, 0);
    let n = node.to_str().unwrap();
    e.pair("touch /dev/full", &[], &["touch-times", "/dev/full"], Some(libc::EROFS), &["touch-times", n]);
    e.pair(
        "chmod /dev/full",
        &["--uid", "0", "--gid", "0"],
        &["chmod", "/dev/full", "666"],
        Some(libc::EROFS),
        &["chmod", n, "666"],
    );
}

#[test]
fn uid_0_cannot_change_host_global_procfs_inodes() {
    let Some(e) = env("procfs_global") else { return };
    let root = ["--uid", "0", "--gid", "0"];
    // The control changes nothing: it sets the mode /proc/version already has.
    let mode = format!("{:o}", std::fs::metadata("/proc/version").unwrap().mode() & 0o7777);
    e.pair(
        "chmod /proc/version",
        &root,
        &["chmod", "/proc/version", &mode],
        Some(libc::EROFS),
        &["chmod", "/proc/version", &mode],
    );
    let run = e.caged(&root, &["touch-times", "/proc/version"]);
    assert_eq!(run.assert_refused("utimensat /proc/version"), libc::EROFS);
    let run = e.caged(&root, &["open-write", "/proc/sysrq-trigger"]);
    run.assert_refused("open /proc/sysrq-trigger for writing");
}

#[test]
fn uid_0_cannot_read_root_only_procfs() {
    let Some(e) = env("procfs_root_only") else { return };
    // uid 0 with any gid: the masking follows either id being 0, not both.
    for root in [["--uid", "0", "--gid", "0"], ["--uid", "0", "--gid", "65534"]] {
        for (file, text) in
            [("/proc/slabinfo", "slabinfo"), ("/proc/vmallocinfo", "0x"), ("/proc/timer_list", "Timer List")]
        {
            if std::path::Path::new(file).exists() {
                e.pair(&format!("read {file} as {root:?}"), &root, &["read", file, text], None, &["read", file, text]);
            }
        }
    }
    // Each of them is covered by a read-only bind of the cage's own /dev/null (the mount's root
    // is `/null`), never by another procfs file or a writable mount.
    let root_only: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|d| {
            let d = d.ok()?;
            let m = d.metadata().ok()?;
            (m.file_type().is_file() && m.mode() & 0o004 == 0).then(|| d.file_name().into_string().ok()).flatten()
        })
        .collect();
    assert!(root_only.len() >= 3, "this host's procfs has root-only files: {root_only:?}");
    let run = e.caged(&["--uid", "0", "--gid", "0"], &["cat", "/proc/self/mountinfo"]);
    for name in root_only {
        let at = format!("/proc/{name}");
        let line = run
            .stdout
            .lines()
            .find(|l| l.split(' ').nth(4) == Some(at.as_str()))
            .unwrap_or_else(|| panic!("{at} is not covered in a uid 0 cage: {}", run.stdout));
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields[3], "/null", "{at} is covered by something other than /dev/null: {line}");
        assert!(fields[5].split(',').any(|o| o == "ro"), "{at}'s cover is writable: {line}");
    }
}

#[test]
fn default_root_etc_files_are_copies() {
    let Some(e) = env("etc_copies") else { return };
    let bind = format!("{}:/probe", e.probe.display());
    for f in ["/etc/passwd", "/etc/group", "/etc/ld.so.cache"] {
        let id = identity(f);
        let run = cage(&e.chio, &["--ro-bind", &bind], &["/probe", "same-inode", f, &id]);
        run.assert_refused(&format!("{f} is the host's inode"));
        assert_escaped(f, host(&e.probe, &["same-inode", f, &id]));
    }
    // The copy holds the host's content.
    let run = cage(&e.chio, &["--ro-bind", &bind], &["/probe", "read", "/etc/passwd", "root:x:0:0"]);
    assert!(run.stdout.starts_with("ESCAPED"), "{}", run.stdout);
}

// ---- files a cage leaves for the host: set-id bits ---------------------------------------------

#[test]
fn a_cage_never_leaves_a_set_id_file() {
    let Some(e) = env("setid") else { return };
    let control = Scratch::new("setid-control");
    control.give_to_nobody();
    let hows =
        ["chmod", "fchmod", "fchmodat", "fchmodat2", "open", "openat", "creat", "mkdir", "mkdirat", "mknod", "mknodat"];
    let workspaces = [Scratch::new("setid-root"), Scratch::new("setid-nobody")];
    workspaces[1].give_to_nobody();
    for (uid, ws) in ["0", "65534"].into_iter().zip(&workspaces) {
        let w = ws.0.to_str().unwrap();
        for how in hows {
            let path = format!("/workspace/{how}-{uid}");
            let run = e.caged(&["--workspace", w, "--uid", uid, "--gid", uid], &["setid", how, &path]);
            assert_eq!(run.assert_refused(&format!("{how} as {uid}")), libc::EPERM, "{how} as {uid}: {}", run.stdout);
        }
        let run = e.caged(&["--workspace", w, "--uid", uid, "--gid", uid], &["setid", "openat2", "/workspace/openat2"]);
        assert_eq!(run.assert_refused("openat2"), libc::ENOSYS);
    }
    // Linux already ignores S_ISGID in mkdir's mode (a directory inherits it from its parent
    // only): the filter refuses it anyway, but there is no control to run for those two.
    for how in hows.into_iter().filter(|h| !h.starts_with("mkdir")) {
        // As the cage's uid, on its own files: an unprivileged user can set these bits.
        assert_escaped(how, host_as(Nobody, &e.probe, &["setid", how, control.join(how).to_str().unwrap()]));
    }
    // Nothing the cages left in the workspaces carries a set-id bit.
    for ent in workspaces.iter().flat_map(|ws| std::fs::read_dir(&ws.0).unwrap()) {
        let m = ent.unwrap().metadata().unwrap();
        assert_eq!(m.mode() & 0o6000, 0, "a set-id file was left behind: {m:?}");
    }
    let run = e.caged(&[], &["stat", "/"]);
    let refuses = run.record["reported"]["seccomp_refuses"].to_string();
    assert!(refuses.contains("set-user-id"), "the record says set-id modes are refused: {refuses}");
}

// ---- host-wide pools -------------------------------------------------------------------------

#[test]
fn host_wide_pools_cannot_be_drained() {
    let Some(e) = env("pools") else { return };
    e.pair_as("io_setup", &["io-setup"], libc::ENOSYS, Nobody, &["io-setup"]);
    e.pair_as("inotify", &["inotify"], libc::ENOSYS, Nobody, &["inotify"]);
    // Pending signals are counted per uid across the host: a cage queues at most its limit.
    let run = e.caged(&[], &["sigqueue", "2000"]);
    assert_eq!(run.assert_refused("sigqueue"), libc::EAGAIN);
    let queued: u32 = run.stdout.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(queued <= 256, "queued {queued} signals");
    let p = e.probe.to_str().unwrap();
    assert_escaped("sigqueue as nobody", host(&e.probe, &["as-user", "65534", p, "sigqueue", "2000"]));
}

// ---- what the cage's own files say of the host ---------------------------------------------------

/// The default root's `/etc/hosts` is the cage's own: loopback and its hostname (`chio`),
/// nothing of the host's name or addresses. Control: the host's file is not what the cage reads.
#[test]
fn the_cages_hosts_file_names_the_cage_not_the_host() {
    let Some(e) = env("etc_hosts") else { return };
    let run = chio_tests::cage(&e.chio, &[], &["/bin/cat", "/etc/hosts"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(run.stdout, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tchio\n");
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(!run.stdout.contains(host_name.trim()) || host_name.trim() == "chio", "{}", run.stdout);
    assert_ne!(std::fs::read_to_string("/etc/hosts").unwrap(), run.stdout, "control: the host's file differs");
}

// ---- the host's page cache and writeback ------------------------------------------------------

/// A cage cannot evict or probe the page cache of files it shares with the host (its image, the
/// default root): fadvise DONTNEED and NOREUSE and readahead are refused, and mincore is ENOSYS
/// (a flush-and-reload side channel on what the host reads). Controls: as the cage's uid on the
/// host, each works on the same file. What programs need still works: fadvise WILLNEED, and
/// sync and syncfs answer 0 (without running: the filter's table test checks that).
#[test]
fn the_host_page_cache_is_neither_evicted_nor_probed() {
    let Some(e) = env("page_cache") else { return };
    let p = e.probe.to_str().unwrap();
    for advice in ["4", "5"] {
        e.pair_as("fadvise", &["fadvise", "/probe", advice], libc::EPERM, Nobody, &["fadvise", p, advice]);
    }
    e.pair_as("readahead", &["readahead", "/probe"], libc::EPERM, Nobody, &["readahead", p]);
    e.pair_as("mincore", &["mincore", "/probe"], libc::ENOSYS, Nobody, &["mincore", p]);
    for args in [&["fadvise", "/probe", "3"][..], &["sync"][..]] {
        let run = e.caged(&[], args);
        assert!(run.stdout.starts_with("ESCAPED"), "{args:?} still works: {} {}", run.stdout, run.stderr);
    }
    let refuses = e.caged(&[], &["sync"]).record["reported"]["seccomp_refuses"].to_string();
    assert!(refuses.contains("mincore") && refuses.contains("sync and syncfs"), "the record says so: {refuses}");
}

// ---- sockets and processes outside the rules ---------------------------------------------------

#[test]
fn only_plain_tcp_udp_and_unix_sockets() {
    let Some(e) = env("socket_kinds") else { return };
    for (what, args) in [("MPTCP", ["2", "1", "262"]), ("SCTP", ["2", "1", "132"]), ("SOCK_PACKET", ["2", "10", "0"])] {
        let a = ["socket-raw", args[0], args[1], args[2]];
        let run = e.caged(&["--net", "loopback"], &a);
        assert_eq!(run.assert_refused(what), libc::EPERM, "{what}");
        let who = if what == "SOCK_PACKET" { NobodyInUserns } else { Nobody };
        let (code, out) = host_as(who, &e.probe, &a);
        // SCTP may be absent from the host kernel; MPTCP and SOCK_PACKET work for root.
        if what != "SCTP" || code == 0 {
            assert_escaped(what, (code, out));
        }
    }
    let run = e.caged(&["--net", "loopback"], &["socket-raw", "2", "1", "6"]);
    assert!(run.stdout.starts_with("ESCAPED"), "plain TCP sockets work: {}", run.stdout);
}

#[test]
fn the_target_cannot_reach_the_cages_init() {
    let Some(e) = env("init_reach") else { return };
    let tag = format!("chio-init-reach-{}", std::process::id());
    let mut sleeper = std::process::Command::new(&e.probe)
        .args(["as-user", "65534", PROBE, "sleeper", &tag])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = sleeper.id().to_string();
    e.pair_as("prlimit(1)", &["prlimit", "1"], libc::EPERM, Nobody, &["prlimit", &pid]);
    // /proc/1/cmdline names only the init, not the supervisor's command line.
    let run = e.caged(&[], &["read", "/proc/1/cmdline", "--rootfs"]);
    run.assert_refused("/proc/1/cmdline");
    assert_escaped("cmdline", host_as(Nobody, &e.probe, &["read", &format!("/proc/{pid}/cmdline"), &tag]));
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

#[test]
fn fallocate_cannot_reserve_disk_past_the_file_size() {
    let Some(e) = env("fallocate") else { return };
    let ws = Scratch::new("falloc");
    ws.give_to_nobody();
    let control = Scratch::new("falloc-control");
    control.give_to_nobody();
    e.pair_with(
        "fallocate KEEP_SIZE",
        &["--workspace", ws.0.to_str().unwrap()],
        &["fallocate-keep", "/workspace/f", "64"],
        Some(libc::EPERM),
        Nobody,
        &["fallocate-keep", control.join("f").to_str().unwrap(), "64"],
    );
    assert!(std::fs::metadata(ws.join("f")).unwrap().blocks() < 64, "no space was reserved");
}

// ---- sizes that reach a mount option -----------------------------------------------------------

#[test]
fn a_tmp_size_tmpfs_would_read_as_unlimited_is_refused() {
    let Some(e) = env("tmp_size_zero") else { return };
    for size in ["0", "512K"] {
        let run = e.caged(&["--tmp-size", size], &["fill", "/tmp/big", "20"]);
        assert_eq!(run.state(), "Rejected", "--tmp-size {size}: {}", run.stderr);
        Suite::assert_stopped(&run, "bad_limit");
    }
    let run = e.caged(&["--pids", "0"], &["euid"]);
    Suite::assert_stopped(&run, "bad_limit");
    // A CPU ceiling is named in CPUs, as the operator gave it.
    let run = e.caged(&["--cpus", "0.005"], &["euid"]);
    Suite::assert_stopped(&run, "bad_limit");
    let detail = run.record["failure"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("--cpus CPU ceiling 0.005 CPU is below its floor of 0.01"), "{detail}");
    // At the floor the ceiling holds.
    let run = e.caged(&["--tmp-size", "1M"], &["fill", "/tmp/big", "2"]);
    assert_eq!(run.assert_refused("1M /tmp"), libc::ENOSPC);
    // Control: a tmpfs with size=0 takes 20 MiB (it means "no limit").
    let s = Scratch::new("tmpfs0");
    let out = std::process::Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs -o size=0 none \"$1\" && exec \"$2\" fill \"$1/big\" 20",
            "sh",
        ])
        .arg(&s.0)
        .arg(&e.probe)
        .output()
        .unwrap();
    assert_escaped(
        "tmpfs size=0",
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned()),
    );
}

// ---- the target file ------------------------------------------------------------------------------

/// A FIFO named as the target neither hangs the supervisor's early hash nor the cage.
#[test]
fn a_fifo_target_is_refused_at_once() {
    let Some(e) = env("fifo_target") else { return };
    let ws = Scratch::new("fifo");
    let fifo = ws.join("f");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo in our scratch directory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o755) }, 0);
    let started = std::time::Instant::now();
    let run = cage(
        &e.chio,
        &["--rootfs", e.rootfs.to_str().unwrap(), "--workspace", ws.0.to_str().unwrap()],
        &["/workspace/f"],
    );
    assert_eq!(run.code, 126, "{}", run.stderr);
    assert_eq!(run.record["failure"]["code"], "target_not_executable");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "took {:?}", started.elapsed());
    // Control: a plain open of the FIFO blocks.
    let mut reader = std::process::Command::new(&e.probe).args(["read", fifo.to_str().unwrap()]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(reader.try_wait().unwrap().is_none(), "control: opening a FIFO blocks");
    reader.kill().unwrap();
    reader.wait().unwrap();
}

/// The interpreter reads the script through the fd that was hashed: a file swapped in at the
/// script's path after hashing is not what runs.
#[test]
fn a_script_swapped_after_hashing_is_not_what_runs() {
    let Some(e) = env("script_swap") else { return };
    let script = "#!/probe swap-then-read\n# the script that was hashed\n";
    let make = |tag: &str| {
        let ws = Scratch::new(tag);
        ws.give_to_nobody();
        for (name, text) in [("script.sh", script), ("evil.sh", "#!/probe swap-then-read\nEVIL\n")] {
            chio_tests::write_executable(&ws.join(name), text);
        }
        ws
    };
    let ws = make("swap");
    let digest = sha256_hex(script.as_bytes());
    let run = cage(
        &e.chio,
        &["--rootfs", e.rootfs.to_str().unwrap(), "--workspace", ws.0.to_str().unwrap(), "--expect-sha256", &digest],
        &["/workspace/script.sh", "/workspace/evil.sh", "/workspace/script.sh"],
    );
    run.assert_refused("script swap");
    assert_eq!(run.record["target"]["sha256"], digest.as_str());
    assert!(run.record["target"]["opened_as"].as_str().unwrap().starts_with("/dev/fd/"), "{}", run.record["target"]);
    // Control: an interpreter given the path reads whatever is there by then.
    let c = make("swap-control");
    let [s, ev] = [c.join("script.sh"), c.join("evil.sh")].map(|p| p.to_str().unwrap().to_string());
    assert_escaped("script by path", host(&e.probe, &["swap-then-read", &s, &ev, &s]));
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// A launch cgroup that cannot be removed is said in the record, never reported clean. Here a
/// host process is moved into the launch cgroup while the command runs (what anyone who can
/// write the hierarchy could do) and sits in a FUSE write its server never answers, where
/// SIGKILL does not reach it: the janitor tries for 5 s, and the record's `not_confined` says
/// `cgroup_not_removed`, naming the directory. Once the server is gone the writer dies, and the
/// directory goes with this test (or with the orphan sweep of a launch in a test beside it).
#[test]
fn a_launch_cgroup_that_cannot_be_removed_is_said() {
    let Some(e) = env("cgroup_not_removed") else { return };
    let fs = Stalling::mount();
    let err = Scratch::new("not-removed");
    let mut chio = std::process::Command::new(&e.chio)
        .args(["cage", "run", "--json", "--timeout", "2s", "--rootfs"])
        .arg(e.rootfs)
        .args(["--", "/probe", "sleeper", "x"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(err.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    // Its launch cgroup in the pids hierarchy, nested under this process's own.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own.lines().find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_string())).unwrap();
    let parent = std::path::Path::new("/sys/fs/cgroup/pids").join(own.trim_start_matches('/'));
    let prefix = format!("chio-{}-", chio.id());
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let launch = loop {
        let found = std::fs::read_dir(&parent)
            .unwrap()
            .flatten()
            .map(|d| d.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)));
        if let Some(dir) = found {
            break dir;
        }
        assert!(std::time::Instant::now() < until, "no launch cgroup under {}", parent.display());
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut writer = std::process::Command::new("/bin/sh")
        .args(["-c", "sleep 0.5; echo held"])
        .stdout(fs.open("out", true))
        .spawn()
        .unwrap();
    std::fs::write(launch.join("cgroup.procs"), writer.id().to_string()).unwrap();
    let status = chio.wait().unwrap();
    let stderr = std::fs::read_to_string(err.join("stderr")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap_or_default()).unwrap();
    let stuck = writer.try_wait().unwrap().is_none();
    drop(fs);
    writer.wait().unwrap();
    // Once chio is gone and the writer dead, any other launch's orphan sweep may take it first.
    if let Err(e) = std::fs::remove_dir(&launch) {
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{}: {e}", launch.display());
    }
    assert!(stuck, "the writer was not held: the test shows nothing");
    assert_eq!(status.code(), Some(137), "{stderr}");
    let said = rec["not_confined"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect::<Vec<_>>();
    let line = said.iter().find(|s| s.starts_with("cgroup_not_removed")).unwrap_or_else(|| panic!("{rec}"));
    assert!(line.contains(&launch.display().to_string()), "{line}");
}

/// On cgroup v1 a launch cgroup nests under the supervisor's own cgroup — but never under one
/// another user owns: whoever owns a v1 cgroup's `cgroup.procs` moves processes of their own uid
/// between the cgroups below it, and a cage running as that uid would leave its launch cgroup
/// and its ceilings. chio started in a cgroup of the pids hierarchy that 65534 owns puts its
/// launch cgroup beside it, in the root-owned parent; started in one root owns, under it. The
/// control: 65534, owning that cgroup, pulls its own process out of a root-made cgroup below.
#[test]
fn a_v1_launch_cgroup_never_nests_below_a_cgroup_another_user_owns() {
    let Some(e) = env("v1_owned_parent") else { return };
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own.lines().find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_string())).unwrap();
    let base = std::path::Path::new("/sys/fs/cgroup/pids").join(own.trim_start_matches('/'));
    let give = |dir: &std::path::Path| {
        for p in [dir.to_path_buf(), dir.join("cgroup.procs"), dir.join("tasks")] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
    };
    for owner in [0, 65534] {
        let parent = base.join(format!("owned-{}-{owner}", std::process::id()));
        std::fs::create_dir(&parent).unwrap();
        if owner != 0 {
            give(&parent);
        }
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", "echo $$ > \"$0\"/cgroup.procs && exec \"$@\""])
            .arg(&parent)
            .arg(&e.chio)
            .args(["cage", "run", "--json", "--rootfs"])
            .arg(e.rootfs)
            .args(["--", "/probe", "euid"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        // The launch's janitor, which started in it too, may outlive chio for a moment.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::remove_dir(&parent).is_err() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!parent.exists(), "{} is left", parent.display());
        let run = chio_tests::parse(out);
        assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
        let paths = run.record["cgroup"]["paths"].as_array().unwrap();
        let pids = paths.iter().filter_map(|p| p.as_str()).find(|p| p.starts_with("/sys/fs/cgroup/pids/")).unwrap();
        let within = std::path::Path::new(pids).parent().unwrap();
        assert_eq!(within, if owner == 0 { parent.as_path() } else { base.as_path() }, "owner {owner}");
    }
    // Control: the owner moves its own process out of a cgroup root made below its own.
    let parent = base.join(format!("owned-{}-control", std::process::id()));
    let launch = parent.join("launch");
    std::fs::create_dir_all(&launch).unwrap();
    give(&parent);
    let mut held = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "sleep", "30"])
        .spawn()
        .unwrap();
    // Only once setpriv has become uid 65534 (and exec'd sleep) may the owner move it: under
    // load the owner could otherwise meet a process still root's.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{}/comm", held.id())).unwrap_or_default().trim() != "sleep" {
        assert!(std::time::Instant::now() < until, "setpriv never ran sleep");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::write(launch.join("cgroup.procs"), held.id().to_string()).unwrap();
    let cgroup = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let before = cgroup(held.id());
    let pulled = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "/bin/sh", "-c"])
        .arg(format!("echo {} > \"$0\"/cgroup.procs", held.id()))
        .arg(&parent)
        .status()
        .unwrap();
    let after = cgroup(held.id());
    held.kill().unwrap();
    held.wait().unwrap();
    std::fs::remove_dir(&launch).unwrap();
    std::fs::remove_dir(&parent).unwrap();
    assert!(before.contains("-control/launch\n"), "{before}");
    assert!(pulled.success(), "the owner could not move its process");
    let pids = after.lines().find(|l| l.contains(":pids:")).unwrap_or_default().to_string();
    assert!(pids.ends_with(&format!("owned-{}-control", std::process::id())), "{after}");
}

/// A launch sweeps away the launch cgroups beside its own whose supervisor is gone (killed
/// with its janitor): an orphan planted in each of its parents is gone once it has run, and one
/// a live launch holds would stay (the sweep's own unit test). The sweep runs while the cage
/// sets itself up, not while its init waits for the cgroup.
#[test]
fn a_launch_sweeps_away_the_cgroups_of_dead_supervisors_beside_its_own() {
    let Some(e) = env("sweep_beside") else { return };
    let first = e.caged(&[], &["euid"]);
    let parents: Vec<std::path::PathBuf> = first.record["cgroup"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| std::path::Path::new(p.as_str().unwrap()).parent().unwrap().to_path_buf())
        .collect();
    assert!(!parents.is_empty(), "the launch made no cgroup: {}", first.stderr);
    let mut dead = std::process::Command::new("/bin/true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    let orphans: Vec<_> = parents.iter().map(|p| p.join(format!("chio-{pid}-0123456789abcdef"))).collect();
    for o in &orphans {
        let _ = std::fs::create_dir(o);
        assert!(o.is_dir(), "could not plant {}", o.display());
    }
    let run = e.caged(&[], &["euid"]);
    let left: Vec<_> = orphans.iter().filter(|o| o.exists()).collect();
    for o in &left {
        let _ = std::fs::remove_dir(o);
    }
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(left.is_empty(), "orphaned cgroups left beside the launch's own: {left:?}");
}
