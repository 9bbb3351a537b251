//! One cgroup per launch, on cgroup v2 (unified) or v1 (one directory per controller hierarchy),
//! detected at run time. Ceilings are written before the cage's first process joins; at the end
//! everything in it is killed and the directories removed. On v1 the launch cgroup nests under the
//! supervisor's own cgroup in each hierarchy so host accounting still covers it (or higher, where
//! that one is not root's: [`v1_parent`]). On v2 it goes
//! under a configurable root (`CHIO_CGROUP_V2_ROOT`); else, when a service manager delegated the
//! supervisor's cgroup to it (systemd's `Delegate=yes`), under that cgroup's `launches`, so that
//! the unit's accounting, limits and final kill cover its cages ([`Delegation`]); else under
//! `/sys/fs/cgroup/chio`. v2 forbids processes in a cgroup that hands controllers to children,
//! so a supervisor in its delegated cgroup itself first moves into the leaf `supervisor` there.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::fcntl::AtFlags;
use nix::fcntl::{OFlag, AT_FDCWD};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use std::time::{Duration, Instant};

use crate::plan::Limits;

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
const CPU_PERIOD_US: u64 = 100_000;

/// A controller the cage may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// memory (+swap).
    Memory,
    /// pids.
    Pids,
    /// cpu bandwidth.
    Cpu,
    /// cpu accounting (v1 only; v2 has cpu.stat always).
    Cpuacct,
}

impl Controller {
    /// Every controller a launch may need, in the order `needed` lists them.
    pub const ALL: [Controller; 4] = [Controller::Cpuacct, Controller::Memory, Controller::Pids, Controller::Cpu];

    fn named(name: &str) -> Option<Controller> {
        Controller::ALL.into_iter().find(|c| c.name() == name)
    }

    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
        }
    }
}

/// Resource use read from the cgroup at the end.
#[derive(Debug, Default, Clone, Copy)]
pub struct Usage {
    /// Peak memory in bytes.
    pub peak_memory: u64,
    /// CPU time in microseconds.
    pub cpu_us: u64,
    /// The memory ceiling was hit (OOM kill or allocation failure).
    pub memory_hit: bool,
    /// The pids ceiling refused a fork.
    pub pids_hit: bool,
}

/// The cgroup of one launch.
#[derive(Debug)]
pub struct LaunchCgroup {
    /// Directory name, `chio-<supervisor pid>-<random>`, the same in every hierarchy (or an
    /// engine's path: [`LaunchCgroup::create_at`]).
    name: String,
    /// "v1" or "v2".
    pub version: &'static str,
    /// Directory per controller (v1), or the single directory under every controller (v2).
    dirs: Vec<(Controller, PathBuf)>,
    /// Ceilings that could not be applied because the controller is missing.
    pub missing: Vec<String>,
    /// Why they are missing, when that is known and something an operator can change.
    pub missing_why: Option<String>,
    /// Each distinct directory of `dirs`, opened once it exists: every later step of the launch
    /// works from these descriptors ([`Dir`]).
    opened: Vec<Dir>,
    /// A running cage's cgroup that a process entering it joins ([`LaunchCgroup::adopt`]):
    /// never killed or removed through this handle.
    adopted: bool,
}

/// Where a launch's cgroup goes: the hierarchy, and the cgroup mount opened ([`Mounts`]) — by
/// a one-shot launch before it clones the cage's init, so that nothing it does for the cgroup
/// afterwards walks sysfs.
#[derive(Debug)]
pub struct Place {
    /// The hierarchy launch cgroups go into.
    pub hierarchy: Hierarchy,
    mounts: Mounts,
}

impl Place {
    /// `hierarchy`, its mount opened now.
    pub fn of(hierarchy: Hierarchy) -> Place {
        Place { hierarchy, mounts: Mounts::open() }
    }
}

/// The cgroup mount point, `/sys/fs/cgroup`, opened for cgroup work: a path under it is looked
/// up from this descriptor, not from `/`. An absolute lookup walks `sys` and `fs`
/// in sysfs under sysfs's lock, and a cage's init takes that lock as a writer at the same
/// moment, to register its new network namespace's loopback device there: the two were
/// measured waiting on each other for ~130 µs a launch (`tests/bench/trace/waits.py`). A path
/// elsewhere (an operator's v2 root on another mount, a test's) is used as it is.
#[derive(Debug)]
struct Mounts(Option<OwnedFd>);

impl Mounts {
    fn open() -> Mounts {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        Mounts(nix::fcntl::openat(AT_FDCWD, CGROUP_MOUNT, flags, Mode::empty()).ok())
    }

    /// Where to look `path` up from: the mount's descriptor and the rest of the path, or the
    /// path as it is.
    fn at<'p>(&self, path: &'p Path) -> (BorrowedFd<'_>, &'p Path) {
        match (&self.0, path.strip_prefix(CGROUP_MOUNT)) {
            (Some(fd), Ok(rel)) if rel.as_os_str().is_empty() => (fd.as_fd(), Path::new(".")),
            (Some(fd), Ok(rel)) => (fd.as_fd(), rel),
            _ => (AT_FDCWD, path),
        }
    }

    /// The directory `path`, opened.
    fn dir(&self, path: &Path) -> io::Result<Opened> {
        let (at, rel) = self.at(path);
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(at, rel, flags, Mode::empty())
            .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("opening {}: {e}", path.display())))?;
        Ok(Opened { path: path.to_path_buf(), fd })
    }

    /// The file system type of what `path` names (None if it cannot be opened).
    fn magic(&self, path: &Path) -> Option<i64> {
        let (at, rel) = self.at(path);
        let fd = nix::fcntl::openat(at, rel, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
        nix::sys::statfs::fstatfs(&fd).ok().map(|st| st.filesystem_type().0)
    }

    /// Whether `path` (not followed if a link) belongs to root.
    fn roots(&self, path: &Path) -> bool {
        let (at, rel) = self.at(path);
        nix::sys::stat::fstatat(at, rel, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| st.st_uid == 0)
    }
}

/// A cgroup directory, opened, with its path for the record and for messages. Its files are
/// opened from the descriptor.
#[derive(Debug)]
struct Opened {
    path: PathBuf,
    fd: OwnedFd,
}

impl Opened {
    fn file(&self, name: &str, flags: OFlag) -> io::Result<fs::File> {
        let mode = Mode::from_bits_truncate(0o644);
        nix::fcntl::openat(&self.fd, name, flags | OFlag::O_CLOEXEC, mode).map(fs::File::from).map_err(|e| {
            io::Error::new(io::Error::from(e).kind(), format!("opening {}: {e}", self.path.join(name).display()))
        })
    }

    fn read(&self, name: &str) -> io::Result<String> {
        crate::sys::read_whole(self.file(name, OFlag::O_RDONLY)?)
    }

    /// Write `value` to the file `name`, opened as `fs::write` opens a file (a cgroup's files
    /// all exist; a directory standing in for one in a test gets them made).
    fn write(&self, name: &str, value: &str) -> io::Result<()> {
        let shown = |e: io::Error| {
            io::Error::new(e.kind(), format!("writing {value:?} to {}: {e}", self.path.join(name).display()))
        };
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC;
        io::Write::write_all(&mut self.file(name, flags).map_err(shown)?, value.as_bytes()).map_err(shown)
    }

