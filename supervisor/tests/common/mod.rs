//! Tests that create, replace and remove files as root — layer extraction, image import — run
//! with the host sealed: the calling test thread gets a mount namespace of its own in which
//! every mount is read-only and `/tmp` is a fresh tmpfs. A bug that walks out of its root
//! (or a mutant that removes a check, as one of a mutation run once did here, deleting the
//! host's /etc) meets EROFS instead of the host, and the tmpfs goes with the thread, so
//! nothing is left in the host's /tmp either. Without root nothing is sealed: an unprivileged
//! run cannot write outside its own files anyway.

use std::cell::Cell;
use std::os::fd::AsFd;

thread_local! {
    static SEALED: Cell<bool> = const { Cell::new(false) };
}

/// Seal this test thread (once; later calls in the same thread do nothing). Panics if sealing
/// fails as root: such a test never runs against the open host.
pub fn seal() {
    if !nix::unistd::geteuid().is_root() || SEALED.with(Cell::get) {
        return;
    }
    // unshare(CLONE_NEWNS) from one thread of the test process moves only that thread.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("a mount namespace for the test thread");
    let root = std::fs::File::open("/").expect("/");
    // Read-only and private, every mount of this namespace (the host's stay as they are).
    chio_cage::sys::mount_setattr_tree(root.as_fd(), chio_cage::sys::MOUNT_ATTR_RDONLY).expect("sealing /");
    nix::mount::mount(Some("tmpfs"), "/tmp", Some("tmpfs"), nix::mount::MsFlags::empty(), Some("mode=1777"))
        .expect("a tmpfs on /tmp");
    SEALED.with(|s| s.set(true));
}

/// Where a sealed test writes: its own `/tmp` (whatever `TMPDIR` says — a mutation run points
/// it into the repository, which the seal makes read-only too); unsealed, the usual temp dir.
pub fn scratch() -> std::path::PathBuf {
    seal();
    if SEALED.with(Cell::get) {
        "/tmp".into()
    } else {
        std::env::temp_dir()
    }
}

/// Whether writing outside `/tmp` fails here (the seal holds).
#[allow(dead_code)]
pub fn host_is_read_only() -> bool {
    let probe = "/var/chio-sealed-probe";
    match std::fs::create_dir(probe) {
        Err(e) => e.raw_os_error() == Some(libc::EROFS),
        // Not sealed: the probe is the host's now; take it away again.
        Ok(()) => {
            let _ = std::fs::remove_dir(probe);
            false
        }
    }
}
