//! What a launch process says itself — clap's usage, chio's notes and errors, a repository
//! operation's output — reaches its client through memory. The process's stdout and stderr are
//! memfds; what they hold is written to the client's own descriptors at two moments, before the
//! command's output starts and before the answer, the way the command's output is written
//! (`chio_cage::supervise::write_within`): never waiting on the client past a deadline. A
//! client that stops reading its stdout or stderr (a full pipe, a stopped terminal) would
//! otherwise hold its launch process, and a launch slot, for as long as it liked; what it has
//! not taken by the deadline is dropped, and the daemon's log says how much.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use nix::sys::memfd::{memfd_create, MFdFlags};

/// How long one flush waits for a client to take what was said.
pub const FLUSH_WAIT: Duration = Duration::from_secs(10);

/// One stream: the client's descriptor, this process's memfd for it (also its fd 1 or 2), and
/// how far that has been written out.
struct Stream {
    client: OwnedFd,
    memfd: File,
    flushed: u64,
}

thread_local! {
    /// The launch process's client streams (stdout, stderr), once taken. A launch process is
    /// single-threaded.
    static HELD: RefCell<Option<[Stream; 2]>> = const { RefCell::new(None) };
}

/// Make memfds this process's stdout and stderr and hold the client's `out` and `err`.
pub fn take(out: OwnedFd, err: OwnedFd) -> io::Result<()> {
    let said_out = memfd_create(c"chio-stdout", MFdFlags::MFD_CLOEXEC)?;
    let said_err = memfd_create(c"chio-stderr", MFdFlags::MFD_CLOEXEC)?;
    nix::unistd::dup2_stdout(&said_out)?;
    nix::unistd::dup2_stderr(&said_err)?;
    let streams = [
        Stream { client: out, memfd: File::from(said_out), flushed: 0 },
        Stream { client: err, memfd: File::from(said_err), flushed: 0 },
    ];
    HELD.with(|h| *h.borrow_mut() = Some(streams));
    Ok(())
}

/// The client's stdout and stderr, for the command's output (None in the one-shot form).
///
/// The descriptors stay open until [`finish`], which only the launch process's end calls.
pub fn client_outputs() -> Option<(BorrowedFd<'static>, BorrowedFd<'static>)> {
    HELD.with(|h| {
        h.borrow().as_ref().map(|[o, e]| {
            // SAFETY: held open in HELD until finish, called once the launch is over.
            unsafe { (BorrowedFd::borrow_raw(o.client.as_raw_fd()), BorrowedFd::borrow_raw(e.client.as_raw_fd())) }
        })
    })
}

/// Write what this process has said since the last flush to the client, waiting at most
/// [`FLUSH_WAIT`]. Returns the bytes said and the bytes dropped (0, 0 in the one-shot form).
pub fn flush() -> (u64, u64) {
    use std::io::Write;
    let _ = io::stdout().flush();
    let _ = io::stderr().flush();
    let deadline = Instant::now() + FLUSH_WAIT;
    HELD.with(|h| {
        let mut held = h.borrow_mut();
        let Some(streams) = held.as_mut() else { return (0, 0) };
        let (mut said, mut dropped) = (0, 0);
        for s in streams.iter_mut() {
            let text = unflushed(s);
            if text.is_empty() {
                continue;
            }
            let written = chio_cage::supervise::write_within(s.client.as_fd(), &text, deadline) as u64;
            said += text.len() as u64;
            dropped += text.len() as u64 - written;
            s.flushed += text.len() as u64;
        }
        (said, dropped)
    })
}

/// What stream `s`'s memfd holds past what was flushed (nothing if it cannot be read).
fn unflushed(s: &Stream) -> Vec<u8> {
    let end = s.memfd.metadata().map_or(0, |m| m.len());
    let mut text = vec![0u8; end.saturating_sub(s.flushed) as usize];
    if s.memfd.read_exact_at(&mut text, s.flushed).is_err() {
        text.clear();
    }
    text
}

/// Give this process the client's descriptors themselves as stdout and stderr: for `chio
/// repository serve`, whose answers are the client's stream (an admin's only).
pub fn direct() -> io::Result<()> {
    flush();
    HELD.with(|h| match h.borrow_mut().take() {
        Some([o, e]) => {
            nix::unistd::dup2_stdout(&o.client)?;
            nix::unistd::dup2_stderr(&e.client)?;
            Ok(())
        }
        None => Ok(()),
    })
}

/// The last [`flush`], after which the client's descriptors are closed: its readers see EOF by
/// the time it has its answer. Returns the bytes said and dropped.
pub fn finish() -> (u64, u64) {
    let said = flush();
    HELD.with(|h| drop(h.borrow_mut().take()));
    said
}
