//! The seccomp allow-list. Default action is `EPERM`: a system call must be named here to be
//! usable. It is enough for bash, coreutils, python3 and cargo/rustc. It excludes namespace
//! creation, the mount API, ptrace and cross-process memory access, bpf, perf, keyrings,
//! userfaultfd, io_uring, kexec and module loading, and filters `clone`, `ioctl`, `socket` and
//! `socketpair` by argument. A second filter turns `clone3` and `io_uring_*` into `ENOSYS`, so
//! libc and runtimes fall back to what the first filter allows instead of failing hard.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompFilter,
    SeccompRule, TargetArch,
};
use sha2::{Digest, Sha256};

/// Every `CLONE_NEW*` flag (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME).
pub const CLONE_NEW_MASK: u64 = 0x7E02_0080;
/// TIOCSTI: push a byte into a terminal's input queue.
pub const TIOCSTI: u64 = 0x5412;
/// TIOCLINUX: console subcommands, including selection paste.
pub const TIOCLINUX: u64 = 0x541C;

/// System calls allowed without conditions.
const ALLOWED: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_open,
    libc::SYS_close,
    libc::SYS_stat,
    libc::SYS_fstat,
    libc::SYS_lstat,
    libc::SYS_poll,
    libc::SYS_lseek,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_munmap,
    libc::SYS_brk,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_access,
    libc::SYS_pipe,
    libc::SYS_select,
    libc::SYS_sched_yield,
    libc::SYS_mremap,
    libc::SYS_msync,
    libc::SYS_mincore,
    libc::SYS_madvise,
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_pause,
    libc::SYS_nanosleep,
    libc::SYS_getitimer,
    libc::SYS_alarm,
    libc::SYS_setitimer,
    libc::SYS_getpid,
    libc::SYS_sendfile,
    libc::SYS_connect,
    libc::SYS_accept,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_shutdown,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_execve,
    libc::SYS_exit,
    libc::SYS_wait4,
    libc::SYS_kill,
    libc::SYS_uname,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semctl,
    libc::SYS_shmdt,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_truncate,
    libc::SYS_ftruncate,
    libc::SYS_getdents,
    libc::SYS_getcwd,
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_rename,
    libc::SYS_mkdir,
    libc::SYS_rmdir,
    libc::SYS_creat,
    libc::SYS_link,
    libc::SYS_unlink,
    libc::SYS_symlink,
    libc::SYS_readlink,
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_chown,
    libc::SYS_fchown,
    libc::SYS_lchown,
    libc::SYS_umask,
    libc::SYS_gettimeofday,
    libc::SYS_getrlimit,
    libc::SYS_getrusage,
    libc::SYS_sysinfo,
    libc::SYS_times,
    libc::SYS_getuid,
    libc::SYS_getgid,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_geteuid,
    libc::SYS_getegid,
    libc::SYS_setpgid,
    libc::SYS_getppid,
    libc::SYS_getpgrp,
    libc::SYS_setsid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_getgroups,
    libc::SYS_setgroups,
    libc::SYS_setresuid,
    libc::SYS_getresuid,
    libc::SYS_setresgid,
    libc::SYS_getresgid,
    libc::SYS_getpgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_getsid,
    libc::SYS_capget,
    libc::SYS_capset,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_sigsuspend,
    libc::SYS_sigaltstack,
    libc::SYS_utime,
    libc::SYS_mknod,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_sched_setparam,
    libc::SYS_sched_getparam,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_rr_get_interval,
    libc::SYS_mlock,
    libc::SYS_munlock,
    libc::SYS_mlockall,
    libc::SYS_munlockall,
    libc::SYS_prctl,
    libc::SYS_arch_prctl,
    libc::SYS_gettid,
    libc::SYS_readahead,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    libc::SYS_tkill,
    libc::SYS_time,
    libc::SYS_futex,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getaffinity,
    libc::SYS_set_thread_area,
    libc::SYS_get_thread_area,
    libc::SYS_io_setup,
    libc::SYS_io_destroy,
    libc::SYS_io_getevents,
    libc::SYS_io_submit,
    libc::SYS_io_cancel,
    libc::SYS_getdents64,
    libc::SYS_set_tid_address,
    libc::SYS_restart_syscall,
    libc::SYS_semtimedop,
    libc::SYS_fadvise64,
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_gettime,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_delete,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_exit_group,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_ctl,
    libc::SYS_tgkill,
    libc::SYS_utimes,
    libc::SYS_waitid,
    libc::SYS_inotify_init,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    libc::SYS_openat,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_fchownat,
    libc::SYS_futimesat,
    libc::SYS_newfstatat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_linkat,
    libc::SYS_symlinkat,
    libc::SYS_readlinkat,
    libc::SYS_fchmodat,
    libc::SYS_faccessat,
    libc::SYS_pselect6,
    libc::SYS_ppoll,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_splice,
    libc::SYS_tee,
    libc::SYS_sync_file_range,
    libc::SYS_vmsplice,
    libc::SYS_utimensat,
    libc::SYS_epoll_pwait,
    libc::SYS_signalfd,
    libc::SYS_timerfd_create,
    libc::SYS_eventfd,
    libc::SYS_fallocate,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    libc::SYS_accept4,
    libc::SYS_signalfd4,
    libc::SYS_eventfd2,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_dup3,
    libc::SYS_pipe2,
    libc::SYS_inotify_init1,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_recvmmsg,
    libc::SYS_prlimit64,
    libc::SYS_syncfs,
    libc::SYS_sendmmsg,
    libc::SYS_getcpu,
    libc::SYS_sched_setattr,
    libc::SYS_sched_getattr,
    libc::SYS_renameat2,
    libc::SYS_seccomp,
    libc::SYS_getrandom,
    libc::SYS_memfd_create,
    libc::SYS_execveat,
    libc::SYS_membarrier,
    libc::SYS_mlock2,
    libc::SYS_copy_file_range,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_pkey_mprotect,
    libc::SYS_pkey_alloc,
    libc::SYS_pkey_free,
    libc::SYS_statx,
    libc::SYS_rseq,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    libc::SYS_close_range,
    libc::SYS_openat2,
    libc::SYS_faccessat2,
    libc::SYS_epoll_pwait2,
    libc::SYS_landlock_create_ruleset,
    libc::SYS_landlock_add_rule,
    libc::SYS_landlock_restrict_self,
    libc::SYS_futex_waitv,
    libc::SYS_fchmodat2,
    libc::SYS_sync,
    libc::SYS_sched_getattr,
];

