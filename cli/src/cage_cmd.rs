//! `chio cage run`: build a CagePlan from flags, launch it, pass the target's output through,
//! write the record, exit with the target's status (125/126/127 for cage failures).

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use chio_cage::{Bind, LaunchRecord, Mode, NetMode, State};
pub use chio_supervisor::launch::TeardownAt;
use chio_supervisor::launch::{self, How, Io, LaunchReceipts, LaunchRequest, Launched, PolicyLaunch, Receipts};
use chio_supervisor::launch_plan::{ImageChoice, PlanOptions};
use clap::{Args, ValueEnum};

use crate::units::{arg, parse_cpus, parse_duration_ms, parse_size};

/// Enforcement mode on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Any missing confinement fact stops the launch before the target runs.
    Enforced,
    /// The target runs anyway; the record says "not confined" and why.
    Shadow,
}

/// Network on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NetArg {
    /// New network namespace, no interface up.
    None,
    /// New network namespace with loopback up.
    Loopback,
}

/// Flags of `chio cage run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Root filesystem directory. Default: the host's /usr, /bin, /lib*, /sbin and a minimal
    /// /etc, read-only.
    #[arg(long, value_name = "DIR", conflicts_with = "image")]
    rootfs: Option<PathBuf>,
    /// An imported image (reference or ID): its rootfs read-only, its Env and WorkingDir as
    /// defaults.
    #[arg(long, value_name = "REF|ID")]
    image: Option<String>,
    /// State directory holding imported images (default $CHIO_STATE_DIR or /var/lib/chio).
    #[arg(long = "state-dir", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Host directory mounted read-write at /workspace (and the default working directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Extra read-only bind, SRC:DST.
    #[arg(long = "ro-bind", value_name = "SRC:DST", value_parser = arg::bind)]
    ro_bind: Vec<String>,
    /// Extra read-write bind, SRC:DST.
    #[arg(long = "bind", value_name = "SRC:DST", value_parser = arg::bind)]
    bind: Vec<String>,
    /// Working directory inside the cage.
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// Environment variable KEY=VALUE, or KEY to pass chio's own value through (the environment
    /// starts with only PATH, HOME, TMPDIR).
    #[arg(long, value_name = "KEY[=VALUE]", value_parser = arg::env)]
    env: Vec<String>,
    /// Environment variables from a file: KEY=VALUE or KEY lines; blank lines and # comments
    /// skipped (applied before --env).
    #[arg(long = "env-file", value_name = "FILE")]
    env_file: Vec<PathBuf>,
    /// uid of the target (default: the image's User, else 65534).
    #[arg(long, allow_hyphen_values = true)]
    uid: Option<u32>,
    /// gid of the target (default: the image's User's group, else 65534).
    #[arg(long, allow_hyphen_values = true)]
    gid: Option<u32>,
    /// With --image: replace the image's Entrypoint ("" clears it).
    #[arg(long, value_name = "CMD", requires = "image")]
    entrypoint: Option<String>,
    /// Network namespace contents.
    #[arg(long, value_enum, default_value_t = NetArg::None)]
    net: NetArg,
    /// Memory ceiling (e.g. 512M); "none" for no ceiling.
    #[arg(long, default_value = "512M", allow_hyphen_values = true, value_parser = arg::size_or_none)]
    memory: String,
    /// Maximum tasks in the cage; "none" for no ceiling.
    #[arg(long, default_value = "64", allow_hyphen_values = true, value_parser = arg::count_or_none)]
    pids: String,
    /// CPU bandwidth (e.g. 1, 0.5); "none" for no ceiling.
    #[arg(long, default_value = "1", allow_hyphen_values = true, value_parser = arg::cpus_or_none)]
    cpus: String,
    /// Wall-clock deadline (e.g. 30s, 5m).
    #[arg(long, default_value = "300s", allow_hyphen_values = true, value_parser = arg::duration)]
    timeout: String,
    /// Bytes of stdout and of stderr passed through (each); the rest is counted and dropped.
    #[arg(long = "output-limit", default_value = "512K", allow_hyphen_values = true, value_parser = arg::size)]
    output_limit: String,
    /// Size of the /tmp tmpfs.
    #[arg(long = "tmp-size", default_value = "16M", allow_hyphen_values = true, value_parser = arg::size)]
    tmp_size: String,
    /// Required SHA-256 of the target executable (lowercase hex).
    #[arg(long = "expect-sha256", value_name = "HEX")]
    expect_sha256: Option<String>,
    /// Enforcement mode.
    #[arg(long, value_enum, default_value_t = ModeArg::Enforced)]
    mode: ModeArg,
    /// Write the launch record (JSON) to FILE.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Print the launch record as one JSON line, the last line on stderr.
    #[arg(long)]
    pub json: bool,
    /// Feed chio's stdin to the command through a pipe. Without it the command's stdin is the
    /// cage's /dev/null; it never gets chio's own stdin (a terminal or pipe) itself.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Append this launch's enforcement and terminal receipts to this store (needs --kernel-key).
    #[arg(long = "receipt-db", value_name = "DB", requires = "kernel_key")]
    pub receipt_db: Option<PathBuf>,
    /// The kernel's signing seed for the receipts (needs --receipt-db).
    #[arg(long = "kernel-key", value_name = "SEED", requires = "receipt_db")]
    pub kernel_key: Option<PathBuf>,
    /// Launch under an operator-signed cage launch policy (admission as `chio policy admit`):
    /// the command must be the admitted argv, and the launch gets exactly the admitted plan.
    #[arg(
        long,
        value_name = "FILE",
        requires_all = ["policy_signer", "manifest"],
        conflicts_with_all = ["rootfs", "image", "uid", "gid", "memory", "pids", "cpus", "timeout", "output_limit",
            "tmp_size", "mode", "expect_sha256", "env", "env_file", "bind", "ro_bind", "net", "entrypoint", "cwd"]
    )]
    pub policy: Option<PathBuf>,
    /// The operator's public key the policy must be signed by (64 hex digits or a file).
    #[arg(long = "policy-signer", value_name = "HEX|FILE", requires = "policy")]
    pub policy_signer: Option<String>,
    /// The publisher-signed tool manifest the policy admits.
    #[arg(long, value_name = "FILE", requires = "policy")]
    pub manifest: Option<PathBuf>,
    /// Let a policy run as uid/gid 0 or on the host's / (recorded in the launch's receipts).
    #[arg(long = "allow-root-policy", requires = "policy")]
    pub allow_root_policy: bool,
    /// Send the launch to the supervisor daemon listening on SOCKET (as $CHIO_SUPERVISOR):
    /// same options, output, exit status and record; receipts go to the daemon's store.
    #[arg(long, value_name = "SOCKET", env = "CHIO_SUPERVISOR", conflicts_with_all = ["receipt_db", "kernel_key"])]
    pub supervisor: Option<PathBuf>,
    /// The signed policy and manifest as a supervisor client sent them (read instead of the files).
    #[arg(skip)]
    pub documents: Option<(Vec<u8>, Vec<u8>)>,
    /// Command and arguments. With --image they replace the image's Cmd (after its
    /// Entrypoint), as `docker run` does; without one the image's Entrypoint and Cmd run.
    #[arg(last = true, required_unless_present = "image", value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

