//! The daemon's I/O: accept, map the peer to a role, read one request line (bounded in size and
//! time) with its descriptors, hand launches to the launcher, answer. A launch holds a slot of
//! `max_launches` and one of its uid's `max_launches_per_client`; a connection a slot of
//! `max_connections` and one of its uid's `max_connections_per_client`. A connection or a launch
//! over its uid's share is answered "try again" at once, so a slow or hostile client holds at
//! most its own share and never stalls the others.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Context, Result};
use chio_kernel::journal::Begin;
use chio_kernel::store::Store;
use nix::sys::socket::MsgFlags;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{Notify, Semaphore};

use super::answer::{self, Delivery};
use super::config::{Config, Role};
use super::job::{DaemonSide, Job};
use super::launcher::Launcher;
use super::metrics::{Metrics, Outcome, Reason};
use super::wire::{self, Request, MAX_FDS, MAX_REQUEST_BYTES};

/// How long a repeat of a request still in flight waits for its outcome to land (a client that
/// asks again right after its answer reached it gets the retained answer, not "running").
const REPEAT_WAIT: Duration = Duration::from_secs(2);
/// How long a refusal waits for the launch it withdrew to tear its cage down (which removes the
/// cgroup within 5 s, killing what is in it).
const WITHDRAW_WAIT: Duration = Duration::from_secs(10);
/// The daemon's keys in the journal: `supervisor:<peer uid>:<request id>`.
const JOURNAL_PREFIX: &str = "supervisor:";
/// How long a launch that finds its client at `max_launches_per_client` waits for one of that
/// client's own launches to end before it is answered "try again": a launch answers its client
/// itself, a moment before the daemon reads that it ended, so a client launching back to back
/// at its limit would otherwise be refused for a launch it already has the answer of.
const SHARE_WAIT: Duration = Duration::from_secs(1);
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
    /// Told whenever a request's outcome lands in the journal (see [`settled_meanwhile`]).
    settled: Arc<Notify>,
    /// Told whenever a client gives back a share (see [`Shared::share_within`]).
    freed: Notify,
    metrics: Arc<Metrics>,
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
        settled: Arc::new(Notify::new()),
        freed: Notify::new(),
        metrics: Arc::new(Metrics::default()),
        config,
        daemon,
        launcher,
    });
    // Bound before READY: a metrics address in use stops the daemon at its start.
    let endpoint = match &shared.config.metrics {
        Some(at) => {
            let endpoint = super::scrape::bind(at).await?;
            tracing::info!("metrics at {at}");
            Some(endpoint)
        }
        None => None,
    };
    let metrics_socket = endpoint.as_ref().and_then(|e| e.path().map(Path::to_path_buf));
    let scrapes = endpoint.map(|e| {
        let s = shared.clone();
        tokio::spawn(super::scrape::serve(e, Arc::new(move || s.metrics.encode(&s.launcher.gauges).ok())))
    });
    tracing::info!("listening on {}", path.display());
    crate::service::notify(&format!("READY=1\nSTATUS=listening on {}", path.display()));
    let mut prune = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = prune.tick() => prune_journal(&shared).await,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => { tokio::spawn(connection(shared.clone(), stream)); }
                Err(e) => tracing::warn!("accept: {e}"),
            },
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(path);
    if let Some(task) = scrapes {
        task.abort();
    }
    if let Some(p) = metrics_socket {
        let _ = std::fs::remove_file(p);
    }
    let grace = Duration::from_secs(shared.config.stop_grace_s);
    let running = shared.running.load(Ordering::SeqCst);
    crate::service::notify(&format!("STOPPING=1\nSTATUS=stopping: {running} launch(es) running"));
    tracing::info!(running, "stopping: {running} launch(es) get {} s to finish", grace.as_secs());
    if !drained(&shared, grace).await {
        tracing::warn!("the stop grace is over: killing the launches still running");
        shared.launcher.kill_all()?;
        drained(&shared, Duration::from_secs(5)).await;
    }
    Ok(0)
}

