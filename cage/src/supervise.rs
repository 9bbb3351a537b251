//! After the verified exec: pass the target's output through with caps, enforce the wall-clock
//! deadline, forward the supervisor's termination signals to the cage, and collect how it ended.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use crate::record::Outcome;

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);
const FORWARD: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];
/// After the init is reaped, how long to wait for the output pipes to drain.
const DRAIN_MS: u64 = 1000;

/// Called at the exec stop once every fact holds, before the target runs one instruction. An
/// error stops the launch (the target is killed without running): evidence that cannot be
/// recorded means no launch.
pub type OnEnforced<'a> = &'a mut dyn FnMut(&crate::record::LaunchRecord) -> Result<(), String>;

/// Where the target's output goes, and who hears that the launch is enforced.
pub struct Sinks<'a> {
    /// Receives the target's stdout.
    pub stdout: &'a mut dyn Write,
    /// Receives the target's stderr.
    pub stderr: &'a mut dyn Write,
    /// Optional hook at the exec stop (see [`OnEnforced`]).
    pub on_enforced: Option<OnEnforced<'a>>,
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
        // SAFETY: installing a handler that only stores to an atomic (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A stream being passed through.
struct Stream {
    fd: Option<OwnedFd>,
    kept: u64,
    dropped: u64,
}

impl Stream {
    /// Read once; false on EOF.
    fn pump(&mut self, limit: u64, sink: &mut dyn Write, buf: &mut [u8]) -> bool {
        let Some(fd) = &self.fd else { return false };
        // SAFETY: read into a buffer of the given length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
        }
        if n == 0 {
            self.fd = None;
            let _ = sink.flush();
            return false;
        }
        let n = n as u64;
        let keep = n.min(limit.saturating_sub(self.kept));
        if keep > 0 && sink.write_all(&buf[..keep as usize]).is_err() {
            self.dropped += keep;
        } else {
            self.kept += keep;
        }
        self.dropped += n - keep;
        true
    }
}

/// Run the loop until the init is reaped and output drained.
pub fn run(r: Run<'_, '_>) -> Outcome {
    PENDING_SIGNAL.store(0, Ordering::SeqCst);
    set_handlers(on_signal as *const () as libc::sighandler_t);
    let mut out = Stream { fd: Some(r.stdout), kept: 0, dropped: 0 };
    let mut err = Stream { fd: Some(r.stderr), kept: 0, dropped: 0 };
    let mut buf = vec![0u8; 64 << 10];
    let mut outcome = Outcome::default();
    let mut killed = false;
    let mut reaped: Option<Instant> = None;
    let mut result_read = false;
    loop {
        if reaped.is_some_and(|t| t.elapsed() > Duration::from_millis(DRAIN_MS))
            || (reaped.is_some() && out.fd.is_none() && err.fd.is_none())
        {
            break;
        }
        let raw = |s: &Stream| s.fd.as_ref().map_or(-1, |f| f.as_raw_fd());
        let mut fds = [
            libc::pollfd { fd: raw(&out), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: raw(&err), events: libc::POLLIN, revents: 0 },
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
        // SAFETY: four valid pollfds (negative fds are ignored by poll).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 4, timeout) };
        let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            // SAFETY: forwarding to our child, the cage's init, which forwards to the target.
            unsafe { libc::kill(r.init, sig) };
        }
        if n < 0 {
            continue;
        }
        if n == 0 && !killed && reaped.is_none() {
            // SAFETY: killing our child; the kernel then kills its whole pid namespace.
            unsafe { libc::kill(r.init, libc::SIGKILL) };
            killed = true;
            outcome.limit_hit.push("wall_time".into());
            continue;
        }
        if fds[0].revents != 0 {
            out.pump(r.output_limit, r.sinks.stdout, &mut buf);
        }
        if fds[1].revents != 0 {
            err.pump(r.output_limit, r.sinks.stderr, &mut buf);
        }
        if fds[3].revents != 0 && !result_read {
            read_result(&r.result, &mut outcome);
            result_read = true;
            (r.on_result)();
        }
        if fds[2].revents != 0 && reaped.is_none() {
            let mut status = 0;
            // SAFETY: reaping our child.
            unsafe { libc::waitpid(r.init, &mut status, 0) };
            reaped = Some(Instant::now());
            outcome.wall_ms = r.started.elapsed().as_millis() as u64;
        }
    }
    set_handlers(libc::SIG_DFL);
    if !result_read {
        read_result(&r.result, &mut outcome);
    }
    outcome.stdout_bytes = out.kept;
    outcome.stdout_dropped = out.dropped;
    outcome.stderr_bytes = err.kept;
    outcome.stderr_dropped = err.dropped;
    if out.dropped + err.dropped > 0 {
        outcome.limit_hit.push("output".into());
    }
    outcome
}

/// The init's report of how the target ended; without one the cage was killed.
fn read_result(fd: &OwnedFd, o: &mut Outcome) {
    let mut buf = [0u8; 32];
    // SAFETY: nonblocking-enough read: every writer is dead, so this returns data or EOF.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n != 32 {
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
}
