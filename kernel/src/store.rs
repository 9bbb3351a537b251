//! The receipt store: one SQLite file, WAL, `synchronous=FULL`, checked `application_id` and
//! `user_version`, append-only (triggers refuse UPDATE and DELETE), one writer at a time
//! (`BEGIN IMMEDIATE`). A receipt is committed — durable — before `append` returns. Chain
//! verification re-checks every signature against the pinned key and every hash link, so an edited,
//! deleted or reordered row is reported even if someone bypassed the triggers.

use std::path::Path;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::receipt::{self, Body, Draft, Verified, GENESIS, SCHEMA};
use crate::time;

/// `PRAGMA application_id` of a chio receipt store ("chio").
pub const APPLICATION_ID: i32 = 0x6368_696f;
/// Schema of a signed checkpoint of a store's head.
pub const CHECKPOINT_SCHEMA: &str = "chio.receipt-checkpoint.v1";
/// Schema version this code reads and writes (1 lacked `store_meta`; it is upgraded on open).
pub const USER_VERSION: i32 = 2;

const SCHEMA_SQL: &str = "
CREATE TABLE receipts (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    tool_server TEXT,
    outcome TEXT NOT NULL,
    issued_at_ms INTEGER NOT NULL,
    prev TEXT NOT NULL,
    envelope TEXT NOT NULL
) STRICT;
CREATE INDEX receipts_by_time ON receipts(issued_at_ms, seq);
CREATE INDEX receipts_by_tool_server ON receipts(tool_server, seq);
CREATE INDEX receipts_by_kind ON receipts(kind, seq);
CREATE INDEX receipts_by_outcome ON receipts(outcome, seq);
CREATE TRIGGER receipts_no_update BEFORE UPDATE ON receipts BEGIN SELECT RAISE(ABORT, 'receipts are append-only'); END;
CREATE TRIGGER receipts_no_delete BEFORE DELETE ON receipts BEGIN SELECT RAISE(ABORT, 'receipts are append-only'); END;
CREATE TABLE operations (
    op_key TEXT PRIMARY KEY,
    request_sha256 TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'dispatched', 'completed', 'outcome_unknown', 'abandoned')),
    result TEXT,
    updated_at_ms INTEGER NOT NULL
) STRICT;
";

/// How long a step waits for another connection's lock before the store reports it busy.
const BUSY_WAIT: Duration = Duration::from_secs(10);

/// Run `step`, retrying while SQLite answers `SQLITE_BUSY`, for at most `BUSY_WAIT`. SQLite
/// returns BUSY without calling the busy handler where waiting could deadlock: switching a
/// fresh file to WAL upgrades a read lock to a write lock, and every creator that reached that
/// step at once holds the same read lock. All but one are refused; they retry here once the
/// winner has switched it.
fn retry_busy<T>(mut step: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let deadline = Instant::now() + BUSY_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        match step() {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            done => return done,
        }
    }
}

/// Facts fixed at creation: the kernel public key the store is bound to.
const META_SQL: &str = "
CREATE TABLE store_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TRIGGER store_meta_no_update BEFORE UPDATE ON store_meta BEGIN SELECT RAISE(ABORT, 'a store''s binding is fixed'); END;
CREATE TRIGGER store_meta_no_delete BEFORE DELETE ON store_meta BEGIN SELECT RAISE(ABORT, 'a store''s binding is fixed'); END;
";

/// Why the store refused or failed.
#[derive(Debug)]
pub enum StoreError {
    /// The file is not a chio receipt store, or a newer/older one.
    Foreign(String),
    /// SQLite error.
    Sql(rusqlite::Error),
    /// A receipt could not be built or signed.
    Receipt(receipt::ReceiptError),
    /// Bad input (a draft without a kind, ...).
    Invalid(String),
    /// The store is bound to another kernel key, or its chain is broken: no append.
    Refused(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Foreign(e) | StoreError::Invalid(e) | StoreError::Refused(e) => write!(f, "{e}"),
            StoreError::Sql(e) => write!(f, "receipt store: {e}"),
            StoreError::Receipt(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sql(e)
    }
}

/// Listing filters (all optional) and cursor pagination by sequence number.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this tool server.
    pub tool_server: Option<String>,
    /// Only this kind (snake_case name).
    pub kind: Option<String>,
    /// Only this outcome.
    pub outcome: Option<String>,
    /// Issued at or after (Unix ms).
    pub since_ms: Option<i64>,
    /// Issued before (Unix ms).
    pub until_ms: Option<i64>,
    /// Only receipts after this sequence number (the cursor of the previous page).
    pub after_seq: Option<u64>,
    /// At most this many.
    pub limit: u64,
}

/// One stored receipt as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Sequence number (also the pagination cursor).
    pub seq: u64,
    /// Receipt id.
    pub id: String,
    /// Kind.
    pub kind: String,
    /// Tool server.
    pub tool_server: Option<String>,
    /// Outcome.
    pub outcome: String,
    /// RFC 3339 issue time.
    pub issued_at: String,
    /// The signed envelope, as stored.
    pub envelope: String,
}

/// Result of a chain verification.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainReport {
    /// Receipts checked.
    pub checked: u64,
    /// Each problem: (sequence number, receipt id, reason).
    pub problems: Vec<(u64, String, String)>,
}

/// A receipt just appended.
#[derive(Debug, Clone, PartialEq)]
pub struct Appended {
    /// Its id and body.
    pub receipt: Verified,
    /// The signed envelope as stored.
    pub envelope: crate::envelope::Signed,
}

/// A store's integrity and format, as `Store::health` reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreHealth {
    /// `PRAGMA quick_check`: `ok`, or what is wrong.
    pub quick_check: String,
    /// `PRAGMA journal_mode` (`wal` for a store chio writes).
    pub journal_mode: String,
    /// `PRAGMA application_id` ([`APPLICATION_ID`]).
    pub application_id: i32,
    /// `PRAGMA user_version` (the schema version).
    pub user_version: i32,
}

