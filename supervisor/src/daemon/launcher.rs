//! The launcher: a single-threaded process forked before the daemon starts its runtime. The
//! cage's `launch` forks and must not run in a threaded process, so every launch is a child
//! forked by this process — one child per launch, so launches run side by side. The next
//! launch's child is forked before its job arrives (a spare); once no launch process is left
//! (none running, none tearing its cage down, or none but teardowns older than
//! [`WIND_DOWN_WAIT`]) it makes its cage's network namespace, launch cgroup, the root the last
//! launch had and the cage's init ahead (`chio_cage::ahead`), then waits.
//!
//! A job does not pass through the launcher: the daemon sends it (with its answer pipe, its
//! gate, the client's connection and descriptors) on a queue, a SOCK_SEQPACKET pair whose
//! receiving end only the launcher and its spare hold, and the spare takes it from there itself
//! — one wake fewer on a request's path. The kernel gives each message to one receiver, so a
//! job is never run twice: a spare that dies before it takes the job leaves it queued for the
//! next. The spare says `taken` on its own pair, and the launcher forks the next spare. The
//! daemon talks to the launcher on another pair: `kill` (stop every launch still on its way to
//! an answer); EOF means the daemon is gone: those launches are killed, and those winding their
//! cages down finish. Each launch says `answered` (with its root) on its own pair once its
//! client has the answer.
//!
//! Each launch child dies with the launcher (PDEATHSIG), and each cage with its launch child
//! (the cage's own PDEATHSIG, PTRACE_O_EXITKILL and janitor): killing this process ends them all.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags};
use nix::sys::socket::{SockFlag, SockType, UnixAddr};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use chio_cage::digests::Digests;
use chio_cage::{Ahead, RootKey};

use super::{answer, job, said};

const LAUNCH: &[u8] = b"launch";
const KILL: &[u8] = b"kill";
/// To a spare: make the work ahead of the job now.
const PREPARE: &[u8] = b"prepare";
/// How often at most a spare makes its root ahead again after the host's mounts changed (see
/// `Ahead::watch`).
const RENEW_EVERY: Duration = Duration::from_millis(100);
/// A spare's answer once it holds its job.
const TAKEN: &[u8] = b"taken";
/// A launch's word once its client has the answer (it is only winding its cage down now),
/// followed by its cage's root ([`RootKey`] as JSON) when a root made ahead could serve it.
const ANSWERED: &[u8] = b"answered";
/// The longest word on a launcher's socket: a word and a root ([`RootKey`] as JSON). A root
/// whose JSON is longer is not made ahead.
const WORD_MAX: usize = 8192;
/// How long the spare's work ahead waits for a launch winding its cage down (about 1.5 ms
/// here): a teardown stuck longer (an init whose exit blocks) no longer holds it back.
const WIND_DOWN_WAIT: Duration = Duration::from_millis(50);
/// How long a spare may leave a job queued (it may be finishing a step of its work ahead)
/// before it is killed, and the job left to the next spare.
const HAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Descriptors on one `launch` message: the job, the result pipe, the gate, the client's
/// connection and up to four of the client's.
const MAX_JOB_FDS: usize = 8;

/// The daemon's handle on its launcher.
pub struct Launcher {
    sock: OwnedFd,
    /// The jobs' queue, which the spare reads.
    jobs: OwnedFd,
    /// The launcher's pid (the daemon reaps it at exit).
    pub pid: Pid,
    /// What the launcher and its spare say of themselves, for the daemon's metrics.
    pub gauges: Gauges,
}

/// Two figures the launcher and its spare keep for the daemon's metrics: the launch processes
/// alive (running a launch or tearing its cage down) and whether a spare waits with its work
/// made ahead. A memfd made before the launcher is forked: the launcher and its spare write
/// their figure with one pwrite each when it changes, the daemon reads both at a scrape — no
/// message and no lock, nothing on a launch's path.
pub struct Gauges(OwnedFd);

/// Where each figure is in the memfd (8 bytes each, native order).
const LIVE_AT: i64 = 0;
const SPARE_READY_AT: i64 = 8;

