//! `chio supervisor serve`: the privileged supervisor daemon, the only chio process that runs as
//! root. Clients connect to its Unix socket and are given a role by their peer credentials;
//! launches run in children of a single-threaded launcher forked before the I/O runtime starts.
//! It holds the kernel key and the receipt store, recovers what a previous daemon left, and
//! only then says READY=1. A request is a typed `chio.supervisor.v2` line ([`wire`]); one
//! admission ([`admit`]) decides what the peer's role may ask.

#[macro_use]
mod error;
pub mod admit;
mod answer;
pub mod config;
mod export_as;
pub mod job;
pub mod launcher;
pub mod log;
pub mod metrics;
pub mod said;
mod scrape;
mod server;
pub mod wire;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use config::Config;
pub use error::{Context, DaemonError, Result};
use job::DaemonSide;

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/chio/supervisor.sock";
/// The daemon's configuration unless told otherwise (absent: only root may connect).
pub const DEFAULT_CONFIG: &str = "/etc/chio/supervisor.json";

/// How the daemon is started.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The Unix socket to listen on.
    pub socket: PathBuf,
    /// The daemon's configuration file (None: [`DEFAULT_CONFIG`] when it exists).
    pub config: Option<PathBuf>,
    /// The state directory (None: `CHIO_STATE_DIR` or the default).
    pub state_dir: Option<PathBuf>,
    /// How it logs.
    pub log_format: log::LogFormat,
}

/// Run the daemon in the foreground until SIGTERM or SIGINT; returns its exit status.
pub fn serve(a: &ServeOptions) -> Result<i32> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "chio supervisor serve needs root: it builds every cage (run it from chio-supervisor.service or with sudo)"
        );
    }
    log::init(a.log_format)?;
    let config = match &a.config {
        Some(path) => Config::load(path)?,
        None if Path::new(DEFAULT_CONFIG).exists() => Config::load(Path::new(DEFAULT_CONFIG))?,
        None => {
            tracing::warn!(
                "no configuration ({DEFAULT_CONFIG} is absent): only root may connect, launches are not receipted"
            );
            Config::default()
        }
    };
    // Absolute: each launch runs in the client's directory (an admin's) or in /.
    let state_dir = std::path::absolute(crate::state_dir(a.state_dir.as_deref()))?;
    std::fs::create_dir_all(&state_dir).with_context(|| format!("state directory {}", state_dir.display()))?;
    // Its journal, receipts and image trees: no one but root may be able to replace them.
    let state_dir =
        chio_cage::path::private_dir(&state_dir).with_context(|| format!("state directory {}", state_dir.display()))?;
    // One daemon per state directory, held until this process and every one it forked ends:
    // a second one would recover the first one's running launches as outcome_unknown.
    let _state_lock = crate::state_lock::hold(&state_dir).context("the state directory's lock")?;
    let daemon = DaemonSide {
        receipt_db: state_dir.join("receipts.db"),
        state_dir,
        kernel_key: config.kernel_key.as_deref().map(std::path::absolute).transpose()?,
        policy_signers: config.policy_signers.clone(),
        workspaces: Vec::new(),
    };
    if let Some(seed) = &daemon.kernel_key {
        // A bad key or a foreign store stops the daemon here, not each launch later.
        crate::launch::LaunchReceipts::open(&daemon.receipt_db, seed).context("the kernel key and store")?;
    }
    settle_in_delegation()?;
    let (unknown, cgroups) = recover(&daemon.receipt_db)?;
    tracing::info!(
        outcome_unknown = unknown,
        cgroups_removed = cgroups,
        "recovered: {unknown} launch(es) dispatched without an outcome are outcome_unknown, {cgroups} cgroup(s) removed"
    );
    let listener = listen(&a.socket)?;
    single_threaded()?;
    let launcher = launcher::spawn().context("forking the launcher")?;
    // One I/O thread; blocking work (the journal, behind one lock) needs at most two more.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
        .build()
        .context("starting the I/O runtime")?;
    let launcher_pid = launcher.pid;
    let code = rt.block_on(server::run(listener, &a.socket, config, daemon, launcher));
    // Dropping the runtime drops the last handle on the launcher's socket: it kills whatever
    // still runs and exits.
    drop(rt);
    let _ = nix::sys::wait::waitpid(launcher_pid, None);
    let _ = std::fs::remove_file(&a.socket);
    code
}

