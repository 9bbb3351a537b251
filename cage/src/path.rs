//! Path resolution without string joins. Every lookup is relative to a directory fd we hold,
//! through `openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`, so a symlink planted in an
//! untrusted tree (`/proc -> /host/proc`, `x -> ../../etc`) resolves inside that tree or fails.
//! Where `openat2` is missing, a per-component `O_NOFOLLOW` walk refuses every symlink instead.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use crate::sys;

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
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
    let cwd = unsafe_cwd();
    let opened = match sys::openat2(cwd, &c, libc::O_PATH | extra_flags, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    {
        // No openat2: walk from the real root, one O_NOFOLLOW component at a time.
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => sys::openat(cwd, c"/", libc::O_PATH | libc::O_DIRECTORY, 0)
            .and_then(|root| walk_nofollow(root.as_fd(), path, libc::O_PATH | extra_flags)),
        r => r,
    };
    opened.map_err(|e| match e.raw_os_error() {
        // The fallback walk meets a symlinked directory as ENOTDIR.
        Some(libc::ELOOP | libc::ENOTDIR) if has_symlink(path) => symlink_refused(path),
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

fn has_symlink(path: &Path) -> bool {
    first_symlink(path).is_some()
}

/// The error for an operator path that passes through a symlink, naming the first one.
fn symlink_refused(path: &Path) -> io::Error {
    let link = first_symlink(path).map_or_else(|| path.display().to_string(), |l| l.display().to_string());
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{link} is a symbolic link; chio never follows symlinks in host paths (give the real path)"),
    )
}

fn unsafe_cwd() -> BorrowedFd<'static> {
    nix::fcntl::AT_FDCWD
}

/// Resolve `path` inside the tree rooted at `root`: absolute symlinks and `..` cannot leave it.
/// `flags` are the open flags (`O_PATH`, `O_RDONLY`, ...).
pub fn resolve_in(root: BorrowedFd<'_>, path: &Path, flags: i32) -> io::Result<OwnedFd> {
    let rel = relative(path)?;
    let c = cstring(&rel)?;
    match sys::openat2(root, &c, flags, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => walk_nofollow(root, path, flags),
        r => r,
    }
}

/// The fallback walk: one `O_PATH | O_NOFOLLOW` open per component; any symlink or `..` fails.
pub fn walk_nofollow(root: BorrowedFd<'_>, path: &Path, flags: i32) -> io::Result<OwnedFd> {
    let names = components(path)?;
    let Some((last, dirs)) = names.split_last() else {
        return sys::openat(root, c".", flags, 0);
    };
    let mut cur: Option<OwnedFd> = None;
    for name in dirs {
        let dir = cur.as_ref().map(|f| f.as_fd()).unwrap_or(root);
        let next = sys::openat(dir, &cstring(name)?, libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY, 0)?;
        cur = Some(next);
    }
    let dir = cur.as_ref().map(|f| f.as_fd()).unwrap_or(root);
    let fd = sys::openat(dir, &cstring(last)?, flags | libc::O_NOFOLLOW, 0)?;
    if sys::fstat(fd.as_fd())?.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    Ok(fd)
}

/// Names in the directory `dir` (without `.` and `..`), unsorted.
pub fn read_dir_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    let fd = sys::openat(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let mut d = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for ent in d.iter() {
        let name = ent?.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            out.push(name);
        }
    }
    Ok(out)
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
    use std::os::unix::fs::symlink;

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
    fn fallback_walk_refuses_any_symlink() {
        let d = tempdir("walk");
        std::fs::write(d.join("inner/f"), "x").unwrap();
        symlink("inner", d.join("alias")).unwrap();
        let root = open_host(&d, libc::O_DIRECTORY).unwrap();
        assert!(walk_nofollow(root.as_fd(), Path::new("inner/f"), libc::O_RDONLY).is_ok());
        let err = walk_nofollow(root.as_fd(), Path::new("alias/f"), libc::O_RDONLY).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
        let err = walk_nofollow(root.as_fd(), Path::new("alias"), libc::O_PATH).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
