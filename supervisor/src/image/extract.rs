//! Applying one (already decompressed) tar layer onto a root directory, safely.
//!
//! Every operation is relative to a directory fd: parents are walked one component at a time with
//! `O_NOFOLLOW`, so nothing is ever written through a symlink, whatever the layer planted. Names
//! with `..` or a leading `/` are refused; hardlink targets must be regular files inside the root;
//! an existing entry is removed before a new one is created; whiteouts (`.wh.name`, and the opaque
//! `.wh..wh..opq`) remove lower-layer entries only — what this layer created survives. Device nodes
//! are skipped and reported, FIFOs too unless allowed; setuid/setgid bits are kept (the cage mounts
//! nosuid) and reported; only `user.*` xattrs are applied; uid/gid are numeric. PAX and GNU
//! long-name headers are parsed here, after a size check, so a header bomb is refused before it is
//! read. Budgets cap entries, bytes, header size, path length and depth.

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{self, FchmodatFlags, Mode, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{unlinkat, Gid, Uid, UnlinkatFlags};
use sha2::{Digest, Sha256};
use tar::EntryType;

/// Limits for one import (shared by all its layers through [`Totals`]).
#[derive(Debug, Clone)]
pub struct Budgets {
    /// Entries across all layers.
    pub max_entries: u64,
    /// Decompressed bytes of file content across all layers; also the most one layer's whole
    /// decompressed stream may hold (what follows its end marker counts, and is hashed).
    pub max_bytes: u64,
    /// Size of one PAX or GNU long-name header.
    pub max_header: u64,
    /// Bytes in one path.
    pub max_path: usize,
    /// Components in one path.
    pub max_depth: usize,
    /// Create FIFOs (otherwise skipped and reported).
    pub allow_fifos: bool,
}

impl Default for Budgets {
    /// Generous for real toolchain images of several GiB.
    fn default() -> Self {
        Budgets {
            max_entries: 4_000_000,
            max_bytes: 64 << 30,
            max_header: 1 << 20,
            max_path: 4096,
            max_depth: 256,
            allow_fifos: false,
        }
    }
}

/// Running totals across the layers of one import.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    /// Entries seen.
    pub entries: u64,
    /// File bytes written.
    pub bytes: u64,
}

/// What a layer contained that deserves an operator's attention.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LayerReport {
    /// Files kept with setuid/setgid bits.
    pub setuid: Vec<String>,
    /// Device nodes not created.
    pub skipped_devices: Vec<String>,
    /// FIFOs not created.
    pub skipped_fifos: Vec<String>,
    /// SHA-256 of each regular file's content as written, by inode, so the store's tree digest
    /// need not read the tree back.
    pub content: std::collections::HashMap<u64, [u8; 32]>,
}

/// A writer that hashes what it writes.
struct HashingWriter<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Why a layer was refused.
#[derive(Debug)]
pub enum ExtractError {
    /// A hostile or malformed entry.
    Refused {
        /// The entry's path as written in the layer.
        path: String,
        /// Why.
        why: String,
    },
    /// A budget was exceeded.
    Budget(String),
    /// An I/O error.
    Io {
        /// The entry.
        path: String,
        /// The error.
        err: io::Error,
    },
}

impl std::fmt::Display for ExtractError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtractError::Refused { path, why } => write!(f, "layer entry {path:?} refused: {why}"),
            ExtractError::Budget(e) => write!(f, "layer exceeds a budget: {e}"),
            ExtractError::Io { path, err } => write!(f, "layer entry {path:?}: {err}"),
        }
    }
}

impl std::error::Error for ExtractError {}

fn refused(path: &[u8], why: impl Into<String>) -> ExtractError {
    ExtractError::Refused { path: String::from_utf8_lossy(path).into_owned(), why: why.into() }
}

fn io_err(path: &[u8]) -> impl Fn(io::Error) -> ExtractError + '_ {
    move |err| ExtractError::Io { path: String::from_utf8_lossy(path).into_owned(), err }
}

/// One component, as every `*at` call below takes it. A `/` would let the call leave the
/// directory it is relative to (an absolute name ignores it altogether), and `.` or `..` would
/// name another directory: `components` never yields these, and this refuses them again at the
/// one place every name passes, so no slip there can point a removal at the host.
fn cstr(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a single name")));
    }
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    chio_cage::sys::openat(dir, name, flags, mode)
}

