//! The daemon's I/O: accept, map the peer to a role, read one request line (bounded in size and
//! time) with its descriptors, hand launches to the launcher, answer. A launch holds a slot of
//! `max_launches` and one of its uid's `max_launches_per_client`; a connection a slot of
//! `max_connections` and one of its uid's `max_connections_per_client`. A connection or a launch
//! over its uid's share is answered "try again" at once, so a slow or hostile client holds at
//! most its own share and never stalls the others.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use chio_kernel::journal::Begin;
use chio_kernel::store::Store;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Semaphore;

use super::config::{Config, Role};
use super::job::{DaemonSide, Job};
use super::launcher::Launcher;
use super::wire::{self, Request, MAX_FDS, MAX_REQUEST_BYTES};

/// The daemon's keys in the journal: `supervisor:<peer uid>:<request id>`.
const JOURNAL_PREFIX: &str = "supervisor:";
/// The longest answer a launch child may give (a launch record is a few KiB).
const MAX_ANSWER_BYTES: u64 = 4 << 20;

struct Shared {
    journal: Arc<Mutex<Store>>,
    /// Per client uid: (connections open, launches running).
    per_client: Mutex<HashMap<u32, (usize, usize)>>,
    config: Config,
    daemon: DaemonSide,
    launcher: Launcher,
    launches: Semaphore,
    connections: Arc<Semaphore>,
    /// Launches running, and launch answers still being journaled (a stop waits for both).
    running: Arc<AtomicUsize>,
}

/// Serve until SIGTERM or SIGINT; then stop accepting, give running launches the stop grace,
/// and kill what is left.
pub async fn run(
    listener: std::os::unix::net::UnixListener,
    path: &Path,
    config: Config,
    daemon: DaemonSide,
    launcher: Launcher,
) -> Result<i32> {
    let listener = UnixListener::from_std(listener)?;
    // The daemon's one connection to its store, for the request journal (opened after the
    // launcher is forked: no launch child inherits it).
    let store = Store::open(&daemon.receipt_db, true).context("the supervisor's store")?;
    store.defer_sync()?;
    // Point lookups by key need little cache: a bounded one keeps the daemon's size flat.
    store.connection().execute_batch("PRAGMA cache_size=-256;").context("the supervisor's store")?;
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    let shared = Arc::new(Shared {
        journal: Arc::new(Mutex::new(store)),
        per_client: Mutex::new(HashMap::new()),
        launches: Semaphore::new(config.max_launches),
        connections: Arc::new(Semaphore::new(config.max_connections)),
        running: Arc::new(AtomicUsize::new(0)),
        config,
        daemon,
        launcher,
    });
    eprintln!("chio supervisor: listening on {}", path.display());
    chio_supervisor::service::notify(&format!("READY=1\nSTATUS=listening on {}", path.display()));
    let mut prune = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = prune.tick() => prune_journal(&shared).await,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => { tokio::spawn(connection(shared.clone(), stream)); }
                Err(e) => eprintln!("chio supervisor: accept: {e}"),
            },
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(path);
    let grace = Duration::from_secs(shared.config.stop_grace_s);
    let running = shared.running.load(Ordering::SeqCst);
    chio_supervisor::service::notify(&format!("STOPPING=1\nSTATUS=stopping: {running} launch(es) running"));
    eprintln!("chio supervisor: stopping: {running} launch(es) get {} s to finish", grace.as_secs());
    if !drained(&shared, grace).await {
        eprintln!("chio supervisor: the stop grace is over: killing the launches still running");
        shared.launcher.kill_all()?;
        drained(&shared, Duration::from_secs(5)).await;
    }
    Ok(0)
}

/// Forget settled requests older than the retention (at start, then hourly).
async fn prune_journal(s: &Shared) {
    let keep = i64::try_from(s.config.journal_retention_s.saturating_mul(1000)).unwrap_or(i64::MAX);
    let before = chio_kernel::time::now_ms().saturating_sub(keep);
    match journal(s, move |st| st.op_prune(JOURNAL_PREFIX, before)).await {
        Ok(0) => {}
        Ok(n) => eprintln!("chio supervisor: forgot {n} settled request(s) older than the journal's retention"),
        Err(e) => eprintln!("chio supervisor: pruning the journal: {e}"),
    }
}