/// Forget settled requests older than the retention (at start, then hourly).
async fn prune_journal(s: &Shared) {
    let keep = i64::try_from(s.config.journal_retention_s.saturating_mul(1000)).unwrap_or(i64::MAX);
    let before = chio_kernel::time::now_ms().saturating_sub(keep);
    match journal(s, "journal_prune", move |st| st.op_prune(JOURNAL_PREFIX, before)).await {
        Ok(0) => {}
        Ok(n) => tracing::info!("forgot {n} settled request(s) older than the journal's retention"),
        Err(e) => tracing::error!("pruning the journal: {e}"),
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

    /// [`Shared::share`], waiting up to `wait` for one of the client's own to be given back.
    async fn share_within(&self, uid: u32, kind: Kind, wait: Duration) -> Option<Share<'_>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Listening before looking, so that a share given back in between is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(share) = self.share(uid, kind) {
                return Some(share);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return None;
            }
        }
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
        self.s.freed.notify_waiters();
    }
}

impl Shared {
    /// A refusal of peer `uid`'s request `id` for `reason` (counted and logged), exiting
    /// `exit_code`; its id is set as it is sent.
    fn refuse(&self, uid: Option<u32>, id: Option<&str>, reason: Reason, why: String, exit_code: i32) -> Value {
        self.refused(uid, id, reason, &why);
        refusal(reason, why, exit_code)
    }

    /// Count a refusal and log it with its fields (`CHIO_OUTCOME=refused`, `CHIO_REASON`, …).
    fn refused(&self, uid: Option<u32>, id: Option<&str>, reason: Reason, why: &str) {
        self.metrics.refused(reason);
        tracing::info!(peer_uid = uid, request_id = id, outcome = "refused", reason = reason.word(), "refused: {why}");
    }
}

/// A refusal's answer (its id set as it is sent).
fn refusal(reason: Reason, why: String, exit_code: i32) -> Value {
    json!({"id": null, "error": why, "reason": reason.word(), "exit_code": exit_code})
}

/// An answer: built here, a launch's own JSON object passed through as it came (a launch
/// record is a few KiB; decoding and encoding it again cost the round trip ~0.1 ms), one its
/// launch child wrote to the client itself, in part or whole (see [`super::answer`]), or none
/// (the connection is in an unknown state).
enum Answer {
    Built(Value),
    Passed(String),
    Delivered { text: String, sent: usize },
    Hangup,
}

/// What a connection writes back: the answer line (a newline follows) from byte `from` on, or
/// nothing, closing the connection.
enum Reply {
    Line { text: String, from: usize },
    Hangup,
}

impl Answer {
    /// The reply: the answer's text with `id` as its first member, less what the client has.
    fn reply(self, id: &str) -> Reply {
        let (text, from) = match self {
            Answer::Built(mut v) => {
                v["id"] = json!(id);
                (v.to_string(), 0)
            }
            Answer::Passed(text) => (super::answer::line(id, &text), 0),
            Answer::Delivered { text, sent } => (super::answer::line(id, &text), sent),
            Answer::Hangup => return Reply::Hangup,
        };
        Reply::Line { text, from }
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
    error: Option<Value>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    record: Option<RecordSummary>,
    /// The launch's receipts: its enforcement receipt first (the launch's id in the log).
    #[serde(default)]
    receipts: Vec<String>,
}

#[derive(serde::Deserialize)]
struct RecordSummary {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    outcome: Option<OutcomeSummary>,
}

#[derive(serde::Deserialize)]
struct OutcomeSummary {
    #[serde(default)]
    limit_hit: Vec<String>,
}

impl Summary {
    /// How the request ended, for the metrics: refused (an `error`), not run (a launch without
    /// a record or without an outcome in it), or ran.
    fn outcome(&self, launch: bool) -> Outcome<'_> {
        if self.error.is_some() {
            return Outcome::Refused(self.reason.as_deref().map_or(Reason::LaunchFailed, Reason::of));
        }
        if !launch {
            return Outcome::Ran { state: None, limits: &[] };
        }
        let state = self.record.as_ref().and_then(|r| r.state.as_deref());
        match self.record.as_ref().and_then(|r| r.outcome.as_ref()) {
            Some(o) => Outcome::Ran { state, limits: &o.limit_hit },
            None => Outcome::NotRun { state },
        }
    }
}

