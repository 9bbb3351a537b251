//! `export` and `verify-export`.
//!
//! A bundle is a directory: `workspace.json` (the configuration every receipt binds),
//! `kernel.pub`, `receipts.ndjson` (the original signed receipts, in chain order),
//! `transitions.json` (the ordered snapshot digests, each with its receipt id), `baseline.tar`,
//! `final.tar` and `changes.patch`. The recipient verifies it against a commit, a scope and a
//! key it chose itself: the bundle is evidence, never authority.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use chio_kernel::receipt::{self, Kind, Verified, GENESIS};
use chio_kernel::store::{Filter, Store};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::archive;
use super::execute::check_scope;
use super::git_source;
use super::patch::Trees;
use super::snapshot::{self, Index, Objects};
use super::workspace::{Config, RepoError, Workspace};

/// One committed transition of the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransitionEntry {
    /// The `tool_call` receipt that signed it.
    pub receipt_id: String,
    /// The operation key.
    pub operation_key: String,
    /// Snapshot before.
    pub before: String,
    /// Snapshot after.
    pub after: String,
}

/// `transitions.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transitions {
    /// The baseline snapshot.
    pub baseline: String,
    /// Committed transitions in order.
    pub transitions: Vec<TransitionEntry>,
    /// The final snapshot (the last `after`, or the baseline).
    pub final_snapshot: String,
}

/// What `export` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    /// Committed transitions.
    pub transitions: usize,
    /// Receipts.
    pub receipts: usize,
    /// The final snapshot.
    pub final_digest: String,
}

/// A scratch directory removed when dropped, held under a lock (`flock`) while it lives: the
/// lock, not its pid, is how [`sweep_stale`] knows a live chio still uses it.
pub(crate) struct Scratch {
    pub(crate) dir: PathBuf,
    _lock: Flock<fs::File>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A new scratch directory `chio-WHAT-PID-RANDOM` in `parent`, locked (the pid is for the
/// operator who finds one; see [`sweep_stale`]). It is made and locked under a name no sweep
/// matches and only then renamed: a sweep never sees it unlocked.
pub(crate) fn scratch(parent: &Path, what: &str) -> Result<Scratch, RepoError> {
    let mut rnd = [0u8; 8];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom")?, &mut rnd)?;
    let name = format!("chio-{what}-{}-{}", std::process::id(), chio_kernel::keys::hex(&rnd));
    let (making, dir) = (parent.join(format!(".{name}")), parent.join(name));
    // Private: it holds the recipient's own baseline (its source, perhaps not public) in /tmp.
    std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o700).create(&making)?;
    let locked = fs::File::open(&making)
        .and_then(|f| Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| io::Error::from(e)))
        .and_then(|lock| {
            let (at, no_replace) = (nix::fcntl::AT_FDCWD, nix::fcntl::RenameFlags::RENAME_NOREPLACE);
            nix::fcntl::renameat2(at, &making, at, &dir, no_replace).map(|()| lock).map_err(io::Error::from)
        });
    match locked {
        Ok(lock) => Ok(Scratch { dir, _lock: lock }),
        Err(e) => {
            let _ = fs::remove_dir(&making);
            Err(e.into())
        }
    }
}

/// Remove the `chio-WHAT-…` directories in `parent` that a chio killed before its scratch
/// directory's drop left: those of this user (never another's: `/tmp` is everyone's) that no
/// process holds locked. They hold a recipient's baseline — its source, perhaps not public. The
/// lock, not the pid in the name: a verify-export in another pid namespace sharing this `/tmp`
/// has a pid this one cannot see, and a dead one's pid may be reused.
pub(crate) fn sweep_stale(parent: &Path, what: &str) {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let prefix = format!("chio-{what}-");
    let Ok(entries) = fs::read_dir(parent) else { return };
    let me = nix::unistd::geteuid().as_raw();
    for e in entries.flatten() {
        if !e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
            continue;
        }
        // Never through a link; the directory checked is the one opened.
        let open = fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(e.path());
        let Ok(dir) = open else { continue };
        if !dir.metadata().is_ok_and(|m| m.uid() == me) {
            continue;
        }
        if let Ok(_unused) = Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            let _ = super::workspace::remove_tree(&e.path());
        }
    }
}

