//! `chio receipt verify | list | verify-chain | checkpoint | report`, and the receipts `chio cage
//! run` appends.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use chio_kernel::canonical;
use chio_kernel::keys;
use chio_kernel::receipt::{self, Verified};
use chio_kernel::store::{Filter, Store};
use chio_kernel::time;
use chio_supervisor::report::{self, ReportError};
use clap::Subcommand;

/// Largest input `receipt verify` reads.
const MAX_INPUT_BYTES: u64 = 64 << 20;
/// Most receipts `receipt verify` checks in one file.
const MAX_RECORDS: usize = 100_000;

/// `chio receipt …`
#[derive(Debug, Subcommand)]
pub enum ReceiptCommand {
    /// Verify exported receipts offline (.json: one receipt; .ndjson: one per line, in chain order).
    #[command(
        after_help = "Example:\n  chio receipt verify --input export.ndjson --trusted-key kernel-key/public.key"
    )]
    Verify {
        /// The export.
        #[arg(long, value_name = "FILE")]
        input: PathBuf,
        /// The kernel's public key: 64 hex digits, or a file holding them.
        #[arg(long = "trusted-key", visible_alias = "trusted-kernel-pubkey", value_name = "HEX|FILE")]
        key: String,
    },
    /// List receipts as JSON lines, oldest first; prints the next page's cursor on stderr.
    #[command(
        after_help = "Example:\n  chio receipt list --receipt-db /var/lib/chio/receipts.db --kind launch_terminal --limit 50"
    )]
    List {
        /// The receipt store.
        #[arg(long = "receipt-db", value_name = "DB")]
        db: PathBuf,
        /// Only this tool server.
        #[arg(long = "tool-server")]
        tool_server: Option<String>,
        /// Only this kind.
        #[arg(long, value_parser = ["launch_enforcement", "launch_terminal", "tool_call", "denial"])]
        kind: Option<String>,
        /// Only this outcome.
        #[arg(long)]
        outcome: Option<String>,
        /// Issued at or after (RFC 3339 UTC, e.g. 2026-11-29T00:00:00Z).
        #[arg(long)]
        since: Option<String>,
        /// Issued before (RFC 3339 UTC).
        #[arg(long)]
        until: Option<String>,
        /// Page size (1 to 10000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        limit: u64,
        /// Cursor from the previous page.
        #[arg(long)]
        cursor: Option<u64>,
    },
    /// Verify the whole store (or a range): signatures, ids, links and sequence.
    #[command(
        after_help = "Example:\n  chio receipt verify-chain --receipt-db /var/lib/chio/receipts.db --trusted-key kernel-key/public.key"
    )]
    VerifyChain {
        /// The receipt store.
        #[arg(long = "receipt-db", value_name = "DB")]
        db: PathBuf,
        /// The kernel's public key (64 hex digits, or a file): also check every signature.
        /// Without it only ids, links and sequence numbers are checked.
        #[arg(long = "trusted-key", visible_alias = "trusted-kernel-pubkey", value_name = "HEX|FILE")]
        key: Option<String>,
        /// First sequence number.
        #[arg(long)]
        from: Option<u64>,
        /// Last sequence number.
        #[arg(long)]
        to: Option<u64>,
        /// A checkpoint from `chio receipt checkpoint` (needs --trusted-kernel-pubkey): the store
        /// must still hold the receipt it names (deleted newest receipts are caught).
        #[arg(long, value_name = "FILE", requires = "key")]
        checkpoint: Option<PathBuf>,
    },
    /// Write a signed checkpoint of the store's head (seq and id of its last receipt) to keep
    /// elsewhere; `verify-chain --checkpoint` checks the store against it.
    #[command(
        after_help = "Example:\n  chio receipt checkpoint --receipt-db /var/lib/chio/receipts.db --kernel-key kernel-key/signing.seed --out head.json"
    )]
    Checkpoint {
        /// The receipt store.
        #[arg(long = "receipt-db", value_name = "DB")]
        db: PathBuf,
        /// The kernel's signing seed (the key the store is bound to).
        #[arg(long = "kernel-key", value_name = "SEED")]
        kernel_key: PathBuf,
        /// Where to write it (default: stdout).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Render the store as one self-contained HTML page (no script, nothing loaded): the
    /// verification result at the top, then the launches and commands with their facts, exits,
    /// limits hit and file changes, the refusals, and charts of latency and resource use.
    #[command(after_help = "Exit status: 0 written and verified; 1 written, but the store does not verify (the page \
                      says so at its top), or nothing written; 2 usage.\n\nExample:\n  chio receipt report \
                      --receipt-db /var/lib/chio/receipts.db --trusted-key /etc/chio/kernel-key/public.key --out report.html")]
    Report {
        /// The receipt store.
        #[arg(long = "receipt-db", value_name = "DB")]
        db: PathBuf,
        /// The kernel's public key (64 hex digits, or a file): check every signature. Without it
        /// the page says at its top that signatures were not checked.
        #[arg(long = "trusted-key", visible_alias = "trusted-kernel-pubkey", value_name = "HEX|FILE")]
        key: Option<String>,
        /// A checkpoint from `chio receipt checkpoint` (needs --trusted-key): receipts deleted
        /// from the end show as a failure.
        #[arg(long, value_name = "FILE", requires = "key")]
        checkpoint: Option<PathBuf>,
        /// A repository workspace's state (`chio repository --state`) or a governed session's:
        /// each command's file changes, from the snapshots its receipt binds.
        #[arg(long, value_name = "STATE")]
        session: Option<PathBuf>,
        /// Show the newest N launches (the verification always covers the whole store).
        #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=report::MAX_LAUNCHES))]
        last: u64,
        /// The page to write (replaced whole; mode 0600).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

/// Run a receipt subcommand.
pub fn run(cmd: &ReceiptCommand) -> Result<i32> {
    match cmd {
        ReceiptCommand::Verify { input, key } => verify_file(input, &pinned_key(key)?),
        ReceiptCommand::List { db, tool_server, kind, outcome, since, until, limit, cursor } => {
            let when = |s: &Option<String>, flag: &str| -> Result<Option<i64>> {
                s.as_deref()
                    .map(|t| {
                        time::parse_rfc3339(t)
                            .with_context(|| format!("{flag} {t:?} is not RFC 3339 UTC (2026-11-29T00:00:00Z)"))
                    })
                    .transpose()
            };
            let filter = Filter {
                tool_server: tool_server.clone(),
                kind: kind.clone(),
                outcome: outcome.clone(),
                since_ms: when(since, "--since")?,
                until_ms: when(until, "--until")?,
                after_seq: *cursor,
                limit: *limit,
            };
            list(db, &filter)
        }
        ReceiptCommand::Checkpoint { db, kernel_key, out } => {
            let key = keys::read_seed(kernel_key)?;
            let mut store = Store::open(db, false)?;
            store.bind_key(&key).with_context(|| format!("receipt store {}", db.display()))?;
            let text = serde_json::to_string(&store.checkpoint(&key)?)? + "\n";
            match out {
                Some(p) => std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?,
                None => print!("{text}"),
            }
            Ok(0)
        }
        ReceiptCommand::Report { db, key, checkpoint, session, last, out } => {
            let checkpoint = checkpoint
                .as_ref()
                .map(|cp| std::fs::read(cp).with_context(|| format!("reading checkpoint {}", cp.display())))
                .transpose()?;
            let request = report::Request {
                db: db.clone(),
                key: key.as_deref().map(pinned_key).transpose()?,
                checkpoint,
                session: session.clone(),
                last: *last,
            };
            write_report(&request, out)
        }
        ReceiptCommand::VerifyChain { db, key, from, to, checkpoint } => {
            if let (Some(f), Some(t)) = (from, to) {
                if f > t {
                    eprintln!("chio: --from {f} is after --to {t}: an empty range verifies nothing");
                    return Ok(2);
                }
            }
            let key = key.as_deref().map(pinned_key).transpose()?;
            let code = verify_chain(db, key.as_deref(), *from, *to)?;
            match (checkpoint, &key) {
                (Some(cp), Some(k)) => {
                    let bytes = std::fs::read(cp).with_context(|| format!("reading checkpoint {}", cp.display()))?;
                    let problems = Store::open_read_only(db)?.check_checkpoint(&bytes, k)?;
                    for p in &problems {
                        eprintln!("checkpoint {}: {p}", cp.display());
                    }
                    Ok(if problems.is_empty() { code } else { 1 })
                }
                _ => Ok(code),
            }
        }
    }
}

/// A pinned key given inline or in a file; checked (weak keys refused).
pub fn pinned_key(arg: &str) -> Result<String> {
    Ok(keys::pinned(arg)?)
}

fn verify_file(input: &Path, key: &str) -> Result<i32> {
    let size = std::fs::metadata(input).with_context(|| format!("{}", input.display()))?.len();
    if size > MAX_INPUT_BYTES {
        bail!("{} is {size} bytes; receipt verify reads at most {MAX_INPUT_BYTES}", input.display());
    }
    let text = std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?;
    let ndjson = input.extension().is_some_and(|e| e == "ndjson");
    let records: Vec<String> = if ndjson {
        text.lines().filter(|l| !l.trim().is_empty()).map(unwrap_listed).collect()
    } else {
        vec![unwrap_listed(text.trim())]
    };
    if records.is_empty() || records.iter().all(|r| r.is_empty()) {
        eprintln!("chio: {} holds no receipt: nothing was verified", input.display());
        return Ok(1);
    }
    if records.len() > MAX_RECORDS {
        bail!("{} holds {} receipts; receipt verify checks at most {MAX_RECORDS}", input.display(), records.len());
    }
    let mut ok: Vec<Verified> = Vec::new();
    let mut failures = 0;
    let mut err = std::io::stderr().lock();
    for (i, rec) in records.iter().enumerate() {
        match receipt::verify(rec.as_bytes(), key) {
            Ok(v) => ok.push(v),
            Err(e) => {
                failures += 1;
                writeln!(err, "{}:{}: receipt {}: {e}", input.display(), i + 1, claimed_id(rec))?;
            }
        }
    }
    if ndjson && failures == 0 {
        if let Some(first) = ok.first() {
            let (prev, seq) = (first.body.prev.clone(), first.body.seq - 1);
            for (id, why) in receipt::chain_breaks(&ok, prev, seq) {
                failures += 1;
                writeln!(err, "{}: receipt {id}: {why}", input.display())?;
            }
        }
    }
    if failures > 0 {
        writeln!(err, "chio: {failures} problem(s) in {} receipt(s)", records.len())?;
        return Ok(1);
    }
    println!("ok: {} receipt(s) verified under {key}", ok.len());
    Ok(0)
}

/// A line of `chio receipt list` (`{seq, id, ..., receipt}`) stands for its receipt; anything
/// else is taken as a receipt itself.
fn unwrap_listed(line: &str) -> String {
    match canonical::parse_strict(line.as_bytes()) {
        Ok(v) if v.get("receipt").is_some_and(|r| r.is_object()) && v.get("body").is_none() => v["receipt"].to_string(),
        _ => line.to_string(),
    }
}

/// The id a receipt would have (SHA-256 of its canonical body), for error messages.
fn claimed_id(text: &str) -> String {
    canonical::parse_strict(text.as_bytes())
        .ok()
        .and_then(|v| canonical::to_canonical(v.get("body")?).ok())
        .map_or_else(|| "(unreadable)".into(), |c| receipt::sha256_hex(c.as_bytes()))
}

fn list(db: &Path, filter: &Filter) -> Result<i32> {
    let store = Store::open_read_only(db)?;
    let rows = store.list(filter)?;
    let mut out = std::io::stdout().lock();
    for r in &rows {
        let receipt: serde_json::Value = serde_json::from_str(&r.envelope)?;
        let line = serde_json::json!({
            "seq": r.seq, "id": r.id, "kind": r.kind, "tool_server": r.tool_server,
            "outcome": r.outcome, "issued_at": r.issued_at, "receipt": receipt,
        });
        writeln!(out, "{line}")?;
    }
    if rows.len() as u64 == filter.limit {
        if let Some(last) = rows.last() {
            eprintln!("next cursor: {}", last.seq);
        }
    }
    Ok(0)
}

/// Build the report and write it to `out` whole (a temporary file beside it, renamed over it).
fn write_report(request: &report::Request, out: &Path) -> Result<i32> {
    if out.is_dir() {
        eprintln!("chio: --out {} is a directory; name the page's file", out.display());
        return Ok(2);
    }
    let built = match report::build(request) {
        Ok(r) => r,
        Err(ReportError::Usage(e)) => {
            eprintln!("chio: {e}");
            return Ok(2);
        }
        Err(e) => bail!("no report was written: {e}"),
    };
    let page = report::render(&built);
    let name = out.file_name().with_context(|| format!("--out {} names no file", out.display()))?;
    let tmp = out.with_file_name(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(page.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, out)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        bail!("writing {}: {e}", out.display());
    }
    let v = &built.verification;
    if v.holds() {
        let signed = if v.key.is_some() { "signatures and chain" } else { "chain (signatures not checked)" };
        eprintln!("chio: wrote {}: {} receipt(s), {signed} verified", out.display(), v.receipts);
        Ok(0)
    } else {
        let problems = v.all_problems().count();
        eprintln!(
            "chio: wrote {}, but the store does NOT verify ({problems} problem(s), named at the page's top)",
            out.display()
        );
        Ok(1)
    }
}

fn verify_chain(db: &Path, key: Option<&str>, from: Option<u64>, to: Option<u64>) -> Result<i32> {
    let store = Store::open_read_only(db)?;
    let report = store.verify_chain(key, from, to)?;
    let mut err = std::io::stderr().lock();
    for (seq, id, why) in &report.problems {
        writeln!(err, "receipt {seq} {id}: {why}")?;
    }
    if report.problems.is_empty() {
        match key {
            Some(k) => println!("ok: {} receipt(s), chain intact, all signed by {k}", report.checked),
            None => println!(
                "ok: {} receipt(s), chain intact (signatures not checked: no --trusted-kernel-pubkey)",
                report.checked
            ),
        }
        Ok(0)
    } else {
        writeln!(err, "chio: {} problem(s) in {} receipt(s)", report.problems.len(), report.checked)?;
        Ok(1)
    }
}
