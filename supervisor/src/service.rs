//! `chio security supervise`: run a command as a systemd service expects — credentials from
//! `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=`) into named variables, so no secret
//! sits in a unit file; then either `exec` the command, or run it with readiness, sd_notify,
//! signal forwarding and a stop grace.
//!
//! This process stays single-threaded: signals arrive on a signalfd (blocked for us, unblocked
//! in the child before it execs), polled with the readiness clock.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

/// Why supervise refused or failed (each with an exit status).
#[derive(Debug)]
pub enum ServiceError {
    /// Bad input: a credential, a flag (exit 2).
    Refused(String),
    /// The service did not become ready, or could not be started (exit 1).
    Failed(String),
}

impl ServiceError {
    /// The exit status.
    pub fn exit_code(&self) -> i32 {
        match self {
            ServiceError::Refused(_) => 2,
            ServiceError::Failed(_) => 1,
        }
    }
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceError::Refused(m) => write!(f, "refused: {m}"),
            ServiceError::Failed(m) => f.write_str(m),
        }
    }
}

fn refused(m: impl Into<String>) -> ServiceError {
    ServiceError::Refused(m.into())
}

fn failed(m: impl Into<String>) -> ServiceError {
    ServiceError::Failed(m.into())
}

/// The largest credential file.
const MAX_CREDENTIAL_BYTES: u64 = 64 << 10;

/// Read the credentials: `(VAR, file name)` pairs from `dir`. Each file is opened without
/// following a link and must be a regular file of root's or this process's user, which nobody
/// but its owner and this process's user can read or write — by its mode or, where it has one,
/// its ACL (systemd grants a service's user a credential by an ACL entry); one trailing
/// newline is stripped, and any other padding or control character refuses it. A variable
/// already set in this environment refuses too (a credential never overrides silently).
pub fn read_credentials(dir: &Path, wanted: &[(String, String)]) -> Result<Vec<(String, String)>, ServiceError> {
    let mut out = Vec::new();
    for (at, (var, name)) in wanted.iter().enumerate() {
        if wanted[..at].iter().any(|(v, _)| v == var) {
            return Err(refused(format!("{var} is given two credentials; each variable takes one")));
        }
        if std::env::var_os(var).is_some() {
            return Err(refused(format!("{var} is already set in the environment; a credential never overrides it")));
        }
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(refused(format!("credential name {name:?} is not a file name")));
        }
        let path = dir.join(name);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| refused(format!("credential {}: {e} (a link is never followed)", path.display())))?;
        let meta = f.metadata().map_err(|e| refused(format!("credential {}: {e}", path.display())))?;
        if !meta.is_file() {
            return Err(refused(format!("credential {} is not a regular file", path.display())));
        }
        // Whoever owns or can write it chooses the identity the command takes; whoever can read
        // it holds that identity too.
        let euid = nix::unistd::geteuid().as_raw();
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(refused(format!(
                "credential {} belongs to uid {}, neither root nor this process's user ({euid}): chown it",
                path.display(),
                meta.uid()
            )));
        }
        let shared = crate::file_access::shared_beyond(&f, &meta, euid)
            .map_err(|e| refused(format!("credential {}: reading its ACL: {e}", path.display())))?;
        if let Some(who) = shared {
            return Err(refused(format!(
                "credential {} is readable or writable by {who}: only its owner and this process's user may \
                 reach it (chmod 0600, setfacl -b)",
                path.display()
            )));
        }
        let mut bytes = Vec::new();
        f.take(MAX_CREDENTIAL_BYTES + 1).read_to_end(&mut bytes).map_err(|e| refused(e.to_string()))?;
        if bytes.len() as u64 > MAX_CREDENTIAL_BYTES {
            return Err(refused(format!("credential {} is over {MAX_CREDENTIAL_BYTES} bytes", path.display())));
        }
        out.push((var.clone(), credential_value(&path, bytes)?));
    }
    Ok(out)
}

fn credential_value(path: &Path, mut bytes: Vec<u8>) -> Result<String, ServiceError> {
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    let text = String::from_utf8(bytes).map_err(|_| refused(format!("credential {} is not UTF-8", path.display())))?;
    if text.is_empty() {
        return Err(refused(format!("credential {} is empty", path.display())));
    }
    if text.trim() != text {
        return Err(refused(format!("credential {} is padded with whitespace", path.display())));
    }
    if text.chars().any(char::is_control) {
        return Err(refused(format!("credential {} holds a control character", path.display())));
    }
    Ok(text)
}

