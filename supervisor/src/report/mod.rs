//! `chio receipt report`: a receipt store (and, with a session, its workspace's snapshots) read
//! into one self-contained HTML page for a person to look at — the verification result first,
//! then a timeline of launches and commands, the refusals, and charts.
//!
//! The page is evidence only as far as its verification line says: every receipt is shown from
//! its stored body, and a receipt that does not verify is marked where it is shown. Nothing in
//! it is fetched: no script, no external style or image, and a Content-Security-Policy that
//! forbids any load, so a command text written by hostile code is only ever text.

mod changes;
mod chart;
mod facts;
mod html;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use chio_cage::record::{Failure, Outcome};
use chio_cage::LaunchRecord;
use chio_kernel::receipt::{self, Kind};
use chio_kernel::store::{Filter, Store, StoreError};
use serde_json::Value;

pub use changes::Changes;
pub use facts::Fact;
pub use html::render;

/// Most launches a report shows (the newest; the verification always covers the whole store).
pub const MAX_LAUNCHES: u64 = 10_000;

/// What to report on.
#[derive(Debug, Clone)]
pub struct Request {
    /// The receipt store.
    pub db: PathBuf,
    /// The kernel's public key (hex): every signature is checked under it.
    pub key: Option<String>,
    /// A signed checkpoint of the store's head (with `key`).
    pub checkpoint: Option<Vec<u8>>,
    /// A repository workspace's state (or a governed session's, which holds one): each
    /// command's file changes from its snapshots.
    pub session: Option<PathBuf>,
    /// Show the newest this many launches (1 to [`MAX_LAUNCHES`]).
    pub last: u64,
}

/// The result of checking the store (and the session's snapshots).
#[derive(Debug, Clone, Default)]
pub struct Verification {
    /// Receipts checked.
    pub receipts: u64,
    /// The key signatures were checked under (none: signatures were not checked).
    pub key: Option<String>,
    /// Each problem, in words: the receipt (seq and id) and why.
    pub problems: Vec<String>,
    /// Sequence numbers of the receipts the problems name.
    pub bad: BTreeSet<u64>,
    /// The checkpoint's result: `None` without one, else its problems (empty: it holds).
    pub checkpoint: Option<Vec<String>>,
    /// SQLite's `quick_check` of the file.
    pub quick_check: String,
    /// Snapshots of the session that could not be read or do not match their digest.
    pub snapshot_problems: Vec<String>,
}

impl Verification {
    /// Every problem found: the chain's, the session's snapshots', the checkpoint's.
    pub fn all_problems(&self) -> impl Iterator<Item = &String> {
        self.problems.iter().chain(&self.snapshot_problems).chain(self.checkpoint.iter().flatten())
    }

    /// Everything checked holds.
    pub fn holds(&self) -> bool {
        self.quick_check == "ok" && self.all_problems().next().is_none()
    }
}

/// How a launched target ended (its `launch_terminal` receipt).
#[derive(Debug, Clone)]
pub struct Terminal {
    /// The terminal receipt's sequence number.
    pub seq: u64,
    /// `exit:N` or `signal:N`.
    pub outcome: String,
    /// Its detail.
    pub ended: Outcome,
}

/// A command a tool call ran or a file tool it used (a `tool_call` receipt).
#[derive(Debug, Clone)]
pub struct Call {
    /// Sequence number.
    pub seq: u64,
    /// Receipt id.
    pub id: String,
    /// The command (or `read_file PATH`, `list_dir PATH`).
    pub what: String,
    /// The operation key, for a command.
    pub operation_key: Option<String>,
    /// `committed`, `refused`, `launch_failed`, or `ok` for a file tool.
    pub transition: String,
    /// The receipt's outcome.
    pub outcome: String,
    /// Why a transition was refused.
    pub reason: Option<String>,
    /// The workspace's file changes, when the session's snapshots were read.
    pub changes: Option<Result<Changes, String>>,
}

/// One launch: its enforcement receipt, its terminal receipt and the command it ran, if any.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The enforcement receipt's sequence number.
    pub seq: u64,
    /// Its id (the launch's id in the daemon's log).
    pub id: String,
    /// When it was issued.
    pub issued_at: String,
    /// The launch state (the receipt's outcome).
    pub state: String,
    /// argv as given (empty when the body embeds no record).
    pub argv: Vec<String>,
    /// Why the launch failed, when it did.
    pub failure: Option<Failure>,
    /// Microseconds from the launch's start to its observed exec.
    pub exec_observed_us: Option<u64>,
    /// Why the receipt's launch record could not be read, when it could not.
    pub record_error: Option<String>,
    /// The facts an auditor checks, read from the record (which is not kept: a timeline of
    /// thousands of launches holds only what it shows).
    pub facts: Vec<Fact>,
    /// How it ended.
    pub terminal: Option<Terminal>,
    /// The command it ran.
    pub call: Option<Call>,
}

impl Launch {
    /// The command line shown: the tool call's command, else the argv.
    pub fn what(&self) -> String {
        match &self.call {
            Some(c) => c.what.clone(),
            None => self.argv.join(" "),
        }
    }
}

