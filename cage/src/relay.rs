//! A copy between two descriptors in a process of its own, for the ends of a launch's output
//! and input that poll cannot gate: a regular file or a device where one write or read may
//! never complete. On FUSE a request its server never answers holds the caller in the kernel,
//! past SIGKILL, until the server answers or dies; a hard NFS mount whose server is gone does
//! the same. The supervision loop then only touches its own pipe to the relay, so the deadline
//! and the forwarded signals keep their times whatever the far end does, and a relay still
//! stuck when the launch ends is killed and left to finish dying on its own.

use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::sys;

/// File systems whose reads and writes complete (local disks and memory): a regular file there
/// is read and written directly. Anything else — FUSE, NFS, CIFS, 9p, an overlay of who knows
/// what — goes through a relay.
const COMPLETING: [&str; 8] = ["ext4", "ext3", "ext2", "xfs", "btrfs", "tmpfs", "ramfs", "f2fs"];

/// Whether reading or writing `fd` can wait for ever where poll cannot see it (see [`stalls`]).
pub fn may_stall(fd: BorrowedFd<'_>) -> bool {
    stalls(fd).is_some()
}

/// What `fd` is, when reading or writing it can wait for ever where poll cannot see it: a
/// regular file off the local file systems above, any block device, or a character device other
/// than a terminal or the memory devices (`/dev/null`, `/dev/zero`, `/dev/full`: major 1).
/// Pipes and sockets poll gates: None. Asked without a request to the file's own file system —
/// a FUSE server that never answers would hold the question itself: the type comes from the
/// attributes the kernel holds (`AT_STATX_DONT_SYNC`), the file system from the mount table.
/// Unknown counts as stalling.
pub fn stalls(fd: BorrowedFd<'_>) -> Option<String> {
    stalls_for(fd, None)
}

/// [`stalls`] for a descriptor a process `peer` passed: its mount is looked for in that
/// process's mount table too. A daemon in a mount namespace of its own (systemd's
/// `PrivateTmp=`) sees none of its clients' mounts by id — a namespace's copy of a mount is
/// another mount — and a client in a container or a unit's namespace has mounts the daemon has
/// no copy of. A mount's id is the kernel's for as long as the mount lives, and the descriptor
/// held here keeps it alive, so any table that lists the id describes that mount; a table
/// that does not (the peer gone, its pid another process's) leaves it unknown: stalling.
pub fn stalls_for(fd: BorrowedFd<'_>, peer: Option<libc::pid_t>) -> Option<String> {
    let stx = match held_attributes(fd) {
        Ok(stx) => stx,
        Err(e) => return Some(format!("a descriptor whose kind cannot be read ({e})")),
    };
    match u32::from(stx.stx_mode) & libc::S_IFMT {
        libc::S_IFREG => {
            let mount = (stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id);
            match mount.and_then(|m| mount_type(m, "self").or_else(|| mount_type(m, &peer?.to_string()))) {
                Some(t) if COMPLETING.contains(&t.as_str()) => None,
                Some(t) => Some(format!("a file on {t}")),
                None if mount.is_some() && mount == memfd_mount() => None,
                None => Some("a file on a mount this process cannot see".into()),
            }
        }
        libc::S_IFBLK => Some("a block device".into()),
        libc::S_IFCHR if stx.stx_rdev_major != 1 && !nix::unistd::isatty(fd).unwrap_or(false) => {
            Some(format!("the character device {}:{}", stx.stx_rdev_major, stx.stx_rdev_minor))
        }
        _ => None,
    }
}

/// `fd`'s type and mount as the kernel holds them, asking no file system.
fn held_attributes(fd: BorrowedFd<'_>) -> io::Result<libc::statx> {
    sys::statx_held(fd, libc::STATX_TYPE | libc::STATX_MNT_ID)
}

/// The mount every memfd lives on — the kernel's own tmpfs, in no mount table — learnt once
/// from a memfd of this process's. A memfd is memory: its writes complete.
fn memfd_mount() -> Option<u64> {
    static MOUNT: OnceLock<Option<u64>> = OnceLock::new();
    *MOUNT.get_or_init(|| {
        let fd = nix::sys::memfd::memfd_create(c"chio-kind", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).ok()?;
        let stx = held_attributes(fd.as_fd()).ok()?;
        (stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id)
    })
}