/// Replace this process with `argv`, the credentials in its environment. Returns only on error.
pub fn exec(argv: &[OsString], credentials: &[(String, String)]) -> ServiceError {
    let Some((program, args)) = argv.split_first() else { return refused("no command") };
    let e = Command::new(program).args(args).envs(credentials.iter().map(|(k, v)| (k, v))).exec();
    failed(format!("exec {}: {e}", program.to_string_lossy()))
}

/// How readiness is known.
#[derive(Debug, Clone)]
pub enum Readiness {
    /// Ready once started.
    Started,
    /// Ready once this Unix socket accepts a connection.
    UnixSocket(PathBuf),
    /// Ready once a GET of this URL answers 2xx (with this bearer token, if any).
    Http {
        /// The URL.
        url: String,
        /// `Authorization: Bearer` value.
        bearer: Option<String>,
    },
}

impl Readiness {
    fn ready(&self) -> bool {
        match self {
            Readiness::Started => true,
            Readiness::UnixSocket(p) => accepts_now(p),
            Readiness::Http { url, bearer } => {
                // The answer must be this URL's own: no proxy from the environment (a unit's
                // HTTP_PROXY would get the request, bearer token and all, and answer for a
                // "localhost" of its own), and no redirect to somewhere else.
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .timeout_global(Some(Duration::from_millis(1000)))
                    .http_status_as_error(false)
                    .proxy(None)
                    .max_redirects(0)
                    .build()
                    .into();
                let mut req = agent.get(url);
                if let Some(b) = bearer {
                    req = req.header("Authorization", &format!("Bearer {b}"));
                }
                req.call().is_ok_and(|r| r.status().is_success())
            }
        }
    }
}

/// Whether a Unix stream socket at `p` takes a connection now. The connect must not wait: one
/// to a listener whose backlog is full blocks until it is accepted, which would hold the
/// readiness clock, the deadline and signal forwarding for as long as the command likes.
fn accepts_now(p: &Path) -> bool {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let Ok(addr) = UnixAddr::new(p) else { return false };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let Ok(fd) = socket(AddressFamily::Unix, SockType::Stream, flags, None) else { return false };
    // A Unix stream connect completes or fails at once; EAGAIN is a full backlog.
    connect(fd.as_raw_fd(), &addr).is_ok()
}

/// What `run` needs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The command.
    pub argv: Vec<OsString>,
    /// Variables to add.
    pub credentials: Vec<(String, String)>,
    /// How readiness is known.
    pub readiness: Readiness,
    /// How long readiness may take.
    pub ready_timeout: Duration,
    /// How long a stopping child may take before SIGKILL.
    pub stop_grace: Duration,
}

/// How the child ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited with this status, after being ready.
    Exited(ExitStatus),
    /// It was not ready in time, or exited first (the reason).
    NotReady(String, ExitStatus),
}

const POLL: Duration = Duration::from_millis(250);
const FORWARDED: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// Spawn the command and see it through: readiness polled every 250 ms racing its exit, the
/// forwarded signals and the deadline; `READY=1`, `STOPPING=1` and `STATUS=` to systemd.
pub fn run(o: &RunOptions) -> Result<Ended, ServiceError> {
    let Some((program, args)) = o.argv.split_first() else { return Err(refused("no command")) };
    // The command's end is heard by SIGCHLD, and its status read by waiting: neither works
    // under an ignored SIGCHLD inherited from whoever started this.
    chio_cage::sys::hear_of_children().map_err(|e| failed(format!("restoring SIGCHLD: {e}")))?;
    let mut mask = SigSet::empty();
    for s in FORWARDED.into_iter().chain([Signal::SIGCHLD]) {
        mask.add(s);
    }
    mask.thread_block().map_err(|e| failed(format!("blocking signals: {e}")))?;
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| failed(format!("signalfd: {e}")))?;
    let mut cmd = Command::new(program);
    cmd.args(args).envs(o.credentials.iter().map(|(k, v)| (k, v)));
    // Readiness is ours to tell systemd: a command that speaks sd_notify would otherwise say
    // READY=1 before the readiness check does (under NotifyAccess=all), or have systemd log
    // each message from a process that is not the unit's main one.
    cmd.env_remove("NOTIFY_SOCKET");
    // SAFETY: only sigprocmask between fork and exec (async-signal-safe): the child gets the
    // default signal mask back.
    unsafe {
        cmd.pre_exec(|| SigSet::empty().thread_set_mask().map_err(io::Error::from));
    }
    let mut child = cmd.spawn().map_err(|e| failed(format!("starting {}: {e}", program.to_string_lossy())))?;
    notify(&format!("STATUS=started {}", program.to_string_lossy()));
    let started = Instant::now();
    // Readiness by start alone is there as soon as the command is.
    let mut ready = matches!(o.readiness, Readiness::Started);
    if ready {
        notify("READY=1\nSTATUS=ready");
    }
    let mut stopping: Option<Instant> = None;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| failed(e.to_string()))? {
            return Ok(if ready {
                Ended::Exited(status)
            } else {
                Ended::NotReady(format!("the command exited ({status}) before it was ready"), status)
            });
        }
        if !ready && stopping.is_none() {
            if o.readiness.ready() {
                ready = true;
                notify("READY=1\nSTATUS=ready");
            } else if started.elapsed() >= o.ready_timeout {
                let status = stop(&mut child, &sfd, o.stop_grace)?;
                let why = format!("not ready within {} ms; stopped", o.ready_timeout.as_millis());
                return Ok(Ended::NotReady(why, status));
            }
        }
        if let Some(since) = stopping {
            if since.elapsed() >= o.stop_grace {
                let _ = child.kill();
            }
        }
        for sig in wait_signals(&sfd, POLL)? {
            if FORWARDED.contains(&sig) {
                if stopping.is_none() {
                    notify("STOPPING=1\nSTATUS=stopping");
                    stopping = Some(Instant::now());
                }
                let _ = kill(Pid::from_raw(child.id() as i32), sig);
            }
        }
    }
}

