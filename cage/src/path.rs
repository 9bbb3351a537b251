//! Path resolution without string joins. Every lookup is relative to a directory fd we hold,
//! through `openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`, so a symlink planted in an
//! untrusted tree (`/proc -> /host/proc`, `x -> ../../etc`) resolves inside that tree or fails.
//! Without `openat2` (before Linux 5.6, or a seccomp filter above chio refusing it) nothing is
//! resolved: the launch fails, and `chio security preflight` reports it fatal.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use crate::sys;

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;
const RESOLVE_IN_ROOT: u64 = 0x10;

/// Convert a path to a C string, refusing interior NUL bytes.
pub fn cstring(p: impl AsRef<OsStr>) -> io::Result<CString> {
    CString::new(p.as_ref().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Open an operator-supplied absolute host path as an `O_PATH` fd without following any
/// symlink in any component (`RESOLVE_NO_SYMLINKS`). A path is given by an operator, but the
/// directories it walks through may be writable by earlier cages (a workspace, say): a link
/// planted there (`W/next -> /`) would otherwise hand the next launch the host's root. A symlink
/// is refused (`ErrorKind::InvalidInput`), naming the component.
pub fn open_host(path: &Path, extra_flags: i32) -> io::Result<OwnedFd> {
    if !path.is_absolute() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not an absolute path", path.display())));
    }
    let c = cstring(path)?;
    openat2(nix::fcntl::AT_FDCWD, &c, libc::O_PATH | extra_flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS).map_err(
        |e| match e.raw_os_error() {
            // RESOLVE_NO_SYMLINKS met a symlink.
            Some(libc::ELOOP) => symlink_refused(path),
            _ => e,
        },
    )
}

/// `openat2`, its absence (ENOSYS) turned into an error an operator can act on.
fn openat2(dir: BorrowedFd<'_>, path: &std::ffi::CStr, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    sys::openat2(dir, path, flags, 0, resolve).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOSYS) => io::Error::new(
            io::ErrorKind::Unsupported,
            "openat2 is not available (Linux 5.6 or later, not refused by a seccomp filter above chio): \
             chio resolves every path with it",
        ),
        _ => e,
    })
}

/// The first prefix of `path` that is a symlink (for the refusal's message only).
fn first_symlink(path: &Path) -> Option<std::path::PathBuf> {
    let mut prefix = std::path::PathBuf::from("/");
    path.components().skip(1).find_map(|c| {
        prefix.push(c);
        std::fs::symlink_metadata(&prefix).ok().filter(|m| m.file_type().is_symlink()).map(|_| prefix.clone())
    })
}

/// The error for an operator path that passes through a symlink, naming the first one.
fn symlink_refused(path: &Path) -> io::Error {
    let link = first_symlink(path).map_or_else(|| path.display().to_string(), |l| l.display().to_string());
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{link} is a symbolic link; chio never follows symlinks in host paths (give the real path)"),
    )
}

/// Open the directory at `path` (`O_PATH`), following links on the way as the caller's rights
/// allow: for a path an operator (or a client, read with its own rights) names, below which
/// [`open_beneath`] then follows none.
pub fn open_host_following(path: &Path) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    use nix::fcntl::OFlag;
    Ok(nix::fcntl::open(
        c.as_c_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?)
}

/// Resolve `path` inside the tree rooted at `root`: absolute symlinks and `..` cannot leave it.
/// `flags` are the open flags (`O_PATH`, `O_RDONLY`, ...).
pub fn resolve_in(root: BorrowedFd<'_>, path: &Path, flags: i32) -> io::Result<OwnedFd> {
    let c = cstring(relative(path)?)?;
    openat2(root, &c, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
}

/// Open `path` under the directory `dir` through no symlink at all and never above `dir`
/// (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): for trees that hold only plain files and
/// directories (an OCI layout), where a link can only be planted. A link met is refused
/// (`ErrorKind::InvalidData`), naming `path`.
pub fn open_beneath(dir: BorrowedFd<'_>, path: &Path, flags: i32) -> io::Result<OwnedFd> {
    let c = cstring(relative(path)?)?;
    openat2(dir, &c, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is or passes through a symbolic link, which chio does not follow here", path.display()),
            ),
            Some(libc::EXDEV) => {
                io::Error::new(io::ErrorKind::InvalidData, format!("{} leads outside its directory", path.display()))
            }
            _ => e,
        }
    })
}

