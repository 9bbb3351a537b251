//! A session's configuration (what the operator asks for), the provisioning request derived from
//! it (what running it would need — it grants nothing) and the signed authorization that admits
//! exactly that request.

use std::collections::BTreeMap;
use std::path::PathBuf;

use chio_cage::Limits;
use chio_kernel::envelope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::repository::workspace::{json_digest, RepoError};

/// Schema of a session configuration.
pub const CONFIG_SCHEMA: &str = "chio.session.v1";
/// Schema of a provisioning request.
pub const REQUEST_SCHEMA: &str = "chio.session.provisioning-request.v1";
/// Schema of an operator's authorization of one request.
pub const AUTHORIZATION_SCHEMA: &str = "chio.session-authorization.v1";
/// The leg's shell: every repository command is this argv plus one operand, the command.
pub const COMMAND_ARGV_PREFIX: [&str; 4] = ["/bin/bash", "--noprofile", "--norc", "-c"];

/// What the operator configures (`session init --config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionConfig {
    /// Always [`CONFIG_SCHEMA`].
    pub schema: String,
    /// The source repository (a checkout or a bare repository).
    pub repository: PathBuf,
    /// A branch, tag or commit id (resolved to a commit at init).
    pub revision: String,
    /// The literal source paths.
    pub source_paths: Vec<String>,
    /// Build output kept out of snapshots (see the repository leg).
    #[serde(default)]
    pub scratch_paths: Vec<String>,
    /// The execution image (reference or id; `None`: the host's system directories).
    #[serde(default)]
    pub image: Option<String>,
    /// The image store (default $CHIO_STATE_DIR or /var/lib/chio).
    #[serde(default)]
    pub image_store: Option<PathBuf>,
    /// Deadline of each repository command, 1–300 s.
    pub command_timeout_s: u64,
    /// The agent's limits.
    pub agent: AgentLimits,
    /// The model behind the gateway.
    pub model: ModelSettings,
    /// How the worker (the agent process) runs.
    pub worker: WorkerSettings,
}

/// The agent's limits; the leg and the gateway enforce them too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLimits {
    /// Model calls at most, and repository commands at most, in one run.
    pub step_limit: u32,
    /// The worker's wall-clock deadline in seconds.
    pub wall_time_s: u64,
}

/// The provider the gateway forwards to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// The model name sent to the provider.
    pub name: String,
    /// OpenAI-compatible base URL (`…/v1`), http or https.
    pub base_url: String,
    /// The variable of `session run`'s environment holding the provider credential (only the
    /// gateway ever sees its value).
    pub credential_env: String,
    /// What the session may spend at the provider (none: only the step limit bounds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// The provider's prices and the session's spending ceilings, in whole numbers: millionths of a
/// US dollar (µUSD) and tokens. The gateway refuses a call that could pass them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// The price of a million prompt tokens, in µUSD (0.40 USD: 400000).
    pub input_microusd_per_mtok: u64,
    /// The price of a million completion tokens, in µUSD.
    pub output_microusd_per_mtok: u64,
    /// The most completion tokens one call may ask for; a call that names none is sent asking
    /// for this many (`max_tokens`).
    pub max_output_tokens: u64,
    /// The session's ceiling in µUSD: a call whose worst case (every byte of its request a
    /// prompt token, all of `max_output_tokens` used) would take the spend past it is refused.
    pub max_cost_microusd: u64,
}

