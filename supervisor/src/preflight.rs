//! `chio security preflight`: can this host enforce? Each probe is one finding with a severity
//! and its context; the worst finding is the exit status (0 ok, info or warning; 1 error;
//! 2 fatal: this host cannot build a cage at all).
//!
//! The platform probe asks the kernel for each mechanism the cage uses and then proves it the
//! only way that counts: a trial cage (`/bin/true` on the host's system directories) launched to
//! the exec observation and killed there, before the target runs.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use chio_cage::cgroup::Hierarchy;
use chio_cage::{CagePlan, LaunchRecord, State};

use crate::launch::{self, How, Io, Prepared, Receipts};
use serde::Serialize;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// As required.
    Ok,
    /// Worth knowing; nothing to do.
    Info,
    /// Works, but weaker than it could be.
    Warning,
    /// A requirement is not met.
    Error,
    /// Nothing can be enforced on this host.
    Fatal,
}

impl Severity {
    /// The exit status a run whose worst finding is this one ends with.
    pub fn exit_code(self) -> i32 {
        match self {
            Severity::Ok | Severity::Info | Severity::Warning => 0,
            Severity::Error => 1,
            Severity::Fatal => 2,
        }
    }
}

/// One probe's result.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// `security.platform`, `security.bearer_roles`, `security.native_launch`,
    /// `security.durable_stores`.
    pub probe: &'static str,
    /// How bad.
    pub severity: Severity,
    /// One line an operator can act on.
    pub summary: String,
    /// What was checked and what was found.
    pub context: BTreeMap<String, String>,
    /// Every problem found, in the order found, the summary's among them: a lesser one found
    /// beside a worse is still said.
    pub problems: Vec<Problem>,
}

/// One problem a probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// How bad.
    pub severity: Severity,
    /// What to act on.
    pub summary: String,
}

impl Finding {
    /// A finding with no context yet (a warning or worse is its first problem).
    pub fn new(probe: &'static str, severity: Severity, summary: impl Into<String>) -> Finding {
        let summary = summary.into();
        let problems = if severity >= Severity::Warning {
            vec![Problem { severity, summary: summary.clone() }]
        } else {
            Vec::new()
        };
        Finding { probe, severity, summary, context: BTreeMap::new(), problems }
    }

    fn note(&mut self, key: &str, value: impl Into<String>) {
        self.context.insert(key.to_string(), value.into());
    }

    /// Record a problem of severity `s` and raise the finding's to it (never lower it); the
    /// summary is the first problem of the worst level.
    pub fn raise(&mut self, s: Severity, summary: impl Into<String>) {
        let summary = summary.into();
        if s > self.severity {
            self.severity = s;
            self.summary.clone_from(&summary);
        }
        self.problems.push(Problem { severity: s, summary });
    }

    /// The problems other than the one the summary says.
    pub fn others(&self) -> impl Iterator<Item = &Problem> {
        let mut said = false;
        self.problems.iter().filter(move |p| {
            let this = !said && p.severity == self.severity && p.summary == self.summary;
            said |= this;
            !this
        })
    }
}

/// The minimum landlock ABI for enforced launches (network rules and scoping need 4 and up).
pub const MIN_LANDLOCK_ABI: u32 = 4;

