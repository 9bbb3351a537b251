//! The repository execution leg end to end, with real git repositories built here, real cages
//! over the host's system directories (bash, coreutils, python3) and real signed receipts: the
//! Python calculator task from init to a verified, applied patch; refused changes and shapes;
//! processes that try to outlive their command; deadlines and output ceilings; a hostile source
//! repository; tampered bundles.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chio_tests::{calculator_repo as calculator, chio_bin, git, privileged, Scratch};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

/// `chio ARGS`, failing the test if it has not ended in two minutes (the suite's deadlines are
/// seconds: a longer wait is a hang).
fn chio(args: &[&str]) -> Output {
    let mut c = Command::new(chio_bin(&PathBuf::from(PROBE)));
    c.args(args).stdin(Stdio::null());
    chio_tests::run_within(&mut c, std::time::Duration::from_secs(120), &format!("chio {}", args.join(" ")))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A workspace over `repo`'s `package/` at HEAD, with a fresh kernel key: (state, seed, pubkey).
struct Ws {
    state: PathBuf,
    public: PathBuf,
}

fn init(dir: &Scratch, repo: &Path, paths: &[&str]) -> Ws {
    let (ws, out) = try_init(dir, repo, paths, &[]);
    assert!(out.status.success(), "init: {}", String::from_utf8_lossy(&out.stderr));
    ws
}

/// `init` with extra arguments; the caller checks the outcome.
fn try_init(dir: &Scratch, repo: &Path, paths: &[&str], extra: &[&str]) -> (Ws, Output) {
    let state = dir.join(&format!("ws-{}", std::fs::read_dir(&dir.0).unwrap().count()));
    let out = init_at(dir, repo, &state, paths, extra);
    (Ws { state, public: dir.join("key/public.key") }, out)
}

/// `init` of `state`, signed with the scratch directory's key (made on first use).
fn init_at(dir: &Scratch, repo: &Path, state: &Path, paths: &[&str], extra: &[&str]) -> Output {
    let keydir = dir.join("key");
    if !keydir.exists() {
        assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    }
    let mut args = vec!["repository", "init", "--state", s(state), "--repository", s(repo), "--revision", "HEAD"];
    for p in paths {
        args.extend(["--source-path", p]);
    }
    let seed = keydir.join("signing.seed");
    args.extend(["--kernel-key", s(&seed)]);
    args.extend(extra);
    chio(&args)
}

/// `chio repository execute --json`: (exit code, result).
fn exec(ws: &Ws, key: &str, deadline: &str, command: &str) -> (i32, Value) {
    let out = chio(&[
        "repository",
        "execute",
        "--state",
        s(&ws.state),
        "--operation-key",
        key,
        "--deadline",
        deadline,
        "--json",
        "--",
        command,
    ]);
    let code = out.status.code().unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&out.stderr).into()));
    (code, v)
}

fn status(ws: &Ws) -> Value {
    let out = chio(&["repository", "status", "--state", s(&ws.state), "--json"]);
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `chio repository verify-export` of `bundle` against `checkout` at `rev`, scope `package`, under
/// `key`, with `extra` flags; the caller reads the outcome.
fn verify_package(bundle: &Path, checkout: &Path, rev: &str, key: &Path, extra: &[&str]) -> Output {
    let args = ["repository", "verify-export", "--bundle", s(bundle), "--repository", s(checkout), "--revision", rev];
    let scope = ["--source-path", "package", "--kernel-key", s(key)];
    chio(&[&args[..], &scope, extra].concat())
}

fn verify(bundle: &Path, checkout: &Path, rev: &str, paths: &[&str], key: &Path) -> (i32, Value, String) {
    let mut args =
        vec!["repository", "verify-export", "--bundle", s(bundle), "--repository", s(checkout), "--revision", rev];
    for p in paths {
        args.extend(["--source-path", p]);
    }
    args.extend(["--kernel-key", s(key)]);
    // Its scratch directory (the recipient's baseline, objects, a git repository) goes, whatever
    // the verdict; so do those a killed verify-export of this user left, which no process holds
    // locked, whatever pid their name carries — but not one a live verify-export holds (here this
    // test, as one in another pid namespace whose pid is not to be seen), one still being made
    // (its dotted name), another user's, or a link.
    let tmp = checkout.with_extension("verify-tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    drop(gone.wait_with_output());
    for stale in [format!("chio-verify-{dead}-aa"), format!("chio-verify-{}-ee", std::process::id())] {
        std::fs::create_dir_all(tmp.join(&stale).join("import")).unwrap();
        std::fs::write(tmp.join(&stale).join("import/source.py"), "private").unwrap();
    }
    let kept = [format!(".chio-verify-{dead}-ff"), format!("chio-verify-{dead}-bb"), format!("chio-verify-{dead}-cc")];
    for k in &kept {
        std::fs::create_dir(tmp.join(k)).unwrap();
    }
    let held = std::fs::File::open(tmp.join(&kept[1])).unwrap();
    // SAFETY: flock on our own open directory, released when `held` is dropped.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) }, 0);
    std::os::unix::fs::chown(tmp.join(&kept[2]), Some(65534), None).unwrap();
    let target = checkout.with_extension("verify-target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("kept"), "host").unwrap();
    std::os::unix::fs::symlink(&target, tmp.join(format!("chio-verify-{dead}-dd"))).unwrap();
    let out = Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(&args)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let mut left: Vec<String> =
        std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    let link = format!("chio-verify-{dead}-dd");
    assert_eq!(left, [kept[0].clone(), kept[1].clone(), kept[2].clone(), link], "verify-export's TMPDIR afterwards");
    drop(held);
    assert_eq!(std::fs::read_to_string(target.join("kept")).unwrap(), "host", "the link's target");
    std::fs::remove_dir_all(&tmp).unwrap();
    std::fs::remove_dir_all(&target).unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap(), v, String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn python_calculator_from_init_to_an_applied_verified_patch() {
    if !privileged("python_calculator") {
        return;
    }
    let dir = Scratch::new("repo-calc");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    let live = ws.state.join("workspace/package");
    // Exactly the committed tree: no dirty change, no untracked file, nothing outside the scope.
    assert_eq!(std::fs::read_to_string(live.join("calc.py")).unwrap(), "def add(a, b):\n    return a - b\n");
    assert!(!live.join("untracked.py").exists() && !ws.state.join("workspace/README").exists());

    let (code, r) = exec(&ws, "run-1", "60", "cd package && python3 -m unittest");
    assert_eq!((code, r["exit_status"].as_i64()), (1, Some(1)), "{r}");
    assert!(r["output"].as_str().unwrap().contains("FAILED"), "{r}");
    // The fix changes the file's size: python3 trusts a bytecode cache whose source has the same
    // size and mtime second, and this edit lands within the second of the failing run.
    let (code, r) = exec(&ws, "fix-1", "60", "sed -i 's/return a - b/return a + b  # fixed/' package/calc.py");
    assert_eq!(code, 0, "{r}");
    let (code, r) = exec(&ws, "run-2", "60", "cd package && python3 -m unittest");
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["transition"], "committed");
    assert_ne!(r["before"], r["after"], "the test run left bytecode behind: a new snapshot");

    // The signed detail has exactly the fields its JSON Schema names.
    let detail_of_last = {
        let out = chio(&["receipt", "list", "--receipt-db", s(&ws.state.join("receipts.db")), "--kind", "tool_call"]);
        let last: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
        last["receipt"]["body"]["detail"].clone()
    };
    let schema_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/schemas/chio.repository.execute.v1.json");
    let schema: Value = serde_json::from_slice(&std::fs::read(schema_path).unwrap()).unwrap();
    let mut named: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
    let mut have: Vec<&String> = detail_of_last.as_object().unwrap().keys().collect();
    named.sort();
    have.sort();
    assert_eq!(named, have);
    assert_eq!(detail_of_last["schema"], "chio.repository.execute.v1");
    // A replayed key returns the retained result and launches nothing (no new receipt).
    let receipts = status(&ws)["receipts"].as_u64().unwrap();
    let (code, again) = exec(&ws, "run-2", "60", "cd package && python3 -m unittest");
    assert_eq!(code, 0);
    assert_eq!(again["replayed"], true);
    assert_eq!(again["receipt_id"], r["receipt_id"]);
    assert_eq!(status(&ws)["receipts"].as_u64().unwrap(), receipts, "a replay launched again");
    // The same key with another command is a conflict.
    let (code, _) = exec(&ws, "run-2", "60", "true");
    assert_eq!(code, 4);

    let bundle = dir.join("bundle");
    let out = chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&bundle)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The recipient: its own clone, its own choice of commit, scope and key.
    let recipient = dir.join("recipient");
    git(&dir.0, &["clone", "-q", s(&repo), s(&recipient)]);
    let (code, report, err) = verify(&bundle, &recipient, "HEAD", &["package"], &ws.public);
    assert_eq!(code, 0, "{report} {err}");
    assert_eq!(report["verified_transitions"], 3, "{report}");
    assert_eq!(report["verified_receipts"].as_u64(), Some(receipts), "{report}");
    assert_eq!(report["source_paths"], serde_json::json!(["package"]), "{report}");
    for k in ["baseline_matches", "final_matches", "patch_matches"] {
        assert_eq!(report[k], true, "{k}: {report}");
    }
    git(&recipient, &["apply", s(&bundle.join("changes.patch"))]);
    let t = Command::new("python3").args(["-m", "unittest"]).current_dir(recipient.join("package")).output().unwrap();
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));

    // Another key: refused.
    let other = dir.join("other-key");
    assert!(chio(&["keys", "generate", "--out", s(&other)]).status.success());
    let (code, report, _) = verify(&bundle, &recipient, "HEAD", &["package"], &other.join("public.key"));
    assert_eq!(code, 5);
    assert!(report["error"].as_str().unwrap().contains("pinned key"), "{report}");
}

