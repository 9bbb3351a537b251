//! `LaunchRecord` (`chio.cage.launch-record.v1`): what happened to one launch. Facts the
//! supervisor read itself from `/proc` live under `observed`; facts only the cage's own pre-exec
//! code can know (landlock status has no `/proc` view) live under `reported`.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::plan::{Limits, Mode, NetMode};

/// Device and inode numbers are 64-bit (overlayfs with `xino=on` sets the top bits): in a signed
/// document they are decimal strings, since canonical JSON numbers are exact only to 2^53.
/// Reading also takes a plain number (records written before this rule).
pub mod id64 {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialize as a decimal string.
    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    /// Deserialize from a decimal string or a number.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Text(String),
            Number(u64),
        }
        match Either::deserialize(d)? {
            Either::Number(n) => Ok(n),
            Either::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Schema name of the record.
pub const SCHEMA: &str = "chio.cage.launch-record.v1";

/// Enforcement state of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    /// Every fact was observed at the target's exec.
    FullyEnforced,
    /// Shadow mode: the target ran although some fact did not hold (see `not_confined`).
    NotConfined,
    /// Setup failed; the target never ran.
    BootstrapFailed,
    /// The plan was refused before anything was set up.
    Rejected,
    /// The host lacks a feature enforced mode requires.
    Unsupported,
}

pub use crate::failure::{FailCode, Failure};

/// The executable that was run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Path inside the cage.
    pub path: String,
    /// SHA-256 of the bytes that executed, hashed by the supervisor from the fd that is
    /// executed: before the exec for a file only root can write on a read-only mount (its
    /// identity then held to the exec stop), at the exec stop for any other. For a `#!` script,
    /// of the sealed copy its interpreter reads.
    pub sha256: String,
    /// st_dev of the opened file.
    #[serde(with = "id64")]
    pub device: u64,
    /// st_ino of the opened file.
    #[serde(with = "id64")]
    pub inode: u64,
    /// For a `#!` script: the path the interpreter reads it by, the sealed copy's fd kept open
    /// across exec (`/dev/fd/<n>`), so the bytes hashed are the bytes read; `device` and
    /// `inode` are the script's file as opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_as: Option<String>,
    /// For a `#!` script: the interpreter that is actually executed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<Box<Target>>,
}

/// A namespace as seen by the supervisor: the target's inode and the supervisor's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceFact {
    /// `readlink /proc/<target>/ns/<name>`.
    pub cage: String,
    /// `readlink /proc/self/ns/<name>` of the supervisor.
    pub host: String,
}

/// Facts read by the supervisor from `/proc/<target>` at the exec stop.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// Target pid as the host sees it.
    pub pid: i32,
    /// Device of `/proc/<pid>/exe`.
    #[serde(with = "id64")]
    pub exe_device: u64,
    /// Inode of `/proc/<pid>/exe`.
    #[serde(with = "id64")]
    pub exe_inode: u64,
    /// `NoNewPrivs:` of status.
    pub no_new_privs: u32,
    /// `Seccomp:` of status (2 = filter).
    pub seccomp: u32,
    /// `Seccomp_filters:` of status.
    pub seccomp_filters: u32,
    /// Of those, the filters the supervisor itself runs under (a service manager's, such as
    /// systemd's `SystemCallArchitectures=`), which everything it starts inherits: the target
    /// must have exactly these plus the cage's.
    #[serde(default)]
    pub seccomp_filters_inherited: u32,
    /// CapInh, CapPrm, CapEff, CapBnd, CapAmb as hex strings.
    pub capabilities: BTreeMap<String, String>,
    /// Real, effective, saved, filesystem uid.
    pub uids: Vec<u32>,
    /// Real, effective, saved, filesystem gid.
    pub gids: Vec<u32>,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// Each namespace of the target against the supervisor's.
    pub namespaces: BTreeMap<String, NamespaceFact>,
    /// `/proc/<pid>/cgroup`.
    pub cgroup: String,
    /// Open fds of the target.
    pub fds: Vec<i32>,
    /// Device and inode behind each open fd above 2 (a script's fd).
    #[serde(default)]
    pub fd_files: Vec<FdFile>,
    /// `/proc/<pid>/cwd` (as the cage sees it).
    pub cwd: String,
    /// The cage's status channel reached EOF (no cage process holds a setup fd).
    pub status_channel_eof: bool,
    /// The cage's init, read at the same stop once the channel reached EOF.
    #[serde(default)]
    pub init: InitFacts,
}

