//! The daemon's errors: what failed and the context it failed in, in words an operator acts on
//! (`listening on /run/chio/supervisor.sock: Permission denied`).

use std::fmt::Display;

/// A daemon error: its words, outermost context first.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DaemonError(String);

impl DaemonError {
    /// An error of these words.
    pub fn msg(words: impl Into<String>) -> DaemonError {
        DaemonError(words.into())
    }
}

/// The daemon's results.
pub type Result<T, E = DaemonError> = std::result::Result<T, E>;

macro_rules! from {
    ($($t:ty),*) => {$(
        impl From<$t> for DaemonError {
            fn from(e: $t) -> DaemonError {
                DaemonError(e.to_string())
            }
        }
    )*};
}
from!(std::io::Error, nix::Error, serde_json::Error, chio_kernel::store::StoreError, crate::launch::LaunchError);

/// Context for a failure: `what` failed, and why.
pub trait Context<T> {
    /// Say what failed.
    fn context(self, what: &str) -> Result<T>;
    /// Say what failed, worded when it did.
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: &str) -> Result<T> {
        self.map_err(|e| DaemonError(format!("{what}: {e}")))
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| DaemonError(format!("{}: {e}", what())))
    }
}

/// Return a [`DaemonError`] of these words.
macro_rules! bail {
    ($($words:tt)*) => {
        return Err($crate::daemon::DaemonError::msg(format!($($words)*)))
    };
}
