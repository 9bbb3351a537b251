//! `execute`: one command of a session, from journal intent to signed transition.
//!
//! intent committed → dispatched → cage (`/bin/bash --noprofile --norc -c CMD` over the
//! workspace) → the cage torn down, every process of the command gone → the workspace walked →
//! scope and shape checked → snapshot committed → `tool_call` receipt → head moved → result
//! retained. A refused walk commits nothing: the workspace is put back and stopped.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsFd;

use chio_cage::{LaunchRecord, State};
use chio_kernel::journal::{Begin, OpState};
use chio_kernel::receipt::{Draft, Kind};
use chio_kernel::store::{Appended, Store};
use nix::sys::memfd::{memfd_create, MFdFlags};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::git_source::{in_scope, is_parent_of_scope};
use super::snapshot::{self, Index, Node, StatCache};
use super::workspace::{write_snapshot, RepoError, Workspace};
use crate::launch::{self, How, Io, LaunchRequest, Receipts};
use crate::launch_plan::{ImageChoice, PlanOptions};
use crate::receipts;

/// Bytes of combined output a result carries; the rest is counted.
pub const OUTPUT_LIMIT: u64 = 512 << 10;
/// Longest deadline a command may ask for, in seconds.
pub const MAX_DEADLINE_S: u64 = 300;

/// One command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Idempotency key: the same key and request return the retained result.
    pub operation_key: String,
    /// The shell command (`bash -c`).
    pub command: String,
    /// Wall-clock deadline, 1–300 seconds.
    pub deadline_s: u64,
}

/// What became of a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    /// A new snapshot was committed (possibly equal to the previous one).
    Committed,
    /// The workspace change was refused: nothing committed, the workspace put back and stopped.
    Refused,
    /// The cage did not start the command; the workspace is untouched.
    LaunchFailed,
}

/// The result of `execute` (retained by the journal and returned again on a replay).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    /// The operation key.
    pub operation_key: String,
    /// What became of the workspace.
    pub transition: Transition,
    /// The command's exit status (128+N for signal N; 125–127 for a launch that failed).
    pub exit_status: i32,
    /// Combined stdout and stderr, at most [`OUTPUT_LIMIT`] bytes (lossy UTF-8).
    pub output: String,
    /// Bytes the command wrote in all.
    pub output_bytes: u64,
    /// Bytes not returned.
    pub output_dropped: u64,
    /// SHA-256 of the returned output bytes.
    pub output_sha256: String,
    /// The deadline killed the command.
    pub deadline_hit: bool,
    /// Ceilings hit (`wall_time`, `memory`, `pids`, `output`, `cpu`).
    pub limits_hit: Vec<String>,
    /// Snapshot before the command.
    pub before: String,
    /// Snapshot after it (when committed).
    pub after: Option<String>,
    /// Why the change was refused, or why the launch failed.
    pub reason: Option<String>,
    /// The `tool_call` receipt.
    pub receipt_id: String,
    /// The launch's `launch_enforcement` receipt.
    pub launch_receipt_id: String,
    /// True when this result was retained from an earlier call with the same key.
    #[serde(default)]
    pub replayed: bool,
    /// Where the time went, in microseconds: `journal` (intent and dispatch), `launch` (the
    /// cage, from plan to teardown, with its enforcement receipt), `walk` (reading the workspace
    /// and storing new objects), `commit` (snapshot index and head; the receipts' transaction
    /// that retains this result comes after it).
    #[serde(default)]
    pub timings_us: std::collections::BTreeMap<String, u64>,
    /// The cage's root, when a root made ahead could serve a command like it (a daemon makes
    /// it ahead for the next one). Not part of the result: never shown or retained.
    #[serde(skip)]
    pub root: Option<chio_cage::RootKey>,
}

fn failed(e: impl std::fmt::Display) -> RepoError {
    RepoError::Failed(e.to_string())
}

/// The request's digest as the journal keeps it.
fn request_digest(r: &ExecRequest) -> Result<String, RepoError> {
    Ok(snapshot::hex_sha256(&super::workspace::canonical_json(r)?))
}

/// Run one command in the workspace (see the module docs).
pub fn execute(ws: &Workspace, req: &ExecRequest) -> Result<ExecResult, RepoError> {
    execute_with(ws, req, chio_cage::Ahead::default())
}