fn mismatch(m: impl Into<String>) -> RepoError {
    RepoError::Mismatch(m.into())
}

/// Verify receipts (envelope JSON, one per line) under `key` as one chain from the genesis.
fn verify_receipts(lines: &[String], key: &str) -> Result<Vec<Verified>, RepoError> {
    let mut out = Vec::with_capacity(lines.len());
    for (i, l) in lines.iter().enumerate() {
        out.push(
            receipt::verify(l.as_bytes(), key)
                .map_err(|e| mismatch(format!("receipt {} does not verify under the pinned key: {e}", i + 1)))?,
        );
    }
    if let Some((id, why)) = receipt::chain_breaks(&out, GENESIS.to_string(), 0).into_iter().next() {
        return Err(mismatch(format!("the receipt chain is broken at {id}: {why}")));
    }
    Ok(out)
}

/// The committed transitions the receipts attest, checked: every `tool_call` binds this
/// configuration and references a FullyEnforced launch receipt of the same chain, and the
/// committed ones follow each other from the baseline.
fn transitions_of(receipts: &[Verified], config_digest: &str, baseline: &str) -> Result<Transitions, RepoError> {
    let fully = serde_json::to_value(chio_cage::State::FullyEnforced).ok().and_then(|v| v.as_str().map(str::to_string));
    let mut launches = std::collections::HashMap::new();
    let mut list = Vec::new();
    let mut head = baseline.to_string();
    for r in receipts {
        match r.body.kind {
            Kind::LaunchEnforcement => {
                launches.insert(r.id.clone(), r);
            }
            Kind::ToolCall => {
                let d = r.body.detail.as_ref().ok_or_else(|| mismatch(format!("tool_call {} has no detail", r.id)))?;
                if d["workspace"].as_str() != Some(config_digest) {
                    return Err(mismatch(format!("tool_call {} binds another workspace configuration", r.id)));
                }
                // A file tool's read: no launch, no transition.
                if d["schema"] == super::file_tools::READ_SCHEMA {
                    continue;
                }
                let launch = r.body.launch.as_ref().and_then(|l| launches.get(&l.receipt_id).map(|e| (l, e)));
                let Some((_, enforcement)) = launch else {
                    return Err(mismatch(format!("tool_call {} references no launch receipt of this chain", r.id)));
                };
                if d["transition"] != "committed" {
                    continue;
                }
                if Some(&enforcement.body.outcome) != fully.as_ref() {
                    return Err(mismatch(format!(
                        "tool_call {} committed a change from a launch that was not FullyEnforced",
                        r.id
                    )));
                }
                let (before, after) = (d["before"].as_str().unwrap_or(""), d["after"].as_str().unwrap_or(""));
                if before != head {
                    return Err(mismatch(format!(
                        "tool_call {} starts from {before}, but the previous snapshot is {head} (a transition is missing or reordered)",
                        r.id
                    )));
                }
                head = after.to_string();
                list.push(TransitionEntry {
                    receipt_id: r.id.clone(),
                    operation_key: d["operation_key"].as_str().unwrap_or("").to_string(),
                    before: before.to_string(),
                    after: after.to_string(),
                });
            }
            _ => {}
        }
    }
    Ok(Transitions { baseline: baseline.to_string(), transitions: list, final_snapshot: head })
}

/// Every receipt of the workspace's store, in chain order, as stored.
fn stored_receipts(store: &Store) -> Result<Vec<String>, RepoError> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let rows = store.list(&Filter { after_seq: Some(after), limit: 1000, ..Filter::default() })?;
        let Some(last) = rows.last() else { break };
        after = last.seq;
        out.extend(rows.into_iter().map(|r| r.envelope));
    }
    Ok(out)
}

