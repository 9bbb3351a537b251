//! chio-kernel: the trust layer, with no Linux in it. Canonical JSON (RFC 8785), Ed25519 keys,
//! signed envelopes whose verification always takes the key pinned by the caller, receipts, and
//! the durable tamper-evident receipt store.

pub mod canonical;
pub mod documents;
pub mod envelope;
pub mod journal;
pub mod keys;
pub mod receipt;
pub mod store;
pub mod time;
