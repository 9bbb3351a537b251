//! Thin, checked wrappers over the system calls the cage makes on paths and descriptors. Those
//! nix wraps go through nix; raw calls remain only for what nix lacks: the new mount API
//! (open_tree, mount_setattr, move_mount, fsopen/fsconfig/fsmount), openat2 with our resolve
//! flags, execveat, close_range, pidfd_open, a fork-style clone (nix's clone needs a callback
//! stack) and clone3. Every wrapper returns `io::Result` and takes/returns owned fds so nothing
//! leaks on an error path.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{AtFlags, OFlag};
use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag};
use nix::unistd::Pid;

/// `open_tree` flags.
pub const OPEN_TREE_CLONE: u32 = 0x1;
/// `open_tree`: close the returned fd on exec.
pub const OPEN_TREE_CLOEXEC: u32 = libc::O_CLOEXEC as u32;
/// `move_mount`: the source is the fd itself.
pub const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
/// `mount_setattr` attributes.
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// No set-user-id / capabilities from files on this mount.
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// No device files on this mount.
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
/// No execution from this mount.
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;
const FSMOUNT_CLOEXEC: u32 = 1;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn owned(ret: libc::c_long) -> io::Result<OwnedFd> {
    let fd = check(ret)? as RawFd;
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Clone the mount tree at `fd` (recursively) into a new detached mount.
pub fn open_tree_clone(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32 | libc::AT_RECURSIVE as u32;
    // SAFETY: valid fd and a NUL-terminated empty path.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) })
}

/// Set mount attributes on the whole tree at `fd` and make it private, so nothing mounted
/// inside the cage propagates back to the host.
pub fn mount_setattr_tree(fd: BorrowedFd<'_>, attr_set: u64) -> io::Result<()> {
    let attr = MountAttr { attr_set, attr_clr: 0, propagation: libc::MS_PRIVATE, userns_fd: 0 };
    let flags = libc::AT_EMPTY_PATH as u32 | libc::AT_RECURSIVE as u32;
    // SAFETY: attr is a valid mount_attr of the size we pass.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Set attributes on the single mount at `fd` (not its children), leaving propagation alone.
pub fn mount_setattr_one(fd: BorrowedFd<'_>, attr_set: u64) -> io::Result<()> {
    let attr = MountAttr { attr_set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: attr is a valid mount_attr of the size we pass.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as u32,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Attach the detached mount `from` onto `name` beneath the directory fd `to_dir`.
pub fn move_mount_to(from: BorrowedFd<'_>, to_dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fds and NUL-terminated paths.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            c"".as_ptr(),
            to_dir.as_raw_fd(),
            name.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// Create a detached mount of a fresh filesystem (`tmpfs`, `proc`) with string options.
pub fn fs_mount(fstype: &CStr, options: &[(&CStr, &CStr)], attrs: u64) -> io::Result<OwnedFd> {
    // SAFETY: NUL-terminated fs name.
    let ctx = owned(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), 1u32) })?;
    // The source mountinfo shows is the type's name, as mount(8) gives it ("none" otherwise):
    // tools inside the cage and compliance checks match mounts by it.
    for (key, value) in [(c"source", fstype)].iter().chain(options) {
        // SAFETY: valid context fd and NUL-terminated strings.
        check(unsafe {
            libc::syscall(libc::SYS_fsconfig, ctx.as_raw_fd(), FSCONFIG_SET_STRING, key.as_ptr(), value.as_ptr(), 0)
        })?;
    }
    // SAFETY: valid context fd.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            ctx.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0,
        )
    })?;
    // SAFETY: valid context fd.
    owned(unsafe { libc::syscall(libc::SYS_fsmount, ctx.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) })
}

