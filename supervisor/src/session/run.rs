//! `session run`: the gateway and the leg as child processes of this one (each dies with it),
//! then the worker in its own cage, launched from this single-threaded process. The worker's
//! cage has its own network namespace with only loopback (landlock: one TCP port, the
//! forwarder's) and no credential; it gets the task, the two sockets (read-only) and a
//! directory for its trajectory (read-write), nothing else of the host.

use std::ffi::OsString;
use std::fs;
use std::io::{self, BufRead, BufReader};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use chio_cage::{Bind, Limits, State};
use serde_json::{json, Value};

use super::config::SessionConfig;
use super::{Outcome, Session};
use crate::launch::{self, How, Io, LaunchRequest, Receipts};
use crate::launch_plan::{ImageChoice, PlanOptions};
use crate::repository::workspace::{write_durably, RepoError, COMMAND_ID};

/// Where the run directory (the sockets, the worker's settings) appears in the worker's cage:
/// top-level, so chio makes the mount point itself whatever the worker image's root holds.
pub const RUN_MOUNT: &str = "/chio-session";
/// Where the worker's output directory appears in its cage (top-level for the same reason).
pub const OUT_MOUNT: &str = "/chio-out";
/// The loopback port, in the worker's own network namespace, where litellm reaches the
/// forwarder to the gateway's socket (the only TCP port landlock lets the worker bind or connect).
pub const MODEL_PORT: u16 = 8000;
/// The largest trajectory read back.
const MAX_TRAJECTORY_BYTES: u64 = 64 << 20;

/// The worker's argv.
pub fn worker_argv(c: &SessionConfig) -> Vec<OsString> {
    [
        c.worker.python.as_os_str(),
        "-m".as_ref(),
        "chio_minisweagent.worker".as_ref(),
        "/chio-session/worker.json".as_ref(),
    ]
    .iter()
    .map(|s| s.to_os_string())
    .collect()
}

