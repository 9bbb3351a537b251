//! The cage security round: escapes through the host side of what a cage touches — bind and
//! workspace sources, files a cage leaves for the host, host-global `/proc` and `/dev` inodes,
//! the supervisor's own stdin and output, the target file, and host-wide pools. Every probe is
//! refused in a cage and paired with a control showing the same action works without the
//! restriction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;

use chio_tests::{assert_escaped, cage, host, Scratch, Suite};

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
        assert_eq!((s["device"].as_u64().unwrap(), s["inode"].as_u64().unwrap()), (m.dev(), m.ino()), "{dest}");
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