/// Leave a real-time scheduling policy this process was started with (`chrt -f chio …`, or a
/// unit's `CPUSchedulingPolicy=fifo`): a cage's init is cloned from it, a real-time task cannot
/// join a launch cgroup without a real-time budget (EINVAL, on a kernel with RT group
/// scheduling), and where it could, the cage would run real-time, which its CPU ceiling does not
/// hold. Raw: nix has no `sched_setscheduler`.
pub fn leave_realtime() -> io::Result<()> {
    // SAFETY: plain syscalls on this process with a local parameter.
    unsafe {
        let policy = libc::sched_getscheduler(0) & !libc::SCHED_RESET_ON_FORK;
        if policy == libc::SCHED_FIFO || policy == libc::SCHED_RR {
            let normal = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(0, libc::SCHED_OTHER, &normal) != 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(
                    e.kind(),
                    format!("leaving the real-time scheduling policy chio was started with (a cage never runs real-time): {e}"),
                ));
            }
        }
    }
    Ok(())
}

/// How often `openat2` is asked again after EAGAIN.
const OPENAT2_TRIES: usize = 256;

/// `openat2` with the given flags and resolve restrictions. Under `RESOLVE_IN_ROOT` or
/// `RESOLVE_BENEATH` the kernel answers EAGAIN when a rename or mount anywhere on the host
/// raced its walk of a `..` (it could not ensure the `..` stayed inside) and asks the caller to
/// try again: a busy host made image imports and launches fail at random. Asked again, a
/// bounded number of times; past that the EAGAIN is the answer.
pub fn openat2(dir: BorrowedFd<'_>, path: &CStr, flags: i32, mode: u32, resolve: u64) -> io::Result<OwnedFd> {
    let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u64, mode: mode as u64, resolve };
    let mut tries = 0;
    loop {
        // SAFETY: valid fd, NUL-terminated path, open_how of the size we pass.
        let opened = owned(unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        });
        tries += 1;
        match opened {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < OPENAT2_TRIES => continue,
            other => return other,
        }
    }
}

/// `fd`'s attributes in `mask` as the kernel holds them, asking no file system
/// (`AT_STATX_DONT_SYNC`: a FUSE server that never answers would hold the question itself).
/// Raw statx: nix has none.
pub fn statx_held(fd: BorrowedFd<'_>, mask: u32) -> io::Result<libc::statx> {
    // SAFETY: a zeroed plain-data struct of ours for statx to fill.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    // SAFETY: a valid fd, an empty path with AT_EMPTY_PATH, our own buffer.
    if unsafe { libc::statx(fd.as_raw_fd(), c"".as_ptr(), flags, mask, &mut stx) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stx)
}

/// The id of the mount `fd`'s file is on.
pub fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let stx = statx_held(fd, libc::STATX_MNT_ID)?;
    if stx.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::other("the kernel reported no mount id"));
    }
    Ok(stx.stx_mnt_id)
}

/// Plain `openat`, close-on-exec (used with `O_NOFOLLOW` by the per-component walk).
pub fn openat(dir: BorrowedFd<'_>, path: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let flags = OFlag::from_bits_retain(flags) | OFlag::O_CLOEXEC;
    Ok(nix::fcntl::openat(dir, path, flags, Mode::from_bits_retain(mode))?)
}

/// `fstatat` of `name` below `dir` with `flags` (`AT_SYMLINK_NOFOLLOW`, or 0 to follow).
pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<libc::stat> {
    Ok(nix::sys::stat::fstatat(dir, name, AtFlags::from_bits_retain(flags))?)
}

/// `fstat` of an fd.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    Ok(nix::sys::stat::fstat(fd)?)
}

/// `mkdirat`, treating an existing entry as an error (the skeleton is always fresh).
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    Ok(nix::sys::stat::mkdirat(dir, name, Mode::from_bits_retain(mode))?)
}

/// `mknodat` (a device node in the cage's own `/dev`), then its mode exactly (the umask would
/// clear bits).
pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let kind = SFlag::from_bits_truncate(mode & libc::S_IFMT);
    let perm = Mode::from_bits_truncate(mode & 0o7777);
    nix::sys::stat::mknodat(dir, name, kind, perm, dev)?;
    // A device node is not a symlink: following is the same as not.
    Ok(nix::sys::stat::fchmodat(dir, name, perm, FchmodatFlags::FollowSymlink)?)
}

