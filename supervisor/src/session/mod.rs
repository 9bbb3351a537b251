//! Governed sessions (DESIGN §9): an agent works one task on one committed slice of a repository.
//! `init` writes a provisioning request that grants nothing; `prepare` admits the operator's
//! signed authorization of exactly that request; `run` starts the model gateway and the
//! repository leg on the host side and the worker (mini-swe-agent) in its own cage with no
//! network, which reaches them only through two Unix sockets bound into it; `result` is the
//! repository export plus the agent's trajectory.
//!
//! ```text
//! STATE/session.json                 the configuration (canonical)
//! STATE/task.md                      the task
//! STATE/provisioning-request.json    what running needs (grants nothing)
//! STATE/authorization.signed.json    the operator's admitted authorization (after prepare)
//! STATE/operator.key                 the key it was verified under
//! STATE/workspace/                   the repository workspace (`chio repository` state)
//! STATE/run/                         the sockets and the worker's settings (bound read-only)
//! STATE/out/                         what the worker writes: its trajectory
//! STATE/model-calls/NNNNNN.json      the gateway's journal, one durable file a call
//! STATE/image-store                the image store of the worker image (when there is one)
//! STATE/worker-launch.json          the worker cage's launch record
//! STATE/running                      present while a run is in progress or was interrupted
//! STATE/run.lock                     held by a live run (flock)
//! STATE/outcome.json                 a completed run's outcome
//! ```

pub mod claims;
pub mod config;
pub mod gateway;
pub mod leg;
pub mod qualify;
pub mod run;
pub mod scripted;

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::repository::workspace::{self, write_durably, RepoError, COMMAND_ID};
use crate::repository::{export, recover, status as repo_status};
use config::{
    ProvisioningRequest, RequestedCommands, RequestedWorker, RequestedWorkspace, SessionConfig, COMMAND_ARGV_PREFIX,
    REQUEST_SCHEMA,
};

/// The largest task file.
const MAX_TASK_BYTES: u64 = 1 << 20;
/// The largest authorization file.
const MAX_AUTHORIZATION_BYTES: u64 = 1 << 20;

/// What `init` needs.
#[derive(Debug, Clone)]
pub struct InitRequest {
    /// The state directory to create (missing or empty).
    pub state: PathBuf,
    /// The configuration file.
    pub config: PathBuf,
    /// The task file.
    pub task: PathBuf,
    /// The kernel's signing seed (signs the workspace's receipts).
    pub kernel_key: PathBuf,
    /// The image store (for `image` and `worker.image`).
    pub image_store: PathBuf,
    /// The tool server id the workspace's receipts name (`verify-export --server-id` pins it).
    pub server_id: Option<String>,
}

/// An opened session (its files read, nothing locked).
#[derive(Debug, Clone)]
pub struct Session {
    /// The state directory.
    pub dir: PathBuf,
    /// The configuration.
    pub config: SessionConfig,
    /// The provisioning request.
    pub request: ProvisioningRequest,
    /// The task.
    pub task: String,
}

/// A completed run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// The agent's exit status (`Submitted`, `LimitsExceeded`, ...), from its trajectory.
    pub agent_exit_status: Option<String>,
    /// True when the agent submitted.
    pub submitted: bool,
    /// The worker cage's exit status.
    pub worker_exit_status: i32,
    /// Ceilings the worker's cage hit (`wall_time`: the agent's wall-clock limit).
    #[serde(default)]
    pub worker_limits_hit: Vec<String>,
    /// Model calls journaled.
    pub model_calls: u64,
}

/// Where a session stands.
#[derive(Debug, Clone, Serialize)]
pub struct SessionStatus {
    /// Session id.
    pub session_id: String,
    /// `initialized`, `prepared`, `running`, `interrupted` (a killed run: recover it) or
    /// `completed`.
    pub state: String,
    /// Model calls journaled.
    pub model_calls: u64,
    /// A model call sent and never answered (its outcome unknown): the next run stops naming it
    /// unless run with `--resend-unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_call_outcome_unknown: Option<u64>,
    /// The outcome of a completed run.
    pub outcome: Option<Outcome>,
    /// The repository workspace (absent while a run holds it).
    pub workspace: Option<repo_status::Status>,
}

