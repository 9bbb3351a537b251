//! `chio security supervise`: credentials from a systemd credentials directory into variables
//! (strict file checks), `--exec`, readiness (Unix socket, HTTP with a bearer token) reported
//! with sd_notify, signals forwarded, the stop grace, and the child's status (or signal) as ours.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use chio_tests::{chio_bin, processes_tagged, wait_gone, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn supervise(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(chio_bin(&PathBuf::from(PROBE)));
    c.args(["security", "supervise"]).args(args).env_remove("CREDENTIALS_DIRECTORY").envs(env.iter().copied());
    c.stdin(Stdio::null());
    c
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    supervise(args, env).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn credential(dir: &Path, name: &str, bytes: &[u8], mode: u32) {
    std::fs::write(dir.join(name), bytes).unwrap();
    std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn credentials_become_variables_only_from_strict_files() {
    let dir = Scratch::new("supervise-creds");
    credential(&dir.0, "api", b"tok-1\n", 0o600);
    let print = ["--", "/bin/sh", "-c", "printf '%s' \"$TOKEN\""];
    let args = |extra: &[&'static str]| -> Vec<String> {
        let mut v = vec!["--exec".to_string(), "--credentials-dir".into(), s(&dir.0).into()];
        v.extend(extra.iter().map(|x| x.to_string()));
        v.extend(print.iter().map(|x| x.to_string()));
        v
    };
    fn argv(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let out = run(&argv(&args(&["--credential-env", "TOKEN=api"])), &[]);
    assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()), (Some(0), "tok-1"));
    // $CREDENTIALS_DIRECTORY (systemd's) is the default.
    let out = run(
        &["--exec", "--credential-env", "TOKEN=api", print[0], print[1], print[2], print[3]],
        &[("CREDENTIALS_DIRECTORY", s(&dir.0))],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "tok-1");

    credential(&dir.0, "group-readable", b"x\n", 0o640);
    credential(&dir.0, "others-writable", b"x\n", 0o602);
    credential(&dir.0, "padded", b" x\n", 0o600);
    credential(&dir.0, "two-newlines", b"x\n\n", 0o600);
    credential(&dir.0, "control", b"x\x1by\n", 0o600);
    std::os::unix::fs::symlink(dir.join("api"), dir.join("link")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("device-link")).unwrap();
    for (name, why) in [
        ("group-readable", "readable or writable by group or others"),
        ("others-writable", "readable or writable by group or others (mode 602)"),
        ("padded", "padded"),
        ("two-newlines", "padded"),
        ("control", "control character"),
        ("link", "link is never followed"),
        ("missing", "No such file"),
    ] {
        let spec = format!("TOKEN={name}");
        let mut a = args(&[]);
        a.splice(3..3, ["--credential-env".to_string(), spec]);
        let out = run(&argv(&a), &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(why), "{name}: {err}");
        assert!(out.stdout.is_empty(), "{name}: the command ran");
    }
    // A variable already set is never overridden.
    let out = run(&argv(&args(&["--credential-env", "TOKEN=api"])), &[("TOKEN", "from-the-unit")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already set"));
    // 64 KiB at most.
    credential(&dir.0, "largest", &vec![b'a'; 64 << 10], 0o600);
    credential(&dir.0, "too-large", &vec![b'a'; (64 << 10) + 1], 0o600);
    let out = run(&argv(&args(&["--credential-env", "TOKEN=largest"])), &[]);
    assert_eq!((out.status.code(), out.stdout.len()), (Some(0), 64 << 10));
    let out = run(&argv(&args(&["--credential-env", "TOKEN=too-large"])), &[]);
    assert_eq!((out.status.code(), out.stdout.is_empty()), (Some(2), true));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is over 65536 bytes"));
    // A credential is a file of the directory itself, named as such; a variable is a name.
    std::fs::create_dir(dir.join("sub")).unwrap();
    credential(&dir.join("sub"), "api", b"tok-3\n", 0o600);
    for spec in ["TOKEN=sub/api", "TOKEN=.", "TOKEN=..", "1TOKEN=api", "TO-KEN=api", "=api", "TOKEN=", "TOKEN"] {
        let mut a = args(&[]);
        a.splice(3..3, ["--credential-env".to_string(), spec.to_string()]);
        let out = run(&argv(&a), &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.status.code(), out.stdout.is_empty()), (Some(2), true), "{spec}: {err}");
        let why = if spec.starts_with("TOKEN=") && spec.len() > 6 { "is not a file name" } else { "give VAR=NAME" };
        assert!(err.contains(why), "{spec}: {err}");
    }
    // Nor by a second credential for the same variable.
    credential(&dir.0, "api-2", b"tok-2\n", 0o600);
    let out = run(&argv(&args(&["--credential-env", "TOKEN=api", "--credential-env", "TOKEN=api-2"])), &[]);
    assert_eq!((out.status.code(), out.stdout.is_empty()), (Some(2), true));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TOKEN is given two credentials"));
    // Without a directory, credentials cannot be found: refused, nothing runs.
    let out = run(&["--credential-env", "TOKEN=api", "--", "/bin/true"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

/// On a file system without extended attributes (ramfs: where systemd before 254 puts
/// credentials, chowned to the service's user) the mode says it all: a 0600 file is read, a
/// 0640 one refused. Here in a mount namespace of the test's own.
#[test]
fn credentials_on_a_file_system_without_acls() {
    if !chio_tests::privileged("supervise_ramfs") {
        return;
    }
    let dir = Scratch::new("supervise-ramfs");
    let chio = chio_bin(&PathBuf::from(PROBE));
    let script = "set -e\nmount -t ramfs none \"$1\"\nprintf 'tok-ramfs\\n' > \"$1/api\"\nchmod \"$2\" \"$1/api\"\n\
                  exec \"$3\" security supervise --exec --credentials-dir \"$1\" --credential-env TOKEN=api -- \
                  /bin/sh -c 'printf %s \"$TOKEN\"'";
    for (mode, code, said) in [("600", Some(0), "tok-ramfs"), ("640", Some(2), "")] {
        let out = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh", s(&dir.0), mode])
            .arg(&chio)
            .env_remove("CREDENTIALS_DIRECTORY")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()), (code, said), "{mode}: {err}");
        if code == Some(2) {
            assert!(err.contains("readable or writable by group or others (mode 640)"), "{err}");
        }
    }
}

/// `setfacl ARGS FILE`.
fn setfacl(file: &Path, args: &[&str]) {
    let out =
        Command::new("setfacl").args(args).arg(file).output().expect("setfacl (apt-get install acl; .ci/run does)");
    assert!(out.status.success(), "setfacl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// systemd grants a service's user a credential it wrote as root with an ACL entry for that
/// user (`user:UID:r--`: `ls` then shows 0440) wherever the file system has ACLs — its tmpfs
/// since systemd 254. That user is let in, as systemd means; any other reach an ACL gives — to a
/// user that is not the reader, a group, the owning group — is refused naming who, and so is a
/// file of neither root's nor the reader's.
#[test]
fn credentials_shared_by_an_acl_only_with_the_reader() {
    let dir = Scratch::new("supervise-acl");
    let token = dir.join("token");
    credential(&dir.0, "token", b"tok-acl\n", 0o400);
    setfacl(&token, &["-m", "u:65534:r"]);
    let as_nobody = |name: &str| {
        let spec = format!("TOKEN={name}");
        let args = ["--exec", "--credentials-dir", s(&dir.0), "--credential-env", &spec, "--", "/bin/sh", "-c"];
        supervise(&args, &[]).arg("printf '%s' \"$TOKEN\"").uid(65534).gid(65534).output().unwrap()
    };
    // systemd's layout, read by the user it names.
    let out = as_nobody("token");
    assert_eq!(
        (out.status.code(), String::from_utf8_lossy(&out.stdout).as_ref()),
        (Some(0), "tok-acl"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = |name: &str, reader: Option<u32>, why: &str| {
        let spec = format!("TOKEN={name}");
        let out = match reader {
            Some(_) => as_nobody(name),
            None => run(&["--exec", "--credentials-dir", s(&dir.0), "--credential-env", &spec, "--", "/bin/true"], &[]),
        };
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(why), "{name}: {err}");
    };
    // The same file read by root: uid 65534 can read it too.
    refused("token", None, "readable or writable by user 65534 (by its ACL)");
    // A group, or the owning group, given reach by the ACL (the mode's group bits are its mask).
    credential(&dir.0, "group", b"x\n", 0o400);
    setfacl(&dir.join("group"), &["-m", "u:65534:r,g:65533:r"]);
    refused("group", Some(65534), "readable or writable by group 65533 (by its ACL)");
    credential(&dir.0, "own-group", b"x\n", 0o400);
    setfacl(&dir.join("own-group"), &["-m", "u:65534:r,g::r"]);
    refused("own-group", Some(65534), "readable or writable by its group (by its ACL)");
    // Another user than the reader (and others) named.
    credential(&dir.0, "stranger", b"x\n", 0o400);
    setfacl(&dir.join("stranger"), &["-m", "u:65534:r,u:65533:rw,o::r"]);
    refused("stranger", Some(65534), "readable or writable by user 65533, others (by its ACL)");
    // An entry the ACL's mask takes everything from gives nothing: read by root, accepted.
    credential(&dir.0, "masked", b"tok-masked\n", 0o400);
    setfacl(&dir.join("masked"), &["-n", "-m", "u:65533:rw,g:65533:r,m::-"]);
    let out = supervise(
        &["--exec", "--credentials-dir", s(&dir.0), "--credential-env", "TOKEN=masked", "--", "/bin/sh", "-c"],
        &[],
    )
    .arg("printf '%s' \"$TOKEN\"")
    .output()
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "tok-masked", "{}", String::from_utf8_lossy(&out.stderr));
    // A file of another user's, private to it: that user chose the identity.
    credential(&dir.0, "theirs", b"x\n", 0o600);
    std::os::unix::fs::chown(dir.join("theirs"), Some(65533), None).unwrap();
    refused("theirs", None, "belongs to uid 65533, neither root nor this process's user (0)");
}

/// A NOTIFY_SOCKET for the test, and what arrives on it.
struct Notify {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Notify {
    fn new(dir: &Scratch) -> Notify {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Notify { sock, path }
    }

    /// Wait for a message containing `what`; returns when it arrived.
    fn wait_for(&self, what: &str) -> Instant {
        let mut buf = [0u8; 512];
        loop {
            let n = self.sock.recv(&mut buf).unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
            if String::from_utf8_lossy(&buf[..n]).contains(what) {
                return Instant::now();
            }
        }
    }
}

fn sigterm(g: &Group) {
    // SAFETY: kill on our own child.
    unsafe { libc::kill(g.0.id() as i32, libc::SIGTERM) };
}

/// A supervise run in a process group of its own: whatever it started is killed with it when
/// the test ends, so a failing assertion leaves no server running.
struct Group(Child);

impl Group {
    fn spawn(mut cmd: Command) -> Group {
        Group(cmd.process_group(0).spawn().unwrap())
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().unwrap()
    }

    /// Wait at most `limit`; a run still going then fails the test. How long it took.
    fn wait_within(&mut self, limit: Duration) -> (std::process::ExitStatus, Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return (status, started.elapsed());
            }
            assert!(started.elapsed() <= limit, "still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill on our own child's process group (the group outlives its leader while
        // anything it started is left, so its id names no one else).
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

#[test]
fn unix_socket_readiness_then_a_forwarded_sigterm() {
    let dir = Scratch::new("supervise-ready");
    let notify = Notify::new(&dir);
    let ready_sock = dir.join("service.sock");
    // The command speaks sd_notify itself where it can: readiness is supervise's to tell, so the
    // command never gets the socket (it would otherwise say READY=1 before it listens).
    let script = format!(
        "import os,socket,signal,sys,time\nn=os.environ.get('NOTIFY_SOCKET')\n\
         n and socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM).sendto(b'READY=1',n)\n\
         signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n\
         time.sleep(0.4)\ns=socket.socket(socket.AF_UNIX)\ns.bind({:?})\ns.listen(4)\ntime.sleep(60)\n",
        s(&ready_sock)
    );
    let started = Instant::now();
    let mut child = Group::spawn(supervise(
        &["--ready-unix-socket", s(&ready_sock), "--ready-timeout", "20s", "--", "python3", "-c", &script],
        &[("NOTIFY_SOCKET", s(&notify.path))],
    ));
    let ready_at = notify.wait_for("READY=1");
    assert!(ready_at - started >= Duration::from_millis(400), "ready before the socket existed");
    assert!(ready_sock.exists());
    sigterm(&child);
    notify.wait_for("STOPPING=1");
    let status = child.wait();
    assert_eq!(status.code(), Some(3), "the child's own exit status: {status:?}");
}

#[test]
fn the_stop_grace_ends_in_sigkill_and_the_signal_is_ours() {
    let dir = Scratch::new("supervise-grace");
    let notify = Notify::new(&dir);
    // The command says when it ignores SIGTERM (a file); a SIGTERM before would end it at once.
    let ignoring = dir.join("ignoring");
    let ignore = "import signal,sys,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen(sys.argv[1],'w').close()\ntime.sleep(60)\n";
    let mut child = Group::spawn(supervise(
        &["--stop-grace", "600ms", "--", "python3", "-c", ignore, s(&ignoring)],
        &[("NOTIFY_SOCKET", s(&notify.path))],
    ));
    notify.wait_for("READY=1");
    let until = Instant::now() + Duration::from_secs(20);
    while !ignoring.exists() {
        assert!(Instant::now() < until, "the command never came to ignore SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = Instant::now();
    sigterm(&child);
    let status = child.wait();
    let took = sent.elapsed();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(took >= Duration::from_millis(600) && took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn not_ready_in_time_or_exited_first_is_a_failure_and_leaves_nothing() {
    let tag = "31.4159";
    let out = run(
        &[
            "--ready-unix-socket",
            "/nonexistent/chio.sock",
            "--ready-timeout",
            "700ms",
            "--stop-grace",
            "1s",
            "--",
            "sleep",
            tag,
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not ready within 700 ms"));
    assert_eq!(wait_gone(tag, Duration::from_secs(5)), Vec::<u32>::new());
    assert!(processes_tagged(tag).is_empty());
    let out = run(&["--ready-unix-socket", "/nonexistent/chio.sock", "--", "/bin/sh", "-c", "exit 4"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("before it was ready"));
}

#[test]
fn http_readiness_sends_the_bearer_token() {
    let dir = Scratch::new("supervise-http");
    credential(&dir.0, "probe-token", b"let-me-in\n", 0o600);
    let server = "import http.server,sys\n\
class H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        ok = self.headers.get('Authorization') == 'Bearer let-me-in'\n        self.send_response(200 if ok else 401); self.end_headers()\n    def log_message(self, *a): pass\n\
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n";
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let url = format!("http://127.0.0.1:{port}/ready");
    let notify = Notify::new(&dir);
    let common = ["--credentials-dir", s(&dir.0), "--ready-http", &url, "--ready-timeout", "15s", "--stop-grace", "1s"];
    let with = |bearer_var: &str| {
        let mut a: Vec<&str> = common.to_vec();
        a.extend(["--credential-env", "PROBE_TOKEN=probe-token", "--ready-http-bearer-env", bearer_var]);
        a.extend(["--", "python3", "-c", server, &port]);
        a.iter().map(|x| x.to_string()).collect::<Vec<_>>()
    };
    let args = with("PROBE_TOKEN");
    let mut child = Group::spawn(supervise(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[("NOTIFY_SOCKET", s(&notify.path))],
    ));
    notify.wait_for("READY=1");
    sigterm(&child);
    let status = child.wait();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "python's default SIGTERM, re-raised: {status:?}");

    // The wrong token never makes it ready.
    let mut args = with("WRONG");
    let at = args.iter().position(|a| a == "15s").unwrap();
    args[at] = "1500ms".into();
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[("WRONG", "not-it")]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Readiness is the URL's own answer: a proxy named in the environment (systemd's
/// `DefaultEnvironment=HTTP_PROXY=…` on many hosts) would otherwise get the request with its
/// bearer token and answer for a "127.0.0.1" of its own; a redirect is not an answer (here
/// one to a page that answers anyone).
#[test]
fn http_readiness_is_the_urls_own_answer() {
    let dir = Scratch::new("supervise-http-own");
    credential(&dir.0, "probe-token", b"let-me-in\n", 0o600);
    let server = "import http.server,sys\n\
class H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        if self.path == '/moved':\n            self.send_response(302); self.send_header('Location', '/open'); self.end_headers(); return\n        ok = self.path == '/open' or self.headers.get('Authorization') == 'Bearer let-me-in'\n        self.send_response(200 if ok else 401); self.end_headers()\n    def log_message(self, *a): pass\n\
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n";
    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    proxy.set_nonblocking(true).unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let proxies = [("HTTP_PROXY", proxy_url.as_str()), ("http_proxy", &proxy_url), ("ALL_PROXY", &proxy_url)];
    for (path, ready) in [("/ok", true), ("/moved", false)] {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}{path}");
        let args = [
            "--credentials-dir",
            s(&dir.0),
            "--credential-env",
            "PROBE_TOKEN=probe-token",
            "--ready-http",
            &url,
            "--ready-http-bearer-env",
            "PROBE_TOKEN",
            "--ready-timeout",
            "2s",
            "--stop-grace",
            "1s",
            "--",
            "python3",
            "-c",
            server,
            &port,
        ];
        let notify = Notify::new(&dir);
        let mut env = proxies.to_vec();
        env.push(("NOTIFY_SOCKET", s(&notify.path)));
        let mut child = Group::spawn(supervise(&args, &env));
        if ready {
            notify.wait_for("READY=1");
            sigterm(&child);
        }
        let (status, _) = child.wait_within(Duration::from_secs(15));
        let expected = if ready { (None, Some(libc::SIGTERM)) } else { (Some(1), None) };
        assert_eq!((status.code(), status.signal()), expected, "{path}");
        std::fs::remove_file(&notify.path).unwrap();
    }
    assert_eq!(
        proxy.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "the proxy was asked"
    );
}

/// A listener whose backlog is full takes no connection: it is not ready, and the check must
/// not wait for it — a blocking connect there held the deadline and signal forwarding for as
/// long as the command kept its backlog full.
#[test]
fn a_socket_whose_backlog_is_full_is_not_ready_and_the_deadline_holds() {
    let dir = Scratch::new("supervise-backlog");
    let ready_sock = dir.join("service.sock");
    let filling = dir.join("filling.sock");
    // Bound under another name, its one-connection backlog filled by itself, then renamed into
    // place: supervise never meets it with room.
    let script = format!(
        "import os,socket,time\ns=socket.socket(socket.AF_UNIX)\ns.bind({f:?})\ns.listen(0)\n\
         c=socket.socket(socket.AF_UNIX)\nc.connect({f:?})\nos.rename({f:?}, {r:?})\ntime.sleep(60)\n",
        f = s(&filling),
        r = s(&ready_sock)
    );
    let mut child = Group::spawn(supervise(
        &[
            "--ready-unix-socket",
            s(&ready_sock),
            "--ready-timeout",
            "1500ms",
            "--stop-grace",
            "1s",
            "--",
            "python3",
            "-c",
            &script,
        ],
        &[],
    ));
    let (status, took) = child.wait_within(Duration::from_secs(15));
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    assert!(ready_sock.exists(), "the command never got its socket in place");
}

/// A caller that ignores SIGCHLD (the disposition survives its exec of chio) must not cost the
/// command's status: under it the kernel reaps the child unasked and chio answered "No child
/// processes", exit 1. The exit status and a death by signal both come through.
#[test]
fn a_caller_ignoring_sigchld_keeps_the_status() {
    for (script, code, signal) in [("exit 3", Some(3), None), ("kill -9 $$", None, Some(libc::SIGKILL))] {
        let mut c = supervise(&["--", "sh", "-c", script], &[]);
        chio_tests::ignore_sigchld(&mut c);
        let out = c.output().unwrap();
        assert_eq!(
            (out.status.code(), out.status.signal()),
            (code, signal),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