/// The worker's environment: chio's fixed part (no network lookups, no cost-table download,
/// no bytecode written) and the configured variables.
pub fn worker_env(c: &SessionConfig) -> Vec<(String, String)> {
    let fixed = [
        ("HOME", "/tmp"),
        ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
        ("MSWEA_COST_TRACKING", "ignore_errors"),
        ("MSWEA_SILENT_STARTUP", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
    ];
    let mut env: Vec<(String, String)> = fixed.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    env.extend(c.worker.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// The worker cage's ceilings: the leg's defaults with room for the Python agent.
pub fn worker_limits(c: &SessionConfig) -> Limits {
    Limits {
        memory_bytes: Some(1 << 30),
        wall_ms: c.agent.wall_time_s * 1000,
        output_bytes: 16 << 20,
        ..Limits::default()
    }
}

/// The refusal of a run while model call `n`'s outcome is unknown.
fn unknown_refusal(n: u64) -> RepoError {
    RepoError::Refused(format!(
        "model call {n} was sent to the provider and never answered: its outcome is unknown (the provider may have \
         done and billed it), so it is not sent again; to send it again, run `chio session run --resend-unknown` \
         (recorded in the call journal as {n:06}.resent)"
    ))
}

/// Run the session's agent once (or, when a run completed, return its outcome: nothing runs).
/// A model call whose outcome is unknown stops the run, named, unless `resend_unknown` (the
/// operator's recorded choice) lets the gateway send it again.
pub fn run(dir: &Path, resend_unknown: bool) -> Result<Outcome, RepoError> {
    let s = super::open(dir)?;
    let auth = s.check_authorized()?;
    let Some(_run) = s.try_lock_run()? else {
        return Err(RepoError::Refused("another run of this session is in progress".into()));
    };
    if let Some(done) = s.outcome()? {
        return Ok(done);
    }
    if s.running() {
        return Err(RepoError::Refused(
            "a run of this session is in progress or was interrupted; run `chio session recover` first".into(),
        ));
    }
    // The grant's lifetime: no run starts after it (a completed one still answers, above).
    if let Some(ended) = auth.grant.expired(chio_kernel::time::now_ms()) {
        return Err(RepoError::Refused(format!("{ended}: no run starts; ask the operator for a new authorization")));
    }
    if let (Some(n), false) = (super::gateway::unknown_call(&s.calls_dir())?, resend_unknown) {
        return Err(unknown_refusal(n));
    }
    let credential_env = &s.config.model.credential_env;
    let credential = std::env::var(credential_env)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| RepoError::Usage(format!("{credential_env} (the provider credential) is not set")))?;
    write_durably(&s.dir.join("running"), b"")?;
    prepare_dirs(&s)?;
    let mut children = Vec::new();
    let result = start_and_launch(&s, &credential, resend_unknown, &mut children);
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = fs::remove_dir_all(s.dir.join("run"));
    settle_interrupted_command(&s)?;
    let rec = result?;
    if rec.state != State::FullyEnforced {
        fs::remove_file(s.dir.join("running"))?;
        let why = rec.failure.as_ref().map_or(format!("{:?}", rec.state), |f| format!("{}: {}", f.code, f.detail));
        return Err(RepoError::Failed(format!("the worker's cage did not run: {why}")));
    }
    // A call left unknown in this run (its answer lost on the way): no outcome, the run stops
    // naming it, resumable once the operator decides.
    if let Some(n) = super::gateway::unknown_call(&s.calls_dir())? {
        fs::remove_file(s.dir.join("running"))?;
        return Err(unknown_refusal(n));
    }
    let trajectory = read_worker_file(&s.dir.join("out").join("trajectory.json"), MAX_TRAJECTORY_BYTES)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    // An agent killed before it finished leaves an empty status in its trajectory: no status.
    let status = trajectory
        .as_ref()
        .and_then(|t| t["info"]["exit_status"].as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let outcome = Outcome {
        submitted: status.as_deref() == Some("Submitted"),
        agent_exit_status: status,
        worker_exit_status: rec.exit_status(),
        worker_limits_hit: rec.outcome.as_ref().map(|o| o.limit_hit.clone()).unwrap_or_default(),
        model_calls: s.model_calls()?,
    };
    let bytes = serde_json::to_vec_pretty(&outcome).map_err(|e| RepoError::Failed(e.to_string()))?;
    write_durably(&s.dir.join("outcome.json"), &bytes)?;
    fs::remove_file(s.dir.join("running"))?;
    Ok(outcome)
}

/// A worker stopped mid-command (its deadline, its cage failing) leaves that command's operation
/// dispatched, and the leg that ran it is gone: settle it as `recover` would (its outcome becomes
/// unknown and is never run again; the workspace goes back to the last committed snapshot).
/// This process holds the run lock, so nothing else is running.
fn settle_interrupted_command(s: &Session) -> Result<(), RepoError> {
    let ws = crate::repository::workspace::open(&s.workspace_dir())?;
    let unsettled = chio_kernel::store::Store::open_read_only(&ws.dir.join("receipts.db"))?.op_unsettled()?;
    if !unsettled.is_empty() {
        crate::repository::recover::recover(&ws)?;
    }
    Ok(())
}

fn prepare_dirs(s: &Session) -> Result<(), RepoError> {
    let run = s.dir.join("run");
    let _ = fs::remove_dir_all(&run);
    fs::DirBuilder::new().mode(0o755).create(&run)?;
    let out = s.dir.join("out");
    if !out.exists() {
        fs::DirBuilder::new().mode(0o700).create(&out)?;
        nix::unistd::chown(&out, Some(COMMAND_ID.into()), Some(COMMAND_ID.into())).map_err(io::Error::from)?;
    }
    let settings = json!({
        "task": s.task,
        "run_id": s.request.session_id,
        "model_name": s.config.model.name,
        "model_socket": format!("{RUN_MOUNT}/model.sock"),
        "model_port": MODEL_PORT,
        "leg_socket": format!("{RUN_MOUNT}/leg.sock"),
        "command_timeout_s": s.config.command_timeout_s,
        "step_limit": s.config.agent.step_limit,
        "wall_time_s": s.config.agent.wall_time_s,
        "trajectory": format!("{OUT_MOUNT}/trajectory.json"),
    });
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(run.join("worker.json"))?;
    io::Write::write_all(&mut f, settings.to_string().as_bytes())?;
    Ok(())
}

/// Start a helper (`chio session gateway|leg`) and wait for its `ready`.
fn start_helper(s: &Session, role: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Child, RepoError> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["session", role, "--state"]).arg(&s.dir).args(args).env_clear().envs(env.iter().copied());
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    // SAFETY: between fork and exec only prctl, which is async-signal-safe; the helper dies
    // with this process, so a crashed run leaves no server behind.
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(io::Error::from));
    }
    let mut child = cmd.spawn()?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    if line.trim() != "ready" {
        let _ = child.kill();
        let status = child.wait()?;
        return Err(RepoError::Failed(format!("the session's {role} did not start ({status})")));
    }
    Ok(child)
}

