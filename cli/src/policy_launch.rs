//! `chio cage run --policy`: a launch under an operator-signed cage launch policy. Admission is
//! `policy admit`'s; the command must be exactly the admitted argv, and the plan is exactly the
//! admitted one — every flag that could widen it conflicts with `--policy` (clap refuses them).
//! A refusal is written as a signed `denial` receipt when a store is given.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use chio_cage::{Bind, CagePlan, Mode, RootSpec};
use chio_kernel::documents::{self, AdmittedPlan, PolicyMode, Rootfs};

use crate::cage_cmd::RunArgs;

/// The plan a policy admits (and the image it holds), or the exit status of a refusal.
pub type Planned = std::result::Result<(CagePlan, Option<std::fs::File>), i32>;

/// A policy and manifest verified under their pinned keys, and what admission said.
pub struct Checked {
    /// The verified policy.
    pub policy: documents::Policy,
    /// The verified manifest.
    pub manifest: documents::Manifest,
    /// The manifest body's digest.
    pub digest: String,
    /// The admitted plan, or every violation (admission's and this launch's).
    pub admitted: std::result::Result<Box<AdmittedPlan>, Vec<String>>,
}

/// Verify the policy under `signer` and the manifest under the publisher key the policy names
/// (`manifest_key`, when given, must be that key), then admit the launch `a` asks for.
pub fn check(a: &RunArgs, policy: &Path, signer: &str, manifest: &Path, manifest_key: Option<&str>) -> Result<Checked> {
    let (policy_bytes, manifest_bytes) = match &a.documents {
        Some((p, m)) => (p.clone(), m.clone()),
        None => (crate::doc_cmd::read(policy)?, crate::doc_cmd::read(manifest)?),
    };
    let p = documents::verify_policy(&policy_bytes, &crate::receipt_cmd::pinned_key(signer)?)
        .with_context(|| format!("{}", policy.display()))?;
    if let Some(k) = manifest_key {
        let pinned = crate::receipt_cmd::pinned_key(k)?;
        anyhow::ensure!(
            pinned == p.manifest.publisher_key,
            "the policy admits manifests of publisher {}, not the pinned manifest key {pinned}",
            p.manifest.publisher_key
        );
    }
    let (m, digest) = documents::verify_manifest(&manifest_bytes, &p.manifest.publisher_key)
        .with_context(|| format!("{}", manifest.display()))?;
    let admitted = match documents::admit(&m, &digest, &p) {
        documents::Admission::Admitted(plan) => {
            let v = launch_violations(a, &plan, p.receipts.required);
            if v.is_empty() {
                Ok(plan)
            } else {
                Err(v)
            }
        }
        documents::Admission::Refused(v) => Err(v),
    };
    Ok(Checked { policy: p, manifest: m, digest, admitted })
}

/// Admit the launch `a` asks for under its policy, or refuse it.
pub fn plan(a: &RunArgs, policy: &Path, signer: &str, manifest: &Path) -> Result<Planned> {
    let c = check(a, policy, signer, manifest, None)?;
    let admitted = match &c.admitted {
        Ok(plan) => plan,
        Err(violations) => {
            for v in violations {
                eprintln!("refused: {v}");
            }
            if let (Some(db), Some(seed)) = (&a.receipt_db, &a.kernel_key) {
                let (server, policy_id) = (&c.manifest.server_id, &c.policy.policy_id);
                crate::doc_cmd::record_denial(db, seed, server, policy_id, &c.digest, violations)?;
            }
            eprintln!("chio: launch refused by policy {}: {} violation(s)", c.policy.policy_id, violations.len());
            return Ok(Err(125));
        }
    };
    Ok(Ok(admitted_plan(a, &c, admitted)?))
}

/// The cage plan of a checked, admitted launch, annotated with what admitted it.
pub fn admitted_plan(a: &RunArgs, c: &Checked, admitted: &AdmittedPlan) -> Result<(CagePlan, Option<std::fs::File>)> {
    let (mut plan, held) = build(a, admitted)?;
    plan.annotations.insert("policy.id".into(), c.policy.policy_id.clone());
    plan.annotations.insert("policy.manifest_sha256".into(), c.digest.clone());
    plan.annotations.insert("policy.server_id".into(), c.manifest.server_id.clone());
    if a.allow_root_policy {
        plan.annotations.insert("policy.allow_root".into(), "true".into());
    }
    if !admitted.network.is_empty() {
        plan.annotations.insert(
            "policy.network".into(),
            "admitted destinations are not provided: the cage has no route out".into(),
        );
    }
    Ok((plan, held))
}

