//! Fixture builders and helpers for the end-to-end suites: locate the built `chio` and probe
//! binaries, build a root filesystem from the probe (with its shared libraries copied in, so the
//! rootfs holds nothing of the host but those), hostile variants of it, and run both caged and
//! control launches.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The built `chio` binary (a sibling of the probe in the target directory), with `chio-full`
/// beside it (the one `chio` hands every command but `cage run` to). `cargo test -p chio-tests`
/// alone does not rebuild them: a binary older than the sources it is built from is refused, so
/// no suite passes or fails on yesterday's code.
pub fn chio_bin(probe: &Path) -> PathBuf {
    let p = probe.with_file_name("chio");
    for bin in [&p, &probe.with_file_name("chio-full")] {
        fresh(bin);
    }
    p
}

/// Panic unless `bin` exists and is newer than every source of the `chio` crates.
fn fresh(bin: &Path) {
    assert!(bin.exists(), "{} is missing: build the workspace (cargo test --workspace builds it)", bin.display());
    let built = std::fs::metadata(bin).and_then(|m| m.modified()).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    if let Some(newer) = ["cage/src", "cli/src", "kernel/src", "supervisor/src"]
        .iter()
        .flat_map(|d| sources(&repo.join(d)))
        .find(|f| std::fs::metadata(f).and_then(|m| m.modified()).is_ok_and(|t| t > built))
    {
        panic!(
            "{} is older than {}: rebuild it (cargo test --workspace, or cargo build -p chio-cli -p chio-tests)",
            bin.display(),
            newer.display()
        );
    }
}

/// Every file below `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for ent in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match ent.file_type() {
                Ok(t) if t.is_dir() => stack.push(ent.path()),
                Ok(_) => out.push(ent.path()),
                Err(_) => {}
            }
        }
    }
    out
}

/// Skip `test` for `reason` (printed), or fail under `CI=true` / `CHIO_REQUIRE_PRIVILEGED=1`,
/// where nothing may be skipped.
pub fn skip(test: &str, reason: &str) {
    let must = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("CHIO_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1");
    assert!(!must, "{test}: cannot run here ({reason}), and CI=true forbids skipping");
    eprintln!("SKIP {test}: {reason}");
}

