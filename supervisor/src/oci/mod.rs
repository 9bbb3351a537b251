//! `chio oci`: the runc command-line contract, so that containerd, podman and CRI run their
//! containers in chio's cages.
//!
//! `create` builds the cage as `chio cage run` does, up to its target's hello, then forks: the
//! parent saves the state, writes the pid file and exits, so the cage's init (the container's
//! process to the engine) becomes the child of the engine's subreaper; the child holds the
//! launch — the channel to the cage — and waits on the container's socket. `start` asks it to
//! go on: it seizes the target, checks every fact at the exec stop exactly as a one-shot launch
//! does, signs the enforcement receipt (when the node names a store), writes the record beside
//! the bundle, answers `start` and exits. From then on the engine supervises the container.

pub mod bundle;
pub mod cgroup;
mod console;
pub mod exec;
pub mod node;
mod profile;
pub mod state;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use chio_cage::{LaunchRecord, Parked, State};
use nix::sys::signal::{kill, Signal};
use nix::unistd::{fork, ForkResult, Pid};
use serde::{Deserialize, Serialize};

use crate::launch::receipts::LaunchReceipts;
use state::{Root, Saved, Status};

/// The OCI runtime spec version this runtime follows.
pub const SPEC_VERSION: &str = "1.0.2";
/// The record of a container's observed start, written beside its bundle.
pub const RECORD_NAME: &str = "chio-launch.json";

/// The runtime's global options.
pub struct Global {
    /// Where container state lives.
    pub root: PathBuf,
    /// The node configuration named on the command line (see [`node::NodeConfig::load`]).
    pub node_config: Option<PathBuf>,
}

impl Global {
    fn root(&self) -> Root {
        Root(self.root.clone())
    }
}

/// What the holder tells `start`.
#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    state: State,
    failure: Option<String>,
}

/// `create`: build container `id` from `bundle` and leave it parked at its target's hello.
pub fn create(
    g: &Global,
    id: &str,
    bundle: &Path,
    pid_file: Option<&Path>,
    console_socket: Option<&Path>,
) -> Result<(), String> {
    state::check_id(id)?;
    if !nix::unistd::geteuid().is_root() {
        return Err("chio oci needs root: it creates the container's namespaces, mounts and cgroup".into());
    }
    let bundle = std::fs::canonicalize(bundle).map_err(|e| format!("bundle {}: {e}", bundle.display()))?;
    let node = node::NodeConfig::load(g.node_config.as_deref())?;
    let t = bundle::translate(id, &bundle, &node)
        .map_err(|why| format!("chio refused container {id}: {}", why.join("; ")))?;
    // Opened before anything runs: a bad key or a foreign store refuses the container now.
    let receipts = match (&node.receipt_db, &node.kernel_key) {
        (Some(db), Some(key)) => Some(LaunchReceipts::open(db, key).map_err(|e| e.to_string())?),
        _ => None,
    };
    let console = console::for_process(t.plan.terminal, console_socket)?;
    let netns = match &t.netns {
        Some(p) => Some(OwnedFd::from(
            std::fs::File::open(p).map_err(|e| format!("opening the network namespace {}: {e}", p.display()))?,
        )),
        None => None,
    };
    let root = g.root();
    let dir = root.make(id)?;
    let made = Made { dir: dir.clone() };
    let listener = in_dir(&dir, |sock| UnixListener::bind(sock))
        .map_err(|e| format!("making the container's socket in {}: {e}", dir.display()))?;
    let pid_file = pid_file.map(absolute).transpose()?;
    let mut saved = Saved {
        id: id.to_string(),
        bundle: bundle.clone(),
        pid: 0,
        pid_started: 0,
        holder: 0,
        started: false,
        created: chio_cage::record::now_rfc3339(),
        cgroup: Vec::new(),
        annotations: t.plan.annotations.clone(),
        plan: Some(t.plan.clone()),
    };
    // The holder's: whether this process is it, and `start`'s connection once it came.
    let (mut holder, mut start_conn) = (false, None::<UnixStream>);
    let mut receipts = receipts;
    let record = {
        let (out, err) = (std::io::stdout(), std::io::stderr());
        let mut sinks = console::sinks(console.as_ref(), out.as_fd(), err.as_fd());

        sinks.ahead.netns = netns;
        let mut park =
            |p: &Parked| park(&root, &mut saved, pid_file.as_deref(), &listener, p, (&mut holder, &mut start_conn));
        sinks.park = Some(&mut park);
        let mut sign = |rec: &LaunchRecord| match receipts.as_mut() {
            Some(r) => r.enforcement(rec).map(drop),
            None => Ok(()),
        };
        sinks.on_enforced = Some(&mut sign);
        chio_cage::launch(&t.plan, &mut sinks)
    };
    // Only a failed create comes back here; in the holder, after `start`, so does every start.
    if holder && start_conn.is_none() {
        // The container ended (or was deleted) before its start: its state stays for `delete`.
        std::mem::forget(made);
        // SAFETY: see held_to_the_end.
        unsafe { libc::_exit(0) }
    }
    let Some(mut conn) = start_conn else {
        let f = record.failure.as_ref().map_or("the cage ended before its command's hello".into(), |f| {
            format!("{} at stage {}: {}", f.code, f.stage.name(), f.detail)
        });
        drop(made);
        return Err(format!("container {id}: {f}"));
    };
    std::mem::forget(made);
    held_to_the_end(&root, id, &bundle, &record, &mut conn)
}