/// Names in the directory `dir` (without `.` and `..`), unsorted.
pub fn read_dir_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    Ok(read_dir_typed(dir)?.into_iter().map(|(name, _)| name).collect())
}

/// Names in the directory `dir` (without `.` and `..`), unsorted, each with the type the
/// listing gives (`None` where the file system leaves it unknown: look it up to know).
pub fn read_dir_typed(dir: BorrowedFd<'_>) -> io::Result<Vec<(CString, Option<nix::dir::Type>)>> {
    let fd = sys::openat(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for ent in d.iter() {
        let ent = ent?;
        let name = ent.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            out.push((name, ent.file_type()));
        }
    }
    Ok(out)
}

/// Remove the directory `name` in `parent` and everything below it, following no link, with at
/// most three descriptors open and no recursion. A tree a command wrote can be deeper than any
/// descriptor limit or stack allows (`while mkdir a && cd a; do :; done`), and the host must
/// still be able to remove it: `std::fs::remove_dir_all` holds a descriptor and a stack frame a
/// level. Each way back up is through `..`, checked against the device and inode seen on the
/// way down, so a tree moved meanwhile stops the removal instead of taking it elsewhere. It
/// never crosses into another mount (`rm --one-file-system`): a mount point in the tree — a bind
/// of a host directory — stops the removal, naming it, before anything of that mount is touched.
pub fn remove_tree(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    use std::os::fd::AsFd;
    let mount = sys::mount_id(parent)?;
    let open = |at: BorrowedFd<'_>, n: &std::ffi::CStr, path: &dyn Fn() -> String| {
        let fd = sys::openat(at, n, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?;
        if sys::mount_id(fd.as_fd())? != mount {
            return Err(io::Error::other(format!(
                "{}: a mount point; removing a tree does not cross into another mount (unmount it first)",
                path()
            )));
        }
        Ok(fd)
    };
    let top = cstring(name)?;
    // The names walked down through, each with the identity of the directory that holds it.
    let mut down: Vec<(CString, (u64, u64))> = Vec::new();
    let mut cur = open(parent, &top, &|| Path::new(name).display().to_string())?;
    loop {
        if let Some(child) = clear(cur.as_fd())? {
            #[cfg(test)]
            tests::BEFORE_DESCENT.with_borrow_mut(|hook| hook.as_mut().map(|f| f()));
            let next = open(cur.as_fd(), &child, &|| {
                let names = down.iter().map(|(n, _)| n.as_c_str()).chain([child.as_c_str()]);
                names
                    .fold(Path::new(name).to_path_buf(), |p, n| p.join(OsStr::from_bytes(n.to_bytes())))
                    .display()
                    .to_string()
            })?;
            down.push((child, identity(cur.as_fd())?));
            cur = next;
            continue;
        }
        let Some((child, id)) = down.pop() else { break };
        #[cfg(test)]
        tests::BEFORE_CLIMB.with_borrow_mut(|hook| hook.as_mut().map(|f| f()));
        let up = open(cur.as_fd(), c"..", &|| "..".into())?;
        if identity(up.as_fd())? != id {
            return Err(io::Error::other(format!(
                "{}: a directory moved while its tree was removed",
                Path::new(name).display()
            )));
        }
        nix::unistd::unlinkat(&up, child.as_c_str(), nix::unistd::UnlinkatFlags::RemoveDir)?;
        cur = up;
    }
    drop(cur);
    Ok(nix::unistd::unlinkat(parent, top.as_c_str(), nix::unistd::UnlinkatFlags::RemoveDir)?)
}

