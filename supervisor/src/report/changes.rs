//! A repository command's file changes: the difference between the snapshots its `tool_call`
//! receipt binds (before and after), read from the workspace's state. A snapshot is shown only
//! if its bytes hash to the digest the receipt names; one that does not is a verification
//! problem of the report, not a change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::ReportError;
use crate::repository::bounded;
use crate::repository::snapshot::{self, Index, Node};
use crate::repository::workspace::Config;

/// Most paths listed per kind of change for one command; the rest are counted.
pub const MAX_LISTED: usize = 500;
/// Largest snapshot index read (8,192 entries take well under 2 MiB).
const MAX_INDEX_BYTES: u64 = 32 << 20;

/// What one command changed in the workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Paths that appeared, with what they are.
    pub added: Vec<(String, String)>,
    /// Paths that went, with what they were.
    pub removed: Vec<(String, String)>,
    /// Paths whose content, mode or kind changed: (path, before → after).
    pub modified: Vec<(String, String)>,
    /// Changes beyond [`MAX_LISTED`] of a kind, not listed.
    pub unlisted: usize,
}

impl Changes {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.modified.is_empty() && self.unlisted == 0
    }

    /// Changes counted, listed or not.
    pub fn count(&self) -> usize {
        self.added.len() + self.removed.len() + self.modified.len() + self.unlisted
    }
}

/// A workspace's snapshots, read without its lock (a snapshot is written once, under its digest).
#[derive(Debug)]
pub struct Snapshots {
    dir: PathBuf,
    /// The configuration digest its receipts bind: another workspace's commands are not ours.
    config_digest: String,
    /// The last snapshot read: a command's `before` is the previous one's `after`.
    last: Option<(String, Index)>,
}

fn describe(n: &Node) -> String {
    match n {
        Node::File { size, executable: true, .. } => format!("executable file, {size} B"),
        Node::File { size, .. } => format!("file, {size} B"),
        Node::Dir => "directory".into(),
        Node::Symlink { target } => format!("symlink to {target}"),
    }
}

impl Snapshots {
    /// The workspace of a `chio repository` state, or of a governed session's state.
    pub fn open(state: &Path) -> Result<Snapshots, ReportError> {
        let dir = if state.join("workspace.json").is_file() {
            state.to_path_buf()
        } else if state.join("session.json").is_file() && state.join("workspace").join("workspace.json").is_file() {
            state.join("workspace")
        } else {
            return Err(ReportError::Usage(format!(
                "--session {}: neither a repository workspace's state (no workspace.json) nor a governed \
                 session's (no session.json with a workspace/ beside it)",
                state.display()
            )));
        };
        let bytes = bounded::read_regular(&dir.join("workspace.json"), 1 << 20, libc::O_NOFOLLOW)
            .map_err(|e| ReportError::Usage(format!("--session {}: workspace.json: {e}", state.display())))?;
        let config_digest = Config::parse(&bytes)
            .and_then(|c| c.digest())
            .map_err(|e| ReportError::Usage(format!("--session {}: workspace.json: {e}", state.display())))?;
        Ok(Snapshots { dir, config_digest, last: None })
    }

    /// The changes of the command whose `tool_call` detail is `d`: `None` for a receipt that is
    /// not a command of this workspace; an error (also pushed onto `problems`) when a snapshot
    /// cannot be shown.
    pub fn changes_of(&mut self, d: &Value, problems: &mut Vec<String>) -> Option<Result<Changes, String>> {
        if d.get("workspace").and_then(Value::as_str) != Some(self.config_digest.as_str()) {
            return None;
        }
        let before = d.get("before").and_then(Value::as_str)?;
        let after = d.get("after").and_then(Value::as_str).unwrap_or(before);
        let result = self.read(before).and_then(|b| Ok((b, self.read(after)?))).map(|(b, a)| diff(&b, &a));
        if let Err(e) = &result {
            problems.push(e.clone());
        }
        Some(result)
    }

    fn read(&mut self, digest: &str) -> Result<Index, String> {
        if let Some((d, index)) = &self.last {
            if d == digest {
                return Ok(index.clone());
            }
        }
        let hex = digest.strip_prefix("sha256:").filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(hex) = hex else {
            return Err(format!("a receipt names snapshot {digest:?}, which is not a snapshot digest"));
        };
        let path = self.dir.join("snapshots").join(format!("{hex}.json"));
        let bytes = bounded::read_regular(&path, MAX_INDEX_BYTES, libc::O_NOFOLLOW)
            .map_err(|e| format!("snapshot {digest} cannot be read: {e}"))?;
        let index = snapshot::parse_index(&bytes).map_err(|e| format!("snapshot {digest} is not an index: {e}"))?;
        if snapshot::digest(&index) != digest {
            return Err(format!("snapshot {digest} does not match its digest: {} was changed", path.display()));
        }
        self.last = Some((digest.to_string(), index.clone()));
        Ok(index)
    }
}

