//! The options of `chio cage run` do what they say: binds, cwd, env, identity, network mode, and
//! signals sent to the supervisor reach the target through the cage's init.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use chio_tests::{cage, chio_bin, parse, privileged, shared_rootfs, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn chio() -> PathBuf {
    chio_bin(&PathBuf::from(PROBE))
}

#[test]
fn binds_cwd_env_and_identity() {
    if !privileged("run_options") {
        return;
    }
    let rw = Scratch::new("rw-bind");
    rw.give_to_nobody();
    let ro = Scratch::new("ro-bind");
    std::fs::write(ro.join("data"), "read-only data").unwrap();
    let rw_spec = format!("{}:/out", rw.0.display());
    let ro_spec = format!("{}:/opt/data", ro.0.display());
    let script = "cat /opt/data/data; echo; echo hi > /out/file && echo wrote; \
                  (echo x > /opt/data/new) 2>/dev/null || echo ro-refused; \
                  pwd; echo $GREETING; id -u; id -g";
    let run = cage(
        &chio(),
        &[
            "--bind",
            &rw_spec,
            "--ro-bind",
            &ro_spec,
            "--cwd",
            "/out",
            "--env",
            "GREETING=hello",
            "--uid",
            "1234",
            "--gid",
            "4321",
        ],
        &["/bin/sh", "-c", script],
    );
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[0], "read-only data");
    assert!(lines.contains(&"ro-refused"), "{lines:?}");
    assert!(!lines.contains(&"wrote"), "uid 1234 cannot write a directory owned by 65534: {lines:?}");
    assert!(lines.ends_with(&["/out", "hello", "1234", "4321"]), "{lines:?}");
    assert_eq!(run.record["observed"]["uids"], serde_json::json!([1234, 1234, 1234, 1234]));
    assert_eq!(run.record["observed"]["cwd"], "/out");
    // As 65534 the rw bind is writable and the write lands on the host.
    let run = cage(&chio(), &["--bind", &rw_spec], &["/bin/sh", "-c", "echo hi > /out/file && echo wrote"]);
    assert_eq!(run.stdout.trim(), "wrote", "{}", run.stderr);
    assert_eq!(std::fs::read_to_string(rw.join("file")).unwrap(), "hi\n");
}

#[test]
fn loopback_mode_brings_up_lo_only() {
    if !privileged("loopback") {
        return;
    }
    // The devices, whether lo is up (its flags, as the kernel has them), and a TCP connect.
    let script = "cat /proc/net/dev | awk 'NR>2 {print $1}' | tr '\\n' ' '; \
                  python3 -c \"import fcntl, socket, struct; \
                  f = fcntl.ioctl(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), 0x8913, struct.pack('256s', b'lo')); \
                  print('up' if struct.unpack('H', f[16:18])[0] & 1 else 'down', end=' ')\"; \
                  python3 -c \"import socket; s=socket.socket(); s.settimeout(1); print(s.connect_ex(('127.0.0.1', 9)))\"";
    let none = cage(&chio(), &[], &["/bin/sh", "-c", script]);
    let lo = cage(&chio(), &["--net", "loopback"], &["/bin/sh", "-c", script]);
    assert_eq!(none.state(), "FullyEnforced", "{}", none.stderr);
    assert_eq!(none.stdout.split_whitespace().next(), Some("lo:"), "only lo exists: {}", none.stdout);
    // Landlock denies TCP connect in both modes (EACCES = 13) before routing is consulted.
    assert!(none.stdout.trim_end().ends_with("13"), "{}", none.stdout);
    assert!(lo.stdout.trim_end().ends_with("13"), "{}", lo.stdout);
    // lo is up only when asked for, and the record says what the kernel says.
    assert!(none.stdout.contains(" down "), "{}", none.stdout);
    assert!(lo.stdout.contains(" up "), "{}", lo.stdout);
    assert_eq!(lo.record["reported"]["loopback_up"], true);
    assert_eq!(none.record["reported"]["loopback_up"], false);
}

#[test]
fn sigterm_to_the_supervisor_reaches_the_target() {
    if !privileged("signals") {
        return;
    }
    let rootfs = shared_rootfs(&PathBuf::from(PROBE));
    let mut child = Command::new(chio())
        .args(["cage", "run", "--json", "--rootfs", rootfs.to_str().unwrap(), "--", "/probe", "sleeper", "sig"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "SLEEPING");
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    let run = parse(output);
    assert_eq!(run.code, 128 + libc::SIGTERM, "{}", run.stderr);
    assert_eq!(run.record["outcome"]["signal"], libc::SIGTERM);
    assert!(run.record["outcome"]["limit_hit"].as_array().unwrap().is_empty());
}

/// `--env KEY` passes chio's own value through; `--env-file` reads KEY=VALUE and KEY lines;
/// an unset KEY is refused before anything runs.
#[test]
fn env_pass_through_and_env_file() {
    if !privileged("env_file") {
        return;
    }
    let s = Scratch::new("env-file");
    std::fs::write(s.join("vars"), "# comment\nFROM_FILE=file value\n\nPASSED\n").unwrap();
    let out = Command::new(chio())
        .args(["cage", "run", "--json", "--env", "CHIO_TEST_PASSED", "--env-file"])
        .arg(s.join("vars"))
        .args(["--", "/usr/bin/env"])
        .env("CHIO_TEST_PASSED", "through")
        .env("PASSED", "from chio")
        .env("NOT_PASSED", "secret")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run = parse(out);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    for want in ["CHIO_TEST_PASSED=through", "FROM_FILE=file value", "PASSED=from chio"] {
        assert!(run.stdout.lines().any(|l| l == want), "{want} in {}", run.stdout);
    }
    assert!(!run.stdout.contains("NOT_PASSED"), "only what is named passes");
    let out = Command::new(chio())
        .args(["cage", "run", "--env", "CHIO_TEST_SURELY_UNSET", "--", "/bin/true"])
        .env_remove("CHIO_TEST_SURELY_UNSET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not set"));
}

