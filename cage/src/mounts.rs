//! The cage's filesystem, built with the fd-based mount API.
//!
//! The supervisor prepares everything as *detached* mounts before the cage exists: a small tmpfs
//! skeleton that becomes `/`, one read-only clone per top-level entry of the root filesystem, the
//! workspace, the binds, `/tmp`, `/dev` with individual device nodes and `/dev/shm`. Sources are
//! opened as fds (never re-walked by path), so what is mounted is what was checked. The cage's
//! init then attaches the trees inside its private mount namespace, mounts a fresh procfs,
//! seals the skeleton read-only and pivots into it. An init a daemon's spare cloned ahead with
//! a root made ahead ([`RootAhead`]) attaches that root and pivots before its plan comes; its
//! launch process makes the plan's trees at the request, and the init attaches them (by
//! descriptor, inside the root it is in) and seals the root before its target exists.
//!
//! Mount points live in the skeleton we created, not in the image: an image whose `/proc`, `/dev`
//! or `/tmp` is a symlink to a host path is simply not consulted for those names.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Type;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::fault::{self, TestHook};
use crate::path::{self, cstring};
use crate::plan::{CagePlan, RootSpec};
use crate::record::SourceFact;
use crate::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

const PROC_SUPER_MAGIC: i64 = 0x9fa0;
/// Names the cage always provides itself, whatever the image has there.
const RESERVED: [&str; 4] = ["proc", "dev", "tmp", "workspace"];
/// Host directories making up the default root.
pub(crate) const HOST_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Host `/etc` entries the default root carries: what the dynamic loader, name lookups and
/// `alternatives` symlinks need — no shadow, and no `ssl` (it holds `private/`, which a target
/// run with `--uid 0` could read as its owner). Files and symlinks are copied into the cage's own
/// `/etc` (a lock or watch on them never reaches the host's inode); directories are bound
/// read-only. Not the host's `hosts`: it names the host and its addresses (see [`HOSTS`]).
const HOST_ETC: [&str; 9] = [
    "passwd",
    "group",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "os-release",
];
/// The default root's `/etc/hosts`: loopback and the cage's own hostname, nothing of the host.
const HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tchio\n";
/// Device nodes the cage's `/dev` holds: its own inodes (major, minor), made with mknod in its
/// own tmpfs — never binds of the host's nodes, whose mode and times a cage could change.
const DEVICES: [(&CStr, u32, u32); 6] =
    [(c"null", 1, 3), (c"zero", 1, 5), (c"full", 1, 7), (c"random", 1, 8), (c"urandom", 1, 9), (c"tty", 5, 0)];

/// Size of the cage's own `/etc` on the default root (the copied files are a few KiB; the
/// loader cache tens of KiB).
const ETC_BYTES: u64 = 1 << 20;
/// A host `/etc` file larger than this is not copied (the tmpfs would refuse it anyway).
const ETC_FILE_MAX: u64 = 512 << 10;

