//! The escape probe. Each subcommand tries exactly one escape and reports one line:
//! `ESCAPED: …` (exit 0) when the operation worked, `REFUSED: … errno=N` (exit 1) when the kernel
//! refused it, `ERROR: …` (exit 3) when the probe itself could not run. The suite runs every probe
//! inside a cage (must be refused) and as a control without that restriction (must escape), so a
//! probe cannot pass by being broken.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::exit;

fn escaped(what: &str) -> ! {
    println!("ESCAPED: {what}");
    exit(0)
}

fn refused(what: &str, errno: i32) -> ! {
    println!("REFUSED: {what} errno={errno}");
    exit(1)
}

fn error(what: &str) -> ! {
    println!("ERROR: {what}");
    exit(3)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Report a raw syscall result: >= 0 is an escape, < 0 a refusal with errno.
fn verdict(what: &str, r: libc::c_long) -> ! {
    if r >= 0 {
        escaped(what)
    } else {
        refused(what, errno())
    }
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

fn arg(args: &[String], i: usize) -> &str {
    args.get(i).map(String::as_str).unwrap_or_else(|| error("missing argument"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = arg(&args, 0).to_string();
    let rest = &args[1..];
    match name.as_str() {
        "write" => write_file(arg(rest, 0)),
        "read" => read_file(arg(rest, 0), rest.get(1).map(String::as_str)),
        "exec-copy" => exec_copy(arg(rest, 0)),
        "exec-memfd" => exec_memfd(),
        "hardlink" => hardlink(arg(rest, 0), arg(rest, 1)),
        "is-procfs" => is_procfs(arg(rest, 0)),
        "fds" => fds(),
        "fd-walk" => fd_walk(),
        "open-write" => open_write(arg(rest, 0)),
        "unshare" => unshare(arg(rest, 0)),
        "clone-newuser" => clone_newuser(),
        "clone3" => clone3(),
        "setns" => setns(),
        "mount" => mount(arg(rest, 0)),
        "pivot-root" => pivot_root(rest.first().map(String::as_str) == Some("--own-ns")),
        "ptrace" => ptrace(),
        "process-vm-readv" => process_vm_readv(),
        "bpf" => bpf(),
        "perf-event-open" => perf_event_open(),
        "keyctl" => keyctl(),
        "userfaultfd" => userfaultfd(),
        "io-uring" => io_uring(),
        "tiocsti" => tiocsti(false),
        "tiocsti-highbit" => tiocsti(true),
        "socket" => socket(arg(rest, 0)),
        "tcp-connect" => tcp_connect(arg(rest, 0)),
        "tcp-bind" => tcp_bind(arg(rest, 0)),
        "tcp-listen" => tcp_listen(),
        "abstract-connect" => abstract_connect(arg(rest, 0)),
        "kill" => kill(arg(rest, 0)),
        "as-user" => as_user(rest),
        "euid" => euid(),
        "caps" => caps(),
        "nnp" => nnp(),
        "securebits" => securebits(),
        "fork-many" => fork_many(arg(rest, 0)),
        "alloc" => alloc(arg(rest, 0)),
        "fill" => fill(arg(rest, 0), arg(rest, 1)),
        "flood" => flood(arg(rest, 0)),
        "sleeper" => sleeper(arg(rest, 0), rest.get(1).map(String::as_str) == Some("--background")),
        "mknod" => mknod(arg(rest, 0)),
        "chroot" => chroot(arg(rest, 0)),
        "sethostname" => sethostname(rest.first().map(String::as_str) == Some("--own-ns")),
        "write-sysctl" => write_sysctl(rest.first().map(String::as_str) == Some("--own-ns")),
        "open-by-handle" => open_by_handle(arg(rest, 0)),
        "stat" => stat(arg(rest, 0)),
        "ioctl-tty" => ioctl_tty(arg(rest, 0)),
        "raw-socket" => raw_socket(),
        "setuid0" => verdict("setuid(0)", unsafe { libc::setuid(0) } as libc::c_long),
        "dump-status" => dump_status(),
        "symlink" => symlink(arg(rest, 0), arg(rest, 1)),
        "create" => create(arg(rest, 0), arg(rest, 1)),
        "truncate" => {
            verdict(&format!("truncate {}", arg(rest, 0)), unsafe { libc::truncate(c(arg(rest, 0)).as_ptr(), 0) }
                as libc::c_long)
        }
        "userns" => userns(rest),
        "setid" => setid(arg(rest, 0), arg(rest, 1)),
        "chmod" => chmod(arg(rest, 0), arg(rest, 1)),
        "touch-times" => touch_times(arg(rest, 0)),
        "same-inode" => same_inode(arg(rest, 0), arg(rest, 1)),
        "io-setup" => io_setup(),
        "inotify" => verdict("inotify_init1", unsafe { libc::inotify_init1(0) } as libc::c_long),
        "sigqueue" => sigqueue(arg(rest, 0)),
        "socket-raw" => socket_raw(arg(rest, 0), arg(rest, 1), arg(rest, 2)),
        "prlimit" => prlimit(arg(rest, 0)),
        "fallocate-keep" => fallocate_keep(arg(rest, 0), arg(rest, 1)),
        "fadvise" => fadvise(arg(rest, 0), arg(rest, 1)),
        "readahead" => readahead(arg(rest, 0)),
        "mincore" => mincore(arg(rest, 0)),
        "sync" => sync_all(),
        "read-stdin" => read_stdin(),
        "stdin-tty" => stdin_tty(),
        "swap-then-read" => swap_then_read(arg(rest, 0), arg(rest, 1), arg(rest, 2)),
        "without" => without(arg(rest, 0), &rest[1..]),
        "argv" => {
            println!("{}", std::env::args().collect::<Vec<_>>().join(" "));
            exit(0)
        }
        "copy-stdin" => {
            std::io::copy(&mut std::io::stdin().lock(), &mut std::io::stdout().lock())
                .unwrap_or_else(|e| error(&format!("copy: {e}")));
            exit(0)
        }
        "cat" => {
            let data = std::fs::read(arg(rest, 0)).unwrap_or_else(|e| error(&format!("read: {e}")));
            std::io::stdout().write_all(&data).unwrap();
            exit(0)
        }
        "spin" => {
            let ms: u64 = arg(rest, 0).parse().unwrap_or_else(|_| error("spin MS"));
            let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
            let mut x = 0u64;
            while std::time::Instant::now() < until {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            exit(0)
        }
        "burn" => {
            // Spend MS of CPU, partly in the kernel (system calls), then print what it spent by
            // its own count: `user_us=U sys_us=S`.
            let ms: i64 = arg(rest, 0).parse().unwrap_or_else(|_| error("burn MS"));
            let spent = || {
                let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
                unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
                let us = |t: libc::timeval| t.tv_sec * 1_000_000 + t.tv_usec;
                (us(ru.ru_utime), us(ru.ru_stime))
            };
            let mut x = 0u64;
            while spent().0 + spent().1 < ms * 1000 {
                for _ in 0..20_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                for _ in 0..200 {
                    unsafe { libc::getppid() };
                }
            }
            let (user, sys) = spent();
            println!("user_us={user} sys_us={sys}");
            exit(0)
        }
        "flood-stderr" => {
            let mib: usize = arg(rest, 0).parse().unwrap_or_else(|_| error("flood-stderr MIB"));
            let chunk = vec![b'e'; 1 << 20];
            for _ in 0..mib {
                if std::io::stderr().write_all(&chunk).is_err() {
                    exit(1);
                }
            }
            exit(0)
        }
        "stderr-partial" => {
            eprint!("{}", arg(rest, 0));
            exit(0)
        }
        _ => error(&format!("unknown probe {name}")),
    }
}

fn write_file(path: &str) -> ! {
    match std::fs::write(path, b"chio-probe") {
        Ok(()) => escaped(&format!("wrote {path}")),
        Err(e) => refused(&format!("write {path}: {e}"), e.raw_os_error().unwrap_or(0)),
    }
}

/// Read `path`; with `want`, escaping means the content contains `want`.
fn read_file(path: &str, want: Option<&str>) -> ! {
    match std::fs::read(path) {
        Ok(data) => match want {
            Some(w) if !String::from_utf8_lossy(&data).contains(w) => {
                refused(&format!("read {path} but it is not the host's file"), 0)
            }
            _ => escaped(&format!("read {} bytes of {path}", data.len())),
        },
        Err(e) => refused(&format!("read {path}: {e}"), e.raw_os_error().unwrap_or(0)),
    }
}

/// Copy our own binary to `path`, make it executable and run it.
fn exec_copy(path: &str) -> ! {
    let me = std::fs::read("/proc/self/exe").unwrap_or_else(|e| error(&format!("read self: {e}")));
    if let Err(e) = std::fs::write(path, me) {
        error(&format!("cannot write {path}: {e}"));
    }
    let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    match std::process::Command::new(path).arg("euid").output() {
        Ok(o) if o.status.code().is_some() => escaped(&format!("executed {path}")),
        Ok(o) => refused(&format!("{path} died: {:?}", o.status), 0),
        Err(e) => refused(&format!("exec {path}: {e}"), e.raw_os_error().unwrap_or(0)),
    }
}

fn exec_memfd() -> ! {
    let me = std::fs::read("/proc/self/exe").unwrap_or_else(|e| error(&format!("read self: {e}")));
    let fd = unsafe { libc::memfd_create(c"probe".as_ptr(), 0) };
    if fd < 0 {
        refused("memfd_create", errno());
    }
    unsafe { libc::write(fd, me.as_ptr().cast(), me.len()) };
    let argv = [c"probe".as_ptr(), c"euid".as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    match unsafe { libc::fork() } {
        0 => {
            // The child's own report must not be mistaken for ours.
            let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY) };
            unsafe { libc::dup2(null, 1) };
            unsafe {
                libc::syscall(libc::SYS_execveat, fd, c"".as_ptr(), argv.as_ptr(), envp.as_ptr(), libc::AT_EMPTY_PATH)
            };
            unsafe { libc::_exit(100 + errno().min(100)) }
        }
        pid => {
            let mut st = 0;
            unsafe { libc::waitpid(pid, &mut st, 0) };
            let code = libc::WEXITSTATUS(st);
            if code >= 100 {
                refused("execveat(memfd)", code - 100)
            }
            escaped("executed a memfd")
        }
    }
}

fn hardlink(src: &str, dst: &str) -> ! {
    verdict(&format!("link {src} -> {dst}"), unsafe { libc::link(c(src).as_ptr(), c(dst).as_ptr()) } as libc::c_long)
}

/// Escaping means `path` is NOT procfs (something else was mounted or redirected there).
fn is_procfs(path: &str) -> ! {
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c(path).as_ptr(), &mut st) } != 0 {
        escaped(&format!("{path} is not reachable: errno {}", errno()));
    }
    if st.f_type == libc::PROC_SUPER_MAGIC {
        refused(&format!("{path} is procfs"), 0)
    }
    escaped(&format!("{path} is a filesystem of type {:#x}", st.f_type))
}

fn open_fds() -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .unwrap_or_else(|e| error(&format!("/proc/self/fd: {e}")))
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort();
    v
}

/// Escaping means an fd beyond stdio was inherited (the read_dir fd itself is excluded).
fn fds() -> ! {
    let fds = open_fds();
    let extra: Vec<String> = fds
        .iter()
        .filter(|fd| **fd > 2)
        .filter_map(|fd| {
            std::fs::read_link(format!("/proc/self/fd/{fd}")).ok().map(|l| format!("{fd}->{}", l.display()))
        })
        .collect();
    if extra.is_empty() {
        refused("no inherited fds beyond stdio", 0)
    }
    escaped(&format!("inherited fds {extra:?}"))
}

/// CVE-2024-21626 shape: fchdir into any inherited directory fd and walk up to a host root.
fn fd_walk() -> ! {
    for fd in 3..1024 {
        if unsafe { libc::fchdir(fd) } == 0 {
            for _ in 0..64 {
                unsafe { libc::chdir(c"..".as_ptr()) };
            }
            let host = std::path::Path::new("chio-host-marker").exists();
            escaped(&format!("fchdir({fd}) worked; host marker visible: {host}"));
        }
    }
    refused("no directory fd to fchdir into", libc::EBADF)
}

/// A terminal ioctl (TCGETS, what isatty() asks) on the device at `path`: a device that is not
/// a terminal answers ENOTTY; landlock refusing device ioctls answers EACCES.
fn ioctl_tty(path: &str) -> ! {
    let fd = unsafe { libc::open(c(path).as_ptr(), libc::O_RDONLY) };
    if fd < 0 {
        error(&format!("open {path}: {}", std::io::Error::last_os_error()));
    }
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    verdict(&format!("TCGETS on {path}"), unsafe { libc::ioctl(fd, libc::TCGETS, &mut t) } as libc::c_long)
}

fn open_write(path: &str) -> ! {
    let fd = unsafe { libc::open(c(path).as_ptr(), libc::O_WRONLY) };
    verdict(&format!("open {path} for writing"), fd as libc::c_long)
}

fn unshare(kind: &str) -> ! {
    let flag = match kind {
        "user" => libc::CLONE_NEWUSER,
        "mnt" => libc::CLONE_NEWNS,
        "net" => libc::CLONE_NEWNET,
        "pid" => libc::CLONE_NEWPID,
        _ => error("unshare user|mnt|net|pid"),
    };
    verdict(&format!("unshare({kind})"), unsafe { libc::unshare(flag) } as libc::c_long)
}

fn reap(pid: libc::c_long) {
    if pid > 0 {
        let mut st = 0;
        unsafe { libc::waitpid(pid as i32, &mut st, 0) };
    }
}

fn clone_newuser() -> ! {
    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
    let r = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if r == 0 {
        unsafe { libc::_exit(0) };
    }
    reap(r);
    verdict("clone(CLONE_NEWUSER)", r)
}

fn clone3() -> ! {
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
    }
    let args = CloneArgs { exit_signal: libc::SIGCHLD as u64, ..Default::default() };
    let r = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    if r == 0 {
        unsafe { libc::_exit(0) };
    }
    reap(r);
    verdict("clone3", r)
}

