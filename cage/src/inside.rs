//! Code that runs inside the cage: the init (PID 1 of the new pid namespace) and the target's
//! pre-exec setup. Neither ever returns; every failure is reported on the status channel with
//! its stage and the process exits, so the target never runs after a failed step.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{dup2_stderr, dup2_stdout, Pid};

use crate::channel::{self, CageMsg, GO};
use crate::failure::{FailCode, Failure};
use crate::fault::{self, TestHook};
use crate::identity;
use crate::landlock::{fs as lfs, net as lnet, Ruleset};
use crate::mounts::{Access, Prepared};
use crate::path;
use crate::plan::{CagePlan, Mode, NetMode, Stage};
use crate::record::Reported;
use crate::seccomp::{self, Filters};
use crate::sys;

/// Namespaces the init creates for itself right after clone (the pid namespace comes with clone,
/// the cgroup namespace once the init is in the launch cgroup).
const UNSHARED: libc::c_int = libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;

/// Signals the init forwards to the target.
const FORWARDED: [libc::c_int; 8] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
];

/// Everything the cage processes inherit from the supervisor (by fork).
pub struct Ctx<'a> {
    /// The plan.
    pub plan: &'a CagePlan,
    /// Compiled seccomp filters.
    pub filters: &'a Filters,
    /// Landlock ABI to build for (0 = none).
    pub landlock_abi: u32,
    /// Cage end of the status channel.
    pub sock: RawFd,
    /// cgroup v1: the supervisor creates the launch cgroup while the init builds its namespaces,
    /// then sends its `tasks` files (`CageMsg::Join`); the init moves itself in before the target
    /// exists. On v2 clone3 already started the init inside it.
    pub await_cgroup: bool,
    /// Write end of the stdout pipe.
    pub stdout_w: RawFd,
    /// Write end of the stderr pipe.
    pub stderr_w: RawFd,
    /// Write end of the result pipe (init → supervisor: how the target ended).
    pub result_w: RawFd,
    /// Read end of the stdin pipe, or -1: the target's stdin is then the cage's `/dev/null`.
    pub stdin_r: RawFd,
    /// The supervisor's ends of the channel and pipes (-1 for none), closed by the init first.
    pub supervisor_ends: [RawFd; 5],
    /// A fresh network namespace made ahead of the request (see [`crate::ahead`]) to enter
    /// instead of unsharing one, or -1.
    pub netns: RawFd,
    /// The ipc and uts namespaces to join (the plan's `join`, opened by the supervisor), or -1.
    pub join: [RawFd; 2],
    /// The root's part made ahead of the request (see [`crate::mounts::RootAhead`]).
    pub root_ahead: Option<&'a crate::mounts::RootAhead>,
    /// Entering a running cage (the plan's `enter`): its net, ipc, uts, cgroup, pid and mnt
    /// namespaces, opened by the supervisor; -1 otherwise.
    pub enter: [RawFd; 6],
    /// The supervisor's CPUs, which the target inherits: the supervisor narrows the init's for
    /// a moment to start it on another CPU than its own ([`sys::start_elsewhere`]).
    pub cpus: Option<nix::sched::CpuSet>,
}

/// The namespaces an entering process joins, in the order it joins them: the mount namespace
/// last, since joining it moves the process's root and working directory into the cage.
pub const ENTERED: [(&str, libc::c_int); 6] = [
    ("net", libc::CLONE_NEWNET),
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
    ("cgroup", libc::CLONE_NEWCGROUP),
    ("pid", libc::CLONE_NEWPID),
    ("mnt", libc::CLONE_NEWNS),
];

/// What the target is granted (landlock), and the record's view of the cage's mounts.
struct Granted<'a> {
    access: &'a Access,
    described: &'a [String],
    sources: &'a [crate::record::SourceFact],
    /// The init dropped the bounding set and locked securebits before it forked the target,
    /// which inherits both and does not repeat it ([`shed_bounding`]).
    shed: bool,
}

impl<'a> From<&'a Prepared> for Granted<'a> {
    fn from(p: &'a Prepared) -> Self {
        Granted { access: &p.access, described: &p.described, sources: &p.sources, shed: false }
    }
}

impl Ctx<'_> {
    fn report(&self, f: &Failure) {
        let _ = channel::send(self.sock, &CageMsg::Failed(f.clone()), &[]);
    }
}

fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and runs no destructors or atexit handlers of the supervisor
    // (nix has no _exit).
    unsafe { libc::_exit(code) }
}

/// Test hook `orphan_early`: the supervisor's pid, set before it clones the init.
pub(crate) static HOOK_SUPERVISOR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The cage's init: the child of clone(CLONE_NEWPID), PID 1 of the new pid namespace.
pub fn init_main(ctx: &Ctx<'_>) -> ! {
    if fault::on(ctx.plan, &TestHook::OrphanEarly) {
        await_orphaned();
    }
    init_start(ctx.sock, ctx.supervisor_ends, ctx.plan.detached);
    let setup = match &ctx.plan.enter {
        Some(e) => enter_setup(ctx, e),
        None => init_setup(ctx),
    };
    match setup {
        Ok((target, shed)) => reap(ctx, target, shed),
        Err(f) => {
            ctx.report(&f);
            exit_now(1)
        }
    }
}

