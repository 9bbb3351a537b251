//! The leg's file tools, `read_file` and `list_dir`: a model reads the workspace without running
//! a command, under the operator's grant of path prefixes (`chio repository serve --read-prefix
//! package/src`). The workspace is written by caged commands and so is hostile to the host: every
//! path is walked beneath the live tree's directory descriptor by `openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` — no link is followed, `..`
//! cannot climb out, a rename under the walk cannot take it elsewhere (the kernel fails the
//! lookup instead) — a FIFO or device is never opened for reading (`O_NONBLOCK`, then only a
//! regular file is read), and at most [`MAX_READ_BYTES`] are read whatever the file's size says
//! (one grown while read is refused, not cut). Each call holds the workspace's lock (no command
//! runs meanwhile) and is a signed receipt; each refusal a signed denial naming the rule.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use chio_kernel::receipt::{Draft, Kind};
use serde::Serialize;
use serde_json::{json, Value};

use super::snapshot::hex_sha256;
use super::workspace::{RepoError, Workspace};

/// The most bytes `read_file` returns: a larger file is refused, not cut.
pub const MAX_READ_BYTES: u64 = 64 << 10;
/// The most entries `list_dir` returns (the rest are counted).
pub const MAX_LIST_ENTRIES: usize = 1000;
/// Schema of a file tool's receipt detail.
pub const READ_SCHEMA: &str = "chio.repository.read.v1";

/// The operator's grant: path prefixes below the workspace root, each whole components.
#[derive(Debug, Clone, Default)]
pub struct ReadGrant {
    prefixes: Vec<Vec<String>>,
}

/// A path given by the model, split into plain components, or why not.
fn components(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() || path.len() > 4096 || path.contains('\0') {
        return Err("an empty, over-long or NUL-holding path".into());
    }
    let mut out = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(n) => out.push(n.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => return Err("`..` is not followed".into()),
            Component::RootDir | Component::Prefix(_) => {
                return Err("an absolute path: give one relative to the workspace".into())
            }
        }
    }
    if out.is_empty() {
        return Err("no path below the workspace".into());
    }
    Ok(out)
}

impl ReadGrant {
    /// The grant of `prefixes` (each a relative path of plain components).
    pub fn new(prefixes: &[String]) -> Result<ReadGrant, RepoError> {
        let mut out = Vec::new();
        for p in prefixes {
            let c = components(p).map_err(|e| RepoError::Usage(format!("--read-prefix {p:?}: {e}")))?;
            if c.iter().any(|n| n == ".git") {
                return Err(RepoError::Usage(format!("--read-prefix {p:?}: .git is the sandbox's, not a source")));
            }
            out.push(c);
        }
        Ok(ReadGrant { prefixes: out })
    }

    /// True when no prefix is granted.
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    /// The granted prefixes, as given.
    pub fn prefixes(&self) -> Vec<String> {
        self.prefixes.iter().map(|p| p.join("/")).collect()
    }

    fn covers(&self, path: &[String]) -> bool {
        self.prefixes.iter().any(|p| path.len() >= p.len() && path[..p.len()] == p[..])
    }
}

/// One entry of a listing.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// Its name.
    pub name: String,
    /// `file`, `dir`, `symlink` (never followed) or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Bytes, for a file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// What a file tool gives the model: the text (or listing) and the receipt that binds it.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    /// The path asked for.
    pub path: String,
    /// `read_file`: the content (UTF-8; other bytes replaced, `sha256` is of the bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `read_file`: the bytes' SHA-256.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// `list_dir`: the entries, by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries: Option<Vec<Entry>>,
    /// `list_dir`: entries past [`MAX_LIST_ENTRIES`], not listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more: Option<usize>,
    /// The signed receipt.
    pub receipt_id: String,
}

/// A refusal, signed: the rule and why.
#[derive(Debug)]
pub struct Refusal {
    /// The rule (`read_prefix`, `path`, `link`, `not_regular`, `size`, `not_found`).
    pub rule: &'static str,
    /// In words.
    pub reason: String,
    /// The denial receipt (None when it could not be written: the refusal stands).
    pub receipt_id: Option<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.receipt_id {
            Some(id) => write!(f, "refused ({}): {} (denial receipt {id})", self.rule, self.reason),
            None => write!(f, "refused ({}): {} (its denial could not be signed)", self.rule, self.reason),
        }
    }
}

/// Which tool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tool {
    /// `read_file`.
    Read,
    /// `list_dir`.
    List,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Read => "read_file",
            Tool::List => "list_dir",
        }
    }
}