/// `security.platform`: kernel, landlock, seccomp, no_new_privs, the fd and exec syscalls the
/// launch uses, cgroups, ptrace, and a trial cage.
pub fn platform(require_enforcement: bool) -> Finding {
    let mut f = Finding::new("security.platform", Severity::Ok, "this host can build and observe a cage");
    f.note("kernel", nix::sys::utsname::uname().map_or("?".into(), |u| u.release().to_string_lossy().into_owned()));
    let abi = chio_cage::landlock::abi();
    f.note("landlock_abi", abi.to_string());
    if abi < MIN_LANDLOCK_ABI {
        let s = if require_enforcement { Severity::Error } else { Severity::Warning };
        f.raise(s, format!("landlock ABI {abi}: enforced launches need {MIN_LANDLOCK_ABI} or later (kernel 6.7+)"));
    }
    syscalls(&mut f);
    // The trial and the cgroup check take the operator's settings (`CHIO_CGROUP_V2_ROOT`, the
    // staging directory) as every launch does.
    let mut plan = CagePlan::new(vec![OsString::from("/bin/true")]);
    if let Err(e) = crate::launch_plan::apply_environment_overrides(&mut plan) {
        f.raise(Severity::Fatal, format!("the environment's launch settings: {e}"));
        return f;
    }
    let hierarchy = Hierarchy::detect(plan.cgroup_v2_root.as_deref());
    cgroups(&mut f, &hierarchy);
    if plan.cgroup_v2_root.is_none() && hierarchy != Hierarchy::V1 {
        delegation(&mut f);
    }
    ptrace_scope(&mut f);
    if let Some(needs) = needs_root(&plan) {
        f.note("trial_launch", "not run: needs root");
        f.raise(Severity::Warning, needs);
        return f;
    }
    let rec = trial_launch(&Prepared::of(plan));
    f.note("trial_launch", format!("{:?}", rec.state));
    if rec.state != State::FullyEnforced {
        let why =
            rec.failure.as_ref().map_or(String::new(), |x| format!(": {} at {}: {}", x.code, x.stage.name(), x.detail));
        f.raise(Severity::Fatal, format!("a trial cage did not reach FullyEnforced{why}"));
    }
    f
}

/// The syscalls a launch needs, each asked of the kernel.
fn syscalls(f: &mut Finding) {
    // SAFETY: a prctl query with no pointers (raw: nix has no seccomp-mode getter).
    let seccomp = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    let nnp = nix::sys::prctl::get_no_new_privs().map_or(-1, i32::from);
    f.note("seccomp_mode_of_chio", seccomp.to_string());
    f.note("no_new_privs_of_chio", nnp.to_string());
    if seccomp < 0 {
        f.raise(Severity::Fatal, "seccomp is not available in this kernel");
    } else if seccomp == 2 {
        f.raise(
            Severity::Warning,
            "chio itself runs under a seccomp filter: it may refuse what a cage needs (ptrace, clone3)",
        );
    }
    let pidfd = chio_cage::sys::pidfd_open(std::process::id() as libc::pid_t);
    f.note("pidfd_open", if pidfd.is_ok() { "yes" } else { "no" });
    let root = std::fs::File::open("/");
    let openat2 = root.as_ref().ok().map(|r| chio_cage::sys::openat2(r.as_fd(), c".", libc::O_PATH, 0, 0x04));
    f.note("openat2", if matches!(openat2, Some(Ok(_))) { "yes" } else { "no" });
    // SAFETY: close_range over descriptors this process cannot have; execveat on fd -1 fails
    // with EBADF where it exists (ENOSYS where not), executing nothing.
    let (close_range, execveat) = unsafe {
        let c = libc::syscall(libc::SYS_close_range, u32::MAX - 1, u32::MAX, 0);
        let argv: [*const libc::c_char; 1] = [std::ptr::null()];
        let e = libc::syscall(libc::SYS_execveat, -1, c"".as_ptr(), argv.as_ptr(), argv.as_ptr(), libc::AT_EMPTY_PATH);
        (c == 0, e == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF))
    };
    // The supervisor seizes the target by the pid its hello carried and checks it against the
    // pidfd that came with it (SCM_PIDFD); the status channel refuses to open without one.
    let scm_pidfd = chio_cage::channel::pair().is_ok();
    f.note("scm_pidfd", if scm_pidfd { "yes" } else { "no" });
    f.note("close_range", if close_range { "yes" } else { "no" });
    f.note("execveat_empty_path", if execveat { "yes" } else { "no" });
    for (name, ok) in [
        ("pidfd_open", pidfd.is_ok()),
        ("openat2", matches!(openat2, Some(Ok(_)))),
        ("close_range", close_range),
        ("execveat(AT_EMPTY_PATH)", execveat),
        ("SCM_PIDFD", scm_pidfd),
    ] {
        if !ok && seccomp == 2 && !nix::unistd::geteuid().is_root() {
            // A user's service under its unit's filter (systemd's RestrictSUIDSGID= takes openat2
            // away) launches nothing itself: what its filter hides says nothing of the root
            // daemon's launches, which chio-preflight.service proves.
            f.raise(
                Severity::Warning,
                format!(
                    "{name} is not available to this process, which runs under a seccomp filter (its unit's?): a \
                     launch needs it, and launches are root's, proven by its own preflight"
                ),
            );
        } else if !ok {
            f.raise(Severity::Fatal, format!("{name} is not available: a launch needs it"));
        }
    }
}

