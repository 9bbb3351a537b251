//! Turning launch options into a [`CagePlan`]: defaults, an imported image's root, environment,
//! working directory and user, the workspace, binds and environment variables. The one-shot CLI,
//! the repository leg and the daemon build their plans through here.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use chio_cage::{Bind, CagePlan, Limits, Mode, NetMode, RootSpec};
use serde::{Deserialize, Serialize};

use crate::image::store::{ImageRecord, ImageStore};

/// Why a plan could not be built (the message says what to change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError(pub String);

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlanError {}

fn err(msg: impl Into<String>) -> PlanError {
    PlanError(msg.into())
}

/// An imported image to run on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageChoice {
    /// The image store's state directory (None: the launching process's own, see
    /// [`crate::state_dir`]; a daemon's launch is on the daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_dir: Option<PathBuf>,
    /// Reference or image ID.
    pub reference: String,
    /// Replace the image's Entrypoint (`Some("")` clears it).
    pub entrypoint: Option<String>,
}

/// Everything a caller may choose about one launch. Unset fields take the repository-command
/// defaults of DESIGN §6 (or the image's config). Its JSON form is what a daemon client sends
/// (`supervisor::launch::LaunchRequest`): who may set which field is the daemon's admission's to
/// decide, field by field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlanOptions {
    /// Command and arguments (with an image: replaces its Cmd, after its Entrypoint). On the
    /// wire as strings: an argument that is not UTF-8 cannot travel to a daemon.
    #[serde(with = "os_strings")]
    pub argv: Vec<OsString>,
    /// Enforcement mode.
    pub mode: Mode,
    /// Network namespace contents.
    pub net: NetMode,
    /// A root filesystem directory (conflicts with `image`).
    pub rootfs: Option<PathBuf>,
    /// An imported image.
    pub image: Option<ImageChoice>,
    /// Host directory bound read-write at /workspace (and the working directory).
    pub workspace: Option<PathBuf>,
    /// Working directory inside the cage.
    pub cwd: Option<PathBuf>,
    /// Extra binds.
    pub binds: Vec<Bind>,
    /// Files of `KEY=VALUE` / `KEY` lines (applied before `env`).
    pub env_files: Vec<PathBuf>,
    /// `KEY=VALUE`, or `KEY` to pass this process's own value through.
    pub env: Vec<String>,
    /// uid (default: the image's User, else 65534).
    pub uid: Option<u32>,
    /// gid (default: the image's User's group, else 65534).
    pub gid: Option<u32>,
    /// Ceilings.
    pub limits: Limits,
    /// Required SHA-256 of the target.
    pub expect_sha256: Option<String>,
    /// Facts about the launch's origin for its record (`repository.operation_key`,
    /// `session.role`, ...): set by the road, never by a daemon client.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Loopback TCP ports the target may bind and connect to (landlock denies every other):
    /// a session's worker reaches its model gateway by one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp_ports: Vec<u16>,
}

/// `Vec<OsString>` as JSON strings (refusing, not mangling, one that is not UTF-8).
mod os_strings {
    use std::ffi::OsString;

    use serde::{de::Deserializer, ser::Error, Deserialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[OsString], s: S) -> Result<S::Ok, S::Error> {
        let strings: Result<Vec<&str>, S::Error> = v
            .iter()
            .map(|a| a.to_str().ok_or_else(|| S::Error::custom(format!("argument {a:?} is not UTF-8"))))
            .collect();
        s.collect_seq(strings?)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<OsString>, D::Error> {
        Ok(Vec::<String>::deserialize(d)?.into_iter().map(OsString::from).collect())
    }
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions::new(Vec::new())
    }
}

