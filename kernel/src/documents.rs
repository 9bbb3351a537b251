//! The signed documents: a publisher's tool manifest (`chio.tool-manifest.v1`) and an operator's
//! cage launch policy (`chio.cage-launch-policy.v1`), and admission — the manifest's request must
//! fit inside the policy's ceilings, its target and argv must be exactly the policy's, and its
//! digest and publisher must be the ones the policy names. Unknown fields are refused and every
//! list and string is bounded.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical;
use crate::envelope::{self, EnvelopeError};
use crate::receipt::sha256_hex;

/// Schema of a tool manifest body.
pub const MANIFEST_SCHEMA: &str = "chio.tool-manifest.v1";
/// Schema of a cage launch policy body.
pub const POLICY_SCHEMA: &str = "chio.cage-launch-policy.v1";
const MAX_LIST: usize = 256;
const MAX_STRING: usize = 4096;

/// A TCP destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// Syscall profiles, from most to least restrictive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyscallProfile {
    /// The default allow-list without process creation beyond threads.
    Strict,
    /// The cage's default allow-list.
    Default,
}

/// What a tool server asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Permissions {
    /// Paths it reads.
    pub read_paths: Vec<String>,
    /// Paths it writes.
    pub write_paths: Vec<String>,
    /// TCP destinations it connects to.
    pub network: Vec<Destination>,
    /// Environment variables it needs.
    pub env: Vec<String>,
    /// Syscall profile it needs.
    pub syscall_profile: SyscallProfile,
}

/// The executable of a tool server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    /// Absolute path inside the cage.
    pub path: String,
    /// SHA-256 of the executable (lowercase hex).
    pub sha256: String,
    /// Full argv, `argv[0]` first.
    pub argv: Vec<String>,
}

/// One tool a server offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Tool name.
    pub name: String,
    /// What it does.
    pub description: String,
}

/// A publisher-signed tool manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_SCHEMA`].
    pub schema: String,
    /// Stable server id.
    pub server_id: String,
    /// Display name.
    pub name: String,
    /// Version.
    pub version: String,
    /// Tools offered.
    pub tools: Vec<Tool>,
    /// The executable.
    pub target: TargetSpec,
    /// What it asks for.
    pub permissions: Permissions,
}

/// Enforcement mode of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyMode {
    /// Confinement failures deny.
    Enforced,
    /// Runs, but receipts say "not confined".
    Shadow,
    /// No cage (must be asked for explicitly).
    Disabled,
}

/// Which manifest a policy admits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmittedManifest {
    /// SHA-256 of the manifest's canonical body.
    pub sha256: String,
    /// The publisher key that must have signed it.
    pub publisher_key: String,
}

/// The most a launch may have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ceilings {
    /// Readable path prefixes.
    pub read_paths: Vec<String>,
    /// Writable path prefixes.
    pub write_paths: Vec<String>,
    /// Allowed TCP destinations.
    pub network: Vec<Destination>,
    /// Environment variables that may be passed.
    pub env: Vec<String>,
    /// Least restrictive syscall profile allowed.
    pub syscall_profile: SyscallProfile,
    /// Memory ceiling.
    pub memory_bytes: u64,
    /// Extra swap.
    pub swap_bytes: u64,
    /// Task ceiling.
    pub pids: u64,
    /// CPU in thousandths.
    pub cpu_millis: u64,
    /// Wall-clock ceiling.
    pub wall_ms: u64,
    /// Output kept per stream.
    pub output_bytes: u64,
    /// /tmp size.
    pub tmp_bytes: u64,
}

/// Identity the target runs as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
}

/// Root filesystem of the launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Rootfs {
    /// An imported image, by id (config digest).
    ImageId(String),
    /// A directory.
    Directory(String),
}

/// Receipt settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptSettings {
    /// Refuse to launch without a receipt store.
    pub required: bool,
}

/// An operator-signed cage launch policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Always [`POLICY_SCHEMA`].
    pub schema: String,
    /// Stable policy id.
    pub policy_id: String,
    /// Enforcement mode.
    pub mode: PolicyMode,
    /// The manifest admitted.
    pub manifest: AdmittedManifest,
    /// Exact target path and argv admitted.
    pub launch: LaunchSpec,
    /// Ceilings.
    pub ceilings: Ceilings,
    /// Execution identity.
    pub identity: Identity,
    /// Root filesystem.
    pub rootfs: Rootfs,
    /// Receipts.
    pub receipts: ReceiptSettings,
}

