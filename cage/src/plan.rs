//! `CagePlan`: the fully resolved description of one launch. Admission (or the CLI) builds it;
//! `launch` consumes it. Nothing in here is interpreted policy: every field is a concrete value.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How failures of confinement are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Any missing fact kills the launch before the target runs.
    Enforced,
    /// The target runs even when a fact is missing; the record says it was not confined and why.
    Shadow,
}

/// Network namespace contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// A new network namespace with no interface up.
    None,
    /// A new network namespace with only `lo` up.
    Loopback,
}

/// Where the cage's root filesystem comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootSpec {
    /// A directory (an imported image's rootfs): each top-level entry is bound read-only.
    Directory(PathBuf),
    /// The host's system directories (/usr, /bin, /lib*, /sbin) and a minimal /etc, read-only.
    HostSystem,
}

/// An extra bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// Host path (operator supplied).
    pub source: PathBuf,
    /// Absolute path inside the cage.
    pub dest: PathBuf,
    /// Read-write when true, read-only otherwise.
    pub writable: bool,
}

/// Resource ceilings. `None` means "no ceiling of this kind".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Memory ceiling in bytes (cgroup memory.max / limit_in_bytes).
    pub memory_bytes: Option<u64>,
    /// Extra swap allowed beyond memory (0 = none).
    pub swap_bytes: u64,
    /// Maximum number of tasks in the cage (cgroup pids.max).
    pub pids: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (1000 = one CPU).
    pub cpu_millis: Option<u64>,
    /// Wall-clock deadline in milliseconds.
    pub wall_ms: u64,
    /// Bytes of stdout and of stderr kept (each); the rest is counted and dropped.
    pub output_bytes: u64,
    /// Size of the `/tmp` tmpfs in bytes.
    pub tmp_bytes: u64,
    /// Size of the `/dev/shm` tmpfs in bytes.
    pub shm_bytes: u64,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// RLIMIT_FSIZE in bytes.
    pub fsize_bytes: u64,
    /// RLIMIT_CORE in bytes.
    pub core_bytes: u64,
    /// RLIMIT_CPU in seconds.
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_AS in bytes.
    pub address_space_bytes: Option<u64>,
    /// RLIMIT_SIGPENDING: queued signals are counted per uid across the host, and a cage
    /// queues only while the uid's count is below its own limit — so this bounds what one cage
    /// can take from the host's processes of the same uid.
    #[serde(default = "default_sigpending")]
    pub sigpending: u64,
    /// RLIMIT_MEMLOCK in bytes (`SHM_LOCK` is counted per uid across the host in the same way).
    #[serde(default = "default_memlock")]
    pub memlock_bytes: u64,
}

fn default_sigpending() -> u64 {
    256
}

fn default_memlock() -> u64 {
    64 << 10
}

impl Default for Limits {
    /// The repository-command defaults of DESIGN §6.
    fn default() -> Self {
        Limits {
            memory_bytes: Some(512 << 20),
            swap_bytes: 0,
            pids: Some(64),
            cpu_millis: Some(1000),
            wall_ms: 300_000,
            output_bytes: 512 << 10,
            tmp_bytes: 16 << 20,
            shm_bytes: 8 << 20,
            nofile: 128,
            fsize_bytes: 16 << 20,
            core_bytes: 0,
            cpu_seconds: None,
            address_space_bytes: None,
            sigpending: default_sigpending(),
            memlock_bytes: default_memlock(),
        }
    }
}

/// The setup stages of a launch, in order. Failures name the stage they happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Opening and checking every path of the plan.
    Resolve,
    /// Creating the launch cgroup and writing its ceilings.
    Cgroup,
    /// Creating the namespaces and the cage's init.
    Namespaces,
    /// Attaching the root, binds, /proc, /dev, /tmp.
    Mounts,
    /// pivot_root into the new root.
    Pivot,
    /// Bringing up loopback.
    Network,
    /// rlimits, groups, uid/gid, securebits, no_new_privs.
    Identity,
    /// Emptying every capability set.
    Capabilities,
    /// Landlock ruleset.
    Landlock,
    /// Seccomp filter.
    Seccomp,
    /// Finding and opening the target executable inside the cage.
    Target,
    /// Hash of the target against the plan's expected digest.
    Verify,
    /// execveat of the verified fd.
    Exec,
    /// Reading and checking the target's state at the exec stop.
    Observe,
    /// Running the target to its end.
    Supervise,
}