/// Run `tool` on `path` in the locked workspace under `grant`. An `Err` is a failure of the
/// host (the store); a refusal is `Ok(Err(..))`, signed.
pub fn run(ws: &Workspace, grant: &ReadGrant, tool: Tool, path: &str) -> Result<Result<Answer, Refusal>, RepoError> {
    let key = ws.kernel_key()?;
    let mut store = ws.store(&key)?;
    let server = ws.config.server_id.clone();
    let mut refuse = |rule: &'static str, reason: String| {
        let draft = Draft {
            kind: Some(Kind::Denial),
            tool_server: server.clone(),
            outcome: "denied".into(),
            detail: Some(json!({"schema": READ_SCHEMA, "workspace": ws.config_digest, "tool": tool.name(),
                                "rule": rule, "path": path, "reason": reason})),
            ..Default::default()
        };
        let receipt_id = store.append(&key, draft).ok().map(|a| a.receipt.id);
        Ok(Err(Refusal { rule, reason, receipt_id }))
    };
    let names = match components(path) {
        Ok(n) => n,
        Err(e) => return refuse("path", e),
    };
    if !grant.covers(&names) {
        let granted = grant.prefixes();
        let why = if granted.is_empty() {
            "the operator granted no reads (chio repository serve --read-prefix)".to_string()
        } else {
            format!("it is under none of the granted prefixes {granted:?}")
        };
        return refuse("read_prefix", why);
    }
    let (found, detail) = match walk(ws, tool, &names) {
        Ok(found) => found,
        Err((rule, reason)) => return refuse(rule, reason),
    };
    let mut body = serde_json::Map::new();
    body.insert("schema".into(), json!(READ_SCHEMA));
    body.insert("workspace".into(), json!(ws.config_digest));
    body.insert("tool".into(), json!(tool.name()));
    body.insert("path".into(), json!(path));
    body.extend(detail);
    let draft = Draft {
        kind: Some(Kind::ToolCall),
        tool_server: server.clone(),
        outcome: "ok".into(),
        detail: Some(Value::Object(body)),
        ..Default::default()
    };
    let receipt_id = store.append(&key, draft)?.receipt.id;
    Ok(Ok(Answer { path: path.to_string(), receipt_id, ..found }))
}

type Found = (Answer, serde_json::Map<String, Value>);

/// Open `names` beneath the live tree and read or list it; a refusal is (rule, why).
fn walk(ws: &Workspace, tool: Tool, names: &[String]) -> Result<Found, (&'static str, String)> {
    let shown = names.join("/");
    let root = chio_cage::path::open_host(&ws.live(), libc::O_DIRECTORY)
        .map_err(|e| ("path", format!("the workspace's tree: {e}")))?;
    let rel: std::path::PathBuf = names.iter().collect();
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    let fd: OwnedFd = chio_cage::path::open_beneath(root.as_fd(), &rel, flags).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => ("link", format!("{shown}: {e}")),
        std::io::ErrorKind::NotFound => ("not_found", format!("{shown}: no such file or directory")),
        _ => ("path", format!("{shown}: {e}")),
    })?;
    let mut file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| ("path", format!("{shown}: {e}")))?;
    let blank =
        Answer { path: String::new(), text: None, sha256: None, entries: None, more: None, receipt_id: String::new() };
    match tool {
        Tool::Read => {
            if !meta.is_file() {
                return Err((
                    "not_regular",
                    format!("{shown} is not a regular file (a directory, FIFO, socket or device)"),
                ));
            }
            let mut bytes = Vec::new();
            (&mut file)
                .take(MAX_READ_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| ("path", format!("{shown}: {e}")))?;
            if bytes.len() as u64 > MAX_READ_BYTES {
                return Err(("size", format!("{shown} holds more than {MAX_READ_BYTES} bytes: not read")));
            }
            let sha = hex_sha256(&bytes);
            let mut d = serde_json::Map::new();
            d.insert("bytes".into(), json!(bytes.len()));
            d.insert("sha256".into(), json!(sha));
            let text = String::from_utf8_lossy(&bytes).into_owned();
            Ok((Answer { text: Some(text), sha256: Some(sha), ..blank }, d))
        }
        Tool::List => {
            if !meta.is_dir() {
                return Err(("not_regular", format!("{shown} is not a directory")));
            }
            let names = chio_cage::path::read_dir_names(file.as_fd()).map_err(|e| ("path", format!("{shown}: {e}")))?;
            let mut entries: Vec<Entry> = names
                .iter()
                .map(|n| {
                    let name = OsStr::from_bytes(n.as_bytes());
                    let st = nix::sys::stat::fstatat(file.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
                    let (kind, size) = match st.map(|s| (s.st_mode & libc::S_IFMT, s.st_size)) {
                        Ok((libc::S_IFREG, size)) => ("file", u64::try_from(size).ok()),
                        Ok((libc::S_IFDIR, _)) => ("dir", None),
                        Ok((libc::S_IFLNK, _)) => ("symlink", None),
                        _ => ("other", None),
                    };
                    Entry { name: name.to_string_lossy().into_owned(), kind: kind.into(), size }
                })
                .collect();
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let more = entries.len().saturating_sub(MAX_LIST_ENTRIES);
            entries.truncate(MAX_LIST_ENTRIES);
            let mut d = serde_json::Map::new();
            d.insert("entries".into(), json!(entries.len() + more));
            Ok((Answer { entries: Some(entries), more: (more > 0).then_some(more), ..blank }, d))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_plain_and_under_a_granted_prefix() {
        let g = ReadGrant::new(&["package/src".into()]).unwrap();
        let ok = |p: &str| components(p).map(|c| g.covers(&c));
        assert_eq!(ok("package/src/lib.rs"), Ok(true));
        assert_eq!(ok("package/src"), Ok(true));
        assert_eq!(ok("./package/src/a"), Ok(true));
        assert_eq!(ok("package/srcx/a"), Ok(false), "a prefix is whole components");
        assert_eq!(ok("package"), Ok(false));
        for bad in ["", "/etc/passwd", "package/src/../../etc", "..", "a\0b"] {
            assert!(components(bad).is_err(), "{bad:?}");
        }
        assert!(ReadGrant::new(&["../x".into()]).is_err());
        assert!(ReadGrant::new(&["package/.git".into()]).is_err());
        assert!(ReadGrant::new(&[]).unwrap().is_empty());
    }
}
