//! The repository execution leg (DESIGN §6): a workspace imported from one commit, every command
//! in a cage over it, each transition checked and signed, and an export a recipient verifies.

pub mod archive;
pub(crate) mod bounded;
pub mod claims;
pub mod execute;
pub mod export;
pub mod file_tools;
pub mod git_source;
pub mod patch;
pub mod recover;
pub mod snapshot;
pub mod status;
pub mod workspace;

/// Test-only crash point: with the `test-hooks` feature and `CHIO_TEST_CRASH=<point>`, the
/// process kills itself here with SIGKILL (what a crash or an OOM kill looks like from outside).
pub(crate) fn crash_point(point: &str) {
    if cfg!(feature = "test-hooks") && std::env::var("CHIO_TEST_CRASH").is_ok_and(|v| v == point) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
pub mod mcp;
pub mod operation;