fn usage(m: impl Into<String>) -> RepoError {
    RepoError::Usage(m.into())
}

fn read_bounded(path: &Path, max: u64, what: &str) -> Result<Vec<u8>, RepoError> {
    crate::repository::bounded::read_regular(path, max, 0).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
            usage(format!("{what} {}: not a regular file of at most {max} bytes", path.display()))
        }
        _ => usage(format!("{what} {}: {e}", path.display())),
    })
}

/// Create a session: the workspace imported, the request written. Nothing runs.
pub fn init(r: &InitRequest) -> Result<Session, RepoError> {
    let config = SessionConfig::parse(&read_bounded(&r.config, MAX_TASK_BYTES, "configuration")?)?;
    config.check_paths_exist()?;
    let task = String::from_utf8(read_bounded(&r.task, MAX_TASK_BYTES, "task file")?)
        .map_err(|_| usage("the task file is not UTF-8"))?;
    let (state, _) = crate::repository::workspace::new_state_dir(&r.state)?;
    let made = init_in(&state, r, config, task);
    if made.is_err() {
        // Only what init made: the directory was missing or empty.
        if let Ok(entries) = fs::read_dir(&state) {
            for e in entries.flatten() {
                let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
            }
        }
    }
    made
}

fn init_in(state: &Path, r: &InitRequest, config: SessionConfig, task: String) -> Result<Session, RepoError> {
    let ws = workspace::init(&workspace::InitRequest {
        state: state.join("workspace"),
        repository: config.repository.clone(),
        revision: config.revision.clone(),
        source_paths: config.source_paths.clone(),
        scratch_paths: config.scratch_paths.clone(),
        image: config.image.as_ref().map(|i| (r.image_store.clone(), i.clone())),
        kernel_key: r.kernel_key.clone(),
        server_id: r.server_id.clone(),
        read_as: None,
    })?;
    let worker_image = match &config.worker.image {
        Some(reference) => Some(image_id(&r.image_store, reference)?),
        None => None,
    };
    let mut limits = ws.config.limits.clone();
    limits.wall_ms = config.command_timeout_s * 1000;
    let request = ProvisioningRequest {
        schema: REQUEST_SCHEMA.into(),
        session_id: workspace::random_hex(16)?,
        session_config: config.digest()?,
        task_sha256: crate::repository::snapshot::hex_sha256(task.as_bytes()),
        workspace: RequestedWorkspace {
            config_digest: ws.config_digest.clone(),
            source_commit: ws.config.source_commit.clone(),
            source_paths: ws.config.source_paths.clone(),
            scratch_paths: ws.config.scratch_paths.clone(),
            image_id: ws.config.image_id.clone(),
        },
        commands: RequestedCommands {
            argv_prefix: COMMAND_ARGV_PREFIX.iter().map(|s| s.to_string()).collect(),
            uid: ws.config.uid,
            gid: ws.config.gid,
            limits,
            deadline_s: config.command_timeout_s,
            network: "none".into(),
        },
        worker: RequestedWorker {
            argv: run::worker_argv(&config).iter().map(|s| s.to_string_lossy().into_owned()).collect(),
            image_id: worker_image,
            read_only_paths: config.worker.read_only_paths.clone(),
            env: run::worker_env(&config).into_iter().map(|(k, _)| k).collect(),
            uid: COMMAND_ID,
            network: format!("loopback only (own namespace), TCP port {} only", run::MODEL_PORT),
            wall_time_s: config.agent.wall_time_s,
            limits: run::worker_limits(&config),
        },
        agent: config.agent.clone(),
        model: config.model.clone(),
    };
    if config.worker.image.is_some() {
        write_durably(&state.join("image-store"), std::path::absolute(&r.image_store)?.as_os_str().as_encoded_bytes())?;
    }
    write_durably(&state.join("task.md"), task.as_bytes())?;
    write_durably(&state.join("session.json"), &workspace::canonical_json(&config)?)?;
    // Written last, and pretty: the operator reads it before signing.
    let pretty = serde_json::to_vec_pretty(&request).map_err(|e| RepoError::Failed(e.to_string()))?;
    write_durably(&state.join("provisioning-request.json"), &pretty)?;
    open(state)
}

