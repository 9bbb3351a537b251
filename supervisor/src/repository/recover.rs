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
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

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
    let mounts = mounts_below(&ws.dir);
    report
        .left_in_place
        .extend(mounts.iter().map(|m| format!("mount point {}: not made by chio; unmount it yourself", m.display())));
    report.temporary_removed = remove_temporaries(ws, &mounts)?;
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
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(std::ffi::OsString::from_vec(unescaped(m))))
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// A mount point as `/proc/self/mountinfo` writes it — space, tab, newline and backslash as
/// `\NNN` in octal — back to its bytes.
fn unescaped(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal.and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// Remove `tmp/*`, `objects/*/.tmp-*`, and `*.tmp` beside the state files — but a directory of
/// `tmp` that is or holds one of `mounts`, which is left in place with what is on it.
fn remove_temporaries(ws: &Workspace, mounts: &[PathBuf]) -> Result<usize, RepoError> {
    let mut n = 0;
    for e in fs::read_dir(ws.dir.join("tmp"))?.flatten() {
        let p = e.path();
        if mounts.iter().any(|m| m.starts_with(&p)) {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A mount point whose name holds a space, a tab, a newline or a backslash is matched
    /// under a workspace named with them (the table writes each as `\NNN`).
    #[test]
    fn mount_points_are_read_as_the_table_escapes_them() {
        assert_eq!(unescaped(r"/srv/my\040work\011x\012y\134z"), b"/srv/my work\tx\ny\\z");
        assert_eq!(unescaped(r"/a\04"), b"/a\\04", "a cut escape stays as it is");
        assert_eq!(unescaped(r"/a\999"), b"/a\\999");
    }
}