/// Copy the regular file `name` of `from` into `to` with `mode` (never through a symlink).
fn copy_file(from: BorrowedFd<'_>, to: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    let src = sys::openat(from, name, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0)?;
    let st = sys::fstat(src.as_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > ETC_FILE_MAX {
        return Err(io::Error::other("not a regular file of at most 512 KiB"));
    }
    let dst = sys::openat(to, name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, mode)?;
    // sendfile itself, not `io::copy`: that probes both files and tries copy_file_range first,
    // which fails from the host's file system into a tmpfs (four wasted calls a file). The size
    // read above ends the copy; a file cut short meanwhile ends it at EOF.
    let (size, mut copied) = (st.st_size as usize, 0);
    while copied < size {
        match nix::sys::sendfile::sendfile(&dst, &src, None, size - copied) {
            Ok(0) => break,
            Ok(n) => copied += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The umask may have cleared bits of `mode`.
    std::fs::File::from(dst).set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
}

/// Create the file `name` in `to` holding `bytes`, with `mode` (never through a symlink).
fn write_file(to: BorrowedFd<'_>, name: &CStr, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    let dst = sys::openat(to, name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, mode)?;
    let mut dst = std::fs::File::from(dst);
    dst.write_all(bytes)?;
    // The umask may have cleared bits of `mode`.
    dst.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
}

/// Where a detached tree is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Parent {
    Root,
    Etc,
    Dev,
}

/// One detached tree and its place.
struct Attach {
    parent: Parent,
    name: CString,
    tree: OwnedFd,
}

/// A bind whose destination lies inside an attached tree: resolved inside the new root.
struct NestedBind {
    dest: PathBuf,
    tree: OwnedFd,
    is_dir: bool,
}

/// The permissions landlock grants, by in-cage path.
#[derive(Debug, Default, Clone)]
pub struct Access {
    /// Read + execute (top-level directories of the root, read-only binds).
    pub read_exec: Vec<CString>,
    /// Read + write + execute (workspace, writable binds).
    pub read_write_exec: Vec<CString>,
}

/// Everything the cage's init needs to build its root.
pub struct Prepared {
    skeleton: OwnedFd,
    etc: Option<OwnedFd>,
    dev: OwnedFd,
    attach: Vec<Attach>,
    nested: Vec<NestedBind>,
    /// Destinations (relative) of binds whose directories chio built in its skeleton.
    skeleton_binds: Vec<PathBuf>,
    /// Landlock grants by path.
    pub access: Access,
    /// Human-readable list of mounts, for the record.
    pub described: Vec<String>,
    /// Identity of every operator-supplied source, for the record.
    pub sources: Vec<SourceFact>,
    /// The target runs as uid or gid 0: procfs's root-only files are masked.
    mask_proc: bool,
    /// No TCP bind port is granted: the cage's network namespace gets no ephemeral port.
    no_ephemeral_ports: bool,
    /// Mount attributes a test hook strips (read-only and noexec), to show landlock alone holds.
    strip: u64,
    /// Top-level tmpfs mounts of the plan's (besides `/tmp`): binds below them get their mount
    /// points made in them.
    own_tmpfs: Vec<std::ffi::OsString>,
    /// In-cage paths covered once everything is attached (the plan's `masked`).
    masked: Vec<PathBuf>,
    /// In-cage paths made read-only once everything is attached (the plan's `read_only`).
    read_only: Vec<PathBuf>,
}

fn err_at(what: &str, p: impl AsRef<Path>, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", p.as_ref().display()))
}

fn tmpfs(size: u64, mode: &str, attrs: u64) -> io::Result<OwnedFd> {
    let size = CString::new(size.to_string()).map_err(io::Error::other)?;
    let mode = CString::new(mode).map_err(io::Error::other)?;
    sys::fs_mount(c"tmpfs", &[(c"size", &size), (c"mode", &mode)], attrs)
}

/// Clone the tree at `fd` and set its attributes.
fn clone_tree(fd: BorrowedFd<'_>, attrs: u64) -> io::Result<OwnedFd> {
    let tree = sys::open_tree_clone(fd)?;
    sys::mount_setattr_tree(tree.as_fd(), attrs)?;
    Ok(tree)
}

/// Entries of a directory fd: (name, file type bits from lstat).
fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<(CString, u32)>> {
    let out = path::read_dir_names(dir)?;
    let mut typed = Vec::with_capacity(out.len());
    for name in out {
        let mode = sys::fstatat(dir, &name, libc::AT_SYMLINK_NOFOLLOW)?.st_mode & libc::S_IFMT;
        typed.push((name, mode));
    }
    typed.sort();
    Ok(typed)
}

/// What a root made ahead is made for: the root, the sizes of its `/tmp` and `/dev/shm`, and the
/// staging directory it is attached at before the pivot into it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RootKey {
    /// The root filesystem.
    pub root: RootSpec,
    /// Size of `/tmp`.
    pub tmp_bytes: u64,
    /// Size of `/dev/shm`.
    pub shm_bytes: u64,
    /// The plan's `staging_dir`.
    pub staging: PathBuf,
}

impl RootKey {
    /// The key of `plan`'s root, when a root made ahead could serve it: no bind over one of its
    /// top-level entries, no test hook on mount flags.
    pub fn of(plan: &CagePlan) -> Option<RootKey> {
        let top_binds = plan.binds.iter().any(|b| top_level_name(&b.dest).is_some());
        (!top_binds && plan.tmpfs.is_empty() && !fault::on(plan, &TestHook::MountFlags)).then(|| RootKey {
            root: plan.root.clone(),
            tmp_bytes: plan.limits.tmp_bytes,
            shm_bytes: plan.limits.shm_bytes,
            staging: plan.staging_dir.clone(),
        })
    }
}

/// The plan-independent part of a cage's root, made ahead of the request by a daemon's spare
/// (see [`crate::ahead`]) for the root the last launch had: the skeleton with its mount points,
/// `/dev` with its device nodes, `/tmp` and `/dev/shm`, and the root's read-only binds — an
/// image directory's top-level entries, or the host's `/usr`, `/lib`… with the cage's own
/// `/etc` and its copies of the host's files. One launch uses it, and only if its plan has the
/// same [`RootKey`], every source it was made from is unchanged (same device, inode, size,
/// mtime and ctime: an entry added, removed or renamed at an image's top level moves its
/// directory's mtime; a directory swapped for another at the same path has another inode)
/// and nothing was mounted or unmounted on the host since (a bind copies the mounts below its
/// source as they were: one made over `/usr/local` later, or one gone since, would otherwise
/// not be what the cage sees). Otherwise that launch builds its own, as the one-shot form
/// always does.
///
/// The init cloned ahead with it attaches it and pivots into it before its plan comes
/// ([`Prepared::attach_ahead`]); its launch process adds the plan's part at the request, in the
/// host's mount namespace as it is then ([`RootAhead::plan_part`]), and the init attaches that
/// and seals the root ([`Prepared::finish_ahead`]).
pub struct RootAhead {
    key: RootKey,
    prepared: Prepared,
    sources: Vec<Option<crate::digests::Identity>>,
    /// The host's mount table, opened before the binds were made: see [`mounts_changed`].
    mounts: std::fs::File,
}

impl RootAhead {
    /// Make it now. The sources are read before anything is bound, so that a change made
    /// meanwhile makes it stale rather than unnoticed.
    pub fn make(key: &RootKey) -> io::Result<RootAhead> {
        let mounts = std::fs::File::open("/proc/self/mountinfo")?;
        let sources = sources_of(&key.root);
        let mut prepared = Prepared::empty(false, 0)?;
        match &key.root {
            RootSpec::Directory(dir) => prepared.add_root_dir(dir, &[])?,
            RootSpec::HostSystem => prepared.add_host_system(&[])?,
        }
        prepared.add_special(key.tmp_bytes, key.shm_bytes)?;
        Ok(RootAhead { key: key.clone(), prepared, sources, mounts })
    }

    /// Whether it serves `key`: made for it, and its sources and the host's mounts are still
    /// what it was made from. (Asked once: the poll of the mount table consumes its event.)
    pub fn serves(&self, key: Option<&RootKey>) -> bool {
        key == Some(&self.key) && !mounts_changed(&self.mounts) && sources_of(&self.key.root) == self.sources
    }

    /// Where an init attaches it before its pivot.
    pub fn staging(&self) -> &Path {
        &self.key.staging
    }

    /// The init's own handles on its trees, to attach ahead ([`Prepared::attach_ahead`]).
    pub fn prepared(&self) -> io::Result<Prepared> {
        self.prepared.try_clone(false)
    }

    /// Launch process, at the request, for a plan it serves (asked first): the plan's trees (the
    /// workspace, the binds) opened and cloned here, in the host's mount namespace as it is now,
    /// with their mount points made in the root's skeleton, which the init has attached but not
    /// sealed. Returns what the init needs besides them, and their descriptors in the order
    /// [`Prepared::finish_ahead`] takes them.
    pub fn plan_part(&self, plan: &CagePlan) -> io::Result<(PlanPart, Vec<OwnedFd>)> {
        let mut p = self.prepared.try_clone(plan.uid == 0 || plan.gid == 0)?;
        let base = p.attach.len();
        p.add_plan(plan)?;
        Ok(p.into_part(base, false))
    }
}

/// The plan's part of a root an init ahead has pivoted into, as its launch process made it
/// ([`RootAhead::plan_part`]), or the plan's whole root when the one made ahead does not serve
/// the plan ([`Prepared::whole_part`]). The trees' descriptors travel beside it: for a whole
/// root the skeleton, `/dev` and `/etc` (if any) first, then `attach`'s, then `nested`'s. The
/// lists of grants, mounts and sources are whole (the root's part included).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PlanPart {
    /// A whole root (`Some`), whether it has an `/etc` of its own.
    whole: Option<bool>,
    attach: Vec<(Parent, Vec<u8>)>,
    nested: Vec<(PathBuf, bool)>,
    read_exec: Vec<Vec<u8>>,
    read_write_exec: Vec<Vec<u8>>,
    described: Vec<String>,
    sources: Vec<SourceFact>,
    mask_proc: bool,
    no_ephemeral_ports: bool,
    masked: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
}

impl PlanPart {
    /// Whether it is a whole root, to pivot into again ([`Prepared::from_part`]).
    pub fn is_whole(&self) -> bool {
        self.whole.is_some()
    }

    /// Whether finishing the root writes the cage's network sysctls (see
    /// [`Prepared::writes_net_sysctls`]).
    pub fn writes_net_sysctls(&self) -> bool {
        self.no_ephemeral_ports
    }
}

