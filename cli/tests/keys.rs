//! `chio keys`: generation, display, and the refusals that protect a secret seed.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const CHIO: &str = env!("CARGO_BIN_EXE_chio");

fn dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("chio-keys-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn generate_then_show_and_refusals() {
    let d = dir("gen");
    let out = Command::new(CHIO).args(["keys", "generate", "--out"]).arg(&d).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let public = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(public.len(), 64);
    assert_eq!(std::fs::metadata(d.join("signing.seed")).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
    for file in ["signing.seed", "public.key"] {
        let out = Command::new(CHIO).args(["keys", "show"]).arg(d.join(file)).output().unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), public, "{file}");
    }
    // Never overwrites.
    let out = Command::new(CHIO).args(["keys", "generate", "--out"]).arg(&d).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to overwrite"));
    // A seed readable by others is refused with the fix in the message.
    std::fs::set_permissions(d.join("signing.seed"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(CHIO).args(["keys", "show"]).arg(d.join("signing.seed")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_weak_public_key_is_refused() {
    let d = dir("weak");
    std::fs::create_dir_all(&d).unwrap();
    let mut identity = "01".to_string();
    identity.push_str(&"00".repeat(31));
    std::fs::write(d.join("weak.key"), identity).unwrap();
    let out = Command::new(CHIO).args(["keys", "show"]).arg(d.join("weak.key")).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("weak"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Seed and public-key files are told apart by what they are: a public-key file holding a weak
/// key says so whatever its mode, and a renamed seed is still a seed (its header says so).
#[test]
fn seeds_and_public_keys_are_told_apart_by_what_they_are() {
    let d = dir("kinds");
    assert!(Command::new(CHIO).args(["keys", "generate", "--out"]).arg(&d).output().unwrap().status.success());
    let zero = d.join("zero.key");
    std::fs::write(&zero, format!("{}\n", "0".repeat(64))).unwrap();
    std::fs::set_permissions(&zero, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(CHIO).args(["keys", "show"]).arg(&zero).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("weak"), "{}", String::from_utf8_lossy(&out.stderr));
    let renamed = d.join("backup-of-my-key");
    std::fs::copy(d.join("signing.seed"), &renamed).unwrap();
    let public = std::fs::read_to_string(d.join("public.key")).unwrap();
    let out = Command::new(CHIO).args(["keys", "show"]).arg(&renamed).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), public.trim(), "a renamed seed shows its public key");
    let _ = std::fs::remove_dir_all(&d);
}