async fn connection(s: Arc<Shared>, mut stream: UnixStream) {
    let (uid, gid, pid) = match stream.peer_cred() {
        Ok(c) => (c.uid(), c.gid(), c.pid().unwrap_or(0)),
        Err(e) => return tracing::warn!("peer credentials: {e}"),
    };
    let Ok(_slot) = s.connections.clone().try_acquire_owned() else {
        let why = format!("the supervisor is serving its limit of {} connections; try again", s.config.max_connections);
        let _ = reply(&mut stream, &s.refuse(Some(uid), None, Reason::Connections, why, 75)).await;
        return;
    };
    let Some(role) = s.config.role_of(uid, gid) else {
        let why = format!(
            "uid {uid} (gid {gid}) may not use this supervisor: it is not among the clients of its configuration \
             ({}; without one only root may connect)",
            super::DEFAULT_CONFIG
        );
        let _ = reply(&mut stream, &s.refuse(Some(uid), None, Reason::NotAClient, why, 77)).await;
        return;
    };
    let Some(_share) = s.share(uid, Kind::Connection) else {
        let why = format!(
            "uid {uid} has its limit of {} connections open (max_connections_per_client); try again",
            s.config.max_connections_per_client
        );
        let _ = reply(&mut stream, &s.refuse(Some(uid), None, Reason::ClientConnections, why, 75)).await;
        return;
    };
    let timeout = Duration::from_secs(s.config.request_timeout_s);
    loop {
        let (line, fds) = match tokio::time::timeout(timeout, read_request(&stream)).await {
            Ok(Ok(Some(got))) => got,
            Ok(Ok(None)) => return,
            Ok(Err(why)) => {
                return drop(reply(&mut stream, &s.refuse(Some(uid), None, Reason::BadRequest, why, 2)).await)
            }
            Err(_) => {
                let why = format!("no complete request within {} s", timeout.as_secs());
                return drop(reply(&mut stream, &s.refuse(Some(uid), None, Reason::RequestTimeout, why, 2)).await);
            }
        };
        let arrived = super::answer::monotonic_ns();
        let req = match Request::parse(&line) {
            Ok(r) => r,
            Err(why) => return drop(reply(&mut stream, &s.refuse(Some(uid), None, Reason::BadRequest, why, 2)).await),
        };
        let job = matches!(req, Request::Launch { .. } | Request::Repository { .. });
        let peer = Peer { uid, gid, pid, role, arrived };
        let (reply, settling) = answer(&s, req, fds, peer, &stream).await;
        let replied = match reply {
            Reply::Line { text, from } => reply_text(&mut stream, text, from).await,
            Reply::Hangup => Err(std::io::Error::other("the launch child ended while answering")),
        };
        if job && replied.is_ok() {
            s.metrics.answered(seconds_since(arrived));
        }
        // The answer is journaled while it travels; the next request on this connection (and
        // a stop) waits for that.
        if let Some(Err(why)) = settle(settling).await {
            tracing::error!("{why}");
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
    /// 0 when SO_PEERCRED names no pid of this pid namespace.
    pid: i32,
    role: Role,
    /// When its request arrived (`CLOCK_MONOTONIC`, ns).
    arrived: u64,
}

/// Seconds from `since` (`CLOCK_MONOTONIC`, ns) to now.
fn seconds_since(since: u64) -> f64 {
    super::answer::monotonic_ns().saturating_sub(since) as f64 / 1e9
}

/// The reply to one request on `conn`.
async fn answer(s: &Shared, req: Request, fds: Vec<OwnedFd>, peer: Peer, conn: &UnixStream) -> (Reply, Settling) {
    let Peer { uid, role, .. } = peer;
    let id = req.id().to_string();
    if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        let why = "a request id is 1–128 characters of [A-Za-z0-9._-]".into();
        return (
            Reply::Line { text: s.refuse(Some(uid), None, Reason::BadRequest, why, 2).to_string(), from: 0 },
            None,
        );
    }
    let mut settling = None;
    let a = match &req {
        _ if fds.len() != req.fd_count() => Answer::Built(s.refuse(
            Some(uid),
            Some(&id),
            Reason::BadRequest,
            format!("{} descriptors do not match the request's fds", fds.len()),
            2,
        )),
        Request::Ping { .. } => Answer::Built(
            json!({"version": env!("CARGO_PKG_VERSION"), "protocol": wire::PROTOCOL, "role": role.name(), "uid": uid}),
        ),
        Request::Repository { .. } if role == Role::Launch => Answer::Built(s.refuse(
            Some(uid),
            Some(&id),
            Reason::Role,
            format!("uid {uid}: the repository operations need the admin or repository role"),
            77,
        )),
        Request::Launch { .. } | Request::Repository { .. } => match conn.as_fd().try_clone_to_owned() {
            Ok(conn) => {
                let (a, journaling) = launch(s, req, fds, peer, conn).await;
                settling = journaling;
                a
            }
            Err(e) => {
                let why = format!("the connection's descriptor: {e}");
                Answer::Built(s.refuse(Some(uid), Some(&id), Reason::LaunchFailed, why, 125))
            }
        },
    };
    (a.reply(&id), settling)
}

async fn launch(s: &Shared, req: Request, fds: Vec<OwnedFd>, peer: Peer, conn: OwnedFd) -> (Answer, Settling) {
    let uid = peer.uid;
    let queued = s.metrics.queued();
    let Some(_share) = s.share_within(uid, Kind::Launch, SHARE_WAIT).await else {
        let why = format!(
            "uid {uid} has its limit of {} launches running (max_launches_per_client); try again when one ends",
            s.config.max_launches_per_client
        );
        return (Answer::Built(s.refuse(Some(uid), Some(req.id()), Reason::ClientLaunches, why, 75)), None);
    };
    let Ok(_slot) = s.launches.acquire().await else {
        return (
            Answer::Built(s.refuse(
                Some(uid),
                Some(req.id()),
                Reason::Stopping,
                "the supervisor is stopping".into(),
                75,
            )),
            None,
        );
    };
    drop(queued);
    s.running.fetch_add(1, Ordering::SeqCst);
    let answer = dispatch(s, req, fds, peer, conn).await;
    s.running.fetch_sub(1, Ordering::SeqCst);
    match answer {
        Ok((a, settling)) => (a, settling),
        // (Counted where it was decided: a refusal, or a launch whose outcome is unknown.)
        Err(Turned { reason, why }) => (Answer::Built(refusal(reason, why, 125)), None),
    }
}

/// Why [`dispatch`] did not pass a launch's answer on (counted where it was decided).
struct Turned {
    reason: Reason,
    why: String,
}

/// Journal the request, hand it to the launcher (whose launch process answers the client itself:
/// see [`super::answer`]), and start journaling its answer (returned unawaited: the reply need
/// not wait for it — a repeat of the id meanwhile waits for it, [`REPEAT_WAIT`] at most, and a
/// crash before it lands leaves the request `outcome_unknown`, never run again). A repeated id
/// gets the retained answer of a finished request and never runs twice.
///
/// The job goes to the launcher while its journal entry is being written: its launch process
/// takes the client's descriptors and parses the arguments meanwhile, but does nothing anyone
/// can see — no output, no file, no cage — until the daemon sends "go", which it does only
/// once the entry has landed. A request the journal refuses (or a daemon that dies first)
/// closes the gate instead, and that launch process exits having done nothing.
async fn dispatch(
    s: &Shared,
    req: Request,
    fds: Vec<OwnedFd>,
    peer: Peer,
    conn: OwnedFd,
) -> Result<(Answer, Settling), Turned> {
    let Peer { uid, gid, pid, role, arrived } = peer;
    let id = req.id().to_string();
    let failed = |why: String| Turned { reason: Reason::LaunchFailed, why };
    let turned = |reason: Reason, why: String| {
        s.refused(Some(uid), Some(&id), reason, &why);
        Turned { reason, why }
    };
    let key = format!("{JOURNAL_PREFIX}{uid}:{id}");
    let is_launch = matches!(req, Request::Launch { .. });
    let mut daemon = s.daemon.clone();
    daemon.workspaces = s.config.workspaces.iter().filter(|w| w.uid == uid).cloned().collect();
    let job = Job { role, uid, gid, pid, request: req, daemon };
    // The job first, its journal entry after it: the entry is written while the launch process
    // parses the job, which waits at its gate for it either way. Started first, the journal's
    // thread ran ahead of this one on its CPU (or ahead of the launch process on the other)
    // and held the job back by about its write.
    let submitted = submit(s, &job, fds, &conn);
    drop(conn);
    let digest = match request_digest(&job.request) {
        Ok(d) => d,
        Err(why) => {
            withdraw(submitted).await;
            return Err(turned(Reason::LaunchFailed, why));
        }
    };
    let begin = {
        let (key, digest) = (key.clone(), digest.clone());
        journal_started(s.journal.clone(), s.metrics.clone(), "journal_begin", move |st| {
            st.op_begin_dispatched(&key, &digest)
        })
    };
    let begun = match begin.await.map_err(|e| e.to_string()).and_then(|r| r) {
        Ok(Begin::InProgress) => settled_meanwhile(s, &key, &digest).await,
        other => other,
    };
    let refused = match begun {
        Ok(Begin::Proceed) => None,
        Ok(Begin::Retained(answer)) => Some(Ok((Answer::Passed(answer), None))),
        Ok(Begin::Conflict { .. }) => {
            Some(Err((Reason::IdReused, format!("request id {id:?} was already used for another request"))))
        }
        Ok(Begin::InProgress) => Some(Err((Reason::IdRunning, format!("request id {id:?} is running")))),
        Ok(Begin::OutcomeUnknown) => Some(Err((
            Reason::OutcomeUnknown,
            format!(
                "request id {id:?} was dispatched before the supervisor stopped and its outcome is unknown; it is \
                 not run again"
            ),
        ))),
        Err(e) => Some(Err((Reason::Journal, e))),
    };
    if let Some(refused) = refused {
        withdraw(submitted).await;
        return refused.map_err(|(reason, why)| turned(reason, why));
    }
    let delivered = match submitted {
        Ok(gated) => gated.open().await,
        Err(why) => Err(why),
    };
    // From here the request was dispatched: however it ends, it is counted and logged once, as
    // it ended.
    let lost = |why: &str| {
        s.metrics.ended(is_launch, Outcome::Unknown);
        tracing::warn!(peer_uid = uid, request_id = id, outcome = "unknown", "uid {uid} request {id}: {why}");
    };
    let (text, told) = match delivered {
        Ok(Delivery::Sent { told, answer }) => (answer, told),
        Ok(Delivery::NotSent) => {
            let why = format!(
                "the launch of request {id} ended without an answer: its cage was killed (the supervisor is stopping) \
                 or its launch process failed; its outcome is unknown"
            );
            lost(&why);
            unknown(s, key).await.map_err(failed)?;
            return Err(failed(why));
        }
        Ok(Delivery::Unknown) => {
            lost("its launch process ended while answering; closing");
            unknown(s, key).await.map_err(failed)?;
            return Ok((Answer::Hangup, None));
        }
        Err(why) => {
            lost(&why);
            unknown(s, key).await.map_err(failed)?;
            return Err(failed(why));
        }
    };
    let sent = told.sent;
    let summary: Summary = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) if sent == 0 => {
            let why = format!("the launch's answer is not a JSON object: {e}");
            lost(&why);
            return Err(failed(why));
        }
        // Part of it is with the client already: nothing else can follow on that connection.
        Err(e) => {
            lost(&format!("the launch's answer is not a JSON object: {e}; closing"));
            return Ok((Answer::Hangup, None));
        }
    };
    let outcome = summary.outcome(is_launch);
    s.metrics.ended(is_launch, outcome);
    if let Some(at) = told.exec_observed_ns.filter(|&at| at >= arrived) {
        s.metrics.exec_observed((at - arrived) as f64 / 1e9);
    }
    for us in &told.receipt_writes_us {
        s.metrics.store_write("receipt", *us as f64 / 1e6);
    }
    let answer = text.clone();
    let (store, running, settled, metrics) =
        (s.journal.clone(), s.running.clone(), s.settled.clone(), s.metrics.clone());
    running.fetch_add(1, Ordering::SeqCst);
    let settling = tokio::spawn(async move {
        let done = journal_owned(store, metrics, "journal_complete", move |st| st.op_complete(&key, &answer)).await;
        settled.notify_waiters();
        running.fetch_sub(1, Ordering::SeqCst);
        done
    });
    let state = summary.record.as_ref().and_then(|r| r.state.as_deref()).unwrap_or("-");
    let status = summary.exit_status.as_ref().or(summary.exit_code.as_ref()).unwrap_or(&Value::Null);
    let reason = match outcome {
        Outcome::Refused(r) => Some(r.word()),
        _ => None,
    };
    tracing::info!(
        peer_uid = uid,
        request_id = id,
        role = role.name(),
        outcome = outcome.word(),
        reason,
        state,
        exit = %status,
        launch_id = summary.receipts.first().map(String::as_str),
        "uid {uid} request {id} role {} exit {status} state {state}",
        role.name()
    );
    Ok((Answer::Delivered { text, sent }, Some(settling)))
}

