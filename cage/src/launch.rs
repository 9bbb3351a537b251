//! The supervisor side of a launch (DESIGN §3): check the plan, clone the cage's init (which
//! builds its own namespaces and mounts) while making the cgroup and the janitor, verify the
//! target the cage opened, hold it under ptrace to its exec, check every fact at the exec stop,
//! then supervise it to the end and clean up. Any missing fact in enforced mode kills the cage
//! before the target's first instruction.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::cgroup::{Hierarchy, LaunchCgroup, Place, Usage};
use crate::channel::{self, CageMsg, ABORT, GO};
use crate::child_stops::ChildStops;
use crate::digests::{Digests, Identity};
use crate::failure::{FailCode, Failure};
use crate::fault::{self, TestHook};
use crate::inside::{self, Ctx};
use crate::janitor;
use crate::landlock;
use crate::observe::{self, Expect};
use crate::plan::{CagePlan, Mode, Stage};
use crate::prehash::{self, Early};
use crate::record::{self, CgroupFacts, LaunchRecord, State, Target, SCHEMA};
use crate::seccomp::{self, Filters};
use crate::supervise::{self, Gate, OnEnforced, Sinks};
use crate::sys;

/// Namespaces every cage gets (pid by clone, the others by the init itself).
pub const NAMESPACES: [&str; 6] = ["mnt", "pid", "net", "ipc", "uts", "cgroup"];
/// How long the cage may take for each of its steps to the exec stop: its hello, its ready
/// report, and from the supervisor's go to its exec.
const SETUP_TIMEOUT_MS: i32 = 30_000;

fn new_record(plan: &CagePlan) -> LaunchRecord {
    LaunchRecord {
        schema: SCHEMA.to_string(),
        state: State::BootstrapFailed,
        mode: plan.mode,
        not_confined: Vec::new(),
        annotations: plan.annotations.clone(),
        failure: None,
        argv: plan.argv.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
        target: None,
        observed: None,
        reported: None,
        namespaces: NAMESPACES.iter().map(|s| s.to_string()).collect(),
        net: plan.net,
        cgroup: None,
        limits: plan.limits.clone(),
        outcome: None,
        started_at: record::now_rfc3339(),
        exec_observed_at: None,
        ended_at: None,
        timings_us: Default::default(),
        clock: Some(Instant::now()),
    }
}

/// Run `plan` to completion: the target's stdout/stderr go to `sinks` (capped), and the record
/// says what was enforced and how it ended. The calling process must be single-threaded.
pub fn launch(plan: &CagePlan, sinks: &mut Sinks<'_>) -> LaunchRecord {
    let (mut rec, teardown) = launch_to_end(plan, sinks);
    teardown.finish_into(&mut rec);
    rec
}

/// [`launch`] up to the command's end: the record is complete once every process of the cage
/// but its init is gone (the init reports only then) and the output is drained. What is left
/// — the init's own exit, which tears its namespaces down, and the launch cgroup's removal — is
/// the returned [`Teardown`]'s: a daemon answers its client first and finishes it afterwards.
pub fn launch_to_end(plan: &CagePlan, sinks: &mut Sinks<'_>) -> (LaunchRecord, Teardown) {
    let mut rec = new_record(plan);
    let mut held = Held {
        ahead: sinks.ahead.cgroup.take(),
        ahead_janitor: sinks.ahead.janitor.take(),
        ahead_init: sinks.ahead.init.take(),
        ..Held::default()
    };
    if let Err(s) = run(plan, sinks, &mut rec, &mut held) {
        rec.state = s.state();
        rec.failure = Some(s);
    }
    rec.ended_at = Some(record::now_rfc3339());
    (rec, Teardown(Some(held)))
}

/// What a launch still holds after its command's end (see [`launch_to_end`]). Finished when
/// dropped, if [`Teardown::finish`] was not called.
pub struct Teardown(Option<Held>);

impl Teardown {
    /// Reap the cage's init (its exit ends the cage's namespaces) and remove the launch cgroup.
    pub fn finish(mut self) -> Result<(), String> {
        self.0.take().map_or(Ok(()), Held::tear_down)
    }

    /// Finish, and say in `rec` when the cgroup could not be removed.
    pub fn finish_into(self, rec: &mut LaunchRecord) {
        if let Err(e) = self.finish() {
            rec.not_confined.push(format!("cgroup_not_removed: {e}"));
        }
        rec.mark("cleaned_up");
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            let _ = held.tear_down();
        }
    }
}

fn check_plan(plan: &CagePlan) -> Result<(), Failure> {
    let reject = |code: FailCode, detail: String| code.at(Stage::Resolve, detail);
    if plan.argv.is_empty() {
        return Err(reject(FailCode::EmptyCommand, "no command to run".into()));
    }
    if plan.enter.is_some() && !plan.detached {
        return Err(reject(FailCode::SetupFailed, "a process entering a running cage is launched detached".into()));
    }
    // exec takes C strings: an argument or variable with a NUL in it would reach the command
    // cut short, or not at all, while the record shows it whole.
    if let Some(a) = plan.argv.iter().find(|a| a.as_bytes().contains(&0)) {
        return Err(reject(FailCode::BadCommand, format!("command argument {a:?} contains a NUL byte")));
    }
    let bad_var = |(k, v): &&(OsString, OsString)| {
        k.is_empty() || k.as_bytes().iter().any(|b| *b == 0 || *b == b'=') || v.as_bytes().contains(&0)
    };
    if let Some((k, _)) = plan.env.iter().find(bad_var) {
        return Err(reject(
            FailCode::BadEnvironment,
            format!("environment variable {k:?} has an empty name, or a NUL or '=' in its name, or a NUL in its value"),
        ));
    }
    // The exec-stop check compares /proc/<pid>/cwd with this path, so it must be in the form
    // the kernel prints: absolute, no '.', '..', doubled or trailing slashes.
    let normal: std::path::PathBuf =
        std::path::Path::new("/").join(plan.cwd.components().collect::<std::path::PathBuf>());
    let has_dots =
        plan.cwd.components().any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::CurDir));
    if !plan.cwd.is_absolute() || has_dots || normal.as_os_str() != plan.cwd.as_os_str() {
        return Err(reject(
            FailCode::BadCwd,
            format!(
                "working directory {} must be an absolute path without '.', '..' or trailing '/'",
                plan.cwd.display()
            ),
        ));
    }
    if let Some(h) = &plan.hostname {
        if h.is_empty() || h.len() > 64 || h.bytes().any(|b| b == 0 || b == b'/' || b.is_ascii_whitespace()) {
            return Err(reject(
                FailCode::BadHostname,
                format!("hostname {h:?} must be 1 to 64 bytes without NUL, '/' or white space"),
            ));
        }
    }
    check_limits(&plan.limits, plan.detached).map_err(|detail| reject(FailCode::BadLimit, detail))?;
    if plan.uid == u32::MAX || plan.gid == u32::MAX {
        // -1 means "leave unchanged" to setresuid/setresgid: the target would keep root's ids.
        return Err(reject(
            FailCode::BadIdentity,
            "uid and gid 4294967295 (-1) mean \"unchanged\" to the kernel; choose another".into(),
        ));
    }
    if let Some(d) = &plan.expect_sha256 {
        if d.len() != 64 || !d.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(reject(FailCode::BadDigest, format!("expected digest {d:?} is not 64 lowercase hex digits")));
        }
    }
    let missing = missing_supervisor_capabilities(plan).map_err(|e| reject(FailCode::SupervisorCapabilities, e))?;
    if !missing.is_empty() {
        return Err(reject(
            FailCode::SupervisorCapabilities,
            format!("chio lacks {} (a unit's CapabilityBoundingSet, or setpriv, dropped them)", missing.join(", ")),
        ));
    }
    match sys::thread_count() {
        Ok(1) => Ok(()),
        Ok(n) => Err(reject(
            FailCode::MultithreadedSupervisor,
            format!("launch must be called from a single-threaded process (this one has {n} threads)"),
        )),
        Err(e) => Err(reject(FailCode::MultithreadedSupervisor, format!("cannot count threads: {e}"))),
    }
}

