//! The model gateway: the only holder of the provider credential. It listens on a Unix socket
//! bound into the worker's cage (`STATE/run/model.sock`), takes OpenAI-compatible
//! `POST …/chat/completions` requests, and forwards each to the provider with the credential
//! added. Every answered call is journaled durably before the worker sees it: call N of a run
//! that the journal already holds is answered from the journal (a resumed or repeated run makes
//! no new model call) — and only if the request is the one journaled, so a run that diverges is
//! refused rather than silently given another run's answer. At most `step_limit` calls a session.
//!
//! A call is journaled before it is sent (`NNNNNN.sent`, durable), its answer after. A call
//! sent and never answered — the run killed while the model was thinking, an answer lost on the
//! way — has an unknown outcome: the provider may have done, and billed, the work. It is never
//! sent again on its own: the run stops naming it, and only `chio session run --resend-unknown`
//! sends it again, recorded beside it (`NNNNNN.resent`). A call the provider refused, or one that
//! never reached it (no connection), is known not answered and may be asked again.
//!
//! The gateway never launches a cage, so it may use threads: one per connection, a few at once.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::Session;
use crate::repository::workspace::{write_durably, RepoError};

/// The largest request head.
const MAX_HEAD_BYTES: usize = 64 << 10;
/// The largest request body.
const MAX_BODY_BYTES: usize = 8 << 20;
/// The largest provider answer.
const MAX_ANSWER_BYTES: u64 = 16 << 20;
/// Connections served at once.
const MAX_CONNECTIONS: usize = 4;
/// How long one provider call may take.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(300);
/// The request members forwarded: those that shape one answer of the session's model. Any other
/// is refused by name — `n` above 1 (several answers billed as one call of the step limit),
/// `service_tier` (a dearer tier), `store` and `metadata` (the conversation kept at the
/// provider), built-in tools such as `web_search_options` (billed apart): the worker, not the
/// operator, would be choosing them. The session's own worker sends `model`, `messages` and
/// `tools`.
const FORWARDED: [&str; 17] = [
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
];

/// One journaled call.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournaledCall {
    /// Its place in the run (0-based).
    pub ordinal: u64,
    /// SHA-256 of the request body's canonical JSON.
    pub request_sha256: String,
    /// The provider's HTTP status.
    pub status: u16,
    /// The provider's answer.
    pub response: String,
}

/// A call journaled before it was sent (`NNNNNN.sent`), or sent again after its outcome was
/// unknown (`NNNNNN.resent`, which keeps the request that was unknown).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournaledSend {
    /// Its place in the run (0-based).
    pub ordinal: u64,
    /// SHA-256 of the request body's canonical JSON.
    pub request_sha256: String,
}

struct Journal {
    dir: PathBuf,
    next: u64,
    limit: u64,
    /// Send again a call whose outcome is unknown (the operator's explicit, recorded choice).
    resend_unknown: bool,
}

/// The first model call of the journal in `calls` that was sent and never answered: its outcome
/// is unknown.
pub fn unknown_call(calls: &std::path::Path) -> Result<Option<u64>, RepoError> {
    let entries = match fs::read_dir(calls) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(RepoError::Failed(format!(
                "the model call journal {} cannot be read ({e}): a call of unknown outcome may be in it",
                calls.display()
            )))
        }
    };
    let mut unknown = None;
    for e in entries {
        let name = e?.file_name();
        let Some(n) = name.to_str().and_then(|n| n.strip_suffix(".sent")).and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        if !calls.join(format!("{n:06}.json")).exists() {
            unknown = Some(unknown.map_or(n, |u: u64| u.min(n)));
        }
    }
    Ok(unknown)
}

