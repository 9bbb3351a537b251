//! Why a launch did not run its target: one vocabulary for the supervisor's side and the cage's
//! init alike. A [`FailCode`] carries the launch's state, its exit status and the words an
//! operator reads; a [`Failure`] is a code met at a stage, with the detail of that one case.
//! The codes are the record's `failure.code` strings, stable across releases: a code is added,
//! never renamed.

use serde::{Deserialize, Serialize};

use crate::plan::Stage;
use crate::record::State;

/// Declares [`FailCode`] with its list of every code, so that what each code means is written
/// once, beside its name.
macro_rules! fail_codes {
    ($($variant:ident = $name:literal, $state:ident, $words:literal;)+) => {
        /// A launch's failure, as the record's `failure.code` names it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum FailCode {
            $(
                #[doc = $words]
                #[serde(rename = $name)]
                $variant,
            )+
        }

        impl FailCode {
            /// Every code, in the order the docs' table lists them.
            pub const ALL: &'static [FailCode] = &[$(FailCode::$variant),+];

            /// The record's name of the code.
            pub fn name(self) -> &'static str {
                match self { $(FailCode::$variant => $name,)+ }
            }

            /// What the code means, in an operator's words.
            pub fn words(self) -> &'static str {
                match self { $(FailCode::$variant => $words,)+ }
            }

            /// The launch's state when it failed so.
            pub fn state(self) -> State {
                match self { $(FailCode::$variant => State::$state,)+ }
            }
        }
    };
}

fail_codes! {
    // The plan, refused before anything was set up.
    EmptyCommand = "empty_command", Rejected, "no command to run";
    BadCommand = "bad_command", Rejected, "a command argument contains a NUL byte";
    BadEnvironment = "bad_environment", Rejected, "an environment variable's name is empty or holds '=' or NUL, or its value holds NUL";
    BadHostname = "bad_hostname", Rejected, "the hostname is empty or over 64 bytes, or holds NUL, '/' or white space";
    BadCwd = "bad_cwd", Rejected, "the working directory is not an absolute path in the kernel's form";
    BadLimit = "bad_limit", Rejected, "a ceiling is below its floor";
    BadIdentity = "bad_identity", Rejected, "uid or gid 4294967295, which the kernel reads as unchanged";
    BadDigest = "bad_digest", Rejected, "the expected digest is not 64 lowercase hex digits";
    SupervisorCapabilities = "supervisor_capabilities", Rejected, "chio lacks a capability the launch needs";
    MultithreadedSupervisor = "multithreaded_supervisor", Rejected, "the launch was called from a process with more than one thread";
    // The host lacks what enforced mode needs.
    LandlockUnsupported = "landlock_unsupported", Unsupported, "the host's landlock is absent or older than ABI 4";
    CgroupControllerMissing = "cgroup_controller_missing", Unsupported, "a cgroup controller a ceiling needs is not available";
    // The target itself.
    TargetNotFound = "target_not_found", BootstrapFailed, "the command was not found in the cage";
    TargetNotExecutable = "target_not_executable", BootstrapFailed, "the command exists in the cage but cannot be executed";
    DigestMismatch = "digest_mismatch", BootstrapFailed, "the command's bytes are not the expected digest";
    TargetOnRemoteFs = "target_on_remote_fs", BootstrapFailed, "the command is on a FUSE or network file system, whose server could serve other bytes than were hashed";
    ScriptTooLarge = "script_too_large", BootstrapFailed, "a #! script is larger than a script may be";
    ScriptNotSealed = "script_not_sealed", BootstrapFailed, "the copy of a #! script its interpreter reads is not sealed against writes";
    // A fact did not hold at the exec stop.
    FactMismatch = "fact_mismatch", BootstrapFailed, "a fact read at the exec stop is not what the plan set up";
    CapabilitiesRemain = "capabilities_remain", BootstrapFailed, "the command would start holding a capability";
    SecurebitsUnset = "securebits_unset", BootstrapFailed, "the securebits that keep capabilities from coming back are not locked";
    EvidenceNotRecorded = "evidence_not_recorded", BootstrapFailed, "the launch's evidence could not be recorded before the command ran";
    // A setup step failed.
    StagingUnavailable = "staging_unavailable", BootstrapFailed, "the staging directory cannot be used";
    PathNotFound = "path_not_found", BootstrapFailed, "a host path of the plan does not exist";
    PathRefused = "path_refused", BootstrapFailed, "a host path of the plan is refused (a link, or not the kind of file it must be)";
    ResolveFailed = "resolve_failed", BootstrapFailed, "a host path of the plan could not be opened";
    CgroupFailed = "cgroup_failed", BootstrapFailed, "the launch cgroup could not be made, joined or given its ceilings";
    NamespaceFailed = "namespace_failed", BootstrapFailed, "a namespace could not be created or entered";
    ChannelFailed = "channel_failed", BootstrapFailed, "the cage and the supervisor could not talk as the launch requires";
    SetupFailed = "setup_failed", BootstrapFailed, "the cage's init could not be started or held";
    SetupTimeout = "setup_timeout", BootstrapFailed, "the cage did not reach its next step in time";
    CageDied = "cage_died", BootstrapFailed, "the cage's init ended before the command ran";
    ArgvHideFailed = "argv_hide_failed", BootstrapFailed, "the init could not clear its own command line";
    ForkFailed = "fork_failed", BootstrapFailed, "the init could not start the command's process";
    MountFailed = "mount_failed", BootstrapFailed, "the cage's file system could not be mounted";
    PivotFailed = "pivot_failed", BootstrapFailed, "the cage could not pivot into its root";
    HostnameFailed = "hostname_failed", BootstrapFailed, "the cage's hostname could not be set";
    LoopbackFailed = "loopback_failed", BootstrapFailed, "the cage's loopback could not be brought up";
    FdSetupFailed = "fd_setup_failed", BootstrapFailed, "the command's file descriptors could not be set up";
    PersonalityFailed = "personality_failed", BootstrapFailed, "the command's personality could not be set";
    RlimitFailed = "rlimit_failed", BootstrapFailed, "a resource limit could not be set";
    IdentityFailed = "identity_failed", BootstrapFailed, "the command's uid, gid or groups could not be set";
    CapabilityDropFailed = "capability_drop_failed", BootstrapFailed, "a capability set could not be emptied";
    NoNewPrivsFailed = "no_new_privs_failed", BootstrapFailed, "no_new_privs could not be set";
    LandlockFailed = "landlock_failed", BootstrapFailed, "the landlock ruleset could not be built or applied";
    SeccompFailed = "seccomp_failed", BootstrapFailed, "the seccomp filter could not be built or installed";
    CwdUnavailable = "cwd_unavailable", BootstrapFailed, "the working directory cannot be entered in the cage";
    ScriptCopyFailed = "script_copy_failed", BootstrapFailed, "a #! script could not be copied to its sealed memfd";
    ScriptFdFailed = "script_fd_failed", BootstrapFailed, "a #! script's fd could not be kept for its interpreter";
    HashFailed = "hash_failed", BootstrapFailed, "the command's bytes could not be hashed";
    PtraceFailed = "ptrace_failed", BootstrapFailed, "the command could not be held under ptrace to its exec";
    ExecFailed = "exec_failed", BootstrapFailed, "the exec of the verified command failed";
    Withdrawn = "withdrawn", BootstrapFailed, "the launch was withdrawn before the command ran";
    InjectedFailure = "injected_failure", BootstrapFailed, "a test build's failure made on purpose";
}