/// Each tampering of a bundle is refused with exit 5 and named.
#[test]
fn tampered_or_foreign_bundles_are_refused() {
    if !privileged("tampered_bundles") {
        return;
    }
    let dir = Scratch::new("repo-tamper");
    let repo = calculator(&dir.0);
    git(&repo, &["checkout", "-q", "--", "package/calc.py"]);
    // A server id the recipient need not pin (it verifies without one below) but may.
    let (ws, out) = try_init(&dir, &repo, &["package"], &["--server-id", "calc-server"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(exec(&ws, "a", "30", "echo one > package/one.txt").0, 0);
    assert_eq!(exec(&ws, "b", "30", "echo two > package/two.txt").0, 0);
    let bundle = dir.join("bundle");
    assert!(chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&bundle)]).status.success());
    let recipient = dir.join("recipient");
    git(&dir.0, &["clone", "-q", s(&repo), s(&recipient)]);
    assert_eq!(verify(&bundle, &recipient, "HEAD", &["package"], &ws.public).0, 0);

    let copy = |name: &str| -> PathBuf {
        let c = dir.join(name);
        std::fs::create_dir(&c).unwrap();
        for f in std::fs::read_dir(&bundle).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), c.join(f.file_name())).unwrap();
        }
        c
    };
    let expect = |b: &Path, rev: &str, paths: &[&str], words: &str| {
        let (code, report, err) = verify(b, &recipient, rev, paths, &ws.public);
        assert_eq!(code, 5, "{words}: {report} {err}");
        let e = report["error"].as_str().unwrap_or_default().to_string();
        assert!(e.contains(words), "expected {words:?} in {e:?}");
    };
    // An emptied patch: an empty change set is a valid result only when nothing changed.
    let b = copy("emptied-patch");
    std::fs::write(b.join("changes.patch"), "").unwrap();
    expect(&b, "HEAD", &["package"], "changes.patch does not turn the baseline into the final snapshot");
    // An edited patch.
    let b = copy("edited-patch");
    let p = std::fs::read_to_string(b.join("changes.patch")).unwrap().replace("+one", "+ONE");
    std::fs::write(b.join("changes.patch"), p).unwrap();
    expect(&b, "HEAD", &["package"], "changes.patch");
    // The claims document: the edited patch fails its claim (and only the claims that need the
    // patch); the bundle as sent holds every claim.
    let claims_of = |b: &Path| {
        let out = verify_package(b, &recipient, "HEAD", &ws.public, &["--json"]);
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let failed: Vec<String> = doc["claims"]["claims"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["holds"] == false)
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        (out.status.code().unwrap(), failed, doc)
    };
    let (code, failed, doc) = claims_of(&b);
    assert_eq!((code, failed), (5, vec!["patch_verified".to_string()]), "{doc}");
    let (code, failed, doc) = claims_of(&bundle);
    assert_eq!((code, failed.len()), (0, 0), "{doc}");
    assert_eq!(doc["claims"]["schema"], "chio.claims.v1");
    // A dropped receipt.
    let b = copy("dropped-receipt");
    let lines: Vec<String> =
        std::fs::read_to_string(b.join("receipts.ndjson")).unwrap().lines().map(String::from).collect();
    std::fs::write(b.join("receipts.ndjson"), lines[..lines.len() - 1].join("\n") + "\n").unwrap();
    expect(&b, "HEAD", &["package"], "transitions.json");
    let b = copy("dropped-middle");
    let kept: Vec<&String> = lines.iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, l)| l).collect();
    std::fs::write(b.join("receipts.ndjson"), kept.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    expect(&b, "HEAD", &["package"], "chain is broken");
    // An edited receipt (its signature no longer holds).
    let b = copy("edited-receipt");
    let edited = std::fs::read_to_string(b.join("receipts.ndjson")).unwrap().replacen("exit:0", "exit:1", 1);
    std::fs::write(b.join("receipts.ndjson"), edited).unwrap();
    expect(&b, "HEAD", &["package"], "does not verify");
    // Reordered transitions.
    let b = copy("reordered");
    let mut t: Value = serde_json::from_slice(&std::fs::read(b.join("transitions.json")).unwrap()).unwrap();
    t["transitions"].as_array_mut().unwrap().reverse();
    std::fs::write(b.join("transitions.json"), serde_json::to_vec(&t).unwrap()).unwrap();
    expect(&b, "HEAD", &["package"], "transitions.json");
    // A baseline archive that is not the baseline (the recipient's own baseline matches; the
    // bundle's must too).
    let b = copy("other-baseline");
    std::fs::copy(b.join("final.tar"), b.join("baseline.tar")).unwrap();
    expect(&b, "HEAD", &["package"], "the bundle's baseline is not the recipient's baseline");
    // A JSON file over 64 MiB is refused unread past the limit (sparse: no disk is written);
    // exactly 64 MiB is read, and refused as what it is.
    for (len, says) in [((64 << 20) + 1, "is over 67108864 bytes"), (64 << 20, "does not verify")] {
        let b = copy(&format!("receipts-of-{len}"));
        std::fs::File::create(b.join("receipts.ndjson")).unwrap().set_len(len).unwrap();
        expect(&b, "HEAD", &["package"], says);
    }
    // A member whose stated size (8 MiB, within the ceilings) is far beyond its bytes: refused.
    // (A claim of 1 TiB aborted the verifier once; the ceilings refuse it now, below.)
    let b = copy("huge-member");
    let mut h = tar::Header::new_gnu();
    h.set_path("package/huge").unwrap();
    h.set_size(8 << 20);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut tar_bytes = h.as_bytes().to_vec();
    tar_bytes.extend([b'x'; 512]);
    tar_bytes.extend([0u8; 1024]);
    std::fs::write(b.join("final.tar"), tar_bytes).unwrap();
    expect(&b, "HEAD", &["package"], "ends inside this member");
    // The workspace's ceilings (the configuration the receipts bind: 8,192 entries, 16 MiB a
    // file, 64 MiB in all) bound what an archive may make the verifier hold, member by member.
    let member = |b: &mut tar::Builder<std::fs::File>, name: &str, size: u64, bytes: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).unwrap();
        h.set_size(size);
        h.set_mode(if name == "package" { 0o755 } else { 0o644 });
        h.set_entry_type(if name == "package" { tar::EntryType::Directory } else { tar::EntryType::Regular });
        h.set_cksum();
        b.append(&h, std::io::Read::take(std::io::repeat(b'x'), bytes)).unwrap();
    };
    let archive = |name: &str, members: &mut dyn FnMut(&mut tar::Builder<std::fs::File>)| -> PathBuf {
        let b = copy(name);
        let mut t = tar::Builder::new(std::fs::File::create(b.join("final.tar")).unwrap());
        member(&mut t, "package", 0, 0);
        members(&mut t);
        t.finish().unwrap();
        b
    };
    // A file's claim past 16 MiB is refused before a byte of it is read.
    let b = archive("file-ceiling", &mut |t| member(t, "package/big", (16 << 20) + 1, 0));
    expect(&b, "HEAD", &["package"], "\"package/big\": the archive exceeds the size ceilings");
    // 64 MiB in all is held to; the byte past it is refused, in the member that brings it.
    let b = archive("total-ceiling", &mut |t| {
        for i in 0..4 {
            member(t, &format!("package/b{i}"), 16 << 20, 16 << 20);
        }
        member(t, "package/b4", 1, 1);
    });
    expect(&b, "HEAD", &["package"], "\"package/b4\": the archive exceeds the size ceilings");
    // 8,192 members are read (and are not the committed snapshot); one more is refused.
    let b = archive("entries-at-ceiling", &mut |t| (1..8192).for_each(|i| member(t, &format!("package/f{i}"), 0, 0)));
    expect(&b, "HEAD", &["package"], "final.tar is not the snapshot the last transition committed");
    let b = archive("entries-past-ceiling", &mut |t| (1..8193).for_each(|i| member(t, &format!("package/f{i}"), 0, 0)));
    expect(&b, "HEAD", &["package"], "more than 8192 archive members");
    // The bundle is the sender's: a link in it is not followed (here to /dev/zero, which would
    // be read without end), and a FIFO is not waited on.
    let planted = |name: &str, file: &str, fifo: bool| -> PathBuf {
        let b = copy(name);
        std::fs::remove_file(b.join(file)).unwrap();
        if fifo {
            assert!(Command::new("mkfifo").arg(b.join(file)).status().unwrap().success());
        } else {
            std::os::unix::fs::symlink("/dev/zero", b.join(file)).unwrap();
        }
        b
    };
    expect(&planted("linked-receipts", "receipts.ndjson", false), "HEAD", &["package"], "symbolic link");
    expect(&planted("fifo-transitions", "transitions.json", true), "HEAD", &["package"], "not a regular file");
    // The patch too: git is handed the open file, never the path (it read /dev/zero through the
    // link into memory without end, and waited on the FIFO).
    let b = planted("linked-patch", "changes.patch", false);
    expect(&b, "HEAD", &["package"], "changes.patch is or passes through a symbolic link");
    let b = planted("fifo-patch", "changes.patch", true);
    expect(&b, "HEAD", &["package"], "changes.patch is not a regular file");
    // Another commit, another scope.
    std::fs::write(recipient.join("package/more.py"), "x = 1\n").unwrap();
    git(&recipient, &["add", "-A"]);
    git(&recipient, &["commit", "-qm", "more"]);
    expect(&bundle, "HEAD", &["package"], "commit");
    expect(&bundle, "HEAD~1", &["package", "README"], "scope");
    // The server id the workspace names, pinned: verified; another: refused. (A revision is a
    // ref or a commit id: refs are read as files, `HEAD~1` is no name.)
    let first = git(&recipient, &["rev-parse", "HEAD~1"]);
    let with_server = |id: &str| verify_package(&bundle, &recipient, &first, &ws.public, &["--server-id", id]);
    let out = with_server("calc-server");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let out = with_server("another-server");
    assert_eq!(out.status.code(), Some(5));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["error"],
        "verification failed: the bundle is for server id \"calc-server\", not the pinned \"another-server\"",
        "operator words, no Rust Debug form"
    );
}

