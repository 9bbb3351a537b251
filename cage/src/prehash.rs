//! The supervisor is idle while the cage sets itself up (~1.5 ms). It spends that time hashing
//! the file the target will most likely execute, found from the host side. When the fd the cage
//! later sends is that same inode, unchanged (size, mtime and ctime), and no one but root can
//! change it (see [`settled`]), the early digest stands; otherwise the cage's fd is hashed.
//!
//! Timestamps alone never vouch for bytes another uid can write: a write through a shared
//! mapping whose pages are already dirty takes no fault, so neither mtime nor ctime moves. A file
//! a non-root uid could write is therefore hashed at the exec stop, from the executing inode,
//! when the kernel denies every write to it (see `launch`); only root-only files are hashed early
//! and shared between launches.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::digests::{Digests, Identity};
use crate::path;
use crate::plan::{CagePlan, RootSpec};
use crate::sys;

/// A digest computed early, and the identity of the file it is valid for.
#[derive(Debug, Clone)]
pub struct Early {
    id: Identity,
    /// Lowercase hex SHA-256.
    pub sha256: String,
}

/// The identity of the file `st` describes.
pub fn identity(st: &libc::stat) -> Identity {
    [st.st_dev as i64, st.st_ino as i64, st.st_size, st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec]
}

/// The identity (device, inode, size, mtime, ctime) of the file behind `fd`, if it can be read.
pub fn identity_of(fd: BorrowedFd<'_>) -> Option<Identity> {
    sys::fstat(fd).ok().map(|st| identity(&st))
}

impl Early {
    /// True when `st` describes the very file, unchanged since it was hashed.
    pub fn matches(&self, st: &libc::stat) -> bool {
        self.id == identity(st)
    }
}

/// True when only root may open the file `st` describes for writing: owned by uid 0, without a
/// write bit for group or others, and without a POSIX ACL (which could grant one; an ACL that
/// cannot be read counts as present). Only root can change any of these, and each change moves
/// ctime, so this holds for as long as the file's identity does.
pub fn only_root_writes(fd: BorrowedFd<'_>, st: &libc::stat) -> bool {
    st.st_uid == 0 && st.st_mode & 0o022 == 0 && !has_acl(fd)
}

fn has_acl(fd: BorrowedFd<'_>) -> bool {
    use xattr::FileExt;
    let Ok(f) = fd.try_clone_to_owned().map(std::fs::File::from) else { return true };
    match f.get_xattr("system.posix_acl_access") {
        Ok(v) => v.is_some(),
        // A file system without extended attributes has no ACLs.
        Err(e) => e.raw_os_error() != Some(libc::EOPNOTSUPP),
    }
}

/// True when the digest of the file behind `fd` (an fd the cage opened, on the cage's own
/// mount) may be taken before the exec and trusted while its identity holds: only root can
/// write it, and the cage sees it on a read-only mount, so a cage running as uid 0 cannot either.
/// Anything else is hashed at the exec stop.
pub fn settled(fd: BorrowedFd<'_>, st: &libc::stat) -> bool {
    only_root_writes(fd, st) && on_read_only_mount(fd)
}

