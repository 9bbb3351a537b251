//! The signed envelope `{body, signer_public_key, signature}`: an Ed25519 signature over the RFC
//! 8785 canonical bytes of `body`. Verification takes the key pinned by the caller and refuses a
//! different signer before it looks at the signature — the key inside a document is a claim, not
//! a credential.

use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::{self, CanonError};
use crate::keys::{self, KeyError};

/// A signed document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signed {
    /// The signed content.
    pub body: Value,
    /// Lowercase hex Ed25519 public key of the signer.
    pub signer_public_key: String,
    /// Lowercase hex Ed25519 signature over the canonical bytes of `body`.
    pub signature: String,
}

/// Why an envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvelopeError {
    /// Not a well-formed envelope (bad JSON, duplicate or unknown fields).
    Malformed(String),
    /// The body has no canonical form.
    Canonical(CanonError),
    /// Signed by a key other than the pinned one.
    SignerMismatch {
        /// The pinned key.
        pinned: String,
        /// The key the document names.
        claimed: String,
    },
    /// Key or signature problem.
    Key(KeyError),
}

impl std::fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvelopeError::Malformed(e) => write!(f, "not a signed envelope: {e}"),
            EnvelopeError::Canonical(e) => write!(f, "body: {e}"),
            EnvelopeError::SignerMismatch { pinned, claimed } => {
                write!(f, "signer_public_key is {claimed}, not the pinned key {pinned}")
            }
            EnvelopeError::Key(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

/// Sign `body` with `key`.
pub fn sign(key: &SigningKey, body: Value) -> Result<Signed, EnvelopeError> {
    let bytes = canonical::to_canonical(&body).map_err(EnvelopeError::Canonical)?;
    Ok(Signed {
        signature: keys::sign(key, bytes.as_bytes()),
        signer_public_key: keys::hex(key.verifying_key().as_bytes()),
        body,
    })
}

/// Parse and verify an envelope against the pinned key; returns the body.
pub fn verify(bytes: &[u8], pinned_key_hex: &str) -> Result<Value, EnvelopeError> {
    let pinned = keys::public_key(pinned_key_hex).map_err(EnvelopeError::Key)?;
    let value = canonical::parse_strict(bytes).map_err(|e| EnvelopeError::Malformed(e.to_string()))?;
    let env: Signed = serde_json::from_value(value).map_err(|e| EnvelopeError::Malformed(e.to_string()))?;
    if env.signer_public_key != pinned_key_hex {
        return Err(EnvelopeError::SignerMismatch { pinned: pinned_key_hex.into(), claimed: env.signer_public_key });
    }
    let canon = canonical::to_canonical(&env.body).map_err(EnvelopeError::Canonical)?;
    keys::verify(&pinned, canon.as_bytes(), &env.signature).map_err(EnvelopeError::Key)?;
    Ok(env.body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn signed() -> (SigningKey, String, Vec<u8>) {
        let k = keys::generate().unwrap();
        let pk = keys::hex(k.verifying_key().as_bytes());
        let env = sign(&k, json!({"schema": "chio.test.v1", "n": 3, "tools": ["a", "b"]})).unwrap();
        (k, pk, serde_json::to_vec(&env).unwrap())
    }

    #[test]
    fn verifies_under_the_pinned_key_only() {
        let (_, pk, bytes) = signed();
        assert_eq!(verify(&bytes, &pk).unwrap()["n"], 3);
        let other = keys::hex(keys::generate().unwrap().verifying_key().as_bytes());
        assert!(matches!(verify(&bytes, &other), Err(EnvelopeError::SignerMismatch { .. })));
    }

    #[test]
    fn one_changed_byte_is_refused() {
        let (_, pk, bytes) = signed();
        let text = String::from_utf8(bytes).unwrap().replace("\"n\":3", "\"n\":4");
        assert_eq!(verify(text.as_bytes(), &pk), Err(EnvelopeError::Key(KeyError::BadSignature)));
    }

    #[test]
    fn a_forged_signer_key_is_refused_before_the_signature() {
        let (_, pk, bytes) = signed();
        let forger = keys::generate().unwrap();
        let mut env: Signed = serde_json::from_slice(&bytes).unwrap();
        env.signer_public_key = keys::hex(forger.verifying_key().as_bytes());
        env.signature = keys::sign(&forger, canonical::to_canonical(&env.body).unwrap().as_bytes());
        let err = verify(&serde_json::to_vec(&env).unwrap(), &pk).unwrap_err();
        assert!(matches!(err, EnvelopeError::SignerMismatch { .. }), "{err}");
    }

    #[test]
    fn unknown_and_duplicate_fields_are_refused() {
        let (_, pk, bytes) = signed();
        let mut v: Value = serde_json::from_slice(&bytes).unwrap();
        v["extra"] = json!(1);
        assert!(matches!(verify(&serde_json::to_vec(&v).unwrap(), &pk), Err(EnvelopeError::Malformed(_))));
        let dup = String::from_utf8(bytes).unwrap().replacen('{', "{\"signature\":\"00\",", 1);
        assert!(matches!(verify(dup.as_bytes(), &pk), Err(EnvelopeError::Malformed(e)) if e.contains("duplicate")));
    }
}
