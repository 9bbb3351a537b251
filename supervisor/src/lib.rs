//! chio-supervisor: turns signed inputs into cage plans and runs them. So far: images — reading
//! `docker save` archives and OCI layouts in place, verifying them, extracting layers safely, and
//! the content-addressed image store behind `chio image` and `chio cage run --image`.

mod file_access;
pub mod image;
pub mod launch_plan;
pub mod preflight;
pub mod receipts;
pub mod repository;
pub mod service;
pub mod session;
pub mod state_lock;
