//! After the verified exec: pass the target's output through with caps, feed its stdin when
//! asked, enforce the wall-clock deadline, forward the supervisor's termination signals to the
//! cage, and collect how it ended.
//!
//! Nothing here may block: a target can stop the terminal chio writes to (`tcflow(TCOOFF)`),
//! and any reader of chio's output can be slow. Every host-side write goes through a
//! non-blocking file description of our own (see `Sink`) and is only attempted when poll says
//! it can take data; while a sink is stuck, its pipe is not read and the target blocks on it —
//! the deadline still fires, because the loop waits in poll and nowhere else. A destination or
//! source poll cannot gate (a file on FUSE or NFS, a device) is written or read by a relay
//! process of its own (see `relay`), and the loop touches only its pipe to the relay.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::socket::MsgFlags;
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use crate::inside::RESULT_BYTES;
use crate::record::Outcome;
use crate::relay::{self, Relay};
use crate::sys;

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);
const FORWARD: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];
/// After the init is reaped, how long to wait for the output to drain (a relay to finish too).
pub const DRAIN_MS: u64 = 1000;
/// The most bytes read from a pipe at a time.
const CHUNK: usize = 64 << 10;
/// The first read of a stream (see [`Pump::fill`]).
const FIRST_READ: usize = 4 << 10;

/// Called at the exec stop once every fact holds, before the target runs one instruction. An
/// error stops the launch (the target is killed without running): evidence that cannot be
/// recorded means no launch.
pub type OnEnforced<'a> = &'a mut dyn FnMut(&crate::record::LaunchRecord) -> Result<(), String>;

/// Asked once, after the target is seized and before it is told to go on towards its exec:
/// whether the launch may still go ahead. A caller that must hear from someone else first (the
/// daemon's launch process waits for its request's journal entry) builds the cage meanwhile;
/// false withdraws the launch before one instruction of the command runs.
pub type Gate<'a> = &'a dyn Fn() -> bool;

/// The cage as it waits at its target's hello, before anything is traced: what a detached
/// launch's `create` hands over.
#[derive(Debug, Clone)]
pub struct Parked {
    /// The cage's init (PID 1 of its pid namespace), as the host sees it.
    pub init: libc::pid_t,
    /// The target, not yet seized.
    pub target: libc::pid_t,
    /// The launch cgroup's directories, which outlive the launch when it is detached.
    pub cgroup: Vec<std::path::PathBuf>,
}

/// Called once at the target's hello, before the target is seized: an OCI runtime's `create`
/// forks here — the parent reports the parked cage and exits, the child returns and goes on
/// with the launch when `start` comes. An error withdraws the launch.
pub type Park<'a> = &'a mut dyn FnMut(&Parked) -> Result<(), String>;

/// Where the target's output goes, where its input comes from, and who hears that the launch
/// is enforced.
pub struct Sinks<'a> {
    /// Receives the target's stdout (a terminal, pipe, socket or file).
    pub stdout: BorrowedFd<'a>,
    /// Receives the target's stderr.
    pub stderr: BorrowedFd<'a>,
    /// Fed to the target's stdin through a pipe; `None` gives it the cage's `/dev/null`. The
    /// target never gets a host file description itself — but in a detached launch (an OCI
    /// container), whose stdout, stderr and this (`None`: the supervisor's own stdin) are the
    /// target's own, as the engine gave them.
    pub stdin: Option<BorrowedFd<'a>>,
    /// Optional hook at the exec stop (see [`OnEnforced`]).
    pub on_enforced: Option<OnEnforced<'a>>,
    /// Optional gate before the target goes on (see [`Gate`]).
    pub gate: Option<Gate<'a>>,
    /// Optional hook at the target's hello (see [`Park`]).
    pub park: Option<Park<'a>>,
    /// Set by the launch when the target's stderr, as passed through, does not end with a
    /// newline (what the caller writes next would otherwise continue the target's line).
    pub stderr_mid_line: bool,
    /// What a long-lived supervisor made before the request (see [`crate::ahead`]); empty for
    /// the one-shot form, which makes everything itself.
    pub ahead: crate::Ahead,
}

