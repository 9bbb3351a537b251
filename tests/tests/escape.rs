//! The escape suite: every probe runs inside a real cage and must be refused, and runs again as a
//! control without that restriction (on the host, as root, or in a namespace of its own) where it
//! must succeed — so no probe passes by being broken.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chio_tests::Control::{Nobody, NobodyInUserns, Root};
use chio_tests::{
    assert_escaped, build_symlinked_rootfs, cage, copy_executable, host, host_as, parse, processes_tagged, wait_gone,
    Scratch, Suite,
};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn env(test: &str) -> Option<Suite> {
    Suite::new(test, PROBE)
}

/// A syscall probe refused in the cage with `errno`; its control runs the same call as `who`
/// (the cage's uid without the cage, or in a user namespace of its own where capabilities are
/// needed; root only where the host refuses unprivileged users and says why).
macro_rules! syscall_probe {
    ($name:ident, $args:expr, $errno:expr, $who:expr) => {
        #[test]
        fn $name() {
            let Some(e) = env(stringify!($name)) else { return };
            e.pair_as(stringify!($name), $args, $errno, $who, $args);
        }
    };
}

// ---- filesystem -------------------------------------------------------------------------

#[test]
fn write_to_root_is_refused() {
    let Some(e) = env("write_to_root") else { return };
    let s = Scratch::new("write-root");
    s.give_to_nobody();
    let control = s.join("escaped");
    e.pair_with(
        "write /",
        &[],
        &["write", "/escaped"],
        Some(libc::EROFS),
        Nobody,
        &["write", control.to_str().unwrap()],
    );
}

#[test]
fn write_into_image_directory_is_refused() {
    let Some(e) = env("write_into_image") else { return };
    let s = Scratch::new("write-lib");
    s.give_to_nobody();
    let control = s.join("escaped");
    e.pair_with(
        "write /lib",
        &[],
        &["write", "/lib/escaped"],
        Some(libc::EROFS),
        Nobody,
        &["write", control.to_str().unwrap()],
    );
}

#[test]
fn host_files_outside_the_binds_are_invisible() {
    let Some(e) = env("host_files") else { return };
    let s = Scratch::new("secret");
    let secret = s.join("secret.txt");
    std::fs::write(&secret, "host-secret").unwrap();
    let p = secret.to_str().unwrap();
    e.pair_with("read host file", &[], &["read", p], Some(libc::ENOENT), Nobody, &["read", p]);
}

#[test]
fn host_shadow_is_not_readable_on_the_default_root() {
    let Some(e) = env("host_shadow") else { return };
    let bind = format!("{}:/probe", e.probe.display());
    // As uid 0, which may read the host's shadow: the cage's own effect is that it is absent.
    let run = cage(&e.chio, &["--ro-bind", &bind, "--uid", "0", "--gid", "0"], &["/probe", "read", "/etc/shadow"]);
    assert_eq!(run.assert_refused("read /etc/shadow"), libc::ENOENT);
    // Control as root: the host refuses /etc/shadow to every other uid.
    assert_escaped(
        "read /etc/shadow",
        host_as(Root("shadow is readable by root only"), &e.probe, &["read", "/etc/shadow"]),
    );
}

#[test]
fn exec_from_tmp_is_refused() {
    let Some(e) = env("exec_tmp") else { return };
    let s = Scratch::new("exec-tmp");
    s.give_to_nobody();
    let control = s.join("x");
    e.pair_with(
        "exec /tmp",
        &[],
        &["exec-copy", "/tmp/x"],
        Some(libc::EACCES),
        Nobody,
        &["exec-copy", control.to_str().unwrap()],
    );
}

#[test]
fn exec_from_dev_shm_is_refused() {
    let Some(e) = env("exec_shm") else { return };
    let s = Scratch::new("exec-shm");
    s.give_to_nobody();
    let control = s.join("x");
    e.pair_with(
        "exec /dev/shm",
        &[],
        &["exec-copy", "/dev/shm/x"],
        Some(libc::EACCES),
        Nobody,
        &["exec-copy", control.to_str().unwrap()],
    );
}

