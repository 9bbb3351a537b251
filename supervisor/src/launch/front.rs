//! A launch as `chio cage run` runs it, whether in its own process or in a daemon's launch
//! process for a client: [`prepare`](super::prepare), what is to be said before the command's
//! output (a policy's refusal, a note on an unwritable workspace), [`run`](super::run), and the
//! record reported — on stderr, and in a record file when asked. In a daemon's launch process
//! the command's output goes to the client's own descriptors ([`Client`]).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use chio_cage::{LaunchRecord, State};

use super::{How, Io, LaunchError, LaunchReceipts, LaunchRequest, Launched, Receipts, TeardownAt};

/// A daemon client's streams: the command's output goes there, and `before_output` is called
/// once what this process said must reach the client, before the command's output starts.
pub struct Client<'a> {
    /// The client's stdout.
    pub stdout: std::os::fd::BorrowedFd<'a>,
    /// The client's stderr.
    pub stderr: std::os::fd::BorrowedFd<'a>,
    /// Say what was said so far.
    pub before_output: &'a dyn Fn(),
}

/// How the record is reported beyond the failure and shadow-mode lines: a record file (created
/// before the launch, so a path that cannot be written refuses it) and `--json`.
#[derive(Default)]
pub struct Report {
    /// The record file, opened, and its path.
    pub record: Option<(File, PathBuf)>,
    /// Print the record as the last line on stderr.
    pub json: bool,
}

/// A launch's exit status and, when it got to launching, what the launch returned.
pub struct Done {
    /// What `chio cage run` exits with.
    pub status: i32,
    /// The launch, when one ran (not when its policy refused it, or its gate withdrew it
    /// before it began).
    pub launched: Option<Launched>,
    /// How long each of its writes to the receipt store took.
    pub receipt_writes: Vec<std::time::Duration>,
}

impl Done {
    fn without_launch(status: i32, receipts: Option<LaunchReceipts>) -> Done {
        Done { status, launched: None, receipt_writes: writes(receipts) }
    }
}

/// The times of the writes `receipts` made.
fn writes(receipts: Option<LaunchReceipts>) -> Vec<std::time::Duration> {
    receipts.map(LaunchReceipts::into_writes).unwrap_or_default()
}

/// Launch `request`: `receipts` the store and seed to record in, `report` how to report the
/// record; `ahead`, `teardown` and `gate` as [`How`].
pub fn launch_request(
    request: &LaunchRequest,
    receipts: Option<(&Path, &Path)>,
    client: Option<Client<'_>>,
    report: Report,
    ahead: chio_cage::Ahead,
    teardown: TeardownAt,
    gate: Option<chio_cage::Gate<'_>>,
) -> Result<Done, LaunchError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(LaunchError::Failed(
            "chio cage run needs root: it creates namespaces, mounts and cgroups for the cage (run it as root, e.g. \
             with sudo; the command itself runs as --uid, 65534 by default)"
                .into(),
        ));
    }
    // A one-shot launch never writes the store of a running daemon (one writer per store); a
    // daemon's own launch processes (which hold their client's streams) write it under the
    // daemon's lock.
    let one_shot = client.is_none();
    let _store_lock = match receipts {
        Some((db, _)) if one_shot => crate::state_lock::share(db).map_err(|e| LaunchError::Failed(e.to_string()))?,
        _ => None,
    };
    // Opened before anything runs: a bad key or a foreign store refuses the launch up front.
    let mut receipts = match receipts {
        Some((db, seed)) => Some(LaunchReceipts::open(db, seed)?),
        None => None,
    };
    let prepared = match super::prepare(request, receipts.as_mut())? {
        Ok(p) => p,
        Err(refusal) => {
            for v in &refusal.violations {
                eprintln!("refused: {v}");
            }
            if let Some(id) = &refusal.denial_receipt {
                eprintln!("chio: denial receipt {id}");
            }
            eprintln!(
                "chio: launch refused by policy {}: {} violation(s)",
                refusal.policy_id,
                refusal.violations.len()
            );
            return Ok(Done::without_launch(125, receipts));
        }
    };
    if let Some(note) = prepared.workspace_note() {
        if gate.is_some_and(|open| !open()) {
            return Ok(Done::without_launch(125, receipts));
        }
        eprintln!("{note}");
    }
    let (stdout, stderr, stdin) = (std::io::stdout(), std::io::stderr(), std::io::stdin());
    // In a daemon's launch process the command's output goes to the client's own descriptors,
    // and what was said before it goes out first.
    let (out, err) = match &client {
        Some(c) => {
            (c.before_output)();
            (c.stdout, c.stderr)
        }
        None => (stdout.as_fd(), stderr.as_fd()),
    };
    let io = Io { stdout: out, stderr: err, stdin: request.interactive.then(|| stdin.as_fd()) };
    let to = match receipts.as_mut() {
        Some(r) => Receipts::Launch(r),
        None => Receipts::Off,
    };
    let launched = super::run(&prepared, io, to, How { ahead, teardown, gate });
    if launched.withdrawn {
        return Ok(Done { status: 125, launched: Some(launched), receipt_writes: writes(receipts) });
    }
    if launched.stderr_mid_line {
        // chio's own lines (and the --json record) always start a line of their own.
        eprintln!();
    }
    // A receipt that cannot be written never hides the record: it is still printed and saved.
    match &launched.unrecorded {
        Some(why) => eprintln!("chio: {} could not be recorded: {why}", super::unrecorded_words(&launched.record)),
        None if receipts.is_some() => eprintln!("chio: receipts {}", launched.receipts.join(" ")),
        None => {}
    }
    say_record(&launched.record, report).map_err(|e| LaunchError::Failed(e.to_string()))?;
    Ok(Done { status: launched.status, launched: Some(launched), receipt_writes: writes(receipts) })
}

/// Write the record to the record file, say how the launch failed or ran unconfined, and print
/// the record with `json` (the last line on stderr).
pub fn say_record(rec: &LaunchRecord, report: Report) -> std::io::Result<()> {
    // Serialised only when asked for: most launches print no record.
    let json = if report.record.is_some() || report.json { serde_json::to_string(rec)? } else { String::new() };
    if let Some((mut f, path)) = report.record {
        f.write_all(format!("{json}\n").as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| std::io::Error::new(e.kind(), format!("writing record {}: {e}", path.display())))?;
    }
    let mut err = std::io::stderr().lock();
    if let Some(f) = &rec.failure {
        let state = match rec.state {
            State::Rejected => "rejected",
            State::Unsupported => "unsupported on this host",
            _ => "cage failed",
        };
        writeln!(err, "chio: {state} at stage {}: {}: {}", f.stage.name(), f.code, f.detail)?;
    } else if rec.state == State::NotConfined {
        writeln!(err, "chio: shadow mode: the target ran NOT CONFINED: {}", rec.not_confined.join("; "))?;
    }
    if report.json {
        writeln!(err, "{json}")?;
    }
    Ok(())
}
