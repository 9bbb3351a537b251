//! One daemon per state directory. `chio supervisor serve` holds an exclusive lock on
//! `<state dir>/supervisor.lock` for as long as it (or any process it forked) lives, with its pid
//! written inside: a second daemon on the same directory is refused at start, naming the holder,
//! instead of recovering the first one's running launches as `outcome_unknown`. A one-shot
//! command that would write the same receipt store checks the lock the same way (a shared lock,
//! held while it writes), so the store keeps one writer.

use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

/// The lock's name inside a state directory.
pub const LOCK_FILE: &str = "supervisor.lock";

/// A held lock on a state directory (released when dropped, and when the last process holding
/// a copy of its descriptor ends).
#[derive(Debug)]
pub struct StateLock {
    _lock: Flock<File>,
}

/// Why a state directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// A live daemon holds the directory: a one-shot writer of its store is refused.
    #[error(
        "the receipt store in {} belongs to a running chio supervisor (pid {pid}; it holds {}/{LOCK_FILE}): \
         send this launch through it (--supervisor SOCKET), or write receipts to a store of its own",
        dir.display(), dir.display()
    )]
    DaemonHolds {
        /// The state directory.
        dir: PathBuf,
        /// The holder's pid as it wrote it (`unknown` when unreadable).
        pid: String,
    },
    /// Another daemon (or a one-shot command writing its store) holds the directory: a second
    /// daemon is refused at start.
    #[error(
        "the state directory {} is in use: a chio supervisor holds {}/{LOCK_FILE} (the last to write its pid \
         there was {pid}), or a one-shot command is writing its receipt store; stop it first, or give this \
         daemon a state directory of its own (--state-dir)",
        dir.display(), dir.display()
    )]
    InUse {
        /// The state directory.
        dir: PathBuf,
        /// The pid the last daemon wrote (`unknown` when unreadable).
        pid: String,
    },
    /// The lock file could not be opened or locked.
    #[error("locking {}/{LOCK_FILE}: {source}", dir.display())]
    Io {
        /// The state directory.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// Open (creating it, mode 0600, never through a link) the lock file of `dir`.
fn open(dir: &Path, create: bool) -> Result<Option<File>, LockError> {
    let io = |source| LockError::Io { dir: dir.to_path_buf(), source };
    let flags =
        OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | if create { OFlag::O_CREAT } else { OFlag::empty() };
    let dirfd = nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| io(e.into()))?;
    match nix::fcntl::openat(&dirfd, LOCK_FILE, flags, Mode::from_bits_truncate(0o600)) {
        Ok(fd) => Ok(Some(File::from(fd))),
        Err(nix::errno::Errno::ENOENT) if !create => Ok(None),
        Err(e) => Err(io(e.into())),
    }
}

/// The pid a holder wrote into its lock file.
fn holder(f: &mut File) -> String {
    let mut s = String::new();
    let _ = f.rewind().and_then(|()| f.take(32).read_to_string(&mut s));
    match s.trim() {
        "" => "unknown".into(),
        pid => pid.into(),
    }
}

/// Take `dir` for this daemon: an exclusive lock, this process's pid written inside.
pub fn hold(dir: &Path) -> Result<StateLock, LockError> {
    let f = open(dir, true)?
        .ok_or_else(|| LockError::Io { dir: dir.to_path_buf(), source: std::io::ErrorKind::NotFound.into() })?;
    let lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut f, nix::errno::Errno::EWOULDBLOCK)) => {
            return Err(LockError::InUse { dir: dir.to_path_buf(), pid: holder(&mut f) })
        }
        Err((_, e)) => return Err(LockError::Io { dir: dir.to_path_buf(), source: e.into() }),
    };
    let io = |source| LockError::Io { dir: dir.to_path_buf(), source };
    lock.set_len(0).map_err(io)?;
    lock.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0).map_err(io)?;
    Ok(StateLock { _lock: lock })
}

/// For a one-shot command about to write the store `db`: refused while a daemon holds the state
/// directory `db` lies in; otherwise a shared lock, held while the command writes (a daemon
/// started meanwhile is refused in turn). None when no daemon ever used that directory.
pub fn share(db: &Path) -> Result<Option<StateLock>, LockError> {
    let dir = match db.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Some(f) = open(dir, false)? else { return Ok(None) };
    match Flock::lock(f, FlockArg::LockSharedNonblock) {
        Ok(l) => Ok(Some(StateLock { _lock: l })),
        Err((mut f, nix::errno::Errno::EWOULDBLOCK)) => {
            Err(LockError::DaemonHolds { dir: dir.to_path_buf(), pid: holder(&mut f) })
        }
        Err((_, e)) => Err(LockError::Io { dir: dir.to_path_buf(), source: e.into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("chio-state-lock-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A second holder is refused naming the first's pid; once the first lets go, it is taken.
    #[test]
    fn one_holder_at_a_time_and_the_refusal_names_it() {
        let d = dir("hold");
        let first = hold(&d).unwrap();
        let again = hold(&d).unwrap_err();
        assert!(matches!(&again, LockError::InUse { pid, .. } if *pid == std::process::id().to_string()), "{again}");
        assert!(again.to_string().contains("--state-dir"), "{again}");
        let writer = share(&d.join("receipts.db")).unwrap_err();
        assert!(matches!(writer, LockError::DaemonHolds { .. }), "{writer}");
        drop(first);
        let second = hold(&d).unwrap();
        drop(second);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A one-shot writer shares the directory with other one-shot writers, and a daemon cannot
    /// start while one writes; a directory no daemon ever used is not locked at all.
    #[test]
    fn one_shot_writers_share_and_keep_a_daemon_out() {
        let d = dir("share");
        assert!(share(&d.join("receipts.db")).unwrap().is_none(), "no daemon ever used it");
        drop(hold(&d).unwrap());
        let a = share(&d.join("receipts.db")).unwrap().unwrap();
        let b = share(&d.join("receipts.db")).unwrap().unwrap();
        assert!(matches!(hold(&d).unwrap_err(), LockError::InUse { .. }));
        drop((a, b));
        drop(hold(&d).unwrap());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The lock file is never opened through a link planted in its place.
    #[test]
    fn a_planted_link_is_not_followed() {
        let d = dir("link");
        std::os::unix::fs::symlink("/etc/passwd", d.join(LOCK_FILE)).unwrap();
        assert!(matches!(hold(&d).unwrap_err(), LockError::Io { .. }));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
