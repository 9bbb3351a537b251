//! `chio repository`: the repository execution leg (init, execute, status, export,
//! verify-export). The engine and the operation's output are `chio_supervisor::repository`'s
//! (`operation`); this is flags. Exit codes: 0 ok (execute: the command's status), 1 failure, 2
//! bad input, 3 refused by a check, 4 operation-key conflict, 5 evidence that does not verify.

use std::path::PathBuf;

use anyhow::Result;
use chio_supervisor::repository::operation::{self, Operation};
use clap::Subcommand;

pub use chio_supervisor::repository::operation::{print_json, require_root};

/// `chio repository` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum RepositoryCommand {
    /// Create a workspace from the committed tree of literal paths at one revision.
    #[command(
        after_help = "Example:\n  chio repository init --state ./ws --repository ./calc --revision main \\\n      --source-path package --kernel-key kernel.seed"
    )]
    Init {
        /// The workspace's state directory (created; must be missing or empty).
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// The source repository (a checkout or a bare repository); only read.
        #[arg(long, value_name = "PATH")]
        repository: PathBuf,
        /// A branch, tag or commit id.
        #[arg(long, value_name = "REV")]
        revision: String,
        /// A literal path of the commit to import (repeat for more, 1 to 64, none inside another).
        #[arg(long = "source-path", value_name = "P", required = true)]
        source_path: Vec<String>,
        /// A path inside a source path that commands may fill but that is never part of a
        /// snapshot or the patch (build output: `pkg/target`, `pkg/__pycache__`; up to 16).
        #[arg(long = "scratch-path", value_name = "P")]
        scratch_path: Vec<String>,
        /// An imported image to run commands on (default: the host's /usr, /bin, /lib*, read-only).
        #[arg(long, value_name = "REF|ID")]
        image: Option<String>,
        /// The image store (default $CHIO_STATE_DIR or /var/lib/chio).
        #[arg(long = "image-store", value_name = "DIR")]
        image_store: Option<PathBuf>,
        /// The kernel's signing seed (signs every receipt of the workspace). Required, except
        /// through `--supervisor`, whose own key signs when none is given.
        #[arg(long = "kernel-key", value_name = "SEED")]
        kernel_key: Option<PathBuf>,
        /// Server id recorded in the configuration and the receipts.
        #[arg(long = "server-id", value_name = "ID")]
        server_id: Option<String>,
        /// Print the workspace status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run one command (`bash -c`) in a cage over the workspace and commit the checked change.
    #[command(
        after_help = "Example:\n  chio repository execute --state ./ws --operation-key step-1 --deadline 60 -- python3 -m unittest"
    )]
    Execute {
        /// The workspace's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// Idempotency key: the same key and command return the first result without running again.
        #[arg(long = "operation-key", value_name = "KEY")]
        operation_key: String,
        /// Wall-clock deadline in seconds (1 to 300).
        #[arg(long, value_name = "SECONDS", default_value_t = 300)]
        deadline: u64,
        /// Print the whole result as JSON on stdout instead of the output.
        #[arg(long)]
        json: bool,
        /// The command, run by `/bin/bash --noprofile --norc -c` (several words are joined by spaces).
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Workspace state, snapshots and operations.
    Status {
        /// The workspace's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Serve the leg over MCP (JSON-RPC 2.0 on stdio): `execute`, and with --read-prefix the
    /// file tools `read_file` and `list_dir`.
    Serve {
        /// The workspace's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// A path the file tools may read under (repeat; e.g. package/src). None: no file tools.
        #[arg(long = "read-prefix", value_name = "PATH")]
        read_prefix: Vec<String>,
    },
    /// After a crash: remove leftovers, restore the last committed snapshot, settle the journal.
    Recover {
        /// The workspace's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
    },
    /// Write the patch, the receipts and the archives a recipient verifies.
    Export {
        /// The workspace's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// The bundle directory to create (must not exist).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Verify an exported bundle against a checkout, scope and key chosen by the recipient.
    #[command(name = "verify-export")]
    VerifyExport {
        /// The bundle directory.
        #[arg(long, value_name = "DIR")]
        bundle: PathBuf,
        /// The recipient's own checkout of the source repository.
        #[arg(long, value_name = "CHECKOUT")]
        repository: PathBuf,
        /// The revision the recipient expects the baseline from.
        #[arg(long, value_name = "REV")]
        revision: String,
        /// The scope the recipient expects (repeat).
        #[arg(long = "source-path", value_name = "P", required = true)]
        source_path: Vec<String>,
        /// The kernel public key the receipts must be signed by (64 hex digits or a file).
        #[arg(long = "kernel-key", value_name = "PUBKEY")]
        kernel_key: String,
        /// The server id the workspace must name.
        #[arg(long = "server-id", value_name = "ID")]
        server_id: Option<String>,
        /// Print the claims document (chio.claims.v1): each check as a claim with its evidence,
        /// and the bundle tried under a fresh key and with its patch edited (both must be refused).
        #[arg(long)]
        json: bool,
    },
}

impl RepositoryCommand {
    /// The operation as a value: what runs, and what a daemon client sends.
    pub fn operation(&self) -> Operation {
        use RepositoryCommand as R;
        match self {
            R::Init {
                state,
                repository,
                revision,
                source_path,
                scratch_path,
                image,
                image_store,
                kernel_key,
                server_id,
                json,
            } => Operation::Init {
                state: state.clone(),
                repository: repository.clone(),
                revision: revision.clone(),
                source_path: source_path.clone(),
                scratch_path: scratch_path.clone(),
                image: image.clone(),
                image_store: image_store.clone(),
                kernel_key: kernel_key.clone(),
                server_id: server_id.clone(),
                json: *json,
            },
            R::Execute { state, operation_key, deadline, json, command } => Operation::Execute {
                state: state.clone(),
                operation_key: operation_key.clone(),
                deadline: *deadline,
                json: *json,
                command: command.clone(),
            },
            R::Status { state, json } => Operation::Status { state: state.clone(), json: *json },
            R::Serve { state, read_prefix } => {
                Operation::Serve { state: state.clone(), read_prefix: read_prefix.clone() }
            }
            R::Recover { state } => Operation::Recover { state: state.clone() },
            R::Export { state, out } => Operation::Export { state: state.clone(), out: out.clone() },
            R::VerifyExport { bundle, repository, revision, source_path, kernel_key, server_id, json } => {
                Operation::VerifyExport {
                    bundle: bundle.clone(),
                    repository: repository.clone(),
                    revision: revision.clone(),
                    source_path: source_path.clone(),
                    kernel_key: kernel_key.clone(),
                    server_id: server_id.clone(),
                    json: *json,
                }
            }
        }
    }
}

/// The parser of `chio repository`'s subcommands alone (the daemon's launch child parses a
/// client's arguments with it).
pub fn parse_args(args: &[std::ffi::OsString]) -> std::result::Result<RepositoryCommand, clap::Error> {
    use clap::{FromArgMatches, Subcommand};
    let cmd = RepositoryCommand::augment_subcommands(clap::Command::new("repository").bin_name("chio repository"))
        .subcommand_required(true);
    let matches = cmd.try_get_matches_from(std::iter::once("repository".into()).chain(args.iter().cloned()))?;
    RepositoryCommand::from_arg_matches(&matches)
}

/// Run a `chio repository` command as the one-shot form does.
pub fn run(cmd: &RepositoryCommand) -> Result<i32> {
    Ok(operation::run(&cmd.operation(), chio_cage::Ahead::default(), &mut None, None))
}