/// The calls of the journal in `calls` that were sent again after their outcome was unknown
/// (`NNNNNN.resent`), in order.
pub fn resent_calls(calls: &std::path::Path) -> Result<Vec<u64>, RepoError> {
    let entries = match fs::read_dir(calls) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(RepoError::Failed(format!("the model call journal {} cannot be read: {e}", calls.display())))
        }
    };
    let mut resent = Vec::new();
    for e in entries {
        let name = e?.file_name();
        if let Some(n) = name.to_str().and_then(|n| n.strip_suffix(".resent")).and_then(|n| n.parse::<u64>().ok()) {
            resent.push(n);
        }
    }
    resent.sort_unstable();
    Ok(resent)
}

impl Journal {
    fn path(&self, n: u64) -> PathBuf {
        self.dir.join(format!("{n:06}.json"))
    }

    fn sent_path(&self, n: u64) -> PathBuf {
        self.dir.join(format!("{n:06}.sent"))
    }

    fn resent_path(&self, n: u64) -> PathBuf {
        self.dir.join(format!("{n:06}.resent"))
    }

    /// A durable record of call `n` with `digest`, at `path`.
    fn record(&self, path: &std::path::Path, n: u64, digest: &str) -> Result<(), RepoError> {
        let entry = JournaledSend { ordinal: n, request_sha256: digest.to_string() };
        let bytes = serde_json::to_vec(&entry).map_err(|e| RepoError::Failed(e.to_string()))?;
        Ok(write_durably(path, &bytes)?)
    }

