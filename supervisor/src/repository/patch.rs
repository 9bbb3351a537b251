//! Patches between snapshots, made and checked with git in a scratch bare repository that has
//! no configuration, no attributes and no hooks: snapshots enter through `fast-import` (no
//! filter or end-of-line conversion can touch their bytes), the patch is `diff-tree --binary`,
//! and a patch is checked by applying it to the baseline's tree in a scratch index.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::git_source::{git, init_bare, run, SourceError};
use super::snapshot::{Index, Node};

/// A scratch repository holding snapshots as trees.
pub struct Trees {
    dir: PathBuf,
}

fn quote(path: &str) -> String {
    if path.starts_with('"') {
        format!("\"{}\"", path.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        path.to_string()
    }
}

impl Trees {
    /// A new scratch repository at `dir` (which must not exist).
    pub fn create(dir: &Path) -> Result<Trees, SourceError> {
        init_bare(dir)?;
        Ok(Trees { dir: dir.to_path_buf() })
    }

    /// Import `index` (contents from `content`) as a tree; returns the tree id. Empty
    /// directories are not part of a git tree.
    pub fn import(
        &self,
        index: &Index,
        content: impl FnMut(&str) -> std::io::Result<Vec<u8>>,
    ) -> Result<String, SourceError> {
        self.commit(index, content, "refs/heads/t", "")
    }

    /// Give a workspace its own git history at the baseline (DESIGN §6): a fresh repository in
    /// `workdir/.git` (no templates, no configuration read) whose `main` is one commit of
    /// `index`, checked out into its index so `git diff` inside the sandbox shows the session's
    /// changes. It belongs to the sandbox: the host never runs git on it again.
    pub fn sandbox_history(
        workdir: &Path,
        index: &Index,
        content: impl FnMut(&str) -> std::io::Result<Vec<u8>>,
        message: &str,
    ) -> Result<(), SourceError> {
        let mut init = std::process::Command::new("git");
        init.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", "/nonexistent")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["init", "-q", "--template=", "--initial-branch=main"])
            .arg(workdir)
            .stdin(Stdio::null());
        run(init, "creating the workspace's own git history")?;
        let t = Trees { dir: workdir.join(".git") };
        t.commit(index, content, "refs/heads/main", message)?;
        let mut c = git(&t.dir);
        c.args(["read-tree", "refs/heads/main"]);
        run(c, "checking out the baseline into the workspace's git index")?;
        Ok(())
    }

    fn commit(
        &self,
        index: &Index,
        mut content: impl FnMut(&str) -> std::io::Result<Vec<u8>>,
        refname: &str,
        message: &str,
    ) -> Result<String, SourceError> {
        let mut stream = Vec::new();
        let mut marks: HashMap<&str, usize> = HashMap::new();
        for node in index.values() {
            if let Node::File { sha256, .. } = node {
                if !marks.contains_key(sha256.as_str()) {
                    let mark = marks.len() + 1;
                    let bytes = content(sha256)?;
                    write!(stream, "blob\nmark :{mark}\ndata {}\n", bytes.len())?;
                    stream.extend_from_slice(&bytes);
                    stream.push(b'\n');
                    marks.insert(sha256, mark);
                }
            }
        }
        write!(
            stream,
            "commit {refname}\ncommitter chio <chio@localhost> 0 +0000\ndata {}\n{message}\ndeleteall\n",
            message.len()
        )?;
        for (path, node) in index {
            match node {
                Node::File { sha256, executable, .. } => {
                    let mode = if *executable { "100755" } else { "100644" };
                    writeln!(stream, "M {mode} :{} {}", marks[sha256.as_str()], quote(path))?;
                }
                Node::Symlink { target } => {
                    write!(stream, "M 120000 inline {}\ndata {}\n{target}\n", quote(path), target.len())?;
                }
                Node::Dir => {}
            }
        }
        stream.extend_from_slice(b"done\n");
        let mut c = git(&self.dir);
        c.args(["fast-import", "--quiet", "--done", "--force"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let (mut child, watchdog) = super::git_source::spawn_watched(&mut c)?;
        let mut stdin =
            child.stdin.take().ok_or_else(|| SourceError::Refused("git fast-import has no stdin".into()))?;
        let writer = std::thread::spawn(move || stdin.write_all(&stream));
        let out = child.wait_with_output();
        let _ = writer.join();
        if watchdog.disarm() {
            return Err(SourceError::Refused(super::bounded::overran("git fast-import")));
        }
        let out = out?;
        if !out.status.success() {
            return Err(SourceError::Refused(format!(
                "git fast-import: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let mut c = git(&self.dir);
        c.args(["rev-parse", "--verify"]).arg(format!("{refname}^{{tree}}"));
        Ok(String::from_utf8_lossy(&run(c, "reading the imported tree")?).trim().to_string())
    }

    /// The patch from tree `a` to tree `b`: `git apply`-able, binary files and modes included.
    pub fn diff(&self, a: &str, b: &str) -> Result<Vec<u8>, SourceError> {
        let mut c = git(&self.dir);
        c.args([
            "diff-tree",
            "-r",
            "-p",
            "--binary",
            "--full-index",
            "--no-renames",
            "--no-textconv",
            "--no-ext-diff",
            "--no-color",
            a,
            b,
        ]);
        run(c, "making the patch")
    }

    /// Apply `patch` (an open file, git's standard input: git never opens a path the patch's
    /// sender chose) to tree `base` in a scratch index; returns the resulting tree id.
    pub fn apply(&self, base: &str, patch: std::fs::File) -> Result<String, SourceError> {
        let index = self.dir.join("apply.index");
        let with_index = |args: &[&str]| {
            let mut c = git(&self.dir);
            c.env("GIT_INDEX_FILE", &index).args(args);
            c
        };
        run(with_index(&["read-tree", base]), "reading the baseline tree")?;
        // `--allow-empty`: a session that changed nothing has an empty patch, a valid result
        // (the caller still compares trees: an empty patch for a changed snapshot is refused).
        let mut apply = with_index(&["apply", "--cached", "--allow-empty", "--whitespace=nowarn"]);
        apply.stdin(patch);
        run(apply, "the patch does not apply to the baseline")?;
        Ok(String::from_utf8_lossy(&run(with_index(&["write-tree"]), "writing the patched tree")?).trim().to_string())
    }
}
