//! `chio security supervise` (credentials, readiness, sd_notify, signals: `chio_supervisor::service`)
//! and `chio security preflight`: can this host enforce this launch? Four probes, in order — the
//! platform, the bearer roles' tokens, the native launch material (with a trial launch to the
//! exec observation), the durable stores — each one finding; exit 0 (ok, info, warning), 1
//! (error) or 2 (fatal) from the worst. The probes are `chio_supervisor::preflight`'s; the launch
//! material is loaded here exactly as `chio cage run --policy` loads it.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Result;
use chio_cage::{Mode, State};
use chio_supervisor::launch::{self, PolicyLaunch, Prepared};
use chio_supervisor::launch_plan::PlanOptions;
use chio_supervisor::preflight::{self, Finding, Severity};
use clap::{Args, Subcommand};

/// `chio security` subcommands.
#[derive(Debug, Subcommand)]
pub enum SecurityCommand {
    /// Check that this host can enforce (and, given launch material, this exact launch).
    #[command(after_help = PREFLIGHT_EXAMPLE)]
    Preflight(Box<PreflightArgs>),
    /// Run a command as a systemd service: credentials into variables, readiness, sd_notify,
    /// signal forwarding, stop grace (or `--exec`).
    #[command(after_help = SUPERVISE_EXAMPLE)]
    Supervise(Box<SuperviseArgs>),
}

const SUPERVISE_EXAMPLE: &str = "Examples (in a unit with LoadCredential=api-token:/etc/chio/credentials/api-token):\n  chio security supervise --exec --credential-env CHIO_AUTH_TOKEN=api-token -- /usr/bin/chio-edge\n  chio security supervise --credential-env CHIO_AUTH_TOKEN=api-token \\\n      --ready-unix-socket /run/chio/edge.sock --ready-timeout 30s --stop-grace 10s -- /usr/bin/chio-edge";

/// Flags of `chio security supervise`.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// Set the variables and exec the command (no readiness, no supervision).
    #[arg(long, conflicts_with_all = ["ready_unix_socket", "ready_http", "ready_timeout", "stop_grace"])]
    exec: bool,
    /// Where the credential files are (default $CREDENTIALS_DIRECTORY, systemd's LoadCredential=).
    #[arg(long = "credentials-dir", value_name = "DIR")]
    credentials_dir: Option<PathBuf>,
    /// Set VAR from the credential file NAME (repeat for more).
    #[arg(long = "credential-env", value_name = "VAR=NAME", value_parser = var_eq_name)]
    credential_env: Vec<(String, String)>,
    /// Ready once this Unix socket accepts a connection.
    #[arg(long = "ready-unix-socket", value_name = "PATH", conflicts_with = "ready_http")]
    ready_unix_socket: Option<PathBuf>,
    /// Ready once a GET of this URL answers 2xx.
    #[arg(long = "ready-http", value_name = "URL")]
    ready_http: Option<String>,
    /// The variable holding the bearer token for --ready-http (a credential's VAR, say).
    #[arg(long = "ready-http-bearer-env", value_name = "VAR", requires = "ready_http")]
    ready_http_bearer_env: Option<String>,
    /// How long readiness may take.
    #[arg(long = "ready-timeout", value_name = "DUR", default_value = "90s", value_parser = crate::units::arg::duration)]
    ready_timeout: String,
    /// How long a stopping command may take before SIGKILL.
    #[arg(long = "stop-grace", value_name = "DUR", default_value = "10s", value_parser = crate::units::arg::duration)]
    stop_grace: String,
    /// The command.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn var_eq_name(s: &str) -> std::result::Result<(String, String), String> {
    let (var, name) = s.split_once('=').ok_or_else(|| format!("{s:?}: give VAR=NAME"))?;
    let ok = !var.is_empty()
        && !var.starts_with(|c: char| c.is_ascii_digit())
        && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok || name.is_empty() {
        return Err(format!("{s:?}: give VAR=NAME (a variable name, a credential file name)"));
    }
    Ok((var.to_string(), name.to_string()))
}

const PREFLIGHT_EXAMPLE: &str = "Examples:\n  chio security preflight --require-enforcement\n  chio security preflight --json --require-enforcement \\\n      --signed-manifest m.json --manifest-public-key publisher.key \\\n      --cage-policy p.json --cage-policy-signer operator.key --server-id repo-files \\\n      --receipt-db /var/lib/chio/receipts.db -- /usr/bin/repo-files --stdio";