impl Budget {
    /// The cost in µUSD of `prompt` and `completion` tokens (rounded up).
    pub fn cost(&self, prompt: u64, completion: u64) -> u64 {
        let micro = u128::from(prompt) * u128::from(self.input_microusd_per_mtok)
            + u128::from(completion) * u128::from(self.output_microusd_per_mtok);
        u64::try_from(micro.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

/// The worker's cage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// The worker image (reference or id; `None`: the host's system directories).
    #[serde(default)]
    pub image: Option<String>,
    /// The Python that has mini-swe-agent and chio_minisweagent, inside the worker's root.
    #[serde(default = "default_python")]
    pub python: PathBuf,
    /// Host directories bound read-only at the same path (a virtualenv, a package checkout).
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    /// Extra environment of the worker (no credential may be named here).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_python() -> PathBuf {
    PathBuf::from("/usr/bin/python3")
}

fn usage(m: impl Into<String>) -> RepoError {
    RepoError::Usage(m.into())
}

impl SessionConfig {
    /// Parse and check a configuration.
    pub fn parse(bytes: &[u8]) -> Result<SessionConfig, RepoError> {
        let c: SessionConfig =
            serde_json::from_slice(bytes).map_err(|e| usage(format!("not a session configuration: {e}")))?;
        if c.schema != CONFIG_SCHEMA {
            return Err(usage(format!("configuration schema {:?} is not {CONFIG_SCHEMA}", c.schema)));
        }
        if !(1..=300).contains(&c.command_timeout_s) {
            return Err(usage("command_timeout_s: give 1 to 300 seconds"));
        }
        if !(1..=1000).contains(&c.agent.step_limit) {
            return Err(usage("agent.step_limit: give 1 to 1000"));
        }
        if !(1..=86_400).contains(&c.agent.wall_time_s) {
            return Err(usage("agent.wall_time_s: give 1 to 86400 seconds"));
        }
        let url = &c.model.base_url;
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.chars().any(char::is_whitespace) {
            return Err(usage(format!("model.base_url {url:?}: give an http:// or https:// URL")));
        }
        check_env_name("model.credential_env", &c.model.credential_env)?;
        if let Some(b) = &c.model.budget {
            if b.max_output_tokens == 0 || b.max_output_tokens > 1 << 24 {
                return Err(usage("model.budget.max_output_tokens: give 1 to 16777216"));
            }
            let price = 1_000_000_000_000u64; // a million dollars a million tokens: a typo
            if b.input_microusd_per_mtok > price || b.output_microusd_per_mtok > price {
                return Err(usage("model.budget: a price above 1000000 USD a million tokens is a typo"));
            }
        }
        for (k, v) in &c.worker.env {
            check_env_name("worker.env", k)?;
            if v.contains('\0') {
                return Err(usage(format!("worker.env {k}: a NUL byte")));
            }
        }
        if c.worker.env.contains_key(&c.model.credential_env) {
            return Err(usage(format!(
                "worker.env names {}, the provider credential: the worker never holds it",
                c.model.credential_env
            )));
        }
        for p in c.worker.read_only_paths.iter().chain([&c.worker.python]) {
            if !p.is_absolute() {
                return Err(usage(format!("worker path {} is not absolute", p.display())));
            }
        }
        for p in &c.worker.read_only_paths {
            check_bindable(p)?;
        }
        Ok(c)
    }

    /// At `init`, before anyone signs: every worker path can be bound as it is named (it exists,
    /// no link on the way: a bind source is never reached through one).
    pub fn check_paths_exist(&self) -> Result<(), RepoError> {
        bindable_now(&self.worker.read_only_paths)
    }

    /// The configuration's digest (`sha256:` over its RFC 8785 bytes).
    pub fn digest(&self) -> Result<String, RepoError> {
        json_digest(self)
    }
}

/// Each of `paths` exists and is reached through no link (see [`SessionConfig::check_paths_exist`]).
fn bindable_now(paths: &[std::path::PathBuf]) -> Result<(), RepoError> {
    for p in paths {
        chio_cage::path::open_host(p, libc::O_PATH).map_err(|e| {
            usage(format!("worker.read_only_paths {}: {e}; it cannot be bound into the worker's cage", p.display()))
        })?;
    }
    Ok(())
}

/// A worker path is bound at its own path: refused where the worker's cage cannot hold a bind —
/// `/`, `..`, under `/proc` or `/dev` (the cage makes them itself), or at or under the session's
/// own mounts.
fn check_bindable(p: &std::path::Path) -> Result<(), RepoError> {
    let refuse = |why: &str| {
        usage(format!("worker.read_only_paths {}: {why}; it cannot be bound into the worker's cage", p.display()))
    };
    let names = chio_cage::path::components(p).map_err(|e| refuse(&e.to_string()))?;
    let Some(first) = names.first().and_then(|n| n.to_str()) else { return Err(refuse("it is /")) };
    if matches!(first, "proc" | "dev") {
        return Err(refuse("it lies under /proc or /dev, which the cage makes itself"));
    }
    let own = [super::run::RUN_MOUNT, super::run::OUT_MOUNT];
    if own.iter().any(|m| p.starts_with(m)) {
        return Err(refuse("it lies under the session's own mounts"));
    }
    Ok(())
}

fn check_env_name(what: &str, k: &str) -> Result<(), RepoError> {
    let ok = !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(usage(format!("{what}: {k:?} is not a variable name")))
    }
}

/// What running the session needs: the exact commands, images, limits and digests. Written at
/// init; grants nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisioningRequest {
    /// Always [`REQUEST_SCHEMA`].
    pub schema: String,
    /// Random id of this session.
    pub session_id: String,
    /// Digest of the session configuration.
    pub session_config: String,
    /// SHA-256 of the task text.
    pub task_sha256: String,
    /// The repository workspace: its configuration digest (bound by every receipt), commit,
    /// scope and image.
    pub workspace: RequestedWorkspace,
    /// Repository commands: `argv_prefix` plus one operand, in a cage with these limits.
    pub commands: RequestedCommands,
    /// The worker's cage.
    pub worker: RequestedWorker,
    /// The agent's limits.
    pub agent: AgentLimits,
    /// The provider (the credential is named, never included).
    pub model: ModelSettings,
}