fn lstatat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<libc::stat>> {
    match stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The normal components of a layer path; `..` and absolute names are refused.
fn components(raw: &[u8], b: &Budgets) -> Result<Vec<OsString>, ExtractError> {
    if raw.len() > b.max_path {
        return Err(ExtractError::Budget(format!("path of {} bytes (limit {})", raw.len(), b.max_path)));
    }
    if raw.starts_with(b"/") {
        return Err(refused(raw, "absolute path"));
    }
    let mut out = Vec::new();
    for c in raw.split(|x| *x == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(refused(raw, "path contains '..'")),
            c => out.push(OsStr::from_bytes(c).to_os_string()),
        }
    }
    if out.len() > b.max_depth {
        return Err(ExtractError::Budget(format!("path of depth {} (limit {})", out.len(), b.max_depth)));
    }
    Ok(out)
}

/// Open the directory holding `names[..n-1]` below `root`, one `O_NOFOLLOW` step at a time;
/// missing directories are created when `create`. A symlink on the way is resolved *inside the
/// root*, as containerd and umoci do (`openat2(RESOLVE_IN_ROOT)`: an absolute target or `..`
/// cannot leave it), so a layer adding `bin/foo` over a base whose `bin -> usr/bin` writes
/// `usr/bin/foo`. Nothing is ever written outside the root.
fn open_parent(root: BorrowedFd<'_>, names: &[OsString], create: bool, raw: &[u8]) -> Result<OwnedFd, ExtractError> {
    let mut cur = openat(root, c".", libc::O_PATH | libc::O_DIRECTORY, 0).map_err(io_err(raw))?;
    let dirs = &names[..names.len().saturating_sub(1)];
    for (i, name) in dirs.iter().enumerate() {
        let c = cstr(name).map_err(io_err(raw))?;
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        cur = match openat(cur.as_fd(), &c, flags, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                stat::mkdirat(cur.as_fd(), c.as_c_str(), Mode::from_bits_truncate(0o755))
                    .map_err(|e| io_err(raw)(e.into()))?;
                openat(cur.as_fd(), &c, flags, 0).map_err(io_err(raw))?
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => in_root(root, &dirs[..=i], raw)?,
            Err(e) => return Err(io_err(raw)(e)),
        };
    }
    Ok(cur)
}

/// Resolve the directory `prefix` inside `root`, following symlinks as if `root` were `/`.
fn in_root(root: BorrowedFd<'_>, prefix: &[OsString], raw: &[u8]) -> Result<OwnedFd, ExtractError> {
    let path: std::path::PathBuf = prefix.iter().collect();
    let shown = path.to_string_lossy().into_owned();
    chio_cage::path::resolve_in(root, &path, libc::O_PATH | libc::O_DIRECTORY).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTDIR) => refused(raw, format!("{shown} is not a directory")),
        Some(libc::ENOENT) => refused(raw, format!("{shown} is a symlink to a directory the image does not have")),
        Some(libc::ELOOP) => refused(raw, format!("{shown}: too many symlinks")),
        _ => io_err(raw)(e),
    })
}

/// Remove `name` below `dir` (recursively for a directory), if it exists. True when a directory
/// was removed (callers drop cached directory fds then).
fn remove(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
    let Some(st) = lstatat(dir, name)? else { return Ok(false) };
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let sub = openat(dir, name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?;
        for child in list(sub.as_fd())? {
            remove(sub.as_fd(), &child)?;
        }
        unlinkat(dir, name, UnlinkatFlags::RemoveDir)?;
        return Ok(true);
    }
    unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
    Ok(false)
}

/// Names in a directory fd.
fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    chio_cage::path::read_dir_names(dir)
}

/// Pending PAX / GNU long-name values for the next entry.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    uid: Option<u32>,
    gid: Option<u32>,
}

