//! The supervisor is idle while the cage sets itself up (~1.5 ms). It spends that time hashing
//! the file the target will most likely execute, found from the host side. When the fd the cage
//! later sends is that same inode, unchanged (size, mtime and ctime — any write moves ctime), the
//! early digest stands; otherwise the cage's fd is hashed as before. Either way the digest is of
//! the file the cage opened: this only moves work off the critical path.

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

/// The digest of the file behind `fd` with the identity `id`: from `known` when a launch of
/// this supervisor already hashed that very file unchanged, otherwise hashed now (and shared).
pub fn hash_known(fd: BorrowedFd<'_>, id: &Identity, known: Option<Digests>) -> std::io::Result<String> {
    if let Some(d) = known.and_then(|k| k.get(id)) {
        return Ok(crate::seccomp::hex(&d));
    }
    let d = sha256_fd(fd)?;
    // Kept only if the file did not change while it was read.
    if let (Some(k), Some(after)) = (known, identity_of(fd)) {
        if after == *id {
            k.put(id, &d);
        }
    }
    Ok(crate::seccomp::hex(&d))
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
        let sha256 = hash_known(fd.as_fd(), &identity(&before), known).ok()?;
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
        let sha = crate::seccomp::hex(&sha256_fd(f.as_fd()).unwrap());
        let known = Digests::new().unwrap();
        assert_eq!(hash_known(f.as_fd(), &id, Some(known)).unwrap(), sha);
        assert_eq!(known.get(&id).map(|d| crate::seccomp::hex(&d)), Some(sha.clone()));
        let mut stale = id;
        stale[2] += 1;
        let other = Digests::new().unwrap();
        assert_eq!(hash_known(f.as_fd(), &stale, Some(other)).unwrap(), sha);
        assert_eq!(other.get(&stale), None);
    }

    #[test]
    fn early_digest_is_only_used_for_the_unchanged_file() {
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
        assert_eq!(early.sha256, crate::seccomp::hex(&sha256_fd(f.as_fd()).unwrap()));
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