/// The workspace part of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedWorkspace {
    /// Digest of the workspace configuration.
    pub config_digest: String,
    /// The source commit.
    pub source_commit: String,
    /// The scope.
    pub source_paths: Vec<String>,
    /// Paths never snapshotted.
    pub scratch_paths: Vec<String>,
    /// The execution image id (`None`: the host's system directories).
    pub image_id: Option<String>,
}

/// The commands part of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedCommands {
    /// `/bin/bash --noprofile --norc -c`; the command is the one operand after it.
    pub argv_prefix: Vec<String>,
    /// uid commands run as.
    pub uid: u32,
    /// gid commands run as.
    pub gid: u32,
    /// The cage ceilings of each command.
    pub limits: Limits,
    /// The deadline of each command in seconds.
    pub deadline_s: u64,
    /// Network: always `none`.
    pub network: String,
}

/// The worker part of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedWorker {
    /// The worker's argv.
    pub argv: Vec<String>,
    /// The worker image id (`None`: the host's system directories).
    pub image_id: Option<String>,
    /// Host directories bound read-only.
    pub read_only_paths: Vec<PathBuf>,
    /// The worker's environment names (values are in the session configuration).
    pub env: Vec<String>,
    /// uid the worker runs as.
    pub uid: u32,
    /// Network: its own namespace, loopback only (the model is reached through the gateway's
    /// socket, by way of a forwarder on one loopback port).
    pub network: String,
    /// The worker's wall-clock deadline in seconds.
    pub wall_time_s: u64,
    /// The worker cage's ceilings.
    pub limits: Limits,
}

/// The signed body an operator gives `session prepare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Authorization {
    /// Always [`AUTHORIZATION_SCHEMA`].
    pub schema: String,
    /// Only `enforced` runs anything.
    pub mode: String,
    /// Digest of `request`.
    pub request_sha256: String,
    /// The request authorized, in full (so the operator signs what they read).
    pub request: ProvisioningRequest,
    /// The grant's own limits, beyond the request's.
    #[serde(default, skip_serializing_if = "Grant::is_open")]
    pub grant: Grant,
}

/// What the operator limits the grant to when signing (`session authorize --max-calls
/// --max-attempts --valid-for`); each absent limit leaves the request's own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Model calls answered in the whole session, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    /// Requests sent to the provider in the whole session, at most: answered, refused by the
    /// provider and sent again alike (each may be billed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u64>,
    /// The grant's end (RFC 3339, UTC): no run starts, no model call is made and no command runs
    /// after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
}

impl Grant {
    fn is_open(&self) -> bool {
        *self == Grant::default()
    }

    /// The refusal when the grant has ended at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> Option<String> {
        let end = self.not_after.as_deref()?;
        match chio_kernel::time::parse_rfc3339(end) {
            Some(t) if now_ms <= t => None,
            Some(_) => Some(format!("the operator's authorization ended at {end} (not_after)")),
            None => Some(format!("the authorization's not_after {end:?} is no time")),
        }
    }
}

