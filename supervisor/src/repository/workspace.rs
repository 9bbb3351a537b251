//! One workspace's state directory and its configuration.
//!
//! ```text
//! STATE/workspace.json    the configuration (canonical JSON; its digest is bound by every receipt)
//! STATE/settings.json     host settings that are not evidence (kernel key file, image store)
//! STATE/workspace/        the live directory, bound at /workspace in each command's cage
//! STATE/objects/          content-addressed file contents, shared by all snapshots
//! STATE/snapshots/H.json  one index per snapshot
//! STATE/head              the current snapshot's digest
//! STATE/stopped           present when a refused transition stopped the workspace (the reason)
//! STATE/receipts.db       receipts and the operation journal
//! STATE/lock              one operation at a time
//! STATE/tmp/              scratch (restores, git readers), emptied by recovery
//! ```

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use chio_cage::Limits;
use chio_kernel::keys::{self, SigningKey};
use chio_kernel::store::{Store, StoreError};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::git_source::{self, SourceError};
use super::snapshot::{self, Ceilings, Index, Objects, SnapshotError};

/// Schema of a workspace configuration.
pub const CONFIG_SCHEMA: &str = "chio.repository.workspace.v1";
/// The uid and gid a command runs as (and owns the live workspace).
pub const COMMAND_ID: u32 = 65534;

/// Why a repository operation was refused or failed. Each kind has an exit code.
#[derive(Debug)]
pub enum RepoError {
    /// Bad input: a missing workspace, a bad path, an invalid argument (exit 2).
    Usage(String),
    /// The change or the request is refused by a check (exit 3).
    Refused(String),
    /// The operation key was used for another request, or its outcome is unknown (exit 4).
    Conflict(String),
    /// Evidence does not verify (exit 5).
    Mismatch(String),
    /// The system failed (exit 1).
    Failed(String),
}

impl RepoError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            RepoError::Failed(_) => 1,
            RepoError::Usage(_) => 2,
            RepoError::Refused(_) => 3,
            RepoError::Conflict(_) => 4,
            RepoError::Mismatch(_) => 5,
        }
    }
}

impl std::fmt::Display for RepoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RepoError::Usage(m) => write!(f, "{m}"),
            RepoError::Refused(m) => write!(f, "refused: {m}"),
            RepoError::Conflict(m) => write!(f, "conflict: {m}"),
            RepoError::Mismatch(m) => write!(f, "verification failed: {m}"),
            RepoError::Failed(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for RepoError {}

impl From<io::Error> for RepoError {
    fn from(e: io::Error) -> Self {
        RepoError::Failed(e.to_string())
    }
}

impl From<StoreError> for RepoError {
    fn from(e: StoreError) -> Self {
        RepoError::Failed(e.to_string())
    }
}

impl From<SnapshotError> for RepoError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Refused(r) => RepoError::Refused(r),
            SnapshotError::Io(e) => RepoError::Failed(e.to_string()),
        }
    }
}

impl From<SourceError> for RepoError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::Refused(r) => RepoError::Refused(r),
            SourceError::Io(e) => RepoError::Failed(e.to_string()),
        }
    }
}

/// What a workspace is: bound into every receipt by its digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Always [`CONFIG_SCHEMA`].
    pub schema: String,
    /// Random id of this workspace.
    pub workspace_id: String,
    /// The server this workspace serves, if named.
    pub server_id: Option<String>,
    /// The full commit the baseline came from.
    pub source_commit: String,
    /// The literal source paths (the scope).
    pub source_paths: Vec<String>,
    /// Scratch paths inside the scope (build output such as `pkg/target`): kept in the live
    /// workspace across commands, never looked into by the walk, never part of a snapshot, a
    /// scope check, an archive or the patch. Absent when there are none (older configurations
    /// keep their digest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scratch_paths: Vec<String>,
    /// The image commands run on (`None`: the host's system directories, read-only).
    pub image_id: Option<String>,
    /// Digest of the baseline snapshot.
    pub baseline: String,
    /// Cage ceilings of every command (the deadline is per command).
    pub limits: Limits,
    /// Snapshot ceilings.
    pub ceilings: Ceilings,
    /// uid and gid commands run as.
    pub uid: u32,
    /// gid commands run as.
    pub gid: u32,
    /// The kernel key that signs this workspace's receipts (hex).
    pub kernel_public_key: String,
}

impl Config {
    /// The canonical bytes (what is stored and digested).
    pub fn canonical(&self) -> Result<Vec<u8>, RepoError> {
        canonical_json(self)
    }

