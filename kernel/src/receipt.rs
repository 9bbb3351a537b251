//! Receipts (`chio.receipt.v1`): signed statements of what the kernel admitted, launched, saw end,
//! or denied. A receipt is a signed envelope whose body carries a sequence number and the id of
//! the previous receipt, so the receipts of one store form a hash chain: an edited, deleted or
//! reordered receipt breaks it. The id of a receipt is the SHA-256 of its canonical body.

use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::canonical;
use crate::envelope::{self, EnvelopeError, Signed};

/// Schema name of a receipt body.
pub const SCHEMA: &str = "chio.receipt.v1";
/// `prev` of the first receipt in a store.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a receipt attests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A launch reached (or failed to reach) FullyEnforced.
    LaunchEnforcement,
    /// A launched target ended.
    LaunchTerminal,
    /// A tool call made under a launch.
    ToolCall,
    /// Admission refused something.
    Denial,
}

impl Kind {
    /// The snake_case name stored and filtered on.
    pub fn name(self) -> &'static str {
        match self {
            Kind::LaunchEnforcement => "launch_enforcement",
            Kind::LaunchTerminal => "launch_terminal",
            Kind::ToolCall => "tool_call",
            Kind::Denial => "denial",
        }
    }
}

/// A reference from one receipt to another (a tool call to its launch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// Id of the referenced receipt.
    pub receipt_id: String,
    /// SHA-256 of the referenced receipt's canonical envelope.
    pub receipt_sha256: String,
}

/// The signed content of a receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Body {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// What this attests.
    pub kind: Kind,
    /// Position in the store's chain, from 1.
    pub seq: u64,
    /// Id of the previous receipt in the chain ([`GENESIS`] for the first).
    pub prev: String,
    /// RFC 3339 UTC time of issue.
    pub issued_at: String,
    /// Tool server the receipt concerns, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_server: Option<String>,
    /// Short outcome: a launch state, `exit:N`, `signal:N`, `denied`, ...
    pub outcome: String,
    /// The cage's launch record, embedded as opaque JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_record: Option<Value>,
    /// The launch receipt a tool call or terminal receipt belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Reference>,
    /// Kind-specific detail (denial reasons, tool call arguments digest, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
}

/// What the caller supplies; the store fills in `seq`, `prev` and `issued_at`.
#[derive(Debug, Clone, Default)]
pub struct Draft {
    /// Kind (required).
    pub kind: Option<Kind>,
    /// Tool server.
    pub tool_server: Option<String>,
    /// Outcome.
    pub outcome: String,
    /// Embedded launch record.
    pub launch_record: Option<Value>,
    /// Launch reference.
    pub launch: Option<Reference>,
    /// Detail.
    pub detail: Option<Value>,
}

/// Why a receipt was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptError {
    /// Envelope, key or signature problem.
    Envelope(EnvelopeError),
    /// The body is not a receipt.
    Body(String),
}

impl std::fmt::Display for ReceiptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReceiptError::Envelope(e) => write!(f, "{e}"),
            ReceiptError::Body(e) => write!(f, "not a {SCHEMA} body: {e}"),
        }
    }
}

impl std::error::Error for ReceiptError {}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::keys::hex(&Sha256::digest(bytes))
}

/// Id of a receipt body: SHA-256 of its canonical bytes.
pub fn id_of(body: &Body) -> Result<String, ReceiptError> {
    let v = serde_json::to_value(body).map_err(|e| ReceiptError::Body(e.to_string()))?;
    let c = canonical::to_canonical(&v).map_err(|e| ReceiptError::Envelope(EnvelopeError::Canonical(e)))?;
    Ok(sha256_hex(c.as_bytes()))
}

/// Sign a body.
pub fn sign(key: &SigningKey, body: &Body) -> Result<Signed, ReceiptError> {
    let v = serde_json::to_value(body).map_err(|e| ReceiptError::Body(e.to_string()))?;
    envelope::sign(key, v).map_err(ReceiptError::Envelope)
}

/// A verified receipt.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// Its id.
    pub id: String,
    /// Its body.
    pub body: Body,
}

/// Verify one exported receipt (an envelope's JSON bytes) against the pinned kernel key.
pub fn verify(bytes: &[u8], kernel_key_hex: &str) -> Result<Verified, ReceiptError> {
    let v = envelope::verify(bytes, kernel_key_hex).map_err(ReceiptError::Envelope)?;
    verified_body(v)
}

/// A signed body as a receipt. Its id is the SHA-256 of the canonical bytes of exactly what was
/// signed, and the body must be in its one receipt form (what the typed body serializes to: an
/// explicit `null` where the schema omits a field is refused) — so two different signed bodies
/// can never share an id.
fn verified_body(v: Value) -> Result<Verified, ReceiptError> {
    let body: Body = serde_json::from_value(v.clone()).map_err(|e| ReceiptError::Body(e.to_string()))?;
    if body.schema != SCHEMA {
        return Err(ReceiptError::Body(format!("schema is {:?}", body.schema)));
    }
    if serde_json::to_value(&body).map_err(|e| ReceiptError::Body(e.to_string()))? != v {
        return Err(ReceiptError::Body(
            "the signed body is not in its receipt form (an explicit null or a field the schema omits)".into(),
        ));
    }
    let c = canonical::to_canonical(&v).map_err(|e| ReceiptError::Envelope(EnvelopeError::Canonical(e)))?;
    Ok(Verified { id: sha256_hex(c.as_bytes()), body })
}

