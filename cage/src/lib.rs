//! chio-cage: the Linux mechanics of the chio native cage. A fully resolved [`CagePlan`] in; a
//! [`LaunchRecord`] out, after the target ran inside namespaces, a read-only root, landlock,
//! seccomp, dropped capabilities and cgroup ceilings — each observed at the target's exec.
//!
//! [`launch`] forks, so it must be called from a single-threaded process (it checks).

pub mod ahead;
pub mod cgroup;
pub mod channel;
mod child_stops;
pub mod digests;
pub mod failure;
pub mod fault;
pub mod identity;
mod inside;
mod janitor;
pub mod landlock;
mod launch;
pub mod mounts;
pub mod observe;
pub mod path;
pub mod plan;
mod prehash;
pub mod profile;
pub mod record;
pub mod relay;
pub mod sealed;
pub mod seccomp;
pub mod supervise;
pub mod sys;

pub use ahead::Ahead;
pub use fault::TestHook;
pub use launch::{launch, launch_to_end, missing_supervisor_capabilities, Teardown, NAMESPACES};
pub use mounts::RootKey;
pub use plan::{AskedRlimit, Bind, CagePlan, Enter, Limits, Mode, NetMode, RlimitResource, RootSpec, Stage, Tmpfs};
pub use profile::{ArgCheck, CmpOp, SyscallProfile, SyscallRule, Verdict};
pub use record::{LaunchRecord, State};
pub use supervise::{Gate, Park, Parked, Sinks};