impl Gauges {
    /// A fresh pair of figures, both 0.
    pub fn new() -> io::Result<Gauges> {
        let fd = nix::sys::memfd::memfd_create(c"chio-gauges", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
        nix::unistd::ftruncate(&fd, 16)?;
        Ok(Gauges(fd))
    }

    fn set(&self, at: i64, v: u64) {
        let _ = nix::sys::uio::pwrite(&self.0, &v.to_ne_bytes(), at);
    }

    /// (launch processes alive, a spare waits ready).
    pub fn read(&self) -> (u64, bool) {
        let mut b = [0u8; 16];
        if nix::sys::uio::pread(&self.0, &mut b, 0) != Ok(16) {
            return (0, false);
        }
        let word = |at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap_or_default());
        (word(LIVE_AT as usize), word(SPARE_READY_AT as usize) == 1)
    }

    fn try_clone(&self) -> io::Result<Gauges> {
        Ok(Gauges(self.0.try_clone()?))
    }
}

/// Fork the launcher. Must be called while the process is single-threaded.
pub fn spawn() -> io::Result<Launcher> {
    let pair = || socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC);
    let (ours, theirs) = pair().map_err(io::Error::from)?;
    let (jobs, queue) = pair().map_err(io::Error::from)?;
    let gauges = Gauges::new()?;
    let its_gauges = gauges.try_clone()?;
    // SAFETY: the caller is single-threaded (checked by the daemon before it starts tokio);
    // the child runs only `serve`, which never returns.
    match unsafe { fork() }.map_err(io::Error::from)? {
        ForkResult::Child => {
            drop(ours);
            drop(jobs);
            drop(gauges);
            serve(theirs, queue, its_gauges)
        }
        // Only the launcher's processes hold the queue's receiving end: with them gone, a job
        // cannot be queued.
        ForkResult::Parent { child } => Ok(Launcher { sock: ours, jobs, pid: child, gauges }),
    }
}

