//! `chio repository serve`: the leg as an MCP server (JSON-RPC 2.0, one message per line on
//! stdio) with one tool, `execute`. Bad input gets a JSON-RPC error, never a dead server.

use std::io::{BufRead, Read, Write};
use std::path::Path;

use serde_json::{json, Value};

use super::execute::{self, ExecRequest, Transition, MAX_DEADLINE_S};
use super::file_tools::{self, ReadGrant, Tool, MAX_READ_BYTES};
use super::workspace::{self, RepoError};

/// Protocol versions this server speaks, newest first.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];
/// Longest request line accepted.
const MAX_LINE: u64 = 1 << 20;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

fn error(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message.into() } })
}

fn reply(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// The `execute` tool's description and input schema.
pub fn tool() -> Value {
    json!({
        "name": "execute",
        "title": "Run a shell command in the repository workspace",
        "description": "Runs the command with `bash -c` in a fresh confined cage (no network, read-only system, \
                        resource ceilings) over the workspace at /workspace. Changes inside the workspace's \
                        source paths are committed as a signed transition; a change elsewhere is refused and \
                        stops the workspace. Returns the combined output, the exit status and the receipt id.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "command": { "type": "string", "description": "The shell command." },
                "operation_key": { "type": "string", "description": "Idempotency key: the same key and command return the first result." },
                "timeout": { "type": "integer", "minimum": 1, "maximum": MAX_DEADLINE_S, "description": "Deadline in seconds (default 300)." }
            },
            "required": ["command"],
            "additionalProperties": false
        }
    })
}

/// The file tools' descriptions and input schemas (offered when the operator granted reads).
pub fn file_tools(grant: &ReadGrant) -> Vec<Value> {
    let granted = grant.prefixes().join(", ");
    let path = json!({ "type": "string", "description": format!("A path relative to the workspace, under one of: {granted}.") });
    vec![
        json!({
            "name": "read_file",
            "title": "Read a file of the workspace",
            "description": format!("Returns the text of a regular file of at most {MAX_READ_BYTES} bytes under the granted                                     paths ({granted}); links and `..` are not followed."),
            "inputSchema": { "type": "object", "properties": { "path": path }, "required": ["path"], "additionalProperties": false }
        }),
        json!({
            "name": "list_dir",
            "title": "List a directory of the workspace",
            "description": format!("Lists a directory under the granted paths ({granted}): names, types and sizes;                                     links are listed, never followed."),
            "inputSchema": { "type": "object", "properties": { "path": path }, "required": ["path"], "additionalProperties": false }
        }),
    ]
}

/// Serve requests from `input` until it ends; `grant` is the file tools' (empty: `execute` only).
pub fn serve(state: &Path, grant: &ReadGrant, input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    let mut input = input;
    loop {
        let mut line = Vec::new();
        let n = (&mut input).take(MAX_LINE + 1).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        let response = if line.len() as u64 > MAX_LINE {
            skip_line(&mut input)?;
            Some(error(Value::Null, INVALID_REQUEST, format!("a request longer than {MAX_LINE} bytes")))
        } else if line.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            handle(state, grant, &line)
        };
        if let Some(r) = response {
            writeln!(output, "{r}")?;
            output.flush()?;
        }
    }
}

/// Skip the rest of a line, holding none of it: an oversized request may never end.
fn skip_line(input: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let buf = input.fill_buf()?;
        let (used, ended) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), buf.is_empty()),
        };
        input.consume(used);
        if ended {
            return Ok(());
        }
    }
}