/// Capabilities the supervisor must hold in its effective set for `plan`. Most missing ones
/// would fail a later step with a vaguer error; a missing CAP_KILL would not fail at all: the
/// deadline's kill of a cage running as another uid would be refused and the target run on.
pub fn missing_supervisor_capabilities(plan: &CagePlan) -> Result<Vec<&'static str>, String> {
    use caps::Capability as Cap;
    // (capget: one system call, where /proc/self/status formats a page of text.)
    let effective = caps::read(None, caps::CapSet::Effective)
        .map_err(|e| format!("reading this process's effective capabilities: {e}"))?;
    let mut needed = vec![
        (Cap::CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"),
        (Cap::CAP_KILL, "CAP_KILL"),
        (Cap::CAP_SETGID, "CAP_SETGID"),
        (Cap::CAP_SETUID, "CAP_SETUID"),
        (Cap::CAP_SETPCAP, "CAP_SETPCAP"),
        (Cap::CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
        (Cap::CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (Cap::CAP_MKNOD, "CAP_MKNOD"),
    ];
    if plan.net == crate::plan::NetMode::Loopback {
        needed.push((Cap::CAP_NET_ADMIN, "CAP_NET_ADMIN"));
    }
    Ok(needed.into_iter().filter(|(cap, _)| !effective.contains(cap)).map(|(_, name)| name).collect())
}

/// Smallest size of the cage's `/tmp` and `/dev/shm`. tmpfs reads `size=0` as "no limit", so a
/// zero (or a size that rounds to it) would silently lift the ceiling the record states.
const MIN_TMPFS_BYTES: u64 = 1 << 20;

/// Ceilings that would mean something other than what the record says are refused.
/// A detached launch's deadline is none of its business (the engine's): 0 there.
fn check_limits(l: &crate::plan::Limits, detached: bool) -> Result<(), String> {
    for (name, value) in [("/tmp size", l.tmp_bytes), ("/dev/shm size", l.shm_bytes)] {
        if value < MIN_TMPFS_BYTES {
            return Err(format!("{name} {value} bytes is below the 1 MiB floor (tmpfs would read 0 as unlimited)"));
        }
    }
    // (flag, what, value, floor): below the floor a launch cannot even start its init and target.
    let floors = [
        ("--memory", "memory ceiling", l.memory_bytes, 1 << 20, "1M"),
        ("--pids", "pids ceiling", l.pids, 2, "2 (the init and the command)"),
        ("--cpus", "CPU ceiling", l.cpu_millis, 10, "0.01 (the kernel's smallest CPU quota)"),
        ("--timeout", "wall-clock deadline", Some(l.wall_ms).filter(|_| !detached), 1, "1ms"),
        ("", "open-file limit", Some(l.nofile), 8, "8"),
    ];
    for (flag, what, value, floor, shown) in floors {
        if let Some(v) = value.filter(|v| *v < floor) {
            let v = if flag == "--cpus" { format!("{} CPU", v as f64 / 1000.0) } else { v.to_string() };
            return Err(format!("{flag} {what} {v} is below its floor of {shown}").trim_start().to_string());
        }
    }
    Ok(())
}

/// Shadow mode records a missing fact and goes on; enforced mode stops.
fn require(plan: &CagePlan, rec: &mut LaunchRecord, ok: bool, s: Failure) -> Result<(), Failure> {
    if ok {
        return Ok(());
    }
    match plan.mode {
        Mode::Enforced => Err(s),
        Mode::Shadow => {
            rec.not_confined.push(format!("{}: {}", s.code, s.detail));
            Ok(())
        }
    }
}

fn run(plan: &CagePlan, sinks: &mut Sinks<'_>, rec: &mut LaunchRecord, held: &mut Held) -> Result<(), Failure> {
    check_plan(plan)?;
    fault::fail_at(plan, Stage::Resolve)?;
    ensure_stdio();
    ensure_staging(&plan.staging_dir).map_err(|e| FailCode::StagingUnavailable.at(Stage::Resolve, e))?;
    let abi = fault::landlock_abi(plan, landlock::abi());
    require(
        plan,
        rec,
        abi >= 4,
        FailCode::LandlockUnsupported
            .at(Stage::Landlock, format!("the host's landlock ABI is {abi}; enforced mode needs 4 or newer")),
    )?;
    let compiled = seccomp::compiled().as_ref().map_err(|e| FailCode::SeccompFailed.at(Stage::Seccomp, e))?;
    let stacked;
    let filters = match &plan.syscall_profile {
        None => compiled,
        Some(p) => {
            stacked = compiled.with_profile(p).map_err(|e| FailCode::SeccompFailed.at(Stage::Seccomp, e))?;
            &stacked
        }
    };
    rec.mark("resolve");
    fault::fail_at(plan, Stage::Cgroup)?;
    let result = launch_cage(plan, sinks, rec, filters, abi, held);
    rec.mark("target_ended");
    if let Some(cg) = &held.cgroup {
        record_usage(held.usage.take().unwrap_or_else(|| cg.usage()), rec);
    }
    result
}

/// What a launch holds outside the cage and must undo at the end, however it ended.
#[derive(Default)]
struct Held {
    /// A launch cgroup made ahead of the request, until it is taken (or removed unused).
    ahead: Option<LaunchCgroup>,
    /// That cgroup's janitor, forked with it; taken with it.
    ahead_janitor: Option<janitor::Janitor>,
    /// An init cloned ahead into that cgroup, until it takes the plan (or is killed unused).
    ahead_init: Option<crate::ahead::AheadInit>,
    cgroup: Option<LaunchCgroup>,
    janitor: Option<janitor::Janitor>,
    /// The cgroup's usage, read as soon as the target's end was reported.
    usage: Option<Usage>,
    /// The cage's init when it reported the command's end but was not reaped yet.
    init: Option<Pid>,
}

impl Held {
    fn tear_down(self) -> Result<(), String> {
        // (Killed and reaped first: it is in the cgroup made ahead.)
        drop(self.ahead_init);
        if let Some(unused) = &self.ahead {
            let _ = janitor::remove(unused, self.ahead_janitor);
        }
        if let Some(init) = self.init {
            while let Err(Errno::EINTR) = waitpid(init, None) {}
        }
        let Some(cg) = &self.cgroup else { return Ok(()) };
        // The init has been reaped by now, and with it (PID 1 of the cage's pid namespace) every
        // cage process, so the cgroup is normally empty; removal kills whatever it still finds.
        janitor::remove(cg, self.janitor).map_err(|e| format!("{e} ({})", cg.paths().join(", ")))
    }
}

fn record_usage(usage: Usage, rec: &mut LaunchRecord) {
    let Some(o) = rec.outcome.as_mut() else { return };
    if usage.cpu_us > 0 {
        o.cpu_ms = usage.cpu_us / 1000;
    }
    if usage.peak_memory > 0 {
        o.peak_memory_bytes = usage.peak_memory;
    }
    if usage.memory_hit {
        o.limit_hit.push("memory".into());
    }
    if usage.pids_hit {
        o.limit_hit.push("pids".into());
    }
}

/// Create the launch cgroup into `held` and record it; missing controllers refuse an enforced
/// launch.
fn make_cgroup<'h>(
    plan: &CagePlan,
    rec: &mut LaunchRecord,
    place: &Place,
    held: &'h mut Held,
) -> Result<&'h LaunchCgroup, Failure> {
    // The one made ahead of the request (by a daemon's spare), if it fits; else a new one.
    // Its janitor comes with it, unless the cage is detached (its cgroup outlives us).
    let made = match held.ahead.take() {
        Some(pre) if plan.cgroup_path.is_none() && pre.fits(&plan.limits, &place.hierarchy) => {
            match held.ahead_janitor.take() {
                Some(j) if plan.detached => j.dismiss(),
                j => held.janitor = j,
            }
            pre.apply(&plan.limits).map(|_| pre)
        }
        other => {
            if let Some(pre) = other {
                let _ = janitor::remove(&pre, held.ahead_janitor.take());
            }
            match &plan.enter {
                // A running cage's own: joined, never made over.
                Some(e) => LaunchCgroup::adopt(&e.cgroup),
                None => match &plan.cgroup_path {
                    // The engine's place for it.
                    Some(at) => LaunchCgroup::create_at(at, &plan.limits, place),
                    None => {
                        let name = if plan.detached { LaunchCgroup::detached_name() } else { LaunchCgroup::new_name() };
                        LaunchCgroup::create(&name, &plan.limits, place)
                    }
                },
            }
        }
    };
    let cg = made.map_err(|e| FailCode::CgroupFailed.at(Stage::Cgroup, e))?;
    rec.cgroup = Some(CgroupFacts { version: cg.version.to_string(), paths: cg.paths() });
    let missing = cg.missing.clone();
    let why = cg.missing_why.as_ref().map(|w| format!(": {w}")).unwrap_or_default();
    let version = cg.version;
    let cg = held.cgroup.insert(cg);
    require(
        plan,
        rec,
        missing.is_empty(),
        FailCode::CgroupControllerMissing.at(
            Stage::Cgroup,
            format!("the host's cgroup {version} lacks controllers {missing:?} needed for the ceilings{why}"),
        ),
    )?;
    Ok(cg)
}