/// An open store.
pub struct Store {
    conn: Connection,
}

impl Store {
    /// Open (and with `create`, initialize) the store at `path`. A foreign database, or a store of
    /// another schema version, is refused.
    pub fn open(path: &Path, create: bool) -> Result<Store, StoreError> {
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = Connection::open_with_flags(path, flags)
            .map_err(|e| StoreError::Foreign(format!("cannot open receipt store {}: {e}", path.display())))?;
        conn.busy_timeout(BUSY_WAIT)?;
        // One statement, so one snapshot: a store being created by another process is seen
        // either empty or whole.
        let ids = |c: &Connection| -> rusqlite::Result<(i32, i32, i64)> {
            c.query_row(
                "SELECT (SELECT application_id FROM pragma_application_id), (SELECT user_version FROM pragma_user_version),
                        (SELECT count(*) FROM sqlite_schema)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
        };
        let (mut app, mut version, tables) = ids(&conn)?;
        if app == 0 && version == 0 && tables == 0 {
            if !create {
                return Err(StoreError::Foreign(format!("{} is empty, not a receipt store", path.display())));
            }
            retry_busy(|| conn.execute_batch("PRAGMA journal_mode=WAL;"))?;
            // Another process may be creating the same store: decide inside one write
            // transaction, so exactly one of them creates it and the others find it made.
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let created = match ids(&conn) {
                Ok((0, 0, 0)) => conn.execute_batch(&format!(
                    "{SCHEMA_SQL} {META_SQL} PRAGMA application_id={APPLICATION_ID}; PRAGMA user_version={USER_VERSION};"
                )),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            };
            match created {
                Ok(()) => conn.execute_batch("COMMIT")?,
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Err(e.into());
                }
            }
            (app, version, _) = ids(&conn)?;
        }
        if app == 0 && version == 0 {
            return Err(StoreError::Foreign(format!("{} is not a chio receipt store", path.display())));
        } else if app == APPLICATION_ID && version == 1 {
            // Schema 1 had no binding table; `bind_key` binds such a store on its next append.
            conn.execute_batch(&format!("BEGIN IMMEDIATE; {META_SQL} PRAGMA user_version={USER_VERSION}; COMMIT;"))?;
        } else if app != APPLICATION_ID {
            return Err(StoreError::Foreign(format!(
                "{} is not a chio receipt store (application_id {app:#x})",
                path.display()
            )));
        } else if version != USER_VERSION {
            return Err(StoreError::Foreign(format!(
                "{} has receipt store schema {version}; this chio reads schema {USER_VERSION}",
                path.display()
            )));
        }
        retry_busy(|| conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"))?;
        Ok(Store { conn })
    }

    /// Open a store only to read it (list, verify): nothing is written, and it works on a
    /// read-only file system (where SQLite cannot create the WAL index, the file is opened
    /// immutable — nothing can be writing to it there).
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        let escaped = path.to_string_lossy().replace('%', "%25").replace('?', "%3f").replace('#', "%23");
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let cannot =
            |e: rusqlite::Error| StoreError::Foreign(format!("cannot open receipt store {}: {e}", path.display()));
        if !path.is_file() {
            return Err(StoreError::Foreign(format!("{} is not a receipt store (no such file)", path.display())));
        }
        let probe = |uri: &str| -> rusqlite::Result<(Connection, i32, i32)> {
            let conn = Connection::open_with_flags(uri, flags)?;
            conn.busy_timeout(BUSY_WAIT)?;
            let (app, version) = conn.query_row(
                "SELECT (SELECT application_id FROM pragma_application_id), (SELECT user_version FROM pragma_user_version)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            Ok((conn, app, version))
        };
        let (conn, app, version) = probe(&format!("file:{escaped}?mode=ro"))
            .or_else(|_| probe(&format!("file:{escaped}?mode=ro&immutable=1")))
            .map_err(cannot)?;
        if app != APPLICATION_ID {
            return Err(StoreError::Foreign(format!(
                "{} is not a chio receipt store (application_id {app:#x})",
                path.display()
            )));
        }
        if !(1..=USER_VERSION).contains(&version) {
            return Err(StoreError::Foreign(format!(
                "{} has receipt store schema {version}; this chio reads schema {USER_VERSION}",
                path.display()
            )));
        }
        Ok(Store { conn })
    }

    /// What `PRAGMA quick_check` and the journal mode say about any SQLite database at `path`
    /// (another service's session store, for `chio security preflight --session-db`), opened
    /// only to read; its application id and schema are reported, not judged.
    pub fn sqlite_health(path: &Path) -> Result<StoreHealth, StoreError> {
        let escaped = path.to_string_lossy().replace('%', "%25").replace('?', "%3f").replace('#', "%23");
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let open = |uri: &str| -> rusqlite::Result<Store> {
            let conn = Connection::open_with_flags(uri, flags)?;
            conn.busy_timeout(BUSY_WAIT)?;
            // A file that is no database fails here, on its first read.
            conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get::<_, i64>(0))?;
            Ok(Store { conn })
        };
        let store = open(&format!("file:{escaped}?mode=ro"))
            .or_else(|_| open(&format!("file:{escaped}?mode=ro&immutable=1")))
            .map_err(|e| StoreError::Foreign(format!("cannot open {} as an SQLite database: {e}", path.display())))?;
        store.health()
    }