impl Stage {
    /// Every stage, in launch order (for fault-injection tests).
    pub const ALL: [Stage; 15] = [
        Stage::Resolve,
        Stage::Cgroup,
        Stage::Namespaces,
        Stage::Mounts,
        Stage::Pivot,
        Stage::Network,
        Stage::Identity,
        Stage::Capabilities,
        Stage::Landlock,
        Stage::Seccomp,
        Stage::Target,
        Stage::Verify,
        Stage::Exec,
        Stage::Observe,
        Stage::Supervise,
    ];

    /// The snake_case name used in records and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Resolve => "resolve",
            Stage::Cgroup => "cgroup",
            Stage::Namespaces => "namespaces",
            Stage::Mounts => "mounts",
            Stage::Pivot => "pivot",
            Stage::Network => "network",
            Stage::Identity => "identity",
            Stage::Capabilities => "capabilities",
            Stage::Landlock => "landlock",
            Stage::Seccomp => "seccomp",
            Stage::Target => "target",
            Stage::Verify => "verify",
            Stage::Exec => "exec",
            Stage::Observe => "observe",
            Stage::Supervise => "supervise",
        }
    }

    /// Parse a stage name.
    pub fn parse(s: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|st| st.name() == s)
    }
}

/// A test-only fault that makes one fact the supervisor checks at the exec stop false, through a
/// real unmet condition in the cage (a step skipped or undone). Only builds with the
/// `test-hooks` feature act on one; other builds refuse a plan that names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestHook {
    /// Execute this file (inside the cage) instead of the verified one.
    Exe(PathBuf),
    /// Skip no_new_privs (landlock and seccomp are applied while capabilities still allow it).
    NoNewPrivs,
    /// Skip the seccomp filter.
    Seccomp,
    /// Skip dropping the bounding set, clearing ambient and locking securebits.
    Bounding,
    /// Put a capability in the inheritable set and skip emptying the sets (the inheritable
    /// set survives exec).
    Caps,
    /// Run as the plan's uid minus one.
    Uid,
    /// Run as the plan's gid minus one.
    Gid,
    /// Keep a supplementary group.
    Groups,
    /// Do not unshare this namespace (`mnt`, `net`, `ipc`, `uts` or `cgroup`).
    Namespace(&'static str),
    /// Do not join the launch cgroup.
    Cgroup,
    /// Leave an extra fd open across exec.
    Fd,
    /// Change to `/` after entering the working directory.
    Cwd,
    /// The init keeps its copy of the status channel.
    Channel,
    /// Mount the image's entries without read-only and `/tmp`, `/dev/shm` without noexec (to
    /// show landlock alone refuses writes and execution there).
    MountFlags,
    /// Change the file sent for hashing in place once the supervisor has hashed it (after GO),
    /// before the exec (as another writer of the workspace might).
    Touch,
    /// Change the command's file (argv[0], a path) in place before opening it, once the
    /// supervisor has had the time to hash its early guess of it.
    TouchBeforeOpen,
    /// The target is killed (SIGKILL from the host) at its exec stop once every fact is checked,
    /// before it is let go: as the OOM killer or an operator might.
    KillAtExecStop,
    /// The supervisor exits the moment its init exists, and the init waits, before its first
    /// step, until it is gone: orphaned before it armed its parent-death signal, which will
    /// then never come, and before the supervisor sent it anything.
    OrphanEarly,
    /// The init's shedding of its privileges fails (as a refused setresuid or capability drop
    /// would): it must end the cage rather than supervise it privileged.
    InitShedFails,
    /// The init skips its shedding altogether (root, every capability, no `no_new_privs`) and
    /// goes on as if it had shed: only the supervisor's reading of it at the exec stop is left
    /// to refuse the launch.
    InitPrivileged,
    /// The target sleeps instead of making its exec (as one of a file on a file system that
    /// does not answer would), and the supervisor waits for its exec stop 1 s, not 30.
    StallBeforeExec,
    /// The init aborts when the target has ended, under its filter (as a bug in it would): the
    /// launch must end then, not spin until its deadline.
    InitAborts,
    /// The supervisor sends its go only once the target has had the time to finish its own
    /// setup (300 ms): one that failed there has reported it and ended by then.
    GoLate,
}

