//! `chio cage run`: build a CagePlan from flags, launch it, pass the target's output through,
//! write the record, exit with the target's status (125/126/127 for cage failures).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use std::io::Write;

use anyhow::{bail, Context, Result};
use chio_cage::LaunchRecord;
use chio_cage::{Bind, Mode, NetMode};
use chio_supervisor::launch::front::{self, Report};
use chio_supervisor::launch::{LaunchRequest, PolicyLaunch, TeardownAt};
use chio_supervisor::launch_plan::{ImageChoice, PlanOptions};
use clap::{Args, ValueEnum};
use serde_json::Value;

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

/// Run the command; returns the process exit status. One-shot: parse → [`launch::prepare`] →
/// [`launch::run`] → report ([`front::launch_request`]); with `--supervisor`, the daemon runs it.
pub fn run(a: &RunArgs) -> Result<i32> {
    if let Some(socket) = &a.supervisor {
        let record_file = create_record_file(a)?;
        let answer = crate::daemon::client::cage_launch(socket, request_from(a)?, a.interactive)?;
        return finish(a, &answer, record_file);
    }
    let request = request_from(a)?;
    let report = Report { record: create_record_file(a)?.zip(a.record.clone()), json: a.json };
    let receipts = a.receipt_db.as_deref().zip(a.kernel_key.as_deref());
    let done =
        front::launch_request(&request, receipts, None, report, chio_cage::Ahead::default(), TeardownAt::First, None)?;
    Ok(done.status)
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

/// The daemon's answer to a launch, reported as the one-shot form reports its own: the refusal
/// or the record (to `--record`, and with `--json` on stderr), the launch's exit status.
fn finish(a: &RunArgs, answer: &Value, record_file: Option<std::fs::File>) -> Result<i32> {
    if let Some(e) = answer.get("error").and_then(Value::as_str) {
        eprintln!("chio: the supervisor refused the launch: {e}");
        return Ok(answer.get("exit_code").and_then(Value::as_i64).map_or(125, |c| c as i32));
    }
    let status =
        answer.get("exit_status").and_then(Value::as_i64).context("the supervisor's answer has no exit_status")?;
    // The record is read only to be printed or saved.
    let wanted = record_file.is_some() || a.json;
    if let Some(r) = answer.get("record").filter(|r| wanted && !r.is_null()) {
        let rec: LaunchRecord = serde_json::from_value(r.clone()).context("the supervisor's launch record")?;
        if let (Some(mut f), Some(path)) = (record_file, &a.record) {
            f.write_all(format!("{}\n", serde_json::to_string(&rec)?).as_bytes())
                .and_then(|_| f.sync_all())
                .with_context(|| format!("writing record {}", path.display()))?;
        }
        if a.json {
            eprintln!("{}", serde_json::to_string(&rec)?);
        }
    }
    Ok(status as i32)
}