    /// What `PRAGMA quick_check`, the journal mode and the schema say about this store (for
    /// `chio security preflight`; works on a read-only store).
    pub fn health(&self) -> Result<StoreHealth, StoreError> {
        let quick_check: Vec<String> =
            self.conn.prepare("PRAGMA quick_check")?.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        let journal_mode: String = self.conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        let (application_id, user_version): (i32, i32) = self.conn.query_row(
            "SELECT (SELECT application_id FROM pragma_application_id), (SELECT user_version FROM pragma_user_version)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(StoreHealth { quick_check: quick_check.join("; "), journal_mode, application_id, user_version })
    }

    /// Make the store ready for appends signed by `key`, or refuse: a store is bound to the kernel
    /// key that first wrote to it (recorded in `store_meta`; a store from before the binding is
    /// bound to the signer of its first receipt), and its tail — the last receipt's signature,
    /// id, sequence number, link and indexed columns — must verify under that key. Call it once
    /// after opening, before the first append; a refusal names the receipt.
    pub fn bind_key(&mut self, key: &SigningKey) -> Result<(), StoreError> {
        let ours = crate::keys::hex(key.verifying_key().as_bytes());
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let bound: Option<String> = tx
            .query_row("SELECT value FROM store_meta WHERE name = 'kernel_public_key'", [], |r| r.get(0))
            .optional()?;
        let bound = match bound {
            Some(k) => k,
            None => {
                let first: Option<String> =
                    tx.query_row("SELECT envelope FROM receipts ORDER BY seq LIMIT 1", [], |r| r.get(0)).optional()?;
                let k = match first {
                    Some(env) => serde_json::from_str::<crate::envelope::Signed>(&env)
                        .map(|s| s.signer_public_key)
                        .map_err(|e| StoreError::Refused(format!("the first receipt cannot be read: {e}")))?,
                    None => ours.clone(),
                };
                tx.execute("INSERT INTO store_meta (name, value) VALUES ('kernel_public_key', ?1)", [&k])?;
                k
            }
        };
        if bound != ours {
            return Err(StoreError::Refused(format!(
                "this receipt store is bound to kernel key {bound}; refusing receipts signed by {ours} (use the store's own key, or a new store)"
            )));
        }
        Self::check_tail(&tx, &bound)?;
        tx.commit()?;
        Ok(())
    }

    /// The last receipt verifies under `key` and links to the one before it.
    fn check_tail(tx: &rusqlite::Transaction<'_>, key: &str) -> Result<(), StoreError> {
        let broken = |seq: i64, id: &str, why: String| {
            StoreError::Refused(format!(
                "the receipt store's chain is broken at receipt {seq} ({id}): {why}; no receipt is appended to it (run `chio receipt verify-chain`)"
            ))
        };
        let last = tx
            .query_row(
                "SELECT seq, id, kind, tool_server, outcome, prev, envelope, (SELECT count(*) FROM receipts) FROM receipts ORDER BY seq DESC LIMIT 1",
                [],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        (r.get::<_, String>(2)?, r.get::<_, Option<String>>(3)?, r.get::<_, String>(4)?, r.get::<_, String>(5)?),
                        r.get::<_, String>(6)?,
                        r.get::<_, i64>(7)?,
                    ))
                },
            )
            .optional()
            .map_err(|e| StoreError::Refused(format!("the receipt store's last receipt cannot be read: {e}")))?;
        let Some((seq, id, columns, envelope, count)) = last else { return Ok(()) };
        let v = receipt::verify(envelope.as_bytes(), key)
            .map_err(|e| broken(seq, &id, format!("signature or body refused: {e}")))?;
        if v.id != id {
            return Err(broken(seq, &id, format!("the stored id differs from the body's digest {}", v.id)));
        }
        if v.body.seq != seq as u64 || count != seq {
            return Err(broken(seq, &id, format!("the body says seq {} in a store of {count} receipts", v.body.seq)));
        }
        let body_cols =
            (v.body.kind.name().to_string(), v.body.tool_server.clone(), v.body.outcome.clone(), v.body.prev.clone());
        if body_cols != columns {
            return Err(broken(seq, &id, "indexed columns differ from the signed body".into()));
        }
        let before: Option<String> =
            tx.query_row("SELECT id FROM receipts WHERE seq = ?1", [seq - 1], |r| r.get(0)).optional()?;
        let expected = before.unwrap_or_else(|| GENESIS.to_string());
        if v.body.prev != expected {
            return Err(broken(seq, &id, format!("links to {} but the receipt before it is {expected}", v.body.prev)));
        }
        Ok(())
    }

    /// Append a receipt signed by `key`; it is committed (durable) when this returns.
    pub fn append(&mut self, key: &SigningKey, draft: Draft) -> Result<Appended, StoreError> {
        Ok(self.append_batch(key, vec![draft])?.remove(0))
    }

    /// Append several receipts in one transaction (group commit: one fsync for all); all are
    /// durable when this returns, or none is stored.
    pub fn append_batch(&mut self, key: &SigningKey, drafts: Vec<Draft>) -> Result<Vec<Appended>, StoreError> {
        if drafts.is_empty() {
            return Err(StoreError::Invalid("nothing to append".into()));
        }
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut out = Vec::with_capacity(drafts.len());
        for draft in drafts {
            out.push(Self::append_in(&tx, key, draft)?);
        }
        tx.commit()?;
        Ok(out)
    }

    pub(crate) fn append_in(
        tx: &rusqlite::Transaction<'_>,
        key: &SigningKey,
        draft: Draft,
    ) -> Result<Appended, StoreError> {
        let kind = draft.kind.ok_or_else(|| StoreError::Invalid("a receipt needs a kind".into()))?;
        let last: Option<(u64, String)> = tx
            .query_row("SELECT seq, id FROM receipts ORDER BY seq DESC LIMIT 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let (seq, prev) = last.map_or((1, GENESIS.to_string()), |(s, id)| (s + 1, id));
        let now = time::now_ms();
        let body = Body {
            schema: SCHEMA.into(),
            kind,
            seq,
            prev: prev.clone(),
            issued_at: time::rfc3339(now),
            tool_server: draft.tool_server,
            outcome: draft.outcome,
            launch_record: draft.launch_record,
            launch: draft.launch,
            detail: draft.detail,
        };
        let env = receipt::sign(key, &body).map_err(StoreError::Receipt)?;
        let id = receipt::id_of(&body).map_err(StoreError::Receipt)?;
        let text = serde_json::to_string(&env).map_err(|e| StoreError::Invalid(e.to_string()))?;
        tx.execute(
            "INSERT INTO receipts (seq, id, kind, tool_server, outcome, issued_at_ms, prev, envelope)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![seq, id, kind.name(), body.tool_server, body.outcome, now, prev, text],
        )?;
        Ok(Appended { receipt: Verified { id, body }, envelope: env })
    }

    /// List receipts by sequence number with filters; the last row's `seq` is the next cursor.
    pub fn list(&self, f: &Filter) -> Result<Vec<Row>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT seq, id, kind, tool_server, outcome, issued_at_ms, envelope FROM receipts
             WHERE (?1 IS NULL OR tool_server = ?1) AND (?2 IS NULL OR kind = ?2) AND (?3 IS NULL OR outcome = ?3)
               AND (?4 IS NULL OR issued_at_ms >= ?4) AND (?5 IS NULL OR issued_at_ms < ?5) AND seq > ?6
             ORDER BY seq LIMIT ?7",
        )?;
        let rows = stmt.query_map(
            params![f.tool_server, f.kind, f.outcome, f.since_ms, f.until_ms, f.after_seq.unwrap_or(0), f.limit],
            |r| {
                Ok(Row {
                    seq: r.get(0)?,
                    id: r.get(1)?,
                    kind: r.get(2)?,
                    tool_server: r.get(3)?,
                    outcome: r.get(4)?,
                    issued_at: time::rfc3339(r.get(5)?),
                    envelope: r.get(6)?,
                })
            },
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Verify the chain over `[from, to]` (whole store by default): every id, every column against
    /// its body, contiguous sequence numbers and links — and, with a pinned key, every signature.
    pub fn verify_chain(
        &self,
        kernel_key_hex: Option<&str>,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<ChainReport, StoreError> {
        let from = from.unwrap_or(1).max(1);
        let mut report = ChainReport::default();
        let (mut seq, mut prev) = if from == 1 {
            (0, GENESIS.to_string())
        } else {
            let prev: Option<String> =
                self.conn.query_row("SELECT id FROM receipts WHERE seq = ?1", [from - 1], |r| r.get(0)).optional()?;
            match prev {
                Some(id) => (from - 1, id),
                None => {
                    report.problems.push((from - 1, String::new(), "the receipt before the range is missing".into()));
                    (from - 1, String::new())
                }
            }
        };
        let mut stmt = self.conn.prepare(
            "SELECT seq, id, kind, tool_server, outcome, prev, envelope, issued_at_ms FROM receipts WHERE seq >= ?1 AND seq <= ?2 ORDER BY seq",
        )?;
        let mut rows = stmt.query(params![from, to.unwrap_or(i64::MAX as u64)])?;
        while let Some(r) = rows.next()? {
            // A row whose bytes were damaged is reported by its seq and id (as far as they can
            // be read), not as a conversion error that ends the verification.
            let row_seq: u64 = r.get::<_, i64>(0).map_or(0, |v| v as u64);
            let row_id: String = r.get(1).unwrap_or_else(|_| "(unreadable id)".into());
            let read = (|| -> rusqlite::Result<_> {
                let columns: (String, Option<String>, String, String) = (r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?);
                Ok((columns, r.get::<_, String>(6)?, r.get::<_, i64>(7)?))
            })();
            report.checked += 1;
            let (columns, envelope, issued_at_ms) = match read {
                Ok(v) => v,
                Err(e) => {
                    report.problems.push((row_seq, row_id.clone(), format!("the row is corrupt: {e}")));
                    seq = row_seq;
                    prev = row_id;
                    continue;
                }
            };
            let mut problem = |why: String| report.problems.push((row_seq, row_id.clone(), why));
            if row_seq != seq + 1 {
                problem(format!("sequence jumps from {seq} to {row_seq}: receipts are missing"));
            }
            let checked = match kernel_key_hex {
                Some(k) => receipt::verify(envelope.as_bytes(), k),
                None => receipt::parse_unsigned(envelope.as_bytes()),
            };
            match checked {
                Err(e) => problem(format!("signature or body refused: {e}")),
                Ok(v) => {
                    if v.id != row_id {
                        problem(format!("stored id differs from the body's digest {}", v.id));
                    }
                    if v.body.seq != row_seq {
                        problem(format!("body says seq {} (rows were reordered)", v.body.seq));
                    }
                    if v.body.prev != prev {
                        problem(format!("links to {} but the previous receipt is {prev}", v.body.prev));
                    }
                    let body_cols = (
                        v.body.kind.name().to_string(),
                        v.body.tool_server.clone(),
                        v.body.outcome.clone(),
                        v.body.prev.clone(),
                    );
                    if body_cols != columns {
                        problem("indexed columns differ from the signed body".into());
                    }
                    // The time column is what `list --since/--until` filters on.
                    if time::rfc3339(issued_at_ms) != v.body.issued_at {
                        problem(format!(
                            "issued_at_ms column ({}) differs from the signed issued_at {}",
                            time::rfc3339(issued_at_ms),
                            v.body.issued_at
                        ));
                    }
                }
            }
            seq = row_seq;
            prev = row_id;
        }
        Ok(report)
    }

    /// A signed checkpoint of the chain's head (`chio.receipt-checkpoint.v1`: seq and id of the
    /// last receipt, time), for the operator to keep elsewhere: deleting the newest receipts
    /// (or all of them) leaves a chain that verifies, but not against its checkpoint.
    pub fn checkpoint(&self, key: &SigningKey) -> Result<crate::envelope::Signed, StoreError> {
        let head: Option<(u64, String)> = self
            .conn
            .query_row("SELECT seq, id FROM receipts ORDER BY seq DESC LIMIT 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let (seq, id) = head.unwrap_or((0, GENESIS.to_string()));
        let body = serde_json::json!({
            "schema": CHECKPOINT_SCHEMA, "seq": seq, "id": id, "issued_at": time::rfc3339(time::now_ms()),
        });
        crate::envelope::sign(key, body).map_err(|e| StoreError::Receipt(receipt::ReceiptError::Envelope(e)))
    }

    /// Check the store against a checkpoint (its envelope's bytes) signed by the pinned key: the
    /// receipt at the checkpoint's seq must exist and have its id. Returns the problems.
    pub fn check_checkpoint(&self, checkpoint: &[u8], key_hex: &str) -> Result<Vec<String>, StoreError> {
        let body = crate::envelope::verify(checkpoint, key_hex)
            .map_err(|e| StoreError::Refused(format!("the checkpoint does not verify: {e}")))?;
        let (Some(CHECKPOINT_SCHEMA), Some(seq), Some(id)) =
            (body["schema"].as_str(), body["seq"].as_u64(), body["id"].as_str())
        else {
            return Err(StoreError::Refused(format!("the checkpoint is not a {CHECKPOINT_SCHEMA} document")));
        };
        if seq == 0 {
            return Ok(Vec::new());
        }
        let at: Option<String> =
            self.conn.query_row("SELECT id FROM receipts WHERE seq = ?1", [seq], |r| r.get(0)).optional()?;
        let last = self.conn.query_row("SELECT coalesce(max(seq), 0) FROM receipts", [], |r| r.get::<_, u64>(0))?;
        Ok(match at {
            Some(found) if found == id => Vec::new(),
            Some(found) => vec![format!("receipt {seq} is {found} but the checkpoint says {id}: the chain diverges")],
            None if last < seq => vec![format!(
                "the store ends at receipt {last} but its checkpoint is at {seq}: receipts {}..{seq} were deleted",
                last + 1
            )],
            None => vec![format!("receipt {seq} of the checkpoint is missing")],
        })
    }

    /// Number of receipts.
    pub fn count(&self) -> Result<u64, StoreError> {
        Ok(self.conn.query_row("SELECT count(*) FROM receipts", [], |r| r.get(0))?)
    }

    /// Receipts of `kind`, and the sequence number of the `n`th newest of them (counting from 1;
    /// `None` when there are fewer): where a view of the newest `n` begins.
    pub fn newest_of_kind(&self, kind: &str, n: u64) -> Result<(u64, Option<u64>), StoreError> {
        let total = self.conn.query_row("SELECT count(*) FROM receipts WHERE kind = ?1", [kind], |r| r.get(0))?;
        let nth = self
            .conn
            .query_row(
                "SELECT seq FROM receipts WHERE kind = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2",
                params![kind, n.saturating_sub(1)],
                |r| r.get(0),
            )
            .optional()?;
        Ok((total, nth))
    }

    /// The raw connection (tests use it to play the attacker; the journal shares the file).
    #[doc(hidden)]
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Commits on this connection stop waiting for fsync (`synchronous=NORMAL`): for a journal
    /// whose entries share the WAL with receipts, whose `FULL` commits (on any connection) fsync
    /// the whole log, every earlier frame with it. A crash of the process loses nothing; a power
    /// loss loses only what no receipt has made durable since.
    pub fn defer_sync(&self) -> Result<(), StoreError> {
        self.conn.execute_batch("PRAGMA synchronous=NORMAL;")?;
        Ok(())
    }

    /// Mutable access for the operation journal's transactions.
    pub(crate) fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;
    use crate::receipt::Kind;

    /// A store file in /tmp, removed (with its -wal and -shm) when the test is done, pass or fail.
    struct TempDb(std::path::PathBuf);

    impl Drop for TempDb {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
            }
        }
    }

    impl std::ops::Deref for TempDb {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    fn temp(tag: &str) -> TempDb {
        let p = std::env::temp_dir().join(format!("chio-store-{tag}-{}.db", std::process::id()));
        let t = TempDb(p);
        drop(TempDb(t.0.clone()));
        t
    }

    fn draft(i: usize) -> Draft {
        Draft {
            kind: Some(if i % 2 == 0 { Kind::LaunchEnforcement } else { Kind::LaunchTerminal }),
            tool_server: Some(format!("server-{}", i % 3)),
            outcome: if i % 2 == 0 { "FullyEnforced".into() } else { "exit:0".into() },
            ..Draft::default()
        }
    }

    fn filled(tag: &str, n: usize) -> (Store, String, TempDb) {
        let path = temp(tag);
        let key = keys::generate().unwrap();
        let mut s = Store::open(&path, true).unwrap();
        for i in 0..n {
            s.append(&key, draft(i)).unwrap();
        }
        (s, keys::hex(key.verifying_key().as_bytes()), path)
    }

    #[test]
    fn append_list_and_verify() {
        let (s, pk, _) = filled("basic", 10);
        assert_eq!(s.count().unwrap(), 10);
        let report = s.verify_chain(Some(&pk), None, None).unwrap();
        assert_eq!(report, ChainReport { checked: 10, problems: vec![] });
        let page = s.list(&Filter { tool_server: Some("server-1".into()), limit: 2, ..Filter::default() }).unwrap();
        assert_eq!(page.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![2, 5]);
        let next = s
            .list(&Filter { tool_server: Some("server-1".into()), limit: 2, after_seq: Some(5), ..Filter::default() })
            .unwrap();
        assert_eq!(next.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![8]);
        let kinds = s.list(&Filter { kind: Some("launch_terminal".into()), limit: 100, ..Filter::default() }).unwrap();
        assert_eq!(kinds.len(), 5);
        assert_eq!(s.verify_chain(Some(&pk), Some(4), Some(7)).unwrap().checked, 4);
        assert_eq!(s.verify_chain(None, None, None).unwrap(), ChainReport { checked: 10, problems: vec![] });
    }

    #[test]
    fn wrong_key_fails_every_receipt() {
        let (s, _, _) = filled("wrongkey", 3);
        let other = keys::hex(keys::generate().unwrap().verifying_key().as_bytes());
        assert_eq!(s.verify_chain(Some(&other), None, None).unwrap().problems.len(), 3);
    }

    #[test]
    fn updates_and_deletes_are_refused_by_the_store() {
        let (s, _, _) = filled("appendonly", 2);
        for sql in ["UPDATE receipts SET outcome = 'x' WHERE seq = 1", "DELETE FROM receipts WHERE seq = 1"] {
            let e = s.connection().execute(sql, []).unwrap_err();
            assert!(e.to_string().contains("append-only"), "{sql}: {e}");
        }
    }

    fn attacker(s: &Store, sql: &str) {
        s.connection()
            .execute_batch(&format!("DROP TRIGGER receipts_no_update; DROP TRIGGER receipts_no_delete; {sql}"))
            .unwrap();
    }

    #[test]
    fn tampering_is_detected() {
        // An edited row (its body changed, signature now wrong).
        let (s, pk, _) = filled("edit", 5);
        attacker(&s, "UPDATE receipts SET envelope = replace(envelope, 'exit:0', 'exit:1') WHERE seq = 2");
        let r = s.verify_chain(Some(&pk), None, None).unwrap();
        assert!(r.problems.iter().any(|(seq, _, why)| *seq == 2 && why.contains("signature")), "{r:?}");
        // A deleted row.
        let (s, pk, _) = filled("delete", 5);
        attacker(&s, "DELETE FROM receipts WHERE seq = 3");
        let r = s.verify_chain(Some(&pk), None, None).unwrap();
        assert!(r.problems.iter().any(|(seq, _, why)| *seq == 4 && why.contains("missing")), "{r:?}");
        // Two rows swapped.
        let (s, pk, _) = filled("reorder", 5);
        attacker(
            &s,
            "UPDATE receipts SET seq = 100 WHERE seq = 2; UPDATE receipts SET seq = 2 WHERE seq = 3;
             UPDATE receipts SET seq = 3 WHERE seq = 100;",
        );
        let r = s.verify_chain(Some(&pk), None, None).unwrap();
        assert!(r.problems.iter().any(|(_, _, why)| why.contains("reordered")), "{r:?}");
        // The time column moved (it would hide the receipt from `list --since`).
        let (s, pk, _) = filled("time", 3);
        attacker(&s, "UPDATE receipts SET issued_at_ms = issued_at_ms - 86400000 WHERE seq = 2");
        let r = s.verify_chain(Some(&pk), None, None).unwrap();
        assert!(r.problems.iter().any(|(seq, _, why)| *seq == 2 && why.contains("issued_at")), "{r:?}");
        // An indexed column changed without touching the signed body.
        let (s, pk, _) = filled("column", 3);
        attacker(&s, "UPDATE receipts SET outcome = 'FullyEnforced' WHERE seq = 2");
        let r = s.verify_chain(Some(&pk), None, None).unwrap();
        assert!(r.problems.iter().any(|(seq, _, why)| *seq == 2 && why.contains("columns")), "{r:?}");
    }

    #[test]
    fn a_store_is_bound_to_the_key_that_first_wrote_it() {
        let path = temp("bound");
        let (k1, k2) = (keys::generate().unwrap(), keys::generate().unwrap());
        let mut s = Store::open(&path, true).unwrap();
        s.bind_key(&k1).unwrap();
        s.append(&k1, draft(0)).unwrap();
        drop(s);
        let mut s = Store::open(&path, true).unwrap();
        let e = s.bind_key(&k2).unwrap_err();
        let pk1 = keys::hex(k1.verifying_key().as_bytes());
        assert!(matches!(&e, StoreError::Refused(m) if m.contains(&format!("bound to kernel key {pk1}"))), "{e}");
        s.bind_key(&k1).unwrap();
        // The binding itself cannot be rewritten through SQL.
        assert!(s
            .connection()
            .execute("UPDATE store_meta SET value = 'x'", [])
            .is_err_and(|e| e.to_string().contains("fixed")));
    }

    #[test]
    fn a_store_from_before_the_binding_is_bound_to_its_first_signer() {
        let (s, pk, path) = filled("legacy", 2);
        s.connection().execute_batch("DROP TABLE store_meta; PRAGMA user_version = 1;").unwrap();
        drop(s);
        let mut s = Store::open(&path, true).unwrap();
        let other = keys::generate().unwrap();
        let e = s.bind_key(&other).unwrap_err();
        assert!(matches!(&e, StoreError::Refused(m) if m.contains(&pk)), "{e}");
    }

    #[test]
    fn a_broken_tail_refuses_appends_naming_the_receipt() {
        let path = temp("tail");
        let key = keys::generate().unwrap();
        let mut s = Store::open(&path, true).unwrap();
        s.bind_key(&key).unwrap();
        for i in 0..4 {
            s.append(&key, draft(i)).unwrap();
        }
        let last_id: String =
            s.connection().query_row("SELECT id FROM receipts WHERE seq = 4", [], |r| r.get(0)).unwrap();
        // An edited last receipt.
        attacker(&s, "UPDATE receipts SET envelope = replace(envelope, 'exit:0', 'exit:1') WHERE seq = 4");
        let e = s.bind_key(&key).unwrap_err();
        assert!(
            matches!(&e, StoreError::Refused(m) if m.contains(&format!("receipt 4 ({last_id})")) && m.contains("signature")),
            "{e}"
        );
        // A receipt deleted before the last.
        let path = temp("tail-gap");
        let mut s = Store::open(&path, true).unwrap();
        s.bind_key(&key).unwrap();
        for i in 0..4 {
            s.append(&key, draft(i)).unwrap();
        }
        attacker(&s, "DELETE FROM receipts WHERE seq = 2");
        let e = s.bind_key(&key).unwrap_err();
        assert!(matches!(&e, StoreError::Refused(m) if m.contains("receipt 4") && m.contains("3 receipts")), "{e}");
        // An indexed column of the last receipt.
        let path = temp("tail-column");
        let mut s = Store::open(&path, true).unwrap();
        s.bind_key(&key).unwrap();
        s.append(&key, draft(1)).unwrap();
        attacker(&s, "UPDATE receipts SET outcome = 'exit:7' WHERE seq = 1");
        let e = s.bind_key(&key).unwrap_err();
        assert!(matches!(&e, StoreError::Refused(m) if m.contains("receipt 1") && m.contains("columns")), "{e}");
    }

    #[test]
    fn many_processes_creating_one_store_all_succeed() {
        let path = temp("concurrent");
        let key = keys::generate().unwrap();
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (p, k) = (path.0.clone(), key.clone());
                std::thread::spawn(move || -> Result<(), StoreError> {
                    let mut s = Store::open(&p, true)?;
                    s.bind_key(&k)?;
                    s.append(&k, draft(0)).map(drop)
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        let s = Store::open(&path, false).unwrap();
        assert_eq!(s.count().unwrap(), 16);
        let pk = keys::hex(key.verifying_key().as_bytes());
        assert!(s.verify_chain(Some(&pk), None, None).unwrap().problems.is_empty());
    }

    /// Creators that start together on a fresh file all reach the WAL switch at once: SQLite
    /// refuses all but one of them with `SQLITE_BUSY` without calling the busy handler (each
    /// holds a read lock it would have to give up), so `open` must retry that step itself.
    #[test]
    fn creators_that_start_together_all_succeed() {
        for round in 0..40 {
            let path = temp(&format!("together-{round}"));
            let start = std::sync::Arc::new(std::sync::Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (p, start) = (path.0.clone(), start.clone());
                    std::thread::spawn(move || -> Result<(), StoreError> {
                        start.wait();
                        Store::open(&p, true).map(drop)
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap().unwrap_or_else(|e| panic!("round {round}: {e}"));
            }
            assert_eq!(Store::open(&path, false).unwrap().health().unwrap().journal_mode, "wal");
        }
    }

    #[test]
    fn deleting_the_newest_receipts_is_caught_by_a_checkpoint() {
        let path = temp("checkpoint");
        let key = keys::generate().unwrap();
        let pk = keys::hex(key.verifying_key().as_bytes());
        let mut s = Store::open(&path, true).unwrap();
        s.bind_key(&key).unwrap();
        for i in 0..5 {
            s.append(&key, draft(i)).unwrap();
        }
        let cp = serde_json::to_vec(&s.checkpoint(&key).unwrap()).unwrap();
        assert_eq!(s.check_checkpoint(&cp, &pk).unwrap(), Vec::<String>::new());
        s.append(&key, draft(5)).unwrap();
        assert_eq!(s.check_checkpoint(&cp, &pk).unwrap(), Vec::<String>::new(), "a longer store still holds it");
        attacker(&s, "DELETE FROM receipts WHERE seq >= 4");
        assert!(s.verify_chain(Some(&pk), None, None).unwrap().problems.is_empty(), "the shorter chain verifies");
        let p = s.check_checkpoint(&cp, &pk).unwrap();
        assert!(p[0].contains("ends at receipt 3") && p[0].contains("4..5 were deleted"), "{p:?}");
        // Another key's checkpoint is refused.
        let other = keys::hex(keys::generate().unwrap().verifying_key().as_bytes());
        assert!(matches!(s.check_checkpoint(&cp, &other), Err(StoreError::Refused(_))));
    }

    #[test]
    fn a_corrupt_row_is_reported_by_seq_and_id() {
        let (s, pk, path) = filled("corrupt-row", 3);
        let (id, env): (String, String) = s
            .connection()
            .query_row("SELECT id, envelope FROM receipts WHERE seq = 2", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        s.connection().execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
        drop(s);
        // One byte of the file changed inside row 2's envelope: no longer UTF-8 text.
        let sig = serde_json::from_str::<serde_json::Value>(&env).unwrap()["signature"].as_str().unwrap().to_string();
        let mut bytes = std::fs::read(&*path).unwrap();
        let at = bytes.windows(sig.len()).position(|w| w == sig.as_bytes()).unwrap();
        bytes[at] = 0xff;
        std::fs::write(&*path, bytes).unwrap();
        let s = Store::open(&path, false).unwrap();
        let r = s.verify_chain(Some(&pk), None, None).unwrap();
        assert_eq!(r.checked, 3, "the verification goes on past the corrupt row: {r:?}");
        assert!(r.problems.iter().any(|(seq, pid, why)| *seq == 2 && *pid == id && why.contains("corrupt")), "{r:?}");
    }

    #[test]
    fn foreign_and_newer_databases_are_refused() {
        let path = temp("foreign");
        let c = Connection::open(&*path).unwrap();
        c.execute_batch("CREATE TABLE t(x); PRAGMA application_id = 42;").unwrap();
        drop(c);
        assert!(
            matches!(Store::open(&path, true), Err(StoreError::Foreign(e)) if e.contains("not a chio receipt store"))
        );
        let (s, _, path) = filled("newer", 1);
        s.connection().execute_batch("PRAGMA user_version = 3;").unwrap();
        drop(s);
        assert!(matches!(Store::open(&path, false), Err(StoreError::Foreign(e)) if e.contains("schema 3")));
        assert!(matches!(Store::open(&temp("absent"), false), Err(StoreError::Foreign(_))));
    }

    #[test]
    fn a_database_without_our_id_is_foreign_even_with_tables() {
        let path = temp("foreign0");
        Connection::open(&*path).unwrap().execute_batch("CREATE TABLE t(x);").unwrap();
        for create in [true, false] {
            let e = Store::open(&path, create).err().unwrap();
            assert_eq!(e.to_string(), format!("{} is not a chio receipt store", path.display()), "create {create}");
        }
        // Our id without a schema version: a store of an unknown schema, not someone else's file.
        let c = Connection::open(&*path).unwrap();
        c.execute_batch(&format!("PRAGMA application_id = {APPLICATION_ID};")).unwrap();
        drop(c);
        let e = Store::open(&path, false).err().unwrap();
        assert!(e.to_string().ends_with("has receipt store schema 0; this chio reads schema 2"), "{e}");
        let e = Store::open(&temp("empty"), false).err().unwrap();
        assert!(e.to_string().contains("no such file") || e.to_string().contains("unable to open"), "{e}");
        assert_eq!(
            StoreError::from(rusqlite::Error::QueryReturnedNoRows).to_string(),
            "receipt store: Query returned no rows"
        );
    }

    #[test]
    fn a_store_opened_read_only_is_read_and_a_foreign_one_refused() {
        let (s, pk, path) = filled("ro", 3);
        drop(s);
        let ro = Store::open_read_only(&path).unwrap();
        assert_eq!(ro.verify_chain(Some(&pk), None, None).unwrap(), ChainReport { checked: 3, problems: vec![] });
        let h = ro.health().unwrap();
        assert_eq!((h.quick_check.as_str(), h.application_id, h.user_version), ("ok", APPLICATION_ID, USER_VERSION));
        assert!(ro.connection().execute("INSERT INTO operations VALUES ('k','s','pending',NULL,0)", []).is_err());
        drop(ro);
        let e = Store::open_read_only(&temp("ro-absent")).err().unwrap();
        assert!(e.to_string().contains("is not a receipt store (no such file)"), "{e}");
        let c = Connection::open(&*path).unwrap();
        c.execute_batch("PRAGMA user_version = 3;").unwrap();
        let e = Store::open_read_only(&path).err().unwrap();
        assert!(e.to_string().contains("has receipt store schema 3"), "{e}");
        c.execute_batch("PRAGMA user_version = 1;").unwrap();
        assert!(Store::open_read_only(&path).is_ok(), "schema 1 is read");
        c.execute_batch("PRAGMA application_id = 42;").unwrap();
        let e = Store::open_read_only(&path).err().unwrap();
        assert!(e.to_string().contains("is not a chio receipt store (application_id 0x2a)"), "{e}");
    }

    #[test]
    fn a_range_links_to_the_receipt_before_it_or_says_it_is_missing() {
        let (s, pk, _) = filled("range", 8);
        assert_eq!(s.verify_chain(Some(&pk), Some(4), Some(7)).unwrap(), ChainReport { checked: 4, problems: vec![] });
        assert_eq!(s.verify_chain(Some(&pk), Some(8), None).unwrap(), ChainReport { checked: 1, problems: vec![] });
        attacker(&s, "DELETE FROM receipts WHERE seq = 3");
        let r = s.verify_chain(Some(&pk), Some(4), Some(5)).unwrap();
        assert_eq!(r.problems[0], (3, String::new(), "the receipt before the range is missing".to_string()), "{r:?}");
        // The range's first receipt links to a receipt that is not there: nothing else is wrong.
        assert_eq!(r.problems.len(), 2, "{r:?}");
        assert!(r.problems[1].0 == 4 && r.problems[1].2.ends_with("but the previous receipt is "), "{r:?}");
    }

    #[test]
    fn a_checkpoint_catches_a_chain_rewritten_under_the_same_key() {
        // Whoever holds the kernel key can sign a whole other history that verifies on its own;
        // a checkpoint kept elsewhere still names the receipt that was there.
        let key = keys::generate().unwrap();
        let pk = keys::hex(key.verifying_key().as_bytes());
        let (a_path, b_path) = (temp("cp-a"), temp("cp-b"));
        let (mut a, mut b) = (Store::open(&a_path, true).unwrap(), Store::open(&b_path, true).unwrap());
        for i in 0..3 {
            a.append(&key, draft(i)).unwrap();
            b.append(&key, draft(i + 1)).unwrap();
        }
        let cp = serde_json::to_vec(&a.checkpoint(&key).unwrap()).unwrap();
        assert!(b.verify_chain(Some(&pk), None, None).unwrap().problems.is_empty());
        let p = b.check_checkpoint(&cp, &pk).unwrap();
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("receipt 3 is ") && p[0].ends_with("the chain diverges"), "{p:?}");
        // The checkpoint's receipt removed from inside a longer chain: missing, not "deleted at the end".
        a.append(&key, draft(3)).unwrap();
        attacker(&a, "DELETE FROM receipts WHERE seq = 3");
        assert_eq!(a.check_checkpoint(&cp, &pk).unwrap(), vec!["receipt 3 of the checkpoint is missing".to_string()]);
    }

    #[test]
    fn deferred_sync_waits_for_no_fsync_on_that_connection_only() {
        let (s, _, path) = filled("sync", 1);
        let mode = |s: &Store| s.connection().query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0)).unwrap();
        assert_eq!(mode(&s), 2, "FULL");
        s.defer_sync().unwrap();
        assert_eq!(mode(&s), 1, "NORMAL");
        assert_eq!(mode(&Store::open(&path, false).unwrap()), 2, "another connection stays FULL");
    }
}