    fn has(&self, name: &str) -> bool {
        nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// The pids listed in `cgroup.procs` (none if it cannot be read).
    fn procs(&self) -> Vec<libc::pid_t> {
        pids_in(&self.read("cgroup.procs").unwrap_or_default())
    }
}

/// One directory of a launch cgroup: itself opened — under a shared lock, as a live launch's
/// ([`lock_shared`]) — and its parent, from which it is made and removed and beside which
/// orphans are swept. Made or opened before the cage's init needs it; nothing after that looks
/// a path up through sysfs ([`Mounts`]).
#[derive(Debug)]
struct Dir {
    dir: Opened,
    parent: Opened,
}

impl Dir {
    /// Make the directory `name` in `parent`, open it and lock it.
    fn make(parent: Opened, name: &str) -> io::Result<Dir> {
        let path = parent.path.join(name);
        nix::sys::stat::mkdirat(&parent.fd, name, Mode::from_bits_truncate(0o755))
            .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("creating {}: {e}", path.display())))?;
        match Self::leaf(&parent, name, true) {
            Ok(fd) => Ok(Dir { dir: Opened { path, fd }, parent }),
            Err(e) => {
                let _ = nix::unistd::unlinkat(&parent.fd, name, UnlinkatFlags::RemoveDir);
                Err(e)
            }
        }
    }

    /// The existing directory `path`, opened (and locked if `lock`).
    fn open(mounts: &Mounts, path: &Path, lock: bool) -> io::Result<Dir> {
        let (Some(up), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
            return Err(io::Error::other(format!("{} names no cgroup directory", path.display())));
        };
        let parent = mounts.dir(up)?;
        let fd = Self::leaf(&parent, name, lock)?;
        Ok(Dir { dir: Opened { path: path.to_path_buf(), fd }, parent })
    }

    /// `name` in `parent`, opened (and locked if `lock`).
    fn leaf(parent: &Opened, name: &str, lock: bool) -> io::Result<OwnedFd> {
        let fd = OwnedFd::from(parent.file(name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?);
        if lock {
            lock_shared(&fd)
                .map_err(|e| io::Error::new(e.kind(), format!("locking {}: {e}", parent.path.join(name).display())))?;
        }
        Ok(fd)
    }

    /// The directory's own name (what each hierarchy's line of a member's `/proc/PID/cgroup`
    /// ends with).
    fn name(&self) -> &str {
        self.dir.path.file_name().and_then(|n| n.to_str()).unwrap_or_default()
    }

    /// Remove the directory from its parent.
    fn rmdir(&self) -> io::Result<()> {
        nix::unistd::unlinkat(&self.parent.fd, self.name(), UnlinkatFlags::RemoveDir).map_err(io::Error::from)
    }
}

fn statfs_magic(p: &Path) -> Option<i64> {
    nix::sys::statfs::statfs(p).ok().map(|st| st.filesystem_type().0)
}

/// SIGKILL a process the launch cgroup named `name` listed as `pid` — through a pidfd, and only
/// while it is in that cgroup. A listed process may have ended and been reaped since the list was
/// read, and its pid be another process's by now: a cage can churn through the host's pids by
/// forking (32,768 of them on a default `pid_max`), and a kill by pid would then hit whatever
/// host process came next. The pidfd is opened first, the membership read after, and the kill
/// goes through the pidfd: it reaches the process that was read, or none.
fn kill_listed(name: &str, pid: libc::pid_t) {
    kill_listed_if(name, pid, |_| true);
}

/// [`kill_listed`], and only if `also(pid)` holds once the pidfd is open.
fn kill_listed_if(name: &str, pid: libc::pid_t, also: impl Fn(libc::pid_t) -> bool) {
    let Ok(pidfd) = crate::sys::pidfd_open(pid) else { return };
    let member = crate::sys::read_proc(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|c| c.lines().any(|l| l.rsplit('/').next() == Some(name)));
    if member && also(pid) {
        let _ = crate::sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
    }
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("writing {value:?} to {}: {e}", path.display())))
}

fn needed(limits: &Limits) -> Vec<Controller> {
    let mut c = vec![Controller::Cpuacct];
    if limits.memory_bytes.is_some() {
        c.push(Controller::Memory);
    }
    if limits.pids.is_some() {
        c.push(Controller::Pids);
    }
    if limits.cpu_millis.is_some() {
        c.push(Controller::Cpu);
    }
    c
}

/// Which cgroup hierarchy launches go into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// The unified hierarchy, launch cgroups under this directory.
    V2(PathBuf),
    /// The legacy per-controller hierarchies, launch cgroups under our own cgroup in each.
    V1,
}

impl Hierarchy {
    /// The host's hierarchy; `v2_root` forces v2 under that directory (the operator's, or a
    /// private cgroup2 mount in tests). Without one, v2 launch cgroups go under the delegation
    /// this process runs in ([`Delegation::launches`]), else under `/sys/fs/cgroup/chio`.
    pub fn detect(v2_root: Option<&Path>) -> Hierarchy {
        if let Some(root) = v2_root {
            return Hierarchy::V2(root.to_path_buf());
        }
        match statfs_magic(Path::new(CGROUP_MOUNT)) {
            Some(CGROUP2_SUPER_MAGIC) => {
                Hierarchy::V2(Delegation::find().map_or_else(|| PathBuf::from(V2_DEFAULT_ROOT), |d| d.launches()))
            }
            _ => Hierarchy::V1,
        }
    }

    /// [`Hierarchy::detect`], this process first moved out of its delegated cgroup into the
    /// leaf there when it sits in that cgroup itself ([`Delegation::settle`]): what a launch
    /// takes before it makes its cgroup.
    pub fn take(v2_root: Option<&Path>) -> io::Result<Hierarchy> {
        match v2_root.is_none().then(Delegation::find).flatten() {
            Some(d) => {
                d.settle()?;
                Ok(Hierarchy::V2(d.launches()))
            }
            None => Ok(Hierarchy::detect(v2_root)),
        }
    }

    /// Which of the ceilings' controllers (memory, pids, cpu) a launch cgroup here could not
    /// get, judged as [`LaunchCgroup::make`] judges them: on v2 those the root's parent does not
    /// offer (a launch enables the rest there itself); on v1 those without a cgroup hierarchy
    /// mounted at `/sys/fs/cgroup/NAME` (a directory of another file system counts as none).
    pub fn unavailable(&self) -> Vec<&'static str> {
        match self {
            Hierarchy::V2(root) => {
                let offered = v2_offered(root);
                CEILINGS.into_iter().filter(|c| !offered.split_whitespace().any(|o| o == *c)).collect()
            }
            Hierarchy::V1 => CEILINGS
                .into_iter()
                .filter(|c| statfs_magic(&Path::new("/sys/fs/cgroup").join(c)) != Some(CGROUP_SUPER_MAGIC))
                .collect(),
        }
    }
}

/// Where the cgroup hierarchy is mounted.
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// Where v2 launch cgroups go when neither the operator nor a service manager says.
const V2_DEFAULT_ROOT: &str = "/sys/fs/cgroup/chio";

/// A cgroup v2 subtree handed to this process by a service manager: systemd's `Delegate=yes`
/// marks the unit's cgroup with the extended attribute `trusted.delegate` = `1` (only a
/// privileged process can set a `trusted.` attribute). Launch cgroups then go under its
/// `launches`, inside the unit: the unit's accounting and limits count its cages, and the
/// manager's stop and final SIGKILL reach them — a cage made outside the unit is a process its
/// manager neither sees nor ends.
///
/// Taken only when the delegated cgroup and every one above it belong to root: whoever owns a
/// cgroup's `cgroup.procs` or `cgroup.subtree_control` can move a cage's processes out of its
/// launch cgroup or take a controller (and with it a ceiling) away from the ones below. systemd
/// gives a `User=` unit's delegated cgroup to that user; a root chio there uses the default root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegation {
    /// The delegated cgroup (the unit's).
    pub dir: PathBuf,
    /// This process's own cgroup, `dir` or below it.
    pub own: PathBuf,
}

impl Delegation {
    /// The delegation this process runs in: the nearest cgroup at or above its own v2 cgroup
    /// with the mark, if the hierarchy at `/sys/fs/cgroup` is v2 and that cgroup is root's.
    pub fn find() -> Option<Delegation> {
        if statfs_magic(Path::new(CGROUP_MOUNT)) != Some(CGROUP2_SUPER_MAGIC) {
            return None;
        }
        let own = own_v2_cgroup()?;
        let mount = Path::new(CGROUP_MOUNT);
        let dir = own.ancestors().take_while(|d| *d != mount).find(|d| marked_delegated(d))?;
        let mounts = Mounts::open();
        let mut roots = dir.ancestors().take_while(|d| d.starts_with(mount));
        roots
            .all(|d| roots_own_files(&mounts, d, &["cgroup.procs", "cgroup.subtree_control"]))
            .then(|| Delegation { dir: dir.to_path_buf(), own: own.clone() })
    }