/// [`execute`], with what a daemon's spare made `ahead` for the command's cage (see
/// `chio_cage::ahead`; what does not fit the launch is dropped and made by it).
pub fn execute_with(ws: &Workspace, req: &ExecRequest, ahead: chio_cage::Ahead) -> Result<ExecResult, RepoError> {
    if req.operation_key.is_empty() || req.operation_key.len() > 256 || req.operation_key.chars().any(char::is_control)
    {
        return Err(RepoError::Usage("the operation key must be 1–256 printable characters".into()));
    }
    if !(1..=MAX_DEADLINE_S).contains(&req.deadline_s) {
        return Err(RepoError::Usage(format!("deadline {} s: give 1 to {MAX_DEADLINE_S} seconds", req.deadline_s)));
    }
    let started = std::time::Instant::now();
    let mut mark = started;
    let mut timings = std::collections::BTreeMap::new();
    let mut lap = |name: &str| {
        let now = std::time::Instant::now();
        timings.insert(name.to_string(), (now - mark).as_micros() as u64);
        mark = now;
    };
    let key = ws.kernel_key()?;
    let mut store = ws.store(&key)?;
    // This process holds the workspace's lock: an operation still begun or dispatched was
    // interrupted, and the workspace may not be what its receipts say until recovery.
    if let Some(k) = store.op_unsettled()?.first() {
        return Err(RepoError::Refused(format!(
            "operation {k:?} was interrupted; run `chio repository recover` before anything else"
        )));
    }
    if let Some(reason) = ws.stopped() {
        // A stopped workspace runs nothing new; a completed key still returns its result.
        if store.op_state(&req.operation_key)? != Some(OpState::Completed) {
            return Err(RepoError::Refused(format!("the workspace is stopped: {reason}")));
        }
    }
    let before = ws.head()?;
    // Intent and dispatch in one transaction: nothing happens between them here.
    match store.op_begin_dispatched(&req.operation_key, &request_digest(req)?)? {
        Begin::Proceed => {}
        Begin::Retained(r) => return replay(&r),
        Begin::Conflict { .. } => {
            return Err(RepoError::Conflict(format!(
                "operation key {:?} was used for a different command or deadline",
                req.operation_key
            )))
        }
        Begin::InProgress => {
            return Err(RepoError::Conflict(format!(
                "operation key {:?} is in progress or was interrupted; run `chio repository recover`",
                req.operation_key
            )))
        }
        Begin::OutcomeUnknown => {
            return Err(RepoError::Conflict(format!(
                "operation key {:?} was dispatched before a crash and its outcome is unknown; it is never run again",
                req.operation_key
            )))
        }
    }
    super::crash_point("dispatched");
    lap("journal");
    let Caged { rec, launch_receipt, terminal, mut output, root } = run_cage(ws, req, &mut store, &key, ahead)?;
    lap("launch");
    // Bytes past the cage's own per-stream cap were counted there, not written.
    output.total += rec.outcome.as_ref().map_or(0, |o| o.stdout_dropped + o.stderr_dropped);
    let mut result = ExecResult {
        operation_key: req.operation_key.clone(),
        transition: Transition::LaunchFailed,
        exit_status: rec.exit_status(),
        output: String::from_utf8_lossy(&output.kept).into_owned(),
        output_bytes: output.total,
        output_dropped: output.total - output.kept.len() as u64,
        output_sha256: snapshot::hex_sha256(&output.kept),
        deadline_hit: false,
        limits_hit: Vec::new(),
        before: before.clone(),
        after: None,
        reason: None,
        receipt_id: String::new(),
        launch_receipt_id: launch_receipt.receipt.id.clone(),
        replayed: false,
        timings_us: Default::default(),
        root,
    };
    if let Some(o) = &rec.outcome {
        result.limits_hit = o.limit_hit.clone();
        result.deadline_hit = o.limit_hit.iter().any(|l| l == "wall_time");
    }
    if rec.state != State::FullyEnforced {
        result.reason = Some(match &rec.failure {
            Some(f) => format!("{}: {}: {}", f.stage.name(), f.code, f.detail),
            None => format!("the launch ended {:?}", rec.state),
        });
    } else {
        // The launch has returned: the cage's init and with it every process of the command
        // is gone, so nothing can change the workspace while it is read.
        let walked = walk(ws, &before);
        lap("walk");
        match walked.and_then(|(index, seen)| Ok((write_snapshot(&ws.dir, &ws.objects, &index)?, seen))) {
            Ok((after, mut seen)) => {
                seen.snapshot = after.clone();
                // Only an aid for the next walk: a failure to keep it costs nothing but time. The
                // cache it came from still holds when nothing was read (nothing changed).
                if after != before || seen.files_read > 0 {
                    let _ = seen.save(&ws.dir.join("statcache"));
                }
                result.transition = Transition::Committed;
                result.after = Some(after);
            }
            Err(RepoError::Refused(reason)) => {
                ws.restore(&before)?;
                ws.stop(&reason)?;
                result.transition = Transition::Refused;
                result.reason = Some(reason);
            }
            Err(e) => return Err(e),
        }
    }
    super::crash_point("receipt");
    // The head moves before anything attests it: a crash from here to the receipts leaves the
    // operation dispatched, so nothing runs before `recover` puts the head back.
    if let Some(after) = result.after.as_ref().filter(|a| **a != before) {
        ws.set_head(after)?;
    }
    super::crash_point("committed");
    lap("commit");
    result.timings_us = timings;
    // The terminal and tool-call receipts and the retained result: one transaction, one fsync.
    let drafts: Vec<Draft> =
        terminal.into_iter().chain([tool_call_draft(ws, req, &result, &launch_receipt)?]).collect();
    let retained = |appended: &[Appended]| {
        let mut r = result.clone();
        r.receipt_id = appended.last().map(|a| a.receipt.id.clone()).unwrap_or_default();
        serde_json::to_string(&r).unwrap_or_default()
    };
    let appended = store.op_complete_with_receipts(&req.operation_key, &key, drafts, retained)?;
    result.receipt_id = appended.last().map(|a| a.receipt.id.clone()).unwrap_or_default();
    Ok(result)
}