/// Whether anything was mounted, unmounted or changed in the mount namespace of `mountinfo`
/// since it was opened. The kernel keeps an event count per mount namespace; a poll of its
/// mountinfo reports POLLPRI when the count has moved since the file was opened (or last
/// polled). The file was opened in the host's namespace, so this holds in the init's own.
fn mounts_changed(mountinfo: &std::fs::File) -> bool {
    let mut p = [PollFd::new(mountinfo.as_fd(), PollFlags::POLLPRI)];
    match poll(&mut p, PollTimeout::ZERO) {
        Ok(_) => !p[0].revents().is_some_and(|r| !r.intersects(PollFlags::POLLPRI | PollFlags::POLLERR)),
        Err(_) => true,
    }
}

impl std::fmt::Debug for RootAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootAhead").field("mounts", &self.prepared.described).finish()
    }
}

/// The identity (a hashed file's: see `prehash::identity`) of every host entry a root is made
/// from (None: absent), in order: an image directory itself (its top-level entries are what
/// its mtime and ctime cover), or the host's entries a default root binds and copies.
fn sources_of(root: &RootSpec) -> Vec<Option<crate::digests::Identity>> {
    let id = |dir: Option<&OwnedFd>, name: &str| {
        let c = cstring(name).ok()?;
        let st = sys::fstatat(dir?.as_fd(), &c, libc::AT_SYMLINK_NOFOLLOW).ok()?;
        Some(crate::prehash::identity(&st))
    };
    if let RootSpec::Directory(dir) = root {
        let fd = path::open_host(dir, libc::O_DIRECTORY).ok();
        return vec![fd.and_then(|f| sys::fstat(f.as_fd()).ok()).map(|st| crate::prehash::identity(&st))];
    }
    let root = path::open_host(Path::new("/"), libc::O_DIRECTORY).ok();
    let etc = path::open_host(Path::new("/etc"), libc::O_DIRECTORY).ok();
    let mut ids: Vec<_> = HOST_DIRS.iter().map(|n| id(root.as_ref(), n)).collect();
    ids.push(id(root.as_ref(), "etc"));
    ids.extend(HOST_ETC.iter().map(|n| id(etc.as_ref(), n)));
    ids
}

