//! Snapshots of a workspace: an index (path → file, directory or symlink) whose canonical JSON's
//! SHA-256 is the snapshot digest, over a content-addressed object store shared by all snapshots.
//! The live workspace is read by walking it fd-relative without following any link, and a
//! snapshot is materialized the same way. Names and shapes are checked the same way whether they
//! come from git, from a walk or from an archive.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{fchownat, symlinkat, Gid, Uid};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Schema of a snapshot index.
pub const SCHEMA: &str = "chio.repository.snapshot.v1";

/// One entry of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Node {
    /// A regular file.
    File {
        /// SHA-256 of the content (the object's name).
        sha256: String,
        /// Bytes.
        size: u64,
        /// Owner-executable (git's 100755).
        executable: bool,
    },
    /// A directory.
    Dir,
    /// A symbolic link (its target stays inside the workspace).
    Symlink {
        /// The link's target, as written.
        target: String,
    },
}

/// A snapshot: every entry by its relative path (sorted).
pub type Index = BTreeMap<String, Node>;

/// Ceilings on a snapshot's shape (DESIGN §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ceilings {
    /// Entries (files, directories, links).
    pub max_entries: u64,
    /// Bytes of one file.
    pub max_file_bytes: u64,
    /// Bytes of all files.
    pub max_total_bytes: u64,
}

impl Default for Ceilings {
    fn default() -> Self {
        Ceilings { max_entries: 8192, max_file_bytes: 16 << 20, max_total_bytes: 64 << 20 }
    }
}

/// Why a snapshot could not be taken or read.
#[derive(Debug)]
pub enum SnapshotError {
    /// The tree has a shape the leg refuses (named path and reason).
    Refused(String),
    /// Reading or writing failed.
    Io(io::Error),
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Refused(r) => f.write_str(r),
            SnapshotError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

impl From<io::Error> for SnapshotError {
    fn from(e: io::Error) -> Self {
        SnapshotError::Io(e)
    }
}

impl From<nix::Error> for SnapshotError {
    fn from(e: nix::Error) -> Self {
        SnapshotError::Io(e.into())
    }
}

fn refused(msg: impl Into<String>) -> SnapshotError {
    SnapshotError::Refused(msg.into())
}

/// The digest of an index: `sha256:` of its canonical JSON.
pub fn digest(index: &Index) -> String {
    format!("sha256:{}", hex_sha256(&canonical_bytes(index)))
}

/// The canonical JSON (RFC 8785) of an index: what its digest covers, and how it is stored.
/// Written directly — a snapshot of thousands of entries is canonicalized on every command, and
/// going through a generic JSON value cost more than the walk. Only strings, booleans and
/// integers occur, whose compact serde_json form is already canonical; member names are sorted
/// by UTF-16 code units as RFC 8785 requires (not by bytes: they differ above U+FFFF).
pub fn canonical_bytes(index: &Index) -> Vec<u8> {
    let mut keys: Vec<&String> = index.keys().collect();
    keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
    let mut out = Vec::with_capacity(index.len() * 120 + 64);
    out.extend_from_slice(b"{\"entries\":{");
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, k);
        out.push(b':');
        let _ = match &index[*k] {
            Node::File { sha256, size, executable } => {
                write!(out, "{{\"executable\":{executable},\"sha256\":\"{sha256}\",\"size\":{size},\"type\":\"file\"}}")
            }
            Node::Dir => write!(out, "{{\"type\":\"dir\"}}"),
            Node::Symlink { target } => {
                out.extend_from_slice(b"{\"target\":");
                let _ = serde_json::to_writer(&mut out, target);
                write!(out, ",\"type\":\"symlink\"}}")
            }
        };
    }
    let _ = write!(out, "}},\"schema\":\"{SCHEMA}\"}}");
    out
}

/// Parse a stored index, checking its schema and every name.
pub fn parse_index(bytes: &[u8]) -> Result<Index, SnapshotError> {
    // Entries are read as plain structs and then typed: serde's internally tagged enums buffer
    // every entry first, which made reading a large index slower than walking the tree.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        #[serde(rename = "type")]
        kind: String,
        sha256: Option<String>,
        size: Option<u64>,
        executable: Option<bool>,
        target: Option<String>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        schema: String,
        entries: BTreeMap<String, Raw>,
    }
    let doc: Doc = serde_json::from_slice(bytes).map_err(|e| refused(format!("not a snapshot index: {e}")))?;
    if doc.schema != SCHEMA {
        return Err(refused(format!("snapshot schema {:?} is not {SCHEMA}", doc.schema)));
    }
    let mut index = Index::new();
    for (path, r) in doc.entries {
        let node = match (r.kind.as_str(), r.sha256, r.size, r.executable, r.target) {
            ("file", Some(sha256), Some(size), Some(executable), None) => Node::File { sha256, size, executable },
            ("dir", None, None, None, None) => Node::Dir,
            ("symlink", None, None, None, Some(target)) => Node::Symlink { target },
            _ => return Err(refused(format!("snapshot entry {path:?} is malformed"))),
        };
        index.insert(path, node);
    }
    check_index(&index, &Ceilings { max_entries: u64::MAX, max_file_bytes: u64::MAX, max_total_bytes: u64::MAX })?;
    Ok(index)
}

