//! The node's word on what containers may ask for: read once per runtime call from
//! `/etc/chio/oci.json` (or the file `--node-config` or `CHIO_OCI_CONFIG` names). A missing file means the strictest node: no
//! binds, no receipts, the default ceilings.

use std::path::{Component, Path, PathBuf};

use chio_cage::Limits;
use serde::Deserialize;

/// Where the node configuration is read from when none is named.
pub const DEFAULT_NODE_CONFIG: &str = "/etc/chio/oci.json";

/// A host directory whose contents containers may have bound in.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindSource {
    /// An absolute host directory; a bind's source must be it or below it.
    pub path: PathBuf,
    /// Whether a bind from here may be writable.
    #[serde(default)]
    pub writable: bool,
}

/// The node configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// The receipt store every container start is signed into (with `kernel_key`).
    #[serde(default)]
    pub receipt_db: Option<PathBuf>,
    /// The kernel's signing seed for those receipts.
    #[serde(default)]
    pub kernel_key: Option<PathBuf>,
    /// Host directories binds may come from.
    #[serde(default)]
    pub bind_sources: Vec<BindSource>,
    /// The most a container may have: a bundle may ask for less, never more, and what it does
    /// not ask for is this.
    #[serde(default = "container_ceilings")]
    pub ceilings: Limits,
    /// Where the cage's root is attached on the host (nothing is written into it).
    #[serde(default = "default_staging")]
    pub staging_dir: PathBuf,
}

/// The ceilings of a node that names none: a container's usual share of a small node.
fn container_ceilings() -> Limits {
    Limits {
        memory_bytes: Some(1 << 30),
        pids: Some(1024),
        cpu_millis: Some(2000),
        nofile: 1 << 20,
        // 1 PiB: no file-size limit in practice, and a number a signed record holds exactly.
        fsize_bytes: 1 << 50,
        tmp_bytes: 64 << 20,
        shm_bytes: 64 << 20,
        ..Limits::default()
    }
}

fn default_staging() -> PathBuf {
    PathBuf::from(chio_cage::plan::DEFAULT_STAGING_DIR)
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            receipt_db: None,
            kernel_key: None,
            bind_sources: Vec::new(),
            ceilings: container_ceilings(),
            staging_dir: default_staging(),
        }
    }
}

impl NodeConfig {
    /// The node configuration at `named` (`--node-config`, or `CHIO_OCI_CONFIG`), else at
    /// [`DEFAULT_NODE_CONFIG`] when that exists, else the strictest default. A file that exists
    /// but does not parse is an error, and so is a named file that does not exist.
    pub fn load(named: Option<&Path>) -> Result<NodeConfig, String> {
        let path = named.unwrap_or(Path::new(DEFAULT_NODE_CONFIG));
        match std::fs::read(path) {
            Ok(bytes) => Self::parse(&bytes, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && named.is_none() => Ok(NodeConfig::default()),
            Err(e) => Err(format!("reading the node configuration {}: {e}", path.display())),
        }
    }

    fn parse(bytes: &[u8], path: &Path) -> Result<NodeConfig, String> {
        let c: NodeConfig = serde_json::from_slice(bytes)
            .map_err(|e| format!("the node configuration {} does not parse: {e}", path.display()))?;
        if c.receipt_db.is_some() != c.kernel_key.is_some() {
            return Err(format!(
                "the node configuration {} names {} without {}: receipts need both the store and the key",
                path.display(),
                if c.receipt_db.is_some() { "receipt_db" } else { "kernel_key" },
                if c.receipt_db.is_some() { "kernel_key" } else { "receipt_db" },
            ));
        }
        if let Some(b) = c.bind_sources.iter().find(|b| !b.path.is_absolute()) {
            return Err(format!("the node configuration's bind source {} is not absolute", b.path.display()));
        }
        Ok(c)
    }

    /// The allowed source `source` falls under, if any, compared by path components. The
    /// source must be absolute without `.` or `..`; the cage then opens it without following
    /// any symlink, so what the comparison saw is what is bound.
    pub fn bind_source(&self, source: &Path) -> Option<&BindSource> {
        let plain =
            source.is_absolute() && source.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        plain.then(|| self.bind_sources.iter().find(|b| source.starts_with(&b.path)))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_without_a_key_is_refused() {
        let e = NodeConfig::parse(br#"{"receipt_db": "/x.db"}"#, Path::new("/c.json")).unwrap_err();
        assert!(e.contains("receipt_db without kernel_key"), "{e}");
        let e = NodeConfig::parse(br#"{"bind_srcs": []}"#, Path::new("/c.json")).unwrap_err();
        assert!(e.contains("does not parse"), "{e}");
        let c = NodeConfig::parse(br#"{"bind_sources": [{"path": "/tmp"}]}"#, Path::new("/c.json")).unwrap();
        assert!(c.bind_source(Path::new("/tmp/x")).is_some_and(|b| !b.writable));
        assert!(c.bind_source(Path::new("/tmp/../etc")).is_none());
        assert!(c.bind_source(Path::new("/tmpx")).is_none());
        assert!(c.bind_source(Path::new("/etc")).is_none());
    }
}
