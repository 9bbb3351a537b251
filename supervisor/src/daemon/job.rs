//! One launch, in the launch child the launcher forked for it: the client's descriptors become
//! this process's 0, 1 and 2 (and, for an admin, its working directory), the client's variables
//! its environment (chio's own settings stay the daemon's: [`SETTINGS`]), and then it is exactly
//! `chio cage run` with the client's arguments — same parser, same checks, same output — with
//! the daemon's receipt store and key. The role's limits are applied before anything runs.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use chio_cage::Ahead;

use super::config::{Role, WorkspaceGrant};
use super::metrics::Reason;
use super::wire::Request;
use crate::launch::front::{self, Done};
use crate::launch::TeardownAt;
use crate::repository::git_source::ReadAs;
use crate::repository::operation::{self, Operation as RepositoryCommand};

/// What the daemon hands the launcher for one launch.
#[derive(Debug, Serialize, Deserialize)]
pub struct Job {
    /// The peer's role.
    pub role: Role,
    /// The peer's uid (for messages, and the owner of what it exports).
    pub uid: u32,
    /// The peer's primary gid.
    pub gid: u32,
    /// The peer's pid as SO_PEERCRED gave it at connect (0: not in this pid namespace). Its
    /// mount table describes the mounts of the files it passes ([`chio_cage::relay::stalls_for`]).
    pub pid: i32,
    /// The request.
    pub request: Request,
    /// The daemon's side: nothing here comes from the client.
    pub daemon: DaemonSide,
}

/// What the daemon decides about every launch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonSide {
    /// Imported images.
    pub state_dir: PathBuf,
    /// The receipt store (the daemon journals requests in it too).
    pub receipt_db: PathBuf,
    /// The kernel's signing seed; without one, launches are not receipted.
    pub kernel_key: Option<PathBuf>,
    /// Keys a launch policy must be signed by.
    pub policy_signers: Vec<String>,
    /// The workspaces this peer may use with the repository role (its grants).
    #[serde(default)]
    pub workspaces: Vec<WorkspaceGrant>,
}

/// An answer saying the launch could not be run, with cage run's cage-failure status.
pub fn failure(why: &str) -> String {
    refused(Reason::LaunchFailed, why, 125)
}

/// An answer refusing the request for `reason`, exiting `exit_code`.
pub fn refused(reason: Reason, why: &str, exit_code: i32) -> String {
    json!({"error": why, "reason": reason.word(), "exit_code": exit_code}).to_string()
}

/// A job's answer (JSON), and what its launch still has to tear down once that is sent.
pub struct Answered {
    /// The answer.
    pub text: String,
    /// The cage's teardown, left for after the answer.
    pub teardown: Option<chio_cage::Teardown>,
    /// The cage's root, if a root made ahead could serve it (the next launch probably has it
    /// too: see [`chio_cage::RootKey`]).
    pub root: Option<chio_cage::RootKey>,
    /// The request's id (none when the job could not be read).
    pub id: Option<String>,
    /// What the daemon is told with the answer (see [`super::answer::Told`]; the bytes sent are
    /// filled in once they are).
    pub told: super::answer::Told,
}

impl From<String> for Answered {
    fn from(text: String) -> Answered {
        Answered { text, teardown: None, root: None, id: None, told: Default::default() }
    }
}

/// Run the job `text` with the client's descriptors and what the launcher made `ahead`.
///
/// Everything up to `gate` is private to this process (the job read, the client's descriptors
/// taken, the arguments parsed and checked): the daemon sends "go" on it once the request's
/// journal entry has landed. EOF there means the request is withdrawn (the journal refused
/// it, or the daemon died): nothing has been done — not a byte written to the client — and
/// None is returned.
pub fn run(text: &[u8], client: Vec<OwnedFd>, gate: OwnedFd, ahead: Ahead) -> Option<Answered> {
    let job: Job = match serde_json::from_slice(text) {
        Ok(j) => j,
        Err(e) => return go(gate).then(|| failure(&format!("the launcher received a malformed job: {e}")).into()),
    };
    let id = job.request.id().to_string();
    run_job(&job, client, gate, ahead).map(|a| Answered { id: Some(id), ..a })
}