/// Pipes and the status channel of one launch: (supervisor end, cage end) of each.
pub(crate) struct Wiring {
    sup_sock: OwnedFd,
    cage_sock: OwnedFd,
    stdout: (OwnedFd, OwnedFd),
    stderr: (OwnedFd, OwnedFd),
    result: (OwnedFd, OwnedFd),
    /// (write end, read end) when the target's stdin is fed by the supervisor.
    stdin: Option<(OwnedFd, OwnedFd)>,
}

/// The supervisor's ends of a launch's wiring, once the init has its copies of the cage's.
#[derive(Debug)]
pub(crate) struct SupEnds {
    /// The status channel.
    pub(crate) sock: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    result: OwnedFd,
    /// The write end of the target's stdin, when the supervisor feeds it.
    pub(crate) stdin: Option<OwnedFd>,
}

impl Wiring {
    pub(crate) fn new(feed_stdin: bool) -> io::Result<Wiring> {
        let (sup_sock, cage_sock) = channel::pair()?;
        let stdin = match feed_stdin {
            true => {
                let (r, w) = pipe()?;
                set_nonblocking(&w)?;
                Some((w, r))
            }
            false => None,
        };
        Ok(Wiring { sup_sock, cage_sock, stdout: pipe()?, stderr: pipe()?, result: pipe()?, stdin })
    }

    /// The cage's ends as an init uses them: stdout, stderr and result write ends, stdin's
    /// read end (or -1), and the status channel.
    pub(crate) fn cage_ends(&self) -> ([RawFd; 4], RawFd) {
        let stdin = self.stdin.as_ref().map_or(-1, |s| s.1.as_raw_fd());
        let pipes = [self.stdout.1.as_raw_fd(), self.stderr.1.as_raw_fd(), self.result.1.as_raw_fd(), stdin];
        (pipes, self.cage_sock.as_raw_fd())
    }

    /// Keep the supervisor's ends only (the init, cloned, has its own copies of the cage's).
    pub(crate) fn into_supervisor_ends(self) -> SupEnds {
        let Wiring { sup_sock, stdout, stderr, result, stdin, .. } = self;
        SupEnds { sock: sup_sock, stdout: stdout.0, stderr: stderr.0, result: result.0, stdin: stdin.map(|(w, _)| w) }
    }

    /// The supervisor's ends, which the cloned init must close at once: holding the peer's end
    /// of its own channel would hide the supervisor's death from it.
    pub(crate) fn supervisor_ends(&self) -> [RawFd; 5] {
        [
            self.sup_sock.as_raw_fd(),
            self.stdout.0.as_raw_fd(),
            self.stderr.0.as_raw_fd(),
            self.result.0.as_raw_fd(),
            self.stdin.as_ref().map_or(-1, |s| s.0.as_raw_fd()),
        ]
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(())
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(OFlag::O_CLOEXEC)?)
}

/// Clone the init (or hand the plan to one cloned ahead) and take the launch from there to the
/// target's end. On cgroup v2 the init is cloned straight into the launch cgroup, which must
/// exist first; on v1 the supervisor creates it while the init builds its namespaces (they run
/// on two CPUs) and sends it over. An init cloned ahead is in the cgroup already and is told
/// once its ceilings are written.
fn launch_cage(
    plan: &CagePlan,
    sinks: &mut Sinks<'_>,
    rec: &mut LaunchRecord,
    filters: &Filters,
    abi: u32,
    held: &mut Held,
) -> Result<(), Failure> {
    let hierarchy =
        Hierarchy::take(plan.cgroup_v2_root.as_deref()).map_err(|e| FailCode::CgroupFailed.at(Stage::Cgroup, e))?;
    // (The cgroup mount opened now, before the init is cloned: see cgroup::Mounts.)
    let place = Place::of(hierarchy);
    // One that does not fit this plan is killed here (before its cgroup is made over).
    let pre = held.ahead_init.take().filter(|_| !plan.detached && ahead_init_fits(plan, &place.hierarchy, held));
    fault::fail_at(plan, Stage::Namespaces)?;
    let feed = sinks.stdin.is_some();
    let known = sinks.ahead.digests;
    let started = pre.map(|p| p.start(plan, abi, feed));
    let (init, ends, ahead) = match started {
        Some(Ok((pid, ends))) => (pid, ends, true),
        // Gone, or the plan would not fit in one message: the launch clones its own.
        _ => {
            let cpus = sys::own_affinity();
            let (pid, ends) = clone_init(plan, sinks, rec, (filters, abi), held, (&place, cpus.as_ref()))?;
            // The init starts on another CPU while we make the cgroup and the janitor on this one.
            if let Some(cpus) = &cpus {
                sys::start_elsewhere(pid, cpus);
            }
            (pid, ends, false)
        }
    };
    // From here the init exists: until supervision takes it, any way out kills and reaps it.
    let guard = InitGuard(Some(init), plan.enter.is_some());
    let SupEnds { sock, stdout, stderr, result, stdin } = ends;
    let fresh = FreshInit { pid: init, sock: &sock, ahead };
    let hooks = Hooks { gate: sinks.gate, enforced: sinks.on_enforced.take(), park: sinks.park.take() };
    let (exec_at, pidfd) = start_cage(plan, rec, &place, held, fresh, known, hooks)?;
    let init = guard.hand_over();
    if plan.detached {
        // Observed and recorded: the rest is the engine's. The cgroup stays for `delete`.
        drop(held.cgroup.take());
        return Ok(());
    }
    let cg = held.cgroup.as_ref();
    let mut on_result = || held.usage = cg.map(LaunchCgroup::usage);
    let ended = supervise::run(supervise::Run {
        init,
        pidfd: pidfd.as_fd(),
        stdout,
        stderr,
        stdin,
        result,
        deadline: exec_at + std::time::Duration::from_millis(plan.limits.wall_ms),
        output_limit: plan.limits.output_bytes,
        started: exec_at,
        sinks,
        on_result: &mut on_result,
    });
    if !ended.init_reaped {
        held.init = Some(Pid::from_raw(init));
    }
    rec.outcome = Some(ended.outcome);
    Ok(())
}

/// The cage's init from its clone until supervision takes it: dropped on the way — a setup
/// stage that failed, a refusal at the exec stop, a withdrawn launch, a panic — it is killed
/// and reaped, so that no failed launch leaves a cage behind.
///
/// A process entering a running cage is given a moment first: its target lives in the cage's
/// pid namespace, and only its parent — the entering process — reaps it there. Killed at once,
/// it would leave the target (which ends with the channel closed, or of its parent-death
/// signal) to the caller's subreaper, outside the cage, where the cage's init could not reap it.
struct InitGuard(Option<libc::pid_t>, bool);

impl InitGuard {
    /// The init, now supervision's to end.
    fn hand_over(mut self) -> libc::pid_t {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            if self.1 {
                let deadline = Instant::now() + std::time::Duration::from_secs(2);
                while Instant::now() < deadline {
                    match waitpid(Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                        Ok(nix::sys::wait::WaitStatus::StillAlive) | Err(Errno::EINTR) => {
                            std::thread::sleep(std::time::Duration::from_millis(2))
                        }
                        _ => return,
                    }
                }
            }
            kill_and_reap(pid);
        }
    }
}