/// A session that changed nothing has a result all the same: an empty, signed, verifiable change
/// set; a server id pinned against a workspace that named none is refused in words.
#[test]
fn a_result_without_changes_verifies() {
    if !privileged("no_change_result") {
        return;
    }
    let dir = Scratch::new("repo-nochange");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    let (code, r) = exec(&ws, "look", "30", "ls package");
    assert_eq!(code, 0, "{r}");
    let bundle = dir.join("bundle");
    let out = chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&bundle)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(bundle.join("changes.patch")).unwrap().len(), 0, "no change, an empty patch");
    let recipient = dir.join("recipient");
    git(&dir.0, &["clone", "-q", s(&repo), s(&recipient)]);
    let (code, report, err) = verify(&bundle, &recipient, "HEAD", &["package"], &ws.public);
    assert_eq!(code, 0, "{report} {err}");
    for k in ["baseline_matches", "final_matches", "patch_matches"] {
        assert_eq!(report[k], true, "{k}: {report}");
    }
    assert_eq!(report["verified_transitions"], 1, "{report}");
    // A patch planted in an empty change set is refused.
    std::fs::write(
        bundle.join("changes.patch"),
        "diff --git a/package/x b/package/x\nnew file mode 100644\n--- /dev/null\n+++ b/package/x\n@@ -0,0 +1 @@\n+x\n",
    )
    .unwrap();
    let (code, report, _) = verify(&bundle, &recipient, "HEAD", &["package"], &ws.public);
    assert_eq!((code, report["patch_matches"].as_bool()), (5, Some(false)), "{report}");
    let out = verify_package(&bundle, &recipient, "HEAD", &ws.public, &["--server-id", "sandbox"]);
    assert_eq!(out.status.code(), Some(5));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = report["error"].as_str().unwrap();
    assert!(e.contains("names no server id") && !e.contains("None") && !e.contains("Some("), "{e}");
}

#[test]
fn a_change_outside_the_scope_is_put_back_and_stops_the_workspace() {
    if !privileged("scope_violation") {
        return;
    }
    let dir = Scratch::new("repo-scope");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    let before = status(&ws)["head"].clone();
    let (code, r) = exec(&ws, "escape", "30", "echo changed > package/calc.py; echo outside > notes.txt");
    assert_eq!(code, 3, "{r}");
    assert_eq!(r["transition"], "refused");
    assert!(r["reason"].as_str().unwrap().contains("notes.txt"), "{r}");
    // Put back: the in-scope edit of the same command is undone too, nothing outside remains.
    assert!(!ws.state.join("workspace/notes.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.state.join("workspace/package/calc.py")).unwrap(),
        "def add(a, b):\n    return a - b\n"
    );
    let st = status(&ws);
    assert_eq!((st["state"].as_str(), &st["head"]), (Some("stopped"), &before));
    let (code, r) = exec(&ws, "next", "30", "true");
    assert_eq!(code, 3, "{r}");
    // The refusal itself is signed evidence.
    assert!(st["receipts"].as_u64().unwrap() >= 3);
}

#[test]
fn every_refused_workspace_shape_is_refused() {
    if !privileged("refused_shapes") {
        return;
    }
    let dir = Scratch::new("repo-shapes");
    let repo = calculator(&dir.0);
    let cases = [
        ("fifo", "mkfifo package/pipe", "FIFO"),
        ("socket", "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"package/sock\")'", "FIFO, socket"),
        ("hard link", "ln package/calc.py package/hard.py", "hard link"),
        ("escaping symlink", "ln -s ../../etc/passwd package/pw", "outside the workspace"),
        ("absolute symlink", "ln -s /etc/passwd package/pw", "absolute"),
        ("too many entries", "cd package && seq 8200 | xargs touch", "entries"),
        (
            "too much content",
            "cd package && for i in 1 2 3 4 5; do head -c 15M /dev/zero > big$i; done",
            "bytes of content",
        ),
        ("a newline in a name", "touch 'package/a\nb'", "control character"),
    ];
    for (what, command, words) in cases {
        let ws = init(&dir, &repo, &["package"]);
        let (code, r) = exec(&ws, "k", "60", command);
        assert_eq!(code, 3, "{what}: {r}");
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(words), "{what}: {reason:?} lacks {words:?}");
        assert_eq!(status(&ws)["state"], "stopped", "{what}");
        let listing = std::fs::read_dir(ws.state.join("workspace/package")).unwrap().count();
        assert_eq!(listing, 2, "{what}: the workspace was not put back");
    }
    // A file over 16 MiB cannot even be written (RLIMIT_FSIZE); the walk's own ceiling is
    // covered by the snapshot unit tests.
    let ws = init(&dir, &repo, &["package"]);
    let (code, r) = exec(&ws, "big", "60", "head -c 17M /dev/zero > package/big");
    assert_ne!(r["exit_status"], 0, "{r}");
    assert_eq!(code, r["exit_status"].as_i64().unwrap() as i32);
    assert!(std::fs::metadata(ws.state.join("workspace/package/big")).unwrap().len() <= 16 << 20);
}