/// `open_tree(dir, name, OPEN_TREE_CLONE)`: a detached bind mount of one file or directory.
pub fn open_tree_clone_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    let flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_SYMLINK_NOFOLLOW as u32;
    // SAFETY: valid fd and a NUL-terminated name.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), name.as_ptr(), flags) })
}

/// Attach the detached mount `tree` onto the file or directory `target` (an `O_PATH` fd).
pub fn move_mount_onto(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
    // SAFETY: valid fds, empty paths, documented flags.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// Create an empty regular file (a mount point for a file bind).
pub fn mkfileat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    openat(dir, name, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW, 0o644).map(drop)
}

/// `symlinkat`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    Ok(nix::unistd::symlinkat(target, dir, name)?)
}

/// `readlinkat` into an owned byte vector.
pub fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    Ok(std::os::unix::ffi::OsStringExt::into_vec(nix::fcntl::readlinkat(dir, name)?))
}

/// `dup` (close-on-exec) of an fd.
pub fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

/// `pidfd_open` for a child, so waiting can be combined with poll and a deadline.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) })
}

/// Send `sig` (0: only check) to the process behind `pidfd`: that process or none, never
/// another that took its pid after it was reaped (ESRCH then). Raw: nix has no pidfd calls.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we hold, no info pointer, no flags.
    check(unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig, std::ptr::null::<libc::siginfo_t>(), 0u32)
    })
    .map(drop)
}

/// Whether the process behind `pidfd` still holds its pid (alive, or a zombie not yet reaped).
pub fn pidfd_holds_pid(pidfd: BorrowedFd<'_>) -> bool {
    pidfd_send_signal(pidfd, 0).is_ok()
}

/// Hear of every child's stop and end: SIGCHLD back to its default disposition. An ignored
/// SIGCHLD (a disposition kept across exec from whoever started chio) makes the kernel reap
/// children unasked and send no SIGCHLD at all, and `SA_NOCLDSTOP` silences stops: a process
/// that waits for its children by that signal would wait for good.
pub fn hear_of_children() -> io::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: installs no handler (the default disposition).
    unsafe { sigaction(Signal::SIGCHLD, &default) }.map(drop).map_err(io::Error::from)
}

/// Close every fd from `first` upwards.
pub fn close_from(first: u32) -> io::Result<()> {
    close_range(first, u32::MAX)
}

/// Close every fd from 3 upwards but those in `keep`.
pub fn close_all_but(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep.iter().filter_map(|&fd| u32::try_from(fd).ok()).filter(|&fd| fd >= 3).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from = 3;
    for fd in keep {
        if fd > from {
            close_range(from, fd - 1)?;
        }
        from = fd + 1;
    }
    close_range(from, u32::MAX)
}

fn close_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: plain syscall with integer arguments (raw: nix has no close_range).
    check(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) }).map(drop)
}

/// `execveat(fd, "", argv, envp, AT_EMPTY_PATH)`: execute exactly the verified open file.
/// Returns only on failure.
pub fn execveat_fd(fd: RawFd, argv: &[*const libc::c_char], envp: &[*const libc::c_char]) -> io::Error {
    // SAFETY: argv/envp are NULL-terminated arrays of NUL-terminated strings owned by the caller.
    unsafe {
        libc::syscall(libc::SYS_execveat, fd, c"".as_ptr(), argv.as_ptr(), envp.as_ptr(), libc::AT_EMPTY_PATH);
    }
    io::Error::last_os_error()
}

/// `clone` with namespace flags and fork semantics (no new stack: copy-on-write like fork).
/// The caller must be single-threaded. Returns 0 in the child and the child's pid in the parent.
pub fn clone_fork(flags: libc::c_ulong) -> io::Result<libc::pid_t> {
    // SAFETY: with a NULL stack, clone behaves like fork; the caller guarantees one thread.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags | libc::SIGCHLD as libc::c_ulong,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0usize,
        )
    };
    check(ret).map(|p| p as libc::pid_t)
}