impl Prepared {
    /// The skeleton and `/dev` tmpfs, nothing in them yet.
    fn empty(mask_proc: bool, strip: u64) -> io::Result<Prepared> {
        let skeleton = tmpfs(1 << 20, "0755", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
        // Not nodev: it holds the cage's own device nodes (and is sealed read-only once built).
        let dev = tmpfs(64 << 10, "0755", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)?;
        Ok(Prepared { mask_proc, strip, ..Prepared::empty_with(skeleton, dev) })
    }

    /// This process's own handles on the same trees (a base made ahead stays the spare's).
    fn try_clone(&self, mask_proc: bool) -> io::Result<Prepared> {
        let dup = |f: &OwnedFd| f.try_clone();
        let mut attach = Vec::with_capacity(self.attach.len());
        for a in &self.attach {
            attach.push(Attach { parent: a.parent, name: a.name.clone(), tree: dup(&a.tree)? });
        }
        Ok(Prepared {
            skeleton: dup(&self.skeleton)?,
            etc: self.etc.as_ref().map(dup).transpose()?,
            dev: dup(&self.dev)?,
            attach,
            nested: Vec::new(),
            skeleton_binds: self.skeleton_binds.clone(),
            access: self.access.clone(),
            described: self.described.clone(),
            sources: self.sources.clone(),
            mask_proc,
            no_ephemeral_ports: false,
            strip: self.strip,
            own_tmpfs: self.own_tmpfs.clone(),
            masked: self.masked.clone(),
            read_only: self.read_only.clone(),
        })
    }

    /// Prepare the detached trees for `plan`, starting from the root made ahead when it serves
    /// this plan (see [`RootAhead`]).
    pub fn build(plan: &CagePlan, ahead: Option<&RootAhead>) -> io::Result<Prepared> {
        let mask_proc = plan.uid == 0 || plan.gid == 0;
        let strip = if fault::on(plan, &TestHook::MountFlags) { MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOEXEC } else { 0 };
        let mut p = match ahead.filter(|a| a.serves(RootKey::of(plan).as_ref())) {
            Some(a) => a.prepared.try_clone(mask_proc)?,
            None => {
                for t in &plan.tmpfs {
                    tmpfs_name(&t.dest)?;
                }
                let top_binds: Vec<&OsStr> = plan
                    .binds
                    .iter()
                    .filter_map(|b| top_level_name(&b.dest))
                    .chain(plan.tmpfs.iter().filter_map(|t| top_level_name(&t.dest)))
                    .collect();
                let mut p = Prepared::empty(mask_proc, strip)?;
                match &plan.root {
                    RootSpec::Directory(dir) => p.add_root_dir(dir, &top_binds)?,
                    RootSpec::HostSystem => p.add_host_system(&top_binds)?,
                }
                p.add_special(plan.limits.tmp_bytes, plan.limits.shm_bytes)?;
                for t in &plan.tmpfs {
                    p.add_tmpfs(&t.dest, t.bytes)?;
                }
                p
            }
        };
        p.add_plan(plan)?;
        Ok(p)
    }

    /// The plan's own part: the workspace, the binds, the masks and what they change.
    fn add_plan(&mut self, plan: &CagePlan) -> io::Result<()> {
        // (Without its own network namespace — a test hook — the host's would be changed.)
        self.no_ephemeral_ports = plan.tcp_bind.is_empty() && !fault::on(plan, &TestHook::Namespace("net"));
        if let Some(ws) = &plan.workspace {
            let fd = path::open_host(ws, libc::O_DIRECTORY).map_err(|e| err_at("opening workspace", ws, e))?;
            let ro = plan.workspace_read_only;
            self.note_source("/workspace", ws, fd.as_fd(), !ro)?;
            let tree =
                clone_tree(fd.as_fd(), MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | if ro { MOUNT_ATTR_RDONLY } else { 0 })?;
            sys::mkdirat(self.skeleton.as_fd(), c"workspace", 0o755)?;
            let kind = if ro { "ro" } else { "rw" };
            self.push(Parent::Root, c"workspace".into(), tree, format!("/workspace {kind} bind of {}", ws.display()));
            if ro {
                self.access.read_exec.push(c"/workspace".into());
            } else {
                self.access.read_write_exec.push(c"/workspace".into());
            }
        }
        for b in &plan.binds {
            self.add_bind(b)?;
        }
        for (list, what) in [(&plan.masked, "masked"), (&plan.read_only, "read-only")] {
            for m in list {
                if !m.is_absolute() || path::components(m).map_or(true, |c| c.is_empty()) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("a {what} path must be absolute and below /, not {}", m.display()),
                    ));
                }
                self.described.push(format!("{} {what}", m.display()));
            }
        }
        self.masked = plan.masked.clone();
        self.read_only = plan.read_only.clone();
        Ok(())
    }

    /// Record what an operator path resolved to.
    fn note_source(&mut self, dest: &str, source: &Path, fd: BorrowedFd<'_>, writable: bool) -> io::Result<libc::stat> {
        let st = sys::fstat(fd)?;
        self.sources.push(SourceFact {
            dest: dest.to_string(),
            source: source.display().to_string(),
            device: st.st_dev,
            inode: st.st_ino,
            writable,
        });
        Ok(st)
    }

    fn push(&mut self, parent: Parent, name: CString, tree: OwnedFd, what: String) {
        self.attach.push(Attach { parent, name, tree });
        self.described.push(what);
    }

    fn add_root_dir(&mut self, dir: &Path, skip: &[&OsStr]) -> io::Result<()> {
        let root = path::open_host(dir, libc::O_DIRECTORY).map_err(|e| err_at("opening rootfs", dir, e))?;
        self.note_source("/", dir, root.as_fd(), false)?;
        for (name, kind) in list_dir(root.as_fd())? {
            let n = OsStr::from_bytes(name.as_bytes());
            if RESERVED.iter().any(|r| OsStr::new(r) == n) || skip.contains(&n) {
                continue;
            }
            self.add_entry(root.as_fd(), Parent::Root, &name, kind, dir)?;
        }
        Ok(())
    }

    /// Bind, copy (symlinks) or skip one top-level entry of a source directory.
    fn add_entry(
        &mut self,
        src: BorrowedFd<'_>,
        parent: Parent,
        name: &CStr,
        kind: u32,
        from: &Path,
    ) -> io::Result<()> {
        let target = match parent {
            Parent::Root => self.skeleton.as_fd(),
            Parent::Etc => self.etc.as_ref().map_or(self.skeleton.as_fd(), |f| f.as_fd()),
            Parent::Dev => self.dev.as_fd(),
        };
        let shown = from.join(OsStr::from_bytes(name.to_bytes()));
        match kind {
            libc::S_IFDIR => {
                let fd = sys::openat(src, name, libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY, 0)?;
                let tree =
                    clone_tree(fd.as_fd(), (MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) & !self.strip)?;
                sys::mkdirat(target, name, 0o755)?;
                self.grant_exec(parent, name)?;
                self.push(parent, name.into(), tree, format!("ro bind of {}", shown.display()));
            }
            libc::S_IFREG => {
                let fd = sys::openat(src, name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
                let tree =
                    clone_tree(fd.as_fd(), (MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) & !self.strip)?;
                sys::mkfileat(target, name)?;
                self.grant_exec(parent, name)?;
                self.push(parent, name.into(), tree, format!("ro bind of {}", shown.display()));
            }
            libc::S_IFLNK => {
                let link = sys::readlinkat(src, name)?;
                sys::symlinkat(&CString::new(link).map_err(io::Error::other)?, target, name)?;
            }
            // Devices, FIFOs and sockets of an image are never exposed.
            _ => {}
        }
        Ok(())
    }

    /// Top-level entries of the image are executable (landlock grants execute per entry, never
    /// at `/`, so `/tmp` and `/dev/shm` stay non-executable).
    fn grant_exec(&mut self, parent: Parent, name: &CStr) -> io::Result<()> {
        if parent == Parent::Root {
            let mut p = b"/".to_vec();
            p.extend_from_slice(name.to_bytes());
            self.access.read_exec.push(CString::new(p).map_err(io::Error::other)?);
        }
        Ok(())
    }

    fn add_host_system(&mut self, skip: &[&OsStr]) -> io::Result<()> {
        let root = path::open_host(Path::new("/"), libc::O_DIRECTORY)?;
        for name in HOST_DIRS {
            let c = cstring(name)?;
            if skip.contains(&OsStr::new(name)) {
                continue;
            }
            match sys::fstatat(root.as_fd(), &c, libc::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => self.add_entry(root.as_fd(), Parent::Root, &c, st.st_mode & libc::S_IFMT, Path::new("/"))?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(err_at("reading host", format!("/{name}"), e)),
            }
        }
        if skip.contains(&OsStr::new("etc")) {
            return Ok(());
        }
        let etc = tmpfs(ETC_BYTES, "0755", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)?;
        let host_etc = path::open_host(Path::new("/etc"), libc::O_DIRECTORY)?;
        for name in HOST_ETC {
            let c = cstring(name)?;
            let Ok(st) = sys::fstatat(host_etc.as_fd(), &c, libc::AT_SYMLINK_NOFOLLOW) else { continue };
            if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                copy_file(host_etc.as_fd(), etc.as_fd(), &c, st.st_mode & 0o777)
                    .map_err(|e| err_at("copying host", format!("/etc/{name}"), e))?;
                self.described.push(format!("/etc/{name} copy of the host's"));
            }
        }
        write_file(etc.as_fd(), c"hosts", HOSTS.as_bytes(), 0o644).map_err(|e| err_at("writing", "/etc/hosts", e))?;
        self.described.push("/etc/hosts the cage's own (localhost and chio)".into());
        self.etc = Some(etc);
        for name in HOST_ETC {
            let c = cstring(name)?;
            let Ok(st) = sys::fstatat(host_etc.as_fd(), &c, libc::AT_SYMLINK_NOFOLLOW) else { continue };
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                self.add_entry(host_etc.as_fd(), Parent::Etc, &c, st.st_mode & libc::S_IFMT, Path::new("/etc"))?;
            }
        }
        sys::mkdirat(self.skeleton.as_fd(), c"etc", 0o755)?;
        Ok(())
    }

    /// `/proc`, `/tmp` and `/dev` mount points; `/dev` contents.
    fn add_special(&mut self, tmp_bytes: u64, shm_bytes: u64) -> io::Result<()> {
        let sk = self.skeleton.as_fd();
        sys::mkdirat(sk, c"proc", 0o555)?;
        sys::mkdirat(sk, c"dev", 0o755)?;
        sys::mkdirat(sk, c"tmp", 0o1777)?;
        let tmp = tmpfs(tmp_bytes, "1777", (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC) & !self.strip)?;
        self.push(Parent::Root, c"tmp".into(), tmp, format!("/tmp tmpfs size={tmp_bytes} noexec"));
        for (name, major, minor) in DEVICES {
            sys::mknodat(self.dev.as_fd(), name, libc::S_IFCHR | 0o666, libc::makedev(major, minor))?;
            self.described.push(format!("/dev/{} device node {major}:{minor}", name.to_string_lossy()));
        }
        for (name, target) in [
            (c"fd", c"/proc/self/fd"),
            (c"stdin", c"/proc/self/fd/0"),
            (c"stdout", c"/proc/self/fd/1"),
            (c"stderr", c"/proc/self/fd/2"),
        ] {
            sys::symlinkat(target, self.dev.as_fd(), name)?;
        }
        sys::mkdirat(self.dev.as_fd(), c"shm", 0o1777)?;
        let shm = tmpfs(shm_bytes, "1777", (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC) & !self.strip)?;
        self.push(Parent::Dev, c"shm".into(), shm, format!("/dev/shm tmpfs size={shm_bytes} noexec"));
        Ok(())
    }

    /// A writable, non-executable tmpfs of `bytes` at `dest`: at a top-level name in the
    /// skeleton, or deeper on a directory the image has (its mount point, never made in it).
    fn add_tmpfs(&mut self, dest: &Path, bytes: u64) -> io::Result<()> {
        let fs = tmpfs(bytes, "0755", (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC) & !self.strip)?;
        let what = format!("{} tmpfs size={bytes} noexec", dest.display());
        match top_level_name(dest) {
            Some(name) => {
                let c = cstring(name)?;
                sys::mkdirat(self.skeleton.as_fd(), &c, 0o755)?;
                self.push(Parent::Root, c, fs, what);
                self.own_tmpfs.push(name.to_os_string());
            }
            None => {
                self.nested.push(NestedBind { dest: dest.to_path_buf(), tree: fs, is_dir: true });
                self.described.push(what);
            }
        }
        Ok(())
    }

    fn add_bind(&mut self, b: &crate::plan::Bind) -> io::Result<()> {
        let names = path::components(&b.dest)?;
        if !b.dest.is_absolute() || names.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bind destination {} must be an absolute path below /", b.dest.display()),
            ));
        }
        if matches!(names[0].to_str(), Some("proc" | "dev")) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bind destination {} is under /proc or /dev, which the cage owns", b.dest.display()),
            ));
        }
        let src = path::open_host(&b.source, 0).map_err(|e| err_at("opening bind source", &b.source, e))?;
        let kind =
            self.note_source(&b.dest.to_string_lossy(), &b.source, src.as_fd(), b.writable)?.st_mode & libc::S_IFMT;
        if kind == libc::S_IFSOCK {
            // Read-only or not, a bound socket can be connect()ed: the cage would reach the host
            // service behind it (dbus, docker.sock, ...).
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bind source {} is a unix socket; the cage would reach the host service behind it",
                    b.source.display()
                ),
            ));
        }
        let is_dir = kind == libc::S_IFDIR;
        let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | if b.writable { 0 } else { MOUNT_ATTR_RDONLY };
        let tree = clone_tree(src.as_fd(), attrs)?;
        let dest = cstring(&b.dest)?;
        if b.writable {
            self.access.read_write_exec.push(dest);
        } else {
            self.access.read_exec.push(dest);
        }
        let what =
            format!("{} {} bind of {}", b.dest.display(), if b.writable { "rw" } else { "ro" }, b.source.display());
        let first = cstring(names[0])?;
        let dest_rel: PathBuf = names.iter().collect();
        // A top-level directory an earlier bind made in the skeleton is ours, not the image's:
        // more binds may be built beside it — but not inside an earlier bind's own tree.
        let ours = self.skeleton_binds.iter().any(|d| d.starts_with(names[0]));
        let inside_a_bind = self.skeleton_binds.iter().any(|d| dest_rel.starts_with(d));
        let in_skeleton_only = !RESERVED.iter().any(|r| OsStr::new(r) == names[0])
            && !inside_a_bind
            && (names.len() == 1
                || ours
                || sys::fstatat(self.skeleton.as_fd(), &first, libc::AT_SYMLINK_NOFOLLOW).is_err());
        if in_skeleton_only {
            // The destination is not in the image: build it in our own skeleton.
            let mut rel = PathBuf::new();
            for dir in &names[..names.len() - 1] {
                rel.push(dir);
                match sys::mkdirat(self.skeleton.as_fd(), &cstring(&rel)?, 0o755) {
                    Err(e) if ours && e.kind() == io::ErrorKind::AlreadyExists => {}
                    r => r?,
                }
            }
            rel.push(names[names.len() - 1]);
            let name = cstring(&rel)?;
            if is_dir {
                sys::mkdirat(self.skeleton.as_fd(), &name, 0o755)?;
            } else {
                sys::mkfileat(self.skeleton.as_fd(), &name)?;
            }
            self.push(Parent::Root, name, tree, what);
            self.skeleton_binds.push(dest_rel);
        } else {
            let in_own_tmpfs = names[0] == "tmp" || self.own_tmpfs.iter().any(|t| t.as_os_str() == names[0]);
            if in_own_tmpfs && names.len() > 1 {
                self.mount_point_in_tmp(names[0], &names[1..], is_dir)?;
            }
            self.nested.push(NestedBind { dest: b.dest.clone(), tree, is_dir });
            self.described.push(what);
        }
        Ok(())
    }

    /// A bind below `/tmp` (a tool or venv on a host path under `/tmp`, bound at the same path):
    /// the cage's `/tmp` is its own empty tmpfs, so the mount point is made there — directories
    /// root's, 0755, the last a directory or an empty file as the source is — never in the host's.
    /// The same for a bind below one of the plan's own top-level tmpfs mounts (`top`).
    fn mount_point_in_tmp(&self, top: &OsStr, rel: &[&OsStr], is_dir: bool) -> io::Result<()> {
        let Some(tmp) = self.attach.iter().find(|a| a.parent == Parent::Root && a.name.as_bytes() == top.as_bytes())
        else {
            return Ok(());
        };
        let mut at = PathBuf::new();
        for (i, name) in rel.iter().enumerate() {
            at.push(name);
            let c = cstring(&at)?;
            let made = match (i + 1 == rel.len(), is_dir) {
                (true, false) => sys::mkfileat(tmp.tree.as_fd(), &c),
                _ => sys::mkdirat(tmp.tree.as_fd(), &c, 0o755),
            };
            match made {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                r => r.map_err(|e| {
                    err_at("making the mount point in the cage's tmpfs for", Path::new("/").join(top).join(&at), e)
                })?,
            }
        }
        Ok(())
    }

    /// Whether [`Prepared::attach`] writes the cage's network sysctls (through its procfs, in
    /// the writer's network namespace).
    pub fn writes_net_sysctls(&self) -> bool {
        self.no_ephemeral_ports
    }

    /// Cage side (inside the new mount and pid namespaces): attach everything at `staging`,
    /// mount procfs and seal the skeleton read-only.
    pub fn attach(&self, staging: &Path) -> io::Result<()> {
        let proc = self.attach_ahead(staging)?;
        self.finish(proc.as_fd())
    }

    /// An init ahead, before its plan (see [`RootAhead`]): what [`Prepared::attach`] does with
    /// the root's plan-independent part, less the masks and the seal. Returns the cage's procfs
    /// (mounted, not sealed) for [`Prepared::finish_ahead`].
    pub fn attach_ahead(&self, staging: &Path) -> io::Result<OwnedFd> {
        self.attach_skeleton(staging)?;
        self.attach_trees(0)?;
        self.mount_proc()
    }

    /// An init ahead, pivoted, with its plan: take the plan's part its launch process made
    /// ([`RootAhead::plan_part`]) with its trees' descriptors, attach them (inside the root, by
    /// descriptor), then the masks and the seal, as [`Prepared::attach`] ends.
    pub fn finish_ahead(&mut self, part: PlanPart, fds: Vec<OwnedFd>, proc: BorrowedFd<'_>) -> io::Result<()> {
        if part.is_whole() {
            return Err(io::Error::other("a whole root came where the plan's part of one was due"));
        }
        let base = self.attach.len();
        self.take(part, fds)?;
        self.attach_trees(base)?;
        self.finish(proc)
    }

    /// Launch process, at the request, when the root made ahead does not serve the plan: the
    /// plan's whole root, built here in the host's mounts as they are now, for the init that
    /// pivoted into the stale one to attach and pivot into instead ([`Prepared::from_part`]).
    pub fn whole_part(plan: &CagePlan) -> io::Result<(PlanPart, Vec<OwnedFd>)> {
        Ok(Prepared::build(plan, None)?.into_part(0, true))
    }

    /// An init ahead, pivoted into a root made ahead that did not serve its plan: the whole root
    /// its launch process built instead ([`Prepared::whole_part`]), ready for
    /// [`Prepared::attach`] and [`Prepared::pivot`].
    pub fn from_part(part: PlanPart, fds: Vec<OwnedFd>) -> io::Result<Prepared> {
        let Some(has_etc) = part.whole else {
            return Err(io::Error::other("the plan's part of a root came where a whole root was due"));
        };
        let mut fds = fds.into_iter();
        let mut next = || fds.next().ok_or_else(|| io::Error::other("a whole root came without its skeleton"));
        let (skeleton, dev) = (next()?, next()?);
        let etc = if has_etc { Some(next()?) } else { None };
        let mut p = Prepared { etc, ..Prepared::empty_with(skeleton, dev) };
        p.take(part, fds.collect())?;
        Ok(p)
    }

    /// A prepared root holding `skeleton` and `dev` and nothing else yet.
    fn empty_with(skeleton: OwnedFd, dev: OwnedFd) -> Prepared {
        Prepared {
            skeleton,
            etc: None,
            dev,
            attach: Vec::new(),
            nested: Vec::new(),
            skeleton_binds: Vec::new(),
            access: Access::default(),
            described: Vec::new(),
            sources: Vec::new(),
            mask_proc: false,
            no_ephemeral_ports: false,
            strip: 0,
            own_tmpfs: Vec::new(),
            masked: Vec::new(),
            read_only: Vec::new(),
        }
    }

    /// The trees of `part` (its descriptors `fds`, those of a whole root's base taken already)
    /// added, and its grants, mounts, sources and masks taken.
    fn take(&mut self, part: PlanPart, fds: Vec<OwnedFd>) -> io::Result<()> {
        let wanted = part.attach.len() + part.nested.len();
        if fds.len() != wanted {
            return Err(io::Error::other(format!(
                "the plan's part of the root came with {} descriptors for {wanted} trees",
                fds.len()
            )));
        }
        let mut fds = fds.into_iter();
        for ((parent, name), tree) in part.attach.into_iter().zip(fds.by_ref()) {
            self.attach.push(Attach { parent, name: CString::new(name).map_err(io::Error::other)?, tree });
        }
        for ((dest, is_dir), tree) in part.nested.into_iter().zip(fds) {
            self.nested.push(NestedBind { dest, tree, is_dir });
        }
        let cstrings = |v: Vec<Vec<u8>>| -> io::Result<Vec<CString>> {
            v.into_iter().map(|b| CString::new(b).map_err(io::Error::other)).collect()
        };
        self.access = Access { read_exec: cstrings(part.read_exec)?, read_write_exec: cstrings(part.read_write_exec)? };
        self.described = part.described;
        self.sources = part.sources;
        self.mask_proc = part.mask_proc;
        self.no_ephemeral_ports = part.no_ephemeral_ports;
        self.masked = part.masked;
        self.read_only = part.read_only;
        Ok(())
    }

    /// What crosses to the init: the trees from the `from`th on and the nested binds, with the
    /// skeleton, `/dev` and `/etc` first for a `whole` root.
    fn into_part(self, from: usize, whole: bool) -> (PlanPart, Vec<OwnedFd>) {
        let mut fds = Vec::with_capacity(3 + self.attach.len() + self.nested.len());
        let has_etc = self.etc.is_some();
        if whole {
            fds.push(self.skeleton);
            fds.push(self.dev);
            fds.extend(self.etc);
        }
        let mut attach = Vec::with_capacity(self.attach.len());
        for a in self.attach.into_iter().skip(from) {
            attach.push((a.parent, a.name.into_bytes()));
            fds.push(a.tree);
        }
        let mut nested = Vec::with_capacity(self.nested.len());
        for n in self.nested {
            nested.push((n.dest, n.is_dir));
            fds.push(n.tree);
        }
        let bytes = |v: Vec<CString>| v.into_iter().map(CString::into_bytes).collect();
        let part = PlanPart {
            whole: whole.then_some(has_etc),
            attach,
            nested,
            read_exec: bytes(self.access.read_exec),
            read_write_exec: bytes(self.access.read_write_exec),
            described: self.described,
            sources: self.sources,
            mask_proc: self.mask_proc,
            no_ephemeral_ports: self.no_ephemeral_ports,
            masked: self.masked,
            read_only: self.read_only,
        };
        (part, fds)
    }

    /// The skeleton attached at `staging` in a mount namespace made private, `/dev` and `/etc`
    /// in it.
    fn attach_skeleton(&self, staging: &Path) -> io::Result<()> {
        let private = nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE;
        nix::mount::mount(None::<&str>, "/", None::<&str>, private, None::<&str>)
            .map_err(|e| err_at("making private", "/", e.into()))?;
        let staging_fd = path::open_host(staging, libc::O_DIRECTORY)?;
        let parent_of_staging = staging.parent().unwrap_or(Path::new("/"));
        let staging_name = cstring(staging.file_name().unwrap_or_default())?;
        let parent_fd = path::open_host(parent_of_staging, libc::O_DIRECTORY)?;
        drop(staging_fd);
        sys::move_mount_to(self.skeleton.as_fd(), parent_fd.as_fd(), &staging_name)
            .map_err(|e| err_at("attaching the root at", staging, e))?;
        let sk = self.skeleton.as_fd();
        sys::move_mount_to(self.dev.as_fd(), sk, c"dev").map_err(|e| err_at("attaching", "/dev", e))?;
        if let Some(etc) = &self.etc {
            sys::move_mount_to(etc.as_fd(), sk, c"etc").map_err(|e| err_at("attaching", "/etc", e))?;
        }
        Ok(())
    }

    /// The trees from the `from`th on, then the binds nested in them.
    fn attach_trees(&self, from: usize) -> io::Result<()> {
        let sk = self.skeleton.as_fd();
        for a in self.attach.get(from..).unwrap_or_default() {
            let dir = match a.parent {
                Parent::Root => sk,
                Parent::Etc => self.etc.as_ref().map_or(sk, |f| f.as_fd()),
                Parent::Dev => self.dev.as_fd(),
            };
            sys::move_mount_to(a.tree.as_fd(), dir, &a.name)
                .map_err(|e| err_at("attaching", Path::new(OsStr::from_bytes(a.name.as_bytes())), e))?;
        }
        for n in &self.nested {
            attach_nested(sk, n)?;
        }
        Ok(())
    }

    /// A fresh procfs at `/proc`, its memfds sealed.
    fn mount_proc(&self) -> io::Result<OwnedFd> {
        let proc = sys::fs_mount(c"proc", &[], MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)?;
        if nix::sys::statfs::fstatfs(proc.as_fd())?.filesystem_type().0 as i64 != PROC_SUPER_MAGIC {
            return Err(io::Error::other("the new /proc mount is not procfs"));
        }
        seal_memfds(proc.as_fd()).map_err(|e| err_at("writing", "/proc/sys/vm/memfd_noexec", e))?;
        sys::move_mount_to(proc.as_fd(), self.skeleton.as_fd(), c"proc")
            .map_err(|e| err_at("attaching", "/proc", e))?;
        Ok(proc)
    }

    /// The network sysctls, the masks, the read-only paths, then everything sealed read-only.
    fn finish(&self, proc: BorrowedFd<'_>) -> io::Result<()> {
        let sk = self.skeleton.as_fd();
        if self.no_ephemeral_ports {
            no_ephemeral_ports(proc)?;
        }
        if self.mask_proc {
            mask_root_only(proc, self.dev.as_fd())?;
        }
        for m in &self.masked {
            mask(sk, m, self.dev.as_fd()).map_err(|e| err_at("masking", m, e))?;
        }
        for r in &self.read_only {
            make_read_only(sk, r).map_err(|e| err_at("making read-only", r, e))?;
        }
        // procfs read-only as a whole: its top-level files are one inode for every procfs on
        // the host, so a chmod or utimensat by uid 0 would change them everywhere; sysctls and
        // sysrq-trigger are written through it.
        let sealed = [Some(sk), self.etc.as_ref().map(|f| f.as_fd()), Some(self.dev.as_fd()), Some(proc)];
        for fd in sealed.into_iter().flatten() {
            sys::mount_setattr_one(fd, MOUNT_ATTR_RDONLY)?;
        }
        Ok(())
    }

    /// Make the attached skeleton the root and detach the old one.
    pub fn pivot(&self) -> io::Result<()> {
        sys::pivot_into(self.skeleton.as_fd())
    }
}

