//! The client's stdout, stderr and stdin as the daemon is given them. The daemon refuses one
//! whose writes or reads may never complete — a file on FUSE or NFS, a block device (see
//! [`chio_cage::relay::stalls`]): such a request would hold its launch process in the kernel past
//! SIGKILL. The client relays one itself instead, through a process of its own and a pipe the
//! daemon gets, so the launch keeps its deadline, and only this client waits on its own files.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use chio_cage::relay::{self, Relay};

/// An output relayed by this client: its name, our copy of the pipe's read end (to see what is
/// still in it), and the relay.
struct Output {
    name: &'static str,
    pipe: OwnedFd,
    relay: Relay,
}

/// The descriptors to send, and the relays behind any that stand in for ours.
pub struct Passed {
    fds: Vec<RawFd>,
    /// Pipe ends the daemon gets in place of ours: closed here once sent.
    ends: Vec<OwnedFd>,
    outputs: Vec<Output>,
    input: Option<Relay>,
}

impl Passed {
    /// This process's stdout, stderr, then `cwd`, then (`stdin`) its stdin.
    pub fn ours(cwd: BorrowedFd<'_>, stdin: bool) -> Result<Passed> {
        let mut p = Passed { fds: Vec::new(), ends: Vec::new(), outputs: Vec::new(), input: None };
        p.output("stdout", io::stdout().as_fd())?;
        p.output("stderr", io::stderr().as_fd())?;
        p.fds.push(cwd.as_raw_fd());
        if stdin {
            p.stdin(io::stdin().as_fd())?;
        }
        Ok(p)
    }

    fn output(&mut self, name: &'static str, fd: BorrowedFd<'_>) -> Result<()> {
        if !relay::may_stall(fd) {
            self.fds.push(fd.as_raw_fd());
            return Ok(());
        }
        let (r, w) = pipe()?;
        let relay = Relay::start(r.as_fd(), fd).with_context(|| format!("starting a relay for {name}"))?;
        self.fds.push(w.as_raw_fd());
        self.ends.push(w);
        self.outputs.push(Output { name, pipe: r, relay });
        Ok(())
    }

    fn stdin(&mut self, fd: BorrowedFd<'_>) -> Result<()> {
        if !relay::may_stall(fd) {
            self.fds.push(fd.as_raw_fd());
            return Ok(());
        }
        let (r, w) = pipe()?;
        self.input = Some(Relay::start(fd, w.as_fd()).context("starting a relay for stdin")?);
        self.fds.push(r.as_raw_fd());
        self.ends.push(r);
        Ok(())
    }

    /// The descriptors to send.
    pub fn fds(&self) -> &[RawFd] {
        &self.fds
    }

    /// After the answer: the output relays get what the one-shot form's get, the drain time
    /// (the daemon's launch process lets go of its ends right after answering), and any still
    /// stuck then is stopped; the input relay is stopped. Returns what could not be written,
    /// by stream, for the caller to say.
    pub fn finish(mut self) -> Vec<(&'static str, u64)> {
        self.ends.clear();
        if let Some(r) = &self.input {
            r.stop();
        }
        let deadline = Instant::now() + Duration::from_millis(chio_cage::supervise::DRAIN_MS);
        let mut left = Vec::new();
        for o in &self.outputs {
            if !o.relay.finish(deadline) {
                let queued = queued(o.pipe.as_fd());
                o.relay.stop();
                left.push((o.name, queued + o.relay.in_hand()));
            }
        }
        left
    }
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")
}

/// Bytes waiting in the pipe `fd` is an end of.
fn queued(fd: BorrowedFd<'_>) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD into a local int on a pipe of ours (raw: nix has no wrapper for it).
    let ok = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) } == 0;
    if ok {
        u64::try_from(n).unwrap_or(0)
    } else {
        0
    }
}
