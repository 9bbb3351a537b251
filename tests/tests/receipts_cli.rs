//! `chio cage run --receipt-db --kernel-key` makes a launch evidence: its receipts verify offline
//! under the pinned kernel key, and tampering or a wrong key is reported with the receipt id.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chio_tests::{chio_bin, privileged, shared_rootfs, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn chio(args: &[&str]) -> Output {
    Command::new(chio_bin(&PathBuf::from(PROBE))).args(args).stdin(Stdio::null()).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A fresh kernel key in `dir/key` and the store path next to it: (db, seed, public key file).
fn keyed_store(dir: &Scratch) -> (PathBuf, PathBuf, PathBuf) {
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    (dir.join("r.db"), keydir.join("signing.seed"), keydir.join("public.key"))
}

/// `/probe euid` on the shared rootfs with receipts (exit 1: it reports euid 65534).
fn probe_euid(db: &Path, seed: &Path) -> Output {
    let rootfs = shared_rootfs(&PathBuf::from(PROBE));
    chio(&[
        "cage",
        "run",
        "--rootfs",
        s(rootfs),
        "--receipt-db",
        s(db),
        "--kernel-key",
        s(seed),
        "--",
        "/probe",
        "euid",
    ])
}

/// An NDJSON export is a chain: a receipt deleted from its middle, or two swapped, is refused by
/// `receipt verify`, naming the break (each receipt alone still verifies). Control: the whole
/// export verifies.
#[test]
fn an_export_with_a_receipt_deleted_or_moved_does_not_verify() {
    if !privileged("receipts_export_chain") {
        return;
    }
    let dir = Scratch::new("receipts-chain");
    let (db, seed, public) = keyed_store(&dir);
    for _ in 0..2 {
        assert_eq!(probe_euid(&db, &seed).status.code(), Some(1));
    }
    let listed = String::from_utf8(chio(&["receipt", "list", "--receipt-db", s(&db)]).stdout).unwrap();
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 4, "{listed}");
    let verify = |name: &str, kept: &[usize]| {
        let file = dir.join(name);
        std::fs::write(&file, kept.iter().map(|i| format!("{}\n", lines[*i])).collect::<String>()).unwrap();
        chio(&["receipt", "verify", "--input", s(&file), "--trusted-kernel-pubkey", s(&public)])
    };
    let whole = verify("whole.ndjson", &[0, 1, 2, 3]);
    assert!(whole.status.success(), "control: the whole export verifies: {}", String::from_utf8_lossy(&whole.stderr));
    for (name, kept, why) in [
        ("deleted.ndjson", &[0, 1, 3][..], "a receipt is missing or moved"),
        ("moved.ndjson", &[0, 2, 1, 3][..], "a receipt is missing or moved"),
    ] {
        let v = verify(name, kept);
        let err = String::from_utf8_lossy(&v.stderr);
        assert_eq!(v.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(why) && err.contains("but the previous receipt is"), "{name}: {err}");
    }
}