/// Build the authorization body for `request` under `grant` (what `session authorize` signs).
pub fn authorization_for(request: &ProvisioningRequest, grant: Grant) -> Result<Authorization, RepoError> {
    Ok(Authorization {
        schema: AUTHORIZATION_SCHEMA.into(),
        mode: "enforced".into(),
        request_sha256: json_digest(request)?,
        request: request.clone(),
        grant,
    })
}

/// Verify a signed authorization under the pinned operator key and admit it against this
/// session's request: every violation is named.
pub fn admit(signed: &[u8], operator_key_hex: &str, request: &ProvisioningRequest) -> Result<Authorization, RepoError> {
    let body: Value = envelope::verify(signed, operator_key_hex)
        .map_err(|e| RepoError::Refused(format!("the authorization does not verify: {e}")))?;
    let auth: Authorization =
        serde_json::from_value(body).map_err(|e| RepoError::Refused(format!("not a session authorization: {e}")))?;
    let mut violations = Vec::new();
    if auth.schema != AUTHORIZATION_SCHEMA {
        violations.push(format!("schema {:?} is not {AUTHORIZATION_SCHEMA}", auth.schema));
    }
    if auth.mode != "enforced" {
        violations.push(format!(
            "mode {:?}: a session runs only under an enforced authorization (no command ever runs outside a cage)",
            auth.mode
        ));
    }
    let ours = json_digest(request)?;
    if auth.request_sha256 != json_digest(&auth.request)? {
        violations.push("request_sha256 is not the digest of the request it carries".into());
    }
    if auth.request_sha256 != ours {
        violations.push(format!(
            "it authorizes request {} (session {}), not this session's request {ours}",
            auth.request_sha256, auth.request.session_id
        ));
    }
    if violations.is_empty() {
        Ok(auth)
    } else {
        Err(RepoError::Refused(format!("the authorization is not admitted: {}", violations.join("; "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chio_kernel::keys;

    /// A worker path the worker's cage cannot hold a bind at is refused when the configuration
    /// is read, before anyone signs; a path under /tmp or any other is taken.
    #[test]
    fn a_worker_path_that_cannot_be_bound_is_refused_up_front() {
        for bad in ["/", "/proc/self", "/dev/shm/x", "/chio-session/x", "/chio-out", "/a/../b"] {
            let e = check_bindable(std::path::Path::new(bad)).unwrap_err();
            assert!(e.to_string().contains("cannot be bound"), "{bad}: {e}");
        }
        for good in ["/tmp/checkout/target/msa-venv", "/opt/venv", "/chio-sessions"] {
            check_bindable(std::path::Path::new(good)).unwrap();
        }
        // At init: the path must be there, reached through no link.
        let dir = std::env::temp_dir().join(format!("chio-bindable-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&dir, dir.join("link")).unwrap();
        bindable_now(std::slice::from_ref(&dir)).unwrap();
        assert!(bindable_now(&[dir.join("absent")]).is_err());
        assert!(bindable_now(&[dir.join("link")]).unwrap_err().to_string().contains("cannot be bound"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn request() -> ProvisioningRequest {
        let agent = AgentLimits { step_limit: 4, wall_time_s: 60 };
        let model = ModelSettings {
            name: "m".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            credential_env: "K".into(),
            budget: None,
        };
        ProvisioningRequest {
            schema: REQUEST_SCHEMA.into(),
            session_id: "s1".into(),
            session_config: "sha256:00".into(),
            task_sha256: "00".into(),
            workspace: RequestedWorkspace {
                config_digest: "sha256:11".into(),
                source_commit: "c".into(),
                source_paths: vec!["p".into()],
                scratch_paths: vec![],
                image_id: None,
            },
            commands: RequestedCommands {
                argv_prefix: COMMAND_ARGV_PREFIX.iter().map(|s| s.to_string()).collect(),
                uid: 65534,
                gid: 65534,
                limits: Limits::default(),
                deadline_s: 60,
                network: "none".into(),
            },
            worker: RequestedWorker {
                argv: vec![],
                image_id: None,
                read_only_paths: vec![],
                env: vec![],
                uid: 65534,
                network: "loopback".into(),
                wall_time_s: 60,
                limits: Limits::default(),
            },
            agent,
            model,
        }
    }

    fn signed(key: &chio_kernel::keys::SigningKey, auth: &Authorization) -> Vec<u8> {
        let body = serde_json::to_value(auth).unwrap();
        serde_json::to_vec(&envelope::sign(key, body).unwrap()).unwrap()
    }

    #[test]
    fn only_an_enforced_authorization_of_this_request_under_the_pinned_key_is_admitted() {
        let (operator, stranger) = (keys::generate().unwrap(), keys::generate().unwrap());
        let pinned = keys::hex(operator.verifying_key().as_bytes());
        let req = request();
        let auth = authorization_for(&req, Grant::default()).unwrap();
        admit(&signed(&operator, &auth), &pinned, &req).unwrap();

        let refused = |bytes: &[u8], why: &str| match admit(bytes, &pinned, &req) {
            Err(RepoError::Refused(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("{other:?}"),
        };
        refused(&signed(&stranger, &auth), "pinned key");
        refused(&signed(&operator, &Authorization { mode: "shadow".into(), ..auth.clone() }), "mode \"shadow\"");
        // Another session's request, correctly digested: not this one.
        let mut other = req.clone();
        other.commands.deadline_s = 300;
        refused(
            &signed(&operator, &authorization_for(&other, Grant::default()).unwrap()),
            "not this session's request",
        );
        // The request edited after its digest was taken.
        let forged = Authorization { request: other, ..auth.clone() };
        refused(&signed(&operator, &forged), "not the digest of the request");
    }

    #[test]
    fn a_configuration_cannot_hand_the_worker_the_credential() {
        let c = serde_json::json!({
            "schema": CONFIG_SCHEMA, "repository": "/r", "revision": "HEAD", "source_paths": ["p"],
            "command_timeout_s": 60, "agent": {"step_limit": 4, "wall_time_s": 60},
            "model": {"name": "m", "base_url": "https://x/v1", "credential_env": "KEY"},
            "worker": {"env": {"KEY": "x"}}
        });
        match SessionConfig::parse(c.to_string().as_bytes()) {
            Err(RepoError::Usage(m)) => assert!(m.contains("never holds it"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// The provider's URL is http(s) with no whitespace in it (a space could carry a second
    /// target past a reader of the request); the worker's python defaults to the system's.
    #[test]
    fn the_provider_url_is_one_plain_http_url() {
        let with_url = |url: &str| {
            let c = serde_json::json!({
                "schema": CONFIG_SCHEMA, "repository": "/r", "revision": "HEAD", "source_paths": ["p"],
                "command_timeout_s": 60, "agent": {"step_limit": 4, "wall_time_s": 60},
                "model": {"name": "m", "base_url": url, "credential_env": "KEY"}, "worker": {}
            });
            SessionConfig::parse(c.to_string().as_bytes())
        };
        for bad in ["https://x/v1 http://y/v1", "http://x/v1\n", "ftp://x/v1", "x/v1"] {
            match with_url(bad) {
                Err(RepoError::Usage(m)) => assert!(m.contains("give an http:// or https:// URL"), "{bad:?}: {m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let c = with_url("https://x/v1").unwrap();
        assert_eq!(c.worker.python, PathBuf::from("/usr/bin/python3"));
    }

    /// A variable name is a name: `A=B` would set another variable than the one named, an empty
    /// one or one with a space or a leading digit is no variable; control: `_K1` is.
    #[test]
    fn variable_names_are_names() {
        let with_names = |credential: &str, worker: &str| {
            let c = serde_json::json!({
                "schema": CONFIG_SCHEMA, "repository": "/r", "revision": "HEAD", "source_paths": ["p"],
                "command_timeout_s": 60, "agent": {"step_limit": 4, "wall_time_s": 60},
                "model": {"name": "m", "base_url": "https://x/v1", "credential_env": credential},
                "worker": {"env": {worker: "v"}}
            });
            SessionConfig::parse(c.to_string().as_bytes())
        };
        for bad in ["", "1K", "A=B", "A B", "A-B", "K\u{e9}"] {
            for (what, r) in [("model.credential_env", with_names(bad, "_W1")), ("worker.env", with_names("_K1", bad))]
            {
                match r {
                    Err(RepoError::Usage(m)) => {
                        assert!(m.contains(what) && m.contains("is not a variable name"), "{m}")
                    }
                    other => panic!("{what} {bad:?}: {other:?}"),
                }
            }
        }
        with_names("_K1", "_W1").unwrap();
    }
}