fn start_and_launch(
    s: &Session,
    credential: &str,
    resend_unknown: bool,
    children: &mut Vec<Child>,
) -> Result<chio_cage::LaunchRecord, RepoError> {
    let gateway_args: &[&str] = if resend_unknown { &["--resend-unknown"] } else { &[] };
    children.push(start_helper(s, "gateway", gateway_args, &[(s.config.model.credential_env.as_str(), credential)])?);
    children.push(start_helper(s, "leg", &[], &[])?);
    let mut o = PlanOptions::new(worker_argv(&s.config));
    o.uid = Some(COMMAND_ID);
    o.gid = Some(COMMAND_ID);
    o.limits = worker_limits(&s.config);
    o.cwd = Some(PathBuf::from("/tmp"));
    // Its own network namespace with only `lo`: the forwarder to the gateway's socket.
    o.net = chio_cage::NetMode::Loopback;
    o.env = worker_env(&s.config).into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    o.binds.push(Bind { source: s.dir.join("run"), dest: RUN_MOUNT.into(), writable: false });
    o.binds.push(Bind { source: s.dir.join("out"), dest: OUT_MOUNT.into(), writable: true });
    for p in &s.config.worker.read_only_paths {
        o.binds.push(Bind { source: p.clone(), dest: p.clone(), writable: false });
    }
    if let Some(id) = &s.request.worker.image_id {
        let store_dir = workspace_image_store(s)?;
        o.image =
            Some(ImageChoice { store_dir: Some(store_dir), reference: id.clone(), entrypoint: Some(String::new()) });
    }
    o.tcp_ports = vec![MODEL_PORT];
    o.annotations.insert("session.id".into(), s.request.session_id.clone());
    o.annotations.insert("session.role".into(), "worker".into());
    let prepared = match launch::prepare(&LaunchRequest::new(o), None).map_err(|e| RepoError::Usage(e.to_string()))? {
        Ok(p) => p,
        Err(refusal) => return Err(RepoError::Refused(refusal.violations.join("; "))),
    };
    // The worker's own output goes to chio's stderr (the operator's terminal or log).
    let stderr = io::stderr();
    let io = Io { stdout: stderr.as_fd(), stderr: stderr.as_fd(), stdin: None };
    let launched = launch::run(&prepared, io, Receipts::Off, How::default());
    let rec = launched.record;
    let record = serde_json::to_vec_pretty(&rec).map_err(|e| RepoError::Failed(e.to_string()))?;
    write_durably(&s.dir.join("worker-launch.json"), &record)?;
    Ok(rec)
}

/// The image store the worker image was found in at init.
fn workspace_image_store(s: &Session) -> Result<PathBuf, RepoError> {
    let path = fs::read(s.dir.join("image-store"))
        .map_err(|e| RepoError::Failed(format!("the session's image-store file: {e}")))?;
    Ok(PathBuf::from(std::ffi::OsString::from(String::from_utf8_lossy(&path).into_owned())))
}

/// Read a file the worker wrote: no link followed, no FIFO waited on, a regular file only, bounded.
pub fn read_worker_file(path: &Path, max: u64) -> Result<Vec<u8>, RepoError> {
    crate::repository::bounded::read_regular(path, max, libc::O_NOFOLLOW).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
            RepoError::Refused(format!("{}: not a regular file of at most {max} bytes", path.display()))
        }
        _ if e.raw_os_error() == Some(libc::ELOOP) => {
            RepoError::Refused(format!("{}: a symbolic link, not followed", path.display()))
        }
        _ => RepoError::Refused(format!("{}: {e}", path.display())),
    })
}