/// [`run`], once the job is read.
fn run_job(job: &Job, client: Vec<OwnedFd>, gate: OwnedFd, ahead: Ahead) -> Option<Answered> {
    if let Err(e) = take_client_side(job, client) {
        return go(gate).then(|| refused(Reason::ClientDescriptors, &e, 125).into());
    }
    let launch = match &job.request {
        Request::Repository { command, .. } => return go(gate).then(|| repository(job, (**command).clone(), ahead)),
        Request::Launch { launch, .. } => (**launch).clone(),
        Request::Ping { .. } => return go(gate).then(|| failure("a ping is not a job").into()),
    };
    let admitted = super::admit::launch(job.role, job.uid, &job.daemon, launch);
    let gate = Gate::new(gate);
    // A launch builds its cage while the entry is written and waits at the gate only before
    // its target goes on (see `launch::front::launch_request`); a policy's refusal writes a receipt,
    // so a policy launch waits here, as every refusal does.
    let builds_ahead = admitted.as_ref().is_ok_and(|a| a.request.policy.is_none());
    if !builds_ahead && !gate.open() {
        return None;
    }
    Some(match admitted {
        Ok(a) => launched(&a, ahead, builds_ahead.then_some(&|| gate.open()))?,
        Err(why) => refused(Reason::NotAdmitted, &why, 125).into(),
    })
}

/// Wait at the gate: true once the daemon says go, false at EOF (the request is withdrawn).
fn go(gate: OwnedFd) -> bool {
    Gate::new(gate).open()
}

/// The gate, waited at once and its answer kept.
struct Gate {
    fd: OwnedFd,
    said: std::cell::Cell<Option<bool>>,
}

impl Gate {
    fn new(fd: OwnedFd) -> Gate {
        Gate { fd, said: Default::default() }
    }

    /// True once the daemon says go, false at EOF (the request is withdrawn).
    fn open(&self) -> bool {
        if let Some(said) = self.said.get() {
            return said;
        }
        let mut b = [0u8; 1];
        let said = loop {
            match nix::unistd::read(&self.fd, &mut b) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r == Ok(1),
            }
        };
        self.said.set(Some(said));
        said
    }
}

/// Read a launch request once while waiting for a job: that touches the deserializer's code
/// and memory the fork shares with the launcher, which the job would otherwise pay for.
pub fn warm() {
    let line =
        br#"{"protocol":"chio.supervisor.v2","op":"launch","id":"warm","launch":{"options":{"argv":["/bin/true"]}}}"#;
    let _ = Request::parse(line);
}

/// `chio repository …` as the client asked, as far as its role allows (see [`super::grants`]).
/// An `execute` takes what the spare made `ahead` for its cage, and its answer names the cage's
/// root for the launcher (the next spare makes it ahead).
fn repository(job: &Job, command: RepositoryCommand, ahead: Ahead) -> Answered {
    let mut root = None;
    let mut cmd = command;
    if let Err(why) = super::admit::repository(job.role, job.uid, &job.daemon, &mut cmd) {
        return refused(Reason::NotAdmitted, &why, 77).into();
    }
    // The MCP server's answers are the client's stream, written as they come.
    if matches!(cmd, RepositoryCommand::Serve { .. }) {
        if let Err(e) = super::said::direct() {
            return failure(&format!("giving serve the client's stdout: {e}")).into();
        }
    }
    let status = match &cmd {
        RepositoryCommand::Export { state, out } if job.role == Role::Repository => exported_as_client(job, state, out),
        // A source is read with the client's rights, never the daemon's.
        _ => operation::run(&cmd, ahead, &mut root, Some(ReadAs { uid: job.uid, gid: job.gid })),
    };
    let text = json!({"exit_status": status, "record": null, "receipts": []}).to_string();
    Answered { root, ..text.into() }
}

/// A repository-role client's export, written with its own file system rights.
fn exported_as_client(job: &Job, state: &std::path::Path, out: &std::path::Path) -> i32 {
    match super::export_as::export(state, out, job.uid, job.gid) {
        Ok(r) => {
            println!("{}", operation::exported(&r, out));
            0
        }
        Err(e) => {
            eprintln!("chio: {e}");
            e.exit_code()
        }
    }
}

/// Descriptors and environment: the client's stdin (and cwd) become ours, its stdout and stderr
/// are held for the command's output and what this process says (see [`super::said`]).
fn take_client_side(job: &Job, client: Vec<OwnedFd>) -> Result<(), String> {
    let (want, env) = match &job.request {
        Request::Launch { fds, env, .. } | Request::Repository { fds, env, .. } => (*fds, env),
        Request::Ping { .. } => return Err("a ping carries no descriptors".into()),
    };
    if client.len() != want.count() {
        return Err(format!("the request announced {} descriptors and carried {}", want.count(), client.len()));
    }
    let mut it = client.into_iter();
    let (Some(out), Some(err)) = (it.next(), it.next()) else {
        return Err("the request carried no stdout and stderr".into());
    };
    let cwd = if want.cwd { it.next() } else { None };
    let stdin = if want.stdin { it.next() } else { None };
    for (name, fd) in [("stdout", Some(&out)), ("stderr", Some(&err)), ("stdin", stdin.as_ref())] {
        let peer = (job.pid > 0).then_some(job.pid);
        if let Some(kind) = fd.and_then(|f| chio_cage::relay::stalls_for(f.as_fd(), peer)) {
            return Err(stalling(name, &kind));
        }
    }
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    let taken = match &stdin {
        Some(f) => nix::unistd::dup2_stdin(f),
        None => nix::unistd::dup2_stdin(&null),
    };
    taken.map_err(|e| format!("taking the client's stdin: {e}"))?;
    super::said::take(out, err).map_err(|e| format!("taking the client's stdout and stderr: {e}"))?;
    // Only an admin's relative paths resolve in the client's directory; everyone else's launch
    // names no host path at all.
    match (cwd, job.role) {
        (Some(dir), Role::Admin) => {
            nix::unistd::fchdir(&dir).map_err(|e| format!("the client's working directory: {e}"))?
        }
        _ => std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?,
    }
    set_environment(env, &job.daemon);
    Ok(())
}

