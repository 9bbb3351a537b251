//! The daemon's own configuration (`/etc/chio/supervisor.json`): who may connect and as what,
//! the keys policies must be signed by, the kernel key, the bounds. Nothing a client sends can
//! change any of it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Context, Result};
use serde::{Deserialize, Serialize};

/// The schema name of the configuration file.
pub const SCHEMA: &str = "chio.supervisor-config.v1";

/// What a connecting peer may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Any `chio cage run` launch, as root could run it (root is always admin).
    Admin,
    /// Launches under a signed policy and manifest only, verified under the pinned signers.
    Launch,
    /// `chio repository execute` and `status` on the workspaces granted to its uid (an agent
    /// host or session runner on workspaces an operator made).
    Repository,
}

impl Role {
    /// The role's name in replies and logs.
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Launch => "launch",
            Role::Repository => "repository",
        }
    }
}

/// A rule mapping a peer's uid or gid to a role.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Client {
    /// The peer's uid.
    #[serde(default)]
    pub uid: Option<u32>,
    /// The peer's primary gid (SO_PEERCRED carries only that one).
    #[serde(default)]
    pub gid: Option<u32>,
    /// What it may do.
    pub role: Role,
}

/// A workspace a client uid with the repository role may use: run commands in, read the status
/// of, export (written with the client's own file system rights) and — from one of `sources`,
/// the repositories an operator lets it import — create.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceGrant {
    /// The client's uid.
    pub uid: u32,
    /// The workspace's state directory (absolute).
    pub state: PathBuf,
    /// Source repositories (absolute) the client may `init` this workspace from; none: only an
    /// admin creates it.
    #[serde(default)]
    pub sources: Vec<PathBuf>,
}

/// The configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Must be [`SCHEMA`].
    pub schema: String,
    /// Who may connect. Root may always connect, as admin.
    #[serde(default)]
    pub clients: Vec<Client>,
    /// Workspaces each client uid with the repository role may use.
    #[serde(default)]
    pub workspaces: Vec<WorkspaceGrant>,
    /// Operator keys (64 hex digits) a launch policy must be signed by.
    #[serde(default)]
    pub policy_signers: Vec<String>,
    /// The kernel's signing seed: every launch's receipts go to the daemon's store under it.
    #[serde(default)]
    pub kernel_key: Option<PathBuf>,
    /// Launches running at once; more wait their turn.
    #[serde(default = "default_max_launches")]
    pub max_launches: usize,
    /// Connections open at once; more are answered with an error and closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Launches one client uid may have running at once; more are refused ("try again"), so
    /// no one client takes every launch slot.
    #[serde(default = "default_max_launches_per_client")]
    pub max_launches_per_client: usize,
    /// Connections one client uid may have open at once.
    #[serde(default = "default_max_connections_per_client")]
    pub max_connections_per_client: usize,
    /// Seconds a client has to send its request line.
    #[serde(default = "default_request_timeout_s")]
    pub request_timeout_s: u64,
    /// Seconds running launches get to finish after SIGTERM before their cages are killed.
    #[serde(default = "default_stop_grace_s")]
    pub stop_grace_s: u64,
    /// Seconds a settled request's answer is kept for repeats of its id (then forgotten, so
    /// the journal does not grow without bound).
    #[serde(default = "default_journal_retention_s")]
    pub journal_retention_s: u64,
    /// Where the daemon serves its metrics (see [`MetricsAt`]); none: it serves none.
    #[serde(default)]
    pub metrics: Option<MetricsAt>,
}

/// Where the metrics endpoint listens: a loopback address and port (`"127.0.0.1:9464"`,
/// `"[::1]:9464"`) or the absolute path of a Unix socket (`"/run/chio/metrics.sock"`, given to
/// group chio, mode 0660). It answers anyone who can reach it, so it is never on an address
/// another host can reach: an operator who exports the figures puts a proxy in front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAt {
    /// A loopback address and port.
    Tcp(std::net::SocketAddr),
    /// A Unix socket's path.
    Unix(PathBuf),
}

