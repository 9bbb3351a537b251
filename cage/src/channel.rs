//! The status channel between the supervisor and the cage: a `SOCK_SEQPACKET` socketpair, both
//! ends close-on-exec. The cage sends JSON messages with kernel-checked credentials (a failure;
//! the target's "hello", which is how the supervisor learns the target's host pid and pidfd;
//! "ready" with the opened target fds); the supervisor answers the hello with one byte. EOF on
//! the supervisor's end after the target's exec proves no cage process still holds a setup fd.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType, UnixCredentials,
};

use serde::{Deserialize, Serialize};

use crate::record::Reported;

/// Supervisor → target: it is held under ptrace; it may exec once set up.
pub const GO: u8 = b'G';
/// Supervisor → target: stop, the launch is refused.
pub const ABORT: u8 = b'X';
const MAX_MSG: usize = 64 * 1024;

/// Messages on the status channel (all cage → supervisor but `Join`, `Plan` and `Ceilings`).
#[derive(Debug, Serialize, Deserialize)]
pub enum CageMsg {
    /// Supervisor → an init cloned ahead of its request (see [`crate::ahead`]): the launch.
    Plan {
        /// The plan.
        plan: Box<crate::plan::CagePlan>,
        /// Landlock ABI to build for (the host's, or less under a test cap).
        landlock_abi: u32,
        /// Whether the supervisor feeds the target's stdin (else the init drops that pipe).
        feed_stdin: bool,
        /// For an init that pivoted into the root made ahead ([`CageMsg::Pivoted`]): the plan's
        /// part of that root, whose trees the message's fds carry.
        root: Option<Box<crate::mounts::PlanPart>>,
    },
    /// An init cloned ahead with a root made ahead → its launch process: it has attached that
    /// root and pivoted into it, and waits for the plan (see [`crate::mounts::RootAhead`]).
    Pivoted,
    /// Supervisor → an init cloned ahead, which is in the launch cgroup already: its ceilings
    /// are written, the target may exist.
    Ceilings,
    /// Supervisor → init, cgroup v1 only: the fds carry the launch cgroup's `tasks` files, one
    /// per hierarchy, created while the init was building its namespaces.
    Join,
    /// A setup stage failed; the cage exits without running the target.
    Failed(crate::failure::Failure),
    /// The target exists (the message's credentials carry its pid) and sets itself up; it
    /// execs only once the supervisor, which attaches ptrace meanwhile, answers [`GO`].
    Hello,
    /// Everything before exec is in place; the fds carry the executable (and script, if any).
    Ready {
        /// Facts only the cage can report.
        reported: Box<Reported>,
        /// Path of the executed file inside the cage.
        exec_path: String,
        /// Path of the script when the target is a `#!` script.
        script_path: Option<String>,
        /// The fd the script stays open on across exec: the interpreter reads `/dev/fd/<n>`.
        script_fd: Option<i32>,
    },
}

/// A received message.
pub struct Received {
    /// The message, or `None` on EOF.
    pub msg: Option<CageMsg>,
    /// Passed fds, in order.
    pub fds: Vec<OwnedFd>,
    /// Sender pid as the receiver's pid namespace sees it (from SCM_CREDENTIALS).
    pub pid: Option<libc::pid_t>,
    /// A pidfd for the sender itself (SCM_PIDFD), on the supervisor's end: unlike the pid, it
    /// cannot come to name another process once the sender is gone.
    pub pidfd: Option<OwnedFd>,
}

/// `SO_PASSPIDFD` and `SCM_PIDFD` (Linux 6.5, asm-generic/socket.h, which x86_64 and aarch64
/// use): the libc crate does not export them yet, nor nix a sockopt or a control message.
const SO_PASSPIDFD: libc::c_int = 76;
const SCM_PIDFD: libc::c_int = 4;

/// The most descriptors one message can carry (the kernel's SCM_MAX_FD): the receive buffer
/// holds that many, so the kernel never cuts the control data — a cut would leave the
/// descriptors that fit installed here with no way (through nix) to close them.
const SCM_MAX_FD: usize = 253;

/// Create the socketpair: (supervisor end, cage end). The supervisor end receives credentials
/// and a pidfd for each message's sender; a kernel that cannot give the pidfd (before 6.5) is
/// refused here, so no launch runs without it.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
    setsockopt(&a, sockopt::PassCred, &true)?;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on our own socket with a pointer to an int that outlives the call.
    let r = unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSPIDFD,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("SO_PASSPIDFD (Linux 6.5 or later): {e}")));
    }
    Ok((a, b))
}