impl TestHook {
    /// The `CHIO_TEST_HOOK` value that [`TestHook::parse`] reads back as this hook.
    pub fn text(&self) -> String {
        match self {
            TestHook::Exe(p) => format!("exe={}", p.display()),
            TestHook::NoNewPrivs => "no_new_privs".into(),
            TestHook::Seccomp => "seccomp".into(),
            TestHook::Bounding => "bounding".into(),
            TestHook::Caps => "caps".into(),
            TestHook::Uid => "uid".into(),
            TestHook::Gid => "gid".into(),
            TestHook::Groups => "groups".into(),
            TestHook::Namespace(ns) => format!("ns={ns}"),
            TestHook::Cgroup => "cgroup".into(),
            TestHook::Fd => "fd".into(),
            TestHook::Cwd => "cwd".into(),
            TestHook::Channel => "channel".into(),
            TestHook::MountFlags => "mount_flags".into(),
            TestHook::Touch => "touch".into(),
            TestHook::TouchBeforeOpen => "touch_before_open".into(),
            TestHook::KillAtExecStop => "kill_at_exec_stop".into(),
            TestHook::OrphanEarly => "orphan_early".into(),
            TestHook::InitShedFails => "init_shed_fails".into(),
            TestHook::InitPrivileged => "init_privileged".into(),
            TestHook::StallBeforeExec => "stall_before_exec".into(),
            TestHook::InitAborts => "init_aborts".into(),
            TestHook::GoLate => "go_late".into(),
        }
    }

    /// Parse `CHIO_TEST_HOOK`'s value (`exe=/path`, `no_new_privs`, `ns=net`, ...).
    pub fn parse(s: &str) -> Result<TestHook, String> {
        if !cfg!(feature = "test-hooks") {
            return Err("this chio was built without test hooks (the `test-hooks` feature)".into());
        }
        Ok(match s {
            "no_new_privs" => TestHook::NoNewPrivs,
            "seccomp" => TestHook::Seccomp,
            "bounding" => TestHook::Bounding,
            "caps" => TestHook::Caps,
            "uid" => TestHook::Uid,
            "gid" => TestHook::Gid,
            "groups" => TestHook::Groups,
            "ns=mnt" => TestHook::Namespace("mnt"),
            "ns=net" => TestHook::Namespace("net"),
            "ns=ipc" => TestHook::Namespace("ipc"),
            "ns=uts" => TestHook::Namespace("uts"),
            "ns=cgroup" => TestHook::Namespace("cgroup"),
            "cgroup" => TestHook::Cgroup,
            "fd" => TestHook::Fd,
            "cwd" => TestHook::Cwd,
            "channel" => TestHook::Channel,
            "mount_flags" => TestHook::MountFlags,
            "touch" => TestHook::Touch,
            "touch_before_open" => TestHook::TouchBeforeOpen,
            "kill_at_exec_stop" => TestHook::KillAtExecStop,
            "orphan_early" => TestHook::OrphanEarly,
            "init_shed_fails" => TestHook::InitShedFails,
            "init_privileged" => TestHook::InitPrivileged,
            "stall_before_exec" => TestHook::StallBeforeExec,
            "init_aborts" => TestHook::InitAborts,
            "go_late" => TestHook::GoLate,
            _ => match s.strip_prefix("exe=") {
                Some(p) if p.starts_with('/') => TestHook::Exe(PathBuf::from(p)),
                _ => return Err(format!("CHIO_TEST_HOOK={s} names no hook")),
            },
        })
    }
}

/// `CHIO_TEST_HOOK`'s text form of a test hook, which is how a plan carries one.
#[cfg(feature = "test-hooks")]
mod hook_text {
    use super::TestHook;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(hook: &Option<TestHook>, s: S) -> Result<S::Ok, S::Error> {
        hook.as_ref().map(TestHook::text).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TestHook>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| TestHook::parse(&t).map_err(serde::de::Error::custom)).transpose()
    }
}

/// The test suites' switches on a plan (builds with the `test-hooks` feature only). Each can
/// only make a launch fail or claim less host support, never weaken a cage.
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TestSwitches {
    /// Fail this stage on purpose.
    pub fail_stage: Option<Stage>,
    /// Pretend the host's landlock ABI is at most this.
    pub landlock_abi_cap: Option<u32>,
    /// Make one exec-stop fact false, or one step misbehave.
    #[serde(with = "hook_text")]
    pub hook: Option<TestHook>,
}

