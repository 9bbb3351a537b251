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

use super::config::{Budget, Grant};
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
    /// What the call cost in µUSD under the session's budget: its `usage` priced, or (an answer
    /// without `usage`) the worst case it was admitted under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_microusd: Option<u64>,
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
    /// The budget and the grant's limits, and where refusals are signed.
    rules: Rules,
}

/// What the gateway holds calls to beyond the step limit.
#[derive(Default)]
struct Rules {
    budget: Option<Budget>,
    grant: Grant,
    /// Where each refusal is signed: the session's `model-receipts.db`, with the kernel seed.
    denials: Option<(PathBuf, PathBuf)>,
    /// µUSD spent by the calls journaled so far.
    spent: u64,
    /// Requests sent to the provider so far (the `attempts` file).
    attempts: u64,
}

/// The session's model spend: the journaled calls' costs, in µUSD.
pub fn spent(calls: &std::path::Path) -> Result<u64, RepoError> {
    let mut total = 0u64;
    let entries = match fs::read_dir(calls) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    for e in entries {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "json") {
            let call: JournaledCall = serde_json::from_slice(&fs::read(&path)?)
                .map_err(|e| RepoError::Mismatch(format!("{}: {e}", path.display())))?;
            total = total.saturating_add(call.cost_microusd.unwrap_or(0));
        }
    }
    Ok(total)
}

