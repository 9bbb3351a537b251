//! A container's state on the host: one directory per container under the runtime's root
//! (`--root`, `/run/chio-oci` by default), holding `state.json`, the socket `start` speaks to
//! and the launch record once the start was observed.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The runtime's root when `--root` names none.
pub const DEFAULT_ROOT: &str = "/run/chio-oci";

/// What the runtime keeps of one container.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saved {
    /// The container's id.
    pub id: String,
    /// The bundle directory, absolute.
    pub bundle: PathBuf,
    /// The cage's init (the container's process as the engine sees it).
    pub pid: i32,
    /// The init's start time (field 22 of its `/proc/PID/stat`): a pid reused later is not it.
    pub pid_started: u64,
    /// The process holding the launch from `create` to `start`.
    pub holder: i32,
    /// Whether `start` released the container and saw its exec.
    pub started: bool,
    /// When it was created (RFC 3339).
    pub created: String,
    /// The launch cgroup's directories (one per v1 hierarchy, or the v2 one).
    pub cgroup: Vec<PathBuf>,
    /// The bundle's annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The container's plan, which a process `exec` runs in it is confined by too.
    #[serde(default)]
    pub plan: Option<chio_cage::CagePlan>,
}

/// A container's status in the spec's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Parked at its target's hello, waiting for `start`.
    Created,
    /// Started and its init alive.
    Running,
    /// Frozen by `pause`.
    Paused,
    /// Its init has ended.
    Stopped,
}

impl Status {
    /// The spec's name.
    pub fn name(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Stopped => "stopped",
        }
    }
}

/// A container id as runc accepts them: letters, digits, `_`, `+`, `-` and `.`, not `.`/`..`.
pub fn check_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 1024
        && id != "."
        && id != ".."
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b));
    match ok {
        true => Ok(()),
        false => Err(format!("invalid container id {id:?}: use letters, digits, '_', '+', '-' and '.'")),
    }
}

/// The container directories under one root.
pub struct Root(pub PathBuf);

impl Root {
    /// The directory of container `id`.
    pub fn dir(&self, id: &str) -> PathBuf {
        self.0.join(id)
    }

    /// Make the directory of a new container; an existing one is an error.
    pub fn make(&self, id: &str) -> Result<PathBuf, String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&self.0)
            .map_err(|e| format!("making the runtime root {}: {e}", self.0.display()))?;
        let dir = self.dir(id);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(format!("container {id:?} already exists (in {})", self.0.display()))
            }
            Err(e) => Err(format!("making {}: {e}", dir.display())),
        }
    }

    /// The saved state of `id`.
    pub fn load(&self, id: &str) -> Result<Saved, String> {
        check_id(id)?;
        let path = self.dir(id).join("state.json");
        let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("container {id:?} does not exist"),
            _ => format!("reading {}: {e}", path.display()),
        })?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{} does not parse: {e}", path.display()))
    }

    /// Write the state of a container atomically.
    pub fn save(&self, s: &Saved) -> Result<(), String> {
        let bytes = serde_json::to_vec(s).map_err(|e| e.to_string())?;
        write_atomic(&self.dir(&s.id).join("state.json"), &bytes)
    }
}

/// Write `bytes` to `path` through a temporary file and a rename, so a reader sees the old
/// file or the new one whole.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension("partial");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The start time of `pid` (field 22 of its stat), and whether it is a zombie.
pub fn started_at(pid: i32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split(' ').collect();
    // After "pid (comm) ": state is field 3, starttime field 22.
    Some((fields.get(19)?.parse().ok()?, fields.first() == Some(&"Z")))
}

impl Saved {
    /// Whether the container's init is still the process at its pid, and not a zombie.
    pub fn alive(&self) -> bool {
        started_at(self.pid).is_some_and(|(t, zombie)| t == self.pid_started && !zombie)
    }

    /// The container's status now.
    pub fn status(&self) -> Status {
        match (self.alive(), self.started) {
            (false, _) => Status::Stopped,
            (true, false) => Status::Created,
            (true, true) if super::cgroup::frozen(&self.cgroup) => Status::Paused,
            (true, true) => Status::Running,
        }
    }
}