/// The cgroup version and the controllers the ceilings need, judged as a launch judges them.
fn cgroups(f: &mut Finding, hierarchy: &Hierarchy) {
    let missing = hierarchy.unavailable();
    f.note("cgroup_controllers_missing", format!("{missing:?}"));
    match hierarchy {
        Hierarchy::V2(root) => {
            f.note("cgroup", "v2");
            f.note("cgroup_root", root.display().to_string());
            f.note("cgroup_controllers", chio_cage::cgroup::v2_offered(root));
            if !missing.is_empty() {
                let parent = root.parent().unwrap_or(root);
                f.raise(
                    Severity::Error,
                    format!("cgroup v2 controllers {missing:?} are not delegated to {}", parent.display()),
                );
            }
        }
        Hierarchy::V1 => {
            f.note("cgroup", "v1");
            if !missing.is_empty() {
                f.raise(Severity::Error, format!("cgroup v1 hierarchies {missing:?} are not mounted"));
            }
        }
    }
}

/// Whether the launch cgroups go inside this process's service unit (a delegated cgroup v2
/// subtree) or outside it, where its manager neither counts nor ends the cages.
fn delegation(f: &mut Finding) {
    use chio_cage::cgroup::{own_v2_cgroup, Delegation};
    if let Some(d) = Delegation::find() {
        f.note("cgroup_delegated", d.dir.display().to_string());
        return;
    }
    f.note("cgroup_delegated", "no");
    // The root cgroup is no unit's.
    if let Some(own) = own_v2_cgroup().filter(|o| o != std::path::Path::new("/sys/fs/cgroup")) {
        f.raise(
            Severity::Warning,
            format!(
                "launch cgroups go under /sys/fs/cgroup/chio, outside this process's cgroup {}: the service manager \
                 that put it there neither counts nor ends its cages (Delegate=yes on a root unit puts them inside)",
                own.display()
            ),
        );
    }
}

/// Yama's ptrace_scope: 3 forbids ptrace altogether, and the exec observation is ptrace.
fn ptrace_scope(f: &mut Finding) {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().map(|s| s.trim().to_string());
    f.note("yama_ptrace_scope", scope.clone().unwrap_or_else(|| "absent".into()));
    if scope.as_deref() == Some("3") {
        f.raise(Severity::Fatal, "Yama ptrace_scope is 3: the exec observation (ptrace) is impossible");
    }
}

/// As a user other than root, what a trial of `plan` would need and this process lacks, in words
/// (None as root: there a missing capability is the unit's doing and fails the trial, as it
/// would fail every launch). Unprivileged, preflight checks the kernel's mechanisms and the
/// material; the trial cage is root's (chio-preflight.service runs it at boot).
pub fn needs_root(plan: &CagePlan) -> Option<String> {
    if nix::unistd::geteuid().is_root() {
        return None;
    }
    let missing = match chio_cage::missing_supervisor_capabilities(plan) {
        Ok(m) => m.join(", "),
        Err(e) => e,
    };
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "not proven as uid {}: the trial cage needs root ({} for namespaces, mounts, the exec observation and the \
         target's identity); only the kernel's mechanisms were checked here — run preflight as root (chio-preflight.service \
         does at boot) for the trial",
        nix::unistd::geteuid(),
        missing
    ))
}

/// Launch `p` to the exec observation and stop it there: the target never runs. Returns the
/// record as it stood at the exec stop (its state is what the launch would have reached).
pub fn trial_launch(p: &Prepared) -> LaunchRecord {
    // The target never runs, so it never writes: stderr stands for both streams.
    let err = std::io::stderr();
    let io = Io { stdout: err.as_fd(), stderr: err.as_fd(), stdin: None };
    launch::run(p, io, Receipts::Trial, How::default()).record
}

/// The credential variables of the edge's roles.
pub const BEARER_ROLES: [&str; 4] =
    ["CHIO_AUTH_TOKEN", "CHIO_ADMIN_TOKEN", "CHIO_CONTROL_TOKEN", "CHIO_REMOTE_AUTHORITY_WORKLOAD_TOKEN"];