fn image_id(store_dir: &Path, reference: &str) -> Result<String, RepoError> {
    let store = crate::image::store::ImageStore::open_existing(store_dir)
        .map_err(|e| usage(format!("image store {}: {e}", store_dir.display())))?;
    Ok(store.find(reference).map_err(|e| usage(e.to_string()))?.image_id)
}

/// Open a session's files.
pub fn open(dir: &Path) -> Result<Session, RepoError> {
    let dir = crate::repository::workspace::state_dir(dir, "session")?;
    let read = |name: &str| {
        fs::read(dir.join(name)).map_err(|e| {
            usage(format!("{} is not a session ({name}: {e}); create it with `chio session init`", dir.display()))
        })
    };
    let config = SessionConfig::parse(&read("session.json")?)?;
    let request: ProvisioningRequest = serde_json::from_slice(&read("provisioning-request.json")?)
        .map_err(|e| RepoError::Mismatch(format!("provisioning-request.json: {e}")))?;
    if request.session_config != config.digest()? {
        return Err(RepoError::Mismatch("provisioning-request.json does not match session.json".into()));
    }
    let task = String::from_utf8(read("task.md")?).map_err(|_| RepoError::Mismatch("task.md is not UTF-8".into()))?;
    if crate::repository::snapshot::hex_sha256(task.as_bytes()) != request.task_sha256 {
        return Err(RepoError::Mismatch("task.md does not match the provisioning request".into()));
    }
    Ok(Session { dir, config, request, task })
}

impl Session {
    /// The repository workspace's state directory.
    pub fn workspace_dir(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    /// The gateway's journal directory.
    pub fn calls_dir(&self) -> PathBuf {
        self.dir.join("model-calls")
    }

    /// Check the stored authorization again (nothing runs on the word of a marker file).
    pub fn check_authorized(&self) -> Result<config::Authorization, RepoError> {
        let signed = fs::read(self.dir.join("authorization.signed.json")).map_err(|_| {
            RepoError::Refused("the session is not prepared: run `chio session prepare --authorization FILE`".into())
        })?;
        let key = fs::read_to_string(self.dir.join("operator.key"))?;
        config::admit(&signed, key.trim(), &self.request)
    }

    /// Model calls journaled so far.
    pub fn model_calls(&self) -> Result<u64, RepoError> {
        match fs::read_dir(self.calls_dir()) {
            Ok(d) => Ok(d
                .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "json")))
                .count() as u64),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(RepoError::Failed(format!(
                "the model call journal {} cannot be read: {e}",
                self.calls_dir().display()
            ))),
        }
    }

    /// The outcome of a completed run.
    pub fn outcome(&self) -> Result<Option<Outcome>, RepoError> {
        match fs::read(self.dir.join("outcome.json")) {
            Ok(b) => {
                Ok(Some(serde_json::from_slice(&b).map_err(|e| RepoError::Mismatch(format!("outcome.json: {e}")))?))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn running(&self) -> bool {
        self.dir.join("running").exists()
    }

    /// Hold the session's run lock (`STATE/run.lock`) for as long as the returned value lives;
    /// `None` when another process holds it (a run in progress).
    pub(crate) fn try_lock_run(&self) -> Result<Option<Flock<File>>, RepoError> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.dir.join("run.lock"))?;
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => Ok(Some(l)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(io::Error::from(e).into()),
        }
    }
}