#[test]
fn launch_receipts_verify_offline_and_tampering_is_named() {
    if !privileged("receipts_cli") {
        return;
    }
    let dir = Scratch::new("receipts");
    let (db, seed, public) = keyed_store(&dir);
    let run = probe_euid(&db, &seed);
    assert_eq!(run.status.code(), Some(1), "{}", String::from_utf8_lossy(&run.stderr));
    let ok = chio(&["receipt", "verify-chain", "--receipt-db", s(&db), "--trusted-kernel-pubkey", s(&public)]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("2 receipt(s), chain intact"));

    // Export as NDJSON and verify offline.
    let listed = chio(&["receipt", "list", "--receipt-db", s(&db)]);
    let lines: Vec<serde_json::Value> =
        String::from_utf8(listed.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["kind"], "launch_enforcement");
    assert_eq!(lines[0]["outcome"], "FullyEnforced");
    assert_eq!(lines[0]["receipt"]["body"]["launch_record"]["state"], "FullyEnforced");
    // Written at the exec stop, before the target ran: the embedded record has no outcome yet.
    assert!(lines[0]["receipt"]["body"]["launch_record"]["outcome"].is_null());
    assert!(lines[0]["receipt"]["body"]["launch_record"]["exec_observed_at"].is_string());
    assert_eq!(lines[1]["kind"], "launch_terminal");
    assert_eq!(lines[1]["outcome"], "exit:1");
    assert_eq!(lines[1]["receipt"]["body"]["launch"]["receipt_id"], lines[0]["id"]);
    let export = dir.join("export.ndjson");
    let text: String = lines.iter().map(|l| format!("{}\n", l["receipt"])).collect();
    std::fs::write(&export, &text).unwrap();
    let v = chio(&["receipt", "verify", "--input", s(&export), "--trusted-kernel-pubkey", s(&public)]);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));

    // One changed byte: refused, naming the receipt.
    let tampered = dir.join("tampered.ndjson");
    std::fs::write(&tampered, text.replacen("exit:1", "exit:0", 1)).unwrap();
    let v = chio(&["receipt", "verify", "--input", s(&tampered), "--trusted-kernel-pubkey", s(&public)]);
    assert_eq!(v.status.code(), Some(1));
    let err = String::from_utf8_lossy(&v.stderr);
    assert!(err.contains(":2: receipt ") && err.contains("does not verify"), "{err}");

    // Another kernel's key: every receipt refused before its signature is checked.
    let other = dir.join("other");
    assert!(chio(&["keys", "generate", "--out", s(&other)]).status.success());
    let v =
        chio(&["receipt", "verify", "--input", s(&export), "--trusted-kernel-pubkey", s(&other.join("public.key"))]);
    assert_eq!(v.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&v.stderr).contains("not the pinned key"));

    // `receipt list` output verifies as it is (no jq step).
    let listed_file = dir.join("listed.ndjson");
    std::fs::write(&listed_file, chio(&["receipt", "list", "--receipt-db", s(&db)]).stdout).unwrap();
    let v = chio(&["receipt", "verify", "--input", s(&listed_file), "--trusted-kernel-pubkey", s(&public)]);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    assert!(String::from_utf8_lossy(&v.stdout).contains("2 receipt(s) verified"));
    // Zero receipts is not "verified".
    let empty = dir.join("empty.ndjson");
    std::fs::write(&empty, "").unwrap();
    let v = chio(&["receipt", "verify", "--input", s(&empty), "--trusted-kernel-pubkey", s(&public)]);
    assert_eq!(v.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&v.stderr).contains("no receipt"));
    // Nonsense filters and ranges are refused, not answered with nothing.
    for args in [
        vec!["receipt", "list", "--receipt-db", s(&db), "--kind", "bogus"],
        vec!["receipt", "list", "--receipt-db", s(&db), "--limit", "0"],
        vec!["receipt", "verify-chain", "--receipt-db", s(&db), "--from", "4", "--to", "2"],
    ] {
        let r = chio(&args);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&r.stderr));
        assert!(r.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn a_foreign_store_refuses_the_launch_before_it_runs() {
    if !privileged("receipts_foreign") {
        return;
    }
    let dir = Scratch::new("receipts-foreign");
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    let db = dir.join("not-receipts.db");
    std::fs::write(&db, "this is not sqlite").unwrap();
    let ws = Scratch::new("receipts-foreign-ws");
    ws.give_to_nobody();
    let rootfs = shared_rootfs(&PathBuf::from(PROBE));
    let run = chio(&[
        "cage",
        "run",
        "--rootfs",
        s(rootfs),
        "--workspace",
        s(&ws.0),
        "--receipt-db",
        s(&db),
        "--kernel-key",
        s(&keydir.join("signing.seed")),
        "--",
        "/probe",
        "write",
        "/workspace/ran",
    ]);
    assert_eq!(run.status.code(), Some(125), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(!ws.join("ran").exists(), "the target ran although its receipts could not be recorded");
}

/// A store written by one kernel key refuses a launch with another, before it runs, and a store
/// whose last receipt was edited refuses the next launch naming that receipt.
#[test]
fn a_store_bound_to_another_key_or_broken_refuses_the_launch() {
    if !privileged("receipts_bound") {
        return;
    }
    let dir = Scratch::new("receipts-bound");
    let (k1, k2) = (dir.join("k1"), dir.join("k2"));
    for k in [&k1, &k2] {
        assert!(chio(&["keys", "generate", "--out", s(k)]).status.success());
    }
    let db = dir.join("r.db");
    let ws = Scratch::new("receipts-bound-ws");
    ws.give_to_nobody();
    let rootfs = shared_rootfs(&PathBuf::from(PROBE));
    let launch = |key: &Path, file: &str| {
        chio(&[
            "cage",
            "run",
            "--rootfs",
            s(rootfs),
            "--workspace",
            s(&ws.0),
            "--receipt-db",
            s(&db),
            "--kernel-key",
            s(&key.join("signing.seed")),
            "--",
            "/probe",
            "write",
            &format!("/workspace/{file}"),
        ])
    };
    // Control: the store's own key appends.
    assert!(launch(&k1, "first").status.success());
    assert!(ws.join("first").exists());
    let run = launch(&k2, "second");
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(125), "{err}");
    assert!(err.contains("bound to kernel key"), "{err}");
    assert!(!ws.join("second").exists(), "the target ran under a store that refused its key");
    // Edit the last receipt (bypassing the append-only triggers, as an attacker with the file would).
    let store = chio_kernel::store::Store::open(&db, false).unwrap();
    store
        .connection()
        .execute_batch(
            "DROP TRIGGER receipts_no_update; UPDATE receipts SET envelope = replace(envelope, 'exit:0', 'exit:9')
             WHERE seq = (SELECT max(seq) FROM receipts);",
        )
        .unwrap();
    drop(store);
    let run = launch(&k1, "third");
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(125), "{err}");
    assert!(err.contains("chain is broken at receipt 2"), "{err}");
    assert!(!ws.join("third").exists());
}