/// `security.bearer_roles`: each role's token, from `get` (the environment): empty, padded, with
/// control characters, or shared by two roles is an error; none set is info. Values are never
/// printed.
pub fn bearer_roles(get: impl Fn(&str) -> Option<OsString>) -> Finding {
    let mut f = Finding::new("security.bearer_roles", Severity::Ok, "every role's token is well-formed and its own");
    let mut seen: Vec<(&str, OsString)> = Vec::new();
    for role in BEARER_ROLES {
        let Some(v) = get(role) else { continue };
        let text = v.to_string_lossy();
        let problem = if v.is_empty() {
            Some("set but empty")
        } else if text.trim() != text {
            Some("padded with whitespace")
        } else if text.chars().any(char::is_control) {
            Some("holds control characters")
        } else if v.to_str().is_none() {
            Some("not UTF-8")
        } else {
            None
        };
        f.note(role, problem.unwrap_or("set").to_string());
        if let Some(p) = problem {
            f.raise(Severity::Error, format!("{role} is {p}"));
        }
        if let Some((other, _)) = seen.iter().find(|(_, w)| *w == v && !v.is_empty()) {
            f.raise(Severity::Error, format!("{role} and {other} share one value: each role needs its own token"));
        }
        seen.push((role, v));
    }
    if seen.is_empty() {
        f.severity = Severity::Info;
        f.summary = "no bearer-role token is set".into();
    }
    f
}

/// A store not made yet: fine on a fresh install when its directory is there and only root (or
/// this user) can write in it — the first receipted launch creates it. A directory others can
/// write would let one of them put a store of their making there first.
fn new_store(p: &Path, maker: &str) -> (Severity, String) {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return (Severity::Error, "absent".into());
    };
    match std::fs::symlink_metadata(dir) {
        Err(e) => (Severity::Error, format!("absent, and so is its directory {} ({e})", dir.display())),
        Ok(m) if !m.is_dir() => (Severity::Error, format!("absent, and {} is not a directory", dir.display())),
        Ok(m) if m.uid() != 0 && m.uid() != nix::unistd::geteuid().as_raw() => (
            Severity::Error,
            format!(
                "absent, and its directory {} belongs to uid {}: it could put a store there first",
                dir.display(),
                m.uid()
            ),
        ),
        Ok(m) if m.mode() & 0o022 != 0 => (
            Severity::Error,
            format!(
                "absent, and its directory {} is writable by others: one of them could put a store there first",
                dir.display()
            ),
        ),
        Ok(_) => (Severity::Info, format!("new: not created yet; {maker} creates it in {}", dir.display())),
    }
}

/// `security.durable_stores`: each receipt store opened read-only and checked (`quick_check`,
/// journal mode, application id and schema version), and each session store (another service's
/// SQLite database) the same way but for what is the service's own choice: its schema and its
/// journal mode.
pub fn durable_stores(receipts: &[PathBuf], sessions: &[PathBuf]) -> Finding {
    let mut f = Finding::new("security.durable_stores", Severity::Ok, "every named store is healthy");
    if receipts.is_empty() && sessions.is_empty() {
        f.severity = Severity::Info;
        f.summary = "no store named (--receipt-db, --session-db)".into();
    }
    let checks = receipts.iter().map(|p| (p, store_health(p))).chain(sessions.iter().map(|p| (p, session_health(p))));
    for (p, (s, what)) in checks {
        let key = p.display().to_string();
        f.note(&key, what.clone());
        f.raise(s, format!("{key}: {what}"));
    }
    f
}

/// A session store: there (or new, as a receipt store), a regular file, an SQLite database that
/// passes `quick_check`. (A journal mode that would not survive a crash, `off` or `memory`,
/// lasts one connection only: at rest there is none to see.)
fn session_health(p: &Path) -> (Severity, String) {
    match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return new_store(p, "its service");
        }
        Err(e) => return (Severity::Error, format!("unreadable: {e}")),
        Ok(m) if !m.is_file() => return (Severity::Error, "not a regular file".into()),
        Ok(_) => {}
    }
    match chio_kernel::store::Store::sqlite_health(p) {
        Err(e) => (Severity::Error, format!("unreadable or not SQLite: {e}")),
        Ok(h) if h.quick_check != "ok" => (Severity::Error, format!("corrupt: quick_check says {}", h.quick_check)),
        Ok(h) => {
            (Severity::Ok, format!("healthy session store (journal {}, schema {})", h.journal_mode, h.user_version))
        }
    }
}