/// Admit the operator's signed authorization (verified under `operator_key_hex`) against the
/// session's request, and keep it.
pub fn prepare(dir: &Path, authorization: &Path, operator_key_hex: &str) -> Result<Session, RepoError> {
    let s = open(dir)?;
    let signed = read_bounded(authorization, MAX_AUTHORIZATION_BYTES, "authorization")?;
    let auth = config::admit(&signed, operator_key_hex, &s.request)?;
    if let Some(ended) = auth.grant.expired(chio_kernel::time::now_ms()) {
        return Err(RepoError::Refused(format!("the authorization is not admitted: {ended}")));
    }
    write_durably(&s.dir.join("operator.key"), operator_key_hex.as_bytes())?;
    write_durably(&s.dir.join("authorization.signed.json"), &signed)?;
    Ok(s)
}

/// Where the session stands.
pub fn status(dir: &Path) -> Result<SessionStatus, RepoError> {
    let s = open(dir)?;
    let outcome = s.outcome()?;
    let prepared = s.dir.join("authorization.signed.json").exists();
    // A live run holds the run lock; a marker without one is a run that was killed.
    let live = s.try_lock_run()?.is_none();
    let state = match (&outcome, s.running(), prepared) {
        (Some(_), _, _) => "completed",
        (None, true, _) if live => "running",
        (None, true, _) => "interrupted",
        (None, false, true) => "prepared",
        (None, false, false) => "initialized",
    };
    // A run holds the workspace's lock; its status waits for none.
    let workspace = if live { None } else { Some(repo_status::status(&workspace::open(&s.workspace_dir())?)?) };
    Ok(SessionStatus {
        session_id: s.request.session_id.clone(),
        state: state.into(),
        model_calls: s.model_calls()?,
        model_call_outcome_unknown: gateway::unknown_call(&s.calls_dir())?,
        outcome,
        workspace,
    })
}

/// After a crash: the workspace recovered (an unknown outcome is never dispatched again), the
/// run marked resumable. Completed steps replay from the journals on the next run.
pub fn recover(dir: &Path) -> Result<recover::RecoverReport, RepoError> {
    let s = open(dir)?;
    let Some(_run) = s.try_lock_run()? else {
        return Err(RepoError::Refused("a run of this session is in progress; stop it before recovering".into()));
    };
    let ws = workspace::open(&s.workspace_dir())?;
    let report = recover::recover(&ws)?;
    let run = s.dir.join("run");
    if run.exists() {
        fs::remove_dir_all(&run)?;
    }
    match fs::remove_file(s.dir.join("running")) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    Ok(report)
}

/// What `result` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ResultReport {
    /// The repository export.
    pub export: export::ExportReport,
    /// The run's outcome.
    pub outcome: Outcome,
    /// Why the worker's trajectory was not copied (a link, a FIFO, too large, absent), when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trajectory_refused: Option<String>,
}

/// The repository export (`OUT/bundle`), the agent's trajectory and the outcome.
pub fn result(dir: &Path, out: &Path) -> Result<ResultReport, RepoError> {
    let s = open(dir)?;
    let outcome = s.outcome()?.ok_or_else(|| RepoError::Refused("the session has no completed run".into()))?;
    if out.exists() {
        return Err(usage(format!("{} exists; give a new directory", out.display())));
    }
    fs::DirBuilder::new().mode(0o755).create(out)?;
    let ws = workspace::open(&s.workspace_dir())?;
    let report = export::export(&ws, &out.join("bundle"))?;
    // The worker wrote it: read without following a link, bounded. What it left there that is not
    // a bounded regular file is not copied, and the report says so: the rest of the result stands.
    let trajectory_refused = match run::read_worker_file(&s.dir.join("out").join("trajectory.json"), 64 << 20) {
        Ok(t) => {
            fs::write(out.join("trajectory.json"), t)?;
            None
        }
        Err(e) => Some(e.to_string()),
    };
    let outcome_json = serde_json::to_vec_pretty(&outcome).map_err(|e| RepoError::Failed(e.to_string()))?;
    fs::write(out.join("outcome.json"), outcome_json)?;
    Ok(ResultReport { export: report, outcome, trajectory_refused })
}