impl FailCode {
    /// The exit status of a launch that failed with this code, as `chio cage run` (and the
    /// cage's init, for the same failure) reports it: 127 the target was not found in the cage,
    /// 126 it cannot be executed, 125 any other cage failure.
    pub fn exit_status(self) -> i32 {
        match self {
            FailCode::TargetNotFound => 127,
            FailCode::TargetNotExecutable => 126,
            _ => 125,
        }
    }

    /// This code met at `stage`, with `detail` saying what happened.
    pub fn at(self, stage: Stage, detail: impl std::fmt::Display) -> Failure {
        Failure { code: self, stage, detail: detail.to_string() }
    }
}

impl std::fmt::Display for FailCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a launch failed: the record's `failure`, the cage's report of its own failure, and the
/// supervisor's refusal are all this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Stable machine-readable code.
    pub code: FailCode,
    /// The stage that failed.
    pub stage: Stage,
    /// Operator-readable explanation of this case.
    pub detail: String,
}

impl Failure {
    /// The launch's state when it failed so.
    pub fn state(&self) -> State {
        self.code.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_its_record_name_and_back() {
        let mut names = std::collections::BTreeSet::new();
        for code in FailCode::ALL {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.name()));
            assert_eq!(serde_json::from_str::<FailCode>(&json).unwrap(), *code);
            assert!(names.insert(code.name()), "{} twice", code.name());
        }
        assert!(serde_json::from_str::<FailCode>("\"no_such_code\"").is_err());
    }

    #[test]
    fn the_state_follows_from_the_code() {
        assert_eq!(FailCode::BadLimit.state(), State::Rejected);
        assert_eq!(FailCode::LandlockUnsupported.state(), State::Unsupported);
        assert_eq!(FailCode::CgroupControllerMissing.state(), State::Unsupported);
        assert_eq!(FailCode::DigestMismatch.state(), State::BootstrapFailed);
        assert_eq!(FailCode::TargetNotFound.exit_status(), 127);
        assert_eq!(FailCode::TargetNotExecutable.exit_status(), 126);
        assert_eq!(FailCode::CageDied.exit_status(), 125);
    }

    /// The cage-run guide's table of failure codes is this list: a code added here without a
    /// row there (or a row whose exit status or state is not the code's) fails.
    #[test]
    fn the_guide_lists_every_code_as_it_is() {
        let guide = include_str!("../../docs/cage-run.md");
        let rows: Vec<&str> = guide.lines().filter(|l| l.starts_with("| `")).collect();
        for code in FailCode::ALL {
            let row = format!("| `{}` | {} | {:?} |", code.name(), code.exit_status(), code.state());
            assert!(rows.iter().any(|r| r.starts_with(&row)), "docs/cage-run.md has no row starting {row}");
        }
        let listed =
            rows.iter().filter(|r| FailCode::ALL.iter().any(|c| r.starts_with(&format!("| `{}` |", c.name()))));
        assert_eq!(listed.count(), FailCode::ALL.len(), "a code listed twice in docs/cage-run.md");
    }
}