/// Test hook `orphan_early`: wait (at most 10 s) until the supervisor is gone. (getppid says 0
/// in a new pid namespace; the host's procfs, still mounted here, names the parent.)
fn await_orphaned() {
    let supervisor = HOOK_SUPERVISOR.load(std::sync::atomic::Ordering::Relaxed).to_string();
    let ppid =
        || std::fs::read_to_string("/proc/self/stat").ok()?.rsplit(") ").next()?.split(' ').nth(1).map(str::to_string);
    for _ in 0..10_000 {
        if ppid().is_some_and(|p| p != supervisor) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The init's first steps, before it takes anything from the supervisor.
fn init_start(sock: RawFd, supervisor_ends: [RawFd; 5], detached: bool) {
    // Die with the supervisor. It may already be dead (killed between clone and here), and then
    // no signal will ever come: with the supervisor's ends closed in this process, its end of
    // the channel is closed everywhere once it has exited — look for that after arming. A
    // detached cage outlives the `create` that cloned it; until its `start` it waits on the
    // channel, which the process holding the launch keeps open, and ends when that closes.
    let armed = detached || nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_ok();
    for fd in supervisor_ends.into_iter().filter(|fd| *fd >= 0) {
        // SAFETY: closing fds this process inherited and does not use (raw numbers: the
        // context carries the supervisor's descriptor numbers, which no OwnedFd here owns).
        unsafe { libc::close(fd) };
    }
    if !armed || peer_gone(sock) {
        exit_now(1);
    }
}

/// The cage built and the target forked: its pid, and whether the bounding set was dropped before
/// the fork (for both).
fn init_setup(ctx: &Ctx<'_>) -> Result<(libc::pid_t, bool), Failure> {
    hide_argv().map_err(|e| FailCode::ArgvHideFailed.at(Stage::Namespaces, e))?;
    // The pid namespace came with clone; the rest are made here, so that their cost (a new
    // network namespace is the dearest) overlaps the supervisor's cgroup and janitor work.
    let plan = ctx.plan;
    let mut flags = UNSHARED;
    for (name, flag) in [
        ("mnt", libc::CLONE_NEWNS),
        ("net", libc::CLONE_NEWNET),
        ("ipc", libc::CLONE_NEWIPC),
        ("uts", libc::CLONE_NEWUTS),
    ] {
        if fault::on(plan, &TestHook::Namespace(name)) {
            flags &= !flag;
        }
    }
    let supervisors = Origin::now()?;
    if fault::on(plan, &TestHook::NetnsKept) {
        flags &= !libc::CLONE_NEWNET;
    }
    for (fd, flag) in ctx.join.into_iter().zip([libc::CLONE_NEWIPC, libc::CLONE_NEWUTS]).filter(|(fd, _)| *fd >= 0) {
        // SAFETY: an nsfs descriptor the supervisor opened for us (a descriptor number from the
        // context, open for the whole call).
        let ns = unsafe { BorrowedFd::borrow_raw(fd) };
        nix::sched::setns(ns, CloneFlags::from_bits_retain(flag))
            .map_err(|e| FailCode::NamespaceFailed.at(Stage::Namespaces, format!("joining a namespace: {e}")))?;
        flags &= !flag;
    }
    enter_namespaces(flags, ctx.netns)?;
    let prepared = build_root(ctx, supervisors)?;
    fault::fail_at(ctx.plan, Stage::Network)?;
    // (Without its own uts namespace — a test hook — the name would be the host's; a joined
    // one keeps its own.)
    if flags & libc::CLONE_NEWUTS != 0 {
        let name = plan.hostname.as_deref().unwrap_or("chio");
        nix::unistd::sethostname(name).map_err(|e| FailCode::HostnameFailed.at(Stage::Network, e))?;
    }
    if plan.net == NetMode::Loopback {
        loopback_up().map_err(|e| FailCode::LoopbackFailed.at(Stage::Network, e))?;
    }
    let shed = shed_bounding(plan)?;
    if ctx.await_cgroup {
        join_cgroup(ctx.sock, !fault::on(plan, &TestHook::Cgroup))?;
    }
    fault::fail_at(ctx.plan, Stage::Namespaces)?;
    // We are in the launch cgroup, which becomes the namespace root.
    if !fault::on(plan, &TestHook::Namespace("cgroup")) {
        unshare(CloneFlags::CLONE_NEWCGROUP).map_err(|e| FailCode::NamespaceFailed.at(Stage::Namespaces, e))?;
    }
    // The init leads a new session so the target has no controlling tty.
    let _ = nix::unistd::setsid();
    block_forwarded_signals();
    let granted = Granted { shed, ..Granted::from(&prepared) };
    let target = spawn_target(ctx, &granted).map_err(|e| FailCode::ForkFailed.at(Stage::Namespaces, e))?;
    Ok((target, shed))
}

/// Drop the bounding set and lock securebits once, in the init, for itself and the target it
/// forks (both inherit them; the init never execs, and keeps its effective capabilities for
/// the rest of its setup): off the target's way to its exec, and while a v1 cgroup is still
/// being made for the init. True when it was done: not under the test hooks that need them in
/// the target (one leaves them to the exec stop, one raises an inheritable capability, which
/// the bounding set caps).
fn shed_bounding(plan: &CagePlan) -> Result<bool, Failure> {
    if fault::on(plan, &TestHook::Bounding) || fault::on(plan, &TestHook::Caps) {
        return Ok(false);
    }
    identity::drop_bounding_and_lock(identity::last_cap())
        .map_err(|e| FailCode::CapabilityDropFailed.at(Stage::Capabilities, e))?;
    Ok(true)
}

/// Enter a running cage instead of building one: its cgroup, then its namespaces (its root
/// with the mount namespace, last), then the target is spawned as in a new cage — in the
/// cage's pid namespace, a child of this process, which stays outside it (in the supervisor's
/// pid namespace) to reap it and report its end.
fn enter_setup(ctx: &Ctx<'_>, e: &crate::plan::Enter) -> Result<(libc::pid_t, bool), Failure> {
    hide_argv().map_err(|e| FailCode::ArgvHideFailed.at(Stage::Namespaces, e))?;
    if ctx.await_cgroup {
        join_cgroup(ctx.sock, true)?;
    }
    for (fd, (name, flag)) in ctx.enter.into_iter().zip(ENTERED) {
        if fd < 0 {
            return Err(FailCode::NamespaceFailed.at(Stage::Namespaces, format!("no {name} namespace to enter")));
        }
        // SAFETY: an nsfs descriptor the supervisor opened for us (a descriptor number from the
        // context, open for the whole call).
        let ns = unsafe { BorrowedFd::borrow_raw(fd) };
        nix::sched::setns(ns, CloneFlags::from_bits_retain(flag)).map_err(|err| {
            FailCode::NamespaceFailed.at(Stage::Namespaces, format!("entering the cage's {name} namespace: {err}"))
        })?;
    }
    nix::unistd::chdir(c"/").map_err(|err| FailCode::NamespaceFailed.at(Stage::Namespaces, err))?;
    let cstrings = |v: &[String]| -> Result<Vec<std::ffi::CString>, Failure> {
        v.iter()
            .map(|p| std::ffi::CString::new(p.as_bytes()).map_err(|err| FailCode::PathRefused.at(Stage::Landlock, err)))
            .collect()
    };
    let access = Access { read_exec: cstrings(&e.read_exec)?, read_write_exec: cstrings(&e.read_write_exec)? };
    let _ = nix::unistd::setsid();
    block_forwarded_signals();
    // (The entering process keeps its bounding set until the target has execed: the target
    // drops its own, and this process sheds after.)
    let granted = Granted { access: &access, described: &e.mounts, sources: &e.sources, shed: false };
    let target = spawn_target(ctx, &granted).map_err(|e| FailCode::ForkFailed.at(Stage::Namespaces, e))?;
    Ok((target, false))
}

/// Unshare the namespaces in `flags`, entering the network namespace made ahead (`netns`, or
/// -1) instead of unsharing one.
fn enter_namespaces(mut flags: libc::c_int, netns: RawFd) -> Result<(), Failure> {
    if netns >= 0 {
        let wanted = flags & libc::CLONE_NEWNET != 0;
        enter_netns(netns, wanted).map_err(|e| FailCode::NamespaceFailed.at(Stage::Namespaces, e))?;
        flags &= !libc::CLONE_NEWNET;
    }
    unshare(CloneFlags::from_bits_retain(flags)).map_err(|e| FailCode::NamespaceFailed.at(Stage::Namespaces, e))
}

/// The namespaces the init was cloned in: its supervisor's (device and inode of each).
#[derive(Clone, Copy, PartialEq)]
struct Origin {
    mnt: (u64, u64),
    net: (u64, u64),
}

impl Origin {
    /// The mount and network namespaces this process is in now.
    fn now() -> Result<Origin, Failure> {
        Ok(Origin { mnt: namespace(c"/proc/self/ns/mnt")?, net: namespace(c"/proc/self/ns/net")? })
    }
}

/// The namespace behind `link` (a `/proc/self/ns` entry): its device and inode.
fn namespace(link: &std::ffi::CStr) -> Result<(u64, u64), Failure> {
    let st = nix::sys::stat::stat(link).map_err(|e| FailCode::NamespaceFailed.at(Stage::Namespaces, e))?;
    Ok((st.st_dev, st.st_ino))
}

/// The plan's root, attached and pivoted into — never in the mount namespace the init was cloned
/// in (`supervisors`): a pivot_root and detach of the old root there would take the supervisor's
/// (for a one-shot launch, the host's) root away. Checked here, before any mount, whatever the
/// unshare before it did. Likewise the cage's network sysctls (its ephemeral ports) are written
/// through its procfs only outside the supervisor's network namespace: `/proc/sys/net` is the
/// writer's namespace's, and there they would be the host's.
fn build_root(ctx: &Ctx<'_>, supervisors: Origin) -> Result<Prepared, Failure> {
    let now = Origin::now()?;
    if now.mnt == supervisors.mnt {
        return Err(FailCode::NamespaceFailed
            .at(Stage::Namespaces, "the init is still in the supervisor's mount namespace: no mount is made there"));
    }
    let prepared = Prepared::build(ctx.plan, ctx.root_ahead).map_err(|e| {
        let code = match e.kind() {
            io::ErrorKind::NotFound => FailCode::PathNotFound,
            io::ErrorKind::InvalidInput => FailCode::PathRefused,
            _ => FailCode::ResolveFailed,
        };
        code.at(Stage::Resolve, e)
    })?;
    if prepared.writes_net_sysctls() && now.net == supervisors.net {
        return Err(FailCode::NamespaceFailed.at(
            Stage::Namespaces,
            "the init is still in the supervisor's network namespace: the cage's network sysctls are not written there",
        ));
    }
    fault::fail_at(ctx.plan, Stage::Mounts)?;
    prepared.attach(&ctx.plan.staging_dir).map_err(|e| FailCode::MountFailed.at(Stage::Mounts, e))?;
    fault::fail_at(ctx.plan, Stage::Pivot)?;
    prepared.pivot().map_err(|e| FailCode::PivotFailed.at(Stage::Pivot, e))?;
    Ok(prepared)
}

/// The root an init ahead pivoted into, finished with the plan's part (its trees attached, the
/// masks, the sysctls, the seal); or, when that root did not serve the plan, the plan's whole
/// root its launch process built instead, attached inside the stale one and pivoted into, which
/// detaches the stale one. With the checks and test failures [`build_root`] has.
fn finish_pivoted(
    ctx: &Ctx<'_>,
    origin: Origin,
    mut pivoted: Pivoted,
    part: crate::mounts::PlanPart,
    trees: Vec<OwnedFd>,
) -> Result<Prepared, Failure> {
    if part.writes_net_sysctls() && Origin::now()?.net == origin.net {
        return Err(FailCode::NamespaceFailed.at(
            Stage::Namespaces,
            "the init is still in the supervisor's network namespace: the cage's network sysctls are not written there",
        ));
    }
    fault::fail_at(ctx.plan, Stage::Mounts)?;
    if !part.is_whole() {
        let proc = pivoted.proc.as_fd();
        pivoted.prepared.finish_ahead(part, trees, proc).map_err(|e| FailCode::MountFailed.at(Stage::Mounts, e))?;
        fault::fail_at(ctx.plan, Stage::Pivot)?;
        return Ok(pivoted.prepared);
    }
    let prepared = Prepared::from_part(part, trees).map_err(|e| FailCode::MountFailed.at(Stage::Mounts, e))?;
    // Attached at a directory made in the stale root, the init's root and working directory
    // now (still writable, and detached by the pivot below).
    sys::mkdirat(cwd_fd(), c"chio-root", 0o700).map_err(|e| FailCode::MountFailed.at(Stage::Mounts, e))?;
    prepared.attach(Path::new("/chio-root")).map_err(|e| FailCode::MountFailed.at(Stage::Mounts, e))?;
    fault::fail_at(ctx.plan, Stage::Pivot)?;
    prepared.pivot().map_err(|e| FailCode::PivotFailed.at(Stage::Pivot, e))?;
    Ok(prepared)
}

/// What an init cloned ahead of its request has before the plan comes (a [`Ctx`] less the
/// plan and the landlock ABI; its stdin pipe always exists and is dropped if not fed).
pub struct AheadCtx<'a> {
    /// Compiled seccomp filters.
    pub filters: &'a Filters,
    /// Cage end of the status channel.
    pub sock: RawFd,
    /// cgroup v1: join the launch cgroup from the `tasks` files the supervisor sends at once.
    pub await_cgroup: bool,
    /// Write ends of the stdout, stderr and result pipes; read end of the stdin pipe.
    pub pipes: [RawFd; 4],
    /// The supervisor's ends, closed by the init first.
    pub supervisor_ends: [RawFd; 5],
    /// A network namespace made ahead, or -1.
    pub netns: RawFd,
    /// The root's part made ahead.
    pub root_ahead: Option<&'a crate::mounts::RootAhead>,
}

/// An init cloned ahead of its request (see [`crate::ahead`]): it makes its namespaces (its
/// mount namespace only once the plan is there) and joins the launch cgroup, then waits for
/// the plan. Whatever the request, it makes exactly what [`init_main`] would; a plan that
/// would have it make less (a test hook) is not sent to it. It ends, silently, if the
/// supervisor closes the channel instead.
pub fn init_ahead(a: &AheadCtx<'_>) -> ! {
    init_start(a.sock, a.supervisor_ends, false);
    // (Before the network namespace made ahead is entered.)
    let Ok(origin) = Origin::now() else { exit_now(1) };
    let setup = ahead_setup(a).and_then(|()| a.root_ahead.map(|ra| pivot_ahead(ra, origin)).transpose());
    let pivoted = match setup {
        Ok(pivoted) => pivoted,
        Err(f) => {
            let _ = channel::send(a.sock, &CageMsg::Failed(f), &[]);
            exit_now(1)
        }
    };
    if pivoted.is_some() && channel::send(a.sock, &CageMsg::Pivoted, &[]).is_err() {
        exit_now(1);
    }
    channel::warm();
    // The plan stops it: what is not mapped yet faults in as it runs.
    sys::populate_text(&|| !peer_quiet(a.sock));
    let Some(Planned { plan, landlock_abi, feed_stdin, root, trees }) = await_plan(a.sock) else { exit_now(0) };
    let [stdout_w, stderr_w, result_w, stdin_r] = a.pipes;
    if !feed_stdin {
        // SAFETY: the read end of our own stdin pipe, which no OwnedFd here owns.
        unsafe { libc::close(stdin_r) };
    }
    let ctx = Ctx {
        plan: &plan,
        filters: a.filters,
        landlock_abi,
        sock: a.sock,
        await_cgroup: false,
        stdout_w,
        stderr_w,
        result_w,
        stdin_r: if feed_stdin { stdin_r } else { -1 },
        supervisor_ends: [-1; 5],
        netns: -1,
        join: [-1, -1],
        root_ahead: a.root_ahead,
        enter: [-1; 6],
        // (Cloned by a spare, which never narrows it.)
        cpus: None,
    };
    let root = match (pivoted, root) {
        (Some(p), Some(part)) => Some((p, *part, trees)),
        (None, None) => None,
        _ => {
            let f = FailCode::SetupFailed.at(Stage::Mounts, "the plan and the root pivoted into ahead do not match");
            ctx.report(&f);
            exit_now(1)
        }
    };
    match planned_setup(&ctx, origin, root) {
        Ok((target, shed)) => reap(&ctx, target, shed),
        Err(f) => {
            ctx.report(&f);
            exit_now(1)
        }
    }
}

/// An init ahead, before its plan: every namespace but the mount namespace, the host name, the
/// launch cgroup. (A mount namespace is a copy of the host's mount table when it is made; where
/// the host's mounts do not propagate, one made before the request would miss a mount made
/// since — and see what it covers, a directory the host has hidden under another mount. So it
/// is made ahead only to pivot into the root made ahead ([`pivot_ahead`]), after which nothing
/// of the host is resolved in it.)
fn ahead_setup(a: &AheadCtx<'_>) -> Result<(), Failure> {
    hide_argv().map_err(|e| FailCode::ArgvHideFailed.at(Stage::Namespaces, e))?;
    enter_namespaces(UNSHARED & !libc::CLONE_NEWNS, a.netns)?;
    nix::unistd::sethostname("chio").map_err(|e| FailCode::HostnameFailed.at(Stage::Network, e))?;
    // (A plan with a test hook that needs them kept is not sent to an init made ahead.)
    identity::drop_bounding_and_lock(identity::last_cap())
        .map_err(|e| FailCode::CapabilityDropFailed.at(Stage::Capabilities, e))?;
    if a.await_cgroup {
        join_cgroup(a.sock, true)?;
    }
    unshare(CloneFlags::CLONE_NEWCGROUP).map_err(|e| FailCode::NamespaceFailed.at(Stage::Namespaces, e))?;
    let _ = nix::unistd::setsid();
    Ok(())
}

/// An init ahead with the root made ahead, before its plan: its mount namespace, that root
/// attached (not yet sealed) and pivoted into. Nothing of the host is resolved in this
/// namespace after the pivot: the plan's own trees are opened by the launch process, in the
/// host's namespace as it is at the request ([`crate::mounts::RootAhead::plan_part`]).
fn pivot_ahead(ra: &crate::mounts::RootAhead, origin: Origin) -> Result<Pivoted, Failure> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| FailCode::NamespaceFailed.at(Stage::Namespaces, e))?;
    // (`origin` was read before any namespace was made: its mount namespace is the supervisor's.)
    if Origin::now()?.mnt == origin.mnt {
        return Err(FailCode::NamespaceFailed
            .at(Stage::Namespaces, "the init is still in the supervisor's mount namespace: no mount is made there"));
    }
    let prepared = ra.prepared().map_err(|e| FailCode::ResolveFailed.at(Stage::Resolve, e))?;
    let proc = prepared.attach_ahead(ra.staging()).map_err(|e| FailCode::MountFailed.at(Stage::Mounts, e))?;
    prepared.pivot().map_err(|e| FailCode::PivotFailed.at(Stage::Pivot, e))?;
    Ok(Pivoted { prepared, proc })
}

