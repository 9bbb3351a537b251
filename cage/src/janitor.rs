//! A small process that outlives a killed supervisor: it waits for EOF on a socket only the
//! supervisor holds, then kills whatever is left in the launch cgroup and removes it. The
//! cage's processes already die with the supervisor (PDEATHSIG on the init, EXITKILL on the
//! traced target); cgroup directories do not, which is what this is for.
//!
//! A supervisor that lives to the end removes the cgroup itself, once it has read its usage,
//! and then tells the janitor it is done (one byte, then EOF): the janitor exits without
//! touching it. Handing the removal over instead, and waiting for the janitor's word, cost two
//! process wakes at the end of every one-shot launch. A supervisor whose removal failed closes
//! the socket without the byte, and the janitor tries once more on its own. It does not wait
//! for the janitor's exit (a process teardown, off the launch's critical path); released
//! janitors are reaped by the next launch, or by whoever inherits them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::signal::{signal, SigHandler, Signal};
use nix::sys::socket::{send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{dup2_stderr, dup2_stdin, dup2_stdout, fork, read, ForkResult, Pid};

use crate::cgroup::LaunchCgroup;
use crate::sys;

/// The supervisor's word that it removed the cgroup itself.
const DONE: u8 = b'D';

/// Janitors released and exiting on their own, not yet reaped.
static RELEASED: Mutex<Vec<Pid>> = Mutex::new(Vec::new());

/// The supervisor's side: EOF on it without the word [`DONE`] tells the janitor to remove the cgroup.
#[derive(Debug)]
pub struct Janitor {
    sock: OwnedFd,
    pid: Pid,
}

impl Janitor {
    /// Normal end: the cage is gone and the supervisor has removed the cgroup (`removed`). A
    /// janitor told so exits; one closed without the word removes what is left, as it does
    /// when the supervisor dies.
    fn release(self, removed: bool) {
        if removed {
            // MSG_NOSIGNAL: a janitor killed meanwhile makes this EPIPE, never a SIGPIPE.
            let _ = send(self.sock.as_raw_fd(), &[DONE], MsgFlags::MSG_NOSIGNAL);
        }
        drop(self.sock);
        if let Ok(mut r) = RELEASED.lock() {
            r.push(self.pid);
        }
        reap_released();
    }

    /// Not wanted after all (a detached cage's cgroup outlives its supervisor): killed and
    /// reaped, leaving the cgroup as it is.
    pub fn dismiss(self) {
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        while let Err(Errno::EINTR) = waitpid(self.pid, None) {}
    }
}

/// Remove `cg` (killing what is left in it), and release its janitor: told the cgroup is gone,
/// or, when the removal failed, left to try once more.
pub fn remove(cg: &LaunchCgroup, janitor: Option<Janitor>) -> io::Result<()> {
    let removed = cg.remove();
    if let Some(j) = janitor {
        j.release(removed.is_ok());
    }
    removed
}

/// Reap released janitors that have exited (never blocks).
fn reap_released() {
    let Ok(mut pids) = RELEASED.lock() else { return };
    pids.retain(|&pid| matches!(waitpid(pid, Some(WaitPidFlag::WNOHANG)), Ok(WaitStatus::StillAlive)));
}

/// Fork the janitor for `cg`. Must be called single-threaded.
pub fn spawn(cg: &LaunchCgroup) -> io::Result<Janitor> {
    reap_released();
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)?;
    // SAFETY: the caller is single-threaded; the child only runs `watch`.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(ours);
            watch(theirs, cg)
        }
        ForkResult::Parent { child } => {
            drop(theirs);
            Ok(Janitor { sock: ours, pid: child })
        }
    }
}

fn watch(sock: OwnedFd, cg: &LaunchCgroup) -> ! {
    let _ = nix::sys::prctl::set_name(c"chio-janitor");
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGPIPE] {
        // SAFETY: SIG_IGN installs no handler.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = dup2_stdin(&null).and_then(|_| dup2_stdout(&null)).and_then(|_| dup2_stderr(&null));
    }
    // The socket and the cgroup's descriptors kept, nothing else of the supervisor's. Those
    // are the supervisor's own open directories, so their locks are too (see cgroup::Dir): the
    // cgroup stays held as a live launch's while this process watches it, whenever its
    // supervisor dies.
    let mut keep = cg.descriptors();
    keep.push(sock.as_raw_fd());
    let _ = sys::close_all_but(&keep);
    let mut b = [0u8];
    let done = loop {
        match read(sock.as_fd(), &mut b) {
            Err(Errno::EINTR) => continue,
            Ok(0) | Err(_) => break false,
            Ok(_) if b[0] == DONE => break true,
            Ok(_) => {}
        }
    };
    if !done {
        let _ = cg.remove();
    }
    // SAFETY: leave without running the supervisor's destructors.
    unsafe { libc::_exit(0) }
}