/// The request `key` was dispatched and its outcome is unknown.
async fn unknown(s: &Shared, key: String) -> Result<(), String> {
    let r = journal(s, "journal_unknown", move |st| st.op_unknown(&key)).await;
    s.settled.notify_waiters();
    r
}

/// A request under the same key is in flight: wait, [`REPEAT_WAIT`] at most, for its outcome to
/// land (its answer may be with its client already: the journal is written while it travels).
async fn settled_meanwhile(s: &Shared, key: &str, digest: &str) -> Result<Begin, String> {
    let deadline = tokio::time::Instant::now() + REPEAT_WAIT;
    loop {
        // Listening before looking, so that an outcome landing in between is not missed.
        let landed = s.settled.notified();
        tokio::pin!(landed);
        landed.as_mut().enable();
        let (k, d) = (key.to_string(), digest.to_string());
        let begun = journal(s, "journal_begin", move |st| st.op_begin_dispatched(&k, &d)).await?;
        if !matches!(begun, Begin::InProgress) || tokio::time::timeout_at(deadline, landed).await.is_err() {
            return Ok(begun);
        }
    }
}

/// A journal operation (`name`, as the metrics call it) on the daemon's store, off the I/O
/// thread.
async fn journal<T: Send + 'static>(
    s: &Shared,
    name: &'static str,
    op: impl FnOnce(&mut Store) -> Result<T, chio_kernel::store::StoreError> + Send + 'static,
) -> Result<T, String> {
    journal_owned(s.journal.clone(), s.metrics.clone(), name, op).await
}

