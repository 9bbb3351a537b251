//! Work a long-lived supervisor does before the request arrives. The daemon's launcher forks
//! each launch's process before its job comes (a spare), and the spare makes, while it waits:
//! - its cage's network namespace, the dearest part of a cage's setup (≈ 0.3 ms, most of it
//!   the kernel registering the namespace's loopback device and per-namespace tables), which
//!   the cage's init then enters instead of unsharing its own;
//! - its launch cgroup, in every hierarchy (≈ 0.3 ms of mkdirs on cgroup v1), whose ceilings
//!   are written when the request names them;
//! - when told the root the last launch had (the next will likely have it too), that root's
//!   plan-independent part ([`RootAhead`]: the skeleton, `/dev`, `/tmp`, and the read-only
//!   binds of an image's top-level entries or of the host's system directories with the cage's
//!   own `/etc`), which a launch uses only for the same root while every source is unchanged;
//! - its janitor ([`crate::janitor`]), forked as soon as the cgroup exists, so that neither the
//!   launch nor its client waits for that fork (≈ 0.1 ms) and a spare killed before its job
//!   has its cgroup removed at once;
//! - last, the cage's init itself ([`AheadInit`]), cloned into the launch cgroup with the
//!   namespace and the host part above: it makes its ipc, uts and cgroup namespaces (the pid
//!   namespace comes with the clone), sets its host name; with a root made ahead it makes its
//!   mount namespace, attaches that root (not yet sealed) and pivots into it (≈ 0.6 ms under a
//!   launch: `pivot_root` walks every thread on the host, the old root's detach waits for an
//!   RCU grace period); then it waits on its status channel for the plan. When the request
//!   comes the launch sends it the plan instead of cloning (≈ 0.15 ms of clone and ≈ 0.1 ms of
//!   namespaces and cgroup joining taken off the request's path). The plan's own trees (the
//!   workspace, the binds) are opened and cloned by the launch process then, in the host's
//!   mounts as they are at the request, not as they were when the spare got ready, and sent
//!   with the plan; the init attaches them, seals its root, starts the target only once the
//!   request's ceilings are written, and from there the launch is the same. A plan the root
//!   made ahead does not serve (another root, or a host mount or source changed since) has its
//!   whole root built by the launch process, and the init pivots again, into that. A plan that
//!   would withhold a namespace or the cgroup (test hooks), or that the cgroup does not fit,
//!   gets an init of its own and this one is killed.
//!
//! The launcher also shares, with every launch it forks, the table of digests earlier launches
//! computed ([`crate::digests`]), so that an unchanged tool is not hashed again.
//!
//! A namespace made here is as fresh as one the init would unshare: it is created by
//! `unshare(CLONE_NEWNET)` in the spare, which at once steps back into its own; the only
//! reference is the descriptor, no process ever ran in it, and it is handed to the spare's one
//! launch. The cgroup is empty and named for the spare's pid, so the janitor and every sweep
//! treat it as any launch cgroup. The one-shot `chio cage run` has no earlier moment and makes
//! both as before.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;

use std::os::fd::{AsFd, AsRawFd};

use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use crate::cgroup::{Controller, Hierarchy, LaunchCgroup, Place};
use crate::channel::{self, CageMsg};
use crate::digests::Digests;
use crate::inside::{self, AheadCtx};
use crate::janitor::{self, Janitor};
use crate::launch::{self, SupEnds, Wiring};
use crate::mounts::{RootAhead, RootKey};
use crate::plan::CagePlan;
use crate::{seccomp, sys};

/// What was made for the next launch.
#[derive(Debug, Default)]
pub struct Ahead {
    /// A fresh network namespace (an nsfs descriptor) for the cage to enter.
    pub netns: Option<OwnedFd>,
    /// The digests earlier launches of this supervisor computed (see [`crate::digests`]).
    pub digests: Option<Digests>,
    /// The launch cgroup, made (without ceilings: those come with the request) by the process
    /// that will launch, in the host's hierarchy with every controller a launch may need.
    pub cgroup: Option<LaunchCgroup>,
    /// The plan-independent part of a root (see [`RootAhead`]).
    pub root: Option<RootAhead>,
    /// The janitor of `cgroup`: the launch that takes the cgroup takes it too.
    pub janitor: Option<Janitor>,
    /// The cage's init, cloned into `cgroup` (see [`AheadInit`]).
    pub init: Option<AheadInit>,
    /// The host's mount table, opened once the root was made ahead (see [`Ahead::watch`]).
    watch: Option<File>,
}

impl Ahead {
    /// Nothing made yet, only the shared `digests`.
    pub fn sharing(digests: Option<Digests>) -> Ahead {
        Ahead { netns: None, digests, cgroup: None, janitor: None, root: None, init: None, watch: None }
    }

