//! Each layer alone. Where two layers refuse the same thing (mount flags and landlock, seccomp
//! and missing capabilities), one is turned off — landlock by the ABI cap in shadow mode, the
//! mount flags and the capability drop by test hooks — and the other must still refuse. Each
//! test also shows the layer really was off (the record says so, or the same probe succeeds
//! where only the remaining layer is absent).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use chio_tests::{assert_escaped, build_rootfs, copy_executable, host, parse, CageRun, Scratch, Suite};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

/// `chio cage run --json --rootfs ROOT FLAGS -- /probe ARGS` with `env`.
fn run(e: &Suite, root: &Path, env: &[(&str, &str)], flags: &[&str], args: &[&str]) -> CageRun {
    let out = Command::new(&e.chio)
        .args(["cage", "run", "--json", "--rootfs"])
        .arg(root)
        .args(flags)
        .arg("--")
        .arg("/probe")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    parse(out)
}

/// Landlock off: shadow mode with the host's landlock ABI capped at 0.
const NO_LANDLOCK: [(&str, &str); 1] = [("CHIO_TEST_LANDLOCK_ABI", "0")];

fn assert_refused_without(run: &CageRun, what: &str, layer: &str, errno: i32) {
    assert_eq!(run.state(), "NotConfined", "{what}: {}", run.stderr);
    assert!(
        run.record["not_confined"].to_string().contains(layer),
        "{what}: {layer} is off: {}",
        run.record["not_confined"]
    );
    assert!(run.stdout.starts_with("REFUSED"), "{what}: refused without {layer}: {}", run.stdout);
    assert!(run.stdout.trim_end().ends_with(&format!("errno={errno}")), "{what}: {}", run.stdout);
}

#[test]
fn read_only_mounts_hold_without_landlock() {
    let Some(e) = Suite::new("ro_without_landlock", PROBE) else { return };
    let ws = Scratch::new("ro-ll");
    ws.give_to_nobody();
    let flags = ["--mode", "shadow", "--workspace", ws.0.to_str().unwrap()];
    for target in ["/escaped", "/lib/escaped"] {
        let r = run(&e, e.rootfs, &NO_LANDLOCK, &flags, &["write", target]);
        assert_refused_without(&r, target, "landlock", libc::EROFS);
    }
    // Control: without landlock, a write where the mount is writable goes through.
    let r = run(&e, e.rootfs, &NO_LANDLOCK, &flags, &["write", "/workspace/written"]);
    assert!(r.stdout.starts_with("ESCAPED"), "{}", r.stdout);
}

#[test]
fn noexec_tmp_and_shm_hold_without_landlock() {
    let Some(e) = Suite::new("noexec_without_landlock", PROBE) else { return };
    let ws = Scratch::new("noexec-ll");
    ws.give_to_nobody();
    let flags = ["--mode", "shadow", "--workspace", ws.0.to_str().unwrap()];
    for target in ["/tmp/x", "/dev/shm/x"] {
        let r = run(&e, e.rootfs, &NO_LANDLOCK, &flags, &["exec-copy", target]);
        assert_refused_without(&r, target, "landlock", libc::EACCES);
    }
    // Control: without landlock, a copy in the (exec-able) workspace runs.
    let r = run(&e, e.rootfs, &NO_LANDLOCK, &flags, &["exec-copy", "/workspace/x"]);
    assert!(r.stdout.starts_with("ESCAPED"), "{}", r.stdout);
}