async fn drained(s: &Shared, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while s.running.load(Ordering::SeqCst) > 0 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Which of a client's shares a [`Share`] holds.
#[derive(Clone, Copy)]
enum Kind {
    Connection,
    Launch,
}

/// One unit of a client uid's share, given back on drop.
struct Share<'a> {
    s: &'a Shared,
    uid: u32,
    kind: Kind,
}

impl Shared {
    /// Take one of `uid`'s connections or launches, or None when it holds its limit.
    fn share(&self, uid: u32, kind: Kind) -> Option<Share<'_>> {
        let mut m = self.per_client.lock().ok()?;
        let e = m.entry(uid).or_insert((0, 0));
        let (held, limit) = match kind {
            Kind::Connection => (&mut e.0, self.config.max_connections_per_client),
            Kind::Launch => (&mut e.1, self.config.max_launches_per_client),
        };
        if *held >= limit {
            return None;
        }
        *held += 1;
        Some(Share { s: self, uid, kind })
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.s.per_client.lock() {
            if let Some(e) = m.get_mut(&self.uid) {
                match self.kind {
                    Kind::Connection => e.0 -= 1,
                    Kind::Launch => e.1 -= 1,
                }
                if *e == (0, 0) {
                    m.remove(&self.uid);
                }
            }
        }
    }
}

fn refusal(id: Option<&str>, why: String, exit_code: i32) -> Value {
    json!({"id": id, "error": why, "exit_code": exit_code})
}

/// An answer: built here, or a launch's own JSON object passed through as it came (a launch
/// record is a few KiB; decoding and encoding it again cost the round trip ~0.1 ms).
enum Answer {
    Built(Value),
    Passed(String),
}

impl Answer {
    /// The answer's text with `id` as its first member.
    fn with_id(self, id: &str) -> String {
        match self {
            Answer::Built(mut v) => {
                v["id"] = json!(id);
                v.to_string()
            }
            Answer::Passed(text) => {
                let rest = text.trim_start().strip_prefix('{').unwrap_or("}").trim_start();
                let sep = if rest.starts_with('}') { "" } else { "," };
                format!("{{\"id\":{}{sep}{rest}", json!(id))
            }
        }
    }
}

/// What the daemon reads of a launch's answer: the status and state for its log. Decoding into
/// it also proves the answer is one JSON object.
#[derive(serde::Deserialize)]
struct Summary {
    #[serde(default)]
    exit_status: Option<Value>,
    #[serde(default)]
    exit_code: Option<Value>,
    #[serde(default)]
    record: Option<RecordSummary>,
}

#[derive(serde::Deserialize)]
struct RecordSummary {
    #[serde(default)]
    state: Option<String>,
}

async fn connection(s: Arc<Shared>, mut stream: UnixStream) {
    let Ok(_slot) = s.connections.clone().try_acquire_owned() else {
        let why = format!("the supervisor is serving its limit of {} connections; try again", s.config.max_connections);
        let _ = reply(&mut stream, &refusal(None, why, 75)).await;
        return;
    };
    let (uid, gid) = match stream.peer_cred() {
        Ok(c) => (c.uid(), c.gid()),
        Err(e) => return eprintln!("chio supervisor: peer credentials: {e}"),
    };
    let Some(role) = s.config.role_of(uid, gid) else {
        let why = format!(
            "uid {uid} (gid {gid}) may not use this supervisor: it is not among the clients of its configuration \
             ({}; without one only root may connect)",
            super::DEFAULT_CONFIG
        );
        let _ = reply(&mut stream, &refusal(None, why, 77)).await;
        return;
    };
    let Some(_share) = s.share(uid, Kind::Connection) else {
        let why = format!(
            "uid {uid} has its limit of {} connections open (max_connections_per_client); try again",
            s.config.max_connections_per_client
        );
        let _ = reply(&mut stream, &refusal(None, why, 75)).await;
        return;
    };
    let timeout = Duration::from_secs(s.config.request_timeout_s);
    loop {
        let (line, fds) = match tokio::time::timeout(timeout, read_request(&stream)).await {
            Ok(Ok(Some(got))) => got,
            Ok(Ok(None)) => return,
            Ok(Err(why)) => return drop(reply(&mut stream, &refusal(None, why, 2)).await),
            Err(_) => {
                let why = format!("no complete request within {} s", timeout.as_secs());
                return drop(reply(&mut stream, &refusal(None, why, 2)).await);
            }
        };
        let req: Request = match serde_json::from_slice(&line) {
            Ok(r) => r,
            Err(e) => return drop(reply(&mut stream, &refusal(None, format!("not a request: {e}"), 2)).await),
        };
        let (answer, settling) = answer(&s, req, fds, Peer { uid, gid, role }).await;
        let replied = reply_text(&mut stream, answer).await;
        // The answer is journaled while it travels; the next request on this connection (and
        // a stop) waits for that.
        if let Some(Err(why)) = settle(settling).await {
            eprintln!("chio supervisor: {why}");
        }
        if replied.is_err() {
            return;
        }
    }
}