    /// Where this delegation's launch cgroups go: its `launches`.
    pub fn launches(&self) -> PathBuf {
        self.dir.join("launches")
    }

    /// Move this process into the leaf `supervisor` of the delegated cgroup when it sits in
    /// that cgroup itself. cgroup v2 hands controllers to a cgroup's children only while it
    /// holds no process of its own, so the launch cgroups' ceilings need the unit's cgroup
    /// empty. (A process of the unit that is not chio's keeps it from being so; the launch then
    /// finds the controllers missing and says why.)
    pub fn settle(&self) -> io::Result<()> {
        if self.own != self.dir {
            return Ok(());
        }
        let leaf = self.dir.join("supervisor");
        match fs::create_dir(&leaf) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io::Error::new(e.kind(), format!("creating {}: {e}", leaf.display())))
            }
            _ => {}
        }
        write(&leaf.join("cgroup.procs"), "0")
    }
}

/// This process's own cgroup on the v2 hierarchy mounted at `/sys/fs/cgroup`.
pub fn own_v2_cgroup() -> Option<PathBuf> {
    let text = crate::sys::read_proc("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new(CGROUP_MOUNT).join(rel.trim_start_matches('/')))
}

/// Whether a service manager marked `dir` delegated.
fn marked_delegated(dir: &Path) -> bool {
    xattr::get(dir, "trusted.delegate").ok().flatten().as_deref() == Some(b"1")
}

/// Whether `dir` and each of its `files` belong to root.
fn roots_own_files(mounts: &Mounts, dir: &Path, files: &[&str]) -> bool {
    mounts.roots(dir) && files.iter().all(|f| mounts.roots(&dir.join(f)))
}

/// The directory of the v1 hierarchy mounted at (or linked from) `mount`, by one name whichever
/// controller named it: co-mounted hierarchies (cpu,cpuacct) reach one directory through two
/// names, `cpu` and `cpuacct` being links to `cpu,cpuacct` beside them. One `readlink` for that
/// usual link; anything else is resolved whole (`canonicalize`, a `readlink` per component,
/// each a lookup through sysfs, which contends with a cage's new network namespace registering
/// its loopback device there).
fn v1_mount(mounts: &Mounts, mount: &Path) -> io::Result<PathBuf> {
    let (at, rel) = mounts.at(mount);
    match nix::fcntl::readlinkat(at, rel).map(PathBuf::from) {
        Err(nix::errno::Errno::EINVAL) => Ok(mount.to_path_buf()),
        Ok(to) if matches!(to.components().collect::<Vec<_>>()[..], [std::path::Component::Normal(_)]) => {
            Ok(mount.with_file_name(&to))
        }
        _ => fs::canonicalize(mount),
    }
}

/// Where v1 launch cgroups go in `controller`'s hierarchy, mounted at `mount`: under this
/// process's own cgroup there (`proc_cgroup` is its `/proc/self/cgroup`), so the host's
/// accounting covers them — or, when that cgroup or one above it is not root's, under the
/// parent of the highest such. Whoever owns a v1 cgroup's `cgroup.procs` or `tasks` moves
/// processes of their own uid between the cgroups below it: a cage running as that uid could be
/// pulled out of its launch cgroup and its ceilings (the v2 rule is [`Delegation`]'s).
fn v1_parent(mounts: &Mounts, mount: &Path, proc_cgroup: &str, controller: Controller) -> PathBuf {
    let rel = own_path_v1(proc_cgroup, controller.name()).unwrap_or_default();
    let own = mount.join(rel.trim_start_matches('/'));
    let chain: Vec<&Path> = own.ancestors().take_while(|d| d.starts_with(mount)).collect();
    match chain.iter().rposition(|d| !roots_own_files(mounts, d, &["cgroup.procs", "tasks"])) {
        // (A hierarchy's root that is not root's leaves nothing better than the root.)
        Some(i) => chain.get(i + 1).map_or(mount.to_path_buf(), |d| d.to_path_buf()),
        None => own,
    }
}

/// The controllers the ceilings use.
const CEILINGS: [&str; 3] = ["memory", "pids", "cpu"];

/// What the parent of a v2 launch root offers (its `cgroup.controllers`; empty if unreadable).
pub fn v2_offered(root: &Path) -> String {
    let parent = root.parent().unwrap_or(root);
    fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default().trim().to_string()
}

impl LaunchCgroup {
    /// A fresh launch cgroup name: `chio-<this process's pid>-<random>`.
    pub fn new_name() -> String {
        let mut b = [0u8; 8];
        // SAFETY: getrandom into a local buffer (nix has no wrapper); a short read leaves zeros,
        // which only weakens the uniqueness of a name already made unique by our pid.
        unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        format!("chio-{}-{:016x}", std::process::id(), u64::from_le_bytes(b))
    }

    /// A handle on no directory yet, named `name` on cgroup `version`.
    fn empty(name: String, version: &'static str) -> LaunchCgroup {
        LaunchCgroup {
            name,
            version,
            dirs: Vec::new(),
            missing: Vec::new(),
            missing_why: None,
            opened: Vec::new(),
            adopted: false,
        }
    }

    /// A detached launch's cgroup name: `chio-oci-<random>`. It names no supervisor pid, so no
    /// later launch's sweep takes it for an orphan (its supervisor exits by design once the
    /// cage is parked); the OCI runtime's `delete` removes it.
    pub fn detached_name() -> String {
        let fresh = Self::new_name();
        let random = fresh.rsplit('-').next().unwrap_or_default();
        format!("chio-oci-{random}")
    }

    /// A running cage's launch cgroup (its directories as that launch recorded them), for a
    /// process entering the cage to join. Its ceilings are the cage's, already written; this
    /// handle never kills what is in it or removes it.
    pub fn adopt(dirs: &[PathBuf]) -> io::Result<LaunchCgroup> {
        let first = dirs.first().ok_or_else(|| io::Error::other("the cage names no launch cgroup"))?;
        let name = first.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name.is_empty() || dirs.iter().any(|d| d.file_name() != first.file_name()) {
            return Err(io::Error::other(format!("the cage's cgroup directories do not share one name: {dirs:?}")));
        }
        let mounts = Mounts::open();
        let mut cg = LaunchCgroup { adopted: true, ..LaunchCgroup::empty(name, "v1") };
        for d in dirs {
            let dir = Dir::open(&mounts, d, false)?;
            let magic = nix::sys::statfs::fstatfs(&dir.dir.fd).map(|st| st.filesystem_type().0);
            let controllers = match magic {
                Ok(CGROUP2_SUPER_MAGIC) => {
                    cg.version = "v2";
                    vec![Controller::Cpuacct]
                }
                // A v1 directory's controller by the files it has (cpu and cpuacct may share one).
                Ok(CGROUP_SUPER_MAGIC) => [
                    (Controller::Memory, "memory.limit_in_bytes"),
                    (Controller::Pids, "pids.max"),
                    (Controller::Cpu, "cpu.cfs_quota_us"),
                    (Controller::Cpuacct, "cpuacct.usage"),
                ]
                .into_iter()
                .filter(|(_, f)| dir.dir.has(f))
                .map(|(c, _)| c)
                .collect(),
                _ => return Err(io::Error::other(format!("{} is not a cgroup directory", d.display()))),
            };
            cg.dirs.extend(controllers.into_iter().map(|c| (c, d.clone())));
            cg.opened.push(dir);
        }
        Ok(cg)
    }

    /// Create the launch cgroup `name` in `hierarchy` and write the ceilings.
    pub fn create(name: &str, limits: &Limits, place: &Place) -> io::Result<LaunchCgroup> {
        let cg = Self::make(name, &needed(limits), place)?;
        cg.apply(limits)?;
        Ok(cg)
    }

    /// Create the launch cgroup at the place an engine names (an OCI config's
    /// `linux.cgroupsPath`) and write the ceilings. An absolute `path` is taken from each
    /// hierarchy's root (`/kubepods/burstable/pod…/ID`: the pod's own cgroup then bounds the
    /// container, and the engine finds it where it looks), a relative one from where chio makes
    /// its launch cgroups. Missing parents are made (and left: they are the engine's); the leaf
    /// is made, or taken if it exists and holds no process.
    pub fn create_at(path: &Path, limits: &Limits, place: &Place) -> io::Result<LaunchCgroup> {
        let rel = engine_path(path)?;
        // The whole path, not the leaf alone: the exec stop then checks each hierarchy's line
        // ends with it (an engine's leaf, a container id or `c1`, is not unique on its own).
        let name = rel.to_string_lossy().into_owned();
        let controllers = needed(limits);
        let mounts = &place.mounts;
        let mut cg = LaunchCgroup::empty(name, "v1");
        let leaves: Vec<(Vec<Controller>, PathBuf)> = match &place.hierarchy {
            Hierarchy::V2(root) => {
                cg.version = "v2";
                let base = if path.is_absolute() { v2_mount_of(root) } else { root.clone() };
                let dir = base.join(&rel);
                // Each level offers the ceilings' controllers to the next (a failure leaves
                // them missing, named below, as for a launch cgroup of chio's own).
                for level in
                    dir.ancestors().skip(1).take_while(|d| d.starts_with(&base)).collect::<Vec<_>>().iter().rev()
                {
                    if !level.exists() {
                        fs::create_dir(level)?;
                    }
                    for c in CEILINGS {
                        let _ = write(&level.join("cgroup.subtree_control"), &format!("+{c}"));
                    }
                }
                vec![(controllers.clone(), dir)]
            }
            Hierarchy::V1 => {
                let own = crate::sys::read_proc("/proc/self/cgroup")?;
                let mut by_dir: Vec<(Vec<Controller>, PathBuf)> = Vec::new();
                for &c in &controllers {
                    let mount = Path::new(CGROUP_MOUNT).join(c.name());
                    if mounts.magic(&mount) != Some(CGROUP_SUPER_MAGIC) {
                        cg.missing.push(c.name().to_string());
                        continue;
                    }
                    let mount = v1_mount(mounts, &mount)?;
                    let base = if path.is_absolute() { mount.clone() } else { v1_parent(mounts, &mount, &own, c) };
                    let dir = base.join(&rel);
                    match by_dir.iter_mut().find(|(_, d)| *d == dir) {
                        Some((cs, _)) => cs.push(c),
                        None => by_dir.push((vec![c], dir)),
                    }
                }
                by_dir
            }
        };
        for (cs, dir) in leaves {
            match take_leaf(&dir).and_then(|()| Dir::open(mounts, &dir, true)) {
                Ok(d) => cg.opened.push(d),
                Err(e) => {
                    let _ = cg.remove();
                    return Err(e);
                }
            }
            let enabled = cg.opened.last().and_then(|d| d.dir.read("cgroup.controllers").ok()).unwrap_or_default();
            for c in cs {
                let on_v2 = cg.version == "v2";
                if on_v2 && c != Controller::Cpuacct && !enabled.split_whitespace().any(|a| a == c.name()) {
                    cg.missing.push(c.name().to_string());
                    cg.missing_why = Some(format!(
                        "the cgroup above {} does not offer {} (enable it in cgroup.subtree_control of each cgroup above)",
                        dir.display(),
                        c.name()
                    ));
                    continue;
                }
                cg.dirs.push((c, dir.clone()));
            }
            if cg.version == "v2" && !cg.has(Controller::Cpuacct) {
                cg.dirs.insert(0, (Controller::Cpuacct, dir.clone()));
            }
        }
        cg.apply(limits)?;
        Ok(cg)
    }

    /// Create the launch cgroup `name` in `hierarchy` with `controllers`, without ceilings yet
    /// (a daemon makes its next launch's ahead of the request: see [`crate::ahead`]).
    pub fn make(name: &str, controllers: &[Controller], place: &Place) -> io::Result<LaunchCgroup> {
        match &place.hierarchy {
            Hierarchy::V2(root) => Self::make_v2(&place.mounts, root, name, controllers),
            Hierarchy::V1 => Self::make_v1(&place.mounts, name, controllers),
        }
    }

    /// Whether this cgroup was made in `hierarchy` with the controllers `limits` need.
    pub fn fits(&self, limits: &Limits, hierarchy: &Hierarchy) -> bool {
        let mut wanted = needed(limits);
        let mut have: Vec<Controller> =
            self.dirs.iter().map(|(c, _)| *c).chain(self.missing.iter().filter_map(|m| Controller::named(m))).collect();
        wanted.sort_by_key(|c| c.name());
        have.sort_by_key(|c| c.name());
        let same_hierarchy = match hierarchy {
            Hierarchy::V1 => self.version == "v1",
            Hierarchy::V2(root) => {
                self.version == "v2" && self.dirs.first().is_some_and(|(_, d)| d.parent() == Some(root))
            }
        };
        same_hierarchy && wanted == have
    }

    /// Write the ceilings; on failure the cgroup is removed.
    pub fn apply(&self, limits: &Limits) -> io::Result<()> {
        let written = match self.version {
            "v2" => self.opened.first().map_or(Ok(()), |d| self.write_v2_limits(&d.dir, limits)),
            _ => self.write_v1_limits(limits),
        };
        if written.is_err() {
            let _ = self.remove();
        }
        written
    }

    fn make_v2(mounts: &Mounts, root: &Path, name: &str, controllers: &[Controller]) -> io::Result<LaunchCgroup> {
        let not_v2 = || io::Error::other(format!("{} is not on a cgroup2 filesystem", root.display()));
        let (Some(up), Some(leaf)) = (root.parent(), root.file_name().and_then(|n| n.to_str())) else {
            return Err(not_v2());
        };
        let parent = mounts.dir(up).map_err(|_| not_v2())?;
        if nix::sys::statfs::fstatfs(&parent.fd).map(|st| st.filesystem_type().0) != Ok(CGROUP2_SUPER_MAGIC) {
            return Err(not_v2());
        }
        match nix::sys::stat::mkdirat(&parent.fd, leaf, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => {
                return Err(io::Error::new(io::Error::from(e).kind(), format!("creating {}: {e}", root.display())))
            }
        }
        let root = Opened { path: root.to_path_buf(), fd: Dir::leaf(&parent, leaf, false)? };
        let available = root.read("cgroup.controllers").unwrap_or_default();
        let wanted = CEILINGS;
        // Enabling in the parent first lets the root expose them; failures leave them missing,
        // and a parent that holds processes is the failure an operator can do something about.
        let mut why = None;
        for c in wanted.iter().filter(|c| !available.split_whitespace().any(|a| a == **c)) {
            let busy = parent
                .write("cgroup.subtree_control", &format!("+{c}"))
                .is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY));
            if busy {
                why = Some(format!(
                    "{} holds processes of its own, and cgroup v2 hands controllers only to the children of a \
                     cgroup that holds none (run them in a cgroup below it, e.g. systemd's DelegateSubgroup=)",
                    parent.path.display()
                ));
            }
        }
        let available = root.read("cgroup.controllers").unwrap_or_default();
        for c in wanted.iter().filter(|c| available.split_whitespace().any(|a| a == **c)) {
            let _ = root.write("cgroup.subtree_control", &format!("+{c}"));
        }
        let dir = Dir::make(root, name)?;
        let enabled = dir.dir.read("cgroup.controllers").unwrap_or_default();
        let has = |c: Controller| c == Controller::Cpuacct || enabled.split_whitespace().any(|a| a == c.name());
        let mut cg = LaunchCgroup {
            dirs: vec![(Controller::Cpuacct, dir.dir.path.clone())],
            ..LaunchCgroup::empty(name.into(), "v2")
        };
        for &c in controllers.iter().filter(|c| **c != Controller::Cpuacct) {
            if has(c) {
                cg.dirs.push((c, dir.dir.path.clone()));
            } else {
                cg.missing.push(c.name().to_string());
                cg.missing_why.clone_from(&why);
            }
        }
        cg.opened.push(dir);
        Ok(cg)
    }

    fn write_v2_limits(&self, dir: &Opened, limits: &Limits) -> io::Result<()> {
        if let (Some(m), true) = (limits.memory_bytes, self.has(Controller::Memory)) {
            dir.write("memory.max", &m.to_string())?;
            if dir.has("memory.swap.max") {
                dir.write("memory.swap.max", &limits.swap_bytes.to_string())?;
            }
        }
        if let (Some(p), true) = (limits.pids, self.has(Controller::Pids)) {
            dir.write("pids.max", &p.to_string())?;
        }
        if let (Some(c), true) = (limits.cpu_millis, self.has(Controller::Cpu)) {
            dir.write("cpu.max", &format!("{} {CPU_PERIOD_US}", c * CPU_PERIOD_US / 1000))?;
        }
        Ok(())
    }

    fn make_v1(mounts: &Mounts, name: &str, controllers: &[Controller]) -> io::Result<LaunchCgroup> {
        let own = crate::sys::read_proc("/proc/self/cgroup")?;
        let mut cg = LaunchCgroup::empty(name.into(), "v1");
        for &c in controllers {
            let mount = Path::new(CGROUP_MOUNT).join(c.name());
            if mounts.magic(&mount) != Some(CGROUP_SUPER_MAGIC) {
                cg.missing.push(c.name().to_string());
                continue;
            }
            let parent = v1_parent(mounts, &v1_mount(mounts, &mount)?, &own, c);
            let dir = parent.join(name);
            if cg.dirs.iter().any(|(_, d)| *d == dir) {
                cg.dirs.push((c, dir));
                continue;
            }
            match mounts.dir(&parent).and_then(|p| Dir::make(p, name)) {
                Ok(d) => cg.opened.push(d),
                Err(e) => {
                    let _ = cg.remove();
                    return Err(e);
                }
            }
            cg.dirs.push((c, dir));
        }
        Ok(cg)
    }

    fn write_v1_limits(&self, limits: &Limits) -> io::Result<()> {
        if let (Some(m), Some(d)) = (limits.memory_bytes, self.dir(Controller::Memory)) {
            d.write("memory.limit_in_bytes", &m.to_string())?;
            if d.has("memory.memsw.limit_in_bytes") {
                d.write("memory.memsw.limit_in_bytes", &(m + limits.swap_bytes).to_string())?;
            } else if host_has_swap() {
                return Err(io::Error::other(
                    "the host has swap but no memory.memsw accounting, so the swap ceiling cannot be enforced",
                ));
            }
        }
        if let (Some(p), Some(d)) = (limits.pids, self.dir(Controller::Pids)) {
            d.write("pids.max", &p.to_string())?;
        }
        if let (Some(c), Some(d)) = (limits.cpu_millis, self.dir(Controller::Cpu)) {
            d.write("cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            d.write("cpu.cfs_quota_us", &(c * CPU_PERIOD_US / 1000).to_string())?;
        }
        Ok(())
    }

    /// Remove the launch cgroups beside this one whose supervisor is gone (see [`sweep`]).
    /// Called by a launch once its init is on its way, not while the init waits for the cgroup:
    /// a held cgroup (this one, any live launch's) is never taken for an orphan, so when the
    /// sweep runs does not matter.
    pub fn sweep_beside(&self) -> usize {
        let mut parents: Vec<&Opened> = self.opened.iter().map(|d| &d.parent).collect();
        parents.sort_by(|a, b| a.path.cmp(&b.path));
        parents.dedup_by(|a, b| a.path == b.path);
        parents.into_iter().map(sweep_orphans).sum()
    }

    fn has(&self, c: Controller) -> bool {
        self.dirs.iter().any(|(k, _)| *k == c)
    }

    /// The opened directory that carries controller `c`.
    fn dir(&self, c: Controller) -> Option<&Opened> {
        let (_, path) = self.dirs.iter().find(|(k, _)| *k == c)?;
        self.opened.iter().map(|d| &d.dir).find(|d| d.path == *path)
    }

    fn unique_dirs(&self) -> Vec<&Path> {
        let mut v: Vec<&Path> = self.opened.iter().map(|d| d.dir.path.as_path()).collect();
        v.sort();
        v
    }

    /// On v2, the launch directory for `clone3(CLONE_INTO_CGROUP)`.
    pub fn v2_dir(&self) -> io::Result<OwnedFd> {
        let d = self.opened.first().filter(|_| self.version == "v2");
        d.ok_or_else(|| io::Error::other("not a cgroup v2 launch cgroup"))?.dir.fd.try_clone()
    }

    /// Every descriptor this handle holds (its directories and their parents): what a janitor
    /// keeps of its supervisor's when it closes the rest ([`crate::janitor`]).
    pub fn descriptors(&self) -> Vec<RawFd> {
        self.opened.iter().flat_map(|d| [d.dir.fd.as_raw_fd(), d.parent.fd.as_raw_fd()]).collect()
    }

    /// The launch cgroup's directory name — or, at an engine's place, its path from the place's
    /// base (`pod/c1`): what each hierarchy's line of the target's `/proc/PID/cgroup` ends with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of distinct hierarchies the launch cgroup lives in.
    pub fn hierarchies(&self) -> usize {
        self.opened.len()
    }

    /// Directories of this launch, for the record.
    pub fn paths(&self) -> Vec<String> {
        self.unique_dirs().iter().map(|d| d.display().to_string()).collect()
    }

    /// On v1, the `tasks` file of every hierarchy, opened for the cage's init to move *itself*
    /// (writing "0"). A thread moving itself skips the global threadgroup lock that a move of
    /// another process takes — and with it an RCU grace period (7-10 ms on these hosts).
    pub fn self_join_fds(&self) -> io::Result<Vec<OwnedFd>> {
        if self.version != "v1" {
            return Ok(Vec::new());
        }
        self.opened.iter().map(|d| d.dir.file("tasks", OFlag::O_WRONLY).map(OwnedFd::from)).collect()
    }

    /// Resource use so far.
    pub fn usage(&self) -> Usage {
        let mut u = Usage::default();
        let read = |d: &Opened, f: &str| d.read(f).unwrap_or_default();
        if self.version == "v2" {
            let Some(d) = self.opened.first().map(|d| &d.dir) else {
                return u;
            };
            u.cpu_us = key_in(&read(d, "cpu.stat"), "usage_usec").unwrap_or(0);
            u.peak_memory = read(d, "memory.peak").trim().parse().unwrap_or(0);
            let events = read(d, "memory.events");
            u.memory_hit = ["oom_kill", "max"].iter().any(|k| key_in(&events, k).unwrap_or(0) > 0);
            u.pids_hit = key_in(&read(d, "pids.events"), "max").unwrap_or(0) > 0;
            return u;
        }
        if let Some(d) = self.dir(Controller::Cpuacct) {
            u.cpu_us = read(d, "cpuacct.usage").trim().parse().unwrap_or(0) / 1000;
        }
        if let Some(d) = self.dir(Controller::Memory) {
            u.peak_memory = read(d, "memory.max_usage_in_bytes").trim().parse().unwrap_or(0);
            u.memory_hit = read(d, "memory.failcnt").trim().parse().unwrap_or(0) > 0
                || key_in(&read(d, "memory.oom_control"), "oom_kill").unwrap_or(0) > 0;
        }
        if let Some(d) = self.dir(Controller::Pids) {
            u.pids_hit = key_in(&read(d, "pids.events"), "max").unwrap_or(0) > 0;
        }
        u
    }

    /// Kill every process in the cgroup (v2: cgroup.kill; v1: SIGKILL each listed pid until empty).
    pub fn kill_all(&self) {
        if self.adopted {
            return;
        }
        for d in &self.opened {
            if self.version == "v2" && d.dir.write("cgroup.kill", "1").is_ok() {
                continue;
            }
            for pid in d.dir.procs() {
                kill_listed(d.name(), pid);
            }
        }
    }

    /// Kill what is left, wait (bounded) for the cgroup to empty, and remove every directory.
    pub fn remove(&self) -> io::Result<()> {
        if self.adopted {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last_err = None;
        for d in &self.opened {
            loop {
                match d.rmdir() {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if Instant::now() < deadline => {
                        self.kill_all();
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => {
                        last_err = Some(io::Error::new(e.kind(), format!("removing {}: {e}", d.dir.path.display())));
                        break;
                    }
                }
            }
        }
        last_err.map_or(Ok(()), Err)
    }
}

/// An engine's cgroup path as a relative path of plain names: no `..`, no `.`, none empty,
/// and a leaf that is not of chio's own launch names (which sweeps take for orphans).
fn engine_path(path: &Path) -> io::Result<PathBuf> {
    use std::path::Component;
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("cgroupsPath {}: {why}", path.display()));
    let mut rel = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => rel.push(n),
            _ => return Err(bad("only plain names may follow one another (no '..' or '.')")),
        }
    }
    let leaf = rel.file_name().and_then(|n| n.to_str()).ok_or_else(|| bad("names no cgroup"))?;
    if leaf.starts_with("chio-") {
        return Err(bad("a name beginning chio- is chio's own launch cgroups'"));
    }
    Ok(rel)
}

