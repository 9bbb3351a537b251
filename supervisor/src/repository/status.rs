//! `status`: what a workspace is and where it stands.

use std::collections::BTreeMap;

use serde::Serialize;

use super::workspace::{RepoError, Workspace};

/// A workspace's state.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// Workspace id.
    pub workspace_id: String,
    /// Digest of the configuration (bound by every receipt).
    pub config_digest: String,
    /// `active`, or `stopped` after a refused transition.
    pub state: String,
    /// Why it stopped.
    pub stopped_reason: Option<String>,
    /// The source commit.
    pub source_commit: String,
    /// The scope.
    pub source_paths: Vec<String>,
    /// Paths kept out of every snapshot.
    pub scratch_paths: Vec<String>,
    /// The baseline snapshot.
    pub baseline: String,
    /// The current snapshot.
    pub head: String,
    /// Snapshots stored.
    pub snapshots: usize,
    /// Receipts stored.
    pub receipts: u64,
    /// Operations by journal state.
    pub operations: BTreeMap<String, u64>,
}

/// Report the workspace's state.
pub fn status(ws: &Workspace) -> Result<Status, RepoError> {
    let store = chio_kernel::store::Store::open_read_only(&ws.dir.join("receipts.db"))?;
    let operations = store.op_counts()?;
    let stopped_reason = ws.stopped();
    Ok(Status {
        workspace_id: ws.config.workspace_id.clone(),
        config_digest: ws.config_digest.clone(),
        state: if stopped_reason.is_some() { "stopped" } else { "active" }.into(),
        stopped_reason,
        source_commit: ws.config.source_commit.clone(),
        source_paths: ws.config.source_paths.clone(),
        scratch_paths: ws.config.scratch_paths.clone(),
        baseline: ws.config.baseline.clone(),
        head: ws.head()?,
        snapshots: ws.snapshot_count()?,
        receipts: store.count()?,
        operations,
    })
}