/// One message: the response, or nothing for a notification.
pub fn handle(state: &Path, grant: &ReadGrant, line: &[u8]) -> Option<Value> {
    let msg: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return Some(error(Value::Null, PARSE_ERROR, format!("not JSON: {e}"))),
    };
    let id = msg.get("id").cloned();
    let valid_id = matches!(id, None | Some(Value::String(_)) | Some(Value::Number(_)));
    let method = msg.get("method").and_then(Value::as_str);
    let (Some(method), true, true) = (method, msg.get("jsonrpc") == Some(&json!("2.0")), valid_id) else {
        return Some(error(
            id.filter(|_| valid_id).unwrap_or(Value::Null),
            INVALID_REQUEST,
            "not a JSON-RPC 2.0 request",
        ));
    };
    let Some(id) = id else {
        // A notification (`notifications/initialized`, `notifications/cancelled`, ...): no reply.
        return None;
    };
    let params = msg.get("params").cloned().unwrap_or(json!({}));
    Some(match method {
        "initialize" => {
            let asked = params["protocolVersion"].as_str().unwrap_or_default();
            let version = PROTOCOL_VERSIONS.iter().find(|v| **v == asked).unwrap_or(&PROTOCOL_VERSIONS[0]);
            reply(
                id,
                json!({
                    "protocolVersion": version,
                    "capabilities": { "tools": { "listChanged": false } },
                    "serverInfo": { "name": "chio-repository", "version": env!("CARGO_PKG_VERSION") },
                    "instructions": "Every command runs in a fresh cage over the workspace at /workspace."
                }),
            )
        }
        "ping" => reply(id, json!({})),
        "tools/list" => {
            let mut tools = vec![tool()];
            if !grant.is_empty() {
                tools.extend(file_tools(grant));
            }
            reply(id, json!({ "tools": tools }))
        }
        "tools/call" => match params["name"].as_str() {
            Some("read_file") if !grant.is_empty() => read(state, grant, id, Tool::Read, &params),
            Some("list_dir") if !grant.is_empty() => read(state, grant, id, Tool::List, &params),
            _ => call(state, id, &params),
        },
        other => error(id, METHOD_NOT_FOUND, format!("no method {other:?}")),
    })
}

fn call(state: &Path, id: Value, params: &Value) -> Value {
    if params["name"] != "execute" {
        return error(id, INVALID_PARAMS, format!("no tool {}", params["name"]));
    }
    let args = &params["arguments"];
    let Some(command) = args["command"].as_str() else {
        return error(id, INVALID_PARAMS, "arguments.command (a string) is required");
    };
    if let Some(k) =
        args.as_object().and_then(|o| o.keys().find(|k| !["command", "operation_key", "timeout"].contains(&k.as_str())))
    {
        return error(id, INVALID_PARAMS, format!("unknown argument {k:?}"));
    }
    let deadline_s = match &args["timeout"] {
        Value::Null => MAX_DEADLINE_S,
        v => match v.as_u64().filter(|t| (1..=MAX_DEADLINE_S).contains(t)) {
            Some(t) => t,
            None => return error(id, INVALID_PARAMS, format!("timeout must be 1 to {MAX_DEADLINE_S} seconds")),
        },
    };
    let operation_key = match &args["operation_key"] {
        Value::Null => match fresh_key() {
            Ok(k) => k,
            Err(e) => return tool_error(id, &e),
        },
        Value::String(k) => k.clone(),
        _ => return error(id, INVALID_PARAMS, "operation_key must be a string"),
    };
    let req = ExecRequest { operation_key, command: command.to_string(), deadline_s };
    match workspace::open(state).and_then(|ws| execute::execute(&ws, &req)) {
        Ok(r) => {
            let mut text = r.output.clone();
            if r.transition == Transition::Refused {
                text.push_str(&format!("\n[chio] refused: {}", r.reason.as_deref().unwrap_or("-")));
            }
            let structured = serde_json::to_value(&r).unwrap_or(Value::Null);
            reply(
                id,
                json!({
                    "content": [{ "type": "text", "text": text }],
                    "structuredContent": structured,
                    "isError": r.transition != Transition::Committed,
                }),
            )
        }
        Err(e) => tool_error(id, &e),
    }
}

