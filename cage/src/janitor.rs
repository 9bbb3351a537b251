//! A small process that outlives a killed supervisor: it waits for EOF on a pipe only the
//! supervisor holds, then kills whatever is left in the launch cgroup and removes it. A
//! supervisor that lives to the end closes the pipe too, once it has read the cgroup's usage,
//! and takes the janitor's exit status as the removal's result: one removal path for both. The cage's
//! processes already die with the supervisor (PDEATHSIG on the init, EXITKILL on the traced
//! target); cgroup directories do not, which is what this is for.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::cgroup::LaunchCgroup;
use crate::sys;

/// The supervisor's side: closing the lifeline tells the janitor to remove the cgroup and exit.
pub struct Janitor {
    lifeline: Option<OwnedFd>,
    pid: libc::pid_t,
}

impl Janitor {
    /// Normal end: the cage is gone. The janitor removes the cgroup — exactly what it does
    /// when the supervisor dies — and its exit status says whether that worked.
    pub fn finish(mut self) -> io::Result<()> {
        self.lifeline = None;
        let mut status = 0;
        loop {
            // SAFETY: reaping our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                break;
            }
            if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return Err(io::Error::last_os_error());
            }
        }
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            Ok(())
        } else {
            Err(io::Error::other(format!("the janitor could not remove the launch cgroup (status {status:#x})")))
        }
    }
}

/// Fork the janitor for `cg`. Must be called single-threaded.
pub fn spawn(cg: &LaunchCgroup) -> io::Result<Janitor> {
    let mut fds = [0; 2];
    // SAFETY: valid array; CLOEXEC so no exec'd program keeps the lifeline.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fds.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the caller is single-threaded; the child only runs `watch`.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(w);
            watch(r, cg)
        }
        pid => {
            drop(r);
            Ok(Janitor { lifeline: Some(w), pid })
        }
    }
}

fn watch(r: OwnedFd, cg: &LaunchCgroup) -> ! {
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
        libc::dup2(r.as_raw_fd(), 3);
    }
    let _ = sys::close_from(4);
    let mut b = 0u8;
    loop {
        // SAFETY: one-byte read from our pipe.
        let n = unsafe { libc::read(3, (&mut b as *mut u8).cast(), 1) };
        if n == 0 || (n < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)) {
            break;
        }
    }
    let code = if cg.remove().is_ok() { 0 } else { 1 };
    // SAFETY: leave without running the supervisor's destructors.
    unsafe { libc::_exit(code) }
}
