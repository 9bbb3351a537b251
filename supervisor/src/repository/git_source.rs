//! The baseline of a workspace: exactly the committed tree of the selected literal paths, read
//! from the source repository's object store. git never runs with the source's configuration:
//! objects are read through a fresh, empty repository whose only link to the source is an
//! `alternates` entry, and refs are read as files here — so no filter, hook, fsmonitor, replace
//! ref or promisor remote of the (hostile) source can run, and the source is never written.
//!
//! A daemon reads a client's source with the client's rights ([`ReadAs`]): its own reads take
//! the client's file system ids, and git runs as the client, in a scratch directory of the
//! client's. A link, a `.git` file or an alternates entry the client plants then leads to
//! nothing the client could not read itself. Whoever reads: `.git` and `objects` must be real
//! directories, refs are never read through a link, and a source that borrows objects from
//! another repository (`objects/info/alternates`, `http-alternates`) is refused.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use nix::unistd::{Gid, Uid};

use super::bounded::{self, Watchdog};
use super::snapshot::{self, Ceilings, Index, Node, Objects, SnapshotError};

/// Longest ref, `.git` or `commondir` file read.
const SMALL_FILE: u64 = 4096;
/// Longest `packed-refs` read (a repository with a great many tags keeps tens of MiB there).
const PACKED_REFS: u64 = 256 << 20;

/// Most source paths one workspace may select.
pub const MAX_SOURCE_PATHS: usize = 64;

/// Why the baseline could not be imported.
#[derive(Debug)]
pub enum SourceError {
    /// The request or the tree is refused (named reason).
    Refused(String),
    /// git or the file system failed.
    Io(std::io::Error),
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceError::Refused(r) => f.write_str(r),
            SourceError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SourceError {}

impl From<std::io::Error> for SourceError {
    fn from(e: std::io::Error) -> Self {
        SourceError::Io(e)
    }
}

impl From<SnapshotError> for SourceError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Refused(r) => SourceError::Refused(r),
            SnapshotError::Io(e) => SourceError::Io(e),
        }
    }
}

fn refused(msg: impl Into<String>) -> SourceError {
    SourceError::Refused(msg.into())
}

/// The source path that names the whole tree (`--source-path .`), alone.
pub const WHOLE_TREE: &str = ".";

/// True when `paths` is the whole tree.
fn whole(paths: &[String]) -> bool {
    paths.len() == 1 && paths[0] == WHOLE_TREE
}

/// Check the selected paths: 1–64 canonical relative paths, no `.git`, none inside another; or
/// `.` alone, the whole tree. They are literal: pathspec magic (`:(glob)`), `*` and `?` are
/// plain characters.
pub fn check_source_paths(paths: &[String]) -> Result<(), SourceError> {
    if paths.is_empty() || paths.len() > MAX_SOURCE_PATHS {
        return Err(refused(format!("{} source paths: give 1 to {MAX_SOURCE_PATHS}", paths.len())));
    }
    if whole(paths) {
        return Ok(());
    }
    if paths.iter().any(|p| p == WHOLE_TREE) {
        return Err(refused("source path \".\" is the whole tree: give it alone"));
    }
    for p in paths {
        snapshot::check_path(p).map_err(|e| refused(format!("source path {e}")))?;
    }
    for (i, p) in paths.iter().enumerate() {
        for q in &paths[i + 1..] {
            if p == q || q.starts_with(&format!("{p}/")) || p.starts_with(&format!("{q}/")) {
                return Err(refused(format!("source paths {p:?} and {q:?} overlap")));
            }
        }
    }
    Ok(())
}

/// True when `path` is one of the source paths or inside one.
pub fn in_scope(paths: &[String], path: &str) -> bool {
    whole(paths) || paths.iter().any(|p| path == p || path.strip_prefix(p.as_str()).is_some_and(|r| r.starts_with('/')))
}

/// True when `path` is a directory above a source path.
pub fn is_parent_of_scope(paths: &[String], path: &str) -> bool {
    paths.iter().any(|p| p.strip_prefix(path).is_some_and(|r| r.starts_with('/')))
}

/// Whose file system rights a source is read with: a client of the daemon (its uid, and its
/// gid as the only group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAs {
    /// The client's uid.
    pub uid: u32,
    /// The client's primary gid.
    pub gid: u32,
}