#[test]
fn landlock_holds_without_the_mount_flags() {
    let Some(e) = Suite::new("landlock_without_flags", PROBE) else { return };
    // A rootfs of this test's own: the control writes into it.
    let s = Scratch::new("ll-flags");
    let root = s.join("root");
    build_rootfs(&root, &e.probe);
    let hook = [("CHIO_TEST_HOOK", "mount_flags")];
    // As uid 0, the owner of the image's files: file permissions would allow the write.
    let root_id = ["--uid", "0", "--gid", "0"];
    let r = run(&e, &root, &hook, &root_id, &["write", "/lib/escaped"]);
    assert_eq!(r.assert_refused("write /lib by landlock alone"), libc::EACCES);
    for target in ["/tmp/x", "/dev/shm/x"] {
        let r = run(&e, &root, &hook, &[], &["exec-copy", target]);
        assert_eq!(r.assert_refused(&format!("exec {target} by landlock alone")), libc::EACCES);
    }
    assert!(!root.join("lib/escaped").exists());
    // Each kind of creation and truncation, refused by landlock's own right for it (the write
    // above is also refused by WRITE_FILE, so it cannot tell whether MAKE_REG is handled).
    std::fs::write(root.join("lib/existing"), b"keep").unwrap();
    let kinds = ["reg", "dir", "fifo", "sym", "sock", "chr", "blk"];
    for kind in kinds {
        let r = run(&e, &root, &hook, &root_id, &["create", kind, "/lib/made"]);
        assert_eq!(r.assert_refused(&format!("create {kind} in /lib by landlock alone")), libc::EACCES, "{kind}");
    }
    let r = run(&e, &root, &hook, &root_id, &["truncate", "/lib/existing"]);
    assert_eq!(r.assert_refused("truncate in /lib by landlock alone"), libc::EACCES);
    assert_eq!(std::fs::read(root.join("lib/existing")).unwrap(), b"keep");
    // Control: the same mounts without landlock either: the write and the exec go through, so
    // the hook really removed the flags.
    let both = [("CHIO_TEST_HOOK", "mount_flags"), ("CHIO_TEST_LANDLOCK_ABI", "0")];
    let r = run(&e, &root, &both, &["--mode", "shadow", "--uid", "0", "--gid", "0"], &["write", "/lib/escaped"]);
    assert!(r.stdout.starts_with("ESCAPED"), "{}", r.stdout);
    let r = run(&e, &root, &both, &["--mode", "shadow"], &["exec-copy", "/tmp/x"]);
    assert!(r.stdout.starts_with("ESCAPED"), "{}", r.stdout);
    let shadow_root = ["--mode", "shadow", "--uid", "0", "--gid", "0"];
    for (i, kind) in kinds.iter().enumerate() {
        let path = format!("/lib/made-{i}");
        let r = run(&e, &root, &both, &shadow_root, &["create", kind, &path]);
        match *kind {
            // Without landlock the capability drop refuses device nodes, with another errno:
            // the EACCES above is landlock's.
            "chr" | "blk" => assert!(r.stdout.contains(&format!("errno={}", libc::EPERM)), "{kind}: {}", r.stdout),
            _ => assert!(r.stdout.starts_with("ESCAPED"), "{kind}: {}", r.stdout),
        }
    }
    let r = run(&e, &root, &both, &shadow_root, &["truncate", "/lib/existing"]);
    assert!(r.stdout.starts_with("ESCAPED"), "{}", r.stdout);
}

/// uid 0 keeps its capabilities when the bounding drop and securebits are skipped (shadow mode
/// runs it, the record says NOT CONFINED): seccomp alone still refuses.
#[test]
fn seccomp_holds_with_capabilities_present() {
    let Some(e) = Suite::new("seccomp_with_caps", PROBE) else { return };
    let hook = [("CHIO_TEST_HOOK", "bounding")];
    let flags = ["--mode", "shadow", "--uid", "0", "--gid", "0"];
    let r = run(&e, e.rootfs, &hook, &flags, &["caps"]);
    assert!(r.stdout.starts_with("ESCAPED"), "the target holds capabilities: {}", r.stdout);
    assert!(r.record["not_confined"].to_string().contains("CapEff"), "{}", r.record["not_confined"]);
    let s = Scratch::new("caps-control");
    for (args, control) in [
        (vec!["mount", "/tmp"], vec!["mount", s.0.to_str().unwrap()]),
        (vec!["unshare", "user"], vec!["unshare", "user"]),
        (vec!["chroot", "/"], vec!["chroot", "/"]),
        (vec!["sethostname"], vec!["sethostname", "--own-ns"]),
        (vec!["open-by-handle", "/probe"], vec!["open-by-handle", PROBE]),
        (vec!["setns"], vec!["setns"]),
    ] {
        let r = run(&e, e.rootfs, &hook, &flags, &args);
        assert_eq!(r.state(), "NotConfined", "{args:?}: {}", r.stderr);
        assert!(r.stdout.starts_with("REFUSED") && r.stdout.trim_end().ends_with("errno=1"), "{args:?}: {}", r.stdout);
        // Control: with capabilities and no filter (root on the host) the call works.
        assert_escaped(&format!("{args:?}"), host(&e.probe, &control));
    }
}