/// Whether an init cloned ahead can take this plan: it made every namespace and is in the
/// cgroup made ahead, so the plan must not withhold one (a test hook) and must fit that cgroup.
fn ahead_init_fits(plan: &CagePlan, hierarchy: &Hierarchy, held: &Held) -> bool {
    let withholds = matches!(
        fault::hook(plan),
        Some(TestHook::Namespace(_) | TestHook::NetnsKept | TestHook::Cgroup | TestHook::Bounding | TestHook::Caps)
    );
    // (It named itself `chio`, and dropped its bounding set, before the plan came.)
    !withholds
        && plan.hostname.is_none()
        && plan.join.is_empty()
        // (Its filters were compiled before the plan came, without the plan's own profile.)
        && plan.syscall_profile.is_none()
        && held.ahead.as_ref().is_some_and(|cg| cg.fits(&plan.limits, hierarchy))
}

/// Clone the init now. Returns its pid and the supervisor's ends of its wiring.
fn clone_init(
    plan: &CagePlan,
    sinks: &mut Sinks<'_>,
    rec: &mut LaunchRecord,
    (filters, abi): (&Filters, u32),
    held: &mut Held,
    (place, cpus): (&Place, Option<&nix::sched::CpuSet>),
) -> Result<(libc::pid_t, SupEnds), Failure> {
    let v2_dir = match place.hierarchy {
        Hierarchy::V2(_) => {
            let cg = make_cgroup(plan, rec, place, held)?;
            Some(cg.v2_dir().map_err(|e| FailCode::CgroupFailed.at(Stage::Cgroup, e))?)
        }
        Hierarchy::V1 => None,
    };
    let w = Wiring::new(sinks.stdin.is_some()).map_err(|e| FailCode::SetupFailed.at(Stage::Namespaces, e))?;
    // Taken, so that the supervisor's copy closes as soon as the init has its own.
    let (netns, root_ahead) = (sinks.ahead.netns.take(), sinks.ahead.root.take());
    let join = open_joined(plan)?;
    let entered = open_entered(plan)?;
    let ([stdout_w, stderr_w, result_w, stdin_r], sock) = match plan.detached {
        // The engine's own descriptors as it gave them to us (stdin: ours unless one is named),
        // or its console's terminal.
        true => {
            let stdin = sinks.stdin.map_or(0, |f| f.as_raw_fd());
            ([sinks.stdout.as_raw_fd(), sinks.stderr.as_raw_fd(), -1, stdin], w.cage_ends().1)
        }
        false => w.cage_ends(),
    };
    let ctx = Ctx {
        plan,
        filters,
        landlock_abi: abi,
        sock,
        await_cgroup: v2_dir.is_none(),
        stdout_w,
        stderr_w,
        result_w,
        stdin_r,
        supervisor_ends: w.supervisor_ends(),
        netns: netns.as_ref().map_or(-1, |f| f.as_raw_fd()),
        root_ahead: root_ahead.as_ref(),
        join: [&join[0], &join[1]].map(|f| f.as_ref().map_or(-1, |f| f.as_raw_fd())),
        enter: entered.each_ref().map(|f| f.as_ref().map_or(-1, |f| f.as_raw_fd())),
        cpus: cpus.copied(),
    };
    // (A test hook leaves the init outside the launch cgroup.)
    let into = v2_dir.as_ref().filter(|_| !fault::on(plan, &TestHook::Cgroup));
    if fault::on(plan, &TestHook::OrphanEarly) {
        inside::HOOK_SUPERVISOR.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
    }
    let cloned = match plan.enter {
        None => clone_pid_ns(into.map(AsFd::as_fd)),
        // Entering: the process stays in our pid namespace; its target is born in the cage's.
        Some(_) => clone_plain(into.map(AsFd::as_fd)),
    };
    match cloned {
        Ok(0) => inside::init_main(&ctx),
        Ok(_) if fault::on(plan, &TestHook::OrphanEarly) => {
            // Test hook: the supervisor dies the moment its init exists, before it sends a word.
            // SAFETY: _exit ends this process at once (nix has no _exit).
            unsafe { libc::_exit(9) }
        }
        // The init has its own copies: the supervisor keeps no handle on the cage's mounts.
        Ok(pid) => Ok((pid, w.into_supervisor_ends())),
        Err(e) => Err(FailCode::NamespaceFailed.at(Stage::Namespaces, e)),
    }
}

/// A running cage's namespaces to enter (the plan's `enter`), opened here, in the order the
/// entering process joins them — only while its init is the process the plan names (its start
/// time), and never one of the supervisor's own.
fn open_entered(plan: &CagePlan) -> Result<[Option<OwnedFd>; 6], Failure> {
    let Some(e) = &plan.enter else { return Ok(Default::default()) };
    let fail = |d: String| FailCode::NamespaceFailed.at(Stage::Namespaces, d);
    let pidfd = sys::pidfd_open(e.init).map_err(|err| fail(format!("the cage's init {} is gone: {err}", e.init)))?;
    let started: u64 = sys::stat_field(&e.init.to_string(), 22).map_err(|err| fail(format!("{err}")))?;
    if started != e.init_started {
        return Err(fail(format!("pid {} is no longer the cage's init (another process has its pid)", e.init)));
    }
    let mut fds: [Option<OwnedFd>; 6] = Default::default();
    for (slot, (name, _)) in fds.iter_mut().zip(inside::ENTERED) {
        let path = format!("/proc/{}/ns/{name}", e.init);
        let f = fs::File::open(&path).map_err(|err| fail(format!("opening {path}: {err}")))?;
        let own = fs::metadata(format!("/proc/self/ns/{name}")).map_err(|err| fail(format!("{err}")))?;
        let theirs = f.metadata().map_err(|err| fail(format!("{err}")))?;
        use std::os::unix::fs::MetadataExt;
        if (own.dev(), own.ino()) == (theirs.dev(), theirs.ino()) {
            return Err(fail(format!("the cage's {name} namespace is the supervisor's own: it is not entered")));
        }
        *slot = Some(OwnedFd::from(f));
    }
    // Still the same process after the opens: the namespaces are the cage's.
    if !sys::pidfd_holds_pid(pidfd.as_fd()) {
        return Err(fail(format!("the cage's init {} ended while it was being entered", e.init)));
    }
    Ok(fds)
}

/// The plan's ipc and uts namespaces to join, opened here (on the host, before the clone).
fn open_joined(plan: &CagePlan) -> Result<[Option<OwnedFd>; 2], Failure> {
    let mut fds = [None, None];
    for (kind, path) in &plan.join {
        let slot = match kind.as_str() {
            "ipc" => 0,
            "uts" => 1,
            _ => {
                return Err(FailCode::NamespaceFailed
                    .at(Stage::Namespaces, format!("a {kind} namespace cannot be joined (only ipc and uts)")))
            }
        };
        let f = fs::File::open(path).map_err(|e| {
            FailCode::NamespaceFailed
                .at(Stage::Namespaces, format!("opening the {kind} namespace {}: {e}", path.display()))
        })?;
        fds[slot] = Some(OwnedFd::from(f));
    }
    Ok(fds)
}

/// Clone this process into a new pid namespace (and on cgroup v2 `into` the launch cgroup): 0
/// in the child, which is the cage's init, and its pid in the parent. The caller is
/// single-threaded.
pub(crate) fn clone_pid_ns(into: Option<BorrowedFd<'_>>) -> io::Result<libc::pid_t> {
    // Read here, once per process, so that the init (a copy of this process) need not.
    let _ = sys::arg_area();
    sys::leave_realtime()?;
    match into {
        Some(dir) => sys::clone_into_cgroup(libc::CLONE_NEWPID as u64, dir),
        None => sys::clone_fork(libc::CLONE_NEWPID as libc::c_ulong),
    }
}

