//! `chio cage run`: build a CagePlan from flags, launch it, pass the target's output through,
//! write the record, exit with the target's status (125/126/127 for cage failures).

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use chio_cage::{Bind, CagePlan, LaunchRecord, Mode, NetMode, RootSpec, Sinks, Stage, State};
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
    record: Option<PathBuf>,
    /// Print the launch record as one JSON line, the last line on stderr.
    #[arg(long)]
    json: bool,
    /// Feed chio's stdin to the command through a pipe. Without it the command's stdin is the
    /// cage's /dev/null; it never gets chio's own stdin (a terminal or pipe) itself.
    #[arg(short = 'i', long)]
    interactive: bool,
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
    let source = std::path::absolute(src).with_context(|| format!("bind source {src}"))?;
    Ok(Bind { source, dest: PathBuf::from(dst), writable })
}

fn optional<T>(s: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Option<T>> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    parse(s).map(Some).map_err(anyhow::Error::msg)
}

/// Turn flags into a plan (no I/O beyond canonicalizing operator paths).
pub fn plan_from(a: &RunArgs) -> Result<(CagePlan, Option<std::fs::File>)> {
    let mut plan = CagePlan::new(a.command.clone());
    let mut held = None;
    plan.mode = match a.mode {
        ModeArg::Enforced => Mode::Enforced,
        ModeArg::Shadow => Mode::Shadow,
    };
    plan.net = match a.net {
        NetArg::None => NetMode::None,
        NetArg::Loopback => NetMode::Loopback,
    };
    if let Some(r) = &a.rootfs {
        // Not canonicalized here: the cage opens it (and reports a missing rootfs in the record).
        plan.root = RootSpec::Directory(std::path::absolute(r).with_context(|| format!("rootfs {}", r.display()))?);
    }
    if let Some(image) = &a.image {
        held = Some(apply_image(&mut plan, image, a)?);
    }
    if let Some(w) = &a.workspace {
        plan.workspace = Some(std::path::absolute(w).with_context(|| format!("workspace {}", w.display()))?);
        plan.cwd = PathBuf::from("/workspace");
    } else {
        set_env(&mut plan.env, "HOME", "/tmp");
    }
    if let Some(c) = &a.cwd {
        // Rebuilt from its components: "/tmp/" and "/tmp/./" become "/tmp" ('..' is kept and refused).
        plan.cwd = c.components().collect();
    }
    for b in &a.ro_bind {
        plan.binds.push(split_bind(b, false)?);
    }
    for b in &a.bind {
        plan.binds.push(split_bind(b, true)?);
    }
    for file in &a.env_file {
        let text = std::fs::read_to_string(file).with_context(|| format!("--env-file {}", file.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            apply_env(&mut plan.env, line).with_context(|| format!("--env-file {}:{}", file.display(), n + 1))?;
        }
    }
    for kv in &a.env {
        apply_env(&mut plan.env, kv).context("--env")?;
    }
    plan.uid = a.uid.unwrap_or(plan.uid);
    plan.gid = a.gid.unwrap_or(plan.gid);
    let l = &mut plan.limits;
    l.memory_bytes = optional(&a.memory, parse_size).context("--memory")?;
    l.pids = optional(&a.pids, |s| s.parse::<u64>().map_err(|_| format!("{s:?} is not a number"))).context("--pids")?;
    l.cpu_millis = optional(&a.cpus, parse_cpus).context("--cpus")?;
    l.wall_ms = parse_duration_ms(&a.timeout).map_err(anyhow::Error::msg).context("--timeout")?;
    l.output_bytes = parse_size(&a.output_limit).map_err(anyhow::Error::msg).context("--output-limit")?;
    l.tmp_bytes = parse_size(&a.tmp_size).map_err(anyhow::Error::msg).context("--tmp-size")?;
    plan.expect_sha256 = a.expect_sha256.clone();
    apply_environment_overrides(&mut plan)?;
    Ok((plan, held))
}

/// Root filesystem, environment and working directory from an imported image (flags given
/// later override them).
fn apply_image(plan: &mut CagePlan, image: &str, a: &RunArgs) -> Result<std::fs::File> {
    let (store, rec) = crate::image_cmd::find(&a.state_dir, image)?;
    // Held for the whole launch: `image rm` refuses an image in use.
    let held = store.hold(&rec).with_context(|| format!("image {image}"))?;
    plan.root = RootSpec::Directory(store.rootfs(&rec));
    for kv in rec.config["Env"].as_array().into_iter().flatten().filter_map(|v| v.as_str()) {
        if let Some((k, v)) = kv.split_once('=') {
            set_env(&mut plan.env, k, v);
        }
    }
    if let Some(wd) = rec.config["WorkingDir"].as_str().filter(|w| w.starts_with('/')) {
        plan.cwd = Path::new(wd).components().collect();
    }
    // docker run: Entrypoint (or --entrypoint) then the command, or the image's Cmd.
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_string)).collect()
    };
    let entrypoint = match &a.entrypoint {
        Some(e) if e.is_empty() => Vec::new(),
        Some(e) => vec![e.clone()],
        None => strings(&rec.config["Entrypoint"]),
    };
    let cmd: Vec<OsString> = if a.command.is_empty() {
        strings(&rec.config["Cmd"]).into_iter().map(OsString::from).collect()
    } else {
        a.command.clone()
    };
    plan.argv = entrypoint.iter().map(OsString::from).chain(cmd).collect();
    if plan.argv.is_empty() {
        bail!("image {image} has no Entrypoint or Cmd: give a command after --");
    }
    plan.annotations.insert("image.id".into(), rec.image_id.clone());
    for (key, field) in [("image.entrypoint", "Entrypoint"), ("image.cmd", "Cmd"), ("image.user", "User")] {
        if !rec.config[field].is_null() {
            plan.annotations.insert(key.into(), rec.config[field].to_string());
        }
    }
    if let Some(user) = rec.config["User"].as_str().filter(|u| !u.is_empty()) {
        let (uid, gid) =
            image_user(&store.rootfs(&rec), user).with_context(|| format!("image {image}: User {user:?}"))?;
        plan.uid = uid;
        plan.gid = gid;
    }
    Ok(held)
}