async fn journal_owned<T: Send + 'static>(
    store: Arc<Mutex<Store>>,
    metrics: Arc<Metrics>,
    name: &'static str,
    op: impl FnOnce(&mut Store) -> Result<T, chio_kernel::store::StoreError> + Send + 'static,
) -> Result<T, String> {
    journal_started(store, metrics, name, op).await.map_err(|e| e.to_string())?
}

/// A journal operation started now on a blocking thread (awaiting the handle gets its result),
/// its time (the lock's wait included: a request waits that too) counted under `name`.
fn journal_started<T: Send + 'static>(
    store: Arc<Mutex<Store>>,
    metrics: Arc<Metrics>,
    name: &'static str,
    op: impl FnOnce(&mut Store) -> Result<T, chio_kernel::store::StoreError> + Send + 'static,
) -> tokio::task::JoinHandle<Result<T, String>> {
    tokio::task::spawn_blocking(move || {
        let began = std::time::Instant::now();
        let mut st = store.lock().map_err(|_| "the journal's lock is poisoned".to_string())?;
        let done = op(&mut st).map_err(|e| format!("the request journal: {e}"));
        metrics.store_write(name, began.elapsed().as_secs_f64());
        done
    })
}

/// The journal's digest of a request: SHA-256 of its canonical JSON (a repeated id with another
/// digest is another request).
fn request_digest(req: &Request) -> Result<String, String> {
    let value = serde_json::to_value(req).map_err(|e| e.to_string())?;
    chio_kernel::documents::body_digest(&value).map_err(|e| e.to_string())
}