/// What the policy admits but this launch may not do, or what the operator must allow.
fn launch_violations(a: &RunArgs, admitted: &AdmittedPlan, receipts_required: bool) -> Vec<String> {
    let mut v = Vec::new();
    let command: Vec<String> = a.command.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if command != admitted.argv {
        v.push(format!("the command {command:?} is not the admitted argv {:?}", admitted.argv));
    }
    if admitted.mode == PolicyMode::Disabled {
        v.push("the policy's mode is disabled: chio never runs a command outside a cage".into());
    }
    if receipts_required && a.receipt_db.is_none() {
        v.push("the policy requires receipts: give --receipt-db and --kernel-key".into());
    }
    let root_host = matches!(&admitted.rootfs, Rootfs::Directory(d) if Path::new(d).components().count() <= 1);
    if (admitted.identity.uid == 0 || admitted.identity.gid == 0 || root_host) && !a.allow_root_policy {
        v.push("the policy runs as uid/gid 0 or on the host's / as root filesystem: pass --allow-root-policy (the receipt records it)".into());
    }
    for path in admitted.read_paths.iter().chain(&admitted.write_paths) {
        if path != "/workspace" && !path.starts_with("/workspace/") {
            v.push(format!("{path}: only paths under /workspace can be provided (from --workspace)"));
        }
    }
    if let Some(ws) = &a.workspace {
        for w in admitted.write_paths.iter().filter_map(|w| w.strip_prefix("/workspace/")) {
            if !ws.join(w).exists() {
                v.push(format!("write path /workspace/{w} does not exist in the workspace {}", ws.display()));
            }
        }
    }
    v
}

/// The cage plan of an admitted launch: nothing the policy did not admit.
fn build(a: &RunArgs, admitted: &AdmittedPlan) -> Result<(CagePlan, Option<std::fs::File>)> {
    let mut plan = CagePlan::new(admitted.argv.iter().map(OsString::from).collect());
    plan.mode = if admitted.mode == PolicyMode::Shadow { Mode::Shadow } else { Mode::Enforced };
    plan.expect_sha256 = Some(admitted.target_sha256.clone());
    let mut held = None;
    plan.root = match &admitted.rootfs {
        Rootfs::Directory(d) => RootSpec::Directory(PathBuf::from(d)),
        Rootfs::ImageId(id) => {
            let (store, rec) = crate::image_cmd::find(&a.state_dir, id)?;
            held = Some(store.hold(&rec).with_context(|| format!("image {id}"))?);
            RootSpec::Directory(store.rootfs(&rec))
        }
    };
    plan.uid = admitted.identity.uid;
    plan.gid = admitted.identity.gid;
    let c = &admitted.ceilings;
    let l = &mut plan.limits;
    (l.memory_bytes, l.swap_bytes, l.pids, l.cpu_millis) =
        (Some(c.memory_bytes), c.swap_bytes, Some(c.pids), Some(c.cpu_millis));
    (l.wall_ms, l.output_bytes, l.tmp_bytes) = (c.wall_ms, c.output_bytes, c.tmp_bytes);
    // Only the variables the manifest asked for (and the policy admitted), with chio's values.
    for name in &admitted.env {
        if let Some(v) = std::env::var_os(name) {
            plan.env.retain(|(k, _)| k != name.as_str());
            plan.env.push((name.into(), v));
        }
    }
    if let Some(ws) = &a.workspace {
        let ws = std::path::absolute(ws).with_context(|| format!("workspace {}", ws.display()))?;
        // Read-only, unless the whole workspace is admitted for writing; each admitted write
        // path below it is bound writable on its own.
        plan.workspace_read_only = !admitted.write_paths.iter().any(|w| w.trim_end_matches('/') == "/workspace");
        for w in admitted.write_paths.iter().filter_map(|w| w.strip_prefix("/workspace/")) {
            plan.binds.push(Bind { source: ws.join(w), dest: PathBuf::from("/workspace").join(w), writable: true });
        }
        plan.workspace = Some(ws);
        plan.cwd = PathBuf::from("/workspace");
    }
    chio_supervisor::launch_plan::apply_environment_overrides(&mut plan)?;
    Ok((plan, held))
}