fn split_bind(spec: &str, writable: bool) -> Result<Bind> {
    let Some((src, dst)) = spec.split_once(':') else {
        bail!("bind {spec:?} is not SRC:DST");
    };
    if src.is_empty() || !dst.starts_with('/') {
        bail!("bind {spec:?} needs a source and an absolute destination");
    }
    Ok(Bind { source: PathBuf::from(src), dest: PathBuf::from(dst), writable })
}

fn optional<T>(s: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Option<T>> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    parse(s).map(Some).map_err(anyhow::Error::msg)
}

/// Turn flags into launch options (the supervisor builds the plan from them).
fn options_from(a: &RunArgs) -> Result<PlanOptions> {
    let mut o = PlanOptions::new(a.command.clone());
    o.mode = match a.mode {
        ModeArg::Enforced => Mode::Enforced,
        ModeArg::Shadow => Mode::Shadow,
    };
    o.net = match a.net {
        NetArg::None => NetMode::None,
        NetArg::Loopback => NetMode::Loopback,
    };
    o.rootfs = a.rootfs.clone();
    o.image = a.image.as_ref().map(|reference| ImageChoice {
        store_dir: a.state_dir.clone(),
        reference: reference.clone(),
        entrypoint: a.entrypoint.clone(),
    });
    o.workspace = a.workspace.clone();
    o.cwd = a.cwd.clone();
    for b in &a.ro_bind {
        o.binds.push(split_bind(b, false)?);
    }
    for b in &a.bind {
        o.binds.push(split_bind(b, true)?);
    }
    o.env_files = a.env_file.clone();
    o.env = a.env.clone();
    o.uid = a.uid;
    o.gid = a.gid;
    let l = &mut o.limits;
    l.memory_bytes = optional(&a.memory, parse_size).context("--memory")?;
    l.pids = optional(&a.pids, |s| s.parse::<u64>().map_err(|_| format!("{s:?} is not a number"))).context("--pids")?;
    l.cpu_millis = optional(&a.cpus, parse_cpus).context("--cpus")?;
    l.wall_ms = parse_duration_ms(&a.timeout).map_err(anyhow::Error::msg).context("--timeout")?;
    l.output_bytes = parse_size(&a.output_limit).map_err(anyhow::Error::msg).context("--output-limit")?;
    l.tmp_bytes = parse_size(&a.tmp_size).map_err(anyhow::Error::msg).context("--tmp-size")?;
    o.expect_sha256 = a.expect_sha256.clone();
    Ok(o)
}

