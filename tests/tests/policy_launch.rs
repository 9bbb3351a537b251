//! `chio cage run --policy`: a launch under an operator-signed policy gets exactly the admitted
//! plan — the admitted argv and digest, identity, ceilings, a read-only workspace with only the
//! admitted write paths writable — and anything else is refused, with a denial receipt.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chio_tests::{chio_bin, parse, privileged, shared_rootfs, Scratch};
use sha2::{Digest, Sha256};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn chio(args: &[&str]) -> Output {
    Command::new(chio_bin(&PathBuf::from(PROBE))).args(args).stdin(Stdio::null()).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

struct Signed {
    dir: Scratch,
    policy: PathBuf,
    manifest: PathBuf,
    operator: PathBuf,
}

/// Keys, a manifest for `/probe ARGV`, and a policy admitting it on the probe rootfs as `uid`.
fn signed(argv: &[&str], uid: u32) -> Signed {
    let dir = Scratch::new("policy");
    for k in ["publisher", "operator"] {
        assert!(chio(&["keys", "generate", "--out", s(&dir.join(k))]).status.success());
    }
    let digest: String = Sha256::digest(std::fs::read(PROBE).unwrap()).iter().map(|b| format!("{b:02x}")).collect();
    let manifest = serde_json::json!({
        "schema": "chio.tool-manifest.v1", "server_id": "probe", "name": "Probe", "version": "1.0.0",
        "tools": [{"name": "write", "description": "write a file"}],
        "target": {"path": "/probe", "sha256": digest, "argv": argv},
        "permissions": {"read_paths": ["/workspace"], "write_paths": ["/workspace/out"], "network": [],
                        "env": ["LANG"], "syscall_profile": "default"}
    });
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
    let out = chio(&[
        "manifest",
        "sign",
        "--key",
        s(&dir.join("publisher/signing.seed")),
        "--in",
        s(&dir.join("manifest.json")),
        "--out",
        s(&dir.join("manifest.signed.json")),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest_digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let publisher = std::fs::read_to_string(dir.join("publisher/public.key")).unwrap().trim().to_string();
    let rootfs = shared_rootfs(&PathBuf::from(PROBE));
    let policy = serde_json::json!({
        "schema": "chio.cage-launch-policy.v1", "policy_id": "probe-policy", "mode": "enforced",
        "manifest": {"sha256": manifest_digest, "publisher_key": publisher},
        "launch": {"path": "/probe", "argv": argv},
        "ceilings": {"read_paths": ["/workspace"], "write_paths": ["/workspace/out"], "network": [], "env": ["LANG"],
                     "syscall_profile": "default", "memory_bytes": 268435456, "swap_bytes": 0, "pids": 32,
                     "cpu_millis": 1000, "wall_ms": 60000, "output_bytes": 65536, "tmp_bytes": 8388608},
        "identity": {"uid": uid, "gid": uid},
        "rootfs": {"directory": rootfs},
        "receipts": {"required": true}
    });
    std::fs::write(dir.join("policy.json"), policy.to_string()).unwrap();
    let out = chio(&[
        "policy",
        "sign",
        "--key",
        s(&dir.join("operator/signing.seed")),
        "--in",
        s(&dir.join("policy.json")),
        "--out",
        s(&dir.join("policy.signed.json")),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Signed {
        policy: dir.join("policy.signed.json"),
        manifest: dir.join("manifest.signed.json"),
        operator: dir.join("operator/public.key"),
        dir,
    }
}

fn launch(p: &Signed, ws: &Path, extra: &[&str], command: &[&str]) -> Output {
    let (db, seed) = (p.dir.join("r.db"), p.dir.join("operator/signing.seed"));
    let mut args = vec![
        "cage",
        "run",
        "--json",
        "--policy",
        s(&p.policy),
        "--policy-signer",
        s(&p.operator),
        "--manifest",
        s(&p.manifest),
        "--workspace",
        s(ws),
        "--receipt-db",
        s(&db),
        "--kernel-key",
        s(&seed),
    ];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(command);
    chio(&args)
}

#[test]
fn a_policy_launch_gets_exactly_the_admitted_plan() {
    if !privileged("policy_launch") {
        return;
    }
    let argv = ["/probe", "write", "/workspace/out/ran"];
    let p = signed(&argv, 65534);
    let ws = Scratch::new("policy-ws");
    ws.give_to_nobody();
    std::fs::create_dir(ws.join("out")).unwrap();
    std::os::unix::fs::chown(ws.join("out"), Some(65534), Some(65534)).unwrap();
    let run = parse(launch(&p, &ws.0, &[], &argv));
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(ws.join("out/ran").exists(), "the admitted write path is writable");
    let r = &run.record;
    assert_eq!(r["annotations"]["policy.id"], "probe-policy");
    assert_eq!(r["limits"]["memory_bytes"], 268435456);
    assert_eq!(r["limits"]["pids"], 32);
    let ws_source = r["reported"]["sources"].as_array().unwrap().iter().find(|x| x["dest"] == "/workspace").unwrap();
    assert_eq!(ws_source["writable"], false, "the workspace itself is read-only: only /workspace/out was admitted");
    // The same binary writing elsewhere in the workspace is another argv: refused, with a denial.
    let other = ["/probe", "write", "/workspace/elsewhere"];
    let out = launch(&p, &ws.0, &[], &other);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("is not the admitted argv") && err.contains("denial receipt"), "{err}");
    assert!(!ws.join("elsewhere").exists());
    let denials = chio(&["receipt", "list", "--receipt-db", s(&p.dir.join("r.db")), "--kind", "denial"]);
    assert_eq!(String::from_utf8_lossy(&denials.stdout).lines().count(), 1);
    // No flag may widen the plan.
    for extra in [&["--memory", "1G"][..], &["--uid", "0"], &["--bind", "/etc:/etc"], &["--net", "loopback"]] {
        let out = launch(&p, &ws.0, extra, &argv);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn a_root_policy_needs_the_operator_to_allow_it() {
    if !privileged("policy_root") {
        return;
    }
    let argv = ["/probe", "euid"];
    let p = signed(&argv, 0);
    let ws = Scratch::new("policy-root-ws");
    let out = launch(&p, &ws.0, &[], &argv);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("--allow-root-policy"), "{err}");
    // Allowed, it runs as uid 0 and the record (so the receipt) says it was allowed.
    std::fs::create_dir(ws.join("out")).unwrap();
    let run = parse(launch(&p, &ws.0, &["--allow-root-policy"], &argv));
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(run.stdout.starts_with("ESCAPED: euid is 0"), "{}", run.stdout);
    assert_eq!(run.record["annotations"]["policy.allow_root"], "true");
}
