//! The operation journal, in the receipt store's file. Every call carries an operation key. The
//! intent is committed before anything is dispatched; the same key with the same request returns
//! the retained result instead of running again; the same key with a different request is a
//! conflict; and after a crash an operation that was dispatched but has no recorded outcome is
//! `outcome_unknown` — never dispatched again under that key.
//!
//! States and transitions:
//! ```text
//!   (none) --begin--> pending --dispatch--> dispatched --complete--> completed
//!   (none) --begin_dispatched--> dispatched        (both steps in one transaction)
//!   pending --recover--> abandoned --begin (same request)--> pending
//!   dispatched --recover--> outcome_unknown            (terminal)
//! ```

use rusqlite::{params, OptionalExtension, TransactionBehavior};

use crate::store::{Store, StoreError};
use crate::time;

/// State of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpState {
    /// Intent committed, not dispatched yet.
    Pending,
    /// Dispatch began; the outcome is not recorded yet.
    Dispatched,
    /// Finished; the result is retained.
    Completed,
    /// Dispatched before a crash without a recorded outcome: never dispatched again.
    OutcomeUnknown,
    /// Pending when a crash happened, so never dispatched: may be claimed again.
    Abandoned,
}

impl OpState {
    fn name(self) -> &'static str {
        match self {
            OpState::Pending => "pending",
            OpState::Dispatched => "dispatched",
            OpState::Completed => "completed",
            OpState::OutcomeUnknown => "outcome_unknown",
            OpState::Abandoned => "abandoned",
        }
    }

    fn parse(s: &str) -> Result<OpState, StoreError> {
        Ok(match s {
            "pending" => OpState::Pending,
            "dispatched" => OpState::Dispatched,
            "completed" => OpState::Completed,
            "outcome_unknown" => OpState::OutcomeUnknown,
            "abandoned" => OpState::Abandoned,
            other => return Err(StoreError::Invalid(format!("journal holds an unknown state {other:?}"))),
        })
    }
}

/// What `begin` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Intent committed: dispatch it (after `dispatch`).
    Proceed,
    /// Already completed with the same request: here is the retained result.
    Retained(String),
    /// The key was used for a different request.
    Conflict {
        /// SHA-256 of the request the key was first used for.
        original: String,
    },
    /// Another call with this key is in progress.
    InProgress,
    /// Dispatched before a crash with no recorded outcome: it will not be dispatched again.
    OutcomeUnknown,
}

