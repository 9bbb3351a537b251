//! `chio supervisor serve`: launches through the daemon are the one-shot form's (output, status,
//! record), peers get the role their credentials map to, the launch role runs only signed
//! policies under the daemon's pinned signers, every launch is receipted in the daemon's store,
//! hostile requests are answered without stalling anyone, a SIGKILLed daemon leaves nothing
//! behind and its launch becomes outcome_unknown, and SIGTERM gives launches their grace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use chio_tests::{
    chio_bin, copy_executable, lasting_orphaned_inits, launch_cgroups_of, privileged, processes_tagged, relay_data,
    signed_launch, wait_gone, Overlay, Scratch, Stalling,
};
use serde_json::{json, Value};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

#[path = "daemon/log.rs"]
mod log;
#[path = "daemon/metrics.rs"]
mod metrics;

fn chio() -> PathBuf {
    chio_bin(&PathBuf::from(PROBE))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Start a daemon on `dir` (socket, state, log) with `config`; its socket is opened to
    /// everyone so that the daemon's own credential check is what a stranger meets.
    fn start(dir: &Scratch, config: Value) -> Daemon {
        Daemon::start_with(dir, config, None)
    }

    /// [`Daemon::start`], the daemon in a mount namespace of its own (a private copy of the
    /// host's): what other tests mount and unmount on the host meanwhile, which makes a root
    /// made ahead stale, does not reach it.
    fn apart_from_host_mounts(dir: &Scratch, config: Value) -> Daemon {
        let mut cmd = Command::new("unshare");
        cmd.args(["-m", "--propagation", "private"]).arg(chio());
        Daemon::spawn(dir, config, cmd)
    }

    /// [`Daemon::start`], the daemon in a mount namespace of its own where a fresh cgroup2
    /// mount at `v2.0` holds its launch cgroups under `v2.1` (`CHIO_CGROUP_V2_ROOT`).
    fn start_with(dir: &Scratch, config: Value, v2: Option<&V2Root>) -> Daemon {
        Daemon::start_with_env(dir, config, v2, &[])
    }

    /// [`Daemon::start_with`], with `env` added to the daemon's environment.
    fn start_with_env(dir: &Scratch, config: Value, v2: Option<&V2Root>, env: &[(&str, &str)]) -> Daemon {
        let mut cmd = Command::new(chio());
        if let Some(V2Root(mnt, sub)) = v2 {
            let script = r#"set -e; mount -t cgroup2 none "$1"; mkdir -p "$1/$2"; export CHIO_CGROUP_V2_ROOT="$1/$2"
shift 2; exec "$@""#;
            cmd = Command::new("unshare");
            cmd.args(["-m", "--propagation", "private", "sh", "-c", script, "sh", s(mnt), sub, s(&chio())]);
        }
        cmd.envs(env.iter().copied());
        Daemon::spawn(dir, config, cmd)
    }

    /// `cmd` (chio, or what runs it) with `supervisor serve` on `dir` and `config`, started.
    fn spawn(dir: &Scratch, config: Value, cmd: Command) -> Daemon {
        Daemon::spawn_with(dir, config, cmd, &[])
    }

    /// [`Daemon::spawn`], `flags` added to `supervisor serve`'s.
    fn spawn_with(dir: &Scratch, config: Value, mut cmd: Command, flags: &[&str]) -> Daemon {
        let conf = dir.join("supervisor.json");
        std::fs::write(&conf, config.to_string()).unwrap();
        let (socket, log) = (dir.join("s.sock"), dir.join("daemon.log"));
        let before = std::fs::read_to_string(&log).unwrap_or_default().matches("listening on").count();
        let child = cmd
            .args([
                "supervisor",
                "serve",
                "--socket",
                s(&socket),
                "--state-dir",
                s(&dir.join("state")),
                "--config",
                s(&conf),
            ])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon { child, socket, log };
        let until = Instant::now() + Duration::from_secs(10);
        while d.log().matches("listening on").count() <= before {
            assert!(Instant::now() < until, "the daemon did not start: {}", d.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// `chio cage run --supervisor` with `args`, as `uid` (None: root), stdin from `input`.
    fn run(&self, uid: Option<u32>, args: &[&str], input: Option<&str>) -> Output {
        let mut c = Command::new(chio());
        c.args(["cage", "run", "--supervisor", s(&self.socket)]);
        // The flags before `--` (the command's own may say `--timeout` too).
        let flags = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let deadline = chio_tests::with_test_deadline(&mut c, &args[..flags]);
        c.args(&args[flags..]);
        if let Some(u) = uid {
            c.uid(u).gid(u);
        }
        c.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        if let Some(text) = input {
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        }
        let within = chio_tests::seconds(deadline) + chio_tests::PAST_DEADLINE;
        chio_tests::output_within(child, within, &format!("a launch through the daemon: {args:?}"))
    }

    /// `chio cage run --supervisor … ARGS` (stdin /dev/null, stderr the test's), its stdout
    /// read from a file, failing the test if it has not ended `within`: a job stuck on its way
    /// to a launch holds the client's descriptors, and a pipe's reader would wait past any
    /// deadline.
    fn run_bounded(&self, dir: &Scratch, args: &[&str], within: Duration) -> (std::process::ExitStatus, String) {
        let out = dir.join("run-bounded.out");
        let mut c = Command::new(chio());
        c.args(["cage", "run", "--supervisor", s(&self.socket)]).args(args);
        c.stdin(Stdio::null()).stdout(std::fs::File::create(&out).unwrap()).stderr(Stdio::inherit());
        let mut child = c.spawn().unwrap();
        let until = Instant::now() + within;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > until {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("a launch through the daemon did not answer in {within:?}: {args:?}; {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        (status, std::fs::read_to_string(&out).unwrap())
    }

    /// The launcher's spare (the next launch's process), waited for (5 s at most).
    fn spare(&self) -> u32 {
        self.launcher_child("chio-spare")
    }

    /// A process of the launcher's named `name` (a spare, a launch), waited for (5 s at most).
    fn launcher_child(&self, name: &str) -> u32 {
        let children = |pid: u32| -> Vec<u32> {
            let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
            list.split_whitespace().filter_map(|p| p.parse().ok()).collect()
        };
        let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let found = children(self.pid()).into_iter().flat_map(children).find(|p| comm(*p).trim() == name);
            if let Some(p) = found {
                return p;
            }
            assert!(Instant::now() < until, "no {name} under the launcher: {}", self.log());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Wait until the spare has made its launch cgroup ahead (the daemon is idle meanwhile).
    fn spare_prepared(&self) -> u32 {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let spare = self.spare();
            if !launch_cgroups_of(spare).is_empty() {
                return spare;
            }
            assert!(Instant::now() < until, "the spare made no launch cgroup ahead");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The init the spare cloned ahead of its job, waited for (5 s at most).
    fn init_ahead(&self) -> u32 {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let spare = self.spare_prepared();
            let list = std::fs::read_to_string(format!("/proc/{spare}/task/{spare}/children")).unwrap_or_default();
            let comm = |pid: &u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if let Some(p) =
                list.split_whitespace().filter_map(|p| p.parse().ok()).find(|p| comm(p).trim() == "chio-init")
            {
                return p;
            }
            assert!(Instant::now() < until, "the spare cloned no init ahead");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Wait (10 s at most) until a launch's shell tagged `tag` runs in its cage.
    fn wait_for_shell(&self, tag: &str) {
        let until = Instant::now() + Duration::from_secs(10);
        while processes_tagged(tag).iter().all(|&p| !is_sh(p)) {
            assert!(Instant::now() < until, "the launch tagged {tag} did not start: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's descriptors once a finished request's connection is closed (just after
    /// its answer): the same list read twice, 50 ms apart.
    fn settled_fds(&self) -> Vec<String> {
        let mut last = self.fds();
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(50));
            let now = self.fds();
            if now == last {
                return now;
            }
            last = now;
        }
        last
    }

    /// The daemon's open descriptors (what each points at).
    fn fds(&self) -> Vec<String> {
        let dir = format!("/proc/{}/fd", self.pid());
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| {
                format!(
                    "{} -> {}",
                    e.file_name().to_string_lossy(),
                    std::fs::read_link(e.path()).unwrap_or_default().display()
                )
            })
            .collect();
        v.sort();
        v
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The record printed by `--json`: the last line on stderr.
fn record(out: &Output) -> Value {
    let err = text(&out.stderr);
    serde_json::from_str(err.lines().last().unwrap_or_default()).unwrap_or_else(|_| panic!("no record: {err}"))
}

fn config(extra: Value) -> Value {
    let mut c = json!({"schema": "chio.supervisor-config.v1"});
    c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    c
}

#[test]
fn a_launch_through_the_daemon_is_the_one_shot_launch() {
    if !privileged("daemon_one_shot") {
        return;
    }
    let dir = Scratch::new("daemon-same");
    let d = Daemon::start(&dir, config(json!({})));
    let argv = ["--json", "--timeout", "30s", "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 3"];
    let via = d.run(None, &argv, None);
    let mut direct = Command::new(chio());
    let direct = direct.args(["cage", "run"]).args(argv).stdin(Stdio::null()).output().unwrap();
    assert_eq!((via.status.code(), text(&via.stdout)), (Some(3), "out\n".into()), "{}", text(&via.stderr));
    assert_eq!((via.status.code(), text(&via.stdout)), (direct.status.code(), text(&direct.stdout)));
    assert_eq!(text(&via.stderr).lines().next(), Some("err"));
    let (rv, rd) = (record(&via), record(&direct));
    assert_eq!(rv["state"], "FullyEnforced");
    for k in ["state", "argv", "namespaces", "limits", "mode"] {
        assert_eq!(rv[k], rd[k], "{k}");
    }
    assert_eq!(rv["observed"]["fds"], json!([0, 1, 2]));
    // The command's output reaches the client as it comes, not when the command is over.
    let started = Instant::now();
    let mut slow = Command::new(chio())
        .args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", "echo first; exec sleep 2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(slow.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first, "first\n");
    assert!(started.elapsed() < Duration::from_millis(1500), "the first line came after {:?}", started.elapsed());
    assert!(slow.wait().unwrap().success());
    // The launch ran in a child of the daemon's launcher, not in a process of the client's.
    let own = |r: &Value| r["cgroup"]["paths"][0].as_str().unwrap().rsplit('-').nth(1).unwrap().to_string();
    assert_ne!(own(&rv), own(&rd));
    // -i gives the command the client's stdin; --record is written by the client.
    let rec = dir.join("record.json");
    let out = d.run(None, &["-i", "--record", s(&rec), "--", "/bin/cat"], Some("fed through\n"));
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "fed through\n".into()), "{}", text(&out.stderr));
    let written: Value = serde_json::from_slice(&std::fs::read(&rec).unwrap()).unwrap();
    assert_eq!(written["state"], "FullyEnforced");
    // Without -i the command's stdin is /dev/null, as in the one-shot form — never a
    // descriptor of the daemon's or of the spare its cage was made ahead in (twice: the second
    // launch's cage is a spare's, made while the daemon was idle).
    for _ in 0..2 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let out = d.run(None, &["--", "/bin/readlink", "/proc/self/fd/0"], Some("not for the command\n"));
        assert_eq!(text(&out.stdout), "/dev/null\n", "{}", text(&out.stderr));
    }
    // A relative path resolves in the client's directory, as in the one-shot form.
    std::fs::create_dir(dir.join("ws")).unwrap();
    std::fs::write(dir.join("ws/marker"), "here\n").unwrap();
    let mut c = Command::new(chio());
    c.current_dir(&dir.0).args([
        "cage",
        "run",
        "--supervisor",
        s(&d.socket),
        "--workspace",
        "ws",
        "--",
        "/bin/cat",
        "marker",
    ]);
    let out = c.stdin(Stdio::null()).output().unwrap();
    assert_eq!(text(&out.stdout), "here\n", "{}", text(&out.stderr));
    // The daemon's store is the receipt store: the client may not name another.
    let out = d.run(None, &["--receipt-db", "x.db", "--kernel-key", "k", "--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// A daemon started by a process that ignores SIGCHLD (a disposition an exec keeps) still hears
/// its launches end: under an ignored SIGCHLD the kernel reaps children unasked and never says
/// so, and a launch's cage then waited for its command until the wall deadline.
#[test]
fn a_daemon_started_ignoring_sigchld_still_sees_launches_end() {
    if !privileged("daemon_sigchld_ignored") {
        return;
    }
    let dir = Scratch::new("daemon-sigchld");
    let mut cmd = Command::new(chio());
    chio_tests::ignore_sigchld(&mut cmd);
    let d = Daemon::spawn(&dir, config(json!({})), cmd);
    // The launcher (which reaps launches and notices a spare's death by SIGCHLD) and the spare
    // (whose init is cloned from it) hear of their children; the daemon itself still ignores.
    let ignores_sigchld = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:")).unwrap().trim().to_string();
        u64::from_str_radix(&mask, 16).unwrap() & (1 << (libc::SIGCHLD - 1)) != 0
    };
    let spare = d.spare();
    let launcher: u32 = std::fs::read_to_string(format!("/proc/{spare}/stat"))
        .unwrap()
        .rsplit_once(") ")
        .unwrap()
        .1
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(ignores_sigchld(d.pid()), "the daemon was started ignoring SIGCHLD");
    assert!(!ignores_sigchld(launcher) && !ignores_sigchld(spare), "launcher {launcher}, spare {spare}");
    for _ in 0..3 {
        let started = Instant::now();
        let out = d.run(None, &["--json", "--timeout", "20s", "--", "/bin/sh", "-c", "exit 3"], None);
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        assert_eq!(record(&out)["outcome"]["limit_hit"], json!([]));
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }
}

/// The daemon answers as soon as the command is over, before its cage is wound down — so "over"
/// must include everything the command started: processes it left running (in the background,
/// in a session of their own) are killed, reaped and counted before the answer, in both forms.
#[test]
fn nothing_a_command_started_outlives_its_answer() {
    if !privileged("daemon_answer_first") {
        return;
    }
    let dir = Scratch::new("daemon-answer-first");
    let d = Daemon::start(&dir, config(json!({})));
    // `sleep` sums its arguments: the tag is a second, harmless one.
    let tag = format!("0.{:0>10}", std::process::id());
    let script = format!("for i in 1 2; do sleep 300 {tag} & done; setsid sleep 300 {tag} & echo started");
    let argv = ["--json", "--timeout", "30s", "--", "/bin/sh", "-c", script.as_str()];
    let mut direct = Command::new(chio());
    for (form, out) in
        [("daemon", d.run(None, &argv, None)), ("one-shot", direct.args(["cage", "run"]).args(argv).output().unwrap())]
    {
        // Read at once: nothing may be left to die after the answer.
        let left = processes_tagged(&tag);
        assert_eq!(
            (out.status.code(), text(&out.stdout)),
            (Some(0), "started\n".into()),
            "{form}: {}",
            text(&out.stderr)
        );
        assert_eq!(left, Vec::<u32>::new(), "{form}: processes of the command outlived its answer");
        let r = record(&out);
        assert_eq!(r["state"], "FullyEnforced", "{form}");
        assert_eq!(r["outcome"]["killed_at_end"], 3, "{form}: {}", r["outcome"]);
    }
    // A command that leaves nothing behind has nothing killed.
    let out = d.run(None, &["--json", "--", "/bin/sh", "-c", "sleep 0.01 & wait"], None);
    assert_eq!(record(&out)["outcome"]["killed_at_end"], 0);
}

/// The daemon keeps its journal, receipts and image trees in its state directory and gives its
/// socket a group and mode by path: it does not start where anyone but root could replace
/// either directory (or one above them), naming the directory, its owner and mode.
#[test]
fn the_daemon_starts_only_in_directories_no_one_else_can_replace() {
    if !privileged("daemon_private_dirs") {
        return;
    }
    let dir = Scratch::new("daemon-private");
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let theirs = dir.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    for (socket, state, says) in [
        (open.join("s.sock"), dir.join("state"), format!("{} is owned by uid 0 with mode 777", open.display())),
        (dir.join("s.sock"), theirs.join("state"), format!("{} is owned by uid 65534", theirs.display())),
    ] {
        let child = Command::new(chio())
            .args(["supervisor", "serve", "--socket", s(&socket), "--state-dir", s(&state)])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = chio_tests::output_within(child, Duration::from_secs(20), "a daemon in a directory others can write");
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains(&says), "expected {says:?} in {}", text(&out.stderr));
        assert!(!socket.exists(), "{} was bound", socket.display());
    }
}

#[test]
fn peers_get_the_role_their_credentials_map_to() {
    if !privileged("daemon_roles") {
        return;
    }
    let dir = Scratch::new("daemon-roles");
    let d = Daemon::start(&dir, config(json!({"clients": [{"uid": 65533, "role": "launch"}]})));
    // A stranger reaches the daemon (the socket is open to all here) and is refused by it.
    let out = d.run(Some(65534), &["--", "/bin/true"], None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{err}");
    assert!(err.contains("uid 65534 (gid 65534) may not use this supervisor"), "{err}");
    // The launch role may not launch anything but a signed policy.
    let out = d.run(Some(65533), &["--", "/bin/true"], None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("uid 65533 has the launch role: it may only launch under a signed policy"), "{err}");
    // Control: root, mapped to admin, runs the same command.
    assert_eq!(d.run(None, &["--", "/bin/true"], None).status.code(), Some(0));
}

/// A client in a working directory it may enter but not list (mode 0711, as a home directory
/// may be) launches: the directory travels as an `O_PATH` descriptor, which needs no read
/// permission. (Opened for reading, it is refused: "opening the working directory".)
#[test]
fn a_client_in_a_directory_it_cannot_list_launches() {
    if !privileged("daemon_cwd_unlisted") {
        return;
    }
    let dir = Scratch::new("daemon-cwd");
    let d = Daemon::start(&dir, config(json!({"clients": [{"uid": 65531, "role": "admin"}]})));
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o711)).unwrap();
    let out = Command::new(chio())
        .args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/true"])
        .current_dir(&home)
        .uid(65531)
        .gid(65531)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Control: that uid cannot open the directory for reading.
    let listed = Command::new("ls").arg(&home).uid(65531).gid(65531).output().unwrap();
    assert!(!listed.status.success(), "65531 could list {}", home.display());
}

/// The repository role drives its granted workspaces' leg, and launches nothing of its own: not
/// a plain command, not one with a host directory bound in as root.
#[test]
fn the_repository_role_launches_nothing_of_its_own() {
    if !privileged("daemon_repository_role_launch") {
        return;
    }
    let dir = Scratch::new("daemon-repo-launch");
    let host = dir.join("host");
    std::fs::create_dir(&host).unwrap();
    let d = Daemon::start(&dir, config(json!({"clients": [{"uid": 65532, "role": "repository"}]})));
    let write =
        ["--workspace", s(&host), "--uid", "0", "--gid", "0", "--", "/bin/sh", "-c", "echo x > /workspace/planted"];
    for args in [&["--", "/bin/true"][..], &write[..]] {
        let out = d.run(Some(65532), args, None);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains("uid 65532 has the repository role: it may not launch"), "{args:?}: {err}");
    }
    assert!(!host.join("planted").exists(), "the repository role wrote into a host directory as root");
    // Control: root, mapped to admin, runs the same launch.
    assert_eq!(d.run(None, &write, None).status.code(), Some(0));
    assert!(host.join("planted").exists());
}

#[test]
fn the_launch_role_runs_signed_policies_under_the_pinned_signers_and_every_launch_is_receipted() {
    if !privileged("daemon_policy") {
        return;
    }
    let argv = ["/probe", "euid"];
    let p = signed_launch(Path::new(PROBE), &argv, 65534, "enforced");
    let operator = std::fs::read_to_string(&p.operator).unwrap().trim().to_string();
    let kernel_key = p.dir.join("operator/signing.seed");
    let dir = Scratch::new("daemon-policy");
    let conf =
        json!({"clients": [{"uid": 65533, "role": "launch"}], "policy_signers": [operator], "kernel_key": kernel_key});
    let d = Daemon::start(&dir, config(conf));
    let policy = |signer: &str, extra: &[&'static str], command: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> =
            ["--json", "--policy", s(&p.policy), "--policy-signer", signer, "--manifest", s(&p.manifest)]
                .iter()
                .map(|x| x.to_string())
                .collect();
        v.extend(extra.iter().map(|x| x.to_string()));
        v.push("--".into());
        v.extend(command.iter().map(|x| x.to_string()));
        v
    };
    let strs = |v: &[String]| -> Vec<String> { v.to_vec() };
    let run = |args: Vec<String>| d.run(Some(65533), &args.iter().map(String::as_str).collect::<Vec<_>>(), None);
    let out = run(strs(&policy(&operator, &[], &argv)));
    let err = text(&out.stderr);
    assert_eq!(record(&out)["state"], "FullyEnforced", "{err}");
    assert!(text(&out.stdout).contains("euid is 65534"), "{}", text(&out.stdout));
    assert_eq!(record(&out)["annotations"]["policy.id"], "probe-policy");
    assert!(err.contains("chio: receipts "), "{err}");
    let store = chio_kernel::store::Store::open_read_only(&dir.join("state/receipts.db")).unwrap();
    assert_eq!(store.count().unwrap(), 2, "enforcement and terminal receipts in the daemon's store");
    // Another argv: refused by admission, with a denial receipt in the daemon's store.
    let out = run(strs(&policy(&operator, &[], &["/probe", "caps"])));
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is not the admitted argv"), "{}", text(&out.stderr));
    assert_eq!(store.count().unwrap(), 3);
    // A signer the daemon does not pin is refused, whatever the client names.
    let other = Scratch::new("daemon-other-key");
    let key = other.join("k");
    assert!(Command::new(chio()).args(["keys", "generate", "--out", s(&key)]).output().unwrap().status.success());
    let other_key = std::fs::read_to_string(key.join("public.key")).unwrap().trim().to_string();
    let out = run(strs(&policy(&other_key, &[], &argv)));
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("is not one this supervisor pins"), "{}", text(&out.stderr));
    // Host paths, and a wider policy, are the admin's to give: each alone is refused.
    for extra in [&["--workspace", "/root"][..], &["--state-dir", "/root"], &["--allow-root-policy"]] {
        let out = run(strs(&policy(&operator, extra, &argv)));
        assert_eq!(out.status.code(), Some(125), "{extra:?}");
        assert!(text(&out.stderr).contains("only the admin role may give them"), "{extra:?}: {}", text(&out.stderr));
    }
    assert_eq!(store.count().unwrap(), 3, "refusals before admission write no receipt");
}

/// `--record` and `--json` are the client's to handle: a request has no field for them, and one
/// naming a record file anyway — which the launch process would write, as root, wherever the
/// client said — is refused before anything runs, from anyone.
#[test]
fn a_raw_request_may_not_name_a_record_file() {
    if !privileged("daemon_raw_record") {
        return;
    }
    let dir = Scratch::new("daemon-raw-record");
    let d = Daemon::start(&dir, config(json!({})));
    let rec = dir.join("record.json");
    let launch = |id: &str, extra: Value| {
        let mut line = json!({"protocol": "chio.supervisor.v2", "op": "launch", "id": id,
                              "launch": {"options": {"argv": ["/bin/true"]}}});
        for (k, v) in extra.as_object().unwrap() {
            line["launch"][k] = v.clone();
        }
        format!("{line}\n")
    };
    for (id, extra) in [("rec-0", json!({"record": s(&rec)})), ("rec-1", json!({"json": true}))] {
        let files = [std::fs::File::create(dir.join("out")).unwrap(), std::fs::File::create(dir.join("err")).unwrap()];
        let answer = raw_with_fds(&d.socket, launch(id, extra.clone()).as_bytes(), &[&files[0], &files[1]]);
        let field = extra.as_object().unwrap().keys().next().unwrap().clone();
        assert!(
            answer["error"].as_str().is_some_and(|e| e.contains(&format!("unknown field `{field}`"))),
            "{extra}: {answer}"
        );
    }
    assert!(!rec.exists(), "the launch wrote a record where the request said");
    // Control: the same request without them runs.
    let files = [std::fs::File::create(dir.join("out")).unwrap(), std::fs::File::create(dir.join("err")).unwrap()];
    let answer = raw_with_fds(&d.socket, launch("rec-2", json!({})).as_bytes(), &[&files[0], &files[1]]);
    assert_eq!(answer["exit_status"], 0, "{answer}");
}

/// One raw request line on a fresh connection; the answer line (read even when sending failed).
fn raw(socket: &Path, bytes: &[u8]) -> Value {
    let mut c = UnixStream::connect(socket).unwrap();
    let _ = c.write_all(bytes);
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|_| panic!("not an answer: {line:?}"))
}

/// One request line with `files` attached as SCM_RIGHTS; the answer line.
fn raw_with_fds(socket: &Path, line: &[u8], files: &[&std::fs::File]) -> Value {
    let c = UnixStream::connect(socket).unwrap();
    send_with_fds(&c, line, files);
    let mut answer = String::new();
    BufReader::new(&c).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|_| panic!("not an answer: {answer:?}"))
}

/// Send one request line on `c` with `files` attached as SCM_RIGHTS.
fn send_with_fds(c: &UnixStream, line: &[u8], files: &[&std::fs::File]) {
    use std::os::fd::AsRawFd;
    let fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
    let space = unsafe { libc::CMSG_SPACE((fds.len() * 4) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: line.as_ptr() as *mut libc::c_void, iov_len: line.len() };
    // SAFETY: a msghdr over live buffers; one SCM_RIGHTS message sized for `fds`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let cm = libc::CMSG_FIRSTHDR(&msg);
        (*cm).cmsg_level = libc::SOL_SOCKET;
        (*cm).cmsg_type = libc::SCM_RIGHTS;
        (*cm).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as usize;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cm).cast::<i32>(), fds.len());
        assert_eq!(libc::sendmsg(c.as_raw_fd(), &msg, 0), line.len() as isize);
    }
}

/// The request line (with its newline) `chio cage run ARGS --supervisor` sends, as `id`, its
/// stdout and stderr riding along (as `chio internal request` writes it).
fn launch_line(id: &str, args: Value) -> String {
    request_line(id, &["cage", "run"], args)
}

/// The request line `chio OP… ARGS --supervisor` sends, as `id` (stdout and stderr along; stdin
/// too for `-i` and `repository serve`).
fn request_line(id: &str, op: &[&str], args: Value) -> String {
    let args: Vec<&str> = args.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let out =
        Command::new(chio()).args(["internal", "request", "--id", id, "--"]).args(op).args(&args).output().unwrap();
    assert!(out.status.success(), "chio internal request {op:?} {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// A launch request line written by hand, as a client in another language would: `options` as
/// `chio.supervisor.v2` takes them (what is not given takes its default).
fn typed_line(id: &str, options: Value) -> String {
    let line = json!({"protocol": "chio.supervisor.v2", "op": "launch", "id": id, "launch": {"options": options},
                      "fds": {"cwd": false, "stdin": false}});
    format!("{line}\n")
}

/// A launch whose launch process says something on the client's stderr and launches nothing: an
/// environment file that is not there.
fn saying_line(id: &str) -> String {
    typed_line(id, json!({"argv": ["/bin/true"], "env_files": ["/nonexistent/chio-test-env"]}))
}

/// What [`saying_line`]'s launch process says.
const SAID: &str = "env file /nonexistent/chio-test-env";

/// A scratch workspace any uid may write (the cage's command runs as 65534).
fn open_workspace(dir: &Scratch) -> PathBuf {
    let ws = dir.join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o777)).unwrap();
    ws
}

/// Bytes waiting to be read on `c`.
fn unread(c: &UnixStream) -> i32 {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD into a local int on our own socket.
    assert_eq!(unsafe { libc::ioctl(c.as_raw_fd(), libc::FIONREAD, &mut n) }, 0);
    n
}

/// A launch's answer goes to the client from the launch process itself, and whatever its
/// socket does not take at once the daemon writes after it: a client that sends request after
/// request on one connection without reading an answer fills its socket, and then reads every
/// answer whole, in order, each with its id — none cut, doubled or lost.
#[test]
fn a_client_that_reads_no_answer_until_its_socket_is_full_gets_each_whole() {
    if !privileged("daemon_unread") {
        return;
    }
    let dir = Scratch::new("daemon-unread");
    let d = Daemon::start(&dir, config(json!({})));
    let c = UnixStream::connect(&d.socket).unwrap();
    let null = std::fs::File::options().write(true).open("/dev/null").unwrap();
    // Each answer carries its 60 KB argument back in its record: a few fill the socket.
    let script = format!(": {}", "x".repeat(60_000));
    let mut sent = 0;
    loop {
        let args = json!(["--", "/bin/sh", "-c", script]);
        let before = unread(&c);
        send_with_fds(&c, launch_line(&format!("unread-{sent}"), args).as_bytes(), &[&null, &null]);
        sent += 1;
        // Its answer is in once the unread bytes stop growing (a full socket takes none of it).
        let until = Instant::now() + Duration::from_secs(10);
        let mut last = (before, Instant::now());
        while last.1.elapsed() < Duration::from_millis(200) {
            assert!(Instant::now() < until, "request {sent}: no answer: {}", d.log());
            std::thread::sleep(Duration::from_millis(5));
            let now = unread(&c);
            if now != last.0 {
                last = (now, Instant::now());
            }
        }
        let full = last.0 == before;
        assert!(sent < 50, "the socket never filled: {} bytes unread", last.0);
        if full {
            break;
        }
    }
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut lines = BufReader::new(&c).lines();
    for n in 0..sent {
        let line = lines.next().unwrap_or_else(|| panic!("answer {n} of {sent} missing")).unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("answer {n} cut: {line:?}"));
        assert_eq!(answer["id"], format!("unread-{n}"), "{line}");
        assert_eq!(answer["exit_status"], 0, "{line}");
    }
}