/// A launch's answer being written to the journal (see [`dispatch`]).
type Settling = Option<tokio::task::JoinHandle<Result<(), String>>>;

async fn settle(s: Settling) -> Option<Result<(), String>> {
    Some(s?.await.map_err(|e| e.to_string()).and_then(|r| r))
}

/// Who is asking: SO_PEERCRED's uid and gid, and the role they map to.
#[derive(Clone, Copy)]
struct Peer {
    uid: u32,
    gid: u32,
    role: Role,
}

/// The answer line (without its newline) to one request.
async fn answer(s: &Shared, req: Request, fds: Vec<OwnedFd>, peer: Peer) -> (String, Settling) {
    let Peer { uid, role, .. } = peer;
    if req.id.is_empty()
        || req.id.len() > 128
        || !req.id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return (refusal(None, "a request id is 1–128 characters of [A-Za-z0-9._-]".into(), 2).to_string(), None);
    }
    let id = req.id.clone();
    let mut settling = None;
    let a = match req.op.as_str() {
        "ping" if fds.is_empty() => {
            Answer::Built(json!({"version": env!("CARGO_PKG_VERSION"), "role": role.name(), "uid": uid}))
        }
        "repository" if role == Role::Launch => Answer::Built(refusal(
            None,
            format!("uid {uid}: the repository operations need the admin or repository role"),
            77,
        )),
        "launch" | "repository" if fds.len() == req.fds.count() => {
            let (a, journaling) = launch(s, req, fds, peer).await;
            settling = journaling;
            a
        }
        "ping" | "launch" | "repository" => {
            Answer::Built(refusal(None, format!("{} descriptors do not match the request's fds", fds.len()), 2))
        }
        other => Answer::Built(refusal(None, format!("unknown operation {other:?} (ping, launch, repository)"), 2)),
    };
    (a.with_id(&id), settling)
}

async fn launch(s: &Shared, req: Request, fds: Vec<OwnedFd>, peer: Peer) -> (Answer, Settling) {
    let uid = peer.uid;
    let Some(_share) = s.share(uid, Kind::Launch) else {
        let why = format!(
            "uid {uid} has its limit of {} launches running (max_launches_per_client); try again when one ends",
            s.config.max_launches_per_client
        );
        return (Answer::Built(refusal(None, why, 75)), None);
    };
    let Ok(_slot) = s.launches.acquire().await else {
        return (Answer::Built(refusal(None, "the supervisor is stopping".into(), 75)), None);
    };
    s.running.fetch_add(1, Ordering::SeqCst);
    let answer = dispatch(s, req, fds, peer).await;
    s.running.fetch_sub(1, Ordering::SeqCst);
    match answer {
        Ok((a, settling)) => (a, settling),
        Err(why) => (Answer::Built(refusal(None, why, 125)), None),
    }
}