impl MetricsAt {
    /// Read `text` as [`MetricsAt`]; an address another host could reach is refused.
    pub fn parse(text: &str) -> std::result::Result<MetricsAt, String> {
        if text.starts_with('/') {
            let path = PathBuf::from(text);
            if path.file_name().is_none() || path.components().any(|c| c == std::path::Component::ParentDir) {
                return Err(format!("metrics: {text:?} names no socket file (give an absolute path without ..)"));
            }
            return Ok(MetricsAt::Unix(path));
        }
        let addr: std::net::SocketAddr = text.parse().map_err(|_| {
            format!(
                "metrics: {text:?} is neither a loopback address with its port (127.0.0.1:9464, [::1]:9464) nor the \
                 absolute path of a Unix socket"
            )
        })?;
        if !addr.ip().is_loopback() {
            return Err(format!(
                "metrics: {addr} is not a loopback address: the endpoint answers without authentication, so it \
                 listens only on 127.0.0.1, ::1 or a Unix socket (put a proxy in front to export it)"
            ));
        }
        if addr.port() == 0 {
            return Err(format!("metrics: {addr}: give the port to listen on"));
        }
        Ok(MetricsAt::Tcp(addr))
    }
}

impl<'de> Deserialize<'de> for MetricsAt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<MetricsAt, D::Error> {
        let text = String::deserialize(d)?;
        MetricsAt::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for MetricsAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricsAt::Tcp(a) => write!(f, "http://{a}/metrics"),
            MetricsAt::Unix(p) => write!(f, "unix:{} /metrics", p.display()),
        }
    }
}

fn default_max_launches() -> usize {
    8
}
fn default_max_connections() -> usize {
    64
}
fn default_max_launches_per_client() -> usize {
    4
}
fn default_max_connections_per_client() -> usize {
    16
}
fn default_request_timeout_s() -> u64 {
    10
}
fn default_stop_grace_s() -> u64 {
    10
}
fn default_journal_retention_s() -> u64 {
    86_400
}

impl Default for Config {
    /// No configuration file: only root may connect; no receipts (said at start-up).
    fn default() -> Config {
        Config {
            schema: SCHEMA.into(),
            clients: Vec::new(),
            workspaces: Vec::new(),
            policy_signers: Vec::new(),
            kernel_key: None,
            max_launches: default_max_launches(),
            max_connections: default_max_connections(),
            max_launches_per_client: default_max_launches_per_client(),
            max_connections_per_client: default_max_connections_per_client(),
            request_timeout_s: default_request_timeout_s(),
            stop_grace_s: default_stop_grace_s(),
            journal_retention_s: default_journal_retention_s(),
            metrics: None,
        }
    }
}

impl Config {
    /// Read and check `path`: it must be a regular file that only root can write, in directories
    /// only root can change (a sticky one aside: there no one else can replace root's entry). The
    /// file is checked as opened (not followed if a link), and the open file is what is read.
    pub fn load(path: &Path) -> Result<Config> {
        use std::io::Read;
        let shown = path.display();
        let (mut file, meta) = open_root_owned(path).with_context(|| format!("supervisor configuration {shown}"))?;
        if !meta.is_file() {
            bail!("supervisor configuration {shown}: not a regular file");
        }
        if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            bail!(
                "supervisor configuration {shown}: owned by uid {} with mode {:o}; it decides who may launch as root, \
                 so it must be owned by root and writable by nobody else (chown root: and chmod go-w)",
                meta.uid(),
                meta.mode() & 0o7777
            );
        }
        let mut text = Vec::new();
        file.read_to_end(&mut text).with_context(|| format!("reading {shown}"))?;
        let c: Config = serde_json::from_slice(&text).with_context(|| format!("{shown}"))?;
        c.check().with_context(|| format!("{shown}"))?;
        Ok(c)
    }

    fn check(&self) -> Result<()> {
        if self.schema != SCHEMA {
            bail!("schema {:?}: expected {SCHEMA:?}", self.schema);
        }
        for (i, c) in self.clients.iter().enumerate() {
            if c.uid.is_none() == c.gid.is_none() {
                bail!("clients[{i}]: give exactly one of uid and gid");
            }
        }
        for (i, w) in self.workspaces.iter().enumerate() {
            if !w.state.is_absolute() {
                bail!("workspaces[{i}]: state {} must be an absolute path", w.state.display());
            }
            if let Some(s) = w.sources.iter().find(|s| !s.is_absolute()) {
                bail!("workspaces[{i}]: source {} must be an absolute path", s.display());
            }
        }
        for k in &self.policy_signers {
            chio_kernel::keys::public_key(k).with_context(|| format!("policy_signers: {k:?} is not a public key"))?;
        }
        let bounds =
            [self.max_launches, self.max_connections, self.max_launches_per_client, self.max_connections_per_client];
        if bounds.contains(&0) || self.request_timeout_s == 0 {
            bail!("max_launches, max_connections, their _per_client limits and request_timeout_s must be at least 1");
        }
        Ok(())
    }

    /// The role of a peer, or None: not allowed to connect. A uid rule wins over a gid rule.
    pub fn role_of(&self, uid: u32, gid: u32) -> Option<Role> {
        if uid == 0 {
            return Some(Role::Admin);
        }
        let by_uid = self.clients.iter().find(|c| c.uid == Some(uid));
        by_uid.or_else(|| self.clients.iter().find(|c| c.gid == Some(gid))).map(|c| c.role)
    }
}