/// The cage's init as the supervisor reads it from `/proc/<init>/status` at the target's exec
/// stop. The init lives on beside the target (it forwards signals and reaps), so before the
/// target runs it must hold no more than the target: the target's uid and gid, no
/// capabilities, `no_new_privs`, and its own seccomp filter. An init that ended instead (it
/// gives up when it cannot shed) closes the channel too: its state tells the two apart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitFacts {
    /// The init's pid as the host sees it.
    pub pid: i32,
    /// The first letter of `State:` (`S` waiting; `Z` ended; empty: unreadable).
    pub state: String,
    /// Real, effective, saved, filesystem uid.
    pub uids: Vec<u32>,
    /// Real, effective, saved, filesystem gid.
    pub gids: Vec<u32>,
    /// CapInh, CapPrm, CapEff, CapBnd, CapAmb as hex strings.
    pub capabilities: BTreeMap<String, String>,
    /// `NoNewPrivs:` of status.
    pub no_new_privs: u32,
    /// `Seccomp:` of status (2 = filter).
    pub seccomp: u32,
    /// `Seccomp_filters:` of status.
    pub seccomp_filters: u32,
}

/// Facts reported by the cage's own pre-exec code.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reported {
    /// Landlock ABI version of the host (after any test cap).
    pub landlock_abi: u32,
    /// Filesystem ruleset status.
    pub landlock_fs: String,
    /// TCP ruleset status.
    pub landlock_net: String,
    /// Scoping (abstract unix sockets, signals) status.
    pub landlock_scope: String,
    /// SHA-256 of the seccomp BPF program installed.
    pub seccomp_filter_sha256: String,
    /// What the filter's argument conditions refuse beyond its allow-list, in operator words.
    #[serde(default)]
    pub seccomp_refuses: Vec<String>,
    /// SHA-256 of the workload's own profile, installed over chio's filter (an OCI config's
    /// `linux.seccomp`); absent when the plan brought none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_filter_sha256: Option<String>,
    /// In-cage paths landlock grants read and execute.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub landlock_read_exec: Vec<String>,
    /// In-cage paths landlock grants read, write and execute.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub landlock_read_write_exec: Vec<String>,
    /// Capability sets read back with capget/PR_CAPBSET_READ after dropping: all zero.
    pub capabilities_cleared: bool,
    /// Securebits value after locking.
    pub securebits: u32,
    /// procfs at /proc was verified with fstatfs.
    pub proc_verified: bool,
    /// Loopback was brought up.
    pub loopback_up: bool,
    /// Mounts attached inside the cage (target path → kind).
    pub mounts: Vec<String>,
    /// Every operator-supplied host path that was mounted, with the identity it resolved to
    /// (no symlink followed).
    #[serde(default)]
    pub sources: Vec<SourceFact>,
}

/// An open fd of the target above 2 and the file it is open on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FdFile {
    /// The fd number.
    pub fd: i32,
    /// st_dev of the file.
    #[serde(with = "id64")]
    pub device: u64,
    /// st_ino of the file.
    #[serde(with = "id64")]
    pub inode: u64,
}

