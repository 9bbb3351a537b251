//! `exec`: a further process in a running container, confined as its first process is. It
//! enters the container's namespaces (its root with them) and launch cgroup, gets the landlock
//! grants the container's record lists, the container's seccomp filters (chio's and the
//! config's), rlimits no higher than the container's and no capability; its exec is held under
//! ptrace and checked at the exec stop like any launch's, and recorded (`exec-<pid>.json` in
//! the container's directory) and signed into the node's store.
//!
//! The process the pid file names — which the engine waits for, as runc's — is the one that
//! entered: it stays in the host's pid namespace, its target is born in the container's, and
//! it exits with the target's status (`128 + signal` when killed), passing on the signals it
//! gets. Without `--detach`, `exec` waits for it and exits with that status.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use chio_cage::{Enter, LaunchRecord, State};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use oci_spec::runtime::Process;

use super::state::{self, Status};
use super::{bundle, console, node, Global, RECORD_NAME};
use crate::launch::receipts::LaunchReceipts;

/// What `exec` was asked.
pub struct ExecArgs<'a> {
    /// The container.
    pub id: &'a str,
    /// A process JSON (the spec's `process`), or None: `args` with the container's defaults.
    pub process: Option<&'a Path>,
    /// The command when no process file is given.
    pub args: &'a [String],
    /// Working directory over the default.
    pub cwd: Option<&'a Path>,
    /// Variables (`K=V`) added to the environment.
    pub env: &'a [String],
    /// User (`UID[:GID]`) over the default.
    pub user: Option<&'a str>,
    /// A terminal for the process (with `console_socket`).
    pub tty: bool,
    /// Where the terminal's master goes.
    pub console_socket: Option<&'a Path>,
    /// Return once the exec is observed, leaving the process to the caller's subreaper.
    pub detach: bool,
    /// Where the entered process's pid is written.
    pub pid_file: Option<&'a Path>,
}

/// The process to run: the file's, or one made of `args` over the container's own defaults.
fn process_of(a: &ExecArgs<'_>, base: &chio_cage::CagePlan) -> Result<Process, String> {
    let mut v = match a.process {
        Some(f) => {
            let text =
                std::fs::read_to_string(f).map_err(|e| format!("reading the process file {}: {e}", f.display()))?;
            serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| format!("the process file {} is not JSON: {e}", f.display()))?
        }
        None => {
            if a.args.is_empty() {
                return Err("exec names no command: give one after the container id, or --process".into());
            }
            let env: Vec<String> =
                base.env.iter().map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy())).collect();
            serde_json::json!({
                "args": a.args, "env": env, "cwd": base.cwd, "terminal": a.tty,
                "user": {"uid": base.uid, "gid": base.gid},
            })
        }
    };
    if let Some(cwd) = a.cwd {
        v["cwd"] = cwd.to_string_lossy().into_owned().into();
    }
    if !a.env.is_empty() {
        let mut env = v["env"].as_array().cloned().unwrap_or_default();
        env.extend(a.env.iter().map(|e| serde_json::Value::from(e.clone())));
        v["env"] = env.into();
    }
    if let Some(u) = a.user {
        let (uid, gid) = u.split_once(':').unwrap_or((u, "0"));
        let n = |s: &str| s.parse::<u32>().map_err(|_| format!("--user {u:?}: give numeric UID[:GID]"));
        v["user"] = serde_json::json!({"uid": n(uid)?, "gid": n(gid)?});
    }
    if a.tty {
        v["terminal"] = true.into();
    }
    serde_json::from_value(v).map_err(|e| format!("the process to exec is not a runtime-spec process: {e}"))
}

/// What landlock grants and what is mounted in the container, from its start's record.
fn started_record(dir: &Path, id: &str) -> Result<LaunchRecord, String> {
    let path = dir.join(RECORD_NAME);
    let bytes = std::fs::read(&path)
        .map_err(|e| format!("container {id} has no record of its start ({}: {e})", path.display()))?;
    let rec: LaunchRecord = serde_json::from_slice(&bytes)
        .map_err(|e| format!("container {id}: its record {} is unreadable: {e}", path.display()))?;
    if rec.state != State::FullyEnforced {
        return Err(format!("container {id}: its start was not FullyEnforced"));
    }
    Ok(rec)
}