/// The root of the cgroup2 mount `dir` lies on.
fn v2_mount_of(dir: &Path) -> PathBuf {
    let on = |d: &Path| statfs_magic(d) == Some(CGROUP2_SUPER_MAGIC);
    // (chio's launch root may not exist yet: from its nearest existing ancestor.)
    dir.ancestors().skip_while(|d| !d.exists()).take_while(|d| on(d)).last().unwrap_or(dir).to_path_buf()
}

/// Make the cgroup directory `dir` (its parents too), or take it if it exists and is empty: a
/// cgroup that holds processes is another's, never joined.
fn take_leaf(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| io::Error::new(e.kind(), format!("making {}: {e}", parent.display())))?;
    }
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match procs(dir).is_empty() {
            true => Ok(()),
            false => {
                Err(io::Error::other(format!("{} already holds processes: it is not this container's", dir.display())))
            }
        },
        Err(e) => Err(io::Error::new(e.kind(), format!("making {}: {e}", dir.display()))),
    }
}

/// Remove every launch cgroup whose supervisor is gone, in `hierarchy` (a daemon's start-up
/// recovery; launches sweep their own parent as they go, [`LaunchCgroup::sweep_beside`]).
/// Returns how many were removed.
pub fn sweep(hierarchy: &Hierarchy) -> usize {
    let mounts = Mounts::open();
    let swept = |parent: &Path| mounts.dir(parent).map_or(0, |p| sweep_orphans(&p));
    match hierarchy {
        Hierarchy::V2(root) => swept(root),
        Hierarchy::V1 => {
            let own = crate::sys::read_proc("/proc/self/cgroup").unwrap_or_default();
            let mut seen = Vec::new();
            let mut removed = 0;
            for c in Controller::ALL {
                let Ok(mount) = v1_mount(&mounts, &Path::new(CGROUP_MOUNT).join(c.name())) else { continue };
                let parent = v1_parent(&mounts, &mount, &own, c);
                if !seen.contains(&parent) {
                    removed += swept(&parent);
                    seen.push(parent);
                }
            }
            removed
        }
    }
}

