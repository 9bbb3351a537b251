//! A repository leg operation as a value — what `chio repository` runs, and what a daemon
//! client sends (`chio.supervisor.v2`: `{"execute": {"state": …, "operation_key": …, "deadline":
//! 60, "json": true, "command": ["…"]}}`) — and running one, with the output `chio repository`
//! prints. Exit codes: 0 ok (execute: the command's status), 1 failure, 2 bad input, 3 refused by
//! a check, 4 operation-key conflict, 5 evidence that does not verify.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::execute::{self, ExecRequest, Transition};
use super::git_source::ReadAs;
use super::workspace::{self, InitRequest, RepoError};
use super::{export, mcp, recover, status};

/// A repository leg operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Operation {
    /// Create a workspace from the committed tree of literal paths at one revision.
    Init {
        /// The workspace's state directory (created; must be missing or empty).
        state: PathBuf,
        /// The source repository (a checkout or a bare repository); only read.
        repository: PathBuf,
        /// A branch, tag or commit id.
        revision: String,
        /// A literal path of the commit to import (repeat for more, 1 to 64, none inside another).
        source_path: Vec<String>,
        /// A path inside a source path that commands may fill but that is never part of a
        /// snapshot or the patch (build output: `pkg/target`, `pkg/__pycache__`; up to 16).
        scratch_path: Vec<String>,
        /// An imported image to run commands on (default: the host's /usr, /bin, /lib*, read-only).
        image: Option<String>,
        /// The image store (default $CHIO_STATE_DIR or /var/lib/chio).
        image_store: Option<PathBuf>,
        /// The kernel's signing seed (signs every receipt of the workspace). Required, except
        /// through `--supervisor`, whose own key signs when none is given.
        kernel_key: Option<PathBuf>,
        /// Server id recorded in the configuration and the receipts.
        server_id: Option<String>,
        /// Print the workspace status as JSON.
        json: bool,
    },
    /// Run one command (`bash -c`) in a cage over the workspace and commit the checked change.
    Execute {
        /// The workspace's state directory.
        state: PathBuf,
        /// Idempotency key: the same key and command return the first result without running again.
        operation_key: String,
        /// Wall-clock deadline in seconds (1 to 300).
        deadline: u64,
        /// Print the whole result as JSON on stdout instead of the output.
        json: bool,
        /// The command, run by `/bin/bash --noprofile --norc -c` (several words are joined by spaces).
        command: Vec<String>,
    },
    /// Workspace state, snapshots and operations.
    Status {
        /// The workspace's state directory.
        state: PathBuf,
        /// JSON output.
        json: bool,
    },
    /// Serve the leg over MCP (JSON-RPC 2.0 on stdio) with one tool, `execute`.
    Serve {
        /// The workspace's state directory.
        state: PathBuf,
        /// Path prefixes the file tools may read (none: `execute` only).
        #[serde(default)]
        read_prefix: Vec<String>,
    },
    /// After a crash: remove leftovers, restore the last committed snapshot, settle the journal.
    Recover {
        /// The workspace's state directory.
        state: PathBuf,
    },
    /// Write the patch, the receipts and the archives a recipient verifies.
    Export {
        /// The workspace's state directory.
        state: PathBuf,
        /// The bundle directory to create (must not exist).
        out: PathBuf,
    },
    /// Verify an exported bundle against a checkout, scope and key chosen by the recipient.
    VerifyExport {
        /// The bundle directory.
        bundle: PathBuf,
        /// The recipient's own checkout of the source repository.
        repository: PathBuf,
        /// The revision the recipient expects the baseline from.
        revision: String,
        /// The scope the recipient expects (repeat).
        source_path: Vec<String>,
        /// The kernel public key the receipts must be signed by (64 hex digits or a file).
        kernel_key: String,
        /// The server id the workspace must name.
        server_id: Option<String>,
        /// Print the claims document (`chio.claims.v1`) instead of the report alone.
        #[serde(default)]
        json: bool,
    },
}

/// The line an export reports.
pub fn exported(r: &export::ExportReport, out: &Path) -> String {
    format!(
        "exported {} transition(s), {} receipt(s) to {}; final {}",
        r.transitions,
        r.receipts,
        out.display(),
        r.final_digest
    )
}

/// Run `op` as `chio repository` does, printing what it prints; returns its exit status. With
/// what a daemon's spare made `ahead` for an `execute`'s cage; an `execute` sets `root` to its
/// cage's root when a root made ahead could serve the next one's. `read_as`: whose rights an
/// `init` reads its source with (a daemon's client; None: this process's own).
pub fn run(
    op: &Operation,
    ahead: chio_cage::Ahead,
    root: &mut Option<chio_cage::RootKey>,
    read_as: Option<ReadAs>,
) -> i32 {
    match dispatch(op, ahead, root, read_as) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("chio: {e}");
            e.exit_code()
        }
    }
}

/// Write to stdout; a closed pipe (`| head`) is an error named on stderr, not a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(|e| RepoError::Failed(format!("writing to stdout: {e}")))
    }};
}

/// Print `v` as pretty JSON on stdout.
pub fn print_json(v: &impl serde::Serialize) -> Result<(), RepoError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| RepoError::Failed(e.to_string()))?;
    say!("{s}")
}

