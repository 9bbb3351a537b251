//! A container's terminal (`process.terminal` with `--console-socket`): a new pty whose master
//! goes to the engine over its console socket (SCM_RIGHTS, with the terminal's name, as runc
//! sends it) and whose slave becomes the container's stdin, stdout, stderr and controlling
//! terminal.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

/// The container's side of its terminal.
pub struct Console {
    /// The pty's slave: the container's stdio.
    pub slave: OwnedFd,
}

impl Console {
    /// Open a pty and hand its master to the engine at `socket`. Our copy of the master is
    /// closed here: the engine alone holds it.
    pub fn open(socket: &Path) -> Result<Console, String> {
        let pty = nix::pty::openpty(None, None).map_err(|e| format!("opening a terminal for the container: {e}"))?;
        let name = nix::unistd::ttyname(&pty.slave).map_err(|e| format!("naming the container's terminal: {e}"))?;
        let stream = UnixStream::connect(socket)
            .map_err(|e| format!("connecting to the console socket {}: {e}", socket.display()))?;
        let fds = [pty.master.as_raw_fd()];
        let name = name.as_os_str().as_encoded_bytes();
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(name)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("sending the terminal to the console socket {}: {e}", socket.display()))?;
        // The slave is ours (and the container's, by inheritance) only: never the next exec's.
        nix::fcntl::fcntl(&pty.slave, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
            .map_err(|e| format!("the container's terminal: {e}"))?;
        Ok(Console { slave: pty.slave })
    }
}

/// The terminal a process asks for (`process.terminal`): opened and sent to `socket`, or none;
/// a terminal without a socket, or a socket without a terminal, is refused.
pub fn for_process(terminal: bool, socket: Option<&Path>) -> Result<Option<Console>, String> {
    match (terminal, socket) {
        (true, Some(s)) => Console::open(s).map(Some),
        (true, None) => Err("process.terminal is true but no --console-socket was given".into()),
        (false, Some(_)) => Err("--console-socket was given but process.terminal is not true".into()),
        (false, None) => Ok(None),
    }
}

/// Where the process's stdio goes: the terminal's side in the container (its stdin, stdout
/// and stderr), or the engine's own `out` and `err` (and stdin).
pub fn sinks<'a>(console: Option<&'a Console>, out: BorrowedFd<'a>, err: BorrowedFd<'a>) -> chio_cage::Sinks<'a> {
    match console {
        Some(c) => {
            let mut s = chio_cage::Sinks::new(c.slave.as_fd(), c.slave.as_fd());
            s.stdin = Some(c.slave.as_fd());
            s
        }
        None => chio_cage::Sinks::new(out, err),
    }
}