/// The refusal of a client's `name` descriptor that is `kind`, which poll cannot gate.
fn stalling(name: &str, kind: &str) -> String {
    format!(
        "the client's {name} is {kind}: a write or read there may never complete (a FUSE or NFS server \
         that does not answer holds the writer in the kernel, past SIGKILL), and would hold this launch \
         past its deadline; the supervisor takes only pipes, sockets, terminals, /dev/null, memfds and \
         files on local file systems (chio cage run --supervisor and chio repository --supervisor relay any other \
         themselves)"
    )
}

/// The variables chio reads as its own configuration in a launch process (and every
/// `CHIO_TEST_` switch): they stay the daemon's, and a client's value for one is dropped.
/// (`CHIO_OCI_CONFIG`, the OCI runtime's node configuration, is read by `chio oci` alone; a
/// client still may not set it for a launch process.)
const SETTINGS: [&str; 4] = ["CHIO_STATE_DIR", "CHIO_STAGING_DIR", "CHIO_CGROUP_V2_ROOT", "CHIO_OCI_CONFIG"];
/// Variables that are neither the client's nor the daemon's in a launch process: the client's
/// way to a daemon (a launch process holding it would send its launch to a daemon again).
const NEITHER: [&str; 1] = ["CHIO_SUPERVISOR"];

/// The client's variables — all of them, `CHIO_AUTH_TOKEN` and the like too, so that `--env
/// KEY` and a policy's admitted variables pass the client's value through, never the daemon's
/// — except chio's own settings, which stay the daemon's.
fn set_environment(client: &[(String, String)], daemon: &DaemonSide) {
    // (Nothing left to remove when the spare did it while it waited.)
    keep_only_chio_settings();
    for (k, v) in client {
        if !k.is_empty() && !k.contains('=') && !k.contains('\0') && !v.contains('\0') && travels(k) {
            // SAFETY (set_var): the launch child is single-threaded.
            std::env::set_var(k, v);
        }
    }
    std::env::set_var("CHIO_STATE_DIR", &daemon.state_dir);
}

/// Remove every variable of this process's environment but chio's own settings ([`SETTINGS`]):
/// the daemon's other variables — its credentials among them — are no business of a launch. A
/// spare does it while it waits for its job.
pub fn keep_only_chio_settings() {
    let others: Vec<OsString> = std::env::vars_os().map(|(k, _)| k).filter(|k| !is_chio_setting(k)).collect();
    for k in others {
        // SAFETY (remove_var): called in a launch child (a spare), which is single-threaded.
        std::env::remove_var(k);
    }
}

/// Whether a client's variable `k` becomes its launch's (all but chio's settings and the way to
/// a daemon: see [`SETTINGS`], [`NEITHER`]).
pub fn travels(k: &str) -> bool {
    !is_chio_setting(k.as_ref()) && !NEITHER.contains(&k)
}

fn is_chio_setting(k: &std::ffi::OsStr) -> bool {
    k.as_encoded_bytes().starts_with(b"CHIO_TEST_") || SETTINGS.iter().any(|s| k == *s)
}

/// A launch's answer, written straight from the record (through a `Value` tree, a record's few
/// KiB cost several times as much).
fn launch_answer(done: &Done) -> String {
    #[derive(Serialize)]
    struct LaunchAnswer<'a> {
        exit_status: i32,
        record: Option<&'a chio_cage::LaunchRecord>,
        receipts: &'a [String],
    }
    let l = done.launched.as_ref();
    let answer = LaunchAnswer {
        exit_status: done.status,
        record: l.map(|l| &l.record),
        receipts: l.map_or(&[][..], |l| &l.receipts[..]),
    };
    serde_json::to_string(&answer).unwrap_or_else(|e| failure(&format!("writing the launch's answer: {e}")))
}

