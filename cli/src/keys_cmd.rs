//! `chio keys generate` and `chio keys show`.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use chio_kernel::keys;
use clap::Subcommand;

/// File names inside a key directory.
pub const SEED_FILE: &str = "signing.seed";
/// The public key file.
pub const PUBLIC_FILE: &str = "public.key";

/// `chio keys …`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create DIR/signing.seed (mode 0600) and DIR/public.key; never overwrites.
    #[command(after_help = "Example:\n  chio keys generate --out /etc/chio/kernel-key")]
    Generate {
        /// Directory to write into (created 0700 if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Print the public key of a seed file (`*.seed`), or check and print a public key file.
    #[command(after_help = "Example:\n  chio keys show /etc/chio/kernel-key/public.key")]
    Show {
        /// A `*.seed` file, or a public key file.
        file: PathBuf,
    },
}

/// Run a keys subcommand.
pub fn run(cmd: &KeysCommand) -> Result<i32> {
    match cmd {
        KeysCommand::Generate { out } => generate(out),
        KeysCommand::Show { file } => show(file),
    }
}

fn generate(dir: &Path) -> Result<i32> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let seed_path = dir.join(SEED_FILE);
    let public_path = dir.join(PUBLIC_FILE);
    if public_path.exists() {
        bail!("{} already exists; refusing to overwrite a key", public_path.display());
    }
    let key = keys::generate()?;
    keys::write_seed(&seed_path, &key)?;
    let public = keys::hex(key.verifying_key().as_bytes());
    std::fs::write(&public_path, format!("{public}\n"))
        .with_context(|| format!("writing {}", public_path.display()))?;
    println!("{public}");
    eprintln!("chio: wrote {} (secret, 0600) and {}", seed_path.display(), public_path.display());
    Ok(0)
}

fn show(file: &Path) -> Result<i32> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    // Told apart by what the file is, never guessed from its mode or from the key failing as a
    // public key: a seed carries the seed header (or, from before it, a `.seed` name).
    let is_seed = text.starts_with(keys::SEED_HEADER) || file.extension().is_some_and(|e| e == "seed");
    if is_seed {
        let key = keys::read_seed(file)?;
        println!("{}", keys::hex(key.verifying_key().as_bytes()));
    } else {
        let key = keys::public_key(text.trim()).with_context(|| format!("{}", file.display()))?;
        println!("{}", keys::hex(key.as_bytes()));
    }
    Ok(0)
}