/// Read a receipt without checking its signature (for hash-chain checks when no key is pinned):
/// the envelope must still be well formed and the body a receipt.
pub fn parse_unsigned(bytes: &[u8]) -> Result<Verified, ReceiptError> {
    let v = canonical::parse_strict(bytes).map_err(|e| ReceiptError::Body(e.to_string()))?;
    let env: Signed = serde_json::from_value(v).map_err(|e| ReceiptError::Body(e.to_string()))?;
    verified_body(env.body)
}

/// Check that `receipts` (verified, in order) form an unbroken chain starting after `prev`/`seq`.
/// Returns each break as (receipt id, reason).
pub fn chain_breaks(receipts: &[Verified], mut prev: String, mut seq: u64) -> Vec<(String, String)> {
    let mut breaks = Vec::new();
    for r in receipts {
        if r.body.seq != seq + 1 {
            breaks.push((
                r.id.clone(),
                format!("seq is {} but {} was expected (a receipt is missing or moved)", r.body.seq, seq + 1),
            ));
        }
        if r.body.prev != prev {
            breaks.push((r.id.clone(), format!("prev is {} but the previous receipt is {prev}", r.body.prev)));
        }
        prev = r.id.clone();
        seq = r.body.seq;
    }
    breaks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;

    fn body() -> Body {
        Body {
            schema: SCHEMA.into(),
            kind: Kind::LaunchTerminal,
            seq: 1,
            prev: GENESIS.into(),
            issued_at: "2026-12-01T00:00:00.000Z".into(),
            tool_server: None,
            outcome: "exit:0".into(),
            launch_record: None,
            launch: None,
            detail: None,
        }
    }

    #[test]
    fn the_id_is_the_digest_of_exactly_what_was_signed() {
        let key = keys::generate().unwrap();
        let pk = keys::hex(key.verifying_key().as_bytes());
        let env = sign(&key, &body()).unwrap();
        let v = verify(serde_json::to_string(&env).unwrap().as_bytes(), &pk).unwrap();
        let signed = canonical::to_canonical(&serde_json::to_value(&env.body).unwrap()).unwrap();
        assert_eq!(v.id, sha256_hex(signed.as_bytes()));
        assert_eq!(v.id, id_of(&body()).unwrap());
        // The same body with an explicit null the schema omits: a different signed document, so
        // it may not pass under the same id — it is refused.
        let mut with_null = serde_json::to_value(body()).unwrap();
        with_null["tool_server"] = Value::Null;
        let env = envelope::sign(&key, with_null).unwrap();
        let e = verify(serde_json::to_string(&env).unwrap().as_bytes(), &pk).unwrap_err();
        assert!(matches!(&e, ReceiptError::Body(m) if m.contains("receipt form")), "{e}");
        let e = parse_unsigned(serde_json::to_string(&env).unwrap().as_bytes()).unwrap_err();
        assert!(matches!(&e, ReceiptError::Body(_)), "{e}");
    }

    fn chained(n: u64) -> Vec<Verified> {
        let (mut prev, mut out) = (GENESIS.to_string(), Vec::new());
        for seq in 1..=n {
            let b = Body { seq, prev: prev.clone(), ..body() };
            let id = id_of(&b).unwrap();
            prev = id.clone();
            out.push(Verified { id, body: b });
        }
        out
    }

    #[test]
    fn a_chain_breaks_where_a_receipt_is_missing_moved_or_relinked() {
        let all = chained(4);
        assert_eq!(chain_breaks(&all, GENESIS.into(), 0), Vec::new());
        // A range that starts after an earlier receipt links to that one.
        assert_eq!(chain_breaks(&all[2..], all[1].id.clone(), 2), Vec::new());
        // Receipt 2 missing: 3 has the wrong seq and the wrong link.
        let gap = [all[0].clone(), all[2].clone(), all[3].clone()];
        let b = chain_breaks(&gap, GENESIS.into(), 0);
        assert_eq!(b.len(), 2, "{b:?}");
        assert!(b.iter().all(|(id, _)| *id == all[2].id), "{b:?}");
        assert!(b[0].1.contains("seq is 3 but 2 was expected"), "{b:?}");
        assert!(b[1].1.contains(&format!("the previous receipt is {}", all[0].id)), "{b:?}");
        // Started from the wrong place: the first receipt is named.
        let b = chain_breaks(&all, all[0].id.clone(), 1);
        assert!(b.iter().any(|(id, why)| *id == all[0].id && why.contains("seq is 1 but 2")), "{b:?}");
        assert!(b.iter().any(|(id, why)| *id == all[0].id && why.contains("prev is")), "{b:?}");
    }

    #[test]
    fn every_refusal_says_what_was_refused() {
        let cases: [(ReceiptError, &str); 6] = [
            (ReceiptError::Body("x".into()), "not a chio.receipt.v1 body: x"),
            (ReceiptError::Envelope(EnvelopeError::Malformed("m".into())), "not a signed envelope: m"),
            (
                ReceiptError::Envelope(EnvelopeError::Canonical(canonical::CanonError::NotCanonical)),
                "body: JSON is not",
            ),
            (
                ReceiptError::Envelope(EnvelopeError::SignerMismatch { pinned: "p".into(), claimed: "c".into() }),
                "signer_public_key is c, not the pinned key p",
            ),
            (
                ReceiptError::Envelope(EnvelopeError::Key(keys::KeyError::BadSignature)),
                "does not verify under the pinned key",
            ),
            (ReceiptError::Envelope(EnvelopeError::Key(keys::KeyError::WeakKey)), "weak (small order)"),
        ];
        for (e, want) in cases {
            assert!(e.to_string().contains(want), "{e:?}: {e}");
        }
    }
}
