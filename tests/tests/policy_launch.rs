//! `chio cage run --policy`: a launch under an operator-signed policy gets exactly the admitted
//! plan — the admitted argv and digest, identity, ceilings, a read-only workspace with only the
//! admitted write paths writable — and anything else is refused, with a denial receipt.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chio_tests::{
    chio_bin, parse, privileged, shared_rootfs, signed_launch, signed_launch_edited, Scratch, SignedLaunch as Signed,
};
use serde_json::json;

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn chio(args: &[&str]) -> Output {
    Command::new(chio_bin(&PathBuf::from(PROBE))).args(args).stdin(Stdio::null()).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
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
    let p = signed_launch(Path::new(PROBE), &argv, 65534, "enforced");
    let ws = Scratch::new("policy-ws");
    ws.give_to_nobody();
    std::fs::create_dir(ws.join("out")).unwrap();
    std::os::unix::fs::chown(ws.join("out"), Some(65534), Some(65534)).unwrap();
    let run = parse(launch(&p, &ws.0, &[], &argv));
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(ws.join("out/ran").exists(), "the admitted write path is writable");
    let r = &run.record;
    assert_eq!(r["mode"], "enforced", "an enforced policy launches enforced");
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
    let p = signed_launch(Path::new(PROBE), &argv, 0, "enforced");
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

/// Root in any form needs the operator's `--allow-root-policy`: uid 0 under another group, gid 0
/// under another user, and the host's `/` as the root filesystem under an ordinary uid are each
/// refused without it. Controls: each is admitted with it (and the first two run).
#[test]
fn each_form_of_root_needs_the_operator_to_allow_it() {
    if !privileged("policy_root_forms") {
        return;
    }
    let argv = ["/probe", "euid"];
    let probe = Path::new(PROBE);
    let rootfs = shared_rootfs(probe);
    let identity = |uid: u32, gid: u32| {
        move |doc: &str, v: &mut serde_json::Value| {
            if doc == "policy" {
                v["identity"] = json!({"uid": uid, "gid": gid});
            }
        }
    };
    let forms = [
        ("uid 0 under gid 1000", signed_launch_edited(probe, &argv, 0, "enforced", rootfs, identity(0, 1000))),
        ("gid 0 under uid 1000", signed_launch_edited(probe, &argv, 0, "enforced", rootfs, identity(1000, 0))),
        (
            "the host's / as root",
            signed_launch_edited(probe, &argv, 1000, "enforced", Path::new("/"), identity(1000, 1000)),
        ),
    ];
    for (form, p) in &forms {
        let ws = Scratch::new("policy-root-form");
        std::fs::create_dir(ws.join("out")).unwrap();
        let out = launch(p, &ws.0, &[], &argv);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{form}: {err}");
        assert!(err.contains("--allow-root-policy"), "{form}: {err}");
        let allowed = launch(p, &ws.0, &["--allow-root-policy"], &argv);
        let err = String::from_utf8_lossy(&allowed.stderr);
        assert!(!err.contains("refused by policy"), "control, {form}: admitted with --allow-root-policy: {err}");
        if !form.contains("host's /") {
            let run = parse(allowed);
            assert_eq!(run.state(), "FullyEnforced", "control, {form}: {}", run.stderr);
            assert_eq!(run.record["annotations"]["policy.allow_root"], "true", "{form}");
        }
    }
}

/// A policy that admits network destinations runs in a cage with no route out, and its record
/// (so its receipt) says so; one that admits none says nothing about it.
#[test]
fn admitted_destinations_are_said_not_provided() {
    if !privileged("policy_network") {
        return;
    }
    let argv = ["/probe", "euid"];
    let probe = Path::new(PROBE);
    let with_network = |_: &str, v: &mut serde_json::Value| {
        let d = json!([{"host": "example.com", "port": 443}]);
        match v.get_mut("permissions") {
            Some(perms) => perms["network"] = d,
            None => v["ceilings"]["network"] = d,
        }
    };
    let p = signed_launch_edited(probe, &argv, 65534, "enforced", shared_rootfs(probe), with_network);
    let ws = Scratch::new("policy-network");
    std::fs::create_dir(ws.join("out")).unwrap();
    let run = parse(launch(&p, &ws.0, &[], &argv));
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(run.record["net"], "none", "{}", run.record);
    let said = run.record["annotations"]["policy.network"].as_str().unwrap_or_default();
    assert!(said.contains("not provided"), "{}", run.record["annotations"]);
    let plain = signed_launch(probe, &argv, 65534, "enforced");
    let run = parse(launch(&plain, &ws.0, &[], &argv));
    assert_eq!(run.state(), "FullyEnforced", "control: {}", run.stderr);
    assert!(run.record["annotations"].get("policy.network").is_none(), "control: {}", run.record["annotations"]);
}

/// A policy's mode is the launch's: shadow records what enforced would refuse (control: the
/// enforced policy's launch is enforced, above).
#[test]
fn a_shadow_policy_launches_in_shadow_mode() {
    if !privileged("policy_shadow") {
        return;
    }
    let argv = ["/probe", "euid"];
    let p = signed_launch(Path::new(PROBE), &argv, 65534, "shadow");
    let ws = Scratch::new("policy-shadow");
    std::fs::create_dir(ws.join("out")).unwrap();
    let run = parse(launch(&p, &ws.0, &[], &argv));
    assert_eq!(run.record["mode"], "shadow", "{}", run.stderr);
}

/// The command gets the cage's own defaults and the variables its policy admits, with chio's
/// values — and nothing else of chio's environment.
#[test]
fn a_policy_launch_passes_only_the_admitted_variables() {
    if !privileged("policy_env") {
        return;
    }
    let ws = Scratch::new("policy-env");
    std::fs::create_dir(ws.join("out")).unwrap();
    for (want, control) in [
        ("LANG=chio-test-lang", true),
        ("PATH=/usr/local/bin:/usr/bin:/bin", true),
        ("HOME=/workspace", true),
        ("CHIO_POLICY_ENV_NOT_ADMITTED=", false),
    ] {
        let argv = ["/probe", "read", "/proc/self/environ", want];
        let p = signed_launch(Path::new(PROBE), &argv, 65534, "enforced");
        let mut args: Vec<String> =
            ["cage", "run", "--json", "--policy", s(&p.policy), "--policy-signer", s(&p.operator)]
                .into_iter()
                .map(String::from)
                .collect();
        let (db, seed) = (p.dir.join("r.db"), p.dir.join("operator/signing.seed"));
        for a in [
            "--manifest",
            s(&p.manifest),
            "--workspace",
            s(&ws.0),
            "--receipt-db",
            s(&db),
            "--kernel-key",
            s(&seed),
            "--",
        ] {
            args.push(a.into());
        }
        args.extend(argv.iter().map(|a| a.to_string()));
        let out = Command::new(chio_bin(&PathBuf::from(PROBE)))
            .args(&args)
            .env("LANG", "chio-test-lang")
            .env("CHIO_POLICY_ENV_NOT_ADMITTED", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let run = parse(out);
        assert_eq!(run.state(), "FullyEnforced", "{want}: {}", run.stderr);
        assert_eq!(run.stdout.starts_with("ESCAPED"), control, "{want}: {}", run.stdout);
    }
}

/// A policy launch pins the target's digest the manifest names: the policy's root with its
/// `/probe` swapped for other bytes (one appended) after signing is refused at the verify stage,
/// and the swapped file never runs. And a policy that requires receipts refuses a launch that
/// gives no store. Controls: the same launch on the unswapped root, with receipts, runs.
#[test]
fn a_policy_launch_pins_its_digest_and_requires_its_receipts() {
    if !privileged("policy_pins") {
        return;
    }
    let argv = ["/probe", "write", "/workspace/out/ran"];
    let root = Scratch::new("policy-pinned-root");
    chio_tests::build_rootfs(&root.0, Path::new(PROBE));
    let p = chio_tests::signed_launch_on(Path::new(PROBE), &argv, 65534, "enforced", &root.0);
    let ws = Scratch::new("policy-pinned-ws");
    ws.give_to_nobody();
    std::fs::create_dir(ws.join("out")).unwrap();
    std::os::unix::fs::chown(ws.join("out"), Some(65534), Some(65534)).unwrap();
    // No store: refused before anything runs.
    let (manifest, policy, operator) =
        (s(&p.manifest).to_string(), s(&p.policy).to_string(), s(&p.operator).to_string());
    let out = chio(&[
        "cage",
        "run",
        "--json",
        "--policy",
        &policy,
        "--policy-signer",
        &operator,
        "--manifest",
        &manifest,
        "--workspace",
        s(&ws.0),
        "--",
        argv[0],
        argv[1],
        argv[2],
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("the policy requires receipts"), "{err}");
    assert!(!ws.join("out/ran").exists());
    // Control: with its receipts, it runs.
    let run = parse(launch(&p, &ws.0, &[], &argv));
    assert_eq!(run.state(), "FullyEnforced", "control: {}", run.stderr);
    assert!(ws.join("out/ran").exists());
    std::fs::remove_file(ws.join("out/ran")).unwrap();
    // The target swapped after signing: refused by its digest, never run.
    let mut bytes = std::fs::read(root.join("probe")).unwrap();
    bytes.push(0);
    std::fs::write(root.join("probe"), bytes).unwrap();
    let run = parse(launch(&p, &ws.0, &[], &argv));
    assert_eq!(run.state(), "BootstrapFailed", "{}", run.stderr);
    assert_eq!(run.record["failure"]["code"], "digest_mismatch", "{}", run.record["failure"]);
    assert!(!ws.join("out/ran").exists(), "the swapped target ran");
}