#[test]
fn exec_from_memfd_is_refused() {
    let Some(e) = env("exec_memfd") else { return };
    e.pair_as("exec memfd", &["exec-memfd"], libc::EACCES, Nobody, &["exec-memfd"]);
}

#[test]
fn absolute_symlink_in_workspace_stays_inside() {
    let Some(e) = env("ws_symlink_abs") else { return };
    let ws = Scratch::new("ws-abs");
    let host_dir = Scratch::new("ws-abs-target");
    std::fs::write(host_dir.join("chio-host-marker"), "host").unwrap();
    std::os::unix::fs::symlink(&host_dir.0, ws.join("escape")).unwrap();
    let w = ws.0.to_str().unwrap();
    e.pair_with(
        "absolute symlink",
        &["--workspace", w],
        &["read", "/workspace/escape/chio-host-marker"],
        Some(libc::ENOENT),
        Nobody,
        &["read", ws.join("escape/chio-host-marker").to_str().unwrap()],
    );
}

#[test]
fn dotdot_symlink_in_workspace_stays_inside() {
    let Some(e) = env("ws_symlink_up") else { return };
    let ws = Scratch::new("ws-up");
    let host_dir = Scratch::new("ws-up-target");
    std::fs::write(host_dir.join("chio-host-marker"), "host").unwrap();
    let up = format!("../../../../../../../..{}", host_dir.0.display());
    std::os::unix::fs::symlink(&up, ws.join("up")).unwrap();
    let w = ws.0.to_str().unwrap();
    e.pair_with(
        "../ symlink",
        &["--workspace", w],
        &["read", "/workspace/up/chio-host-marker"],
        Some(libc::ENOENT),
        Nobody,
        &["read", ws.join("up/chio-host-marker").to_str().unwrap()],
    );
}

#[test]
fn hardlink_from_workspace_to_image_is_refused() {
    let Some(e) = env("hardlink") else { return };
    let ws = Scratch::new("ws-link");
    ws.give_to_nobody();
    std::fs::write(ws.join("src"), "x").unwrap();
    std::os::unix::fs::chown(ws.join("src"), Some(65534), Some(65534)).unwrap();
    let w = ws.0.to_str().unwrap();
    e.pair_with(
        "hardlink out",
        &["--workspace", w],
        &["hardlink", "/probe", "/workspace/stolen"],
        Some(libc::EXDEV),
        Nobody,
        &["hardlink", ws.join("src").to_str().unwrap(), ws.join("dst").to_str().unwrap()],
    );
}

/// An image whose /proc, /dev and /tmp are symlinks to host directories.
struct Hostile {
    rootfs: Scratch,
    host: Scratch,
}

fn hostile(e: &Suite) -> Hostile {
    let rootfs = Scratch::new("hostile-rootfs");
    let host = Scratch::new("hostile-host");
    build_symlinked_rootfs(&rootfs.join("root"), &e.probe, &host.0);
    Hostile { rootfs, host }
}

#[test]
fn image_proc_symlink_does_not_redirect_procfs() {
    let Some(e) = env("proc_symlink") else { return };
    let h = hostile(&e);
    let root = h.rootfs.join("root");
    let run = cage(&e.chio, &["--rootfs", root.to_str().unwrap()], &["/probe", "is-procfs", "/proc"]);
    run.assert_refused("/proc symlink");
    assert_escaped("/proc symlink", host_as(Nobody, &e.probe, &["is-procfs", root.join("proc").to_str().unwrap()]));
}

#[test]
fn image_dev_symlink_does_not_redirect_dev() {
    let Some(e) = env("dev_symlink") else { return };
    let h = hostile(&e);
    let root = h.rootfs.join("root");
    let run = cage(&e.chio, &["--rootfs", root.to_str().unwrap()], &["/probe", "stat", "/dev/chio-host-marker"]);
    assert_eq!(run.assert_refused("/dev symlink"), libc::ENOENT);
    assert_escaped(
        "/dev symlink",
        host_as(Nobody, &e.probe, &["stat", root.join("dev/chio-host-marker").to_str().unwrap()]),
    );
}