/// Parse PAX records (`"<len> key=value\n"`).
fn parse_pax(data: &[u8], pending: &mut Pending, raw: &[u8]) -> Result<(), ExtractError> {
    let mut rest = data;
    while !rest.is_empty() {
        let sp = rest.iter().position(|b| *b == b' ').ok_or_else(|| refused(raw, "malformed PAX record"))?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|l| *l > sp + 1 && *l <= rest.len())
            .ok_or_else(|| refused(raw, "malformed PAX record length"))?;
        let record = &rest[sp + 1..len];
        let record = record.strip_suffix(b"\n").ok_or_else(|| refused(raw, "PAX record without newline"))?;
        let eq = record.iter().position(|b| *b == b'=').ok_or_else(|| refused(raw, "PAX record without '='"))?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        let num = |v: &[u8]| std::str::from_utf8(v).ok().and_then(|s| s.parse::<u32>().ok());
        match key {
            b"path" => pending.path = Some(value.to_vec()),
            b"linkpath" => pending.link = Some(value.to_vec()),
            b"uid" => pending.uid = Some(num(value).ok_or_else(|| refused(raw, "PAX uid is not a number"))?),
            b"gid" => pending.gid = Some(num(value).ok_or_else(|| refused(raw, "PAX gid is not a number"))?),
            b"size" => return Err(refused(raw, "PAX size records (files over 8 GiB) are not supported")),
            k if k.starts_with(b"SCHILY.xattr.user.") => {
                pending.xattrs.push((k["SCHILY.xattr.".len()..].to_vec(), value.to_vec()))
            }
            _ => {} // mtime precision, other xattrs (security.*, trusted.*): not applied.
        }
        rest = &rest[len..];
    }
    Ok(())
}

fn read_header_data<R: Read>(entry: &mut tar::Entry<'_, R>, b: &Budgets, raw: &[u8]) -> Result<Vec<u8>, ExtractError> {
    let size = entry.size();
    if size > b.max_header {
        return Err(ExtractError::Budget(format!("a {size}-byte PAX/long-name header (limit {})", b.max_header)));
    }
    let mut data = Vec::with_capacity(size as usize);
    entry.read_to_end(&mut data).map_err(io_err(raw))?;
    Ok(data)
}

/// One layer application.
struct Layer<'a> {
    root: BorrowedFd<'a>,
    budgets: &'a Budgets,
    /// Paths this layer created (whiteouts never remove them).
    created: HashSet<Vec<OsString>>,
    report: LayerReport,
    /// The last entry's parent directory (entries arrive grouped by directory): taken out for
    /// each entry and put back only when no directory was removed meanwhile, and dropped by a
    /// whiteout, so a replaced directory is never written through a stale fd.
    parent_cache: Option<(Vec<OsString>, OwnedFd)>,
    /// Running as root: owners are applied (otherwise they cannot be).
    as_root: bool,
    /// Copy buffer for file content, reused (one write per 256 KiB instead of per 8 KiB).
    buf: Vec<u8>,
}

/// Apply the tar stream `layer` onto the directory `root`.
pub fn apply_layer<R: Read>(
    root: BorrowedFd<'_>,
    layer: R,
    budgets: &Budgets,
    totals: &mut Totals,
) -> Result<LayerReport, ExtractError> {
    let mut archive = tar::Archive::new(layer);
    let entries = archive.entries().map_err(io_err(b"(layer)"))?.raw(true);
    let mut l = Layer {
        root,
        budgets,
        created: HashSet::new(),
        report: LayerReport::default(),
        parent_cache: None,
        as_root: nix::unistd::geteuid().is_root(),
        buf: vec![0; 256 << 10],
    };
    let mut pending = Pending::default();
    for entry in entries {
        let mut entry = entry.map_err(io_err(b"(layer)"))?;
        totals.entries += 1;
        if totals.entries > budgets.max_entries {
            return Err(ExtractError::Budget(format!("more than {} entries", budgets.max_entries)));
        }
        let header_path = entry.path_bytes().into_owned();
        match entry.header().entry_type() {
            EntryType::XHeader => {
                let data = read_header_data(&mut entry, budgets, &header_path)?;
                parse_pax(&data, &mut pending, &header_path)?;
            }
            EntryType::XGlobalHeader => {
                read_header_data(&mut entry, budgets, &header_path)?;
            }
            EntryType::GNULongName | EntryType::GNULongLink => {
                let mut data = read_header_data(&mut entry, budgets, &header_path)?;
                while data.last() == Some(&0) {
                    data.pop();
                }
                if entry.header().entry_type() == EntryType::GNULongName {
                    pending.path = Some(data);
                } else {
                    pending.link = Some(data);
                }
            }
            _ => {
                let p = std::mem::take(&mut pending);
                l.entry(&mut entry, p, totals)?;
            }
        }
    }
    Ok(l.report)
}

