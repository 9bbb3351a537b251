//! The `--supervisor` client: a launch or a repository operation sent to the daemon as a typed
//! request, with the client's environment and its stdout, stderr, working directory (and stdin
//! when the command reads it) as descriptors; the daemon's launch child writes the command's
//! output straight to them. The caller reports the answer as the one-shot form would.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{bail, Context, Result};
use chio_supervisor::daemon::wire::{self, Fds, Protocol, Request};
use chio_supervisor::launch::LaunchRequest;
use chio_supervisor::repository::operation::Operation;
use serde_json::Value;

use super::passed::Passed;

/// Send `launch` to the daemon at `socket` with this process's environment, working directory,
/// stdout and stderr (and stdin when `interactive`); returns the daemon's answer. The signed
/// documents in it were read with the client's rights; the daemon's admission decides what of
/// the request this client may ask.
pub fn cage_launch(socket: &Path, launch: LaunchRequest, interactive: bool) -> Result<Value> {
    let request = Request::Launch {
        protocol: Protocol::V2,
        id: random_id()?,
        launch: Box::new(launch),
        env: client_env(),
        fds: Fds { cwd: true, stdin: interactive },
    };
    let cwd = open_cwd()?;
    let passed = Passed::ours(cwd.as_fd(), interactive)?;
    let answer = exchange(socket, &request, passed.fds());
    say_dropped("the command's", passed.finish());
    answer
}

/// Say what a relay of ours could not write (never on a stderr that could not be written).
fn say_dropped(whose: &str, left: Vec<(&str, u64)>) {
    for (name, n) in left.into_iter().filter(|(name, _)| *name != "stderr") {
        let drain_s = chio_cage::supervise::DRAIN_MS / 1000;
        eprintln!(
            "chio: {n} bytes of {whose} {name} could not be written within {drain_s} s of its end, and were dropped"
        );
    }
}

/// `chio repository [--supervisor SOCKET] …` sent to the daemon: the same operation, run by
/// it in the client's directory with the client's stdin, stdout and stderr; exits as it did.
pub fn repository(socket: &Path, command: Operation) -> Result<i32> {
    // Only `serve` reads stdin: any other operation leaves the client's alone.
    let reads_stdin = matches!(command, Operation::Serve { .. });
    let request = Request::Repository {
        protocol: Protocol::V2,
        id: random_id()?,
        command: Box::new(command),
        env: client_env(),
        fds: Fds { cwd: true, stdin: reads_stdin },
    };
    let cwd = open_cwd()?;
    let passed = Passed::ours(cwd.as_fd(), reads_stdin)?;
    let answer = exchange(socket, &request, passed.fds());
    say_dropped("the", passed.finish());
    let answer = answer?;
    if let Some(e) = answer.get("error").and_then(Value::as_str) {
        eprintln!("chio: the supervisor refused the operation: {e}");
        return Ok(answer.get("exit_code").and_then(Value::as_i64).map_or(1, |c| c as i32));
    }
    let status =
        answer.get("exit_status").and_then(Value::as_i64).context("the supervisor's answer has no exit_status")?;
    Ok(status as i32)
}

/// The client's variables that travel (chio's own settings stay the daemon's: see
/// [`super::job::travels`]).
fn client_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| chio_supervisor::daemon::job::travels(k))
        .collect()
}

fn open_cwd() -> Result<std::os::fd::OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(".", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        .context("opening the working directory")
}

/// Send one request with `fds` and read its answer line.
pub fn exchange(socket: &Path, request: &Request, fds: &[RawFd]) -> Result<Value> {
    let conn =
        UnixStream::connect(socket).with_context(|| format!("connecting to the supervisor at {}", socket.display()))?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    // A peer the daemon refuses is answered at once and disconnected: the answer is read
    // even when sending failed.
    let sent = wire::send_line(conn.as_fd(), &line, fds);
    let mut reply = String::new();
    let read = BufReader::new(&conn).read_line(&mut reply);
    if reply.is_empty() {
        sent.with_context(|| format!("sending to the supervisor at {}", socket.display()))?;
        read.with_context(|| format!("reading the supervisor's answer ({})", socket.display()))?;
        bail!("the supervisor at {} closed the connection without an answer", socket.display());
    }
    serde_json::from_str(&reply).context("the supervisor's answer is not JSON")
}

/// 128 random bits in hex: request ids never repeat by accident.
fn random_id() -> Result<String> {
    let mut b = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b).context("/dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}