/// Flags of `chio security preflight`.
#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
    /// Treat what only weakens enforcement (a shadow policy, an old landlock ABI) as an error.
    #[arg(long = "require-enforcement")]
    require_enforcement: bool,
    /// The publisher's signed tool manifest (launch material, 1 of 6).
    #[arg(long = "signed-manifest", value_name = "FILE")]
    signed_manifest: Option<PathBuf>,
    /// The publisher's public key the manifest must verify under (2 of 6): hex or a file.
    #[arg(long = "manifest-public-key", value_name = "HEX|FILE")]
    manifest_public_key: Option<String>,
    /// The operator's signed cage launch policy (3 of 6).
    #[arg(long = "cage-policy", value_name = "FILE")]
    cage_policy: Option<PathBuf>,
    /// The operator's public key the policy must verify under (4 of 6): hex or a file.
    #[arg(long = "cage-policy-signer", value_name = "HEX|FILE")]
    cage_policy_signer: Option<String>,
    /// The server id the manifest must name (5 of 6).
    #[arg(long = "server-id", value_name = "ID")]
    server_id: Option<String>,
    /// A receipt store to check (repeat for more).
    #[arg(long = "receipt-db", value_name = "DB")]
    receipt_db: Vec<PathBuf>,
    /// A service's session store (an SQLite database) to check like a receipt store (repeat).
    #[arg(long = "session-db", value_name = "DB")]
    session_db: Vec<PathBuf>,
    /// The exact command the launch runs (6 of 6).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Run a `chio security` subcommand; returns the exit code.
pub fn run(cmd: &SecurityCommand) -> Result<i32> {
    match cmd {
        SecurityCommand::Preflight(a) => preflight(a),
        SecurityCommand::Supervise(a) => supervise(a),
    }
}

fn preflight(a: &PreflightArgs) -> Result<i32> {
    let findings = vec![
        preflight::platform(a.require_enforcement),
        preflight::bearer_roles(|k| std::env::var_os(k)),
        native_launch(a),
        preflight::durable_stores(&a.receipt_db, &a.session_db),
    ];
    let worst = preflight::worst(&findings);
    if a.json {
        let doc = serde_json::json!({"schema": "chio.security.preflight.v1", "worst": worst, "findings": findings});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for f in &findings {
            println!("{:<8} {}: {}", format!("{:?}", f.severity).to_lowercase(), f.probe, f.summary);
            for p in f.others() {
                println!("           also {}: {}", format!("{:?}", p.severity).to_lowercase(), p.summary);
            }
            for (k, v) in &f.context {
                println!("           {k}: {v}");
            }
        }
    }
    Ok(worst.exit_code())
}

/// `security.native_launch`: all six parts of the launch material or none; loaded and admitted
/// as `chio cage run --policy` would, then a trial launch to the exec observation.
fn native_launch(a: &PreflightArgs) -> Finding {
    const PROBE: &str = "security.native_launch";
    let parts = [
        ("--signed-manifest", a.signed_manifest.is_some()),
        ("--manifest-public-key", a.manifest_public_key.is_some()),
        ("--cage-policy", a.cage_policy.is_some()),
        ("--cage-policy-signer", a.cage_policy_signer.is_some()),
        ("--server-id", a.server_id.is_some()),
        ("-- COMMAND", !a.command.is_empty()),
    ];
    let missing: Vec<&str> = parts.iter().filter(|(_, given)| !given).map(|(n, _)| *n).collect();
    if missing.len() == parts.len() {
        return Finding::new(PROBE, Severity::Info, "no launch material given: only the platform was checked");
    }
    if !missing.is_empty() {
        return Finding::new(
            PROBE,
            Severity::Error,
            format!("launch material is all six parts or none: missing {}", missing.join(", ")),
        );
    }
    match load_and_trial(a) {
        Ok(f) => f,
        Err(e) => Finding::new(PROBE, Severity::Error, format!("{e:#}")),
    }
}

