//! One launch, whichever road it comes by. `chio cage run`, the daemon's launch process, the
//! repository leg, a session's worker and preflight's trial each describe what they want as a
//! [`LaunchRequest`] and go through the same two steps:
//!
//! 1. [`prepare`]: the request becomes a cage plan — from its options, or under its signed
//!    policy (admitted, or refused with every violation named and, with a store, a signed
//!    `denial` receipt);
//! 2. [`run`]: the cage is built and the target observed at its exec; with receipts, the
//!    enforcement receipt is durable at the exec stop, before the target's first instruction,
//!    and the terminal receipt follows its end.
//!
//! Between the two the caller says what it must before the command's output starts (a note on
//! an unwritable workspace); after, it reports the [`Launched`] its own way (a record on stderr,
//! a daemon's answer, a signed transition). Nothing here prints.

pub mod front;
mod policy;
pub(crate) mod receipts;

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::Path;

use chio_cage::{Ahead, CagePlan, Gate, LaunchRecord, RootKey, Sinks, State, Teardown};
use chio_kernel::keys::SigningKey;
use chio_kernel::store::{Appended, Store};
use serde::{Deserialize, Serialize};

use crate::launch_plan::{self, PlanOptions};
pub use policy::{admitted_plan, check, Checked, PolicyLaunch};
pub use receipts::LaunchReceipts;

/// What to launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    /// The plan's options (with a policy: only the command and the workspace).
    pub options: PlanOptions,
    /// Launch under this signed policy instead: exactly the plan it admits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyLaunch>,
    /// Feed the caller's stdin to the command through a pipe (else the cage's `/dev/null`).
    #[serde(default)]
    pub interactive: bool,
}

impl LaunchRequest {
    /// A request for `options`, without a policy, stdin the cage's `/dev/null`.
    pub fn new(options: PlanOptions) -> LaunchRequest {
        LaunchRequest { options, policy: None, interactive: false }
    }
}

/// Why a launch could not be prepared or recorded (the message says what to change).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The plan could not be built from the options.
    #[error("{0}")]
    Plan(String),
    /// The policy or manifest did not verify.
    #[error("{0}")]
    Policy(String),
    /// The receipt store or key could not be used.
    #[error("{0}")]
    Receipts(String),
    /// Anything else that stopped the launch (the words say what).
    #[error("{0}")]
    Failed(String),
}

impl From<launch_plan::PlanError> for LaunchError {
    fn from(e: launch_plan::PlanError) -> LaunchError {
        LaunchError::Plan(e.0)
    }
}

/// A launch ready to run: its plan, and the hold on its image (kept until the launch is over:
/// `chio image rm` refuses an image in use).
pub struct Prepared {
    /// The cage plan.
    pub plan: CagePlan,
    _image_hold: Option<File>,
}

impl Prepared {
    /// A plan built elsewhere (preflight's platform trial).
    pub fn of(plan: CagePlan) -> Prepared {
        Prepared { plan, _image_hold: None }
    }

    /// The note to give before the run when the command's uid and gid cannot write the workspace
    /// (the cage has no capability to override file permissions): the command would otherwise
    /// fail inside with EACCES and nobody would know why.
    pub fn workspace_note(&self) -> Option<String> {
        let ws = self.plan.workspace.as_deref()?;
        unwritable(ws, self.plan.uid, self.plan.gid)
    }
}

/// A policy's refusal of the launch: nothing ran.
#[derive(Debug)]
pub struct Refusal {
    /// The refusing policy.
    pub policy_id: String,
    /// Every violation, admission's and the launch's.
    pub violations: Vec<String>,
    /// The signed `denial` receipt, when the launch had a store.
    pub denial_receipt: Option<String>,
}