/// A retained result: the same answer as the first call.
fn replay(retained: &str) -> Result<ExecResult, RepoError> {
    let mut result: ExecResult = serde_json::from_str(retained).map_err(failed)?;
    result.replayed = true;
    Ok(result)
}

/// Output captured from a launch.
struct Captured {
    kept: Vec<u8>,
    total: u64,
}

/// What a command's cage leaves: its record, its enforcement receipt and the terminal receipt's
/// draft, its output, and its root (see [`ExecResult::root`]).
struct Caged {
    rec: LaunchRecord,
    launch_receipt: Appended,
    terminal: Option<Draft>,
    output: Captured,
    root: Option<chio_cage::RootKey>,
}

/// Launch the command's cage; the enforcement receipt is durable at the exec stop.
fn run_cage(
    ws: &Workspace,
    req: &ExecRequest,
    store: &mut Store,
    key: &chio_kernel::keys::SigningKey,
    ahead: chio_cage::Ahead,
) -> Result<Caged, RepoError> {
    let argv: Vec<OsString> =
        ["/bin/bash", "--noprofile", "--norc", "-c", req.command.as_str()].iter().map(OsString::from).collect();
    let mut o = PlanOptions::new(argv);
    o.workspace = Some(ws.live());
    o.uid = Some(ws.config.uid);
    o.gid = Some(ws.config.gid);
    o.limits = ws.config.limits.clone();
    o.limits.wall_ms = req.deadline_s * 1000;
    o.limits.output_bytes = OUTPUT_LIMIT;
    if let Some(id) = &ws.config.image_id {
        let store_dir = ws.settings.image_store.clone().ok_or_else(|| failed("settings.json names no image store"))?;
        o.image =
            Some(ImageChoice { store_dir: Some(store_dir), reference: id.clone(), entrypoint: Some(String::new()) });
    }
    o.annotations.insert("repository.operation_key".into(), req.operation_key.clone());
    o.annotations.insert("repository.workspace".into(), ws.config_digest.clone());
    let prepared = match launch::prepare(&LaunchRequest::new(o), None).map_err(|e| RepoError::Failed(e.to_string()))? {
        Ok(p) => p,
        Err(refusal) => return Err(failed(format!("refused: {}", refusal.violations.join("; ")))),
    };
    let out = File::from(memfd_create(c"chio-output", MFdFlags::MFD_CLOEXEC).map_err(failed)?);
    let io = Io { stdout: out.as_fd(), stderr: out.as_fd(), stdin: None };
    let how = How { ahead, ..How::default() };
    let launched = launch::run(&prepared, io, Receipts::Enforcement { store: &mut *store, key }, how);
    let rec = launched.record;
    let launch_receipt = match (launched.enforcement, launched.unrecorded) {
        (Some(e), _) => e,
        (None, why) => return Err(failed(format!("recording the enforcement receipt: {}", why.unwrap_or_default()))),
    };
    let terminal = receipts::terminal_draft(&rec, &launch_receipt)?;
    let root = launched.root;
    Ok(Caged { rec, launch_receipt, terminal, output: read_output(out)?, root })
}

