//! A launch under an operator-signed cage launch policy. Admission is `chio policy admit`'s; the
//! command must be exactly the admitted argv, and the plan is exactly the admitted one: of the
//! request's options only the command and the workspace count, and any other option set is a
//! violation (a policy launch cannot be widened by what else the request says).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use chio_cage::{Bind, CagePlan, Mode, RootSpec};
use chio_kernel::documents::{self, AdmittedPlan, PolicyMode, Rootfs};
use serde::{Deserialize, Serialize};

use super::LaunchError;
use crate::image::store::ImageStore;
use crate::launch_plan::PlanOptions;

/// The signed documents of a policy launch and what the operator allowed beyond them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyLaunch {
    /// The operator-signed cage launch policy, as read.
    pub policy: String,
    /// The publisher-signed tool manifest, as read.
    pub manifest: String,
    /// The operator's public key (64 hex digits) the policy must be signed by.
    pub signer: String,
    /// The publisher key the manifest must be signed by, when the caller pins one (preflight's
    /// launch material does); else the key the policy names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_key: Option<String>,
    /// Let the policy run as uid/gid 0 or on the host's `/` (recorded in the launch's receipts).
    #[serde(default)]
    pub allow_root: bool,
    /// The image store an admitted image id is looked up in (None: the launching process's
    /// own, see [`crate::state_dir`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_store: Option<PathBuf>,
    /// Whether the launch will be receipted (a policy requiring receipts refuses a launch that
    /// will not be).
    #[serde(default)]
    pub receipted: bool,
}

/// A policy and manifest verified under their pinned keys, and what admission said.
pub struct Checked {
    /// The verified policy.
    pub policy: documents::Policy,
    /// The verified manifest.
    pub manifest: documents::Manifest,
    /// The manifest body's digest.
    pub digest: String,
    /// The admitted plan, or every violation (admission's and this launch's).
    pub admitted: Result<Box<AdmittedPlan>, Vec<String>>,
}

/// The options a policy launch takes from its request (the command and the workspace); every
/// other option set is named, as a violation.
fn options_set_beside(o: &PlanOptions) -> Vec<&'static str> {
    let defaults = PlanOptions::new(o.argv.clone());
    let PlanOptions {
        argv: _,
        mode,
        net,
        rootfs,
        image,
        workspace: _,
        cwd,
        binds,
        env_files,
        env,
        uid,
        gid,
        limits,
        expect_sha256,
        annotations,
        tcp_ports,
    } = o;
    let set = [
        ("mode", *mode != defaults.mode),
        ("net", *net != defaults.net),
        ("rootfs", rootfs.is_some()),
        ("image", image.is_some()),
        ("cwd", cwd.is_some()),
        ("binds", !binds.is_empty()),
        ("env_files", !env_files.is_empty()),
        ("env", !env.is_empty()),
        ("uid", uid.is_some()),
        ("gid", gid.is_some()),
        ("limits", *limits != defaults.limits),
        ("expect_sha256", expect_sha256.is_some()),
        ("annotations", !annotations.is_empty()),
        ("tcp_ports", !tcp_ports.is_empty()),
    ];
    set.iter().filter(|(_, s)| *s).map(|(n, _)| *n).collect()
}

/// Verify the policy under its signer and the manifest under the publisher key the policy names,
/// then admit the launch `options` asks for.
pub fn check(options: &PlanOptions, p: &PolicyLaunch) -> Result<Checked, LaunchError> {
    let policy = documents::verify_policy(p.policy.as_bytes(), &p.signer)
        .map_err(|e| LaunchError::Policy(format!("the policy: {e}")))?;
    if let Some(pinned) = &p.manifest_key {
        if *pinned != policy.manifest.publisher_key {
            return Err(LaunchError::Policy(format!(
                "the policy admits manifests of publisher {}, not the pinned manifest key {pinned}",
                policy.manifest.publisher_key
            )));
        }
    }
    let (manifest, digest) = documents::verify_manifest(p.manifest.as_bytes(), &policy.manifest.publisher_key)
        .map_err(|e| LaunchError::Policy(format!("the manifest: {e}")))?;
    let admitted = match documents::admit(&manifest, &digest, &policy) {
        documents::Admission::Admitted(plan) => {
            let v = launch_violations(options, p, &plan, policy.receipts.required);
            if v.is_empty() {
                Ok(plan)
            } else {
                Err(v)
            }
        }
        documents::Admission::Refused(v) => Err(v),
    };
    Ok(Checked { policy, manifest, digest, admitted })
}