    fn load(&self, n: u64) -> Result<Option<JournaledCall>, RepoError> {
        match fs::read(self.path(n)) {
            Ok(b) => {
                Ok(Some(serde_json::from_slice(&b).map_err(|e| RepoError::Mismatch(format!("model call {n}: {e}")))?))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

struct Provider {
    url: String,
    bearer: String,
    /// The only model the session may call (the worker cannot pick a costlier one).
    model: String,
    agent: ureq::Agent,
}

/// Serve until killed. Prints `ready` on stdout once the socket listens. `resend_unknown`: send
/// again a call whose outcome is unknown (see the module's note).
pub fn serve(s: &Session, credential: String, resend_unknown: bool) -> Result<(), RepoError> {
    s.check_authorized()?;
    let calls = s.calls_dir();
    fs::create_dir_all(&calls)?;
    let socket = s.dir.join("run").join("model.sock");
    let _ = fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    // Only the worker's cage can reach this path (STATE is root's, 0700); the worker runs as an
    // unprivileged uid and must be able to connect.
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666))?;
    let limit = u64::from(s.config.agent.step_limit);
    let journal = Arc::new(Mutex::new(Journal { dir: calls, next: 0, limit, resend_unknown }));
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(PROVIDER_TIMEOUT)).http_status_as_error(false).build().into();
    let base = s.config.model.base_url.trim_end_matches('/');
    let provider = Arc::new(Provider {
        url: format!("{base}/chat/completions"),
        bearer: format!("Bearer {credential}"),
        model: s.config.model.name.clone(),
        agent,
    });
    println!("ready");
    std::io::stdout().flush()?;
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ = respond(&mut conn, 503, &error_body("too many connections to the model gateway"));
            continue;
        }
        let (journal, provider, active) = (journal.clone(), provider.clone(), active.clone());
        std::thread::spawn(move || {
            let _ = handle(conn, &journal, &provider);
            active.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

fn error_body(message: &str) -> Vec<u8> {
    json!({"error": {"message": message, "type": "chio_gateway"}}).to_string().into_bytes()
}

fn handle(conn: UnixStream, journal: &Mutex<Journal>, provider: &Provider) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut out = conn.try_clone()?;
    let (status, body) = match read_request(conn) {
        Ok(body) => match journal.lock() {
            Ok(mut j) => call(&mut j, provider, &body).unwrap_or_else(|e| (500, error_body(&e.to_string()))),
            Err(_) => (500, error_body("the gateway's journal is poisoned")),
        },
        Err((status, message)) => (status, error_body(&message)),
    };
    respond(&mut out, status, &body)
}

/// Read one HTTP/1.1 request: only `POST …/chat/completions` with a Content-Length body.
fn read_request(conn: UnixStream) -> Result<Vec<u8>, (u16, String)> {
    let mut r = BufReader::new(conn.take((MAX_HEAD_BYTES + MAX_BODY_BYTES) as u64));
    let mut head_bytes = 0;
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).map_err(|e| (400, format!("reading the request: {e}")))?;
        head_bytes += n;
        if n == 0 || head_bytes > MAX_HEAD_BYTES {
            return Err((400, "an incomplete or oversized request head".into()));
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    let request_line = lines.first().cloned().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "POST" || !path.ends_with("/chat/completions") {
        return Err((404, format!("the gateway serves POST …/chat/completions only, not {method} {path}")));
    }
    let mut length = None;
    for h in &lines[1..] {
        let Some((name, value)) = h.split_once(':') else { continue };
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse::<usize>().ok(),
            "transfer-encoding" => return Err((501, "chunked request bodies are not served".into())),
            _ => {}
        }
    }
    let length = length.ok_or((411, "a request without Content-Length".to_string()))?;
    if length > MAX_BODY_BYTES {
        return Err((413, format!("a request body of {length} bytes (at most {MAX_BODY_BYTES})")));
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).map_err(|e| (400, format!("reading the request body: {e}")))?;
    Ok(body)
}

fn respond(out: &mut UnixStream, status: u16, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        403 => "Forbidden",
        404 => "Not Found",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    out.write_all(head.as_bytes())?;
    out.write_all(body)?;
    out.flush()
}

/// One model call: from the journal when it holds this call, else from the provider (journaled
/// before it is answered).
fn call(j: &mut Journal, provider: &Provider, body: &[u8]) -> Result<(u16, Vec<u8>), RepoError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| RepoError::Usage(format!("the request is not JSON: {e}")))?;
    if value["model"].as_str() != Some(provider.model.as_str()) {
        return Ok((403, error_body(&format!("the session calls model {:?} only", provider.model))));
    }
    if let Err(refusal) = check_members(&value) {
        return Ok((403, error_body(&refusal)));
    }
    let digest = crate::repository::workspace::json_digest(&value)?;
    let n = j.next;
    if let Some(done) = j.load(n)? {
        if done.request_sha256 != digest {
            // 403: mini-swe-agent gives up at once instead of retrying.
            return Ok((
                403,
                error_body(&format!(
                    "model call {n} differs from the one this session journaled: the run diverged from its journal"
                )),
            ));
        }
        j.next += 1;
        return Ok((done.status, done.response.into_bytes()));
    }
    if n >= j.limit {
        return Ok((403, error_body(&format!("the session's step limit of {} model calls is reached", j.limit))));
    }
    if j.sent_path(n).exists() {
        if !j.resend_unknown {
            // 403: mini-swe-agent gives up at once instead of retrying.
            return Ok((
                403,
                error_body(&format!(
                    "model call {n} was sent to the provider and its outcome is unknown (it may have been done and \
                     billed): it is not sent again; the operator decides (chio session run --resend-unknown)"
                )),
            ));
        }
        // The operator's choice, recorded with the request that was unknown.
        let was: JournaledSend = serde_json::from_slice(&fs::read(j.sent_path(n))?)
            .map_err(|e| RepoError::Mismatch(format!("model call {n}'s send record: {e}")))?;
        j.record(&j.resent_path(n), n, &was.request_sha256)?;
    }
    // Journaled before it is sent: a crash from here on leaves the call's outcome unknown.
    j.record(&j.sent_path(n), n, &digest)?;
    // What was checked is what is sent: the parsed request written again, never the worker's
    // bytes. A body naming `model` twice passed the check with its last value while a provider
    // that keeps the first would have run the other model.
    let checked = serde_json::to_vec(&value).map_err(|e| RepoError::Failed(e.to_string()))?;
    let answer = provider
        .agent
        .post(&provider.url)
        .header("Authorization", &provider.bearer)
        .header("Content-Type", "application/json")
        .send(&checked[..]);
    let mut answer = match answer {
        Ok(a) => a,
        Err(e) => {
            // Never connected: known not sent. Any other failure may have come after the
            // provider took the request: its outcome stays unknown.
            let refused_at_once =
                matches!(&e, ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused);
            if refused_at_once || matches!(e, ureq::Error::ConnectionFailed | ureq::Error::HostNotFound) {
                fs::remove_file(j.sent_path(n))?;
            }
            return Ok((502, error_body(&format!("the provider could not be reached: {e}"))));
        }
    };
    let status = answer.status().as_u16();
    let text = answer
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER_BYTES)
        .read_to_string()
        .map_err(|e| RepoError::Failed(format!("reading the provider's answer: {e}")))?;
    if (200..300).contains(&status) {
        let entry = JournaledCall { ordinal: n, request_sha256: digest, status, response: text.clone() };
        let bytes = serde_json::to_vec(&entry).map_err(|e| RepoError::Failed(e.to_string()))?;
        write_durably(&j.path(n), &bytes)?;
        j.next += 1;
    }
    // Answered (or refused by the provider, which may be asked again): no longer unknown.
    fs::remove_file(j.sent_path(n))?;
    Ok((status, text.into_bytes()))
}

