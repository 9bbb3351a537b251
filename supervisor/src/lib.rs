//! chio-supervisor: turns signed inputs into cage plans and runs them. So far: the image layer
//! extractor the OCI image store (issue 4) is built on.

pub mod image;