/// Signals that arrived within `timeout`.
fn wait_signals(sfd: &SignalFd, timeout: Duration) -> Result<Vec<Signal>, ServiceError> {
    let mut fds = [PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(timeout.as_millis() as i32).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, ms) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => return Err(failed(format!("poll: {e}"))),
    }
    let mut got = Vec::new();
    while let Ok(Some(info)) = sfd.read_signal() {
        if let Ok(s) = Signal::try_from(info.ssi_signo as i32) {
            got.push(s);
        }
    }
    Ok(got)
}

/// SIGTERM, then SIGKILL after the grace; the child's status.
fn stop(child: &mut Child, sfd: &SignalFd, grace: Duration) -> Result<ExitStatus, ServiceError> {
    notify("STOPPING=1\nSTATUS=stopping");
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let since = Instant::now();
    loop {
        if let Some(s) = child.try_wait().map_err(|e| failed(e.to_string()))? {
            return Ok(s);
        }
        if since.elapsed() >= grace {
            let _ = child.kill();
            return child.wait().map_err(|e| failed(e.to_string()));
        }
        wait_signals(sfd, Duration::from_millis(50))?;
    }
}

/// Tell systemd (`$NOTIFY_SOCKET`, a path or an abstract `@name`); nothing without one.
pub fn notify(state: &str) {
    let Some(addr) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = addr.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        if let Ok(a) = std::os::unix::net::SocketAddr::from_abstract_name(name) {
            let _ = sock.send_to_addr(state.as_bytes(), &a);
        }
    } else {
        let _ = sock.send_to(state.as_bytes(), Path::new(&addr));
    }
}

/// Exit as the child did: its code, or its signal raised again on ourselves.
pub fn exit_like(status: ExitStatus) -> ! {
    if let Some(sig) = status.signal() {
        if let Ok(s) = Signal::try_from(sig) {
            // SAFETY: restoring the default action and unblocking so the signal ends us as it
            // ended the child (a core dump is not wanted: RLIMIT_CORE stays what it is).
            unsafe {
                let _ = nix::sys::signal::signal(s, nix::sys::signal::SigHandler::SigDfl);
            }
            let mut set = SigSet::empty();
            set.add(s);
            let _ = set.thread_unblock();
            let _ = nix::sys::signal::raise(s);
        }
        std::process::exit(128 + sig);
    }
    std::process::exit(status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_values_strip_one_newline_and_refuse_padding_and_controls() {
        let p = Path::new("c");
        assert_eq!(credential_value(p, b"s3cret\n".to_vec()).unwrap(), "s3cret");
        assert_eq!(credential_value(p, b"s3cret".to_vec()).unwrap(), "s3cret");
        for bad in [&b"s3cret\n\n"[..], b" s3cret", b"s3cret ", b"s3\x07cret", b"", b"\n", b"\xff"] {
            assert!(matches!(credential_value(p, bad.to_vec()), Err(ServiceError::Refused(_))), "{bad:?}");
        }
    }
}