/// `struct clone_args` (version 2, with the cgroup field).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3` with fork semantics, the child starting directly inside the cgroup v2 directory
/// `cgroup` — no migration afterwards. The caller must be single-threaded.
pub fn clone_into_cgroup(flags: u64, cgroup: BorrowedFd<'_>) -> io::Result<libc::pid_t> {
    let args = CloneArgs {
        flags: flags | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone_args of the size we pass; no stack means fork semantics.
    let ret = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    check(ret).map(|p| p as libc::pid_t)
}

/// `pivot_root(".", ".")` after `fchdir` into the new root; the old root is then detached.
pub fn pivot_into(new_root: BorrowedFd<'_>) -> io::Result<()> {
    nix::unistd::fchdir(new_root)?;
    nix::unistd::pivot_root(c".", c".")?;
    nix::mount::umount2(c".", nix::mount::MntFlags::MNT_DETACH)?;
    Ok(nix::unistd::chdir(c"/")?)
}

/// A procfs file's text, read whole in one `read` (and the one that finds its end). A procfs
/// file says its size is 0, so `fs::read_to_string` reads it 32 bytes first and doubles: eight
/// reads for a `status`, each a system call, several on a launch's critical path.
pub fn read_proc(path: impl AsRef<std::path::Path>) -> io::Result<String> {
    read_whole(std::fs::File::open(path)?)
}

/// [`read_proc`] of a file already open.
pub fn read_whole(mut file: std::fs::File) -> io::Result<String> {
    let mut text = String::with_capacity(PROC_TEXT);
    io::Read::read_to_string(&mut file, &mut text)?;
    Ok(text)
}

/// Room for a procfs `status` (about 1.5 KB) or `stat` in one read.
const PROC_TEXT: usize = 4096;

/// Field `n` (1-based, as in proc(5)) of `/proc/<pid>/stat`, `pid` being `self` or a number.
pub fn stat_field<T: std::str::FromStr>(pid: &str, n: usize) -> io::Result<T> {
    let stat = read_proc(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (field 2, which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    rest.split_whitespace()
        .nth(n - 3)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("malformed /proc/{pid}/stat")))
}

/// This process's argument area: `arg_start` and `arg_end` (fields 48 and 49 of
/// `/proc/self/stat`), read once per process image. A fork has the same one (fork copies the
/// address space with these bounds; only an exec or `PR_SET_MM_ARG_*` changes them), so a value
/// read before the cage's init is cloned is the init's own.
pub fn arg_area() -> io::Result<(usize, usize)> {
    static AREA: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    if let Some(a) = AREA.get() {
        return Ok(*a);
    }
    let stat = read_proc("/proc/self/stat")?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let mut fields = rest.split_whitespace().skip(48 - 3).map(str::parse::<usize>);
    match (fields.next(), fields.next()) {
        (Some(Ok(start)), Some(Ok(end))) => Ok(*AREA.get_or_init(|| (start, end))),
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "malformed /proc/self/stat")),
    }
}

/// Number of threads of the calling process (field 20 of `/proc/self/stat`).
pub fn thread_count() -> io::Result<u64> {
    stat_field("self", 20)
}

/// The CPUs this process may run on (None if they cannot be read).
pub fn own_affinity() -> Option<CpuSet> {
    sched_getaffinity(Pid::from_raw(0)).ok()
}

/// Start `child`, just cloned by this process (whose CPUs are `mask`), on a CPU other than this
/// one. Right after a fork the scheduler mostly queues the child behind its parent on the
/// parent's CPU (here: 51 of 60 inits), where it starts only once the parent blocks or moves
/// away — and moving ourselves waits for the migration thread (50–70 µs here). A child that is
/// queued, not running, moves at once: it is allowed every CPU of `mask` but this one, then all
/// of `mask` again, which leaves it where it now is. Nothing changes with one CPU. The child
/// also sets its own CPUs back to `mask` right before it forks the target ([`crate::inside`]):
/// a cage inherits the narrower set only if this process stalls, between its clone and these
/// two calls, for the whole of the init's setup.
pub fn start_elsewhere(child: libc::pid_t, mask: &CpuSet) {
    let (Ok(here), pid) = (sched_getcpu(), Pid::from_raw(child)) else { return };
    let mut others = *mask;
    if others.unset(here).is_err() || !(0..CpuSet::count()).any(|c| others.is_set(c).unwrap_or(false)) {
        return;
    }
    if sched_setaffinity(pid, &others).is_ok() {
        let _ = sched_setaffinity(pid, mask);
    }
}