/// The launch process answers its client itself: an answer arrives while the daemon's own
/// process is stopped (SIGSTOP) — the daemon reads it afterwards, for its journal.
#[test]
fn the_launch_process_answers_its_client_itself() {
    if !privileged("daemon_direct_answer") {
        return;
    }
    /// Continues the daemon when dropped, whatever the test did.
    struct Continued<'a>(&'a Daemon);
    impl Drop for Continued<'_> {
        fn drop(&mut self) {
            self.0.signal(libc::SIGCONT);
        }
    }
    let dir = Scratch::new("daemon-direct-answer");
    let d = Daemon::start(&dir, config(json!({})));
    let c = UnixStream::connect(&d.socket).unwrap();
    let null = std::fs::File::options().write(true).open("/dev/null").unwrap();
    let tag = format!("direct-tag-{}", std::process::id());
    let line = launch_line("direct-1", json!(["--", "/bin/sh", "-c", format!("sleep 0.5; : {tag}")]));
    send_with_fds(&c, line.as_bytes(), &[&null, &null]);
    // Launched (its job long through the gate) and still running.
    d.wait_for_shell(&tag);
    let _continued = Continued(&d);
    d.signal(libc::SIGSTOP);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    BufReader::new(&c).read_line(&mut answer).expect("no answer while the daemon was stopped");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!((answer["id"].as_str(), answer["exit_status"].as_i64()), (Some("direct-1"), Some(0)), "{answer}");
}

/// A repeat of a request still running (a client that lost its connection and asks again)
/// waits for the first one's outcome and gets its answer — the command runs once.
#[test]
fn a_repeat_of_a_running_request_gets_its_answer_once_it_lands() {
    if !privileged("daemon_repeat_running") {
        return;
    }
    let dir = Scratch::new("daemon-repeat-running");
    let d = Daemon::start(&dir, config(json!({})));
    let ws = open_workspace(&dir);
    let null = std::fs::File::options().write(true).open("/dev/null").unwrap();
    let tag = format!("repeat-tag-{}", std::process::id());
    let args = json!(["--workspace", s(&ws), "--", "/bin/sh", "-c", format!("echo ran >> count; sleep 0.5; : {tag}")]);
    let line = launch_line("repeat-1", args);
    let first = UnixStream::connect(&d.socket).unwrap();
    send_with_fds(&first, line.as_bytes(), &[&null, &null]);
    d.wait_for_shell(&tag);
    let asked = Instant::now();
    let again = raw_with_fds(&d.socket, line.as_bytes(), &[&null, &null]);
    // Once the first answer lands (its command sleeps 0.5 s), not at the end of the wait's bound.
    assert!(asked.elapsed() < Duration::from_millis(1500), "the repeat took {:?}", asked.elapsed());
    let mut answer = String::new();
    BufReader::new(&first).read_line(&mut answer).unwrap();
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["exit_status"], 0, "{answer}");
    assert_eq!(again, answer, "the repeat got another answer");
    assert_eq!(std::fs::read_to_string(ws.join("count")).unwrap(), "ran\n", "the request ran more than once");
}