/// Journal the request, hand it to the launcher, and start journaling its answer (returned
/// unawaited: the reply need not wait for it — until it lands, a repeat of the id is told the
/// request is running, and a crash before it leaves the request `outcome_unknown`, never run
/// again). A repeated id gets the retained answer of a finished request and never runs twice.
///
/// The job goes to the launcher while its journal entry is being written: its launch process
/// takes the client's descriptors and parses the arguments meanwhile, but does nothing anyone
/// can see — no output, no file, no cage — until the daemon sends "go", which it does only
/// once the entry has landed. A request the journal refuses (or a daemon that dies first)
/// closes the gate instead, and that launch process exits having done nothing.
async fn dispatch(s: &Shared, req: Request, fds: Vec<OwnedFd>, peer: Peer) -> Result<(Answer, Settling), String> {
    let Peer { uid, gid, role } = peer;
    let value = serde_json::to_value(&req).map_err(|e| e.to_string())?;
    let digest = chio_kernel::canonical::to_canonical(&value)
        .map(|c| chio_kernel::receipt::sha256_hex(c.as_bytes()))
        .map_err(|e| e.to_string())?;
    let key = format!("{JOURNAL_PREFIX}{uid}:{}", req.id);
    let id = req.id.clone();
    let begin = {
        let (key, digest) = (key.clone(), digest.clone());
        journal_started(s.journal.clone(), move |st| st.op_begin_dispatched(&key, &digest))
    };
    let mut daemon = s.daemon.clone();
    daemon.workspaces = s.config.workspaces.iter().filter(|w| w.uid == uid).cloned().collect();
    let job = Job { role: role.name().into(), uid, gid, request: req, daemon };
    let submitted = submit(s, &job, fds);
    match begin.await.map_err(|e| e.to_string())?? {
        Begin::Proceed => {}
        Begin::Retained(answer) => return Ok((Answer::Passed(answer), None)),
        Begin::Conflict { .. } => return Err(format!("request id {id:?} was already used for another request")),
        Begin::InProgress => return Err(format!("request id {id:?} is running")),
        Begin::OutcomeUnknown => {
            return Err(format!(
                "request id {id:?} was dispatched before the supervisor stopped and its outcome is unknown; it is not run again"
            ))
        }
    }
    let bytes = match submitted {
        Ok(gated) => gated.open(&job).await,
        Err(why) => Err(why),
    };
    let text = match bytes {
        Ok(b) => String::from_utf8(b).map_err(|e| format!("the launch's answer is not text: {e}"))?,
        Err(why) => {
            journal(s, move |st| st.op_unknown(&key)).await?;
            return Err(why);
        }
    };
    let summary: Summary =
        serde_json::from_str(&text).map_err(|e| format!("the launch's answer is not a JSON object: {e}"))?;
    let answer = text.clone();
    let (store, running) = (s.journal.clone(), s.running.clone());
    running.fetch_add(1, Ordering::SeqCst);
    let settling = tokio::spawn(async move {
        let done = journal_owned(store, move |st| st.op_complete(&key, &answer)).await;
        running.fetch_sub(1, Ordering::SeqCst);
        done
    });
    let state = summary.record.and_then(|r| r.state).unwrap_or_else(|| "-".into());
    let status = summary.exit_status.or(summary.exit_code).unwrap_or(Value::Null);
    eprintln!("chio supervisor: uid {uid} request {id} role {} exit {status} state {state}", role.name());
    Ok((Answer::Passed(text), Some(settling)))
}

/// A journal operation on the daemon's store, off the I/O thread.
async fn journal<T: Send + 'static>(
    s: &Shared,
    op: impl FnOnce(&mut Store) -> Result<T, chio_kernel::store::StoreError> + Send + 'static,
) -> Result<T, String> {
    journal_owned(s.journal.clone(), op).await
}

async fn journal_owned<T: Send + 'static>(
    store: Arc<Mutex<Store>>,
    op: impl FnOnce(&mut Store) -> Result<T, chio_kernel::store::StoreError> + Send + 'static,
) -> Result<T, String> {
    journal_started(store, op).await.map_err(|e| e.to_string())?
}

/// A journal operation started now on a blocking thread (awaiting the handle gets its result).
fn journal_started<T: Send + 'static>(
    store: Arc<Mutex<Store>>,
    op: impl FnOnce(&mut Store) -> Result<T, chio_kernel::store::StoreError> + Send + 'static,
) -> tokio::task::JoinHandle<Result<T, String>> {
    tokio::task::spawn_blocking(move || {
        let mut st = store.lock().map_err(|_| "the journal's lock is poisoned".to_string())?;
        op(&mut st).map_err(|e| format!("the request journal: {e}"))
    })
}