fn load_and_trial(a: &PreflightArgs) -> Result<Finding> {
    const PROBE: &str = "security.native_launch";
    let (Some(manifest), Some(manifest_key), Some(policy), Some(signer), Some(server)) =
        (&a.signed_manifest, &a.manifest_public_key, &a.cage_policy, &a.cage_policy_signer, &a.server_id)
    else {
        anyhow::bail!("launch material is incomplete");
    };
    // The launch as `chio cage run --policy` makes it. Preflight writes no receipt (the trial
    // stops before the target runs): the launch counts as receipted, so that a policy requiring
    // receipts is judged on the rest.
    let read = |p: &std::path::Path| -> Result<String> {
        String::from_utf8(crate::doc_cmd::read(p)?).map_err(|_| anyhow::anyhow!("{}: not UTF-8", p.display()))
    };
    let launch = PolicyLaunch {
        policy: read(policy)?,
        manifest: read(manifest)?,
        signer: crate::receipt_cmd::pinned_key(signer)?,
        manifest_key: Some(crate::receipt_cmd::pinned_key(manifest_key)?),
        allow_root: false,
        image_store: None,
        receipted: true,
    };
    let options = PlanOptions::new(a.command.clone());
    let checked = launch::check(&options, &launch)?;
    let mut f = Finding::new(PROBE, Severity::Ok, "this exact launch reaches FullyEnforced on this host");
    f.context.insert("policy_id".into(), checked.policy.policy_id.clone());
    f.context.insert("manifest_sha256".into(), checked.digest.clone());
    f.context.insert("receipts_required".into(), checked.policy.receipts.required.to_string());
    anyhow::ensure!(
        &checked.manifest.server_id == server,
        "the manifest is for server {:?}, not --server-id {server:?}",
        checked.manifest.server_id
    );
    let admitted = checked.admitted.as_ref().map_err(|v| anyhow::anyhow!("the launch is refused: {}", v.join("; ")))?;
    let (plan, _held) = launch::admitted_plan(&options, &launch, &checked, admitted)?;
    Ok(trial(a, f, Prepared::of(plan)))
}

/// The trial launch of `plan`, judged.
fn trial(a: &PreflightArgs, mut f: Finding, prepared: Prepared) -> Finding {
    if let Some(needs) = preflight::needs_root(&prepared.plan) {
        f.context.insert("trial_launch".into(), "not run: needs root".into());
        f.summary = "the launch material verifies and the policy admits this launch".into();
        f.raise(Severity::Warning, needs);
        return f;
    }
    let rec = preflight::trial_launch(&prepared);
    let plan = &prepared.plan;
    f.context.insert("trial_launch".into(), format!("{:?}", rec.state));
    f.context.insert("mode".into(), format!("{:?}", plan.mode));
    if plan.mode == Mode::Shadow {
        let s = if a.require_enforcement { Severity::Error } else { Severity::Warning };
        f.raise(s, "the policy is in shadow mode: violations are recorded, not refused");
    } else if rec.state != State::FullyEnforced {
        f.raise(
            Severity::Error,
            match &rec.failure {
                Some(x) => format!(
                    "the trial launch did not reach FullyEnforced: {} at {}: {}",
                    x.code,
                    x.stage.name(),
                    x.detail
                ),
                None => format!("the trial launch ended {:?}", rec.state),
            },
        );
    }
    f
}

fn supervise(a: &SuperviseArgs) -> Result<i32> {
    use chio_supervisor::service::{self, Ended, Readiness, RunOptions};
    let said = |e: service::ServiceError| {
        eprintln!("chio: {e}");
        Ok(e.exit_code())
    };
    let dir = a.credentials_dir.clone().or_else(|| std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from));
    let credentials = match (&dir, a.credential_env.is_empty()) {
        (_, true) => Vec::new(),
        (None, false) => {
            return said(service::ServiceError::Refused(
                "--credential-env needs --credentials-dir or $CREDENTIALS_DIRECTORY (systemd's LoadCredential=)".into(),
            ))
        }
        (Some(d), false) => match service::read_credentials(d, &a.credential_env) {
            Ok(c) => c,
            Err(e) => return said(e),
        },
    };
    if a.exec {
        return said(service::exec(&a.command, &credentials));
    }
    let bearer = match &a.ready_http_bearer_env {
        Some(var) => {
            let from_credentials = credentials.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone());
            match from_credentials.or_else(|| std::env::var(var).ok()) {
                Some(v) => Some(v),
                None => {
                    return said(service::ServiceError::Refused(format!("--ready-http-bearer-env {var} is not set")))
                }
            }
        }
        None => None,
    };
    let readiness = match (&a.ready_unix_socket, &a.ready_http) {
        (Some(p), _) => Readiness::UnixSocket(p.clone()),
        (None, Some(url)) => Readiness::Http { url: url.clone(), bearer },
        (None, None) => Readiness::Started,
    };
    let ms = |s: &str| crate::units::parse_duration_ms(s).map_err(anyhow::Error::msg);
    let options = RunOptions {
        argv: a.command.clone(),
        credentials,
        readiness,
        ready_timeout: std::time::Duration::from_millis(ms(&a.ready_timeout)?),
        stop_grace: std::time::Duration::from_millis(ms(&a.stop_grace)?),
    };
    match service::run(&options) {
        Ok(Ended::Exited(status)) => service::exit_like(status),
        Ok(Ended::NotReady(why, _)) => {
            eprintln!("chio: {why}");
            Ok(1)
        }
        Err(e) => said(e),
    }
}