/// `read_file` or `list_dir`: the answer, or the signed refusal as a tool error.
fn read(state: &Path, grant: &ReadGrant, id: Value, tool: Tool, params: &Value) -> Value {
    let args = &params["arguments"];
    if let Some(k) = args.as_object().and_then(|o| o.keys().find(|k| k.as_str() != "path")) {
        return error(id, INVALID_PARAMS, format!("unknown argument {k:?}"));
    }
    let Some(path) = args["path"].as_str() else {
        return error(id, INVALID_PARAMS, "arguments.path (a string) is required");
    };
    match workspace::open(state).and_then(|ws| file_tools::run(&ws, grant, tool, path)) {
        Ok(Ok(a)) => {
            let text = match (&a.text, &a.entries) {
                (Some(t), _) => t.clone(),
                (None, Some(entries)) => {
                    let mut lines: Vec<String> = entries
                        .iter()
                        .map(|e| match (e.kind.as_str(), e.size) {
                            ("dir", _) => format!("{}/", e.name),
                            ("symlink", _) => format!("{} (symbolic link, not followed)", e.name),
                            (_, Some(n)) => format!("{} ({n} bytes)", e.name),
                            _ => format!("{} ({})", e.name, e.kind),
                        })
                        .collect();
                    if let Some(more) = a.more {
                        lines.push(format!("… {more} more"));
                    }
                    lines.join("\n")
                }
                _ => String::new(),
            };
            let structured = serde_json::to_value(&a).unwrap_or(Value::Null);
            reply(
                id,
                json!({ "content": [{ "type": "text", "text": text }], "structuredContent": structured, "isError": false }),
            )
        }
        Ok(Err(refusal)) => reply(
            id,
            json!({
                "content": [{ "type": "text", "text": format!("chio: {refusal}") }],
                "structuredContent": { "rule": refusal.rule, "reason": refusal.reason, "receipt_id": refusal.receipt_id },
                "isError": true
            }),
        ),
        Err(e) => tool_error(id, &e),
    }
}

/// A tool-level failure: reported to the model as an error result, not a protocol error.
fn tool_error(id: Value, e: &RepoError) -> Value {
    reply(id, json!({ "content": [{ "type": "text", "text": format!("chio: {e}") }], "isError": true }))
}

fn fresh_key() -> Result<String, RepoError> {
    let mut b = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b)?;
    Ok(format!("mcp-{}", chio_kernel::keys::hex(&b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(line: &str) -> Option<Value> {
        handle(Path::new("/nonexistent-chio-state"), &ReadGrant::default(), line.as_bytes())
    }

    #[test]
    fn negotiates_lists_and_refuses_bad_input_without_dying() {
        let r =
            ask(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#).unwrap();
        assert_eq!(r["result"]["protocolVersion"], "2025-03-26");
        let r =
            ask(r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"1999-01-01"}}"#).unwrap();
        assert_eq!(r["result"]["protocolVersion"], PROTOCOL_VERSIONS[0]);
        assert!(ask(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_none());
        let r = ask(r#"{"jsonrpc":"2.0","id":"x","method":"tools/list"}"#).unwrap();
        assert_eq!(r["result"]["tools"][0]["name"], "execute");
        for (line, code) in [
            ("{not json", PARSE_ERROR),
            (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, INVALID_REQUEST),
            (r#"{"id":1,"method":"ping"}"#, INVALID_REQUEST),
            (r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#, INVALID_REQUEST),
            (r#"{"jsonrpc":"2.0","id":1,"method":"nope"}"#, METHOD_NOT_FOUND),
            (r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm"}}"#, INVALID_PARAMS),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"execute","arguments":{}}}"#,
                INVALID_PARAMS,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"execute","arguments":{"command":"x","timeout":0}}}"#,
                INVALID_PARAMS,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"execute","arguments":{"command":"x","extra":1}}}"#,
                INVALID_PARAMS,
            ),
        ] {
            assert_eq!(ask(line).unwrap()["error"]["code"], code, "{line}");
        }
        // A tool that cannot run (no workspace) is a tool error the model sees, not a crash.
        let r = ask(r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"execute","arguments":{"command":"true"}}}"#).unwrap();
        assert_eq!(r["result"]["isError"], true);
        assert!(r["result"]["content"][0]["text"].as_str().unwrap().contains("not a workspace"));
    }

    #[test]
    fn serve_answers_line_by_line_and_survives_an_oversized_line() {
        let big = "x".repeat((MAX_LINE + 10) as usize);
        let input = format!("{big}\n{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}}\n\n");
        let mut out = Vec::new();
        serve(Path::new("/nonexistent-chio-state"), &ReadGrant::default(), input.as_bytes(), &mut out).unwrap();
        let lines: Vec<Value> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["error"]["code"], INVALID_REQUEST);
        assert_eq!(lines[1]["result"], json!({}));
    }
}