/// Launch; the answer carries cage run's exit status, the record and the receipt ids. None when
/// `gate` withdrew the launch (its cage is torn down here, and nothing was written).
fn launched(a: &super::admit::Admitted, ahead: Ahead, gate: Option<chio_cage::Gate<'_>>) -> Option<Answered> {
    let receipts = a.receipts.as_ref().map(|(db, key)| (db.as_path(), key.as_path()));
    let flush = || {
        let _ = super::said::flush();
    };
    let client =
        super::said::client_outputs().map(|(stdout, stderr)| front::Client { stdout, stderr, before_output: &flush });
    let report = front::Report::default();
    let done = front::launch_request(&a.request, receipts, client, report, ahead, TeardownAt::Later, gate);
    if gate.is_some_and(|open| !open()) {
        if let Ok(Done { launched: Some(l), .. }) = done {
            if let Some(t) = l.teardown {
                let _ = t.finish();
            }
        }
        return None;
    }
    Some(match done {
        Ok(mut d) => {
            let teardown = d.launched.as_mut().and_then(|l| l.teardown.take());
            let root = d.launched.as_ref().and_then(|l| l.root.clone());
            let told = super::answer::Told {
                sent: 0,
                exec_observed_ns: d.launched.as_ref().and_then(|l| exec_observed_at(&l.record)),
                receipt_writes_us: d.receipt_writes.iter().map(|w| w.as_micros() as u64).collect(),
            };
            Answered { text: launch_answer(&d), teardown, root, id: None, told }
        }
        Err(e) => {
            eprintln!("chio: {e:#}");
            json!({"exit_status": 125, "record": Value::Null, "receipts": []}).to_string().into()
        }
    })
}

/// When the record's target was observed at its exec, on `CLOCK_MONOTONIC` (ns): the record
/// keeps it as µs from its launch's start, whose clock (an `Instant`) reads that clock.
fn exec_observed_at(rec: &chio_cage::LaunchRecord) -> Option<u64> {
    let after_start = rec.timings_us.get("exec_observed")?.checked_mul(1000)?;
    let since_start = u64::try_from(rec.clock?.elapsed().as_nanos()).ok()?;
    super::answer::monotonic_ns().checked_sub(since_start)?.checked_add(after_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `CHIO_` variable the code names is sorted: a setting that stays the daemon's, a
    /// test switch, the client's way to a daemon, or one of the edge's credentials (the client's,
    /// like any other variable). A new setting must join [`SETTINGS`] — or a client could set it
    /// for the daemon's launch process — and this test fails until it is sorted.
    #[test]
    fn every_chio_variable_the_code_names_is_sorted() {
        const CLIENTS: [&str; 4] =
            ["CHIO_AUTH_TOKEN", "CHIO_ADMIN_TOKEN", "CHIO_CONTROL_TOKEN", "CHIO_REMOTE_AUTHORITY_WORKLOAD_TOKEN"];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut named = std::collections::BTreeSet::new();
        for dir in ["cli/src", "cage/src", "supervisor/src", "kernel/src"] {
            let mut stack = vec![root.join(dir)];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "rs") {
                        let text = std::fs::read_to_string(&p).unwrap();
                        for (i, _) in text.match_indices("\"CHIO_") {
                            let name: String = text[i + 1..]
                                .chars()
                                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                                .collect();
                            named.insert(name);
                        }
                    }
                }
            }
        }
        assert!(named.contains("CHIO_STATE_DIR") && named.contains("CHIO_AUTH_TOKEN"), "{named:?}");
        let unsorted: Vec<&String> = named
            .iter()
            .filter(|n| n.as_str() != "CHIO_" && n.as_str() != "CHIO_TEST_")
            .filter(|n| !is_chio_setting(n.as_ref()) && !NEITHER.contains(&n.as_str()))
            .filter(|n| !CLIENTS.contains(&n.as_str()))
            .collect();
        assert!(unsorted.is_empty(), "CHIO_ variables neither settings nor the client's: {unsorted:?}");
    }

    /// A client's settings and way to a daemon are dropped; its other variables, `CHIO_` ones
    /// too, become the launch process's.
    #[test]
    fn the_clients_variables_but_settings_are_the_launch_processes() {
        for (k, setting) in [
            ("CHIO_STATE_DIR", true),
            ("CHIO_TEST_HOOK", true),
            ("CHIO_CGROUP_V2_ROOT", true),
            ("CHIO_AUTH_TOKEN", false),
            ("PATH", false),
        ] {
            assert_eq!(is_chio_setting(k.as_ref()), setting, "{k}");
        }
        assert!(!travels("CHIO_SUPERVISOR") && !travels("CHIO_STATE_DIR"));
        assert!(travels("CHIO_AUTH_TOKEN") && travels("HOME"));
    }
}
