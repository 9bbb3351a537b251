//! `chio_cage::path::remove_tree` on a tree far deeper than the descriptor limit, in a test
//! binary of its own: the limit it lowers is the whole process's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::os::fd::AsFd;

use chio_cage::path::remove_tree;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mkdirat, Mode};

/// A tree far deeper than the descriptor limit (a loop of `mkdir a && cd a` in a cage) is
/// removed whole, links in it removed and never followed; under the same limit of 64
/// descriptors `std::fs::remove_dir_all`, the control, fails on it.
#[test]
fn a_tree_deeper_than_the_descriptor_limit_is_removed() {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 64, 64).unwrap();
    let d = std::env::temp_dir().join(format!("chio-remove-tree-{}", std::process::id()));
    std::fs::create_dir_all(d.join("inner")).unwrap();
    std::fs::write(d.join("inner/kept"), "host").unwrap();
    std::fs::create_dir(d.join("tree")).unwrap();
    // 300 levels, each with a file, a link to a host file and a link to a host directory; one
    // level 100 directories wide. Made with one descriptor at a time.
    let file = OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
    let mut at = std::fs::File::open(d.join("tree")).unwrap();
    for level in 0..300 {
        let fd = at.as_fd();
        drop(openat(fd, "f", file, Mode::from_bits_truncate(0o600)).unwrap());
        nix::unistd::symlinkat(&d.join("inner/kept"), fd, "file-link").unwrap();
        nix::unistd::symlinkat(&d.join("inner"), fd, "dir-link").unwrap();
        if level == 150 {
            for w in 0..100 {
                mkdirat(fd, format!("w{w}").as_str(), Mode::from_bits_truncate(0o755)).unwrap();
                drop(openat(fd, format!("w{w}/f").as_str(), file, Mode::from_bits_truncate(0o600)).unwrap());
            }
        }
        mkdirat(fd, "a", Mode::from_bits_truncate(0o755)).unwrap();
        let next = openat(fd, "a", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).unwrap();
        at = std::fs::File::from(next);
    }
    drop(at);
    let err = std::fs::remove_dir_all(d.join("tree")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EMFILE), "{err}");
    let parent = std::fs::File::open(&d).unwrap();
    remove_tree(parent.as_fd(), OsStr::new("tree")).unwrap();
    assert!(!d.join("tree").exists());
    assert_eq!(std::fs::read_to_string(d.join("inner/kept")).unwrap(), "host");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A mount point in the tree — a bind of a host directory, such as an operator may leave under
/// a workspace's `tmp` — or the tree itself one stops the removal, naming it, before anything on
/// that mount is touched. The control: `std::fs::remove_dir_all` goes through the bind and
/// deletes the host's file. (In a thread's own mount namespace, which ends with the thread.)
#[test]
fn a_mount_in_the_tree_stops_the_removal() {
    use nix::mount::{mount, MsFlags};
    if !nix::unistd::geteuid().is_root() {
        assert!(std::env::var("CI").is_err(), "CI runs the tests as root");
        eprintln!("SKIP a_mount_in_the_tree_stops_the_removal: mounting takes root");
        return;
    }
    let d = std::env::temp_dir().join(format!("chio-remove-tree-mount-{}", std::process::id()));
    let at = d.clone();
    let result = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>).unwrap();
        // (tree, the bind's place in it, the host directory bound there)
        let cases = [("tree", "tree/a/b", "host"), ("top", "top", "host-of-top"), ("control", "control/a/b", "host-c")];
        for (tree, place, host) in cases {
            std::fs::create_dir_all(at.join(tree).join("a/b")).unwrap();
            std::fs::write(at.join(tree).join("a/file"), "tree").unwrap();
            std::fs::create_dir_all(at.join(host)).unwrap();
            std::fs::write(at.join(host).join("kept"), "host").unwrap();
            mount(Some(&at.join(host)), &at.join(place), None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        }
        let parent = std::fs::File::open(&at).unwrap();
        let errors = ["tree", "top"].map(|t| remove_tree(parent.as_fd(), OsStr::new(t)).unwrap_err().to_string());
        let kept = ["host", "host-of-top"].map(|h| std::fs::read_to_string(at.join(h).join("kept")).ok());
        let control = std::fs::remove_dir_all(at.join("control"));
        let control_kept = at.join("host-c/kept").exists();
        for (_, place, _) in cases {
            nix::mount::umount2(&at.join(place), nix::mount::MntFlags::MNT_DETACH).unwrap();
        }
        (errors, kept, control.is_err(), control_kept)
    })
    .join()
    .unwrap();
    std::fs::remove_dir_all(&d).unwrap();
    let (errors, kept, control_failed, control_kept) = result;
    assert!(errors[0].contains("tree/a/b: a mount point"), "{}", errors[0]);
    assert!(errors[1].starts_with("top: a mount point"), "{}", errors[1]);
    assert_eq!(kept, [Some("host".into()), Some("host".into())], "the host's files behind the binds");
    assert!(control_failed && !control_kept, "control: remove_dir_all deletes through the bind, then fails");
}
