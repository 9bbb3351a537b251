//! Images: `docker save` archives and OCI layouts turned into verified root filesystems.
//! [`source`] reads the input in place, [`import`] finds and verifies the image, [`extract`]
//! applies layers safely, [`store`] keeps the results content-addressed.

pub mod extract;
pub mod import;
pub mod pipeline;
pub mod source;
pub mod store;
