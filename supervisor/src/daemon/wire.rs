//! The daemon's wire: one JSON object a line on a Unix stream socket, with the client's
//! descriptors (stdout, stderr, and optionally its working directory and stdin) passed as
//! SCM_RIGHTS on the request line. Passing descriptors, not paths, means the daemon writes the
//! command's output with the client's own rights to wherever the client's output goes.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::launch::LaunchRequest;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use serde::{Deserialize, Serialize};

use crate::repository::operation::Operation;

/// The longest request line the daemon reads (a launch's options, environment and two signed
/// documents).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// The most descriptors one request may carry: stdout, stderr, working directory, stdin.
pub const MAX_FDS: usize = 4;
/// The protocol every request names: a request of another one (a `chio` of another version) is
/// refused, naming both.
pub const PROTOCOL: &str = "chio.supervisor.v2";

/// [`PROTOCOL`], as a field that only takes that value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    /// The typed protocol: a launch is a [`LaunchRequest`], a repository operation a
    /// repository [`Operation`].
    #[serde(rename = "chio.supervisor.v2")]
    V2,
}

/// A request from a client: one JSON object on one line, its operation named by `op`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Is the daemon there, and which role does it give the caller? (No descriptors.)
    Ping {
        /// [`PROTOCOL`].
        protocol: Protocol,
        /// The client's id for this request.
        id: String,
    },
    /// A launch, as `chio cage run` makes it.
    Launch {
        /// [`PROTOCOL`].
        protocol: Protocol,
        /// The client's id for this request: a repeat with the same request returns the
        /// retained answer, a repeat with a different one is refused.
        id: String,
        /// What to launch. Its relative paths resolve in the client's working directory (an
        /// admin's only: no other role names a host path).
        launch: Box<LaunchRequest>,
        /// The client's environment (what `--env KEY` and a policy's admitted variables read).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<(String, String)>,
        /// Which descriptors ride on the request, in order after stdout and stderr.
        #[serde(default)]
        fds: Fds,
    },
    /// A repository operation, as `chio repository` takes it.
    Repository {
        /// [`PROTOCOL`].
        protocol: Protocol,
        /// The client's id for this request (as for a launch).
        id: String,
        /// The operation.
        command: Box<Operation>,
        /// The client's environment.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<(String, String)>,
        /// Which descriptors ride on the request, in order after stdout and stderr.
        #[serde(default)]
        fds: Fds,
    },
}

impl Request {
    /// The request's id.
    pub fn id(&self) -> &str {
        match self {
            Request::Ping { id, .. } | Request::Launch { id, .. } | Request::Repository { id, .. } => id,
        }
    }

    /// How many descriptors the request announces (none for a ping).
    pub fn fd_count(&self) -> usize {
        match self {
            Request::Ping { .. } => 0,
            Request::Launch { fds, .. } | Request::Repository { fds, .. } => fds.count(),
        }
    }

    /// Read a request line: one of [`PROTOCOL`], else an error naming what is wrong with it.
    pub fn parse(line: &[u8]) -> Result<Request, String> {
        let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| format!("not a request: {e}"))?;
        match value.get("protocol").and_then(|p| p.as_str()) {
            Some(PROTOCOL) => {}
            Some(other) => {
                return Err(format!(
                    "this supervisor speaks {PROTOCOL}, not {other:?}: use a chio of the supervisor's version"
                ))
            }
            None => {
                return Err(format!(
                    "the request names no protocol: this supervisor speaks {PROTOCOL} (a request of an older chio \
                     carries `args`; use a chio of the supervisor's version)"
                ))
            }
        }
        serde_json::from_value(value).map_err(|e| format!("not a {PROTOCOL} request: {e}"))
    }
}

/// The optional descriptors of a launch request (stdout and stderr always come first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fds {
    /// The client's working directory (an admin's relative paths resolve from it).
    #[serde(default)]
    pub cwd: bool,
    /// The client's stdin (`--interactive`).
    #[serde(default)]
    pub stdin: bool,
}

impl Fds {
    /// How many descriptors a launch request with these options carries.
    pub fn count(self) -> usize {
        2 + usize::from(self.cwd) + usize::from(self.stdin)
    }
}

/// Send `line` (which ends in a newline) with `fds` attached to its first bytes.
pub fn send_line(sock: BorrowedFd<'_>, line: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    let mut sent = sendmsg::<UnixAddr>(sock.as_raw_fd(), &[IoSlice::new(line)], cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    while sent < line.len() {
        sent +=
            sendmsg::<UnixAddr>(sock.as_raw_fd(), &[IoSlice::new(&line[sent..])], &[], MsgFlags::MSG_NOSIGNAL, None)?;
    }
    Ok(())
}

/// The most descriptors one message can carry (the kernel's SCM_MAX_FD).
const SCM_MAX_FD: usize = 253;

/// One `recvmsg`: bytes into `buf`, descriptors appended to `fds` (close-on-exec). The control
/// buffer holds as many descriptors as one message can carry, so none is ever cut off: a cut
/// (MSG_CTRUNC) would leave the ones that fit installed here with no way to close them through
/// nix. The caller refuses more than [`MAX_FDS`] and closes them all by dropping `fds`.
pub fn recv_some(sock: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<UnixAddr>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: the kernel just installed these descriptors in our table; we own them.
            fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    Ok(msg.bytes)
}
