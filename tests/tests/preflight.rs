//! `chio security preflight` on this host: the platform with its trial cage, the bearer roles'
//! tokens, the launch material (all six parts or none, admitted as a launch would be, a trial
//! launch to the exec observation, shadow mode), and receipt stores (absent, foreign, corrupt,
//! healthy) — each finding's severity and the exit status of the worst.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chio_tests::{chio_bin, privileged, signed_launch, signed_launch_on, Scratch, SignedLaunch};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn preflight(args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let out: Output = Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(["security", "preflight", "--json"])
        .args(args)
        .env_remove("CHIO_AUTH_TOKEN")
        .env_remove("CHIO_ADMIN_TOKEN")
        .env_remove("CHIO_CONTROL_TOKEN")
        .env_remove("CHIO_REMOTE_AUTHORITY_WORKLOAD_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap(), v)
}

fn finding<'a>(doc: &'a Value, probe: &str) -> &'a Value {
    doc["findings"].as_array().unwrap().iter().find(|f| f["probe"] == probe).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_platform_and_the_bearer_roles() {
    if !privileged("preflight_platform") {
        return;
    }
    let (code, doc) = preflight(&["--require-enforcement"], &[]);
    assert_eq!(code, 0, "{doc}");
    let platform = finding(&doc, "security.platform");
    assert_eq!(platform["severity"], "ok", "{platform}");
    assert_eq!(platform["context"]["trial_launch"], "FullyEnforced");
    let probes: Vec<&str> = doc["findings"].as_array().unwrap().iter().map(|f| f["probe"].as_str().unwrap()).collect();
    assert_eq!(
        probes,
        ["security.platform", "security.bearer_roles", "security.native_launch", "security.durable_stores"]
    );
    assert_eq!(finding(&doc, "security.bearer_roles")["severity"], "info", "none set");

    let (code, doc) = preflight(&[], &[("CHIO_AUTH_TOKEN", "t-1"), ("CHIO_CONTROL_TOKEN", "t-2")]);
    assert_eq!((code, &finding(&doc, "security.bearer_roles")["severity"]), (0, &Value::from("ok")));
    for (env, why) in [
        (&[("CHIO_AUTH_TOKEN", "same"), ("CHIO_ADMIN_TOKEN", "same")][..], "share one value"),
        (&[("CHIO_CONTROL_TOKEN", "tok\n")][..], "padded"),
        (&[("CHIO_REMOTE_AUTHORITY_WORKLOAD_TOKEN", "")][..], "empty"),
    ] {
        let (code, doc) = preflight(&[], env);
        let f = finding(&doc, "security.bearer_roles");
        assert_eq!((code, &f["severity"]), (1, &Value::from("error")), "{f}");
        assert!(f["summary"].as_str().unwrap().contains(why), "{f}");
        assert!(!doc.to_string().contains("same") && !doc.to_string().contains("tok\\n"), "a token was printed");
    }
}

/// The six parts of launch material for `p` (its command is given after `--` by the caller).
fn material(p: &SignedLaunch, manifest_key: &Path, server: &str) -> Vec<String> {
    [
        "--signed-manifest",
        s(&p.manifest),
        "--manifest-public-key",
        s(manifest_key),
        "--cage-policy",
        s(&p.policy),
        "--cage-policy-signer",
        s(&p.operator),
        "--server-id",
        server,
    ]
    .iter()
    .map(|x| x.to_string())
    .collect()
}