/// Requests sent to the provider so far in the session.
pub fn attempts(calls: &std::path::Path) -> Result<u64, RepoError> {
    match fs::read_to_string(calls.join("attempts")) {
        Ok(t) => t.trim().parse().map_err(|_| RepoError::Mismatch(format!("{}/attempts: {t:?}", calls.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// The first model call of the journal in `calls` that was sent and never answered: its outcome
/// is unknown.
pub fn unknown_call(calls: &std::path::Path) -> Result<Option<u64>, RepoError> {
    let sent = journaled(calls, ".sent").map_err(|e| match e {
        RepoError::Failed(m) => RepoError::Failed(format!("{m}: a call of unknown outcome may be in it")),
        e => e,
    })?;
    Ok(sent.into_iter().find(|n| !calls.join(format!("{n:06}.json")).exists()))
}

/// The call numbers of the journal in `calls` recorded as `NNNNNN<suffix>`, in order (none when
/// there is no journal yet).
fn journaled(calls: &std::path::Path, suffix: &str) -> Result<Vec<u64>, RepoError> {
    let unreadable = |e| RepoError::Failed(format!("the model call journal {} cannot be read ({e})", calls.display()));
    let entries = match fs::read_dir(calls) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(unreadable(e)),
    };
    let mut found = Vec::new();
    for e in entries {
        let name = e.map_err(unreadable)?.file_name();
        if let Some(n) = name.to_str().and_then(|n| n.strip_suffix(suffix)).and_then(|n| n.parse::<u64>().ok()) {
            found.push(n);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// The calls of the journal in `calls` that were sent again after their outcome was unknown
/// (`NNNNNN.resent`), in order.
pub fn resent_calls(calls: &std::path::Path) -> Result<Vec<u64>, RepoError> {
    journaled(calls, ".resent")
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
    let grant = s.check_authorized()?.grant;
    let calls = s.calls_dir();
    fs::create_dir_all(&calls)?;
    let settings = crate::repository::workspace::read_settings(&s.workspace_dir())?;
    let rules = Rules {
        budget: s.config.model.budget.clone(),
        grant,
        denials: Some((s.dir.join("model-receipts.db"), settings.kernel_key)),
        spent: spent(&calls)?,
        attempts: attempts(&calls)?,
    };
    let socket = s.dir.join("run").join("model.sock");
    let _ = fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    // Only the worker's cage can reach this path (STATE is root's, 0700); the worker runs as an
    // unprivileged uid and must be able to connect.
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666))?;
    let limit = u64::from(s.config.agent.step_limit);
    let journal = Arc::new(Mutex::new(Journal { dir: calls, next: 0, limit, resend_unknown, rules }));
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
    let mut value = value;
    if let Some(refusal) = cap_output(&mut value, j.rules.budget.as_ref()) {
        return Ok(deny(j, "max_output_tokens", &refusal));
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
    if let Some(ended) = j.rules.grant.expired(chio_kernel::time::now_ms()) {
        return Ok(deny(j, "not_after", &ended));
    }
    if let Some(max) = j.rules.grant.max_calls.filter(|m| n >= *m) {
        return Ok(deny(j, "max_calls", &format!("the operator granted {max} model call(s) and {n} were made")));
    }
    if let Some(max) = j.rules.grant.max_attempts.filter(|m| j.rules.attempts >= *m) {
        let sent = j.rules.attempts;
        return Ok(deny(
            j,
            "max_attempts",
            &format!("the operator granted {max} request(s) to the provider and {sent} were sent"),
        ));
    }
    // The worst this call can cost: every byte of the request a prompt token (a token is at
    // least a byte), every completion token allowed used.
    let worst = j.rules.budget.as_ref().map(|b| b.cost(body.len() as u64, b.max_output_tokens));
    if let (Some(b), Some(worst)) = (&j.rules.budget, worst) {
        if j.rules.spent.saturating_add(worst) > b.max_cost_microusd {
            let spent = j.rules.spent;
            return Ok(deny(
                j,
                "max_cost_microusd",
                &format!(
                    "{spent} µUSD spent and this call may cost up to {worst} µUSD: the session's ceiling is {} µUSD",
                    b.max_cost_microusd
                ),
            ));
        }
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
    // Journaled before it is sent: a crash from here on leaves the call's outcome unknown. Counted
    // as an attempt first: one that crashed after counting was perhaps sent.
    j.rules.attempts += 1;
    write_durably(&j.dir.join("attempts"), j.rules.attempts.to_string().as_bytes())?;
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
        let cost = j.rules.budget.as_ref().map(|b| {
            let usage: Option<(u64, u64)> = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| Some((v["usage"]["prompt_tokens"].as_u64()?, v["usage"]["completion_tokens"].as_u64()?)));
            usage.map_or(worst.unwrap_or(0), |(p, c)| b.cost(p, c))
        });
        j.rules.spent = j.rules.spent.saturating_add(cost.unwrap_or(0));
        let entry =
            JournaledCall { ordinal: n, request_sha256: digest, status, response: text.clone(), cost_microusd: cost };
        let bytes = serde_json::to_vec(&entry).map_err(|e| RepoError::Failed(e.to_string()))?;
        write_durably(&j.path(n), &bytes)?;
        j.next += 1;
    }
    // Answered (or refused by the provider, which may be asked again): no longer unknown.
    fs::remove_file(j.sent_path(n))?;
    Ok((status, text.into_bytes()))
}

/// Hold the request to the budget's output cap: one asking for more is refused (the words
/// returned); one naming no cap is sent asking for the budget's (`max_tokens`).
fn cap_output(request: &mut Value, budget: Option<&Budget>) -> Option<String> {
    let b = budget?;
    let mut named = false;
    for member in ["max_tokens", "max_completion_tokens"] {
        match &request[member] {
            Value::Null => {}
            v => match v.as_u64() {
                Some(asked) if asked <= b.max_output_tokens => named = true,
                _ => {
                    return Some(format!(
                        "{member} {v}: the session's budget allows at most {} completion tokens a call",
                        b.max_output_tokens
                    ))
                }
            },
        }
    }
    if !named {
        request["max_tokens"] = json!(b.max_output_tokens);
    }
    None
}

/// A refusal under `rule`: a signed denial in the session's `model-receipts.db` naming the rule
/// and why, then the 403 the worker gets (naming both). A denial that cannot be signed still
/// refuses, and says so.
fn deny(j: &Journal, rule: &str, why: &str) -> (u16, Vec<u8>) {
    let receipt = match &j.rules.denials {
        Some((db, seed)) => sign_denial(db, seed, rule, why, j.next)
            .map_or_else(|e| format!("its denial could not be signed: {e}"), |id| format!("denial receipt {id}")),
        None => "no receipt store".into(),
    };
    (403, error_body(&format!("refused by the session's {rule}: {why} ({receipt})")))
}

fn sign_denial(
    db: &std::path::Path,
    seed: &std::path::Path,
    rule: &str,
    why: &str,
    call: u64,
) -> Result<String, String> {
    let mut r = crate::launch::receipts::LaunchReceipts::open(db, seed).map_err(|e| e.to_string())?;
    r.model_denial(rule, why, call)
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
        let mut j = Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown: false, rules: Rules::default() };
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
        let mut j = Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown: false, rules: Rules::default() };
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
        let mut j = Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown: false, rules: Rules::default() };
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
        let entry = JournaledCall {
            ordinal: 0,
            request_sha256: digest,
            status: 200,
            response: "journaled".into(),
            cost_microusd: None,
        };
        let journal =
            || Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown: false, rules: Rules::default() };
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
        let journal =
            |resend_unknown| Journal { dir: dir.clone(), next: 0, limit: 4, resend_unknown, rules: Rules::default() };
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

    /// Rules with a budget (1 µUSD a token either way, `cap` completion tokens a call, a
    /// `ceiling`) and `grant`, refusals signed into `dir/denials.db` with a key made here.
    fn rules(dir: &std::path::Path, cap: u64, ceiling: u64, grant: Grant) -> Rules {
        let seed = dir.join("kernel.seed");
        if !seed.exists() {
            chio_kernel::keys::write_seed(&seed, &chio_kernel::keys::generate().unwrap()).unwrap();
        }
        Rules {
            budget: Some(Budget {
                input_microusd_per_mtok: 1_000_000,
                output_microusd_per_mtok: 1_000_000,
                max_output_tokens: cap,
                max_cost_microusd: ceiling,
            }),
            grant,
            denials: Some((dir.join("denials.db"), seed)),
            spent: 0,
            attempts: 0,
        }
    }

    /// The denials signed into `dir/denials.db`: (rule, model call) each.
    fn denials(dir: &std::path::Path) -> Vec<(String, u64)> {
        let store = chio_kernel::store::Store::open_read_only(&dir.join("denials.db")).unwrap();
        let rows = store.list(&chio_kernel::store::Filter { limit: 100, ..Default::default() }).unwrap();
        rows.iter()
            .map(|r| {
                let v: Value = serde_json::from_str(&r.envelope).unwrap();
                let d = &v["body"]["detail"];
                (d["rule"].as_str().unwrap().to_string(), d["model_call"].as_u64().unwrap())
            })
            .collect()
    }

    /// Each budget and grant limit refuses the call that could pass it, before the provider or
    /// the journal sees it, with a signed denial naming the rule; below them the call goes on.
    #[test]
    fn budgets_and_the_grant_refuse_with_a_signed_denial() {
        let dir = unit_dir("gateway-budget");
        let provider = provider(9);
        let asked = br#"{"model":"m","messages":[]}"#;
        let journal = |rules| Journal { dir: dir.clone(), next: 0, limit: 8, resend_unknown: false, rules };
        let refused = |j: &mut Journal, body: &[u8], rule: &str| {
            let (status, answer) = call(j, &provider, body).unwrap();
            let answer = String::from_utf8_lossy(&answer).into_owned();
            assert_eq!(status, 403, "{rule}: {answer}");
            assert!(
                answer.contains(&format!("refused by the session's {rule}")) && answer.contains("denial receipt"),
                "{answer}"
            );
            assert_eq!(
                fs::read_dir(&dir)
                    .unwrap()
                    .flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "sent"))
                    .count(),
                0
            );
        };
        // Asking for more completion tokens than the cap.
        let mut j = journal(rules(&dir, 100, 1_000, Grant::default()));
        refused(&mut j, br#"{"model":"m","messages":[],"max_tokens":101}"#, "max_output_tokens");
        refused(&mut j, br#"{"model":"m","messages":[],"max_completion_tokens":"9"}"#, "max_output_tokens");
        // The worst case past the ceiling: 990 spent, 27 bytes and 100 tokens may cost 127.
        j.rules.spent = 990;
        refused(&mut j, asked, "max_cost_microusd");
        // Within it: goes on (to the unreachable provider), counted as an attempt.
        j.rules.spent = 0;
        assert_eq!(call(&mut j, &provider, asked).unwrap().0, 502);
        assert_eq!((j.rules.attempts, attempts(&dir).unwrap()), (1, 1));
        // The grant: attempts, calls, lifetime.
        let grant = Grant { max_attempts: Some(1), ..Grant::default() };
        let mut j = journal(rules(&dir, 100, 1_000_000, grant));
        j.rules.attempts = 1;
        refused(&mut j, asked, "max_attempts");
        let mut j = journal(rules(&dir, 100, 1_000_000, Grant { max_calls: Some(0), ..Grant::default() }));
        refused(&mut j, asked, "max_calls");
        let ended = Grant { not_after: Some("2020-01-01T00:00:00.000Z".into()), ..Grant::default() };
        let mut j = journal(rules(&dir, 100, 1_000_000, ended));
        refused(&mut j, asked, "not_after");
        let open = Grant {
            not_after: Some(chio_kernel::time::rfc3339(chio_kernel::time::now_ms() + 60_000)),
            ..Grant::default()
        };
        let mut j = journal(rules(&dir, 100, 1_000_000, open));
        assert_eq!(call(&mut j, &provider, asked).unwrap().0, 502);
        let signed = denials(&dir);
        let rules: Vec<&str> = signed.iter().map(|d| d.0.as_str()).collect();
        let each =
            ["max_output_tokens", "max_output_tokens", "max_cost_microusd", "max_attempts", "max_calls", "not_after"];
        assert_eq!(rules, each, "one signed denial a refusal");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A call naming no cap is sent asking for the budget's; one within it keeps its own.
    #[test]
    fn a_call_is_sent_asking_for_the_cap_at_most() {
        let b = Budget {
            input_microusd_per_mtok: 0,
            output_microusd_per_mtok: 0,
            max_output_tokens: 64,
            max_cost_microusd: 1,
        };
        let mut v = json!({"model": "m"});
        assert_eq!(cap_output(&mut v, Some(&b)), None);
        assert_eq!(v["max_tokens"], 64);
        let mut v = json!({"model": "m", "max_completion_tokens": 10});
        assert_eq!(cap_output(&mut v, Some(&b)), None);
        assert_eq!((&v["max_completion_tokens"], &v["max_tokens"]), (&json!(10), &Value::Null));
        let mut v = json!({"model": "m"});
        assert_eq!(cap_output(&mut v, None), None);
        assert_eq!(v, json!({"model": "m"}), "no budget, no cap");
        // Prices round up: a token at 0.4 µUSD costs 1.
        let b = Budget { input_microusd_per_mtok: 400_000, ..b };
        assert_eq!((b.cost(1, 0), b.cost(5, 0), b.cost(0, 0)), (1, 2, 0));
    }
}