/// A root an init ahead pivoted into, and its procfs: both still writable until the plan's
/// part is attached ([`Prepared::finish_ahead`]).
struct Pivoted {
    prepared: Prepared,
    proc: OwnedFd,
}

/// What the plan message brings an init ahead.
struct Planned {
    plan: CagePlan,
    landlock_abi: u32,
    feed_stdin: bool,
    root: Option<Box<crate::mounts::PlanPart>>,
    trees: Vec<OwnedFd>,
}

/// Wait for the plan (`None`: the supervisor closed the channel, or sent something else).
/// Every host path in a plan is absolute (`path::open_host` refuses others), so the working
/// directory the init was cloned with does not matter.
fn await_plan(sock: RawFd) -> Option<Planned> {
    // SAFETY: the fd stays open for the whole call (the init's status channel).
    match channel::recv(unsafe { BorrowedFd::borrow_raw(sock) }) {
        Ok(channel::Received { msg: Some(CageMsg::Plan { plan, landlock_abi, feed_stdin, root }), fds, .. }) => {
            Some(Planned { plan: *plan, landlock_abi, feed_stdin, root, trees: fds })
        }
        _ => None,
    }
}

/// An init ahead, once it has its plan: the root (the one it pivoted into, finished with the
/// plan's part; or else its mount namespace, made now from the host's mounts as they are, and
/// the root built in it), the network, the ceilings, the target.
/// (Its bounding set was dropped before the plan came, [`ahead_setup`].)
fn planned_setup(
    ctx: &Ctx<'_>,
    origin: Origin,
    root: Option<(Pivoted, crate::mounts::PlanPart, Vec<OwnedFd>)>,
) -> Result<(libc::pid_t, bool), Failure> {
    let prepared = match root {
        Some((pivoted, part, trees)) => finish_pivoted(ctx, origin, pivoted, part, trees)?,
        None => {
            // (Its mount namespace is still the one it was cloned in.)
            let supervisors = Origin { mnt: namespace(c"/proc/self/ns/mnt")?, ..origin };
            unshare(CloneFlags::CLONE_NEWNS).map_err(|e| FailCode::NamespaceFailed.at(Stage::Namespaces, e))?;
            build_root(ctx, supervisors)?
        }
    };
    fault::fail_at(ctx.plan, Stage::Network)?;
    if ctx.plan.net == NetMode::Loopback {
        loopback_up().map_err(|e| FailCode::LoopbackFailed.at(Stage::Network, e))?;
    }
    await_ceilings(ctx.sock)?;
    fault::fail_at(ctx.plan, Stage::Namespaces)?;
    block_forwarded_signals();
    let granted = Granted { shed: true, ..Granted::from(&prepared) };
    let target = spawn_target(ctx, &granted).map_err(|e| FailCode::ForkFailed.at(Stage::Namespaces, e))?;
    Ok((target, true))
}

