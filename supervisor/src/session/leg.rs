//! The repository leg as the worker reaches it: a Unix socket bound into the worker's cage
//! (`STATE/run/leg.sock`), one JSON request a line (`{"operation_key", "command", "deadline_s"}`),
//! one JSON answer a line (the `execute` result, or `{"error", "exit_code"}`). The server holds the
//! workspace's lock for the whole run and launches each command's cage itself, so it stays a
//! single-threaded process and serves one connection at a time (the worker runs commands one
//! after another). It enforces what the authorization says, whatever the worker asks: the
//! deadline at most the authorized one, at most `step_limit` commands a run.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use serde_json::{json, Value};

use super::config::Grant;
use super::Session;
use crate::repository::execute::{self, ExecRequest};
use crate::repository::workspace::{self, RepoError, Workspace, COMMAND_ID};

/// The longest request line.
const MAX_LINE_BYTES: u64 = 1 << 20;

/// Serve until killed. Prints `ready` on stdout once the socket listens.
pub fn serve(s: &Session) -> Result<(), RepoError> {
    let grant = s.check_authorized()?.grant;
    let ws = workspace::open(&s.workspace_dir())?;
    let socket = s.dir.join("run").join("leg.sock");
    let _ = fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666))?;
    println!("ready");
    std::io::stdout().flush()?;
    let mut commands = 0u32;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let _ = serve_connection(s, &grant, &ws, conn, &mut commands);
    }
    Ok(())
}

fn serve_connection(
    s: &Session,
    grant: &Grant,
    ws: &Workspace,
    conn: UnixStream,
    commands: &mut u32,
) -> std::io::Result<()> {
    let mut out = conn.try_clone()?;
    // The worker's uid, or root: nobody else has the path, but a socket checks its peer anyway.
    let peer = getsockopt(&conn, PeerCredentials).map_err(std::io::Error::from)?;
    if peer.uid() != COMMAND_ID && peer.uid() != 0 {
        let refusal = json!({"error": format!("uid {} may not use the leg", peer.uid()), "exit_code": 3});
        return writeln!(out, "{refusal}");
    }
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if (&mut reader).take(MAX_LINE_BYTES).read_line(&mut line)? == 0 {
            return Ok(());
        }
        let answer = match answer(s, grant, ws, &line, commands) {
            Ok(v) => v,
            Err(e) => json!({"error": e.to_string(), "exit_code": e.exit_code()}),
        };
        writeln!(out, "{answer}")?;
    }
}

fn answer(s: &Session, grant: &Grant, ws: &Workspace, line: &str, commands: &mut u32) -> Result<Value, RepoError> {
    let req: ExecRequest =
        serde_json::from_str(line).map_err(|e| RepoError::Usage(format!("not an execute request: {e}")))?;
    // The grant's lifetime holds the commands too: none runs after it.
    if let Some(ended) = grant.expired(chio_kernel::time::now_ms()) {
        return Err(RepoError::Refused(format!("{ended}: no command runs")));
    }
    let authorized = s.request.commands.deadline_s;
    if req.deadline_s > authorized {
        return Err(RepoError::Refused(format!(
            "a deadline of {} s: the session authorizes at most {authorized} s a command",
            req.deadline_s
        )));
    }
    if *commands >= s.request.agent.step_limit {
        return Err(RepoError::Refused(format!(
            "the session's step limit of {} commands a run is reached",
            s.request.agent.step_limit
        )));
    }
    *commands += 1;
    let result = execute::execute(ws, &req)?;
    serde_json::to_value(&result).map_err(|e| RepoError::Failed(e.to_string()))
}