/// Inode numbers above 2^53 (overlayfs with `xino=on` over two filesystems) have no exact JSON
/// number: the record carries 64-bit identifiers as strings, so a receipted launch on such a
/// root works and its receipts verify.
#[test]
fn a_root_with_64_bit_inodes_is_receipted() {
    if !privileged("receipts_xino") {
        return;
    }
    let dir = Scratch::new("receipts-xino");
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    let db = dir.join("r.db");
    let rootfs = shared_rootfs(&PathBuf::from(PROBE));
    let script = r#"set -e
d="$1"; lower="$2"; shift 2
mkdir -p "$d/up" "$d/root"
mount -t tmpfs none "$d/up"
mkdir "$d/up/u" "$d/up/w"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$d/up/u,workdir=$d/up/w,xino=on" "$d/root"
stat -c '%i' "$d/root/probe" >&2
"$@" --rootfs "$d/root" -- /probe euid
"#;
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(&dir.0)
        .arg(rootfs)
        .arg(chio_bin(&PathBuf::from(PROBE)))
        .args(["cage", "run", "--json", "--receipt-db", s(&db), "--kernel-key", s(&keydir.join("signing.seed"))])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let inode: u64 = stderr.lines().next().unwrap().trim().parse().unwrap();
    assert!(inode > 1 << 53, "the overlay gives 64-bit inodes: {inode}");
    assert_eq!(out.status.code(), Some(1), "the probe ran (euid is refused as 65534): {stderr}");
    let record: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
    assert_eq!(record["state"], "FullyEnforced");
    assert_eq!(record["target"]["inode"], inode.to_string());
    let public = std::fs::read_to_string(keydir.join("public.key")).unwrap();
    let v = chio(&["receipt", "verify-chain", "--receipt-db", s(&db), "--trusted-kernel-pubkey", public.trim()]);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
}