impl Launcher {
    /// Queue a job for the launcher's spare: `job` (JSON) travels in a memfd, `result` is the
    /// write end of the pipe the launch child answers on, `gate` the read end of the pipe that
    /// lets it go (see `job::run`), `conn` the client's connection (the launch child writes the
    /// answer there: see `super::answer`), `client` the client's descriptors.
    pub fn submit(
        &self,
        job: &[u8],
        result: &OwnedFd,
        gate: &OwnedFd,
        conn: &OwnedFd,
        client: &[OwnedFd],
    ) -> io::Result<()> {
        let memfd = nix::sys::memfd::memfd_create(c"chio-job", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
        let mut f = std::fs::File::from(memfd);
        f.write_all(job)?;
        f.rewind()?;
        let mut fds: Vec<RawFd> = vec![f.as_raw_fd(), result.as_raw_fd(), gate.as_raw_fd(), conn.as_raw_fd()];
        fds.extend(client.iter().map(|c| c.as_raw_fd()));
        let cmsg = [ControlMessage::ScmRights(&fds)];
        sendmsg::<UnixAddr>(self.jobs.as_raw_fd(), &[IoSlice::new(LAUNCH)], &cmsg, MsgFlags::MSG_NOSIGNAL, None)?;
        Ok(())
    }

    /// Kill every running launch (their cages die with them).
    pub fn kill_all(&self) -> io::Result<()> {
        sendmsg::<UnixAddr>(self.sock.as_raw_fd(), &[IoSlice::new(KILL)], &[], MsgFlags::MSG_NOSIGNAL, None)?;
        Ok(())
    }
}

/// The launcher's loop. Never returns.
fn serve(sock: OwnedFd, jobs: OwnedFd, gauges: Gauges) -> ! {
    set_name(c"chio-launcher");
    // The launcher dies with the daemon.
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // Systemd's stop (KillMode=mixed) and a terminal's ^C reach the daemon, which decides.
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: setting a disposition to SIG_IGN installs no handler.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
    }
    // Launches end by SIGCHLD: an ignored one (inherited by the daemon) would reap them unasked.
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    let heard = chio_cage::sys::hear_of_children().is_ok();
    let sfd =
        chld.thread_block().and_then(|_| SignalFd::with_flags(&chld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK));
    let (true, Ok(sfd)) = (heard, sfd) else {
        // SAFETY: leaving without running the daemon's destructors (nix has no _exit).
        unsafe { libc::_exit(1) }
    };
    // Compiled (and read) once here, inherited by every launch process.
    let _ = chio_cage::seccomp::compiled();
    let _ = chio_cage::sys::arg_area();
    // The digests every launch shares, and the next launch's child (see `fork_spare`). Without
    // them (they could not be made) a launch hashes its target and makes its own namespace and
    // cgroup, as the one-shot form does.
    let digests = Digests::new().ok();
    let ours = Ours { sock: &sock, jobs: &jobs, sfd: &sfd, blocked: &chld, gauges: &gauges };
    let mut spare: Option<Spare> = None;
    let mut running = Running::new();
    // The root the next launch will likely have (what the last one had): at first the default.
    let limits = chio_cage::Limits::default();
    let mut wants = Some(RootKey {
        root: chio_cage::RootSpec::HostSystem,
        tmp_bytes: limits.tmp_bytes,
        shm_bytes: limits.shm_bytes,
        staging: chio_cage::plan::DEFAULT_STAGING_DIR.into(),
    });
    let mut live = 0;
    loop {
        if spare.is_none() {
            // A new spare has made nothing ahead yet (it says when it has).
            gauges.set(SPARE_READY_AT, 0);
            spare = fork_spare(digests, &ours);
        }
        if running.len() != live {
            live = running.len();
            gauges.set(LIVE_AT, live as u64);
        }
        let recheck = prepare_when_idle(&mut spare, &running, wants.as_ref());
        // The queue is watched once per spare, for a job it leaves there (see `HAND_TIMEOUT`),
        // and for every job while no spare could be forked (each is turned away).
        let (had_spare, due) = (spare.is_some(), spare.as_ref().and_then(|s| s.due));
        let mut fds = vec![PollFd::new(sock.as_fd(), PollFlags::POLLIN), PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
        if let Some(s) = &spare {
            fds.push(PollFd::new(s.sock.as_fd(), PollFlags::POLLIN));
        }
        if due.is_none() {
            fds.push(PollFd::new(jobs.as_fd(), PollFlags::POLLIN));
        }
        let first_running = fds.len();
        let answering: Vec<(Pid, &OwnedFd)> = running
            .iter()
            .filter_map(|(pid, l)| match l {
                Launch::Answering(s) => Some((*pid, s)),
                Launch::WindingDown(_) => None,
            })
            .collect();
        fds.extend(answering.iter().map(|(_, s)| PollFd::new(s.as_fd(), PollFlags::POLLIN)));
        // (Rounded up: a deadline less than a millisecond away is not polled for 0 ms in a loop.)
        let timeout = due.into_iter().chain(recheck).min().map_or(PollTimeout::NONE, |d| {
            let left = d.saturating_duration_since(Instant::now()) + Duration::from_millis(1);
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)
        });
        if poll(&mut fds, timeout).is_err() {
            continue;
        }
        let heard = |i: usize| fds.get(i).is_some_and(|f| f.any().unwrap_or(false));
        let (control, signals) = (heard(0), heard(1));
        let spare_said = spare.is_some() && heard(2);
        let queued = due.is_none() && heard(first_running - 1);
        let said: Vec<Pid> =
            answering.iter().enumerate().filter(|(i, _)| heard(first_running + i)).map(|(_, (p, _))| *p).collect();
        drop(fds);
        if spare_said {
            heard_from_spare(&mut spare, &mut running, &gauges);
        }
        if queued {
            match spare.as_mut() {
                Some(s) => s.due = Some(Instant::now() + HAND_TIMEOUT),
                // No spare could be forked: the job's descriptors close here and the daemon
                // answers the client that the launch did not start.
                None if !had_spare => drop(receive(&jobs, MsgFlags::MSG_DONTWAIT)),
                // Its spare took a job just now: the next spare, forked next, takes this one.
                None => {}
            }
        }
        if spare.as_ref().and_then(|s| s.due).is_some_and(|d| Instant::now() >= d) {
            // (Its word may have come since the poll.)
            heard_from_spare(&mut spare, &mut running, &gauges);
            take_back_overdue(&mut spare, &jobs);
        }
        for pid in said {
            // "answered", or EOF (it died): either way no longer on a client's critical path.
            if let Some(Launch::Answering(s)) = running.insert(pid, Launch::WindingDown(Instant::now())) {
                let mut b = vec![0u8; WORD_MAX];
                // A launch whose root no root made ahead could serve (or an answer that is not
                // a launch's: a repository status, a refusal) leaves the guess as it was.
                if let Ok(n) = nix::sys::socket::recv(s.as_raw_fd(), &mut b, MsgFlags::MSG_DONTWAIT) {
                    wants = word_root(&b[..n], ANSWERED).or(wants);
                }
            }
        }
        if signals {
            while let Ok(Some(_)) = sfd.read_signal() {}
            let gone = reap(&mut running, WaitPidFlag::WNOHANG);
            // A spare that died before its job (killed) is replaced at the top of the loop. Its
            // janitor removes the cgroup it made; the sweep is for one that could make none.
            if spare.as_ref().is_some_and(|s| gone.contains(&s.pid)) {
                spare = None;
                sweep();
            }
        }
        if !control {
            continue;
        }
        match receive(&sock, MsgFlags::empty()) {
            Ok(Message::Kill) => {
                // Queued jobs are turned away, the spare is killed whether or not it took its
                // job (it is replaced), then every launch on its way to an answer.
                turn_away_queued(&jobs);
                if let Some(s) = &spare {
                    let _ = nix::sys::signal::kill(s.pid, Signal::SIGKILL);
                }
                kill(&running);
            }
            Ok(Message::Launch(_) | Message::Prepare(_) | Message::Other) => {}
            Err(_) => {
                // The daemon is gone: nothing may outlive it. Queued jobs are dropped; the
                // spare ends with our end of its pair, removing what it made ahead — wait for
                // that before our death kills it (one that took its job meanwhile is killed).
                turn_away_queued(&jobs);
                heard_from_spare(&mut spare, &mut running, &gauges);
                kill(&running);
                if let Some(s) = spare.take() {
                    drop(s.sock);
                    let _ = waitpid(s.pid, None);
                }
                reap(&mut running, WaitPidFlag::empty());
                // SAFETY: leaving without running the daemon's destructors.
                unsafe { libc::_exit(0) }
            }
        }
    }
}

