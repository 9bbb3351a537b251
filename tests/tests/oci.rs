//! `chio oci`, the runc command line, driven the way engines drive it: create with a pid file,
//! start, state, kill, delete — the test process is the subreaper that inherits the container's
//! process, as conmon and the containerd shim are — and through containerd's own `ctr run` with
//! chio as its runc binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chio_tests::{chio_bin, output_within, privileged, run_within, shared_rootfs, skip, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

/// One runtime root and one bundle on the probe rootfs.
struct Oci {
    chio: PathBuf,
    rootfs: &'static Path,
    dir: Scratch,
    /// The node configuration every call names (`CHIO_OCI_CONFIG`), if any.
    node: std::cell::RefCell<Option<PathBuf>>,
    /// The test's own parent of its containers' cgroups (`cgroupsPath` `/PARENT/NAME`), as an
    /// engine's pod cgroup: removed, in every hierarchy, when the test ends.
    cgroup_parent: String,
}

impl Drop for Oci {
    fn drop(&mut self) {
        for d in cgroup_dirs(&self.cgroup_parent) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// `rel` in every cgroup hierarchy mounted on this host where it exists.
fn cgroup_dirs(rel: &str) -> Vec<PathBuf> {
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten().map(|e| e.path());
    let mut all: Vec<PathBuf> = hierarchies.chain([PathBuf::from("/sys/fs/cgroup")]).map(|h| h.join(rel)).collect();
    all.retain(|d| d.is_dir());
    all
}

impl Oci {
    fn new(test: &str) -> Option<Oci> {
        if !privileged(test) {
            return None;
        }
        become_subreaper();
        let probe = Path::new(PROBE);
        let dir = Scratch::new(&format!("oci-{test}"));
        let cgroup_parent = format!("chio-tests-{}-{test}", std::process::id());
        Some(Oci { chio: chio_bin(probe), rootfs: shared_rootfs(probe), dir, node: Default::default(), cgroup_parent })
    }

    /// [`Oci::new`] for a test that drives `engine` (a program from the Debian `packages`).
    fn with_engine(test: &str, engine: &str, packages: &str) -> Option<Oci> {
        if !privileged(test) {
            return None;
        }
        if Command::new(engine).arg("--version").output().is_err() {
            skip(test, &format!("{engine} is not installed (apt-get install {packages})"));
            return None;
        }
        Oci::new(test)
    }

    fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// A bundle `name` whose config runs `args`, edited by `edit`.
    fn bundle(&self, name: &str, args: &[&str], edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
        let b = self.dir.join(name);
        std::fs::create_dir_all(&b).unwrap();
        let mut c = config(self.rootfs, args);
        c["linux"]["cgroupsPath"] = format!("/{}/{name}", self.cgroup_parent).into();
        edit(&mut c);
        std::fs::write(b.join("config.json"), c.to_string()).unwrap();
        b
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.chio);
        c.arg("oci").arg("--root").arg(self.root()).args(args).stdin(Stdio::null());
        if let Some(n) = self.node.borrow().as_ref() {
            c.env("CHIO_OCI_CONFIG", n);
        }
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        run_within(&mut self.cmd(args), Duration::from_secs(60), &format!("chio oci {args:?}"))
    }

    /// `create` with the container's stdout and stderr going to `out` (as an engine gives the
    /// runtime the container's own descriptors): (create's exit status and stderr, the pid).
    fn create(&self, id: &str, bundle: &Path, out: &Path) -> (Output, Option<i32>) {
        let pid_file = self.dir.join(&format!("{id}.pid"));
        let f = std::fs::File::create(out).unwrap();
        let err = self.dir.join(&format!("{id}.create-err"));
        let b = bundle.to_str().unwrap();
        let mut c = self.cmd(&["create", "--bundle", b, "--pid-file", pid_file.to_str().unwrap(), id]);
        c.stdout(f.try_clone().unwrap()).stderr(std::fs::File::create(&err).unwrap());
        let mut o = output_within(c.spawn().unwrap(), Duration::from_secs(60), "chio oci create");
        o.stderr = std::fs::read(&err).unwrap();
        let pid = std::fs::read_to_string(&pid_file).ok().map(|p| p.trim().parse().unwrap());
        (o, pid)
    }

    fn state(&self, id: &str) -> serde_json::Value {
        let o = self.run(&["state", id]);
        assert!(o.status.success(), "state: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn saved(&self, id: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.root().join(id).join("state.json")).unwrap()).unwrap()
    }

    /// create, start, wait: (exit status of the container's process, its output, its record).
    fn run_container(&self, id: &str, args: &[&str]) -> (i32, String, serde_json::Value) {
        self.run_container_with(id, args, |_| {})
    }

    /// `run_container` of a config edited by `edit`.
    fn run_container_with(
        &self,
        id: &str,
        args: &[&str],
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> (i32, String, serde_json::Value) {
        let b = self.bundle(id, args, edit);
        let out = self.dir.join(&format!("{id}.out"));
        let (o, pid) = self.create(id, &b, &out);
        assert!(o.status.success(), "create: {}", String::from_utf8_lossy(&o.stderr));
        let holder = self.saved(id)["holder"].as_i64().unwrap() as i32;
        let s = self.run(&["start", id]);
        assert!(s.status.success(), "start: {}", String::from_utf8_lossy(&s.stderr));
        let status = wait_exit(pid.unwrap());
        reap(holder);
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.root().join(id).join("chio-launch.json")).unwrap()).unwrap();
        let d = self.run(&["delete", id]);
        assert!(d.status.success(), "delete: {}", String::from_utf8_lossy(&d.stderr));
        (status, std::fs::read_to_string(&out).unwrap(), record)
    }
}

/// runc's default config, as `ctr oci spec` prints it, with a read-only root.
fn config(rootfs: &Path, args: &[&str]) -> serde_json::Value {
    // The engines' default set (runc, containerd, podman), as `ctr oci spec` prints it.
    let caps = chio_supervisor::oci::bundle::DEFAULT_CAPABILITIES;
    serde_json::json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 0, "gid": 0}, "args": args, "env": ["PATH=/usr/bin:/bin"], "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": rootfs, "readonly": true},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}
        ],
        "linux": {
            "resources": {"devices": [{"allow": false, "access": "rwm"}], "memory": {"limit": 268435456}},
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}],
            "maskedPaths": ["/proc/kcore", "/proc/keys"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"]
        },
        "annotations": {"io.kubernetes.pod.name": "web-0", "io.kubernetes.pod.namespace": "shop"}
    })
}

