//! Landlock through the raw system calls, so the status of each class (filesystem, TCP, scoping)
//! is exactly what we asked the kernel for at the host's ABI — no best-effort downgrade hidden in
//! a library. Rights accumulate down a hierarchy, so execute is granted per top-level directory
//! and never at `/`: that keeps `/tmp`, `/dev/shm` and `/proc` non-executable.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::sys;

/// LANDLOCK_ACCESS_FS_* bits.
pub mod fs {
    /// Execute a file.
    pub const EXECUTE: u64 = 1 << 0;
    /// Open a file for writing.
    pub const WRITE_FILE: u64 = 1 << 1;
    /// Open a file for reading.
    pub const READ_FILE: u64 = 1 << 2;
    /// List a directory.
    pub const READ_DIR: u64 = 1 << 3;
    /// Remove a directory.
    pub const REMOVE_DIR: u64 = 1 << 4;
    /// Remove a file.
    pub const REMOVE_FILE: u64 = 1 << 5;
    /// Create a character device.
    pub const MAKE_CHAR: u64 = 1 << 6;
    /// Create a directory.
    pub const MAKE_DIR: u64 = 1 << 7;
    /// Create a regular file.
    pub const MAKE_REG: u64 = 1 << 8;
    /// Create a unix socket.
    pub const MAKE_SOCK: u64 = 1 << 9;
    /// Create a FIFO.
    pub const MAKE_FIFO: u64 = 1 << 10;
    /// Create a block device.
    pub const MAKE_BLOCK: u64 = 1 << 11;
    /// Create a symlink.
    pub const MAKE_SYM: u64 = 1 << 12;
    /// Link or rename across directories (ABI 2).
    pub const REFER: u64 = 1 << 13;
    /// Truncate (ABI 3).
    pub const TRUNCATE: u64 = 1 << 14;
    /// ioctl on device files (ABI 5).
    pub const IOCTL_DEV: u64 = 1 << 15;

    /// Reading files and listing directories.
    pub const READ: u64 = READ_FILE | READ_DIR;
    /// Everything that writes inside a directory, except device creation.
    pub const WRITE: u64 = WRITE_FILE
        | REMOVE_DIR
        | REMOVE_FILE
        | MAKE_DIR
        | MAKE_REG
        | MAKE_SOCK
        | MAKE_FIFO
        | MAKE_SYM
        | REFER
        | TRUNCATE;
}

/// LANDLOCK_ACCESS_NET_* bits (ABI 4).
pub mod net {
    /// Bind a TCP port.
    pub const BIND_TCP: u64 = 1 << 0;
    /// Connect to a TCP port.
    pub const CONNECT_TCP: u64 = 1 << 1;
}

/// LANDLOCK_SCOPE_* bits (ABI 6).
pub mod scope {
    /// Connect to abstract unix sockets outside the domain.
    pub const ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
    /// Signal processes outside the domain.
    pub const SIGNAL: u64 = 1 << 1;
}

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

/// The host's landlock ABI (0 when landlock is unavailable).
pub fn abi() -> u32 {
    // SAFETY: the VERSION query takes a NULL attr and size 0.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    if v < 0 {
        0
    } else {
        v as u32
    }
}

/// Every filesystem right the given ABI knows.
pub fn fs_rights(abi: u32) -> u64 {
    let mut r = (1 << 13) - 1;
    if abi >= 2 {
        r |= fs::REFER;
    }
    if abi >= 3 {
        r |= fs::TRUNCATE;
    }
    if abi >= 5 {
        r |= fs::IOCTL_DEV;
    }
    r
}

/// A ruleset under construction, handling every right of the chosen ABI.
pub struct Ruleset {
    fd: OwnedFd,
    handled_fs: u64,
    /// The ABI the ruleset was built for.
    pub abi: u32,
    /// Whether TCP rights are handled.
    pub net: bool,
    /// Whether scoping is enforced.
    pub scoped: bool,
}

impl Ruleset {
    /// Create a ruleset for `abi`: all filesystem rights, TCP from ABI 4, scoping from ABI 6.
    pub fn new(abi: u32) -> io::Result<Ruleset> {
        let handled_fs = fs_rights(abi);
        let net = abi >= 4;
        let scoped = abi >= 6;
        let attr = RulesetAttr {
            handled_access_fs: handled_fs,
            handled_access_net: if net { net::BIND_TCP | net::CONNECT_TCP } else { 0 },
            scoped: if scoped { scope::ABSTRACT_UNIX_SOCKET | scope::SIGNAL } else { 0 },
        };
        // Older ABIs reject the larger struct; pass only the fields they know.
        let size = match abi {
            0..=3 => 8,
            4 | 5 => 16,
            _ => std::mem::size_of::<RulesetAttr>(),
        };
        // SAFETY: attr is valid for `size` bytes.
        let fd = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, &attr as *const RulesetAttr, size, 0u32) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Ruleset {
            // SAFETY: fresh fd from the kernel.
            fd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
            handled_fs,
            abi,
            net,
            scoped,
        })
    }

    /// Allow `access` (masked to the handled rights) beneath the path `path`, opened O_PATH.
    /// Directory-only rights are dropped for non-directories.
    pub fn allow_path(&self, path: &CStr, access: u64) -> io::Result<()> {
        let cwd = {
            // SAFETY: AT_FDCWD is valid for the process lifetime.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(libc::AT_FDCWD) }
        };
        let fd = sys::openat(cwd, path, libc::O_PATH, 0)?;
        let is_dir = sys::fstat(std::os::fd::AsFd::as_fd(&fd))?.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let file_rights = fs::EXECUTE | fs::WRITE_FILE | fs::READ_FILE | fs::TRUNCATE | fs::IOCTL_DEV;
        let mut allowed = access & self.handled_fs;
        if !is_dir {
            allowed &= file_rights;
        }
        let attr = PathBeneathAttr { allowed_access: allowed, parent_fd: fd.as_raw_fd() };
        // SAFETY: attr is a valid path_beneath attribute.
        let r = unsafe {
            libc::syscall(libc::SYS_landlock_add_rule, self.fd.as_raw_fd(), 1u32, &attr as *const PathBeneathAttr, 0u32)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Allow `access` (BIND_TCP / CONNECT_TCP) on a TCP port.
    pub fn allow_port(&self, port: u16, access: u64) -> io::Result<()> {
        let attr = NetPortAttr { allowed_access: access, port: u64::from(port) };
        // SAFETY: attr is a valid net_port attribute.
        let r = unsafe {
            libc::syscall(libc::SYS_landlock_add_rule, self.fd.as_raw_fd(), 2u32, &attr as *const NetPortAttr, 0u32)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Enforce the ruleset on the calling thread (no_new_privs must be set).
    pub fn restrict_self(self) -> io::Result<()> {
        // SAFETY: valid ruleset fd.
        let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, self.fd.as_raw_fd(), 0u32) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
