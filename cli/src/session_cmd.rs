//! `chio session`: governed sessions (init, authorize, prepare, run, status, recover, result). The
//! engine is `chio_supervisor::session`; this is flags and output. Exit codes as `chio
//! repository`: 0 ok, 1 failure, 2 bad input, 3 refused by a check, 5 evidence that does not
//! verify.

use std::path::PathBuf;

use anyhow::Result;
use chio_kernel::{envelope, keys};
use chio_supervisor::repository::workspace::RepoError;
use chio_supervisor::session::{self, config, gateway, leg, run};
use clap::Subcommand;

use crate::receipt_cmd::pinned_key;
use crate::repository_cmd::print_json;

/// `chio session` subcommands.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Create a session: import the workspace and write the provisioning request (grants nothing).
    #[command(
        after_help = "Example:\n  chio session init --config session.json --task-file issue.md --state ./s --kernel-key kernel.seed"
    )]
    Init {
        /// The session configuration (chio.session.v1).
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The task, as the agent reads it.
        #[arg(long = "task-file", value_name = "FILE")]
        task_file: PathBuf,
        /// The session's state directory (created; must be missing or empty).
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// The kernel's signing seed (signs every receipt of the workspace).
        #[arg(long = "kernel-key", value_name = "SEED")]
        kernel_key: PathBuf,
        /// The image store (default $CHIO_STATE_DIR or /var/lib/chio).
        #[arg(long = "image-store", value_name = "DIR")]
        image_store: Option<PathBuf>,
        /// The tool server id the workspace's receipts name; a recipient pins it with
        /// `repository verify-export --server-id`.
        #[arg(long = "server-id", value_name = "ID")]
        server_id: Option<String>,
    },
    /// Sign the authorization of a provisioning request with the operator's seed.
    #[command(
        after_help = "Example:\n  chio session authorize --key operator/signing.seed --request ./s/provisioning-request.json --out auth.json"
    )]
    Authorize {
        /// The operator's signing seed.
        #[arg(long, value_name = "SEED")]
        key: PathBuf,
        /// The provisioning request to authorize (read in full; its digest is signed).
        #[arg(long, value_name = "FILE")]
        request: PathBuf,
        /// The signed authorization to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Model calls answered in the whole session, at most (below the request's step limit).
        #[arg(long = "max-calls", value_name = "N")]
        max_calls: Option<u64>,
        /// Requests sent to the provider in the whole session, at most (answered, refused by the
        /// provider, sent again: each may be billed).
        #[arg(long = "max-attempts", value_name = "N")]
        max_attempts: Option<u64>,
        /// How long the grant lasts from now (e.g. 30m, 8h): no run, model call or command after.
        #[arg(long = "valid-for", value_name = "DURATION", value_parser = crate::units::parse_duration_ms)]
        valid_for: Option<u64>,
    },
    /// Admit the operator's signed authorization against the session's request.
    #[command(
        after_help = "Example:\n  chio session prepare --state ./s --authorization auth.json --trusted-key operator/public.key"
    )]
    Prepare {
        /// The session's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// The signed authorization.
        #[arg(long, value_name = "FILE")]
        authorization: PathBuf,
        /// The operator's public key: 64 hex digits or a file.
        #[arg(long = "trusted-key", value_name = "HEX|FILE")]
        trusted_key: String,
    },
    /// Run the agent: gateway and leg on the host side, the worker in its own cage.
    #[command(after_help = "Example:\n  OPENAI_API_KEY=... chio session run --state ./s")]
    Run {
        /// The session's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
        /// Send again a model call whose outcome is unknown (sent before a run stopped, never
        /// answered: the provider may have done and billed it). Recorded in the call journal.
        #[arg(long)]
        resend_unknown: bool,
    },
    /// Where the session stands.
    Status {
        /// The session's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// What the session shows, each claim computed from its state with its evidence: the
    /// operator's authorization, the worker's record, the model-call journal, the receipts and
    /// the patch verified as a recipient would, a wrong key and an edited patch refused.
    #[command(
        after_help = "Exit status: 0 every claim holds, 5 one does not, 2 bad input.\nExample:\n  chio session claims --state ./s --kernel-key kernel-key/public.key --json"
    )]
    Claims {
        /// The session's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// The kernel public key the receipts must verify under (64 hex digits or a file);
        /// default the workspace's own, which proves only that the receipts agree with it.
        #[arg(long = "kernel-key", value_name = "PUBKEY")]
        kernel_key: Option<String>,
        /// Print the claims document (chio.claims.v1) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// An operator's evidence without a provider account: the calculator scenario (Python; with
    /// --rust-image, Rust too) run with these very commands against the built-in scripted
    /// provider, a run killed mid-command and recovered, a rerun, the recipient's tests; writes
    /// OUT/claims.json and each scenario's state, result and claims.
    #[command(
        after_help = "Exit status: 0 every claim holds, 5 one does not, 1 a step failed, 2 bad input.\nExample:\n  chio session qualify --out ./qualification --worker-python /opt/msa/bin/python"
    )]
    Qualify {
        /// A new directory.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The Python of a venv with mini-swe-agent and chio_minisweagent (the worker).
        #[arg(long = "worker-python", value_name = "PYTHON")]
        worker_python: PathBuf,
        /// The Rust image (reference or id) for the Rust scenario.
        #[arg(long = "rust-image", value_name = "REF|ID")]
        rust_image: Option<String>,
        /// The image store holding it (default $CHIO_STATE_DIR or /var/lib/chio).
        #[arg(long = "image-store", value_name = "DIR")]
        image_store: Option<PathBuf>,
        /// Print the qualification document as JSON.
        #[arg(long)]
        json: bool,
    },
    /// After a crash: recover the workspace and make the run resumable.
    Recover {
        /// The session's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
    },
    /// Write the result: the repository export (OUT/bundle), the trajectory and the outcome.
    Result {
        /// The session's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// A new directory.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// (Internal to `run`.) The model gateway.
    #[command(hide = true)]
    Gateway {
        /// The session's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
        /// Send again a call whose outcome is unknown (from `run --resend-unknown`).
        #[arg(long)]
        resend_unknown: bool,
    },
    /// (Internal to `run`.) The repository leg's socket server.
    #[command(hide = true)]
    Leg {
        /// The session's state directory.
        #[arg(long, value_name = "DIR")]
        state: PathBuf,
    },
}