/// `chio repository execute --json` with the descriptor limit systemd gives a service (1,024).
fn exec_as_a_service(ws: &Ws, key: &str, command: &str) -> (i32, Value) {
    let mut c = Command::new(chio_bin(&PathBuf::from(PROBE)));
    c.args(["repository", "execute", "--state", s(&ws.state), "--operation-key", key, "--deadline", "60", "--json"])
        .args(["--", command])
        .stdin(Stdio::null());
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            let lim = libc::rlimit { rlim_cur: 1024, rlim_max: 1024 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = c.output().unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&out.stderr).into()));
    (out.status.code().unwrap(), v)
}

/// A command's tree wider or deeper than the host's descriptor limit is committed, refused or
/// put back, never left without an outcome: 1,200 directories are committed and later
/// restored whole; 1,500 levels (`mkdir d; cd d` in a loop) are refused as too deep and removed.
/// Before, the host held a descriptor a directory level on the walk and on the removal, and one
/// a directory of the tree on the restore: each ran out (EMFILE) and left the operation
/// dispatched, its outcome unknown.
#[test]
fn trees_past_the_descriptor_limit_get_an_outcome() {
    if !privileged("descriptor_limit") {
        return;
    }
    let dir = Scratch::new("repo-fds");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    let wide = "python3 -c \"import os\nfor i in range(1200): os.mkdir(f'package/d{i}'); open(f'package/d{i}/f', 'w').close()\"";
    let (code, r) = exec_as_a_service(&ws, "wide", wide);
    assert_eq!((code, &r["transition"]), (0, &Value::from("committed")), "{r}");
    let deep = "python3 -c \"import os\nos.chdir('package')\nfor _ in range(1500): os.mkdir('d'); os.chdir('d')\"";
    let (code, r) = exec_as_a_service(&ws, "deep", deep);
    assert_eq!(code, 3, "{r}");
    let reason = r["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("nested more than 256 directories deep"), "{reason}");
    assert_eq!(status(&ws)["state"], "stopped");
    let live = ws.state.join("workspace/package");
    assert!(!live.join("d").exists(), "the deep tree was not removed");
    assert_eq!(std::fs::read_dir(&live).unwrap().count(), 1202, "the wide tree was not put back");
    assert_eq!(std::fs::read_dir(ws.state.join("tmp")).unwrap().count(), 0, "a tree was left in tmp/");
}

/// A workspace's state directory is only used where no one but root can replace it: a user who
/// can write a directory above it could rename it away and put their own in its place: the
/// configuration (the uid commands run as, their ceilings), the key file root reads, and links
/// among the files root then writes by path. Refused before anything is read or written; above
/// it, sticky will do.
#[test]
fn a_workspace_others_could_replace_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    if !privileged("private_state") {
        return;
    }
    let dir = Scratch::new("repo-private");
    let repo = calculator(&dir.0);
    let chown = |p: &Path, uid: u32| std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
    let chmod = |p: &Path, mode: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    let refused = |out: &Output, words: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains(words), "expected {words:?} in {err}");
    };
    // A home of uid 65534: no workspace is made in it, nor in an empty directory of its own.
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    chown(&home, 65534);
    let init_at = |state: &Path| init_at(&dir, &repo, state, &["package"], &[]);
    refused(&init_at(&home.join("ws")), &format!("{} is owned by uid 65534", home.display()));
    assert!(!home.join("ws").exists());
    let theirs = dir.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chown(&theirs, 65534);
    refused(&init_at(&theirs), &format!("{} is owned by uid 65534", theirs.display()));
    assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
    // An empty one of root's, open to all for reading, is made 0700 like a new one: the live
    // tree below holds whatever commands made, for no one else to reach.
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    chmod(&empty, 0o755);
    assert!(init_at(&empty).status.success());
    assert_eq!(std::fs::metadata(&empty).unwrap().permissions().mode() & 0o7777, 0o700);
    // A workspace made where only root writes; then its parent given away, or opened to all.
    let parent = dir.join("root");
    std::fs::create_dir(&parent).unwrap();
    let ws = Ws { state: parent.join("ws"), public: dir.join("key/public.key") };
    assert!(init_at(&ws.state).status.success());
    assert_eq!(exec(&ws, "k1", "30", "true").0, 0);
    // What every receipt binds is the digest of the configuration as written (its canonical
    // JSON).
    let digest = format!("sha256:{}", chio_tests::hex(&std::fs::read(ws.state.join("workspace.json")).unwrap()));
    assert_eq!(status(&ws)["config_digest"], Value::from(digest));
    // A state path that is a file is bad input, not a directory made over it.
    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = init_at(&file);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Not a directory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = || chio(&["repository", "status", "--state", s(&ws.state)]);
    chown(&parent, 65534);
    refused(&st(), &format!("{} is owned by uid 65534", parent.display()));
    assert_eq!(exec(&ws, "k2", "30", "true").0, 3);
    chown(&parent, 0);
    chmod(&parent, 0o777);
    refused(&st(), "with mode 777");
    chmod(&parent, 0o1777);
    assert!(st().status.success(), "a sticky directory above the state is enough");
    chmod(&parent, 0o755);
    // The state directory itself: writable by root alone, sticky or not.
    chmod(&ws.state, 0o1770);
    refused(&st(), "with mode 1770");
    chmod(&ws.state, 0o700);
    assert!(st().status.success());
}

#[test]
fn no_process_of_a_command_outlives_it() {
    if !privileged("background") {
        return;
    }
    let dir = Scratch::new("repo-bg");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    let marker = format!("sleep 1.{}", std::process::id());
    let command = format!(
        "({marker}; echo late > package/late.txt) & disown; setsid nohup sh -c '{marker}; touch package/nohup.txt' >/dev/null 2>&1 & echo started"
    );
    let (code, r) = exec(&ws, "bg", "30", &command);
    assert_eq!(code, 0, "{r}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let live: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker[6..]))
        .collect();
    assert!(live.is_empty(), "processes outlived the command: {live:?}");
    assert!(
        !ws.state.join("workspace/package/late.txt").exists() && !ws.state.join("workspace/package/nohup.txt").exists()
    );
}

#[test]
fn deadline_and_output_ceilings() {
    if !privileged("deadline_output") {
        return;
    }
    let dir = Scratch::new("repo-limits");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    let started = std::time::Instant::now();
    let (code, r) = exec(&ws, "slow", "1", "echo before; sleep 30");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(r["deadline_hit"], true, "{r}");
    assert_eq!(code, 137, "{r}");
    assert_eq!(r["output"], "before\n");
    let (code, mut r) = exec(&ws, "loud", "30", "head -c 600000 /dev/zero | tr '\\0' a; echo tail >&2");
    assert_eq!(r["output"].as_str().unwrap().len(), 512 << 10);
    r["output"] = Value::Null;
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["output_bytes"], 600005, "{r}");
    assert_eq!(r["output_dropped"], 600005 - (512 << 10));
    for (k, v) in [("deadline_s", "0"), ("deadline_s", "301")] {
        let out = chio(&[
            "repository",
            "execute",
            "--state",
            s(&ws.state),
            "--operation-key",
            k,
            "--deadline",
            v,
            "--",
            "true",
        ]);
        assert_eq!(out.status.code(), Some(2), "deadline {v}");
    }
}