/// A launch through the daemon sees its client's variables, never the daemon's: `--env KEY`
/// passes the client's value through — a `CHIO_` variable too — and a variable only the daemon
/// has is not there to pass (a usage error, nothing run). Control: the one-shot form passes its
/// own value through.
#[test]
fn a_launch_passes_its_clients_variables_never_the_daemons() {
    if !privileged("daemon_env") {
        return;
    }
    let dir = Scratch::new("daemon-env");
    let secrets = [("CHIO_ZZ_SECRET", "daemon-secret"), ("ZZ_DAEMON_ONLY", "daemon-only")];
    let d = Daemon::start_with_env(&dir, config(json!({})), None, &secrets);
    let show = "echo ${CHIO_ZZ_SECRET-unset} ${ZZ_DAEMON_ONLY-unset}";
    let run = |supervisor: bool, value: &str| {
        let mut c = Command::new(chio());
        c.args(["cage", "run"]);
        if supervisor {
            c.args(["--supervisor", s(&d.socket)]);
        }
        let out = c
            .args(["--env", "CHIO_ZZ_SECRET", "--", "/bin/sh", "-c", show])
            .env("CHIO_ZZ_SECRET", value)
            .env_remove("ZZ_DAEMON_ONLY")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(run(true, "client-value"), "client-value unset\n", "the daemon's value passed through");
    assert_eq!(run(false, "own-value"), "own-value unset\n", "control: the one-shot form passes its own");
    // A client that has neither: the daemon's are not there to pass.
    for (key, value) in secrets {
        let out = dir.join(&format!("out-{key}"));
        let files = [std::fs::File::create(&out).unwrap(), std::fs::File::create(dir.join("err")).unwrap()];
        let line = typed_line(&format!("env-{key}"), json!({"argv": ["/bin/sh", "-c", show], "env": [key]}));
        let answer = raw_with_fds(&d.socket, line.as_bytes(), &[&files[0], &files[1]]);
        assert_eq!(answer["exit_status"], 125, "{key}: {answer}");
        assert!(!std::fs::read_to_string(&out).unwrap().contains(value), "{key}: the daemon's value reached the cage");
    }
}

/// A raw request's environment is the client's to fill: chio's own settings in it (where a
/// cage's cgroups and root go, a test switch that fails a stage) stay the daemon's, and a name
/// or value no environment can hold (empty, `=`, NUL) is dropped, not the launch's end.
#[test]
fn a_clients_variables_never_set_chios_own_settings() {
    if !privileged("daemon_env_settings") {
        return;
    }
    let dir = Scratch::new("daemon-env-settings");
    let d = Daemon::start(&dir, config(json!({})));
    let fake_v2 = dir.join("fake-v2");
    std::fs::create_dir(&fake_v2).unwrap();
    let env = json!([
        ["CHIO_STAGING_DIR", s(&dir.join("no-staging"))],
        ["CHIO_CGROUP_V2_ROOT", s(&fake_v2)],
        ["CHIO_TEST_FAIL_STAGE", "landlock"],
        ["", "empty"],
        ["A=B", "eq"],
        ["N\0UL", "nul"],
        ["VALUE_NUL", "v\0"],
        ["KEPT", "yes"]
    ]);
    let line = json!({"protocol": "chio.supervisor.v2", "op": "launch", "id": "env-settings", "env": env,
                      "launch": {"options": {"argv": ["/bin/sh", "-c", "echo ${KEPT-unset}"], "env": ["KEPT"]}},
                      "fds": {"cwd": false, "stdin": false}});
    let (out, err) = (dir.join("out"), dir.join("err"));
    let files = [std::fs::File::create(&out).unwrap(), std::fs::File::create(&err).unwrap()];
    let answer = raw_with_fds(&d.socket, format!("{line}\n").as_bytes(), &[&files[0], &files[1]]);
    let said = std::fs::read_to_string(&err).unwrap();
    assert_eq!(answer["exit_status"], 0, "{answer} {said}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "yes\n");
    assert_eq!(answer["record"]["state"], "FullyEnforced", "{answer}");
    assert_eq!(std::fs::read_dir(&fake_v2).unwrap().count(), 0, "the launch put its cgroup where the client said");
}

/// A request's arguments are JSON strings, which may hold a NUL byte that no command line can:
/// exec would drop such an argument (or variable) while the record showed it whole. Refused
/// before anything runs; control: the same request without the NUL runs whole.
#[test]
fn an_argument_with_a_nul_byte_is_refused_not_cut() {
    if !privileged("daemon_nul_argument") {
        return;
    }
    let dir = Scratch::new("daemon-nul");
    let d = Daemon::start(&dir, config(json!({})));
    let ran = |id: &str, line: String| {
        let (out, err) = (dir.join(&format!("{id}.out")), dir.join(&format!("{id}.err")));
        let files = [std::fs::File::create(&out).unwrap(), std::fs::File::create(&err).unwrap()];
        let answer = raw_with_fds(&d.socket, line.as_bytes(), &[&files[0], &files[1]]);
        (answer, std::fs::read_to_string(&out).unwrap(), std::fs::read_to_string(&err).unwrap())
    };
    let show = r#"printf '%s|' "$@""#;
    for (id, options, says) in [
        ("nul-arg", json!({"argv": ["/bin/sh", "-c", show, "sh", "a\0b", "c"]}), "contains a NUL byte"),
        ("nul-env", json!({"argv": ["/bin/sh", "-c", show, "sh", "c"], "env": ["K=a\0b"]}), "environment variable"),
    ] {
        let (answer, out, err) = ran(id, typed_line(id, options));
        assert_eq!(answer["exit_status"], 125, "{id}: {answer} {err}");
        assert_eq!(out, "", "{id}: the command ran");
        assert!(err.contains(says), "{id}: {err}");
    }
    let whole = json!({"argv": ["/bin/sh", "-c", show, "sh", "ab", "c"], "env": ["K=ab"]});
    let (answer, out, err) = ran("whole", typed_line("whole", whole));
    assert_eq!((answer["exit_status"].as_i64(), out.as_str()), (Some(0), "ab|c|"), "{answer} {err}");
}

/// A request id runs once. The daemon hands a job on while its journal entry is still being
/// written and holds it at a gate until the entry lands; a request the journal turns away
/// (a repeat, or another request under a used id) must leave no trace: not run again, and not
/// a byte on the client's descriptors — only the answer.
#[test]
fn a_request_id_runs_once_and_a_turned_away_one_leaves_no_trace() {
    if !privileged("daemon_gate") {
        return;
    }
    let dir = Scratch::new("daemon-gate");
    let d = Daemon::start(&dir, config(json!({})));
    let ws = open_workspace(&dir);
    let request = |args: Value| launch_line("once-1", args).into_bytes();
    let args = json!(["--workspace", s(&ws), "--", "/bin/sh", "-c", "echo ran >> count; echo hello; echo note >&2"]);
    let send = |line: &[u8], n: u32| {
        let (out, err) = (dir.join(&format!("out{n}")), dir.join(&format!("err{n}")));
        let files = [std::fs::File::create(&out).unwrap(), std::fs::File::create(&err).unwrap()];
        let answer = raw_with_fds(&d.socket, line, &[&files[0], &files[1]]);
        (answer, std::fs::read_to_string(out).unwrap() + &std::fs::read_to_string(err).unwrap())
    };
    let (first, said) = send(&request(args.clone()), 1);
    assert_eq!((first["exit_status"].as_i64(), said.as_str()), (Some(0), "hello\nnote\n"), "{first}");
    // The same request again: the retained answer, and nothing runs or is written.
    let (again, said) = send(&request(args), 2);
    assert_eq!(again["record"], first["record"]);
    assert_eq!(said, "", "a repeat wrote to the client's descriptors");
    // Another request under the used id — even one that would print an error were it let go —
    // is refused with nothing written.
    let (other, said) = send(saying_line("once-1").as_bytes(), 3);
    assert!(other["error"].as_str().unwrap_or_default().contains("already used for another request"), "{other}");
    assert_eq!(said, "", "a refused request wrote to the client's descriptors");
    assert_eq!(std::fs::read_to_string(ws.join("count")).unwrap(), "ran\n", "the request ran more than once");
    // The same for the repository leg's operations: another operation under a used id is refused
    // before anything of it runs (here `status`, which would complain on the client's stderr).
    let repo = |state: &str| request_line("once-2", &["repository"], json!(["status", "--state", state])).into_bytes();
    let (first, said) = send(&repo(s(&dir.join("absent-1"))), 4);
    assert!(first["exit_status"].as_i64().is_some_and(|c| c != 0) && said.contains("absent-1"), "{first} {said}");
    let (other, said) = send(&repo(s(&dir.join("absent-2"))), 5);
    assert!(other["error"].as_str().unwrap_or_default().contains("already used for another request"), "{other}");
    assert_eq!(said, "", "a refused repository operation wrote to the client's descriptors");
}

/// A launch without a policy builds its cage while its journal entry is written and waits at
/// the gate only before its target goes on: a repeat, or another request under a used id,
/// turned away there never runs its command — not a byte on the client's descriptors, and no
/// answer but the daemon's, even after its launch process has torn the cage it built down and
/// gone.
#[test]
fn a_launch_turned_away_at_its_gate_never_runs_its_command() {
    if !privileged("daemon_gate_late") {
        return;
    }
    let dir = Scratch::new("daemon-gate-late");
    let d = Daemon::start(&dir, config(json!({})));
    let n = std::cell::Cell::new(0);
    // `ran`: whether this request is the one its id runs.
    let send = |id: &str, args: Value, ran: bool| {
        n.set(n.get() + 1);
        let (out, err) = (dir.join(&format!("out{}", n.get())), dir.join(&format!("err{}", n.get())));
        let files = [std::fs::File::create(&out).unwrap(), std::fs::File::create(&err).unwrap()];
        let c = UnixStream::connect(&d.socket).unwrap();
        send_with_fds(&c, launch_line(id, args).as_bytes(), &[&files[0], &files[1]]);
        drop(files);
        let mut reader = BufReader::new(&c);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not an answer: {line:?}"));
        // A launch turned away is gone, its cage torn down, before the daemon answers: what it
        // built counts against the launch limits until then. (One that ran answers first.)
        let deadline = Instant::now() + Duration::from_secs(10);
        while held_open(&out) {
            assert!(ran, "{id} was answered before its launch process was gone: {answer}");
            assert!(Instant::now() < deadline, "the launch process kept the client's stdout");
            std::thread::sleep(Duration::from_millis(10));
        }
        // One answer, and only one, on the connection.
        assert!(reader.buffer().is_empty() && unread(&c) == 0, "a second answer to {id}");
        (answer, std::fs::read_to_string(out).unwrap() + &std::fs::read_to_string(err).unwrap())
    };
    let said = json!(["--", "/bin/sh", "-c", "echo hello"]);
    let (first, out) = send("late-1", said.clone(), true);
    assert_eq!((first["exit_status"].as_i64(), out.as_str()), (Some(0), "hello\n"), "{first}");
    let (again, out) = send("late-1", said, false);
    assert_eq!(again["record"], first["record"], "{again}");
    assert_eq!(out, "", "a repeat turned away at its gate ran its command");
    let (other, out) = send("late-1", json!(["--", "/bin/sh", "-c", "echo other"]), false);
    assert!(other["error"].as_str().unwrap_or_default().contains("already used for another request"), "{other}");
    assert_eq!(out, "", "a request turned away at its gate ran its command");
    // A workspace the command cannot write gets a note before the run (before the command's
    // own stderr), and a repeat none.
    let closed = dir.join("closed");
    std::fs::create_dir(&closed).unwrap();
    let noted = json!(["--workspace", s(&closed), "--", "/bin/sh", "-c", "echo hello >&2"]);
    let (first, out) = send("late-2", noted.clone(), true);
    let (note, hello) = (out.find("is not writable by uid 65534"), out.find("hello"));
    assert!(note.is_some() && hello.is_some() && note < hello, "{first}: {out}");
    assert_eq!(out.matches("is not writable").count(), 1, "{out}");
    let (again, out) = send("late-2", noted, false);
    assert_eq!(again["record"], first["record"], "{again}");
    assert_eq!(out, "", "a repeat turned away at its gate wrote its note");
}

/// Whether any process holds `path` open.
fn held_open(path: &Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else { return false };
    procs.flatten().any(|p| {
        std::fs::read_dir(p.path().join("fd"))
            .map(|fds| fds.flatten().any(|f| std::fs::read_link(f.path()).is_ok_and(|t| t == path)))
            .unwrap_or(false)
    })
}

/// `n` connections the daemon serves, each answered one ping and then idle. A connection made
/// while the daemon has yet to see an earlier client's end is turned away (that one still
/// holds its slot): it is dropped and another made.
fn hold_connections(socket: &Path, n: usize) -> Vec<UnixStream> {
    let until = Instant::now() + Duration::from_secs(10);
    let mut held = Vec::new();
    while held.len() < n {
        assert!(Instant::now() < until, "the daemon served only {} connections", held.len());
        let mut c = UnixStream::connect(socket).unwrap();
        c.write_all(b"{\"protocol\":\"chio.supervisor.v2\",\"id\":\"hold\",\"op\":\"ping\"}\n").unwrap();
        let mut line = String::new();
        BufReader::new(&c).read_line(&mut line).unwrap();
        match serde_json::from_str::<Value>(&line).unwrap()["role"].as_str() {
            Some(_) => held.push(c),
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    held
}

/// The protocol field every request line starts with in these hand-written ones.
const V2: &str = r#""protocol":"chio.supervisor.v2""#;

#[test]
fn hostile_requests_are_answered_and_stall_no_one() {
    if !privileged("daemon_hostile") {
        return;
    }
    let dir = Scratch::new("daemon-hostile");
    let d = Daemon::start(&dir, config(json!({"max_connections": 2, "request_timeout_s": 1})));
    let ping = br#"{"protocol":"chio.supervisor.v2","id":"p1","op":"ping"}"#.to_vec();
    assert_eq!(raw(&d.socket, &[&ping[..], b"\n"].concat())["role"], "admin");
    assert_eq!(d.run(None, &["--", "/bin/true"], None).status.code(), Some(0));
    let fds = d.settled_fds();
    for (bytes, says) in [
        (b"garbage\n".to_vec(), "not a request"),
        (format!("{{{V2},\"id\":\"x\",\"op\":\"format-disk\"}}\n").into_bytes(), "unknown variant `format-disk`"),
        (typed_line("x", json!({"argv": ["/bin/true"]})).into_bytes(), "descriptors do not match"),
        (format!("{{{V2},\"id\":\"../x\",\"op\":\"ping\"}}\n").into_bytes(), "request id"),
        (format!("{{{V2},\"id\":\"\",\"op\":\"ping\"}}\n").into_bytes(), "request id"),
        (format!("{{{V2},\"id\":\"{}\",\"op\":\"ping\"}}\n", "i".repeat(129)).into_bytes(), "request id"),
        (vec![b'x'; (1 << 20) + (64 << 10) * 2], "longer than"),
        // A field the protocol does not have, and a request of the argv protocol before it.
        (format!("{{{V2},\"id\":\"x\",\"op\":\"ping\",\"admin\":true}}\n").into_bytes(), "unknown field `admin`"),
        (
            br#"{"id":"x","op":"launch","args":["--","/bin/true"]}"#.iter().chain(b"\n").copied().collect(),
            "names no protocol",
        ),
        (
            br#"{"protocol":"chio.supervisor.v9","id":"x","op":"ping"}"#.iter().chain(b"\n").copied().collect(),
            "not \"chio.supervisor.v9\"",
        ),
    ] {
        let answer = raw(&d.socket, &bytes);
        assert!(answer["error"].as_str().unwrap().contains(says), "{answer}");
    }
    // A request cut off by the client's end of sending is answered as such, not taken for a
    // clean goodbye.
    let mut c = UnixStream::connect(&d.socket).unwrap();
    c.write_all(br#"{"protocol":"chio.supervisor.v2","id":"cut","op":"ping""#).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut said = String::new();
    c.read_to_string(&mut said).unwrap();
    assert!(said.contains("the request ended mid-line"), "{said:?}");
    // The longest id there may be is one.
    let longest = format!("{{{V2},\"id\":\"{}\",\"op\":\"ping\"}}\n", "i".repeat(128));
    assert_eq!(raw(&d.socket, longest.as_bytes())["role"], "admin");
    // Descriptors a request did not announce, or more than four: refused, and none kept.
    let null = std::fs::File::open("/dev/null").unwrap();
    let answer =
        raw_with_fds(&d.socket, format!("{{{V2},\"id\":\"p2\",\"op\":\"ping\"}}\n").as_bytes(), &[&null, &null]);
    assert!(answer["error"].as_str().unwrap().contains("descriptors do not match"), "{answer}");
    let answer = raw_with_fds(&d.socket, format!("{{{V2},\"id\":\"p3\",\"op\":\"ping\"}}\n").as_bytes(), &[&null; 6]);
    assert!(answer["error"].as_str().unwrap().contains("more than 4 descriptors"), "{answer}");
    // Two idle clients hold both connection slots: a third is answered at once, not queued…
    let idle = hold_connections(&d.socket, 2);
    let answer = raw(&d.socket, &[&ping[..], b"\n"].concat());
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("limit of 2 connections")), "{answer}");
    // …and the idle ones are dropped after the request timeout, freeing them.
    for mut c in idle {
        let mut s = String::new();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_to_string(&mut s).unwrap();
        assert!(s.contains("no complete request within 1 s"), "{s}");
    }
    assert_eq!(raw(&d.socket, &[&ping[..], b"\n"].concat())["role"], "admin");
    assert_eq!(d.run(None, &["--", "/bin/true"], None).status.code(), Some(0));
    assert_eq!(d.settled_fds(), fds, "the daemon holds no descriptor of a finished request");
}

#[test]
fn a_killed_daemon_leaves_nothing_behind_and_its_launch_is_outcome_unknown() {
    if !privileged("daemon_killed") {
        return;
    }
    let dir = Scratch::new("daemon-killed");
    let mut d = Daemon::start(&dir, config(json!({})));
    let tag = format!("killed-tag-{}", std::process::id());
    let mut client = Command::new(chio());
    client.args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", &format!("sleep 30; : {tag}")]);
    let client = client.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    d.wait_for_shell(&tag);
    d.signal(libc::SIGKILL);
    let _ = d.child.wait();
    let out = client.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("closed the connection without an answer"), "{}", text(&out.stderr));
    let left = wait_gone(&tag, Duration::from_secs(5));
    let described: Vec<String> = left.iter().map(|&p| chio_tests::describe_process(p)).collect();
    assert!(left.is_empty(), "the cage died with the daemon: {described:?}");
    assert_eq!(lasting_orphaned_inits(Duration::from_secs(2)), Vec::<u32>::new());
    let restarted = Daemon::start(&dir, config(json!({})));
    assert!(
        restarted.log().contains("recovered: 1 launch(es) dispatched without an outcome are outcome_unknown"),
        "{}",
        restarted.log()
    );
    let launch_cgroups = |pid: u32| -> Vec<PathBuf> {
        let mut left = Vec::new();
        for c in ["pids", "memory", "cpu", "cpuacct"] {
            let root = Path::new("/sys/fs/cgroup").join(c);
            let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            let rel = own
                .lines()
                .find_map(|l| {
                    l.split_once(':')
                        .and_then(|(_, r)| r.split_once(':'))
                        .filter(|(cs, _)| cs.split(',').any(|x| x == c))
                        .map(|(_, p)| p.to_string())
                })
                .unwrap_or_default();
            for e in std::fs::read_dir(root.join(rel.trim_start_matches('/'))).into_iter().flatten().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&format!("chio-{}-", d.pid())) {
                    left.push(e.path());
                }
            }
        }
        left
    };
    assert_eq!(
        launch_cgroups(restarted.pid()),
        Vec::<PathBuf>::new(),
        "no launch cgroup of the killed daemon's launches"
    );
}

