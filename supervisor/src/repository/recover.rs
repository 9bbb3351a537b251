//! `recover`: after a crash at any point, bring the workspace back to what its signed receipts
//! say, and say what was done.
//!
//! - Launch cgroups of this workspace's launches (named in their enforcement receipts) that
//!   still exist are killed and removed — the cage's init dies with its supervisor and the
//!   janitor removes the cgroup, so this is the net under both.
//! - Temporary files (half-written objects and snapshots, restores and git scratch) are removed.
//! - The head becomes the last committed transition the receipts attest, and the live directory
//!   is rebuilt from that snapshot (a command killed mid-run may have left anything there).
//! - The journal: dispatched operations become `outcome_unknown` (never run again), pending ones
//!   `abandoned` (may be claimed again: nothing ran).
//!
//! What it cannot prove safe (a cgroup it cannot remove, a mount below the state directory) is
//! left in place and reported.

use std::fs;
use std::path::Path;

use chio_kernel::receipt::Kind;
use chio_kernel::store::{Filter, Store};
use serde::Serialize;

use super::workspace::{RepoError, Workspace};

/// What `recover` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoverReport {
    /// Launch cgroups found and removed.
    pub cgroups_removed: Vec<String>,
    /// Temporary files and directories removed.
    pub temporary_removed: usize,
    /// The snapshot the workspace was restored to.
    pub restored_to: String,
    /// The head before recovery, when it differed.
    pub head_was: Option<String>,
    /// Operations now `outcome_unknown`.
    pub outcome_unknown: usize,
    /// Operations now `abandoned`.
    pub abandoned: usize,
    /// Things left in place, with why.
    pub left_in_place: Vec<String>,
}

/// Recover the workspace (see the module docs).
pub fn recover(ws: &Workspace) -> Result<RecoverReport, RepoError> {
    let key = ws.kernel_key()?;
    let mut store = ws.store(&key)?;
    let mut report = RecoverReport::default();
    reclaim_cgroups(ws, &store, &mut report)?;
    report.left_in_place.extend(mounts_below(&ws.dir));
    report.temporary_removed = remove_temporaries(ws)?;
    let committed = last_committed(ws, &store)?;
    let head = ws.head()?;
    if head != committed {
        report.head_was = Some(head);
    }
    ws.restore(&committed)?;
    ws.set_head(&committed)?;
    report.restored_to = committed;
    let (unknown, abandoned) = store.op_recover()?;
    report.outcome_unknown = unknown;
    report.abandoned = abandoned;
    Ok(report)
}

/// Every enforcement receipt of this workspace names its launch cgroup; remove those that
/// still exist.
fn reclaim_cgroups(ws: &Workspace, store: &Store, report: &mut RecoverReport) -> Result<(), RepoError> {
    each_body(store, Kind::LaunchEnforcement, |id, body| {
        let record = &body["launch_record"];
        if record["annotations"]["repository.workspace"].as_str() != Some(ws.config_digest.as_str()) {
            return;
        }
        let paths: Vec<String> = record["cgroup"]["paths"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str().map(str::to_string))
            .collect();
        match chio_cage::cgroup::reclaim(&paths) {
            Ok(removed) => report.cgroups_removed.extend(removed),
            Err(e) => report.left_in_place.push(format!("launch cgroup of receipt {id}: {e}")),
        }
    })
}

/// Call `f` with the id and body of every stored receipt of `kind`, in chain order.
fn each_body(store: &Store, kind: Kind, mut f: impl FnMut(&str, &serde_json::Value)) -> Result<(), RepoError> {
    let mut after = 0;
    loop {
        let filter = Filter { kind: Some(kind.name().into()), after_seq: Some(after), limit: 500, ..Filter::default() };
        let rows = store.list(&filter)?;
        let Some(last) = rows.last() else { return Ok(()) };
        after = last.seq;
        for row in rows {
            let env: serde_json::Value =
                serde_json::from_str(&row.envelope).map_err(|e| RepoError::Failed(e.to_string()))?;
            f(&row.id, &env["body"]);
        }
    }
}

/// Mount points at or below `dir` (none is ever made there; one would be someone else's).
fn mounts_below(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| *m == prefix || m.starts_with(&format!("{prefix}/")))
        .map(|m| format!("mount point {m}: not made by chio; unmount it yourself"))
        .collect()
}

/// Remove `tmp/*`, `objects/*/.tmp-*`, and `*.tmp` beside the state files.
fn remove_temporaries(ws: &Workspace) -> Result<usize, RepoError> {
    let mut n = 0;
    for e in fs::read_dir(ws.dir.join("tmp"))?.flatten() {
        let p = e.path();
        if e.file_type()?.is_dir() {
            // A restore's old tree, the command's, may be here: removed however deep it nests.
            super::workspace::remove_tree(&p)?
        } else {
            fs::remove_file(&p)?
        }
        n += 1;
    }
    for fan in fs::read_dir(ws.dir.join("objects"))?.flatten() {
        if !fan.file_type()?.is_dir() {
            continue;
        }
        for e in fs::read_dir(fan.path())?.flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                fs::remove_file(e.path())?;
                n += 1;
            }
        }
    }
    for dir in [ws.dir.clone(), ws.dir.join("snapshots")] {
        for e in fs::read_dir(&dir)?.flatten() {
            if e.path().extension().is_some_and(|x| x == "tmp") {
                fs::remove_file(e.path())?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// The last committed snapshot the receipts attest (the baseline when there is none).
fn last_committed(ws: &Workspace, store: &Store) -> Result<String, RepoError> {
    let mut head = ws.config.baseline.clone();
    each_body(store, Kind::ToolCall, |_, body| {
        let d = &body["detail"];
        if d["workspace"].as_str() == Some(ws.config_digest.as_str()) && d["transition"] == "committed" {
            if let Some(a) = d["after"].as_str() {
                head = a.to_string();
            }
        }
    })?;
    // The snapshot must be there, whole.
    ws.snapshot(&head)?;
    Ok(head)
}