/// Set this process's CPUs to `mask` (best effort: a set the kernel refuses, say after a
/// cpuset changed, leaves the current one).
pub fn set_own_affinity(mask: &CpuSet) {
    let _ = sched_setaffinity(Pid::from_raw(0), mask);
}

/// Map this process's program text into its page tables now (`MADV_POPULATE_READ`, Linux
/// 5.14+), so that code run for the first time later takes no page fault: a process forked
/// from the daemon's launcher starts with none of it mapped (fork copies no page-table entry
/// of a file mapping), and a launch's init and target run most of theirs for the first time.
/// It goes in steps of [`POPULATE_STEP`] bytes (≈ 35 µs each for a warm page cache), `stop`
/// asked before each: whoever waits for a request stops when it comes. Best effort: a kernel
/// without the advice refuses it and the faults stay where they were.
pub fn populate_text(stop: &dyn Fn() -> bool) {
    populate(&text_ranges(), stop);
}

/// This process's executable mappings, `[start, end)`: the program (and a dynamic one's
/// libraries; the vdso refuses the advice).
fn text_ranges() -> Vec<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let (a, b) = range.split_once('-')?;
            let (a, b) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
            perms.starts_with("r-x").then_some((a, b))
        })
        .collect()
}

/// Fault `ranges` of our own mappings in, a step at a time, `stop` asked before each.
fn populate(ranges: &[(usize, usize)], stop: &dyn Fn() -> bool) {
    for &(a, b) in ranges {
        for at in (a..b).step_by(POPULATE_STEP) {
            if stop() {
                return;
            }
            let Some(start) = std::ptr::NonNull::new(at as *mut libc::c_void) else { continue };
            // SAFETY: advice over a mapping of our own address space; POPULATE_READ faults its
            // pages in as reading them would, and changes nothing else.
            let advised = unsafe {
                nix::sys::mman::madvise(
                    start,
                    POPULATE_STEP.min(b - at),
                    nix::sys::mman::MmapAdvise::MADV_POPULATE_READ,
                )
            };
            if advised.is_err() {
                break;
            }
        }
    }
}

/// How much text [`populate_text`] maps between two looks at `stop`.
pub const POPULATE_STEP: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident kB of the mapping starting at `start` (its smaps "Rss").
    fn rss_kb(start: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&format!("{start:x}-")));
        lines.find_map(|l| l.strip_prefix("Rss:")).unwrap().trim().trim_end_matches(" kB").parse().unwrap()
    }

    /// Nothing is faulted in once `stop` says so; all of it, step by step, when it never does.
    /// (A fresh read-only mapping of this program: untouched, and no text range of ours.)
    #[test]
    fn populating_faults_in_the_whole_range_unless_stopped() {
        let exe = std::fs::File::open("/proc/self/exe").unwrap();
        let len = (exe.metadata().unwrap().len() as usize) & !4095;
        assert!(len > 2 * POPULATE_STEP, "a range of several steps");
        // SAFETY: a new private read-only mapping of a file we hold open, unmapped below.
        let at =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, exe.as_raw_fd(), 0) };
        assert_ne!(at, libc::MAP_FAILED);
        let range = [(at as usize, at as usize + len)];
        populate(&range, &|| true);
        assert_eq!(rss_kb(at as usize), 0, "stopped before the first step");
        let steps = std::cell::Cell::new(0);
        populate(&range, &|| {
            steps.set(steps.get() + 1);
            false
        });
        assert_eq!(rss_kb(at as usize), len as u64 / 1024);
        assert_eq!(steps.get(), len.div_ceil(POPULATE_STEP), "stop asked before each step");
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(at, len) };
    }

    #[test]
    fn the_text_ranges_hold_this_code() {
        let here = the_text_ranges_hold_this_code as *const () as usize;
        assert!(text_ranges().iter().any(|&(a, b)| (a..b).contains(&here)));
    }
}