impl PlanOptions {
    /// Options for `argv` with every default.
    pub fn new(argv: Vec<OsString>) -> Self {
        PlanOptions {
            argv,
            mode: Mode::Enforced,
            net: NetMode::None,
            rootfs: None,
            image: None,
            workspace: None,
            cwd: None,
            binds: Vec::new(),
            env_files: Vec::new(),
            env: Vec::new(),
            uid: None,
            gid: None,
            limits: Limits::default(),
            expect_sha256: None,
            annotations: BTreeMap::new(),
            tcp_ports: Vec::new(),
        }
    }
}

/// A built plan, and the hold on its image (kept for the whole launch: `image rm` refuses an
/// image in use).
#[derive(Debug)]
pub struct Planned {
    /// The plan.
    pub plan: CagePlan,
    /// The image hold, when the plan runs on an image.
    pub image_hold: Option<File>,
    /// The image, when the plan runs on one.
    pub image: Option<ImageRecord>,
}

/// Build the plan (no I/O beyond reading the image store, env files and the image's passwd).
pub fn build(o: &PlanOptions) -> Result<Planned, PlanError> {
    let mut plan = CagePlan::new(o.argv.clone());
    let (mut image_hold, mut image) = (None, None);
    plan.mode = o.mode;
    plan.net = o.net;
    if let Some(r) = &o.rootfs {
        if o.image.is_some() {
            return Err(err("a rootfs and an image cannot both be the root"));
        }
        // Not canonicalized here: the cage opens it (and reports a missing rootfs in the record).
        plan.root = RootSpec::Directory(absolute(r, "rootfs")?);
    }
    if let Some(choice) = &o.image {
        let (hold, rec) = apply_image(&mut plan, choice, !o.argv.is_empty())?;
        image_hold = Some(hold);
        image = Some(rec);
    }
    if let Some(w) = &o.workspace {
        plan.workspace = Some(absolute(w, "workspace")?);
        plan.cwd = PathBuf::from("/workspace");
    } else {
        set_env(&mut plan.env, "HOME", "/tmp");
    }
    if let Some(c) = &o.cwd {
        // Rebuilt from its components: "/tmp/" and "/tmp/./" become "/tmp" ('..' is kept and refused).
        plan.cwd = c.components().collect();
    }
    for b in &o.binds {
        let source = absolute(&b.source, "bind source")?;
        plan.binds.push(Bind { source, ..b.clone() });
    }
    for file in &o.env_files {
        let text = std::fs::read_to_string(file).map_err(|e| err(format!("env file {}: {e}", file.display())))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            apply_env(&mut plan.env, line).map_err(|e| err(format!("env file {}:{}: {e}", file.display(), n + 1)))?;
        }
    }
    for kv in &o.env {
        apply_env(&mut plan.env, kv)?;
    }
    plan.uid = o.uid.unwrap_or(plan.uid);
    plan.gid = o.gid.unwrap_or(plan.gid);
    plan.limits = o.limits.clone();
    plan.expect_sha256 = o.expect_sha256.clone();
    plan.annotations.extend(o.annotations.clone());
    plan.tcp_bind = o.tcp_ports.clone();
    plan.tcp_connect = o.tcp_ports.clone();
    apply_environment_overrides(&mut plan)?;
    Ok(Planned { plan, image_hold, image })
}

fn absolute(p: &Path, what: &str) -> Result<PathBuf, PlanError> {
    std::path::absolute(p).map_err(|e| err(format!("{what} {}: {e}", p.display())))
}