/// Run a `chio session` subcommand; returns the exit code.
pub fn run(cmd: &SessionCommand) -> Result<i32> {
    match dispatch(cmd) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("chio: {e}");
            Ok(e.exit_code())
        }
    }
}

fn failed(e: impl std::fmt::Display) -> RepoError {
    RepoError::Failed(e.to_string())
}

/// One line on stdout. A reader that went away (`chio session status | head -1`) is told on
/// stderr and exits 1: never a panic, and never taken for a line written.
fn say(line: std::fmt::Arguments) -> Result<(), RepoError> {
    use std::io::Write as _;
    writeln!(std::io::stdout(), "{line}").map_err(|e| RepoError::Failed(format!("writing to stdout: {e}")))
}

/// Claims a line each: `holds ` or `FAILS `, the name, the count if any, the evidence.
fn print_claims(claims: &[chio_supervisor::repository::claims::Claim], indent: &str) -> Result<(), RepoError> {
    for c in claims {
        let value = c.value.map(|v| format!(" = {v}")).unwrap_or_default();
        let mark = if c.holds { "holds " } else { "FAILS " };
        say(format_args!("{indent}{mark} {}{value}: {}", c.name, c.evidence))?;
    }
    Ok(())
}

/// The agent's status in words: its trajectory's, or why there is none.
fn agent_status(o: &session::Outcome) -> String {
    match &o.agent_exit_status {
        Some(s) => s.clone(),
        None if o.worker_exit_status > 128 => {
            format!("stopped without a status (the worker was killed by signal {})", o.worker_exit_status - 128)
        }
        None => "stopped without a status (no trajectory written)".into(),
    }
}

/// ", ceilings hit: wall_time" or nothing.
fn limits_hit(hit: &[String]) -> String {
    if hit.is_empty() {
        String::new()
    } else {
        format!("; ceilings hit: {}", hit.join(", "))
    }
}

