//! What a client may ask of the repository leg through the daemon. An admin anything `chio
//! repository` takes (an `init` without `--kernel-key` signs with the daemon's key). The
//! repository role: `execute`, `status` and `export` on a workspace granted to its uid, and
//! `init` of a granted workspace from one of the grant's `sources`, signed with the daemon's key
//! and on the daemon's image store. Paths are compared after resolving both sides, and the
//! command then names the grant's own paths, not the client's: a link the client swaps after the
//! check cannot point the operation elsewhere.

use std::path::{Path, PathBuf};

use super::config::{Role, WorkspaceGrant};
use super::job::Job;
use crate::repository_cmd::RepositoryCommand as R;

/// Check `cmd` against the peer's role and grants, putting the daemon's and the grant's paths in.
pub fn check(job: &Job, cmd: &mut R) -> Result<(), String> {
    let uid = job.uid;
    if job.role == Role::Admin {
        if let R::Init { kernel_key: key @ None, .. } = cmd {
            *key = Some(daemon_key(job)?);
        }
        return Ok(());
    }
    if job.role != Role::Repository {
        return Err(format!("uid {uid}: the repository operations need the admin or repository role"));
    }
    match cmd {
        R::Execute { state, .. } | R::Status { state, .. } | R::Export { state, .. } => {
            *state = existing_grant(job, state)?.state.clone();
            Ok(())
        }
        R::Init { state, repository, image_store, kernel_key, .. } => {
            if kernel_key.is_some() || image_store.is_some() {
                return Err(format!(
                    "uid {uid}: --kernel-key and --image-store are the supervisor's own (it signs with its key and \
                     runs on its image store): give neither"
                ));
            }
            let grant = new_grant(job, state)?;
            let source = granted_source(grant, repository).ok_or_else(|| {
                format!(
                    "repository {} is not a source granted to uid {uid} for workspace {} (sources in the \
                     supervisor's configuration)",
                    repository.display(),
                    grant.state.display()
                )
            })?;
            *state = grant.state.clone();
            *repository = source.clone();
            *kernel_key = Some(daemon_key(job)?);
            *image_store = Some(job.daemon.state_dir.clone());
            Ok(())
        }
        _ => Err(format!("uid {uid}: the repository role may run init, execute, status and export only")),
    }
}

fn daemon_key(job: &Job) -> Result<PathBuf, String> {
    job.daemon.kernel_key.clone().ok_or_else(|| {
        "this supervisor has no kernel_key: a workspace it creates needs one to sign its receipts \
         (kernel_key in its configuration)"
            .to_string()
    })
}

fn not_granted(job: &Job, state: &Path) -> String {
    format!(
        "workspace {} is not granted to uid {} (workspaces in the supervisor's configuration)",
        state.display(),
        job.uid
    )
}

/// The grant naming the existing workspace `state`.
fn existing_grant<'j>(job: &'j Job, state: &Path) -> Result<&'j WorkspaceGrant, String> {
    // A path that does not resolve is "not granted" too: the daemon resolves as root, and its
    // error would tell the client whether a path it cannot see exists.
    let resolved = std::fs::canonicalize(state).map_err(|_| not_granted(job, state))?;
    let same = |w: &&WorkspaceGrant| std::fs::canonicalize(&w.state).is_ok_and(|w| w == resolved);
    job.daemon.workspaces.iter().find(same).ok_or_else(|| not_granted(job, state))
}

/// The grant naming the workspace `state` that `init` is to create (it need not exist yet: its
/// parent is resolved, and the last component compared).
fn new_grant<'j>(job: &'j Job, state: &Path) -> Result<&'j WorkspaceGrant, String> {
    let target = resolve_new(state).ok_or_else(|| not_granted(job, state))?;
    let same = |w: &&WorkspaceGrant| resolve_new(&w.state).is_some_and(|w| w == target);
    job.daemon.workspaces.iter().find(same).ok_or_else(|| not_granted(job, state))
}

fn resolve_new(p: &Path) -> Option<PathBuf> {
    let name = p.file_name()?;
    Some(std::fs::canonicalize(p.parent()?).ok()?.join(name))
}

fn granted_source<'g>(grant: &'g WorkspaceGrant, repository: &Path) -> Option<&'g PathBuf> {
    let resolved = std::fs::canonicalize(repository).ok()?;
    grant.sources.iter().find(|s| std::fs::canonicalize(s).is_ok_and(|s| s == resolved))
}