/// Root filesystem, environment, working directory, user and argv from an imported image (the
/// caller's options applied later override them).
fn apply_image(plan: &mut CagePlan, c: &ImageChoice, has_command: bool) -> Result<(File, ImageRecord), PlanError> {
    let store_dir = crate::state_dir(c.store_dir.as_deref());
    let store =
        ImageStore::open_existing(&store_dir).map_err(|e| err(format!("image store {}: {e}", store_dir.display())))?;
    let rec = store.find(&c.reference).map_err(|e| err(e.to_string()))?;
    let held = store.hold(&rec).map_err(|e| err(format!("image {}: {e}", c.reference)))?;
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
    let strings = |v: &serde_json::Value| -> Vec<OsString> {
        v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(OsString::from)).collect()
    };
    let entrypoint = match &c.entrypoint {
        Some(e) if e.is_empty() => Vec::new(),
        Some(e) => vec![OsString::from(e)],
        None => strings(&rec.config["Entrypoint"]),
    };
    let cmd = if has_command { std::mem::take(&mut plan.argv) } else { strings(&rec.config["Cmd"]) };
    plan.argv = entrypoint.into_iter().chain(cmd).collect();
    if plan.argv.is_empty() {
        return Err(err(format!("image {} has no Entrypoint or Cmd: give a command", c.reference)));
    }
    plan.annotations.insert("image.id".into(), rec.image_id.clone());
    for (key, field) in [("image.entrypoint", "Entrypoint"), ("image.cmd", "Cmd"), ("image.user", "User")] {
        if !rec.config[field].is_null() {
            plan.annotations.insert(key.into(), rec.config[field].to_string());
        }
    }
    if let Some(user) = rec.config["User"].as_str().filter(|u| !u.is_empty()) {
        let (uid, gid) = image_user(&store.rootfs(&rec), user)
            .map_err(|e| err(format!("image {}: User {user:?}: {e}", c.reference)))?;
        plan.uid = uid;
        plan.gid = gid;
    }
    Ok((held, rec))
}

/// A file of an image's root, read inside that root (never through a link out of it); empty
/// when it is missing or unreadable.
fn read_in_root(rootfs: &Path, p: &str) -> String {
    let mut s = String::new();
    let root = chio_cage::path::open_host(rootfs, libc::O_DIRECTORY);
    if let Ok(fd) = root.and_then(|r| chio_cage::path::resolve_in(r.as_fd(), Path::new(p), libc::O_RDONLY)) {
        let _ = File::from(fd).take(1 << 20).read_to_string(&mut s);
    }
    s
}

/// An image's `User` (`name`, `uid`, `name:group`, `uid:gid`) as numeric ids, names looked up
/// in the image's own /etc/passwd and /etc/group. A user without a group gets its passwd group,
/// or a gid equal to its uid.
pub fn image_user(rootfs: &Path, user: &str) -> Result<(u32, u32), PlanError> {
    let field = |line: &str, n: usize| line.split(':').nth(n).map(str::to_string);
    let lookup = |file: &str, name: &str| -> Option<u32> {
        read_in_root(rootfs, file)
            .lines()
            .find(|l| field(l, 0).as_deref() == Some(name))?
            .split(':')
            .nth(2)?
            .parse()
            .ok()
    };
    let (u, g) = user.split_once(':').map_or((user, None), |(u, g)| (u, Some(g)));
    let uid = match u.parse::<u32>() {
        Ok(n) => n,
        Err(_) => {
            lookup("/etc/passwd", u).ok_or_else(|| err(format!("user {u:?} is not in the image's /etc/passwd")))?
        }
    };
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                lookup("/etc/group", g).ok_or_else(|| err(format!("group {g:?} is not in the image's /etc/group")))?
            }
        },
        None => read_in_root(rootfs, "/etc/passwd")
            .lines()
            .find(|l| field(l, 2).and_then(|x| x.parse::<u32>().ok()) == Some(uid))
            .and_then(|l| field(l, 3)?.parse().ok())
            .unwrap_or(uid),
    };
    Ok((uid, gid))
}

/// `KEY=VALUE` sets it; `KEY` alone passes this process's own value through (refused when unset).
fn apply_env(env: &mut Vec<(OsString, OsString)>, spec: &str) -> Result<(), PlanError> {
    let (k, v) = match spec.split_once('=') {
        Some((k, v)) => (k, v.to_string()),
        None => {
            let v = std::env::var(spec)
                .map_err(|_| err(format!("{spec:?} passes chio's own value through, but it is not set")))?;
            (spec, v)
        }
    };
    if k.is_empty() || k.contains('\0') {
        return Err(err(format!("{spec:?} has no variable name")));
    }
    set_env(env, k, &v);
    Ok(())
}