/// An init ahead is in the launch cgroup already; the target may exist only once the request's
/// ceilings are written there.
fn await_ceilings(sock: RawFd) -> Result<(), Failure> {
    // SAFETY: the fd stays open for the whole call (the init's status channel).
    match channel::recv(unsafe { BorrowedFd::borrow_raw(sock) }) {
        Ok(channel::Received { msg: Some(CageMsg::Ceilings), .. }) => Ok(()),
        // No ceilings means no launch: the supervisor has given up (and will kill us).
        _ => exit_now(1),
    }
}

/// Enter the network namespace made ahead for this launch (unless a test hook withholds it)
/// and close its descriptor, so that nothing later in the cage holds it.
fn enter_netns(fd: RawFd, enter: bool) -> io::Result<()> {
    // SAFETY: the descriptor is ours (inherited from the supervisor, which closed its copy) and
    // is closed here exactly once.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if enter {
        nix::sched::setns(&fd, CloneFlags::CLONE_NEWNET)?;
    }
    Ok(())
}

/// The init is a copy of the supervisor, whose command line (host paths, the key and store
/// locations) any cage process could read in `/proc/1/cmdline`: overwrite the init's copy of
/// the argument area with its own name. (`PR_SET_MM_ARG_START` would move it instead, but needs
/// CAP_SYS_RESOURCE, which hardened hosts withhold even from root.)
fn hide_argv() -> io::Result<()> {
    let (start, end) = sys::arg_area()?;
    let name = b"chio-init";
    if end <= start + name.len() {
        return Err(io::Error::other(format!("argument area {start:#x}..{end:#x} is too small")));
    }
    // SAFETY: [start, end) is this process's own argument area (the kernel reports it, to this
    // process or to the supervisor it is a fork of: see `sys::arg_area`), on the writable stack
    // of a private copy-on-write address space; nothing reads it afterwards but procfs. The
    // name is followed by zeros up to `end`.
    unsafe {
        std::ptr::copy_nonoverlapping(name.as_ptr(), start as *mut u8, name.len());
        std::ptr::write_bytes((start + name.len()) as *mut u8, 0, end - start - name.len());
    }
    let _ = nix::sys::prctl::set_name(c"chio-init");
    Ok(())
}

/// What waits on the status channel now (zero-timeout poll): its `revents`, or None if the
/// poll failed.
fn channel_now(sock: RawFd) -> Option<i16> {
    let mut p = libc::pollfd { fd: sock, events: libc::POLLIN, revents: 0 };
    // SAFETY: a zero-timeout poll of one valid pollfd (a descriptor number from the context).
    (unsafe { libc::poll(&mut p, 1, 0) } >= 0).then_some(p.revents)
}

/// True while nothing waits on the status channel (no message, no EOF).
fn peer_quiet(sock: RawFd) -> bool {
    channel_now(sock) == Some(0)
}

/// True when the other end of the status channel is closed (the supervisor is gone).
fn peer_gone(sock: RawFd) -> bool {
    channel_now(sock).map_or(true, |r| r & (libc::POLLHUP | libc::POLLERR) != 0)
}

/// The command's file-creation mask (runc's default too).
const CAGE_UMASK: libc::mode_t = 0o022;

/// Size of the init's report of the target's end (five little-endian i64s, one write).
pub const RESULT_BYTES: usize = 40;

/// Stack for the target between its spawn and its exec; it runs our setup code only.
const TARGET_STACK: usize = 1 << 20;

/// What the target's entry point gets from the init.
struct Spawn<'a, 'b> {
    ctx: &'a Ctx<'b>,
    granted: &'a Granted<'a>,
}