/// The launcher's own descriptors and figures, which a spare it forks closes or keeps.
struct Ours<'a> {
    /// Its pair with the daemon.
    sock: &'a OwnedFd,
    /// The jobs' queue.
    jobs: &'a OwnedFd,
    sfd: &'a SignalFd,
    /// The signals it blocks.
    blocked: &'a SigSet,
    gauges: &'a Gauges,
}

enum Message {
    Launch(Vec<OwnedFd>),
    Kill,
    /// Make the work ahead (and this root's part, if any).
    Prepare(Option<RootKey>),
    Other,
}

fn receive(sock: &OwnedFd, flags: MsgFlags) -> io::Result<Message> {
    let mut buf = vec![0u8; WORD_MAX];
    let mut space = nix::cmsg_space!([RawFd; MAX_JOB_FDS]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<UnixAddr>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC | flags)?;
    if msg.bytes == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: the kernel just installed these descriptors in our table; we own them.
            fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let bytes = msg.bytes;
    Ok(match &buf[..bytes] {
        LAUNCH if fds.len() >= 4 => Message::Launch(fds),
        KILL => Message::Kill,
        w if w.starts_with(PREPARE) => Message::Prepare(word_root(w, PREPARE)),
        _ => Message::Other,
    })
}

/// A launch child forked before its job arrives, waiting on the queue and its end of a private
/// pair.
struct Spare {
    pid: Pid,
    sock: OwnedFd,
    /// Told to make its work ahead (see [`prepare_when_idle`]).
    told: bool,
    /// When a job it has left queued is taken from it (see [`take_back_overdue`]).
    due: Option<Instant>,
}