/// Fork this process (on cgroup v2 `into` the cage's cgroup) with no new namespace: a process
/// entering a running cage.
fn clone_plain(into: Option<BorrowedFd<'_>>) -> io::Result<libc::pid_t> {
    let _ = sys::arg_area();
    sys::leave_realtime()?;
    match into {
        Some(dir) => sys::clone_into_cgroup(0, dir),
        None => sys::clone_fork(0),
    }
}

/// The init just cloned: its pid and the supervisor's end of its channel.
struct FreshInit<'a> {
    pid: libc::pid_t,
    sock: &'a OwnedFd,
    /// Cloned ahead: in the launch cgroup already, waiting to hear that its ceilings are set.
    ahead: bool,
}

/// The caller's word on the way to the exec: its gate before the target goes on, its hook at
/// the exec stop.
struct Hooks<'a> {
    gate: Option<Gate<'a>>,
    enforced: Option<OnEnforced<'a>>,
    park: Option<crate::supervise::Park<'a>>,
}

/// The supervisor's part while the init sets up: the cgroup (v1), the janitor, a head start on
/// hashing the target; then verify and observe the exec. Returns the exec time and a pidfd.
fn start_cage(
    plan: &CagePlan,
    rec: &mut LaunchRecord,
    place: &Place,
    held: &mut Held,
    init: FreshInit<'_>,
    known: Option<Digests>,
    hooks: Hooks<'_>,
) -> Result<(Instant, OwnedFd), Failure> {
    let FreshInit { pid: init, sock, ahead } = init;
    let to_cage = |msg: &CageMsg, fds: &[RawFd]| {
        channel::send(sock.as_raw_fd(), msg, fds)
            .map_err(|e| cage_report(sock).unwrap_or_else(|| FailCode::CgroupFailed.at(Stage::Cgroup, e)))
    };
    if held.cgroup.is_none() {
        let cg = make_cgroup(plan, rec, place, held)?;
        if !ahead {
            let fds = cg.self_join_fds().map_err(|e| FailCode::CgroupFailed.at(Stage::Cgroup, e))?;
            to_cage(&CageMsg::Join, &fds.iter().map(|f| f.as_raw_fd()).collect::<Vec<_>>())?;
        }
    }
    if ahead {
        to_cage(&CageMsg::Ceilings, &[])?;
    }
    let Some(cg) = held.cgroup.as_ref() else {
        return Err(FailCode::CgroupFailed.at(Stage::Cgroup, "no launch cgroup"));
    };
    rec.mark("cgroup");
    // A detached cage's cgroup is removed by the runtime's `delete`, not when we exit. (One
    // made ahead came with its janitor.)
    if !plan.detached && held.janitor.is_none() {
        held.janitor = Some(janitor::spawn(cg).map_err(|e| FailCode::CgroupFailed.at(Stage::Cgroup, e))?);
    }
    let pidfd = sys::pidfd_open(init).map_err(|e| FailCode::SetupFailed.at(Stage::Namespaces, e))?;
    // The cage is still setting itself up; meanwhile sweep away the launch cgroups of dead
    // supervisors beside ours, hash the file it will most likely send and read what the
    // observation compares with.
    if cg.name().starts_with("chio-") {
        cg.sweep_beside();
    }
    let early = prehash::guess(plan, known);
    let host_ns = observe::own_namespaces();
    let filters = observe::own_seccomp_filters();
    let exec_at =
        verify_and_exec(plan, rec, Host { init, cg, ns: &host_ns, filters }, sock, (early.as_ref(), known), hooks)?;
    Ok((exec_at, pidfd))
}

/// From the target's hello to "target detached after a verified exec". Returns the exec time.
/// `hashes`: the early digest of the likeliest target, and the supervisor's shared digests.
///
/// The target says hello first thing and is held under ptrace from then on: it sets itself up
/// meanwhile, reports ready, and execs without waiting for another word. The executable's
/// digest is checked while it execs, and the exec stop — before one instruction of the new
/// program runs — is where any refusal kills it.
fn verify_and_exec(
    plan: &CagePlan,
    rec: &mut LaunchRecord,
    host: Host<'_>,
    sock: &OwnedFd,
    hashes: (Option<&Early>, Option<Digests>),
    mut hooks: Hooks<'_>,
) -> Result<Instant, Failure> {
    let hello = recv_timeout(sock, SETUP_TIMEOUT_MS)?;
    let (tpid, sender) = match (cage_msg(hello.msg, hello.pid)?, hello.pidfd) {
        ((CageMsg::Hello, Some(pid)), Some(pidfd)) => (pid, pidfd),
        ((CageMsg::Hello, _), _) => {
            return Err(
                FailCode::ChannelFailed.at(Stage::Target, "the hello carried no credentials or no pidfd of its sender")
            )
        }
        _ => return Err(FailCode::ChannelFailed.at(Stage::Namespaces, "the cage spoke out of turn (no hello first)")),
    };
    // A cage parked for a later start is parked ready: its target found, confined and waiting
    // for GO, so that a target that cannot start fails the park with its own reason, not later
    // as a cage that vanished. (The target waits for GO before it execs: a seize after its
    // ready still comes before the exec.)
    let parked_ready = match hooks.park.take() {
        None => None,
        Some(park) => {
            let ready = recv_timeout(sock, SETUP_TIMEOUT_MS)?;
            if !matches!(ready.msg, Some(CageMsg::Ready { .. })) {
                cage_msg(ready.msg, ready.pid)?;
                return Err(FailCode::ChannelFailed.at(Stage::Namespaces, "the cage spoke out of turn (no ready)"));
            }
            let cgroup = host.cg.paths().into_iter().map(std::path::PathBuf::from).collect();
            if let Err(e) = park(&crate::supervise::Parked { init: host.init, target: tpid, cgroup }) {
                let _ = channel::send_byte(sock.as_raw_fd(), ABORT);
                return Err(FailCode::Withdrawn.at(Stage::Exec, e));
            }
            Some(ready)
        }
    };
    if let Err(s) = seize_sender(tpid, sender.as_fd()) {
        let _ = channel::send_byte(sock.as_raw_fd(), ABORT);
        return Err(cage_report(sock).unwrap_or(s));
    }
    if hooks.gate.is_some_and(|open| !open()) {
        let _ = channel::send_byte(sock.as_raw_fd(), ABORT);
        release_tracee(tpid);
        return Err(FailCode::Withdrawn.at(Stage::Exec, "the launch was withdrawn before its command ran"));
    }
    if fault::on(plan, &TestHook::GoLate) {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // The target sets itself up meanwhile: one that failed there has reported why and may have
    // ended, its end of the channel closed. Its report, not the closed channel, is the failure.
    let go = channel::send_byte(sock.as_raw_fd(), GO)
        .map_err(|e| cage_report(sock).unwrap_or_else(|| FailCode::SetupFailed.at(Stage::Exec, e)));
    let r = go.and_then(|()| {
        // While the target sets itself up, the exec stop's reads once, their results dropped:
        // the first reads of a new process's /proc entries (and this process's first run of
        // this code) are several times dearer than a repeat, and at the exec stop the target
        // waits for them.
        drop(observe::read(tpid, host.ns));
        verify_traced(plan, rec, host, sock, (tpid, hashes), (parked_ready, hooks.enforced))
    });
    if r.is_err() {
        release_tracee(tpid);
    }
    r
}

/// A message from the cage and its sender's pid; a failure it reports, or its silent end, as the
/// stop it is.
fn cage_msg(msg: Option<CageMsg>, pid: Option<libc::pid_t>) -> Result<(CageMsg, Option<libc::pid_t>), Failure> {
    match msg {
        Some(CageMsg::Failed(f)) => Err(f),
        None => Err(FailCode::CageDied.at(Stage::Namespaces, "the cage exited during setup without a report")),
        Some(CageMsg::Join | CageMsg::Plan { .. } | CageMsg::Ceilings) => {
            Err(FailCode::ChannelFailed.at(Stage::Namespaces, "the cage sent a supervisor message"))
        }
        Some(m) => Ok((m, pid)),
    }
}

/// The target `tpid` is traced: read its ready report, check the executable it opened, then
/// observe its exec.
fn verify_traced(
    plan: &CagePlan,
    rec: &mut LaunchRecord,
    host: Host<'_>,
    sock: &OwnedFd,
    (tpid, (early, known)): (libc::pid_t, (Option<&Early>, Option<Digests>)),
    (ready, hook): (Option<channel::Received>, Option<OnEnforced<'_>>),
) -> Result<Instant, Failure> {
    let ready = match ready {
        Some(r) => r,
        None => recv_timeout(sock, SETUP_TIMEOUT_MS)?,
    };
    rec.mark("cage_ready");
    let (reported, exec_path, script_path, script_fd) = match cage_msg(ready.msg, ready.pid)? {
        (CageMsg::Ready { reported, exec_path, script_path, script_fd }, Some(pid)) if pid == tpid => {
            (reported, exec_path, script_path, script_fd)
        }
        (CageMsg::Ready { .. }, _) => {
            return Err(FailCode::ChannelFailed.at(Stage::Target, "the ready message did not come from the target"))
        }
        _ => return Err(FailCode::ChannelFailed.at(Stage::Namespaces, "the cage spoke out of turn (no ready)")),
    };
    rec.reported = Some(*reported);
    let mut fds = ready.fds.into_iter();
    let exec_fd = fds
        .next()
        .ok_or_else(|| FailCode::ChannelFailed.at(Stage::Target, "the ready message carried no executable"))?;
    // What was hashed, with the identity it had *before* it was read, to be found unchanged at
    // the exec stop: an identity taken after the hash would vouch for a write that landed while
    // the file was being read. A file only root can write is hashed now; any other is hashed at
    // the exec stop (`Digest::AtExecStop`).
    let exe = describe(exec_fd, &exec_path, early, known)?;
    let exe_id = (exe.target.device, exe.target.inode);
    let (mut target, mut settled, mut pending) = (exe.target, Vec::new(), None);
    match exe.digest {
        Digest::Settled(id) => settled.push((id, exe.fd)),
        Digest::AtExecStop => pending = Some(exe.fd),
    }
    let mut script = None;
    match ((fds.next(), fds.next()), script_path, script_fd) {
        ((Some(file), Some(copy)), Some(sp), Some(n)) => {
            let s = describe_script(&file, &copy, &sp)?;
            script = Some((n, s.copy_device, s.copy_inode));
            target =
                Target { interpreter: Some(Box::new(target)), opened_as: Some(format!("/dev/fd/{n}")), ..s.target };
        }
        ((None, None), None, None) => {}
        _ => {
            return Err(FailCode::ChannelFailed
                .at(Stage::Target, "the ready message's script, its sealed copy and its fd number do not go together"))
        }
    }
    // A digest still to be taken at the exec stop (the executable's, when it is the target) is
    // checked there.
    let verified = match (&pending, &script) {
        (Some(_), None) => Ok(()),
        _ => verify_digest(plan, &target),
    };
    rec.target = Some(target);
    verified?;
    fault::fail_at(plan, Stage::Verify)?;
    if fault::on(plan, &TestHook::Touch) {
        // Test hook: tell the target its file's identity is taken; it changes the file now.
        let _ = channel::send_byte(sock.as_raw_fd(), GO);
    }
    let traced = Traced { plan, host, tpid, exe: exe_id, script, settled, pending, sock };
    traced.exec_and_observe(rec, hook)
}

/// The supervisor-side facts the target is checked against.
#[derive(Clone, Copy)]
struct Host<'a> {
    /// The cage's init (our child).
    init: libc::pid_t,
    cg: &'a LaunchCgroup,
    ns: &'a BTreeMap<String, String>,
    /// Seccomp filters the supervisor itself runs under.
    filters: u32,
}

/// The target between PTRACE_SEIZE and detach.
struct Traced<'a> {
    plan: &'a CagePlan,
    host: Host<'a>,
    tpid: libc::pid_t,
    exe: (u64, u64),
    /// A script's fd number in the target and its device and inode.
    script: Option<(i32, u64, u64)>,
    /// The files hashed before the exec (the supervisor's fds) and their identity before they
    /// were read: each must still have it at the exec stop.
    settled: Vec<(Identity, OwnedFd)>,
    /// The executable when another uid than root could write it: hashed at the exec stop.
    pending: Option<OwnedFd>,
    sock: &'a OwnedFd,
}