extern "C" fn target_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Spawn` on the init's stack, alive (the init is suspended) until we
    // exec or exit.
    let s = unsafe { &*(arg as *const Spawn<'_, '_>) };
    target_main(s.ctx, s.granted)
}

/// Start the target the way posix_spawn does: CLONE_VM | CLONE_VFORK on a stack of its own.
/// Nothing is copied (a fork would copy the page tables the init inherited from the supervisor,
/// and the exec would tear them down again) and the init sleeps until the target has exec'd or
/// died; the init is single-threaded, so the target has the address space to itself meanwhile.
fn spawn_target(ctx: &Ctx<'_>, granted: &Granted<'_>) -> io::Result<libc::pid_t> {
    if let Some(cpus) = &ctx.cpus {
        sys::set_own_affinity(cpus);
    }
    // The target's stack and clone are raw: nix's clone boxes a callback and cannot express
    // CLONE_VM|CLONE_VFORK on a stack unmapped right after; its mman calls are unsafe alike.
    // SAFETY: a fresh private anonymous mapping; the lowest page becomes a guard page.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            TARGET_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the first page of our own mapping.
    if unsafe { libc::mprotect(stack, 4096, libc::PROT_NONE) } != 0 {
        let err = io::Error::last_os_error();
        // SAFETY: our own mapping, unused.
        unsafe { libc::munmap(stack, TARGET_STACK) };
        return Err(err);
    }
    let spawn = Spawn { ctx, granted };
    // SAFETY: the child runs `target_entry` on its own stack (the top of the mapping, 16-byte
    // aligned) and never returns to our frames; CLONE_VFORK keeps us suspended until it execs
    // or exits, so `spawn` and the stack outlive every use.
    let pid = unsafe {
        libc::clone(
            target_entry,
            stack.cast::<u8>().add(TARGET_STACK).cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&spawn as *const Spawn<'_, '_>).cast_mut().cast(),
        )
    };
    let err = io::Error::last_os_error();
    // SAFETY: the child no longer uses the stack (it exec'd into a new address space or died).
    unsafe { libc::munmap(stack, TARGET_STACK) };
    if pid < 0 {
        return Err(err);
    }
    Ok(pid)
}

/// cgroup v1: wait for the supervisor's `tasks` files and move ourselves in (writing "0"). A
/// thread moving itself skips the global threadgroup lock that moving another process takes.
fn join_cgroup(sock: RawFd, join: bool) -> Result<(), Failure> {
    // SAFETY: the fd stays open for the whole call (it is the init's status channel, a
    // descriptor number from the context).
    let got = channel::recv(unsafe { BorrowedFd::borrow_raw(sock) });
    let fds = match got {
        Ok(channel::Received { msg: Some(CageMsg::Join), fds, .. }) if !fds.is_empty() => fds,
        // No cgroup means no launch: the supervisor has given up (and will kill us).
        _ => exit_now(1),
    };
    for fd in fds.into_iter().filter(|_| join) {
        // "0": ourselves, into the cgroup whose tasks file the supervisor opened.
        if nix::unistd::write(&fd, b"0").map_err(|e| FailCode::CgroupFailed.at(Stage::Cgroup, e))? != 1 {
            return Err(FailCode::CgroupFailed.at(Stage::Cgroup, "a short write to a cgroup tasks file"));
        }
    }
    Ok(())
}

/// The init cannot supervise the target: end the cage.
fn give_up(target: libc::pid_t) -> ! {
    let _ = kill(Pid::from_raw(target), Signal::SIGKILL);
    exit_now(1)
}

/// Block the signals the init waits for with sigwaitinfo (and SIGCHLD, by which it learns of
/// the target's end: an ignored SIGCHLD inherited from whoever started chio would reap the
/// target unasked and never wake the init).
fn block_forwarded_signals() {
    let _ = sys::hear_of_children();
    let mut set = SigSet::empty();
    for s in FORWARDED.into_iter().chain([libc::SIGCHLD]).filter_map(|s| Signal::try_from(s).ok()) {
        set.add(s);
    }
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None);
}

/// The init after the target exists: shed privileges, forward signals, reap, and report the
/// target's end — once everything else the command started is dead and reaped too, so that
/// the report means the command is over (the supervisor answers on it without waiting for
/// the init's own exit, which tears the namespaces down).
/// `shed`: the bounding set was dropped (and securebits locked) before the target was forked.
fn reap(ctx: &Ctx<'_>, target: libc::pid_t, shed: bool) -> ! {
    let outlives = ctx.plan.detached;
    // Only a pid namespace's init may end the rest with kill(-1): a process that entered a
    // cage stays in the supervisor's pid namespace, where kill(-1) would reach every process
    // of its uid on the host. Asked now: the init's filter refuses getpid.
    let namespace_init = std::process::id() == 1;
    // Keep the result pipe as fd 3 (a detached cage has none: its init's exit status says it).
    // SAFETY: plain fd syscall on fds we own (raw: onto a fixed number).
    if !outlives && ctx.result_w != 3 && unsafe { libc::dup2(ctx.result_w, 3) } < 0 {
        give_up(target);
    }
    let last = identity::last_cap();
    // The init takes the target's identity with no capabilities: that is exactly enough to
    // forward signals to it (a capability-less root could not signal uid 65534).
    let shed = match fault::on(ctx.plan, &TestHook::InitPrivileged) {
        true => Ok(()),
        false => identity::set_rlimits(&ctx.plan.limits)
            .and_then(|_| if shed { Ok(()) } else { identity::drop_bounding_and_lock(last) })
            .and_then(|_| identity::set_ids(ctx.plan.uid, ctx.plan.gid))
            .and_then(|_| identity::clear_caps())
            .and_then(|_| identity::no_new_privs())
            .and_then(|_| match fault::on(ctx.plan, &TestHook::InitShedFails) {
                true => Err(io::Error::other("test hook: the init's shedding fails")),
                false => Ok(()),
            }),
    };
    // A uid change clears the parent-death signal: arm it again (before seccomp, which would
    // refuse prctl), then make sure the supervisor did not die in between (its end of the
    // result pipe would be closed).
    let orphaned = !outlives
        && (nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_err() || {
            let mut p = libc::pollfd { fd: 3, events: 0, revents: 0 };
            // SAFETY: a zero-timeout poll of fd 3 (a descriptor number: nix polls only borrowed fds).
            unsafe { libc::poll(&mut p, 1, 0) != 0 }
        });
    // The host's stdin, stdout and stderr are no business of the init's.
    let detached = sys::openat(cwd_fd(), c"/dev/null", libc::O_RDWR, 0).is_ok_and(|null| {
        nix::unistd::dup2_stdin(&null).and_then(|_| dup2_stdout(&null)).and_then(|_| dup2_stderr(&null)).is_ok()
    });
    default_faults();
    if shed.is_err() || orphaned || !detached || seccomp::install_init(ctx.filters).is_err() {
        give_up(target);
    }
    let aborts = fault::on(ctx.plan, &TestHook::InitAborts);
    // Last, close everything else: the supervisor waits for EOF on the status channel before it
    // lets the target run, so EOF also proves the init has shed every privilege.
    if !fault::on(ctx.plan, &TestHook::Channel) && sys::close_from(if outlives { 3 } else { 4 }).is_err() {
        give_up(target);
    }
    // Raw: nix has no wait4 with rusage, and the init's filter allows exactly these syscalls.
    // SAFETY: sigset built locally; wait4/kill/write on our own children and fd.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        loop {
            let sig = libc::sigwaitinfo(&set, std::ptr::null_mut());
            if sig == libc::SIGCHLD {
                loop {
                    let mut status = 0;
                    let mut ru: libc::rusage = std::mem::zeroed();
                    let pid = libc::wait4(-1, &mut status, libc::WNOHANG, &mut ru);
                    if pid <= 0 {
                        break;
                    }
                    if pid == target {
                        if aborts {
                            std::process::abort();
                        }
                        let killed = if namespace_init { end_the_rest() } else { 0 };
                        if outlives {
                            // The engine reads the container's end from its init's status, as
                            // runc's init gives it: the target's code, or 128 + its signal.
                            libc::_exit(match libc::WIFSIGNALED(status) {
                                true => 128 + libc::WTERMSIG(status),
                                false => libc::WEXITSTATUS(status),
                            });
                        }
                        write_result(status, killed);
                        libc::_exit(0);
                    }
                }
            } else if sig > 0 {
                libc::kill(target, sig);
            } else if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                // Cannot wait any more: end the cage rather than leave the target unsupervised.
                libc::kill(target, libc::SIGKILL);
                libc::_exit(1);
            }
        }
    }
}

/// Put the default action back on the signals of a fault, so that one ends the init. The
/// supervisor's handlers it inherited (std's stack-overflow check, on SIGSEGV and SIGBUS) would
/// otherwise meet a fault the init did not expect — `abort()` under its filter, which refuses
/// the signal calls, faults on purpose — try to put the default back themselves, be refused by
/// the filter, and return to the faulting instruction: the init would spin until the deadline.
fn default_faults() {
    for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGABRT, libc::SIGTRAP, libc::SIGSYS] {
        default_disposition(sig);
    }
}

/// Kill every other process of the cage and reap them all (orphans are the init's children).
/// kill(-1) from a namespace's init reaches every process in the namespace but itself; a fork
/// racing it is either reached or aborted by the kernel, and wait4 blocks until none is left.
/// Returns how many it killed (those that had exited on their own are not counted).
fn end_the_rest() -> i64 {
    let mut killed = 0;
    // SAFETY: kill and wait4 on our own namespace, with local buffers. Raw like the loop in
    // `reap` that calls this: the init's filter pins these exact syscalls.
    unsafe {
        libc::kill(-1, libc::SIGKILL);
        loop {
            let mut status = 0;
            let mut ru: libc::rusage = std::mem::zeroed();
            if libc::wait4(-1, &mut status, 0, &mut ru) > 0 {
                killed += i64::from(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL);
            } else if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
    }
    killed
}

/// Result record: kind (0 exit, 1 signal), value, cpu µs, max RSS KiB of the reaped tree, and
/// the number of processes killed at the end.
fn write_result(status: libc::c_int, killed: i64) {
    let (cpu, rss) =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).map_or((0, 0), |ru| {
            let (u, s) = (ru.user_time(), ru.system_time());
            ((u.tv_sec() + s.tv_sec()) * 1_000_000 + u.tv_usec() + s.tv_usec(), ru.max_rss())
        });
    let (kind, value) = if libc::WIFSIGNALED(status) {
        (1i64, i64::from(libc::WTERMSIG(status)))
    } else {
        (0i64, i64::from(libc::WEXITSTATUS(status)))
    };
    let mut buf = [0u8; RESULT_BYTES];
    for (i, v) in [kind, value, cpu, rss, killed].iter().enumerate() {
        buf[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    // SAFETY: a local buffer to fd 3, the result pipe (a descriptor number: nix writes only to
    // borrowed fds, and the init's filter allows write(2) itself).
    unsafe { libc::write(3, buf.as_ptr().cast(), buf.len()) };
}

fn loopback_up() -> io::Result<()> {
    let (s, mut req) = loopback_flags()?;
    // SAFETY: the flags member of an ifreq SIOCGIFFLAGS filled, set back on our own socket.
    let r = unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &req)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `lo` is up in this network namespace, as the kernel says: what the record reports,
/// rather than what the plan asked for.
fn loopback_is_up() -> bool {
    // SAFETY: reading the flags member SIOCGIFFLAGS filled.
    loopback_flags().is_ok_and(|(_, req)| unsafe { req.ifr_ifru.ifru_flags } & libc::IFF_UP as libc::c_short != 0)
}

/// A datagram socket and `lo`'s flags read through it (SIOCGIFFLAGS).
fn loopback_flags() -> io::Result<(OwnedFd, libc::ifreq)> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let s = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    // SAFETY: an ifreq for "lo" on our own socket (nix has no interface-flags ioctl).
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((s, req))
    }
}

/// The target's pre-exec setup, in the child of the init.
fn target_main(ctx: &Ctx<'_>, granted: &Granted<'_>) -> ! {
    let sock = match arrange_fds(ctx) {
        Ok(s) => s,
        Err(e) => {
            ctx.report(&FailCode::FdSetupFailed.at(Stage::Identity, e));
            exit_now(125)
        }
    };
    let ctx = Ctx { sock, ..*ctx };
    match target_setup(&ctx, granted) {
        Ok(()) => exit_now(125),
        Err(f) => {
            ctx.report(&f);
            exit_now(f.code.exit_status())
        }
    }
}

/// stdin from the supervisor's pipe or the cage's own `/dev/null` (never a host file
/// description), stdout/stderr onto the pipes, the status channel at fd 3, everything else
/// closed.
fn arrange_fds(ctx: &Ctx<'_>) -> io::Result<RawFd> {
    // fd 0 first, and the /dev/null fd closed before anything else moves: it may have landed on
    // a number (3, say) that the channel is about to take.
    let stdin = match ctx.stdin_r {
        -1 => sys::openat(cwd_fd(), c"/dev/null", libc::O_RDONLY, 0)?,
        // SAFETY: dup of the inherited read end of the stdin pipe, which stays open (a
        // descriptor number from the context).
        fd => sys::dup(unsafe { BorrowedFd::borrow_raw(fd) })?,
    };
    // SAFETY: fd syscalls on fds inherited from the supervisor (raw: onto fixed numbers, which
    // nix's dup2 wants as OwnedFds this process does not have).
    unsafe {
        if libc::dup2(stdin.as_raw_fd(), 0) < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(stdin);
        if libc::dup2(ctx.stdout_w, 1) < 0 || libc::dup2(ctx.stderr_w, 2) < 0 {
            return Err(io::Error::last_os_error());
        }
        if ctx.sock != 3 && libc::dup3(ctx.sock, 3, libc::O_CLOEXEC) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    sys::close_from(4)?;
    Ok(3)
}

fn cwd_fd() -> BorrowedFd<'static> {
    nix::fcntl::AT_FDCWD
}

fn reset_signals() {
    for sig in 1..=libc::SIGRTMAX() {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            default_disposition(sig);
        }
    }
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

/// Put `sig`'s default action back. Raw `rt_sigaction`: glibc's `signal` and `sigaction` (and
/// nix's, over them) refuse the two real-time signals glibc keeps for itself (32 and 33), and a
/// disposition the invoker left on them — an ignored signal survives an exec — would reach the
/// command, whose own C library may use them as any other.
fn default_disposition(sig: libc::c_int) {
    /// The kernel's `struct sigaction` on x86_64 (handler, flags, restorer, mask).
    #[repr(C)]
    struct KernelSigaction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let act = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: rt_sigaction with a local, fully initialised kernel sigaction and no old-action
    // pointer; the default disposition installs no handler.
    unsafe {
        libc::syscall(libc::SYS_rt_sigaction, sig, &act as *const KernelSigaction, std::ptr::null_mut::<u8>(), 8usize)
    };
}

fn target_setup(ctx: &Ctx<'_>, granted: &Granted<'_>) -> Result<(), Failure> {
    // First, so that the supervisor attaches ptrace while the rest is set up.
    channel::send(ctx.sock, &CageMsg::Hello, &[]).map_err(|e| FailCode::ChannelFailed.at(Stage::Identity, e))?;
    let plan = ctx.plan;
    reset_signals();
    // A fixed file-creation mask, not the invoker's: the daemon's unit runs with 0077, a shell
    // with 0022 or 0002, and the same command must make the same files either way.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(CAGE_UMASK));
    // Linux's own execution domain, no flag: an invoker's ADDR_NO_RANDOMIZE (`setarch -R`)
    // survives an exec, and would run the command without address-space randomisation (the
    // cage's filter refuses personality changes, so the command cannot undo it either).
    nix::sys::personality::set(nix::sys::personality::Persona::empty())
        .map_err(|e| FailCode::PersonalityFailed.at(Stage::Identity, e))?;
    if plan.terminal {
        // A session of its own, whose controlling terminal is the console on its stdin.
        nix::unistd::setsid().map_err(|e| FailCode::FdSetupFailed.at(Stage::Identity, format!("setsid: {e}")))?;
        // SAFETY: TIOCSCTTY on fd 0 with argument 0 (do not steal a terminal another session
        // holds); nix has no wrapper for it.
        if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } != 0 {
            let e = io::Error::last_os_error();
            return Err(
                FailCode::FdSetupFailed.at(Stage::Identity, format!("making stdin the controlling terminal: {e}"))
            );
        }
    }
    let mut reported = Reported {
        proc_verified: true,
        loopback_up: loopback_is_up(),
        mounts: granted.described.to_vec(),
        sources: granted.sources.to_vec(),
        landlock_read_exec: granted.access.read_exec.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
        landlock_read_write_exec: granted
            .access
            .read_write_exec
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect(),
        seccomp_filter_sha256: ctx.filters.sha256.clone(),
        profile_filter_sha256: ctx.filters.stacked.as_ref().map(|(_, sha)| sha.clone()),
        seccomp_refuses: seccomp::REFUSALS.iter().map(|r| r.to_string()).collect(),
        ..Reported::default()
    };
    fault::fail_at(ctx.plan, Stage::Identity)?;
    identity::set_rlimits(&plan.limits).map_err(|e| FailCode::RlimitFailed.at(Stage::Identity, e))?;
    let last = identity::last_cap();
    fault::fail_at(ctx.plan, Stage::Capabilities)?;
    // Test hooks skip or delay one of these steps; the exec-stop check must then catch it.
    let late_caps = fault::on(plan, &TestHook::NoNewPrivs);
    let hooked_caps = late_caps || fault::on(plan, &TestHook::Bounding) || fault::on(plan, &TestHook::Caps);
    if fault::on(plan, &TestHook::Caps) {
        identity::raise_inheritable().map_err(|e| FailCode::CapabilityDropFailed.at(Stage::Capabilities, e))?;
    }
    if !granted.shed && !fault::on(plan, &TestHook::Bounding) {
        identity::drop_bounding_and_lock(last)
            .map_err(|e| FailCode::CapabilityDropFailed.at(Stage::Capabilities, e))?;
    }
    let uid = if fault::on(plan, &TestHook::Uid) { plan.uid.wrapping_sub(1) } else { plan.uid };
    let gid = if fault::on(plan, &TestHook::Gid) { plan.gid.wrapping_sub(1) } else { plan.gid };
    identity::set_ids(uid, gid).map_err(|e| FailCode::IdentityFailed.at(Stage::Identity, e))?;
    if plan.enter.is_some() {
        // Entering a running cage, the target is not below a namespace init of its own: it
        // dies with the process that entered (whose pid the engine holds, signals and waits
        // for), as a cage's processes die with theirs. Armed after the uid change, which
        // clears it; it lasts through the exec.
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
            .map_err(|e| FailCode::IdentityFailed.at(Stage::Identity, format!("parent-death signal: {e}")))?;
    }
    if fault::on(plan, &TestHook::Groups) {
        // One group (CAP_SETGID is still effective here).
        let _ = nix::unistd::setgroups(&[nix::unistd::Gid::from_raw(gid)]);
    }
    if !hooked_caps {
        identity::clear_caps().map_err(|e| FailCode::CapabilityDropFailed.at(Stage::Capabilities, e))?;
    }
    reported.capabilities_cleared = identity::caps_all_clear(last);
    if !reported.capabilities_cleared && !hooked_caps {
        return Err(
            FailCode::CapabilitiesRemain.at(Stage::Capabilities, "a capability set is not empty after dropping")
        );
    }
    reported.securebits = identity::securebits();
    if reported.securebits != identity::SECUREBITS && !fault::on(plan, &TestHook::Bounding) {
        return Err(FailCode::SecurebitsUnset.at(
            Stage::Capabilities,
            format!("securebits are {:#x} after locking, not {:#x}", reported.securebits, identity::SECUREBITS),
        ));
    }
    if !late_caps {
        identity::no_new_privs().map_err(|e| FailCode::NoNewPrivsFailed.at(Stage::Identity, e))?;
    }
    let cwd = path::cstring(&plan.cwd).map_err(|e| FailCode::CwdUnavailable.at(Stage::Identity, e))?;
    if let Err(e) = nix::unistd::chdir(cwd.as_c_str()) {
        return Err(FailCode::CwdUnavailable.at(Stage::Identity, format!("cannot enter {}: {e}", plan.cwd.display())));
    }
    if fault::on(plan, &TestHook::Cwd) {
        let _ = nix::unistd::chdir(c"/");
    }
    fault::fail_at(ctx.plan, Stage::Landlock)?;
    apply_landlock(ctx, granted.access, &mut reported)?;
    fault::fail_at(ctx.plan, Stage::Target)?;
    if let (true, Some(argv0)) = (fault::on(plan, &TestHook::TouchBeforeOpen), plan.argv.first()) {
        // The supervisor hashes its early guess while the cage sets up; give it the time.
        std::thread::sleep(std::time::Duration::from_millis(300));
        append_byte(&plan.cwd.join(argv0));
    }
    let target = find_target(plan)?;
    let mut fds = vec![target.exec_fd.as_raw_fd()];
    if let Some(s) = &target.script {
        fds.extend([s.file.as_raw_fd(), s.copy.as_raw_fd()]);
    }
    let ready = CageMsg::Ready {
        reported: Box::new(reported),
        exec_path: target.exec_path.to_string_lossy().into_owned(),
        script_path: target.script.as_ref().map(|s| s.path.to_string_lossy().into_owned()),
        script_fd: target.script.as_ref().map(|s| s.copy.as_raw_fd()),
    };
    channel::send(ctx.sock, &ready, &fds).map_err(|e| FailCode::ChannelFailed.at(Stage::Target, e))?;
    if let Some(script) = target.script {
        // The sealed copy is kept open across exec for the interpreter (its number is in argv):
        // FD_CLOEXEC cleared. The file it was copied from closes here.
        fcntl(&script.copy, FcntlArg::F_SETFD(FdFlag::empty()))
            .map_err(|e| FailCode::ScriptFdFailed.at(Stage::Target, e))?;
        let _kept_open: RawFd = std::os::fd::IntoRawFd::into_raw_fd(script.copy);
    }
    // A test hook's other file is opened now: under the target's filter openat2 is ENOSYS.
    let swap = match fault::hook(plan) {
        Some(h @ TestHook::Exe(other)) if fault::on(plan, h) => Some(open_checked(other)?),
        _ => None,
    };
    fault::fail_at(ctx.plan, Stage::Seccomp)?;
    if !fault::on(plan, &TestHook::Seccomp) {
        seccomp::install(ctx.filters).map_err(|e| FailCode::SeccompFailed.at(Stage::Seccomp, e))?;
    }
    if late_caps {
        identity::clear_caps().map_err(|e| FailCode::CapabilityDropFailed.at(Stage::Capabilities, e))?;
    }
    // The supervisor has attached ptrace (it checks the executable's digest before the exec stop
    // ends); anything but GO stops here.
    match channel::recv_byte(ctx.sock) {
        Ok(Some(GO)) => {}
        _ => exit_now(125),
    }
    fault::fail_at(ctx.plan, Stage::Exec)?;
    if fault::on(plan, &TestHook::Touch) && matches!(channel::recv_byte(ctx.sock), Ok(Some(GO))) {
        // The supervisor says it has taken the file's identity: change it before the exec.
        append_byte(&target.exec_path);
    }
    if fault::on(plan, &TestHook::StallBeforeExec) {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
    let exec_fd = hooked_exec(plan, target.exec_fd, swap);
    let err = exec(&target.argv, &plan.env, exec_fd.as_raw_fd());
    let code = match err.raw_os_error() {
        Some(libc::ENOENT) => FailCode::TargetNotFound,
        Some(libc::EACCES | libc::ENOEXEC | libc::EISDIR | libc::ETXTBSY | libc::EPERM) => {
            FailCode::TargetNotExecutable
        }
        _ => FailCode::ExecFailed,
    };
    Err(code.at(Stage::Exec, format!("executing {}: {err}", target.exec_path.display())))
}

/// Test hook: append a byte to `p` (the file hashed, or the one about to be opened).
fn append_byte(p: &Path) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(p) {
        let _ = f.write_all(b"\0");
    }
}

/// The fd to execute: the verified one, or what a test hook says instead (`swap`, another file;
/// or the verified one with an extra fd left open across exec).
fn hooked_exec(plan: &CagePlan, verified: OwnedFd, swap: Option<OwnedFd>) -> OwnedFd {
    if fault::on(plan, &TestHook::Fd) {
        // SAFETY: a copy of fd 0 without FD_CLOEXEC, left open on purpose (raw: a test hook on a
        // descriptor number).
        unsafe { libc::fcntl(0, libc::F_DUPFD, 9) };
    }
    swap.unwrap_or(verified)
}

fn apply_landlock(ctx: &Ctx<'_>, access: &Access, reported: &mut Reported) -> Result<(), Failure> {
    let abi = ctx.landlock_abi;
    reported.landlock_abi = abi;
    let status = |ok: bool| if ok { "FullyEnforced" } else { "NotEnforced" }.to_string();
    if abi == 0 {
        reported.landlock_fs = status(false);
        reported.landlock_net = status(false);
        reported.landlock_scope = status(false);
        return match ctx.plan.mode {
            Mode::Enforced => Err(FailCode::LandlockUnsupported.at(Stage::Landlock, "the host has no landlock")),
            Mode::Shadow => Ok(()),
        };
    }
    let build = || -> io::Result<Ruleset> {
        let mut rs = Ruleset::new(abi)?;
        rs.allow_path(c"/", lfs::READ)?;
        for p in &access.read_exec {
            rs.allow_path(p, lfs::READ | lfs::EXECUTE)?;
        }
        for p in &access.read_write_exec {
            rs.allow_path(p, lfs::READ | lfs::WRITE | lfs::EXECUTE)?;
        }
        rs.allow_path(c"/tmp", lfs::READ | lfs::WRITE)?;
        for t in &ctx.plan.tmpfs {
            rs.allow_path(&crate::path::cstring(&t.dest)?, lfs::READ | lfs::WRITE)?;
        }
        rs.allow_path(c"/dev/shm", lfs::READ | lfs::WRITE)?;
        rs.allow_path(c"/dev", lfs::READ_FILE | lfs::WRITE_FILE | lfs::IOCTL_DEV)?;
        if rs.net {
            for port in &ctx.plan.tcp_connect {
                rs.allow_port(*port, lnet::CONNECT_TCP)?;
            }
            for port in &ctx.plan.tcp_bind {
                rs.allow_port(*port, lnet::BIND_TCP)?;
            }
        }
        Ok(rs)
    };
    let rs = build().map_err(|e| FailCode::LandlockFailed.at(Stage::Landlock, e))?;
    let (net, scoped) = (rs.net, rs.scoped);
    // Each class the ruleset handles has the crate's status for it; below ABI 4 the file rights
    // lack truncate, so the file class is partial whatever the kernel says of the ruleset.
    let enforced = rs.restrict_self().map_err(|e| FailCode::LandlockFailed.at(Stage::Landlock, e))?;
    reported.landlock_fs = if abi >= 4 { enforced.clone() } else { "PartiallyEnforced".to_string() };
    reported.landlock_net = if net { enforced.clone() } else { status(false) };
    reported.landlock_scope = if scoped { enforced } else { status(false) };
    Ok(())
}

/// The executable to run: the file itself, or the interpreter of a `#!` script.
struct Resolved {
    exec_fd: OwnedFd,
    exec_path: PathBuf,
    script: Option<Script>,
    argv: Vec<OsString>,
}