/// Turn flags into a launch request: the signed documents of a policy launch are read (or taken
/// as a daemon client sent them), and its signer's key resolved.
pub fn request_from(a: &RunArgs) -> Result<LaunchRequest> {
    let policy = match (&a.policy, &a.policy_signer, &a.manifest) {
        (Some(policy), Some(signer), Some(manifest)) => {
            let (policy_bytes, manifest_bytes) = match &a.documents {
                Some((p, m)) => (p.clone(), m.clone()),
                None => (crate::doc_cmd::read(policy)?, crate::doc_cmd::read(manifest)?),
            };
            let text = |b: Vec<u8>, path: &Path| {
                String::from_utf8(b).with_context(|| format!("{}: not a signed document (not UTF-8)", path.display()))
            };
            Some(PolicyLaunch {
                policy: text(policy_bytes, policy)?,
                manifest: text(manifest_bytes, manifest)?,
                signer: crate::receipt_cmd::pinned_key(signer)?,
                manifest_key: None,
                allow_root: a.allow_root_policy,
                image_store: a.state_dir.clone(),
                receipted: a.receipt_db.is_some(),
            })
        }
        _ => None,
    };
    // A policy launch takes the command and the workspace from its flags (clap refuses the
    // others beside --policy); the plan is the policy's.
    let options = match &policy {
        Some(_) => {
            let mut o = PlanOptions::new(a.command.clone());
            o.workspace = a.workspace.clone();
            o
        }
        None => options_from(a)?,
    };
    Ok(LaunchRequest { options, policy, interactive: a.interactive })
}

/// The parser of `chio cage run`'s flags alone (`args` without the program name).
pub fn parser() -> clap::Command {
    use clap::Args;
    RunArgs::augment_args(clap::Command::new("run")).bin_name("chio cage run")
}

/// A launch's exit status and, when it got to launching, what the launch returned.
pub struct Done {
    /// What `chio cage run` exits with.
    pub status: i32,
    /// The launch, when one ran (not when its policy refused it, or its gate withdrew it
    /// before it began).
    pub launched: Option<Launched>,
}

impl Done {
    fn without_launch(status: i32) -> Done {
        Done { status, launched: None }
    }
}

/// Run the command; returns the process exit status.
pub fn run(a: &RunArgs) -> Result<i32> {
    if let Some(socket) = &a.supervisor {
        return crate::daemon::client::cage_run(socket, a);
    }
    Ok(launch(a, chio_cage::Ahead::default(), TeardownAt::First, None)?.status)
}

/// Launch the command in this process (the one-shot form, and the daemon's launch child, which
/// brings what its launcher made `ahead` of the request and tears the cage down `Later`): parse
/// → [`launch::prepare`] → [`launch::run`] → report.
///
/// `gate` (the daemon's): asked before the target goes on towards its exec and before anything
/// is written; once it says no, the launch is withdrawn — its target killed before it ran, no
/// receipt, nothing printed — and the result is to be dropped. A policy launch (a refusal writes
/// a denial receipt) must pass it before this.
pub fn launch(
    a: &RunArgs,
    ahead: chio_cage::Ahead,
    teardown: TeardownAt,
    gate: Option<chio_cage::Gate<'_>>,
) -> Result<Done> {
    require_root()?;
    let request = request_from(a)?;
    let receipts = a.receipt_db.as_deref().zip(a.kernel_key.as_deref());
    launch_request(&request, receipts, Some(a), ahead, teardown, gate)
}

fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "chio cage run needs root: it creates namespaces, mounts and cgroups for the cage \
             (run it as root, e.g. with sudo; the command itself runs as --uid, 65534 by default)"
        );
    }
    Ok(())
}