/// System calls answered with ENOSYS so callers fall back (glibc retries clone3 as clone).
const ENOSYS: &[libc::c_long] =
    &[libc::SYS_clone3, libc::SYS_io_uring_setup, libc::SYS_io_uring_enter, libc::SYS_io_uring_register];

/// What the cage's init still does once the target exists: wait for signals and children,
/// forward signals, report the target's end and exit. Nothing else.
const INIT_ALLOWED: &[libc::c_long] = &[
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_restart_syscall,
    libc::SYS_wait4,
    libc::SYS_kill,
    libc::SYS_getrusage,
    libc::SYS_write,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// The compiled filters, in install order, and their digest.
pub struct Filters {
    /// BPF programs the target installs, first to last.
    pub programs: Vec<BpfProgram>,
    /// The init's own, much smaller filter (cheaper for the kernel to load and to run).
    pub init: BpfProgram,
    /// SHA-256 over every instruction of every program, in install order.
    pub sha256: String,
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<Cond, seccompiler::BackendError> {
    Cond::new(arg, len, op, value)
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(conds)
}

/// Argument-filtered system calls.
fn conditional_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let mut rules = BTreeMap::new();
    // clone: only without any CLONE_NEW* flag.
    rules.insert(libc::SYS_clone, vec![rule(vec![cond(0, Len::Qword, Op::MaskedEq(CLONE_NEW_MASK), 0)?])?]);
    // ioctl: everything but TIOCSTI/TIOCLINUX, compared on the low 32 bits the kernel uses,
    // so `TIOCSTI | 1 << 32` cannot slip past.
    rules.insert(
        libc::SYS_ioctl,
        vec![rule(vec![cond(1, Len::Dword, Op::Ne, TIOCSTI)?, cond(1, Len::Dword, Op::Ne, TIOCLINUX)?])?],
    );
    // socket: unix, IPv4, IPv6 only (no netlink, vsock, packet, ...).
    let families = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6];
    rules.insert(
        libc::SYS_socket,
        families.iter().map(|f| rule(vec![cond(0, Len::Dword, Op::Eq, *f as u64)?])).collect::<Result<_, _>>()?,
    );
    rules.insert(libc::SYS_socketpair, vec![rule(vec![cond(0, Len::Dword, Op::Eq, libc::AF_UNIX as u64)?])?]);
    Ok(rules)
}