/// Open `path` for reading without following a link in its last component (a directory or a
/// FIFO opens too: the caller checks the type), once every directory above it has been found to
/// be root's and writable by no one else, or sticky.
fn open_root_owned(path: &Path) -> Result<(std::fs::File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let Some(name) = path.file_name() else { bail!("names no file") };
    let parent = std::fs::canonicalize(path.parent().unwrap_or(Path::new("."))).context("its directory")?;
    for dir in parent.ancestors() {
        let m = std::fs::symlink_metadata(dir).with_context(|| format!("directory {}", dir.display()))?;
        let sticky = m.mode() & 0o1000 != 0;
        if m.uid() != 0 || (m.mode() & 0o022 != 0 && !sticky) {
            bail!(
                "directory {} is owned by uid {} with mode {:o}: whoever can write it can replace the \
                 configuration (it must be root's and writable by nobody else, or sticky)",
                dir.display(),
                m.uid(),
                m.mode() & 0o7777
            );
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(parent.join(name))
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => super::DaemonError::msg("a symbolic link (name the file it points to)"),
            _ => e.into(),
        })?;
    let meta = file.metadata()?;
    Ok((file, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Result<Config> {
        let c: Config = serde_json::from_str(text)?;
        c.check()?;
        Ok(c)
    }

    #[test]
    fn roles_come_from_uid_then_gid_and_root_is_always_admin() {
        let c = config(
            r#"{"schema":"chio.supervisor-config.v1","clients":[{"uid":1000,"role":"admin"},{"gid":990,"role":"launch"}]}"#,
        )
        .unwrap();
        assert_eq!(c.role_of(0, 0), Some(Role::Admin));
        assert_eq!(c.role_of(1000, 990), Some(Role::Admin));
        assert_eq!(c.role_of(1001, 990), Some(Role::Launch));
        assert_eq!(c.role_of(1001, 991), None);
        assert_eq!(Config::default().role_of(1000, 1000), None);
    }

    /// The file decides who may launch as root: only root may be able to write it.
    #[test]
    fn a_configuration_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("chio-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("supervisor.json");
        std::fs::write(&path, r#"{"schema":"chio.supervisor-config.v1"}"#).unwrap();
        let mode = |m: u32| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
        let root = nix::unistd::geteuid().is_root();
        mode(0o644);
        let loaded = Config::load(&path);
        mode(0o664);
        let group_writable = Config::load(&path).map(|_| ()).map_err(|e| e.to_string());
        mode(0o646);
        let other_writable = Config::load(&path).map(|_| ()).map_err(|e| e.to_string());
        mode(0o644);
        let foreign = if root {
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            Some(Config::load(&path).map(|_| ()).map_err(|e| e.to_string()))
        } else {
            None
        };
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let through_link = Config::load(&link).map(|_| ()).map_err(|e| format!("{e:#}"));
        // The directories above: one others may write (not sticky), or another user's, lets them
        // swap the file; a sticky one does not.
        let sub = dir.join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::copy(&path, sub.join("supervisor.json")).unwrap();
        let in_sub = |m: u32| {
            std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(m)).unwrap();
            Config::load(&sub.join("supervisor.json")).map(|_| ()).map_err(|e| format!("{e:#}"))
        };
        let (open_dir, sticky_dir) = (in_sub(0o777), in_sub(0o1777));
        let foreign_dir = if root {
            std::os::unix::fs::chown(&sub, Some(65534), None).unwrap();
            Some(in_sub(0o755))
        } else {
            None
        };
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(loaded.is_ok(), root, "a root-owned 0644 file loads (when the test owns it as root)");
        for r in [group_writable, other_writable].into_iter().chain(foreign) {
            assert!(
                r.as_ref().is_err_and(|e| e.contains("must be owned by root and writable by nobody else")),
                "{r:?}"
            );
        }
        assert!(through_link.as_ref().is_err_and(|e| e.contains("a symbolic link")), "{through_link:?}");
        assert!(open_dir.as_ref().is_err_and(|e| e.contains("mode 777: whoever can write it")), "{open_dir:?}");
        assert_eq!(sticky_dir.is_ok(), root, "{sticky_dir:?}");
        if let Some(r) = foreign_dir {
            assert!(r.as_ref().is_err_and(|e| e.contains("owned by uid 65534 with mode 755")), "{r:?}");
        }
    }

    /// The endpoint answers without authentication: only loopback or a Unix socket, never an
    /// address another host reaches (the refused ones are in [`bad_configurations_are_refused`]).
    #[test]
    fn metrics_listen_only_where_no_other_host_reaches() {
        let at = |t: &str| config(&format!(r#"{{"schema":"chio.supervisor-config.v1","metrics":"{t}"}}"#)).unwrap();
        assert_eq!(at("127.0.0.1:9464").metrics, Some(MetricsAt::Tcp("127.0.0.1:9464".parse().unwrap())));
        assert_eq!(at("[::1]:9464").metrics, Some(MetricsAt::Tcp("[::1]:9464".parse().unwrap())));
        assert_eq!(at("/run/chio/metrics.sock").metrics, Some(MetricsAt::Unix("/run/chio/metrics.sock".into())));
        assert_eq!(Config::default().metrics, None, "off unless configured");
        let why = MetricsAt::parse("0.0.0.0:9464").unwrap_err();
        assert!(why.contains("not a loopback address") && why.contains("proxy"), "{why}");
    }

    #[test]
    fn bad_configurations_are_refused() {
        for bad in [
            r#"{"schema":"other"}"#,
            r#"{"schema":"chio.supervisor-config.v1","clients":[{"role":"admin"}]}"#,
            r#"{"schema":"chio.supervisor-config.v1","clients":[{"uid":1,"gid":1,"role":"admin"}]}"#,
            r#"{"schema":"chio.supervisor-config.v1","policy_signers":["zz"]}"#,
            r#"{"schema":"chio.supervisor-config.v1","max_launches":0}"#,
            r#"{"schema":"chio.supervisor-config.v1","max_launches_per_client":0}"#,
            r#"{"schema":"chio.supervisor-config.v1","surprise":1}"#,
            r#"{"schema":"chio.supervisor-config.v1","clients":[{"uid":1,"role":"root"}]}"#,
            r#"{"schema":"chio.supervisor-config.v1","workspaces":[{"uid":1,"state":"ws"}]}"#,
            r#"{"schema":"chio.supervisor-config.v1","metrics":"0.0.0.0:9464"}"#,
            r#"{"schema":"chio.supervisor-config.v1","metrics":"[::]:9464"}"#,
            r#"{"schema":"chio.supervisor-config.v1","metrics":"192.168.1.4:9464"}"#,
            r#"{"schema":"chio.supervisor-config.v1","metrics":"localhost:9464"}"#,
            r#"{"schema":"chio.supervisor-config.v1","metrics":"127.0.0.1:0"}"#,
            r#"{"schema":"chio.supervisor-config.v1","metrics":"run/metrics.sock"}"#,
            r#"{"schema":"chio.supervisor-config.v1","metrics":"/run/../metrics.sock"}"#,
            r#"{"schema":"chio.supervisor-config.v1","metrics":9464}"#,
        ] {
            assert!(config(bad).is_err(), "{bad}");
        }
    }
}