#[test]
fn image_tmp_symlink_does_not_redirect_tmp() {
    let Some(e) = env("tmp_symlink") else { return };
    let h = hostile(&e);
    let root = h.rootfs.join("root");
    let run = cage(&e.chio, &["--rootfs", root.to_str().unwrap()], &["/probe", "stat", "/tmp/chio-host-marker"]);
    assert_eq!(run.assert_refused("/tmp symlink"), libc::ENOENT);
    // A write to /tmp lands in the cage's tmpfs, never in the host directory.
    let w = cage(&e.chio, &["--rootfs", root.to_str().unwrap()], &["/probe", "write", "/tmp/written"]);
    assert!(w.stdout.starts_with("ESCAPED"), "writing the cage's own /tmp works: {}", w.stdout);
    assert!(!h.host.join("tmp/written").exists(), "the write went through the image's /tmp symlink");
    assert_escaped(
        "/tmp symlink",
        host_as(Nobody, &e.probe, &["stat", root.join("tmp/chio-host-marker").to_str().unwrap()]),
    );
}

// ---- leaked fds and /proc ----------------------------------------------------------------

/// Run chio (or the probe, for the control) with fd 7 open on the host's `/`.
fn with_leaked_fd(program: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = String::from("exec 7</; exec \"$0\"");
    for i in 1..=args.len() {
        cmd.push_str(&format!(" \"${i}\""));
    }
    Command::new("/bin/sh").arg("-c").arg(cmd).arg(program).args(args).stdin(Stdio::null()).output().unwrap()
}

#[test]
fn no_supervisor_fd_reaches_the_target() {
    let Some(e) = env("leaked_fds") else { return };
    let root = e.rootfs.to_str().unwrap();
    let run = parse(with_leaked_fd(&e.chio, &["cage", "run", "--json", "--rootfs", root, "--", "/probe", "fds"]));
    run.assert_refused("leaked fds");
    let out = with_leaked_fd(&e.probe, &["fds"]);
    assert_escaped("leaked fds", (out.status.code().unwrap(), String::from_utf8_lossy(&out.stdout).into_owned()));
}

#[test]
fn cwd_through_a_leaked_fd_is_impossible() {
    let Some(e) = env("fd_walk") else { return };
    let root = e.rootfs.to_str().unwrap();
    let run = parse(with_leaked_fd(&e.chio, &["cage", "run", "--json", "--rootfs", root, "--", "/probe", "fd-walk"]));
    assert_eq!(run.assert_refused("fd walk"), libc::EBADF);
    let out = with_leaked_fd(&e.probe, &["fd-walk"]);
    assert_escaped("fd walk", (out.status.code().unwrap(), String::from_utf8_lossy(&out.stdout).into_owned()));
}

/// A host process of uid 65534 whose /proc entries the controls (run as 65534) read.
fn host_sleeper() -> std::process::Child {
    Command::new(PROBE).args(["as-user", "65534", "/bin/sleep", "30"]).spawn().unwrap()
}

