//! Argument errors of `chio cage run` are refused with a reason and never launch anything.
#![allow(clippy::unwrap_used)]

use std::process::Command;

const CHIO: &str = env!("CARGO_BIN_EXE_chio");

#[test]
fn bad_size_is_refused_with_its_flag() {
    let out = Command::new(CHIO).args(["cage", "run", "--memory", "lots", "--", "/bin/true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--memory") && err.contains("lots"), "{err}");
}

/// `--env KEY` passes chio's own value through: a KEY chio does not have is refused.
#[test]
fn bad_env_is_refused() {
    let out = Command::new(CHIO)
        .args(["cage", "run", "--env", "NOEQUALS", "--", "/bin/true"])
        .env_remove("NOEQUALS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not set"));
    let out = Command::new(CHIO).args(["cage", "run", "--env", "=v", "--", "/bin/true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no variable name"));
}

#[test]
fn a_command_is_required() {
    let out = Command::new(CHIO).args(["cage", "run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