/// Without root, `chio cage run` says it needs root instead of failing deep in setup.
#[test]
fn without_root_the_message_says_root_is_needed() {
    if !privileged("not_root") {
        return;
    }
    let out = Command::new(PROBE)
        .args(["as-user", "65534"])
        .arg(chio())
        .args(["cage", "run", "--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs root"), "{}", String::from_utf8_lossy(&out.stderr));
    // The image store too says whose it is, instead of a bare "Permission denied" (in a
    // directory of root's that others may enter but not write, as /var/lib is).
    let roots = Scratch::new("not-yours");
    std::fs::set_permissions(&roots.0, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let state = roots.join("chio/state");
    let out = Command::new(PROBE)
        .args(["as-user", "65534"])
        .arg(chio())
        .args(["image", "import", "/etc/hostname", "--state-dir", state.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("belongs to root"), "{err}");
}

/// A workspace the command's uid cannot write is named before the run, with the flags that
/// would fit it; a writable one gets no note.
#[test]
fn an_unwritable_workspace_is_named_before_the_run() {
    if !privileged("ws_note") {
        return;
    }
    let ws = Scratch::new("ws-note");
    let run = cage(&chio(), &["--workspace", ws.0.to_str().unwrap()], &["/bin/true"]);
    assert!(
        run.stderr.contains("is not writable by uid 65534 gid 65534") && run.stderr.contains("--uid 0 --gid 0"),
        "{}",
        run.stderr
    );
    ws.give_to_nobody();
    let run = cage(&chio(), &["--workspace", ws.0.to_str().unwrap()], &["/bin/true"]);
    assert!(!run.stderr.contains("not writable"), "{}", run.stderr);
}

/// Several binds under one directory the root does not have (a virtualenv and a checkout under
/// one `/work`, say): chio builds the directories for all of them, and a bind inside another
/// bind's tree lands inside that tree.
#[test]
fn binds_beside_and_inside_each_other_under_a_new_directory() {
    if !privileged("binds_beside") {
        return;
    }
    let (a, b, c) = (Scratch::new("bind-a"), Scratch::new("bind-b"), Scratch::new("bind-c"));
    std::fs::write(a.join("fa"), "a").unwrap();
    std::fs::create_dir(a.join("c")).unwrap();
    std::fs::write(b.join("fb"), "b").unwrap();
    std::fs::write(c.join("fc"), "c").unwrap();
    let spec = |s: &Scratch, dest: &str| format!("{}:{dest}", s.0.display());
    let (sa, sb, sc) = (spec(&a, "/opt/x/a"), spec(&b, "/opt/x/b"), spec(&c, "/opt/x/a/c"));
    let run = cage(
        &chio(),
        &["--ro-bind", &sa, "--ro-bind", &sb, "--ro-bind", &sc],
        &["/bin/sh", "-c", "cat /opt/x/a/fa /opt/x/b/fb /opt/x/a/c/fc"],
    );
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(run.stdout, "abc");
}

/// A tool or a venv on a host path under `/tmp` (a checkout cloned there), bound at the same
/// path: the cage's `/tmp` is its own tmpfs, so chio makes the mount point there — a directory
/// and a single file alike — and the host's `/tmp` gets nothing. The rest of the cage's `/tmp`
/// stays its own and writable.
#[test]
fn a_bind_below_the_cages_own_tmp_is_made_there() {
    if !privileged("bind_below_tmp") {
        return;
    }
    let dir = Scratch::new("bind-below-tmp");
    std::fs::create_dir_all(dir.join("venv/bin")).unwrap();
    std::fs::write(dir.join("venv/bin/tool"), "venv").unwrap();
    std::fs::write(dir.join("one-file"), "file").unwrap();
    let at = |p: &str| format!("{}:{}", dir.join(p).display(), dir.join(p).display());
    let (venv, file) = (at("venv"), at("one-file"));
    let show = format!(
        "cat {}/venv/bin/tool {}/one-file && echo x > /tmp/mine && cat /tmp/mine",
        dir.0.display(),
        dir.0.display()
    );
    let run = cage(&chio(), &["--ro-bind", &venv, "--ro-bind", &file], &["/bin/sh", "-c", &show]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(run.stdout, "venvfilex\n");
    assert!(!std::path::Path::new("/tmp/mine").exists(), "the cage wrote the host's /tmp");
    let names: Vec<String> =
        std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 2, "nothing was made on the host: {names:?}");
}

/// The cage's own filesystems name their type as their source in its mount table, as mount(8)
/// gives them, so that tools (and compliance checks) inside match them: `proc` on /proc,
/// `tmpfs` on /tmp.
#[test]
fn the_cages_filesystems_name_their_source() {
    if !privileged("run_options") {
        return;
    }
    let rootfs = shared_rootfs(&PathBuf::from(PROBE)).to_str().unwrap();
    let run = cage(&chio(), &["--rootfs", rootfs], &["/probe", "cat", "/proc/self/mountinfo"]);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    let source_of = |at: &str| {
        run.stdout.lines().find(|l| l.split(' ').nth(4) == Some(at)).and_then(|l| {
            let after = l.split(" - ").nth(1)?;
            Some(after.split(' ').take(2).collect::<Vec<_>>().join(" "))
        })
    };
    assert_eq!(source_of("/proc").as_deref(), Some("proc proc"), "{}", run.stdout);
    assert_eq!(source_of("/tmp").as_deref(), Some("tmpfs tmpfs"), "{}", run.stdout);
}