/// Remove every entry of the directory `dir` but the directories that are not empty, stopping
/// at the first of those and returning its name (`None`: `dir` is empty now).
fn clear(dir: BorrowedFd<'_>) -> io::Result<Option<CString>> {
    use nix::unistd::{unlinkat, UnlinkatFlags};
    let mut stream = nix::dir::Dir::from_fd(sys::openat(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?)?;
    for ent in stream.iter() {
        let ent = ent?;
        let name = ent.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let is_dir = match ent.file_type() {
            Some(t) => t == nix::dir::Type::Directory,
            None => {
                nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)?.st_mode & libc::S_IFMT
                    == libc::S_IFDIR
            }
        };
        if !is_dir {
            unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
            continue;
        }
        match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => {}
            // Not empty; or busy — a mount point, which the walk down names and stops at.
            Err(nix::errno::Errno::ENOTEMPTY | nix::errno::Errno::EEXIST | nix::errno::Errno::EBUSY) => {
                return Ok(Some(name.to_owned()))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// A directory's device and inode.
fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// Resolve the directory `dir` (an operator's path; links in it are resolved here, once) and
/// check that no one but root, or this process's own user, can replace it or anything named
/// through it: it and every directory above it must belong to one of them, `dir` writable by no
/// one else, and each directory above it either writable by no one else or sticky (where others
/// may add names but not move ours). A root process that keeps its state in a directory by path
/// — a workspace, a session — acts on whatever is there: a state directory in a user's home
/// could be renamed away by that user and replaced with one of their own making. The path
/// returned is the one checked; the caller uses it and nothing else.
pub fn private_dir(dir: &Path) -> io::Result<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(dir)?;
    let me = nix::unistd::geteuid().as_raw();
    for (i, d) in real.ancestors().enumerate() {
        let m = std::fs::symlink_metadata(d)?;
        let others_write = m.mode() & 0o022 != 0 && (i == 0 || m.mode() & 0o1000 == 0);
        if (m.uid() != 0 && m.uid() != me) || others_write {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is owned by uid {} with mode {:o}: whoever can write it can replace {} (it and every \
                     directory above it must be root's and writable by no one else; above it, sticky will do)",
                    d.display(),
                    m.uid(),
                    m.mode() & 0o7777,
                    real.display()
                ),
            ));
        }
    }
    Ok(real)
}

/// The normal components of `path`, refusing `..` (a walk never goes up).
pub fn components(path: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} contains '..'", path.display())))
            }
        }
    }
    Ok(out)
}