/// Lowercase hex SHA-256.
pub fn hex_sha256(bytes: &[u8]) -> String {
    chio_kernel::keys::hex(&Sha256::digest(bytes))
}

/// Most components of a path the leg accepts. A walk holds a descriptor a level and a tree is
/// materialized holding one a level: a command's tree nested deeper (a loop of `mkdir a && cd a`)
/// would exhaust a daemon's descriptors (1,024 under systemd) and leave its operation without an
/// outcome, where it must be refused.
pub const MAX_DEPTH: usize = 256;

/// A relative path the leg accepts: non-empty UTF-8 components, no `.`/`..`, no `.git` (any
/// case), no control characters (a newline would forge lines of a patch), at most 4096 bytes
/// and [`MAX_DEPTH`] components.
pub fn check_path(path: &str) -> Result<(), SnapshotError> {
    let bad = |why: &str| Err(refused(format!("{path:?}: {why}")));
    if path.is_empty() || path.len() > 4096 {
        return bad("empty or longer than 4096 bytes");
    }
    if path.split('/').count() > MAX_DEPTH {
        return bad(&format!("nested more than {MAX_DEPTH} directories deep"));
    }
    if path.chars().any(char::is_control) {
        return bad("a name with a control character (newline, tab, ...)");
    }
    for c in path.split('/') {
        match c {
            "" => return bad("an absolute name or an empty component"),
            "." | ".." => return bad("a '.' or '..' component"),
            c if c.eq_ignore_ascii_case(".git") => return bad("a .git component"),
            _ => {}
        }
    }
    Ok(())
}

/// Check an index as a whole: names, parents that are directories, ceilings, and symlinks that
/// resolve inside the tree (following the tree's own links, as the kernel would).
pub fn check_index(index: &Index, c: &Ceilings) -> Result<(), SnapshotError> {
    if index.len() as u64 > c.max_entries {
        return Err(refused(format!("{} entries: more than {}", index.len(), c.max_entries)));
    }
    let mut total = 0u64;
    for (path, node) in index {
        check_path(path)?;
        if let Some((parent, _)) = path.rsplit_once('/') {
            if index.get(parent) != Some(&Node::Dir) {
                return Err(refused(format!("{path:?}: its parent is not a directory of the tree")));
            }
        }
        match node {
            Node::File { size, sha256, .. } => {
                if *size > c.max_file_bytes {
                    return Err(refused(format!("{path:?}: {size} bytes, more than {} a file", c.max_file_bytes)));
                }
                if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
                    return Err(refused(format!("{path:?}: {sha256:?} is not a SHA-256")));
                }
                total += size;
                if total > c.max_total_bytes {
                    return Err(refused(format!("more than {} bytes of content", c.max_total_bytes)));
                }
            }
            Node::Symlink { target } => check_link(index, path, target)?,
            Node::Dir => {}
        }
    }
    Ok(())
}

fn check_link(index: &Index, path: &str, target: &str) -> Result<(), SnapshotError> {
    if target.is_empty() || target.starts_with('/') || target.chars().any(char::is_control) {
        return Err(refused(format!("{path:?}: a symlink to {target:?} (absolute, empty or with control characters)")));
    }
    if resolve(index, path).is_none() {
        return Err(refused(format!("{path:?}: a symlink to {target:?} resolves outside the workspace")));
    }
    Ok(())
}

/// Resolve `path` inside the tree as the kernel would, following the tree's links: `None` when
/// it leaves the root (or loops).
fn resolve(index: &Index, path: &str) -> Option<Vec<String>> {
    let mut todo: Vec<String> = path.split('/').rev().map(str::to_string).collect();
    let mut at: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "" | "." => {}
            ".." => {
                at.pop()?;
            }
            _ => {
                at.push(c);
                if let Some(Node::Symlink { target }) = index.get(&at.join("/")) {
                    hops += 1;
                    if hops > 40 || target.starts_with('/') {
                        return None;
                    }
                    at.pop();
                    todo.extend(target.split('/').rev().map(str::to_string));
                }
            }
        }
    }
    Some(at)
}

/// The content-addressed object store (`objects/ab/cdef…`, read-only files).
#[derive(Debug)]
pub struct Objects {
    dir: PathBuf,
    /// Objects written since the last [`Objects::sync`].
    unsynced: std::sync::Mutex<Vec<PathBuf>>,
}

/// Past this many new objects one syncfs is cheaper than an fsync each.
const SYNCFS_FROM: usize = 64;

impl Objects {
    /// The store in `dir` (created if missing).
    pub fn open(dir: &Path) -> io::Result<Objects> {
        std::fs::create_dir_all(dir)?;
        Ok(Objects { dir: dir.to_path_buf(), unsynced: Default::default() })
    }

