//! A small process that outlives a killed supervisor: it waits for EOF on a socket only the
//! supervisor holds, then kills whatever is left in the launch cgroup and removes it. The
//! cage's processes already die with the supervisor (PDEATHSIG on the init, EXITKILL on the
//! traced target); cgroup directories do not, which is what this is for.
//!
//! A supervisor that lives to the end shuts its side down too, once it has read the cgroup's
//! usage, and reads back one byte saying whether the removal worked: one removal path for both
//! ends. It does not wait for the janitor's exit (a process teardown, off the launch's critical
//! path); released janitors are reaped by the next launch, or by whoever inherits them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use crate::cgroup::LaunchCgroup;
use crate::sys;

const REMOVED: u8 = b'R';
const NOT_REMOVED: u8 = b'N';

/// Janitors that reported and are exiting on their own, not yet reaped.
static RELEASED: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// The supervisor's side: shutting the socket down tells the janitor to remove the cgroup.
pub struct Janitor {
    sock: OwnedFd,
    pid: libc::pid_t,
}

impl Janitor {
    /// Normal end: the cage is gone. The janitor removes the cgroup — exactly what it does when
    /// the supervisor dies — and says whether that worked.
    pub fn finish(self) -> io::Result<()> {
        // SAFETY: shutdown and a one-byte read on our own socket.
        let (shut, n, b) = unsafe {
            let shut = libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_WR);
            let mut b = 0u8;
            let n = loop {
                let n = libc::read(self.sock.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                if n >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    break n;
                }
            };
            (shut, n, b)
        };
        if let Ok(mut r) = RELEASED.lock() {
            r.push(self.pid);
        }
        reap_released();
        match (shut, n, b) {
            (0, 1, REMOVED) => Ok(()),
            (0, 1, _) => Err(io::Error::other("the janitor could not remove the launch cgroup")),
            _ => Err(io::Error::other("the janitor ended without reporting the cgroup's removal")),
        }
    }
}

/// Reap released janitors that have exited (never blocks).
fn reap_released() {
    let Ok(mut pids) = RELEASED.lock() else { return };
    pids.retain(|&pid| {
        let mut status = 0;
        // SAFETY: non-blocking reap of our own child.
        unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == 0 }
    });
}

/// Fork the janitor for `cg`. Must be called single-threaded.
pub fn spawn(cg: &LaunchCgroup) -> io::Result<Janitor> {
    reap_released();
    let mut fds = [0; 2];
    // SAFETY: valid array; CLOEXEC so no exec'd program keeps either end.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fds.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the caller is single-threaded; the child only runs `watch`.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(ours);
            watch(theirs, cg)
        }
        pid => {
            drop(theirs);
            Ok(Janitor { sock: ours, pid })
        }
    }
}

fn watch(sock: OwnedFd, cg: &LaunchCgroup) -> ! {
    // SAFETY: fd and signal housekeeping in our own single-threaded child.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"chio-janitor".as_ptr() as libc::c_ulong, 0, 0, 0);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            libc::dup2(null, fd);
        }
        libc::dup2(sock.as_raw_fd(), 3);
    }
    let _ = sys::close_from(4);
    let mut b = 0u8;
    loop {
        // SAFETY: one-byte read from our socket.
        let n = unsafe { libc::read(3, (&mut b as *mut u8).cast(), 1) };
        if n == 0 || (n < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)) {
            break;
        }
    }
    let report = if cg.remove().is_ok() { REMOVED } else { NOT_REMOVED };
    // SAFETY: a one-byte write to our socket (EPIPE when the supervisor is gone: ignored), then
    // leave without running the supervisor's destructors.
    unsafe {
        libc::write(3, (&report as *const u8).cast(), 1);
        libc::_exit(0)
    }
}