/// What the policy admits but this launch may not do, or what the operator must allow.
fn launch_violations(
    o: &PlanOptions,
    p: &PolicyLaunch,
    admitted: &AdmittedPlan,
    receipts_required: bool,
) -> Vec<String> {
    let mut v: Vec<String> = options_set_beside(o)
        .into_iter()
        .map(|name| format!("{name}: a policy launch takes only the command and the workspace from its request"))
        .collect();
    let command: Vec<String> = o.argv.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if command != admitted.argv {
        v.push(format!("the command {command:?} is not the admitted argv {:?}", admitted.argv));
    }
    if admitted.mode == PolicyMode::Disabled {
        v.push("the policy's mode is disabled: chio never runs a command outside a cage".into());
    }
    if receipts_required && !p.receipted {
        v.push("the policy requires receipts: give --receipt-db and --kernel-key".into());
    }
    let root_host = matches!(&admitted.rootfs, Rootfs::Directory(d) if Path::new(d).components().count() <= 1);
    if (admitted.identity.uid == 0 || admitted.identity.gid == 0 || root_host) && !p.allow_root {
        v.push("the policy runs as uid/gid 0 or on the host's / as root filesystem: pass --allow-root-policy (the receipt records it)".into());
    }
    for path in admitted.read_paths.iter().chain(&admitted.write_paths) {
        if path != "/workspace" && !path.starts_with("/workspace/") {
            v.push(format!("{path}: only paths under /workspace can be provided (from --workspace)"));
        }
    }
    if let Some(ws) = &o.workspace {
        for w in admitted.write_paths.iter().filter_map(|w| w.strip_prefix("/workspace/")) {
            if !ws.join(w).exists() {
                v.push(format!("write path /workspace/{w} does not exist in the workspace {}", ws.display()));
            }
        }
    }
    v
}