/// The changes from `before` to `after`.
pub fn diff(before: &Index, after: &Index) -> Changes {
    let mut c = Changes::default();
    let mut push = |list: &mut Vec<(String, String)>, path: &str, what: String| {
        if list.len() < MAX_LISTED {
            list.push((path.to_string(), what));
        } else {
            c.unlisted += 1;
        }
    };
    let (mut added, mut removed, mut modified) = (Vec::new(), Vec::new(), Vec::new());
    let paths: BTreeMap<&String, ()> = before.keys().chain(after.keys()).map(|p| (p, ())).collect();
    for path in paths.keys() {
        match (before.get(*path), after.get(*path)) {
            (None, Some(a)) => push(&mut added, path, describe(a)),
            (Some(b), None) => push(&mut removed, path, describe(b)),
            (Some(b), Some(a)) if b != a => push(&mut modified, path, format!("{} → {}", describe(b), describe(a))),
            _ => {}
        }
    }
    Changes { added, removed, modified, unlisted: c.unlisted }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sha: char, size: u64, executable: bool) -> Node {
        Node::File { sha256: sha.to_string().repeat(64), size, executable }
    }

    #[test]
    fn a_diff_names_each_added_removed_and_changed_path() {
        let before: Index = [
            ("a".to_string(), Node::Dir),
            ("a/kept".to_string(), file('1', 3, false)),
            ("a/edited".to_string(), file('2', 4, false)),
            ("a/chmod".to_string(), file('3', 5, false)),
            ("gone".to_string(), file('4', 6, false)),
        ]
        .into();
        let mut after = before.clone();
        after.remove("gone");
        after.insert("a/edited".into(), file('5', 7, false));
        after.insert("a/chmod".into(), file('3', 5, true));
        after.insert("new".into(), Node::Symlink { target: "a/kept".into() });
        let c = diff(&before, &after);
        assert_eq!(c.added, vec![("new".to_string(), "symlink to a/kept".to_string())]);
        assert_eq!(c.removed, vec![("gone".to_string(), "file, 6 B".to_string())]);
        assert_eq!(
            c.modified,
            vec![
                ("a/chmod".to_string(), "file, 5 B → executable file, 5 B".to_string()),
                ("a/edited".to_string(), "file, 4 B → file, 7 B".to_string()),
            ]
        );
        assert!(diff(&before, &before).is_empty());
    }

    #[test]
    fn counts_and_emptiness_cover_every_kind_of_change() {
        let one = |p: &str| vec![(p.to_string(), String::new())];
        let each = [
            Changes { added: one("a"), ..Changes::default() },
            Changes { removed: one("r"), ..Changes::default() },
            Changes { modified: one("m"), ..Changes::default() },
            Changes { unlisted: 1, ..Changes::default() },
        ];
        for c in &each {
            assert!(!c.is_empty() && c.count() == 1, "{c:?}");
        }
        let all = Changes { added: one("a"), removed: one("r"), modified: one("m"), unlisted: 4 };
        assert_eq!(all.count(), 7);
        assert!(Changes::default().is_empty());
    }

    /// A workspace's snapshots as a report reads them: `dir/snapshots/HEX.json`.
    fn snapshots(tag: &str, indexes: &[&Index]) -> (Snapshots, Vec<String>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/unit-tmp").join(tag);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("snapshots")).unwrap();
        let digests = indexes
            .iter()
            .map(|ix| {
                let d = snapshot::digest(ix);
                let file = dir.join("snapshots").join(format!("{}.json", d.trim_start_matches("sha256:")));
                std::fs::write(file, snapshot::canonical_bytes(ix)).unwrap();
                d
            })
            .collect();
        (Snapshots { dir, config_digest: "sha256:ws".into(), last: None }, digests)
    }

    #[test]
    fn a_commands_changes_come_from_the_snapshots_its_receipt_names_and_only_if_they_match() {
        let before: Index = [("f".to_string(), file('1', 1, false))].into();
        let after: Index = [("f".to_string(), file('2', 2, false)), ("g".to_string(), Node::Dir)].into();
        let (mut w, d) = snapshots("report-changes", &[&before, &after]);
        let detail = |ws: &str, b: &str, a: &str| serde_json::json!({"workspace": ws, "before": b, "after": a});
        let mut problems = Vec::new();
        assert_eq!(w.changes_of(&detail("sha256:other", &d[0], &d[1]), &mut problems), None, "another workspace's");
        let c = w.changes_of(&detail("sha256:ws", &d[0], &d[1]), &mut problems).unwrap().unwrap();
        assert_eq!((c.added.len(), c.modified.len(), c.removed.len()), (1, 1, 0), "{c:?}");
        // A refused command names no `after`: nothing changed.
        let unchanged = serde_json::json!({"workspace": "sha256:ws", "before": d[1]});
        assert!(w.changes_of(&unchanged, &mut problems).unwrap().unwrap().is_empty());
        assert!(problems.is_empty(), "{problems:?}");
        // An index edited on disk is a problem, not a change (read again: not the one cached).
        let on_disk = w.dir.join("snapshots").join(format!("{}.json", d[0].trim_start_matches("sha256:")));
        std::fs::write(&on_disk, snapshot::canonical_bytes(&after)).unwrap();
        w.last = None;
        let e = w.changes_of(&detail("sha256:ws", &d[0], &d[1]), &mut problems).unwrap().unwrap_err();
        assert!(e.contains("does not match its digest"), "{e}");
        assert_eq!(problems, vec![e]);
        for name in ["sha256:../../etc/passwd", "md5:00", &format!("sha256:{}", "g".repeat(64))] {
            let e = w.changes_of(&detail("sha256:ws", name, name), &mut problems).unwrap().unwrap_err();
            assert!(e.contains("which is not a snapshot digest"), "{name}: {e}");
        }
        let absent = format!("sha256:{}", "a".repeat(64));
        let e = w.changes_of(&detail("sha256:ws", &absent, &absent), &mut problems).unwrap().unwrap_err();
        assert!(e.contains("cannot be read"), "{e}");
        let _ = std::fs::remove_dir_all(&w.dir);
    }

    #[test]
    fn a_long_diff_is_listed_to_its_cap_and_the_rest_counted() {
        let after: Index = (0..MAX_LISTED + 7).map(|i| (format!("f{i:05}"), Node::Dir)).collect();
        let c = diff(&Index::new(), &after);
        assert_eq!((c.added.len(), c.unlisted, c.count()), (MAX_LISTED, 7, MAX_LISTED + 7));
    }
}
