//! `chio manifest sign|verify` and `chio policy sign|verify|admit`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use chio_kernel::{canonical, documents, envelope, keys};
use clap::{Args, Subcommand};

use crate::receipt_cmd::pinned_key;

/// Flags of `manifest sign` and `policy sign`.
#[derive(Debug, Args)]
pub struct SignArgs {
    /// Signer's seed file (the publisher's for a manifest, the operator's for a policy).
    #[arg(long, value_name = "SEED")]
    key: PathBuf,
    /// Unsigned body (JSON).
    #[arg(long = "in", value_name = "FILE")]
    input: PathBuf,
    /// Signed envelope to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// `chio manifest …`
#[derive(Debug, Subcommand)]
pub enum ManifestCommand {
    /// Sign a manifest body (chio.tool-manifest.v1) with the publisher's seed.
    #[command(
        after_help = "Example:\n  chio manifest sign --key publisher/signing.seed --in manifest.json --out manifest.signed.json"
    )]
    Sign(SignArgs),
    /// Verify a signed manifest under the pinned publisher key; prints its body digest.
    #[command(
        after_help = "Example:\n  chio manifest verify --in manifest.signed.json --trusted-key publisher/public.key"
    )]
    Verify {
        /// Signed manifest.
        #[arg(long = "in", value_name = "FILE")]
        input: PathBuf,
        /// Publisher public key: 64 hex digits or a file.
        #[arg(long = "trusted-key", visible_alias = "public-key", value_name = "HEX|FILE")]
        public_key: String,
    },
}

/// `chio policy …`
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Sign a cage launch policy body (chio.cage-launch-policy.v1) with the operator's seed.
    #[command(
        after_help = "Example:\n  chio policy sign --key operator/signing.seed --in policy.json --out policy.signed.json"
    )]
    Sign(SignArgs),
    /// Verify a signed policy under the pinned operator key.
    #[command(after_help = "Example:\n  chio policy verify --in policy.signed.json --trusted-key operator/public.key")]
    Verify {
        /// Signed policy.
        #[arg(long = "in", value_name = "FILE")]
        input: PathBuf,
        /// Operator public key: 64 hex digits or a file.
        #[arg(long = "trusted-key", visible_alias = "signer", value_name = "HEX|FILE")]
        signer: String,
    },
    /// Check a signed manifest against a signed policy: admitted, or every violation named.
    #[command(
        after_help = "Example:\n  chio policy admit --policy policy.signed.json --trusted-key operator/public.key --manifest manifest.signed.json"
    )]
    Admit {
        /// Signed policy.
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// Operator public key: 64 hex digits or a file.
        #[arg(long = "trusted-key", visible_alias = "signer", value_name = "HEX|FILE")]
        signer: String,
        /// Signed manifest (verified under the publisher key the policy names).
        #[arg(long, value_name = "FILE")]
        manifest: PathBuf,
        /// Record a refusal as a signed denial receipt in this store (needs --kernel-key).
        #[arg(long = "receipt-db", value_name = "DB", requires = "kernel_key")]
        receipt_db: Option<PathBuf>,
        /// The kernel's signing seed for the denial receipt (needs --receipt-db).
        #[arg(long = "kernel-key", value_name = "SEED", requires = "receipt_db")]
        kernel_key: Option<PathBuf>,
    },
}

/// The bytes of a document file.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

fn sign(a: &SignArgs, validate: fn(serde_json::Value) -> Result<(), documents::DocumentError>) -> Result<i32> {
    let (key, input, out) = (&a.key, &a.input, &a.out);
    let seed = keys::read_seed(key)?;
    let body = canonical::parse_strict(&read(input)?).with_context(|| format!("{}", input.display()))?;
    validate(body.clone()).with_context(|| format!("{}", input.display()))?;
    let signed = envelope::sign(&seed, body)?;
    std::fs::write(out, format!("{}\n", serde_json::to_string_pretty(&signed)?))
        .with_context(|| format!("writing {}", out.display()))?;
    println!("{}", documents::body_digest(&signed.body)?);
    Ok(0)
}

/// Run a manifest subcommand.
pub fn manifest(cmd: &ManifestCommand) -> Result<i32> {
    match cmd {
        ManifestCommand::Sign(a) => sign(a, |v| documents::manifest_from(v).map(drop)),
        ManifestCommand::Verify { input, public_key } => {
            let (m, digest) = documents::verify_manifest(&read(input)?, &pinned_key(public_key)?)
                .with_context(|| format!("{}", input.display()))?;
            println!("ok: manifest {} {} ({}), body sha256 {digest}", m.server_id, m.version, m.name);
            Ok(0)
        }
    }
}

/// Run a policy subcommand.
pub fn policy(cmd: &PolicyCommand) -> Result<i32> {
    match cmd {
        PolicyCommand::Sign(a) => sign(a, |v| documents::policy_from(v).map(drop)),
        PolicyCommand::Verify { input, signer } => {
            let p = documents::verify_policy(&read(input)?, &pinned_key(signer)?)
                .with_context(|| format!("{}", input.display()))?;
            println!("ok: policy {} ({:?}) admits manifest {}", p.policy_id, p.mode, p.manifest.sha256);
            Ok(0)
        }
        PolicyCommand::Admit { policy, signer, manifest, receipt_db, kernel_key } => {
            let p = documents::verify_policy(&read(policy)?, &pinned_key(signer)?)
                .with_context(|| format!("{}", policy.display()))?;
            let (m, digest) = documents::verify_manifest(&read(manifest)?, &p.manifest.publisher_key)
                .with_context(|| format!("{}", manifest.display()))?;
            let violations = match documents::admit(&m, &digest, &p) {
                documents::Admission::Admitted(plan) => {
                    println!("{}", serde_json::to_string(&plan)?);
                    eprintln!("admitted: {} under policy {}", m.server_id, p.policy_id);
                    return Ok(0);
                }
                documents::Admission::Refused(v) => v,
            };
            for v in &violations {
                eprintln!("refused: {v}");
            }
            if let (Some(db), Some(seed)) = (receipt_db, kernel_key) {
                record_denial(db, seed, &m.server_id, &p.policy_id, &digest, &violations)?;
            }
            eprintln!("chio: {} refused by policy {}: {} violation(s)", m.server_id, p.policy_id, violations.len());
            Ok(1)
        }
    }
}

/// Record a policy's refusal as a signed `denial` receipt naming every violation.
pub fn record_denial(
    db: &Path,
    seed: &Path,
    server_id: &str,
    policy_id: &str,
    manifest_sha256: &str,
    violations: &[String],
) -> Result<()> {
    let mut receipts = chio_supervisor::launch::LaunchReceipts::open(db, seed)?;
    let id = receipts.denial(server_id, policy_id, manifest_sha256, violations).map_err(anyhow::Error::msg)?;
    eprintln!("chio: denial receipt {id}");
    Ok(())
}
