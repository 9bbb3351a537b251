//! The daemon's wire: one JSON object a line on a Unix stream socket, with the client's
//! descriptors (stdout, stderr, and optionally its working directory and stdin) passed as
//! SCM_RIGHTS on the request line. Passing descriptors, not paths, means the daemon writes the
//! command's output with the client's own rights to wherever the client's output goes.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use serde::{Deserialize, Serialize};

/// The longest request line the daemon reads (argv, environment and two signed documents).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// The most descriptors one request may carry: stdout, stderr, working directory, stdin.
pub const MAX_FDS: usize = 4;

/// A request from a client.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The client's id for this request: a repeat with the same request returns the retained
    /// answer, a repeat with a different one is refused.
    pub id: String,
    /// `ping`, `launch` (`chio cage run`) or `repository` (`chio repository`).
    pub op: String,
    /// For `launch`: the arguments of `chio cage run` (without `--supervisor`, `--record`,
    /// `--json`); for `repository`, those of `chio repository`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// For `launch`: the client's environment (what `--env KEY` and admitted variables read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// For a policy launch: the signed policy and manifest, as the client read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<Documents>,
    /// Which descriptors ride on the request, in order after stdout and stderr.
    #[serde(default)]
    pub fds: Fds,
}

/// The signed documents of a policy launch.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Documents {
    /// The operator-signed cage launch policy.
    pub policy: String,
    /// The publisher-signed tool manifest.
    pub manifest: String,
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