    /// Where the object `sha` lives.
    pub fn path(&self, sha: &str) -> PathBuf {
        self.dir.join(&sha[..2]).join(&sha[2..])
    }

    /// Store `bytes` unless present; returns its SHA-256. Not yet durable: [`Objects::sync`]
    /// once before anything names the object (one syncfs instead of an fsync per file).
    pub fn put(&self, bytes: &[u8]) -> io::Result<String> {
        let sha = hex_sha256(bytes);
        let dest = self.path(&sha);
        // An object of the wrong size (cut short by a power loss before its sync) is written again.
        if std::fs::metadata(&dest).is_ok_and(|m| m.len() == bytes.len() as u64) {
            return Ok(sha);
        }
        let fan = self.dir.join(&sha[..2]);
        std::fs::create_dir_all(&fan)?;
        // Written under a temporary name and renamed: a crash leaves no half object under its
        // real name (the temporary ones are swept by recovery).
        let tmp = fan.join(format!(".tmp-{}-{}", std::process::id(), &sha[2..]));
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o444).open(&tmp)?;
        f.write_all(bytes)?;
        super::crash_point("snapshot");
        std::fs::rename(&tmp, &dest)?;
        self.unsynced.lock().map_err(|_| io::Error::other("object list poisoned"))?.push(dest);
        Ok(sha)
    }

    /// Make every object written so far durable: an fsync of each and of its directory, or,
    /// for many, one syncfs of the store's file system (which also flushes whatever else the
    /// host has dirty there, so it is kept for imports).
    pub fn sync(&self) -> io::Result<()> {
        let written = std::mem::take(&mut *self.unsynced.lock().map_err(|_| io::Error::other("object list poisoned"))?);
        if written.len() >= SYNCFS_FROM {
            return Ok(nix::unistd::syncfs(File::open(&self.dir)?)?);
        }
        let mut dirs = std::collections::BTreeSet::new();
        for p in &written {
            File::open(p)?.sync_all()?;
            dirs.extend(p.parent().map(Path::to_path_buf));
        }
        for d in dirs {
            File::open(d)?.sync_all()?;
        }
        Ok(())
    }

    /// The content of `sha`, checked against its name.
    pub fn get(&self, sha: &str) -> io::Result<Vec<u8>> {
        let bytes = std::fs::read(self.path(sha))?;
        if hex_sha256(&bytes) != sha {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("object {sha} is corrupt")));
        }
        Ok(bytes)
    }
}

/// Open the host directory `path` for reading, never through a symlink.
fn open_dir(path: &Path) -> Result<OwnedFd, SnapshotError> {
    let at = chio_cage::path::open_host(path, libc::O_DIRECTORY)?;
    // open_host gives an O_PATH fd, which cannot list a directory: reopen it for reading.
    Ok(openat(&at, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?)
}

/// What a walk saw, so the next walk need not read an unchanged file nor parse the snapshot it
/// starts from: the snapshot's index and, for each regular file, its device, inode, size and
/// ctime. A command cannot forge what is compared (the kernel sets ctime on every change, and no
/// call sets it back), and, like git's racy entries, a file whose ctime is not older than the
/// walk that saw it (less a coarse-clock margin) is read again. A cache is only ever an aid: one
/// for another snapshot, or whose index does not hash to its snapshot's digest, is not used.
#[derive(Debug, Clone, Default)]
pub struct StatCache {
    /// The snapshot this cache describes.
    pub snapshot: String,
    /// When the walk began (ns since the epoch, CLOCK_REALTIME like ctime).
    pub taken_at_ns: i128,
    /// The snapshot's index.
    pub index: Index,
    stats: std::collections::HashMap<String, Stat>,
    /// Files the walk that made this cache had to read (0: every file was vouched for).
    pub files_read: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    dev: u64,
    ino: u64,
    size: u64,
    ctime_ns: i128,
}

/// Timestamps are coarse (a jiffy behind the real clock at most); ctime must be older than the
/// walk by more than this to be trusted.
const RACY_MARGIN_NS: i128 = 50_000_000;
const CACHE_MAGIC: &str = "chio-statcache-1";

fn ctime_ns(st: &nix::sys::stat::FileStat) -> i128 {
    st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128
}

impl StatCache {
    /// Read a cache file for `snapshot`; `None` when missing, unreadable, for another snapshot,
    /// or not matching its digest. Fields are tab-separated: no name or link target the leg
    /// accepts holds a tab or a newline.
    pub fn load(path: &Path, snapshot: &str) -> Option<StatCache> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut lines = text.split('\n');
        let mut head = lines.next()?.split('\t');
        if head.next()? != CACHE_MAGIC || head.next()? != snapshot {
            return None;
        }
        let mut c =
            StatCache { snapshot: snapshot.to_string(), taken_at_ns: head.next()?.parse().ok()?, ..Default::default() };
        for l in lines.filter(|l| !l.is_empty()) {
            let mut f = l.split('\t');
            match f.next()? {
                "f" => {
                    let executable = f.next()? == "1";
                    let size = f.next()?.parse().ok()?;
                    let sha256 = f.next()?.to_string();
                    let st = Stat {
                        dev: f.next()?.parse().ok()?,
                        ino: f.next()?.parse().ok()?,
                        size,
                        ctime_ns: f.next()?.parse().ok()?,
                    };
                    let p = f.next()?.to_string();
                    c.stats.insert(p.clone(), st);
                    c.index.insert(p, Node::File { sha256, size, executable });
                }
                "d" => {
                    c.index.insert(f.next()?.to_string(), Node::Dir);
                }
                "l" => {
                    let target = f.next()?.to_string();
                    c.index.insert(f.next()?.to_string(), Node::Symlink { target });
                }
                _ => return None,
            }
        }
        (digest(&c.index) == snapshot).then_some(c)
    }

    /// Write it (atomically; no fsync: a lost or stale cache only costs reading files again).
    pub fn save(&self, path: &Path) -> io::Result<()> {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(self.index.len() * 160);
        let _ = writeln!(out, "{CACHE_MAGIC}\t{}\t{}", self.snapshot, self.taken_at_ns);
        for (p, node) in &self.index {
            let _ = match node {
                Node::File { sha256, size, executable } => match self.stats.get(p) {
                    Some(s) => writeln!(
                        out,
                        "f\t{}\t{size}\t{sha256}\t{}\t{}\t{}\t{p}",
                        u8::from(*executable),
                        s.dev,
                        s.ino,
                        s.ctime_ns
                    ),
                    // No stat: a ctime of 0 and an impossible inode, never trusted.
                    None => writeln!(out, "f\t{}\t{size}\t{sha256}\t0\t0\t0\t{p}", u8::from(*executable)),
                },
                Node::Dir => writeln!(out, "d\t{p}"),
                Node::Symlink { target } => writeln!(out, "l\t{target}\t{p}"),
            };
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, out)?;
        std::fs::rename(tmp, path)
    }

    fn trusted(&self, path: &str, st: &nix::sys::stat::FileStat) -> Option<String> {
        let s = self.stats.get(path)?;
        let same =
            s.dev == st.st_dev && s.ino == st.st_ino && s.size == st.st_size as u64 && s.ctime_ns == ctime_ns(st);
        match self.index.get(path) {
            Some(Node::File { sha256, .. }) if same && s.ino != 0 && s.ctime_ns < self.taken_at_ns - RACY_MARGIN_NS => {
                Some(sha256.clone())
            }
            _ => None,
        }
    }
}