    /// `sha256:` of the canonical bytes.
    pub fn digest(&self) -> Result<String, RepoError> {
        json_digest(self)
    }

    /// Parse stored bytes (refusing unknown fields and other schemas).
    pub fn parse(bytes: &[u8]) -> Result<Config, RepoError> {
        let c: Config = serde_json::from_slice(bytes)
            .map_err(|e| RepoError::Mismatch(format!("not a workspace configuration: {e}")))?;
        if c.schema != CONFIG_SCHEMA {
            return Err(RepoError::Mismatch(format!("configuration schema {:?} is not {CONFIG_SCHEMA}", c.schema)));
        }
        // `init` never writes one: a command run as uid 0 would read and write as root whatever
        // its cage shows it, the live tree (a host directory) among it.
        if c.uid == 0 || c.gid == 0 {
            return Err(RepoError::Mismatch(format!(
                "the configuration runs commands as uid {} gid {}: a workspace's commands never run as root",
                c.uid, c.gid
            )));
        }
        Ok(c)
    }
}

/// RFC 8785 bytes of a serializable value (what is stored, signed over and digested).
pub fn canonical_json(v: &impl Serialize) -> Result<Vec<u8>, RepoError> {
    let v = serde_json::to_value(v).map_err(|e| RepoError::Failed(e.to_string()))?;
    chio_kernel::canonical::to_canonical(&v).map(String::into_bytes).map_err(|e| RepoError::Failed(format!("{e:?}")))
}

/// `sha256:` over [`canonical_json`].
pub fn json_digest(v: &impl Serialize) -> Result<String, RepoError> {
    Ok(format!("sha256:{}", snapshot::hex_sha256(&canonical_json(v)?)))
}

/// Host settings of a workspace (not evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The kernel signing seed's file.
    pub kernel_key: PathBuf,
    /// The image store's state directory (when the workspace runs on an image).
    pub image_store: Option<PathBuf>,
}

/// What `init` needs.
#[derive(Debug, Clone)]
pub struct InitRequest {
    /// The state directory to create (missing or empty).
    pub state: PathBuf,
    /// The source repository (a checkout or a bare repository).
    pub repository: PathBuf,
    /// A branch, tag or commit id.
    pub revision: String,
    /// The literal source paths.
    pub source_paths: Vec<String>,
    /// Scratch paths (see [`Config::scratch_paths`]).
    pub scratch_paths: Vec<String>,
    /// An imported image (reference or ID) and its store; `None` runs on the host's system
    /// directories.
    pub image: Option<(PathBuf, String)>,
    /// The kernel signing seed's file.
    pub kernel_key: PathBuf,
    /// Server id recorded in the configuration.
    pub server_id: Option<String>,
    /// Whose rights the source is read with (a daemon's client; None: this process's own).
    pub read_as: Option<git_source::ReadAs>,
}

/// An open workspace, locked for one operation.
pub struct Workspace {
    /// The state directory.
    pub dir: PathBuf,
    /// The configuration.
    pub config: Config,
    /// Its digest.
    pub config_digest: String,
    /// Host settings.
    pub settings: Settings,
    /// The object store.
    pub objects: Objects,
    _lock: Flock<File>,
}

pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Remove the directory `path` and its tree, a tree a command may have written: no link
/// followed, however deep it nests ([`chio_cage::path::remove_tree`]).
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}: no parent", path.display())));
    };
    let parent = chio_cage::path::open_host(parent, libc::O_DIRECTORY)?;
    chio_cage::path::remove_tree(std::os::fd::AsFd::as_fd(&parent), name)
}

/// The state directory `dir` of a workspace or session, resolved, and only if no one but root
/// can replace it or a directory above it ([`chio_cage::path::private_dir`]): whoever could
/// would choose the configuration — the command's uid among it — and the key path a root
/// process acts on.
pub(crate) fn state_dir(dir: &Path, kind: &str) -> Result<PathBuf, RepoError> {
    if !dir.exists() {
        return Err(RepoError::Usage(format!(
            "{} is not a {kind} (it does not exist); create it with `chio {kind} init`",
            dir.display()
        )));
    }
    private(dir)
}

fn private(dir: &Path) -> Result<PathBuf, RepoError> {
    chio_cage::path::private_dir(dir).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => RepoError::Refused(format!("state directory {}: {e}", dir.display())),
        _ => RepoError::Usage(format!("state directory {}: {e}", dir.display())),
    })
}