impl<'a> Sinks<'a> {
    /// Output to `stdout` and `stderr`, stdin from `/dev/null`, no hook.
    pub fn new(stdout: BorrowedFd<'a>, stderr: BorrowedFd<'a>) -> Self {
        Sinks {
            stdout,
            stderr,
            stdin: None,
            on_enforced: None,
            gate: None,
            park: None,
            stderr_mid_line: false,
            ahead: Default::default(),
        }
    }
}

/// Inputs of the supervision loop.
pub struct Run<'a, 'b> {
    /// The cage's init (host pid).
    pub init: libc::pid_t,
    /// pidfd of the init.
    pub pidfd: BorrowedFd<'a>,
    /// Read end of the stdout pipe.
    pub stdout: OwnedFd,
    /// Read end of the stderr pipe.
    pub stderr: OwnedFd,
    /// Write end of the stdin pipe, when stdin is fed.
    pub stdin: Option<OwnedFd>,
    /// Read end of the result pipe.
    pub result: OwnedFd,
    /// Wall-clock deadline.
    pub deadline: Instant,
    /// Bytes kept per stream.
    pub output_limit: u64,
    /// When the target exec'd.
    pub started: Instant,
    /// Output destinations.
    pub sinks: &'a mut Sinks<'b>,
    /// Called once the init has reported how the target ended (the cage is then winding down:
    /// a moment to read the cgroup's usage while the init exits on another CPU).
    pub on_result: &'a mut dyn FnMut(),
}

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