/// Write the bundle for `ws` to `out` (created; it must not exist). Missing or altered evidence
/// refuses the export.
/// The files of a bundle.
pub const BUNDLE_FILES: [&str; 7] = [
    "workspace.json",
    "kernel.pub",
    "receipts.ndjson",
    "transitions.json",
    "baseline.tar",
    "final.tar",
    "changes.patch",
];

/// Write the bundle of `ws` to the new directory `out`.
pub fn export(ws: &Workspace, out: &Path) -> Result<ExportReport, RepoError> {
    let key = &ws.config.kernel_public_key;
    let store = Store::open_read_only(&ws.dir.join("receipts.db"))?;
    let lines = stored_receipts(&store)?;
    let receipts = verify_receipts(&lines, key)?;
    let t = transitions_of(&receipts, &ws.config_digest, &ws.config.baseline)?;
    let head = ws.head()?;
    if t.final_snapshot != head {
        return Err(mismatch(format!(
            "the receipts end at {} but the workspace head is {head}; run `chio repository recover`",
            t.final_snapshot
        )));
    }
    let baseline = ws.snapshot(&ws.config.baseline)?;
    let last = ws.snapshot(&t.final_snapshot)?;
    fs::create_dir(out).map_err(|e| {
        RepoError::Usage(format!("--out {}: {e} (give a directory that does not exist)", out.display()))
    })?;
    let written = write_bundle(ws, out, &lines, &t, &baseline, &last);
    if written.is_err() {
        let _ = fs::remove_dir_all(out);
    }
    written?;
    Ok(ExportReport { transitions: t.transitions.len(), receipts: lines.len(), final_digest: t.final_snapshot })
}

fn write_bundle(
    ws: &Workspace,
    out: &Path,
    lines: &[String],
    t: &Transitions,
    baseline: &Index,
    last: &Index,
) -> Result<(), RepoError> {
    fs::write(out.join("workspace.json"), ws.config.canonical()?)?;
    fs::write(out.join("kernel.pub"), format!("{}\n", ws.config.kernel_public_key))?;
    fs::write(out.join("receipts.ndjson"), lines.iter().map(|l| format!("{l}\n")).collect::<String>())?;
    let tj = serde_json::to_vec_pretty(t).map_err(|e| RepoError::Failed(e.to_string()))?;
    fs::write(out.join("transitions.json"), tj)?;
    archive::write(baseline, &ws.objects, &out.join("baseline.tar"))?;
    archive::write(last, &ws.objects, &out.join("final.tar"))?;
    let tmp = scratch(&ws.dir.join("tmp"), "export")?;
    let trees = Trees::create(&tmp.dir.join("trees.git"))?;
    let a = trees.import(baseline, |sha| ws.objects.get(sha))?;
    let b = trees.import(last, |sha| ws.objects.get(sha))?;
    fs::write(out.join("changes.patch"), trees.diff(&a, &b)?)?;
    for f in BUNDLE_FILES {
        fs::File::open(out.join(f))?.sync_all()?;
    }
    fs::File::open(out)?.sync_all()?;
    Ok(())
}

/// What the recipient pins.
#[derive(Debug, Clone)]
pub struct VerifyRequest {
    /// The bundle directory.
    pub bundle: PathBuf,
    /// The recipient's checkout.
    pub repository: PathBuf,
    /// The revision the baseline must come from.
    pub revision: String,
    /// The scope.
    pub source_paths: Vec<String>,
    /// The kernel public key (hex).
    pub kernel_key: String,
    /// The server id the workspace must name.
    pub server_id: Option<String>,
}