/// The cage plan of a checked, admitted launch (and the hold on its image), annotated with what
/// admitted it: nothing the policy did not admit.
pub fn admitted_plan(
    o: &PlanOptions,
    p: &PolicyLaunch,
    c: &Checked,
    admitted: &AdmittedPlan,
) -> Result<(CagePlan, Option<std::fs::File>), LaunchError> {
    let mut plan = CagePlan::new(admitted.argv.iter().map(OsString::from).collect());
    plan.mode = if admitted.mode == PolicyMode::Shadow { Mode::Shadow } else { Mode::Enforced };
    plan.expect_sha256 = Some(admitted.target_sha256.clone());
    let mut held = None;
    plan.root = match &admitted.rootfs {
        Rootfs::Directory(d) => RootSpec::Directory(PathBuf::from(d)),
        Rootfs::ImageId(id) => {
            let image = |e: std::io::Error| LaunchError::Plan(format!("image {id}: {e}"));
            let store_dir = crate::state_dir(p.image_store.as_deref());
            let store = ImageStore::open_existing(&store_dir)
                .map_err(|e| LaunchError::Plan(format!("image store {}: {e}", store_dir.display())))?;
            let rec = store.find(id).map_err(image)?;
            held = Some(store.hold(&rec).map_err(image)?);
            RootSpec::Directory(store.rootfs(&rec))
        }
    };
    plan.uid = admitted.identity.uid;
    plan.gid = admitted.identity.gid;
    let c_ = &admitted.ceilings;
    let l = &mut plan.limits;
    (l.memory_bytes, l.swap_bytes, l.pids, l.cpu_millis) =
        (Some(c_.memory_bytes), c_.swap_bytes, Some(c_.pids), Some(c_.cpu_millis));
    (l.wall_ms, l.output_bytes, l.tmp_bytes) = (c_.wall_ms, c_.output_bytes, c_.tmp_bytes);
    // Only the variables the manifest asked for (and the policy admitted), with chio's values.
    for name in &admitted.env {
        if let Some(v) = std::env::var_os(name) {
            plan.env.retain(|(k, _)| k != name.as_str());
            plan.env.push((name.into(), v));
        }
    }
    if let Some(ws) = &o.workspace {
        let ws = std::path::absolute(ws).map_err(|e| LaunchError::Plan(format!("workspace {}: {e}", ws.display())))?;
        // Read-only, unless the whole workspace is admitted for writing; each admitted write
        // path below it is bound writable on its own.
        plan.workspace_read_only = !admitted.write_paths.iter().any(|w| w.trim_end_matches('/') == "/workspace");
        for w in admitted.write_paths.iter().filter_map(|w| w.strip_prefix("/workspace/")) {
            plan.binds.push(Bind { source: ws.join(w), dest: PathBuf::from("/workspace").join(w), writable: true });
        }
        plan.workspace = Some(ws);
        plan.cwd = PathBuf::from("/workspace");
    }
    crate::launch_plan::apply_environment_overrides(&mut plan).map_err(|e| LaunchError::Plan(e.to_string()))?;
    plan.annotations.insert("policy.id".into(), c.policy.policy_id.clone());
    plan.annotations.insert("policy.manifest_sha256".into(), c.digest.clone());
    plan.annotations.insert("policy.server_id".into(), c.manifest.server_id.clone());
    if p.allow_root {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option but the command and the workspace is named when set beside a policy; the
    /// destructuring in `options_set_beside` stops compiling when `PlanOptions` gains a field,
    /// until someone decides whether a policy launch may take it.
    #[test]
    fn a_policy_launch_names_every_option_set_beside_it() {
        let base = PlanOptions::new(vec!["/usr/bin/tool".into()]);
        let mut with_workspace = base.clone();
        with_workspace.workspace = Some("/srv/ws".into());
        assert!(options_set_beside(&with_workspace).is_empty());
        type Set = Box<dyn Fn(&mut PlanOptions)>;
        let cases: Vec<(&str, Set)> = vec![
            ("mode", Box::new(|o| o.mode = Mode::Shadow)),
            ("net", Box::new(|o| o.net = chio_cage::NetMode::Loopback)),
            ("rootfs", Box::new(|o| o.rootfs = Some("/".into()))),
            (
                "image",
                Box::new(|o| {
                    o.image = Some(crate::launch_plan::ImageChoice {
                        store_dir: None,
                        reference: "app".into(),
                        entrypoint: None,
                    })
                }),
            ),
            ("cwd", Box::new(|o| o.cwd = Some("/".into()))),
            ("binds", Box::new(|o| o.binds.push(Bind { source: "/etc".into(), dest: "/e".into(), writable: false }))),
            ("env_files", Box::new(|o| o.env_files.push("/etc/environment".into()))),
            ("env", Box::new(|o| o.env.push("A=1".into()))),
            ("uid", Box::new(|o| o.uid = Some(0))),
            ("gid", Box::new(|o| o.gid = Some(0))),
            ("limits", Box::new(|o| o.limits.memory_bytes = None)),
            ("expect_sha256", Box::new(|o| o.expect_sha256 = Some("00".into()))),
            ("annotations", Box::new(|o| drop(o.annotations.insert("k".into(), "v".into())))),
            ("tcp_ports", Box::new(|o| o.tcp_ports.push(80))),
        ];
        for (name, set) in cases {
            let mut o = base.clone();
            set(&mut o);
            assert_eq!(options_set_beside(&o), vec![name]);
        }
    }
}
