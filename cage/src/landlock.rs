//! Landlock through the `landlock` crate (maintained with the LSM itself), at
//! `CompatLevel::HardRequirement`: every right of the ABI chio chose is handled, or the ruleset is
//! not built — the crate's best-effort downgrade never applies, so the status of each class
//! (filesystem, TCP, scoping) is exactly what was asked for. Rights accumulate down a hierarchy,
//! so execute is granted per top-level directory and never at `/`: that keeps `/tmp`, `/dev/shm`
//! and `/proc` non-executable.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;

use landlock::{
    make_bitflags, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::sys;

/// Filesystem rights, as the crate's flags.
pub mod fs {
    use super::{make_bitflags, AccessFs, BitFlags};

    /// Execute a file.
    pub const EXECUTE: BitFlags<AccessFs> = make_bitflags!(AccessFs::{Execute});
    /// Open a file for writing.
    pub const WRITE_FILE: BitFlags<AccessFs> = make_bitflags!(AccessFs::{WriteFile});
    /// Open a file for reading.
    pub const READ_FILE: BitFlags<AccessFs> = make_bitflags!(AccessFs::{ReadFile});
    /// ioctl on device files (ABI 5).
    pub const IOCTL_DEV: BitFlags<AccessFs> = make_bitflags!(AccessFs::{IoctlDev});
    /// Reading files and listing directories.
    pub const READ: BitFlags<AccessFs> = make_bitflags!(AccessFs::{ReadFile | ReadDir});
    /// Everything that writes inside a directory, except device creation.
    pub const WRITE: BitFlags<AccessFs> = make_bitflags!(AccessFs::{
        WriteFile | RemoveDir | RemoveFile | MakeDir | MakeReg | MakeSock | MakeFifo | MakeSym | Refer | Truncate
    });
    /// Rights that apply to a file itself (the rest only mean something on a directory).
    pub const ON_FILE: BitFlags<AccessFs> =
        make_bitflags!(AccessFs::{Execute | WriteFile | ReadFile | Truncate | IoctlDev});
}

/// TCP rights (ABI 4).
pub mod net {
    use super::{make_bitflags, AccessNet, BitFlags};

    /// Bind a TCP port.
    pub const BIND_TCP: BitFlags<AccessNet> = make_bitflags!(AccessNet::{BindTcp});
    /// Connect to a TCP port.
    pub const CONNECT_TCP: BitFlags<AccessNet> = make_bitflags!(AccessNet::{ConnectTcp});
}

/// The host's landlock ABI (0 when landlock is unavailable). Raw: the crate keeps the running
/// ABI to itself (it picks one for a caller), while chio chooses the ABI, caps it in tests and
/// reports it; this version query is the only landlock call made outside the crate.
pub fn abi() -> u32 {
    // SAFETY: the VERSION query takes a NULL attr and size 0.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    u32::try_from(v).unwrap_or(0)
}

/// The crate's name for ABI `n` (the newest it knows for anything newer).
fn abi_of(n: u32) -> io::Result<ABI> {
    Ok(match n {
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        7 => ABI::V7,
        8 => ABI::V8,
        9.. => ABI::V9,
        0 => return Err(io::Error::other("landlock is not available")),
    })
}

fn ll(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A ruleset under construction, handling every right of the chosen ABI.
pub struct Ruleset {
    created: RulesetCreated,
    abi: ABI,
    handled_fs: BitFlags<AccessFs>,
    /// Whether TCP rights are handled.
    pub net: bool,
    /// Whether scoping is enforced.
    pub scoped: bool,
}

impl Ruleset {
    /// Create a ruleset for `abi`: all filesystem rights, TCP from ABI 4, scoping from ABI 6 —
    /// each a hard requirement.
    pub fn new(abi: u32) -> io::Result<Ruleset> {
        let v = abi_of(abi)?;
        let handled_fs = AccessFs::from_all(v);
        let (net, scoped) = (abi >= 4, abi >= 6);
        let mut r = landlock::Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
        r = r.handle_access(handled_fs).map_err(ll)?;
        if net {
            r = r.handle_access(AccessNet::from_all(v)).map_err(ll)?;
        }
        if scoped {
            r = r.scope(Scope::from_all(v)).map_err(ll)?;
        }
        // no_new_privs is the identity step's to set (and the exec stop's to check), not a side
        // effect of landlock's: the crate would set it again here, hiding a missed step.
        let created = r.create().map_err(ll)?.no_new_privs(false);
        Ok(Ruleset { created, abi: v, handled_fs, net, scoped })
    }

    /// Allow `access` (masked to the handled rights) beneath the path `path`, opened O_PATH.
    /// Directory-only rights are dropped for non-directories.
    pub fn allow_path(&mut self, path: &CStr, access: BitFlags<AccessFs>) -> io::Result<()> {
        let fd = sys::openat(nix::fcntl::AT_FDCWD, path, libc::O_PATH | libc::O_CLOEXEC, 0)?;
        let is_dir = sys::fstat(fd.as_fd())?.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let mut allowed = access & self.handled_fs;
        if !is_dir {
            allowed &= fs::ON_FILE & AccessFs::from_file(self.abi);
        }
        (&mut self.created).add_rule(PathBeneath::new(fd, allowed)).map_err(ll)?;
        Ok(())
    }

    /// Allow `access` (bind / connect) on a TCP port.
    pub fn allow_port(&mut self, port: u16, access: BitFlags<AccessNet>) -> io::Result<()> {
        (&mut self.created).add_rule(NetPort::new(port, access)).map_err(ll)?;
        Ok(())
    }

    /// Enforce the ruleset on the calling thread (no_new_privs must be set). Anything short of
    /// the whole ruleset enforced is an error; otherwise the crate's status, as the record names
    /// it (`FullyEnforced`).
    pub fn restrict_self(self) -> io::Result<String> {
        let status = self.created.restrict_self().map_err(ll)?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(io::Error::other(format!("the kernel enforced the ruleset only as {:?}", status.ruleset)));
        }
        Ok(format!("{:?}", status.ruleset))
    }
}