/// This thread's file system ids as a client's while it lives (root's again when dropped). The
/// groups are set for the process: only a single-threaded process (a daemon's launch child) may
/// take one.
struct AsClient {
    restore: Option<Vec<Gid>>,
}

impl AsClient {
    fn take(who: Option<ReadAs>) -> Result<AsClient, SourceError> {
        let Some(r) = who else { return Ok(AsClient { restore: None }) };
        let groups = nix::unistd::getgroups().map_err(std::io::Error::from)?;
        let guard = AsClient { restore: Some(groups) };
        nix::unistd::setgroups(&[Gid::from_raw(r.gid)]).map_err(std::io::Error::from)?;
        nix::unistd::setfsgid(Gid::from_raw(r.gid));
        nix::unistd::setfsuid(Uid::from_raw(r.uid));
        // setfsuid answers with the previous id whether or not it changed: read it back.
        if nix::unistd::setfsuid(Uid::from_raw(r.uid)) != Uid::from_raw(r.uid)
            || nix::unistd::setfsgid(Gid::from_raw(r.gid)) != Gid::from_raw(r.gid)
        {
            return Err(refused(format!("could not take uid {} gid {}'s file system ids", r.uid, r.gid)));
        }
        Ok(guard)
    }
}

impl Drop for AsClient {
    fn drop(&mut self) {
        if let Some(groups) = self.restore.take() {
            nix::unistd::setfsuid(Uid::from_raw(0));
            nix::unistd::setfsgid(Gid::from_raw(0));
            let _ = nix::unistd::setgroups(&groups);
        }
    }
}

/// A git command that reads nothing of the caller's or the host's configuration.
pub(crate) fn git(git_dir: &Path) -> Command {
    git_as(git_dir, None)
}

/// [`git`], run as `who` when given (its uid, and its gid as the only group).
fn git_as(git_dir: &Path, who: Option<ReadAs>) -> Command {
    let mut c = Command::new("git");
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_ATTR_NOSYSTEM", "1")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_NO_LAZY_FETCH", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_LITERAL_PATHSPECS", "1")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["-c", "core.hooksPath=/dev/null", "-c", "protocol.allow=never", "-c", "core.fsmonitor=false"])
        .stdin(Stdio::null());
    // git dies with chio: a chio killed while git waits on a hostile source (which only the
    // deadline in chio would have ended) leaves no git behind.
    // SAFETY: between fork and exec only prctl, which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    run_as(&mut c, who);
    c
}

/// Run `c` as `who` when given: its uid, and its gid as the only group (an exec resets the file
/// system ids to the effective ones, so a child must take the client's ids for real).
fn run_as(c: &mut Command, who: Option<ReadAs>) {
    let Some(r) = who else { return };
    let (uid, gid) = (Uid::from_raw(r.uid), Gid::from_raw(r.gid));
    // SAFETY: between fork and exec only setgroups, setresgid and setresuid: plain syscalls in
    // the single-threaded child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(c, move || {
            nix::unistd::setgroups(&[gid])?;
            nix::unistd::setresgid(gid, gid, gid)?;
            nix::unistd::setresuid(uid, uid, uid)?;
            Ok(())
        });
    }
}

