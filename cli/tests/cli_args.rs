//! Argument errors of `chio cage run` are refused with a reason and never launch anything.
#![allow(clippy::unwrap_used)]

use std::process::Command;

const CHIO: &str = env!("CARGO_BIN_EXE_chio");

/// A malformed value is a usage error (2, as clap's own are), naming the flag and the value —
/// negative numbers included (never clap's "use -- -1" tip, which would run `-1` as the command).
#[test]
fn malformed_values_are_usage_errors_naming_flag_and_value() {
    for (args, flag, value) in [
        (vec!["cage", "run", "--memory", "lots", "--", "/bin/true"], "--memory", "lots"),
        (vec!["cage", "run", "--memory", "-1", "--", "/bin/true"], "--memory", "-1"),
        (vec!["cage", "run", "--pids", "-5", "--", "/bin/true"], "--pids", "-5"),
        (vec!["cage", "run", "--uid", "-1", "--", "/bin/true"], "--uid", "-1"),
        (vec!["cage", "run", "--bind", "/tmp", "--", "/bin/true"], "--bind", "/tmp"),
        (vec!["cage", "run", "--timeout", "soon", "--", "/bin/true"], "--timeout", "soon"),
        (vec!["image", "import", "/etc/hostname", "--max-bytes", "banana"], "--max-bytes", "banana"),
    ] {
        let out = Command::new(CHIO).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains(value) && !err.contains("-- -"), "{args:?}: {err}");
    }
}

/// `--env KEY` passes chio's own value through: a KEY chio does not have is refused.
#[test]
fn bad_env_is_refused() {
    let out = Command::new(CHIO)
        .args(["cage", "run", "--env", "NOEQUALS", "--", "/bin/true"])
        .env_remove("NOEQUALS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not set"));
    let out = Command::new(CHIO).args(["cage", "run", "--env", "=v", "--", "/bin/true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no variable name"));
}

#[test]
fn a_command_is_required() {
    let out = Command::new(CHIO).args(["cage", "run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `chio --help` describes today's commands, and every subcommand's help shows an example.
#[test]
fn every_help_has_an_example() {
    let top = Command::new(CHIO).arg("--help").output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    assert!(!top.contains("(later)"), "{top}");
    for cmd in ["cage", "image", "manifest", "policy", "receipt", "keys"] {
        assert!(top.contains(cmd), "{cmd} in {top}");
    }
    for sub in [
        "cage run",
        "image import",
        "image list",
        "image inspect",
        "image verify",
        "image rm",
        "manifest sign",
        "manifest verify",
        "policy sign",
        "policy verify",
        "policy admit",
        "receipt verify",
        "receipt list",
        "receipt verify-chain",
        "receipt checkpoint",
        "keys generate",
        "keys show",
    ] {
        let out = Command::new(CHIO).args(sub.split(' ')).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Example") && help.contains(&format!("chio {sub}")), "{sub}: {help}");
    }
}