/// A `#!` script: the file as opened, and the sealed copy its interpreter reads (see `sealed`).
struct Script {
    path: PathBuf,
    file: OwnedFd,
    copy: OwnedFd,
}

/// The most a script may hold: its copy is written under the cage's RLIMIT_FSIZE (a larger one
/// would die by SIGXFSZ half-copied) and charged to its memory; never more than 64 MiB.
fn script_limit(plan: &CagePlan) -> u64 {
    plan.limits.fsize_bytes.min(64 << 20)
}

/// Open `p` inside the cage root (after pivot_root, "/" is the cage's root).
fn open_in_root(p: &Path) -> io::Result<OwnedFd> {
    let root = path::open_host(Path::new("/"), libc::O_DIRECTORY)?;
    // Non-blocking: a FIFO named as the target opens at once (and is then refused as not a
    // regular file) instead of stalling the launch.
    path::resolve_in(root.as_fd(), p, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)
}

fn find_target(plan: &CagePlan) -> Result<Resolved, Failure> {
    let Some(argv0) = plan.argv.first() else {
        return Err(FailCode::TargetNotFound.at(Stage::Target, "empty command"));
    };
    let not_found =
        |what: &Path| FailCode::TargetNotFound.at(Stage::Target, format!("{}: not found in the cage", what.display()));
    let path = if argv0.as_bytes().contains(&b'/') {
        let p = plan.cwd.join(argv0);
        open_checked(&p).map(|fd| (fd, p))?
    } else {
        search_path(plan, argv0).ok_or_else(|| not_found(Path::new(argv0)))?
    };
    let (fd, p) = path;
    let mut head = [0u8; 256];
    let n = nix::sys::uio::pread(&fd, &mut head, 0).unwrap_or(0);
    let head = &head[..n];
    if !head.starts_with(b"#!") {
        return Ok(Resolved { exec_fd: fd, exec_path: p, script: None, argv: plan.argv.clone() });
    }
    let (interp, arg) = parse_shebang(head).ok_or_else(|| {
        FailCode::TargetNotExecutable.at(Stage::Target, format!("{}: malformed #! line", p.display()))
    })?;
    let interp_fd = open_checked(Path::new(&interp)).map_err(|f| Failure {
        code: FailCode::TargetNotExecutable,
        detail: format!("{}: interpreter {}", p.display(), f.detail),
        ..f
    })?;
    // The interpreter reads a sealed copy of the script through the very fd that is hashed
    // (`/dev/fd/<n>`, as the kernel does for an fexecve'd script), never the file or its path:
    // neither a file swapped in at the path nor the file rewritten in place while the
    // interpreter runs is what runs.
    let limit = script_limit(plan);
    let copy = crate::sealed::copy(fd.as_fd(), c"chio-script", limit).map_err(|e| match e.raw_os_error() {
        Some(libc::EFBIG) => FailCode::ScriptTooLarge.at(
            Stage::Target,
            format!(
                "{}: larger than the {limit} bytes a script may have (its RLIMIT_FSIZE, at most 64 MiB)",
                p.display()
            ),
        ),
        _ => FailCode::ScriptCopyFailed.at(Stage::Target, format!("copying {} to a sealed memfd: {e}", p.display())),
    })?;
    let mut argv = vec![interp.clone()];
    argv.extend(arg);
    argv.push(format!("/dev/fd/{}", copy.as_raw_fd()).into());
    argv.extend(plan.argv.iter().skip(1).cloned());
    Ok(Resolved {
        exec_fd: interp_fd,
        exec_path: PathBuf::from(interp),
        script: Some(Script { path: p, file: fd, copy }),
        argv,
    })
}