/// An image's `User` (`name`, `uid`, `name:group`, `uid:gid`) as numeric ids, names looked up
/// in the image's own /etc/passwd and /etc/group (read inside its root, never through a link
/// out of it). A user without a group gets its passwd group, or a gid equal to its uid.
fn image_user(rootfs: &Path, user: &str) -> Result<(u32, u32)> {
    let read = |p: &str| -> String {
        use std::io::Read;
        let mut s = String::new();
        let root = chio_cage::path::open_host(rootfs, libc::O_DIRECTORY);
        if let Ok(fd) =
            root.and_then(|r| chio_cage::path::resolve_in(std::os::fd::AsFd::as_fd(&r), Path::new(p), libc::O_RDONLY))
        {
            let _ = std::fs::File::from(fd).take(1 << 20).read_to_string(&mut s);
        }
        s
    };
    let lookup = |file: &str, name: &str, field: usize| -> Option<u32> {
        read(file).lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name)).then(|| f.get(field)?.parse().ok()).flatten()
        })
    };
    let (u, g) = user.split_once(':').map_or((user, None), |(u, g)| (u, Some(g)));
    let uid = match u.parse::<u32>() {
        Ok(n) => n,
        Err(_) => {
            lookup("/etc/passwd", u, 2).with_context(|| format!("user {u:?} is not in the image's /etc/passwd"))?
        }
    };
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                lookup("/etc/group", g, 2).with_context(|| format!("group {g:?} is not in the image's /etc/group"))?
            }
        },
        None => read("/etc/passwd")
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.get(2).and_then(|x| x.parse::<u32>().ok()) == Some(uid)).then(|| f.get(3)?.parse().ok()).flatten()
            })
            .unwrap_or(uid),
    };
    Ok((uid, gid))
}

/// `KEY=VALUE` sets it; `KEY` alone passes chio's own value through (refused when unset).
fn apply_env(env: &mut Vec<(OsString, OsString)>, spec: &str) -> Result<()> {
    let (k, v) = match spec.split_once('=') {
        Some((k, v)) => (k, v.to_string()),
        None => {
            let v = std::env::var(spec)
                .with_context(|| format!("{spec:?} passes chio's own value through, but it is not set"))?;
            (spec, v)
        }
    };
    if k.is_empty() || k.contains('\0') {
        bail!("{spec:?} has no variable name");
    }
    set_env(env, k, &v);
    Ok(())
}

fn set_env(env: &mut Vec<(OsString, OsString)>, k: &str, v: &str) {
    env.retain(|(key, _)| key != k);
    env.push((k.into(), v.into()));
}