/// Refuse a request with a member the gateway does not forward (`FORWARDED`); `n` and `stream`
/// pass only at their defaults (one answer, not streamed).
fn check_members(request: &Value) -> Result<(), String> {
    // A body that is no object named no model: refused before this.
    for (name, value) in request.as_object().into_iter().flatten() {
        let default = match name.as_str() {
            "n" => value.as_u64() == Some(1),
            "stream" => value.as_bool() == Some(false),
            other => FORWARDED.contains(&other),
        };
        if !default {
            return Err(format!(
                "the gateway does not forward {name:?} = {value}: one answer of the session's model a call, \
                 with the sampling, token and tool members only"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider at `port` on loopback for the session's model `m`.
    fn provider(port: u16) -> Provider {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        Provider {
            url: format!("http://127.0.0.1:{port}/v1/chat/completions"),
            bearer: "Bearer k".into(),
            model: "m".into(),
            agent,
        }
    }

    /// An empty directory for one test, below the workspace's target directory.
    fn unit_dir(tag: &str) -> PathBuf {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/unit-tmp").join(tag);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// What a worker sends, read as the gateway reads it (a socket pair, the sender closing).
    fn read(raw: &[u8]) -> Result<Vec<u8>, (u16, String)> {
        let (mut worker, gateway) = UnixStream::pair().unwrap();
        let raw = raw.to_vec();
        let sender = std::thread::spawn(move || {
            let _ = worker.write_all(&raw);
        });
        let got = read_request(gateway);
        sender.join().unwrap();
        got
    }

    /// The one request the gateway serves is read whole; anything else is answered with the
    /// status that names what is wrong, and no body is read past its bounds.
    #[test]
    fn requests_it_cannot_serve_are_answered_by_status() {
        let post = |head: &str, body: &str| format!("POST /v1/chat/completions HTTP/1.1\r\n{head}\r\n{body}");
        let ok = post("Content-Length: 2\r\n", "{}");
        assert_eq!(read(ok.as_bytes()), Ok(b"{}".to_vec()));
        let code = |raw: &[u8]| read(raw).map_err(|e| e.0).err();
        assert_eq!(code(b"GET /v1/chat/completions HTTP/1.1\r\n\r\n"), Some(404));
        assert_eq!(code(b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"), Some(404));
        assert_eq!(code(post("", "{}").as_bytes()), Some(411));
        assert_eq!(code(post("Transfer-Encoding: chunked\r\n", "2\r\n{}\r\n0\r\n\r\n").as_bytes()), Some(501));
        let over = format!("Content-Length: {}\r\n", MAX_BODY_BYTES + 1);
        assert_eq!(code(post(&over, "").as_bytes()), Some(413));
        let at = format!("Content-Length: {MAX_BODY_BYTES}\r\n");
        assert_eq!(code(post(&at, "{}").as_bytes()), Some(400), "a body cut short of its length");
        // A head past its bound, and one that never ends.
        let long = format!("X-Pad: {}\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(code(post(&long, "").as_bytes()), Some(400));
        assert_eq!(code(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n"), Some(400));
    }

    /// A request for another model than the session's is refused before anything reaches the
    /// provider or the journal (the provider here is unreachable: a call would fail otherwise).
    #[test]
    fn only_the_sessions_model_is_called() {
        let dir = unit_dir("gateway-model");
        let mut j = Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown: false };
        let provider = provider(9);
        let (status, body) = call(&mut j, &provider, br#"{"model":"expensive","messages":[]}"#).unwrap();
        assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));
        assert!(String::from_utf8_lossy(&body).contains("the session calls model"));
        assert_eq!((j.next, fs::read_dir(&dir).unwrap().count()), (0, 0), "nothing journaled");
        // The session's own model goes on to the provider (unreachable here: 502, not journaled).
        let (status, _) = call(&mut j, &provider, br#"{"model":"m","messages":[]}"#).unwrap();
        assert_eq!((status, j.next), (502, 0));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A request asking for more than one answer of the session's model, or naming a member the
    /// gateway does not forward, is refused by name before anything reaches the provider or the
    /// journal; the same members at their defaults, and the sampling ones, go on.
    #[test]
    fn only_one_answer_of_the_model_is_asked_for() {
        let dir = unit_dir("gateway-members");
        let mut j = Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown: false };
        let provider = provider(9);
        for (extra, named) in [
            (r#""n":8"#, "\"n\""),
            (r#""n":"1""#, "\"n\""),
            (r#""stream":true"#, "\"stream\""),
            (r#""service_tier":"priority""#, "\"service_tier\""),
            (r#""store":true"#, "\"store\""),
            (r#""web_search_options":{}"#, "\"web_search_options\""),
        ] {
            let body = format!(r#"{{"model":"m","messages":[],{extra}}}"#);
            let (status, answer) = call(&mut j, &provider, body.as_bytes()).unwrap();
            let answer = String::from_utf8_lossy(&answer);
            assert_eq!(status, 403, "{extra}: {answer}");
            assert!(answer.contains(&format!("does not forward {}", named.replace('"', "\\\""))), "{extra}: {answer}");
        }
        assert_eq!((j.next, fs::read_dir(&dir).unwrap().count()), (0, 0), "nothing journaled");
        // Defaults and sampling members go on to the (unreachable) provider: 502.
        let body = br#"{"model":"m","messages":[],"tools":[],"n":1,"stream":false,"temperature":0,"max_tokens":9}"#;
        let (status, _) = call(&mut j, &provider, body).unwrap();
        assert_eq!(status, 502);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The provider gets the request as checked: a body naming `model` twice (the check reads
    /// the last) reaches it with that model alone, not with the first a provider might keep.
    #[test]
    fn the_provider_gets_the_request_as_checked() {
        use std::net::TcpListener;
        let dir = unit_dir("gateway-checked");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let provider_side = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; length];
            r.read_exact(&mut body).unwrap();
            let answer = br#"{"choices":[]}"#;
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", answer.len());
            let mut w = conn;
            w.write_all(head.as_bytes()).unwrap();
            w.write_all(answer).unwrap();
            body
        });
        let mut j = Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown: false };
        let provider = provider(port);
        let (status, _) = call(&mut j, &provider, br#"{"model":"expensive","messages":[],"model":"m"}"#).unwrap();
        assert_eq!(status, 200);
        let sent = String::from_utf8(provider_side.join().unwrap()).unwrap();
        assert_eq!(sent.matches("\"model\"").count(), 1, "{sent}");
        assert!(!sent.contains("expensive"), "{sent}");
        // The answer was journaled as call 0 before it was given, and the next call is 1.
        let journaled = j.load(0).unwrap().expect("call 0 journaled");
        assert_eq!((journaled.status, journaled.response.as_str(), j.next), (200, r#"{"choices":[]}"#, 1));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A journaled call is answered from the journal — the provider (unreachable here) is not
    /// asked — only for the very request journaled: another request at that place is refused
    /// as a run diverging from its journal. Past the journal, calls go to the provider.
    #[test]
    fn the_journal_answers_only_the_request_it_holds() {
        let dir = unit_dir("gateway-journal");
        let asked = br#"{"model":"m","messages":[{"role":"user","content":"fix it"}]}"#;
        let digest =
            crate::repository::workspace::json_digest(&serde_json::from_slice::<Value>(asked).unwrap()).unwrap();
        let entry = JournaledCall { ordinal: 0, request_sha256: digest, status: 200, response: "journaled".into() };
        let journal = || Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown: false };
        fs::write(journal().path(0), serde_json::to_vec(&entry).unwrap()).unwrap();
        let provider = provider(9);
        let mut j = journal();
        assert_eq!(call(&mut j, &provider, asked).unwrap(), (200, b"journaled".to_vec()));
        assert_eq!(j.next, 1);
        // Call 1 is not journaled: the provider is asked (unreachable: 502), nothing journaled.
        assert_eq!(call(&mut j, &provider, asked).unwrap().0, 502);
        assert_eq!((j.next, j.load(1).unwrap().is_none()), (1, true));
        // A rerun that asks something else at call 0 is refused, and stays at call 0.
        let mut j = journal();
        let (status, body) = call(&mut j, &provider, br#"{"model":"m","messages":[]}"#).unwrap();
        assert_eq!((status, j.next), (403, 0));
        assert!(String::from_utf8_lossy(&body).contains("differs from the one this session journaled"));
        // A journal entry that is not one is an error, not an answer.
        fs::write(journal().path(0), b"{").unwrap();
        assert!(call(&mut journal(), &provider, asked).is_err());
        // Nor is one that cannot be read taken for a call never journaled (which would send it
        // to the provider again): an error, and nothing recorded as sent.
        fs::remove_file(journal().path(0)).unwrap();
        fs::create_dir(journal().path(0)).unwrap();
        assert!(call(&mut journal(), &provider, asked).is_err());
        assert!(!journal().sent_path(0).exists(), "an unreadable journal entry was sent again");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A call journaled as sent and never answered has an unknown outcome: it is never sent
    /// again on its own (refused, named, the journal unchanged), and with the operator's
    /// `resend_unknown` it is sent again with the choice recorded. A call that never reached the
    /// provider (no connection) is known not sent: nothing is left unknown.
    #[test]
    fn a_call_of_unknown_outcome_is_never_sent_again_unasked() {
        let dir = unit_dir("gateway-unknown");
        let asked = br#"{"model":"m","messages":[{"role":"user","content":"fix it"}]}"#;
        let provider = provider(9);
        let journal = |resend_unknown| Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown };
        // Not reached: no send record left behind.
        assert_eq!(call(&mut journal(false), &provider, asked).unwrap().0, 502);
        assert_eq!(unknown_call(&dir).unwrap(), None);
        // Sent before a crash, never answered.
        journal(false).record(&journal(false).sent_path(0), 0, "earlier").unwrap();
        assert_eq!(unknown_call(&dir).unwrap(), Some(0));
        let (status, body) = call(&mut journal(false), &provider, asked).unwrap();
        assert_eq!(status, 403);
        assert!(String::from_utf8_lossy(&body).contains("outcome is unknown"), "{}", String::from_utf8_lossy(&body));
        assert_eq!(unknown_call(&dir).unwrap(), Some(0), "still unknown, not sent");
        assert!(!journal(false).resent_path(0).exists());
        // The operator's choice: sent again (unreachable here) and recorded.
        assert_eq!(call(&mut journal(true), &provider, asked).unwrap().0, 502);
        let resent: JournaledSend = serde_json::from_slice(&fs::read(journal(true).resent_path(0)).unwrap()).unwrap();
        assert_eq!((resent.ordinal, resent.request_sha256.as_str()), (0, "earlier"));
        assert_eq!(unknown_call(&dir).unwrap(), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