fn setns() -> ! {
    let fd = unsafe { libc::open(c"/proc/self/ns/net".as_ptr(), libc::O_RDONLY) };
    if fd < 0 {
        error(&format!("open /proc/self/ns/net: errno {}", errno()));
    }
    verdict("setns(net)", unsafe { libc::setns(fd, 0) } as libc::c_long)
}

fn mount(target: &str) -> ! {
    let r = unsafe { libc::mount(c"tmpfs".as_ptr(), c(target).as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()) };
    if r == 0 {
        unsafe { libc::umount2(c(target).as_ptr(), libc::MNT_DETACH) };
    }
    verdict(&format!("mount tmpfs on {target}"), r as libc::c_long)
}

/// pivot_root into a fresh tmpfs. The control passes --own-ns so it never touches the host root.
fn pivot_root(own_ns: bool) -> ! {
    if own_ns {
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            error("unshare for the control");
        }
        unsafe {
            libc::mount(
                c"".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        // A tmpfs over /tmp first (this mount namespace's own): nothing lands on the host's disk.
        unsafe { libc::mount(c"tmpfs".as_ptr(), c"/tmp".as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()) };
        let dir = std::path::PathBuf::from(format!("/tmp/chio-pivot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = c(dir.to_str().unwrap());
        unsafe { libc::mount(c"tmpfs".as_ptr(), d.as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()) };
        unsafe { libc::chdir(d.as_ptr()) };
    }
    let r = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    verdict("pivot_root", r)
}

fn ptrace() -> ! {
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let r = unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
        unsafe { libc::_exit(if r == 0 { 0 } else { 100 + errno().min(100) }) };
    }
    let mut st = 0;
    unsafe { libc::waitpid(pid, &mut st, 0) };
    let code = libc::WEXITSTATUS(st);
    if code >= 100 {
        refused("ptrace(PTRACE_TRACEME)", code - 100);
    }
    escaped("ptrace(PTRACE_TRACEME)")
}

fn process_vm_readv() -> ! {
    let src = [7u8; 16];
    let mut dst = [0u8; 16];
    let local = libc::iovec { iov_base: dst.as_mut_ptr().cast(), iov_len: 16 };
    let remote = libc::iovec { iov_base: src.as_ptr() as *mut libc::c_void, iov_len: 16 };
    let r = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    verdict("process_vm_readv(self)", r as libc::c_long)
}

fn bpf() -> ! {
    // BPF_MAP_CREATE of a tiny array map.
    #[repr(C)]
    struct MapAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        pad: [u8; 112],
    }
    let attr = MapAttr { map_type: 2, key_size: 4, value_size: 4, max_entries: 1, pad: [0; 112] };
    let r = unsafe { libc::syscall(libc::SYS_bpf, 0, &attr as *const MapAttr, std::mem::size_of::<MapAttr>()) };
    verdict("bpf(BPF_MAP_CREATE)", r)
}

fn perf_event_open() -> ! {
    // struct perf_event_attr (size 128): type=PERF_TYPE_SOFTWARE(1), config=TASK_CLOCK(1),
    // flags: exclude_kernel (bit 5) | exclude_hv (bit 6).
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&1u32.to_le_bytes());
    attr[4..8].copy_from_slice(&128u32.to_le_bytes());
    attr[8..16].copy_from_slice(&1u64.to_le_bytes());
    attr[40..48].copy_from_slice(&((1u64 << 5) | (1u64 << 6)).to_le_bytes());
    let r = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0) };
    verdict("perf_event_open", r)
}

