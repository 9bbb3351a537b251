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
    /// Watch `child` for `limit`.
    pub(crate) fn arm(child: &Child, limit: Duration) -> io::Result<Watchdog> {
        let pidfd = chio_cage::sys::pidfd_open(child.id() as libc::pid_t)?;
        let (disarm, disarmed) = mpsc::channel::<()>();
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

/// The text of the small regular file at `path` (a `.git` file): at most `max` bytes, opened
/// without waiting (a FIFO is refused, not waited on) and never through a link at its last
/// component (ELOOP).
pub(crate) fn read_small(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_regular(path, max, libc::O_NOFOLLOW)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{} is not UTF-8", path.display())))
}

/// The bytes of the regular file at `path`, at most `max` of them: the file is opened without
/// waiting (`O_NONBLOCK`: a FIFO is refused, not waited on), with `flags` besides (`O_NOFOLLOW`
/// for a file a cage wrote), and checked on the descriptor read, so a file swapped after a check
/// by path is never the one read.
pub(crate) fn read_regular(path: &Path, max: u64, flags: i32) -> io::Result<Vec<u8>> {
    let flags = libc::O_NONBLOCK | libc::O_NOCTTY | flags;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a regular file", path.display())));
    }
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is longer than {max} bytes", path.display()),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Instant;

    #[test]
    fn a_child_past_its_deadline_is_killed_and_one_within_it_is_not() {
        let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
        let started = Instant::now();
        let dog = Watchdog::arm(&slow, Duration::from_millis(200)).unwrap();
        let status = slow.wait().unwrap();
        assert!(dog.disarm(), "the deadline did not fire");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        assert!(started.elapsed() < Duration::from_secs(10));
        let mut quick = Command::new("true").spawn().unwrap();
        let dog = Watchdog::arm(&quick, Duration::from_secs(30)).unwrap();
        assert!(quick.wait().unwrap().success());
        let started = Instant::now();
        assert!(!dog.disarm(), "a child that ended in time was counted as killed");
        assert!(started.elapsed() < Duration::from_secs(1), "disarming waited for the deadline");
    }

    #[test]
    fn only_a_bounded_regular_file_is_read_and_a_fifo_is_never_waited_on() {
        let dir = std::env::temp_dir().join(format!("chio-bounded-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("ref");
        std::fs::write(&file, "0123456789").unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a path in our own directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || tx.send(read_regular(&f, 10, 0).map_err(|e| e.kind())));
        let on_fifo = rx.recv_timeout(Duration::from_secs(5));
        if on_fifo.is_err() {
            // Free the waiting reader before failing.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        let results = (
            read_regular(&file, 10, 0).ok(),
            read_regular(&file, 9, 0).map_err(|e| e.kind()).err(),
            read_regular(&dir, 10, 0).map_err(|e| e.kind()).err(),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(on_fifo, Ok(Err(io::ErrorKind::InvalidInput)), "a FIFO was waited on or read");
        assert_eq!(results.0.as_deref(), Some(&b"0123456789"[..]));
        assert_eq!(results.1, Some(io::ErrorKind::InvalidData));
        assert_eq!(results.2, Some(io::ErrorKind::InvalidInput));
    }
}