/// The verification report (printed as JSON).
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Committed transitions verified from the baseline to the final archive.
    pub verified_transitions: usize,
    /// Receipts verified under the pinned key, as one chain.
    pub verified_receipts: usize,
    /// The scope checked.
    pub source_paths: Vec<String>,
    /// The recipient's own baseline equals the bundle's.
    pub baseline_matches: bool,
    /// The final archive is the last transition's snapshot.
    pub final_matches: bool,
    /// The patch turns the baseline into the final archive, inside the scope.
    pub patch_matches: bool,
    /// The first mismatch, when there is one.
    pub error: Option<String>,
}

/// Verify a bundle; the report names the first mismatch.
pub fn verify_export(r: &VerifyRequest) -> VerifyReport {
    verify_with_patch(r, None)
}

/// [`verify_export`] with `patch` in place of the bundle's `changes.patch` (the claims' edited
/// patch: the bundle itself is never written).
pub(crate) fn verify_with_patch(r: &VerifyRequest, patch: Option<&[u8]>) -> VerifyReport {
    let mut report = VerifyReport { source_paths: r.source_paths.clone(), ..VerifyReport::default() };
    if let Err(e) = verify_into(r, patch, &mut report) {
        report.error = Some(e.to_string());
    }
    report
}

/// Most bytes of a bundle's JSON or NDJSON file read into memory (64 MiB: some ten thousand
/// receipts).
const MAX_BUNDLE_TEXT: u64 = 64 << 20;

/// A file of the bundle, opened beneath its directory through no link and only if it is a
/// regular file (a FIFO is not waited on). The bundle is the sender's: a link in it (to
/// `/dev/zero`, to a file of the recipient's) would have the recipient read what the sender
/// chose, on the recipient's machine.
fn bundle_file(r: &VerifyRequest, name: &str) -> Result<fs::File, RepoError> {
    use std::os::fd::AsFd;
    let at = |e: std::io::Error| mismatch(format!("the bundle's {name}: {e}"));
    let dir = fs::File::open(&r.bundle).map_err(|e| mismatch(format!("the bundle {}: {e}", r.bundle.display())))?;
    let flags = libc::O_RDONLY | libc::O_NONBLOCK;
    let file = fs::File::from(chio_cage::path::open_beneath(dir.as_fd(), Path::new(name), flags).map_err(at)?);
    if !file.metadata().map_err(at)?.is_file() {
        return Err(mismatch(format!("the bundle's {name} is not a regular file")));
    }
    Ok(file)
}

pub(crate) fn read_bundle(r: &VerifyRequest, name: &str) -> Result<Vec<u8>, RepoError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    bundle_file(r, name)?
        .take(MAX_BUNDLE_TEXT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| mismatch(format!("the bundle's {name}: {e}")))?;
    if bytes.len() as u64 > MAX_BUNDLE_TEXT {
        return Err(mismatch(format!("the bundle's {name} is over {MAX_BUNDLE_TEXT} bytes")));
    }
    Ok(bytes)
}