/// vm.memfd_noexec is per pid namespace (Linux 6.3+): 2 makes every memfd of the cage
/// non-executable and sealed, so code written to memory cannot be exec'd as a new program —
/// the same rule noexec gives /tmp. Written through the cage's procfs before it is sealed
/// read-only; kernels without the knob have no file to write. Only by PID 1 of a pid namespace
/// (the cage's init): a procfs mounted by anyone else is its caller's namespace's — the host's,
/// for an init cloned without its own — and the write would seal every memfd there.
fn seal_memfds(proc: BorrowedFd<'_>) -> io::Result<()> {
    if std::process::id() != 1 {
        return Err(io::Error::other(
            "not the init of a pid namespace of its own: this procfs is another namespace's (the host's?)",
        ));
    }
    match sys::openat(proc, c"sys/vm/memfd_noexec", libc::O_WRONLY, 0) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(fd) => std::io::Write::write_all(&mut std::fs::File::from(fd), b"2"),
    }
}

/// Landlock governs `bind()`, not the port the kernel picks itself when a TCP socket that was
/// never bound listens (autobind): with no TCP bind port granted, the cage's network namespace
/// gets no ephemeral port at all — its range two ports, both reserved — so `listen()` without
/// `bind()` fails (EADDRINUSE) and no listener exists that the plan did not grant. With no port
/// to listen on, no TCP connection within the namespace could be made anyway; a UDP socket must
/// bind a port of its own to send. Two ports, not one: the kernel logs a warning for a range
/// whose ends have the same parity, on every write (a line per launch in the host's kernel log,
/// and ~1 ms of console output in the init on a machine with a serial console). Written
/// through the cage's procfs before it is sealed read-only (`sys/net` is the writer's network
/// namespace's, the cage's own here; the host's `/proc/sys` may be read-only, as under
/// systemd's `ProtectKernelTunables=`).
fn no_ephemeral_ports(proc: BorrowedFd<'_>) -> io::Result<()> {
    for (name, value) in [
        (c"sys/net/ipv4/ip_local_reserved_ports", NO_EPHEMERAL_RESERVED),
        (c"sys/net/ipv4/ip_local_port_range", NO_EPHEMERAL_RANGE),
    ] {
        let fd = sys::openat(proc, name, libc::O_WRONLY, 0).map_err(|e| err_at("opening", "/proc/sys/net/ipv4", e))?;
        std::io::Write::write_all(&mut std::fs::File::from(fd), value.as_bytes())
            .map_err(|e| err_at(&format!("writing {value:?} to"), Path::new(OsStr::from_bytes(name.to_bytes())), e))?;
    }
    Ok(())
}

