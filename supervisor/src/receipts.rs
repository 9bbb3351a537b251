//! Launch receipts: the enforcement receipt of a launch (durable at the exec stop, before the
//! target's first instruction) and its terminal receipt, in a store bound to one kernel key.
//! The one-shot CLI and the repository leg record launches through here.

use chio_cage::{LaunchRecord, State};
use chio_kernel::canonical;
use chio_kernel::keys::SigningKey;
use chio_kernel::receipt::{self, Draft, Kind, Reference};
use chio_kernel::store::{Appended, Store, StoreError};

fn invalid(e: impl std::fmt::Display) -> StoreError {
    StoreError::Invalid(e.to_string())
}

/// The reference a later receipt makes to `a`: its id and the SHA-256 of its canonical envelope.
pub fn reference(a: &Appended) -> Result<Reference, StoreError> {
    let value = serde_json::to_value(&a.envelope).map_err(invalid)?;
    let canon = canonical::to_canonical(&value).map_err(invalid)?;
    Ok(Reference { receipt_id: a.receipt.id.clone(), receipt_sha256: receipt::sha256_hex(canon.as_bytes()) })
}

/// Append the enforcement receipt for `rec` (the record as it stands: at the exec stop, or the
/// failure). Durable when this returns.
pub fn enforcement(store: &mut Store, key: &SigningKey, rec: &LaunchRecord) -> Result<Appended, StoreError> {
    let record = serde_json::to_value(rec).map_err(invalid)?;
    let state = serde_json::to_value(rec.state).map_err(invalid)?.as_str().unwrap_or("unknown").to_string();
    let draft =
        Draft { kind: Some(Kind::LaunchEnforcement), outcome: state, launch_record: Some(record), ..Draft::default() };
    store.append(key, draft)
}

/// The terminal receipt of a launch whose target ran (none when it never did).
pub fn terminal_draft(rec: &LaunchRecord, enforcement: &Appended) -> Result<Option<Draft>, StoreError> {
    let ran = matches!(rec.state, State::FullyEnforced | State::NotConfined);
    let (true, Some(o)) = (ran, &rec.outcome) else { return Ok(None) };
    let outcome = match (o.exit_code, o.signal) {
        (Some(c), _) => format!("exit:{c}"),
        (_, Some(s)) => format!("signal:{s}"),
        _ => "unknown".into(),
    };
    Ok(Some(Draft {
        kind: Some(Kind::LaunchTerminal),
        outcome,
        launch: Some(reference(enforcement)?),
        detail: Some(serde_json::to_value(o).map_err(invalid)?),
        ..Draft::default()
    }))
}

/// After the launch: the enforcement receipt if the exec stop never came (a failed launch), and,
/// when the target ran, the terminal receipt referencing it. Returns the enforcement receipt and
/// the terminal one.
pub fn finish(
    store: &mut Store,
    key: &SigningKey,
    rec: &LaunchRecord,
    enforced: Option<Appended>,
) -> Result<(Appended, Option<Appended>), StoreError> {
    let enforcement = match enforced {
        Some(e) => e,
        None => enforcement(store, key, rec)?,
    };
    let terminal = match terminal_draft(rec, &enforcement)? {
        Some(d) => Some(store.append(key, d)?),
        None => None,
    };
    Ok((enforcement, terminal))
}
