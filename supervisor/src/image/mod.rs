//! Images: `docker save` archives and OCI layouts turned into verified root filesystems.
//! So far only layer application ([`extract`]), the part every format shares and every hostile
//! archive attacks.

pub mod extract;
pub mod import;
pub mod source;
pub mod store;