/// [`launch`] of a request (the daemon's launch process calls it with an admitted one):
/// `receipts` the store and seed to record in, `flags` the one-shot form's `--record` and
/// `--json`.
pub fn launch_request(
    request: &LaunchRequest,
    receipts: Option<(&Path, &Path)>,
    flags: Option<&RunArgs>,
    ahead: chio_cage::Ahead,
    teardown: TeardownAt,
    gate: Option<chio_cage::Gate<'_>>,
) -> Result<Done> {
    require_root()?;
    // A one-shot launch never writes the store of a running daemon (one writer per store); a
    // daemon's own launch processes (which hold their client's streams) write it under the
    // daemon's lock.
    let one_shot = crate::daemon::said::client_outputs().is_none();
    let _store_lock = match receipts {
        Some((db, _)) if one_shot => chio_supervisor::state_lock::share(db)?,
        _ => None,
    };
    // Opened before anything runs: a bad key or a foreign store refuses the launch up front.
    let mut receipts = match receipts {
        Some((db, seed)) => Some(LaunchReceipts::open(db, seed)?),
        None => None,
    };
    let prepared = match launch::prepare(request, receipts.as_mut())? {
        Ok(p) => p,
        Err(refusal) => {
            for v in &refusal.violations {
                eprintln!("refused: {v}");
            }
            if let Some(id) = &refusal.denial_receipt {
                eprintln!("chio: denial receipt {id}");
            }
            eprintln!(
                "chio: launch refused by policy {}: {} violation(s)",
                refusal.policy_id,
                refusal.violations.len()
            );
            return Ok(Done::without_launch(125));
        }
    };
    if let Some(note) = prepared.workspace_note() {
        if gate.is_some_and(|open| !open()) {
            return Ok(Done::without_launch(125));
        }
        eprintln!("{note}");
    }
    let record_file = match flags {
        Some(a) => create_record_file(a)?,
        None => None,
    };
    let (stdout, stderr, stdin) = (std::io::stdout(), std::io::stderr(), std::io::stdin());
    // In a daemon's launch process the command's output goes to the client's own descriptors,
    // and what was said before it goes out first.
    let (out, err) = crate::daemon::said::client_outputs().unwrap_or((stdout.as_fd(), stderr.as_fd()));
    crate::daemon::said::flush();
    let io = Io { stdout: out, stderr: err, stdin: request.interactive.then(|| stdin.as_fd()) };
    let to = match receipts.as_mut() {
        Some(r) => Receipts::Launch(r),
        None => Receipts::Off,
    };
    let launched = launch::run(&prepared, io, to, How { ahead, teardown, gate });
    if launched.withdrawn {
        return Ok(Done { status: 125, launched: Some(launched) });
    }
    if launched.stderr_mid_line {
        // chio's own lines (and the --json record) always start a line of their own.
        eprintln!();
    }
    // A receipt that cannot be written never hides the record: it is still printed and saved.
    match &launched.unrecorded {
        Some(why) => eprintln!("chio: {} could not be recorded: {why}", launch::unrecorded_words(&launched.record)),
        None if receipts.is_some() => eprintln!("chio: receipts {}", launched.receipts.join(" ")),
        None => {}
    }
    report(flags, &launched.record, record_file)?;
    Ok(Done { status: launched.status, launched: Some(launched) })
}

/// Create the `--record` file before anything runs: a path that cannot be written refuses the
/// launch instead of losing the command's exit status after it.
pub fn create_record_file(a: &RunArgs) -> Result<Option<std::fs::File>> {
    a.record
        .as_ref()
        .map(|path| {
            std::fs::File::create(path)
                .with_context(|| format!("--record {}: cannot create the record file", path.display()))
        })
        .transpose()
}

/// Write the record to the `--record` file, say how the launch failed or ran unconfined, and
/// print the record with `--json` (the last line on stderr).
pub fn report(flags: Option<&RunArgs>, rec: &LaunchRecord, record_file: Option<std::fs::File>) -> Result<()> {
    let json = serde_json::to_string(rec)?;
    if let (Some(mut f), Some(path)) = (record_file, flags.and_then(|a| a.record.as_ref())) {
        f.write_all(format!("{json}\n").as_bytes())
            .and_then(|_| f.sync_all())
            .with_context(|| format!("writing record {}", path.display()))?;
    }
    let mut err = std::io::stderr().lock();
    if let Some(f) = &rec.failure {
        let state = match rec.state {
            State::Rejected => "rejected",
            State::Unsupported => "unsupported on this host",
            _ => "cage failed",
        };
        writeln!(err, "chio: {state} at stage {}: {}: {}", f.stage.name(), f.code, f.detail)?;
    } else if rec.state == State::NotConfined {
        writeln!(err, "chio: shadow mode: the target ran NOT CONFINED: {}", rec.not_confined.join("; "))?;
    }
    if flags.is_some_and(|a| a.json) {
        writeln!(err, "{json}")?;
    }
    Ok(())
}