    /// Make the next launch's resources, sharing `digests`. The caller must be single-threaded
    /// (the calling thread spends a moment in the new namespace) and must be the process that
    /// will launch (the cgroup's name carries its pid: the janitor and every sweep go by it).
    /// `hierarchy` is where the launches' cgroups go (the one their plans name).
    /// `stop` is asked between the steps; what it stops, or what could not be made, is left to
    /// the launch. `root`: the root to make ahead (the last launch's), if any.
    pub fn make(
        digests: Option<Digests>,
        stop: &dyn Fn() -> bool,
        root: Option<&RootKey>,
        hierarchy: &Hierarchy,
    ) -> Ahead {
        let mut ahead = Ahead::sharing(digests);
        ahead.netns = fresh_netns().ok();
        if !stop() {
            ahead.cgroup =
                LaunchCgroup::make(&LaunchCgroup::new_name(), &Controller::ALL, &Place::of(hierarchy.clone())).ok();
            // Forked only from a single-threaded process (as the init below), else left to the
            // launch.
            if sys::thread_count().is_ok_and(|n| n == 1) {
                ahead.janitor = ahead.cgroup.as_ref().and_then(|cg| janitor::spawn(cg).ok());
            }
        }
        if let Some(key) = root.filter(|_| !stop()) {
            ahead.make_root(key);
        }
        if !stop() {
            ahead.init = AheadInit::clone(&mut ahead).ok();
        }
        // The launch's own first run of its code (see `sys::populate_text`).
        sys::populate_text(stop);
        ahead
    }

    /// The host's mount table as it was just after the root was made ahead: it reports a change
    /// (POLLPRI) once something is mounted or unmounted on the host. That root then no longer
    /// serves (`RootAhead::serves` asks its own copy of the table, at the request), and the
    /// init that pivoted into it is of no use: [`Ahead::renew`] makes both again. (A hint only:
    /// a poll of this copy consumes its event, never the root's.)
    pub fn watch(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.watch.as_ref().map(AsFd::as_fd)
    }

    /// Make the root ahead for `key`, and the init that pivots into it, again (see
    /// [`Ahead::watch`]): the init made before is killed, and its network namespace with it; a
    /// new one is made; the launch cgroup and its janitor stay.
    pub fn renew(&mut self, stop: &dyn Fn() -> bool, key: &RootKey) {
        drop(self.init.take());
        (self.root, self.watch) = (None, None);
        if stop() {
            return;
        }
        self.netns = fresh_netns().ok();
        self.make_root(key);
        if !stop() && self.cgroup.is_some() {
            self.init = AheadInit::clone(self).ok();
        }
    }

    fn make_root(&mut self, key: &RootKey) {
        self.root = RootAhead::make(key).ok();
        if self.root.is_some() {
            self.watch = File::open("/proc/self/mountinfo").ok();
        }
    }
}

impl Drop for Ahead {
    /// A cgroup made for a launch that never came is removed (its init killed first), by its
    /// janitor when it has one.
    fn drop(&mut self) {
        drop(self.init.take());
        if let Some(cg) = self.cgroup.take() {
            let _ = janitor::remove(&cg, self.janitor.take());
        }
    }
}

/// The cage's init, cloned ahead of its request into the launch cgroup made ahead, with the
/// network namespace (which the spare then closes: the init has its own copy) and the root's
/// part made ahead, which the init attaches and pivots into before its plan comes, and which the
/// spare keeps: at the request it checks that the root still serves, and adds the plan's part
/// ([`RootAhead::plan_part`]). Dropped unused, it is killed and reaped.
#[derive(Debug)]
pub struct AheadInit {
    pid: libc::pid_t,
    ends: Option<SupEnds>,
    root: Option<RootAhead>,
}

impl AheadInit {
    /// Clone it from `ahead` (which must hold the cgroup). Refused in a process with more than
    /// one thread, which `launch` refuses too (a forked copy of one runs with its locks held).
    fn clone(ahead: &mut Ahead) -> io::Result<AheadInit> {
        if sys::thread_count()? != 1 {
            return Err(io::Error::other("not cloning an init from a multi-threaded process"));
        }
        let cg = ahead.cgroup.as_ref().ok_or_else(|| io::Error::other("no launch cgroup made ahead"))?;
        let filters = seccomp::compiled().as_ref().map_err(|e| io::Error::other(e.to_string()))?;
        // Always a stdin pipe: the request says whether it is fed.
        let w = Wiring::new(true)?;
        let (netns, root) = (ahead.netns.take(), ahead.root.take());
        let (pipes, sock) = w.cage_ends();
        let ctx = AheadCtx {
            filters,
            sock,
            await_cgroup: cg.version == "v1",
            pipes,
            supervisor_ends: w.supervisor_ends(),
            netns: netns.as_ref().map_or(-1, |f| f.as_raw_fd()),
            root_ahead: root.as_ref(),
        };
        let v2_dir = if cg.version == "v1" { None } else { Some(cg.v2_dir()?) };
        let pid = match launch::clone_pid_ns(v2_dir.as_ref().map(AsFd::as_fd))? {
            0 => inside::init_ahead(&ctx),
            pid => pid,
        };
        let init = AheadInit { pid, ends: Some(w.into_supervisor_ends()), root };
        if cg.version == "v1" {
            let fds = cg.self_join_fds()?;
            let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
            channel::send(init.sock()?, &CageMsg::Join, &raw)?;
        }
        channel::warm();
        Ok(init)
    }