/// A job handed to the launcher and held at its gate: the read end of its answer pipe and the
/// daemon's end of its gate (a socket pair: "go" one way; the other, the launch child's word
/// that it is writing to the client, which the daemon reads only once the answer pipe has
/// ended — never woken by it). Dropped without [`Gated::open`], the gate closes (EOF) and the
/// launch process exits having done nothing.
struct Gated {
    answer: OwnedFd,
    go: OwnedFd,
}

/// Hand `job` to the launcher, held at its gate, with the client's connection `conn`.
fn submit(s: &Shared, job: &Job, fds: Vec<OwnedFd>, conn: &OwnedFd) -> Result<Gated, String> {
    let text = serde_json::to_vec(job).map_err(|e| e.to_string())?;
    let (answer, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let (go, gate) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    s.launcher
        .submit(&text, &write, &gate, conn, &fds)
        .map_err(|e| format!("handing the launch to the launcher: {e}"))?;
    // Only the launch child holds the answer's write end and the gate's read end now: EOF on
    // the answer is its answer, or its death.
    Ok(Gated { answer, go })
}

/// Withdraw a job held at its gate, and wait (bounded) for its launch process to end: a launch
/// without a policy builds its cage before it waits at the gate (see `job::run_job`), and that
/// cage counts against the launch limits, whose slot the caller holds, until it is torn down.
async fn withdraw(submitted: Result<Gated, String>) {
    if let Ok(Gated { answer, go }) = submitted {
        drop(go);
        let _ = tokio::time::timeout(WITHDRAW_WAIT, answer_of(answer)).await;
    }
}

impl Gated {
    /// Let the launch go, and read what became of its answer (see [`super::answer`]).
    async fn open(self) -> Result<Delivery, String> {
        nix::unistd::write(&self.go, b"g").map_err(|e| format!("letting the launch go: {e}"))?;
        let bytes = answer_of(self.answer).await?;
        let mut word = [0u8; 1];
        let sending = nix::sys::socket::recv(self.go.as_raw_fd(), &mut word, MsgFlags::MSG_DONTWAIT) == Ok(1)
            && word[0] == answer::SENDING;
        Ok(answer::parse(&bytes, sending))
    }
}

/// Read the launch child's answer pipe to its end.
async fn answer_of(read: OwnedFd) -> Result<Vec<u8>, String> {
    let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(read).map_err(|e| format!("answer pipe: {e}"))?;
    let mut bytes = Vec::new();
    (&mut rx)
        .take(MAX_ANSWER_BYTES)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| format!("reading the launch's answer: {e}"))?;
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
    reply_text(stream, v.to_string(), 0).await
}

/// Write the line `text` and its newline from byte `from` on (the client has the rest).
async fn reply_text(stream: &mut UnixStream, text: String, from: usize) -> std::io::Result<()> {
    let mut line = text.into_bytes();
    line.push(b'\n');
    let rest = line.get(from..).unwrap_or_default();
    match tokio::time::timeout(Duration::from_secs(10), stream.write_all(rest)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
    }
}