impl Traced<'_> {
    /// Let the target exec, check every fact at the exec stop, tell the hook, then detach.
    fn exec_and_observe(&self, rec: &mut LaunchRecord, hook: Option<OnEnforced<'_>>) -> Result<Instant, Failure> {
        let plan = self.plan;
        // Test hook: the target stalls before its exec, and the wait for it is short.
        let within = match fault::on(plan, &TestHook::StallBeforeExec) {
            true => Duration::from_millis(1000),
            false => Duration::from_millis(SETUP_TIMEOUT_MS as u64),
        };
        wait_exec(self.tpid, self.sock, within)?;
        let exec_at = Instant::now();
        rec.exec_observed_at = Some(record::now_rfc3339());
        rec.mark("exec_stop");
        let mut observed = observe::read(self.tpid, self.host.ns);
        observed.status_channel_eof = eof_within(self.sock, 2000);
        // EOF comes from an init that shed everything and closed its fds, or from one that gave
        // up and exited: its state tells which, before the target runs.
        observed.init = observe::read_init(self.host.init);
        observed.seccomp_filters_inherited = self.host.filters;
        let cwd = plan.cwd.to_string_lossy();
        let expect = Expect {
            exe: self.exe,
            uid: plan.uid,
            gid: plan.gid,
            cgroup: Some((self.host.cg.name(), self.host.cg.hierarchies())),
            cwd: &cwd,
            script: self.script,
            inherited_filters: self.host.filters,
            cage_filters: 1 + u32::from(plan.syscall_profile.is_some()),
        };
        // The executed inode is what `exe` names (checked below), and from this exec on the kernel
        // refuses it to every writer (ETXTBSY; a writer still open would have failed the exec):
        // its bytes now are the bytes that run.
        if let Some(fd) = &self.pending {
            self.hash_at_exec_stop(fd, rec)?;
        }
        let mut problems = observe::violations(&observed, &expect);
        for (then, fd) in &self.settled {
            if Some(*then) != prehash::identity_of(fd.as_fd()) {
                problems.push("a file changed after it was hashed (its size, mtime or ctime moved)".into());
            }
        }
        if fault::fails(plan, Stage::Observe) {
            problems.push("test-only failure injected at stage observe".into());
        }
        rec.observed = Some(observed);
        if !problems.is_empty() {
            match plan.mode {
                Mode::Enforced => return Err(FailCode::FactMismatch.at(Stage::Observe, problems.join("; "))),
                Mode::Shadow => rec.not_confined.extend(problems),
            }
        }
        rec.state = if rec.not_confined.is_empty() { State::FullyEnforced } else { State::NotConfined };
        if let Some(h) = hook {
            // Still stopped at exec: a failing hook kills the target before it runs.
            h(rec).map_err(|e| {
                rec.state = State::BootstrapFailed;
                FailCode::EvidenceNotRecorded.at(Stage::Observe, e)
            })?;
        }
        if fault::on(plan, &TestHook::KillAtExecStop) {
            let _ = kill(Pid::from_raw(self.tpid), Signal::SIGKILL);
        }
        // Detached, the tracee continues from the exec stop. Detaching fails only for a tracee
        // no longer stopped: killed here (the OOM killer, an operator, the init's end), it is a
        // zombie only its tracer can release, and until then the cage's init cannot finish
        // dying — reap it as its tracer; its parent, the init, still sees how it ended.
        if ptrace::detach(Pid::from_raw(self.tpid), None).is_err() {
            release_tracee(self.tpid);
        }
        rec.mark("exec_observed");
        Ok(exec_at)
    }
}