/// One launch, fully resolved. It crosses a process boundary once: a daemon's spare clones the
/// cage's init before the request, and sends it the plan when the request comes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CagePlan {
    /// Enforcement mode.
    pub mode: Mode,
    /// Root filesystem source.
    pub root: RootSpec,
    /// Host directory bound at `/workspace` (read-write unless `workspace_read_only`).
    pub workspace: Option<PathBuf>,
    /// Bind the workspace read-only (a policy that admits reads of it, writes only below).
    pub workspace_read_only: bool,
    /// Extra binds.
    pub binds: Vec<Bind>,
    /// argv; `argv[0]` names the target (a path inside the cage, or a name looked up in PATH).
    pub argv: Vec<OsString>,
    /// The complete environment of the target.
    pub env: Vec<(OsString, OsString)>,
    /// Working directory inside the cage.
    pub cwd: PathBuf,
    /// uid the target runs as.
    pub uid: u32,
    /// gid the target runs as (also its only group).
    pub gid: u32,
    /// Network namespace contents.
    pub net: NetMode,
    /// TCP ports the target may connect to (landlock); empty = none.
    pub tcp_connect: Vec<u16>,
    /// TCP ports the target may bind (landlock); empty = none.
    pub tcp_bind: Vec<u16>,
    /// Ceilings.
    pub limits: Limits,
    /// Required SHA-256 (lowercase hex) of the target, if any.
    pub expect_sha256: Option<String>,
    /// A host directory the cage root is attached to inside the cage's private mount namespace.
    /// Nothing is ever written into it.
    pub staging_dir: PathBuf,
    /// cgroup v2 directory under which launch cgroups are created; `None` = detect.
    pub cgroup_v2_root: Option<PathBuf>,
    /// The test suites' switches; a build without the `test-hooks` feature has none.
    #[cfg(feature = "test-hooks")]
    #[serde(default)]
    pub test: TestSwitches,
    /// Where parts of the plan came from (an image's entrypoint, cmd, user, ...), copied into
    /// the launch record as they are.
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl CagePlan {
    /// A plan with the repository-command defaults for `argv` on the host-system root.
    pub fn new(argv: Vec<OsString>) -> Self {
        CagePlan {
            mode: Mode::Enforced,
            root: RootSpec::HostSystem,
            workspace: None,
            workspace_read_only: false,
            binds: Vec::new(),
            argv,
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into()),
                ("HOME".into(), "/workspace".into()),
                ("TMPDIR".into(), "/tmp".into()),
            ],
            cwd: PathBuf::from("/"),
            uid: 65534,
            gid: 65534,
            net: NetMode::None,
            tcp_connect: Vec::new(),
            tcp_bind: Vec::new(),
            limits: Limits::default(),
            expect_sha256: None,
            staging_dir: PathBuf::from("/run/chio/cage-root"),
            cgroup_v2_root: None,
            #[cfg(feature = "test-hooks")]
            test: TestSwitches::default(),
            annotations: Default::default(),
        }
    }

    /// The test hook the plan names (never in a build without test hooks).
    pub fn test_hook(&self) -> Option<&TestHook> {
        #[cfg(feature = "test-hooks")]
        return self.test.hook.as_ref();
        #[cfg(not(feature = "test-hooks"))]
        None
    }

    /// True when this build acts on test hooks and the plan names `hook`.
    pub fn hook(&self, hook: &TestHook) -> bool {
        self.test_hook() == Some(hook)
    }

    /// True when the plan asks `stage` to fail on purpose (never in a build without test hooks).
    pub fn fails_on_purpose(&self, stage: Stage) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.test.fail_stage == Some(stage);
        #[cfg(not(feature = "test-hooks"))]
        {
            let _ = stage;
            false
        }
    }

    /// The landlock ABI the test suites pretend the host has at most (never in a build
    /// without test hooks).
    pub fn landlock_abi_cap(&self) -> Option<u32> {
        #[cfg(feature = "test-hooks")]
        return self.test.landlock_abi_cap;
        #[cfg(not(feature = "test-hooks"))]
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan crosses to an init cloned ahead as JSON: it must arrive whole, hook included.
    #[test]
    fn a_plan_arrives_as_it_was_sent() {
        let mut plan = CagePlan::new(vec!["/bin/sh".into(), "-c".into(), "true".into()]);
        plan.root = RootSpec::Directory("/images/a".into());
        plan.binds.push(Bind { source: "/src".into(), dest: "/dst".into(), writable: true });
        plan.limits.memory_bytes = Some(1 << 20);
        plan.annotations.insert("entrypoint".into(), "x".into());
        let back: CagePlan = serde_json::from_slice(&serde_json::to_vec(&plan).unwrap()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{plan:?}"));
        #[cfg(feature = "test-hooks")]
        {
            plan.test.fail_stage = Some(Stage::Pivot);
            let mut hooks = vec![None];
            for t in ["exe=/x", "no_new_privs", "seccomp", "bounding", "caps", "uid", "gid", "groups", "ns=net"] {
                hooks.push(Some(TestHook::parse(t).unwrap()));
            }
            for t in ["ns=ipc", "ns=uts", "ns=cgroup", "cgroup", "fd", "cwd", "channel", "mount_flags"] {
                hooks.push(Some(TestHook::parse(t).unwrap()));
            }
            for hook in hooks {
                plan.test.hook = hook;
                let back: CagePlan = serde_json::from_slice(&serde_json::to_vec(&plan).unwrap()).unwrap();
                assert_eq!(format!("{back:?}"), format!("{plan:?}"));
            }
        }
    }
}