/// The holder after the launch: write the record, mark the container started, answer `start`
/// and exit (this process must not return into the caller's code: it is a fork of `create`).
fn held_to_the_end(root: &Root, id: &str, bundle: &Path, rec: &LaunchRecord, conn: &mut UnixStream) -> ! {
    let json = serde_json::to_vec_pretty(rec).unwrap_or_default();
    let mut failure = rec.failure.as_ref().map(|f| format!("{} at stage {}: {}", f.code, f.stage.name(), f.detail));
    for path in [root.dir(id).join(RECORD_NAME), bundle.join(RECORD_NAME)] {
        if let Err(e) = state::write_atomic(&path, &json) {
            failure.get_or_insert(e);
        }
    }
    if rec.state == State::FullyEnforced && failure.is_none() {
        if let Ok(mut s) = root.load(id) {
            s.started = true;
            if let Err(e) = root.save(&s) {
                failure = Some(e);
            }
        }
    }
    let answer = Answer { state: rec.state, failure };
    let _ = serde_json::to_writer(&mut *conn, &answer).map(|_| conn.write_all(b"\n"));
    // SAFETY: _exit ends the holder without running the caller's destructors or atexit handlers.
    unsafe { libc::_exit(0) }
}

/// The socket `start` speaks to, in the container's directory.
const SOCKET: &str = "start.sock";

/// `f` on the container's socket by a short path: a socket's path must fit in 108 bytes, and
/// an engine's root and a 64-digit id may not, so it goes through the directory's descriptor.
fn in_dir<T>(dir: &Path, f: impl FnOnce(&Path) -> std::io::Result<T>) -> std::io::Result<T> {
    let d = std::fs::File::open(dir)?;
    f(Path::new(&format!("/proc/self/fd/{}/{SOCKET}", std::os::fd::AsRawFd::as_raw_fd(&d))))
}

/// Removes a new container's directory unless forgotten.
struct Made {
    dir: PathBuf,
}

