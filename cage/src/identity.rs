//! Identity and privilege of the target: rlimits, groups, uid/gid, all five capability sets
//! emptied and read back, securebits locked, no_new_privs. The order matters: the bounding set
//! and securebits need CAP_SETPCAP, so they go before the uid change; capset to zero and the
//! read-back go after it.

use std::io;

use crate::plan::Limits;

/// Securebits we set and lock: NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE (+ their locks),
/// and KEEP_CAPS locked off.
pub const SECUREBITS: u32 = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Apply the plan's rlimits (soft = hard).
pub fn set_rlimits(l: &Limits) -> io::Result<()> {
    let mut set = vec![
        (libc::RLIMIT_NOFILE, l.nofile, "nofile"),
        (libc::RLIMIT_FSIZE, l.fsize_bytes, "fsize"),
        (libc::RLIMIT_CORE, l.core_bytes, "core"),
        (libc::RLIMIT_SIGPENDING, l.sigpending, "sigpending"),
        (libc::RLIMIT_MEMLOCK, l.memlock_bytes, "memlock"),
    ];
    if let Some(c) = l.cpu_seconds {
        set.push((libc::RLIMIT_CPU, c, "cpu"));
    }
    if let Some(a) = l.address_space_bytes {
        set.push((libc::RLIMIT_AS, a, "as"));
    }
    for (res, value, name) in set {
        let lim = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: valid rlimit struct.
        if unsafe { libc::setrlimit(res, &lim) } != 0 {
            return Err(os_err(&format!("setting RLIMIT_{} to {value}", name.to_uppercase())));
        }
    }
    Ok(())
}

/// Highest capability number the kernel knows.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(40)
}

/// Drop every capability from the bounding set, clear ambient, set and lock securebits.
pub fn drop_bounding_and_lock(last: u32) -> io::Result<()> {
    for cap in 0..=last {
        // SAFETY: plain prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(os_err(&format!("dropping capability {cap} from the bounding set")));
        }
    }
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(os_err("clearing ambient capabilities"));
    }
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(os_err("locking securebits"));
    }
    Ok(())
}

/// Set no supplementary groups, then gid and uid (real, effective, saved).
pub fn set_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain syscalls with integer arguments.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(os_err("clearing supplementary groups"));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(os_err(&format!("setting gid {gid}")));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(os_err(&format!("setting uid {uid}")));
        }
    }
    Ok(())
}

/// Empty effective, permitted and inheritable sets.
pub fn clear_caps() -> io::Result<()> {
    let hdr = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [CapData::default(); 2];
    // SAFETY: header and two data structs as capset v3 requires.
    if unsafe { libc::syscall(libc::SYS_capset, &hdr as *const CapHeader, data.as_ptr()) } != 0 {
        return Err(os_err("emptying capability sets"));
    }
    Ok(())
}

/// Add `cap` to the inheritable set (a test hook: inheritable capabilities survive exec).
pub fn raise_inheritable(cap: u32) -> io::Result<()> {
    let mut hdr = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and two data structs as capget/capset v3 require.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) != 0 {
            return Err(os_err("reading capabilities"));
        }
        data[(cap / 32) as usize].inheritable |= 1 << (cap % 32);
        if libc::syscall(libc::SYS_capset, &hdr as *const CapHeader, data.as_ptr()) != 0 {
            return Err(os_err("raising an inheritable capability"));
        }
    }
    Ok(())
}

/// Read every capability set back; true only when all five are empty.
pub fn caps_all_clear(last: u32) -> bool {
    let mut hdr = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and two data structs as capget v3 requires.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) } != 0 {
        return false;
    }
    if data.iter().any(|d| d.effective | d.permitted | d.inheritable != 0) {
        return false;
    }
    (0..=last).all(|cap| {
        // SAFETY: plain prctl queries.
        unsafe {
            libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) == 0
                && libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong,
                    cap as libc::c_ulong,
                    0,
                    0,
                ) == 0
        }
    })
}

/// Set no_new_privs.
pub fn no_new_privs() -> io::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os_err("setting no_new_privs"));
    }
    Ok(())
}

/// Current securebits.
pub fn securebits() -> u32 {
    // SAFETY: plain prctl query.
    let v = unsafe { libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0) };
    v.max(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `f` in a forked child (capability changes stay there); its verdict is the exit code.
    fn in_child(f: impl FnOnce() -> bool) -> bool {
        // SAFETY: the child only makes capability syscalls and exits.
        match unsafe { libc::fork() } {
            0 => unsafe { libc::_exit(i32::from(!f())) },
            pid => {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
            }
        }
    }

    /// Set the effective, permitted and inheritable sets (low 32 capabilities) exactly.
    fn set_caps(effective: u32, permitted: u32, inheritable: u32) -> bool {
        let hdr = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
        let mut data = [CapData::default(); 2];
        data[0] = CapData { effective, permitted, inheritable };
        // SAFETY: header and two data structs as capset v3 requires.
        unsafe { libc::syscall(libc::SYS_capset, &hdr as *const CapHeader, data.as_ptr()) == 0 }
    }

    /// The init's own read-back refuses each set that is not empty, one at a time.
    #[test]
    fn caps_all_clear_sees_each_set() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let last = last_cap();
        // Only the permitted set holds capabilities.
        assert!(in_child(|| drop_bounding_and_lock(last).is_ok() && set_caps(0, 1 << 10, 0) && !caps_all_clear(last)));
        // Only the effective and permitted sets.
        assert!(in_child(|| drop_bounding_and_lock(last).is_ok() && !caps_all_clear(last)));
        // Only the inheritable set.
        assert!(in_child(|| {
            raise_inheritable(10).is_ok()
                && drop_bounding_and_lock(last).is_ok()
                && set_caps(0, 0, 1 << 10)
                && !caps_all_clear(last)
        }));
        // The permitted and inheritable sets holding the same capability (so no `^` of the
        // sets can stand in for their union).
        assert!(in_child(|| {
            raise_inheritable(10).is_ok()
                && drop_bounding_and_lock(last).is_ok()
                && set_caps(0, 1 << 10, 1 << 10)
                && !caps_all_clear(last)
        }));
        // Only the bounding set.
        assert!(in_child(|| clear_caps().is_ok() && !caps_all_clear(last)));
        // All of them empty.
        assert!(in_child(|| drop_bounding_and_lock(last).is_ok() && clear_caps().is_ok() && caps_all_clear(last)));
        assert_eq!(SECUREBITS, 0xef);
    }
}
