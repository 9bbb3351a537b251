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

/// A tmpfs the cage mounts at a top-level name (an OCI bundle's `/run`, say): writable,
/// `nosuid,nodev,noexec`, sized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tmpfs {
    /// Absolute path of one component below `/` (not `/proc`, `/dev`, `/tmp` or `/workspace`).
    pub dest: PathBuf,
    /// Size in bytes.
    pub bytes: u64,
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
    /// Rlimits a launch asks for by name (an OCI config's `process.rlimits`), set after the
    /// ones above. Each only ever lowers: its hard value is capped at what the cage already
    /// holds, its soft value at that hard one — so a soft limit may sit below its hard one
    /// (`RLIMIT_NOFILE` 1024 under 1048576, as engines ask), and no request raises a ceiling.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked: Vec<AskedRlimit>,
}

/// One rlimit a launch asks for: see [`Limits::asked`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskedRlimit {
    /// Which limit.
    pub resource: RlimitResource,
    /// The soft value asked (at most `hard`).
    pub soft: u64,
    /// The hard value asked (capped at what the cage holds).
    pub hard: u64,
}

/// The rlimits a launch may ask for by name (`RLIMIT_` + the upper-cased name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RlimitResource {
    /// RLIMIT_AS: address space (bytes).
    As,
    /// RLIMIT_CORE: core file size (bytes).
    Core,
    /// RLIMIT_CPU: CPU time (seconds).
    Cpu,
    /// RLIMIT_DATA: data segment (bytes).
    Data,
    /// RLIMIT_FSIZE: file size (bytes).
    Fsize,
    /// RLIMIT_LOCKS: file locks.
    Locks,
    /// RLIMIT_MEMLOCK: locked memory (bytes).
    Memlock,
    /// RLIMIT_MSGQUEUE: POSIX message queue bytes (counted per uid).
    Msgqueue,
    /// RLIMIT_NICE: nice ceiling.
    Nice,
    /// RLIMIT_NOFILE: open files.
    Nofile,
    /// RLIMIT_NPROC: processes of the uid (counted across the host).
    Nproc,
    /// RLIMIT_RSS: resident set (ignored by Linux).
    Rss,
    /// RLIMIT_RTPRIO: real-time priority.
    Rtprio,
    /// RLIMIT_RTTIME: real-time CPU time (microseconds).
    Rttime,
    /// RLIMIT_SIGPENDING: queued signals (counted per uid).
    Sigpending,
    /// RLIMIT_STACK: stack size (bytes).
    Stack,
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
            asked: Vec::new(),
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

/// The staging directory a plan names unless the operator sets another (`CHIO_STAGING_DIR`).
pub const DEFAULT_STAGING_DIR: &str = "/run/chio/cage-root";

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
    /// Extra tmpfs mounts at top-level names.
    #[serde(default)]
    pub tmpfs: Vec<Tmpfs>,
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
    /// Existing ipc and uts namespaces to join instead of making new ones (a CRI pod's
    /// sandbox's), by their nsfs paths: `("ipc" | "uts", path)`. A joined uts namespace keeps
    /// its hostname.
    #[serde(default)]
    pub join: Vec<(String, PathBuf)>,
    /// A syscall profile of the workload's own (an OCI config's), stacked under chio's filter:
    /// it can only narrow what the target may call (see [`crate::profile`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall_profile: Option<crate::profile::SyscallProfile>,
    /// In-cage paths hidden from the target (an OCI config's `maskedPaths`): a file covered
    /// by `/dev/null`, a directory by an empty read-only tmpfs; one the root lacks is skipped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<PathBuf>,
    /// In-cage paths made read-only with every mount below them (`readonlyPaths`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<PathBuf>,
    /// A running detached cage to enter instead of building one (an OCI `exec`): the target
    /// joins its namespaces and cgroup and is confined as its first process was (see
    /// [`Enter`]). Only with `detached`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enter: Option<Enter>,
    /// The target's stdin is a terminal to make its controlling terminal (an OCI container's
    /// console): it leads a session of its own.
    #[serde(default)]
    pub terminal: bool,
    /// The cage's hostname (its own uts namespace); `chio` when none.
    #[serde(default)]
    pub hostname: Option<String>,
    /// The cage outlives the process that built it (an OCI runtime's `create` and `start`):
    /// the target gets the supervisor's own stdin, stdout and stderr (the engine's), the init
    /// does not die with the supervisor and exits with the target's status (128 + signal when
    /// killed), and nothing after the observed exec is the supervisor's: no deadline, no output
    /// cap, no janitor — the engine supervises, and the runtime's `delete` removes the cgroup.
    #[serde(default)]
    pub detached: bool,
    /// Where the launch cgroup is made, when an engine names the place (an OCI config's
    /// `linux.cgroupsPath`): absolute from each hierarchy's root, relative from where chio makes
    /// its own. None: a fresh `chio-…` name under chio's own cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_path: Option<PathBuf>,
    /// The test suites' switches; a build without the `test-hooks` feature has none.
    #[cfg(feature = "test-hooks")]
    #[serde(default)]
    pub test: crate::fault::Switches,
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
            tmpfs: Vec::new(),
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
            staging_dir: PathBuf::from(DEFAULT_STAGING_DIR),
            cgroup_v2_root: None,
            join: Vec::new(),
            syscall_profile: None,
            masked: Vec::new(),
            read_only: Vec::new(),
            enter: None,
            hostname: None,
            terminal: false,
            detached: false,
            cgroup_path: None,
            #[cfg(feature = "test-hooks")]
            test: Default::default(),
            annotations: Default::default(),
        }
    }
}

/// A running cage a second process enters: its init, the cgroup it runs in, and what its first
/// process was granted (from that launch's record). The new process gets the same: the
/// cage's namespaces (its root among them), its cgroup, the landlock grants below, the plan's
/// identity rules, rlimits and seccomp filters, no capability — and its exec is observed and
/// recorded like any launch's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enter {
    /// The cage's init (PID 1 of its pid namespace) as the host sees it.
    pub init: i32,
    /// The init's start time (field 22 of `/proc/<pid>/stat`), which the pid must still name:
    /// a pid reused by another process is never entered.
    pub init_started: u64,
    /// The cage's launch cgroup, one directory per hierarchy.
    pub cgroup: Vec<PathBuf>,
    /// Paths landlock grants read and execute.
    pub read_exec: Vec<String>,
    /// Paths landlock grants read, write and execute.
    pub read_write_exec: Vec<String>,
    /// The cage's mounts as its launch recorded them (for this launch's record).
    #[serde(default)]
    pub mounts: Vec<String>,
    /// Host paths mounted in the cage, as its launch recorded them.
    #[serde(default)]
    pub sources: Vec<crate::record::SourceFact>,
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "test-hooks")]
    use crate::fault::TestHook;

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