impl Layer<'_> {
    /// The parent directory of `names`: the cached fd when it is the same directory as the
    /// previous entry's (entries arrive grouped by directory), else opened now. The caller puts
    /// it back in the cache unless it removed a directory meanwhile.
    fn take_parent(&mut self, names: &[OsString], raw: &[u8]) -> Result<(Vec<OsString>, OwnedFd), ExtractError> {
        let dir = &names[..names.len().saturating_sub(1)];
        match self.parent_cache.take() {
            Some((cached, fd)) if cached.as_slice() == dir => Ok((cached, fd)),
            _ => Ok((dir.to_vec(), open_parent(self.root, names, true, raw)?)),
        }
    }

    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        mut p: Pending,
        totals: &mut Totals,
    ) -> Result<(), ExtractError> {
        let raw = p.path.take().unwrap_or_else(|| entry.path_bytes().into_owned());
        let names = components(&raw, self.budgets)?;
        let kind = entry.header().entry_type();
        let Some(last) = names.last().cloned() else {
            // The root itself: only a directory entry is meaningful, and it changes nothing.
            return if kind == EntryType::Directory {
                Ok(())
            } else {
                Err(refused(&raw, "the root must be a directory"))
            };
        };
        let last_bytes = last.as_bytes();
        if let Some(hidden) = last_bytes.strip_prefix(b".wh.") {
            return self.whiteout(&names, hidden, &raw);
        }
        let (dir, parent) = self.take_parent(&names, &raw)?;
        let name = cstr(&last).map_err(io_err(&raw))?;
        let removed_dir = self.place(entry, &p, &names, (parent.as_fd(), &name), &raw, totals)?;
        if !removed_dir {
            self.parent_cache = Some((dir, parent));
        }
        Ok(())
    }

    /// Create one entry as `name` in `parent`. True when a directory was removed to make room.
    fn place<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        p: &Pending,
        names: &[OsString],
        (parent, name): (BorrowedFd<'_>, &CStr),
        raw: &[u8],
        totals: &mut Totals,
    ) -> Result<bool, ExtractError> {
        let mut removed_dir = false;
        let kind = entry.header().entry_type();
        let h = entry.header();
        let mode = h.mode().map_err(io_err(raw))? & 0o7777;
        // A blank numeric owner field (some writers leave it NUL) means 0; the rootfs is
        // read-only and nosuid in the cage, so root ownership grants nothing there.
        let uid = p.uid.unwrap_or_else(|| h.uid().map_or(0, |u| u as u32));
        let gid = p.gid.unwrap_or_else(|| h.gid().map_or(0, |g| g as u32));
        let mtime = h.mtime().unwrap_or(0) as i64;
        let shown = String::from_utf8_lossy(raw).into_owned();
        match kind {
            EntryType::Directory => match lstatat(parent, name).map_err(io_err(raw))? {
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                _ => {
                    removed_dir |= remove(parent, name).map_err(io_err(raw))?;
                    stat::mkdirat(parent, name, Mode::from_bits_truncate(0o700)).map_err(|e| io_err(raw)(e.into()))?;
                }
            },
            EntryType::Regular | EntryType::Continuous => {
                let size = entry.size();
                if totals.bytes + size > self.budgets.max_bytes {
                    return Err(ExtractError::Budget(format!("more than {} bytes of content", self.budgets.max_bytes)));
                }
                totals.bytes += size;
                self.regular_file(entry, p, (parent, name), (uid, gid, mode, mtime), raw, &mut removed_dir)?;
                if mode & 0o6000 != 0 {
                    self.report.setuid.push(shown);
                }
                self.created.insert(names.to_vec());
                return Ok(removed_dir);
            }
            EntryType::Symlink => {
                let target =
                    p.link.clone().or_else(|| entry.link_name_bytes().map(|c| c.into_owned())).unwrap_or_default();
                if target.is_empty() || target.len() > self.budgets.max_path {
                    return Err(refused(raw, "empty or oversized symlink target"));
                }
                removed_dir |= remove(parent, name).map_err(io_err(raw))?;
                let t = CString::new(target).map_err(|_| refused(raw, "NUL in a symlink target"))?;
                nix::unistd::symlinkat(t.as_c_str(), parent, name).map_err(|e| io_err(raw)(e.into()))?;
            }
            EntryType::Link => {
                let target =
                    p.link.clone().or_else(|| entry.link_name_bytes().map(|c| c.into_owned())).unwrap_or_default();
                removed_dir |= self.hardlink(&target, parent, name, raw)?;
                self.created.insert(names.to_vec());
                return Ok(removed_dir); // a hardlink shares its target's owner, mode and times
            }
            EntryType::Char | EntryType::Block => {
                self.report.skipped_devices.push(shown);
                return Ok(removed_dir);
            }
            EntryType::Fifo if !self.budgets.allow_fifos => {
                self.report.skipped_fifos.push(shown);
                return Ok(removed_dir);
            }
            EntryType::Fifo => {
                removed_dir |= remove(parent, name).map_err(io_err(raw))?;
                nix::unistd::mkfifoat(parent, name, Mode::from_bits_truncate(0o600))
                    .map_err(|e| io_err(raw)(e.into()))?;
            }
            other => return Err(refused(raw, format!("unsupported entry type {other:?}"))),
        }
        self.finish(parent, name, kind, (uid, gid, mode, mtime), raw)?;
        if mode & 0o6000 != 0 && kind != EntryType::Symlink {
            self.report.setuid.push(shown);
        }
        self.created.insert(names.to_vec());
        Ok(removed_dir)
    }

    /// A regular file: created exclusively (an existing entry of that name is removed first
    /// only when there is one), content written through a hashing writer, then owner, mode and
    /// mtime set on the open fd.
    fn regular_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        p: &Pending,
        (parent, name): (BorrowedFd<'_>, &CStr),
        (uid, gid, mode, mtime): (u32, u32, u32, i64),
        raw: &[u8],
        removed_dir: &mut bool,
    ) -> Result<(), ExtractError> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // Created with its final permission bits (the umask may take some away; the special
        // bits come only with fchmod, after any fchown, which would clear them).
        let perm = mode & 0o777;
        let fd = match openat(parent, name, flags, perm) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                *removed_dir |= remove(parent, name).map_err(io_err(raw))?;
                openat(parent, name, flags, perm)
            }
            r => r,
        }
        .map_err(io_err(raw))?;
        let size = entry.size();
        let mut w = HashingWriter { inner: std::fs::File::from(fd), hash: Sha256::new() };
        let mut left = size;
        while left > 0 {
            let want = self.buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = entry.read(&mut self.buf[..want]).map_err(io_err(raw))?;
            if n == 0 {
                return Err(refused(raw, "truncated file content"));
            }
            w.write_all(&self.buf[..n]).map_err(io_err(raw))?;
            left -= n as u64;
        }
        let f = w.inner;
        let fd = f.as_raw_fd();
        let st = stat::fstat(&f).map_err(|e| io_err(raw)(e.into()))?;
        self.report.content.insert(st.st_ino, w.hash.finalize().into());
        for (k, v) in &p.xattrs {
            let k = CString::new(k.as_slice()).map_err(|_| refused(raw, "NUL in an xattr name"))?;
            // SAFETY: valid fd, name and value buffer (raw: nix has no xattr calls).
            check(unsafe { libc::fsetxattr(fd, k.as_ptr(), v.as_ptr().cast(), v.len(), 0) }).map_err(io_err(raw))?;
        }
        let t = TimeSpec::new(mtime, 0);
        // Owner and mode are set only where the new file differs (usually root:root, and the
        // permission bits as created): two system calls fewer per file.
        let chown = self.as_root && (st.st_uid, st.st_gid) != (uid, gid);
        let chmod = chown || st.st_mode & 0o7777 != mode;
        let e = |e: Errno| io_err(raw)(e.into());
        // chown before chmod, which would otherwise have its setuid bits cleared.
        if chown {
            nix::unistd::fchown(&f, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(e)?;
        }
        if chmod {
            stat::fchmod(&f, Mode::from_bits_truncate(mode)).map_err(e)?;
        }
        stat::futimens(&f, &t, &t).map_err(e)?;
        Ok(())
    }

    /// Owner, mode (after chown, which clears setuid) and mtime; never following a symlink.
    fn finish(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        kind: EntryType,
        (uid, gid, mode, mtime): (u32, u32, u32, i64),
        raw: &[u8],
    ) -> Result<(), ExtractError> {
        if self.as_root {
            let (u, g) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
            nix::unistd::fchownat(dir, name, u, g, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| io_err(raw)(e.into()))?;
        }
        if kind != EntryType::Symlink {
            // Never following: the entry is one this layer just made, or a directory it found
            // there (a symlink in its place was replaced), so a symlink here would be a bug —
            // refused (EOPNOTSUPP), not followed onto whatever it names.
            stat::fchmodat(dir, name, Mode::from_bits_truncate(mode), FchmodatFlags::NoFollowSymlink)
                .map_err(|e| io_err(raw)(e.into()))?;
        }
        let t = TimeSpec::new(mtime, 0);
        stat::utimensat(dir, name, &t, &t, UtimensatFlags::NoFollowSymlink).map_err(|e| io_err(raw)(e.into()))?;
        Ok(())
    }

    /// A hardlink to a regular file already inside the root. True when a directory was removed
    /// to make room.
    fn hardlink(&mut self, target: &[u8], dir: BorrowedFd<'_>, name: &CStr, raw: &[u8]) -> Result<bool, ExtractError> {
        let tnames = components(target, self.budgets).map_err(|e| match e {
            ExtractError::Refused { why, .. } => {
                refused(raw, format!("hardlink target {}: {why}", String::from_utf8_lossy(target)))
            }
            other => other,
        })?;
        let Some(tlast) = tnames.last() else { return Err(refused(raw, "hardlink to the root")) };
        let tparent = open_parent(self.root, &tnames, false, raw)?;
        let tname = cstr(tlast).map_err(io_err(raw))?;
        match lstatat(tparent.as_fd(), &tname).map_err(io_err(raw))? {
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {}
            Some(_) => return Err(refused(raw, "hardlink target is not a regular file")),
            None => {
                return Err(refused(raw, format!("hardlink target {} does not exist", String::from_utf8_lossy(target))))
            }
        }
        let removed_dir = remove(dir, name).map_err(io_err(raw))?;
        // No flag: a symlink target is never followed.
        nix::unistd::linkat(tparent, tname.as_c_str(), dir, name, AtFlags::empty())
            .map_err(|e| io_err(raw)(e.into()))?;
        Ok(removed_dir)
    }

    /// `.wh.<name>` removes `name` from lower layers; `.wh..wh..opq` empties the directory of
    /// everything lower layers put there.
    fn whiteout(&mut self, names: &[OsString], hidden: &[u8], raw: &[u8]) -> Result<(), ExtractError> {
        self.parent_cache = None;
        let parent = open_parent(self.root, names, true, raw)?;
        let dir_names = &names[..names.len() - 1];
        if hidden == b".wh..opq" {
            for child in list(parent.as_fd()).map_err(io_err(raw))? {
                let mut p = dir_names.to_vec();
                p.push(OsStr::from_bytes(child.to_bytes()).to_os_string());
                if !self.created.iter().any(|c| c.starts_with(&p)) {
                    remove(parent.as_fd(), &child).map_err(io_err(raw))?;
                }
            }
            return Ok(());
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.starts_with(b".wh.") {
            return Err(refused(raw, "invalid whiteout name"));
        }
        let mut p = dir_names.to_vec();
        p.push(OsStr::from_bytes(hidden).to_os_string());
        if !self.created.contains(&p) {
            remove(parent.as_fd(), &cstr(OsStr::from_bytes(hidden)).map_err(io_err(raw))?).map_err(io_err(raw))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_single_name_reaches_an_at_call() {
        for bad in ["", ".", "..", "/", "/etc", "etc/", "a/b", "a\0b"] {
            assert!(cstr(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        for good in ["etc", "..a", "a..", ".wh.x", ".bashrc"] {
            assert_eq!(cstr(OsStr::new(good)).ok().as_deref(), CString::new(good).ok().as_deref(), "{good:?}");
        }
    }
}