fn store_health(p: &Path) -> (Severity, String) {
    match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return new_store(p, "the first receipted launch"),
        Err(e) => return (Severity::Error, format!("unreadable: {e}")),
        Ok(m) if !m.is_file() => return (Severity::Error, "not a regular file".into()),
        Ok(_) => {}
    }
    let store = match chio_kernel::store::Store::open_read_only(p) {
        Ok(s) => s,
        Err(e) => return (Severity::Error, format!("unreadable or foreign: {e}")),
    };
    match store.health() {
        Err(e) => (Severity::Error, format!("corrupt: {e}")),
        Ok(h) if h.quick_check != "ok" => (Severity::Error, format!("corrupt: quick_check says {}", h.quick_check)),
        Ok(h) if h.journal_mode != "wal" => {
            (Severity::Warning, format!("healthy, but journal mode {} (chio writes wal)", h.journal_mode))
        }
        Ok(h) => (Severity::Ok, format!("healthy (schema {}, journal {})", h.user_version, h.journal_mode)),
    }
}

/// The worst severity of `findings`.
pub fn worst(findings: &[Finding]) -> Severity {
    findings.iter().map(|f| f.severity).max().unwrap_or(Severity::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_roles_name_each_problem_without_printing_values() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
        };
        assert_eq!(bearer_roles(env(&[])).severity, Severity::Info);
        let ok = bearer_roles(env(&[("CHIO_AUTH_TOKEN", "a1"), ("CHIO_ADMIN_TOKEN", "b2")]));
        assert_eq!(ok.severity, Severity::Ok);
        for (pairs, why) in [
            (&[("CHIO_AUTH_TOKEN", "")][..], "empty"),
            (&[("CHIO_AUTH_TOKEN", " t")][..], "padded"),
            (&[("CHIO_ADMIN_TOKEN", "t\u{7}x")][..], "control"),
            (&[("CHIO_AUTH_TOKEN", "same"), ("CHIO_CONTROL_TOKEN", "same")][..], "share one value"),
        ] {
            let pairs: &'static [(&'static str, &'static str)] = Box::leak(pairs.to_vec().into_boxed_slice());
            let f = bearer_roles(env(pairs));
            assert_eq!(f.severity, Severity::Error, "{pairs:?}");
            assert!(f.summary.contains(why), "{}", f.summary);
            let shown = serde_json::to_string(&f).unwrap();
            assert!(!shown.contains("same") || why != "share one value", "a value was printed: {shown}");
        }
    }

    #[test]
    fn a_lesser_problem_beside_a_worse_is_still_said() {
        let mut f = Finding::new("p", Severity::Ok, "fine");
        f.raise(Severity::Warning, "w1");
        f.raise(Severity::Error, "e1");
        f.raise(Severity::Warning, "w2");
        f.raise(Severity::Error, "e2");
        assert_eq!((f.severity, f.summary.as_str()), (Severity::Error, "e1"));
        let others: Vec<&str> = f.others().map(|p| p.summary.as_str()).collect();
        assert_eq!(others, ["w1", "w2", "e2"]);
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["problems"].as_array().map(Vec::len), Some(4), "{json}");
        let two = durable_stores(&[PathBuf::from("/nonexistent/a.db"), PathBuf::from("/")], &[]);
        assert_eq!(two.others().map(|p| p.summary.as_str()).collect::<Vec<_>>(), ["/: not a regular file"]);
    }

    #[test]
    fn exit_codes_follow_the_worst_finding() {
        let f = |s| Finding::new("p", s, "");
        assert_eq!(worst(&[f(Severity::Ok), f(Severity::Warning)]).exit_code(), 0);
        assert_eq!(worst(&[f(Severity::Info), f(Severity::Error)]).exit_code(), 1);
        assert_eq!(worst(&[f(Severity::Fatal), f(Severity::Error)]).exit_code(), 2);
    }
}
