//! A scripted OpenAI-compatible provider on the host's loopback, for `session qualify`: a session
//! run end to end without a model account. Its answer depends on the conversation, not on how
//! often it was asked: step N (N tool results so far) gets one `bash` tool call running the
//! script's N-th command, past the script the submit command. It counts the calls of each step
//! (what qualification measures a replay by) and whether each carried a credential.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

/// mini-swe-agent's submit command.
pub const SUBMIT: &str = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT";
/// The largest request accepted (the gateway sends whole conversations).
const MAX_REQUEST_BYTES: usize = 16 << 20;

/// What the provider saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Calls per step.
    pub calls: BTreeMap<usize, u32>,
    /// Calls that carried no `Authorization: Bearer` credential.
    pub without_credential: u32,
}

/// A running scripted provider (its thread ends with the process).
pub struct Scripted {
    /// Its base URL (`http://127.0.0.1:PORT/v1`).
    pub url: String,
    seen: Arc<Mutex<Seen>>,
}

impl Scripted {
    /// Listen on a free loopback port and answer with `commands`.
    pub fn start(commands: Vec<String>) -> std::io::Result<Scripted> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/v1", listener.local_addr()?);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (log, commands) = (seen.clone(), Arc::new(commands));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (log, commands) = (log.clone(), commands.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &commands, &log);
                });
            }
        });
        Ok(Scripted { url, seen })
    }

    /// What it saw so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

fn serve(conn: TcpStream, commands: &[String], seen: &Mutex<Seen>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut out = conn.try_clone()?;
    let mut r = BufReader::new(conn.take(MAX_REQUEST_BYTES as u64));
    let (mut length, mut bearer) = (0usize, false);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "authorization" => bearer = value.trim().starts_with("Bearer ") && value.trim().len() > 7,
                _ => {}
            }
        }
    }
    let mut body = vec![0; length.min(MAX_REQUEST_BYTES)];
    r.read_exact(&mut body)?;
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let step = request["messages"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
    if let Ok(mut s) = seen.lock() {
        *s.calls.entry(step).or_default() += 1;
        s.without_credential += u32::from(!bearer);
    }
    let command = commands.get(step).map_or(SUBMIT, String::as_str);
    let call = json!({"id": format!("call_{step}"), "type": "function",
        "function": {"name": "bash", "arguments": json!({"command": command}).to_string()}});
    let answer = json!({
        "id": format!("chatcmpl-{step}"), "object": "chat.completion", "created": 0,
        "model": request["model"],
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": format!("step {step}"), "tool_calls": [call]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })
    .to_string();
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    )?;
    out.flush()
}