impl Store {
    fn op_row(
        tx: &rusqlite::Transaction<'_>,
        key: &str,
    ) -> Result<Option<(String, OpState, Option<String>)>, StoreError> {
        let row: Option<(String, String, Option<String>)> = tx
            .query_row("SELECT request_sha256, state, result FROM operations WHERE op_key = ?1", [key], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()?;
        row.map(|(d, s, r)| Ok((d, OpState::parse(&s)?, r))).transpose()
    }

    fn op_set(
        tx: &rusqlite::Transaction<'_>,
        key: &str,
        state: OpState,
        result: Option<&str>,
    ) -> Result<(), StoreError> {
        tx.execute(
            "UPDATE operations SET state = ?2, result = COALESCE(?3, result), updated_at_ms = ?4 WHERE op_key = ?1",
            params![key, state.name(), result, time::now_ms()],
        )?;
        Ok(())
    }

    /// Record the intent for `key` (committed before this returns) or say why not to dispatch.
    pub fn op_begin(&mut self, key: &str, request_sha256: &str) -> Result<Begin, StoreError> {
        self.begin_as(key, request_sha256, OpState::Pending)
    }

    /// `op_begin` and `op_dispatch` in one transaction (one fsync), for a caller that dispatches
    /// at once: the intent is committed as dispatched, so a crash before the dispatch counts as
    /// `outcome_unknown` — never dispatched again — rather than `abandoned`.
    pub fn op_begin_dispatched(&mut self, key: &str, request_sha256: &str) -> Result<Begin, StoreError> {
        self.begin_as(key, request_sha256, OpState::Dispatched)
    }

    fn begin_as(&mut self, key: &str, request_sha256: &str, state: OpState) -> Result<Begin, StoreError> {
        let tx = self.connection_mut().transaction_with_behavior(TransactionBehavior::Immediate)?;
        let decision = match Self::op_row(&tx, key)? {
            None => {
                tx.execute(
                    "INSERT INTO operations (op_key, request_sha256, state, updated_at_ms) VALUES (?1, ?2, ?3, ?4)",
                    params![key, request_sha256, state.name(), time::now_ms()],
                )?;
                Begin::Proceed
            }
            Some((original, _, _)) if original != request_sha256 => Begin::Conflict { original },
            Some((_, OpState::Completed, result)) => Begin::Retained(result.unwrap_or_default()),
            Some((_, OpState::Pending | OpState::Dispatched, _)) => Begin::InProgress,
            Some((_, OpState::OutcomeUnknown, _)) => Begin::OutcomeUnknown,
            Some((_, OpState::Abandoned, _)) => {
                Self::op_set(&tx, key, state, None)?;
                Begin::Proceed
            }
        };
        tx.commit()?;
        Ok(decision)
    }

    fn op_transition(&mut self, key: &str, from: OpState, to: OpState, result: Option<&str>) -> Result<(), StoreError> {
        let tx = self.connection_mut().transaction_with_behavior(TransactionBehavior::Immediate)?;
        match Self::op_row(&tx, key)? {
            Some((_, s, _)) if s == from => Self::op_set(&tx, key, to, result)?,
            Some((_, s, _)) => {
                return Err(StoreError::Invalid(format!(
                    "operation {key} is {}; only a {} operation can become {}",
                    s.name(),
                    from.name(),
                    to.name()
                )))
            }
            None => return Err(StoreError::Invalid(format!("operation {key} was never begun"))),
        }
        tx.commit()?;
        Ok(())
    }

    /// Mark `key` dispatched (committed before the caller dispatches).
    pub fn op_dispatch(&mut self, key: &str) -> Result<(), StoreError> {
        self.op_transition(key, OpState::Pending, OpState::Dispatched, None)
    }

    /// Record the outcome of a dispatched operation; it is retained for repeats of the key.
    pub fn op_complete(&mut self, key: &str, result: &str) -> Result<(), StoreError> {
        self.op_transition(key, OpState::Dispatched, OpState::Completed, Some(result))
    }

    /// Forget settled operations (completed or outcome_unknown) under `prefix` last touched
    /// before `before_ms`: their retained results stop answering repeats. Returns how many.
    pub fn op_prune(&mut self, prefix: &str, before_ms: i64) -> Result<usize, StoreError> {
        let tx = self.connection_mut().transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx.execute(
            "DELETE FROM operations WHERE substr(op_key, 1, length(?1)) = ?1 \
             AND state IN ('completed', 'outcome_unknown') AND updated_at_ms < ?2",
            params![prefix, before_ms],
        )?;
        tx.commit()?;
        Ok(n)
    }

    /// A dispatched operation whose outcome was lost (its worker died without answering):
    /// `outcome_unknown`, never dispatched again — as after a crash, without one.
    pub fn op_unknown(&mut self, key: &str) -> Result<(), StoreError> {
        self.op_transition(key, OpState::Dispatched, OpState::OutcomeUnknown, None)
    }

    /// After a crash: dispatched operations become `outcome_unknown`, pending ones `abandoned`.
    /// Returns (outcome_unknown, abandoned) counts.
    pub fn op_recover(&mut self) -> Result<(usize, usize), StoreError> {
        let tx = self.connection_mut().transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now = time::now_ms();
        let unknown = tx.execute(
            "UPDATE operations SET state = 'outcome_unknown', updated_at_ms = ?1 WHERE state = 'dispatched'",
            [now],
        )?;
        let abandoned =
            tx.execute("UPDATE operations SET state = 'abandoned', updated_at_ms = ?1 WHERE state = 'pending'", [now])?;
        tx.commit()?;
        Ok((unknown, abandoned))
    }

    /// Append receipts and complete the dispatched operation `key` in one transaction: the
    /// receipts and the retained result (built by `result` from the appended receipts) become
    /// durable together, or neither does.
    pub fn op_complete_with_receipts(
        &mut self,
        key: &str,
        signer: &ed25519_dalek::SigningKey,
        drafts: Vec<crate::receipt::Draft>,
        result: impl FnOnce(&[crate::store::Appended]) -> String,
    ) -> Result<Vec<crate::store::Appended>, StoreError> {
        let tx = self.connection_mut().transaction_with_behavior(TransactionBehavior::Immediate)?;
        match Self::op_row(&tx, key)? {
            Some((_, OpState::Dispatched, _)) => {}
            Some((_, s, _)) => {
                return Err(StoreError::Invalid(format!(
                    "operation {key} is {}; only a dispatched one can complete",
                    s.name()
                )))
            }
            None => return Err(StoreError::Invalid(format!("operation {key} was never begun"))),
        }
        let mut appended = Vec::with_capacity(drafts.len());
        for d in drafts {
            appended.push(Store::append_in(&tx, signer, d)?);
        }
        Self::op_set(&tx, key, OpState::Completed, Some(&result(&appended)))?;
        tx.commit()?;
        Ok(appended)
    }

    /// Keys of operations begun or dispatched and not finished. With the caller holding the
    /// only right to dispatch (a workspace lock, say), each is a crash's leftover.
    pub fn op_unsettled(&self) -> Result<Vec<String>, StoreError> {
        let mut q = self
            .connection()
            .prepare("SELECT op_key FROM operations WHERE state IN ('pending', 'dispatched') ORDER BY op_key")?;
        let rows = q.query_map([], |r| r.get::<_, String>(0))?;
        rows.map(|r| r.map_err(StoreError::from)).collect()
    }

    /// How many operations are in each state (by state name).
    pub fn op_counts(&self) -> Result<std::collections::BTreeMap<String, u64>, StoreError> {
        let mut q = self.connection().prepare("SELECT state, COUNT(*) FROM operations GROUP BY state")?;
        let rows = q.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        rows.map(|r| r.map(|(s, n)| (s, n as u64)).map_err(StoreError::from)).collect()
    }

    /// Current state of `key`.
    pub fn op_state(&mut self, key: &str) -> Result<Option<OpState>, StoreError> {
        let tx = self.connection_mut().transaction()?;
        let s = Self::op_row(&tx, key)?.map(|(_, s, _)| s);
        tx.commit()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh store in memory (SQLite's `:memory:`): the journal's logic is what is tested
    /// here, and nothing is left in /tmp.
    fn store() -> Store {
        Store::open(std::path::Path::new(":memory:"), true).unwrap()
    }

    #[test]
    fn begin_dispatched_is_one_step_and_recovers_as_unknown() {
        let mut s = store();
        assert_eq!(s.op_begin_dispatched("k", "req").unwrap(), Begin::Proceed);
        assert_eq!(s.op_state("k").unwrap(), Some(OpState::Dispatched));
        assert_eq!(s.op_begin_dispatched("k", "req").unwrap(), Begin::InProgress);
        assert_eq!(s.op_begin_dispatched("k", "other").unwrap(), Begin::Conflict { original: "req".into() });
        assert_eq!(s.op_recover().unwrap(), (1, 0));
        assert_eq!(s.op_begin_dispatched("k", "req").unwrap(), Begin::OutcomeUnknown);
        s.op_complete("x", "r").unwrap_err();
    }

    #[test]
    fn a_lost_outcome_is_unknown_at_once_and_only_for_a_dispatched_key() {
        let mut s = store();
        s.op_begin_dispatched("k", "req").unwrap();
        s.op_unknown("k").unwrap();
        assert_eq!(s.op_begin_dispatched("k", "req").unwrap(), Begin::OutcomeUnknown);
        s.op_unknown("k").unwrap_err();
        s.op_unknown("never").unwrap_err();
        reach(&mut s, "done", OpState::Completed);
        s.op_unknown("done").unwrap_err();
    }

    #[test]
    fn pruning_forgets_only_old_settled_operations_under_the_prefix() {
        let mut s = store();
        reach(&mut s, "d:done", OpState::Completed);
        reach(&mut s, "d:running", OpState::Dispatched);
        reach(&mut s, "other:done", OpState::Completed);
        s.op_begin_dispatched("d:lost", "req").unwrap();
        s.op_unknown("d:lost").unwrap();
        assert_eq!(s.op_prune("d:", 0).unwrap(), 0, "nothing is older than the epoch");
        assert_eq!(s.op_prune("d:", time::now_ms() + 1).unwrap(), 2);
        assert_eq!(s.op_state("d:done").unwrap(), None);
        assert_eq!(s.op_state("d:lost").unwrap(), None);
        assert_eq!(s.op_state("d:running").unwrap(), Some(OpState::Dispatched));
        assert_eq!(s.op_state("other:done").unwrap(), Some(OpState::Completed));
    }

    #[test]
    fn receipts_and_completion_are_one_transaction() {
        let mut s = store();
        let key = crate::keys::generate().unwrap();
        let draft = || crate::receipt::Draft {
            kind: Some(crate::receipt::Kind::ToolCall),
            outcome: "exit:0".into(),
            ..Default::default()
        };
        // Not dispatched: refused, and no receipt is stored.
        assert!(s.op_complete_with_receipts("k", &key, vec![draft()], |_| "r".into()).is_err());
        assert_eq!(s.count().unwrap(), 0);
        s.op_begin_dispatched("k", "req").unwrap();
        let a = s.op_complete_with_receipts("k", &key, vec![draft(), draft()], |a| a[1].receipt.id.clone()).unwrap();
        assert_eq!(s.count().unwrap(), 2);
        assert_eq!(s.op_begin("k", "req").unwrap(), Begin::Retained(a[1].receipt.id.clone()));
    }

    #[test]
    fn counts_by_state() {
        let mut s = store();
        reach(&mut s, "a", OpState::Completed);
        reach(&mut s, "b", OpState::Dispatched);
        reach(&mut s, "c", OpState::Dispatched);
        let c = s.op_counts().unwrap();
        assert_eq!((c["completed"], c["dispatched"], c.len()), (1, 2, 2));
        reach(&mut s, "d", OpState::Pending);
        assert_eq!(s.op_unsettled().unwrap(), ["b", "c", "d"]);
    }

    /// Drive a fresh key into `state`.
    fn reach(s: &mut Store, key: &str, state: OpState) {
        assert_eq!(s.op_begin(key, "req").unwrap(), Begin::Proceed);
        match state {
            OpState::Pending => {}
            OpState::Abandoned => {
                s.op_recover().unwrap();
            }
            OpState::Dispatched => s.op_dispatch(key).unwrap(),
            OpState::Completed => {
                s.op_dispatch(key).unwrap();
                s.op_complete(key, "result-1").unwrap();
            }
            OpState::OutcomeUnknown => {
                s.op_dispatch(key).unwrap();
                s.op_recover().unwrap();
            }
        }
        assert_eq!(s.op_state(key).unwrap(), Some(state));
    }

    const ALL: [OpState; 5] =
        [OpState::Pending, OpState::Dispatched, OpState::Completed, OpState::OutcomeUnknown, OpState::Abandoned];

    #[test]
    fn begin_from_every_state() {
        for state in ALL {
            let mut s = store();
            reach(&mut s, "k", state);
            let same = s.op_begin("k", "req").unwrap();
            let want = match state {
                OpState::Pending | OpState::Dispatched => Begin::InProgress,
                OpState::Completed => Begin::Retained("result-1".into()),
                OpState::OutcomeUnknown => Begin::OutcomeUnknown,
                OpState::Abandoned => Begin::Proceed,
            };
            assert_eq!(same, want, "begin(same) from {state:?}");
            let mut s = store();
            reach(&mut s, "k", state);
            assert_eq!(s.op_begin("k", "other").unwrap(), Begin::Conflict { original: "req".into() }, "{state:?}");
        }
    }

    #[test]
    fn dispatch_and_complete_from_every_state() {
        for state in ALL {
            let mut s = store();
            reach(&mut s, "k", state);
            assert_eq!(s.op_dispatch("k").is_ok(), state == OpState::Pending, "dispatch from {state:?}");
            let mut s = store();
            reach(&mut s, "k", state);
            assert_eq!(s.op_complete("k", "r").is_ok(), state == OpState::Dispatched, "complete from {state:?}");
        }
        let mut s = store();
        let never_begun =
            |r: Result<(), StoreError>| matches!(r, Err(StoreError::Invalid(m)) if m.contains("never begun"));
        assert!(never_begun(s.op_dispatch("never")));
        assert!(never_begun(s.op_complete("never", "r")));
    }

    #[test]
    fn recover_from_every_state() {
        for state in ALL {
            let mut s = store();
            reach(&mut s, "k", state);
            s.op_recover().unwrap();
            let want = match state {
                OpState::Pending | OpState::Abandoned => OpState::Abandoned,
                OpState::Dispatched | OpState::OutcomeUnknown => OpState::OutcomeUnknown,
                OpState::Completed => OpState::Completed,
            };
            assert_eq!(s.op_state("k").unwrap(), Some(want), "recover from {state:?}");
        }
    }

    #[test]
    fn an_unknown_outcome_is_never_dispatched_again() {
        let mut s = store();
        reach(&mut s, "k", OpState::OutcomeUnknown);
        for _ in 0..3 {
            assert_eq!(s.op_begin("k", "req").unwrap(), Begin::OutcomeUnknown);
            let r = s.op_dispatch("k");
            assert!(matches!(&r, Err(StoreError::Invalid(m)) if m.contains("is outcome_unknown")), "{r:?}");
            s.op_recover().unwrap();
        }
    }
}