impl Drop for Made {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// At the target's hello: fork. The parent saves the state and the pid file and exits; the
/// child (the holder) returns once `start` has connected, or fails when the container ends
/// first.
fn park(
    root: &Root,
    saved: &mut Saved,
    pid_file: Option<&Path>,
    listener: &UnixListener,
    p: &Parked,
    (holder, conn): (&mut bool, &mut Option<UnixStream>),
) -> Result<(), String> {
    let (pid_started, _) = state::started_at(p.init).ok_or("the cage's init is gone")?;
    saved.pid = p.init;
    saved.pid_started = pid_started;
    saved.cgroup = p.cgroup.clone();
    // Before the fork: the parked cage's two processes, and whatever they start, are then in it.
    let engine = saved.plan.as_ref().and_then(|p| p.cgroup_path.clone());
    if let Some(freezer) = cgroup::v1_freezer_for(&p.cgroup, &[p.init, p.target], engine.as_deref())? {
        saved.cgroup.push(freezer);
    }
    // SAFETY: the caller (a launch) is single-threaded; the child only continues this code.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Parent { child } => {
            saved.holder = child.as_raw();
            let done = root.save(saved).and_then(|()| match pid_file {
                Some(f) => state::write_atomic(f, p.init.to_string().as_bytes()),
                None => Ok(()),
            });
            if let Err(e) = done {
                let _ = kill(Pid::from_raw(p.init), Signal::SIGKILL);
                let _ = kill(child, Signal::SIGKILL);
                let _ = std::fs::remove_dir_all(root.dir(&saved.id));
                eprintln!("chio: container {}: {e}", saved.id);
                // SAFETY: see held_to_the_end.
                unsafe { libc::_exit(1) }
            }
            // SAFETY: see held_to_the_end. The init is now the engine's (its subreaper's).
            unsafe { libc::_exit(0) }
        }
        ForkResult::Child => {
            *holder = true;
            // Out of the engine's session and off its descriptors (it waits for them to close).
            let _ = nix::unistd::setsid();
            if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
                let _ = nix::unistd::dup2_stdin(&null);
                let _ = nix::unistd::dup2_stdout(&null);
                let _ = nix::unistd::dup2_stderr(&null);
            }
            *conn = Some(await_start(listener, p.init)?);
            Ok(())
        }
    }
}

/// Wait for `start` on the container's socket (from root only), or for the container's end.
fn await_start(listener: &UnixListener, init: i32) -> Result<UnixStream, String> {
    let pidfd = chio_cage::sys::pidfd_open(init).map_err(|e| format!("watching the cage's init: {e}"))?;
    loop {
        let mut fds = [
            nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN),
            nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN),
        ];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("waiting for start: {e}")),
            Ok(_) => {}
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return Err("the container ended before it was started".into());
        }
        let Ok((mut stream, _)) = listener.accept() else { continue };
        let from_root = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
            .is_ok_and(|c| c.uid() == 0);
        let mut line = String::new();
        let asked = BufReader::new(&mut stream).read_line(&mut line).is_ok() && line.trim() == "start";
        if from_root && asked {
            return Ok(stream);
        }
    }
}

/// `start`: release container `id` and wait until its exec was observed.
pub fn start(g: &Global, id: &str) -> Result<(), String> {
    let root = g.root();
    let saved = root.load(id)?;
    match saved.status() {
        Status::Created => {}
        s => return Err(format!("container {id} is {}, not created: only a created container starts", s.name())),
    }
    let dir = root.dir(id);
    let mut conn = in_dir(&dir, |sock| UnixStream::connect(sock))
        .map_err(|e| format!("container {id}: its holder is gone ({}/{SOCKET}: {e})", dir.display()))?;
    conn.write_all(b"start\n").map_err(|e| format!("container {id}: {e}"))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).map_err(|e| format!("container {id}: {e}"))?;
    let answer: Answer = serde_json::from_str(&line)
        .map_err(|_| format!("container {id}: its holder ended without an answer (see {RECORD_NAME})"))?;
    match (answer.state, answer.failure) {
        (State::FullyEnforced, None) => Ok(()),
        (_, Some(f)) => Err(format!("container {id} was not started: {f}")),
        (s, None) => Err(format!("container {id} was not started: its launch ended {s:?}")),
    }
}

