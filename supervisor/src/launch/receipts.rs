//! Where a launch records its receipts: a store bound to one kernel key, opened (and its key and
//! tail checked) before anything runs, so a bad key or a foreign store refuses the launch up
//! front instead of losing its evidence after it.

use std::path::Path;
use std::time::{Duration, Instant};

use chio_cage::LaunchRecord;
use chio_kernel::keys::{self, SigningKey};
use chio_kernel::receipt::{Draft, Kind};
use chio_kernel::store::{Appended, Store};

use super::LaunchError;

/// The receipt store and the kernel key of `chio cage run --receipt-db` and of the daemon.
pub struct LaunchReceipts {
    store: Store,
    key: SigningKey,
    /// How long each write took (for the daemon's metrics).
    writes: Vec<Duration>,
}

impl LaunchReceipts {
    /// Open the store at `db` and read the seed at `seed`; the store must be bound to that key
    /// (or bind to it) and its tail must verify.
    pub fn open(db: &Path, seed: &Path) -> Result<LaunchReceipts, LaunchError> {
        let receipts =
            |e: &dyn std::fmt::Display| LaunchError::Receipts(format!("receipt store {}: {e}", db.display()));
        // The seed's errors name it.
        let key = keys::read_seed(seed).map_err(|e| LaunchError::Receipts(e.to_string()))?;
        let mut store = Store::open(db, true).map_err(|e| receipts(&e))?;
        store.bind_key(&key).map_err(|e| receipts(&e))?;
        Ok(LaunchReceipts { store, key, writes: Vec::new() })
    }

    /// How long each of the writes made through this took.
    pub fn into_writes(self) -> Vec<Duration> {
        self.writes
    }

    /// `write`, timed.
    fn timed<T>(&mut self, write: impl FnOnce(&mut Store, &SigningKey) -> T) -> T {
        let began = Instant::now();
        let done = write(&mut self.store, &self.key);
        self.writes.push(began.elapsed());
        done
    }

    /// Append the enforcement receipt for `rec`. Durable when this returns.
    pub fn enforcement(&mut self, rec: &LaunchRecord) -> Result<Appended, String> {
        self.timed(|store, key| crate::receipts::enforcement(store, key, rec)).map_err(|e| e.to_string())
    }

    /// After the launch: the enforcement receipt if the exec stop never came, and the terminal
    /// receipt when the target ran. Returns their ids.
    pub fn finish(&mut self, rec: &LaunchRecord, enforced: Option<Appended>) -> Result<Vec<String>, String> {
        let (e, t) =
            self.timed(|store, key| crate::receipts::finish(store, key, rec, enforced)).map_err(|e| e.to_string())?;
        Ok(std::iter::once(e.receipt.id).chain(t.map(|t| t.receipt.id)).collect())
    }

    /// A policy's refusal of a launch, as a signed `denial` receipt naming every violation.
    /// Returns its id.
    pub fn denial(
        &mut self,
        server_id: &str,
        policy_id: &str,
        manifest_sha256: &str,
        violations: &[String],
    ) -> Result<String, String> {
        let draft = Draft {
            kind: Some(Kind::Denial),
            tool_server: Some(server_id.to_string()),
            outcome: "denied".into(),
            detail: Some(serde_json::json!({
                "policy_id": policy_id, "manifest_sha256": manifest_sha256, "violations": violations,
            })),
            ..Default::default()
        };
        Ok(self.timed(|store, key| store.append(key, draft)).map_err(|e| e.to_string())?.receipt.id)
    }

    /// A session gateway's refusal of model call `call` under `rule` (a budget or the grant's
    /// limit), as a signed `denial` receipt. Returns its id.
    pub fn model_denial(&mut self, rule: &str, why: &str, call: u64) -> Result<String, String> {
        let draft = Draft {
            kind: Some(Kind::Denial),
            tool_server: Some("chio.session.gateway".into()),
            outcome: "denied".into(),
            detail: Some(serde_json::json!({"rule": rule, "reason": why, "model_call": call})),
            ..Default::default()
        };
        Ok(self.timed(|store, key| store.append(key, draft)).map_err(|e| e.to_string())?.receipt.id)
    }
}