fn keyctl() -> ! {
    // KEYCTL_GET_KEYRING_ID (0) of the session keyring (-3), creating it.
    let r = unsafe { libc::syscall(libc::SYS_keyctl, 0, -3i64, 1) };
    verdict("keyctl(GET_KEYRING_ID)", r)
}

fn userfaultfd() -> ! {
    let r = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
    verdict("userfaultfd", r)
}

fn io_uring() -> ! {
    let mut params = [0u8; 120];
    let r = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    verdict("io_uring_setup", r)
}

/// TIOCSTI into a terminal. Inside the cage no pty device exists, so it goes at fd 0: a refusal
/// by seccomp is EPERM, while the kernel itself would answer ENOTTY for a non-terminal.
fn tiocsti(high_bit: bool) -> ! {
    let cmd: u64 = 0x5412 | if high_bit { 1 << 32 } else { 0 };
    let fd = open_pty_slave().unwrap_or(0);
    let ch = b'x';
    let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, cmd, &ch as *const u8) };
    verdict(&format!("ioctl(TIOCSTI{}) on fd {fd}", if high_bit { "|1<<32" } else { "" }), r)
}

fn open_pty_slave() -> Option<i32> {
    let m = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    if m < 0 || unsafe { libc::grantpt(m) } != 0 || unsafe { libc::unlockpt(m) } != 0 {
        return None;
    }
    let name = unsafe { libc::ptsname(m) };
    if name.is_null() {
        return None;
    }
    let s = unsafe { libc::open(name, libc::O_RDWR | libc::O_NOCTTY) };
    (s >= 0).then_some(s)
}

