//! chio-kernel: the trust layer, with no Linux in it. Canonical JSON (RFC 8785), Ed25519 keys and
//! signed envelopes whose verification always takes the key pinned by the caller.

pub mod canonical;
pub mod envelope;
pub mod keys;