/// The state JSON of the spec for container `id`.
pub fn state_json(g: &Global, id: &str) -> Result<serde_json::Value, String> {
    let saved = g.root().load(id)?;
    let status = saved.status();
    let mut annotations = serde_json::Map::new();
    for (k, v) in &saved.annotations {
        if let Some(k) = k.strip_prefix(bundle::ANNOTATION_PREFIX) {
            annotations.insert(k.to_string(), v.clone().into());
        }
    }
    Ok(serde_json::json!({
        "ociVersion": SPEC_VERSION,
        "id": saved.id,
        "status": status.name(),
        "pid": if status == Status::Stopped { 0 } else { saved.pid },
        "bundle": saved.bundle,
        "created": saved.created,
        "annotations": annotations,
    }))
}

/// A signal by number or name (`9`, `KILL`, `SIGKILL`).
pub fn parse_signal(s: &str) -> Result<Signal, String> {
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| format!("unknown signal {s}"));
    }
    let name = s.to_ascii_uppercase();
    let name = if name.starts_with("SIG") { name } else { format!("SIG{name}") };
    name.parse::<Signal>().map_err(|_| format!("unknown signal {s}"))
}

/// `kill`: signal the container's init, or with `all` every process in its cgroup.
pub fn kill_container(g: &Global, id: &str, signal: Signal, all: bool) -> Result<(), String> {
    let saved = g.root().load(id)?;
    if saved.status() == Status::Stopped {
        return Err(format!("container {id} is not running"));
    }
    let pids = if all { cgroup::procs(&saved.cgroup) } else { vec![saved.pid] };
    for pid in pids {
        match kill(Pid::from_raw(pid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(format!("signalling {pid} of container {id}: {e}")),
        }
    }
    Ok(())
}

/// `delete`: remove a stopped (or created) container; `force` kills a running one first.
pub fn delete(g: &Global, id: &str, force: bool) -> Result<(), String> {
    let root = g.root();
    let saved = match root.load(id) {
        Ok(s) => s,
        Err(e) if force && e.ends_with("does not exist") => return Ok(()),
        Err(e) => return Err(e),
    };
    match saved.status() {
        Status::Running | Status::Paused if !force => {
            return Err(format!("container {id} is running: stop it first, or delete --force"))
        }
        Status::Stopped => {}
        status => {
            // A frozen process does not die of SIGKILL until it is thawed.
            if status == Status::Paused {
                cgroup::freeze(&saved.cgroup, false)?;
            }
            let _ = kill(Pid::from_raw(saved.pid), Signal::SIGKILL);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while saved.alive() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
    if saved.holder > 0 && state::started_at(saved.holder).is_some() && !saved.started {
        let _ = kill(Pid::from_raw(saved.holder), Signal::SIGKILL);
    }
    cgroup::remove(&saved.cgroup)?;
    let _ = std::fs::remove_file(saved.bundle.join(RECORD_NAME));
    std::fs::remove_dir_all(root.dir(id)).map_err(|e| format!("removing {}: {e}", root.dir(id).display()))
}

/// `ps`: the host pids of the container's processes.
pub fn ps(g: &Global, id: &str) -> Result<Vec<i32>, String> {
    Ok(cgroup::procs(&g.root().load(id)?.cgroup))
}

/// `pause` and `resume`.
pub fn pause(g: &Global, id: &str, on: bool) -> Result<(), String> {
    let saved = g.root().load(id)?;
    match (saved.status(), on) {
        (Status::Running, true) | (Status::Paused, false) => cgroup::freeze(&saved.cgroup, on),
        (s, true) => Err(format!("container {id} is {}, not running", s.name())),
        (s, false) => Err(format!("container {id} is {}, not paused", s.name())),
    }
}

/// The `features` document: what this runtime accepts.
pub fn features() -> serde_json::Value {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": SPEC_VERSION,
        "hooks": [],
        "mountOptions": ["ro", "rw", "bind", "rbind", "nosuid", "nodev", "noexec", "size"],
        "linux": {
            "namespaces": ["pid", "mount", "network", "ipc", "uts", "cgroup"],
            "capabilities": [],
            "cgroup": {"v1": true, "v2": true, "systemd": false, "systemdUser": false},
            "seccomp": {"enabled": true},
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false}
        },
        "annotations": {"io.github.chio.observed-exec": "true"}
    })
}