/// Fork the next launch child; it makes what it can ahead of its job (its cage's network
/// namespace and launch cgroup: in its own time, not the launcher's), takes the next job off the
/// queue, says so, then runs it.
fn fork_spare(digests: Option<Digests>, launcher: &Ours) -> Option<Spare> {
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).ok()?;
    // SAFETY: the launcher is single-threaded; the child runs `launch_child`, which never returns.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            // SAFETY: closing the launcher's own descriptors in the child, where only the
            // launcher's borrowed handles name them (raw: no owner here to drop).
            unsafe {
                libc::close(launcher.sock.as_raw_fd());
                libc::close(launcher.sfd.as_raw_fd());
            }
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            drop(ours);
            let _ = launcher.blocked.thread_unblock();
            for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
                // SAFETY: restoring the default disposition installs no handler.
                let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
            }
            set_name(c"chio-spare");
            job::keep_only_chio_settings();
            let jobs = launcher.jobs;
            let mut ahead = Ahead::sharing(digests);
            // The root it was told to make ahead, and when it last made it again.
            let (mut wanted, mut renewed) = (None::<RootKey>, None::<Instant>);
            let fds = loop {
                // A host whose mounts keep changing has the root made again at most every
                // RENEW_EVERY, not at each change.
                let since = renewed.map_or(RENEW_EVERY, |t| t.elapsed());
                let watch = ahead.watch().filter(|_| since >= RENEW_EVERY);
                let mut p =
                    vec![PollFd::new(jobs.as_fd(), PollFlags::POLLIN), PollFd::new(theirs.as_fd(), PollFlags::POLLIN)];
                p.extend(watch.map(|w| PollFd::new(w, PollFlags::POLLPRI)));
                let timeout = match ahead.watch() {
                    Some(_) if since < RENEW_EVERY => {
                        PollTimeout::try_from(RENEW_EVERY - since).unwrap_or(PollTimeout::MAX)
                    }
                    _ => PollTimeout::NONE,
                };
                if poll(&mut p, timeout).is_err() {
                    continue;
                }
                let (job, word) = (p[0].any().unwrap_or(false), p[1].any().unwrap_or(false));
                let changed = p.get(2).and_then(PollFd::revents).is_some_and(|r| !r.is_empty());
                drop(p);
                if changed && !job && !word {
                    if let Some(key) = &wanted {
                        ahead.renew(&|| pending(jobs), key);
                        renewed = Some(Instant::now());
                    }
                    continue;
                }
                // A job first; it may have been taken meanwhile by a spare forked in our place
                // (we were late), which leaves us waiting.
                let message = if job {
                    receive(jobs, MsgFlags::MSG_DONTWAIT)
                } else if word {
                    receive(&theirs, MsgFlags::empty())
                } else {
                    continue;
                };
                match message {
                    Ok(Message::Launch(fds)) => break fds,
                    Ok(Message::Prepare(root)) => {
                        // Step by step, each only while no job is waiting: a job that comes
                        // meanwhile makes the rest itself, as the one-shot form does.
                        let waiting = || pending(jobs);
                        ahead = Ahead::make(digests, &waiting, root.as_ref(), &super::hierarchy());
                        wanted = root;
                        if !waiting() {
                            job::warm();
                            // (The launcher says 0 again once this spare has taken a job.)
                            launcher.gauges.set(SPARE_READY_AT, 1);
                        }
                    }
                    Ok(Message::Kill | Message::Other) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                    // EOF: the launcher (or the daemon) is gone, or has given up on us, before
                    // a job came.
                    Err(_) => {
                        drop(ahead);
                        // SAFETY: leaving without running the launcher's destructors.
                        unsafe { libc::_exit(0) }
                    }
                }
            };
            // Taken: from here the job is ours (see `take_back_overdue`); the queue is not.
            let _ = nix::unistd::write(&theirs, TAKEN);
            // SAFETY: as above (the launcher's borrowed handle; nothing here reads it again).
            unsafe { libc::close(jobs.as_raw_fd()) };
            set_name(c"chio-launch");
            launch_child(fds, ahead, theirs)
        }
        Ok(ForkResult::Parent { child }) => Some(Spare { pid: child, sock: ours, told: false, due: None }),
        Err(_) => None,
    }
}

/// Read the spare's word: once it has taken its job it is a running launch (the next spare is
/// forked at the top of the loop); EOF, it died before that (reaped here, what it made swept).
fn heard_from_spare(spare: &mut Option<Spare>, running: &mut Running, gauges: &Gauges) {
    let Some(s) = spare.as_ref() else {
        return;
    };
    let mut b = [0u8; 8];
    match nix::sys::socket::recv(s.sock.as_raw_fd(), &mut b, MsgFlags::MSG_DONTWAIT) {
        Ok(n) if &b[..n] == TAKEN => {
            if let Some(s) = spare.take() {
                running.insert(s.pid, Launch::Answering(s.sock));
            }
            gauges.set(SPARE_READY_AT, 0);
            // Let the launch start before the next spare is forked (on this CPU the fork would
            // otherwise go first).
            let _ = nix::sched::sched_yield();
        }
        // (It holds its end until it exits.)
        Ok(0) => {
            if let Some(s) = spare.take() {
                let _ = waitpid(s.pid, None);
            }
            sweep();
        }
        _ => {}
    }
}