/// Open a candidate executable inside the root; it must be a regular file.
fn open_checked(p: &Path) -> Result<OwnedFd, Failure> {
    let fd = open_in_root(p).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => {
            FailCode::TargetNotFound.at(Stage::Target, format!("{}: {e}", p.display()))
        }
        _ => FailCode::TargetNotExecutable.at(Stage::Target, format!("{}: {e}", p.display())),
    })?;
    let st = sys::fstat(fd.as_fd()).map_err(|e| FailCode::TargetNotExecutable.at(Stage::Target, e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(FailCode::TargetNotExecutable.at(Stage::Target, format!("{}: not a regular file", p.display())));
    }
    Ok(fd)
}

fn search_path(plan: &CagePlan, name: &OsStr) -> Option<(OwnedFd, PathBuf)> {
    let path =
        plan.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()).unwrap_or_else(|| "/usr/bin:/bin".into());
    for dir in path.as_bytes().split(|b| *b == b':').filter(|d| d.starts_with(b"/")) {
        let candidate = Path::new(OsStr::from_bytes(dir)).join(name);
        if let Ok(fd) = open_checked(&candidate) {
            return Some((fd, candidate));
        }
    }
    None
}

/// `#!interp [one-arg]` as the kernel parses it.
fn parse_shebang(head: &[u8]) -> Option<(OsString, Option<OsString>)> {
    let line = head.get(2..)?.split(|b| *b == b'\n').next()?;
    let line = line.trim_ascii();
    if line.is_empty() {
        return None;
    }
    let (interp, rest) = match line.iter().position(|b| *b == b' ' || *b == b'\t') {
        Some(i) => (&line[..i], line[i..].trim_ascii()),
        None => (line, &b""[..]),
    };
    let arg = (!rest.is_empty()).then(|| OsStr::from_bytes(rest).to_os_string());
    Some((OsStr::from_bytes(interp).to_os_string(), arg))
}

fn exec(argv: &[OsString], env: &[(OsString, OsString)], fd: RawFd) -> io::Error {
    // The plan's check refuses NUL bytes; were one here, nothing runs rather than a cut command.
    let cargs: Result<Vec<CString>, _> = argv.iter().map(|a| CString::new(a.as_bytes())).collect();
    let cenv: Result<Vec<CString>, _> = env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv)
        })
        .collect();
    let (Ok(cargs), Ok(cenv)) = (cargs, cenv) else {
        return io::Error::new(io::ErrorKind::InvalidInput, "a command argument or variable contains a NUL byte");
    };
    let mut argp: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = cenv.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());
    sys::execveat_fd(fd, &argp, &envp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shebang_parsing_matches_the_kernel() {
        let (i, a) = parse_shebang(b"#!/bin/sh\necho").unwrap();
        assert_eq!((i.as_os_str(), a), (OsStr::new("/bin/sh"), None));
        let (i, a) = parse_shebang(b"#! /usr/bin/env  python3 -u \n").unwrap();
        assert_eq!(i, "/usr/bin/env");
        assert_eq!(a.unwrap(), "python3 -u");
        assert!(parse_shebang(b"#!\n").is_none());
    }
}