/// One daemon per state directory: a second `chio supervisor serve` on a directory a live
/// daemon holds is refused at start, naming the holder, and the first daemon's running launch
/// is left alone (not recovered as `outcome_unknown` under it). A one-shot launch that would
/// write the daemon's receipt store is refused the same way. Controls: once the first daemon
/// has stopped, both the one-shot launch and a new daemon on that directory start.
#[test]
fn a_state_directory_has_one_daemon_and_one_writer() {
    if !privileged("daemon_state_lock") {
        return;
    }
    let dir = Scratch::new("daemon-state-lock");
    let d = Daemon::start(&dir, config(json!({})));
    let tag = format!("state-lock-tag-{}", std::process::id());
    let client = Command::new(chio())
        .args(["cage", "run", "--supervisor", s(&d.socket), "--json", "--"])
        .args(["/bin/sh", "-c", &format!("sleep 2; echo finished; : {tag}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    d.wait_for_shell(&tag);
    let second = Command::new(chio())
        .args(["supervisor", "serve", "--socket", s(&dir.join("second.sock")), "--state-dir", s(&dir.join("state"))])
        .args(["--config", s(&dir.join("supervisor.json"))])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let second =
        chio_tests::output_within(second, Duration::from_secs(10), "a second daemon on a held state directory");
    let said = text(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "a second daemon started on a held state directory: {said}");
    assert!(said.contains("is in use") && said.contains(&d.pid().to_string()), "the refusal names the holder: {said}");
    assert!(!dir.join("second.sock").exists(), "the refused daemon listened");
    let keys = Scratch::new("daemon-state-lock-keys");
    let made = Command::new(chio()).args(["keys", "generate", "--out", s(&keys.join("k"))]).output().unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let one_shot = || {
        Command::new(chio())
            .args(["cage", "run", "--json", "--receipt-db", s(&dir.join("state/receipts.db"))])
            .args(["--kernel-key", s(&keys.join("k/signing.seed")), "--", "/bin/true"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let refused = one_shot();
    assert_eq!(refused.status.code(), Some(125), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("belongs to a running chio supervisor"), "{}", text(&refused.stderr));
    let out = client.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout).lines().next(), Some("finished"), "{}", text(&out.stderr));
    assert_eq!(record(&out)["state"], "FullyEnforced", "{}", text(&out.stderr));
    drop(d);
    let written = one_shot();
    assert_eq!(record(&written)["state"], "FullyEnforced", "control: {}", text(&written.stderr));
    let restarted = Daemon::start(&dir, config(json!({})));
    assert!(
        restarted.log().contains("recovered: 0 launch(es) dispatched without an outcome"),
        "the first daemon's launch ended under it: {}",
        restarted.log()
    );
}

/// A request whose launch finished is answered with its retained record after the daemon
/// restarts, and does not run again.
#[test]
fn a_finished_request_is_answered_from_the_journal_after_a_restart() {
    if !privileged("daemon_restart_replay") {
        return;
    }
    let dir = Scratch::new("daemon-restart-replay");
    let ws = open_workspace(&dir);
    let line = launch_line("replay-1", json!(["--workspace", s(&ws), "--", "/bin/sh", "-c", "echo ran >> count"]));
    let send = |d: &Daemon| {
        let files = [std::fs::File::create(dir.join("out")).unwrap(), std::fs::File::create(dir.join("err")).unwrap()];
        raw_with_fds(&d.socket, line.as_bytes(), &[&files[0], &files[1]])
    };
    let first = send(&Daemon::start(&dir, config(json!({}))));
    assert_eq!(first["record"]["state"], "FullyEnforced", "{first}");
    let again = send(&Daemon::start(&dir, config(json!({}))));
    assert_eq!(again["record"], first["record"], "{again}");
    assert_eq!(std::fs::read_to_string(ws.join("count")).unwrap(), "ran\n", "the request ran again");
}

/// The daemon reads a client's source with the client's rights. A repository-role client
/// whose granted source leads, by a route of its own making, into a repository only root can
/// read — `.git` a link to it, `objects` a link to its objects, a ref a link to its ref, or
/// `objects/info/alternates` naming its objects — imports nothing of it: each `init` is refused
/// and no workspace holds the secret. Controls: each route does reach the secret when read as
/// root (git run as root shows it), and an ordinary source of the client's inits through the
/// daemon.
#[test]
fn a_client_imports_no_repository_only_root_can_read() {
    if !privileged("daemon_source_as_client") {
        return;
    }
    use chio_tests::git;
    let dir = Scratch::new("daemon-source-as-client");
    let client = 65532u32;
    // The secret: a repository in a directory only root may enter.
    let secret = dir.join("secret");
    std::fs::create_dir_all(secret.join("repo/package")).unwrap();
    std::fs::write(secret.join("repo/package/secret.txt"), "TOP SECRET\n").unwrap();
    git(&secret.join("repo"), &["init", "-q"]);
    git(&secret.join("repo"), &["add", "-A"]);
    git(&secret.join("repo"), &["commit", "-qm", "secret"]);
    let secret_commit = git(&secret.join("repo"), &["rev-parse", "HEAD"]);
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret_git = secret.join("repo/.git");
    // The client's own repository, with a commit of its own.
    let own = |name: &str| -> PathBuf {
        let r = dir.join(name);
        std::fs::create_dir_all(r.join("package")).unwrap();
        std::fs::write(r.join("package/mine.txt"), "mine\n").unwrap();
        git(&r, &["init", "-q"]);
        git(&r, &["add", "-A"]);
        git(&r, &["commit", "-qm", "mine"]);
        r
    };
    let dotgit = dir.join("src-dotgit");
    std::fs::create_dir(&dotgit).unwrap();
    std::os::unix::fs::symlink(&secret_git, dotgit.join(".git")).unwrap();
    let objects = own("src-objects");
    std::fs::remove_dir_all(objects.join(".git/objects")).unwrap();
    std::os::unix::fs::symlink(secret_git.join("objects"), objects.join(".git/objects")).unwrap();
    std::fs::write(objects.join(".git/refs/heads/main"), format!("{secret_commit}\n")).unwrap();
    let reflink = own("src-reflink");
    std::fs::remove_file(reflink.join(".git/refs/heads/main")).unwrap();
    std::os::unix::fs::symlink(secret_git.join("refs/heads/main"), reflink.join(".git/refs/heads/main")).unwrap();
    let alternates = own("src-alternates");
    std::fs::write(
        alternates.join(".git/objects/info/alternates"),
        format!("{}\n", secret_git.join("objects").display()),
    )
    .unwrap();
    std::fs::write(alternates.join(".git/refs/heads/main"), format!("{secret_commit}\n")).unwrap();
    // The source itself swapped for a link into root's repository: a grant names the source by
    // path, and every check of its layout passes there.
    let swapped = dir.join("src-swapped");
    std::os::unix::fs::symlink(secret.join("repo"), &swapped).unwrap();
    let ordinary = own("src-ordinary");
    for r in [&dotgit, &objects, &reflink, &alternates, &swapped, &ordinary] {
        let chown = Command::new("chown").args(["-hR", &format!("{client}:{client}")]).arg(r).status().unwrap();
        assert!(chown.success());
    }
    // Control: each route reaches the secret for root.
    for r in [&dotgit, &objects, &alternates, &swapped] {
        let out = Command::new("git")
            .arg("-C")
            .arg(r)
            .args([
                "-c",
                &format!("safe.directory={}", r.display()),
                "show",
                &format!("{secret_commit}:package/secret.txt"),
            ])
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert_eq!(
            text(&out.stdout),
            "TOP SECRET\n",
            "control: {} reaches the secret as root: {}",
            r.display(),
            text(&out.stderr)
        );
    }
    assert_eq!(std::fs::read_to_string(reflink.join(".git/refs/heads/main")).unwrap().trim(), secret_commit);
    assert!(Command::new(chio()).args(["keys", "generate", "--out", s(&dir.join("key"))]).status().unwrap().success());
    let routes = [
        ("dotgit", &dotgit),
        ("objects", &objects),
        ("reflink", &reflink),
        ("alternates", &alternates),
        ("swapped", &swapped),
        ("ordinary", &ordinary),
    ];
    let grants: Vec<Value> = routes
        .iter()
        .map(|(n, r)| json!({"uid": client, "state": dir.join(&format!("ws-{n}")), "sources": [r]}))
        .collect();
    let conf = json!({"clients": [{"uid": client, "role": "repository"}], "kernel_key": dir.join("key/signing.seed"),
                      "workspaces": grants});
    let d = Daemon::start(&dir, config(conf));
    for (name, repo) in routes {
        let state = dir.join(&format!("ws-{name}"));
        let out = Command::new(chio())
            .args(["repository", "--supervisor", s(&d.socket), "init", "--state", s(&state), "--repository", s(repo)])
            .args(["--revision", "main", "--source-path", "package"])
            .uid(client)
            .gid(client)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let held_secret = Command::new("grep")
            .args(["-rq", "TOP SECRET"])
            .arg(&state)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(!held_secret, "{name}: the workspace holds the secret");
        if name == "ordinary" {
            assert!(out.status.success(), "control: an ordinary source inits: {}", text(&out.stderr));
        } else {
            assert!(!out.status.success(), "{name}: a route into root's repository was imported");
            eprintln!("{name}: {}", text(&out.stderr).trim());
        }
    }
}

/// The daemon's socket is born for root and group chio only (mode 0660): a stranger's uid
/// cannot even connect (EACCES). Control: with the socket opened to everyone, the same stranger
/// connects, and meets the daemon's own credential check instead.
#[test]
fn a_stranger_cannot_connect_to_the_daemons_socket() {
    if !privileged("daemon_socket_mode") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let dir = Scratch::new("daemon-socket-mode");
    let (socket, log, conf) = (dir.join("s.sock"), dir.join("daemon.log"), dir.join("supervisor.json"));
    std::fs::write(&conf, config(json!({})).to_string()).unwrap();
    let mut daemon = Command::new(chio())
        .args([
            "supervisor",
            "serve",
            "--socket",
            s(&socket),
            "--state-dir",
            s(&dir.join("state")),
            "--config",
            s(&conf),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("listening on") {
        assert!(
            Instant::now() < until,
            "the daemon did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mode = std::fs::metadata(&socket).unwrap().mode() & 0o7777;
    let stranger = |sock: &Path| {
        Command::new(chio())
            .args(["cage", "run", "--supervisor", s(sock), "--", "/bin/true"])
            .uid(65533)
            .gid(65533)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let refused = stranger(&socket);
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let reached = stranger(&socket);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let _ = daemon.wait();
    assert_eq!(mode, 0o660, "the socket's mode");
    let err = text(&refused.stderr);
    assert!(!refused.status.success() && err.contains("Permission denied"), "a stranger connected: {err}");
    let err = text(&reached.stderr);
    assert!(!reached.status.success() && !err.contains("Permission denied"), "control: {err}");
}

/// `chio supervisor serve` on `socket` (state and configuration beside it) through `cmd`, and
/// its log once it has said it listens or has ended (within 10 s).
fn serve_until_listening(dir: &Scratch, socket: &Path, mut cmd: Command) -> (std::process::Child, String) {
    let (log, conf) = (dir.join("serve.log"), dir.join("supervisor.json"));
    std::fs::write(&conf, config(json!({})).to_string()).unwrap();
    let state = dir.join("state");
    let args = ["supervisor", "serve", "--socket", s(socket), "--state-dir", s(&state), "--config", s(&conf)];
    let mut daemon = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.contains("listening on") || daemon.try_wait().unwrap().is_some() {
            return (daemon, said);
        }
        assert!(Instant::now() < until, "the daemon neither listened nor ended: {said}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stop(mut daemon: std::process::Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let _ = daemon.wait();
}

/// The socket goes to the local group `chio` (from /etc/group, where systemd-sysusers puts it),
/// the group the installed units give their clients: here a daemon in a mount namespace of its
/// own sees an /etc/group naming chio 4242. Control: without that line the socket stays root's.
#[test]
fn the_daemons_socket_is_given_to_group_chio() {
    if !privileged("daemon_socket_group") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    for (with_chio, want_gid) in [(true, 4242), (false, 0)] {
        let dir = Scratch::new("daemon-socket-group");
        let host = std::fs::read_to_string("/etc/group").unwrap();
        let ours: String = host.lines().filter(|l| !l.starts_with("chio:")).map(|l| format!("{l}\n")).collect();
        let group = dir.join("group");
        std::fs::write(&group, if with_chio { format!("{ours}chio:x:4242:\n") } else { ours }).unwrap();
        let mut cmd = Command::new("unshare");
        let script = r#"set -e; mount --bind "$1" /etc/group; shift; exec "$@""#;
        cmd.args(["-m", "--propagation", "private", "sh", "-c", script, "sh", s(&group), s(&chio())]);
        let socket = dir.join("s.sock");
        let (daemon, said) = serve_until_listening(&dir, &socket, cmd);
        let m = std::fs::metadata(&socket).map_err(|e| format!("{e}: {said}"));
        stop(daemon);
        let m = m.unwrap();
        assert_eq!((m.gid(), m.mode() & 0o7777), (want_gid, 0o660), "with chio in /etc/group: {with_chio}");
    }
}

/// What the socket's path names already is replaced only when it is a socket no daemon listens
/// on: a regular file there is refused and kept. Control: a stale socket is replaced.
#[test]
fn a_daemon_replaces_only_a_stale_socket() {
    if !privileged("daemon_socket_replace") {
        return;
    }
    let dir = Scratch::new("daemon-socket-replace");
    let socket = dir.join("s.sock");
    std::fs::write(&socket, "the operator's file\n").unwrap();
    let (mut daemon, said) = serve_until_listening(&dir, &socket, Command::new(chio()));
    let ended = daemon.try_wait().unwrap();
    if ended.is_none() {
        stop(daemon);
    }
    assert!(ended.is_some_and(|s| !s.success()), "a daemon started over a regular file: {said}");
    assert!(said.contains("exists and is not a socket"), "{said}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "the operator's file\n");
    std::fs::remove_file(&socket).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let (daemon, said) = serve_until_listening(&dir, &socket, Command::new(chio()));
    let listening = said.contains("listening on");
    stop(daemon);
    assert!(listening, "control: a stale socket is replaced: {said}");
}

fn is_sh(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| matches!(c.trim_end(), "sleep" | "sh" | "dash"))
}

/// A launch whose launch process dies before it answers (here SIGKILLed while its command
/// runs) is outcome_unknown at once: its client is told so, its cage dies with it, and a repeat of
/// its id is refused as unknown, never run again.
#[test]
fn a_launch_process_killed_mid_launch_leaves_its_request_outcome_unknown() {
    if !privileged("daemon_launch_killed") {
        return;
    }
    let dir = Scratch::new("daemon-launch-killed");
    let d = Daemon::start(&dir, config(json!({})));
    let tag = format!("lost-tag-{}", std::process::id());
    let line = launch_line("lost-1", json!(["--", "/bin/sh", "-c", format!("sleep 30; : {tag}")]));
    let null = std::fs::File::options().write(true).open("/dev/null").unwrap();
    let first = UnixStream::connect(&d.socket).unwrap();
    send_with_fds(&first, line.as_bytes(), &[&null, &null]);
    d.wait_for_shell(&tag);
    let launch = d.launcher_child("chio-launch");
    assert_eq!(unsafe { libc::kill(launch as i32, libc::SIGKILL) }, 0);
    let mut answer = String::new();
    BufReader::new(&first).read_line(&mut answer).unwrap();
    assert!(answer.contains("its outcome is unknown"), "{answer}");
    assert_eq!(wait_gone(&tag, Duration::from_secs(5)), Vec::<u32>::new(), "the cage outlived its launch process");
    let asked = Instant::now();
    let again = raw_with_fds(&d.socket, line.as_bytes(), &[&null, &null]);
    assert!(
        again["error"].as_str().unwrap_or_default().contains("its outcome is unknown; it is not run again"),
        "{again}"
    );
    assert!(asked.elapsed() < Duration::from_millis(1500), "the repeat waited {:?}", asked.elapsed());
}

#[test]
fn sigterm_gives_running_launches_the_grace_then_kills_their_cages() {
    if !privileged("daemon_sigterm") {
        return;
    }
    let dir = Scratch::new("daemon-term");
    let d = Daemon::start(&dir, config(json!({"stop_grace_s": 2})));
    let tag = format!("term-tag-{}", std::process::id());
    let spawn = |script: String| {
        let mut c = Command::new(chio());
        c.args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", &script]);
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn().unwrap()
    };
    let short = spawn(format!("sleep 1; echo finished; : {tag}-short"));
    let long = spawn(format!("sleep 60; : {tag}-long"));
    d.wait_for_shell(&format!("{tag}-long"));
    d.wait_for_shell(&format!("{tag}-short"));
    // The launch processes (the launcher's `chio-launch` children) and their launch cgroups.
    let launches: Vec<u32> = {
        let children = |pid: u32| -> Vec<u32> {
            let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
            list.split_whitespace().filter_map(|p| p.parse().ok()).collect()
        };
        let comm = |pid: &u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        children(d.pid()).into_iter().flat_map(children).filter(|p| comm(p).trim() == "chio-launch").collect()
    };
    assert_eq!(launches.len(), 2, "{}", d.log());
    let cgroups: Vec<PathBuf> = launches.iter().flat_map(|p| launch_cgroups_of(*p)).collect();
    assert!(!cgroups.is_empty());
    let t = Instant::now();
    d.signal(libc::SIGTERM);
    let short = short.wait_with_output().unwrap();
    assert_eq!((short.status.code(), text(&short.stdout)), (Some(0), "finished\n".into()), "{}", text(&short.stderr));
    let long = long.wait_with_output().unwrap();
    assert_eq!(long.status.code(), Some(125), "{}", text(&long.stderr));
    let mut d = d;
    let status = d.child.wait().unwrap();
    let took = t.elapsed();
    assert_eq!(status.code(), Some(0), "{}", d.log());
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(6), "{took:?}: {}", d.log());
    assert!(d.log().contains("killing the launches still running"), "{}", d.log());
    // Wound down before the daemon ended (a service manager kills what is left of its unit then):
    // no launch process lives on, no launch cgroup is left.
    let alive: Vec<&u32> = launches
        .iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|st| !st.contains(") Z ")))
        .collect();
    assert_eq!(alive, Vec::<&u32>::new(), "launch processes outlived the daemon: {}", d.log());
    let left: Vec<&PathBuf> = cgroups.iter().filter(|c| c.exists()).collect();
    assert_eq!(left, Vec::<&PathBuf>::new(), "launch cgroups outlived the daemon");
    assert_eq!(wait_gone(&tag, Duration::from_secs(5)), Vec::<u32>::new());
    assert!(!d.socket.exists(), "the socket is removed at stop");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn under_load_no_launch_fails_and_nothing_leaks() {
    if !privileged("daemon_load") {
        return;
    }
    let dir = Scratch::new("daemon-load");
    let d = Daemon::start(&dir, config(json!({})));
    let tag = format!("load-tag-{}", std::process::id());
    let one = |i: usize| d.run(None, &["--", "/bin/sh", "-c", &format!(": {tag}-{i}")], None);
    assert_eq!(one(0).status.code(), Some(0));
    let clients = 2 * std::thread::available_parallelism().map_or(2, usize::from);
    // Clients launching back to back for `secs`: (launches, failures).
    let load = |secs: u64| -> (usize, Vec<String>) {
        let until = Instant::now() + Duration::from_secs(secs);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..clients)
                .map(|_| {
                    s.spawn(|| {
                        let (mut n, mut failed) = (0, Vec::new());
                        while Instant::now() < until {
                            let out = one(n);
                            n += 1;
                            if out.status.code() != Some(0) {
                                failed.push(text(&out.stderr));
                            }
                        }
                        (n, failed)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).fold((0, Vec::new()), |(n, mut f), (m, g)| {
                f.extend(g);
                (n + m, f)
            })
        })
    };
    // A first round brings the daemon to its working size; the second must not grow it.
    let (warm, failed) = load(2);
    assert!(failed.is_empty(), "{failed:?}");
    let (fds, rss) = (d.settled_fds(), rss_kib(d.pid()));
    let (launches, failed) = load(4);
    assert!(failed.is_empty(), "{} of {launches} launches failed: {:?}", failed.len(), failed.first());
    assert!(warm + launches >= clients * 6, "{launches} launches by {clients} clients in 6 s");
    assert_eq!(wait_gone(&tag, Duration::from_secs(2)), Vec::<u32>::new());
    assert_eq!(d.settled_fds(), fds, "descriptors after {launches} launches");
    let grown = rss_kib(d.pid()).saturating_sub(rss);
    assert!(grown < 512, "the daemon's RSS grew {grown} KiB over {launches} launches");
    eprintln!("load: {clients} clients, {warm} + {launches} launches in 2 + 4 s, RSS {rss} KiB + {grown} KiB");
}

/// `chio repository --supervisor S …`: the leg's operations run by the daemon for an admin —
/// init, execute (its output and status), status, export — exactly as the one-shot commands;
/// the launch role is refused them.
#[test]
fn the_repository_leg_through_the_daemon() {
    if !privileged("daemon_repository") {
        return;
    }
    let dir = Scratch::new("daemon-repo");
    let granted = dir.join("ws");
    let own = dir.join("ws3");
    let calc = chio_tests::calculator_repo(&dir.0);
    assert!(Command::new(chio())
        .args(["keys", "generate", "--out", s(&dir.join("key"))])
        .output()
        .unwrap()
        .status
        .success());
    let conf = json!({"clients": [{"uid": 65533, "role": "launch"}, {"uid": 65532, "role": "repository"}],
                      "kernel_key": dir.join("key/signing.seed"),
                      "workspaces": [{"uid": 65532, "state": granted}, {"uid": 65532, "state": own, "sources": [calc]},
                                     {"uid": 65531, "state": dir.join("ws2"), "sources": [calc]},
                                     {"uid": 65532, "state": dir.join("home/ws"), "sources": [calc]}]});
    let d = Daemon::start(&dir, config(conf));
    let leg = |args: &[&str], uid: Option<u32>| {
        let mut c = Command::new(chio());
        c.current_dir(&dir.0).args(["repository", "--supervisor", s(&d.socket)]).args(args);
        if let Some(u) = uid {
            c.uid(u).gid(u);
        }
        c.stdin(Stdio::null()).output().unwrap()
    };
    let init = ["init", "--state", "ws", "--repository", "calc", "--revision", "HEAD", "--source-path", "package"];
    let out = leg(&[&init[..], &["--kernel-key", "key/signing.seed"]].concat(), None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.join("ws/workspace.json").exists(), "relative paths resolve in the client's directory");
    let out = leg(
        &[
            "execute",
            "--state",
            "ws",
            "--operation-key",
            "k1",
            "--",
            "cd package && python3 -B -m unittest 2>&1 | tail -1; exit 4",
        ],
        None,
    );
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(4), "FAILED (failures=1)\n".into()),
        "{}",
        text(&out.stderr)
    );
    let fix = "sed -i 's/a - b/a + b/' package/calc.py";
    assert_eq!(leg(&["execute", "--state", "ws", "--operation-key", "k2", "--", fix], None).status.code(), Some(0));
    let out = leg(&["status", "--state", "ws", "--json"], None);
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["operations"]["completed"], 2, "{st}");
    let out = leg(&["export", "--state", "ws", "--out", "bundle"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(dir.join("bundle/changes.patch")).unwrap().contains("+    return a + b"));
    // What the launch process says (here the command's output, as `execute` prints it) can be
    // more than a pipe holds: a client that reads as it comes gets all of it.
    let big = leg(
        &["execute", "--state", "ws", "--operation-key", "k-big", "--", "head -c 300000 /dev/zero | tr '\\0' x"],
        None,
    );
    assert_eq!((big.status.code(), big.stdout.len()), (Some(0), 300_000), "{}", text(&big.stderr));
    // A usage error is clap's, as the one-shot form gives it.
    assert_eq!(leg(&["execute", "--state", "ws"], None).status.code(), Some(2));
    // An execute's cage is the one its spare made ahead (its init, in the pid namespace that
    // init made before the request; held open so that its number cannot be another's), and so
    // is its root, made for the root of the last execute (after a launch with another root).
    let other_root = dir.join("rootfs");
    chio_tests::build_rootfs(&other_root, Path::new(PROBE));
    let other = d.run(None, &["--rootfs", s(&other_root), "--", "/probe", "cat", "/etc/hostname"], None);
    assert_eq!(other.status.code(), Some(0), "{}", text(&other.stderr));
    let script = r#"readlink /proc/self/ns/pid; while read -r id _ _ _ at _; do [ "$at" = / ] && echo "$id"; done < /proc/self/mountinfo"#;
    let (made, roots_ahead, lines) = with_steady_mounts(|attempt| {
        let key = format!("k-pre-{attempt}");
        let pre = leg(&["execute", "--state", "ws", "--operation-key", &key, "--", "true"], None);
        assert_eq!(pre.status.code(), Some(0), "{}", text(&pre.stderr));
        let init = d.init_ahead();
        let (_held, made) = held_ns(&init.to_string(), "pid");
        let roots_ahead = mount_ids_held(init);
        let key = format!("k-ns-{attempt}");
        let out = leg(&["execute", "--state", "ws", "--operation-key", &key, "--", script], None);
        (made, roots_ahead, text(&out.stdout).lines().map(String::from).collect::<Vec<String>>())
    });
    assert_eq!(lines.first(), Some(&made), "{lines:?}");
    assert!(lines.get(1).is_some_and(|root| roots_ahead.contains(root)), "the execute built its own root: {lines:?}");
    // The launch role may not drive the leg.
    let out = leg(&["status", "--state", "ws"], Some(65533));
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("need the admin or repository role"), "{}", text(&out.stderr));
    // The repository role runs execute and status on its granted workspace, nothing else (ws2,
    // below, is another uid's grant).
    let ws = s(&granted);
    let out = leg(
        &[
            "execute",
            "--state",
            ws,
            "--operation-key",
            "k3",
            "--",
            "cd package && python3 -B -m unittest 2>&1 | tail -1",
        ],
        Some(65532),
    );
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "OK\n".into()), "{}", text(&out.stderr));
    assert_eq!(leg(&["status", "--state", ws], Some(65532)).status.code(), Some(0));
    let init2 = ["init", "--state", "ws2", "--repository", "calc", "--revision", "HEAD", "--source-path", "package"];
    assert!(leg(&[&init2[..], &["--kernel-key", "key/signing.seed"]].concat(), None).status.success());
    let other = dir.join("ws2");
    let copy = dir.join("calc2");
    assert!(Command::new("cp").args(["-a", s(&calc), s(&copy)]).status().unwrap().success());
    // Refused operations name this path; nothing may ever be made there.
    let never = dir.join("never");
    let init_own = |state: &Path, repo: &Path, extra: &[&str]| {
        let mut args = vec!["init", "--state", s(state), "--repository", s(repo), "--revision", "HEAD"];
        args.extend_from_slice(&["--source-path", "package"]);
        args.extend_from_slice(extra);
        leg(&args, Some(65532))
    };
    for (out, says) in [
        (
            leg(&["execute", "--state", s(&other), "--operation-key", "k4", "--", "true"], Some(65532)),
            "is not granted to uid 65532",
        ),
        (leg(&["export", "--state", s(&other), "--out", s(&never)], Some(65532)), "is not granted to uid 65532"),
        (init_own(&never, &calc, &[]), "is not granted to uid 65532"),
        // Whether a path exists is not told (the daemon looks as root).
        (leg(&["status", "--state", s(&dir.join("absent/ws"))], Some(65532)), "is not granted to uid 65532"),
        (leg(&["status", "--state", "/root"], Some(65532)), "is not granted to uid 65532"),
        (init_own(&own, &copy, &[]), "is not a source granted to uid 65532"),
        (init_own(&own, &calc, &["--kernel-key", "k"]), "give neither"),
        (init_own(&own, &calc, &["--image-store", "/tmp"]), "give neither"),
        (leg(&["recover", "--state", ws], Some(65532)), "init, execute, status and export only"),
    ] {
        assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{says}: {}", text(&out.stderr));
    }
    assert!(!own.exists());
    // A grant in a directory the client owns is refused: the client could rename the workspace
    // away and put its own in its place (a configuration naming uid 0 for its commands).
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65532), Some(65532)).unwrap();
    let out = init_own(&home.join("ws"), &calc, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is owned by uid 65532"), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_dir(&home).unwrap().count(), 0);
    // The repository role creates its granted workspace from a granted source, signed with the
    // supervisor's key, and drives it to an export.
    let out = init_own(&own, &calc, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let public = std::fs::read_to_string(dir.join("key/public.key")).unwrap();
    let conf: Value = serde_json::from_slice(&std::fs::read(own.join("workspace.json")).unwrap()).unwrap();
    assert_eq!(conf["kernel_public_key"].as_str(), Some(public.trim()), "{conf}");
    let out = leg(&["execute", "--state", s(&own), "--operation-key", "f", "--", fix], Some(65532));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Its export is written with its own rights: into a directory it owns, as its files ...
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mine = dir.join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::os::unix::fs::chown(&mine, Some(65532), Some(65532)).unwrap();
    let out = leg(&["export", "--state", s(&own), "--out", s(&mine.join("bundle"))], Some(65532));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let patch = mine.join("bundle/changes.patch");
    assert!(std::fs::read_to_string(&patch).unwrap().contains("+    return a + b"));
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&patch).unwrap();
    assert_eq!((m.uid(), m.gid()), (65532, 65532));
    // ... never where it may not write (a root directory), nor over what exists; the same
    // export by an admin (root) succeeds there: the refusal is the client's rights.
    for out_dir in [dir.join("bundle-root"), mine.join("bundle")] {
        let out = leg(&["export", "--state", s(&own), "--out", s(&out_dir)], Some(65532));
        assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains("as uid 65532"), "{}", text(&out.stderr));
    }
    assert!(!dir.join("bundle-root").exists());
    let out = leg(&["export", "--state", s(&own), "--out", s(&dir.join("bundle-root"))], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(std::fs::read_dir(own.join("tmp")).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("export-for")));
    assert!(!never.exists());
    // A link to the grant is the grant; the operation runs on the grant's own path.
    std::os::unix::fs::symlink(&granted, dir.join("link")).unwrap();
    let out = leg(&["status", "--state", s(&dir.join("link")), "--json"], Some(65532));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Only `serve` reads the client's stdin; any other operation leaves it alone, even one the
    // client would relay (a file on an overlay: the daemon takes no such descriptor).
    use std::io::Seek;
    let overlay = Overlay::mount("daemon-repo-stdin");
    let requests = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","#,
        r#""capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        "\n"
    );
    std::fs::write(overlay.join("in"), requests).unwrap();
    let mut input = std::fs::File::open(overlay.join("in")).unwrap();
    let with_input = |args: &[&str], input: &std::fs::File| {
        let mut c = Command::new(chio());
        c.current_dir(&dir.0).args(["repository", "--supervisor", s(&d.socket)]).args(args);
        c.stdin(input.try_clone().unwrap()).output().unwrap()
    };
    let out = with_input(&["status", "--state", "ws", "--json"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(input.stream_position().unwrap(), 0, "status read the client's stdin");
    // `serve` answers each request as it comes (its stdout is the client's own).
    let mut serve = Command::new(chio())
        .current_dir(&dir.0)
        .args(["repository", "--supervisor", s(&d.socket), "serve", "--state", "ws"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_serve = serve.stdin.take().unwrap();
    to_serve.write_all(requests.lines().next().unwrap().as_bytes()).unwrap();
    to_serve.write_all(b"\n").unwrap();
    let from_serve = serve.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(from_serve).read_line(&mut line);
        let _ = tx.send(line);
    });
    let reply = rx.recv_timeout(Duration::from_secs(10));
    drop(to_serve);
    assert!(serve.wait().unwrap().success());
    let reply = reply.expect("serve did not answer a request before its input ended");
    assert!(reply.contains("protocolVersion"), "{reply}");
    let out = with_input(&["serve", "--state", "ws"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let replies: Vec<Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(replies.len(), 2, "{replies:?}");
    assert_eq!(replies[1]["result"]["tools"][0]["name"], "execute", "{replies:?}");
    assert_eq!(input.stream_position().unwrap(), requests.len() as u64);
}

/// A client uid holds at most its share: a launch over `max_launches_per_client` (after a
/// second's wait for one of its own to end) and a connection over `max_connections_per_client`
/// (at once) are answered "try again", while another client is served.
#[test]
fn one_client_holds_at_most_its_share() {
    if !privileged("daemon_share") {
        return;
    }
    let dir = Scratch::new("daemon-share");
    let conf = json!({"max_launches_per_client": 1, "max_connections_per_client": 2, "stop_grace_s": 1,
                      "clients": [{"uid": 65533, "role": "launch"}]});
    let d = Daemon::start(&dir, config(conf));
    let tag = format!("share-tag-{}", std::process::id());
    let mut long = Command::new(chio());
    long.args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", &format!("sleep 30; : {tag}")]);
    let long = long.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    d.wait_for_shell(&tag);
    let out = d.run(None, &["--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("uid 0 has its limit of 1 launches running"), "{}", text(&out.stderr));
    // The long launch's client holds one connection; one more fits, a third does not.
    let _idle = UnixStream::connect(&d.socket).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let answer = raw(&d.socket, b"{\"protocol\":\"chio.supervisor.v2\",\"id\":\"p\",\"op\":\"ping\"}\n");
    assert!(answer["error"].as_str().unwrap().contains("uid 0 has its limit of 2 connections open"), "{answer}");
    // Another client is served meanwhile (and refused only for what its role may not do).
    let out = d.run(Some(65533), &["--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("launch role"), "{}", text(&out.stderr));
    drop(d);
    let _ = long.wait_with_output();
    assert_eq!(wait_gone(&tag, Duration::from_secs(5)), Vec::<u32>::new());
}

/// Through the daemon (a spare's init made ahead), `--net loopback` brings `lo` up and the
/// default leaves it down — and the record says what the kernel has, read in the cage.
#[test]
fn loopback_through_the_daemon_is_what_the_record_says() {
    if !privileged("daemon_loopback") {
        return;
    }
    let dir = Scratch::new("daemon-loopback");
    let d = Daemon::start(&dir, config(json!({})));
    let lo = "import fcntl, socket, struct; \
              f = fcntl.ioctl(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), 0x8913, struct.pack('256s', b'lo')); \
              print('up' if struct.unpack('H', f[16:18])[0] & 1 else 'down')";
    for (net, state, up) in [("loopback", "up\n", true), ("none", "down\n", false)] {
        d.init_ahead();
        let out = d.run(None, &["--json", "--net", net, "--", "/usr/bin/python3", "-c", lo], None);
        assert_eq!((out.status.code(), text(&out.stdout).as_str()), (Some(0), state), "{net}: {}", text(&out.stderr));
        assert_eq!(record(&out)["reported"]["loopback_up"], up, "{net}");
    }
}

/// A client launching back to back at its `max_launches_per_client` is never refused: each
/// launch answers its client itself, a moment before the daemon reads that it ended, and a
/// client that sends its next request the instant its answer arrives (this one, on a raw
/// socket) would otherwise find its own finished launch still counted against it.
#[test]
fn a_client_at_its_limit_launching_back_to_back_is_served() {
    if !privileged("daemon_share_back_to_back") {
        return;
    }
    let dir = Scratch::new("daemon-share-b2b");
    let d = Daemon::start(&dir, config(json!({"max_launches_per_client": 1})));
    let (out, err) = (dir.join("out"), dir.join("err"));
    let files = [std::fs::File::create(&out).unwrap(), std::fs::File::create(&err).unwrap()];
    for i in 0..40 {
        let line = launch_line(&format!("b2b-{i}"), json!(["--", "/bin/true"]));
        let answer = raw_with_fds(&d.socket, line.as_bytes(), &[&files[0], &files[1]]);
        assert_eq!(answer["exit_status"], 0, "launch {i}: {answer}");
    }
}

/// The daemon's launcher makes each launch's network namespace before the request (see
/// chio_cage::ahead): every cage still gets one of its own — not the host's, not an earlier
/// launch's — holding nothing but its loopback device, and no socket. Each namespace compared
/// is held open by the test while the later ones are made (as if their cages still ran), so
/// that no number is compared with one the kernel has since given to a new namespace.
#[test]
fn every_launch_gets_a_fresh_network_namespace_of_its_own() {
    if !privileged("daemon_netns") {
        return;
    }
    let dir = Scratch::new("daemon-netns");
    let d = Daemon::start(&dir, config(json!({})));
    let (host, host_ns) = held_ns("self", "net");
    let (mut held, mut seen) = (vec![host], vec![host_ns]);
    let mut fresh = |ns: String| {
        assert!(ns.starts_with("net:[") && !seen.contains(&ns), "{ns} was seen before: {seen:?}");
        seen.push(ns);
    };
    // Four launches one after another, each on a spare that made its namespace ahead.
    for i in 0..4 {
        d.init_ahead();
        let (child, ns) = netns_launch(&d, &mut held, &format!("netns-tag-{}-{i}", std::process::id()));
        fresh(ns.clone());
        only_loopback(child, &ns);
    }
}

/// A launch through the daemon that shows its network namespace and its contents, then sleeps
/// a moment; returns it and its namespace, which `held` keeps open from the host side.
fn netns_launch(d: &Daemon, held: &mut Vec<std::fs::File>, tag: &str) -> (Child, String) {
    let show = "readlink /proc/self/ns/net; cat /proc/net/dev /proc/net/tcp /proc/net/tcp6 /proc/net/unix | wc -l; \
                grep -c '^ *lo:' /proc/net/dev";
    let script = format!("{show}; sleep 0.5; : {tag}");
    let mut c = Command::new(chio());
    c.args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", &script]);
    let child = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    d.wait_for_shell(tag);
    let sh = processes_tagged(tag).into_iter().find(|p| is_sh(*p)).unwrap();
    let (file, ns) = held_ns(&sh.to_string(), "net");
    held.push(file);
    (child, ns)
}

/// The launch saw `ns` holding only its loopback device and no socket.
fn only_loopback(child: Child, ns: &str) {
    let o = text(&child.wait_with_output().unwrap().stdout);
    // /proc/net/dev: two header lines and lo; tcp, tcp6 and unix: their header line only.
    assert_eq!(o.lines().collect::<Vec<_>>(), [ns, "6", "1"], "{o}");
}

/// Launches share the digests earlier ones computed, but only for the very file unchanged: a
/// script rewritten in place (same inode, same size, even with its mtime put back) is hashed
/// again, and every record names the digest of what ran.
#[test]
fn a_shared_digest_is_never_stale() {
    use sha2::{Digest, Sha256};
    if !privileged("daemon_digests") {
        return;
    }
    let dir = Scratch::new("daemon-digests");
    let d = Daemon::start(&dir, config(json!({})));
    let ws = dir.join("ws");
    std::fs::create_dir(&ws).unwrap();
    let script = ws.join("s.sh");
    let mut first_mtime = None;
    for (i, word) in ["one", "two", "six", "ten", "two"].iter().enumerate() {
        let body = format!("#!/bin/sh\necho {word}\n");
        let f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&script).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        (&f).write_all(body.as_bytes()).unwrap();
        // Only ctime (which no caller can set) tells the rewrite apart.
        let mtime = *first_mtime.get_or_insert_with(|| f.metadata().unwrap().modified().unwrap());
        f.set_modified(mtime).unwrap();
        drop(f);
        for _ in 0..2 {
            let out = d.run(None, &["--json", "--workspace", s(&ws), "--", "/workspace/s.sh"], None);
            assert_eq!(text(&out.stdout), format!("{word}\n"), "run {i}: {}", text(&out.stderr));
            let want = format!("{:x}", Sha256::digest(body.as_bytes()));
            assert_eq!(record(&out)["target"]["sha256"], want.as_str(), "run {i} ({word})");
        }
    }
}

/// The shared digest table never vouches for a file another uid can write by its identity. A
/// writer holds a dirty shared mapping of a workspace binary while a launch of it looks at it
/// (that launch's exec fails: ETXTBSY), then changes it through the mapping (no timestamp
/// moves, asserted: the identity rule would call it unchanged) and unmaps. The next launch
/// hashes it at its exec stop: the record names the bytes as they are, not a digest a launch
/// took while the writer held it.
#[test]
fn a_shared_digest_never_vouches_for_a_file_another_uid_can_write() {
    use sha2::{Digest, Sha256};
    if !privileged("daemon_digest_writable") {
        return;
    }
    let dir = Scratch::new("daemon-digest-writable");
    let d = Daemon::start(&dir, config(json!({})));
    let ws = open_workspace(&dir);
    let probe = ws.join("probe");
    copy_executable(Path::new(PROBE), &probe);
    std::os::unix::fs::chown(&probe, Some(65534), Some(65534)).unwrap();
    let sha = |p: &Path| format!("{:x}", Sha256::digest(std::fs::read(p).unwrap()));
    let launch = || d.run(None, &["--json", "--workspace", s(&ws), "--", "/workspace/probe", "euid"], None);
    let mapping = chio_tests::DirtyMapping::new(&probe);
    let before = chio_tests::file_identity(&probe);
    let first = launch();
    assert_eq!(record(&first)["failure"]["code"], "target_not_executable", "{}", text(&first.stderr));
    assert!(text(&first.stderr).contains("Text file busy"), "{}", text(&first.stderr));
    let was = sha(&probe);
    mapping.swap();
    assert_eq!(chio_tests::file_identity(&probe), before, "control: no timestamp moved");
    assert_ne!(sha(&probe), was, "control: the bytes changed");
    let second = launch();
    assert_eq!(record(&second)["state"], "FullyEnforced", "{}", text(&second.stderr));
    assert_eq!(record(&second)["target"]["sha256"], sha(&probe).as_str(), "a stale digest: {}", text(&second.stderr));
}

/// The launcher keeps the next launch's process ready (a spare, `chio-spare`, holding the
/// launch cgroup it made ahead); one killed while it waits is replaced, the next launch runs,
/// and no spare's cgroup outlives it (swept by the next, removed at a stop).
#[test]
fn a_killed_spare_is_replaced_and_the_next_launch_runs() {
    if !privileged("daemon_spare") {
        return;
    }
    let dir = Scratch::new("daemon-spare");
    let d = Daemon::start(&dir, config(json!({})));
    let mut spares = Vec::new();
    for round in 0..3 {
        // Killed before (round 0) and after (then) it made its work ahead.
        let spare = if round == 0 { d.spare() } else { d.spare_prepared() };
        spares.push(spare);
        // SAFETY: killing the daemon's spare, a child of its launcher.
        unsafe { libc::kill(spare as i32, libc::SIGKILL) };
        let out = d.run(None, &["--", "/bin/sh", "-c", "echo ran"], None);
        assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "ran\n".into()), "{}", text(&out.stderr));
    }
    spares.push(d.spare_prepared());
    drop(d);
    for pid in spares {
        assert_eq!(launch_cgroups_of(pid), Vec::<PathBuf>::new(), "spare {pid}");
    }
}

/// The spare forks its cgroup's janitor ahead too, off the request's path: the launch that
/// takes the cgroup takes that janitor (and forks none of its own), and a spare killed before
/// its job has its cgroup removed by it at once, with the launcher (whose sweep would remove it
/// too) stopped meanwhile.
#[test]
fn a_spares_janitor_is_made_ahead_and_taken_by_its_launch() {
    if !privileged("daemon_janitor_ahead") {
        return;
    }
    let janitors = |pid: u32| -> Vec<u32> {
        let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let comm = |p: &u32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        list.split_whitespace().filter_map(|p| p.parse().ok()).filter(|p| comm(p).trim() == "chio-janitor").collect()
    };
    let made_ahead = |spare: u32| -> Vec<u32> {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let found = janitors(spare);
            if !found.is_empty() {
                return found;
            }
            assert!(Instant::now() < until, "spare {spare} forked no janitor ahead of its job");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let dir = Scratch::new("daemon-janitor-ahead");
    let d = Daemon::start(&dir, config(json!({})));

    // Taken by the launch: while its command runs, the janitor made ahead is its only one.
    d.init_ahead();
    let spare = d.spare_prepared();
    let ahead = made_ahead(spare);
    assert_eq!(ahead.len(), 1, "{ahead:?}");
    let tag = format!("janitor-tag-{}", std::process::id());
    let mut c = Command::new(chio());
    c.args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", &format!("sleep 0.5; : {tag}")]);
    let child = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    d.wait_for_shell(&tag);
    assert_eq!(janitors(spare), ahead, "the launch must use the janitor its spare made ahead");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // Killed before its job, with the launcher stopped: its janitor removes its cgroup.
    let spare = d.spare_prepared();
    made_ahead(spare);
    assert!(!launch_cgroups_of(spare).is_empty());
    let continued = Stopped::new(parent_of(spare));
    // SAFETY: killing the daemon's spare.
    unsafe { libc::kill(spare as i32, libc::SIGKILL) };
    let until = Instant::now() + Duration::from_secs(5);
    while !launch_cgroups_of(spare).is_empty() {
        assert!(Instant::now() < until, "spare {spare}'s cgroup outlived it: {:?}", launch_cgroups_of(spare));
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(continued);
    let out = d.run(None, &["--", "/bin/sh", "-c", "echo ran"], None);
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "ran\n".into()), "{}", text(&out.stderr));
}

/// A process of the daemon's, stopped (SIGSTOP) until this drops, whatever the test did.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        // SAFETY: stopping a process of the daemon under test (continued on drop).
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: continuing the process `new` stopped.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// The parent of process `pid`.
fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit(')').next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A job goes from the daemon straight to the spare, which takes it off the queue itself: with
/// the launcher stopped, a launch still runs and answers. The launcher forks the next spare
/// once it is continued, and the next launch runs in that one.
#[test]
fn a_job_reaches_the_spare_without_the_launcher() {
    if !privileged("daemon_queue") {
        return;
    }
    let dir = Scratch::new("daemon-queue");
    let d = Daemon::start(&dir, config(json!({})));
    let spare = d.spare_prepared();
    let stopped = Stopped::new(parent_of(spare));
    let (status, out) = d.run_bounded(&dir, &["--", "/bin/sh", "-c", "echo ran"], Duration::from_secs(20));
    assert_eq!((status.code(), out.as_str()), (Some(0), "ran\n"));
    drop(stopped);
    let next = d.spare_prepared();
    assert_ne!(next, spare, "the launcher must fork the next spare");
    let out = d.run(None, &["--json", "--", "/bin/true"], None);
    assert_eq!(record(&out)["state"], "FullyEnforced", "{}", text(&out.stderr));
    let paths = record(&out)["cgroup"]["paths"].clone();
    assert!(paths[0].as_str().unwrap().contains(&format!("/chio-{next}-")), "{paths}");
}

/// The next launch's work ahead waits until the last launch has wound its cage down (its
/// process reaped): made beside that teardown, right after the answer, it took the CPUs from
/// the client, which goes on then (a client process exits and its parent wakes). Each launch
/// process is watched from its answer to its end; the spare after it must have made nothing
/// ahead meanwhile — within the wait's bound ([`HELD_AT_LEAST`]), which a teardown on a loaded
/// machine may outlast — and has made it once that launch is gone.
#[test]
fn the_next_spare_works_ahead_only_once_the_last_launch_has_wound_down() {
    if !privileged("daemon_ahead_after_teardown") {
        return;
    }
    let dir = Scratch::new("daemon-ahead-after");
    let d = Daemon::start(&dir, config(json!({})));
    let files = [std::fs::File::create(dir.join("out")).unwrap(), std::fs::File::create(dir.join("err")).unwrap()];
    let children = |pid: u32| -> Vec<u32> {
        let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        list.split_whitespace().filter_map(|p| p.parse().ok()).collect()
    };
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let mut watched = 0;
    for round in 0..20 {
        // The spare, ready: the process that takes the next job and answers it.
        let launch = d.spare_prepared();
        let launcher = parent_of(launch);
        let line = launch_line(&format!("wound-{round}"), json!(["--", "/bin/true"]));
        let answer = raw_with_fds(&d.socket, line.as_bytes(), &[&files[0], &files[1]]);
        let answered = Instant::now();
        assert_eq!(answer["exit_status"], 0, "{answer}");
        while Path::new(&format!("/proc/{launch}")).exists() && answered.elapsed() < HELD_AT_LEAST {
            for next in children(launcher).into_iter().filter(|p| *p != launch && comm(*p).trim() == "chio-spare") {
                let made = launch_cgroups_of(next);
                // (Read again: the launch may have been reaped, and the spare told, in between.)
                if !made.is_empty()
                    && Path::new(&format!("/proc/{launch}")).exists()
                    && answered.elapsed() < HELD_AT_LEAST
                {
                    panic!("round {round}: spare {next} made {made:?} ahead while launch {launch} wound its cage down");
                }
            }
            watched += 1;
        }
    }
    assert!(watched > 0, "no launch process was seen winding its cage down after its answer");
    // And it is made once the launch is gone.
    d.spare_prepared();
}

/// How long the launcher's spare surely waits for a launch winding its cage down: its
/// WIND_DOWN_WAIT of 50 ms, counted from when the launcher heard of the answer, less 10 ms for
/// a test thread slow to note when the client had it.
const HELD_AT_LEAST: Duration = Duration::from_millis(40);

/// A launch whose teardown does not end (held here by a test switch, as an init whose exit
/// blocks would hold it) holds the next spare's work ahead only for the wait's bound: the
/// spare has made its cgroup well before the held launch process ends, and not before the
/// bound has passed since the answer.
#[test]
fn a_teardown_that_does_not_end_holds_the_next_spares_work_only_so_long() {
    if !privileged("daemon_ahead_teardown_held") {
        return;
    }
    let dir = Scratch::new("daemon-ahead-held");
    let d = Daemon::start_with_env(&dir, config(json!({})), None, &[("CHIO_TEST_HOLD_TEARDOWN_MS", "2500")]);
    let files = [std::fs::File::create(dir.join("out")).unwrap(), std::fs::File::create(dir.join("err")).unwrap()];
    let launch = d.spare_prepared();
    let launcher = parent_of(launch);
    let line = launch_line("held", json!(["--", "/bin/true"]));
    let answer = raw_with_fds(&d.socket, line.as_bytes(), &[&files[0], &files[1]]);
    let answered = Instant::now();
    assert_eq!(answer["exit_status"], 0, "{answer}");
    let spares = || {
        let list = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).unwrap_or_default();
        let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let kids: Vec<u32> = list.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        kids.into_iter().filter(|p| *p != launch && comm(*p).trim() == "chio-spare").collect::<Vec<u32>>()
    };
    let made = loop {
        let made: Vec<PathBuf> = spares().into_iter().flat_map(launch_cgroups_of).collect();
        if !made.is_empty() {
            break made;
        }
        assert!(
            answered.elapsed() < Duration::from_secs(2),
            "no spare worked ahead in 2 s while launch {launch} held its teardown"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let after = answered.elapsed();
    assert!(Path::new(&format!("/proc/{launch}")).exists(), "launch {launch} ended before the check: {after:?}");
    assert!(after >= HELD_AT_LEAST, "the spare made {made:?} ahead {after:?} after the answer, within the wait");
}

/// A spare that leaves a job queued (stopped here; one stuck in a step of its work ahead
/// alike) is killed once the hand-off time is up, and the next spare runs the job, once: the
/// stopped one never took it. Nothing of the killed spare is left.
#[test]
fn a_job_a_stuck_spare_leaves_queued_runs_in_the_next() {
    if !privileged("daemon_queue_stuck") {
        return;
    }
    let dir = Scratch::new("daemon-queue-stuck");
    let d = Daemon::start(&dir, config(json!({})));
    let ws = open_workspace(&dir);
    let stuck = d.spare_prepared();
    let stopped = Stopped::new(stuck);
    let began = Instant::now();
    let args = ["--workspace", s(&ws), "--", "/bin/sh", "-c", "echo ran >> /workspace/runs; echo ran"];
    let (status, out) = d.run_bounded(&dir, &args, Duration::from_secs(30));
    let waited = began.elapsed();
    assert_eq!((status.code(), out.as_str()), (Some(0), "ran\n"));
    assert!(waited >= Duration::from_secs(4), "the job went past the stopped spare in {waited:?}");
    assert_eq!(std::fs::read_to_string(ws.join("runs")).unwrap(), "ran\n", "the job must run once");
    assert!(!Path::new(&format!("/proc/{stuck}")).exists(), "the stopped spare {stuck} must be killed and reaped");
    let until = Instant::now() + Duration::from_secs(5);
    while !launch_cgroups_of(stuck).is_empty() {
        assert!(Instant::now() < until, "spare {stuck}'s cgroup outlived it: {:?}", launch_cgroups_of(stuck));
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(stopped);
}

/// The launch cgroup a spare made before its job gets the job's ceilings: a burst of processes
/// past --pids and an allocation past --memory are stopped there; the same commands under the
/// default ceilings (the control) are not.
#[test]
fn the_cgroup_made_ahead_gets_the_requests_ceilings() {
    if !privileged("daemon_cgroup_ahead") {
        return;
    }
    let dir = Scratch::new("daemon-cgroup-ahead");
    let d = Daemon::start(&dir, config(json!({})));
    let burst = "n=0; for i in $(seq 12); do sleep 2 & n=$((n+1)); done 2>/dev/null; echo started $n";
    let hog = "python3 -c 'b = b\"x\" * (200 << 20); print(\"held\")'";
    let run = |limits: &[&str], cmd: &str| {
        // The launch must take the cgroup its spare made ahead.
        let spare = d.spare_prepared();
        let mut args = vec!["--json"];
        args.extend_from_slice(limits);
        args.extend_from_slice(&["--", "/bin/sh", "-c", cmd]);
        let out = d.run(None, &args, None);
        let paths = record(&out)["cgroup"]["paths"].clone();
        assert!(paths[0].as_str().unwrap().contains(&format!("/chio-{spare}-")), "{paths}");
        (text(&out.stdout), record(&out)["outcome"]["limit_hit"].clone())
    };
    let (out, hit) = run(&["--pids", "6", "--timeout", "10s"], burst);
    assert!(hit.as_array().unwrap().contains(&json!("pids")), "{out} {hit}");
    let (out, hit) = run(&["--timeout", "10s"], burst);
    assert_eq!((out.trim(), hit), ("started 12", json!([])), "control: the default ceiling allows the burst");
    let (out, hit) = run(&["--memory", "32M"], hog);
    assert!(hit.as_array().unwrap().contains(&json!("memory")), "{out} {hit}");
    let (out, hit) = run(&[], hog);
    assert_eq!((out.trim(), hit), ("held", json!([])), "control: the default ceiling holds 200 MB");
}

/// The spare makes a default root's host part ahead (the binds of `/usr`, `/lib`… and the
/// cage's own `/etc` with copies of the host's files); a host file that changes after that is
/// seen by the next launch as it is now, never as it was when the spare made its copy.
#[test]
fn a_default_root_made_ahead_is_never_stale() {
    if !privileged("daemon_host_ahead") {
        return;
    }
    /// Appends a comment line to the host's /etc/nsswitch.conf; puts the file back when dropped.
    struct Marked(Vec<u8>);
    impl Drop for Marked {
        fn drop(&mut self) {
            let _ = std::fs::write("/etc/nsswitch.conf", &self.0);
        }
    }
    let dir = Scratch::new("daemon-host-ahead");
    let d = Daemon::start(&dir, config(json!({})));
    let marker = format!("# chio test marker {}", std::process::id());
    let copied = || text(&d.run(None, &["--", "/bin/cat", "/etc/nsswitch.conf"], None).stdout);
    assert_eq!(
        copied(),
        std::fs::read_to_string("/etc/nsswitch.conf").unwrap(),
        "the cage's /etc/nsswitch.conf is the host's"
    );
    for _ in 0..2 {
        d.spare_prepared();
        // The spare makes the root after its cgroup: give it time to finish.
        std::thread::sleep(Duration::from_millis(500));
        let original = std::fs::read("/etc/nsswitch.conf").unwrap();
        let _restore = Marked(original.clone());
        std::fs::write("/etc/nsswitch.conf", [&original[..], format!("{marker}\n").as_bytes()].concat()).unwrap();
        assert!(copied().ends_with(&format!("{marker}\n")), "the launch saw a copy made before the change");
    }
    assert!(!std::fs::read_to_string("/etc/nsswitch.conf").unwrap().contains(&marker));
}

/// The spare makes ahead the root the last launch had (here an image directory: the skeleton,
/// `/dev`, `/tmp` and the binds of its top-level entries), and the next launch with that root
/// takes it: the cage's `/` is a mount the init cloned ahead holds. A launch with another root
/// (the first, after the spare made the default root ahead) builds its own.
#[test]
fn the_next_launch_takes_the_root_made_ahead_for_the_last_ones() {
    if !privileged("daemon_root_ahead") {
        return;
    }
    let dir = Scratch::new("daemon-root-ahead");
    let rootfs = dir.join("rootfs");
    chio_tests::build_rootfs(&rootfs, Path::new(PROBE));
    let d = Daemon::start(&dir, config(json!({})));
    let root_mount = |extra: &[&str]| {
        let args = [&["--rootfs", s(&rootfs)], extra, &["--", "/probe", "cat", "/proc/self/mountinfo"]].concat();
        let out = d.run(None, &args, None);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let info = text(&out.stdout);
        let root = info.lines().find(|l| l.split(' ').nth(4) == Some("/")).map(|l| l.split(' ').next().unwrap());
        root.unwrap_or_else(|| panic!("no / in the cage's mountinfo: {info}")).to_string()
    };
    let made_ahead = mount_ids_held(d.init_ahead());
    assert!(!made_ahead.contains(&root_mount(&[])), "a root made ahead for the default root served an image's");
    for _ in 0..2 {
        // The launch before leads the spare to make this root ahead, watched from there on.
        let taken = with_steady_mounts(|_| {
            root_mount(&[]);
            mount_ids_held(d.init_ahead()).contains(&root_mount(&[]))
        });
        assert!(taken, "the launch built its own root, not the one made ahead");
    }
    // A bind over one of the image's top-level entries: that entry is not the image's in this
    // cage, so the root made ahead (which binds it) does not serve.
    let made_ahead = mount_ids_held(d.init_ahead());
    let over_etc = format!("{}:/etc", s(&dir.join("rootfs/etc")));
    assert!(!made_ahead.contains(&root_mount(&["--ro-bind", &over_etc])), "a root made ahead served a bind over /etc");
}

/// A root made ahead for an image directory is used only while that directory is what it was:
/// an entry added at its top level, the directory swapped for another at the same path, an
/// entry removed — after the spare made the root — are each what the next launch sees.
#[test]
fn a_root_made_ahead_for_an_image_is_never_stale() {
    if !privileged("daemon_root_ahead_stale") {
        return;
    }
    let dir = Scratch::new("daemon-root-ahead-stale");
    let rootfs = dir.join("rootfs");
    chio_tests::build_rootfs(&rootfs, Path::new(PROBE));
    let d = Daemon::start(&dir, config(json!({})));
    let sees = |path: &str| {
        let out = d.run(None, &["--rootfs", s(&rootfs), "--", "/probe", "read", path], None);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out.stderr));
        out.status.code() == Some(0)
    };
    assert!(sees("/probe") && !sees("/added"));
    d.init_ahead();
    std::fs::write(rootfs.join("added"), "").unwrap();
    assert!(sees("/added"), "an entry added after the root was made ahead is missing");
    d.init_ahead();
    std::fs::rename(&rootfs, dir.join("rootfs-old")).unwrap();
    chio_tests::build_rootfs(&rootfs, Path::new(PROBE));
    std::fs::write(rootfs.join("swapped"), "").unwrap();
    assert!(sees("/swapped"), "the launch saw the directory that was at the path when the root was made ahead");
    d.init_ahead();
    std::fs::remove_file(rootfs.join("swapped")).unwrap();
    assert!(!sees("/swapped"), "an entry removed after the root was made ahead is still there");
}

/// An init that pivoted into a root made ahead which then went stale (an entry added at the
/// image's top level after it was made) is still the one its launch takes: its launch process
/// builds the plan's whole root at the request, and the init pivots again, into that, leaving
/// the stale one behind. The launch sees the entry, and runs in the namespaces of the init made
/// ahead, not in a fresh one's (the daemon in a mount namespace of its own, so that no test
/// beside this one makes its spare make the root and init again meanwhile).
#[test]
fn an_init_whose_root_made_ahead_went_stale_pivots_into_the_plans_root() {
    if !privileged("daemon_root_ahead_replaced") {
        return;
    }
    let dir = Scratch::new("daemon-root-ahead-replaced");
    let rootfs = dir.join("rootfs");
    chio_tests::build_rootfs(&rootfs, Path::new(PROBE));
    let d = Daemon::apart_from_host_mounts(&dir, config(json!({})));
    let sees = |path: &str| {
        let out = d.run(None, &["--json", "--rootfs", s(&rootfs), "--", "/probe", "read", path], None);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out.stderr));
        let rec = record(&out);
        (out.status.code() == Some(0), rec["observed"]["namespaces"]["pid"]["cage"].as_str().unwrap_or("").to_string())
    };
    assert!(!sees("/added").0);
    let init = d.init_ahead();
    wait_text_mapped(init);
    let (_held, made) = held_ns(&init.to_string(), "pid");
    std::fs::write(rootfs.join("added"), "").unwrap();
    let (seen, ran_in) = sees("/added");
    assert!(seen, "an entry added after the root was made ahead is missing");
    assert_eq!(ran_in, made, "the launch did not take the init made ahead");
}

/// The mount ids of the files process `pid` holds open (its fdinfo's `mnt_id`).
/// `f` run until a run sees nothing mounted or unmounted on the host from its start to its end
/// (20 runs at most): a root made ahead serves only while the host's mounts stay as they were
/// (`mounts::RootAhead`), and tests beside this one mount and unmount file systems. The host's
/// mount table is watched as the daemon watches it: POLLPRI on an open `/proc/self/mountinfo`.
fn with_steady_mounts<T>(mut f: impl FnMut(usize) -> T) -> T {
    use std::os::fd::AsRawFd;
    for attempt in 0..20 {
        let table = std::fs::File::open("/proc/self/mountinfo").unwrap();
        let got = f(attempt);
        let mut p = libc::pollfd { fd: table.as_raw_fd(), events: libc::POLLPRI, revents: 0 };
        // SAFETY: one pollfd on a descriptor we hold, no wait.
        assert!(unsafe { libc::poll(&mut p, 1, 0) } >= 0);
        if p.revents & (libc::POLLPRI | libc::POLLERR) == 0 {
            return got;
        }
    }
    panic!("the host's mounts changed during each of 20 runs")
}

fn mount_ids_held(pid: u32) -> Vec<String> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fdinfo")).unwrap();
    let info = fds.flatten().map(|e| std::fs::read_to_string(e.path()).unwrap_or_default());
    info.filter_map(|i| i.lines().find_map(|l| l.strip_prefix("mnt_id:").map(|v| v.trim().to_string()))).collect()
}

/// The spare clones the next launch's init ahead (into its namespaces and launch cgroup), and
/// the launch takes it: the target runs in the pid, ipc and uts namespaces that init made
/// before the request, and in the mount namespace it made and pivoted in before the request,
/// into the root made ahead (the plan's own trees, here the workspace, are opened at the
/// request, in the host's mounts as they are then: see
/// `a_host_mount_changed_after_the_spare_got_ready_is_what_the_launch_sees`). Each launch takes
/// a different one.
#[test]
fn a_launch_takes_the_init_its_spare_cloned_ahead() {
    if !privileged("daemon_init_ahead") {
        return;
    }
    let dir = Scratch::new("daemon-init-ahead");
    std::fs::create_dir(dir.join("ws")).unwrap();
    std::fs::write(dir.join("ws/marker"), "relative\n").unwrap();
    let d = Daemon::apart_from_host_mounts(&dir, config(json!({})));
    const NS: [&str; 3] = ["pid", "ipc", "uts"];
    let mut seen = Vec::new();
    for _ in 0..2 {
        let init = d.init_ahead();
        // Both have their program's text mapped while they wait (its first run on the request's
        // path would fault it in page by page).
        for pid in [init, d.spare()] {
            wait_text_mapped(pid);
        }
        // Held open, so that no later namespace can take their numbers if that init is not used.
        let (_held, made): (Vec<_>, Vec<_>) = NS.iter().map(|n| held_ns(&init.to_string(), n)).unzip();
        // (With its text mapped, it has pivoted: it maps its text only once it has.)
        let (_held_mnt, pivoted) = held_ns(&init.to_string(), "mnt");
        let script = NS.map(|n| format!("readlink /proc/self/ns/{n};")).concat()
            + "readlink /proc/self/ns/mnt; cat /workspace/marker";
        let host_mnt = held_ns("self", "mnt").1;
        let out = Command::new(chio())
            .args(["cage", "run", "--supervisor", s(&d.socket), "--workspace", "ws", "--", "/bin/sh", "-c", &script])
            .current_dir(&dir.0)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
        assert_eq!(lines[..3], made[..], "the target runs in the namespaces the init made ahead");
        assert_ne!(lines[3], host_mnt, "the target runs in a mount namespace of its own");
        assert_eq!(lines[3], pivoted, "the init made its mount namespace, and pivoted, before the request");
        assert_eq!(lines[4], "relative", "--workspace ws resolved in the client's directory");
        seen.push(made);
    }
    assert_ne!(seen[0], seen[1], "each launch has an init of its own");
}

/// A root an init pivoted into before its request is the root a one-shot launch builds: the
/// same mounts with the same options and file systems (among them the workspace the launch
/// process opened at the request), the root, `/dev`, `/etc` and `/proc` sealed read-only, the
/// root-only procfs files of a uid 0 target covered, no ephemeral port. The daemon's launch is
/// checked to be the pivoted one (its mount namespace is the one its init pivoted in ahead); a
/// mutation that left that root unsealed and unmasked passed every other test of this suite.
#[test]
fn a_root_pivoted_into_ahead_is_sealed_and_masked_as_a_one_shot_root() {
    if !privileged("daemon_root_pivoted_ahead") {
        return;
    }
    let dir = Scratch::new("daemon-pivoted-root");
    let ws = dir.join("ws");
    std::fs::create_dir(&ws).unwrap();
    let d = Daemon::apart_from_host_mounts(&dir, config(json!({})));
    let script = "readlink /proc/self/ns/mnt
        awk '{for (i = 7; i <= NF; i++) if ($i == \"-\") { print $5, $6, $(i + 1); break }}' /proc/self/mountinfo | sort
        touch /planted 2>/dev/null && echo root-writable || echo root-sealed
        touch /proc/planted 2>/dev/null && echo proc-writable || echo proc-sealed
        touch /workspace/made && echo workspace-writable
        [ -c /proc/timer_list ] && echo timer_list-covered || echo timer_list-open
        cat /proc/sys/net/ipv4/ip_local_port_range";
    let args = ["--uid", "0", "--gid", "0", "--workspace", s(&ws), "--", "/bin/sh", "-c", script];
    // A launch first, so that the spare makes this root ahead.
    assert_eq!(d.run(None, &args, None).status.code(), Some(0));
    let init = d.init_ahead();
    wait_text_mapped(init);
    let (_held, pivoted) = held_ns(&init.to_string(), "mnt");
    let daemon = d.run(None, &args, None);
    assert_eq!(daemon.status.code(), Some(0), "{}", text(&daemon.stderr));
    let daemon = text(&daemon.stdout);
    let (mnt, daemon) = daemon.split_once('\n').unwrap();
    assert_eq!(mnt, pivoted, "the launch ran in the root its init pivoted into ahead");
    let one_shot = Command::new(chio()).args(["cage", "run"]).args(args).stdin(Stdio::null()).output().unwrap();
    assert_eq!(one_shot.status.code(), Some(0), "{}", text(&one_shot.stderr));
    let one_shot = text(&one_shot.stdout);
    let one_shot = one_shot.split_once('\n').unwrap().1;
    assert_eq!(daemon, one_shot, "the root pivoted into ahead differs from a one-shot launch's");
    for line in ["/ ro,", "/proc ro,", "/dev ro,", "/etc ro,", "/workspace rw,"] {
        assert!(daemon.lines().any(|l| l.starts_with(line)), "no {line:?} mount in:\n{daemon}");
    }
    let probes = "root-sealed\nproc-sealed\nworkspace-writable\ntimer_list-covered\n65534\t65535\n";
    assert!(daemon.ends_with(probes), "{daemon}");
}

/// A spare whose root made ahead went stale — something was mounted on the host after it was
/// made — makes it again, with a new init pivoted into it, before the request comes; the next
/// launch takes that init rather than cloning its own (on a host whose mounts change now and
/// then, every launch would otherwise lose the init made ahead).
#[test]
fn a_spare_makes_its_root_again_after_the_hosts_mounts_change() {
    if !privileged("daemon_root_renewed") {
        return;
    }
    let dir = Scratch::new("daemon-root-renewed");
    let d = Daemon::start(&dir, config(json!({})));
    let args = ["--", "/bin/sh", "-c", "readlink /proc/self/ns/pid"];
    // A launch first, so that the spare makes its root ahead.
    assert_eq!(d.run(None, &args, None).status.code(), Some(0));
    let first = d.init_ahead();
    wait_text_mapped(first);
    let at = HostDir::new(dir.join("mnt"));
    let mounted = TestMount::new(&at.0, "x");
    let until = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{first}")).exists() {
        assert!(Instant::now() < until, "the spare kept the init pivoted into a root gone stale");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (_held, made, ran) = with_steady_mounts(|_| {
        let init = d.init_ahead();
        wait_text_mapped(init);
        let (held, made) = held_ns(&init.to_string(), "pid");
        let out = d.run(None, &args, None);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        (held, made, text(&out.stdout).trim().to_string())
    });
    assert_eq!(ran, made, "the launch did not take the init made again");
    drop(mounted);
}

/// An init cloned ahead that its launch cannot use — here the plan, with 70 KiB of arguments,
/// is too big for the one message that hands it over — is killed and reaped at once, and the
/// launch clones its own and runs: no zombie of it waits out the launch under the launch
/// process (a mutation run found nothing showed that the unused init was ever killed).
#[test]
fn an_init_made_ahead_that_its_launch_cannot_use_is_reaped() {
    if !privileged("daemon_init_unused") {
        return;
    }
    let dir = Scratch::new("daemon-init-unused");
    let d = Daemon::start(&dir, config(json!({})));
    let init = d.init_ahead();
    let big = "x".repeat(70 * 1024);
    let mut client = Command::new(chio())
        .args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", "sleep 2; echo ran", "sh", &big])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_millis(1500);
    while Path::new(&format!("/proc/{init}")).exists() {
        let state = std::fs::read_to_string(format!("/proc/{init}/stat")).unwrap_or_default();
        assert!(Instant::now() < until, "the unused init is still there while its launch runs: {state}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(client.try_wait().unwrap().is_none(), "the launch ended before the check");
    let out = client.wait_with_output().unwrap();
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "ran\n".into()), "{}", text(&out.stderr));
}

/// Wait (5 s at most) until process `pid` has the whole of its program's executable mapping
/// in its page tables (Rss = Size in its smaps).
fn wait_text_mapped(pid: u32) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let text = || {
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
        let mut lines = smaps.lines().skip_while(|l| !(l.contains(" r-xp ") && l.ends_with(exe.to_str().unwrap())));
        let header = lines.next().map(String::from);
        let kb = |name: &str, l: &str| l.strip_prefix(name).map(|v| v.trim().trim_end_matches(" kB").to_string());
        let size = lines.clone().find_map(|l| kb("Size:", l));
        let rss = lines.find_map(|l| kb("Rss:", l));
        (header, size, rss)
    };
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (header, size, rss) = text();
        if header.is_some() && size.is_some() && size == rss {
            return;
        }
        assert!(Instant::now() < until, "pid {pid}: text {header:?} mapped {rss:?} of {size:?} kB");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Namespace `ns` of process `pid` (a number, or `self`): held open — while it is, no new
/// namespace can take its number — and its `ns:[inode]` name.
fn held_ns(pid: &str, ns: &str) -> (std::fs::File, String) {
    let path = format!("/proc/{pid}/ns/{ns}");
    (std::fs::File::open(&path).unwrap(), std::fs::read_link(&path).unwrap().display().to_string())
}

/// A tmpfs mounted on the host for the length of a test (lazily unmounted when dropped).
struct TestMount(PathBuf);

impl TestMount {
    fn new(at: &Path, file: &str) -> TestMount {
        let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: plain mount(2) with NUL-terminated strings.
        let r = unsafe {
            libc::mount(c"chio-test".as_ptr(), c.as_ptr(), c"tmpfs".as_ptr(), 0, c"size=64k".as_ptr().cast())
        };
        assert_eq!(r, 0, "mount tmpfs on {}: {}", at.display(), std::io::Error::last_os_error());
        let m = TestMount(at.to_path_buf());
        std::fs::write(at.join(file), "").unwrap();
        m
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: umount2(2) of the mount this guard made.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A directory made on the host for the length of a test (removed when dropped).
struct HostDir(PathBuf);

impl HostDir {
    fn new(at: PathBuf) -> HostDir {
        std::fs::create_dir(&at).unwrap();
        HostDir(at)
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// What the daemon made ahead never hides a host mount change made since: a tmpfs mounted over
/// the workspace and one over a directory in `/usr/local` after the spare got ready (its init
/// cloned, the default root's host part made) are what the launch sees — not the directories
/// they cover — and once they are unmounted again after the next spare got ready, the launch
/// sees the directories, not the gone mounts. (The directory is the test's own: a mount over
/// `/usr/local` itself hid the host's programs there, a git in `/usr/local/bin`, from the tests
/// running beside this one.)
#[test]
fn a_host_mount_changed_after_the_spare_got_ready_is_what_the_launch_sees() {
    if !privileged("daemon_mounts_ahead") {
        return;
    }
    let dir = Scratch::new("daemon-mounts-ahead");
    let ws = dir.join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("under"), "").unwrap();
    assert!(Path::new("/usr/local").is_dir(), "the host has no /usr/local to mount in");
    let marker = format!("chio-test-{}", std::process::id());
    let made = HostDir::new(Path::new("/usr/local").join(&marker));
    let usr_local = made.0.as_path();
    let d = Daemon::start(&dir, config(json!({})));
    let script = format!("ls /workspace; ls {} | grep -x {marker} || echo no-marker", usr_local.display());
    let seen = || {
        let out = d.run(None, &["--workspace", s(&ws), "--", "/bin/sh", "-c", &script], None);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // A default-root launch first, so that the spare also makes that root's host part.
    assert_eq!(seen(), "under\nno-marker\n");
    let ready = |d: &Daemon| {
        d.init_ahead();
        // The spare makes the root before it clones the init; give the clone a moment too.
        std::thread::sleep(Duration::from_millis(200));
    };
    ready(&d);
    let mounts = (TestMount::new(&ws, "over"), TestMount::new(usr_local, &marker));
    assert_eq!(seen(), format!("over\n{marker}\n"), "the launch saw what the new mounts cover");
    ready(&d);
    drop(mounts);
    assert_eq!(seen(), "under\nno-marker\n", "the launch saw mounts the host had removed");
}

/// A cgroup2 subtree for a daemon's launch cgroups (see [`Daemon::start_with`]): the mount point
/// and the subtree's name. The cgroup2 hierarchy is one per host, so the subtree is removed
/// (through a mount of its own) when dropped.
struct V2Root(PathBuf, String);

impl Drop for V2Root {
    fn drop(&mut self) {
        // With whatever a failed test left in it (a launch cgroup a broken build did not remove).
        let script = r#"mount -t cgroup2 none "$1" && find "$1/$2" -depth -type d -exec rmdir {} +"#;
        let _ = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh", s(&self.0), &self.1])
            .status();
    }
}

/// On cgroup v2 (here a private cgroup2 mount: this host's controllers are on v1) the spare
/// makes its launch cgroup under the daemon's `CHIO_CGROUP_V2_ROOT` and clones its init into it
/// with clone3(CLONE_INTO_CGROUP); the launch takes both. (Shadow mode: the v2 tree here lacks
/// the memory, pids and cpu controllers, which an enforced launch refuses as Unsupported.)
#[test]
fn on_cgroup_v2_the_launch_takes_the_init_cloned_into_the_cgroup_made_ahead() {
    if !privileged("daemon_cgroup_v2") {
        return;
    }
    let dir = Scratch::new("daemon-v2");
    let root = V2Root(dir.join("cg2"), format!("chio-test-v2-{}", std::process::id()));
    std::fs::create_dir(&root.0).unwrap();
    let d = Daemon::start_with(&dir, config(json!({})), Some(&root));
    for _ in 0..2 {
        let init = d.init_ahead();
        let spare = std::fs::read_to_string(format!("/proc/{init}/stat")).unwrap();
        let spare = spare.rsplit(')').next().unwrap().split_whitespace().nth(1).unwrap().to_string();
        let (_held, made) = held_ns(&init.to_string(), "pid");
        let its = std::fs::read_to_string(format!("/proc/{init}/cgroup")).unwrap();
        let v2_line = its.lines().find(|l| l.starts_with("0::")).unwrap_or_default();
        assert!(v2_line.contains(&format!("/{}/chio-{spare}-", root.1)), "the init waits in {v2_line:?}");
        let out =
            d.run(None, &["--mode", "shadow", "--json", "--", "/bin/sh", "-c", "readlink /proc/self/ns/pid"], None);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).lines().next(), Some(made.as_str()));
        let rec = record(&out);
        assert_eq!(rec["cgroup"]["version"], "v2", "{rec}");
        let path = rec["cgroup"]["paths"][0].as_str().unwrap();
        assert!(path.contains(&format!("/chio-{spare}-")), "{path}");
    }
    drop(d);
}

/// `script` run by sh (with `args`) in a mount namespace of its own where `/sys/fs/cgroup` is a
/// cgroup2 mount: this host's is a v1 hybrid, production hosts run v2. Its stdout.
fn on_v2(script: &str, args: &[&str]) -> String {
    let full = format!("mount -t cgroup2 none /sys/fs/cgroup\n{script}");
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &full, "sh"])
        .args(args)
        .output()
        .unwrap();
    text(&out.stdout)
}

/// A cgroup v2 subtree of this test's, marked delegated as systemd marks a unit's cgroup under
/// `Delegate=yes` (`trusted.delegate`); removed with whatever the daemon left in it.
struct Delegated(String);

impl Delegated {
    fn new(tag: &str) -> Delegated {
        let d = Delegated(format!("chio-test-{tag}-{}", std::process::id()));
        let mark = r#"python3 -c 'import os, sys; os.setxattr(sys.argv[1], "trusted.delegate", b"1")'"#;
        on_v2(&format!(r#"mkdir "/sys/fs/cgroup/$1" && {mark} "/sys/fs/cgroup/$1""#), &[&d.0]);
        d
    }

    /// The launch cgroups under its `launches`.
    fn launches(&self) -> String {
        on_v2(r#"ls "/sys/fs/cgroup/$1/launches" | grep '^chio-' || true"#, &[&self.0])
    }
}

impl Drop for Delegated {
    fn drop(&mut self) {
        on_v2(r#"find "/sys/fs/cgroup/$1" -depth -type d -exec rmdir {} +"#, &[&self.0]);
    }
}

/// A daemon that systemd runs with `Delegate=yes` on cgroup v2 (its unit's cgroup marked
/// delegated) moves into that cgroup's leaf `supervisor` before it forks anything, and every
/// launch cgroup — the spare's made ahead, the launch's — goes under its `launches`, inside the
/// unit: the unit's accounting and final kill cover the cages. At its stop none is left.
#[test]
fn a_daemon_in_a_delegated_cgroup_keeps_its_cages_inside_it() {
    if !privileged("daemon_delegated") {
        return;
    }
    let dir = Scratch::new("daemon-delegated");
    let cg = Delegated::new("deleg-daemon");
    let script = r#"mount -t cgroup2 none /sys/fs/cgroup && echo 0 > "/sys/fs/cgroup/$1/cgroup.procs"
shift; exec "$@""#;
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", script, "sh", &cg.0, s(&chio())]);
    let d = Daemon::spawn(&dir, config(json!({})), cmd);
    let unit = format!("/sys/fs/cgroup/{}", cg.0);
    assert!(d.log().contains(&format!("cgroup {unit} is delegated to it")), "{}", d.log());
    let own = |pid: u32| {
        let lines = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        lines.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or_default().to_string()
    };
    assert_eq!(own(d.pid()), format!("/{}/supervisor", cg.0));
    let init = d.init_ahead();
    assert!(own(init).starts_with(&format!("/{}/launches/chio-", cg.0)), "the init waits in {}", own(init));
    let out = d.run(None, &["--memory", "none", "--pids", "none", "--cpus", "none", "--json", "--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rec = record(&out);
    assert_eq!(rec["state"], "FullyEnforced", "{rec}");
    let path = rec["cgroup"]["paths"][0].as_str().unwrap();
    assert!(path.starts_with(&format!("{unit}/launches/chio-")), "{path}");
    drop(d);
    assert_eq!(cg.launches(), "", "launch cgroups left in the unit's");
}

/// A daemon in a mount namespace of its own — systemd gives the shipped unit one
/// (`PrivateTmp=yes`) — has its own copy of every mount, under other ids: a client's file on
/// the disk is on no mount of the daemon's table. The daemon looks for the mount in the client's
/// table too, and takes the client's stdout and stderr, files on the disk, directly (before, it
/// refused every file as "on a mount this process cannot see"). A file on FUSE, mounted after
/// the daemon started and so in the client's table alone, is still refused by name.
#[test]
fn a_daemon_in_its_own_mount_namespace_takes_its_clients_files() {
    if !privileged("daemon_own_mounts") {
        return;
    }
    let dir = Scratch::new("daemon-own-mounts");
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private"]).arg(chio());
    let d = Daemon::spawn(&dir, config(json!({"max_launches": 1})), cmd);
    let (out, err) = (dir.join("out"), dir.join("err"));
    let status = Command::new(chio())
        .args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", "echo to-out; echo to-err >&2"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .status()
        .unwrap();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    assert_eq!(status.code(), Some(0), "{}", read(&err));
    assert_eq!((read(&out).as_str(), read(&err).as_str()), ("to-out\n", "to-err\n"));
    let fs = Stalling::mount();
    let stalled = fs.open("out", true);
    fs.stall();
    let c = UnixStream::connect(&d.socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    send_with_fds(&c, saying_line("fuse-err").as_bytes(), &[&null, &stalled]);
    let mut answer = String::new();
    BufReader::new(&c).read_line(&mut answer).expect("no answer in 10 s");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    let why = answer["error"].as_str().unwrap_or_else(|| panic!("{answer}"));
    assert!(why.contains("the client's stderr is a file on fuse"), "{why}");
}

/// A client's descriptor whose writes or reads may never complete — a file on FUSE or a hard
/// NFS mount, a block device — would hold the launch process in the kernel past SIGKILL, and
/// its launch slot with it: one refused argument is enough, its usage message written to such a
/// stderr. The daemon refuses the descriptor, naming it, before a byte is written; `chio cage
/// run --supervisor` relays such a destination itself, so the launch ends by its deadline. The
/// control: the same file holds a plain writer.
#[test]
fn a_descriptor_that_may_never_complete_is_refused_and_the_client_relays_it() {
    if !privileged("daemon_stalling") {
        return;
    }
    let dir = Scratch::new("daemon-stalling");
    let d = Daemon::start(&dir, config(json!({"max_launches": 1})));
    let fs = Stalling::mount();
    // (Opened before the attributes stall: a lookup would then hold this test too.)
    let (out, input, for_control, for_client) =
        (fs.open("out", true), fs.open("in", false), fs.open("out", true), fs.open("out", true));
    let slow = fs.open("slow", true);
    fs.stall();
    let mut control = Command::new("/bin/sh").args(["-c", "echo x"]).stdout(for_control).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(control.try_wait().unwrap().is_none(), "control: the file system let a writer through");
    let null = std::fs::File::open("/dev/null").unwrap();
    let with_stdin = |id: &str| launch_line(id, json!(["-i", "--", "/bin/cat"]));
    for (what, line, files) in [
        ("stderr", saying_line("fuse-err"), vec![&null, &out]),
        ("stdout", saying_line("fuse-out"), vec![&out, &null]),
        ("stdin", with_stdin("fuse-in"), vec![&null, &null, &input]),
    ] {
        let c = UnixStream::connect(&d.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        send_with_fds(&c, line.as_bytes(), &files);
        let mut answer = String::new();
        BufReader::new(&c).read_line(&mut answer).unwrap_or_else(|e| panic!("{what}: no answer in 10 s ({e})"));
        let answer: Value = serde_json::from_str(&answer).unwrap();
        let why = answer["error"].as_str().unwrap_or_else(|| panic!("{what}: {answer}"));
        assert!(why.contains(&format!("the client's {what}")) && why.contains("fuse"), "{what}: {why}");
    }
    // Nothing was held: the daemon's one launch slot is free.
    let ok = d.run(None, &["--", "/bin/true"], None);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    // The client relays its own stdout: the command's deadline holds, and what could not be
    // written is said.
    let started = Instant::now();
    let mut client = Command::new(chio())
        .args(["cage", "run", "--supervisor", s(&d.socket), "--json", "--timeout", "2s", "--"])
        .args(["/bin/sh", "-c", "echo hi; sleep 0.3; echo there; exec sleep 30"])
        .stdin(Stdio::null())
        .stdout(for_client)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while client.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = client.kill();
            panic!("the client was still running 20 s after a 2 s deadline");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = client.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
    let rec = record(&done);
    assert_eq!((done.status.code(), &rec["state"]), (Some(137), &json!("FullyEnforced")), "{rec}");
    assert!(rec["outcome"]["limit_hit"].to_string().contains("wall_time"), "{rec}");
    let err = text(&done.stderr);
    // (The relay holds the first line, its write never done; the second waits in its pipe.)
    let said = "9 bytes of the command's stdout could not be written within 1 s of its end, and were dropped";
    assert!(err.contains(said), "{err}");
    // A destination that is only slow (each write 0.3 s) gets everything: the relay has the
    // drain time after the answer to finish what it holds.
    let done = Command::new(chio())
        .args(["cage", "run", "--supervisor", s(&d.socket), "--", "/bin/sh", "-c", "echo one; echo two"])
        .stdin(Stdio::null())
        .stdout(slow)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(done.status.code(), Some(0), "{}", text(&done.stderr));
    assert!(!text(&done.stderr).contains("could not be written"), "{}", text(&done.stderr));
    let mut written = String::new();
    fs.open("slow", false).read_to_string(&mut written).unwrap();
    assert_eq!(written, "one\ntwo\n");
    drop(fs);
    let _ = control.wait();
}

/// What the client relays arrives whole and in order: stdin from, and stdout and stderr to,
/// files on an overlay (outside the relay's list of local file systems), 1 MiB through the
/// command, the record counting every byte — and the daemon itself never touches those files.
#[test]
fn what_the_client_relays_arrives_whole() {
    if !privileged("daemon_relayed") {
        return;
    }
    let dir = Scratch::new("daemon-relayed");
    let d = Daemon::start(&dir, config(json!({})));
    let overlay = Overlay::mount("daemon-relayed-overlay");
    let data = relay_data();
    std::fs::write(overlay.join("in"), &data).unwrap();
    let status = Command::new(chio())
        .args(["cage", "run", "--supervisor", s(&d.socket), "--json", "-i", "--output-limit", "2M", "--"])
        .args(["/bin/sh", "-c", "cat; echo done >&2"])
        .stdin(std::fs::File::open(overlay.join("in")).unwrap())
        .stdout(std::fs::File::create(overlay.join("out")).unwrap())
        .stderr(std::fs::File::create(overlay.join("err")).unwrap())
        .status()
        .unwrap();
    let err = std::fs::read_to_string(overlay.join("err")).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    let mut lines = err.lines();
    assert_eq!(lines.next(), Some("done"), "{err}");
    let rec: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(rec["state"], "FullyEnforced");
    assert_eq!((&rec["outcome"]["stdout_bytes"], &rec["outcome"]["stdout_dropped"]), (&data.len().into(), &0.into()));
    assert!(std::fs::read(overlay.join("out")).unwrap() == data, "the file holds other bytes");
}

/// A client that never reads its stderr (a pipe full to the brim) cannot hold its launch process:
/// what chio says itself — here clap's usage message — goes out as a command's output does,
/// never waiting on the client past a deadline, and what the client did not take is dropped,
/// which the daemon's log says. Read, the same message arrives whole. The control: a plain
/// write to that pipe waits.
#[test]
fn a_client_that_reads_nothing_holds_no_launch() {
    if !privileged("daemon_unread") {
        return;
    }
    use std::os::fd::AsRawFd;
    let dir = Scratch::new("daemon-unread");
    let d = Daemon::start(&dir, config(json!({"max_launches": 1})));
    let null = std::fs::File::open("/dev/null").unwrap();
    let (r, w) = std::io::pipe().unwrap();
    let w = std::fs::File::from(std::os::fd::OwnedFd::from(w));
    let asked = Instant::now();
    let answer = raw_with_fds(&d.socket, saying_line("read").as_bytes(), &[&null, &w]);
    assert_eq!(answer["exit_status"], 125, "{answer}");
    assert!(asked.elapsed() < Duration::from_secs(5), "a reading client waited {:?}", asked.elapsed());
    drop(w);
    let mut said = String::new();
    std::fs::File::from(std::os::fd::OwnedFd::from(r)).read_to_string(&mut said).unwrap();
    assert_eq!(said.matches(SAID).count(), 1, "{said}");
    // Fill a pipe, then put its description back to blocking, as a client would hand it over.
    let (r, w) = std::io::pipe().unwrap();
    let w = std::fs::File::from(std::os::fd::OwnedFd::from(w));
    // SAFETY: fcntl flag changes on our own pipe.
    let flags = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETFL) };
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) };
    while (&w).write(&[b'x'; 4096]).is_ok() {}
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, flags) };
    let mut control = Command::new("/bin/sh").args(["-c", "echo x"]).stdout(w.try_clone().unwrap()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(control.try_wait().unwrap().is_none(), "control: the full pipe took a write");
    let asked = Instant::now();
    let c = UnixStream::connect(&d.socket).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    send_with_fds(&c, saying_line("unread").as_bytes(), &[&null, &w]);
    let mut answer = String::new();
    BufReader::new(&c).read_line(&mut answer).unwrap_or_else(|e| panic!("no answer in 30 s ({e})"));
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["exit_status"], 125, "{answer}");
    assert!(asked.elapsed() < Duration::from_secs(20), "took {:?}", asked.elapsed());
    let until = Instant::now() + Duration::from_secs(5);
    while !d.log().contains("the rest was dropped") {
        assert!(Instant::now() < until, "the daemon's log does not say what was dropped: {}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Nothing was held: the daemon's one launch slot is free.
    let ok = d.run(None, &["--", "/bin/true"], None);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    // Only the client that read nothing lost anything, and no launch process failed.
    assert_eq!(d.log().matches("dropped").count(), 1, "{}", d.log());
    assert!(!d.log().contains("panicked"), "{}", d.log());
    drop(r);
    let _ = control.wait();
}