/// A refusal: a `denial` receipt, a launch that failed before its exec, or a refused transition.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The receipt's sequence number.
    pub seq: u64,
    /// When.
    pub issued_at: String,
    /// Who refused: the tool server, `launch` or `repository`.
    pub by: String,
    /// The rule or failure code.
    pub rule: String,
    /// Why, in words (each violation).
    pub reasons: Vec<String>,
}

/// One row of the timeline.
#[derive(Debug, Clone)]
pub enum Entry {
    /// A launch.
    Launch(Box<Launch>),
    /// A tool call with no launch of its own (a file tool).
    Call(Call),
    /// A denial.
    Denial(u64),
    /// A receipt whose body cannot be read (its sequence number and why).
    Unreadable(u64, String),
}

/// Everything the page shows.
#[derive(Debug, Clone)]
pub struct Report {
    /// The store's path as given.
    pub db: String,
    /// The session's path, when one was given.
    pub session: Option<String>,
    /// When the report was made (RFC 3339 UTC).
    pub generated_at: String,
    /// The verification result.
    pub verification: Verification,
    /// Launches in the whole store (the timeline shows the newest `--last` of them).
    pub launches_total: u64,
    /// First sequence number shown.
    pub from_seq: u64,
    /// The timeline, oldest first.
    pub entries: Vec<Entry>,
    /// Refusals, oldest first.
    pub refusals: Vec<Refusal>,
}

impl Report {
    /// The launches shown, oldest first.
    pub fn launches(&self) -> impl Iterator<Item = &Launch> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Launch(l) => Some(&**l),
            _ => None,
        })
    }
}

/// Why no report was made.
#[derive(Debug)]
pub enum ReportError {
    /// The input cannot be used (exit 2).
    Usage(String),
    /// Reading the store failed (exit 1).
    Store(StoreError),
}

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReportError::Usage(e) => f.write_str(e),
            ReportError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReportError {}

impl From<StoreError> for ReportError {
    fn from(e: StoreError) -> Self {
        ReportError::Store(e)
    }
}

/// Receipts read per query while building the timeline.
const PAGE: u64 = 2_000;

/// Verify the store and read what the page shows.
pub fn build(r: &Request) -> Result<Report, ReportError> {
    if !(1..=MAX_LAUNCHES).contains(&r.last) {
        return Err(ReportError::Usage(format!("--last {} is outside 1 to {MAX_LAUNCHES}", r.last)));
    }
    let snapshots = r.session.as_deref().map(changes::Snapshots::open).transpose()?;
    let store = Store::open_read_only(&r.db)?;
    let verification = verify(&store, r)?;
    let (launches_total, nth) = store.newest_of_kind(Kind::LaunchEnforcement.name(), r.last)?;
    let from_seq = nth.unwrap_or(1);
    let mut t = Timeline { snapshots, verification, ..Timeline::default() };
    let mut after = from_seq - 1;
    loop {
        let rows = store.list(&Filter { after_seq: Some(after), limit: PAGE, ..Filter::default() })?;
        let Some(last) = rows.last() else { break };
        after = last.seq;
        for row in rows {
            match receipt::parse_unsigned(row.envelope.as_bytes()) {
                Ok(v) => t.add(row.seq, row.id, v.body),
                Err(e) => t.entries.push(Entry::Unreadable(row.seq, e.to_string())),
            }
        }
    }
    Ok(Report {
        db: r.db.display().to_string(),
        session: r.session.as_ref().map(|s| s.display().to_string()),
        generated_at: chio_kernel::time::rfc3339(chio_kernel::time::now_ms()),
        verification: t.verification,
        launches_total,
        from_seq,
        entries: t.entries,
        refusals: t.refusals,
    })
}

/// The timeline as it is read, oldest receipt first.
#[derive(Default)]
struct Timeline {
    entries: Vec<Entry>,
    refusals: Vec<Refusal>,
    /// Where each launch is in `entries`, by its enforcement receipt's id: its later receipts
    /// name it so.
    launch_at: HashMap<String, usize>,
    snapshots: Option<changes::Snapshots>,
    verification: Verification,
}

impl Timeline {
    fn add(&mut self, seq: u64, id: String, body: receipt::Body) {
        match body.kind {
            Kind::LaunchEnforcement => self.launch(seq, id, body),
            Kind::LaunchTerminal => self.terminal(seq, body),
            Kind::ToolCall => self.tool_call(seq, id, body),
            Kind::Denial => {
                self.refusals.push(denial(seq, &body.issued_at, body.tool_server.as_deref(), body.detail.as_ref()));
                self.entries.push(Entry::Denial(seq));
            }
        }
    }

    /// The launch a later receipt references, if it is in the timeline.
    fn launch_of(&mut self, reference: Option<&receipt::Reference>) -> Option<&mut Launch> {
        let at = *self.launch_at.get(&reference?.receipt_id)?;
        match self.entries.get_mut(at) {
            Some(Entry::Launch(l)) => Some(l),
            _ => None,
        }
    }

