//! `chio image import | list | inspect | verify | rm`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use chio_supervisor::image::extract::Budgets;
use chio_supervisor::image::import::Selection;
use chio_supervisor::image::store::{ImageRecord, ImageStore};
use clap::Subcommand;

use crate::progress::ImportProgress;

/// `chio image …`
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Import a docker save archive, an oci-archive or an OCI layout directory.
    #[command(after_help = "Example:\n  chio image import app.tar --name app:1")]
    Import {
        /// The archive or layout directory.
        path: PathBuf,
        /// Which image, when the archive holds several (a tag such as app:1).
        #[arg(long = "ref")]
        reference: Option<String>,
        /// os/arch[/variant] (default: the host's).
        #[arg(long)]
        platform: Option<String>,
        /// An extra name to refer to the image by.
        #[arg(long)]
        name: Option<String>,
        /// Print the image record as JSON.
        #[arg(long)]
        json: bool,
        /// State directory (default $CHIO_STATE_DIR or /var/lib/chio).
        #[arg(long = "state-dir")]
        state_dir: Option<PathBuf>,
        /// Most entries across all layers.
        #[arg(long = "max-entries", default_value_t = Budgets::default().max_entries)]
        max_entries: u64,
        /// Most bytes of file content across all layers (e.g. 64G).
        #[arg(long = "max-bytes", default_value = "64G", allow_hyphen_values = true, value_parser = crate::units::arg::size)]
        max_bytes: String,
        /// Create FIFOs found in layers (skipped by default).
        #[arg(long = "allow-fifos")]
        allow_fifos: bool,
    },
    /// List imported images.
    #[command(after_help = "Example:\n  chio image list")]
    List {
        /// State directory.
        #[arg(long = "state-dir")]
        state_dir: Option<PathBuf>,
    },
    /// Print an image's record (JSON).
    #[command(after_help = "Example:\n  chio image inspect app:1")]
    Inspect {
        /// Reference, image ID or ID prefix (12+ hex digits).
        image: String,
        /// State directory.
        #[arg(long = "state-dir")]
        state_dir: Option<PathBuf>,
    },
    /// Check an image's extracted tree against the digest recorded at import.
    #[command(after_help = "Example:\n  chio image verify app:1")]
    Verify {
        /// Reference, image ID or ID prefix.
        image: String,
        /// State directory.
        #[arg(long = "state-dir")]
        state_dir: Option<PathBuf>,
    },
    /// Remove an image (and its root filesystem when no other image uses it).
    #[command(after_help = "Example:\n  chio image rm app:1")]
    Rm {
        /// Reference, image ID or ID prefix.
        image: String,
        /// State directory.
        #[arg(long = "state-dir")]
        state_dir: Option<PathBuf>,
    },
}

/// The state directory from the flag, `CHIO_STATE_DIR`, or the default.
pub fn state_dir(flag: &Option<PathBuf>) -> PathBuf {
    chio_supervisor::state_dir(flag.as_deref())
}

fn open(flag: &Option<PathBuf>) -> Result<ImageStore> {
    let dir = state_dir(flag);
    ImageStore::open(&dir).map_err(|e| denied_hint(e, &dir)).with_context(|| format!("image store {}", dir.display()))
}

/// A permission error on the store says who may use it.
fn denied_hint(e: std::io::Error, dir: &Path) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        return anyhow::anyhow!(
            "{e}: the image store {} belongs to root (run chio as root, or give --state-dir a directory of yours)",
            dir.display()
        );
    }
    e.into()
}

/// The store for a command that only reads it: nothing is created (a missing store has no
/// image).
fn open_read(flag: &Option<PathBuf>) -> Result<ImageStore> {
    let dir = state_dir(flag);
    ImageStore::open_existing(&dir).with_context(|| format!("image store {}", dir.display()))
}

/// Find an image in the store at `flag` (creating nothing).
pub fn find(flag: &Option<PathBuf>, image: &str) -> Result<(ImageStore, ImageRecord)> {
    let store = open_read(flag)?;
    let rec = store.find(image)?;
    Ok((store, rec))
}

/// Run an image subcommand.
pub fn run(cmd: &ImageCommand) -> Result<i32> {
    match cmd {
        ImageCommand::Import {
            path,
            reference,
            platform,
            name,
            json,
            state_dir,
            max_entries,
            max_bytes,
            allow_fifos,
        } => {
            let budgets = Budgets {
                max_entries: *max_entries,
                max_bytes: crate::units::parse_size(max_bytes).map_err(anyhow::Error::msg).context("--max-bytes")?,
                allow_fifos: *allow_fifos,
                ..Budgets::default()
            };
            import(path, reference, platform, name.as_deref(), *json, state_dir, &budgets)
        }
        ImageCommand::List { state_dir } => {
            for r in open_read(state_dir)?.list()? {
                let id = r.image_id.trim_start_matches("sha256:");
                println!("{}  {:<12} {}", &id[..12.min(id.len())], r.platform, r.references.join(", "));
            }
            Ok(0)
        }
        ImageCommand::Inspect { image, state_dir } => {
            let (store, rec) = find(state_dir, image)?;
            let mut v = serde_json::to_value(&rec)?;
            v["rootfs"] = serde_json::json!(store.rootfs(&rec));
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(0)
        }
        ImageCommand::Verify { image, state_dir } => {
            let (store, rec) = find(state_dir, image)?;
            if store.verify(&rec)? {
                println!("ok: {} unchanged since import ({})", rec.image_id, rec.tree_sha256);
                Ok(0)
            } else {
                eprintln!(
                    "chio: {} has been modified since import: its tree no longer matches {}",
                    rec.image_id, rec.tree_sha256
                );
                Ok(1)
            }
        }
        ImageCommand::Rm { image, state_dir } => {
            let (store, rec) = find(state_dir, image)?;
            let collected = store.remove(&rec)?;
            println!("removed {}{}", rec.image_id, if collected { " and its root filesystem" } else { "" });
            Ok(0)
        }
    }
}

fn import(
    path: &Path,
    reference: &Option<String>,
    platform: &Option<String>,
    name: Option<&str>,
    json: bool,
    state: &Option<PathBuf>,
    budgets: &Budgets,
) -> Result<i32> {
    if !path.exists() {
        bail!("{} does not exist", path.display());
    }
    let sel =
        Selection { reference: reference.clone(), platform: platform.clone().unwrap_or_else(Selection::host_platform) };
    let parts: Vec<&str> = sel.platform.split('/').collect();
    let word = |w: &&str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !(2..=3).contains(&parts.len()) || !parts.iter().all(word) {
        bail!("--platform {:?} is not OS/ARCH[/VARIANT] (e.g. linux/amd64, linux/arm64/v8)", sel.platform);
    }
    let store = open(state)?;
    let mut shown = ImportProgress::new(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let result = store.import(path, &sel, name, budgets, &mut |p| shown.event(p));
    shown.clear();
    let rec = result.with_context(|| format!("importing {}", path.display()))?;
    if !rec.setuid.is_empty() {
        eprintln!("chio: note: {} setuid/setgid file(s) kept (the cage mounts the root nosuid)", rec.setuid.len());
    }
    if !rec.skipped.is_empty() {
        eprintln!("chio: note: {} device node(s)/FIFO(s) not created", rec.skipped.len());
    }
    if json {
        println!("{}", serde_json::to_string(&rec)?);
    } else {
        println!("{}", rec.image_id);
    }
    Ok(0)
}