/// Build the plan the request asks for, or the policy's refusal of it (recorded as a signed
/// `denial` receipt in `receipts`, when given).
pub fn prepare(
    req: &LaunchRequest,
    receipts: Option<&mut LaunchReceipts>,
) -> Result<Result<Prepared, Refusal>, LaunchError> {
    let Some(p) = &req.policy else {
        let planned = launch_plan::build(&req.options)?;
        return Ok(Ok(Prepared { plan: planned.plan, _image_hold: planned.image_hold }));
    };
    let c = check(&req.options, p)?;
    match &c.admitted {
        Ok(admitted) => {
            let (plan, hold) = admitted_plan(&req.options, p, &c, admitted)?;
            Ok(Ok(Prepared { plan, _image_hold: hold }))
        }
        Err(violations) => {
            let denial_receipt = match receipts {
                Some(r) => Some(
                    r.denial(&c.manifest.server_id, &c.policy.policy_id, &c.digest, violations)
                        .map_err(|e| LaunchError::Receipts(format!("recording the denial receipt: {e}")))?,
                ),
                None => None,
            };
            Ok(Err(Refusal { policy_id: c.policy.policy_id.clone(), violations: violations.clone(), denial_receipt }))
        }
    }
}

/// Where the command's streams go: the caller's descriptors (a pipe, a terminal, a file, a
/// daemon client's own). The command never gets them itself: chio passes its output through.
pub struct Io<'a> {
    /// Receives the command's stdout.
    pub stdout: BorrowedFd<'a>,
    /// Receives the command's stderr.
    pub stderr: BorrowedFd<'a>,
    /// Fed to the command's stdin through a pipe (an interactive request only).
    pub stdin: Option<BorrowedFd<'a>>,
}

/// Where the launch's receipts go.
pub enum Receipts<'a> {
    /// None: the launch is not receipted.
    Off,
    /// The enforcement receipt at the exec stop and the terminal receipt after the end (`chio
    /// cage run --receipt-db`, the daemon).
    Launch(&'a mut LaunchReceipts),
    /// The enforcement receipt at the exec stop only: the caller appends the terminal receipt
    /// together with its own (the repository leg's transition).
    Enforcement {
        /// The store.
        store: &'a mut Store,
        /// The kernel key.
        key: &'a SigningKey,
    },
    /// A trial: the launch stops at the exec observation, its target never runs, and the record
    /// is the one of that moment (preflight).
    Trial,
}

/// When a launch's teardown — the cage init's exit, which ends its namespaces, and the launch
/// cgroup's removal — happens.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TeardownAt {
    /// Before the record is reported, which then says whether the cgroup was removed: the
    /// one-shot form.
    First,
    /// After: the daemon answers its client as soon as the command is over (every cage
    /// process is gone and its output drained) and winds the cage down afterwards.
    Later,
}

/// How a caller runs the launch beyond its request.
pub struct How<'a> {
    /// What a long-lived supervisor made before the request (empty for the one-shot form).
    pub ahead: Ahead,
    /// When the cage is torn down.
    pub teardown: TeardownAt,
    /// Asked before the target goes on towards its exec (the daemon's journal): false withdraws
    /// the launch — its target killed before it ran, no receipt — and nothing is to be reported.
    pub gate: Option<Gate<'a>>,
}

impl Default for How<'_> {
    fn default() -> Self {
        How { ahead: Ahead::default(), teardown: TeardownAt::First, gate: None }
    }
}

/// A launch's end: the status to exit with, the record, the receipts.
pub struct Launched {
    /// `chio cage run`'s exit status: the command's, 128+N for signal N, 125/126/127 when the
    /// cage failed, 125 when its receipts could not be written.
    pub status: i32,
    /// The launch record.
    pub record: LaunchRecord,
    /// The gate withdrew the launch: its target was killed before it ran, nothing was
    /// recorded, and nothing is to be reported.
    pub withdrawn: bool,
    /// The ids of the receipts written for it.
    pub receipts: Vec<String>,
    /// With [`Receipts::Enforcement`]: the enforcement receipt, for the caller's terminal one.
    pub enforcement: Option<Appended>,
    /// Why its receipts could not be written, when they could not (the record stands).
    pub unrecorded: Option<String>,
    /// What is left to do after the command's end, with [`TeardownAt::Later`].
    pub teardown: Option<Teardown>,
    /// The cage's root, when a root made ahead could serve a launch like it (see
    /// [`RootKey::of`]): the next launch will likely have it too.
    pub root: Option<RootKey>,
    /// The command's stderr, as passed through, did not end with a newline.
    pub stderr_mid_line: bool,
}