/// `nosuid` on the root's binds, the workspace and an operator's bind holds without no_new_privs (which alone also
/// makes set-id bits inert): shadow mode with the no_new_privs step skipped. Control: the same
/// setuid-root file run by uid 65534 on the host becomes root.
#[test]
fn nosuid_holds_without_no_new_privs() {
    let Some(e) = Suite::new("nosuid_without_nnp", PROBE) else { return };
    let ws = Scratch::new("nosuid-ws");
    std::fs::set_permissions(&ws.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy_executable(Path::new(PROBE), &ws.join("probe-suid"));
    std::fs::set_permissions(ws.join("probe-suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let bind = format!("{}:/opt/bound", ws.0.display());
    let flags = ["--mode", "shadow", "--workspace", ws.0.to_str().unwrap(), "--ro-bind", &bind];
    for target in ["/probe-suid", "/workspace/probe-suid", "/opt/bound/probe-suid"] {
        let out = Command::new(&e.chio)
            .args(["cage", "run", "--json", "--rootfs"])
            .arg(e.rootfs)
            .args(flags)
            .args(["--", target, "euid"])
            .env("CHIO_TEST_HOOK", "no_new_privs")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let r = parse(out);
        assert_eq!(r.record["observed"]["no_new_privs"], 0, "the hook left no_new_privs on: {}", r.stderr);
        assert!(r.stdout.starts_with("REFUSED: euid is 65534"), "{target}: {}", r.stdout);
    }
    let suid = ws.join("probe-suid");
    assert_escaped(
        "setuid without nosuid",
        host(Path::new(PROBE), &["as-user", "65534", suid.to_str().unwrap(), "euid"]),
    );
}

/// `nodev` on the root's binds, the workspace and an operator's bind: a device node planted in
/// any of them (a rootfs directory, a host directory) does not open in the cage — no other layer stops it.
/// Control: uid 65534 on the host opens the same nodes.
#[test]
fn nodev_holds_in_the_root_and_the_workspace() {
    let Some(e) = Suite::new("nodev", PROBE) else { return };
    let (root, ws) = (Scratch::new("nodev-root"), Scratch::new("nodev-ws"));
    build_rootfs(&root.0, Path::new(PROBE));
    for dir in [&root.0, &ws.0] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for node in [root.join("lib/null"), ws.join("null")] {
        let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
        // SAFETY: mknod of a character device (1:3, what /dev/null is) at a path we own.
        assert_eq!(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) }, 0);
        std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let bind = format!("{}:/opt/bound", ws.0.display());
    let flags = ["--workspace", ws.0.to_str().unwrap(), "--bind", &bind];
    for (inside, outside) in [
        ("/lib/null", root.join("lib/null")),
        ("/workspace/null", ws.join("null")),
        ("/opt/bound/null", ws.join("null")),
    ] {
        let r = run(&e, &root.0, &[], &flags, &["read", inside]);
        assert_eq!(r.state(), "FullyEnforced", "{}", r.stderr);
        assert!(r.stdout.starts_with("REFUSED") && r.stdout.trim_end().ends_with("errno=13"), "{inside}: {}", r.stdout);
        assert_escaped(inside, host(Path::new(PROBE), &["as-user", "65534", PROBE, "read", outside.to_str().unwrap()]));
    }
}

/// A whiteout (char 0:0) is the one device node anyone may make: nothing but landlock's
/// MAKE_CHAR stops the target making one in a directory it can write (seccomp allows the call,
/// no capability is needed). Control: landlock off, it is made.
#[test]
fn device_nodes_are_refused_by_landlock_alone() {
    let Some(e) = Suite::new("whiteout", PROBE) else { return };
    let r = run(&e, e.rootfs, &[], &["--mode", "shadow"], &["create", "whiteout", "/tmp/w"]);
    assert_eq!(r.state(), "FullyEnforced", "{}", r.stderr);
    assert!(r.stdout.starts_with("REFUSED") && r.stdout.trim_end().ends_with("errno=13"), "{}", r.stdout);
    let r = run(&e, e.rootfs, &NO_LANDLOCK, &["--mode", "shadow"], &["create", "whiteout", "/tmp/w"]);
    assert!(r.stdout.starts_with("ESCAPED"), "control: {}", r.stdout);
}