/// The file system type of mount `id` in the mount table of process `pid` (`self` too:
/// `/proc/PID/mountinfo`, after the ` - `).
fn mount_type(id: u64, pid: &str) -> Option<String> {
    let table = crate::sys::read_proc(format!("/proc/{pid}/mountinfo")).ok()?;
    let line = table.lines().find(|l| l.split(' ').next().and_then(|f| f.parse::<u64>().ok()) == Some(id))?;
    let (_, after) = line.split_once(" - ")?;
    after.split(' ').next().map(str::to_string)
}

/// What a relay has done, shared with it: bytes it read, bytes it wrote.
#[derive(Default)]
struct Counts {
    taken: AtomicU64,
    copied: AtomicU64,
}

/// A relay's [`Counts`] (one page, shared with the relay).
struct Counter(NonNull<Counts>);

impl Counter {
    fn new() -> io::Result<Counter> {
        let len = NonZeroUsize::new(std::mem::size_of::<Counts>()).ok_or(io::ErrorKind::InvalidInput)?;
        // SAFETY: a fresh anonymous shared mapping; zeroed memory is valid Counts.
        let p =
            unsafe { mmap_anonymous(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED)? };
        Ok(Counter(p.cast()))
    }

    fn get(&self) -> &Counts {
        // SAFETY: the mapping lives as long as self.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no reference to it outlives self.
        unsafe {
            let _ = munmap(self.0.cast(), std::mem::size_of::<Counts>());
        }
    }
}

/// A running copy (see the module).
pub struct Relay {
    pid: Pid,
    pidfd: OwnedFd,
    counts: Counter,
}

impl Relay {
    /// Fork a process that copies `from` to `to` until `from` ends, then exits 0 (1 when a read
    /// or write fails). It keeps only those two descriptors and dies with this process.
    pub fn start(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<Relay> {
        let counts = Counter::new()?;
        let parent = nix::unistd::getpid();
        // SAFETY: the supervising process is single-threaded; the child only makes system
        // calls and leaves with _exit.
        match unsafe { fork() }? {
            ForkResult::Child => {
                let ok = relay_main(parent, from.as_raw_fd(), to.as_raw_fd(), counts.get());
                // SAFETY: leaving the forked child without running the parent's destructors.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            ForkResult::Parent { child } => {
                let pidfd = sys::pidfd_open(child.as_raw()).inspect_err(|_| {
                    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                })?;
                Ok(Relay { pid: child, pidfd, counts })
            }
        }
    }

    /// Bytes written so far.
    pub fn copied(&self) -> u64 {
        self.counts.get().copied.load(Ordering::Acquire)
    }

    /// Bytes read and not (yet) written: what dies with the relay if it is stopped now.
    pub fn in_hand(&self) -> u64 {
        let c = self.counts.get();
        c.taken.load(Ordering::Acquire).saturating_sub(c.copied.load(Ordering::Acquire))
    }

    /// Wait until `deadline` for the relay to finish what it was given (its source must have
    /// ended: for output, this process's end of the pipe closed). True when it copied it all.
    pub fn finish(&self, deadline: Instant) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
            match poll(&mut [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)], ms) {
                Err(Errno::EINTR) => continue,
                _ => break,
            }
        }
        matches!(waitpid(self.pid, Some(WaitPidFlag::WNOHANG)), Ok(WaitStatus::Exited(_, 0)))
    }

    /// End it (SIGKILL through its pidfd) without waiting: one held in a FUSE request dies only
    /// when that request ends.
    pub fn stop(&self) {
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
        let _ = waitpid(self.pid, Some(WaitPidFlag::WNOHANG));
    }
}