/// A new state directory at `dir`: made (0700) in a private directory, or one already there,
/// empty and private itself. Returns it resolved, and whether it was made here.
pub(crate) fn new_state_dir(dir: &Path) -> Result<(PathBuf, bool), RepoError> {
    let dir = std::path::absolute(dir)?;
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(RepoError::Usage(format!("state directory {}: not a directory's name", dir.display())));
    };
    let dir = private(parent)?.join(name);
    match fs::read_dir(&dir).map(|mut d| d.next().is_some()) {
        Ok(true) => Err(RepoError::Usage(format!("state directory {} is not empty", dir.display()))),
        Ok(false) => {
            let dir = private(&dir)?;
            // As a new one would be: the live tree below holds whatever commands made, for no
            // one else to reach.
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
            Ok((dir, false))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new().mode(0o700).create(&dir)?;
            Ok((dir, true))
        }
        Err(e) => Err(RepoError::Usage(format!("state directory {}: {e}", dir.display()))),
    }
}

pub(crate) fn random_hex(n: usize) -> io::Result<String> {
    let mut b = vec![0u8; n];
    io::Read::read_exact(&mut File::open("/dev/urandom")?, &mut b)?;
    Ok(keys::hex(&b))
}

/// Create a workspace: import the baseline, write the configuration, materialize the live
/// directory. Nothing is left behind when it fails.
pub fn init(r: &InitRequest) -> Result<Workspace, RepoError> {
    let key = keys::read_seed(&r.kernel_key).map_err(|e| RepoError::Usage(format!("--kernel-key: {e}")))?;
    git_source::check_source_paths(&r.source_paths)?;
    if let Some(id) = &r.server_id {
        check_server_id(id)?;
    }
    let mut r = r.clone();
    let created;
    (r.state, created) = new_state_dir(&r.state)?;
    let result = init_in(&r, &key);
    if result.is_err() && created {
        let _ = fs::remove_dir_all(&r.state);
    } else if result.is_err() {
        // Only what init itself created: the directory was empty.
        if let Ok(entries) = fs::read_dir(&r.state) {
            for e in entries.flatten() {
                let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
            }
        }
    }
    result
}

/// A server id is a name an operator types and reads in receipts: 1 to 128 characters, none of
/// them a control character or white space.
fn check_server_id(id: &str) -> Result<(), RepoError> {
    if id.is_empty() || id.len() > 128 || id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(RepoError::Usage(format!(
            "--server-id {id:?}: give 1 to 128 characters, no white space or control characters"
        )));
    }
    Ok(())
}

fn init_in(r: &InitRequest, key: &SigningKey) -> Result<Workspace, RepoError> {
    let dir = &r.state;
    let image_id = match &r.image {
        Some((store_dir, reference)) => {
            let store = crate::image::store::ImageStore::open_existing(store_dir)
                .map_err(|e| RepoError::Usage(format!("image store {}: {e}", store_dir.display())))?;
            Some(store.find(reference).map_err(|e| RepoError::Usage(e.to_string()))?.image_id)
        }
        None => None,
    };
    for sub in ["objects", "snapshots", "tmp"] {
        fs::DirBuilder::new().mode(0o700).create(dir.join(sub))?;
    }
    let objects = Objects::open(&dir.join("objects"))?;
    let ceilings = Ceilings::default();
    let scratch = dir.join("tmp").join("import");
    fs::create_dir(&scratch)?;
    let imported =
        git_source::import(&r.repository, &r.revision, &r.source_paths, &objects, &ceilings, &scratch, r.read_as);
    fs::remove_dir_all(&scratch)?;
    let (commit, index) = imported?;
    check_scratch_paths(&r.scratch_paths, &r.source_paths, &index)?;
    let baseline = write_snapshot(dir, &objects, &index)?;
    let config = Config {
        schema: CONFIG_SCHEMA.into(),
        workspace_id: random_hex(16)?,
        server_id: r.server_id.clone(),
        source_commit: commit,
        source_paths: r.source_paths.clone(),
        scratch_paths: r.scratch_paths.clone(),
        image_id,
        baseline: baseline.clone(),
        limits: Limits::default(),
        ceilings,
        uid: COMMAND_ID,
        gid: COMMAND_ID,
        kernel_public_key: keys::hex(key.verifying_key().as_bytes()),
    };
    let settings = Settings {
        kernel_key: std::path::absolute(&r.kernel_key)?,
        image_store: r.image.as_ref().map(|(d, _)| std::path::absolute(d)).transpose()?,
    };
    let live = dir.join("workspace");
    fs::DirBuilder::new().mode(0o755).create(&live)?;
    nix::unistd::chown(&live, Some(COMMAND_ID.into()), Some(COMMAND_ID.into())).map_err(io::Error::from)?;
    snapshot::materialize(&index, &objects, &live, Some((COMMAND_ID, COMMAND_ID)))?;
    let message = format!("baseline: {} {:?}\n", config.source_commit, config.source_paths);
    super::patch::Trees::sandbox_history(&live, &index, |sha| objects.get(sha), &message)?;
    chown_tree(&live.join(".git"), COMMAND_ID)?;
    let mut store = Store::open(&dir.join("receipts.db"), true)?;
    store.bind_key(key)?;
    write_durably(&dir.join("settings.json"), &serde_json::to_vec_pretty(&settings).map_err(io::Error::other)?)?;
    write_durably(&dir.join("head"), baseline.as_bytes())?;
    // Written last: a directory with a configuration is a complete workspace.
    write_durably(&dir.join("workspace.json"), &config.canonical()?)?;
    open(dir)
}