/// What a previous daemon left: dispatched launches without an outcome, launch cgroups. The
/// cages themselves died with it (each launch's processes die with their launch child).
fn recover(receipt_db: &Path) -> Result<(usize, usize)> {
    let mut store = chio_kernel::store::Store::open(receipt_db, true)
        .with_context(|| format!("the supervisor's store {}", receipt_db.display()))?;
    let (unknown, _) = store.op_recover().context("recovering the request journal")?;
    Ok((unknown, chio_cage::cgroup::sweep(&hierarchy())))
}

/// Under a service manager that delegated the daemon's cgroup to it (`Delegate=yes` on cgroup
/// v2), move into that cgroup's leaf `supervisor` and put every launch cgroup under its
/// `launches` — the unit's own subtree, which its manager accounts for and ends
/// ([`chio_cage::cgroup::Delegation`]). Before the launcher is forked: every process of the
/// daemon follows, and each launch process takes the root from `CHIO_CGROUP_V2_ROOT`. An
/// operator's `CHIO_CGROUP_V2_ROOT` decides instead.
fn settle_in_delegation() -> Result<()> {
    if std::env::var_os("CHIO_CGROUP_V2_ROOT").is_some() {
        return Ok(());
    }
    let Some(d) = chio_cage::cgroup::Delegation::find() else { return Ok(()) };
    d.settle().with_context(|| format!("leaving the delegated cgroup {} for its leaf", d.dir.display()))?;
    tracing::info!(
        "cgroup {} is delegated to it: the daemon runs in its supervisor, launch cgroups go under {}",
        d.dir.display(),
        d.launches().display()
    );
    // Each launch would find the same by the same walk up its cgroups; this spares it that.
    // SAFETY (set_var): the daemon is single-threaded until its launcher and runtime start.
    std::env::set_var("CHIO_CGROUP_V2_ROOT", d.launches());
    Ok(())
}

/// Where the daemon's launch cgroups go: where its launches' plans put them (the operator's
/// `CHIO_CGROUP_V2_ROOT`, else the host's own hierarchy). The spares make theirs there and the
/// sweeps look there.
pub fn hierarchy() -> chio_cage::cgroup::Hierarchy {
    let v2_root = std::env::var_os("CHIO_CGROUP_V2_ROOT").map(PathBuf::from);
    chio_cage::cgroup::Hierarchy::detect(v2_root.as_deref())
}

/// Bind the socket: a stale socket from a dead daemon is replaced, anything else is refused.
fn listen(path: &Path) -> Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
        // The socket is given its group and mode by path below: no one else may be able to
        // swap what that path names.
        chio_cage::path::private_dir(dir).with_context(|| format!("the socket's directory {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{}: another supervisor is listening there", path.display());
            }
            std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
        }
        Ok(_) => bail!("{}: exists and is not a socket; refusing to replace it", path.display()),
        Err(_) => {}
    }
    let listener =
        std::os::unix::net::UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))?;
    // Group chio may connect (the daemon's configuration still decides what each peer may do).
    // Under the unit (Group=chio) the socket is born in that group; otherwise root gives it.
    use std::os::unix::fs::MetadataExt;
    let group = local_group("chio");
    if let Some(gid) = group.filter(|&g| std::fs::metadata(path).is_ok_and(|m| m.gid() != g)) {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("giving {} to group chio", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// A local group's gid from /etc/group (where systemd-sysusers puts `chio`). Not getgrnam: in
/// the static release binary glibc's NSS would dlopen modules built for another libc.
fn local_group(name: &str) -> Option<u32> {
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then(|| f.nth(1)?.parse().ok()).flatten()
    })
}

/// The launcher must be forked from a single-threaded process.
fn single_threaded() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let threads = status.lines().find_map(|l| l.strip_prefix("Threads:")).map(str::trim);
    if threads != Some("1") {
        bail!("the supervisor must fork its launcher single-threaded (Threads: {threads:?})");
    }
    Ok(())
}
