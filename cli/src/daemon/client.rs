//! `chio cage run --supervisor SOCKET`: the same launch, run by the daemon. The client sends its
//! arguments, environment, signed documents (read with its own rights) and its stdout, stderr,
//! working directory (and stdin with `-i`) as descriptors; the daemon's launch child writes the
//! command's output straight to them. The client writes `--record`, prints `--json` and exits
//! with the launch's status, so the output and status are the one-shot form's.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{bail, Context, Result};
use chio_cage::LaunchRecord;
use serde_json::Value;

use chio_supervisor::repository::operation::Operation;

use super::passed::Passed;
use super::wire::{self, Fds, Protocol, Request};
use crate::cage_cmd::RunArgs;

/// Send the launch `a` (parsed from this process's arguments) to the daemon at `socket`.
pub fn cage_run(socket: &Path, a: &RunArgs) -> Result<i32> {
    let record_file = crate::cage_cmd::create_record_file(a)?;
    // The signed documents are read here, with the client's rights; the daemon's admission
    // decides what of the request this client may ask.
    let launch = crate::cage_cmd::request_from(a)?;
    let request = Request::Launch {
        protocol: Protocol::V2,
        id: random_id()?,
        launch: Box::new(launch),
        env: client_env(),
        fds: Fds { cwd: true, stdin: a.interactive },
    };
    let cwd = open_cwd()?;
    let passed = Passed::ours(cwd.as_fd(), a.interactive)?;
    let answer = exchange(socket, &request, passed.fds());
    say_dropped("the command's", passed.finish());
    finish(a, &answer?, record_file)
}

/// The request `chio cage run ARGS` or `chio repository ARGS` (`args` starting with `cage run`
/// or `repository`) sends with `--supervisor`, as `id`; a usage error as clap words it.
pub fn request_for(id: &str, cwd: bool, args: &[OsString]) -> std::result::Result<Request, String> {
    let fds = |stdin| Fds { cwd, stdin };
    let first: Vec<&str> = args.iter().take(2).filter_map(|a| a.to_str()).collect();
    match first.as_slice() {
        ["cage", "run", ..] => {
            use clap::FromArgMatches;
            let runs = std::iter::once(OsString::from("run")).chain(args[2..].iter().cloned());
            let matches = crate::cage_cmd::parser().try_get_matches_from(runs).map_err(|e| e.to_string())?;
            let a = RunArgs::from_arg_matches(&matches).map_err(|e| e.to_string())?;
            let launch = crate::cage_cmd::request_from(&a).map_err(|e| format!("{e:#}\n"))?;
            Ok(Request::Launch {
                protocol: Protocol::V2,
                id: id.into(),
                launch: Box::new(launch),
                env: Vec::new(),
                fds: fds(a.interactive),
            })
        }
        ["repository", ..] => {
            let command = crate::repository_cmd::parse_args(&args[1..]).map_err(|e| e.to_string())?.operation();
            let stdin = matches!(command, Operation::Serve { .. });
            Ok(Request::Repository {
                protocol: Protocol::V2,
                id: id.into(),
                command: Box::new(command),
                env: Vec::new(),
                fds: fds(stdin),
            })
        }
        _ => Err("give `cage run …` or `repository …`\n".into()),
    }
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
pub fn repository(socket: &Path) -> Result<i32> {
    let raw: Vec<OsString> = std::env::args_os().skip(2).collect();
    let args = forwarded(&raw, &["--supervisor"])?;
    let command = match crate::repository_cmd::parse_args(&args.iter().map(OsString::from).collect::<Vec<_>>()) {
        Ok(c) => c.operation(),
        Err(e) => {
            let _ = e.print();
            return Ok(e.exit_code());
        }
    };
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
        .filter(|(k, _)| super::job::travels(k))
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

fn finish(a: &RunArgs, answer: &Value, record_file: Option<std::fs::File>) -> Result<i32> {
    if let Some(e) = answer.get("error").and_then(Value::as_str) {
        eprintln!("chio: the supervisor refused the launch: {e}");
        return Ok(answer.get("exit_code").and_then(Value::as_i64).map_or(125, |c| c as i32));
    }
    let status =
        answer.get("exit_status").and_then(Value::as_i64).context("the supervisor's answer has no exit_status")?;
    if let Some(r) = answer.get("record").filter(|r| !r.is_null()) {
        let rec: LaunchRecord = serde_json::from_value(r.clone()).context("the supervisor's launch record")?;
        if let (Some(mut f), Some(path)) = (record_file, &a.record) {
            f.write_all(format!("{}\n", serde_json::to_string(&rec)?).as_bytes())
                .and_then(|_| f.sync_all())
                .with_context(|| format!("writing record {}", path.display()))?;
        }
        if a.json {
            eprintln!("{}", serde_json::to_string(&rec)?);
        }
    }
    Ok(status as i32)
}

/// 128 random bits in hex: request ids never repeat by accident.
fn random_id() -> Result<String> {
    let mut b = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b).context("/dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The arguments to parse: ours without the client's own flags (`strip`).
fn forwarded(raw: &[OsString], strip: &[&str]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut it = raw.iter();
    while let Some(arg) = it.next() {
        let s = arg.to_str().with_context(|| format!("the argument {arg:?} is not UTF-8"))?;
        if s == "--" {
            out.push(s.to_string());
            for rest in it.by_ref() {
                out.push(rest.to_str().with_context(|| format!("the argument {rest:?} is not UTF-8"))?.to_string());
            }
            break;
        }
        let name = s.split_once('=').map_or(s, |(n, _)| n);
        if strip.contains(&name) {
            // Each takes a value, inline or next.
            if !s.contains('=') {
                it.next();
            }
            continue;
        }
        out.push(s.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_flag_is_not_forwarded_and_the_command_is_kept_whole() {
        let raw: Vec<OsString> =
            ["--supervisor", "/s", "execute", "--state", "ws", "--operation-key", "k", "--", "sh", "--supervisor", "x"]
                .iter()
                .map(OsString::from)
                .collect();
        let args = forwarded(&raw, &["--supervisor"]).unwrap();
        assert_eq!(args, ["execute", "--state", "ws", "--operation-key", "k", "--", "sh", "--supervisor", "x"]);
        assert!(crate::repository_cmd::parse_args(&args.iter().map(OsString::from).collect::<Vec<_>>()).is_ok());
    }
}
