//! The mini-swe-agent environments (`packaging/mini-swe-agent`) under mini-swe-agent's own
//! DefaultAgent and DeterministicModel against the freshly built `chio`: the Python suite
//! `packaging/mini-swe-agent/tests`, run with the interpreter of a venv holding mini-swe-agent
//! (`.ci/run` makes `target/msa-venv`; `CHIO_MSA_PYTHON` names another).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use chio_tests::{chio_bin, privileged, run_within, skip};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

#[test]
fn mini_swe_agent_environments() {
    if !privileged("mini_swe_agent_environments") {
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let python = std::env::var_os("CHIO_MSA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/msa-venv/bin/python"));
    if !python.exists() {
        skip(
            "mini_swe_agent_environments",
            &format!("{} is missing (run .ci/run, or set CHIO_MSA_PYTHON)", python.display()),
        );
        return;
    }
    let package = repo.join("packaging/mini-swe-agent");
    let mut suite = Command::new(&python);
    suite
        .args(["-m", "unittest", "discover", "-s", "tests", "-v"])
        .current_dir(&package)
        .env("CHIO_BIN", chio_bin(&PathBuf::from(PROBE)))
        // The package as it is in this checkout, not a copy installed earlier.
        .env("PYTHONPATH", &package)
        .env("MSWEA_SILENT_STARTUP", "1")
        .stdin(std::process::Stdio::null());
    // The suite takes well under a minute; ten is a hang (a venv being made meanwhile, an agent
    // retrying), which fails here, named, instead of holding the whole run.
    let out = run_within(&mut suite, std::time::Duration::from_secs(600), "the mini-swe-agent suite");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the mini-swe-agent suite failed:\n{log}");
    assert!(log.contains("Ran 14 tests") && log.contains("\nOK"), "{log}");
}