/// Run git to its end (or its deadline: [`super::bounded`]) and take its output.
pub(crate) fn run(mut c: Command, what: &str) -> Result<Vec<u8>, SourceError> {
    let (child, watchdog) = spawn_watched(c.stderr(Stdio::piped()).stdout(Stdio::piped()))?;
    let out = child.wait_with_output();
    if watchdog.disarm() {
        return Err(refused(bounded::overran(what)));
    }
    let out = out?;
    if !out.status.success() {
        return Err(refused(format!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(out.stdout)
}

/// Spawn `c` under a [`Watchdog`]; a child that cannot be watched is not left running.
pub(crate) fn spawn_watched(c: &mut Command) -> Result<(Child, Watchdog), SourceError> {
    let mut child = c.spawn()?;
    match Watchdog::arm(&child, bounded::git_deadline()) {
        Ok(w) => Ok((child, w)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e.into())
        }
    }
}

/// Where a source repository keeps its objects and refs.
struct SourceDirs {
    /// Per-worktree files (HEAD).
    git_dir: PathBuf,
    /// Shared objects and refs.
    common: PathBuf,
}

fn source_dirs(repo: &Path) -> Result<SourceDirs, SourceError> {
    let repo = std::fs::canonicalize(repo).map_err(|e| refused(format!("repository {}: {e}", repo.display())))?;
    let dot = repo.join(".git");
    let d = match std::fs::symlink_metadata(&dot) {
        Ok(m) if m.is_symlink() => {
            return Err(refused(format!(
                "{}: .git is a link; give --repository the repository it names itself",
                repo.display()
            )))
        }
        Ok(m) if m.is_dir() => SourceDirs { git_dir: dot.clone(), common: dot },
        Ok(m) if m.is_file() => linked_worktree(&repo, &dot)?,
        _ if repo.join("HEAD").is_file() => SourceDirs { git_dir: repo.clone(), common: repo.clone() },
        _ => return Err(refused(format!("{} is not a git repository", repo.display()))),
    };
    own_objects(&d)?;
    Ok(d)
}

/// The source's objects are its own: `objects` a real directory (not a link), and no
/// alternates borrowing another repository's.
fn own_objects(d: &SourceDirs) -> Result<(), SourceError> {
    let objects = d.common.join("objects");
    match std::fs::symlink_metadata(&objects) {
        Ok(m) if m.is_dir() => {}
        Ok(m) if m.is_symlink() => {
            return Err(refused(format!("{}: objects is a link to another directory", d.common.display())))
        }
        _ => return Err(refused(format!("{} has no objects directory", d.common.display()))),
    }
    for name in ["alternates", "http-alternates"] {
        let p = objects.join("info").join(name);
        if std::fs::symlink_metadata(&p).is_ok() {
            return Err(refused(format!(
                "{} borrows objects from another repository ({}): give a repository holding its own objects \
                 (git repack -a -d, then remove that file)",
                d.common.display(),
                p.display()
            )));
        }
    }
    Ok(())
}

/// A checkout whose `.git` is a file naming its git directory: accepted only as a linked worktree
/// — a directory listed under its common repository's `worktrees/` — so a planted `.git` file
/// cannot point the reader at some other repository on the host.
fn linked_worktree(repo: &Path, dot: &Path) -> Result<SourceDirs, SourceError> {
    let text = bounded::read_small(dot, SMALL_FILE)?;
    let target = text
        .strip_prefix("gitdir: ")
        .map(str::trim)
        .ok_or_else(|| refused(format!("{}: not a gitdir file", dot.display())))?;
    let not_worktree = || {
        refused(format!(
            "{}: its .git file does not name a worktree of a repository (a submodule or a planted link); \
             give --repository the repository itself",
            repo.display()
        ))
    };
    let git_dir = std::fs::canonicalize(repo.join(target)).map_err(|_| not_worktree())?;
    let common_rel = read_beneath(&git_dir, "commondir", SMALL_FILE)?.ok_or_else(not_worktree)?;
    let common = std::fs::canonicalize(git_dir.join(common_rel.trim())).map_err(|_| not_worktree())?;
    if git_dir.parent() != Some(common.join("worktrees").as_path()) {
        return Err(not_worktree());
    }
    Ok(SourceDirs { git_dir, common })
}

/// The text of the small regular file `name` beneath the directory `dir`, opened through no
/// link at all and never above `dir` (`chio_cage::path::open_beneath`), at most `max` bytes;
/// `None` when there is none. A link on the way is refused, named.
fn read_beneath(dir: &Path, name: &str, max: u64) -> Result<Option<String>, SourceError> {
    use std::os::fd::AsFd;
    let d = chio_cage::path::open_host_following(dir).map_err(|e| refused(format!("{}: {e}", dir.display())))?;
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    let fd = match chio_cage::path::open_beneath(d.as_fd(), Path::new(name), flags) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(refused(format!("{}: {e}; the repository's files are never read through links", dir.display())))
        }
        Err(e) => return Err(e.into()),
    };
    let f = std::fs::File::from(fd);
    if !f.metadata()?.is_file() {
        return Err(refused(format!("{}/{name} is not a regular file", dir.display())));
    }
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(refused(format!("{}/{name} is longer than {max} bytes", dir.display())));
    }
    String::from_utf8(bytes).map(Some).map_err(|_| refused(format!("{}/{name} is not UTF-8", dir.display())))
}

/// A ref name safe to read as a file: git's own rules, roughly, and no way out of the directory.
fn plausible_ref(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains("..")
        && !name.contains("//")
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
}