/// Whether `pid` runs in a pid namespace made from this process's own: a cage of a supervisor
/// of this pid namespace (its init was cloned with `CLONE_NEWPID` from here). A launch cgroup's
/// name holds its supervisor's pid as that supervisor saw it; one made by a supervisor in
/// another pid namespace — a container's chio on a cgroup hierarchy it shares with the host's —
/// names a pid that means nothing here, and its live cage is not an orphan of ours.
fn caged_from_here(pid: libc::pid_t) -> bool {
    use std::os::fd::{AsRawFd, FromRawFd};
    let Ok(ours) = nix::sys::stat::stat("/proc/self/ns/pid") else { return false };
    let Ok(ns) = fs::File::open(format!("/proc/{pid}/ns/pid")) else { return false };
    // SAFETY: NS_GET_PARENT on a namespace descriptor we hold; it returns a new descriptor or -1
    // (raw: nix has no namespace ioctls).
    let parent = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_PARENT) };
    if parent < 0 {
        return false;
    }
    // SAFETY: a descriptor the kernel just gave us, owned from here.
    let parent = unsafe { std::os::fd::OwnedFd::from_raw_fd(parent) };
    nix::sys::stat::fstat(&parent).is_ok_and(|st| (st.st_dev, st.st_ino) == (ours.st_dev, ours.st_ino))
}

