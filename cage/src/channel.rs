//! The status channel between the supervisor and the cage: a `SOCK_SEQPACKET` socketpair, both
//! ends close-on-exec. The cage sends JSON messages (a failure, or "ready" with the opened target
//! fds and kernel-checked credentials, which is how the supervisor learns the target's host pid);
//! the supervisor answers with one byte. EOF on the supervisor's end after the target's exec proves
//! no cage process still holds a setup fd.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};

use crate::plan::Stage;
use crate::record::Reported;

/// Supervisor → cage: continue.
pub const GO: u8 = b'G';
/// Supervisor → cage: stop, the launch is refused.
pub const ABORT: u8 = b'X';
const MAX_MSG: usize = 64 * 1024;
const MAX_FDS: usize = 4;

/// Messages on the status channel (all cage → supervisor but `Join`).
#[derive(Debug, Serialize, Deserialize)]
pub enum CageMsg {
    /// Supervisor → init, cgroup v1 only: the fds carry the launch cgroup's `tasks` files, one
    /// per hierarchy, created while the init was building its namespaces.
    Join,
    /// A setup stage failed; the cage exits without running the target.
    Failed {
        /// Stage that failed.
        stage: Stage,
        /// Stable code.
        code: String,
        /// Explanation.
        detail: String,
    },
    /// Everything before exec is in place; the fds carry the executable (and script, if any).
    Ready {
        /// Facts only the cage can report.
        reported: Reported,
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
}

/// Create the socketpair: (supervisor end, cage end). The supervisor end receives credentials.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fds from the kernel.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let one: libc::c_int = 1;
    // SAFETY: valid socket and option value.
    let r = unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((a, b))
}

/// Send a message with optional fds and our credentials.
pub fn send(sock: RawFd, msg: &CageMsg, fds: &[RawFd]) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    // SAFETY: plain libc calls; ucred of ourselves.
    let cred = unsafe { libc::ucred { pid: libc::getpid(), uid: libc::getuid(), gid: libc::getgid() } };
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    let cred_bytes = std::mem::size_of::<libc::ucred>() as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(cred_bytes) + if fds.is_empty() { 0 } else { libc::CMSG_SPACE(fd_bytes) } };
    let mut control = vec![0u8; space as usize];
    let mut iov = libc::iovec { iov_base: body.as_ptr() as *mut libc::c_void, iov_len: body.len() };
    // SAFETY: msghdr is plain data; every pointer below refers to live buffers of the given size.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = control.len();
        let c = libc::CMSG_FIRSTHDR(&hdr);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_CREDENTIALS;
        (*c).cmsg_len = libc::CMSG_LEN(cred_bytes) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>(), cred);
        if !fds.is_empty() {
            let c = libc::CMSG_NXTHDR(&hdr, c);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        }
        if libc::sendmsg(sock, &hdr, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receive one message (blocking).
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Received> {
    let mut buf = vec![0u8; MAX_MSG];
    // SAFETY: pure size computations.
    let space = unsafe {
        libc::CMSG_SPACE(std::mem::size_of::<libc::ucred>() as u32)
            + libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32)
    };
    let mut control = vec![0u8; space as usize];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut out = Received { msg: None, fds: Vec::new(), pid: None };
    // SAFETY: msghdr points at live buffers; cmsgs are walked with the libc macros and fds taken
    // into OwnedFd exactly once.
    let n = unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = control.len();
        // ECONNRESET means the peer closed with a message of ours unread (a cage that failed
        // before reading the supervisor's `Join`); it is reported once, ahead of whatever the
        // peer sent before closing, which is what we want to read.
        let n = loop {
            let n = libc::recvmsg(sock.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC);
            let again = matches!(io::Error::last_os_error().raw_os_error(), Some(libc::EINTR | libc::ECONNRESET));
            if n >= 0 || !again {
                break n;
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                out.pid = Some(cred.pid);
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    out.fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
        if hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(io::Error::other("status message truncated"));
        }
        n as usize
    };
    if n > 0 {
        out.msg = Some(serde_json::from_slice(&buf[..n]).map_err(io::Error::other)?);
    }
    Ok(out)
}

/// Write one control byte.
pub fn send_byte(sock: RawFd, b: u8) -> io::Result<()> {
    // SAFETY: one-byte buffer.
    if unsafe { libc::send(sock, (&b as *const u8).cast(), 1, libc::MSG_NOSIGNAL) } != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Read one control byte (`None` on EOF).
pub fn recv_byte(sock: RawFd) -> io::Result<Option<u8>> {
    let mut b = 0u8;
    loop {
        // SAFETY: one-byte buffer.
        let n = unsafe { libc::recv(sock, (&mut b as *mut u8).cast(), 1, 0) };
        match n {
            1 => return Ok(Some(b)),
            0 => return Ok(None),
            _ if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => continue,
            _ => return Err(io::Error::last_os_error()),
        }
    }
}
