//! Fixture builders for the end-to-end suites.