/// Remove launch cgroups (`chio-<pid>-<random>`) in `parent` whose supervisor is gone. Normally
/// the janitor does this the moment a supervisor dies; this catches the case where both were
/// killed. Only processes caged from this pid namespace are killed ([`caged_from_here`]): a
/// cgroup holding others is some other namespace's launch, and rmdir leaves it (busy).
fn sweep_orphans(parent: &Opened) -> usize {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(mut entries) = nix::dir::Dir::openat(&parent.fd, ".", flags, Mode::empty()) else { return 0 };
    let names: Vec<String> =
        entries.iter().flatten().filter_map(|e| e.file_name().to_str().ok().map(str::to_string)).collect();
    let mut removed = 0;
    for name in names {
        let Some(pid) = name.strip_prefix("chio-").and_then(|r| r.split('-').next()) else { continue };
        if pid.parse::<u32>().is_err() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        let Ok(dir) = Dir::leaf(parent, &name, false) else { continue };
        if held(&dir) {
            continue;
        }
        let opened = Opened { path: parent.path.join(&name), fd: dir };
        for p in opened.procs() {
            kill_listed_if(&name, p, caged_from_here);
        }
        removed += usize::from(nix::unistd::unlinkat(&parent.fd, name.as_str(), UnlinkatFlags::RemoveDir).is_ok());
    }
    removed
}

/// Lock the opened directory `fd` shared (`flock`): a live launch's mark on its cgroup
/// directory, kept by its supervisor and its janitor, released by the kernel when both are gone.
fn lock_shared(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: flock on our own open descriptor (raw: nix's Flock unlocks on drop, which would
    // end the lock for every process sharing the descriptor).
    match unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_SH) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Whether a live launch holds the directory opened as `fd` ([`lock_shared`]). A lock that
/// cannot be asked about counts as held: the directory stays. (The exclusive lock taken to ask
/// goes with this descriptor, closed by the caller.)
fn held(fd: &OwnedFd) -> bool {
    // SAFETY: flock on our own open descriptor.
    unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

/// The supervisor's own path in the v1 hierarchy that carries `controller`.
fn own_path_v1(proc_cgroup: &str, controller: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctrls.split(',').any(|c| c == controller).then(|| path.to_string())
    })
}

fn host_has_swap() -> bool {
    fs::read_to_string("/proc/swaps").map(|s| s.lines().count() > 1).unwrap_or(false)
}

/// The value of `key` in a flat-keyed cgroup file's text (`key value` lines).
fn key_in(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// True for a launch cgroup's directory name: `chio-<pid>-<16 hex digits>`.
fn is_launch_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("chio-") else { return false };
    let Some((pid, rnd)) = rest.split_once('-') else { return false };
    !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && rnd.len() == 16
        && rnd.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Kill and remove launch cgroups recorded earlier (recovery after a supervisor died before
/// its janitor could). Only a directory on a cgroup file system whose name is a launch name is
/// touched: a recorded path is data, never a licence to kill elsewhere. Returns the directories
/// that existed and were removed; a missing one is already gone.
pub fn reclaim(paths: &[String]) -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for p in paths {
        let d = Path::new(p);
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !is_launch_name(name) || !d.is_absolute() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{p} is not a chio launch cgroup")));
        }
        let Some(magic) = statfs_magic(d) else { continue };
        if magic != libc::CGROUP_SUPER_MAGIC && magic != libc::CGROUP2_SUPER_MAGIC {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{p} is not on a cgroup file system")));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let _ = write(&d.join("cgroup.kill"), "1");
            for pid in procs(d) {
                kill_listed(name, pid);
            }
            match fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(io::Error::new(e.kind(), format!("removing {p}: {e}"))),
            }
        }
        removed.push(p.clone());
    }
    Ok(removed)
}

fn procs(d: &Path) -> Vec<libc::pid_t> {
    pids_in(&fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default())
}