/// Build both filters for x86_64.
pub fn build() -> Result<Filters, String> {
    let err = |e: &dyn std::fmt::Display| format!("building the seccomp filter: {e}");
    let mut allow = conditional_rules().map_err(|e| err(&e))?;
    for nr in ALLOWED {
        allow.insert(*nr, Vec::new());
    }
    let enosys: BTreeMap<i64, Vec<SeccompRule>> = ENOSYS.iter().map(|nr| (*nr, Vec::new())).collect();
    let first =
        SeccompFilter::new(allow, SeccompAction::Errno(libc::EPERM as u32), SeccompAction::Allow, TargetArch::x86_64)
            .map_err(|e| err(&e))?;
    let second =
        SeccompFilter::new(enosys, SeccompAction::Allow, SeccompAction::Errno(libc::ENOSYS as u32), TargetArch::x86_64)
            .map_err(|e| err(&e))?;
    let programs: Vec<BpfProgram> = vec![
        first.try_into().map_err(|e: seccompiler::BackendError| err(&e))?,
        second.try_into().map_err(|e: seccompiler::BackendError| err(&e))?,
    ];
    let mut h = Sha256::new();
    for prog in &programs {
        for ins in prog {
            h.update(ins.code.to_le_bytes());
            h.update([ins.jt, ins.jf]);
            h.update(ins.k.to_le_bytes());
        }
    }
    let init_rules: BTreeMap<i64, Vec<SeccompRule>> = INIT_ALLOWED.iter().map(|nr| (*nr, Vec::new())).collect();
    let init = SeccompFilter::new(
        init_rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(|e| err(&e))?;
    let init = init.try_into().map_err(|e: seccompiler::BackendError| err(&e))?;
    Ok(Filters { programs, init, sha256: hex(&h.finalize()) })
}

/// Install every program on the calling thread (no_new_privs must already be set).
pub fn install(filters: &Filters) -> Result<(), String> {
    for prog in &filters.programs {
        seccompiler::apply_filter(prog).map_err(|e| format!("installing the seccomp filter: {e}"))?;
    }
    Ok(())
}

/// Install the init's filter on the calling thread (no_new_privs must already be set).
pub fn install_init(filters: &Filters) -> Result<(), String> {
    seccompiler::apply_filter(&filters.init).map_err(|e| format!("installing the init's seccomp filter: {e}"))
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_builds_and_digest_is_stable() {
        let a = build().unwrap();
        let b = build().unwrap();
        assert_eq!(a.sha256, b.sha256);
        assert_eq!(a.programs.len(), 2);
        for denied in [
            libc::SYS_mount,
            libc::SYS_ptrace,
            libc::SYS_bpf,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_keyctl,
            libc::SYS_userfaultfd,
            libc::SYS_perf_event_open,
            libc::SYS_process_vm_readv,
            libc::SYS_pivot_root,
            libc::SYS_kexec_load,
            libc::SYS_init_module,
            libc::SYS_open_tree,
        ] {
            assert!(!ALLOWED.contains(&denied), "syscall {denied} must not be allowed");
        }
    }
}