/// A spare that has left a job queued for [`HAND_TIMEOUT`] (stuck in a step of its work ahead,
/// or stopped) is killed, and the job left queued for the next spare: it never took it, so it
/// is run once all the same. One that took it just now is killed with it, outcome unknown (its
/// descriptors close: the daemon tells the client) — never run twice.
fn take_back_overdue(spare: &mut Option<Spare>, jobs: &OwnedFd) {
    let Some(s) = spare.as_mut() else {
        return;
    };
    if !pending(jobs) {
        // It took the job (its word is on its way): watch the queue again.
        s.due = None;
        return;
    }
    if let Some(s) = spare.take() {
        let _ = nix::sys::signal::kill(s.pid, Signal::SIGKILL);
        let _ = waitpid(s.pid, None);
    }
    sweep();
}

/// Remove the launch cgroups of processes that are gone (a spare killed before its job).
fn sweep() {
    chio_cage::cgroup::sweep(&super::hierarchy());
}

/// `word`, then `root` as JSON if there is one and it fits in [`WORD_MAX`].
fn root_word(word: &[u8], root: Option<&RootKey>) -> Vec<u8> {
    let mut w = word.to_vec();
    if let Some(json) = root.and_then(|r| serde_json::to_vec(r).ok()).filter(|j| word.len() + j.len() <= WORD_MAX) {
        w.extend(json);
    }
    w
}

/// The root after `word` in a message (see [`root_word`]); None if it has none, or not one that
/// parses.
fn word_root(msg: &[u8], word: &[u8]) -> Option<RootKey> {
    serde_json::from_slice(msg.strip_prefix(word)?).ok()
}

/// Drop every job waiting on the queue: their descriptors close, and the daemon answers each
/// client that its launch did not start.
fn turn_away_queued(jobs: &OwnedFd) {
    while pending(jobs) && receive(jobs, MsgFlags::MSG_DONTWAIT).is_ok() {}
}

/// Whether a message waits on `sock` (without waiting for one).
fn pending(sock: &OwnedFd) -> bool {
    let mut p = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    poll(&mut p, PollTimeout::ZERO).is_ok_and(|n| n > 0)
}

/// A launch child.
enum Launch {
    /// On its way to an answer: its socket, on which it says when its client has the answer.
    Answering(OwnedFd),
    /// Winding its cage down since its client had the answer (then).
    WindingDown(Instant),
}

/// Launch children by pid.
type Running = HashMap<Pid, Launch>;

/// Tell the spare to make its work ahead, once, when no launch process is left: none on its way
/// to an answer, none winding its cage down — or only teardowns that have taken longer than
/// [`WIND_DOWN_WAIT`], which would otherwise hold every later launch's work ahead for as long as
/// they last. On a small host that work would otherwise take CPU from a running launch's
/// critical path, and, right after an answer, from its client, which goes on (a client process
/// exits and its parent wakes) while the last launch tears its cage down. Returns when to look
/// again, while only a teardown younger than that holds the work back.
fn prepare_when_idle(spare: &mut Option<Spare>, running: &Running, root: Option<&RootKey>) -> Option<Instant> {
    let s = spare.as_mut().filter(|s| !s.told)?;
    let mut until = None;
    for launch in running.values() {
        match launch {
            Launch::Answering(_) => return None,
            Launch::WindingDown(since) => until = until.max(Some(*since + WIND_DOWN_WAIT)),
        }
    }
    if until.is_some_and(|u| Instant::now() < u) {
        return until;
    }
    let word = root_word(PREPARE, root);
    let sent = sendmsg::<UnixAddr>(s.sock.as_raw_fd(), &[IoSlice::new(&word)], &[], MsgFlags::MSG_NOSIGNAL, None);
    s.told = sent.is_ok();
    None
}

