//! Identity and privilege of the target: rlimits, groups, uid/gid, all five capability sets
//! emptied and read back, securebits locked, no_new_privs. The order matters: the bounding set
//! and securebits need CAP_SETPCAP, so they go before the uid change; capset to zero and the
//! read-back go after it. Capability sets go through the `caps` crate, ids, rlimits and
//! no_new_privs through nix; raw calls remain only where neither has one, each marked.

use std::io;

use caps::CapSet;
use nix::sys::resource::{getrlimit, setrlimit, Resource};

use crate::plan::{Limits, RlimitResource};

/// Securebits we set and lock: NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE (+ their locks),
/// and KEEP_CAPS locked off.
pub const SECUREBITS: u32 = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn caps_err(what: &'static str) -> impl Fn(caps::errors::CapsError) -> io::Error {
    move |e| io::Error::other(format!("{what}: {e}"))
}

fn nix_err(what: String) -> impl FnOnce(nix::Error) -> io::Error {
    move |e| io::Error::new(io::Error::from(e).kind(), format!("{what}: {e}"))
}

/// Apply the plan's rlimits (soft = hard, then the asked ones, which only lower), and no real-time or raised priority whatever the
/// invoker's limits allow: `sched_setscheduler` and `setpriority` are the caller's own to call,
/// and with an inherited `RLIMIT_RTPRIO` a cage could make itself SCHED_FIFO, which the cgroup's
/// CPU ceiling does not hold.
pub fn set_rlimits(l: &Limits) -> io::Result<()> {
    let mut set = vec![
        (Resource::RLIMIT_NOFILE, l.nofile, "NOFILE"),
        (Resource::RLIMIT_FSIZE, l.fsize_bytes, "FSIZE"),
        (Resource::RLIMIT_CORE, l.core_bytes, "CORE"),
        (Resource::RLIMIT_SIGPENDING, l.sigpending, "SIGPENDING"),
        (Resource::RLIMIT_MEMLOCK, l.memlock_bytes, "MEMLOCK"),
        (Resource::RLIMIT_RTPRIO, 0, "RTPRIO"),
        (Resource::RLIMIT_NICE, 0, "NICE"),
    ];
    if let Some(c) = l.cpu_seconds {
        set.push((Resource::RLIMIT_CPU, c, "CPU"));
    }
    if let Some(a) = l.address_space_bytes {
        set.push((Resource::RLIMIT_AS, a, "AS"));
    }
    for (res, value, name) in set {
        setrlimit(res, value, value).map_err(nix_err(format!("setting RLIMIT_{name} to {value}")))?;
    }
    for a in &l.asked {
        let res = resource(a.resource);
        let (_, held) = getrlimit(res).map_err(nix_err(format!("reading {:?}", a.resource)))?;
        let hard = a.hard.min(held);
        let soft = a.soft.min(hard);
        setrlimit(res, soft, hard).map_err(nix_err(format!("setting {res:?} to {soft}:{hard}")))?;
    }
    Ok(())
}

fn resource(r: RlimitResource) -> Resource {
    use RlimitResource as R;
    match r {
        R::As => Resource::RLIMIT_AS,
        R::Core => Resource::RLIMIT_CORE,
        R::Cpu => Resource::RLIMIT_CPU,
        R::Data => Resource::RLIMIT_DATA,
        R::Fsize => Resource::RLIMIT_FSIZE,
        R::Locks => Resource::RLIMIT_LOCKS,
        R::Memlock => Resource::RLIMIT_MEMLOCK,
        R::Msgqueue => Resource::RLIMIT_MSGQUEUE,
        R::Nice => Resource::RLIMIT_NICE,
        R::Nofile => Resource::RLIMIT_NOFILE,
        R::Nproc => Resource::RLIMIT_NPROC,
        R::Rss => Resource::RLIMIT_RSS,
        R::Rtprio => Resource::RLIMIT_RTPRIO,
        R::Rttime => Resource::RLIMIT_RTTIME,
        R::Sigpending => Resource::RLIMIT_SIGPENDING,
        R::Stack => Resource::RLIMIT_STACK,
    }
}