fn dispatch(
    op: &Operation,
    ahead: chio_cage::Ahead,
    root: &mut Option<chio_cage::RootKey>,
    read_as: Option<ReadAs>,
) -> Result<i32, RepoError> {
    match op {
        Operation::Init {
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
        } => {
            require_root("repository init")?;
            let kernel_key = kernel_key.clone().ok_or_else(|| {
                RepoError::Usage("--kernel-key: give the seed that signs the workspace's receipts".into())
            })?;
            let req = InitRequest {
                state: state.clone(),
                repository: repository.clone(),
                revision: revision.clone(),
                source_paths: source_path.clone(),
                scratch_paths: scratch_path.clone(),
                image: image.as_ref().map(|i| (crate::state_dir(image_store.as_deref()), i.clone())),
                kernel_key,
                server_id: server_id.clone(),
                read_as,
            };
            let ws = workspace::init(&req)?;
            let s = status::status(&ws)?;
            if *json {
                print_json(&s)?;
            } else {
                say!(
                    "workspace {} at {}: commit {}, {} source path(s), baseline {}",
                    s.workspace_id,
                    state.display(),
                    s.source_commit,
                    s.source_paths.len(),
                    s.baseline
                )?;
            }
            Ok(0)
        }
        Operation::Execute { state, operation_key, deadline, json, command } => {
            require_root("repository execute")?;
            let ws = workspace::open(state)?;
            let req =
                ExecRequest { operation_key: operation_key.clone(), command: command.join(" "), deadline_s: *deadline };
            let r = execute::execute_with(&ws, &req, ahead)?;
            root.clone_from(&r.root);
            if *json {
                print_json(&r)?;
            } else {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(r.output.as_bytes());
                let _ = out.flush();
                let replay = if r.replayed { " (retained result, not run again)" } else { "" };
                match r.transition {
                    Transition::Committed => eprintln!(
                        "chio: exit {}{replay}; snapshot {}; receipt {}",
                        r.exit_status,
                        r.after.as_deref().unwrap_or("-"),
                        r.receipt_id
                    ),
                    Transition::Refused => eprintln!(
                        "chio: refused{replay}: {}; the workspace was put back to {} and stopped",
                        r.reason.as_deref().unwrap_or("-"),
                        r.before
                    ),
                    Transition::LaunchFailed => {
                        eprintln!(
                            "chio: the cage did not start the command{replay}: {}",
                            r.reason.as_deref().unwrap_or("-")
                        )
                    }
                }
                if r.output_dropped > 0 {
                    eprintln!("chio: {} more bytes of output were dropped", r.output_dropped);
                }
            }
            Ok(match r.transition {
                Transition::Refused => 3,
                _ => r.exit_status,
            })
        }
        Operation::Status { state, json } => {
            let s = status::status(&workspace::open(state)?)?;
            if *json {
                print_json(&s)?;
            } else {
                say!("workspace {} ({})", s.workspace_id, s.state)?;
                if let Some(r) = &s.stopped_reason {
                    say!("  stopped: {r}")?;
                }
                say!("  source   {} {:?}", s.source_commit, s.source_paths)?;
                if !s.scratch_paths.is_empty() {
                    say!("  scratch  {:?} (never snapshotted)", s.scratch_paths)?;
                }
                say!("  baseline {}", s.baseline)?;
                say!("  head     {} ({} snapshots, {} receipts)", s.head, s.snapshots, s.receipts)?;
                let ops: Vec<String> = s.operations.iter().map(|(k, v)| format!("{k} {v}")).collect();
                say!("  operations: {}", if ops.is_empty() { "none".into() } else { ops.join(", ") })?;
            }
            Ok(0)
        }
        Operation::Serve { state, read_prefix } => {
            require_root("repository serve")?;
            let grant = super::file_tools::ReadGrant::new(read_prefix)?;
            // Opened once up front: a wrong state directory fails here, not at the first call.
            drop(workspace::open(state)?);
            let stdin = std::io::stdin().lock();
            mcp::serve(state, &grant, stdin, std::io::stdout().lock())?;
            Ok(0)
        }
        Operation::Recover { state } => {
            require_root("repository recover")?;
            let report = recover::recover(&workspace::open(state)?)?;
            print_json(&report)?;
            Ok(if report.left_in_place.is_empty() { 0 } else { 3 })
        }
        Operation::Export { state, out } => {
            let ws = workspace::open(state)?;
            let report = export::export(&ws, out)?;
            say!("{}", exported(&report, out))?;
            Ok(0)
        }
        Operation::VerifyExport { bundle, repository, revision, source_path, kernel_key, server_id, json } => {
            let key =
                chio_kernel::keys::pinned(kernel_key).map_err(|e| RepoError::Usage(format!("--kernel-key: {e}")))?;
            let req = export::VerifyRequest {
                bundle: bundle.clone(),
                repository: repository.clone(),
                revision: revision.clone(),
                source_paths: source_path.clone(),
                kernel_key: key,
                server_id: server_id.clone(),
            };
            let report = if *json {
                let (report, claims) = super::claims::bundle_claims(&req);
                let doc = super::claims::Claims::of("bundle", claims);
                print_json(&serde_json::json!({"claims": doc, "report": report}))?;
                if report.error.is_none() && !doc.all_hold {
                    let failed: Vec<&str> = doc.claims.iter().filter(|c| !c.holds).map(|c| c.name.as_str()).collect();
                    eprintln!("chio: the bundle verified, but these claims do not hold: {}", failed.join(", "));
                    return Ok(5);
                }
                report
            } else {
                let report = export::verify_export(&req);
                print_json(&report)?;
                report
            };
            match &report.error {
                None => Ok(0),
                Some(e) => {
                    eprintln!("chio: {e}");
                    Ok(5)
                }
            }
        }
    }
}

/// Refuse `what` without root: it builds cages and hands the workspace to uid 65534.
pub fn require_root(what: &str) -> Result<(), RepoError> {
    if !nix_is_root() {
        return Err(RepoError::Usage(format!(
            "chio {what} needs root: it builds cages and hands the workspace to uid 65534, the uid commands run as"
        )));
    }
    Ok(())
}

fn nix_is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