fn read_output(mut f: File) -> Result<Captured, RepoError> {
    let total = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    let mut kept = Vec::new();
    f.take(OUTPUT_LIMIT).read_to_end(&mut kept)?;
    Ok(Captured { kept, total })
}

/// Walk the workspace (new contents into the object store) and check the change against the
/// scope.
fn walk(ws: &Workspace, before: &str) -> Result<(Index, StatCache), RepoError> {
    let cache = StatCache::load(&ws.dir.join("statcache"), before);
    // The sandbox's own git history and the scratch paths are the command's, never evidence.
    let skip: Vec<&str> = [".git"].into_iter().chain(ws.config.scratch_paths.iter().map(String::as_str)).collect();
    let (index, seen) = snapshot::walk(&ws.live(), &ws.objects, &ws.config.ceilings, &skip, cache.as_ref())?;
    // The cache's index hashes to `before` (checked when it was loaded); without one, the
    // stored snapshot is read.
    let previous = match cache {
        Some(c) => c.index,
        None => ws.snapshot(before)?,
    };
    check_scope(&ws.config.source_paths, &previous, &index)?;
    Ok((index, seen))
}

/// Every added, removed or changed entry must be inside a source path (directories above one
/// excepted).
pub fn check_scope(paths: &[String], before: &Index, after: &Index) -> Result<(), RepoError> {
    let changed = before.keys().chain(after.keys()).filter(|p| before.get(*p) != after.get(*p));
    for path in changed {
        // A directory above the scope may appear or go (with the scope inside it); it may not
        // turn into a file or a link.
        let dir_or_absent = |ix: &Index| ix.get(path).map_or(true, |n| *n == Node::Dir);
        let parent_dir = is_parent_of_scope(paths, path) && dir_or_absent(before) && dir_or_absent(after);
        if !in_scope(paths, path) && !parent_dir {
            return Err(RepoError::Refused(format!("{path:?} changed, and it is outside the source paths {paths:?}")));
        }
    }
    Ok(())
}

fn tool_call_draft(ws: &Workspace, req: &ExecRequest, r: &ExecResult, launch: &Appended) -> Result<Draft, RepoError> {
    let outcome = match r.transition {
        Transition::Committed => format!("exit:{}", r.exit_status),
        Transition::Refused => "refused".to_string(),
        Transition::LaunchFailed => "launch_failed".to_string(),
    };
    Ok(Draft {
        kind: Some(Kind::ToolCall),
        tool_server: ws.config.server_id.clone(),
        outcome,
        launch: Some(receipts::reference(launch)?),
        detail: Some(json!({
            "schema": "chio.repository.execute.v1",
            "workspace": ws.config_digest,
            "operation_key": req.operation_key,
            "command": req.command,
            "deadline_s": req.deadline_s,
            "transition": r.transition,
            "exit_status": r.exit_status,
            "output_sha256": r.output_sha256,
            "output_bytes": r.output_bytes,
            "output_dropped": r.output_dropped,
            "limits_hit": r.limits_hit,
            "before": r.before,
            "after": r.after,
            "reason": r.reason,
        })),
        ..Draft::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(c: char) -> Node {
        Node::File { sha256: c.to_string().repeat(64), size: 1, executable: false }
    }

    #[test]
    fn scope_allows_changes_inside_and_parent_directories_only() {
        let paths = vec!["pkg/src".to_string()];
        let mut before = Index::new();
        before.insert("pkg".into(), Node::Dir);
        before.insert("pkg/src".into(), Node::Dir);
        before.insert("pkg/src/a.py".into(), file('a'));
        let mut after = before.clone();
        after.insert("pkg/src/a.py".into(), file('b'));
        after.insert("pkg/src/new.py".into(), file('c'));
        check_scope(&paths, &before, &after).unwrap();
        let mut out = after.clone();
        out.insert("pkg/README".into(), file('d'));
        assert!(matches!(check_scope(&paths, &before, &out), Err(RepoError::Refused(_))));
        let mut out = after.clone();
        out.insert("top.txt".into(), file('d'));
        assert!(matches!(check_scope(&paths, &before, &out), Err(RepoError::Refused(_))));
        // Removing the scope's parent directory (with everything in it) is a change of scope
        // entries and of a parent directory only.
        check_scope(&paths, &before, &Index::new()).unwrap();
        // A parent directory replaced by a file is not a directory change.
        let mut out = Index::new();
        out.insert("pkg".into(), file('e'));
        assert!(check_scope(&paths, &before, &out).is_err());
    }
}