#[test]
fn a_hostile_source_repository_runs_nothing_and_is_not_written() {
    if !privileged("hostile_source") {
        return;
    }
    let dir = Scratch::new("repo-hostile");
    let repo = calculator(&dir.0);
    git(&repo, &["checkout", "-q", "--", "package/calc.py"]);
    let marker = dir.join("ran");
    let touch = format!("touch {}", s(&marker));
    std::fs::write(repo.join(".gitattributes"), "* filter=evil diff=evil\n").unwrap();
    git(&repo, &["add", ".gitattributes"]);
    git(&repo, &["commit", "-qm", "attributes"]);
    for (k, v) in [
        ("filter.evil.smudge", touch.as_str()),
        ("filter.evil.clean", touch.as_str()),
        ("filter.evil.process", touch.as_str()),
        ("diff.evil.textconv", touch.as_str()),
        ("core.fsmonitor", touch.as_str()),
        ("core.hooksPath", s(&dir.0)),
        ("core.sshCommand", touch.as_str()),
        ("remote.origin.promisor", "true"),
        ("extensions.partialClone", "origin"),
    ] {
        git(&repo, &["config", k, v]);
    }
    for hook in ["post-checkout", "pre-commit", "reference-transaction", "post-index-change"] {
        let h = dir.join(hook);
        chio_tests::write_executable(&h, &format!("#!/bin/sh\n{touch}\n"));
    }
    let snapshot = |d: &Path| -> Vec<(String, u64, std::time::SystemTime)> {
        let mut v = Vec::new();
        let mut stack = vec![d.join(".git")];
        while let Some(p) = stack.pop() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                let m = e.metadata().unwrap();
                if m.is_dir() {
                    stack.push(e.path());
                }
                v.push((e.path().display().to_string(), m.len(), m.modified().unwrap()));
            }
        }
        v.sort();
        v
    };
    let before = snapshot(&repo);
    let ws = init(&dir, &repo, &["package"]);
    assert!(!marker.exists(), "the source's configuration ran a command");
    assert_eq!(snapshot(&repo), before, "the source repository was written");
    assert_eq!(exec(&ws, "x", "30", "echo fixed >> package/calc.py").0, 0);
    let bundle = dir.join("bundle");
    assert!(chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&bundle)]).status.success());
    // The recipient's checkout is the hostile one too: verifying runs nothing of it either.
    let (code, report, err) = verify(&bundle, &repo, "HEAD", &["package"], &ws.public);
    assert_eq!(code, 0, "{report} {err}");
    assert!(!marker.exists(), "verification ran a command of the checkout");
    // The control: the same repository does run the filter for an ordinary checkout.
    let control = dir.join("control");
    let out = Command::new("git")
        .args(["-c", "protocol.file.allow=always", "clone", "-q", "--no-checkout", s(&repo), s(&control)])
        .output()
        .unwrap();
    assert!(out.status.success());
    git(&control, &["config", "filter.evil.smudge", &touch]);
    git(&control, &["checkout", "-q", "HEAD", "--", "."]);
    assert!(marker.exists(), "control: the filter did not run in an ordinary checkout");
}

#[test]
fn init_refuses_bad_scopes_and_submodules() {
    if !privileged("init_refusals") {
        return;
    }
    let dir = Scratch::new("repo-init");
    let repo = calculator(&dir.0);
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    let seed = keydir.join("signing.seed");
    let try_init = |paths: &[&str], rev: &str| -> (i32, String) {
        let state = dir.join("state");
        let mut args = vec!["repository", "init", "--state", s(&state), "--repository", s(&repo), "--revision", rev];
        for p in paths {
            args.extend(["--source-path", p]);
        }
        args.extend(["--kernel-key", s(&seed)]);
        let out = chio(&args);
        assert!(!state.exists(), "a refused init left {}", state.display());
        (out.status.code().unwrap(), String::from_utf8_lossy(&out.stderr).into())
    };
    for (paths, words) in [
        (&["package", "package/calc.py"][..], "overlap"),
        (&["../x"][..], "'..'"),
        (&["/etc"][..], "absolute"),
        (&[".git"][..], ".git"),
        (&["missing"][..], "not in commit"),
        (&["pack*"][..], "not in commit"),
    ] {
        let (code, err) = try_init(paths, "HEAD");
        assert_eq!(code, 3, "{paths:?}: {err}");
        assert!(err.contains(words), "{paths:?}: {err}");
    }
    let (code, err) = try_init(&["package"], "no-such-branch");
    assert_eq!(code, 3, "{err}");
    // A submodule entry in the tree.
    let head = git(&repo, &["rev-parse", "HEAD"]);
    git(&repo, &["update-index", "--add", "--cacheinfo", &format!("160000,{head},package/sub")]);
    git(&repo, &["commit", "-qm", "submodule"]);
    let (code, err) = try_init(&["package"], "HEAD");
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("submodule"), "{err}");
}

#[test]
fn mcp_server_runs_the_execute_tool_and_survives_bad_input() {
    if !privileged("mcp") {
        return;
    }
    use std::io::Write;
    let dir = Scratch::new("repo-mcp");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    let mut child = Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(["repository", "serve", "--state", s(&ws.state)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    // A line of 192 MiB is answered with an error and skipped, never held: the server's peak
    // memory stays far below it, and the next request is answered.
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..192 {
        stdin.write_all(&chunk).unwrap();
    }
    stdin.write_all(b"\n{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"ping\"}\n").unwrap();
    let mut answer = || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()
    };
    assert_eq!(answer()["error"]["code"], -32600);
    assert_eq!(answer()["result"], serde_json::json!({}));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    assert!(peak_kib < 64 << 10, "the server's peak memory: {peak_kib} KiB");
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        "this is not json",
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute","arguments":{"command":"echo hi > package/hi.txt; cat package/hi.txt","operation_key":"m1","timeout":30}}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"execute","arguments":{"command":"echo hi > package/hi.txt; cat package/hi.txt","operation_key":"m1","timeout":30}}}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"execute","arguments":{"command":"echo x > outside.txt"}}}"#,
    ];
    for r in requests {
        writeln!(stdin, "{r}").unwrap();
    }
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    let replies: Vec<Value> = rest.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(replies.len(), 6, "{replies:?}");
    assert_eq!(replies[0]["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(replies[1]["result"]["tools"][0]["name"], "execute");
    assert_eq!(replies[2]["error"]["code"], -32700);
    let first = &replies[3]["result"];
    assert_eq!(first["content"][0]["text"], "hi\n");
    assert_eq!(first["isError"], false);
    assert_eq!(first["structuredContent"]["exit_status"], 0);
    assert_eq!(first["structuredContent"]["receipt_id"].as_str().unwrap().len(), 64);
    // The same key: the retained result, not a second run.
    assert_eq!(replies[4]["result"]["structuredContent"]["replayed"], true);
    assert_eq!(replies[4]["result"]["structuredContent"]["receipt_id"], first["structuredContent"]["receipt_id"]);
    // A change outside the scope: refused, reported to the model as an error.
    assert_eq!(replies[5]["result"]["isError"], true);
    assert_eq!(replies[5]["result"]["structuredContent"]["transition"], "refused");
}

#[test]
fn export_refuses_missing_or_altered_evidence() {
    if !privileged("export_refusals") {
        return;
    }
    let dir = Scratch::new("repo-export");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    assert_eq!(exec(&ws, "a", "30", "echo one > package/one.txt").0, 0);
    let export = |name: &str| -> (Option<i32>, String) {
        let out = chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&dir.join(name))]);
        assert!(out.status.success() || !dir.join(name).exists(), "a refused export left {name}");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into())
    };
    assert_eq!(export("ok").0, Some(0));
    // A head the receipts do not attest.
    let head = std::fs::read_to_string(ws.state.join("head")).unwrap();
    std::fs::write(ws.state.join("head"), "sha256:".to_string() + &"0".repeat(64)).unwrap();
    let (code, err) = export("bad-head");
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("recover"), "{err}");
    std::fs::write(ws.state.join("head"), head).unwrap();
    // A stored object altered (the calculator's content).
    let objects = ws.state.join("objects");
    let victim = std::fs::read_dir(&objects)
        .unwrap()
        .flatten()
        .flat_map(|fan| std::fs::read_dir(fan.path()).unwrap().flatten())
        .map(|e| e.path())
        .find(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains("return a - b")))
        .unwrap();
    std::fs::set_permissions(&victim, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::write(&victim, "def add(a, b):\n    return 42\n").unwrap();
    let (code, err) = export("bad-object");
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("corrupt"), "{err}");
    // A stored object missing.
    std::fs::remove_file(&victim).unwrap();
    let (code, err) = export("missing-object");
    assert_ne!(code, Some(0), "{err}");
}