/// A job handed to the launcher and held at its gate: the read end of its answer pipe and the
/// write end of its "go" pipe. Dropped without [`Gated::open`], the gate closes (EOF) and the
/// launch process exits having done nothing.
struct Gated {
    answer: OwnedFd,
    go: OwnedFd,
}

/// Hand `job` to the launcher, held at its gate.
fn submit(s: &Shared, job: &Job, fds: Vec<OwnedFd>) -> Result<Gated, String> {
    let text = serde_json::to_vec(job).map_err(|e| e.to_string())?;
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"));
    let ((answer, write), (gate, go)) = (pipe()?, pipe()?);
    s.launcher.submit(&text, &write, &gate, &fds).map_err(|e| format!("handing the launch to the launcher: {e}"))?;
    // Only the launch child holds the answer's write end and the gate's read end now: EOF on
    // the answer is its answer, or its death.
    Ok(Gated { answer, go })
}

impl Gated {
    /// Let the launch go, and read its answer.
    async fn open(self, job: &Job) -> Result<Vec<u8>, String> {
        nix::unistd::write(&self.go, b"g").map_err(|e| format!("letting the launch go: {e}"))?;
        drop(self.go);
        answer_of(self.answer, job).await
    }
}

/// Read the launch child's answer.
async fn answer_of(read: OwnedFd, job: &Job) -> Result<Vec<u8>, String> {
    let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(read).map_err(|e| format!("answer pipe: {e}"))?;
    let mut bytes = Vec::new();
    (&mut rx)
        .take(MAX_ANSWER_BYTES)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| format!("reading the launch's answer: {e}"))?;
    if bytes.is_empty() {
        return Err(format!(
            "the launch of request {} ended without an answer: its cage was killed (the supervisor is stopping) \
             or its launch process failed; its outcome is unknown",
            job.request.id
        ));
    }
    Ok(bytes)
}

/// Read one request line and the descriptors that came with it. None: the peer closed cleanly.
async fn read_request(stream: &UnixStream) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>, String> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        stream.readable().await.map_err(|e| e.to_string())?;
        let n = match stream.try_io(Interest::READABLE, || wire::recv_some(stream.as_raw_fd(), &mut buf, &mut fds)) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.to_string()),
        };
        if fds.len() > MAX_FDS {
            return Err(format!("more than {MAX_FDS} descriptors on one request"));
        }
        if n == 0 {
            return if line.is_empty() && fds.is_empty() { Ok(None) } else { Err("the request ended mid-line".into()) };
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            if end + 1 != line.len() {
                return Err("one request at a time: wait for each answer before sending the next".into());
            }
            line.truncate(end);
            return Ok(Some((line, fds)));
        }
        if line.len() > MAX_REQUEST_BYTES {
            return Err(format!("the request is longer than {MAX_REQUEST_BYTES} bytes"));
        }
    }
}

async fn reply(stream: &mut UnixStream, v: &Value) -> std::io::Result<()> {
    reply_text(stream, v.to_string()).await
}

async fn reply_text(stream: &mut UnixStream, text: String) -> std::io::Result<()> {
    let mut line = text.into_bytes();
    line.push(b'\n');
    match tokio::time::timeout(Duration::from_secs(10), stream.write_all(&line)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A passed-through answer gets the id as its first member and stays one JSON object.
    #[test]
    fn the_id_goes_first_into_any_answer() {
        let parsed = |t: String| serde_json::from_str::<Value>(&t).expect("JSON");
        let a = parsed(Answer::Passed(r#"{"exit_status":3,"record":{"state":"FullyEnforced"}}"#.into()).with_id("r-1"));
        assert_eq!(a, json!({"id": "r-1", "exit_status": 3, "record": {"state": "FullyEnforced"}}));
        assert_eq!(parsed(Answer::Passed(" { } ".into()).with_id("r.2")), json!({"id": "r.2"}));
        assert_eq!(parsed(Answer::Built(json!({"a": 1})).with_id("x")), json!({"id": "x", "a": 1}));
        assert!(Answer::Passed(r#"{"b":2}"#.into()).with_id("x").starts_with(r#"{"id":"x","#));
    }
}