/// Orphans of this process (the containers' processes, once `create` exits) come to it.
fn become_subreaper() {
    // SAFETY: a prctl on this process with constant arguments (nix has no wrapper for it).
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }, 0);
}

/// Wait for `pid` (a child by re-parenting): its exit code, or 128 + signal.
fn wait_exit(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: waitpid on one pid into a local.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid({pid}): {}", std::io::Error::last_os_error());
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// `wait_exit`, reaping any other child that ends first.
fn wait_exit_reaping_others(pid: i32) -> i32 {
    loop {
        let mut status = 0;
        // SAFETY: waitpid on any child into a local.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        assert!(r > 0, "waitpid(-1) while waiting for {pid}: {}", std::io::Error::last_os_error());
        if r == pid {
            return if libc::WIFSIGNALED(status) { 128 + libc::WTERMSIG(status) } else { libc::WEXITSTATUS(status) };
        }
    }
}

/// Reap `pid` if it is our child (the holder after `start`, re-parented here).
fn reap(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let mut status = 0;
        // SAFETY: waitpid on one pid into a local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r != 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the holder {pid} did not exit after start");
}

fn gone(pid: i32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

fn sha256_of(p: &Path) -> String {
    chio_tests::hex(&std::fs::read(p).unwrap())
}

/// The container's process runs with the engine's stdio, exits with its own status, and its
/// exec is recorded — the binary's digest, the facts at the exec stop, the bundle's
/// annotations — with the container's lifecycle seen through `state` and `ps`.
#[test]
fn a_container_runs_observed_and_recorded() {
    let Some(o) = Oci::new("runs") else { return };
    let b =
        o.bundle("c1", &["/probe", "euid"], |c| c["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000}));
    let out = o.dir.join("c1.out");
    let (c, pid) = o.create("c1", &b, &out);
    assert!(c.status.success(), "create: {}", String::from_utf8_lossy(&c.stderr));
    let pid = pid.expect("create wrote the pid file before it returned");
    let st = o.state("c1");
    assert_eq!((st["status"].as_str(), st["pid"].as_i64()), (Some("created"), Some(pid as i64)), "{st}");
    assert_eq!(st["annotations"]["io.kubernetes.pod.name"], "web-0");
    let ps = o.run(&["ps", "--format", "json", "c1"]);
    let pids: Vec<i32> = serde_json::from_slice(&ps.stdout).unwrap();
    assert!(pids.contains(&pid), "ps {pids:?} lacks the init {pid}");
    assert!(!o.root().join("c1/chio-launch.json").exists(), "nothing ran yet, nothing is recorded");
    let holder = o.saved("c1")["holder"].as_i64().unwrap() as i32;
    let cgroups: Vec<PathBuf> =
        o.saved("c1")["cgroup"].as_array().unwrap().iter().map(|p| PathBuf::from(p.as_str().unwrap())).collect();
    assert!(!cgroups.is_empty() && cgroups.iter().all(|d| d.is_dir()), "{cgroups:?}");
    let s = o.run(&["start", "c1"]);
    assert!(s.status.success(), "start: {}", String::from_utf8_lossy(&s.stderr));
    // The probe says it runs as the config's uid 1000, not root: its exit status 1.
    assert_eq!(wait_exit(pid), 1);
    reap(holder);
    assert_eq!(o.state("c1")["status"], "stopped");
    let said = std::fs::read_to_string(&out).unwrap();
    assert_eq!(said, "REFUSED: euid is 1000 errno=0\n", "the container's output reached the engine's stdout");
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(b.join("chio-launch.json")).unwrap()).unwrap();
    assert_eq!(rec["state"], "FullyEnforced", "{rec}");
    assert_eq!(rec["target"]["path"], "/probe");
    assert_eq!(rec["target"]["sha256"], sha256_of(&o.rootfs.join("probe")));
    assert_eq!(rec["observed"]["uids"][1], 1000, "{}", rec["observed"]);
    assert_eq!(rec["annotations"]["oci.id"], "c1");
    assert_eq!(rec["annotations"]["oci.annotation.io.kubernetes.pod.namespace"], "shop");
    assert_eq!(rec["limits"]["memory_bytes"], 268435456, "the config's smaller memory ceiling");
    let again = o.run(&["start", "c1"]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("stopped, not created"));
    let d = o.run(&["delete", "c1"]);
    assert!(d.status.success(), "delete: {}", String::from_utf8_lossy(&d.stderr));
    assert!(!o.root().join("c1").exists() && !b.join("chio-launch.json").exists());
    assert!(cgroups.iter().all(|d| !d.exists()), "delete removed the cgroup: {cgroups:?}");
}

/// A signal by name or number reaches the container's process through its init, whose status
/// is then 128 + the signal, as runc's is; `kill --all` reaches every process.
#[test]
fn kill_reaches_the_containers_process() {
    let Some(o) = Oci::new("kill") else { return };
    for (id, how) in [
        ("k1", vec!["kill", "k1", "TERM"]),
        ("k2", vec!["kill", "k2", "15"]),
        ("k3", vec!["kill", "--all", "k3", "SIGKILL"]),
    ] {
        let b = o.bundle(id, &["/probe", "sleeper", id], |_| {});
        let out = o.dir.join(&format!("{id}.out"));
        let (c, pid) = o.create(id, &b, &out);
        assert!(c.status.success(), "create: {}", String::from_utf8_lossy(&c.stderr));
        let holder = o.saved(id)["holder"].as_i64().unwrap() as i32;
        assert!(o.run(&["start", id]).status.success());
        reap(holder);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&out).unwrap().contains("SLEEPING") {
            assert!(Instant::now() < deadline, "the sleeper never said it sleeps");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(o.state(id)["status"], "running");
        let k = o.run(&how);
        assert!(k.status.success(), "{how:?}: {}", String::from_utf8_lossy(&k.stderr));
        let want = if id == "k3" { 128 + 9 } else { 128 + 15 };
        assert_eq!(wait_exit(pid.unwrap()), want, "{how:?}");
        assert!(o.run(&["delete", id]).status.success());
    }
    let bad = o.run(&["kill", "nope", "TERM"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("does not exist"));
}

/// A created container deleted before its start leaves nothing: its init, its holder, its
/// cgroup and its state are gone. A running (here: paused) one is deleted only with --force.
#[test]
fn delete_leaves_nothing_behind() {
    let Some(o) = Oci::new("delete") else { return };
    let b = o.bundle("d1", &["/probe", "sleeper", "d1"], |_| {});
    let (c, pid) = o.create("d1", &b, &o.dir.join("d1.out"));
    assert!(c.status.success(), "create: {}", String::from_utf8_lossy(&c.stderr));
    let (pid, holder) = (pid.unwrap(), o.saved("d1")["holder"].as_i64().unwrap() as i32);
    let cgroups = o.saved("d1")["cgroup"].clone();
    let d = o.run(&["delete", "d1"]);
    assert!(d.status.success(), "delete of a created container: {}", String::from_utf8_lossy(&d.stderr));
    wait_exit(pid);
    reap(holder);
    assert!(gone(pid) && gone(holder) && !o.root().join("d1").exists());
    assert!(cgroups.as_array().unwrap().iter().all(|d| !Path::new(d.as_str().unwrap()).exists()));

    let b = o.bundle("d2", &["/probe", "sleeper", "d2"], |_| {});
    let (c, pid) = o.create("d2", &b, &o.dir.join("d2.out"));
    assert!(c.status.success());
    let holder = o.saved("d2")["holder"].as_i64().unwrap() as i32;
    assert!(o.run(&["start", "d2"]).status.success());
    reap(holder);
    assert!(o.run(&["pause", "d2"]).status.success());
    assert_eq!(o.state("d2")["status"], "paused");
    let refused = o.run(&["delete", "d2"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is running"), "{refused:?}");
    assert!(o.run(&["delete", "--force", "d2"]).status.success());
    assert_eq!(wait_exit(pid.unwrap()), 128 + 9);
    assert!(!o.root().join("d2").exists());
    assert!(o.run(&["delete", "--force", "d2"]).status.success(), "a forced delete of no container succeeds");
}

/// What the node refuses is refused at `create`, every reason named on stderr and in the
/// engine's JSON log, and nothing is left: no state, no process.
#[test]
fn what_the_node_refuses_is_refused_at_create() {
    let Some(o) = Oci::new("refuse") else { return };
    let b = o.bundle("r1", &["/probe", "euid"], |c| {
        c["root"]["readonly"] = false.into();
        c["process"]["capabilities"]["bounding"][0] = "CAP_SYS_ADMIN".into();
        c["linux"]["namespaces"].as_array_mut().unwrap().retain(|n| n["type"] != "network");
    });
    let log = o.dir.join("log.json");
    let pid_file = o.dir.join("r1.pid");
    let out = o.run(&[
        "--log",
        log.to_str().unwrap(),
        "--log-format",
        "json",
        "create",
        "--bundle",
        b.to_str().unwrap(),
        "--pid-file",
        pid_file.to_str().unwrap(),
        "r1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for why in ["root.readonly is not true", "CAP_SYS_ADMIN", "no net namespace: the container would share the host's"]
    {
        assert!(err.contains(why), "{why}: {err}");
    }
    let line: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
    assert_eq!(line["level"], "error");
    assert!(line["msg"].as_str().unwrap().contains("root.readonly"), "{line}");
    assert!(!pid_file.exists() && !o.root().join("r1").exists());
    let sd = o.run(&["--systemd-cgroup", "state", "r1"]);
    assert!(String::from_utf8_lossy(&sd.stderr).contains("--systemd-cgroup is not supported"));
    // A terminal and a console socket go together.
    let plain = o.bundle("r2", &["/probe", "euid"], |_| {});
    let tty = o.run(&["create", "--bundle", plain.to_str().unwrap(), "--console-socket", "/nonexistent", "r2"]);
    assert!(String::from_utf8_lossy(&tty.stderr).contains("process.terminal is not true"), "{tty:?}");
    let term = o.bundle("r3", &["/probe", "euid"], |c| c["process"]["terminal"] = true.into());
    let tty = o.run(&["create", "--bundle", term.to_str().unwrap(), "r3"]);
    assert!(String::from_utf8_lossy(&tty.stderr).contains("no --console-socket"), "{tty:?}");
    assert!(!o.root().join("r2").exists() && !o.root().join("r3").exists());
    // A process that cannot start fails `create` with its own reason (the cage is parked only
    // once its target is ready), not later as a container that vanished.
    let missing = o.bundle("r4", &["/not-in-the-image"], |_| {});
    let pid_file = o.dir.join("r4.pid");
    let out = o.run(&["create", "--bundle", missing.to_str().unwrap(), "--pid-file", pid_file.to_str().unwrap(), "r4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("target_not_found") && err.contains("/not-in-the-image"), "{err}");
    assert!(!pid_file.exists() && !o.root().join("r4").exists());
}

/// The escape probes, run as a container's process, are refused; each probe's control on the
/// host escapes (so none passes by being broken).
#[test]
fn escape_probes_are_refused_in_a_container() {
    let Some(o) = Oci::new("escape") else { return };
    let scratch = Scratch::new("oci-escape-control");
    for (i, (probe, control)) in [
        (vec!["caps"], vec!["caps"]),
        (vec!["unshare", "user"], vec!["unshare", "user"]),
        (vec!["mount", "/run"], vec!["mount", scratch.0.to_str().unwrap()]),
        (vec!["ptrace"], vec!["ptrace"]),
        (vec!["keyctl"], vec!["keyctl"]),
        (vec!["bpf"], vec!["bpf"]),
        (vec!["sethostname"], vec!["sethostname", "--own-ns"]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut args = vec!["/probe"];
        args.extend(&probe);
        let (status, said, rec) = o.run_container(&format!("e{i}"), &args);
        assert_eq!(rec["state"], "FullyEnforced");
        assert!(said.starts_with("REFUSED") && status == 1, "{probe:?} in a container: {status} {said:?}");
        let c = Command::new(PROBE).args(&control).output().unwrap();
        let c = String::from_utf8_lossy(&c.stdout);
        assert!(c.starts_with("ESCAPED"), "control {control:?} on the host as root: {c:?}");
    }
}

/// The config's own seccomp profile is stacked under chio's allow-list: what it refuses is
/// refused (a unix socket, which the cage allows and the same container without the profile
/// opens), and what it allows beyond chio's list (mount) stays refused. The record gives the
/// profile's digest and the exec stop counts both filters.
#[test]
fn the_configs_seccomp_profile_narrows_and_never_widens() {
    let Some(o) = Oci::new("seccomp") else { return };
    let profile = serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [
            {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
             "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}]},
            {"names": ["mount", "unshare"], "action": "SCMP_ACT_ALLOW"}
        ]
    });
    let unix_socket = ["/probe", "socket-raw", "1", "1", "0"];
    let with = |c: &mut serde_json::Value| c["linux"]["seccomp"] = profile.clone();
    let (status, said, rec) = o.run_container_with("s1", &unix_socket, with);
    assert_eq!(rec["state"], "FullyEnforced", "{rec}");
    assert_eq!((status, said.trim()), (1, "REFUSED: socket(1, 1, 0) errno=13"), "the profile's own errno");
    let sha = rec["reported"]["profile_filter_sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64, "{rec}");
    let observed = &rec["observed"];
    assert_eq!(
        observed["seccomp_filters"].as_u64().unwrap(),
        observed["seccomp_filters_inherited"].as_u64().unwrap() + 2
    );
    assert!(rec["annotations"]["oci.seccomp"].as_str().unwrap().contains("stacked under chio's allow-list"), "{rec}");
    // Control: the same container without the profile opens the socket.
    let (status, said, rec) = o.run_container("s2", &unix_socket);
    assert_eq!((status, said.trim()), (0, "ESCAPED: socket(1, 1, 0)"));
    assert!(rec["reported"].get("profile_filter_sha256").is_none(), "{rec}");
    // What the profile allows and chio refuses stays refused, with chio's EPERM.
    let (status, said, _) = o.run_container_with("s3", &["/probe", "mount", "/run"], with);
    assert_eq!((status, said.trim()), (1, "REFUSED: mount tmpfs on /run errno=1"));
    // A profile that hands calls to another process is refused at create.
    let b = o.bundle("s4", &unix_socket, |c| {
        c["linux"]["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_NOTIFY"})
    });
    let out = o.run(&["create", "--bundle", b.to_str().unwrap(), "s4"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("SCMP_ACT_NOTIFY"), "{out:?}");
    assert!(!o.root().join("s4").exists());
}

/// `maskedPaths` hide what they name (a file reads as empty, a directory is an empty one) and
/// `readonlyPaths` make a writable place read-only; the same container without them reads and
/// writes those places (the controls).
#[test]
fn masked_and_read_only_paths_take_access_away() {
    let Some(o) = Oci::new("masked") else { return };
    let hide = |c: &mut serde_json::Value| {
        c["linux"]["maskedPaths"] = serde_json::json!(["/proc/version", "/proc/sys/kernel", "/not/in/the/image"]);
        c["linux"]["readonlyPaths"] = serde_json::json!(["/run"]);
    };
    let version = ["/probe", "cat", "/proc/version"];
    let (_, said, rec) = o.run_container_with("m1", &version, hide);
    assert_eq!(rec["state"], "FullyEnforced", "{rec}");
    assert_eq!(said, "", "a masked file reads as /dev/null");
    let mounts = rec["reported"]["mounts"].to_string();
    assert!(mounts.contains("/proc/version masked") && mounts.contains("/run read-only"), "{mounts}");
    let (_, said, _) = o.run_container("m2", &version);
    assert!(said.starts_with("Linux version"), "control: {said:?}");

    let hostname = ["/probe", "cat", "/proc/sys/kernel/hostname"];
    let (status, said, _) = o.run_container_with("m3", &hostname, hide);
    assert!(status != 0 && said.contains("No such file"), "a masked directory is empty: {status} {said:?}");
    let (status, said, _) = o.run_container("m4", &hostname);
    assert!(status == 0 && !said.trim().is_empty(), "control: {status} {said:?}");

    let write = ["/probe", "create", "reg", "/run/new"];
    let (status, said, _) = o.run_container_with("m5", &write, hide);
    assert!(status == 1 && said.contains("errno=30"), "read-only /run: {said:?}");
    let (status, said, _) = o.run_container("m6", &write);
    assert!(status == 0 && said.starts_with("ESCAPED"), "control: /run is the config's writable tmpfs: {said:?}");
}

/// The config's rlimits are set as asked, soft below hard, for the limits the cage names and
/// for the rest (RLIMIT_DATA, RLIMIT_STACK); a hard value above the node's ceiling is held to
/// the ceiling, and a soft value above its hard one is refused at `create`.
#[test]
fn the_configs_rlimits_are_set_soft_below_hard_and_never_above_the_node() {
    let Some(o) = Oci::new("rlimits") else { return };
    let limits = |c: &mut serde_json::Value| {
        c["process"]["rlimits"] = serde_json::json!([
            {"type": "RLIMIT_NOFILE", "soft": 512, "hard": 1024},
            {"type": "RLIMIT_DATA", "soft": 1_u64 << 30, "hard": 2_u64 << 30},
            {"type": "RLIMIT_STACK", "soft": 4_u64 << 20, "hard": 8_u64 << 20},
            {"type": "RLIMIT_FSIZE", "soft": 1_u64 << 62, "hard": 1_u64 << 62}
        ]);
    };
    let (status, said, rec) = o.run_container_with("r1", &["/probe", "cat", "/proc/self/limits"], limits);
    assert_eq!((status, rec["state"].as_str()), (0, Some("FullyEnforced")), "{said}");
    let row = |name: &str| -> (String, String) {
        let line = said.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {said}"));
        let mut f = line[name.len()..].split_whitespace();
        (f.next().unwrap().to_string(), f.next().unwrap().to_string())
    };
    assert_eq!(row("Max open files"), ("512".into(), "1024".into()));
    assert_eq!(row("Max data size"), ((1_u64 << 30).to_string(), (2_u64 << 30).to_string()));
    assert_eq!(row("Max stack size"), ((4_u64 << 20).to_string(), (8_u64 << 20).to_string()));
    let node = chio_supervisor::oci::node::NodeConfig::default().ceilings.fsize_bytes.to_string();
    assert_eq!(row("Max file size"), (node.clone(), node), "held to the node's ceiling");

    let b = o.bundle("r2", &["/probe", "euid"], |c| {
        c["process"]["rlimits"] = serde_json::json!([{"type": "RLIMIT_NOFILE", "soft": 2048, "hard": 1024}]);
    });
    let (c, pid) = o.create("r2", &b, &o.dir.join("r2.out"));
    let err = String::from_utf8_lossy(&c.stderr);
    assert!(!c.status.success() && pid.is_none(), "soft above hard is refused: {err}");
    assert!(err.contains("soft 2048 above hard 1024"), "{err}");
}

/// The container's cgroup is made where the config's `cgroupsPath` names it, so the engine's
/// pod cgroup above it bounds it (here a pod-level pids ceiling the container's own does not
/// have) and the engine finds it where it looks; `delete` removes it and leaves the pod's.
/// A path that climbs out, or a cgroup that holds another's processes, is refused.
#[test]
fn the_containers_cgroup_is_where_the_engine_names_it() {
    let Some(o) = Oci::new("cgpath") else { return };
    let pod = format!("{}/pod", o.cgroup_parent);
    let pids = PathBuf::from("/sys/fs/cgroup/pids").join(&pod);
    std::fs::create_dir_all(&pids).unwrap();
    std::fs::write(pids.join("pids.max"), "4").unwrap();
    let in_pod = |c: &mut serde_json::Value| c["linux"]["cgroupsPath"] = format!("/{pod}/c1").into();
    let fork = ["/probe", "fork-many", "8"];
    let (status, said, rec) = o.run_container_with("c1", &fork, in_pod);
    assert_eq!((status, rec["state"].as_str()), (1, Some("FullyEnforced")), "{said}");
    assert!(said.starts_with("REFUSED: created only"), "the pod's pids ceiling holds the container: {said}");
    let paths = rec["cgroup"]["paths"].as_array().unwrap();
    assert!(!paths.is_empty() && paths.iter().all(|p| p.as_str().unwrap().ends_with(&format!("/{pod}/c1"))), "{rec}");
    assert!(paths.iter().all(|p| !Path::new(p.as_str().unwrap()).exists()), "delete removed the container's cgroup");
    assert!(pids.is_dir(), "the pod's cgroup is the engine's: left");
    let (status, said, _) = o.run_container("c2", &fork);
    assert_eq!(status, 0, "control: outside the pod the container forks 8: {said}");

    let climbs = o.bundle("c3", &["/probe", "euid"], |c| c["linux"]["cgroupsPath"] = "/a/../../etc".into());
    let (c, pid) = o.create("c3", &climbs, &o.dir.join("c3.out"));
    let err = String::from_utf8_lossy(&c.stderr);
    assert!(!c.status.success() && pid.is_none() && err.contains("cgroupsPath /a/../../etc"), "{err}");
    let taken = PathBuf::from("/sys/fs/cgroup/pids").join(&pod).join("busy");
    std::fs::create_dir(&taken).unwrap();
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(taken.join("cgroup.procs"), other.id().to_string()).unwrap();
    let busy = o.bundle("c4", &["/probe", "euid"], |c| c["linux"]["cgroupsPath"] = format!("/{pod}/busy").into());
    let (c, _) = o.create("c4", &busy, &o.dir.join("c4.out"));
    let _ = other.kill();
    let _ = other.wait();
    let err = String::from_utf8_lossy(&c.stderr);
    assert!(!c.status.success() && err.contains("already holds processes"), "{err}");
    std::fs::remove_dir(&taken).unwrap();
    for d in cgroup_dirs(&pod) {
        std::fs::remove_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    }
}

/// `exec` runs a further process in a running container: in the container's namespaces and
/// cgroup, confined as the first (the probes are refused), observed at its exec and recorded;
/// its status comes back, and with `--detach` the pid file names the process the caller's
/// subreaper reaps. What exec cannot be given is refused.
#[test]
fn exec_runs_a_further_process_confined_and_observed() {
    let Some(o) = Oci::new("exec") else { return };
    become_subreaper();
    let b = o.bundle("x1", &["/probe", "sleeper", "x1"], |_| {});
    let out = o.dir.join("x1.out");
    let (c, pid) = o.create("x1", &b, &out);
    assert!(c.status.success(), "create: {}", String::from_utf8_lossy(&c.stderr));
    let holder = o.saved("x1")["holder"].as_i64().unwrap() as i32;
    let early = o.run(&["exec", "x1", "/probe", "euid"]);
    assert!(String::from_utf8_lossy(&early.stderr).contains("is created"), "not before start: {early:?}");
    assert!(o.run(&["start", "x1"]).status.success());
    reap(holder);
    let started: serde_json::Value =
        serde_json::from_slice(&std::fs::read(o.root().join("x1").join("chio-launch.json")).unwrap()).unwrap();

    let euid = o.run(&["exec", "x1", "/probe", "euid"]);
    assert_eq!(euid.status.code(), Some(0), "{euid:?}");
    assert_eq!(String::from_utf8_lossy(&euid.stdout).trim(), "ESCAPED: euid is 0", "{euid:?}");
    let records: Vec<serde_json::Value> = std::fs::read_dir(o.root().join("x1"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("exec-"))
        .map(|e| serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap())
        .collect();
    assert_eq!(records.len(), 1);
    let rec = &records[0];
    assert_eq!(rec["state"], "FullyEnforced", "{rec}");
    assert!(rec["annotations"]["oci.exec"].is_string(), "{rec}");
    for ns in ["mnt", "pid", "net", "ipc", "uts", "cgroup"] {
        assert_eq!(rec["observed"]["namespaces"][ns]["cage"], started["observed"]["namespaces"][ns]["cage"], "{ns}");
    }
    assert_eq!(rec["cgroup"]["paths"], started["cgroup"]["paths"], "the container's launch cgroup");
    assert_eq!(rec["reported"]["landlock_read_write_exec"], started["reported"]["landlock_read_write_exec"]);

    // Confined as the container's first process: each probe is refused (their host controls
    // escape in `escape_probes_are_refused_in_a_container`).
    for probe in [vec!["caps"], vec!["unshare", "user"], vec!["mount", "/run"], vec!["ptrace"], vec!["keyctl"]] {
        let mut args = vec!["exec", "x1", "/probe"];
        args.extend(&probe);
        let r = o.run(&args);
        assert_eq!(r.status.code(), Some(1), "{probe:?}: {r:?}");
        assert!(String::from_utf8_lossy(&r.stdout).starts_with("REFUSED"), "{probe:?}: {r:?}");
    }
    // Each exec'd process is a landlock domain of its own: it cannot signal the container's
    // other processes (its init here).
    let sig = o.run(&["exec", "x1", "/probe", "kill", "1"]);
    assert_eq!(String::from_utf8_lossy(&sig.stdout).trim(), "REFUSED: kill(1, SIGTERM) errno=1", "{sig:?}");

    let pid_file = o.dir.join("x1-exec.pid");
    let d = o.run(&["exec", "--detach", "--pid-file", pid_file.to_str().unwrap(), "x1", "/probe", "euid"]);
    assert!(d.status.success(), "{d:?}");
    let entered: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert_eq!(wait_exit(entered), 0, "the detached process is reaped by the caller's subreaper");

    for (args, why) in [
        (vec!["exec", "--cap", "CAP_SYS_ADMIN", "x1", "/probe", "euid"], "no capability"),
        (vec!["exec", "x1"], "names no command"),
        (vec!["exec", "x1", "/not-in-the-image"], "target_not_found"),
        (vec!["exec", "nope", "/probe", "euid"], "does not exist"),
    ] {
        let r = o.run(&args);
        assert!(!r.status.success() && String::from_utf8_lossy(&r.stderr).contains(why), "{args:?}: {r:?}");
    }
    assert!(o.run(&["delete", "--force", "x1"]).status.success());
    // (Reaping whatever else ended here: a subreaper reaps what is left to it.)
    assert_eq!(wait_exit_reaping_others(pid.unwrap()), 128 + 9);
    let stopped = o.run(&["exec", "x1", "/probe", "euid"]);
    assert!(String::from_utf8_lossy(&stopped.stderr).contains("does not exist"), "{stopped:?}");
}

/// With receipts configured on the node, every start is signed into the store, and `chio
/// receipt list` names the container and its pod.
#[test]
fn a_container_start_is_signed_into_the_nodes_store() {
    let Some(o) = Oci::new("receipts") else { return };
    let keys = o.dir.join("keys");
    let k = Command::new(&o.chio).args(["keys", "generate", "--out", keys.to_str().unwrap()]).output().unwrap();
    assert!(k.status.success(), "{k:?}");
    let db = o.dir.join("receipts.db");
    let node = o.dir.join("node.json");
    std::fs::write(&node, serde_json::json!({"receipt_db": db, "kernel_key": keys.join("signing.seed")}).to_string())
        .unwrap();
    *o.node.borrow_mut() = Some(node);
    let (status, _, rec) = o.run_container("s1", &["/probe", "caps"]);
    assert_eq!((status, rec["state"].as_str()), (1, Some("FullyEnforced")));
    let list = Command::new(&o.chio).args(["receipt", "list", "--receipt-db", db.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success() && text.contains("s1") && text.contains("web-0"), "{text}");
}

/// containerd's `ctr run` with chio as its runc binary (the runc v2 shim with BinaryName):
/// the container's output and exit status come back, and a probe inside is refused.
#[test]
fn ctr_runs_containers_through_chio() {
    let Some(o) = Oci::with_engine("ctr", "containerd", "containerd") else { return };
    let ctd = Containerd::start(&o);
    // The link docs/oci.md makes: to chio-full, which holds the runtime.
    let runc = o.dir.join("chio-runc");
    std::os::unix::fs::symlink(o.chio.with_file_name("chio-full"), &runc).unwrap();
    let run = |id: &str, args: &[&str]| {
        let cg = format!("/{}/{id}", o.cgroup_parent);
        let mut c = ctd.ctr(&["run", "--rm", "--read-only", "--cgroup", &cg, "--runc-binary", runc.to_str().unwrap()]);
        c.args([IMAGE, id]);
        c.args(args);
        run_within(&mut c, Duration::from_secs(60), "ctr run")
    };
    let out = run("t1", &["/probe", "euid"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ESCAPED: euid is 0\n", "ctr's default user is 0");
    let out = run("t2", &["/probe", "caps"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with("REFUSED") && out.status.code() == Some(1), "{out:?}");
    let writable = ctd
        .ctr(&["run", "--rm", "--cgroup", &format!("/{}/t3", o.cgroup_parent), "--runc-binary", runc.to_str().unwrap()])
        .args([IMAGE, "t3", "/probe", "euid"])
        .output()
        .unwrap();
    assert!(!writable.status.success());
    assert!(String::from_utf8_lossy(&writable.stderr).contains("root.readonly"), "{writable:?}");
    // A detached task, and a further process in it through the shim (`runc exec --detach`).
    let d = ctd
        .ctr(&[
            "run",
            "-d",
            "--read-only",
            "--cgroup",
            &format!("/{}/t4", o.cgroup_parent),
            "--runc-binary",
            runc.to_str().unwrap(),
            IMAGE,
            "t4",
            "/probe",
            "sleeper",
            "t4",
        ])
        .output()
        .unwrap();
    assert!(d.status.success(), "{d:?}");
    let t4 = format!("{}/t4", o.cgroup_parent);
    assert!(cgroup_dirs(&t4).iter().any(|d| d.join("pids.max").exists()), "the task's cgroup is ctr's --cgroup");
    let exec = |id: &str, args: &[&str]| {
        let mut c = ctd.ctr(&["task", "exec", "--exec-id", id, "t4"]);
        c.args(args);
        run_within(&mut c, Duration::from_secs(60), "ctr task exec")
    };
    let e = exec("e1", &["/probe", "euid"]);
    assert_eq!((e.status.code(), String::from_utf8_lossy(&e.stdout).trim()), (Some(0), "ESCAPED: euid is 0"), "{e:?}");
    let e = exec("e2", &["/probe", "unshare", "user"]);
    assert!(e.status.code() == Some(1) && String::from_utf8_lossy(&e.stdout).starts_with("REFUSED"), "{e:?}");
    let k = ctd.ctr(&["task", "kill", "-s", "SIGKILL", "t4"]).output().unwrap();
    assert!(k.status.success(), "{k:?}");
    let mut w = ctd.ctr(&["task", "wait", "t4"]);
    run_within(&mut w, Duration::from_secs(30), "ctr task wait");
    assert!(ctd.ctr(&["task", "delete", "t4"]).output().unwrap().status.success());
    assert!(ctd.ctr(&["container", "delete", "t4"]).output().unwrap().status.success());
}

const IMAGE: &str = "docker.io/library/chio-probe:1";

/// A private containerd (its own root, state and socket; no CRI) with the probe image.
struct Containerd {
    dir: PathBuf,
    daemon: chio_tests::Reaped,
}

impl Containerd {
    fn start(o: &Oci) -> Containerd {
        let dir = o.dir.join("containerd");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        let cfg = dir.join("config.toml");
        std::fs::write(
            &cfg,
            format!(
                "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{0}/sock\"\n",
                dir.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(&cfg)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let c = Containerd { dir, daemon: chio_tests::Reaped(daemon) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).output().unwrap().status.success() {
            assert!(Instant::now() < deadline, "containerd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let layout = o.dir.join("layout");
        chio_tests::oci_layout_with(o.rootfs, &layout, serde_json::json!({"Cmd": ["/probe"]}), "1");
        let mut idx: serde_json::Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        idx["manifests"][0]["annotations"]["io.containerd.image.name"] = IMAGE.into();
        std::fs::write(layout.join("index.json"), idx.to_string()).unwrap();
        let tar = o.dir.join("image.tar");
        let t = Command::new("tar").arg("-C").arg(&layout).arg("-cf").arg(&tar).arg(".").output().unwrap();
        assert!(t.status.success());
        let i = c.ctr(&["image", "import", tar.to_str().unwrap()]).output().unwrap();
        assert!(i.status.success(), "ctr image import: {i:?}");
        c
    }

    fn ctr(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address").arg(self.dir.join("sock")).args(args).stdin(Stdio::null());
        c
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.daemon.0.kill();
        let _ = self.daemon.0.wait();
        // Its snapshots are overlay mounts below its root: unmount them before the scratch goes.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for m in
            mounts.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| m.starts_with(self.dir.to_str().unwrap()))
        {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
    }
}

/// podman with chio as its runtime (conmon creates and starts; podman kills, stops and
/// deletes): exit codes, stdout, stdin with -i, stop and kill through the container's init,
/// pause and unpause, a terminal with -t, exec (with and without a terminal), and the probes
/// refused inside.
#[test]
fn podman_runs_containers_through_chio() {
    let Some(o) = Oci::with_engine("podman", "podman", "podman conmon") else { return };
    let p = Podman::new(&o);
    let out = p.run(&["run", "--rm", "--read-only", "--network", "none", PODMAN_IMAGE, "/probe", "caps"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("REFUSED: all capability sets empty"), "{out:?}");
    // podman's default seccomp profile is stacked over chio's: two filters on the process
    // beyond the ones this test runs under.
    let filters = |status: &str| {
        status.lines().find_map(|l| l.strip_prefix("Seccomp_filters:")).map(|n| n.trim().parse::<u32>().unwrap())
    };
    let own = filters(&std::fs::read_to_string("/proc/self/status").unwrap()).unwrap();
    let out = p.run(&["run", "--rm", "--read-only", "--network", "none", PODMAN_IMAGE, "/probe", "dump-status"]);
    assert_eq!(filters(&String::from_utf8_lossy(&out.stdout)), Some(own + 2), "{out:?}");
    for (probe, errno) in
        [(vec!["ptrace"], "errno=1"), (vec!["mount", "/run"], "errno=1"), (vec!["unshare", "user"], "errno=1")]
    {
        let mut args = vec!["run", "--rm", "--read-only", "--network", "none", PODMAN_IMAGE, "/probe"];
        args.extend(&probe);
        let out = p.run(&args);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.starts_with("REFUSED") && said.contains(errno), "{probe:?} under podman: {out:?}");
    }
    let mut i = p.cmd(&["run", "--rm", "-i", "--read-only", "--network", "none", PODMAN_IMAGE, "/probe", "copy-stdin"]);
    i.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = i.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"through podman's stdin\n").unwrap();
    let out = output_within(child, Duration::from_secs(60), "podman run -i");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through podman's stdin\n", "{out:?}");

    p.sleeper("sleeper");
    assert!(!podman_launch_cgroups(&o.cgroup_parent).is_empty(), "the container's cgroup is below --cgroup-parent");
    // exec through conmon: output and status come back, and the process is confined.
    let exec = p.run(&["exec", "sleeper", "/probe", "euid"]);
    assert_eq!(
        (exec.status.code(), String::from_utf8_lossy(&exec.stdout).trim()),
        (Some(0), "ESCAPED: euid is 0"),
        "{exec:?}"
    );
    let exec = p.run(&["exec", "sleeper", "/probe", "unshare", "user"]);
    assert_eq!(exec.status.code(), Some(1), "{exec:?}");
    assert!(String::from_utf8_lossy(&exec.stdout).starts_with("REFUSED"), "{exec:?}");
    let exec = p.run(&["exec", "-t", "sleeper", "/probe", "stdin-tty"]);
    assert!(String::from_utf8_lossy(&exec.stdout).starts_with("ESCAPED: stdin is a terminal"), "{exec:?}");
    let pause = p.run(&["pause", "sleeper"]);
    assert!(pause.status.success(), "{pause:?}");
    let state = p.run(&["inspect", "--format", "{{.State.Status}}", "sleeper"]);
    assert_eq!(String::from_utf8_lossy(&state.stdout).trim(), "paused", "{state:?}");
    assert!(p.run(&["unpause", "sleeper"]).status.success());
    let stop = p.run(&["stop", "-t", "5", "sleeper"]);
    assert!(stop.status.success(), "{stop:?}");
    let code = p.run(&["inspect", "--format", "{{.State.ExitCode}}", "sleeper"]);
    assert_eq!(String::from_utf8_lossy(&code.stdout).trim(), "143", "SIGTERM reached the process: {code:?}");
    assert!(p.run(&["rm", "sleeper"]).status.success());

    p.sleeper("killed");
    assert!(p.run(&["kill", "--signal", "KILL", "killed"]).status.success());
    let code = p.run(&["wait", "killed"]);
    assert_eq!(String::from_utf8_lossy(&code.stdout).trim(), "137", "{code:?}");
    assert!(p.run(&["rm", "killed"]).status.success());

    let writable = p.run(&["run", "--rm", "--network", "none", PODMAN_IMAGE, "/probe", "euid"]);
    assert!(!writable.status.success());
    assert!(String::from_utf8_lossy(&writable.stderr).contains("root.readonly is not true"), "{writable:?}");
    // -t: the container's stdio is a terminal conmon holds the other side of (its console
    // socket), and the terminal cannot be used to push input back to the engine (TIOCSTI).
    let tty = p.run(&["run", "--rm", "-t", "--read-only", "--network", "none", PODMAN_IMAGE, "/probe", "stdin-tty"]);
    assert!(String::from_utf8_lossy(&tty.stdout).starts_with("ESCAPED: stdin is a terminal"), "{tty:?}");
    let sti = p.run(&["run", "--rm", "-t", "--read-only", "--network", "none", PODMAN_IMAGE, "/probe", "tiocsti"]);
    assert!(String::from_utf8_lossy(&sti.stdout).starts_with("REFUSED"), "{sti:?}");
    // Every container's cgroup went with it (podman's cleanup deletes each through chio).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !podman_launch_cgroups(&o.cgroup_parent).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(podman_launch_cgroups(&o.cgroup_parent), Vec::<PathBuf>::new(), "cgroups left behind");
}

const PODMAN_IMAGE: &str = "localhost/chio-probe:1";

/// podman with private storage, run and temporary directories under the test's scratch, chio
/// as its runtime (by the `chio-runc` name) and the node configuration as a runtime flag.
struct Podman {
    dir: PathBuf,
    runc: PathBuf,
    node: PathBuf,
    cgroup_parent: String,
}

impl Podman {
    fn new(o: &Oci) -> Podman {
        let dir = o.dir.join("podman");
        let rootfs = dir.join("rootfs");
        chio_tests::build_rootfs(&rootfs, Path::new(PROBE));
        // What podman binds over and mounts on: its /etc/hosts and /etc/hostname, /var/tmp.
        std::fs::write(rootfs.join("etc/hosts"), "").unwrap();
        std::fs::create_dir_all(rootfs.join("var/tmp")).unwrap();
        let runc = o.dir.join("chio-runc");
        if !runc.exists() {
            std::os::unix::fs::symlink(o.chio.with_file_name("chio-full"), &runc).unwrap();
        }
        // Podman's defaults set a sysctl chio does not (ping_group_range): none here.
        std::fs::write(dir.join("containers.conf"), "[containers]\ndefault_sysctls = []\n").unwrap();
        let node = dir.join("node.json");
        let binds = serde_json::json!({"bind_sources": [{"path": dir.join("runroot"), "writable": true}]});
        std::fs::write(&node, binds.to_string()).unwrap();
        let p = Podman { dir, runc, node, cgroup_parent: format!("/{}", o.cgroup_parent) };
        let tar = p.dir.join("rootfs.tar");
        let t = Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&tar).arg(".").output().unwrap();
        assert!(t.status.success());
        let i = p.run(&["import", tar.to_str().unwrap(), PODMAN_IMAGE]);
        assert!(i.status.success(), "podman import: {i:?}");
        p
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("podman");
        let d = |n: &str| self.dir.join(n);
        c.env("CONTAINERS_CONF", d("containers.conf"))
            .arg("--root")
            .arg(d("root"))
            .arg("--runroot")
            .arg(d("runroot"))
            .arg("--tmpdir")
            .arg(d("tmp"))
            .args(["--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file"])
            .arg("--runtime")
            .arg(&self.runc)
            .arg("--runtime-flag")
            .arg(format!("node-config={}", self.node.display()));
        match args.split_first() {
            // Its containers' cgroups (and conmon's) below the test's own parent.
            Some((&"run", rest)) => c.arg("run").arg("--cgroup-parent").arg(&self.cgroup_parent).args(rest),
            _ => c.args(args),
        };
        c.stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        run_within(&mut self.cmd(args), Duration::from_secs(120), &format!("podman {args:?}"))
    }

    /// A detached container `name` that sleeps until it is signalled.
    fn sleeper(&self, name: &str) {
        let args =
            ["run", "-d", "--name", name, "--read-only", "--network", "none", PODMAN_IMAGE, "/probe", "sleeper", name];
        let out = self.run(&args);
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd(&["rm", "--all", "--force"]).output();
        let _ = self.cmd(&["system", "reset", "--force"]).output();
        // podman passes no runtime flag to the runtime calls of its exit command (`container
        // cleanup` deletes with the default root), so the runtime's root is its default; left
        // empty, it goes too.
        let _ = std::fs::remove_dir(oci_default_root());
        // conmon's own cgroups below the parent (podman's, not the runtime's).
        for d in cgroup_dirs(self.cgroup_parent.trim_start_matches('/')) {
            remove_cgroup_tree(&d);
        }
    }
}

fn oci_default_root() -> &'static Path {
    Path::new("/run/chio-oci")
}

/// Cgroups of podman's containers (`libpod-<id>`) below the test's parent, in every hierarchy.
fn podman_launch_cgroups(parent: &str) -> Vec<PathBuf> {
    let below = cgroup_dirs(parent).into_iter().flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten());
    below.map(|e| e.path()).filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "conmon")).collect()
}

/// Remove `dir` and every cgroup below it (each empty by then).
fn remove_cgroup_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A CRI pod's containers join their sandbox's network, ipc and uts namespaces by path: the
/// record of the second container shows the first's namespaces, and a path to the host's own
/// namespace is refused. The first runs on meanwhile: a later launch does not take a running
/// container's cgroup for an orphan's (its `create` has exited) and kill it.
#[test]
fn a_container_joins_its_pods_namespaces() {
    let Some(o) = Oci::new("join") else { return };
    let b = o.bundle("pause", &["/probe", "sleeper", "pause"], |c| c["hostname"] = "pod-a".into());
    let (c, pid) = o.create("pause", &b, &o.dir.join("pause.out"));
    assert!(c.status.success(), "create: {}", String::from_utf8_lossy(&c.stderr));
    let (pid, holder) = (pid.unwrap(), o.saved("pause")["holder"].as_i64().unwrap() as i32);
    assert!(o.run(&["start", "pause"]).status.success());
    reap(holder);
    assert_eq!(o.state("pause")["status"], "running", "{}", std::fs::read_to_string(o.dir.join("pause.out")).unwrap());
    let ns = |kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap().display().to_string();
    let (status, _, rec) = {
        let b = o.bundle("app", &["/probe", "euid"], |c| {
            for (i, kind) in [(1, "ipc"), (2, "uts"), (4, "net")] {
                c["linux"]["namespaces"][i]["path"] = format!("/proc/{pid}/ns/{kind}").into();
            }
        });
        let out = o.dir.join("app.out");
        let (c, apid) = o.create("app", &b, &out);
        assert!(c.status.success(), "create: {}", String::from_utf8_lossy(&c.stderr));
        let holder = o.saved("app")["holder"].as_i64().unwrap() as i32;
        let s = o.run(&["start", "app"]);
        assert!(s.status.success(), "start: {}", String::from_utf8_lossy(&s.stderr));
        let status = wait_exit(apid.unwrap());
        reap(holder);
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(b.join("chio-launch.json")).unwrap()).unwrap();
        assert!(o.run(&["delete", "app"]).status.success());
        (status, std::fs::read_to_string(out).unwrap(), rec)
    };
    assert_eq!((status, rec["state"].as_str()), (0, Some("FullyEnforced")));
    for kind in ["ipc", "uts", "net"] {
        assert_eq!(rec["observed"]["namespaces"][kind]["cage"], ns(kind), "{kind}: {}", rec["observed"]["namespaces"]);
    }
    assert_ne!(rec["observed"]["namespaces"]["mnt"]["cage"], ns("mnt"), "its own mount namespace");
    assert_eq!(o.state("pause")["status"], "running", "the pod's first container outlived the second's launch");
    assert!(o.run(&["delete", "--force", "pause"]).status.success());
    wait_exit(pid);
    let b = o.bundle("host", &["/probe", "euid"], |c| c["linux"]["namespaces"][1]["path"] = "/proc/self/ns/ipc".into());
    let (c, _) = o.create("host", &b, &o.dir.join("host.out"));
    assert!(String::from_utf8_lossy(&c.stderr).contains("is the host's"), "{c:?}");
}