fn now_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

/// Walk the live workspace at `root` (fd-relative, no link followed), storing new file contents
/// in `objects`. `skip` names entries (relative paths, at any depth) that are not part of a
/// snapshot and are never looked into. A file the
/// `cache` (for the snapshot the workspace held before) vouches for is not read again. Returns
/// the index and the cache for it (its `snapshot` left for the caller to fill in).
pub fn walk(
    root: &Path,
    objects: &Objects,
    c: &Ceilings,
    skip: &[&str],
    cache: Option<&StatCache>,
) -> Result<(Index, StatCache), SnapshotError> {
    let fd = open_dir(root)?;
    let seen = StatCache { taken_at_ns: now_ns(), ..StatCache::default() };
    let mut w = Walker { objects, c, total: 0, cache, seen, skip };
    w.dir(fd, "")?;
    check_index(&w.seen.index, c)?;
    let index = w.seen.index.clone();
    Ok((index, w.seen))
}

struct Walker<'a> {
    objects: &'a Objects,
    c: &'a Ceilings,
    total: u64,
    cache: Option<&'a StatCache>,
    seen: StatCache,
    skip: &'a [&'a str],
}

impl Walker<'_> {
    fn dir(&mut self, fd: OwnedFd, prefix: &str) -> Result<(), SnapshotError> {
        let mut names = Vec::new();
        let mut dir = Dir::from_fd(fd)?;
        for e in dir.iter() {
            let name = e?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(name);
            }
            // A command can leave millions of names in one directory: refused as they are read,
            // not after all of them are held.
            if (self.seen.index.len() + names.len()) as u64 > self.c.max_entries.saturating_add(self.skip.len() as u64)
            {
                let dir = if prefix.is_empty() { "the top directory".to_string() } else { format!("{prefix:?}") };
                return Err(refused(format!("more than {} entries (counted as {dir} was read)", self.c.max_entries)));
            }
        }
        let dfd = dir.as_fd();
        for name in names {
            let name = String::from_utf8(name).map_err(|n| {
                refused(format!("{prefix}{}: a name that is not UTF-8", String::from_utf8_lossy(n.as_bytes())))
            })?;
            let path = format!("{prefix}{name}");
            if self.skip.contains(&path.as_str()) {
                continue;
            }
            check_path(&path)?;
            if self.seen.index.len() as u64 >= self.c.max_entries {
                return Err(refused(format!("more than {} entries", self.c.max_entries)));
            }
            let st = fstatat(dfd, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
            let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
            let node = match kind {
                SFlag::S_IFDIR => Node::Dir,
                SFlag::S_IFREG => self.file(dfd, &name, &path, st)?,
                SFlag::S_IFLNK => {
                    let target = readlinkat(dfd, name.as_str())?;
                    let target = target
                        .to_str()
                        .ok_or_else(|| refused(format!("{path:?}: a symlink whose target is not UTF-8")))?;
                    Node::Symlink { target: target.to_string() }
                }
                _ => return Err(refused(format!("{path:?}: a FIFO, socket or device node"))),
            };
            let is_dir = node == Node::Dir;
            self.seen.index.insert(path.clone(), node);
            if is_dir {
                let sub = openat(
                    dfd,
                    name.as_str(),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )?;
                self.dir(sub, &format!("{path}/"))?;
            }
        }
        Ok(())
    }

    fn file(
        &mut self,
        dfd: BorrowedFd<'_>,
        name: &str,
        path: &str,
        st: nix::sys::stat::FileStat,
    ) -> Result<Node, SnapshotError> {
        if st.st_nlink > 1 {
            return Err(refused(format!("{path:?}: a hard link ({} names for one file)", st.st_nlink)));
        }
        let size = st.st_size as u64;
        if size > self.c.max_file_bytes {
            return Err(refused(format!("{path:?}: {size} bytes, more than {} a file", self.c.max_file_bytes)));
        }
        self.total += size;
        if self.total > self.c.max_total_bytes {
            return Err(refused(format!("more than {} bytes of content", self.c.max_total_bytes)));
        }
        let executable = st.st_mode & 0o100 != 0;
        self.seen
            .stats
            .insert(path.to_string(), Stat { dev: st.st_dev, ino: st.st_ino, size, ctime_ns: ctime_ns(&st) });
        if let Some(sha256) = self.cache.and_then(|c| c.trusted(path, &st)) {
            return Ok(Node::File { sha256, size, executable });
        }
        let fd = openat(
            dfd,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        )?;
        let mut bytes = Vec::with_capacity(size as usize);
        // Nothing runs in the workspace any more; the bound is only against a size that changed.
        File::from(fd).take(self.c.max_file_bytes + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 != size {
            return Err(refused(format!("{path:?}: changed while it was read")));
        }
        let sha256 = self.objects.put(&bytes)?;
        self.seen.files_read += 1;
        Ok(Node::File { sha256, size, executable })
    }
}