/// The relay itself: `from` and `to` become its stdin and stdout, every other descriptor of the
/// launch (a cage's channel end, its other pipes) is closed, and it copies.
fn relay_main(parent: Pid, from: RawFd, to: RawFd, counts: &Counts) -> bool {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 || nix::unistd::getppid() != parent {
        return false;
    }
    // Above 2 first, so that neither lands on the other's new number.
    // SAFETY: fcntl and dup2 on descriptors of this process.
    let placed = unsafe {
        let (f, t) = (libc::fcntl(from, libc::F_DUPFD, 3), libc::fcntl(to, libc::F_DUPFD, 3));
        f >= 0 && t >= 0 && libc::dup2(f, 0) == 0 && libc::dup2(t, 1) == 1
    };
    if !placed || sys::close_from(2).is_err() {
        return false;
    }
    let (from, to) = (0, 1);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // SAFETY: reading into our own buffer.
        let n = unsafe { libc::read(from, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            return true;
        }
        if n < 0 {
            if Errno::last() == Errno::EINTR {
                continue;
            }
            return false;
        }
        counts.taken.fetch_add(n as u64, Ordering::Release);
        let mut at = 0;
        while at < n as usize {
            // SAFETY: writing from our own buffer.
            let w = unsafe { libc::write(to, buf[at..].as_ptr().cast(), n as usize - at) };
            if w < 0 {
                if Errno::last() == Errno::EINTR {
                    continue;
                }
                return false;
            }
            at += w as usize;
            counts.copied.fetch_add(w as u64, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pipes and the memory devices are polled or never wait; a file of a file system outside
    /// the list (procfs here) goes through a relay, named by its file system.
    #[test]
    fn what_may_stall() {
        use std::os::unix::fs::OpenOptionsExt;
        let (r, w) = nix::unistd::pipe().expect("pipe");
        assert!(!may_stall(r.as_fd()) && !may_stall(w.as_fd()));
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null").expect("/dev/null");
        assert!(!may_stall(null.as_fd()));
        let proc_file = std::fs::File::open("/proc/self/stat").expect("/proc/self/stat");
        assert_eq!(stalls(proc_file.as_fd()).as_deref(), Some("a file on proc"));
        // A memfd's mount is in no mount table, and it is memory.
        let memfd = nix::sys::memfd::memfd_create(c"t", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).expect("memfd");
        assert!(!may_stall(memfd.as_fd()));
        assert_eq!(mount_type(u64::MAX, "self"), None);
        // Files of the local file systems are written directly: tmpfs, and the disk the
        // workspace is on (files without a name, gone with their descriptor).
        for dir in ["/dev/shm", env!("CARGO_MANIFEST_DIR")] {
            let f =
                std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(dir).expect(dir);
            assert_eq!(stalls(f.as_fd()), None, "{dir}");
        }
    }

    /// Whether this test runs as root; without, it skips saying `why` — except under CI, which
    /// runs the unit tests as root, where that fails.
    fn as_root(test: &str, why: &str) -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        assert!(std::env::var("CI").is_err(), "{test}: CI runs the unit tests as root");
        eprintln!("SKIP {test}: {why}");
        false
    }

    /// A file on a mount this process cannot see (another mount namespace's: what a client in
    /// a container may pass) counts as stalling, whatever its file system — here a tmpfs —
    /// unless the process that passed it sees it: then its file system decides.
    #[test]
    fn a_file_of_another_mount_namespace_may_stall() {
        use nix::mount::{mount, MsFlags};
        use std::os::unix::fs::OpenOptionsExt;
        if !as_root("a_file_of_another_mount_namespace_may_stall", "mounting takes root") {
            return;
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/unit-tmp/other-ns");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let at = dir.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        // A thread of its own, unshared: this process's other threads keep the host's mounts.
        let peer = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare");
            mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
                .expect("private");
            mount(Some("tmpfs"), &at, Some("tmpfs"), MsFlags::empty(), None::<&str>).expect("tmpfs");
            let f = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(&at);
            tx.send((f.expect("file"), nix::unistd::gettid().as_raw())).expect("send");
            let _ = wait.recv();
        });
        let (file, tid) = rx.recv().expect("the thread's file");
        assert_eq!(stalls(file.as_fd()).as_deref(), Some("a file on a mount this process cannot see"));
        assert_eq!(stalls_for(file.as_fd(), Some(tid)), None, "the thread sees its tmpfs");
        assert_eq!(stalls_for(file.as_fd(), Some(1)).as_deref(), Some("a file on a mount this process cannot see"));
        drop(done);
        peer.join().expect("thread");
        drop(file);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// Devices: a terminal (a pty's master) is polled; `/dev/fuse` (a character device whose
    /// reads wait on whoever serves it) and a block device go through a relay. Opening them
    /// takes root, which the unit tests have under CI.
    #[test]
    fn which_devices_may_stall() {
        use std::os::unix::fs::OpenOptionsExt;
        if !as_root("which_devices_may_stall", "opening the devices takes root") {
            return;
        }
        let rw =
            |p: &str| std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOCTTY).open(p).expect(p);
        assert_eq!(stalls(rw("/dev/ptmx").as_fd()), None);
        assert_eq!(stalls(rw("/dev/fuse").as_fd()).as_deref(), Some("the character device 10:229"));
        let block = std::fs::read_dir("/sys/block")
            .expect("/sys/block")
            .flatten()
            .find_map(|e| std::fs::File::open(std::path::Path::new("/dev").join(e.file_name())).ok())
            .expect("no block device opens here");
        assert_eq!(stalls(block.as_fd()).as_deref(), Some("a block device"));
    }
}