/// At most this many scratch paths.
pub const MAX_SCRATCH_PATHS: usize = 16;

/// Scratch paths: canonical, strictly inside a source path, none inside another, and nothing of
/// the committed baseline at or under one (committed files are never scratch).
pub fn check_scratch_paths(scratch: &[String], sources: &[String], baseline: &Index) -> Result<(), RepoError> {
    if scratch.len() > MAX_SCRATCH_PATHS {
        return Err(RepoError::Usage(format!("{} scratch paths: give at most {MAX_SCRATCH_PATHS}", scratch.len())));
    }
    let under = |p: &str, q: &str| p.strip_prefix(q).is_some_and(|r| r.starts_with('/'));
    for (i, p) in scratch.iter().enumerate() {
        snapshot::check_path(p).map_err(|e| RepoError::Usage(format!("scratch path {e}")))?;
        if sources != [git_source::WHOLE_TREE] && !sources.iter().any(|s| under(p, s)) {
            return Err(RepoError::Usage(format!("scratch path {p:?} is not inside a source path {sources:?}")));
        }
        if let Some(q) = scratch[i + 1..].iter().find(|q| *q == p || under(p, q) || under(q, p)) {
            return Err(RepoError::Usage(format!("scratch paths {p:?} and {q:?} overlap")));
        }
        if let Some(c) = baseline.keys().find(|k| *k == p || under(k, p)) {
            return Err(RepoError::Usage(format!(
                "scratch path {p:?}: {c:?} is committed at the source revision; committed files are never scratch"
            )));
        }
    }
    Ok(())
}

/// Hand a tree chio just created to `id` (never one a command has touched: no link is followed).
fn chown_tree(path: &Path, id: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(id), Some(id))?;
    if fs::symlink_metadata(path)?.is_dir() {
        for e in fs::read_dir(path)? {
            chown_tree(&e?.path(), id)?;
        }
    }
    Ok(())
}

/// Store an index as a snapshot (durably); returns its digest.
pub fn write_snapshot(dir: &Path, objects: &Objects, index: &Index) -> Result<String, RepoError> {
    let bytes = snapshot::canonical_bytes(index);
    let digest = format!("sha256:{}", snapshot::hex_sha256(&bytes));
    let path = snapshot_path(dir, &digest);
    if !path.exists() {
        // Its objects first: nothing may name an object that a power loss could take back.
        objects.sync()?;
        write_durably(&path, &bytes)?;
    }
    Ok(digest)
}

fn snapshot_path(dir: &Path, digest: &str) -> PathBuf {
    dir.join("snapshots").join(format!("{}.json", digest.trim_start_matches("sha256:")))
}

/// A workspace's host settings (the kernel seed's file, the image store), read without its
/// lock: they are written once, at init.
pub fn read_settings(dir: &Path) -> Result<Settings, RepoError> {
    serde_json::from_slice(&fs::read(dir.join("settings.json"))?)
        .map_err(|e| RepoError::Failed(format!("settings.json: {e}")))
}

/// Open an existing workspace and take its lock (waiting for a running operation to end).
pub fn open(dir: &Path) -> Result<Workspace, RepoError> {
    let dir = &state_dir(dir, "workspace")?;
    let bytes = fs::read(dir.join("workspace.json")).map_err(|e| {
        RepoError::Usage(format!(
            "{} is not a workspace (no workspace.json: {e}); create it with `chio repository init`",
            dir.display()
        ))
    })?;
    let lock = fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(dir.join("lock"))?;
    let lock = Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?;
    let config = Config::parse(&bytes)?;
    let settings = read_settings(dir)?;
    Ok(Workspace {
        dir: dir.to_path_buf(),
        config_digest: config.digest()?,
        config,
        settings,
        objects: Objects::open(&dir.join("objects"))?,
        _lock: lock,
    })
}