/// Operator settings and test-only switches from the environment. The test switches can only
/// make a launch fail or claim less host support; they never weaken a cage.
pub fn apply_environment_overrides(plan: &mut CagePlan) -> Result<()> {
    if let Some(d) = std::env::var_os("CHIO_STAGING_DIR") {
        plan.staging_dir = PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("CHIO_CGROUP_V2_ROOT") {
        plan.cgroup_v2_root = Some(PathBuf::from(d));
    }
    if let Ok(s) = std::env::var("CHIO_TEST_FAIL_STAGE") {
        let stage = Stage::parse(&s).with_context(|| format!("CHIO_TEST_FAIL_STAGE={s} names no stage"))?;
        if stage == Stage::Supervise {
            bail!("CHIO_TEST_FAIL_STAGE=supervise: only setup stages can be made to fail");
        }
        plan.inject_failure = Some(stage);
    }
    if let Ok(s) = std::env::var("CHIO_TEST_HOOK") {
        plan.test_hook = Some(chio_cage::TestHook::parse(&s).map_err(anyhow::Error::msg)?);
    }
    if let Ok(s) = std::env::var("CHIO_TEST_LANDLOCK_ABI") {
        plan.landlock_abi_cap = Some(s.parse().with_context(|| format!("CHIO_TEST_LANDLOCK_ABI={s} is not a number"))?);
    }
    Ok(())
}

/// Run the command; returns the process exit status.
pub fn run(a: &RunArgs) -> Result<i32> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "chio cage run needs root: it creates namespaces, mounts and cgroups for the cage \
             (run it as root, e.g. with sudo; the command itself runs as --uid, 65534 by default)"
        );
    }
    let (plan, _held_image) = match (&a.policy, &a.policy_signer, &a.manifest) {
        (Some(p), Some(k), Some(m)) => match crate::policy_launch::plan(a, p, k, m)? {
            Ok(planned) => planned,
            Err(code) => return Ok(code),
        },
        _ => plan_from(a)?,
    };
    if let Some(ws) = &plan.workspace {
        warn_unwritable(ws, plan.uid, plan.gid);
    }
    // The record file is created before anything runs, like the receipt store: a path that
    // cannot be written refuses the launch instead of losing the command's exit status after it.
    let record_file = match &a.record {
        Some(path) => Some(
            std::fs::File::create(path)
                .with_context(|| format!("--record {}: cannot create the record file", path.display()))?,
        ),
        None => None,
    };
    // Opened before anything runs: a bad key or a foreign store refuses the launch up front.
    let mut receipts = match (&a.receipt_db, &a.kernel_key) {
        (Some(db), Some(seed)) => Some(crate::receipt_cmd::LaunchReceipts::open(db, seed)?),
        _ => None,
    };
    let (stdout, stderr, stdin) = (std::io::stdout(), std::io::stderr(), std::io::stdin());
    let mut sinks = Sinks::new(stdout.as_fd(), stderr.as_fd());
    if a.interactive {
        sinks.stdin = Some(stdin.as_fd());
    }
    // With receipts, the enforcement receipt is made durable at the exec stop, before the target
    // runs one instruction; if it cannot be, the launch stops there.
    let mut enforced = None;
    let mut record_enforcement = |r: &LaunchRecord| -> std::result::Result<(), String> {
        if let Some(rc) = receipts.as_mut() {
            enforced = Some(rc.enforcement(r).map_err(|e| format!("recording the enforcement receipt: {e:#}"))?);
        }
        Ok(())
    };
    sinks.on_enforced = Some(&mut record_enforcement);
    let rec = chio_cage::launch(&plan, &mut sinks);
    if sinks.stderr_mid_line {
        // chio's own lines (and the --json record) always start a line of their own.
        eprintln!();
    }
    // A receipt that cannot be written never hides the record: it is still printed and saved.
    let mut unrecorded = false;
    if let Some(r) = receipts.as_mut() {
        match r.finish(&rec, enforced.take()) {
            Ok(ids) => eprintln!("chio: receipts {}", ids.join(" ")),
            Err(e) => {
                let what = match rec.state {
                    State::FullyEnforced | State::NotConfined => "the command ran but its receipts",
                    _ => "the launch did not run, and the receipt of its failure",
                };
                eprintln!("chio: {what} could not be recorded: {e:#}");
                unrecorded = true;
            }
        }
    }
    report(a, &rec, record_file)?;
    Ok(if unrecorded { 125 } else { rec.exit_status() })
}

/// Say before the run when the command's uid and gid cannot write the workspace (the cage has
/// no capability to override file permissions): it would otherwise fail inside with EACCES.
fn warn_unwritable(ws: &Path, uid: u32, gid: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::symlink_metadata(ws) else { return };
    let mode = m.mode();
    let writable = (m.uid() == uid && mode & 0o200 != 0)
        || (m.uid() != uid && m.gid() == gid && mode & 0o020 != 0)
        || (m.uid() != uid && m.gid() != gid && mode & 0o002 != 0);
    if !writable {
        eprintln!(
            "chio: note: the workspace {} (owner {}:{}, mode {:o}) is not writable by uid {uid} gid {gid} in the cage; \
             run with --uid {} --gid {}, or chown it",
            ws.display(),
            m.uid(),
            m.gid(),
            mode & 0o7777,
            m.uid(),
            m.gid()
        );
    }
}

fn report(a: &RunArgs, rec: &LaunchRecord, record_file: Option<std::fs::File>) -> Result<()> {
    let json = serde_json::to_string(rec)?;
    if let (Some(mut f), Some(path)) = (record_file, &a.record) {
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
    if a.json {
        writeln!(err, "{json}")?;
    }
    Ok(())
}