fn socket(family: &str) -> ! {
    let (domain, ty, proto) = match family {
        "netlink" => (libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
        "vsock" => (libc::AF_VSOCK, libc::SOCK_STREAM, 0),
        "packet" => (libc::AF_PACKET, libc::SOCK_RAW, (libc::ETH_P_ALL as u16).to_be() as i32),
        _ => error("socket netlink|vsock|packet"),
    };
    verdict(&format!("socket({family})"), unsafe { libc::socket(domain, ty, proto) } as libc::c_long)
}

fn raw_socket() -> ! {
    verdict("socket(AF_INET, SOCK_RAW)", unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) }
        as libc::c_long)
}

fn tcp_connect(addr: &str) -> ! {
    match std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), std::time::Duration::from_secs(2)) {
        Ok(_) => escaped(&format!("connected to {addr}")),
        Err(e) => refused(&format!("connect {addr}: {e}"), e.raw_os_error().unwrap_or(0)),
    }
}

fn tcp_bind(addr: &str) -> ! {
    match std::net::TcpListener::bind(addr) {
        Ok(_) => escaped(&format!("bound {addr}")),
        Err(e) => refused(&format!("bind {addr}: {e}"), e.raw_os_error().unwrap_or(0)),
    }
}

/// listen() on a TCP socket never bound: the kernel binds it to an ephemeral port itself
/// (autobind). Escaping means a listener came of it.
fn tcp_listen() -> ! {
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    if s < 0 {
        refused("socket", errno())
    }
    let r = unsafe { libc::listen(s, 1) };
    if r != 0 {
        refused("listen without bind", errno())
    }
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    unsafe { libc::getsockname(s, (&mut addr as *mut libc::sockaddr_in).cast(), &mut len) };
    escaped(&format!("listening on port {} without bind", u16::from_be(addr.sin_port)))
}

fn abstract_connect(name: &str) -> ! {
    let s = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as u16;
    for (i, b) in name.bytes().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as u32;
    let r = unsafe { libc::connect(s, (&addr as *const libc::sockaddr_un).cast(), len) };
    verdict(&format!("connect to abstract socket @{name}"), r as libc::c_long)
}