/// The ephemeral range of a cage granted no TCP bind port (ends of different parity), and the
/// reservation covering all of it.
pub const NO_EPHEMERAL_RANGE: &str = "65534 65535";
/// See [`NO_EPHEMERAL_RANGE`].
pub const NO_EPHEMERAL_RESERVED: &str = "65534-65535";

/// A cage running as uid or gid 0 owns procfs's root-only files (`kpageflags`, `slabinfo`,
/// `vmallocinfo`, `timer_list`, `sysrq-trigger`, ...: every top-level file not readable by
/// others). Each is covered with a read-only bind of the cage's own `/dev/null`. An entry the
/// listing already types as a directory or link is passed over unlooked-up: each lookup makes
/// the fresh procfs an inode (about 4 µs), and only a regular file's mode is read.
fn mask_root_only(proc: BorrowedFd<'_>, dev: BorrowedFd<'_>) -> io::Result<()> {
    let mut first: Option<CString> = None;
    for (name, kind) in path::read_dir_typed(proc)? {
        if name.as_bytes().first().is_some_and(u8::is_ascii_digit) || kind.is_some_and(|k| k != Type::File) {
            continue;
        }
        let Ok(st) = sys::fstatat(proc, &name, libc::AT_SYMLINK_NOFOLLOW) else { continue };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_mode & libc::S_IROTH != 0 {
            continue;
        }
        // The first cover is made read-only; each later one is a clone of it, attributes and
        // all (one syscall, not two). Attached by name: one component of the cage's own
        // procfs, which nothing but this process has mounted on.
        let null = match &first {
            None => {
                let null = sys::open_tree_clone_at(dev, c"null")?;
                sys::mount_setattr_one(null.as_fd(), MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)?;
                null
            }
            Some(covered) => sys::open_tree_clone_at(proc, covered)?,
        };
        sys::move_mount_to(null.as_fd(), proc, &name)
            .map_err(|e| err_at("masking", Path::new("/proc").join(OsStr::from_bytes(name.as_bytes())), e))?;
        first.get_or_insert(name);
    }
    Ok(())
}