/// The sandbox's own git history: `git diff` inside shows the session's changes; it is never
/// part of a snapshot, the scope check, a bundle or the patch, and survives a put-back.
#[test]
fn the_sandbox_has_its_own_git_history() {
    if !privileged("sandbox_git") {
        return;
    }
    let dir = Scratch::new("repo-git");
    let repo = calculator(&dir.0);
    let ws = init(&dir, &repo, &["package"]);
    let (code, r) =
        exec(&ws, "diff", "30", "sed -i 's/a - b/a + b/' package/calc.py && git diff --stat && git log --format=%s");
    assert_eq!(code, 0, "{r}");
    let out = r["output"].as_str().unwrap();
    assert!(out.contains("package/calc.py | 2 +-") && out.contains("baseline: "), "{out}");
    let (code, r) = exec(
        &ws,
        "commit",
        "30",
        "git add -A && git -c user.name=a -c user.email=a@example.com commit -qm fix && git rev-list --count HEAD",
    );
    assert_eq!((code, r["output"].as_str()), (0, Some("2\n")), "{r}");
    // Committing inside changed only .git: the snapshot did not move.
    assert_eq!(r["before"], r["after"]);
    let (code, _) = exec(&ws, "out", "30", "echo x > README");
    assert_eq!(code, 3);
    assert!(ws.state.join("workspace/.git/COMMIT_EDITMSG").exists(), "the put-back lost the sandbox's history");
    let bundle = dir.join("bundle");
    assert!(chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&bundle)]).status.success());
    let patch = std::fs::read_to_string(bundle.join("changes.patch")).unwrap();
    assert!(patch.contains("a/package/calc.py") && !patch.contains(".git/"), "{patch}");
    let listing = Command::new("tar").arg("tf").arg(bundle.join("final.tar")).output().unwrap();
    assert!(!String::from_utf8_lossy(&listing.stdout).contains(".git"));
}

/// The leg on an imported image (no host directories in the cage): bash, sed and cat from an OCI
/// layout built here and imported with `chio image import`.
#[test]
fn the_leg_runs_on_an_imported_image() {
    if !privileged("imported_image") {
        return;
    }
    let dir = Scratch::new("repo-image");
    let repo = calculator(&dir.0);
    let rootfs = dir.join("rootfs");
    chio_tests::programs_rootfs(&rootfs, &["/bin/bash", "/bin/sed", "/bin/cat"]);
    let layout = dir.join("layout");
    chio_tests::oci_layout_with(&rootfs, &layout, serde_json::json!({"Env": ["PATH=/bin"]}), "toolchain:1");
    let store = dir.join("images");
    let out = chio(&["image", "import", s(&layout), "--state-dir", s(&store)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    let state = dir.join("ws");
    let seed = keydir.join("signing.seed");
    let out = chio(&[
        "repository",
        "init",
        "--state",
        s(&state),
        "--repository",
        s(&repo),
        "--revision",
        "HEAD",
        "--source-path",
        "package",
        "--image",
        "toolchain:1",
        "--image-store",
        s(&store),
        "--kernel-key",
        s(&seed),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ws = Ws { state, public: keydir.join("public.key") };
    let (code, r) = exec(&ws, "fix", "30", "sed -i 's/a - b/a + b/' package/calc.py && cat package/calc.py");
    assert_eq!(code, 0, "{r}");
    assert!(r["output"].as_str().unwrap().contains("a + b"), "{r}");
    // The image's root, not the host's: python3 is not in it.
    let (code, r) = exec(&ws, "py", "30", "python3 -c 1");
    assert_eq!(code, 127, "{r}");
    let st = status(&ws);
    assert_eq!(st["snapshots"], 2, "{st}");
}

/// A linked worktree is read through its repository; a planted `.git` file pointing at another
/// repository on the host is refused.
#[test]
fn worktrees_are_followed_planted_git_files_are_not() {
    if !privileged("worktrees") {
        return;
    }
    let dir = Scratch::new("repo-wt");
    let repo = calculator(&dir.0);
    let wt = dir.join("wt");
    git(&repo, &["worktree", "add", "-q", s(&wt)]);
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    let seed = keydir.join("signing.seed");
    let init_from = |checkout: &Path, state: &str| {
        chio(&[
            "repository",
            "init",
            "--state",
            s(&dir.join(state)),
            "--repository",
            s(checkout),
            "--revision",
            "HEAD",
            "--source-path",
            "package",
            "--kernel-key",
            s(&seed),
        ])
    };
    let out = init_from(&wt, "ws-wt");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A checkout of the attacker's whose .git file names the victim's git directory.
    let planted = dir.join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join(".git"), format!("gitdir: {}\n", s(&repo.join(".git")))).unwrap();
    let out = init_from(&planted, "ws-planted");
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("worktree"));
}

/// Scratch paths (build output) stay in the live workspace across commands but are never looked
/// into, snapshotted or exported; shapes a snapshot refuses are fine there and refused beside it.
#[test]
fn scratch_paths_are_kept_but_never_evidence() {
    if !privileged("scratch_paths") {
        return;
    }
    let dir = Scratch::new("repo-scratch");
    let repo = calculator(&dir.0);
    for (bad, why) in [
        ("README/x", "not inside a source path"),
        ("package", "not inside a source path"),
        ("package/calc.py", "is committed"),
        ("package/a/../b", "scratch path"),
    ] {
        let (_, out) = try_init(&dir, &repo, &["package"], &["--scratch-path", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(why), "{bad}: {err}");
    }
    // Overlap in any order, and a path given twice.
    for pair in [["package/b", "package/b/c"], ["package/b/c", "package/b"], ["package/b", "package/b"]] {
        let (_, out) = try_init(&dir, &repo, &["package"], &["--scratch-path", pair[0], "--scratch-path", pair[1]]);
        assert!(String::from_utf8_lossy(&out.stderr).contains("overlap"), "{pair:?}");
    }
    // At most 16.
    let many: Vec<String> = (0..17).map(|i| format!("package/s{i}")).collect();
    let args = |n: usize| many[..n].iter().flat_map(|p| ["--scratch-path", p.as_str()]).collect::<Vec<_>>();
    let (_, out) = try_init(&dir, &repo, &["package"], &args(17));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("give at most 16"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, out) = try_init(&dir, &repo, &["package"], &args(16));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let scratch = ["--scratch-path", "package/build", "--scratch-path", "package/__pycache__"];
    let (ws, out) = try_init(&dir, &repo, &["package"], &scratch);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(status(&ws)["scratch_paths"], serde_json::json!(["package/build", "package/__pycache__"]));
    let base = status(&ws)["head"].clone();
    // Bytecode, a FIFO, a link out of the tree and a hard link, all in scratch paths.
    let fill =
        "cd package && (python3 -m unittest 2>/dev/null; mkdir build && echo out > build/o && mkfifo build/fifo \
                && ln -s /etc/passwd build/up && ln build/o build/o2) && ls __pycache__ | grep -c pyc";
    let (code, r) = exec(&ws, "fill", "60", fill);
    assert_eq!((code, r["transition"].as_str()), (0, Some("committed")), "{r}");
    assert_eq!(r["after"], base, "a scratch path entered the snapshot: {r}");
    let (code, r) = exec(&ws, "kept", "60", "cat package/build/o");
    assert_eq!((code, r["output"].as_str()), (0, Some("out\n")), "{r}");
    let (code, r) =
        exec(&ws, "fix", "60", "sed -i 's/a - b/a + b  # fixed/' package/calc.py && cd package && python3 -m unittest");
    assert_eq!(code, 0, "{r}");
    let bundle = dir.join("bundle");
    assert!(chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&bundle)]).status.success());
    let patch = std::fs::read_to_string(bundle.join("changes.patch")).unwrap();
    assert!(patch.contains("package/calc.py") && !patch.contains("pycache") && !patch.contains("build/"), "{patch}");
    // Control: the same FIFO beside the scratch path is refused and put back.
    let (code, r) = exec(&ws, "fifo", "60", "mkfifo package/fifo");
    assert_eq!((code, r["transition"].as_str()), (3, Some("refused")), "{r}");
    assert!(r["reason"].as_str().unwrap().contains("FIFO"), "{r}");
}