/// Run the process; returns the exit status `exec` ends with.
pub fn exec(g: &Global, a: &ExecArgs<'_>) -> Result<i32, String> {
    let root = g.root();
    let saved = root.load(a.id)?;
    match saved.status() {
        Status::Running => {}
        s => {
            return Err(format!("container {} is {}: exec runs a process only in a running container", a.id, s.name()))
        }
    }
    let base = saved.plan.clone().ok_or_else(|| format!("container {} was created without a saved plan", a.id))?;
    let started = started_record(&root.dir(a.id), a.id)?;
    let reported = started.reported.clone().unwrap_or_default();
    if reported.landlock_read_exec.is_empty() {
        return Err(format!("container {}: its record lists no landlock grants to give the process", a.id));
    }
    let node = node::NodeConfig::load(g.node_config.as_deref())?;
    let process = process_of(a, &base)?;
    let mut plan = bundle::exec_plan(a.id, &base, &process, &node)
        .map_err(|why| format!("chio refused exec in container {}: {}", a.id, why.join("; ")))?;
    // The launch cgroup (the freezer of a v1 host is another name, joined at the exec stop).
    let (freezer, launch): (Vec<PathBuf>, Vec<PathBuf>) =
        saved.cgroup.iter().cloned().partition(|d| d.to_string_lossy().ends_with("-freezer"));
    plan.enter = Some(Enter {
        init: saved.pid,
        init_started: saved.pid_started,
        cgroup: launch,
        read_exec: reported.landlock_read_exec.clone(),
        read_write_exec: reported.landlock_read_write_exec.clone(),
        mounts: reported.mounts.clone(),
        sources: reported.sources.clone(),
    });
    let mut receipts = match (&node.receipt_db, &node.kernel_key) {
        (Some(db), Some(key)) => Some(LaunchReceipts::open(db, key).map_err(|e| e.to_string())?),
        _ => None,
    };
    let console = console::for_process(plan.terminal, a.console_socket)?;
    let record = {
        let (out, err) = (std::io::stdout(), std::io::stderr());
        let mut sinks = console::sinks(console.as_ref(), out.as_fd(), err.as_fd());
        // At the exec stop, before the process runs: into the container's freezer too (so
        // `pause` holds it), and signed into the node's store.
        let mut at_exec = |rec: &LaunchRecord| {
            if let (Some(f), Some(o)) = (freezer.first(), rec.observed.as_ref()) {
                for pid in [o.init.pid, o.pid] {
                    std::fs::write(f.join("cgroup.procs"), pid.to_string())
                        .map_err(|e| format!("moving {pid} into {}: {e}", f.display()))?;
                }
            }
            match receipts.as_mut() {
                Some(r) => r.enforcement(rec).map(drop),
                None => Ok(()),
            }
        };
        sinks.on_enforced = Some(&mut at_exec);
        chio_cage::launch(&plan, &mut sinks)
    };
    drop(console);
    if record.state != State::FullyEnforced {
        let f = record.failure.as_ref().map_or_else(
            || format!("its launch ended {:?}", record.state),
            |f| format!("{} at stage {}: {}", f.code, f.stage.name(), f.detail),
        );
        return Err(format!("exec in container {}: {f}", a.id));
    }
    let entered =
        record.observed.as_ref().map(|o| o.init.pid).filter(|p| *p > 0).ok_or("the record names no process")?;
    let json = serde_json::to_vec_pretty(&record).unwrap_or_default();
    state::write_atomic(&root.dir(a.id).join(format!("exec-{entered}.json")), &json)?;
    if let Some(f) = a.pid_file {
        state::write_atomic(f, entered.to_string().as_bytes())?;
    }
    if a.detach {
        return Ok(0);
    }
    loop {
        match waitpid(Pid::from_raw(entered), None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(128 + sig as i32),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("waiting for the exec'd process {entered}: {e}")),
        }
    }
}
