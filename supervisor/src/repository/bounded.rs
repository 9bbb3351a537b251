//! Reading a source repository that may be hostile, bounded in time and size: git never runs
//! past a deadline, and chio's own reads of the repository's small files (refs, `.git`,
//! `commondir`) take only regular files of a few KiB, never waiting on one. A FIFO planted as a
//! ref or a loose object, or a file system that does not answer, would otherwise hold `init`
//! (and git, which opens such a file and waits for a writer) forever.

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Child;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long one git command may run: far beyond what importing or diffing a large tree takes.
const GIT_DEADLINE: Duration = Duration::from_secs(600);

/// The deadline for git (with the `test-hooks` feature, `CHIO_TEST_GIT_DEADLINE_MS` shortens it).
pub(crate) fn git_deadline() -> Duration {
    let hook = std::env::var("CHIO_TEST_GIT_DEADLINE_MS").ok().and_then(|v| v.parse().ok());
    match hook {
        Some(ms) if cfg!(feature = "test-hooks") => Duration::from_millis(ms),
        _ => GIT_DEADLINE,
    }
}

/// Kills a child that is still running at its deadline; disarmed by [`Watchdog::disarm`] (or
/// drop). The child is signalled through a pidfd, so a child already reaped — its pid perhaps
/// another process's by then — is never signalled.
pub(crate) struct Watchdog {
    disarm: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<bool>>,
}

impl Watchdog {
    /// Watch `child` for [`git_deadline`].
    pub(crate) fn arm(child: &Child) -> io::Result<Watchdog> {
        let pidfd = chio_cage::sys::pidfd_open(child.id() as libc::pid_t)?;
        let (disarm, disarmed) = mpsc::channel::<()>();
        let limit = git_deadline();
        let thread = std::thread::spawn(move || {
            let fired = disarmed.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout);
            if fired {
                let _ = chio_cage::sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
            }
            fired
        });
        Ok(Watchdog { disarm: Some(disarm), thread: Some(thread) })
    }

    /// Stop watching; whether the deadline had come and the child was killed.
    pub(crate) fn disarm(mut self) -> bool {
        self.stop()
    }

    fn stop(&mut self) -> bool {
        drop(self.disarm.take());
        self.thread.take().is_some_and(|t| t.join().unwrap_or(false))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What to say when the deadline killed git doing `what`.
pub(crate) fn overran(what: &str) -> String {
    format!(
        "{what}: git did not finish within {} s and was stopped (a FIFO or device file in the \
         repository, or a file system that does not answer?)",
        git_deadline().as_secs_f64()
    )
}

/// The text of the small regular file at `path` (a ref, `.git`, `commondir`): at most `max`
/// bytes, opened without waiting (a FIFO is refused, not waited on).
pub(crate) fn read_small(path: &Path, max: u64) -> io::Result<String> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a regular file", path.display())));
    }
    let mut text = String::new();
    f.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is longer than {max} bytes", path.display()),
        ));
    }
    Ok(text)
}