    fn launch(&mut self, seq: u64, id: String, body: receipt::Body) {
        // A record this chio cannot read (another version's) still shows its argv, and the row
        // says why its facts are missing.
        let raw_argv: Vec<String> = body
            .launch_record
            .as_ref()
            .and_then(|v| v.get("argv"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        let (record, record_error) = match body.launch_record.map(serde_json::from_value::<LaunchRecord>) {
            Some(Ok(r)) => (Some(r), None),
            Some(Err(e)) => (None, Some(format!("its launch record cannot be read: {e}"))),
            None => (None, Some("it embeds no launch record".to_string())),
        };
        let facts = record.as_ref().map(facts::of).unwrap_or_default();
        let (argv, failure, exec_observed_us) = match record {
            Some(r) => (r.argv, r.failure, r.timings_us.get("exec_stop").copied()),
            None => (raw_argv, None, None),
        };
        if let Some(f) = &failure {
            self.refusals.push(Refusal {
                seq,
                issued_at: body.issued_at.clone(),
                by: "launch".into(),
                rule: f.code.to_string(),
                reasons: vec![f.detail.clone()],
            });
        }
        self.launch_at.insert(id.clone(), self.entries.len());
        self.entries.push(Entry::Launch(Box::new(Launch {
            seq,
            id,
            issued_at: body.issued_at,
            state: body.outcome,
            argv,
            failure,
            exec_observed_us,
            record_error,
            facts,
            terminal: None,
            call: None,
        })));
    }

    fn terminal(&mut self, seq: u64, body: receipt::Body) {
        let Some(ended) = body.detail.and_then(|v| serde_json::from_value::<Outcome>(v).ok()) else {
            self.entries.push(Entry::Unreadable(seq, "a terminal receipt without its detail".into()));
            return;
        };
        // A launch older than the timeline's start is not shown, nor its end.
        if let Some(l) = self.launch_of(body.launch.as_ref()) {
            l.terminal = Some(Terminal { seq, outcome: body.outcome, ended });
        }
    }

    fn tool_call(&mut self, seq: u64, id: String, body: receipt::Body) {
        let mut call = tool_call(seq, id, &body.outcome, body.detail.as_ref());
        if let (Some(w), Some(d)) = (self.snapshots.as_mut(), body.detail.as_ref()) {
            call.changes = w.changes_of(d, &mut self.verification.snapshot_problems);
        }
        if call.transition == "refused" {
            self.refusals.push(Refusal {
                seq,
                issued_at: body.issued_at.clone(),
                by: "repository".into(),
                rule: "transition".into(),
                reasons: call.reason.iter().cloned().collect(),
            });
        }
        match self.launch_of(body.launch.as_ref()) {
            Some(l) if l.call.is_none() => l.call = Some(call),
            _ => self.entries.push(Entry::Call(call)),
        }
    }
}

/// The chain (and signatures, with a key), the checkpoint and SQLite's own check.
fn verify(store: &Store, r: &Request) -> Result<Verification, ReportError> {
    let chain = store.verify_chain(r.key.as_deref(), None, None)?;
    let mut v = Verification {
        receipts: chain.checked,
        key: r.key.clone(),
        quick_check: store.health()?.quick_check,
        ..Verification::default()
    };
    for (seq, id, why) in chain.problems {
        v.problems.push(format!("receipt {seq} {id}: {why}"));
        v.bad.insert(seq);
    }
    if let (Some(cp), Some(key)) = (&r.checkpoint, &r.key) {
        v.checkpoint = Some(store.check_checkpoint(cp, key)?);
    }
    Ok(v)
}

fn text(d: Option<&Value>, field: &str) -> Option<String> {
    d?.get(field).and_then(Value::as_str).map(str::to_string)
}

/// A `tool_call` receipt's detail as a row: a repository command or a file tool.
fn tool_call(seq: u64, id: String, outcome: &str, d: Option<&Value>) -> Call {
    let what = match (text(d, "command"), text(d, "tool"), text(d, "path")) {
        (Some(c), _, _) => c,
        (None, Some(t), Some(p)) => format!("{t} {p}"),
        _ => String::new(),
    };
    Call {
        seq,
        id,
        what,
        operation_key: text(d, "operation_key"),
        transition: text(d, "transition").unwrap_or_else(|| outcome.to_string()),
        outcome: outcome.to_string(),
        reason: text(d, "reason"),
        changes: None,
    }
}

/// A `denial` receipt: a launch policy's violations, a gateway's or a file tool's rule.
fn denial(seq: u64, issued_at: &str, server: Option<&str>, d: Option<&Value>) -> Refusal {
    let violations: Vec<String> = d
        .and_then(|d| d.get("violations"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let rule = text(d, "rule").or_else(|| text(d, "policy_id").map(|p| format!("policy {p}"))).unwrap_or_default();
    let mut reasons = violations;
    reasons.extend(text(d, "reason"));
    Refusal { seq, issued_at: issued_at.to_string(), by: server.unwrap_or("admission").to_string(), rule, reasons }
}