/// Set `k` (replacing an earlier value).
pub fn set_env(env: &mut Vec<(OsString, OsString)>, k: &str, v: &str) {
    env.retain(|(key, _)| key != k);
    env.push((k.into(), v.into()));
}

/// Operator settings and test-only switches from the environment. The test switches can only
/// make a launch fail or claim less host support; they never weaken a cage.
pub fn apply_environment_overrides(plan: &mut CagePlan) -> Result<(), PlanError> {
    if let Some(d) = std::env::var_os("CHIO_STAGING_DIR") {
        plan.staging_dir = PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("CHIO_CGROUP_V2_ROOT") {
        plan.cgroup_v2_root = Some(PathBuf::from(d));
    }
    // Test switches act only in the test suites' build (any other refuses to start with one set,
    // and its plans have no field for them).
    #[cfg(feature = "test-hooks")]
    test_switches(plan)?;
    Ok(())
}

/// The test suites' switches from the environment (`CHIO_TEST_FAIL_STAGE`, `CHIO_TEST_HOOK`,
/// `CHIO_TEST_LANDLOCK_ABI`).
#[cfg(feature = "test-hooks")]
fn test_switches(plan: &mut CagePlan) -> Result<(), PlanError> {
    use chio_cage::Stage;
    if let Ok(s) = std::env::var("CHIO_TEST_FAIL_STAGE") {
        let stage = Stage::parse(&s).ok_or_else(|| err(format!("CHIO_TEST_FAIL_STAGE={s} names no stage")))?;
        if stage == Stage::Supervise {
            return Err(err("CHIO_TEST_FAIL_STAGE=supervise: only setup stages can be made to fail"));
        }
        plan.test.fail_stage = Some(stage);
    }
    if let Ok(s) = std::env::var("CHIO_TEST_HOOK") {
        plan.test.hook = Some(chio_cage::TestHook::parse(&s).map_err(PlanError)?);
    }
    if let Ok(s) = std::env::var("CHIO_TEST_LANDLOCK_ABI") {
        plan.test.landlock_abi_cap =
            Some(s.parse().map_err(|_| err(format!("CHIO_TEST_LANDLOCK_ABI={s} is not a number")))?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_repository_command_defaults() {
        let p = build(&PlanOptions::new(vec!["true".into()])).unwrap().plan;
        assert_eq!(p.uid, 65534);
        assert_eq!(p.limits, Limits::default());
        assert_eq!(p.net, NetMode::None);
        assert!(p.env.contains(&("HOME".into(), "/tmp".into())), "{:?}", p.env);
    }

    #[test]
    fn workspace_sets_home_and_cwd_and_env_overrides_in_order() {
        let mut o = PlanOptions::new(vec!["true".into()]);
        o.workspace = Some("/srv/w".into());
        o.env = vec!["A=1".into(), "A=2".into()];
        let p = build(&o).unwrap().plan;
        assert_eq!(p.cwd, PathBuf::from("/workspace"));
        assert!(p.env.contains(&("HOME".into(), "/workspace".into())));
        assert_eq!(p.env.iter().filter(|(k, _)| k == "A").count(), 1);
        assert!(p.env.contains(&("A".into(), "2".into())));
        o.env = vec!["=x".into()];
        assert!(build(&o).unwrap_err().0.contains("no variable name"));
    }

    #[test]
    fn rootfs_and_image_conflict() {
        let mut o = PlanOptions::new(vec!["true".into()]);
        o.rootfs = Some("/r".into());
        o.image = Some(ImageChoice { store_dir: Some("/nonexistent".into()), reference: "x".into(), entrypoint: None });
        assert!(build(&o).unwrap_err().0.contains("cannot both"));
    }
}