/// True when privileged tests may run. Without root they skip with a printed reason, except
/// under `CI=true` or `CHIO_REQUIRE_PRIVILEGED=1`, where skipping is a failure.
pub fn privileged(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let must = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("CHIO_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1");
    assert!(!must, "{test}: needs root (CI=true or CHIO_REQUIRE_PRIVILEGED=1 forbids skipping)");
    eprintln!("SKIP {test}: needs root for namespaces, mounts and cgroups");
    false
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Create `/tmp/chio-test-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("chio-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch(p)
    }

    /// Hand the directory to uid/gid 65534, the cage's default identity.
    pub fn give_to_nobody(&self) {
        std::os::unix::fs::chown(&self.0, Some(65534), Some(65534)).unwrap();
    }

    /// A path inside.
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child killed and reaped when dropped: a test that fails while its background chio runs
/// leaves nothing running behind it.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Shared libraries `bin` needs, from ldd.
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')).map(PathBuf::from))
        .collect()
}

fn copy_into(root: &Path, file: &Path) {
    let dest = root.join(file.strip_prefix("/").unwrap());
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    copy_executable(file, &dest);
}

/// Copy a program (or library) that something will execute, through `cp`, so that its write
/// descriptor never lives in this process. `std::fs::copy` holds one open while another test's
/// thread may fork: the forked child inherits it until its own exec closes it, and an exec of
/// the copy in that window fails with ETXTBSY ("Text file busy") — a flake seen in CI.
pub fn copy_executable(from: &Path, to: &Path) {
    let st = Command::new("cp").arg("--").arg(from).arg(to).status().expect("cp (coreutils)");
    assert!(st.success(), "cp {} {}: {st}", from.display(), to.display());
}

/// Write a script (mode 0755) that something will execute, for the reason `copy_executable`
/// gives: the text goes to a staging file this process may hold open, and `cp` makes the file
/// that runs.
pub fn write_executable(path: &Path, text: &str) {
    let staging = path.with_file_name(format!(".{}.staging", path.file_name().unwrap().to_string_lossy()));
    std::fs::write(&staging, text).unwrap();
    copy_executable(&staging, path);
    std::fs::remove_file(&staging).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Build a rootfs at `root`: `/probe`, a setuid-root copy `/probe-suid`, the libraries, and the
/// directories the suite writes into.
pub fn build_rootfs(root: &Path, probe: &Path) {
    std::fs::create_dir_all(root).unwrap();
    copy_executable(probe, &root.join("probe"));
    copy_executable(probe, &root.join("probe-suid"));
    std::fs::set_permissions(root.join("probe-suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    for lib in libraries(probe) {
        copy_into(root, &lib);
    }
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/hostname"), "image-hostname\n").unwrap();
    write_executable(&root.join("script.sh"), "#!/probe euid\n");
    write_executable(&root.join("no-interp.sh"), "#!/nonexistent/interpreter\n");
    std::fs::write(root.join("not-exec"), "plain data\n").unwrap();
    std::fs::set_permissions(root.join("not-exec"), std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Build a hostile rootfs whose `/proc`, `/dev` and `/tmp` are symlinks to host directories.
pub fn build_symlinked_rootfs(root: &Path, probe: &Path, host_target: &Path) {
    build_rootfs(root, probe);
    for name in ["proc", "dev", "tmp"] {
        let target = host_target.join(name);
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("chio-host-marker"), "host").unwrap();
        symlink(&target, root.join(name)).unwrap();
    }
}

static SHARED_ROOT: OnceLock<PathBuf> = OnceLock::new();

/// The suite's shared rootfs, built once per test process and removed when the process exits.
pub fn shared_rootfs(probe: &Path) -> &'static Path {
    SHARED_ROOT.get_or_init(|| {
        remove_stale_rootfs();
        let p = std::env::temp_dir().join(format!("chio-test-rootfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        build_rootfs(&p, probe);
        // SAFETY: registering a plain extern "C" function to run at exit.
        unsafe { libc::atexit(remove_shared_rootfs) };
        p
    })
}

extern "C" fn remove_shared_rootfs() {
    if let Some(p) = SHARED_ROOT.get() {
        let _ = std::fs::remove_dir_all(p);
    }
}

/// Rootfs fixtures of earlier test processes that are no longer running.
fn remove_stale_rootfs() {
    let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("chio-test-rootfs-").and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(ent.path());
        }
    }
}

/// One finished `chio cage run`.
pub struct CageRun {
    /// Exit status of chio.
    pub code: i32,
    /// The target's stdout as passed through.
    pub stdout: String,
    /// chio's stderr (the target's stderr, then chio's own lines).
    pub stderr: String,
    /// The launch record (the last stderr line, `--json`).
    pub record: serde_json::Value,
}

impl CageRun {
    /// The record's state.
    pub fn state(&self) -> &str {
        self.record["state"].as_str().unwrap_or("")
    }

    /// Assert the probe was refused inside a FullyEnforced cage; returns the errno it reported.
    pub fn assert_refused(&self, what: &str) -> i32 {
        assert_eq!(self.state(), "FullyEnforced", "{what}: stderr={}", self.stderr);
        assert!(
            self.stdout.starts_with("REFUSED"),
            "{what}: expected REFUSED, got stdout={:?} stderr={}",
            self.stdout,
            self.stderr
        );
        self.stdout.rsplit("errno=").next().and_then(|e| e.trim().parse().ok()).unwrap_or(-1)
    }
}

/// The deadline a test launch gets unless its flags name one: every launch of the suites ends in
/// well under it, so a launch held by a broken check fails its test here, not at chio's 300 s.
pub const TEST_DEADLINE: &str = "30s";

/// How long a test waits for chio beyond its launch's deadline before it kills chio and fails:
/// a chio that overruns its own deadline is the fault under test.
pub const PAST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Run `chio cage run --json FLAGS -- ARGV` (with `--timeout` [`TEST_DEADLINE`] unless FLAGS name
/// one), failing the test if chio outlives that deadline by [`PAST_DEADLINE`].
pub fn cage(chio: &Path, flags: &[&str], argv: &[&str]) -> CageRun {
    let mut cmd = Command::new(chio);
    cmd.args(["cage", "run", "--json"]);
    let deadline = with_test_deadline(&mut cmd, flags);
    let child = cmd
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run chio");
    let within = seconds(deadline) + PAST_DEADLINE;
    parse(output_within(child, within, &format!("chio cage run (deadline {deadline}) of {argv:?}")))
}

/// Add `flags` to a `chio cage run` command line, with `--timeout` [`TEST_DEADLINE`] unless they
/// name one or launch a policy (whose deadline is the policy's: 5 m at most in the suites'
/// policies); returns the deadline.
pub fn with_test_deadline<'a>(cmd: &mut Command, flags: &[&'a str]) -> &'a str {
    cmd.args(flags);
    if flags.contains(&"--policy") {
        return "5m";
    }
    match flags.iter().position(|f| *f == "--timeout") {
        Some(i) => flags.get(i + 1).copied().unwrap_or(TEST_DEADLINE),
        None => {
            cmd.args(["--timeout", TEST_DEADLINE]);
            TEST_DEADLINE
        }
    }
}

/// A `--timeout` value as chio reads it (`500ms`, `30s`, `5m`, `1h`).
pub fn seconds(d: &str) -> std::time::Duration {
    let (n, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("a test deadline chio would refuse: {d}"));
    std::time::Duration::from_millis(match unit {
        "ms" => n,
        "" | "s" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        _ => panic!("a test deadline chio would refuse: {d}"),
    })
}

/// Parse chio's output into a [`CageRun`].
pub fn parse(out: Output) -> CageRun {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let record = stderr.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(serde_json::Value::Null);
    CageRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
        record,
    }
}

/// Run the probe on the host (the control): returns (exit code, stdout).
pub fn host(probe: &Path, argv: &[&str]) -> (i32, String) {
    let out = Command::new(probe).args(argv).stdin(Stdio::null()).output().expect("run probe");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Who runs a control: the cage's own uid (65534) without the cage, the same in a user namespace
/// of its own (an unprivileged user's way to capabilities), or root where the host itself
/// refuses the unprivileged uid (the reason is kept with the call).
#[derive(Debug, Clone, Copy)]
pub enum Control {
    /// uid/gid 65534 on the host.
    Nobody,
    /// uid/gid 65534 as root of a user namespace of its own.
    NobodyInUserns,
    /// root on the host: the host refuses the unprivileged uid (the reason).
    Root(&'static str),
}

/// Run the probe as `who` on the host (a control): returns (exit code, stdout).
pub fn host_as(who: Control, probe: &Path, argv: &[&str]) -> (i32, String) {
    let p = probe.to_str().unwrap();
    let mut full: Vec<&str> = match who {
        Control::Nobody => vec!["as-user", "65534", p],
        Control::NobodyInUserns => vec!["as-user", "65534", p, "userns", p],
        Control::Root(_) => vec![],
    };
    full.extend_from_slice(argv);
    host(probe, &full)
}

/// Assert a control run escaped.
pub fn assert_escaped(what: &str, (code, stdout): (i32, String)) {
    assert!(
        code == 0 && stdout.starts_with("ESCAPED"),
        "control {what} should escape without the restriction: code={code} stdout={stdout:?}"
    );
}

/// The escape suite's fixtures: the probe, the built `chio`, and the shared probe rootfs.
pub struct Suite {
    /// The static probe binary.
    pub probe: PathBuf,
    /// The built `chio`.
    pub chio: PathBuf,
    /// The shared rootfs holding the probe at `/probe`.
    pub rootfs: &'static Path,
}

impl Suite {
    /// The fixtures for `test`, or None when privileged tests must skip (see [`privileged`]).
    pub fn new(test: &str, probe: &str) -> Option<Suite> {
        if !privileged(test) {
            return None;
        }
        let probe = PathBuf::from(probe);
        let chio = chio_bin(&probe);
        let rootfs = shared_rootfs(&probe);
        Some(Suite { probe, chio, rootfs })
    }

    /// Run the probe inside a cage on the probe rootfs.
    pub fn caged(&self, flags: &[&str], args: &[&str]) -> CageRun {
        let root = self.rootfs.to_str().unwrap();
        let mut f = vec!["--rootfs", root];
        f.extend_from_slice(flags);
        let mut argv = vec!["/probe"];
        argv.extend_from_slice(args);
        cage(&self.chio, &f, &argv)
    }

    /// Probe refused in the cage (expecting `errno` when given); escaped in the control.
    pub fn pair(&self, what: &str, flags: &[&str], args: &[&str], errno: Option<i32>, control: &[&str]) {
        let run = self.caged(flags, args);
        let got = run.assert_refused(what);
        if let Some(want) = errno {
            assert_eq!(got, want, "{what}: wrong errno; stdout={}", run.stdout);
        }
        assert_escaped(what, host(&self.probe, control));
    }

    /// Probe refused in the cage with `errno`; the control, run as `who`, escapes.
    pub fn pair_as(&self, what: &str, args: &[&str], errno: i32, who: Control, control: &[&str]) {
        self.pair_with(what, &[], args, Some(errno), who, control)
    }

    /// [`Suite::pair_as`] with launch flags (and any errno when `None`).
    pub fn pair_with(
        &self,
        what: &str,
        flags: &[&str],
        args: &[&str],
        errno: Option<i32>,
        who: Control,
        control: &[&str],
    ) {
        let run = self.caged(flags, args);
        let got = run.assert_refused(what);
        if let Some(want) = errno {
            assert_eq!(got, want, "{what}: wrong errno; stdout={}", run.stdout);
        }
        let got = host_as(who, &self.probe, control);
        assert!(
            got.0 == 0 && got.1.starts_with("ESCAPED"),
            "control {what} as {who:?} should escape without the cage: {got:?}"
        );
    }

    /// Assert a launch was stopped before the target ran, with `code` in its record.
    pub fn assert_stopped(run: &CageRun, code: &str) {
        assert_eq!(run.code, 125, "exit status; stderr={}", run.stderr);
        assert_eq!(run.record["failure"]["code"], code, "stderr={}", run.stderr);
        assert!(run.stdout.is_empty(), "the target ran: {}", run.stdout);
    }
}

/// Cage processes whose command line carries `tag` (the supervisor's own janitor, a fork of the
/// supervisor with its command line, may still be exiting after it reported: not a cage process).
pub fn processes_tagged(tag: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (String::from_utf8_lossy(&cmd).contains(tag) && comm.trim_end() != "chio-janitor").then_some(pid)
        })
        .collect()
}

/// Wait until no process is tagged `tag`, or `within` has passed; returns those left.
pub fn wait_gone(tag: &str, within: std::time::Duration) -> Vec<u32> {
    let until = std::time::Instant::now() + within;
    loop {
        let left = processes_tagged(tag);
        if left.is_empty() || std::time::Instant::now() > until {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The output of `child` (its stdout and stderr piped), which must end within `within`: else it
/// is killed and the test fails, naming `what`. Its pipes are read meanwhile, so a child that
/// says much is not mistaken for one that hangs.
pub fn output_within(child: std::process::Child, within: std::time::Duration, what: &str) -> Output {
    use std::os::fd::{FromRawFd, OwnedFd};
    // A pidfd, so the kill can never reach another process given the pid after the child's end.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id(), 0) };
    assert!(pidfd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let (done, ended) = std::sync::mpsc::channel::<()>();
    let dog = std::thread::spawn(move || {
        if ended.recv_timeout(within) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            use std::os::fd::AsRawFd;
            // Raw: pidfd_send_signal has no wrapper in std or nix 0.30.
            unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, 0, 0) };
            return true;
        }
        false
    });
    let out = child.wait_with_output().unwrap();
    let _ = done.send(());
    use std::os::unix::process::ExitStatusExt;
    if dog.join().unwrap() && out.status.signal() == Some(libc::SIGKILL) {
        panic!("{what} did not end within {within:?} (killed); stderr: {}", String::from_utf8_lossy(&out.stderr));
    }
    out
}

/// Run `cmd` (stdin from /dev/null unless set, stdout and stderr piped) as [`output_within`]
/// does: a test whose chio never ends fails after `within`, naming `what`.
pub fn run_within(cmd: &mut Command, within: std::time::Duration, what: &str) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    output_within(child, within, what)
}

/// Live cage processes (in a pid namespace other than this test's) whose environment holds
/// `var` (`KEY=VALUE`): a cage's init, and its target until the exec, are copies of the
/// supervisor and carry its environment. Waits until none is left or `within` has passed; those
/// left are killed (so a leak this finds does not outlive its test) and returned.
pub fn wait_untagged(var: &str, within: std::time::Duration) -> Vec<i32> {
    let own_pidns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let tagged = || -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|d| d.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|ns| ns != own_pidns))
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == var.as_bytes()))
            })
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| !r.starts_with('Z')))
            })
            .collect()
    };
    let until = std::time::Instant::now() + within;
    let mut left = tagged();
    while !left.is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
        left = tagged();
    }
    for p in &left {
        // SAFETY: ending the leak the caller found, so it does not outlive the test.
        unsafe { libc::kill(*p, libc::SIGKILL) };
    }
    left
}

/// Start `cmd` with SIGCHLD ignored, a disposition its exec keeps (as from a parent that set
/// it, or a service manager configured to).
pub fn ignore_sigchld(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) alone between fork and exec (async-signal-safe).
    unsafe {
        cmd.pre_exec(|| match libc::signal(libc::SIGCHLD, libc::SIG_IGN) {
            libc::SIG_ERR => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
}

/// A pseudo-terminal pair: (master, slave), both opened without becoming a controlling tty.
pub fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt/grantpt/unlockpt/ptsname on the fd we just opened; ptsname's buffer is
    // copied before any other call.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(m >= 0 && libc::grantpt(m) == 0 && libc::unlockpt(m) == 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(m)).to_owned();
        let s = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(s >= 0);
        (std::fs::File::from_raw_fd(m), std::fs::File::from_raw_fd(s))
    }
}

/// Live cage inits (`chio-init`) whose parent is no longer a supervisor — a one-shot `chio`,
/// or a daemon's launch process (`chio-launch`) or spare (`chio-spare`, its init made ahead)
/// still under that daemon's `chio-launcher`: leaked cages (a dead one waiting to be reaped by
/// the host's init is not). Every daemon running beside the caller has a spare's init.
pub fn orphaned_inits() -> Vec<u32> {
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let ppid = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut fields = stat.rsplit_once(") ")?.1.split_whitespace();
        (fields.next()? != "Z").then_some(())?;
        fields.next()?.parse().ok()
    };
    let supervised = |init: u32| {
        let Some(parent) = ppid(init) else { return true };
        match comm(parent).trim_end() {
            "chio" | "chio-init" => true,
            "chio-launch" | "chio-spare" => ppid(parent).is_some_and(|l| comm(l).trim_end() == "chio-launcher"),
            _ => false,
        }
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| comm(pid).trim_end() == "chio-init" && !supervised(pid))
        .collect()
}

/// Orphaned inits that are still there after `within`: a cage whose launch process was just
/// killed is orphaned for the moment its PDEATHSIG takes; a leaked one stays.
pub fn lasting_orphaned_inits(within: std::time::Duration) -> Vec<u32> {
    let until = std::time::Instant::now() + within;
    loop {
        let left = orphaned_inits();
        if left.is_empty() || std::time::Instant::now() > until {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `pid (comm) state ppid: cmdline`, for failure messages.
pub fn describe_process(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmd: String = String::from_utf8_lossy(&cmd).replace('\0', " ").chars().take(120).collect();
    format!("{} :: {cmd}", stat.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
}

/// A `docker save` archive (the legacy layout: `manifest.json`, `<config digest>.json`,
/// `<layer digest>/layer.tar`) at `out` holding one single-layer image per `(tag, rootfs, env)`.
/// With `tamper`, the first image's config file holds other content than its name's digest.
pub fn docker_save_with(out: &Path, images: &[(&str, &Path, &str)], tamper: bool) {
    let mut archive = tar::Builder::new(std::fs::File::create(out).unwrap());
    let mut manifest = Vec::new();
    let mut add = |name: &str, bytes: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        archive.append_data(&mut h, name, bytes).unwrap();
    };
    for (i, (tag, rootfs, env)) in images.iter().enumerate() {
        let layer = layer_tar(rootfs);
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux", "config": {"Env": [env]},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&layer))]}
        }))
        .unwrap();
        let (config_name, layer_name) = (format!("{}.json", hex(&config)), format!("{}/layer.tar", hex(&layer)));
        let stored = if tamper && i == 0 { [&config[..], b" "].concat() } else { config.clone() };
        add(&config_name, &stored);
        add(&layer_name, &layer);
        manifest.push(serde_json::json!({"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}));
    }
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    archive.finish().unwrap();
}

/// A `docker save` archive at `out` of one image, tagged `img:1`, whose manifest names its
/// layer as `shared/layer.tar`: a symlink member to `link` (as `docker save` shares one layer
/// between images), the layer itself stored at `<layer digest>/layer.tar`.
pub fn docker_save_linked(out: &Path, rootfs: &Path, link: &str) {
    let layer = layer_tar(rootfs);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&layer))]}
    }))
    .unwrap();
    let manifest = serde_json::json!([{"Config": format!("{}.json", hex(&config)), "RepoTags": ["img:1"],
                                       "Layers": ["shared/layer.tar"]}]);
    let mut archive = tar::Builder::new(std::fs::File::create(out).unwrap());
    for (name, bytes) in [
        (format!("{}.json", hex(&config)), config.clone()),
        (format!("{}/layer.tar", hex(&layer)), layer.clone()),
        ("manifest.json".to_string(), serde_json::to_vec(&manifest).unwrap()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        archive.append_data(&mut h, name, &bytes[..]).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    archive.append_link(&mut h, "shared/layer.tar", link).unwrap();
    archive.finish().unwrap();
}

/// An OCI image layout at `out` with one gzip layer holding `rootfs`, the given image config and
/// reference `name`.
pub fn oci_layout_with(rootfs: &Path, out: &Path, image_config: serde_json::Value, name: &str) {
    let layer = layer_tar(rootfs);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &layer).unwrap();
    let blob = gz.finish().unwrap();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&layer))]}
    }))
    .unwrap();
    let desc = |m: &str, d: &[u8]| serde_json::json!({"mediaType": m, "digest": format!("sha256:{}", hex(d)), "size": d.len()});
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": desc("application/vnd.oci.image.config.v1+json", &config),
        "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", &blob)],
    }))
    .unwrap();
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for d in [&blob, &config, &manifest] {
        std::fs::write(blobs.join(hex(d)), d).unwrap();
    }
    let mut md = desc("application/vnd.oci.image.manifest.v1+json", &manifest);
    md["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": name});
    std::fs::write(
        out.join("index.json"),
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [md]})).unwrap(),
    )
    .unwrap();
    std::fs::write(out.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// `rootfs` as an uncompressed layer tar (links kept as links): the same bytes for the same tree.
pub fn layer_tar(rootfs: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", rootfs).unwrap();
    b.into_inner().unwrap()
}

/// Lowercase hex SHA-256 of `d`.
pub fn hex(d: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(d).iter().map(|b| format!("{b:02x}")).collect()
}

/// A rootfs at `root` holding these host programs and the shared libraries they load, nothing else.
pub fn programs_rootfs(root: &Path, programs: &[&str]) {
    for p in programs {
        let path = Path::new(p);
        copy_into(root, path);
        for lib in libraries(path) {
            copy_into(root, &lib);
        }
    }
}

/// Run git in `dir` with no user or system configuration; panics on failure, returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The Python calculator repository the leg's and the sessions' suites work on:
/// `package/calc.py` whose `add` subtracts, its test, and a README outside the scope; then a
/// dirty change and an untracked file that must never enter.
pub fn calculator_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("calc");
    std::fs::create_dir_all(repo.join("package")).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("package/calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    std::fs::write(
        repo.join("package/test_calc.py"),
        "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
    )
    .unwrap();
    std::fs::write(repo.join("README"), "calculator\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "calculator"]);
    std::fs::write(repo.join("package/calc.py"), "DIRTY\n").unwrap();
    std::fs::write(repo.join("package/untracked.py"), "UNTRACKED\n").unwrap();
    repo
}

/// A signed manifest and cage launch policy for the probe (keys in `dir`).
pub struct SignedLaunch {
    /// Holds the keys and documents.
    pub dir: Scratch,
    /// The signed policy.
    pub policy: PathBuf,
    /// The signed manifest.
    pub manifest: PathBuf,
    /// The operator's public key file.
    pub operator: PathBuf,
}

/// Keys, a manifest for `/probe ARGV` (`probe`: the probe binary), and a policy in `mode`
/// admitting it on the probe rootfs as `uid`.
pub fn signed_launch(probe: &Path, argv: &[&str], uid: u32, mode: &str) -> SignedLaunch {
    signed_launch_on(probe, argv, uid, mode, shared_rootfs(probe))
}

/// [`signed_launch`] with the policy's root filesystem at `rootfs`.
pub fn signed_launch_on(probe: &Path, argv: &[&str], uid: u32, mode: &str, rootfs: &Path) -> SignedLaunch {
    signed_launch_edited(probe, argv, uid, mode, rootfs, |_, _| ())
}

/// [`signed_launch_on`] with `edit` applied to the manifest and the policy documents before
/// each is signed (the policy's edit sees the manifest as signed).
pub fn signed_launch_edited(
    probe: &Path,
    argv: &[&str],
    uid: u32,
    mode: &str,
    rootfs: &Path,
    edit: impl Fn(&str, &mut serde_json::Value),
) -> SignedLaunch {
    let chio = |args: &[&str]| Command::new(chio_bin(probe)).args(args).stdin(Stdio::null()).output().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let s = |p: PathBuf| -> &'static str { Box::leak(s(&p).into_boxed_str()) };
    let dir = Scratch::new("policy");
    for k in ["publisher", "operator"] {
        assert!(chio(&["keys", "generate", "--out", s(dir.join(k))]).status.success());
    }
    let digest = hex(&std::fs::read(probe).unwrap());
    let manifest = serde_json::json!({
        "schema": "chio.tool-manifest.v1", "server_id": "probe", "name": "Probe", "version": "1.0.0",
        "tools": [{"name": "write", "description": "write a file"}],
        "target": {"path": "/probe", "sha256": digest, "argv": argv},
        "permissions": {"read_paths": ["/workspace"], "write_paths": ["/workspace/out"], "network": [],
                        "env": ["LANG"], "syscall_profile": "default"}
    });
    let mut manifest = manifest;
    edit("manifest", &mut manifest);
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
    // `chio manifest|policy sign` of DIR/NAME.json with DIR/SIGNER/signing.seed; prints the digest.
    let sign = |kind: &str, signer: &str, name: &str| {
        let key = s(dir.join(signer).join("signing.seed"));
        let (input, output) = (s(dir.join(&format!("{name}.json"))), s(dir.join(&format!("{name}.signed.json"))));
        let out = chio(&[kind, "sign", "--key", key, "--in", input, "--out", output]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let manifest_digest = sign("manifest", "publisher", "manifest");
    let publisher = std::fs::read_to_string(dir.join("publisher/public.key")).unwrap().trim().to_string();
    let policy = serde_json::json!({
        "schema": "chio.cage-launch-policy.v1", "policy_id": "probe-policy", "mode": mode,
        "manifest": {"sha256": manifest_digest, "publisher_key": publisher},
        "launch": {"path": "/probe", "argv": argv},
        "ceilings": {"read_paths": ["/workspace"], "write_paths": ["/workspace/out"], "network": [], "env": ["LANG"],
                     "syscall_profile": "default", "memory_bytes": 268435456, "swap_bytes": 0, "pids": 32,
                     "cpu_millis": 1000, "wall_ms": 60000, "output_bytes": 65536, "tmp_bytes": 8388608},
        "identity": {"uid": uid, "gid": uid},
        "rootfs": {"directory": rootfs},
        "receipts": {"required": true}
    });
    let mut policy = policy;
    edit("policy", &mut policy);
    std::fs::write(dir.join("policy.json"), policy.to_string()).unwrap();
    sign("policy", "operator", "policy");
    SignedLaunch {
        policy: dir.join("policy.signed.json"),
        manifest: dir.join("manifest.signed.json"),
        operator: dir.join("operator/public.key"),
        dir,
    }
}

/// The child of `parent` whose comm is `comm`.
pub fn child_named(parent: u32, comm: &str) -> Option<u32> {
    std::fs::read_dir("/proc").unwrap().find_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent && name == comm).then_some(pid)
    })
}

/// Every launch cgroup (`chio-<pid>-<random>`, in any hierarchy) of the chio process `pid`.
pub fn launch_cgroups_of(pid: u32) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let needle = format!("chio-{pid}-");
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for ent in rd.flatten() {
            let dir = ent.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink());
            if dir {
                if ent.file_name().to_string_lossy().starts_with(&needle) {
                    found.push(ent.path());
                }
                stack.push(ent.path());
            }
        }
    }
    found
}

/// A cgroup of a test's own under the test's cgroup in every v1 hierarchy a launch uses. A chio
/// process started in it (see [`PrivateParent::enter`]) makes its launch cgroups there, where no
/// other test's launch sweeps them (each sweeps only its own parent). On a v2 host: nothing.
pub struct PrivateParent {
    dirs: Vec<PathBuf>,
    tasks: Vec<std::fs::File>,
}

impl PrivateParent {
    /// Make `chio-test-<tag>` in each hierarchy.
    pub fn new(tag: &str) -> PrivateParent {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = Vec::new();
        for c in ["cpuacct", "memory", "pids", "cpu"] {
            let Ok(mount) = std::fs::canonicalize(Path::new("/sys/fs/cgroup").join(c)) else { continue };
            let rel = own.lines().find_map(|l| {
                let mut p = l.splitn(3, ':');
                let (_, ctrls, path) = (p.next()?, p.next()?, p.next()?);
                ctrls.split(',').any(|x| x == c).then(|| path.trim_start_matches('/').to_string())
            });
            let Some(rel) = rel else { continue };
            let dir = mount.join(rel).join(format!("chio-test-{tag}"));
            if !dirs.contains(&dir) {
                std::fs::create_dir(&dir).unwrap();
                dirs.push(dir);
            }
        }
        let tasks =
            dirs.iter().map(|d| std::fs::OpenOptions::new().write(true).open(d.join("tasks")).unwrap()).collect();
        PrivateParent { dirs, tasks }
    }

    /// Start `cmd` inside it.
    pub fn enter(&self, cmd: &mut std::process::Command) {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fds: Vec<i32> = self.tasks.iter().map(|f| f.as_raw_fd()).collect();
        // SAFETY: only write(2) of a static byte to descriptors opened before the fork.
        unsafe {
            cmd.pre_exec(move || {
                for fd in &fds {
                    if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }

    /// The directories (one per hierarchy).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

impl Drop for PrivateParent {
    fn drop(&mut self) {
        // A launch cgroup left inside (its test failed with the cage still running) is emptied
        // first: a cgroup with a process in it cannot be removed, and the parent would leak.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for d in &self.dirs {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let gone =
                    |r: std::io::Result<()>| r.is_ok() || r.is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
                while !gone(std::fs::remove_dir(e.path())) && std::time::Instant::now() < until {
                    let procs = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
                    for pid in procs.lines().filter_map(|p| p.parse::<i32>().ok()) {
                        // SAFETY: killing what is left in this test's own cgroup.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A FUSE file system (fusepy, under the system python3) holding `in` and `out`, whose reads and
/// writes never complete — nor, once `stall` has been looked up, their attributes: a request its
/// server never answers holds the caller in the kernel, past SIGKILL — `half`, which takes its
/// first write and never answers another, and `slow`, which keeps what is written to it, each
/// write answered after 0.3 s. Dropping it kills the server (every
/// held request then fails) and unmounts it.
pub struct Stalling {
    dir: Scratch,
    server: std::process::Child,
}

const STALLING_FS: &str = r#"
import errno, stat, sys, threading
from fusepy import FUSE, Operations, FuseOSError

stalled = threading.Event()
slow = bytearray()
half = threading.Event()

class S(Operations):
    def getattr(self, path, fh=None):
        if path == '/':
            return dict(st_mode=stat.S_IFDIR | 0o755, st_nlink=2)
        if path in ('/in', '/out'):
            if stalled.is_set():
                threading.Event().wait()
            return dict(st_mode=stat.S_IFREG | 0o666, st_nlink=1, st_size=4096)
        if path == '/slow':
            return dict(st_mode=stat.S_IFREG | 0o666, st_nlink=1, st_size=len(slow))
        if path == '/half':
            return dict(st_mode=stat.S_IFREG | 0o666, st_nlink=1, st_size=0)
        if path == '/stall':
            stalled.set()
        raise FuseOSError(errno.ENOENT)
    def readdir(self, path, fh):
        return ['.', '..', 'in', 'out', 'slow', 'half']
    def open(self, path, flags):
        return 0
    def truncate(self, path, length, fh=None):
        return 0
    def read(self, path, size, offset, fh):
        if path == '/slow':
            return bytes(slow[offset:offset + size])
        threading.Event().wait()
    def write(self, path, data, offset, fh):
        if path == '/slow':
            threading.Event().wait(0.3)
            slow[offset:offset + len(data)] = data
            return len(data)
        if path == '/half' and not half.is_set():
            half.set()
            return len(data)
        threading.Event().wait()

FUSE(S(), sys.argv[1], foreground=True, direct_io=True, attr_timeout=0, entry_timeout=0)
"#;

impl Stalling {
    /// Mount it (fails the test when python3 with fusepy is missing or it does not mount).
    pub fn mount() -> Stalling {
        let dir = Scratch::new("stalling");
        let server = std::process::Command::new("/usr/bin/python3")
            .args(["-c", STALLING_FS])
            .arg(&dir.0)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("python3 with fusepy (apt-get install python3-fusepy; .ci/run does)");
        let s = Stalling { dir, server };
        let since = std::time::Instant::now();
        while !s.dir.join("out").exists() {
            assert!(since.elapsed() < std::time::Duration::from_secs(10), "the FUSE server did not mount");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        s
    }

    /// `in` or `out`, opened to read or (`write`) to write.
    pub fn open(&self, name: &str, write: bool) -> std::fs::File {
        std::fs::OpenOptions::new().read(!write).write(write).open(self.dir.join(name)).unwrap()
    }

    /// From now on even the attributes of `in` and `out` never come (the kernel asks each time).
    pub fn stall(&self) {
        assert!(!self.dir.join("stall").exists());
    }
}

impl Drop for Stalling {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.dir.0).status();
    }
}

/// An overlay mount (of empty layers) in a scratch directory: a file system outside the
/// relay's list of local ones whose writes are known to complete. Unmounted on drop.
pub struct Overlay(Scratch);

impl Overlay {
    /// Mount it under `/tmp/chio-test-<tag>-…`.
    pub fn mount(tag: &str) -> Overlay {
        let dir = Scratch::new(tag);
        for d in ["lower", "upper", "work", "mnt"] {
            std::fs::create_dir(dir.join(d)).unwrap();
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            dir.join("lower").display(),
            dir.join("upper").display(),
            dir.join("work").display()
        );
        let mounted = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(dir.join("mnt"))
            .status()
            .unwrap();
        assert!(mounted.success(), "mount -t overlay");
        Overlay(dir)
    }

    /// The mount point.
    pub fn mnt(&self) -> PathBuf {
        self.0.join("mnt")
    }

    /// `name` in the mount.
    pub fn join(&self, name: &str) -> PathBuf {
        self.mnt().join(name)
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        // Busy for a moment now and then while tests beside this one fork (a child holds copies
        // of its parent's descriptors until it execs) or make mount namespaces; detached at last.
        let umount =
            || Command::new("umount").arg(self.mnt()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        for _ in 0..50 {
            if umount() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = Command::new("umount").arg("-l").arg(self.mnt()).status();
    }
}

/// 1 MiB of bytes in no simple pattern, for what a relay carries.
pub fn relay_data() -> Vec<u8> {
    (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// A writer's shared, writable mapping of a file whose last page it has dirtied: a later write to
/// that page takes no fault, so it moves neither mtime nor ctime (the attack the exec-stop
/// digest stands against).
pub struct DirtyMapping {
    map: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

impl DirtyMapping {
    /// Map `path` shared and writable and dirty its last page (this write fault is what moves
    /// the file's times, now); the file's descriptor is closed, the mapping kept.
    pub fn new(path: &Path) -> DirtyMapping {
        use nix::sys::mman::{mmap, MapFlags, ProtFlags};
        use std::os::fd::AsFd;
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
        let len = file.metadata().unwrap().len() as usize;
        // SAFETY (test): a fresh shared mapping of the whole file, unmapped by `swap`.
        let map = unsafe {
            mmap(
                None,
                std::num::NonZeroUsize::new(len).unwrap(),
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                file.as_fd(),
                0,
            )
            .unwrap()
        };
        let m = DirtyMapping { map, len };
        let last = m.last();
        // SAFETY (test): `last` is the mapping's last byte; rewriting it dirties its page.
        unsafe { last.write_volatile(last.read_volatile()) };
        std::thread::sleep(std::time::Duration::from_millis(20));
        m
    }

    fn last(&self) -> *mut u8 {
        self.map.as_ptr().cast::<u8>().wrapping_add(self.len - 1)
    }

    /// Flip the file's last byte through the dirty page (no fault, no timestamp moves) and unmap.
    pub fn swap(self) {
        let last = self.last();
        // SAFETY (test): still mapped; the page is dirty, so this write takes no fault; then the
        // mapping made in `new`, of `len` bytes, is unmapped and no longer used.
        unsafe {
            last.write_volatile(!last.read_volatile());
            nix::sys::mman::munmap(self.map, self.len).unwrap();
        }
    }
}

/// What the identity rule compares: device, inode, size, mtime and ctime.
pub fn file_identity(p: &Path) -> [i64; 7] {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).unwrap();
    [m.dev() as i64, m.ino() as i64, m.size() as i64, m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()]
}

/// Read an OpenMetrics exposition with a real parser (the Python Prometheus client's, Debian's
/// python3-prometheus-client): `at` is `unix:PATH` (scraped over HTTP on that socket), an
/// `http://` address, or `file:PATH` (an exposition fetched already). Fails the test unless the
/// answer is 200 with OpenMetrics text that parses; returns every sample.
pub fn scrape_openmetrics(at: &str) -> Samples {
    const SCRAPER: &str = r#"
import json, socket, sys, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
at = sys.argv[1]
if at.startswith("unix:"):
    s = socket.socket(socket.AF_UNIX)
    s.connect(at[5:])
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: chio\r\n\r\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK", lines[0]
    assert any(l.lower().startswith(b"content-type: application/openmetrics-text") for l in lines), head
    text = body.decode()
elif at.startswith("file:"):
    text = open(at[5:]).read()
else:
    r = urllib.request.urlopen(at, timeout=10)
    assert r.headers["Content-Type"].startswith("application/openmetrics-text"), r.headers
    text = r.read().decode()
print(json.dumps([[s.name, s.labels, s.value] for f in text_string_to_metric_families(text) for s in f.samples]))
"#;
    let out = Command::new("/usr/bin/python3").args(["-c", SCRAPER, at]).output().unwrap();
    assert!(out.status.success(), "the metrics at {at} do not parse: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Samples of an exposition: name, labels, value.
pub type Samples = Vec<(String, std::collections::BTreeMap<String, String>, f64)>;

/// The sum of the samples named `name` whose labels include `labels`.
pub fn metric(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, _, v)| v)
        .sum()
}

/// Open `page` in headless Chromium (Debian's chromium and chromium-driver, through Selenium)
/// and return what a reader sees (`tests/src/browse.py`): the verification banner, summary
/// figures, timeline rows, refusals, chart bars, elements that could load anything, and every
/// request the page made. With `screenshot`, a PNG of the window is saved there.
pub fn browse(page: &Path, screenshot: Option<&Path>) -> serde_json::Value {
    const BROWSE: &str = include_str!("browse.py");
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.args(["-c", BROWSE]).arg(page).args(screenshot).stdin(Stdio::null());
    let out = run_within(&mut cmd, std::time::Duration::from_secs(180), "the headless browser");
    assert!(
        out.status.success(),
        "{} did not open in Chromium: {}",
        page.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The bound holds: a child that outlives it is killed and the test fails there, and one
    /// that says more than a pipe holds is read meanwhile (not taken for a hang).
    #[test]
    fn output_within_kills_what_outlives_its_bound() {
        let started = Instant::now();
        let hung = std::panic::catch_unwind(|| {
            run_within(Command::new("sleep").arg("30").stdin(Stdio::null()), Duration::from_millis(300), "sleep 30")
        });
        let why = *hung.expect_err("a child past its bound fails the test").downcast::<String>().unwrap();
        assert!(why.contains("sleep 30 did not end within"), "{why}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let said = run_within(
            Command::new("head").args(["-c", "1000000", "/dev/zero"]).stdin(Stdio::null()),
            Duration::from_secs(20),
            "head",
        );
        assert_eq!((said.status.code(), said.stdout.len()), (Some(0), 1_000_000));
    }

    /// A test deadline is read as chio reads `--timeout`.
    #[test]
    fn test_deadlines_read_as_chio_reads_them() {
        assert_eq!(seconds("500ms"), Duration::from_millis(500));
        assert_eq!(seconds("30s"), Duration::from_secs(30));
        assert_eq!(seconds("2m"), Duration::from_secs(120));
        let mut c = Command::new("chio");
        assert_eq!(with_test_deadline(&mut c, &["--json"]), TEST_DEADLINE);
        assert_eq!(c.get_args().collect::<Vec<_>>(), ["--json", "--timeout", TEST_DEADLINE]);
        let mut c = Command::new("chio");
        assert_eq!(with_test_deadline(&mut c, &["--timeout", "2s"]), "2s");
        assert_eq!(c.get_args().count(), 2);
        let mut c = Command::new("chio");
        with_test_deadline(&mut c, &["--policy", "p"]);
        assert_eq!(c.get_args().count(), 2, "a policy's launch takes the policy's deadline");
    }

    /// A copy made while another thread forks children runs at once, every time. The control,
    /// `std::fs::copy` under the same forking, meets ETXTBSY: the forked children held its
    /// write descriptor.
    #[test]
    fn a_copied_program_is_never_busy_while_other_threads_fork() {
        let dir = Scratch::new("copy-executable");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let forker = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = Command::new("/bin/true").status();
                }
            })
        };
        // Whether the `i`th copy was busy at its exec.
        let busy = |i: usize, copy: &dyn Fn(&Path, &Path)| {
            let to = dir.join(&format!("true-{i}"));
            copy(Path::new("/bin/true"), &to);
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
            let run = Command::new(&to).status();
            std::fs::remove_file(&to).unwrap();
            matches!(run, Err(ref e) if e.raw_os_error() == Some(libc::ETXTBSY))
        };
        let ours = (0..300).filter(|&i| busy(i, &|from, to| copy_executable(from, to))).count();
        let control = (0..5000).any(|i| {
            busy(i, &|from, to| {
                std::fs::copy(from, to).unwrap();
            })
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        forker.join().unwrap();
        assert_eq!(ours, 0, "copy_executable's copy was busy");
        assert!(control, "control: std::fs::copy was never busy in 5000 tries");
    }
}
