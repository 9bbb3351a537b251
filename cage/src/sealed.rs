//! A script is handed to its interpreter as a private copy the kernel keeps from changing.
//!
//! An interpreter reads its script lazily, long after the exec stop (bash reads again from its
//! offset after every external command), and nothing like ETXTBSY protects a script: a writer of
//! the script's file could rewrite its tail while the first lines run, and the record would vouch
//! for bytes that never ran. So the cage copies the script into a memfd and seals it against
//! every write, growth and shrink (and against unsealing); the interpreter reads `/dev/fd/<n>` of
//! that copy, and the supervisor hashes the same copy. The digest is then of the bytes the
//! interpreter reads, whatever happens to the file afterwards.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};

/// The seals a script's copy must carry: no write (and no writable mapping), no growth, no
/// shrink, and no seal removed or added.
pub fn seals() -> SealFlag {
    SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL
}

/// Copy the whole of `src` (from offset 0; its own offset is untouched) into a new sealed memfd
/// named `name`. A file longer than `limit` bytes is refused (EFBIG) rather than cut.
pub fn copy(src: BorrowedFd<'_>, name: &CStr, limit: u64) -> io::Result<OwnedFd> {
    // Not executable either (where the kernel knows MFD_NOEXEC_SEAL, 6.3+): the copy is only read.
    let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    let memfd = match memfd_create(name, flags | MFdFlags::from_bits_retain(libc::MFD_NOEXEC_SEAL)) {
        Err(nix::errno::Errno::EINVAL) => memfd_create(name, flags)?,
        r => r?,
    };
    let mut offset: libc::off_t = 0;
    loop {
        // One byte past the limit tells a file over it from one exactly at it.
        let left = (limit + 1).saturating_sub(offset as u64);
        if left == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        }
        let chunk = left.min(1 << 20) as usize;
        match nix::sys::sendfile::sendfile(memfd.as_fd(), src, Some(&mut offset), chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    fcntl(&memfd, FcntlArg::F_ADD_SEALS(seals()))?;
    // Read from the start by an interpreter that uses the descriptor itself rather than
    // reopening `/dev/fd/<n>`.
    nix::unistd::lseek(&memfd, 0, nix::unistd::Whence::SeekSet)?;
    Ok(memfd)
}

/// True when `fd` is a file sealed against every change of its contents (see [`seals`]).
pub fn is_sealed(fd: BorrowedFd<'_>) -> bool {
    fcntl(fd, FcntlArg::F_GET_SEALS).is_ok_and(|s| SealFlag::from_bits_truncate(s).contains(seals()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    fn temp_file(tag: &str, bytes: &[u8]) -> (std::path::PathBuf, std::fs::File) {
        let p = std::env::temp_dir().join(format!("chio-sealed-{tag}-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&p).unwrap();
        f.write_all(bytes).unwrap();
        (p, f)
    }

    /// The copy holds the file's bytes, and no write, growth or shrink reaches it — even through
    /// a descriptor reopened for writing — while the file itself stays writable.
    #[test]
    fn the_copy_is_the_file_and_cannot_change() {
        let (p, mut f) = temp_file("copy", b"#!/bin/sh\necho original\n");
        let copy = copy(f.as_fd(), c"script", 1 << 20).unwrap();
        assert!(is_sealed(copy.as_fd()));
        let mut read = String::new();
        std::fs::File::from(copy.try_clone().unwrap()).read_to_string(&mut read).unwrap();
        assert_eq!(read, "#!/bin/sh\necho original\n");
        let mut w = std::fs::File::from(copy);
        assert_eq!(w.write(b"x").unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(w.set_len(1).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(w.set_len(1000).unwrap_err().raw_os_error(), Some(libc::EPERM));
        // Control: the file the copy was made of is writable, and its copy is unmoved.
        f.seek(std::io::SeekFrom::Start(10)).unwrap();
        f.write_all(b"echo swapped!\n").unwrap();
        let mut again = String::new();
        w.seek(std::io::SeekFrom::Start(0)).unwrap();
        w.read_to_string(&mut again).unwrap();
        assert_eq!(again, "#!/bin/sh\necho original\n");
        std::fs::remove_file(p).unwrap();
    }

    /// A file over the limit is refused, one at the limit is copied whole.
    #[test]
    fn a_script_over_the_limit_is_refused_not_cut() {
        let (p, f) = temp_file("limit", &[b'#'; 100]);
        assert_eq!(copy(f.as_fd(), c"script", 99).unwrap_err().raw_os_error(), Some(libc::EFBIG));
        let whole = copy(f.as_fd(), c"script", 100).unwrap();
        assert_eq!(crate::sys::fstat(whole.as_fd()).unwrap().st_size, 100);
        std::fs::remove_file(p).unwrap();
    }

    /// A memfd without every seal is not taken as sealed.
    #[test]
    fn an_unsealed_memfd_is_not_sealed() {
        let m = memfd_create(c"open", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap();
        assert!(!is_sealed(m.as_fd()));
        fcntl(&m, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SEAL)).unwrap();
        assert!(!is_sealed(m.as_fd()), "write and seal alone leave growth and shrink");
    }
}
