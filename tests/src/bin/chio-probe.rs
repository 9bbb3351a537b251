//! Escape probe (placeholder until the suite lands).
fn main() {}