fn launch_child(mut fds: Vec<OwnedFd>, ahead: Ahead, launcher: OwnedFd) -> ! {
    let client = fds.split_off(4);
    let (job_fd, result_fd, gate, conn) = match (fds.pop(), fds.pop(), fds.pop(), fds.pop()) {
        (Some(conn), Some(gate), Some(result), Some(job)) => (job, result, gate, conn),
        // SAFETY: leaving without running the daemon's destructors.
        _ => unsafe { libc::_exit(1) },
    };
    // The daemon's log, for what happens after the answer (the job makes the client's
    // descriptors this process's 0, 1 and 2).
    let log = nix::unistd::dup(io::stderr()).ok();
    // Our own handle on the gate, to say SENDING on once the job has run (see `answer`).
    let word = gate.try_clone().ok();
    let mut text = Vec::new();
    let answered = match std::fs::File::from(job_fd).read_to_end(&mut text) {
        Ok(_) => job::run(&text, client, gate, ahead),
        Err(e) => Some(job::failure(&format!("reading the job: {e}")).into()),
    };
    // Withdrawn at the gate: nothing was done, nothing is answered.
    let Some(answered) = answered else {
        // SAFETY: leaving without running the launcher's destructors.
        unsafe { libc::_exit(0) }
    };
    // Whatever the job said goes out before its answer (never waiting on the client for long),
    // and the client's stdout and stderr are let go: its readers see EOF by the time it has
    // its answer.
    let (said, dropped) = said::finish();
    // The answer goes to the client first, then what it got and the answer to the daemon.
    let sending = word.is_some_and(|w| nix::unistd::write(&w, &[answer::SENDING]) == Ok(1));
    let sent = answered.id.as_deref().filter(|_| sending).map_or(0, |id| {
        let line = answer::line(id, &answered.text) + "\n";
        answer::send_now(&conn, line.as_bytes())
    });
    drop(conn);
    let mut out = std::fs::File::from(result_fd);
    let told = answer::Told { sent, ..answered.told };
    let _ = out.write_all(told.with(&answered.text).as_bytes());
    drop(out);
    let _ = nix::unistd::write(&launcher, &root_word(ANSWERED, answered.root.as_ref()));
    drop(launcher);
    hold_teardown();
    // The client has its answer: let go of its stdin, then wind the cage down.
    let to_log = match (log, std::fs::File::open("/dev/null")) {
        (Some(log), Ok(null)) => nix::unistd::dup2_stdin(&null)
            .and_then(|_| nix::unistd::dup2_stdout(&null))
            .and_then(|_| nix::unistd::dup2_stderr(&log))
            .is_ok(),
        _ => false,
    };
    if dropped > 0 && to_log {
        tracing::warn!(
            "launch process {}: its client took {} of the {said} bytes chio said to it within {} s; the rest was \
             dropped",
            std::process::id(),
            said - dropped,
            said::FLUSH_WAIT.as_secs()
        );
    }
    if let Some(Err(e)) = answered.teardown.map(chio_cage::Teardown::finish) {
        // (Never on the client's stderr, which may belong to its next command by now.)
        if to_log {
            tracing::error!("after a launch (pid {}): {e}", std::process::id());
        }
    }
    // SAFETY: leaving without running the launcher's destructors.
    unsafe { libc::_exit(0) }
}

/// Test switch (test builds only): `CHIO_TEST_HOLD_TEARDOWN_MS` holds each launch process that
/// long after its answer, before it winds its cage down, as an init whose exit blocks would.
fn hold_teardown() {
    if !crate::TEST_HOOKS {
        return;
    }
    if let Some(ms) = std::env::var("CHIO_TEST_HOLD_TEARDOWN_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Kill the launches still on their way to an answer (their cages die with them). Those that
/// answered are only winding their cages down — reaping the init, removing the cgroup, a
/// moment's work that killing would hand to the janitor — and are left to finish.
fn kill(running: &Running) {
    // (A word on its socket not read yet is "answered", or EOF: dead already.)
    let answering = |l: &Launch| matches!(l, Launch::Answering(s) if !pending(s));
    for (&pid, _) in running.iter().filter(|(_, l)| answering(l)) {
        // The pid is ours and not reaped yet, so it cannot name another process.
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
}

/// Reap children: with WNOHANG every one that has ended (launches and a dead spare), otherwise
/// wait for every running launch. Returns the pids reaped.
fn reap(running: &mut Running, flags: WaitPidFlag) -> Vec<Pid> {
    let mut gone = Vec::new();
    while flags.contains(WaitPidFlag::WNOHANG) || !running.is_empty() {
        match waitpid(None, Some(flags)) {
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(s) => {
                if let Some(pid) = s.pid() {
                    running.remove(&pid);
                    gone.push(pid);
                }
            }
        }
    }
    gone
}

fn set_name(name: &std::ffi::CStr) {
    let _ = nix::sys::prctl::set_name(name);
}