/// Send a message with optional fds and our credentials.
pub fn send(sock: RawFd, msg: &CageMsg, fds: &[RawFd]) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_MSG {
        // The receiver would read it cut short.
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a {} byte message", body.len())));
    }
    let cred = UnixCredentials::new();
    let mut cmsgs = vec![ControlMessage::ScmCredentials(&cred)];
    if !fds.is_empty() {
        cmsgs.push(ControlMessage::ScmRights(fds));
    }
    sendmsg::<()>(sock, &[IoSlice::new(&body)], &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

/// Receive one message (blocking).
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Received> {
    // A buffer the message's size, not the largest one's: 64 KiB zeroed for each message was
    // sixteen fresh pages to fault in, in the supervisor and again in the init.
    let mut buf = vec![0u8; next_len(sock)?.clamp(1, MAX_MSG)];
    let mut space = nix::cmsg_space!(libc::ucred, [RawFd; SCM_MAX_FD], RawFd);
    let mut out = Received { msg: None, fds: Vec::new(), pid: None, pidfd: None };
    let mut iov = [IoSliceMut::new(&mut buf)];
    // ECONNRESET means the peer closed with a message of ours unread (a cage that failed before
    // reading the supervisor's `Join`); it is reported once, ahead of whatever the peer sent
    // before closing, which is what we want to read.
    let msg = loop {
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(Errno::EINTR | Errno::ECONNRESET) => continue,
            r => break r?,
        }
    };
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::ScmCredentials(cred) => out.pid = Some(cred.pid()),
            ControlMessageOwned::Unknown(c)
                if c.cmsg_header.cmsg_level == libc::SOL_SOCKET && c.cmsg_header.cmsg_type == SCM_PIDFD =>
            {
                out.pidfd = pidfd_of(&c.data_bytes);
            }
            ControlMessageOwned::ScmRights(received) => {
                // SAFETY: the kernel just installed these descriptors in our table; we own them.
                out.fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
            _ => {}
        }
    }
    if msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::other("status message truncated"));
    }
    let n = msg.bytes;
    if n > 0 {
        out.msg = Some(serde_json::from_slice(&buf[..n]).map_err(io::Error::other)?);
    }
    Ok(out)
}

/// The length of the next message, left queued (blocking until there is one; 0 at EOF). Peeked
/// without room for ancillary data, which the kernel then keeps for the real read: no
/// descriptor is installed by the peek.
fn next_len(sock: BorrowedFd<'_>) -> io::Result<usize> {
    loop {
        match recvmsg::<()>(sock.as_raw_fd(), &mut [], None, MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC) {
            // As in `recv`: a reset is reported once, ahead of what the peer sent.
            Err(Errno::EINTR | Errno::ECONNRESET) => continue,
            r => return Ok(r?.bytes),
        }
    }
}

/// The descriptor an SCM_PIDFD message carries. The kernel puts a negative errno there when it
/// could not make one (a sender already reaped, on kernels that refuse those): no pidfd then.
fn pidfd_of(data: &[u8]) -> Option<OwnedFd> {
    let fd = RawFd::from_ne_bytes(data.get(..4)?.try_into().ok()?);
    // SAFETY: a non-negative value is a descriptor the kernel just installed for us.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Write and parse a plan message once, while waiting for the request: a process forked from
/// the daemon's launcher runs that code for the first time when the plan crosses, and pays for
/// the first touch of its pages then (≈ 30 µs on each side of the hop).
pub fn warm() {
    let msg = CageMsg::Plan {
        plan: Box::new(crate::plan::CagePlan::new(vec!["/bin/true".into()])),
        landlock_abi: 0,
        feed_stdin: false,
        root: None,
    };
    if let Ok(body) = serde_json::to_vec(&msg) {
        let _ = serde_json::from_slice::<CageMsg>(&body);
    }
}

/// Write one control byte.
pub fn send_byte(sock: RawFd, b: u8) -> io::Result<()> {
    match nix::sys::socket::send(sock, &[b], MsgFlags::MSG_NOSIGNAL)? {
        1 => Ok(()),
        _ => Err(io::Error::other("short write of a control byte")),
    }
}

/// Read one control byte (`None` on EOF).
pub fn recv_byte(sock: RawFd) -> io::Result<Option<u8>> {
    let mut b = [0u8];
    loop {
        match nix::sys::socket::recv(sock, &mut b, MsgFlags::empty()) {
            Ok(1) => return Ok(Some(b[0])),
            Ok(_) => return Ok(None),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