/// `path` made relative ("." for the root itself), for use with a directory fd.
fn relative(path: &Path) -> io::Result<std::path::PathBuf> {
    let names = components(path)?;
    if names.is_empty() {
        return Ok(".".into());
    }
    Ok(names.iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::symlink;

    /// A link's `..` resolved under RESOLVE_IN_ROOT while renames happen anywhere on the host
    /// (here a thread renaming a file back and forth): the kernel may answer EAGAIN, "could not
    /// ensure `..` did not escape", and asks the caller to try again. Every resolution succeeds
    /// (without the retry, about one in fifteen failed here).
    #[test]
    fn dotdot_resolves_while_the_host_renames() {
        let d = tempdir("renames");
        std::fs::create_dir(d.join("inner/sub")).unwrap();
        std::fs::write(d.join("inner/f"), "x").unwrap();
        symlink("../f", d.join("inner/sub/l")).unwrap();
        std::fs::write(d.join("a"), "").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renamer = {
            let (stop, d) = (stop.clone(), d.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::rename(d.join("a"), d.join("b"));
                    let _ = std::fs::rename(d.join("b"), d.join("a"));
                }
            })
        };
        let root = open_host(&d, libc::O_DIRECTORY).unwrap();
        let failed = (0..20_000)
            .filter_map(|_| resolve_in(root.as_fd(), Path::new("/inner/sub/l"), libc::O_RDONLY).err())
            .count();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        renamer.join().unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(failed, 0, "resolutions failed while the host renamed");
    }

    thread_local! {
        /// Run before each climb of `remove_tree` back up through `..` (this thread's only).
        pub(super) static BEFORE_CLIMB: std::cell::RefCell<Option<Box<dyn FnMut()>>> =
            const { std::cell::RefCell::new(None) };
        /// Run before each descent of `remove_tree` into a directory it found not empty.
        pub(super) static BEFORE_DESCENT: std::cell::RefCell<Option<Box<dyn FnMut()>>> =
            const { std::cell::RefCell::new(None) };
    }

    /// A tree moved while `remove_tree` removes it: the climb back up from the moved directory
    /// leads elsewhere, and the removal stops there, naming it, instead of going on in the
    /// directory the tree was moved into.
    #[test]
    fn remove_tree_stops_when_the_tree_moves() {
        let gone = Gone(tempdir("moved"));
        let d = &gone.0;
        std::fs::create_dir_all(d.join("t/a/b")).unwrap();
        std::fs::write(d.join("t/a/b/file"), "x").unwrap();
        std::fs::write(d.join("t/a/keep"), "x").unwrap();
        std::fs::create_dir(d.join("elsewhere")).unwrap();
        let (from, to) = (d.join("t/a"), d.join("elsewhere/a"));
        // Before the first climb (from b into a): move a out of t.
        BEFORE_CLIMB.set(Some(Box::new(move || {
            let _ = std::fs::rename(&from, &to);
        })));
        let parent = open_host(d, libc::O_DIRECTORY).unwrap();
        let err = remove_tree(parent.as_fd(), OsStr::new("t"));
        BEFORE_CLIMB.set(None);
        let err = err.unwrap_err();
        assert!(err.to_string().contains("t: a directory moved while its tree was removed"), "{err}");
        // b (climbed into a, which holds it still) went; a, in its new place, did not.
        assert!(d.join("elsewhere/a").is_dir() && !d.join("elsewhere/a/b").exists());
        assert!(d.join("t").is_dir(), "the removal went on past the move");
    }

    /// A directory swapped for a link to a host directory between its listing and the walk
    /// down into it: the walk never follows the link (the host's file stays) and the removal
    /// stops there, naming nothing of the host. Control: the link, followed, leads to the file.
    #[test]
    fn remove_tree_never_follows_a_directory_swapped_for_a_link() {
        let gone = Gone(tempdir("swapped"));
        let d = &gone.0;
        std::fs::create_dir_all(d.join("t/a")).unwrap();
        std::fs::write(d.join("t/a/file"), "x").unwrap();
        std::fs::write(d.join("inner/kept"), "host").unwrap();
        let (a, aside, host) = (d.join("t/a"), d.join("aside"), d.join("inner"));
        let mut once = true;
        BEFORE_DESCENT.set(Some(Box::new(move || {
            if std::mem::take(&mut once) {
                std::fs::rename(&a, &aside).unwrap();
                symlink(&host, &a).unwrap();
            }
        })));
        let parent = open_host(d, libc::O_DIRECTORY).unwrap();
        let err = remove_tree(parent.as_fd(), OsStr::new("t"));
        BEFORE_DESCENT.set(None);
        // ENOTDIR: O_DIRECTORY with O_NOFOLLOW finds a link, not a directory.
        let errno = err.unwrap_err().raw_os_error();
        assert!(matches!(errno, Some(libc::ENOTDIR | libc::ELOOP)), "{errno:?}");
        assert_eq!(std::fs::read_to_string(d.join("inner/kept")).unwrap(), "host", "the host's file");
        assert_eq!(std::fs::read_to_string(d.join("t/a/kept")).unwrap(), "host", "control: the link leads there");
    }

    /// A test's directory, removed however the test ends (these run under mutation, where they
    /// fail).
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("chio-path-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("inner")).unwrap();
        d
    }

    #[test]
    fn absolute_symlink_stays_inside_root() {
        let d = tempdir("abs");
        std::fs::write(d.join("inner/passwd"), "inside").unwrap();
        symlink("/inner/passwd", d.join("link")).unwrap();
        let root = open_host(&d, libc::O_DIRECTORY).unwrap();
        let fd = resolve_in(root.as_fd(), Path::new("/link"), libc::O_RDONLY).unwrap();
        let text = std::fs::read_to_string(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)));
        assert_eq!(text.unwrap(), "inside");
        // The same link pointing at a host file resolves inside the root and is not found.
        symlink("/etc/hostname", d.join("host")).unwrap();
        let err = resolve_in(root.as_fd(), Path::new("host"), libc::O_RDONLY).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn dotdot_cannot_leave_root() {
        let d = tempdir("dotdot");
        symlink("../../../../etc", d.join("up")).unwrap();
        let root = open_host(&d, libc::O_DIRECTORY).unwrap();
        let err = resolve_in(root.as_fd(), Path::new("up/hostname"), libc::O_RDONLY).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        let err = resolve_in(root.as_fd(), Path::new("../etc"), libc::O_RDONLY).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_host_path_through_a_symlink_is_refused_naming_the_first_link() {
        let d = tempdir("host");
        std::fs::write(d.join("inner/f"), "x").unwrap();
        symlink("inner", d.join("alias")).unwrap();
        symlink("f", d.join("inner/link")).unwrap();
        assert!(open_host(&d.join("inner/f"), 0).is_ok(), "control: the real path opens");
        for (path, named) in
            [("alias/f", "alias"), ("alias", "alias"), ("alias/link", "alias"), ("inner/link", "inner/link")]
        {
            let err = open_host(&d.join(path), 0).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{path}: {err}");
            let want = format!("{} is a symbolic link", d.join(named).display());
            assert!(err.to_string().starts_with(&want), "{path}: {err}");
        }
        let err = open_host(&d.join("absent"), 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "a missing path is not called a link: {err}");
        let err = open_host(Path::new("inner/f"), 0).unwrap_err();
        assert!(err.to_string().ends_with("is not an absolute path"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Beneath a directory, no link is followed — not even one that stays inside — and `..`
    /// is refused; plain files and directories open.
    #[test]
    fn beneath_a_directory_no_link_is_followed() {
        let d = tempdir("beneath");
        std::fs::write(d.join("inner/f"), "x").unwrap();
        symlink("inner", d.join("alias")).unwrap();
        symlink("f", d.join("inner/link")).unwrap();
        symlink("/etc", d.join("host")).unwrap();
        let dir = open_host(&d, libc::O_DIRECTORY).unwrap();
        assert!(open_beneath(dir.as_fd(), Path::new("inner/f"), libc::O_RDONLY).is_ok(), "control");
        for path in ["alias/f", "inner/link", "host/hostname"] {
            let err = open_beneath(dir.as_fd(), Path::new(path), libc::O_RDONLY).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{path}: {err}");
            assert!(err.to_string().contains("symbolic link"), "{path}: {err}");
        }
        let err = open_beneath(dir.as_fd(), Path::new("inner/../../etc/hostname"), libc::O_RDONLY).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        let err = open_beneath(dir.as_fd(), Path::new("absent"), libc::O_RDONLY).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Without openat2 nothing is resolved, and the error says what is missing. (The thread
    /// runs under the target's own seccomp filter, which makes openat2 ENOSYS; the filter and
    /// no_new_privs end with the thread.)
    #[test]
    fn without_openat2_nothing_resolves() {
        let d = tempdir("enosys");
        let dir = d.clone();
        let filters = crate::seccomp::build().unwrap();
        let errs = std::thread::spawn(move || {
            let root = std::fs::File::open(&dir).unwrap();
            nix::sys::prctl::set_no_new_privs().unwrap();
            crate::seccomp::install(&filters).unwrap();
            [open_host(&dir, 0).unwrap_err(), resolve_in(root.as_fd(), Path::new("inner"), libc::O_PATH).unwrap_err()]
        })
        .join()
        .unwrap();
        for err in errs {
            assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
            assert!(err.to_string().starts_with("openat2 is not available"), "{err}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// An operator's path is only ever named by the fd (a bind source, a root): it opens
    /// `O_PATH`, which cannot read, write or block on a FIFO.
    #[test]
    fn a_host_path_opens_as_a_path_only() {
        let d = tempdir("opath");
        std::fs::write(d.join("inner/f"), "x").unwrap();
        let fd = open_host(&d.join("inner/f"), 0).unwrap();
        let fl = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert_eq!(fl & libc::O_PATH, libc::O_PATH);
        assert_eq!(nix::unistd::read(&fd, &mut [0u8; 1]), Err(nix::errno::Errno::EBADF));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