/// A source that would hold git, or chio, forever: a FIFO planted as a ref and another as the
/// commit's root tree (a loose object), where a read waits for a writer that never comes. chio
/// reads refs itself without waiting on one (the ref is simply not there), and git, which
/// would wait, is stopped at its deadline (cut to 1.5 s here by a test hook): init ends well
/// within 30 s, refused with the reason, and leaves no state. The control: git on its own
/// waits on both.
#[test]
fn a_source_that_would_hold_git_ends_at_its_deadline() {
    if !privileged("git_deadline") {
        return;
    }
    let dir = Scratch::new("repo-fifo");
    let repo = calculator(&dir.0);
    let tree = git(&repo, &["rev-parse", "HEAD^{tree}"]);
    let object = repo.join(".git/objects").join(&tree[..2]).join(&tree[2..]);
    std::fs::remove_file(&object).unwrap();
    for fifo in [object, repo.join(".git/refs/heads/held")] {
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }
    let keydir = dir.join("key");
    assert!(chio(&["keys", "generate", "--out", s(&keydir)]).status.success());
    let seed = keydir.join("signing.seed");
    for (rev, said) in
        [("held", "refs/heads/held is not a regular file"), ("HEAD", "git did not finish within 1.5 s and was stopped")]
    {
        let state = dir.join(&format!("ws-{rev}"));
        let args = ["repository", "init", "--state", s(&state), "--repository", s(&repo), "--revision", rev];
        let mut child = Command::new(chio_bin(&PathBuf::from(PROBE)))
            .args(args)
            .args(["--source-path", "package", "--kernel-key", s(&seed)])
            .env("CHIO_TEST_GIT_DEADLINE_MS", "1500")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let held = child.try_wait().unwrap().is_none();
        if held {
            child.kill().unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!held, "init of {rev} was still running after 30 s");
        assert_eq!(out.status.code(), Some(3), "{rev}: {err}");
        assert!(err.contains(said), "{rev}: {err}");
        assert!(std::fs::read_dir(&state).map_or(true, |mut d| d.next().is_none()), "{rev}: init left state");
    }
    // chio killed while git waits: git goes with it (the deadline that would have ended it
    // was chio's).
    let state = dir.join("ws-killed");
    let mut child = Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(["repository", "init", "--state", s(&state), "--repository", s(&repo), "--revision", "HEAD"])
        .args(["--source-path", "package", "--kernel-key", s(&seed)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // chio's gits for this state: `(blocked on a FIFO, any)`. Blocked means asleep opening a
    // FIFO, as the git that reads the planted tree is. The gits before it (the scratch
    // reader's `git init`, the commit's `rev-parse`) come and go: matching any git let a
    // passing one stand for the git that waits, and the check after it then found none.
    let gits = || {
        let mine = s(&state).to_string();
        let (mut blocked, mut any) = (false, false);
        for p in std::fs::read_dir("/proc").unwrap().flatten() {
            let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            if cmd.starts_with("git\0") && cmd.contains(&mine) {
                any = true;
                let read = |f: &str| std::fs::read_to_string(p.path().join(f)).unwrap_or_default();
                blocked |= read("stack").contains("fifo_open") || read("wchan") == "wait_for_partner";
            }
        }
        (blocked, any)
    };
    let waiting = || gits().0;
    // 60 s: a bound for a loaded machine; init reaches the git that waits within a second.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut started = waiting();
    while !started && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
        started = waiting();
    }
    let ended_first = child.try_wait().unwrap();
    // What chio and its children were doing, should none of them be the git waited for.
    let doing = if started { String::new() } else { process_tree(child.id()) };
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while gits().1 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left = gits().1;
    let _ = std::fs::remove_dir_all(&state);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(started, "no git waited on the source (chio ended first: {ended_first:?}): {err}\n{doing}");
    assert!(!left, "git outlived the chio that ran it");
    // Control: git itself waits on either FIFO.
    for args in [&["rev-parse", "held"][..], &["ls-tree", "HEAD"][..]] {
        let waited = Command::new("timeout").arg("2").arg("git").arg("-C").arg(&repo).args(args).output().unwrap();
        assert_eq!(waited.status.code(), Some(124), "git {args:?} did not wait");
    }
}

/// Process `pid` and its descendants, a line each: pid, state, where it sleeps (wchan), argv.
fn process_tree(pid: u32) -> String {
    let read = |p: u32, f: &str| std::fs::read_to_string(format!("/proc/{p}/{f}")).unwrap_or_default();
    let (mut lines, mut stack) = (Vec::new(), vec![pid]);
    while let Some(p) = stack.pop() {
        let stat = read(p, "stat");
        let state = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("?").to_string();
        let argv = read(p, "cmdline").replace('\0', " ");
        lines.push(format!("{p} {state} {} {}", read(p, "wchan"), argv.trim_end()));
        stack.extend(read(p, &format!("task/{p}/children")).split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    lines.join("\n")
}

/// `chio repository serve --read-prefix P`: a client of the leg's MCP server.
struct Mcp {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Mcp {
    fn start(ws: &Ws, prefixes: &[&str]) -> Mcp {
        let mut args = vec!["repository", "serve", "--state", s(&ws.state)];
        for p in prefixes {
            args.extend(["--read-prefix", p]);
        }
        let mut child = Command::new(chio_bin(&PathBuf::from(PROBE)))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        Mcp { child, stdin, stdout, next: 0 }
    }

    fn ask(&mut self, method: &str, params: Value) -> Value {
        use std::io::{BufRead, Write};
        self.next += 1;
        let req = serde_json::json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        writeln!(self.stdin, "{req}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// `tool` on `path`: the call's result.
    fn tool(&mut self, tool: &str, path: &str) -> Value {
        self.ask("tools/call", serde_json::json!({"name": tool, "arguments": {"path": path}}))["result"].clone()
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The file tools read the workspace beneath its directory only, as the operator granted: links a
/// caged command planted are refused (where following them would have read the host's
/// files), so are `..`, paths outside the grant, a FIFO (without waiting on it), a file past the
/// 64 KiB bound or grown past it while read, and a directory swapped for a link to a host
/// directory while the walk runs. Each answer and each refusal is signed; the export still
/// verifies with them in its chain.
#[test]
fn file_tools_read_beneath_the_workspace_and_nothing_else() {
    if !privileged("file_tools") {
        return;
    }
    let dir = Scratch::new("repo-files");
    let repo = calculator(&dir.0);
    git(&repo, &["checkout", "-q", "--", "package/calc.py"]);
    let ws = init(&dir, &repo, &["package"]);
    // A caged command leaves a link inside the workspace and files at and past the bound. (A link
    // leading out never enters a snapshot, absolute or climbing: the transition is refused and put
    // back. The file tools do not rely on that: the same links planted from the host below.)
    let plant = "ln -s calc.py package/alias && mkdir package/d && echo inside > package/d/secret.txt \
                 && head -c 65536 /dev/zero > package/exact && head -c 65537 /dev/zero > package/big";
    let (code, r) = exec(&ws, "plant", "30", plant);
    assert_eq!((code, &r["transition"]), (0, &serde_json::json!("committed")), "{r}");
    let live = ws.state.join("workspace");
    std::os::unix::fs::symlink("/etc/passwd", live.join("package/pw")).unwrap();
    std::os::unix::fs::symlink(format!("{}etc", "../".repeat(40)), live.join("package/root")).unwrap();
    // Control: a reader that follows links reads the host's files through them.
    assert!(std::fs::read_to_string(live.join("package/pw")).unwrap().contains("root:"));
    assert!(std::fs::read_to_string(live.join("package/root/passwd")).unwrap().contains("root:"));

    let mut mcp = Mcp::start(&ws, &["package"]);
    let tools = mcp.ask("tools/list", serde_json::json!({}));
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["execute", "read_file", "list_dir"]);
    let ok = mcp.tool("read_file", "package/calc.py");
    assert_eq!(
        (&ok["isError"], ok["content"][0]["text"].as_str()),
        (&serde_json::json!(false), Some("def add(a, b):\n    return a - b\n"))
    );
    assert_eq!(ok["structuredContent"]["receipt_id"].as_str().unwrap().len(), 64);
    assert_eq!(mcp.tool("read_file", "package/exact")["structuredContent"]["text"].as_str().unwrap().len(), 65536);
    let listed = mcp.tool("list_dir", "package");
    let text = listed["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("pw (symbolic link, not followed)")
            && text.contains("d/")
            && text.contains("exact (65536 bytes)"),
        "{text}"
    );
    let refused = |mcp: &mut Mcp, tool: &str, path: &str, rule: &str| {
        let r = mcp.tool(tool, path);
        assert_eq!(
            (&r["isError"], &r["structuredContent"]["rule"]),
            (&serde_json::json!(true), &serde_json::json!(rule)),
            "{path}: {r}"
        );
        assert_eq!(r["structuredContent"]["receipt_id"].as_str().map(str::len), Some(64), "{path}: unsigned: {r}");
        assert!(!r.to_string().contains("root:x:0"), "{path}: the host's file: {r}");
    };
    refused(&mut mcp, "read_file", "package/pw", "link");
    refused(&mut mcp, "read_file", "package/alias", "link");
    refused(&mut mcp, "read_file", "package/root/passwd", "link");
    refused(&mut mcp, "list_dir", "package/root", "link");
    refused(&mut mcp, "read_file", "package/../../settings.json", "path");
    refused(&mut mcp, "read_file", "/etc/passwd", "path");
    refused(&mut mcp, "read_file", ".git/config", "read_prefix");
    refused(&mut mcp, "read_file", "package/big", "size");
    refused(&mut mcp, "read_file", "package/d", "not_regular");
    refused(&mut mcp, "read_file", "package/none", "not_found");
    // A FIFO (a snapshot would never keep one; planted here from the host): refused at once,
    // never waited on.
    nix::unistd::mkfifo(&live.join("package/fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    refused(&mut mcp, "read_file", "package/fifo", "not_regular");
    std::fs::remove_file(live.join("package/fifo")).unwrap();

    // Races from the host side: a file appended to while it is read, and `package/d` swapped
    // with a link to a host directory holding a file of the same name.
    let host = dir.join("host-secret");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("secret.txt"), "HOST SECRET").unwrap();
    std::fs::write(live.join("package/growing"), "").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (stop, live, host) = (stop.clone(), live.clone(), host.clone());
        std::thread::spawn(move || {
            use std::io::Write;
            let mut grow = std::fs::OpenOptions::new().append(true).open(live.join("package/growing")).unwrap();
            let (d, aside) = (live.join("package/d"), live.join("package/d-aside"));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if grow.metadata().unwrap().len() < 1 << 20 {
                    grow.write_all(&[b'g'; 4096]).unwrap();
                }
                std::fs::rename(&d, &aside).unwrap();
                std::os::unix::fs::symlink(&host, &d).unwrap();
                std::fs::remove_file(&d).unwrap();
                std::fs::rename(&aside, &d).unwrap();
            }
        })
    };
    let (mut inside, mut grown) = (0, 0);
    for _ in 0..200 {
        let r = mcp.tool("read_file", "package/d/secret.txt");
        assert!(!r.to_string().contains("HOST SECRET"), "the walk followed the swapped link: {r}");
        inside += usize::from(r["isError"] == false);
        let r = mcp.tool("read_file", "package/growing");
        let len = r["structuredContent"]["text"].as_str().map_or(0, str::len);
        assert!(len <= 65536, "more than the bound was read: {len}");
        grown += usize::from(r["structuredContent"]["rule"] == "size");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    racer.join().unwrap();
    assert!(
        inside > 0 && grown > 0,
        "the races never showed both sides: {inside} reads inside, {grown} refused past the bound"
    );
    drop(mcp);
    for planted in ["growing", "pw", "root"] {
        std::fs::remove_file(live.join("package").join(planted)).unwrap();
    }

    // Signed: every answer a tool_call of the read schema, every refusal a denial naming its rule;
    // the bundle still verifies with them in its chain.
    let list = |kind: &str| {
        let out = chio(&["receipt", "list", "--receipt-db", s(&ws.state.join("receipts.db")), "--kind", kind]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    let reads = list("tool_call")
        .into_iter()
        .filter(|r| r["receipt"]["body"]["detail"]["schema"] == "chio.repository.read.v1")
        .count();
    let denials = list("denial");
    assert!(reads >= 4 && denials.len() >= 10, "{reads} reads, {} denials", denials.len());
    assert!(denials.iter().any(|d| d["receipt"]["body"]["detail"]["rule"] == "link"));
    let bundle = dir.join("bundle");
    assert!(chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&bundle)]).status.success());
    let recipient = dir.join("recipient");
    git(&dir.0, &["clone", "-q", s(&repo), s(&recipient)]);
    let (code, report, err) = verify(&bundle, &recipient, "HEAD", &["package"], &ws.public);
    assert_eq!(code, 0, "{report} {err}");
}

/// The whole repository as the scope (`--source-path .`): every committed file enters (never a
/// dirty change or an untracked file), a change anywhere but `.git` is a transition, the
/// scratch-path rules hold (a committed path is never scratch), and the bundle verifies with the
/// same scope.
#[test]
fn the_whole_repository_can_be_the_scope() {
    if !privileged("whole_tree") {
        return;
    }
    let dir = Scratch::new("repo-whole");
    let repo = calculator(&dir.0);
    let (_, out) = try_init(&dir, &repo, &["."], &["--scratch-path", "README"]);
    assert_eq!(out.status.code(), Some(2), "a committed file as scratch: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("committed"));
    let (_, out) = try_init(&dir, &repo, &[".", "package"], &[]);
    assert_ne!(out.status.code(), Some(0), "`.` beside another path");
    let (ws, out) = try_init(&dir, &repo, &["."], &["--scratch-path", "package/__pycache__"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let live = ws.state.join("workspace");
    assert_eq!(std::fs::read_to_string(live.join("README")).unwrap(), "calculator\n");
    assert_eq!(std::fs::read_to_string(live.join("package/calc.py")).unwrap(), "def add(a, b):\n    return a - b\n");
    assert!(!live.join("package/untracked.py").exists(), "an untracked file entered");
    let (code, r) = exec(&ws, "docs", "30", "echo more >> README && cd package && python3 -m unittest; true");
    assert_eq!((code, &r["transition"]), (0, &serde_json::json!("committed")), "{r}");
    let bundle = dir.join("bundle");
    assert!(chio(&["repository", "export", "--state", s(&ws.state), "--out", s(&bundle)]).status.success());
    let patch = std::fs::read_to_string(bundle.join("changes.patch")).unwrap();
    assert!(patch.contains("+more") && !patch.contains("__pycache__"), "{patch}");
    let recipient = dir.join("recipient");
    git(&dir.0, &["clone", "-q", s(&repo), s(&recipient)]);
    let (code, report, err) = verify(&bundle, &recipient, "HEAD", &["."], &ws.public);
    assert_eq!(code, 0, "{report} {err}");
    let (code, _, _) = verify(&bundle, &recipient, "HEAD", &["package"], &ws.public);
    assert_eq!(code, 5, "another scope");
}