fn kill(pid: &str) -> ! {
    let pid: i32 = pid.parse().unwrap_or_else(|_| error("kill PID"));
    // Blocked here: a SIGTERM that reaches the cage's init is forwarded to us, and must not end
    // us before the verdict is printed.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    verdict(&format!("kill({pid}, SIGTERM)"), unsafe { libc::kill(pid, libc::SIGTERM) } as libc::c_long)
}

/// Control helper: drop to a uid/gid and exec a command (used to run setuid controls).
fn as_user(rest: &[String]) -> ! {
    let uid: u32 = arg(rest, 0).parse().unwrap_or_else(|_| error("as-user UID CMD…"));
    unsafe {
        libc::setgroups(0, std::ptr::null());
        libc::setresgid(uid, uid, uid);
        libc::setresuid(uid, uid, uid);
    }
    let mut cmd = std::process::Command::new(arg(rest, 1));
    cmd.args(&rest[2..]);
    let e = std::os::unix::process::CommandExt::exec(&mut cmd);
    error(&format!("exec: {e}"))
}

/// Escaping means the effective uid is 0 (a setuid binary gained root).
fn euid() -> ! {
    let e = unsafe { libc::geteuid() };
    if e == 0 {
        escaped("euid is 0")
    }
    refused(&format!("euid is {e}"), 0)
}

fn status_field(key: &str) -> String {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim_start_matches(':').trim().to_string()))
        .unwrap_or_default()
}

fn caps() -> ! {
    let fields = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
    let set: Vec<String> = fields.iter().map(|f| format!("{f}={}", status_field(f))).collect();
    if fields.iter().all(|f| u64::from_str_radix(&status_field(f), 16) == Ok(0)) {
        refused(&format!("all capability sets empty: {set:?}"), 0)
    }
    escaped(&format!("capabilities held: {set:?}"))
}

/// The securebits the cage sets and locks: NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE and
/// their locks, KEEP_CAPS locked off (0xef). Anything else means a root in the cage could
/// regain capabilities through exec or a setuid transition.
fn securebits() -> ! {
    let bits = unsafe { libc::prctl(libc::PR_GET_SECUREBITS) };
    if bits == 0xef {
        refused("securebits are 0xef (set and locked)", 0)
    }
    escaped(&format!("securebits are {bits:#x}, not 0xef"))
}

fn nnp() -> ! {
    let v = status_field("NoNewPrivs");
    if v == "1" {
        refused("NoNewPrivs is 1", 0)
    }
    escaped(&format!("NoNewPrivs is {v}"))
}

/// Try to create N live children; escaping means all of them exist at once.
fn fork_many(n: &str) -> ! {
    let n: usize = n.parse().unwrap_or_else(|_| error("fork-many N"));
    let mut kids = Vec::new();
    let mut err = 0;
    for _ in 0..n {
        match unsafe { libc::fork() } {
            0 => {
                unsafe { libc::pause() };
                unsafe { libc::_exit(0) }
            }
            -1 => {
                err = errno();
                break;
            }
            pid => kids.push(pid),
        }
    }
    let made = kids.len();
    for k in kids {
        unsafe { libc::kill(k, libc::SIGKILL) };
        reap(k as libc::c_long);
    }
    if made == n {
        escaped(&format!("created {n} processes"))
    }
    refused(&format!("created only {made} of {n} processes"), err)
}

/// Allocate and touch N MiB; escaping means all of it was resident.
fn alloc(mib: &str) -> ! {
    let mib: usize = mib.parse().unwrap_or_else(|_| error("alloc MIB"));
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        let mut v = Vec::new();
        if v.try_reserve_exact(1 << 20).is_err() {
            refused("allocation failed", libc::ENOMEM);
        }
        v.resize(1 << 20, 1u8);
        blocks.push(v);
    }
    escaped(&format!("allocated and touched {} MiB", blocks.len()))
}

/// Write N MiB to `path`; escaping means all of it was written.
fn fill(path: &str, mib: &str) -> ! {
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let mib: usize = mib.parse().unwrap_or_else(|_| error("fill PATH MIB"));
    let mut f = std::fs::File::create(path).unwrap_or_else(|e| error(&format!("create {path}: {e}")));
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..mib {
        if let Err(e) = f.write_all(&chunk).and_then(|_| f.sync_data()) {
            refused(&format!("write stopped after {i} MiB: {e}"), e.raw_os_error().unwrap_or(0));
        }
    }
    escaped(&format!("wrote {mib} MiB to {path}"))
}

fn flood(mib: &str) -> ! {
    let mib: usize = mib.parse().unwrap_or_else(|_| error("flood MIB"));
    let chunk = vec![b'y'; 1 << 20];
    let mut out = std::io::stdout().lock();
    for _ in 0..mib {
        if out.write_all(&chunk).is_err() {
            exit(1);
        }
    }
    exit(0)
}

/// Sleep forever with `tag` in argv; with --background, leave a setsid'd grandchild behind.
fn sleeper(tag: &str, background: bool) -> ! {
    let _ = tag;
    if background && unsafe { libc::fork() } == 0 {
        unsafe { libc::setsid() };
        if unsafe { libc::fork() } == 0 {
            loop {
                unsafe { libc::pause() };
            }
        }
        unsafe { libc::_exit(0) };
    }
    println!("SLEEPING");
    let _ = std::io::stdout().flush();
    loop {
        unsafe { libc::pause() };
    }
}