/// Cover `at` (resolved inside the cage's root, as the container would resolve it): a file
/// with a read-only bind of the cage's own `/dev/null`, a directory with an empty read-only
/// tmpfs. A path the root does not have is left alone (there is nothing to hide).
fn mask(root: BorrowedFd<'_>, at: &Path, dev: BorrowedFd<'_>) -> io::Result<()> {
    let target = match path::resolve_in(root, at, libc::O_PATH | libc::O_CLOEXEC) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    let cover = match sys::fstat(target.as_fd())?.st_mode & libc::S_IFMT == libc::S_IFDIR {
        true => tmpfs(4096, "0555", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)?,
        false => {
            let null = sys::open_tree_clone_at(dev, c"null")?;
            sys::mount_setattr_one(null.as_fd(), MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)?;
            null
        }
    };
    sys::move_mount_onto(cover.as_fd(), target.as_fd())
}

/// Make `at` (resolved inside the cage's root) and every mount below it read-only: a
/// recursive read-only clone of it mounted over it. A path the root does not have is left
/// alone.
fn make_read_only(root: BorrowedFd<'_>, at: &Path) -> io::Result<()> {
    let target = match path::resolve_in(root, at, libc::O_PATH | libc::O_CLOEXEC) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    let tree = sys::open_tree_clone(target.as_fd())?;
    sys::mount_setattr_tree(tree.as_fd(), MOUNT_ATTR_RDONLY)?;
    sys::move_mount_onto(tree.as_fd(), target.as_fd())
}