/// Read a ref as git's files backend stores it: loose file first, then packed-refs; each beneath
/// its directory through no link (a ref that is one, or passes through one, is refused).
fn read_ref(d: &SourceDirs, name: &str, depth: u32) -> Result<Option<String>, SourceError> {
    if depth > 5 || !plausible_ref(name) {
        return Ok(None);
    }
    let base = if name.starts_with("refs/") { &d.common } else { &d.git_dir };
    let value = match read_beneath(base, name, SMALL_FILE)? {
        Some(v) => v.trim().to_string(),
        None => {
            let packed = read_beneath(&d.common, "packed-refs", PACKED_REFS)?;
            let found = packed.as_deref().and_then(|p| {
                p.lines().find_map(|l| {
                    let (oid, r) = l.split_once(' ')?;
                    (r == name && !l.starts_with('#') && !l.starts_with('^')).then(|| oid.to_string())
                })
            });
            match found {
                Some(oid) => oid,
                None => return Ok(None),
            }
        }
    };
    match value.strip_prefix("ref: ") {
        Some(target) => read_ref(d, target.trim(), depth + 1),
        None => Ok(Some(value)),
    }
}

/// The refs `rev` may name, in git's order (gitrevisions(7)).
fn ref_candidates(rev: &str) -> Vec<String> {
    let mut v = vec![rev.to_string()];
    for p in ["refs/", "refs/tags/", "refs/heads/", "refs/remotes/"] {
        v.push(format!("{p}{rev}"));
    }
    v.push(format!("refs/remotes/{rev}/HEAD"));
    v
}

/// A fresh, empty bare repository in `scratch` reading the source's objects through
/// `alternates` (made by `who` when given).
fn fresh_reader(d: &SourceDirs, scratch: &Path, who: Option<ReadAs>) -> Result<PathBuf, SourceError> {
    let dir = scratch.join("reader.git");
    init_bare_as(&dir, who)?;
    let objects = std::fs::canonicalize(d.common.join("objects"))?;
    std::fs::create_dir_all(dir.join("objects/info"))?;
    std::fs::write(dir.join("objects/info/alternates"), format!("{}\n", objects.display()))?;
    Ok(dir)
}

/// A new, empty bare repository at `dir` (no templates, no configuration read).
pub(crate) fn init_bare(dir: &Path) -> Result<(), SourceError> {
    init_bare_as(dir, None)
}

fn init_bare_as(dir: &Path, who: Option<ReadAs>) -> Result<(), SourceError> {
    let mut init = Command::new("git");
    run_as(&mut init, who);
    init.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["init", "-q", "--bare", "--template="])
        .arg(dir)
        .stdin(Stdio::null());
    run(init, "creating a scratch git repository")?;
    Ok(())
}

/// The full commit id `rev` names in the source.
fn resolve_commit(d: &SourceDirs, reader: &Path, who: Option<ReadAs>, rev: &str) -> Result<String, SourceError> {
    if rev.is_empty() || rev.starts_with('-') || rev.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(refused(format!("revision {rev:?} is not a ref name or commit id")));
    }
    let mut oid = rev.to_string();
    for r in ref_candidates(rev) {
        if let Some(found) = read_ref(d, &r, 0)? {
            oid = found;
            break;
        }
    }
    let mut c = git_as(reader, who);
    c.args(["rev-parse", "--verify", "--quiet", "--end-of-options"]).arg(format!("{oid}^{{commit}}"));
    let out = run(c, &format!("revision {rev:?}"))?;
    let commit = String::from_utf8_lossy(&out).trim().to_string();
    if commit.is_empty() {
        return Err(refused(format!("revision {rev:?} names no commit in the repository")));
    }
    Ok(commit)
}

/// One `ls-tree` entry before its content is read.
struct Listed {
    path: String,
    mode: String,
    oid: String,
    size: u64,
}