fn mknod(path: &str) -> ! {
    let dev = libc::makedev(8, 0);
    verdict(&format!("mknod {path} b 8 0"), unsafe { libc::mknod(c(path).as_ptr(), libc::S_IFBLK | 0o600, dev) }
        as libc::c_long)
}

fn chroot(path: &str) -> ! {
    verdict(&format!("chroot {path}"), unsafe { libc::chroot(c(path).as_ptr()) } as libc::c_long)
}

fn sethostname(own_ns: bool) -> ! {
    if own_ns && unsafe { libc::unshare(libc::CLONE_NEWUTS) } != 0 {
        error("unshare(NEWUTS) for the control");
    }
    verdict("sethostname", unsafe { libc::sethostname(c"escaped".as_ptr(), 7) } as libc::c_long)
}

/// Write a sysctl through /proc/sys (the UTS hostname, so the control can use its own namespace).
fn write_sysctl(own_ns: bool) -> ! {
    if own_ns && unsafe { libc::unshare(libc::CLONE_NEWUTS) } != 0 {
        error("unshare(NEWUTS) for the control");
    }
    write_file("/proc/sys/kernel/hostname")
}

/// The "shocker" attack: name_to_handle_at + open_by_handle_at bypass path checks.
fn open_by_handle(path: &str) -> ! {
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        data: [u8; 128],
    }
    let mut h = Handle { bytes: 128, kind: 0, data: [0; 128] };
    let mut mount_id = 0;
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c(path).as_ptr(),
            &mut h as *mut Handle,
            &mut mount_id,
            0,
        )
    };
    if r < 0 {
        refused("name_to_handle_at", errno());
    }
    let root = unsafe { libc::open(c"/".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    let fd = unsafe { libc::syscall(libc::SYS_open_by_handle_at, root, &mut h as *mut Handle, libc::O_RDONLY) };
    verdict("open_by_handle_at", fd)
}

fn stat(path: &str) -> ! {
    match std::fs::symlink_metadata(path) {
        Ok(_) => escaped(&format!("{path} exists")),
        Err(e) => refused(&format!("stat {path}: {e}"), e.raw_os_error().unwrap_or(0)),
    }
}

fn dump_status() -> ! {
    let mut s = String::new();
    std::fs::File::open("/proc/self/status").and_then(|mut f| f.read_to_string(&mut s)).unwrap();
    print!("{s}");
    let _ = std::ffi::OsStr::new("").as_bytes();
    exit(0)
}

/// Create `path` as one kind of file with the one call that needs only that kind's right (no
/// open for writing): reg, dir, fifo, sym, sock, chr, blk.
fn create(kind: &str, path: &str) -> ! {
    let p = c(path);
    let r = unsafe {
        match kind {
            "reg" => libc::mknod(p.as_ptr(), libc::S_IFREG | 0o644, 0),
            "dir" => libc::mkdir(p.as_ptr(), 0o755),
            "fifo" => libc::mkfifo(p.as_ptr(), 0o644),
            "sym" => libc::symlink(c("target").as_ptr(), p.as_ptr()),
            "chr" => libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)),
            "blk" => libc::mknod(p.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(8, 0)),
            // A whiteout (char 0:0): the one device node Linux lets anyone make.
            "whiteout" => libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(0, 0)),
            "sock" => {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let mut addr: libc::sockaddr_un = std::mem::zeroed();
                addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
                for (i, b) in path.bytes().take(addr.sun_path.len() - 1).enumerate() {
                    addr.sun_path[i] = b as libc::c_char;
                }
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len)
            }
            _ => error("create reg|dir|fifo|sym|sock|chr|blk|whiteout PATH"),
        }
    };
    verdict(&format!("create {kind} {path}"), r as libc::c_long)
}

fn symlink(target: &str, path: &str) -> ! {
    verdict(&format!("symlink {path} -> {target}"), unsafe { libc::symlink(c(target).as_ptr(), c(path).as_ptr()) }
        as libc::c_long)
}