#[test]
fn proc_1_exe_of_the_init_is_not_readable() {
    let Some(e) = env("proc1_exe") else { return };
    let mut other = host_sleeper();
    let control = format!("/proc/{}/exe", other.id());
    e.pair_with("read /proc/1/exe", &[], &["read", "/proc/1/exe"], Some(libc::EACCES), Nobody, &["read", &control]);
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn proc_self_exe_is_not_writable() {
    let Some(e) = env("proc_self_exe") else { return };
    let s = Scratch::new("self-exe");
    let copy = s.join("probe-copy");
    copy_executable(&e.probe, &copy);
    std::os::unix::fs::chown(&copy, Some(65534), Some(65534)).unwrap();
    e.pair_with(
        "write /proc/self/exe",
        &[],
        &["open-write", "/proc/self/exe"],
        None,
        Nobody,
        &["open-write", copy.to_str().unwrap()],
    );
}

#[test]
fn proc_1_root_does_not_lead_out() {
    let Some(e) = env("proc1_root") else { return };
    let mut other = host_sleeper();
    let control = format!("/proc/{}/root/etc/hostname", other.id());
    let args = ["read", "/proc/1/root/etc/hostname"];
    e.pair_with("read /proc/1/root", &[], &args, Some(libc::EACCES), Nobody, &["read", &control]);
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn sys_is_not_mounted() {
    let Some(e) = env("sys") else { return };
    e.pair_with("stat /sys", &[], &["stat", "/sys/fs/cgroup"], Some(libc::ENOENT), Nobody, &["stat", "/sys/fs/cgroup"]);
}

#[test]
fn host_block_devices_are_absent() {
    let Some(e) = env("devices") else { return };
    let dev = ["/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/mem", "/dev/kmsg"]
        .into_iter()
        .find(|d| Path::new(d).exists())
        .unwrap();
    e.pair_with("host device", &[], &["stat", dev], Some(libc::ENOENT), Nobody, &["stat", dev]);
}

// ---- system calls ------------------------------------------------------------------------

syscall_probe!(unshare_user_namespace, &["unshare", "user"], libc::EPERM, Nobody);
syscall_probe!(unshare_mount_namespace, &["unshare", "mnt"], libc::EPERM, NobodyInUserns);
syscall_probe!(unshare_net_namespace, &["unshare", "net"], libc::EPERM, NobodyInUserns);
syscall_probe!(clone_with_new_namespace, &["clone-newuser"], libc::EPERM, Nobody);
syscall_probe!(clone3_is_enosys, &["clone3"], libc::ENOSYS, Nobody);
syscall_probe!(
    setns_is_refused,
    &["setns"],
    libc::EPERM,
    Root("setns into another net namespace needs CAP_SYS_ADMIN over it")
);
syscall_probe!(ptrace_is_refused, &["ptrace"], libc::EPERM, Nobody);
syscall_probe!(process_vm_readv_is_refused, &["process-vm-readv"], libc::EPERM, Nobody);
syscall_probe!(bpf_is_refused, &["bpf"], libc::EPERM, Root("kernel.unprivileged_bpf_disabled"));
syscall_probe!(perf_event_open_is_refused, &["perf-event-open"], libc::EPERM, Nobody);
syscall_probe!(keyctl_is_refused, &["keyctl"], libc::EPERM, Nobody);
syscall_probe!(userfaultfd_is_refused, &["userfaultfd"], libc::EPERM, Root("vm.unprivileged_userfaultfd=0"));
syscall_probe!(io_uring_is_enosys, &["io-uring"], libc::ENOSYS, Nobody);
syscall_probe!(
    tiocsti_is_refused,
    &["tiocsti"],
    libc::EPERM,
    Root("dev.tty.legacy_tiocsti=0 refuses unprivileged TIOCSTI")
);
syscall_probe!(tiocsti_high_bit_is_refused, &["tiocsti-highbit"], libc::EPERM, Root("dev.tty.legacy_tiocsti=0"));
syscall_probe!(netlink_socket_is_refused, &["socket", "netlink"], libc::EPERM, Nobody);
syscall_probe!(vsock_socket_is_refused, &["socket", "vsock"], libc::EPERM, Nobody);
syscall_probe!(packet_socket_is_refused, &["socket", "packet"], libc::EPERM, NobodyInUserns);
syscall_probe!(raw_socket_is_refused, &["raw-socket"], libc::EPERM, NobodyInUserns);
syscall_probe!(
    setuid_root_is_refused,
    &["setuid0"],
    libc::EPERM,
    Root("only root may become root: the cage's own effect is running as 65534")
);
syscall_probe!(chroot_is_refused, &["chroot", "/"], libc::EPERM, NobodyInUserns);

#[test]
fn mount_is_refused() {
    let Some(e) = env("mount") else { return };
    let s = Scratch::new("mount");
    e.pair_as("mount", &["mount", "/tmp"], libc::EPERM, NobodyInUserns, &["mount", s.0.to_str().unwrap()]);
}

#[test]
fn pivot_root_is_refused() {
    let Some(e) = env("pivot_root") else { return };
    e.pair_as("pivot_root", &["pivot-root"], libc::EPERM, NobodyInUserns, &["pivot-root", "--own-ns"]);
}

#[test]
fn sethostname_is_refused() {
    let Some(e) = env("sethostname") else { return };
    e.pair_as("sethostname", &["sethostname"], libc::EPERM, NobodyInUserns, &["sethostname", "--own-ns"]);
}

#[test]
fn uid_0_in_the_cage_cannot_write_sysctls() {
    let Some(e) = env("sysctl") else { return };
    // The cage's procfs is read-only as a whole (EROFS), in front of the sysctl's own
    // capability check (EACCES).
    e.pair(
        "write /proc/sys",
        &["--uid", "0", "--gid", "0"],
        &["write-sysctl"],
        Some(libc::EROFS),
        &["write-sysctl", "--own-ns"],
    );
}

#[test]
fn mknod_is_refused() {
    let Some(e) = env("mknod") else { return };
    let s = Scratch::new("mknod");
    let control = s.join("disk");
    let who = Root("device nodes need CAP_MKNOD over the host, which no unprivileged user has");
    e.pair_as("mknod", &["mknod", "/tmp/disk"], libc::EACCES, who, &["mknod", control.to_str().unwrap()]);
}

#[test]
fn open_by_handle_is_refused() {
    let Some(e) = env("open_by_handle") else { return };
    let s = Scratch::new("handle");
    std::fs::write(s.join("f"), "x").unwrap();
    e.pair(
        "open_by_handle_at",
        &[],
        &["open-by-handle", "/probe"],
        Some(libc::EPERM),
        &["open-by-handle", s.join("f").to_str().unwrap()],
    );
}

// ---- network, IPC and signals ------------------------------------------------------------

#[test]
fn tcp_to_host_loopback_is_refused() {
    let Some(e) = env("tcp_host") else { return };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let run = e.caged(&["--net", "loopback"], &["tcp-connect", &addr]);
    run.assert_refused("tcp to host");
    assert_escaped("tcp to host", host_as(Nobody, &e.probe, &["tcp-connect", &addr]));
}

#[test]
fn tcp_bind_is_refused_by_landlock() {
    let Some(e) = env("tcp_bind") else { return };
    let run = e.caged(&["--net", "loopback"], &["tcp-bind", "127.0.0.1:8080"]);
    assert_eq!(run.assert_refused("tcp bind"), libc::EACCES);
    assert_escaped("tcp bind", host_as(Nobody, &e.probe, &["tcp-bind", "127.0.0.1:0"]));
}

/// Landlock's bind denial means no listener: a TCP socket that listens without ever binding
/// (the kernel would pick it a port itself) is refused, with loopback up or not. Control: as the
/// cage's uid on the host, it listens.
#[test]
fn a_tcp_listener_without_a_bind_is_refused() {
    let Some(e) = env("tcp_listen_autobind") else { return };
    for net in ["loopback", "none"] {
        let run = e.caged(&["--net", net], &["tcp-listen"]);
        assert_eq!(run.assert_refused("listen without bind"), libc::EADDRINUSE, "--net {net}");
    }
    assert_escaped("listen without bind", host_as(Nobody, &e.probe, &["tcp-listen"]));
}

/// The cage's ephemeral range is all reserved, and its two ends differ in parity: the kernel
/// logs "prefer different parity" for every write of a range whose ends do not (a line in the
/// host's kernel log per launch, and ~1 ms of console output in the cage's init).
#[test]
fn the_cages_ephemeral_range_is_reserved_and_draws_no_kernel_warning() {
    let Some(e) = env("ephemeral_range") else { return };
    let read = |path: &str| {
        let run = e.caged(&[], &["cat", path]);
        assert_eq!(run.code, 0, "cat {path}: {}", run.stderr);
        run.stdout.trim().to_string()
    };
    let range: Vec<u32> =
        read("/proc/sys/net/ipv4/ip_local_port_range").split_whitespace().map(|p| p.parse().unwrap()).collect();
    let [low, high] = range[..] else { panic!("the range {range:?} is not two ports") };
    assert_ne!(low % 2, high % 2, "the range {low}-{high} has ends of the same parity");
    assert_eq!(read("/proc/sys/net/ipv4/ip_local_reserved_ports"), format!("{low}-{high}"));
}

#[test]
fn abstract_unix_socket_on_host_is_unreachable() {
    let Some(e) = env("abstract") else { return };
    let name = format!("chio-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _l = UnixListener::bind_addr(&addr).unwrap();
    e.pair_with("abstract socket", &[], &["abstract-connect", &name], None, Nobody, &["abstract-connect", &name]);
}

#[test]
fn host_processes_cannot_be_signalled() {
    let Some(e) = env("kill_host") else { return };
    let mut victim = Command::new(&e.probe).args(["as-user", "65534", "/bin/sleep", "60"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let pid = victim.id().to_string();
    let run = e.caged(&[], &["kill", &pid]);
    assert_eq!(run.assert_refused("kill host"), libc::ESRCH);
    assert!(victim.try_wait().unwrap().is_none(), "the host process survived the cage's attempt");
    assert_escaped("kill host", host_as(Nobody, &e.probe, &["kill", &pid]));
    victim.wait().unwrap();
}

// ---- privilege ---------------------------------------------------------------------------

#[test]
fn setuid_binary_in_rootfs_gains_nothing() {
    let Some(e) = env("setuid") else { return };
    let run = cage(&e.chio, &["--rootfs", e.rootfs.to_str().unwrap()], &["/probe-suid", "euid"]);
    run.assert_refused("setuid binary");
    let suid = e.rootfs.join("probe-suid");
    assert_escaped("setuid binary", host(&e.probe, &["as-user", "65534", suid.to_str().unwrap(), "euid"]));
}

#[test]
fn no_capabilities_inside() {
    let Some(e) = env("caps") else { return };
    e.pair_with("capabilities", &[], &["caps"], None, Root("the capabilities a cage drops are root's"), &["caps"]);
}

#[test]
fn no_new_privs_inside() {
    let Some(e) = env("nnp") else { return };
    e.pair_with("no_new_privs", &[], &["nnp"], None, Nobody, &["nnp"]);
}

#[test]
fn securebits_set_and_locked_inside() {
    let Some(e) = env("securebits") else { return };
    e.pair_with("securebits", &[], &["securebits"], None, Nobody, &["securebits"]);
}

// ---- ceilings ----------------------------------------------------------------------------

#[test]
fn fork_bomb_is_held_by_pids() {
    let Some(e) = env("fork_bomb") else { return };
    let run = e.caged(&["--pids", "16"], &["fork-many", "64"]);
    assert_eq!(run.assert_refused("fork bomb"), libc::EAGAIN);
    let hit = run.record["outcome"]["limit_hit"].as_array().unwrap();
    assert!(hit.iter().any(|h| h == "pids"), "record names the pids ceiling: {hit:?}");
    assert_escaped("fork bomb", host_as(Nobody, &e.probe, &["fork-many", "64"]));
}

#[test]
fn memory_hog_is_held_by_memory() {
    let Some(e) = env("memory_hog") else { return };
    let run = e.caged(&["--memory", "64M"], &["alloc", "256"]);
    assert_eq!(run.state(), "FullyEnforced");
    assert!(!run.stdout.starts_with("ESCAPED"), "allocated past the ceiling: {}", run.stdout);
    let o = &run.record["outcome"];
    assert_eq!(o["signal"], 9, "the OOM killer ended it: {o}");
    assert!(o["limit_hit"].as_array().unwrap().iter().any(|h| h == "memory"), "{o}");
    assert!(o["peak_memory_bytes"].as_u64().unwrap() <= 64 << 20, "{o}");
    assert_eq!(run.code, 137);
    assert_escaped("memory hog", host_as(Nobody, &e.probe, &["alloc", "256"]));
}

#[test]
fn disk_fill_is_held_by_fsize() {
    let Some(e) = env("fsize") else { return };
    let ws = Scratch::new("fsize");
    ws.give_to_nobody();
    let run = e.caged(&["--workspace", ws.0.to_str().unwrap()], &["fill", "/workspace/big", "32"]);
    assert_eq!(run.assert_refused("fsize"), libc::EFBIG);
    assert_eq!(std::fs::metadata(ws.join("big")).unwrap().len(), 16 << 20);
    let s = Scratch::new("fsize-control");
    s.give_to_nobody();
    assert_escaped("fsize", host_as(Nobody, &e.probe, &["fill", s.join("big").to_str().unwrap(), "32"]));
}

#[test]
fn tmp_fill_is_held_by_tmpfs_size() {
    let Some(e) = env("tmp_size") else { return };
    let run = e.caged(&["--tmp-size", "8M"], &["fill", "/tmp/big", "12"]);
    assert_eq!(run.assert_refused("tmp size"), libc::ENOSPC);
    let s = Scratch::new("tmp-control");
    s.give_to_nobody();
    assert_escaped("tmp size", host_as(Nobody, &e.probe, &["fill", s.join("big").to_str().unwrap(), "12"]));
}

#[test]
fn output_flood_is_capped() {
    let Some(e) = env("flood") else { return };
    let run = e.caged(&["--output-limit", "64K"], &["flood", "8"]);
    assert_eq!(run.state(), "FullyEnforced");
    assert_eq!(run.stdout.len(), 64 << 10);
    let o = &run.record["outcome"];
    assert_eq!(o["stdout_bytes"], 64 << 10);
    assert_eq!(o["stdout_dropped"], (8 << 20) - (64 << 10));
    assert!(o["limit_hit"].as_array().unwrap().iter().any(|h| h == "output"));
    let (code, out) = host_as(Nobody, &e.probe, &["flood", "8"]);
    assert_eq!((code, out.len()), (0, 8 << 20), "control floods 8 MiB");
}

#[test]
fn deadline_kills_the_target_and_its_background_children() {
    let Some(e) = env("deadline") else { return };
    let tag = format!("chio-deadline-{}", std::process::id());
    let started = Instant::now();
    let run = e.caged(&["--timeout", "2s"], &["sleeper", &tag, "--background"]);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(run.state(), "FullyEnforced");
    assert_eq!(run.code, 137);
    assert!(run.record["outcome"]["limit_hit"].as_array().unwrap().iter().any(|h| h == "wall_time"));
    assert_eq!(processes_tagged(&tag), Vec::<u32>::new(), "background children outlived the deadline");
    // Control: without a cage, the setsid'd grandchild survives its parent's death.
    let ctag = format!("{tag}-control");
    let mut parent =
        Command::new(&e.probe).args(["sleeper", &ctag, "--background"]).stdout(Stdio::piped()).spawn().unwrap();
    BufReader::new(parent.stdout.take().unwrap()).lines().next();
    parent.kill().unwrap();
    parent.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let survivors = processes_tagged(&ctag);
    assert!(!survivors.is_empty(), "control: the background child should survive without a cage");
    for p in survivors {
        // SAFETY: killing the control's own leftover.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
}

#[test]
fn killed_supervisor_leaves_no_process_mount_or_cgroup() {
    let Some(e) = env("supervisor_kill") else { return };
    let tag = format!("chio-sigkill-{}", std::process::id());
    // In a parent of its own: another test's launch sweeping the orphaned cgroup would hide a
    // janitor that did not remove it.
    let parent = chio_tests::PrivateParent::new(&tag);
    let mut sup = sleeping_cage_in(&e, &tag, &["--background"], Some(&parent));
    let pid = sup.id();
    assert!(!chio_tests::launch_cgroups_of(pid).is_empty(), "the launch cgroup exists while running");
    assert!(!processes_tagged(&tag).is_empty());
    sup.kill().unwrap();
    sup.wait().unwrap();
    assert_eq!(wait_gone(&tag, Duration::from_secs(5)), Vec::<u32>::new(), "cage processes outlived the supervisor");
    let until = Instant::now() + Duration::from_secs(5);
    while !chio_tests::launch_cgroups_of(pid).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(chio_tests::launch_cgroups_of(pid), Vec::<PathBuf>::new(), "the launch cgroup outlived the supervisor");
    let until = Instant::now() + Duration::from_secs(5);
    while janitor_orphans(&tag) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!janitor_orphans(&tag), "the janitor outlived its work");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("cage-root"), "a cage mount leaked into the host namespace");
    // Control: a plain parent killed the same way leaves its child running.
    uncaged_child_survives_its_killed_parent(&e, &format!("{tag}-control"));
}

/// `chio cage run` of the probe's sleeper tagged `tag`, returned once the sleeper runs; its
/// supervisor started in `parent` when one is given.
fn sleeping_cage_in(
    e: &Suite,
    tag: &str,
    extra: &[&str],
    parent: Option<&chio_tests::PrivateParent>,
) -> std::process::Child {
    let root = e.rootfs.to_str().unwrap();
    let mut cmd = Command::new(&e.chio);
    cmd.args(["cage", "run", "--rootfs", root, "--", "/probe", "sleeper", tag]).args(extra);
    if let Some(p) = parent {
        p.enter(&mut cmd);
    }
    let mut sup = cmd.stdout(Stdio::piped()).stdin(Stdio::null()).spawn().unwrap();
    let line = BufReader::new(sup.stdout.take().unwrap()).lines().next().unwrap().unwrap();
    assert_eq!(line, "SLEEPING");
    sup
}

/// A janitor of a launch tagged `tag` still exists.
fn janitor_orphans(tag: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().any(|e| {
        let Some(pid) = e.ok().and_then(|e| e.file_name().to_str()?.parse::<u32>().ok()) else { return false };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        comm.trim_end() == "chio-janitor" && String::from_utf8_lossy(&cmd).contains(tag)
    })
}

#[test]
fn init_dies_with_the_supervisor_even_without_the_janitor() {
    // The janitor would kill the cage's processes through the cgroup; kill it first, so only the
    // init's own parent-death signal (re-armed after its uid change) can end the cage.
    let Some(e) = env("pdeathsig") else { return };
    let tag = format!("chio-pdeathsig-{}", std::process::id());
    // In a parent of its own: no other test's launch sweeps the orphaned cgroup below.
    let parent = chio_tests::PrivateParent::new(&tag);
    let mut sup = sleeping_cage_in(&e, &tag, &[], Some(&parent));
    let janitor = chio_tests::child_named(sup.id(), "chio-janitor").expect("the launch has a janitor");
    // SAFETY: killing the janitor of our own launch.
    unsafe { libc::kill(janitor as i32, libc::SIGKILL) };
    sup.kill().unwrap();
    sup.wait().unwrap();
    let left = wait_gone(&tag, Duration::from_secs(5));
    // Isolated from the other tests' launches (its own parent): one of them sweeping this
    // orphaned cgroup would kill its processes and remove it. The cgroup must still be here, so
    // the parent-death signal, not a sweep, ended the cage.
    let cgroups = chio_tests::launch_cgroups_of(sup.id());
    assert!(!cgroups.is_empty(), "the launch cgroup was swept by another launch: the test proves nothing");
    for d in cgroups {
        let _ = std::fs::remove_dir(d); // nobody is left to remove it; the next launch would sweep it
    }
    assert_eq!(left, Vec::<u32>::new(), "cage processes outlived the supervisor and its janitor");
    // Control: a child of a killed parent, without a parent-death signal, lives on.
    uncaged_child_survives_its_killed_parent(&e, &format!("{tag}-control"));
}

/// The control of the supervisor-kill tests: without a cage, the probe's sleeper outlives its
/// SIGKILLed parent (the leftover is then killed).
fn uncaged_child_survives_its_killed_parent(e: &Suite, tag: &str) {
    let mut sh = Command::new("/bin/sh")
        .arg("-c")
        .arg("\"$0\" sleeper \"$1\" & wait")
        .arg(&e.probe)
        .arg(tag)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    BufReader::new(sh.stdout.take().unwrap()).lines().next();
    sh.kill().unwrap();
    sh.wait().unwrap();
    let survivors = processes_tagged(tag);
    assert!(!survivors.is_empty(), "control: an uncaged child survives its killed parent");
    for p in survivors {
        // SAFETY: killing the control's own leftover.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
}