/// Run a prepared launch to its end.
pub fn run(p: &Prepared, io: Io<'_>, mut receipts: Receipts<'_>, how: How<'_>) -> Launched {
    let mut enforced: Option<Appended> = None;
    let mut at_exec: Option<LaunchRecord> = None;
    let trial = matches!(receipts, Receipts::Trial);
    let (mut rec, left, stderr_mid_line) = {
        // At the exec stop, once every fact holds and before the target runs one instruction:
        // evidence that cannot be recorded means no launch.
        let mut on_exec = |r: &LaunchRecord| -> Result<(), String> {
            let recorded = match &mut receipts {
                Receipts::Off => return Ok(()),
                Receipts::Trial => {
                    at_exec = Some(r.clone());
                    return Err("preflight: a trial launch stops at the exec observation".into());
                }
                Receipts::Launch(rc) => rc.enforcement(r),
                Receipts::Enforcement { store, key } => {
                    crate::receipts::enforcement(store, key, r).map_err(|e| e.to_string())
                }
            };
            enforced = Some(recorded.map_err(|e| format!("recording the enforcement receipt: {e}"))?);
            Ok(())
        };
        let mut sinks = Sinks::new(io.stdout, io.stderr);
        sinks.stdin = io.stdin;
        sinks.ahead = how.ahead;
        sinks.gate = how.gate;
        sinks.on_enforced = Some(&mut on_exec);
        let (rec, left) = chio_cage::launch_to_end(&p.plan, &mut sinks);
        (rec, left, sinks.stderr_mid_line)
    };
    if how.gate.is_some_and(|open| !open()) {
        return Launched {
            status: 125,
            record: rec,
            withdrawn: true,
            receipts: Vec::new(),
            enforcement: None,
            unrecorded: None,
            teardown: Some(left),
            root: None,
            stderr_mid_line,
        };
    }
    let teardown = match how.teardown {
        TeardownAt::First => {
            left.finish_into(&mut rec);
            None
        }
        TeardownAt::Later => Some(left),
    };
    if let Some(r) = at_exec {
        rec = r;
    }
    let (mut ids, mut unrecorded) = (Vec::new(), None);
    match &mut receipts {
        Receipts::Off | Receipts::Trial => {}
        Receipts::Launch(rc) => match rc.finish(&rec, enforced.take()) {
            Ok(written) => ids = written,
            Err(e) => unrecorded = Some(e),
        },
        Receipts::Enforcement { store, key } if enforced.is_none() => {
            match crate::receipts::enforcement(store, key, &rec) {
                Ok(a) => enforced = Some(a),
                Err(e) => unrecorded = Some(e.to_string()),
            }
        }
        Receipts::Enforcement { .. } => {}
    }
    let status = if unrecorded.is_some() { 125 } else { rec.exit_status() };
    let root = if trial { None } else { RootKey::of(&p.plan) };
    Launched {
        status,
        record: rec,
        withdrawn: false,
        receipts: ids,
        enforcement: enforced,
        unrecorded,
        teardown,
        root,
        stderr_mid_line,
    }
}

/// The words for a record whose receipts could not be written: whether the command ran.
pub fn unrecorded_words(rec: &LaunchRecord) -> &'static str {
    match rec.state {
        State::FullyEnforced | State::NotConfined => "the command ran but its receipts",
        _ => "the launch did not run, and the receipt of its failure",
    }
}

/// The note for a workspace the command's uid and gid cannot write.
fn unwritable(ws: &Path, uid: u32, gid: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(ws).ok()?;
    let mode = m.mode();
    let writable = (m.uid() == uid && mode & 0o200 != 0)
        || (m.uid() != uid && m.gid() == gid && mode & 0o020 != 0)
        || (m.uid() != uid && m.gid() != gid && mode & 0o002 != 0);
    (!writable).then(|| {
        format!(
            "chio: note: the workspace {} (owner {}:{}, mode {:o}) is not writable by uid {uid} gid {gid} in the cage; \
             run with --uid {} --gid {}, or chown it",
            ws.display(),
            m.uid(),
            m.gid(),
            mode & 0o7777,
            m.uid(),
            m.gid()
        )
    })
}