/// Escaping means `path` ends up with a set-user-id or set-group-id bit, made through `how`.
fn setid(how: &str, path: &str) -> ! {
    let p = c(path);
    let mode: libc::mode_t = if how == "mkdir" || how == "mkdirat" { 0o2755 } else { 0o4755 };
    // Files for the chmod family exist first; the others create it with the mode.
    if how.starts_with("chmod") || how.starts_with("fchmod") {
        std::fs::write(path, b"x").unwrap_or_else(|e| error(&format!("create {path}: {e}")));
    }
    let r: libc::c_long = unsafe {
        match how {
            "chmod" => libc::chmod(p.as_ptr(), mode) as libc::c_long,
            "fchmod" => {
                let fd = libc::open(p.as_ptr(), libc::O_RDONLY);
                libc::fchmod(fd, mode) as libc::c_long
            }
            "fchmodat" => libc::syscall(libc::SYS_fchmodat, libc::AT_FDCWD, p.as_ptr(), mode),
            "fchmodat2" => libc::syscall(libc::SYS_fchmodat2, libc::AT_FDCWD, p.as_ptr(), mode, 0),
            "open" => libc::syscall(libc::SYS_open, p.as_ptr(), libc::O_CREAT | libc::O_WRONLY, mode),
            "openat" => {
                libc::syscall(libc::SYS_openat, libc::AT_FDCWD, p.as_ptr(), libc::O_CREAT | libc::O_WRONLY, mode)
            }
            "creat" => libc::syscall(libc::SYS_creat, p.as_ptr(), mode),
            "openat2" => {
                #[repr(C)]
                struct How {
                    flags: u64,
                    mode: u64,
                    resolve: u64,
                }
                let how = How { flags: (libc::O_CREAT | libc::O_WRONLY) as u64, mode: mode as u64, resolve: 0 };
                libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, p.as_ptr(), &how as *const How, 24usize)
            }
            "mkdir" => libc::mkdir(p.as_ptr(), mode) as libc::c_long,
            "mkdirat" => libc::syscall(libc::SYS_mkdirat, libc::AT_FDCWD, p.as_ptr(), mode),
            "mknod" => libc::syscall(libc::SYS_mknod, p.as_ptr(), libc::S_IFREG | mode, 0),
            "mknodat" => libc::syscall(libc::SYS_mknodat, libc::AT_FDCWD, p.as_ptr(), libc::S_IFREG | mode, 0),
            _ => error(
                "setid chmod|fchmod|fchmodat|fchmodat2|open|openat|openat2|creat|mkdir|mkdirat|mknod|mknodat PATH",
            ),
        }
    };
    if r < 0 {
        refused(&format!("{how} {path} {mode:o}"), errno());
    }
    let got = std::fs::symlink_metadata(path).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
    match got {
        Ok(m) if m & 0o6000 != 0 => escaped(&format!("{path} has mode {m:o} via {how}")),
        Ok(m) => refused(&format!("{how} {path}: mode is {m:o}, no set-id bit"), 0),
        Err(e) => refused(&format!("{how} {path}: {e}"), e.raw_os_error().unwrap_or(0)),
    }
}

fn chmod(path: &str, mode: &str) -> ! {
    let mode = libc::mode_t::from_str_radix(mode, 8).unwrap_or_else(|_| error("chmod PATH OCTAL"));
    verdict(&format!("chmod {mode:o} {path}"), unsafe { libc::chmod(c(path).as_ptr(), mode) } as libc::c_long)
}

/// Set a file's times to now (needs write access or ownership).
fn touch_times(path: &str) -> ! {
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c(path).as_ptr(), std::ptr::null(), 0) };
    verdict(&format!("utimensat {path}"), r as libc::c_long)
}

/// Escaping means `path` is the file whose identity is `DEV:INO` (a host inode shared with the cage).
fn same_inode(path: &str, id: &str) -> ! {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap_or_else(|e| error(&format!("stat {path}: {e}")));
    let here = format!("{}:{}", m.dev(), m.ino());
    if here == id {
        escaped(&format!("{path} is the host's inode {id}"))
    }
    refused(&format!("{path} is {here}, not the host's {id}"), 0)
}

fn io_setup() -> ! {
    let mut ctx: libc::c_ulong = 0;
    verdict("io_setup(64)", unsafe { libc::syscall(libc::SYS_io_setup, 64, &mut ctx) })
}

/// Queue N real-time signals to ourselves (blocked, so they stay pending); escaping means every
/// one was queued, i.e. the per-uid pending-signal pool was the cage's to drain.
fn sigqueue(n: &str) -> ! {
    let n: usize = n.parse().unwrap_or_else(|_| error("sigqueue N"));
    let sig = libc::SIGRTMIN();
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    for i in 0..n {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        info.si_signo = sig;
        info.si_code = libc::SI_QUEUE;
        let r =
            unsafe { libc::syscall(libc::SYS_rt_sigqueueinfo, libc::getpid(), sig, &info as *const libc::siginfo_t) };
        if r < 0 {
            refused(&format!("queued only {i} of {n} signals"), errno());
        }
    }
    escaped(&format!("queued {n} signals"))
}

fn socket_raw(family: &str, kind: &str, proto: &str) -> ! {
    let n = |s: &str| s.parse::<i32>().unwrap_or_else(|_| error("socket-raw FAMILY TYPE PROTO"));
    let (f, t, p) = (n(family), n(kind), n(proto));
    verdict(&format!("socket({f}, {t}, {p})"), unsafe { libc::socket(f, t, p) } as libc::c_long)
}

/// Change the open-file limit of process `pid` (to its current value).
fn prlimit(pid: &str) -> ! {
    let pid: i32 = pid.parse().unwrap_or_else(|_| error("prlimit PID"));
    let mut old: libc::rlimit = unsafe { std::mem::zeroed() };
    if unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) } != 0 {
        refused(&format!("prlimit({pid}) read"), errno());
    }
    let new = libc::rlimit { rlim_cur: 64, rlim_max: old.rlim_max };
    verdict(&format!("prlimit({pid}, NOFILE)"), unsafe {
        libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut())
    } as libc::c_long)
}

/// Reserve N MiB beyond the end of an empty file (FALLOC_FL_KEEP_SIZE): disk taken that no
/// file size shows.
fn fallocate_keep(path: &str, mib: &str) -> ! {
    let mib: i64 = mib.parse().unwrap_or_else(|_| error("fallocate-keep PATH MIB"));
    let f = std::fs::File::create(path).unwrap_or_else(|e| error(&format!("create {path}: {e}")));
    let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), libc::FALLOC_FL_KEEP_SIZE, 0, mib << 20) };
    verdict(&format!("fallocate(KEEP_SIZE, {mib} MiB) of {path}"), r as libc::c_long)
}