fn set_handlers(handler: libc::sighandler_t) {
    for sig in FORWARD {
        // SAFETY: installing a handler that only stores to an atomic (async-signal-safe); raw
        // like nix's own sigaction, which is unsafe for the same reason.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A host-side destination written without ever blocking.
enum Sink<'a> {
    /// Our own non-blocking file description of the same terminal, pipe or FIFO, opened
    /// through `/proc/self/fd` — O_NONBLOCK on the shared description would change it for
    /// every other process holding it.
    Reopened(OwnedFd),
    /// A socket: `send(MSG_DONTWAIT)` is non-blocking per call.
    Socket(BorrowedFd<'a>),
    /// A regular file, block device or a character device that is not a terminal (`/dev/null`):
    /// writes complete without waiting for a reader.
    File(BorrowedFd<'a>),
    /// Our own pipe (stdin's), already non-blocking.
    Own(OwnedFd),
    /// Our own non-blocking pipe to a relay that writes to a destination poll cannot gate.
    Relayed(OwnedFd, Relay),
    /// A terminal or pipe we could not reopen: written only after POLLOUT and at most
    /// `PIPE_BUF` bytes at a time, which a pipe with room takes without waiting.
    Gated(BorrowedFd<'a>),
}

impl<'a> Sink<'a> {
    fn open(fd: BorrowedFd<'a>) -> io::Result<Sink<'a>> {
        if relay::may_stall(fd) {
            let (from, to) = relayed_pipe(Ours::WriteEnd)?;
            let relay = Relay::start(from.as_fd(), fd)?;
            return Ok(Sink::Relayed(to, relay));
        }
        let st = crate::sys::fstat(fd)?;
        let tty = nix::unistd::isatty(fd).unwrap_or(false);
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG | libc::S_IFBLK => Ok(Sink::File(fd)),
            // /dev/null and its kind never make a writer wait; terminals can.
            libc::S_IFCHR if !tty => Ok(Sink::File(fd)),
            libc::S_IFSOCK => Ok(Sink::Socket(fd)),
            _ => {
                let path =
                    std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(io::Error::other)?;
                let flags = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
                let cwd = nix::fcntl::AT_FDCWD;
                Ok(crate::sys::openat(cwd, &path, flags, 0).map_or(Sink::Gated(fd), Sink::Reopened))
            }
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Sink::Reopened(f) | Sink::Own(f) | Sink::Relayed(f, _) => f.as_fd(),
            Sink::Socket(fd) | Sink::File(fd) | Sink::Gated(fd) => *fd,
        }
    }

    fn raw(&self) -> RawFd {
        self.fd().as_raw_fd()
    }

    /// Write what can be written now; Ok(0) when the destination is full.
    fn write_some(&self, data: &[u8]) -> io::Result<usize> {
        let written = match self {
            Sink::Socket(fd) => {
                let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
                nix::sys::socket::send(fd.as_raw_fd(), data, flags)
            }
            Sink::Gated(fd) => nix::unistd::write(fd, &data[..data.len().min(libc::PIPE_BUF)]),
            _ => nix::unistd::write(self.fd(), data),
        };
        match written {
            Ok(n) => Ok(n),
            Err(Errno::EAGAIN | Errno::EINTR) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }
}

/// Which end of a relay's pipe the loop keeps.
enum Ours {
    ReadEnd,
    WriteEnd,
}

/// A pipe for a relay, (read end, write end), both close-on-exec: the loop's end non-blocking,
/// the relay's blocking.
fn relayed_pipe(ours: Ours) -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let own = match ours {
        Ours::ReadEnd => &r,
        Ours::WriteEnd => &w,
    };
    nix::fcntl::fcntl(own, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
    Ok((r, w))
}

/// One stream from a source fd to a sink: read only when the last read has been written.
struct Pump<'a> {
    src: Option<BorrowedFd<'a>>,
    sink: Option<Sink<'a>>,
    buf: Vec<u8>,
    /// How much the next read asks for (see [`Pump::fill`]).
    want: usize,
    at: usize,
    limit: u64,
    kept: u64,
    dropped: u64,
    last_byte: Option<u8>,
}

impl<'a> Pump<'a> {
    fn new(src: BorrowedFd<'a>, sink: io::Result<Sink<'a>>, limit: u64) -> Pump<'a> {
        let (sink, dropped_all) = match sink {
            Ok(s) => (Some(s), false),
            Err(_) => (None, true),
        };
        Pump {
            src: Some(src),
            sink,
            buf: Vec::new(),
            want: FIRST_READ,
            at: 0,
            limit: if dropped_all { 0 } else { limit },
            kept: 0,
            dropped: 0,
            last_byte: None,
        }
    }

    fn pending(&self) -> bool {
        self.at < self.buf.len()
    }

    /// Poll entries: the source when nothing is pending, the sink when something is.
    fn poll_src(&self) -> libc::pollfd {
        let fd = if self.pending() { -1 } else { self.src.map_or(-1, |s| s.as_raw_fd()) };
        libc::pollfd { fd, events: libc::POLLIN, revents: 0 }
    }

    fn poll_sink(&self) -> libc::pollfd {
        let fd = if self.pending() { self.sink.as_ref().map_or(-1, Sink::raw) } else { -1 };
        libc::pollfd { fd, events: libc::POLLOUT, revents: 0 }
    }

    /// Read once from the source; the part within the limit becomes pending.
    fn fill(&mut self) {
        let Some(src) = self.src else { return };
        // Reads start at a page and double while they come back full, up to CHUNK: most
        // commands write a little, and zeroing 64 KiB for each stream faulted in sixteen pages.
        self.buf.resize(self.want, 0);
        let n = match nix::unistd::read(src, &mut self.buf[..self.want]) {
            Err(Errno::EINTR | Errno::EAGAIN) => {
                self.buf.clear();
                return;
            }
            // An error ends the stream as EOF does.
            r => r.unwrap_or(0) as u64,
        };
        if n == 0 {
            self.src = None;
        } else if n as usize == self.want {
            self.want = (self.want * 2).min(CHUNK);
        }
        // With no sink left (its reader went away) everything read is dropped.
        let room = if self.sink.is_some() { self.limit.saturating_sub(self.kept) } else { 0 };
        let keep = n.min(room);
        self.kept += keep;
        self.dropped += n - keep;
        self.buf.truncate(keep as usize);
        self.at = 0;
    }

    /// Write what the sink takes now.
    fn drain(&mut self) {
        let Some(sink) = &self.sink else { return };
        match sink.write_some(&self.buf[self.at..]) {
            Ok(n) => {
                self.at += n;
                if n > 0 {
                    self.last_byte = Some(self.buf[self.at - 1]);
                }
            }
            Err(_) => {
                // The reader is gone: count the rest as dropped and stop writing.
                self.give_up();
                self.sink = None;
            }
        }
    }

    /// Count whatever was not written as dropped.
    fn give_up(&mut self) {
        let left = (self.buf.len() - self.at) as u64;
        self.kept -= left;
        self.dropped += left;
        self.at = self.buf.len();
    }

    fn done(&self) -> bool {
        self.src.is_none() && !self.pending()
    }

    /// The stream is over: a relay gets EOF and until `deadline` to write what it holds; one
    /// still writing then is stopped, and what it did not write counts as dropped.
    fn settle(&mut self, deadline: Instant) {
        let Some(Sink::Relayed(pipe, relay)) = self.sink.take() else { return };
        drop(pipe);
        if !relay.finish(deadline) {
            relay.stop();
            let written = relay.copied().min(self.kept);
            self.dropped += self.kept - written;
            self.kept = written;
        }
    }
}

/// Write `data` to `fd` as the loop writes a command's output — a terminal or pipe through a
/// non-blocking description of our own, a socket per call without waiting — until it is all
/// written or `deadline` passes, waiting in poll and nowhere else. Returns the bytes that
/// reached `fd`: none when it is a destination poll cannot gate ([`relay::stalls`]), which
/// the caller must not have taken.
pub fn write_within(fd: BorrowedFd<'_>, data: &[u8], deadline: Instant) -> usize {
    if relay::may_stall(fd) {
        return 0;
    }
    let Ok(sink) = Sink::open(fd) else { return 0 };
    let mut at = 0;
    while at < data.len() {
        match sink.write_some(&data[at..]) {
            Ok(0) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !writable_within(sink.fd(), left) {
                    break;
                }
            }
            Ok(n) => at += n,
            Err(_) => break,
        }
    }
    at
}

/// Whether `fd` can take data within `left` (poll's POLLOUT; an error or hang-up counts as no).
fn writable_within(fd: BorrowedFd<'_>, left: Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
    match poll(&mut fds, ms) {
        Ok(_) => fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLOUT)),
        Err(e) => e == Errno::EINTR,
    }
}