/// The first component of `dest` when it is the only one.
/// A plan's tmpfs goes below `/`, not at or below a place the cage provides itself.
fn tmpfs_name(dest: &Path) -> io::Result<&OsStr> {
    match path::components(dest).ok().and_then(|n| n.first().copied()) {
        Some(n) if dest.is_absolute() && !RESERVED.iter().any(|r| OsStr::new(r) == n) => Ok(n),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "tmpfs destination {} must be an absolute path outside /proc, /dev, /tmp and /workspace",
                dest.display()
            ),
        )),
    }
}

fn top_level_name(dest: &Path) -> Option<&OsStr> {
    let names = path::components(dest).ok()?;
    (names.len() == 1).then(|| names[0])
}

/// Attach a bind whose destination is inside an already attached tree, resolving the
/// destination inside the new root so a symlink in the image cannot redirect it.
fn attach_nested(root: BorrowedFd<'_>, n: &NestedBind) -> io::Result<()> {
    let flags = libc::O_PATH | if n.is_dir { libc::O_DIRECTORY } else { 0 };
    let target =
        path::resolve_in(root, &n.dest, flags).map_err(|e| err_at("resolving bind destination", &n.dest, e))?;
    let is_dir = sys::fstat(target.as_fd())?.st_mode & libc::S_IFMT == libc::S_IFDIR;
    if is_dir != n.is_dir {
        return Err(io::Error::other(format!("bind destination {} has the wrong file type", n.dest.display())));
    }
    sys::move_mount_onto(n.tree.as_fd(), target.as_fd()).map_err(|e| err_at("attaching bind at", &n.dest, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Only the init of a pid namespace of its own seals memfds through a procfs: from any
    /// other process the procfs is another namespace's — the host's, whose memfds a write
    /// would seal for every process on it (a mutant that cloned the init without its own pid
    /// namespace once did that to this machine). Refused, naming why, with nothing written: a
    /// stand-in directory with the sysctl's file takes the place of a procfs, so a write would
    /// land there and not on the host.
    #[test]
    fn only_a_namespaces_init_seals_its_memfds() {
        let d = Dir::new("memfd-standin");
        std::fs::create_dir_all(d.0.join("sys/vm")).unwrap();
        std::fs::write(d.0.join("sys/vm/memfd_noexec"), "0").unwrap();
        let err = seal_memfds(d.fd().as_fd()).unwrap_err();
        assert!(err.to_string().contains("not the init of a pid namespace of its own"), "{err}");
        assert_eq!(std::fs::read_to_string(d.0.join("sys/vm/memfd_noexec")).unwrap(), "0");
    }

    /// A scratch directory under target/ (not /tmp), removed when dropped.
    struct Dir(PathBuf);
    impl Dir {
        fn new(name: &str) -> Dir {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/unit-tmp").join(name);
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        fn fd(&self) -> OwnedFd {
            OwnedFd::from(std::fs::File::open(&self.0).unwrap())
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The host `/etc` copy takes regular files of at most 512 KiB only, never through a link,
    /// never waiting on a FIFO, never over something already there.
    #[test]
    fn copy_file_copies_small_regular_files_only() {
        let (from, to) = (Dir::new("copy-from"), Dir::new("copy-to"));
        std::fs::write(from.0.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        std::fs::write(from.0.join("big"), vec![b'x'; (ETC_FILE_MAX + 1) as usize]).unwrap();
        std::os::unix::fs::symlink("hosts", from.0.join("link")).unwrap();
        let (f, t) = (from.fd(), to.fd());
        sys::mknodat(f.as_fd(), c"fifo", libc::S_IFIFO | 0o644, 0).unwrap();
        copy_file(f.as_fd(), t.as_fd(), c"hosts", 0o640).unwrap();
        assert_eq!(std::fs::read_to_string(to.0.join("hosts")).unwrap(), "127.0.0.1 localhost\n");
        // A loader cache's size, every byte in place.
        let cache: Vec<u8> = (0..100_000u32).flat_map(u32::to_le_bytes).collect();
        std::fs::write(from.0.join("cache"), &cache).unwrap();
        copy_file(f.as_fd(), t.as_fd(), c"cache", 0o644).unwrap();
        assert!(std::fs::read(to.0.join("cache")).unwrap() == cache, "the copy differs");
        assert_eq!(std::fs::metadata(to.0.join("hosts")).unwrap().permissions().mode() & 0o777, 0o640);
        // Already there (a second copy, or a planted link): refused, not written through.
        assert!(copy_file(f.as_fd(), t.as_fd(), c"hosts", 0o640).is_err());
        std::os::unix::fs::symlink("hosts", to.0.join("planted")).unwrap();
        std::fs::write(from.0.join("planted"), "x").unwrap();
        assert!(copy_file(f.as_fd(), t.as_fd(), c"planted", 0o644).is_err());
        assert_eq!(std::fs::read_to_string(to.0.join("hosts")).unwrap(), "127.0.0.1 localhost\n");
        for refused in [c"big", c"link", c"fifo"] {
            assert!(copy_file(f.as_fd(), t.as_fd(), refused, 0o644).is_err(), "{refused:?}");
            assert!(!to.0.join(refused.to_str().unwrap()).exists(), "{refused:?}");
        }
    }
}