impl Traced<'_> {
    /// Hash the executable at the exec stop and check the plan's digest against it (the
    /// target's, or for a script the interpreter's: the script's own digest was checked before).
    fn hash_at_exec_stop(&self, fd: &OwnedFd, rec: &mut LaunchRecord) -> Result<(), Failure> {
        let Some(target) = rec.target.as_mut() else {
            return Err(FailCode::HashFailed.at(Stage::Verify, "no target described before the exec"));
        };
        let exe = match target.interpreter.as_deref_mut() {
            Some(interpreter) => interpreter,
            None => target,
        };
        exe.sha256 = prehash::hash(fd.as_fd())
            .map_err(|e| FailCode::HashFailed.at(Stage::Verify, format!("hashing {} at its exec: {e}", exe.path)))?;
        match self.script {
            Some(_) => Ok(()),
            None => verify_digest(self.plan, target),
        }
    }
}

/// Kill a tracee and consume its exit notification. Without this the cage's init could never
/// finish tearing down its namespace: the zombie tracee waits for its tracer (us) first.
fn release_tracee(tpid: libc::pid_t) {
    let pid = Pid::from_raw(tpid);
    // A supervisor without CAP_KILL over the target's uid cannot signal it; as its tracer it
    // still ends it from the stop it is in, resumed with SIGKILL. When neither works, waiting
    // would never end: the cage's teardown (the init's death) reaps it instead.
    if kill(pid, Signal::SIGKILL).is_err() && ptrace::cont(pid, Signal::SIGKILL).is_err() {
        return;
    }
    loop {
        match waitpid(pid, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => break,
            Err(Errno::EINTR) | Ok(_) => {}
            Err(_) => break,
        }
    }
}

/// When a described file's digest is taken.
enum Digest {
    /// Taken before the exec (only root can write the file): valid while it keeps this
    /// identity, which it had before it was read.
    Settled(Identity),
    /// Taken at the exec stop, when the kernel denies every write to the executing inode.
    AtExecStop,
}

/// A file the record names, as described before the exec.
struct Described {
    target: Target,
    fd: OwnedFd,
    digest: Digest,
}

/// The file behind `fd`, described; hashed now (or found among the early and shared digests)
/// when only root can change it, otherwise left to be hashed at the exec stop.
fn describe(fd: OwnedFd, path: &str, early: Option<&Early>, known: Option<Digests>) -> Result<Described, Failure> {
    let st = regular(&fd, path)?;
    local_fs(&fd, path)?;
    let mut target = Target { path: path.to_string(), device: st.st_dev, inode: st.st_ino, ..Target::default() };
    if !prehash::settled(fd.as_fd(), &st) {
        return Ok(Described { target, fd, digest: Digest::AtExecStop });
    }
    let id = prehash::identity(&st);
    let (sha256, share) = match (early, prehash::lookup(known, &id)) {
        (_, Some(d)) => (d, false),
        (Some(e), None) if e.matches(&st) => (e.sha256.clone(), true),
        _ => (
            prehash::hash(fd.as_fd())
                .map_err(|e| FailCode::HashFailed.at(Stage::Verify, format!("hashing {path}: {e}")))?,
            true,
        ),
    };
    if share {
        prehash::share(known, fd.as_fd(), &id, &sha256);
    }
    target.sha256 = sha256;
    Ok(Described { target, fd, digest: Digest::Settled(id) })
}

/// A `#!` script as the record names it: the file as opened (path, device, inode) with the
/// digest of its sealed copy, the bytes the interpreter reads; and the copy's device and inode,
/// which the target must hold open at its exec.
struct DescribedScript {
    target: Target,
    copy_device: u64,
    copy_inode: u64,
}

fn describe_script(file: &OwnedFd, copy: &OwnedFd, path: &str) -> Result<DescribedScript, Failure> {
    let st = regular(file, path)?;
    let copied = regular(copy, path)?;
    if !crate::sealed::is_sealed(copy.as_fd()) {
        return Err(FailCode::ScriptNotSealed
            .at(Stage::Verify, format!("the copy of {path} its interpreter would read is not sealed against writes")));
    }
    let sha256 = prehash::hash(copy.as_fd())
        .map_err(|e| FailCode::HashFailed.at(Stage::Verify, format!("hashing the sealed copy of {path}: {e}")))?;
    Ok(DescribedScript {
        target: Target { path: path.to_string(), sha256, device: st.st_dev, inode: st.st_ino, ..Target::default() },
        copy_device: copied.st_dev,
        copy_inode: copied.st_ino,
    })
}

/// File systems whose page cache holds a file's bytes as the kernel wrote or read them from a
/// local device or memory (ext2/3/4, xfs, btrfs, tmpfs, overlayfs, squashfs, erofs, f2fs,
/// ramfs, bcachefs). A FUSE or network file system's server can give a later page fault other
/// bytes than were hashed, and report any owner, mode and times: a file executed from one is
/// refused rather than vouched for.
const LOCAL_FS: [i64; 10] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0x794C_7630,
    0x7371_7368,
    0xE0F5_E1E2,
    0xF2F5_2010,
    0x8584_58F6,
    0xCA45_1A4E,
];
/// FUSE's file system type, named in a refusal.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// The file behind `fd` (to be executed) lives on a local file system (see [`LOCAL_FS`]).
fn local_fs(fd: &OwnedFd, path: &str) -> Result<(), Failure> {
    let statfs = nix::sys::statfs::fstatfs(fd).map_err(|e| FailCode::HashFailed.at(Stage::Verify, e))?;
    let f_type = statfs.filesystem_type().0 as i64;
    if LOCAL_FS.contains(&f_type) {
        return Ok(());
    }
    let what = if f_type == FUSE_SUPER_MAGIC { "FUSE".to_string() } else { format!("{f_type:#x}") };
    Err(FailCode::TargetOnRemoteFs.at(
        Stage::Verify,
        format!(
            "{path} is on a {what} file system, whose server could serve other bytes than were hashed once it runs; \
             copy it to a local file system (the workspace, the image)"
        ),
    ))
}

