//! Waiting for a traced child with a deadline. `waitpid` has no timeout, and a pidfd becomes
//! readable only when its process exits, not when it stops; but every stop and exit of a child
//! or tracee sends its parent or tracer SIGCHLD. Blocked, SIGCHLD is queued rather than
//! ignored, and a signalfd makes it something `poll` can wait for with a timeout.

use std::io;
use std::os::fd::AsFd;
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// SIGCHLD blocked on this thread and readable from a signalfd until dropped, when the
/// thread's previous mask comes back.
pub struct ChildStops {
    fd: SignalFd,
    old: SigSet,
}

impl ChildStops {
    /// Start catching SIGCHLD. A stop or exit after this call wakes [`ChildStops::wait`]; one
    /// before it is for the caller's next `waitpid(WNOHANG)` to find.
    pub fn catch() -> io::Result<ChildStops> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGCHLD);
        // Under the default disposition SIGCHLD is sent for stops too (and, unblocked,
        // discarded).
        crate::sys::hear_of_children()?;
        let old = set.thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
        match SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) {
            Ok(fd) => Ok(ChildStops { fd, old }),
            Err(e) => {
                let _ = old.thread_set_mask();
                Err(e.into())
            }
        }
    }

    /// Wait for the next SIGCHLD until `deadline`: true when one came (read and discarded:
    /// the caller asks `waitpid` what it was), false at the deadline.
    pub fn wait(&self, deadline: Instant) -> io::Result<bool> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = PollTimeout::try_from(left.as_millis().saturating_add(1)).unwrap_or(PollTimeout::MAX);
            let mut p = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut p, ms) {
                Ok(0) if Instant::now() >= deadline => return Ok(false),
                Ok(0) | Err(nix::errno::Errno::EINTR) => {}
                Ok(_) => {
                    while let Ok(Some(_)) = self.fd.read_signal() {}
                    return Ok(true);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for ChildStops {
    fn drop(&mut self) {
        let _ = self.old.thread_set_mask();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A SIGCHLD wakes the wait long before its deadline; with nothing more to come, the wait
    /// ends at the deadline, not before. (The signal is sent to this thread: in the test
    /// harness, a process-wide SIGCHLD goes to a thread that does not block it. The supervisor
    /// waits in a process of one thread, where every launch's exec stop wakes it this way.)
    #[test]
    fn a_sigchld_wakes_and_the_deadline_ends_the_wait() {
        let stops = ChildStops::catch().unwrap();
        let t = Instant::now();
        nix::sys::signal::raise(Signal::SIGCHLD).unwrap();
        assert!(stops.wait(t + Duration::from_secs(20)).unwrap(), "woken before the deadline");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        // With nothing more to come, the wait ends at its deadline. Another test's child ending
        // meanwhile may wake it (a process-wide SIGCHLD can be read from this thread's
        // signalfd too): a few tries, one of which must run to its deadline.
        let to_deadline = (0..20).any(|_| {
            let t = Instant::now();
            let woken = stops.wait(t + Duration::from_millis(150)).unwrap();
            !woken && t.elapsed() >= Duration::from_millis(150)
        });
        assert!(to_deadline, "every wait was woken: the first SIGCHLD was not read, or one came each time");
    }

    /// The thread's mask is what it was once the catcher is gone.
    #[test]
    fn the_mask_comes_back() {
        let before = SigSet::thread_get_mask().unwrap();
        assert!(!before.contains(Signal::SIGCHLD));
        let stops = ChildStops::catch().unwrap();
        assert!(SigSet::thread_get_mask().unwrap().contains(Signal::SIGCHLD));
        drop(stops);
        assert!(!SigSet::thread_get_mask().unwrap().contains(Signal::SIGCHLD));
    }
}
