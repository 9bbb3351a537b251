//! The manifest and policy walkthrough of docs/policies.md, as a test: the shipped example bodies sign,
//! verify and admit; a wrong key, a changed byte and an unknown field are refused with a reason.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CHIO: &str = env!("CARGO_BIN_EXE_chio");

fn chio(args: &[&str]) -> Output {
    Command::new(CHIO).args(args).output().unwrap()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/examples").join(name)
}

#[test]
fn readme_flow_signs_verifies_and_admits() {
    let d = std::env::temp_dir().join(format!("chio-docs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let (publisher, operator) = (d.join("publisher"), d.join("operator"));
    assert!(chio(&["keys", "generate", "--out", p(&publisher)]).status.success());
    assert!(chio(&["keys", "generate", "--out", p(&operator)]).status.success());
    let (pub_seed, pub_key) = (publisher.join("signing.seed"), publisher.join("public.key"));
    let (op_seed, op_key) = (operator.join("signing.seed"), operator.join("public.key"));
    let manifest = d.join("manifest.signed.json");
    let out =
        chio(&["manifest", "sign", "--key", p(&pub_seed), "--in", p(&example("manifest.json")), "--out", p(&manifest)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(chio(&["manifest", "verify", "--in", p(&manifest), "--public-key", p(&pub_key)]).status.success());

    let key_hex = std::fs::read_to_string(&pub_key).unwrap();
    let body = std::fs::read_to_string(example("policy.json")).unwrap().replace("PUBLISHER_KEY", key_hex.trim());
    let policy_body = d.join("policy.json");
    std::fs::write(&policy_body, body).unwrap();
    let policy = d.join("policy.signed.json");
    assert!(chio(&["policy", "sign", "--key", p(&op_seed), "--in", p(&policy_body), "--out", p(&policy)])
        .status
        .success());
    assert!(chio(&["policy", "verify", "--in", p(&policy), "--signer", p(&op_key)]).status.success());
    let admit = chio(&["policy", "admit", "--policy", p(&policy), "--signer", p(&op_key), "--manifest", p(&manifest)]);
    assert!(admit.status.success(), "{}", String::from_utf8_lossy(&admit.stderr));

    // Wrong key.
    let out = chio(&["policy", "verify", "--in", p(&policy), "--signer", p(&pub_key)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the pinned key"));
    // One byte changed.
    let tampered = d.join("tampered.json");
    std::fs::write(&tampered, std::fs::read_to_string(&policy).unwrap().replace("\"pids\": 64", "\"pids\": 65"))
        .unwrap();
    let out = chio(&["policy", "verify", "--in", p(&tampered), "--signer", p(&op_key)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not verify"));
    // Unknown field, signed correctly: refused by the schema, naming the field.
    let extra = d.join("extra.json");
    std::fs::write(
        &extra,
        std::fs::read_to_string(example("manifest.json")).unwrap().replacen('{', "{\"surprise\": 1,", 1),
    )
    .unwrap();
    let out = chio(&["manifest", "sign", "--key", p(&pub_seed), "--in", p(&extra), "--out", p(&d.join("x.json"))]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("surprise"));
    // A policy admitting a different manifest refuses this one, naming why.
    let other =
        std::fs::read_to_string(&policy_body).unwrap().replace("\"env\": [\"LANG\", \"TZ\"]", "\"env\": [\"TZ\"]");
    std::fs::write(&policy_body, other).unwrap();
    assert!(chio(&["policy", "sign", "--key", p(&op_seed), "--in", p(&policy_body), "--out", p(&policy)])
        .status
        .success());
    let db = d.join("receipts.db");
    let out = chio(&[
        "policy",
        "admit",
        "--policy",
        p(&policy),
        "--signer",
        p(&op_key),
        "--manifest",
        p(&manifest),
        "--receipt-db",
        p(&db),
        "--kernel-key",
        p(&op_seed),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("environment variable LANG is not allowed") && err.contains("denial receipt"), "{err}");
    // The refusal is evidence: a signed denial receipt naming every violation.
    let listed = chio(&["receipt", "list", "--receipt-db", p(&db), "--kind", "denial"]);
    let line: serde_json::Value = serde_json::from_slice(listed.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["outcome"], "denied");
    assert_eq!(line["tool_server"], "repo-files");
    let violations = &line["receipt"]["body"]["detail"]["violations"];
    assert!(violations.to_string().contains("LANG"), "{violations}");
    let chain = chio(&["receipt", "verify-chain", "--receipt-db", p(&db), "--trusted-kernel-pubkey", p(&op_key)]);
    assert!(chain.status.success());
    let unsigned = chio(&["receipt", "verify-chain", "--receipt-db", p(&db)]);
    assert!(String::from_utf8_lossy(&unsigned.stdout).contains("signatures not checked"));
    std::fs::remove_dir_all(&d).unwrap();
}