#[test]
fn launch_material_is_all_or_nothing_and_loaded_as_a_launch() {
    if !privileged("preflight_launch") {
        return;
    }
    let argv = ["/probe", "euid"];
    let p = signed_launch(Path::new(PROBE), &argv, 65534, "enforced");
    let publisher = p.dir.join("publisher/public.key");
    let ours = |manifest_key: &Path, server: &str| material(&p, manifest_key, server);
    let run = |args: Vec<String>, command: &[&str], extra: &[&str]| {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend(extra);
        all.push("--");
        all.extend(command);
        preflight(&all, &[])
    };
    let (code, doc) = run(ours(&publisher, "probe"), &argv, &["--require-enforcement"]);
    let f = finding(&doc, "security.native_launch");
    assert_eq!((code, &f["severity"]), (0, &Value::from("ok")), "{f}");
    assert_eq!(f["context"]["trial_launch"], "FullyEnforced");

    // A partial set names what is missing.
    let (code, doc) = preflight(&["--cage-policy", s(&p.policy), "--server-id", "probe"], &[]);
    let f = finding(&doc, "security.native_launch");
    assert_eq!(code, 1);
    assert!(f["summary"].as_str().unwrap().contains("missing --signed-manifest, --manifest-public-key"), "{f}");
    // Each part is checked as a launch checks it.
    for (args, command, why) in [
        (ours(&publisher, "other"), &argv[..], "not --server-id"),
        (ours(&p.operator, "probe"), &argv[..], "not the pinned manifest key"),
        (ours(&publisher, "probe"), &["/probe", "egid"][..], "not the admitted argv"),
    ] {
        let (code, doc) = run(args, command, &[]);
        let f = finding(&doc, "security.native_launch");
        assert_eq!((code, &f["severity"]), (1, &Value::from("error")), "{why}: {f}");
        assert!(f["summary"].as_str().unwrap().contains(why), "{why}: {f}");
    }

    // Admitted, but this host cannot reach FullyEnforced for it (its root has no /probe): the
    // trial launch says so.
    let empty = Scratch::new("preflight-empty-root");
    let broken = signed_launch_on(Path::new(PROBE), &argv, 65534, "enforced", &empty.0);
    let args = material(&broken, &broken.dir.join("publisher/public.key"), "probe");
    let (code, doc) = run(args, &argv, &[]);
    let f = finding(&doc, "security.native_launch");
    assert_eq!(code, 1, "{f}");
    assert!(f["summary"].as_str().unwrap().contains("did not reach FullyEnforced: target_not_found"), "{f}");

    // A shadow policy: a warning, an error when enforcement is required.
    let shadow = signed_launch(Path::new(PROBE), &argv, 65534, "shadow");
    let args = material(&shadow, &shadow.dir.join("publisher/public.key"), "probe");
    let (code, doc) = run(args.clone(), &argv, &[]);
    assert_eq!((code, &finding(&doc, "security.native_launch")["severity"]), (0, &Value::from("warning")));
    let (code, doc) = run(args, &argv, &["--require-enforcement"]);
    assert_eq!((code, &finding(&doc, "security.native_launch")["severity"]), (1, &Value::from("error")));
}

#[test]
fn receipt_stores_absent_foreign_corrupt_and_healthy() {
    if !privileged("preflight_stores") {
        return;
    }
    let dir = Scratch::new("preflight-stores");
    let chio = chio_bin(&PathBuf::from(PROBE));
    let key = dir.join("key");
    assert!(Command::new(&chio).args(["keys", "generate", "--out", s(&key)]).output().unwrap().status.success());
    let healthy = dir.join("healthy.db");
    let seed = key.join("signing.seed");
    let out = Command::new(&chio)
        .args(["cage", "run", "--receipt-db", s(&healthy), "--kernel-key", s(&seed), "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, doc) = preflight(&["--receipt-db", s(&healthy)], &[]);
    let f = finding(&doc, "security.durable_stores");
    assert_eq!((code, &f["severity"]), (0, &Value::from("ok")), "{f}");
    assert!(f["context"][s(&healthy)].as_str().unwrap().starts_with("healthy"), "{f}");

    let foreign = dir.join("notes.txt");
    std::fs::write(&foreign, "not a database").unwrap();
    let corrupt = dir.join("corrupt.db");
    let mut bytes = std::fs::read(&healthy).unwrap();
    let page = 4096.min(bytes.len() / 2);
    for b in &mut bytes[page..] {
        *b = 0x5a;
    }
    std::fs::write(&corrupt, bytes).unwrap();
    for (path, why) in [
        (dir.join("absent.db"), "absent"),
        (dir.0.clone(), "not a regular file"),
        (foreign, "unreadable or foreign"),
        (corrupt, "corrupt"),
    ] {
        let (code, doc) = preflight(&["--receipt-db", s(&path)], &[]);
        let f = finding(&doc, "security.durable_stores");
        assert_eq!((code, &f["severity"]), (1, &Value::from("error")), "{why}: {f}");
        assert!(f["context"][s(&path)].as_str().unwrap().starts_with(why), "{why}: {f}");
    }
}