fn list_tree(reader: &Path, who: Option<ReadAs>, commit: &str, paths: &[String]) -> Result<Vec<Listed>, SourceError> {
    let mut c = git_as(reader, who);
    c.args(["ls-tree", "-r", "-t", "-z", "-l", "--full-tree", commit, "--"]).args(paths);
    let out = run(c, "listing the commit's tree")?;
    let mut v = Vec::new();
    for rec in out.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let rec = std::str::from_utf8(rec).map_err(|_| refused("the tree has a name that is not UTF-8"))?;
        let (meta, path) = rec.split_once('\t').ok_or_else(|| refused("unexpected ls-tree output"))?;
        let f: Vec<&str> = meta.split_whitespace().collect();
        let [mode, _kind, oid, size] = f.as_slice() else { return Err(refused("unexpected ls-tree output")) };
        v.push(Listed {
            path: path.to_string(),
            mode: mode.to_string(),
            oid: oid.to_string(),
            size: size.parse().unwrap_or(0),
        });
    }
    Ok(v)
}

/// Read the listed blobs through one `cat-file --batch`.
fn read_blobs(
    reader: &Path,
    who: Option<ReadAs>,
    oids: &[String],
    mut each: impl FnMut(usize, Vec<u8>) -> Result<(), SourceError>,
) -> Result<(), SourceError> {
    if oids.is_empty() {
        return Ok(());
    }
    let mut c = git_as(reader, who);
    c.args(["cat-file", "--batch"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
    let (mut child, watchdog) = spawn_watched(&mut c)?;
    let mut stdin = child.stdin.take().ok_or_else(|| refused("git cat-file has no stdin"))?;
    let requests: String = oids.iter().map(|o| format!("{o}\n")).collect();
    let writer = std::thread::spawn(move || stdin.write_all(requests.as_bytes()));
    let mut out = BufReader::new(child.stdout.take().ok_or_else(|| refused("git cat-file has no stdout"))?);
    let mut read_all = || -> Result<(), SourceError> {
        for (i, oid) in oids.iter().enumerate() {
            let mut header = String::new();
            out.read_line(&mut header)?;
            let f: Vec<&str> = header.split_whitespace().collect();
            let size: u64 = match f.as_slice() {
                [o, "blob", s] if o == oid => s.parse().map_err(|_| refused("unexpected cat-file output"))?,
                _ => return Err(refused(format!("object {oid} is missing or not a blob ({})", header.trim()))),
            };
            let mut bytes = Vec::with_capacity(size as usize);
            (&mut out).take(size).read_to_end(&mut bytes)?;
            let mut nl = [0u8; 1];
            out.read_exact(&mut nl)?;
            each(i, bytes)?;
        }
        Ok(())
    };
    // Whatever happened, git and the writer thread are ended before this returns.
    let result = read_all();
    drop(out);
    let _ = child.kill();
    let _ = child.wait();
    let _ = writer.join();
    if watchdog.disarm() {
        return Err(refused(bounded::overran("reading the tree's files")));
    }
    result
}

/// The full commit id `rev` names in `repo` now, read as [`import`] reads it (no configuration
/// of the source's, no hook), in a scratch directory under `scratch`.
pub fn resolve(repo: &Path, rev: &str, scratch: &Path) -> Result<String, SourceError> {
    let d = source_dirs(repo)?;
    let reader = fresh_reader(&d, scratch, None)?;
    resolve_commit(&d, &reader, None, rev)
}

/// Import the committed tree of `paths` at `rev` into `objects`; returns the full commit id and
/// the baseline index. Names, types and sizes are refused from the listing, before any content
/// is read; links after. With `who`, the source is read with its rights (see [`ReadAs`]): its
/// files with its file system ids, git as it, in a scratch directory of its own under the
/// system's temporary directory (`scratch`, root's, is not the client's to enter).
pub fn import(
    repo: &Path,
    rev: &str,
    paths: &[String],
    objects: &Objects,
    c: &Ceilings,
    scratch: &Path,
    who: Option<ReadAs>,
) -> Result<(String, Index), SourceError> {
    check_source_paths(paths)?;
    let client_scratch = who.map(ClientScratch::new).transpose()?;
    let scratch = client_scratch.as_ref().map_or(scratch, |s| s.0.as_path());
    let (d, reader) = {
        let _as_client = AsClient::take(who)?;
        let d = source_dirs(repo)?;
        let reader = fresh_reader(&d, scratch, who)?;
        (d, reader)
    };
    let commit = {
        let _as_client = AsClient::take(who)?;
        resolve_commit(&d, &reader, who, rev)?
    };
    let listed = list_tree(&reader, who, &commit, paths)?;
    let mut index = Index::new();
    let mut blobs: Vec<(String, String, bool)> = Vec::new();
    let mut total = 0u64;
    for e in &listed {
        snapshot::check_path(&e.path)?;
        let node = match e.mode.as_str() {
            "040000" => Node::Dir,
            "100644" | "100664" | "100755" | "120000" => {
                if e.size > c.max_file_bytes {
                    return Err(refused(format!(
                        "{:?}: {} bytes, more than {} a file",
                        e.path, e.size, c.max_file_bytes
                    )));
                }
                total += e.size;
                blobs.push((e.path.clone(), e.oid.clone(), e.mode == "120000"));
                Node::File { sha256: String::new(), size: e.size, executable: e.mode == "100755" }
            }
            "160000" => return Err(refused(format!("{:?} is a submodule: submodules are refused", e.path))),
            m => return Err(refused(format!("{:?}: git mode {m} is refused", e.path))),
        };
        if index.insert(e.path.clone(), node).is_some() {
            return Err(refused(format!("{:?}: a duplicate entry in the tree", e.path)));
        }
        if index.len() as u64 > c.max_entries || total > c.max_total_bytes {
            return Err(refused(format!(
                "the selected tree exceeds {} entries or {} bytes",
                c.max_entries, c.max_total_bytes
            )));
        }
    }
    for p in paths.iter().filter(|_| !whole(paths)) {
        if !index.contains_key(p) {
            return Err(refused(format!("source path {p:?} is not in commit {commit}")));
        }
    }
    let oids: Vec<String> = blobs.iter().map(|b| b.1.clone()).collect();
    read_blobs(&reader, who, &oids, |i, bytes| {
        let (path, _, link) = &blobs[i];
        let node = if *link {
            let target = String::from_utf8(bytes)
                .map_err(|_| refused(format!("{path:?}: a symlink target that is not UTF-8")))?;
            Node::Symlink { target }
        } else {
            let Some(Node::File { size, executable, .. }) = index.get(path) else {
                return Err(refused("index changed"));
            };
            if bytes.len() as u64 != *size {
                return Err(refused(format!("{path:?}: the blob's size differs from the tree's")));
            }
            Node::File { sha256: objects.put(&bytes)?, size: *size, executable: *executable }
        };
        index.insert(path.clone(), node);
        Ok(())
    })?;
    snapshot::check_index(&index, c)?;
    Ok((commit, index))
}

/// A scratch directory of a client's (mode 0700, its owner), removed when dropped.
struct ClientScratch(PathBuf);

impl ClientScratch {
    fn new(who: ReadAs) -> Result<ClientScratch, SourceError> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("chio-source-{}-{}-{nanos}", who.uid, std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let scratch = ClientScratch(dir);
        std::os::unix::fs::lchown(&scratch.0, Some(who.uid), Some(who.gid))?;
        Ok(scratch)
    }
}

impl Drop for ClientScratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_paths_are_literal_canonical_and_disjoint() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        check_source_paths(&s(&["package", "docs/a.md", ":(glob)*"])).unwrap();
        for bad in [&[][..], &["a", "a/b"], &["a", "a"], &["/a"], &["a/"], &["a/../b"], &[".git"], &["a/.git/x"]] {
            assert!(check_source_paths(&s(bad)).is_err(), "{bad:?} accepted");
        }
        let many: Vec<String> = (0..65).map(|i| format!("p{i}")).collect();
        assert!(check_source_paths(&many).is_err());
        // `.` alone is the whole tree; beside another path it is refused.
        check_source_paths(&s(&["."])).unwrap();
        assert!(check_source_paths(&s(&[".", "package"])).is_err());
        assert!(in_scope(&s(&["."]), "README") && in_scope(&s(&["."]), "a/b/c"));
        assert!(!is_parent_of_scope(&s(&["."]), "a"));
        assert!(in_scope(&s(&["pkg"]), "pkg/a") && in_scope(&s(&["pkg"]), "pkg") && !in_scope(&s(&["pkg"]), "pkg2"));
        assert!(is_parent_of_scope(&s(&["a/b/c"]), "a/b") && !is_parent_of_scope(&s(&["a/b"]), "a/b"));
    }

    #[test]
    fn ref_names_cannot_leave_the_git_directory() {
        for bad in ["../x", "refs/../../etc/passwd", "/etc/passwd", "a b", ""] {
            assert!(!plausible_ref(bad), "{bad:?}");
        }
        assert!(plausible_ref("refs/heads/feature-1.2"));
    }
}