/// Open `path` for reading (or end the probe with an error).
fn open_read(path: &str) -> std::fs::File {
    std::fs::File::open(path).unwrap_or_else(|e| error(&format!("open {path}: {e}")))
}

/// posix_fadvise(path, ADVICE) over the whole file; escaping means the advice was taken
/// (DONTNEED and NOREUSE evict the file's cached pages, the host's too for a shared file).
fn fadvise(path: &str, advice: &str) -> ! {
    let advice: libc::c_long = advice.parse().unwrap_or_else(|_| error("fadvise PATH ADVICE"));
    let f = open_read(path);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    verdict(&format!("fadvise({path}, {advice})"), unsafe { libc::syscall(libc::SYS_fadvise64, fd, 0, 0, advice) })
}

/// readahead of the first 64 KiB of `path`; escaping means it filled the page cache at will.
fn readahead(path: &str) -> ! {
    let f = open_read(path);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    verdict(&format!("readahead({path})"), unsafe { libc::syscall(libc::SYS_readahead, fd, 0, 65536) })
}

/// mincore over a shared mapping of `path`'s first page; escaping means the residency of a
/// (possibly shared) file's pages could be read.
fn mincore(path: &str) -> ! {
    let f = open_read(path);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let mut vec = [0u8; 1];
    let r = unsafe {
        let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd, 0);
        if p == libc::MAP_FAILED {
            error(&format!("mmap {path}"));
        }
        libc::syscall(libc::SYS_mincore, p, 4096, vec.as_mut_ptr())
    };
    verdict(&format!("mincore({path})"), r)
}

/// sync and syncfs: "escaping" here only means both answered 0, as programs expect.
fn sync_all() -> ! {
    let root = open_read("/");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&root);
    let r = unsafe { libc::syscall(libc::SYS_sync) };
    if r != 0 {
        verdict("sync", r)
    }
    verdict("sync and syncfs", unsafe { libc::syscall(libc::SYS_syncfs, fd) })
}

/// Escaping means something could be read from stdin.
fn read_stdin() -> ! {
    let mut buf = [0u8; 256];
    let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
    if n > 0 {
        escaped(&format!("read {:?} from stdin", String::from_utf8_lossy(&buf[..n as usize])))
    }
    refused(&format!("stdin gave {n}"), if n < 0 { errno() } else { 0 })
}

/// Escaping means stdin is a terminal.
fn stdin_tty() -> ! {
    if unsafe { libc::isatty(0) } == 1 {
        escaped("stdin is a terminal")
    }
    refused("stdin is not a terminal", errno())
}

/// As a script's interpreter: rename `from` over `to` (a concurrent swap after the script was
/// hashed), then read `script` as an interpreter would. Escaping means the swapped-in file is read.
fn swap_then_read(script: &str, from: &str, to: &str) -> ! {
    std::fs::rename(from, to).unwrap_or_else(|e| error(&format!("rename {from} {to}: {e}")));
    let text = std::fs::read_to_string(script).unwrap_or_else(|e| error(&format!("read {script}: {e}")));
    if text.contains("EVIL") {
        escaped(&format!("{script} read the swapped-in file"))
    }
    refused(&format!("{script} is the file that was hashed"), 0)
}

/// Control helper: become root of a new user namespace (mapped to the caller's uid and gid, so
/// no privilege the caller did not have) and exec a command there. What an unprivileged user
/// can do this way, the cage must still refuse.
fn userns(rest: &[String]) -> ! {
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // Network and mount namespaces too: capabilities over the host's would not come with the
    // user namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        error(&format!("unshare(CLONE_NEWUSER): errno {}", errno()));
    }
    for (file, text) in [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("0 {uid} 1")),
        ("/proc/self/gid_map", format!("0 {gid} 1")),
    ] {
        std::fs::write(file, text).unwrap_or_else(|e| error(&format!("{file}: {e}")));
    }
    if unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS) } != 0 {
        error(&format!("unshare(CLONE_NEWNET|CLONE_NEWNS): errno {}", errno()));
    }
    let mut cmd = std::process::Command::new(arg(rest, 0));
    cmd.args(&rest[1..]);
    let e = std::os::unix::process::CommandExt::exec(&mut cmd);
    error(&format!("exec: {e}"))
}

/// Not a probe: run `argv` where the syscall numbers in `list` (comma-separated) fail with
/// ENOSYS — a kernel without them, as far as the program can tell (x86_64 only; anything else
/// is killed).
fn without(list: &str, argv: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    let nrs: Vec<u32> = list.split(',').map(|n| n.parse().unwrap_or_else(|_| error("a syscall number"))).collect();
    let n = nrs.len();
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let mut prog = vec![
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        libc::sock_filter { jt: 1, ..stmt(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, AUDIT_ARCH_X86_64) },
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
    ];
    for (i, nr) in nrs.iter().enumerate() {
        // A match jumps over the other comparisons and the ALLOW to the ERRNO.
        prog.push(libc::sock_filter { jt: (n - i) as u8, ..stmt(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, *nr) });
    }
    prog.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW));
    prog.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
    // SAFETY: the program outlives the call; the kernel copies it.
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog as *const libc::sock_fprog) } != 0 {
        error(&format!("seccomp filter: errno={}", errno()));
    }
    let Some((program, args)) = argv.split_first() else { error("no command") };
    let e = std::process::Command::new(program).args(args).exec();
    error(&format!("exec {program}: {e}"))
}