impl Workspace {
    /// The live directory.
    pub fn live(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    /// The current snapshot's digest.
    pub fn head(&self) -> Result<String, RepoError> {
        Ok(fs::read_to_string(self.dir.join("head"))?.trim().to_string())
    }

    /// Make `digest` the current snapshot.
    pub fn set_head(&self, digest: &str) -> Result<(), RepoError> {
        Ok(write_durably(&self.dir.join("head"), digest.as_bytes())?)
    }

    /// A stored snapshot.
    pub fn snapshot(&self, digest: &str) -> Result<Index, RepoError> {
        let bytes = fs::read(snapshot_path(&self.dir, digest))
            .map_err(|e| RepoError::Failed(format!("snapshot {digest}: {e}")))?;
        let index = snapshot::parse_index(&bytes)?;
        if snapshot::digest(&index) != digest {
            return Err(RepoError::Mismatch(format!("snapshot {digest} does not match its digest")));
        }
        Ok(index)
    }

    /// Number of stored snapshots.
    pub fn snapshot_count(&self) -> Result<usize, RepoError> {
        Ok(fs::read_dir(self.dir.join("snapshots"))?
            .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "json")))
            .count())
    }

    /// Why the workspace is stopped, if it is.
    pub fn stopped(&self) -> Option<String> {
        fs::read_to_string(self.dir.join("stopped")).ok()
    }

    /// Stop the workspace with `reason` (later commands are refused).
    pub fn stop(&self, reason: &str) -> Result<(), RepoError> {
        Ok(write_durably(&self.dir.join("stopped"), reason.as_bytes())?)
    }

    /// The kernel key, checked against the configuration.
    pub fn kernel_key(&self) -> Result<SigningKey, RepoError> {
        let key = keys::read_seed(&self.settings.kernel_key)
            .map_err(|e| RepoError::Failed(format!("kernel key {}: {e}", self.settings.kernel_key.display())))?;
        if keys::hex(key.verifying_key().as_bytes()) != self.config.kernel_public_key {
            return Err(RepoError::Refused(format!(
                "the kernel key {} is not the key this workspace was created with",
                self.settings.kernel_key.display()
            )));
        }
        Ok(key)
    }

    /// The receipt store (bound to the kernel key).
    pub fn store(&self, key: &SigningKey) -> Result<Store, RepoError> {
        let mut store = Store::open(&self.dir.join("receipts.db"), false)?;
        store.bind_key(key)?;
        Ok(store)
    }

    /// Put the live directory back to snapshot `digest`: built beside it, then exchanged with it
    /// in one rename, then the old tree removed.
    pub fn restore(&self, digest: &str) -> Result<(), RepoError> {
        let index = self.snapshot(digest)?;
        let tmp = self.dir.join("tmp");
        let fresh = tmp.join(format!("restore-{}", random_hex(8)?));
        fs::DirBuilder::new().mode(0o755).create(&fresh)?;
        nix::unistd::chown(&fresh, Some(self.config.uid.into()), Some(self.config.gid.into()))
            .map_err(io::Error::from)?;
        snapshot::materialize(&index, &self.objects, &fresh, Some((self.config.uid, self.config.gid)))?;
        // The sandbox's own history is not part of a snapshot: it moves over as it is.
        let history = self.live().join(".git");
        if fs::symlink_metadata(&history).is_ok() {
            fs::rename(&history, fresh.join(".git"))?;
        }
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &fresh,
            nix::fcntl::AT_FDCWD,
            &self.live(),
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .map_err(io::Error::from)?;
        // `fresh` now names the old tree, the command's: however deep it nests, it goes.
        remove_tree(&fresh)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped example (validated against the JSON Schema by the kernel's schema test) is
    /// exactly what this type reads and writes.
    #[test]
    fn the_schema_example_is_a_config() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/examples/repository-workspace.json");
        let example: serde_json::Value = serde_json::from_slice(&fs::read(p).unwrap()).unwrap();
        let config = Config::parse(example.to_string().as_bytes()).unwrap();
        assert_eq!(serde_json::to_value(&config).unwrap(), example);
        for (k, v) in [("uid", 0), ("gid", 0)] {
            let mut root = example.clone();
            root[k] = v.into();
            let err = Config::parse(root.to_string().as_bytes()).unwrap_err().to_string();
            assert!(err.contains("never run as root"), "{k}: {err}");
        }
    }
}
