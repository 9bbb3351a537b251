//! The repository execution leg (DESIGN §6): a workspace imported from one commit, every command
//! in a cage over it, each transition checked and signed, and an export a recipient verifies.

pub mod archive;
pub mod execute;
pub mod export;
pub mod git_source;
pub mod patch;
pub mod snapshot;
pub mod status;
pub mod workspace;