/// The stat of `fd`, which must be a regular file.
fn regular(fd: &OwnedFd, path: &str) -> Result<libc::stat, Failure> {
    let st = sys::fstat(fd.as_fd()).map_err(|e| FailCode::HashFailed.at(Stage::Verify, e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(FailCode::TargetNotExecutable.at(Stage::Verify, format!("{path} is not a regular file")));
    }
    Ok(st)
}

fn verify_digest(plan: &CagePlan, target: &Target) -> Result<(), Failure> {
    match &plan.expect_sha256 {
        Some(want) if *want != target.sha256 => Err(FailCode::DigestMismatch
            .at(Stage::Verify, format!("{} has SHA-256 {} but the plan requires {want}", target.path, target.sha256))),
        _ => Ok(()),
    }
}

/// Seize the hello's sender by the pid its credentials gave, and make sure the process seized is
/// that sender: had the target died and been reaped since its hello, its pid could name any
/// process on the host by now, which the supervisor would hold, and kill on the way out. The
/// sender's pidfd still holding its pid after the seize proves it held it during the seize; a
/// traced process is not reaped before its tracer waits for it, so the pid stays the target's
/// from then on. A stranger seized is let go untouched.
fn seize_sender(tpid: libc::pid_t, sender: BorrowedFd<'_>) -> Result<(), Failure> {
    // The target cannot exec before our GO.
    let opts = ptrace::Options::PTRACE_O_TRACEEXEC | ptrace::Options::PTRACE_O_EXITKILL;
    ptrace::seize(Pid::from_raw(tpid), opts).map_err(|e| FailCode::PtraceFailed.at(Stage::Exec, e))?;
    if sys::pidfd_holds_pid(sender) {
        return Ok(());
    }
    let_go(Pid::from_raw(tpid));
    Err(FailCode::CageDied.at(
        Stage::Target,
        format!("the target ended between its hello and the seize; pid {tpid} was let go, not followed"),
    ))
}

/// Detach a process seized by mistake, leaving it as it was: interrupt it into a stop (a seized
/// process that runs cannot be detached), then detach. A seized process's group stops come as
/// events; a plain stop is a signal on its way, passed on.
fn let_go(pid: Pid) {
    if ptrace::interrupt(pid).is_err() {
        return;
    }
    let status = loop {
        match waitpid(pid, Some(WaitPidFlag::__WALL)) {
            Err(Errno::EINTR) => continue,
            r => break r,
        }
    };
    let _ = match status {
        Ok(WaitStatus::Stopped(_, sig)) => ptrace::detach(pid, sig),
        Ok(WaitStatus::PtraceEvent(..)) => ptrace::detach(pid, None),
        _ => Ok(()),
    };
}

/// Wait for the target's exec stop; an exit instead means exec failed (the cage says why).
fn wait_exec(tpid: libc::pid_t, sock: &OwnedFd, within: Duration) -> Result<(), Failure> {
    let pid = Pid::from_raw(tpid);
    let deadline = Instant::now() + within;
    let stops = ChildStops::catch().map_err(|e| FailCode::PtraceFailed.at(Stage::Exec, e))?;
    loop {
        let stopped = match waitpid(pid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => match stops.wait(deadline) {
                Ok(true) => continue,
                Ok(false) => {
                    return Err(FailCode::SetupTimeout.at(Stage::Exec,
                        format!(
                            "the target did not reach its exec within {} ms of being let go (an exec of a file on a file system that does not answer would not)",
                            within.as_millis()
                        ),
                    ))
                }
                Err(e) => return Err(FailCode::PtraceFailed.at(Stage::Exec, e)),
            },
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(FailCode::PtraceFailed.at(Stage::Exec, e)),
            Ok(WaitStatus::PtraceEvent(_, _, event)) if event == libc::PTRACE_EVENT_EXEC => return Ok(()),
            Ok(WaitStatus::PtraceEvent(_, sig, _) | WaitStatus::Stopped(_, sig)) => sig,
            Ok(status) => {
                // The target exited before exec: its report explains why.
                return Err(cage_report(sock).unwrap_or_else(|| {
                    FailCode::ExecFailed.at(Stage::Exec, format!("the target ended before exec ({status:?})"))
                }));
            }
        };
        // A signal-delivery or group stop before exec: pass the signal on.
        let inject = (stopped != Signal::SIGTRAP && stopped != Signal::SIGSTOP).then_some(stopped);
        let _ = ptrace::cont(pid, inject);
    }
}

/// A failure the cage reported on the status channel, if one arrives within a second (after
/// whatever the target said before it failed: a target that fails fast may have said ready).
fn cage_report(sock: &OwnedFd) -> Option<Failure> {
    loop {
        match recv_timeout(sock, 1000) {
            Ok(channel::Received { msg: Some(CageMsg::Failed(f)), .. }) => return Some(f),
            Ok(channel::Received { msg: Some(CageMsg::Hello | CageMsg::Ready { .. }), .. }) => {}
            _ => return None,
        }
    }
}

fn poll_in(fd: BorrowedFd<'_>, ms: i32) -> io::Result<bool> {
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    loop {
        let mut p = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut p, timeout) {
            Ok(n) => return Ok(n > 0),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

fn recv_timeout(sock: &OwnedFd, ms: i32) -> Result<channel::Received, Failure> {
    match poll_in(sock.as_fd(), ms) {
        Ok(true) => channel::recv(sock.as_fd()).map_err(|e| FailCode::ChannelFailed.at(Stage::Namespaces, e)),
        Ok(false) => Err(FailCode::SetupTimeout.at(Stage::Namespaces, format!("no word from the cage within {ms} ms"))),
        Err(e) => Err(FailCode::ChannelFailed.at(Stage::Namespaces, e)),
    }
}

/// True when the peer end is closed everywhere within `ms`.
fn eof_within(sock: &OwnedFd, ms: i32) -> bool {
    matches!(poll_in(sock.as_fd(), ms), Ok(true))
        && matches!(channel::recv(sock.as_fd()), Ok(channel::Received { msg: None, .. }))
}

/// Kill and reap our own child, the cage's init (its namespace dies with it).
fn kill_and_reap(pid: libc::pid_t) {
    let pid = Pid::from_raw(pid);
    let _ = kill(pid, Signal::SIGKILL);
    while let Err(Errno::EINTR) = waitpid(pid, None) {}
}

/// Make sure fds 0-2 are open so no setup fd can land on them.
fn ensure_stdio() {
    for fd in 0..3 {
        // SAFETY: F_GETFD probe, then open of /dev/null which takes the lowest free fd.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) < 0 {
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
}

fn ensure_staging(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

    /// What exec takes is a C string: an argument or variable it would cut or drop is refused
    /// before anything is built (a daemon's client can send one in JSON).
    #[test]
    fn a_command_exec_would_not_pass_whole_is_refused() {
        let code = |argv: &[&str], env: &[(&str, &str)]| {
            let mut plan = CagePlan::new(argv.iter().map(OsString::from).collect());
            plan.env = env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect();
            check_plan(&plan).map_err(|s| (s.code, s.detail)).unwrap_err()
        };
        let (c, detail) = code(&["/bin/echo", "a\0b"], &[]);
        assert_eq!(c, FailCode::BadCommand, "{detail}");
        assert!(detail.contains("\"a\\0b\" contains a NUL byte"), "{detail}");
        for env in [("K", "a\0b"), ("K\0", "v"), ("K=V", "v"), ("", "v")] {
            let (c, detail) = code(&["/bin/echo"], &[env]);
            assert_eq!(c, FailCode::BadEnvironment, "{env:?}: {detail}");
        }
        // Control: the same plans whole pass these checks (and meet a later one: this test's
        // process has threads, and may lack root's capabilities).
        let (c, _) = code(&["/bin/echo", "ab"], &[("K", "ab")]);
        assert!([FailCode::MultithreadedSupervisor, FailCode::SupervisorCapabilities].contains(&c), "{c}");
    }

    /// A child killed and reaped when the test ends, however it ends.
    struct Reaped(Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn tracer_of(pid: libc::pid_t) -> String {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("TracerPid:")).unwrap();
        line["TracerPid:".len()..].trim().to_string()
    }

    /// The pid a hello named, taken by another process once its sender was reaped (here: another
    /// child's pid beside the pidfd of one already reaped, which is what reuse amounts to).
    #[test]
    fn a_hello_whose_sender_is_gone_never_holds_the_process_now_at_its_pid() {
        let mut sender = Command::new("/bin/true").spawn().unwrap();
        let sender_fd = sys::pidfd_open(sender.id() as libc::pid_t).unwrap();
        sender.wait().unwrap();
        let mut stranger = Reaped(Command::new("/bin/sleep").arg("30").spawn().unwrap());
        let pid = stranger.0.id() as libc::pid_t;

        match seize_sender(pid, sender_fd.as_fd()) {
            Err(s) => assert!(s.code == FailCode::CageDied && s.detail.contains("let go"), "{}: {}", s.code, s.detail),
            Ok(()) => panic!("a process that is not the hello's sender was held"),
        }
        assert_eq!(tracer_of(pid), "0", "the stranger is still traced");
        assert!(stranger.0.try_wait().unwrap().is_none(), "the stranger did not go on running");

        // Control: with its own pidfd the same process is seized and held.
        let own = sys::pidfd_open(pid).unwrap();
        assert!(seize_sender(pid, own.as_fd()).is_ok());
        assert_eq!(tracer_of(pid), nix::unistd::gettid().to_string());
        let_go(Pid::from_raw(pid));
        assert_eq!(tracer_of(pid), "0");
        assert!(stranger.0.try_wait().unwrap().is_none());
    }

    /// A process seized by mistake that stopped for a signal on its way is let go with that
    /// signal passed on (SIGSTOP here: untraced, it then stops as it would have).
    #[test]
    fn a_process_let_go_in_a_signal_stop_is_detached_with_its_signal() {
        let stranger = Reaped(Command::new("/bin/sleep").arg("30").spawn().unwrap());
        let pid = Pid::from_raw(stranger.0.id() as libc::pid_t);
        let state = || fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        ptrace::seize(pid, ptrace::Options::empty()).unwrap();
        kill(pid, Signal::SIGSTOP).unwrap();
        // The signal-delivery stop, reported but not yet waited for.
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while !state().contains(") t ") {
            assert!(Instant::now() < deadline, "no signal-delivery stop");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let_go(pid);
        assert_eq!(tracer_of(pid.as_raw()), "0", "still traced");
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while !state().contains(") T ") {
            assert!(Instant::now() < deadline, "its SIGSTOP was lost: {}", state());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