fn on_read_only_mount(fd: BorrowedFd<'_>) -> bool {
    nix::sys::statvfs::fstatvfs(fd).is_ok_and(|v| v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

/// The digest `known` holds for a file of identity `id`.
pub fn lookup(known: Option<Digests>, id: &Identity) -> Option<String> {
    known.and_then(|k| k.get(id)).map(|d| crate::seccomp::hex(&d))
}

/// Put `sha256` (lowercase hex) into `known` for the file behind `fd`, if it still has the
/// identity `id` it had before it was read. Only for [`settled`] files: the table is trusted by
/// identity alone.
pub fn share(known: Option<Digests>, fd: BorrowedFd<'_>, id: &Identity, sha256: &str) {
    let mut d = [0u8; 32];
    let parsed = sha256.len() == 64
        && (0..32).all(|i| u8::from_str_radix(&sha256[2 * i..2 * i + 2], 16).map(|b| d[i] = b).is_ok());
    if let (Some(k), true, Some(after)) = (known, parsed, identity_of(fd)) {
        if after == *id {
            k.put(id, &d);
        }
    }
}

/// SHA-256 of the whole file behind `fd`, lowercase hex (pread from offset 0; the fd's offset is
/// untouched).
pub fn hash(fd: BorrowedFd<'_>) -> std::io::Result<String> {
    sha256_fd(fd).map(|d| crate::seccomp::hex(&d))
}

/// SHA-256 of the whole file behind `fd` (pread from offset 0; the fd's offset is untouched).
fn sha256_fd(fd: BorrowedFd<'_>) -> std::io::Result<[u8; 32]> {
    let mut h = Sha256::new();
    // A small buffer stays in cache; a large one costs page faults in every fresh supervisor.
    let mut buf = vec![0u8; 32 << 10];
    let mut off: i64 = 0;
    loop {
        let n = match nix::sys::uio::pread(fd, &mut buf, off) {
            Ok(0) => break,
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        h.update(&buf[..n]);
        off += n as i64;
    }
    Ok(h.finalize().into())
}

/// Where the cage will look for `argv[0]`, as absolute in-cage paths.
fn candidates(plan: &CagePlan) -> Vec<PathBuf> {
    let Some(argv0) = plan.argv.first() else { return Vec::new() };
    let name = Path::new(argv0);
    if argv0.as_encoded_bytes().contains(&b'/') {
        return vec![plan.cwd.join(name)];
    }
    let path = plan.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()).unwrap_or_default();
    std::env::split_paths(&path).filter(|d| d.is_absolute()).map(|d| d.join(name)).collect()
}

/// Open `p` (an in-cage path) from the host side, or None when the cage's view could differ.
fn open_from_host(plan: &CagePlan, p: &Path) -> Option<OwnedFd> {
    let names = path::components(p).ok()?;
    let first = names.first()?.to_str()?;
    // A bind can shadow any path beneath its destination: do not guess there.
    if plan.binds.iter().any(|b| p.starts_with(&b.dest)) {
        return None;
    }
    let (root, rest): (PathBuf, PathBuf) = match (&plan.root, &plan.workspace) {
        (_, Some(ws)) if first == "workspace" => (ws.clone(), names[1..].iter().collect()),
        (RootSpec::Directory(dir), _) => (dir.clone(), names.iter().collect()),
        (RootSpec::HostSystem, _) if crate::mounts::HOST_DIRS.contains(&first) => ("/".into(), names.iter().collect()),
        _ => return None,
    };
    let root = path::open_host(&root, libc::O_DIRECTORY).ok()?;
    open_regular(root.as_fd(), &rest)
}

/// Open `rest` below `root` for reading only if it is a regular file, never blocking: a FIFO
/// (or a device) named as the target must not stall the supervisor in `open`. The path is
/// resolved `O_PATH` first and checked; the read open is non-blocking and must find the same
/// inode.
fn open_regular(root: BorrowedFd<'_>, rest: &Path) -> Option<OwnedFd> {
    let probe = path::resolve_in(root, rest, libc::O_PATH).ok()?;
    let st = sys::fstat(probe.as_fd()).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let fd = path::resolve_in(root, rest, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY).ok()?;
    let again = sys::fstat(fd.as_fd()).ok()?;
    ((again.st_dev, again.st_ino) == (st.st_dev, st.st_ino)).then_some(fd)
}

/// Hash the likeliest target now (or find it among the `known` digests). None when there is
/// no confident guess.
pub fn guess(plan: &CagePlan, known: Option<Digests>) -> Option<Early> {
    for p in candidates(plan) {
        let Some(fd) = open_from_host(plan, &p) else { continue };
        let before = sys::fstat(fd.as_fd()).ok()?;
        if before.st_mode & libc::S_IFMT != libc::S_IFREG {
            continue;
        }
        // A file another uid could write is hashed at the exec stop whatever happens here.
        if !only_root_writes(fd.as_fd(), &before) {
            return None;
        }
        let sha256 = match lookup(known, &identity(&before)) {
            Some(d) => d,
            None => hash(fd.as_fd()).ok()?,
        };
        let after = sys::fstat(fd.as_fd()).ok()?;
        // Changed while we read it: no early digest.
        return (identity(&before) == identity(&after)).then(|| Early { id: identity(&after), sha256 });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    /// A digest goes into the shared table only under the identity of the file as it was read:
    /// one read under an identity it no longer has (it changed since) leaves the table alone.
    #[test]
    fn a_digest_is_shared_only_for_the_file_as_read() {
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let id = identity_of(f.as_fd()).unwrap();
        let sha = hash(f.as_fd()).unwrap();
        let known = Digests::new().unwrap();
        share(Some(known), f.as_fd(), &id, &sha);
        assert_eq!(lookup(Some(known), &id), Some(sha.clone()));
        let mut stale = id;
        stale[2] += 1;
        let other = Digests::new().unwrap();
        share(Some(other), f.as_fd(), &stale, &sha);
        assert_eq!(other.get(&stale), None);
    }

    /// Only a file no one but root can open for writing is settled by its identity: a write bit
    /// for group or others, another owner, or an ACL each make it a file to hash at the exec
    /// stop. The mount part: a writable mount is never settled, a read-only one is.
    #[test]
    fn only_root_only_files_are_settled_by_identity() {
        use std::os::unix::fs::PermissionsExt;
        let p = std::env::temp_dir().join(format!("chio-prehash-owner-{}", std::process::id()));
        std::fs::write(&p, b"bytes").unwrap();
        let check = |mode: u32, uid: u32| {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            std::os::unix::fs::chown(&p, Some(uid), None).unwrap();
            let f = std::fs::File::open(&p).unwrap();
            only_root_writes(f.as_fd(), &sys::fstat(f.as_fd()).unwrap())
        };
        if nix::unistd::geteuid().is_root() {
            assert!(check(0o755, 0));
            assert!(!check(0o775, 0), "group-writable");
            assert!(!check(0o757, 0), "world-writable");
            assert!(!check(0o755, 65534), "owned by another uid");
            check(0o755, 0);
            let acl = std::process::Command::new("setfacl").args(["-m", "u:65534:rw"]).arg(&p).status();
            if acl.is_ok_and(|s| s.success()) {
                let f = std::fs::File::open(&p).unwrap();
                assert!(!only_root_writes(f.as_fd(), &sys::fstat(f.as_fd()).unwrap()), "an ACL grants a write");
            }
        }
        // The file is on a writable mount here: never settled, whatever its owner.
        let f = std::fs::File::open(&p).unwrap();
        assert!(!settled(f.as_fd(), &sys::fstat(f.as_fd()).unwrap()));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn early_digest_is_only_used_for_the_unchanged_file() {
        // Only a root-owned file is hashed early.
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("chio-prehash-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join("bin/tool"), b"version one").unwrap();
        let mut plan = CagePlan::new(vec![OsString::from("tool")]);
        plan.root = RootSpec::Directory(dir.clone());
        plan.env = vec![("PATH".into(), "/nope:/bin".into())];
        let early = guess(&plan, None).unwrap();
        let st = |p: &Path| {
            let f = std::fs::File::open(p).unwrap();
            sys::fstat(f.as_fd()).unwrap()
        };
        assert!(early.matches(&st(&dir.join("bin/tool"))));
        let f = std::fs::File::open(dir.join("bin/tool")).unwrap();
        assert_eq!(early.sha256, hash(f.as_fd()).unwrap());
        // Any write moves ctime (and here size): the early digest no longer applies.
        std::thread::sleep(std::time::Duration::from_millis(5));
        std::fs::write(dir.join("bin/tool"), b"version two!").unwrap();
        assert!(!early.matches(&st(&dir.join("bin/tool"))));
        // A bind over the path makes the host-side view unreliable: no guess.
        plan.binds.push(crate::plan::Bind { source: dir.clone(), dest: "/bin".into(), writable: false });
        assert!(guess(&plan, None).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
