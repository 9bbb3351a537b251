//! The test build's fault points, in one place. A suite names a fault on the plan (a hook that
//! makes one exec-stop fact false through a real unmet condition, a stage made to fail, a
//! landlock ABI cap); the launch asks this module at each point where one could act. Without
//! the `test-hooks` feature a plan carries no switches, a hook cannot be parsed, and every
//! question here has its constant answer: the product's straight line is all that is compiled.
//! Each fault can only make a launch fail or claim less host support, never weaken a cage.

use std::path::PathBuf;

#[cfg(feature = "test-hooks")]
use serde::{Deserialize, Serialize};

use crate::failure::{FailCode, Failure};
use crate::plan::{CagePlan, Stage};

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
    /// The init keeps the supervisor's network namespace yet goes on to write the cage's network
    /// sysctls (as a reordering of its setup might): it must refuse to write them there.
    NetnsKept,
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
            TestHook::NetnsKept => "netns_kept".into(),
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
            "netns_kept" => TestHook::NetnsKept,
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
pub struct Switches {
    /// Fail this stage on purpose.
    pub fail_stage: Option<Stage>,
    /// Pretend the host's landlock ABI is at most this.
    pub landlock_abi_cap: Option<u32>,
    /// Make one exec-stop fact false, or one step misbehave.
    #[serde(with = "hook_text")]
    pub hook: Option<TestHook>,
}

/// The hook `plan` names (never in a build without test hooks).
pub fn hook(plan: &CagePlan) -> Option<&TestHook> {
    #[cfg(feature = "test-hooks")]
    return plan.test.hook.as_ref();
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = plan;
        None
    }
}

/// True when `plan` names `which` (never in a build without test hooks).
pub fn on(plan: &CagePlan, which: &TestHook) -> bool {
    hook(plan) == Some(which)
}

/// True when `plan` asks `stage` to fail on purpose (never in a build without test hooks).
pub fn fails(plan: &CagePlan, stage: Stage) -> bool {
    #[cfg(feature = "test-hooks")]
    return plan.test.fail_stage == Some(stage);
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = (plan, stage);
        false
    }
}

/// The failure `plan` asks of `stage`, if it asks one.
pub fn fail_at(plan: &CagePlan, stage: Stage) -> Result<(), Failure> {
    if fails(plan, stage) {
        return Err(
            FailCode::InjectedFailure.at(stage, format!("test-only failure injected at stage {}", stage.name()))
        );
    }
    Ok(())
}

/// The landlock ABI a launch builds for: the host's, or less under a suite's cap.
pub fn landlock_abi(plan: &CagePlan, host: u32) -> u32 {
    #[cfg(feature = "test-hooks")]
    return plan.test.landlock_abi_cap.map_or(host, |cap| host.min(cap));
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = plan;
        host
    }
}