/// Exact path and argv a policy admits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    /// Path inside the cage.
    pub path: String,
    /// Full argv.
    pub argv: Vec<String>,
}

/// Why a document was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocumentError {
    /// Signature, key or envelope problem.
    Envelope(EnvelopeError),
    /// The body does not match the schema: field path and reason.
    Schema(String),
}

impl std::fmt::Display for DocumentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DocumentError::Envelope(e) => write!(f, "{e}"),
            DocumentError::Schema(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DocumentError {}

fn check_strings(v: &Value, at: &str) -> Result<(), DocumentError> {
    match v {
        Value::String(s) if s.len() > MAX_STRING => {
            Err(DocumentError::Schema(format!("{at}: string longer than {MAX_STRING} bytes")))
        }
        Value::Array(a) if a.len() > MAX_LIST => {
            Err(DocumentError::Schema(format!("{at}: list longer than {MAX_LIST} entries")))
        }
        Value::Array(a) => a.iter().enumerate().try_for_each(|(i, x)| check_strings(x, &format!("{at}[{i}]"))),
        Value::Object(m) => m.iter().try_for_each(|(k, x)| check_strings(x, &format!("{at}.{k}"))),
        _ => Ok(()),
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Parse and validate a manifest body.
pub fn manifest_from(v: Value) -> Result<Manifest, DocumentError> {
    check_strings(&v, "manifest")?;
    let m: Manifest = serde_json::from_value(v).map_err(|e| DocumentError::Schema(format!("manifest: {e}")))?;
    if m.schema != MANIFEST_SCHEMA {
        return Err(DocumentError::Schema(format!("manifest.schema: {:?} is not {MANIFEST_SCHEMA}", m.schema)));
    }
    if !is_hex64(&m.target.sha256) {
        return Err(DocumentError::Schema("manifest.target.sha256: not 64 lowercase hex digits".into()));
    }
    if !m.target.path.starts_with('/') || m.target.argv.is_empty() {
        return Err(DocumentError::Schema("manifest.target: path must be absolute and argv non-empty".into()));
    }
    Ok(m)
}

/// Parse and validate a policy body.
pub fn policy_from(v: Value) -> Result<Policy, DocumentError> {
    check_strings(&v, "policy")?;
    let p: Policy = serde_json::from_value(v).map_err(|e| DocumentError::Schema(format!("policy: {e}")))?;
    if p.schema != POLICY_SCHEMA {
        return Err(DocumentError::Schema(format!("policy.schema: {:?} is not {POLICY_SCHEMA}", p.schema)));
    }
    if !is_hex64(&p.manifest.sha256) || !is_hex64(&p.manifest.publisher_key) {
        return Err(DocumentError::Schema(
            "policy.manifest: sha256 and publisher_key must be 64 lowercase hex digits".into(),
        ));
    }
    for (field, paths) in [("read_paths", &p.ceilings.read_paths), ("write_paths", &p.ceilings.write_paths)] {
        if let Some(bad) = paths.iter().find(|c| !c.starts_with('/') || c.split('/').any(|x| x == "..")) {
            return Err(DocumentError::Schema(format!(
                "policy.ceilings.{field}: {bad:?} is not an absolute path without '..' (write \"/\" for everything)"
            )));
        }
    }
    Ok(p)
}

/// SHA-256 of a document body's canonical bytes (what a policy pins a manifest by).
pub fn body_digest(body: &Value) -> Result<String, DocumentError> {
    let c = canonical::to_canonical(body).map_err(|e| DocumentError::Envelope(EnvelopeError::Canonical(e)))?;
    Ok(sha256_hex(c.as_bytes()))
}

/// Verify a signed manifest under the pinned publisher key.
pub fn verify_manifest(bytes: &[u8], publisher_key: &str) -> Result<(Manifest, String), DocumentError> {
    let body = envelope::verify(bytes, publisher_key).map_err(DocumentError::Envelope)?;
    let digest = body_digest(&body)?;
    Ok((manifest_from(body)?, digest))
}

/// Verify a signed policy under the pinned operator key.
pub fn verify_policy(bytes: &[u8], operator_key: &str) -> Result<Policy, DocumentError> {
    policy_from(envelope::verify(bytes, operator_key).map_err(DocumentError::Envelope)?)
}

/// `path` lies at or beneath `prefix`, by whole components (`/` holds everything; an empty
/// prefix holds nothing — policies refuse one anyway).
fn beneath(path: &str, prefix: &str) -> bool {
    if prefix.is_empty() {
        return false;
    }
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty() || path == prefix || path.starts_with(&format!("{prefix}/"))
}

/// What admission hands to the launcher: everything a cage plan needs, from the two documents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdmittedPlan {
    /// Tool server id.
    pub server_id: String,
    /// Policy that admitted it.
    pub policy_id: String,
    /// SHA-256 of the admitted manifest body.
    pub manifest_sha256: String,
    /// Enforcement mode.
    pub mode: PolicyMode,
    /// Executable path inside the cage.
    pub target_path: String,
    /// Digest the executable must have (the cage checks it at launch).
    pub target_sha256: String,
    /// Full argv.
    pub argv: Vec<String>,
    /// Environment variables the target may receive (the manifest's request).
    pub env: Vec<String>,
    /// Paths readable / writable (the manifest's request).
    pub read_paths: Vec<String>,
    /// Writable paths.
    pub write_paths: Vec<String>,
    /// TCP destinations.
    pub network: Vec<Destination>,
    /// Ceilings from the policy.
    pub ceilings: Ceilings,
    /// Identity from the policy.
    pub identity: Identity,
    /// Root filesystem from the policy.
    pub rootfs: Rootfs,
}

/// Admission's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Admitted, with the plan description.
    Admitted(Box<AdmittedPlan>),
    /// Refused, naming every violation.
    Refused(Vec<String>),
}

/// Admit `m` (with body digest `digest`) under `p`, or name every violation.
pub fn admit(m: &Manifest, digest: &str, p: &Policy) -> Admission {
    let violations = admission_violations(m, digest, p);
    if !violations.is_empty() {
        return Admission::Refused(violations);
    }
    Admission::Admitted(Box::new(AdmittedPlan {
        server_id: m.server_id.clone(),
        policy_id: p.policy_id.clone(),
        manifest_sha256: digest.to_string(),
        mode: p.mode,
        target_path: m.target.path.clone(),
        target_sha256: m.target.sha256.clone(),
        argv: m.target.argv.clone(),
        env: m.permissions.env.clone(),
        read_paths: m.permissions.read_paths.clone(),
        write_paths: m.permissions.write_paths.clone(),
        network: m.permissions.network.clone(),
        ceilings: p.ceilings.clone(),
        identity: p.identity.clone(),
        rootfs: p.rootfs.clone(),
    }))
}

/// Every way `m` (with body digest `digest`) exceeds `p`. Empty means admitted.
pub fn admission_violations(m: &Manifest, digest: &str, p: &Policy) -> Vec<String> {
    let mut v = Vec::new();
    if digest != p.manifest.sha256 {
        v.push(format!("manifest digest {digest} is not the policy's {}", p.manifest.sha256));
    }
    if m.target.path != p.launch.path {
        v.push(format!("target path {} is not the admitted {}", m.target.path, p.launch.path));
    }
    if m.target.argv != p.launch.argv {
        v.push(format!("argv {:?} is not the admitted {:?}", m.target.argv, p.launch.argv));
    }
    let dotdot = |s: &str| s.split('/').any(|c| c == "..");
    for (kind, asked, allowed) in [
        ("read", &m.permissions.read_paths, &p.ceilings.read_paths),
        ("write", &m.permissions.write_paths, &p.ceilings.write_paths),
    ] {
        for path in asked {
            if dotdot(path) || !path.starts_with('/') || !allowed.iter().any(|a| beneath(path, a)) {
                v.push(format!("{kind} path {path} is outside the policy's {kind} ceiling"));
            }
        }
    }
    for d in &m.permissions.network {
        if !p.ceilings.network.contains(d) {
            v.push(format!("network destination {}:{} is not allowed", d.host, d.port));
        }
    }
    for e in &m.permissions.env {
        if !p.ceilings.env.contains(e) {
            v.push(format!("environment variable {e} is not allowed"));
        }
    }
    if m.permissions.syscall_profile > p.ceilings.syscall_profile {
        v.push(format!(
            "syscall profile {:?} is less restrictive than the policy's {:?}",
            m.permissions.syscall_profile, p.ceilings.syscall_profile
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;
    use serde_json::json;

    pub(crate) fn manifest_body() -> Value {
        json!({
            "schema": MANIFEST_SCHEMA, "server_id": "files", "name": "File tools", "version": "1.0.0",
            "tools": [{"name": "read_file", "description": "Read a file"}],
            "target": {"path": "/usr/bin/files-server", "sha256": "a".repeat(64), "argv": ["/usr/bin/files-server", "--stdio"]},
            "permissions": {"read_paths": ["/workspace/src"], "write_paths": ["/workspace/out"],
                "network": [], "env": ["LANG"], "syscall_profile": "default"}
        })
    }

    fn policy_body(digest: &str, publisher: &str) -> Value {
        json!({
            "schema": POLICY_SCHEMA, "policy_id": "files-prod", "mode": "enforced",
            "manifest": {"sha256": digest, "publisher_key": publisher},
            "launch": {"path": "/usr/bin/files-server", "argv": ["/usr/bin/files-server", "--stdio"]},
            "ceilings": {"read_paths": ["/workspace"], "write_paths": ["/workspace/out"], "network": [],
                "env": ["LANG", "TZ"], "syscall_profile": "default", "memory_bytes": 536870912, "swap_bytes": 0,
                "pids": 64, "cpu_millis": 1000, "wall_ms": 300000, "output_bytes": 524288, "tmp_bytes": 16777216},
            "identity": {"uid": 65534, "gid": 65534},
            "rootfs": {"image_id": "b".repeat(64)},
            "receipts": {"required": true}
        })
    }

    #[test]
    fn signed_manifest_and_policy_admit() {
        let publisher = keys::generate().unwrap();
        let operator = keys::generate().unwrap();
        let pk = keys::hex(publisher.verifying_key().as_bytes());
        let ok = keys::hex(operator.verifying_key().as_bytes());
        let m_env = serde_json::to_vec(&envelope::sign(&publisher, manifest_body()).unwrap()).unwrap();
        let (m, digest) = verify_manifest(&m_env, &pk).unwrap();
        let p_env = serde_json::to_vec(&envelope::sign(&operator, policy_body(&digest, &pk)).unwrap()).unwrap();
        let p = verify_policy(&p_env, &ok).unwrap();
        assert_eq!(admission_violations(&m, &digest, &p), Vec::<String>::new());
        let Admission::Admitted(plan) = admit(&m, &digest, &p) else { panic!("refused") };
        assert_eq!(
            (plan.target_sha256.as_str(), plan.identity.uid, plan.mode),
            ("a".repeat(64).as_str(), 65534, PolicyMode::Enforced)
        );
        assert!(
            matches!(verify_policy(&p_env, &pk), Err(DocumentError::Envelope(EnvelopeError::SignerMismatch { .. }))),
            "wrong key"
        );
    }

    #[test]
    fn an_empty_or_relative_ceiling_path_is_refused() {
        for bad in ["", "etc", "/workspace/../etc"] {
            let mut body = policy_body(&"c".repeat(64), &"d".repeat(64));
            body["ceilings"]["read_paths"] = json!([bad]);
            let e = policy_from(body).unwrap_err();
            assert!(matches!(&e, DocumentError::Schema(m) if m.contains("read_paths")), "{bad:?}: {e}");
        }
        assert!(!beneath("/etc/shadow", ""));
        assert!(beneath("/etc/shadow", "/"));
        assert!(beneath("/workspace/a", "/workspace/"));
        assert!(!beneath("/workspacefoo", "/workspace"));
    }

    #[test]
    fn every_violation_is_named() {
        let mut body = manifest_body();
        body["permissions"]["read_paths"] = json!(["/etc", "/workspace/../etc", "/workspacefoo"]);
        body["permissions"]["write_paths"] = json!(["/workspace/src"]);
        body["permissions"]["network"] = json!([{"host": "example.com", "port": 443}]);
        body["permissions"]["env"] = json!(["AWS_SECRET_ACCESS_KEY"]);
        body["target"]["argv"] = json!(["/usr/bin/files-server", "--evil"]);
        let m = manifest_from(body.clone()).unwrap();
        let p = policy_from(policy_body(&"c".repeat(64), &"d".repeat(64))).unwrap();
        let v = admission_violations(&m, &body_digest(&body).unwrap(), &p);
        for needle in [
            "digest",
            "argv",
            "/etc is outside",
            "../etc",
            "/workspacefoo",
            "write path /workspace/src",
            "example.com:443",
            "AWS_SECRET",
        ] {
            assert!(v.iter().any(|x| x.contains(needle)), "{needle} not in {v:?}");
        }
    }

    #[test]
    fn a_manifest_asking_a_wider_syscall_profile_than_the_policy_allows_is_refused() {
        let body = manifest_body();
        let digest = body_digest(&body).unwrap();
        let m = manifest_from(body).unwrap();
        let mut policy = policy_body(&digest, &"d".repeat(64));
        policy["launch"] = json!({"path": m.target.path, "argv": m.target.argv});
        let same = policy_from(policy.clone()).unwrap();
        assert_eq!(admission_violations(&m, &digest, &same), Vec::<String>::new(), "default under default");
        policy["ceilings"]["syscall_profile"] = json!("strict");
        let v = admission_violations(&m, &digest, &policy_from(policy).unwrap());
        assert!(v.iter().any(|x| x.contains("syscall profile Default is less restrictive")), "{v:?}");
    }

    #[test]
    fn digests_and_keys_must_be_64_lowercase_hex_digits() {
        for bad in ["a".repeat(63), "a".repeat(65), "A".repeat(64), "g".repeat(64), format!("{}/", "a".repeat(63))] {
            let mut body = manifest_body();
            body["target"]["sha256"] = json!(bad);
            let e = manifest_from(body).unwrap_err();
            assert!(e.to_string().contains("manifest.target.sha256: not 64 lowercase hex digits"), "{bad}: {e}");
            let e = policy_from(policy_body(&"c".repeat(64), &bad)).unwrap_err();
            assert!(e.to_string().contains("publisher_key must be 64 lowercase hex"), "{bad}: {e}");
            assert!(policy_from(policy_body(&bad, &"d".repeat(64))).is_err(), "{bad}");
        }
        let mut body = manifest_body();
        body["target"]["sha256"] = json!("0123456789abcdef".repeat(4));
        assert!(manifest_from(body).is_ok());
    }

    #[test]
    fn a_target_needs_an_absolute_path_and_an_argv() {
        for (path, argv) in [("usr/bin/files-server", json!(["x"])), ("/usr/bin/files-server", json!([]))] {
            let mut body = manifest_body();
            body["target"]["path"] = json!(path);
            body["target"]["argv"] = argv;
            let e = manifest_from(body).unwrap_err();
            assert!(e.to_string().contains("path must be absolute and argv non-empty"), "{path}: {e}");
        }
    }

    #[test]
    fn strings_and_lists_are_bounded_at_every_depth() {
        // At the bound: accepted. One past it, in a list inside an object: refused, named.
        let mut body = manifest_body();
        body["target"]["argv"] = json!(["/usr/bin/files-server", "x".repeat(MAX_STRING)]);
        body["permissions"]["env"] = json!(vec!["X"; MAX_LIST]);
        assert!(manifest_from(body.clone()).is_ok());
        body["target"]["argv"][1] = json!("x".repeat(MAX_STRING + 1));
        let e = manifest_from(body).unwrap_err();
        assert_eq!(e.to_string(), format!("manifest.target.argv[1]: string longer than {MAX_STRING} bytes"));
        let mut body = manifest_body();
        body["permissions"]["env"] = json!(vec!["X"; MAX_LIST + 1]);
        let e = manifest_from(body).unwrap_err();
        assert_eq!(e.to_string(), format!("manifest.permissions.env: list longer than {MAX_LIST} entries"));
    }

    #[test]
    fn unknown_fields_and_oversized_lists_are_refused() {
        let mut body = manifest_body();
        body["surprise"] = json!(true);
        assert!(matches!(manifest_from(body), Err(DocumentError::Schema(e)) if e.contains("surprise")));
        let mut body = manifest_body();
        body["permissions"]["env"] = json!(vec!["X"; 300]);
        assert!(matches!(manifest_from(body), Err(DocumentError::Schema(e)) if e.contains("manifest.permissions.env")));
        let mut body = manifest_body();
        body["schema"] = json!("chio.tool-manifest.v2");
        assert!(matches!(manifest_from(body), Err(DocumentError::Schema(e)) if e.contains("manifest.schema")));
    }
}