/// A signed checkpoint of the head catches the deletion of the newest receipts, which leaves a
/// chain that verifies on its own.
#[test]
fn a_checkpoint_catches_deleted_newest_receipts() {
    if !privileged("receipts_checkpoint") {
        return;
    }
    let dir = Scratch::new("receipts-checkpoint");
    let (db, seed, public) = keyed_store(&dir);
    for _ in 0..2 {
        let run = probe_euid(&db, &seed);
        assert_eq!(run.status.code(), Some(1), "{}", String::from_utf8_lossy(&run.stderr));
    }
    let cp = dir.join("head.json");
    let out = chio(&["receipt", "checkpoint", "--receipt-db", s(&db), "--kernel-key", s(&seed), "--out", s(&cp)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let verify = || {
        chio(&[
            "receipt",
            "verify-chain",
            "--receipt-db",
            s(&db),
            "--trusted-kernel-pubkey",
            s(&public),
            "--checkpoint",
            s(&cp),
        ])
    };
    assert!(verify().status.success(), "{}", String::from_utf8_lossy(&verify().stderr));
    // Delete the newest receipt (an attacker with the file, bypassing the triggers).
    let store = chio_kernel::store::Store::open(&db, false).unwrap();
    store
        .connection()
        .execute_batch(
            "DROP TRIGGER receipts_no_delete; DELETE FROM receipts WHERE seq = (SELECT max(seq) FROM receipts);",
        )
        .unwrap();
    drop(store);
    let plain = chio(&["receipt", "verify-chain", "--receipt-db", s(&db), "--trusted-kernel-pubkey", s(&public)]);
    assert!(plain.status.success(), "without the checkpoint the shorter chain verifies");
    let v = verify();
    assert_eq!(v.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&v.stderr).contains("were deleted"), "{}", String::from_utf8_lossy(&v.stderr));
}

/// Reading commands never write: `receipt list` and `verify-chain` work on a store on a
/// read-only file system, and `image list` / `inspect` create no state directory.
#[test]
fn read_only_commands_write_nothing() {
    if !privileged("receipts_read_only") {
        return;
    }
    let dir = Scratch::new("receipts-ro");
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    let store_dir = dir.join("store");
    std::fs::create_dir(&store_dir).unwrap();
    let db = store_dir.join("r.db");
    let seed = keydir.join("signing.seed");
    let run = probe_euid(&db, &seed);
    assert_eq!(run.status.code(), Some(1));
    let before: Vec<_> = std::fs::read_dir(&store_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    let script = r#"set -e
mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"
"$2" receipt list --receipt-db "$1/r.db" >/dev/null
"$2" receipt verify-chain --receipt-db "$1/r.db" --trusted-key "$3"
"#;
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(&store_dir)
        .arg(chio_bin(&PathBuf::from(PROBE)))
        .arg(keydir.join("public.key"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("chain intact"));
    let after: Vec<_> = std::fs::read_dir(&store_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(before.len(), after.len(), "{before:?} -> {after:?}");
    // No image store is made by looking at one.
    let state = dir.join("no-state");
    assert!(chio(&["image", "list", "--state-dir", s(&state)]).status.success());
    assert_eq!(chio(&["image", "inspect", "x", "--state-dir", s(&state)]).status.code(), Some(1));
    assert!(!state.exists(), "a reading command created {}", state.display());
}

/// Evidence that cannot be recorded means no launch: when the enforcement receipt cannot be
/// written at the exec stop (here: chio's file-size limit reached in the store's WAL), the target
/// is killed before it runs one instruction (`evidence_not_recorded`).
#[test]
fn a_receipt_that_cannot_be_written_at_the_exec_stop_kills_the_target() {
    if !privileged("receipts_evidence") {
        return;
    }
    let dir = Scratch::new("receipts-evidence");
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    let (db, seed) = (dir.join("r.db"), keydir.join("signing.seed"));
    let ws = Scratch::new("receipts-evidence-ws");
    ws.give_to_nobody();
    let launch = |file: &str| {
        vec![
            "cage",
            "run",
            "--json",
            "--workspace",
            s(&ws.0),
            "--receipt-db",
            s(&db),
            "--kernel-key",
            s(&seed),
            "--",
            "/bin/sh",
            "-c",
        ]
        .into_iter()
        .map(String::from)
        .chain([format!("echo ran > /workspace/{file}")])
        .collect::<Vec<_>>()
    };
    // A connection held open keeps the WAL growing across launches (no checkpoint at close).
    let run =
        |v: Vec<String>| Command::new(chio_bin(&PathBuf::from(PROBE))).args(v).stdin(Stdio::null()).output().unwrap();
    assert!(run(launch("first")).status.success());
    let held = chio_kernel::store::Store::open(&db, false).unwrap();
    for i in 0..3 {
        assert!(run(launch(&format!("warm{i}"))).status.success());
    }
    let wal = std::fs::metadata(format!("{}-wal", db.display())).unwrap().len();
    // Room for the WAL as it is plus less than one more receipt.
    let blocks = (wal + 1024) / 512 + 1;
    let cmd = launch("ran");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("trap '' XFSZ; ulimit -S -f {blocks}; exec \"$@\""))
        .arg("sh")
        .arg(chio_bin(&PathBuf::from(PROBE)))
        .args(&cmd)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    drop(held);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    let record: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
    assert_eq!(record["failure"]["code"], "evidence_not_recorded", "{stderr}");
    assert_eq!(record["failure"]["stage"], "observe");
    assert!(!ws.join("ran").exists(), "the target ran although its evidence was not recorded");
    assert!(ws.join("warm2").exists(), "control: the same launch with room for its receipts runs");
}

/// What `receipt verify` and `verify-chain` take, at their bounds: a line that is a receipt is
/// verified as itself even when it also carries a `receipt` member (never the member in its
/// place: a forged body with a genuine receipt inside must not verify); an input of more than
/// 64 MiB, or of more than 100,000 lines, is refused unread (one of exactly 64 MiB is read); a
/// range of one receipt (`--from N --to N`) verifies. Controls: the genuine receipt verifies
/// alone and as `receipt list` wraps it.
#[test]
fn verify_takes_each_line_as_itself_and_holds_its_bounds() {
    if !privileged("receipts_verify_bounds") {
        return;
    }
    let dir = Scratch::new("receipts-bounds");
    let (db, seed, public) = keyed_store(&dir);
    assert_eq!(probe_euid(&db, &seed).status.code(), Some(1));
    let listed = String::from_utf8(chio(&["receipt", "list", "--receipt-db", s(&db)]).stdout).unwrap();
    let first: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    let genuine = first["receipt"].clone();
    let verify = |name: &str, text: &str| {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        chio(&["receipt", "verify", "--input", s(&file), "--trusted-kernel-pubkey", s(&public)])
    };
    assert!(verify("genuine.ndjson", &format!("{genuine}\n")).status.success(), "control: the receipt alone");
    // A forged body carrying the genuine receipt as a member: verified as itself, refused.
    let mut forged = genuine.clone();
    forged["body"]["outcome"] = serde_json::json!("exit:0");
    forged["receipt"] = genuine.clone();
    let v = verify("forged.ndjson", &format!("{forged}\n"));
    assert_eq!(v.status.code(), Some(1), "a forged body verified through the receipt it carries");
    // More than 64 MiB, or more than 100,000 lines: refused before anything is verified.
    let big = dir.join("big.ndjson");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len((64 << 20) + 1).unwrap();
    let v = chio(&["receipt", "verify", "--input", s(&big), "--trusted-kernel-pubkey", s(&public)]);
    assert!(String::from_utf8_lossy(&v.stderr).contains("reads at most"), "{}", String::from_utf8_lossy(&v.stderr));
    f.set_len(64 << 20).unwrap();
    let v = chio(&["receipt", "verify", "--input", s(&big), "--trusted-kernel-pubkey", s(&public)]);
    assert!(!String::from_utf8_lossy(&v.stderr).contains("reads at most"), "64 MiB exactly is read");
    let lines = verify("many.ndjson", &"{}\n".repeat(100_001));
    assert!(
        String::from_utf8_lossy(&lines.stderr).contains("checks at most"),
        "{}",
        String::from_utf8_lossy(&lines.stderr)
    );
    let lines = verify("enough.ndjson", &"{}\n".repeat(100_000));
    assert!(!String::from_utf8_lossy(&lines.stderr).contains("checks at most"), "100,000 lines are checked");
    // A range of one receipt.
    let one = chio(&["receipt", "verify-chain", "--receipt-db", s(&db), "--from", "2", "--to", "2"]);
    assert!(one.status.success(), "--from 2 --to 2: {}", String::from_utf8_lossy(&one.stderr));
}