    fn sock(&self) -> io::Result<std::os::fd::RawFd> {
        self.ends.as_ref().map(|e| e.sock.as_raw_fd()).ok_or_else(|| io::Error::other("the init was started"))
    }

    /// Send it the plan. Returns its pid and the supervisor's ends of its wiring; on an error it
    /// is killed, and the launch clones its own.
    pub(crate) fn start(mut self, plan: &CagePlan, abi: u32, feed_stdin: bool) -> io::Result<(libc::pid_t, SupEnds)> {
        let sock = self.sock()?;
        let (root, trees) = match &self.root {
            Some(ahead) => {
                // Normally said long before the request.
                // SAFETY: the channel's descriptor, open for the whole call.
                match channel::recv(unsafe { std::os::fd::BorrowedFd::borrow_raw(sock) })?.msg {
                    Some(CageMsg::Pivoted) => {}
                    _ => return Err(io::Error::other("the init ahead did not pivot into the root made ahead")),
                }
                // (Asked before anything is added to it.) A root that no longer serves (another
                // root, a source or a host mount changed since) is replaced whole: the init
                // pivots again, into the plan's root built now.
                let (part, trees) = match ahead.serves(RootKey::of(plan).as_ref()) {
                    true => ahead.plan_part(plan)?,
                    false => crate::mounts::Prepared::whole_part(plan)?,
                };
                (Some(Box::new(part)), trees)
            }
            None => (None, Vec::new()),
        };
        let msg = CageMsg::Plan { plan: Box::new(plan.clone()), landlock_abi: abi, feed_stdin, root };
        let raw: Vec<_> = trees.iter().map(AsRawFd::as_raw_fd).collect();
        channel::send(sock, &msg, &raw)?;
        // (The trees are the init's now: the spare's handles close here, with the root's.)
        drop(trees);
        drop(self.root.take());
        let mut ends = self.ends.take().ok_or_else(|| io::Error::other("the init was started"))?;
        if !feed_stdin {
            ends.stdin = None;
        }
        Ok((std::mem::replace(&mut self.pid, 0), ends))
    }
}

impl Drop for AheadInit {
    fn drop(&mut self) {
        if self.pid > 0 {
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
            let _ = waitpid(Pid::from_raw(self.pid), None);
        }
    }
}

/// A new network namespace, held by a descriptor only. The calling thread returns to its own
/// namespace before this returns; if it could not, the process would fork every later launch
/// from the wrong namespace, so it exits instead (a root thread re-entering the namespace it
/// came from has no reason to fail).
fn fresh_netns() -> io::Result<OwnedFd> {
    let own = File::open("/proc/thread-self/ns/net")?;
    unshare(CloneFlags::CLONE_NEWNET)?;
    let made = File::open("/proc/thread-self/ns/net");
    if let Err(e) = setns(&own, CloneFlags::CLONE_NEWNET) {
        eprintln!("chio: cannot return to the supervisor's own network namespace after making a cage's: {e}");
        std::process::exit(70);
    }
    Ok(OwnedFd::from(made?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn inode(p: &str) -> u64 {
        std::fs::metadata(p).map(|m| m.ino()).unwrap_or(0)
    }

    /// Each call makes a namespace of its own and leaves the calling thread where it was (the
    /// test runs as root, as the suite does).
    #[test]
    fn makes_distinct_namespaces_and_returns_home() {
        let home = inode("/proc/thread-self/ns/net");
        let a = Ahead::make(None, &|| false, None, &Hierarchy::detect(None));
        let b = Ahead::make(None, &|| false, None, &Hierarchy::detect(None));
        assert_eq!(inode("/proc/thread-self/ns/net"), home, "the thread must be back in its own namespace");
        let ino = |x: &Ahead| {
            let fd = x.netns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd).unwrap_or(-1);
            inode(&format!("/proc/self/fd/{fd}"))
        };
        assert_ne!(ino(&a), home);
        assert_ne!(ino(&b), home);
        assert_ne!(ino(&a), ino(&b), "every launch gets a namespace of its own");
        // The test harness runs several threads: a copy of such a process must not become an
        // init (it would run with another thread's locks held).
        assert!(sys::thread_count().unwrap() > 1);
        assert!(a.cgroup.is_some() && a.init.is_none(), "no init cloned from a multi-threaded process");
    }
}
