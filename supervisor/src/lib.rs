//! chio-supervisor: turns signed inputs into cage plans and runs them. So far: images — reading
//! `docker save` archives and OCI layouts in place, verifying them, extracting layers safely, and
//! the content-addressed image store behind `chio image` and `chio cage run --image`.

/// True in a build with the `test-hooks` feature (the test suites' build), the only build that
/// acts on `CHIO_TEST_*` variables; any other refuses them.
pub const TEST_HOOKS: bool = cfg!(feature = "test-hooks");

/// The first `CHIO_TEST_*` variable in this process's environment, which a build without test
/// hooks must refuse to start with (a test switch set on a production host is a mistake or an
/// attack, never something to ignore).
pub fn test_switch_refused() -> Option<String> {
    if TEST_HOOKS {
        return None;
    }
    std::env::vars_os()
        .map(|(k, _)| k)
        .find(|k| k.as_encoded_bytes().starts_with(b"CHIO_TEST_"))
        .map(|k| k.to_string_lossy().into_owned())
}

/// The state directory (images, the daemon's journal and receipts) when neither a flag nor
/// `CHIO_STATE_DIR` names one.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/chio";

/// The state directory: `flag`, else `CHIO_STATE_DIR`, else [`DEFAULT_STATE_DIR`].
pub fn state_dir(flag: Option<&std::path::Path>) -> std::path::PathBuf {
    flag.map(std::path::Path::to_path_buf)
        .or_else(|| std::env::var_os("CHIO_STATE_DIR").map(std::path::PathBuf::from))
        .unwrap_or_else(|| std::path::PathBuf::from(DEFAULT_STATE_DIR))
}

pub mod daemon;
mod file_access;
pub mod image;
pub mod launch;
pub mod launch_plan;
pub mod oci;
pub mod preflight;
pub mod receipts;
pub mod report;
pub mod repository;
pub mod service;
pub mod session;
pub mod state_lock;