fn verify_into(r: &VerifyRequest, patch: Option<&[u8]>, report: &mut VerifyReport) -> Result<(), RepoError> {
    // What an earlier verify of this user, killed, left: whatever this one's verdict.
    sweep_stale(&std::env::temp_dir(), "verify");
    let config = Config::parse(&read_bundle(r, "workspace.json")?)?;
    if config.kernel_public_key != r.kernel_key {
        return Err(mismatch(format!(
            "the workspace was signed by kernel key {}, not the pinned key",
            config.kernel_public_key
        )));
    }
    let mut want = r.source_paths.clone();
    let mut have = config.source_paths.clone();
    want.sort();
    have.sort();
    if want != have {
        return Err(mismatch(format!("the bundle's scope is {:?}, not {:?}", config.source_paths, r.source_paths)));
    }
    if let Some(want) = &r.server_id {
        match &config.server_id {
            Some(have) if have == want => {}
            Some(have) => {
                return Err(mismatch(format!("the bundle is for server id {have:?}, not the pinned {want:?}")));
            }
            None => {
                return Err(mismatch(format!(
                    "the bundle names no server id, and {want:?} was pinned (the workspace was initialised without --server-id)"
                )));
            }
        }
    }
    let config_digest = config.digest()?;
    // Every snapshot the workspace took held to its ceilings, so an archive past them is refused
    // as it is read: the verifier's memory and disk are bounded by the ceilings the receipts bind
    // (the configuration's digest), not by the size of a file the sender chose.
    let ceilings = config.ceilings;
    let tmp = scratch(&std::env::temp_dir(), "verify")?;
    let objects = Objects::open(&tmp.dir.join("objects"))?;
    // The recipient's own baseline, from its own checkout.
    let import_dir = tmp.dir.join("import");
    fs::create_dir(&import_dir)?;
    let (commit, own) =
        git_source::import(&r.repository, &r.revision, &r.source_paths, &objects, &config.ceilings, &import_dir, None)
            .map_err(|e| mismatch(format!("recomputing the baseline from {}: {e}", r.repository.display())))?;
    if commit != config.source_commit {
        return Err(mismatch(format!(
            "the bundle is from commit {}, not {commit} ({})",
            config.source_commit, r.revision
        )));
    }
    let bundled_baseline = archive::read(bundle_file(r, "baseline.tar")?, &objects, &ceilings)
        .map_err(|e| mismatch(format!("baseline.tar: {e}")))?;
    report.baseline_matches =
        snapshot::digest(&own) == config.baseline && snapshot::digest(&bundled_baseline) == config.baseline;
    if !report.baseline_matches {
        return Err(mismatch("the bundle's baseline is not the recipient's baseline"));
    }
    // Receipts and transitions.
    let text =
        String::from_utf8(read_bundle(r, "receipts.ndjson")?).map_err(|_| mismatch("receipts.ndjson is not UTF-8"))?;
    let lines: Vec<String> = text.lines().filter(|l| !l.is_empty()).map(str::to_string).collect();
    let receipts = verify_receipts(&lines, &r.kernel_key)?;
    report.verified_receipts = receipts.len();
    let derived = transitions_of(&receipts, &config_digest, &config.baseline)?;
    let stated: Transitions = serde_json::from_slice(&read_bundle(r, "transitions.json")?)
        .map_err(|e| mismatch(format!("transitions.json: {e}")))?;
    if stated != derived {
        return Err(mismatch(
            "transitions.json is not the transitions the receipts attest (edited, dropped or reordered)",
        ));
    }
    report.verified_transitions = derived.transitions.len();
    let last = archive::read(bundle_file(r, "final.tar")?, &objects, &ceilings)
        .map_err(|e| mismatch(format!("final.tar: {e}")))?;
    report.final_matches = snapshot::digest(&last) == derived.final_snapshot;
    if !report.final_matches {
        return Err(mismatch("final.tar is not the snapshot the last transition committed"));
    }
    // The patch: inside the scope, and exactly the baseline-to-final difference.
    check_scope(&r.source_paths, &own, &last)
        .map_err(|e| mismatch(format!("the final snapshot leaves the scope: {e}")))?;
    let trees = Trees::create(&tmp.dir.join("trees.git"))?;
    let base = trees.import(&own, |sha| objects.get(sha))?;
    let fin = trees.import(&last, |sha| objects.get(sha))?;
    let patch_file = match patch {
        None => bundle_file(r, "changes.patch")?,
        Some(bytes) => {
            let at = tmp.dir.join("substituted.patch");
            fs::write(&at, bytes)?;
            fs::File::open(&at)?
        }
    };
    let applied = trees.apply(&base, patch_file).map_err(|e| mismatch(format!("changes.patch: {e}")))?;
    report.patch_matches = applied == fin;
    if !report.patch_matches {
        return Err(mismatch("changes.patch does not turn the baseline into the final snapshot"));
    }
    Ok(())
}