fn dispatch(cmd: &SessionCommand) -> Result<i32, RepoError> {
    match cmd {
        SessionCommand::Init { config, task_file, state, kernel_key, image_store, server_id } => {
            crate::repository_cmd::require_root("session init")?;
            let s = session::init(&session::InitRequest {
                state: state.clone(),
                config: config.clone(),
                task: task_file.clone(),
                kernel_key: kernel_key.clone(),
                image_store: crate::image_cmd::state_dir(image_store),
                server_id: server_id.clone(),
            })?;
            say(format_args!(
                "session {} at {}: review {} and have the operator authorize it",
                s.request.session_id,
                state.display(),
                s.dir.join("provisioning-request.json").display()
            ))?;
            Ok(0)
        }
        SessionCommand::Authorize { key, request, out, max_calls, max_attempts, valid_for } => {
            let seed = keys::read_seed(key).map_err(|e| RepoError::Usage(format!("--key: {e}")))?;
            let bytes = std::fs::read(request).map_err(|e| RepoError::Usage(format!("{}: {e}", request.display())))?;
            let req: config::ProvisioningRequest = serde_json::from_slice(&bytes)
                .map_err(|e| RepoError::Usage(format!("{}: not a provisioning request: {e}", request.display())))?;
            let not_after = valid_for.map(|ms| {
                let now = chio_kernel::time::now_ms();
                chio_kernel::time::rfc3339(now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
            });
            let grant = config::Grant { max_calls: *max_calls, max_attempts: *max_attempts, not_after };
            let body = serde_json::to_value(config::authorization_for(&req, grant)?).map_err(failed)?;
            let signed = envelope::sign(&seed, body).map_err(failed)?;
            let text = serde_json::to_vec_pretty(&signed).map_err(failed)?;
            std::fs::write(out, text).map_err(|e| RepoError::Usage(format!("{}: {e}", out.display())))?;
            eprintln!(
                "chio: authorized session {} (request {})",
                req.session_id,
                chio_supervisor::repository::workspace::json_digest(&req)?
            );
            Ok(0)
        }
        SessionCommand::Prepare { state, authorization, trusted_key } => {
            let key = pinned_key(trusted_key).map_err(|e| RepoError::Usage(format!("--trusted-key: {e:#}")))?;
            let s = session::prepare(state, authorization, &key)?;
            say(format_args!("session {} prepared: the authorization is admitted", s.request.session_id))?;
            Ok(0)
        }
        SessionCommand::Run { state, json, resend_unknown } => {
            crate::repository_cmd::require_root("session run")?;
            let outcome = run::run(state, *resend_unknown)?;
            if *json {
                print_json(&outcome)?;
            } else {
                say(format_args!(
                    "agent {}; {} model call(s); worker exit {}{}",
                    agent_status(&outcome),
                    outcome.model_calls,
                    outcome.worker_exit_status,
                    limits_hit(&outcome.worker_limits_hit)
                ))?;
            }
            Ok(if outcome.submitted { 0 } else { 1 })
        }
        SessionCommand::Status { state, json } => {
            let st = session::status(state)?;
            if *json {
                print_json(&st)?;
            } else {
                // Each line through `say`: `status | head -1` closes the pipe after the first.
                say(format_args!("session {} ({}), {} model call(s)", st.session_id, st.state, st.model_calls))?;
                if let Some(o) = &st.outcome {
                    say(format_args!("  agent {}{}", agent_status(o), limits_hit(&o.worker_limits_hit)))?;
                }
                if let Some(w) = &st.workspace {
                    say(format_args!("  workspace {} head {} ({} receipts)", w.workspace_id, w.head, w.receipts))?;
                }
            }
            Ok(0)
        }
        SessionCommand::Claims { state, kernel_key, json } => {
            let key = kernel_key
                .as_deref()
                .map(|k| pinned_key(k).map_err(|e| RepoError::Usage(format!("--kernel-key: {e:#}"))))
                .transpose()?;
            let doc = session::claims::claims(state, key.as_deref())?;
            if *json {
                print_json(&doc)?;
            } else {
                print_claims(&doc.claims, "")?;
            }
            Ok(if doc.all_hold { 0 } else { 5 })
        }
        SessionCommand::Qualify { out, worker_python, rust_image, image_store, json } => {
            crate::repository_cmd::require_root("session qualify")?;
            let q = session::qualify::qualify(&session::qualify::QualifyRequest {
                out: out.clone(),
                worker_python: worker_python.clone(),
                rust_image: rust_image.clone(),
                image_store: crate::image_cmd::state_dir(image_store),
            })?;
            if *json {
                print_json(&q)?;
            } else {
                for sc in &q.scenarios {
                    say(format_args!("{} ({})", sc.name, sc.dir.display()))?;
                    print_claims(&sc.claims.claims, "  ")?;
                }
                say(format_args!("{}", out.join("claims.json").display()))?;
            }
            Ok(if q.all_hold { 0 } else { 5 })
        }
        SessionCommand::Recover { state } => {
            crate::repository_cmd::require_root("session recover")?;
            print_json(&session::recover(state)?)?;
            Ok(0)
        }
        SessionCommand::Result { state, out } => {
            let r = session::result(state, out)?;
            print_json(&r)?;
            Ok(0)
        }
        SessionCommand::Gateway { state, resend_unknown } => {
            let s = session::open(state)?;
            let credential = std::env::var(&s.config.model.credential_env).unwrap_or_default();
            gateway::serve(&s, credential, *resend_unknown)?;
            Ok(0)
        }
        SessionCommand::Leg { state } => {
            leg::serve(&session::open(state)?)?;
            Ok(0)
        }
    }
}