/// A host directory or file the cage mounts, as it was resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFact {
    /// Where it appears inside the cage (`/` for the root filesystem).
    pub dest: String,
    /// The host path the operator gave.
    pub source: String,
    /// st_dev of the opened source.
    #[serde(with = "id64")]
    pub device: u64,
    /// st_ino of the opened source.
    #[serde(with = "id64")]
    pub inode: u64,
    /// Mounted writable.
    pub writable: bool,
}

/// cgroup placement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupFacts {
    /// "v1" or "v2".
    pub version: String,
    /// Directories created for this launch.
    pub paths: Vec<String>,
}

/// How the target ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Exit code when the target exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal number when the target was killed by a signal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Wall time from exec to end.
    pub wall_ms: u64,
    /// CPU time of the whole cage (cgroup), or of the target tree (rusage) without a cgroup.
    pub cpu_ms: u64,
    /// Peak memory of the cage.
    pub peak_memory_bytes: u64,
    /// stdout bytes passed through.
    pub stdout_bytes: u64,
    /// stdout bytes dropped after the output limit.
    pub stdout_dropped: u64,
    /// stderr bytes passed through.
    pub stderr_bytes: u64,
    /// stderr bytes dropped after the output limit.
    pub stderr_dropped: u64,
    /// Ceilings that were hit: `wall_time`, `memory`, `pids`, `output`, `cpu`.
    pub limit_hit: Vec<String>,
    /// Processes the command left running when its main process ended, which the cage killed
    /// (before the end was reported: nothing the command started outlives it).
    #[serde(default)]
    pub killed_at_end: u64,
}

/// The record of one launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchRecord {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Enforcement state.
    pub state: State,
    /// Plan mode.
    pub mode: Mode,
    /// Shadow mode: each confinement fact that did not hold.
    pub not_confined: Vec<String>,
    /// Where parts of the plan came from (`image.entrypoint`, `image.cmd`, `image.user`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Why the launch failed, when it did.
    pub failure: Option<Failure>,
    /// argv as given.
    pub argv: Vec<String>,
    /// The executable.
    pub target: Option<Target>,
    /// Facts read from /proc by the supervisor.
    pub observed: Option<Observed>,
    /// Facts reported by the cage.
    pub reported: Option<Reported>,
    /// Namespaces created for the cage.
    pub namespaces: Vec<String>,
    /// Network mode.
    pub net: NetMode,
    /// cgroup placement.
    pub cgroup: Option<CgroupFacts>,
    /// The ceilings that applied.
    pub limits: Limits,
    /// How the target ended.
    pub outcome: Option<Outcome>,
    /// RFC 3339 UTC time the launch started.
    pub started_at: String,
    /// RFC 3339 UTC time the exec stop was observed.
    pub exec_observed_at: Option<String>,
    /// RFC 3339 UTC time the launch ended.
    pub ended_at: Option<String>,
    /// Microseconds from launch start to the end of each phase (resolve, cgroup, cage_ready,
    /// exec_observed, target_ended, cleaned_up): where a launch spends its time.
    pub timings_us: BTreeMap<String, u64>,
    /// Monotonic start of the launch (not serialized).
    #[serde(skip)]
    pub clock: Option<std::time::Instant>,
}

impl LaunchRecord {
    /// Note that `phase` ended now.
    pub fn mark(&mut self, phase: &str) {
        if let Some(t0) = self.clock {
            self.timings_us.insert(phase.to_string(), t0.elapsed().as_micros() as u64);
        }
    }

    /// The exit status the CLI reports for this record: the target's own status, or 125/126/127
    /// for a cage failure / not executable / not found.
    pub fn exit_status(&self) -> i32 {
        if let Some(f) = &self.failure {
            return f.code.exit_status();
        }
        match &self.outcome {
            Some(Outcome { exit_code: Some(c), .. }) => *c,
            Some(Outcome { signal: Some(s), .. }) => 128 + s,
            _ => 125,
        }
    }
}

/// Current time as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, dd) = civil_from_days(days);
    format!("{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, d.subsec_millis())
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
    }
}