/// Highest capability number the kernel knows (read once per process; a forked child has it).
pub fn last_cap() -> u32 {
    static LAST: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        crate::sys::read_proc("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(40)
    })
}

/// Drop every capability from the bounding set, clear ambient, set and lock securebits.
///
/// Each `PR_CAPBSET_DROP` commits a new set of credentials (~2 µs here), so each capability is
/// dropped once, by number, without reading it first (the `caps` crate's `clear` reads every
/// capability before dropping it, and knows none past its own last): raw prctl.
pub fn drop_bounding_and_lock(last: u32) -> io::Result<()> {
    for cap in 0..=last {
        // SAFETY: plain prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(os_err(&format!("dropping capability {cap} from the bounding set")));
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(caps_err("clearing ambient capabilities"))?;
    // Raw: neither `caps` (only KEEP_CAPS) nor nix sets securebits.
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(os_err("locking securebits"));
    }
    Ok(())
}

/// Set no supplementary groups, then gid and uid (real, effective, saved).
pub fn set_ids(uid: u32, gid: u32) -> io::Result<()> {
    use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
    setgroups(&[]).map_err(nix_err("clearing supplementary groups".into()))?;
    let g = Gid::from_raw(gid);
    setresgid(g, g, g).map_err(nix_err(format!("setting gid {gid}")))?;
    let u = Uid::from_raw(uid);
    setresuid(u, u, u).map_err(nix_err(format!("setting uid {uid}")))?;
    Ok(())
}

/// Empty effective, permitted and inheritable sets (clearing permitted clears effective too).
pub fn clear_caps() -> io::Result<()> {
    caps::clear(None, CapSet::Inheritable).map_err(caps_err("emptying the inheritable set"))?;
    caps::clear(None, CapSet::Permitted).map_err(caps_err("emptying the permitted and effective sets"))?;
    Ok(())
}

/// Add CAP_NET_BIND_SERVICE to the inheritable set (a test hook: inheritable capabilities
/// survive exec).
pub fn raise_inheritable() -> io::Result<()> {
    caps::raise(None, CapSet::Inheritable, caps::Capability::CAP_NET_BIND_SERVICE)
        .map_err(caps_err("raising an inheritable capability"))
}

/// Read every capability set back; true only when all five are empty. The ambient set needs no
/// read of its own: the kernel keeps it within permitted ∩ inheritable (lowering either lowers
/// it), so with both empty it is empty. The exec stop checks all 64 bits of all five sets in
/// `/proc/<pid>/status` besides.
pub fn caps_all_clear(last: u32) -> bool {
    let sets = [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable];
    if !sets.into_iter().all(|set| caps::read(None, set).is_ok_and(|s| s.is_empty())) {
        return false;
    }
    // Raw: by number, past the crate's last capability too, and without building a set.
    // SAFETY: plain prctl queries.
    (0..=last).all(|cap| unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) } == 0)
}

/// Set no_new_privs.
pub fn no_new_privs() -> io::Result<()> {
    nix::sys::prctl::set_no_new_privs().map_err(nix_err("setting no_new_privs".into()))
}

/// Current securebits.
pub fn securebits() -> u32 {
    // Raw: neither `caps` nor nix reads securebits.
    // SAFETY: plain prctl query.
    let v = unsafe { libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0) };
    v.max(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

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
            raise_inheritable().is_ok()
                && drop_bounding_and_lock(last).is_ok()
                && set_caps(0, 0, 1 << 10)
                && !caps_all_clear(last)
        }));
        // The permitted and inheritable sets holding the same capability (so no `^` of the
        // sets can stand in for their union).
        assert!(in_child(|| {
            raise_inheritable().is_ok()
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