/// The pids of a `cgroup.procs` text.
fn pids_in(text: &str) -> Vec<libc::pid_t> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engines_cgroup_path_is_plain_names() {
        assert_eq!(engine_path(Path::new("/kubepods/pod1/abc")).unwrap(), PathBuf::from("kubepods/pod1/abc"));
        assert_eq!(engine_path(Path::new("rel/c")).unwrap(), PathBuf::from("rel/c"));
        // (A "." inside is no step at all: Path drops it.)
        assert_eq!(engine_path(Path::new("/a/./b")).unwrap(), PathBuf::from("a/b"));
        for bad in ["/a/../../etc", "./a", "/", "", "/pods/chio-1-00112233aabbccdd"] {
            assert!(engine_path(Path::new(bad)).is_err(), "{bad:?} taken");
        }
    }

    #[test]
    fn reclaim_touches_only_launch_cgroups() {
        assert!(is_launch_name("chio-123-00112233aabbccdd"));
        for bad in ["chio-x-00112233aabbccdd", "system.slice", "chio-1-0011", "chio--00112233aabbccdd"] {
            assert!(!is_launch_name(bad), "{bad}");
        }
        let e = reclaim(&["/sys/fs/cgroup/system.slice".into()]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // A launch name outside a cgroup file system is refused, not removed.
        let e = reclaim(&["/proc/chio-1-00112233aabbccdd".into()]).map(|v| v.len());
        assert!(matches!(e, Ok(0)), "{e:?}");
    }

    use std::process::{Child, Command};

    /// A child killed and reaped when the test ends, however it ends.
    struct Gone(Child);

    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn sleeper() -> Gone {
        Gone(Command::new("/bin/sleep").arg("30").spawn().unwrap())
    }

    /// A launch cgroup removed when the test ends (after the children, declared later, are gone).
    struct Removed(LaunchCgroup);

    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = self.0.remove();
        }
    }

    fn ceilings() -> Limits {
        Limits {
            memory_bytes: Some(64 << 20),
            swap_bytes: 16 << 20,
            pids: Some(7),
            cpu_millis: Some(250),
            ..Limits::default()
        }
    }

    /// A listed pid is killed only while its process is in the cgroup: once reaped, its pid may
    /// be any host process's (here: a process outside the cgroup, named by its pid).
    #[test]
    fn a_listed_pid_is_killed_only_while_it_is_in_the_cgroup() {
        let cg = Removed(
            LaunchCgroup::make(&LaunchCgroup::new_name(), &[Controller::Pids], &Place::of(Hierarchy::detect(None)))
                .unwrap(),
        );
        let dir = cg.0.unique_dirs()[0].to_path_buf();
        let mut inside = sleeper();
        let mut outside = sleeper();
        fs::write(dir.join("cgroup.procs"), inside.0.id().to_string()).unwrap();

        let name = cg.0.name().to_string();
        kill_listed(&name, outside.0.id() as libc::pid_t);
        std::thread::sleep(Duration::from_millis(50));
        assert!(outside.0.try_wait().unwrap().is_none(), "a process outside the launch cgroup was killed");

        kill_listed(&name, inside.0.id() as libc::pid_t);
        let status = inside.0.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        cg.0.remove().unwrap();
    }

    /// Removing a launch cgroup kills whatever is still in it (on this host's v1 hierarchies).
    #[test]
    fn removing_a_launch_cgroup_kills_what_is_left_in_it() {
        let cg =
            LaunchCgroup::make(&LaunchCgroup::new_name(), &[Controller::Pids], &Place::of(Hierarchy::detect(None)))
                .unwrap();
        let dir = cg.unique_dirs()[0].to_path_buf();
        let mut left = sleeper();
        fs::write(dir.join("cgroup.procs"), left.0.id().to_string()).unwrap();
        let (removed, status) = remove_around(&cg, &mut left);
        let _ = fs::remove_dir(&dir);
        removed.unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    }

    /// `cg.remove()` with `left` in it, and how `left` ended (killed here if the removal left it).
    fn remove_around(cg: &LaunchCgroup, left: &mut Gone) -> (io::Result<()>, std::process::ExitStatus) {
        let removed = cg.remove();
        if removed.is_err() {
            let _ = left.0.kill();
        }
        (removed, left.0.wait().unwrap())
    }

    /// This thread in a mount namespace of its own with the host's unified hierarchy mounted at
    /// a fresh `/tmp/NAME-<pid>` (the mount is private to the thread's namespace).
    fn private_cgroup2(name: &str) -> PathBuf {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
        let none: Option<&str> = None;
        nix::mount::mount(none, "/", none, nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE, none)
            .unwrap();
        let mnt = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        fs::create_dir_all(&mnt).unwrap();
        nix::mount::mount(Some("none"), &mnt, Some("cgroup2"), nix::mount::MsFlags::empty(), none).unwrap();
        mnt
    }

    /// Detached: a child another test thread forks holds copies of our descriptors (the
    /// cgroup's locks among them) until it execs, and the mount is busy meanwhile.
    fn unmount_private(mnt: &Path) {
        let _ = nix::mount::umount2(mnt, nix::mount::MntFlags::MNT_DETACH);
        let _ = fs::remove_dir(mnt);
    }

    /// The same on cgroup v2, through `cgroup.kill`: in a private cgroup2 mount (the hierarchy is
    /// the host's one unified tree; the mount lives in this test thread's own mount namespace).
    #[test]
    fn removing_a_v2_launch_cgroup_kills_what_is_left_in_it() {
        std::thread::spawn(|| {
            let mnt = private_cgroup2("chio-cg2");
            let root = mnt.join(format!("chio-unit-{}", std::process::id()));
            let cg = LaunchCgroup::make(&LaunchCgroup::new_name(), &[], &Place::of(Hierarchy::V2(root.clone())));
            let outcome = cg.map(|cg| {
                let dir = cg.unique_dirs()[0].to_path_buf();
                let mut left = sleeper();
                fs::write(dir.join("cgroup.procs"), left.0.id().to_string()).unwrap();
                let (removed, status) = remove_around(&cg, &mut left);
                let _ = fs::remove_dir(&dir);
                (removed, status)
            });
            let _ = fs::remove_dir(&root);
            unmount_private(&mnt);
            let (removed, status) = outcome.unwrap();
            removed.unwrap();
            assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        })
        .join()
        .unwrap();
    }

    /// On v2 an engine's absolute path is taken from the mount's root, not from chio's own
    /// launch root, and a relative one from that launch root; parents are left at removal. (On
    /// a hybrid host the private cgroup2 mount offers no controllers: the ceilings are named
    /// missing, never silently dropped.)
    #[test]
    fn a_v2_cgroup_at_an_engines_path_is_made_from_the_mounts_root() {
        std::thread::spawn(|| {
            let mnt = private_cgroup2("chio-cg2-at");
            let root = mnt.join(format!("chio-unit-at-{}", std::process::id()));
            let h = Place::of(Hierarchy::V2(root.clone()));
            let pod = format!("pod-{}", std::process::id());
            let abs = LaunchCgroup::create_at(Path::new(&format!("/{pod}/c1")), &ceilings(), &h);
            let rel = LaunchCgroup::create_at(Path::new("c2"), &ceilings(), &h);
            let seen = |cg: &io::Result<LaunchCgroup>| {
                let c = cg.as_ref().map_err(|e| e.to_string())?;
                Ok::<_, String>((c.unique_dirs()[0].to_path_buf(), c.name().to_string(), c.missing.clone()))
            };
            let (a, r) = (seen(&abs), seen(&rel));
            let removed = [abs.map(|c| c.remove()), rel.map(|c| c.remove())];
            let pod_left = mnt.join(&pod).is_dir();
            let offered = fs::read_to_string(mnt.join("cgroup.controllers")).unwrap_or_default();
            let _ = fs::remove_dir(mnt.join(&pod));
            let _ = fs::remove_dir(&root);
            unmount_private(&mnt);
            let (a, r) = (a.unwrap(), r.unwrap());
            assert_eq!((a.0, a.1), (mnt.join(&pod).join("c1"), format!("{pod}/c1")));
            assert_eq!(r.0, root.join("c2"));
            for c in CEILINGS.iter().filter(|c| !offered.split_whitespace().any(|o| o == **c)) {
                assert!(a.2.iter().any(|m| m == c), "{c} not offered yet not named missing: {:?}", a.2);
            }
            for r in removed {
                r.unwrap().unwrap();
            }
            assert!(pod_left, "the engine's parent is left");
        })
        .join()
        .unwrap();
    }

    /// The ceilings as each hierarchy names them: on v1 (this host's, for real) the memory ceiling
    /// with swap on top in memsw, pids, and the CPU quota per period.
    #[test]
    fn v1_ceilings_are_written_as_v1_names_them() {
        let cg =
            Removed(LaunchCgroup::create(&LaunchCgroup::new_name(), &ceilings(), &Place::of(Hierarchy::V1)).unwrap());
        let read =
            |c: Controller, f: &str| fs::read_to_string(cg.0.dir(c).unwrap().path.join(f)).unwrap().trim().to_string();
        assert_eq!(read(Controller::Memory, "memory.limit_in_bytes"), (64u64 << 20).to_string());
        if cg.0.dir(Controller::Memory).unwrap().has("memory.memsw.limit_in_bytes") {
            assert_eq!(read(Controller::Memory, "memory.memsw.limit_in_bytes"), (80u64 << 20).to_string());
        }
        assert_eq!(read(Controller::Pids, "pids.max"), "7");
        assert_eq!(read(Controller::Cpu, "cpu.cfs_quota_us"), "25000");
        assert_eq!(read(Controller::Cpu, "cpu.cfs_period_us"), "100000");
    }

    /// On v2 (this host's v2 tree has no memory, pids or cpu controller: the files are checked in
    /// a directory standing in for the cgroup) the memory ceiling, swap apart, pids, and the CPU
    /// quota and period in one file.
    #[test]
    fn v2_ceilings_are_written_as_v2_names_them() {
        let dir = std::env::temp_dir().join(format!("chio-v2-ceilings-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("memory.swap.max"), "max").unwrap();
        let dirs = [Controller::Cpuacct, Controller::Memory, Controller::Pids, Controller::Cpu];
        let cg = LaunchCgroup {
            dirs: dirs.iter().map(|c| (*c, dir.clone())).collect(),
            opened: vec![Dir::open(&Mounts::open(), &dir, false).unwrap()],
            ..LaunchCgroup::empty("stand-in".into(), "v2")
        };
        let applied = cg.apply(&ceilings());
        let read = |f: &str| fs::read_to_string(dir.join(f)).map(|s| s.trim().to_string());
        let files = ["memory.max", "memory.swap.max", "pids.max", "cpu.max"].map(read);
        let v1_files = ["memory.limit_in_bytes", "cpu.cfs_quota_us"].map(|f| dir.join(f).exists());
        fs::remove_dir_all(&dir).unwrap();
        applied.unwrap();
        let want = [(64u64 << 20).to_string(), (16u64 << 20).to_string(), "7".into(), "25000 100000".into()];
        assert_eq!(files.map(Result::unwrap), want);
        assert_eq!(v1_files, [false, false]);
    }

    /// What a workspace's receipts name is reclaimed only if it is a launch cgroup on a cgroup
    /// file system: a directory of that name elsewhere is refused and left as it was.
    #[test]
    fn reclaim_refuses_a_launch_name_off_a_cgroup_file_system() {
        let base = std::env::temp_dir().join(format!("chio-reclaim-{}", std::process::id()));
        let fake = base.join("chio-1-00112233aabbccdd");
        fs::create_dir_all(&fake).unwrap();
        let refused = reclaim(&[fake.to_string_lossy().into_owned()]);
        let still = fake.exists();
        fs::remove_dir_all(&base).unwrap();
        assert_eq!(refused.map_err(|e| e.kind()), Err(io::ErrorKind::InvalidInput));
        assert!(still, "a directory off a cgroup file system was removed");
    }

    /// A launch cgroup a workspace's receipts name is reclaimed: what is in it killed, the
    /// directory removed (and said so only then).
    #[test]
    fn reclaim_removes_a_launch_cgroup_and_kills_what_is_in_it() {
        let cg = Removed(
            LaunchCgroup::make(&LaunchCgroup::new_name(), &[Controller::Pids], &Place::of(Hierarchy::V1)).unwrap(),
        );
        let dir = cg.0.unique_dirs()[0].to_path_buf();
        let mut left = sleeper();
        fs::write(dir.join("cgroup.procs"), left.0.id().to_string()).unwrap();
        let named = dir.to_string_lossy().into_owned();
        let reclaimed = reclaim(std::slice::from_ref(&named));
        let gone = !dir.exists();
        if reclaimed.is_err() {
            let _ = left.0.kill();
        }
        let status = left.0.wait().unwrap();
        assert_eq!(reclaimed.unwrap(), vec![named]);
        assert!(gone, "reclaimed but still there");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    }

    /// A launch cgroup whose supervisor is gone is swept, and counted; one whose name's pid is
    /// gone here but that a live launch still holds — its supervisor in another pid namespace,
    /// where that pid means something else — is kept. In a parent of its own: every launch
    /// cgroup made beside this test sweeps its own parent, and a child forked by another test
    /// thread holds a copy of any lock taken here until it execs.
    #[test]
    fn the_sweep_removes_and_counts_orphans() {
        let parent = Path::new("/sys/fs/cgroup/pids").join(format!("chio-test-sweep-{}", std::process::id()));
        fs::create_dir(&parent).unwrap();
        let mut dead = Command::new("/bin/true").spawn().unwrap();
        let pid = dead.id();
        dead.wait().unwrap();
        let (orphan, kept) = (parent.join(format!("chio-{pid}-00112233")), parent.join(format!("chio-{pid}-44556677")));
        fs::create_dir(&orphan).unwrap();
        fs::create_dir(&kept).unwrap();
        let held = Dir::open(&Mounts::open(), &kept, true).unwrap();
        let swept = sweep_orphans(&Mounts::open().dir(&parent).unwrap());
        let left = (orphan.exists(), kept.exists());
        drop(held);
        for d in [&kept, &orphan, &parent] {
            let _ = fs::remove_dir(d);
        }
        assert_eq!(left, (false, true), "(orphan, held) left");
        assert_eq!(swept, 1);
    }

    /// A co-mounted hierarchy's two links name its one directory; a directory names itself; any
    /// other link is resolved whole, and a missing name is an error.
    #[test]
    fn a_v1_hierarchy_has_one_name_whichever_controller_names_it() {
        let d = std::env::temp_dir().join(format!("chio-v1-mount-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("cpu,cpuacct")).unwrap();
        fs::create_dir_all(d.join("memory")).unwrap();
        fs::create_dir_all(d.join("x/pids")).unwrap();
        std::os::unix::fs::symlink("cpu,cpuacct", d.join("cpu")).unwrap();
        std::os::unix::fs::symlink("cpu,cpuacct", d.join("cpuacct")).unwrap();
        std::os::unix::fs::symlink("x/../x/pids", d.join("pids")).unwrap();
        let canonical = fs::canonicalize(&d).unwrap();
        let m = Mounts::open();
        assert_eq!(v1_mount(&m, &d.join("cpu")).unwrap(), d.join("cpu,cpuacct"));
        assert_eq!(v1_mount(&m, &d.join("cpuacct")).unwrap(), v1_mount(&m, &d.join("cpu")).unwrap());
        assert_eq!(v1_mount(&m, &d.join("memory")).unwrap(), d.join("memory"));
        assert_eq!(v1_mount(&m, &d.join("pids")).unwrap(), canonical.join("x/pids"));
        assert!(v1_mount(&m, &d.join("blkio")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn parses_v1_membership() {
        let text = "9:name=systemd:/\n4:memory:/a/b\n1:cpu,cpuacct:/c\n0::/\n";
        assert_eq!(own_path_v1(text, "memory").as_deref(), Some("/a/b"));
        assert_eq!(own_path_v1(text, "cpuacct").as_deref(), Some("/c"));
        assert_eq!(own_path_v1(text, "pids"), None);
    }
}