/// Create the tree of `index` under the empty directory `root` (fd-relative, no link followed),
/// owned by `owner` (uid, gid) when given.
pub fn materialize(
    index: &Index,
    objects: &Objects,
    root: &Path,
    owner: Option<(u32, u32)>,
) -> Result<(), SnapshotError> {
    // Depth first (by components, where the index's order puts `a-b` between `a` and `a/x`), so
    // only the directories above the entry made are open: one descriptor a level, not one a
    // directory of the tree.
    let mut order: Vec<(&String, &Node)> = index.iter().collect();
    order.sort_by(|a, b| a.0.split('/').cmp(b.0.split('/')));
    let mut open: Vec<(&str, OwnedFd)> = vec![("", open_dir(root)?)];
    let chown = |dfd: BorrowedFd<'_>, name: &str| -> Result<(), SnapshotError> {
        if let Some((u, g)) = owner {
            fchownat(dfd, name, Some(Uid::from_raw(u)), Some(Gid::from_raw(g)), AtFlags::AT_SYMLINK_NOFOLLOW)?;
        }
        Ok(())
    };
    for (path, node) in order {
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        while open.last().is_some_and(|(p, _)| *p != parent) {
            open.pop();
        }
        let dfd = open.last().ok_or_else(|| refused(format!("{path:?}: parent missing")))?.1.as_fd();
        match node {
            Node::Dir => {
                mkdirat(dfd, name, Mode::from_bits_truncate(0o755))?;
                chown(dfd, name)?;
                let sub = openat(
                    dfd,
                    name,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )?;
                open.push((path, sub));
            }
            Node::File { sha256, executable, .. } => {
                let bytes = objects.get(sha256)?;
                let mode = if *executable { 0o755 } else { 0o644 };
                let fd = openat(
                    dfd,
                    name,
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(mode),
                )?;
                // The umask must not narrow the mode the snapshot says.
                fchmod(&fd, Mode::from_bits_truncate(mode))?;
                File::from(fd).write_all(&bytes)?;
                chown(dfd, name)?;
            }
            Node::Symlink { target } => {
                symlinkat(OsStr::new(target), dfd, name)?;
                chown(dfd, name)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sha: &str) -> Node {
        Node::File { sha256: sha.repeat(64), size: 1, executable: false }
    }

    #[test]
    fn names_that_could_escape_or_forge_are_refused() {
        for bad in ["", "/a", "a//b", "a/", "./a", "a/../b", "..", ".git", "a/.GIT/x", "a\nb", "a\tb"] {
            assert!(matches!(check_path(bad), Err(SnapshotError::Refused(_))), "{bad:?} accepted");
        }
        for good in ["a", "a/b.txt", ".gitignore", "a/.github/x", "..a", "a.."] {
            check_path(good).unwrap();
        }
        // 4096 bytes at most.
        let longest = format!("{}/{}", "n".repeat(255), "m".repeat(3840));
        check_path(&longest).unwrap();
        assert!(check_path(&format!("{longest}m")).is_err(), "4097 bytes accepted");
        let deepest = vec!["d"; MAX_DEPTH].join("/");
        check_path(&deepest).unwrap();
        assert!(check_path(&format!("{deepest}/d")).is_err(), "{} components accepted", MAX_DEPTH + 1);
    }

    #[test]
    fn links_must_resolve_inside_following_the_trees_own_links() {
        let mut ix = Index::new();
        ix.insert("d".into(), Node::Dir);
        ix.insert("d/up".into(), Node::Symlink { target: "..".into() });
        ix.insert("d/f".into(), file("a"));
        check_index(&ix, &Ceilings::default()).unwrap();
        // Lexically "d/up/.." is "d", but d/up is the root, and the root's parent is outside.
        ix.insert("d/out".into(), Node::Symlink { target: "up/..".into() });
        assert!(check_index(&ix, &Ceilings::default()).is_err());
        ix.remove("d/out");
        // `.` and empty components are no directory to climb out of: `./../..` from `d/` leaves.
        for t in ["/etc/passwd", "../..", "../../x", "", "./../..", "..//..", ".././.."] {
            ix.insert("d/l".into(), Node::Symlink { target: t.into() });
            assert!(check_index(&ix, &Ceilings::default()).is_err(), "{t:?} accepted");
        }
        ix.insert("d/l".into(), Node::Symlink { target: "l".into() });
        assert!(check_index(&ix, &Ceilings::default()).is_err(), "a loop accepted");
        // A chain of 40 links resolves (the kernel follows as many); 41 do not.
        ix.remove("d/l");
        for n in 1..=41 {
            ix.insert(
                format!("d/c{n}"),
                Node::Symlink { target: if n == 1 { ".".into() } else { format!("c{}", n - 1) } },
            );
        }
        ix.remove("d/c41");
        check_index(&ix, &Ceilings::default()).unwrap();
        ix.insert("d/c41".into(), Node::Symlink { target: "c40".into() });
        assert!(check_index(&ix, &Ceilings::default()).is_err(), "41 links followed");
    }

    #[test]
    fn ceilings_and_parents() {
        let mut ix = Index::new();
        ix.insert("a/b".into(), file("a"));
        assert!(check_index(&ix, &Ceilings::default()).is_err(), "a file without its parent");
        ix.insert("a".into(), Node::Dir);
        check_index(&ix, &Ceilings::default()).unwrap();
        let c = Ceilings { max_entries: 1, ..Ceilings::default() };
        assert!(check_index(&ix, &c).is_err());
        ix.insert("a/b".into(), Node::File { sha256: "a".repeat(64), size: (16 << 20) + 1, executable: false });
        assert!(check_index(&ix, &Ceilings::default()).is_err());
        // 64 MiB in all (by the sizes the index states) at most.
        ix.insert("a/b".into(), file("a"));
        let mut all = ix.clone();
        for i in 0..4 {
            all.insert(format!("a/{i}"), Node::File { sha256: "b".repeat(64), size: 16 << 20, executable: false });
        }
        all.remove("a/b");
        check_index(&all, &Ceilings::default()).unwrap();
        all.insert("a/b".into(), file("a"));
        assert!(check_index(&all, &Ceilings::default()).is_err(), "64 MiB and a byte accepted");
        // An object's name is 64 lowercase hex digits, no fewer (a short one would be sliced
        // into the store's fan-out), no other character.
        for bad in ["ab".to_string(), "g".repeat(64), "A".repeat(64), "a".repeat(65)] {
            ix.insert("a/b".into(), Node::File { sha256: bad.clone(), size: 1, executable: false });
            assert!(check_index(&ix, &Ceilings::default()).is_err(), "{bad:?} accepted");
        }
    }

    /// A scratch directory under the system temp dir, removed when dropped.
    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn scratch(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("chio-snapshot-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        Scratch(d)
    }

    /// The entry ceiling holds as a directory's names are read, and what the walk skips does not
    /// count: exactly the ceiling passes beside a skipped `.git`, one more is refused.
    #[test]
    fn the_entry_ceiling_counts_names_as_they_are_read() {
        let s = scratch("entries");
        let (src, obj) = (s.0.join("src"), Objects::open(&s.0.join("objects")).unwrap());
        std::fs::create_dir_all(src.join(".git")).unwrap();
        for n in ["a", "b", "c"] {
            std::fs::write(src.join(n), n).unwrap();
        }
        let c = Ceilings { max_entries: 3, ..Ceilings::default() };
        assert_eq!(walk(&src, &obj, &c, &[".git"], None).unwrap().0.len(), 3);
        std::fs::write(src.join("d"), "d").unwrap();
        let r = walk(&src, &obj, &c, &[".git"], None);
        let early = "more than 3 entries (counted as the top directory was read)";
        assert!(matches!(&r, Err(SnapshotError::Refused(m)) if m == early), "{r:?}");
    }

    /// The byte ceiling stops the walk's reading: no file past it is read into the store.
    /// Exactly the ceiling passes.
    #[test]
    fn the_byte_ceiling_stops_the_reading() {
        let s = scratch("bytes");
        let (src, objects) = (s.0.join("src"), s.0.join("objects"));
        std::fs::create_dir(&src).unwrap();
        for n in ["a", "b"] {
            std::fs::write(src.join(n), n.repeat(8)).unwrap();
        }
        let c = Ceilings { max_total_bytes: 16, ..Ceilings::default() };
        walk(&src, &Objects::open(&objects).unwrap(), &c, &[], None).unwrap();
        std::fs::remove_dir_all(&objects).unwrap();
        std::fs::write(src.join("c"), "c".repeat(8)).unwrap();
        let r = walk(&src, &Objects::open(&objects).unwrap(), &c, &[], None);
        assert!(matches!(&r, Err(SnapshotError::Refused(m)) if m.contains("bytes of content")), "{r:?}");
        let stored: usize =
            std::fs::read_dir(&objects).unwrap().map(|f| std::fs::read_dir(f.unwrap().path()).unwrap().count()).sum();
        assert_eq!(stored, 2, "a file past the ceiling was read");
    }

    #[test]
    fn walk_and_materialize_round_trip_and_refuse_host_shapes() {
        let s = scratch("walk");
        let (src, dst, obj) = (s.0.join("src"), s.0.join("dst"), Objects::open(&s.0.join("objects")).unwrap());
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join("a/b/f.txt"), b"hello").unwrap();
        // Sorted by name, `a-z` comes between `a` and `a/b`: materialized depth first all the same.
        std::fs::create_dir_all(src.join("a-z/y")).unwrap();
        std::fs::write(src.join("a-z/y/g"), b"g").unwrap();
        std::fs::write(src.join("run.sh"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(src.join("run.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("b/f.txt", src.join("a/link")).unwrap();
        std::fs::create_dir(src.join(".git")).unwrap();
        let (ix, _) = walk(&src, &obj, &Ceilings::default(), &[".git"], None).unwrap();
        let names: Vec<&str> = ix.keys().map(String::as_str).collect();
        assert_eq!(names, ["a", "a-z", "a-z/y", "a-z/y/g", "a/b", "a/b/f.txt", "a/link", "run.sh"]);
        assert!(matches!(ix["run.sh"], Node::File { executable: true, .. }));
        std::fs::create_dir(&dst).unwrap();
        materialize(&ix, &obj, &dst, None).unwrap();
        assert_eq!(digest(&walk(&dst, &obj, &Ceilings::default(), &[], None).unwrap().0), digest(&ix));
        // Host shapes the leg refuses: a hard link, a FIFO, a link out of the tree.
        std::fs::hard_link(src.join("a/b/f.txt"), src.join("hard")).unwrap();
        assert!(
            matches!(walk(&src, &obj, &Ceilings::default(), &[".git"], None), Err(SnapshotError::Refused(m)) if m.contains("hard link"))
        );
        std::fs::remove_file(src.join("hard")).unwrap();
        nix::unistd::mkfifo(&src.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        assert!(
            matches!(walk(&src, &obj, &Ceilings::default(), &[".git"], None), Err(SnapshotError::Refused(m)) if m.contains("FIFO"))
        );
        std::fs::remove_file(src.join("fifo")).unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", src.join("a/out")).unwrap();
        assert!(
            matches!(walk(&src, &obj, &Ceilings::default(), &[".git"], None), Err(SnapshotError::Refused(m)) if m.contains("outside"))
        );
    }

    #[test]
    fn the_stat_cache_is_trusted_only_for_old_unchanged_files() {
        let s = scratch("cache");
        let (src, obj) = (s.0.join("src"), Objects::open(&s.0.join("objects")).unwrap());
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::os::unix::fs::symlink("f", src.join("l")).unwrap();
        std::fs::write(src.join("f"), b"one").unwrap();
        let c = Ceilings::default();
        let forged = "f".repeat(64);
        let sha_of = |ix: &Index| match &ix["f"] {
            Node::File { sha256, .. } => sha256.clone(),
            other => panic!("{other:?}"),
        };
        // A cache entry whose hash is forged shows whether the walk trusted it or read the file.
        let (_, mut cache) = walk(&src, &obj, &c, &[], None).unwrap();
        cache.index.insert("f".into(), Node::File { sha256: forged.clone(), size: 3, executable: false });
        // Just taken: racy, so the file is read again.
        let (ix, _) = walk(&src, &obj, &c, &[], Some(&cache)).unwrap();
        assert_ne!(sha_of(&ix), forged, "a racy entry was trusted");
        // Older than the margin and unchanged: trusted (and survives a save and load).
        cache.taken_at_ns += 10 * RACY_MARGIN_NS;
        cache.snapshot = digest(&cache.index);
        let saved = s.0.join("cache");
        cache.save(&saved).unwrap();
        assert!(StatCache::load(&saved, "sha256:other").is_none(), "a cache for another snapshot was used");
        let loaded = StatCache::load(&saved, &cache.snapshot).unwrap();
        assert_eq!((&loaded.index, &loaded.snapshot), (&cache.index, &cache.snapshot));
        std::fs::write(&saved, std::fs::read_to_string(&saved).unwrap().replace("\tf\n", "\tg\n")).unwrap();
        assert!(StatCache::load(&saved, &cache.snapshot).is_none(), "an edited cache was used");
        let (ix, _) = walk(&src, &obj, &c, &[], Some(&loaded)).unwrap();
        assert_eq!(sha_of(&ix), forged, "an old unchanged entry was read again");
        // A same-size rewrite moves ctime: read again.
        std::fs::write(src.join("f"), b"two").unwrap();
        let (ix, _) = walk(&src, &obj, &c, &[], Some(&loaded)).unwrap();
        assert_eq!(sha_of(&ix), hex_sha256(b"two"));
    }

    /// An object cut short (a power loss before its sync) is written again by the next `put`
    /// of its content, not taken as present.
    #[test]
    fn a_short_object_is_written_again() {
        let s = scratch("objects");
        let obj = Objects::open(&s.0.join("objects")).unwrap();
        let sha = obj.put(b"content").unwrap();
        std::fs::set_permissions(obj.path(&sha), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        std::fs::write(obj.path(&sha), b"cont").unwrap();
        assert!(obj.get(&sha).is_err());
        assert_eq!(obj.put(b"content").unwrap(), sha);
        assert_eq!(obj.get(&sha).unwrap(), b"content");
    }

    #[test]
    fn canonical_bytes_are_rfc8785() {
        let mut ix = Index::new();
        for name in ["a", "\u{ff01}", "\u{1f600}", "q\"uote\\", "é", "d"] {
            ix.insert(name.into(), file("a"));
        }
        ix.insert("d".into(), Node::Dir);
        ix.insert("l".into(), Node::Symlink { target: "t\"x\u{1f600}".into() });
        let doc = serde_json::json!({ "schema": SCHEMA, "entries": ix });
        let want = chio_kernel::canonical::to_canonical(&doc).unwrap();
        assert_eq!(String::from_utf8(canonical_bytes(&ix)).unwrap(), want);
    }

    #[test]
    fn digest_depends_on_every_field() {
        let mut ix = Index::new();
        ix.insert("f".into(), file("a"));
        let d1 = digest(&ix);
        ix.insert("f".into(), Node::File { sha256: "a".repeat(64), size: 1, executable: true });
        assert_ne!(d1, digest(&ix));
        assert_eq!(parse_index(&canonical_bytes(&ix)).unwrap(), ix);
        ix.insert("d".into(), Node::Dir);
        ix.insert("l".into(), Node::Symlink { target: "f".into() });
        assert_eq!(parse_index(&canonical_bytes(&ix)).unwrap(), ix);
        let bad =
            String::from_utf8(canonical_bytes(&ix)).unwrap().replace(r#"{"type":"dir"}"#, r#"{"size":1,"type":"dir"}"#);
        assert!(parse_index(bad.as_bytes()).is_err());
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// Where a walk of 8,000 small files spends its time (run by hand:
    /// `cargo test --release -p chio-supervisor walk_cost -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn walk_cost() {
        let root = std::env::temp_dir().join(format!("chio-walk-cost-{}", std::process::id()));
        let (src, obj) = (root.join("src"), Objects::open(&root.join("objects")).unwrap());
        for i in 0..8000 {
            let d = src.join(format!("pkg/d{}", i / 100));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("f{i}.txt")), format!("line {i}\n").repeat(8)).unwrap();
        }
        let c = Ceilings::default();
        let t = std::time::Instant::now();
        let (ix, mut cache) = walk(&src, &obj, &c, &[], None).unwrap();
        println!("cold walk {:?}", t.elapsed());
        cache.taken_at_ns += 10 * RACY_MARGIN_NS;
        let t = std::time::Instant::now();
        let mut ix2 = Index::new();
        for _ in 0..20 {
            ix2 = walk(&src, &obj, &c, &[], Some(&cache)).unwrap().0;
        }
        println!("cached walk {:?}", t.elapsed() / 20);
        let t = std::time::Instant::now();
        let bytes = canonical_bytes(&ix2);
        println!("canonical {:?} ({} bytes)", t.elapsed(), bytes.len());
        let t = std::time::Instant::now();
        let _ = hex_sha256(&bytes);
        println!("sha {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let parsed = parse_index(&bytes).unwrap();
        println!("parse {:?}", t.elapsed());
        let t = std::time::Instant::now();
        check_index(&parsed, &c).unwrap();
        println!("check_index {:?}", t.elapsed());
        let t = std::time::Instant::now();
        cache.save(&root.join("cache")).unwrap();
        println!("cache save {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let _ = StatCache::load(&root.join("cache"), "sha256:x");
        println!("cache load {:?}", t.elapsed());
        assert_eq!(ix, ix2);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