/// How a supervised launch ended.
pub struct Ended {
    /// The command's end, output and ceilings.
    pub outcome: Outcome,
    /// Whether the init was reaped here. It reports the command's end only once every other
    /// process of the cage is gone, so with its report and the output drained the command is
    /// over; its own exit (which tears the namespaces down) is then the caller's to reap.
    pub init_reaped: bool,
}

/// Run the loop until the init has reported (or is reaped) and the output is drained.
pub fn run(r: Run<'_, '_>) -> Ended {
    PENDING_SIGNAL.store(0, Ordering::SeqCst);
    set_handlers(on_signal as *const () as libc::sighandler_t);
    let mut out = Pump::new(r.stdout.as_fd(), Sink::open(r.sinks.stdout), r.output_limit);
    let mut err = Pump::new(r.stderr.as_fd(), Sink::open(r.sinks.stderr), r.output_limit);
    // A host stdin poll cannot gate is read by a relay into a pipe of ours; if none can be
    // started the target's stdin is closed (it reads EOF) rather than read here.
    let feeder = match r.sinks.stdin {
        Some(host) if r.stdin.is_some() => stdin_relay(host),
        _ => Ok(None),
    };
    let mut input = match (r.sinks.stdin, r.stdin, &feeder) {
        (Some(host), Some(pipe), Ok(relayed)) => {
            let src = relayed.as_ref().map_or(host, |(from, _)| from.as_fd());
            Pump::new(src, Ok(Sink::Own(pipe)), u64::MAX)
        }
        _ => Pump {
            src: None,
            sink: None,
            buf: Vec::new(),
            want: FIRST_READ,
            at: 0,
            limit: 0,
            kept: 0,
            dropped: 0,
            last_byte: None,
        },
    };
    let mut outcome = Outcome::default();
    let mut killed = false;
    let mut reaped: Option<Instant> = None;
    let mut result_read = false;
    loop {
        let ended = reaped.is_some() || result_read;
        if reaped.is_some_and(|t| t.elapsed() > Duration::from_millis(DRAIN_MS)) || (ended && out.done() && err.done())
        {
            break;
        }
        if input.done() {
            // EOF on the host's stdin: the target sees EOF too.
            input.sink = None;
        }
        let mut fds = [
            out.poll_src(),
            err.poll_src(),
            out.poll_sink(),
            err.poll_sink(),
            input.poll_src(),
            input.poll_sink(),
            libc::pollfd {
                fd: if reaped.is_some() { -1 } else { r.pidfd.as_raw_fd() },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd { fd: if result_read { -1 } else { r.result.as_raw_fd() }, events: libc::POLLIN, revents: 0 },
        ];
        let timeout = if killed || reaped.is_some() {
            DRAIN_MS as i32
        } else {
            r.deadline.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32
        };
        // SAFETY: valid pollfds; negative fds are ignored by poll (raw: nix's PollFd cannot
        // hold such an idle slot).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        // Forwarded to our child, the cage's init, which forwards it to the target — through
        // its pidfd: once the init is reaped (the loop goes on draining) its pid may be another
        // process's.
        if let Ok(sig) = Signal::try_from(PENDING_SIGNAL.swap(0, Ordering::SeqCst)) {
            let _ = sys::pidfd_send_signal(r.pidfd, sig as libc::c_int);
        }
        // The deadline is a time, not "poll timed out": a sink that is always ready must not
        // postpone it.
        if !killed && reaped.is_none() && Instant::now() >= r.deadline {
            // Our child: the kernel then kills its whole pid namespace.
            let _ = sys::pidfd_send_signal(r.pidfd, libc::SIGKILL);
            killed = true;
            outcome.limit_hit.push("wall_time".into());
        }
        if n <= 0 {
            continue;
        }
        for (pump, src, sink) in [(&mut out, 0, 2), (&mut err, 1, 3), (&mut input, 4, 5)] {
            if fds[src].revents != 0 {
                pump.fill();
            }
            if fds[sink].revents != 0 || (fds[src].revents != 0 && pump.pending()) {
                pump.drain();
            }
        }
        if fds[7].revents != 0 && !result_read {
            read_result(&r.result, &mut outcome);
            result_read = true;
            outcome.wall_ms = r.started.elapsed().as_millis() as u64;
            (r.on_result)();
        }
        if fds[6].revents != 0 && reaped.is_none() {
            let _ = waitpid(Pid::from_raw(r.init), None);
            reaped = Some(Instant::now());
            if !result_read {
                outcome.wall_ms = r.started.elapsed().as_millis() as u64;
            }
        }
    }
    set_handlers(libc::SIG_DFL);
    if !result_read {
        read_result(&r.result, &mut outcome);
    }
    // Whatever a stuck sink did not take is dropped, not delivered.
    out.give_up();
    err.give_up();
    let settled = Instant::now() + Duration::from_millis(DRAIN_MS);
    out.settle(settled);
    err.settle(settled);
    if let Ok(Some((_, relay))) = &feeder {
        relay.stop();
    }
    r.sinks.stderr_mid_line = err.last_byte.is_some_and(|b| b != b'\n');
    outcome.stdout_bytes = out.kept;
    outcome.stdout_dropped = out.dropped;
    outcome.stderr_bytes = err.kept;
    outcome.stderr_dropped = err.dropped;
    if out.dropped + err.dropped > 0 {
        outcome.limit_hit.push("output".into());
    }
    Ended { outcome, init_reaped: reaped.is_some() }
}

/// For a host stdin poll cannot gate: our non-blocking end of a pipe and the relay filling it
/// (`None`: poll gates it, read it directly; an error: it needs a relay and none started).
fn stdin_relay(host: BorrowedFd<'_>) -> io::Result<Option<(OwnedFd, Relay)>> {
    if !relay::may_stall(host) {
        return Ok(None);
    }
    let (from, to) = relayed_pipe(Ours::ReadEnd)?;
    let relay = Relay::start(host, to.as_fd())?;
    Ok(Some((from, relay)))
}

/// The init's report of how the target ended; without one the cage was killed.
fn read_result(fd: &OwnedFd, o: &mut Outcome) {
    let mut buf = [0u8; RESULT_BYTES];
    // Read when the pipe is readable or its only writer (the init) is reaped: the report is one
    // write under PIPE_BUF, so this gets all of it or EOF without waiting.
    if nix::unistd::read(fd, &mut buf).ok() != Some(RESULT_BYTES) {
        o.signal = Some(libc::SIGKILL);
        return;
    }
    let v = |i: usize| i64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    if v(0) == 0 {
        o.exit_code = Some(v(1) as i32);
    } else {
        o.signal = Some(v(1) as i32);
    }
    o.cpu_ms = (v(2) / 1000) as u64;
    o.peak_memory_bytes = (v(3) * 1024) as u64;
    o.killed_at_end = v(4).max(0) as u64;
}
