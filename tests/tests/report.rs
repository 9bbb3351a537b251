//! `chio receipt report`: the page a person reads, opened in a real headless browser (Debian's
//! Chromium through Selenium). Its figures must be the store's (compared with `chio receipt
//! list`), a store that does not verify must say so at the very top, a repository session's
//! commands show their file changes, and the page loads nothing — not even when the commands it
//! shows were written by hostile code to make it load something.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use chio_tests::{browse, calculator_repo, chio_bin, privileged, signed_launch, Scratch};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn chio(args: &[&str]) -> Output {
    let mut c = Command::new(chio_bin(&PathBuf::from(PROBE)));
    c.args(args).stdin(Stdio::null());
    chio_tests::run_within(&mut c, std::time::Duration::from_secs(120), &format!("chio {}", args.join(" ")))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A loopback HTTP listener that counts the connections made to it (a page that fetched
/// anything from it would show here, whatever the browser's own log says).
struct Listener {
    url: String,
    hits: Arc<AtomicUsize>,
}

impl Listener {
    fn start() -> Listener {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                let _ = c.read(&mut [0u8; 4096]);
                let _ = c.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            }
        });
        Listener { url, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// The store as `chio receipt list` gives it: every line.
fn listed(db: &Path) -> Vec<Value> {
    let out = chio(&["receipt", "list", "--receipt-db", s(db), "--limit", "10000"]);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `chio receipt report` with `args`, to `out`.
fn report(out: &Path, args: &[&str]) -> Output {
    let mut all = vec!["receipt", "report", "--out", s(out)];
    all.extend_from_slice(args);
    chio(&all)
}

/// A fresh kernel key in `dir/name` (its `signing.seed` and `public.key`).
fn new_key(dir: &Scratch, name: &str) -> PathBuf {
    let key = dir.join(name);
    assert!(chio(&["keys", "generate", "--out", s(&key)]).status.success());
    key
}

fn row(page: &Value, seq: u64) -> &Value {
    page["rows"].as_array().unwrap().iter().find(|r| r["seq"] == seq).unwrap_or_else(|| panic!("no row {seq}: {page}"))
}

/// The page's every figure is the store's: for each launch its state, end, time to the observed
/// exec, wall and CPU time, peak memory and limits hit, and its facts; the charts' bars; the
/// denial with its violation. A command line written to make the page load something (markup in
/// argv) is shown as text, and the page makes no request at all — while a page without chio's
/// policy and escaping, opened the same way, does reach the listener (the control).
#[test]
fn a_report_shows_the_store_as_its_receipts_say_and_loads_nothing() {
    if !privileged("report_figures") {
        return;
    }
    let argv = ["/probe", "write", "/workspace/out/ran"];
    let p = signed_launch(Path::new(PROBE), &argv, 65534, "enforced");
    let (db, seed, public) =
        (p.dir.join("r.db"), p.dir.join("operator/signing.seed"), p.dir.join("operator/public.key"));
    let ws = Scratch::new("report-ws");
    ws.give_to_nobody();
    std::fs::create_dir(ws.join("out")).unwrap();
    std::os::unix::fs::chown(ws.join("out"), Some(65534), Some(65534)).unwrap();
    let policy_launch = |command: &[&str]| {
        let mut args = vec!["cage", "run", "--policy", s(&p.policy), "--policy-signer", s(&p.operator)];
        args.extend(["--manifest", s(&p.manifest), "--workspace", s(&ws.0), "--receipt-db", s(&db)]);
        args.extend(["--kernel-key", s(&seed), "--"]);
        args.extend_from_slice(command);
        chio(&args)
    };
    assert!(policy_launch(&argv).status.success());
    let refused = policy_launch(&["/probe", "write", "/workspace/elsewhere"]);
    assert_eq!(refused.status.code(), Some(125), "{}", text(&refused));

    let listener = Listener::start();
    let lure = format!("<img src=\"{0}/argv\"><script src=\"{0}/script\"></script>", listener.url);
    let plain = |flags: &[&str], command: &[&str]| {
        let mut args = vec!["cage", "run", "--receipt-db", s(&db), "--kernel-key", s(&seed)];
        args.extend_from_slice(flags);
        args.push("--");
        args.extend_from_slice(command);
        chio(&args)
    };
    assert!(plain(&[], &["/bin/echo", &lure]).status.success());
    assert_eq!(plain(&[], &["/bin/sh", "-c", "exit 3"]).status.code(), Some(3));
    let oom = plain(&["--memory", "32M"], &["/usr/bin/python3", "-c", "x = bytearray(200 << 20)"]);
    assert_eq!(oom.status.code(), Some(137), "{}", text(&oom));
    // A launch that fails before its exec: an enforcement receipt naming the failure, no end.
    assert_eq!(plain(&[], &["/nonexistent/tool"]).status.code(), Some(127));

    let dir = Scratch::new("report-page");
    let page_at = dir.join("report.html");
    let made = report(&page_at, &["--receipt-db", s(&db), "--trusted-key", s(&public)]);
    assert_eq!(made.status.code(), Some(0), "{}", text(&made));
    let page = browse(&page_at, Some(&dir.join("report.png")));

    // It renders, verification first, and loads nothing.
    let v = &page["verification"];
    assert_eq!(v["cls"], "ok", "{v}");
    assert!(v["first"].as_bool().unwrap() && v["top"].as_f64().unwrap() < 40.0 && v["height"].as_f64().unwrap() > 20.0);
    assert!(v["headline"].as_str().unwrap().starts_with("Verified"), "{v}");
    assert!(page["csp"].as_str().unwrap().starts_with("default-src 'none'"), "{page}");
    assert!(page["loaders"].as_object().unwrap().values().all(|n| n == 0), "{}", page["loaders"]);
    assert_eq!(page["resources"], serde_json::json!([]));
    assert_eq!(page["requests"], serde_json::json!([format!("file://{}", page_at.display())]));
    assert_eq!(page["network"], serde_json::json!([]));
    assert_eq!(listener.hits(), 0, "the report reached the listener");

    // The figures are the store's.
    let receipts = listed(&db);
    let of_kind = |k: &str| receipts.iter().filter(|r| r["kind"] == k).collect::<Vec<_>>();
    let (launches, terminals, denials) = (of_kind("launch_enforcement"), of_kind("launch_terminal"), of_kind("denial"));
    assert_eq!((launches.len(), terminals.len(), denials.len()), (5, 4, 1), "{receipts:?}");
    let figures = &page["figures"];
    assert_eq!(figures["receipts"], receipts.len().to_string());
    assert_eq!(figures["launches"], "5");
    assert_eq!(figures["shown"], "5");
    let enforced = launches.iter().filter(|l| l["outcome"] == "FullyEnforced").count();
    assert_eq!(figures["enforced"], enforced.to_string());
    assert_eq!(figures["limit_hits"], "1");
    let failed = launches.len() - enforced;
    assert_eq!(figures["refusals"], (denials.len() + failed).to_string());
    for l in &launches {
        let seq = l["seq"].as_u64().unwrap();
        let r = row(&page, seq);
        let record = &l["receipt"]["body"]["launch_record"];
        assert_eq!(r["cells"]["state"]["text"], l["outcome"], "{r}");
        assert_eq!(
            r["what"],
            record["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect::<Vec<_>>().join(" ")
        );
        assert_eq!(r["cells"]["exec"]["value"], record["timings_us"]["exec_stop"], "{r}");
        assert_eq!(r["ids"][0], l["id"]);
        let terminal = terminals.iter().find(|t| t["receipt"]["body"]["launch"]["receipt_id"] == l["id"]);
        match terminal {
            Some(t) => {
                let d = &t["receipt"]["body"]["detail"];
                assert_eq!(r["cells"]["exit"]["text"], t["outcome"]);
                for (cell, field) in [("wall", "wall_ms"), ("cpu", "cpu_ms"), ("memory", "peak_memory_bytes")] {
                    assert_eq!(r["cells"][cell]["value"], d[field], "{cell} of {seq}: {r}");
                }
                assert_eq!(r["cells"]["wall"]["text"], format!("{} ms", d["wall_ms"]));
                let hit: Vec<&str> = d["limit_hit"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect();
                assert_eq!(r["cells"]["limits"]["text"], if hit.is_empty() { "—".to_string() } else { hit.join(", ") });
                let facts = r["facts"].as_array().unwrap();
                assert!(facts.len() >= 8 && facts.iter().all(|f| f["holds"] == true), "{seq}: {facts:?}");
            }
            None => {
                assert_ne!(l["outcome"], "FullyEnforced");
                assert_eq!(r["cells"]["exit"]["text"], record["failure"]["code"], "{r}");
            }
        }
    }
    let hostile =
        page["rows"].as_array().unwrap().iter().find(|r| r["what"].as_str().unwrap().contains("<img")).unwrap();
    assert_eq!(hostile["what"], format!("/bin/echo {lure}"), "the markup is shown as the text it is");
    let oom_row = page["rows"].as_array().unwrap().iter().find(|r| r["cells"]["limits"]["text"] == "memory").unwrap();
    assert_eq!(oom_row["cells"]["exit"]["text"], "signal:9");
    // Every bar is a launch's figure.
    let exec_bars: Vec<(u64, f64)> = page["bars"]["chart-exec"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b[0].as_u64().unwrap(), b[1].as_f64().unwrap()))
        .collect();
    let expected: Vec<(u64, f64)> = launches
        .iter()
        .filter_map(|l| {
            let us = l["receipt"]["body"]["launch_record"]["timings_us"]["exec_stop"].as_f64()?;
            Some((l["seq"].as_u64().unwrap(), us / 1000.0))
        })
        .collect();
    assert_eq!(exec_bars, expected);
    let memory_bars = page["bars"]["chart-memory"].as_array().unwrap();
    assert_eq!(memory_bars.len(), terminals.len());
    let tallest = memory_bars.iter().max_by(|a, b| a[2].as_f64().unwrap().total_cmp(&b[2].as_f64().unwrap())).unwrap();
    assert_eq!(tallest[0], oom_row["seq"], "the OOM-killed launch's memory bar is the tallest");
    // The denial, with its violation.
    let refusals = page["refusals"].as_array().unwrap();
    let denial = refusals.iter().find(|f| f["seq"] == denials[0]["seq"]).unwrap();
    let violations = denials[0]["receipt"]["body"]["detail"]["violations"].as_array().unwrap();
    assert_eq!(denial["reasons"].as_array().unwrap().len(), violations.len());
    assert!(denial["reasons"][0].as_str().unwrap().contains("is not the admitted argv"), "{denial}");

    // Control: the same markup on a page without chio's policy and escaping is fetched, and the
    // browser's log and the listener both see it.
    let control = dir.join("control.html");
    std::fs::write(&control, format!("<!DOCTYPE html><html><body><p>control</p>{lure}</body></html>")).unwrap();
    let seen = browse(&control, None);
    assert!(listener.hits() >= 1, "the control page reached nothing: the check would miss a fetch");
    for log in ["requests", "network"] {
        let urls = seen[log].as_array().unwrap();
        assert!(urls.iter().any(|u| u.as_str().unwrap().starts_with(&listener.url)), "{log}: {seen}");
    }
}

/// The banner tells the three cases apart, at the top: verified under a key; chain intact but
/// signatures unchecked (no key); and a store that does not verify — an edited receipt, another
/// key, or receipts deleted from its end against a checkpoint (without the checkpoint that
/// deletion verifies: the control). The edited receipt's row is marked where it is shown.
#[test]
fn a_store_that_does_not_verify_says_so_at_the_top_of_its_report() {
    if !privileged("report_tampered") {
        return;
    }
    let dir = Scratch::new("report-tamper");
    let (key, other) = (new_key(&dir, "key"), new_key(&dir, "other"));
    let (db, seed, public) = (dir.join("r.db"), key.join("signing.seed"), key.join("public.key"));
    for _ in 0..3 {
        let run = chio(&["cage", "run", "--receipt-db", s(&db), "--kernel-key", s(&seed), "--", "/bin/true"]);
        assert!(run.status.success(), "{}", text(&run));
    }
    let checkpoint = dir.join("head.json");
    let made =
        chio(&["receipt", "checkpoint", "--receipt-db", s(&db), "--kernel-key", s(&seed), "--out", s(&checkpoint)]);
    assert!(made.status.success());
    let page = |name: &str, args: &[&str], code: i32| -> Value {
        let at = dir.join(name);
        let mut all = vec!["--receipt-db", s(&db)];
        all.extend_from_slice(args);
        let out = report(&at, &all);
        assert_eq!(out.status.code(), Some(code), "{name}: {}", text(&out));
        let seen = browse(&at, None);
        let v = &seen["verification"];
        assert!(v["first"].as_bool().unwrap() && v["top"].as_f64().unwrap() < 40.0, "{name}: {v}");
        seen
    };
    let ok = page("ok.html", &["--trusted-key", s(&public), "--checkpoint", s(&checkpoint)], 0);
    assert_eq!(ok["verification"]["cls"], "ok");
    // --last: the newest launches only; the verification still covers every receipt.
    let newest = page("last.html", &["--trusted-key", s(&public), "--last", "2"], 0);
    assert_eq!((&newest["figures"]["launches"], &newest["figures"]["shown"]), (&"3".into(), &"2".into()));
    assert_eq!(newest["figures"]["receipts"], "6");
    let seqs: Vec<&Value> = newest["rows"].as_array().unwrap().iter().map(|r| &r["seq"]).collect();
    assert_eq!(seqs, [3, 5]);
    let unsigned = page("unsigned.html", &[], 0);
    assert_eq!(unsigned["verification"]["cls"], "unsigned");
    assert!(unsigned["verification"]["headline"].as_str().unwrap().contains("signatures NOT checked"));
    let foreign = page("foreign.html", &["--trusted-key", s(&other.join("public.key"))], 1);
    assert_eq!(foreign["verification"]["cls"], "failed");
    assert_eq!(foreign["verification"]["problems"].as_array().unwrap().len(), 6, "{}", foreign["verification"]);
    assert_ne!(ok["verification"]["background"], foreign["verification"]["background"], "the failure looks different");

    // Receipts deleted from the end: the chain alone still verifies; the checkpoint does not.
    let store = chio_kernel::store::Store::open(&db, false).unwrap();
    store
        .connection()
        .execute_batch(
            "DROP TRIGGER receipts_no_delete; DELETE FROM receipts WHERE seq = (SELECT max(seq) FROM receipts);",
        )
        .unwrap();
    drop(store);
    let shortened = page("short.html", &["--trusted-key", s(&public)], 0);
    assert_eq!(shortened["verification"]["cls"], "ok", "control: without the checkpoint the deletion verifies");
    let caught = page("caught.html", &["--trusted-key", s(&public), "--checkpoint", s(&checkpoint)], 1);
    assert_eq!(caught["verification"]["cls"], "failed");
    let problems = &caught["verification"]["problems"];
    assert!(problems[0].as_str().unwrap().contains("were deleted"), "{problems}");

    // An edited receipt (its exit code), as an attacker with the file would do it.
    let store = chio_kernel::store::Store::open(&db, false).unwrap();
    store
        .connection()
        .execute_batch("DROP TRIGGER receipts_no_update; UPDATE receipts SET envelope = replace(envelope, 'exit:0', 'exit:9'), outcome = 'exit:9' WHERE seq = 2;")
        .unwrap();
    drop(store);
    let edited = page("edited.html", &["--trusted-key", s(&public)], 1);
    let v = &edited["verification"];
    assert_eq!(v["cls"], "failed");
    assert!(v["headline"].as_str().unwrap().starts_with("NOT VERIFIED"), "{v}");
    assert!(v["problems"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().starts_with("receipt 2 ")), "{v}");
    assert_eq!(row(&edited, 1)["bad"], true, "the launch whose terminal receipt was edited is marked");
    assert_eq!(row(&edited, 3)["bad"], false, "only the edited receipt's launch is marked");
    assert_eq!(row(&edited, 1)["cells"]["exit"]["text"], "exit:9", "the page shows what the store holds");
    let unsigned = page("edited-unsigned.html", &[], 1);
    assert_eq!(unsigned["verification"]["cls"], "failed", "the id no longer matches even without a key");
}

/// A repository session: each command's row shows the files it changed (from the snapshots its
/// receipt binds; scratch output is not a change), a refused transition is listed with its
/// reason, a governed session's state works the same, and a snapshot edited on disk is a
/// failure at the top, not a change.
#[test]
fn a_session_report_shows_each_commands_file_changes() {
    if !privileged("report_session") {
        return;
    }
    let dir = Scratch::new("report-session");
    let repo = calculator_repo(&dir.0);
    let key = new_key(&dir, "key");
    let state = dir.join("ws");
    let init = chio(&[
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
        "--scratch-path",
        "package/__pycache__",
        "--kernel-key",
        s(&key.join("signing.seed")),
    ]);
    assert!(init.status.success(), "{}", text(&init));
    let exec = |op: &str, command: &str| -> Value {
        let out = chio(&[
            "repository",
            "execute",
            "--state",
            s(&state),
            "--operation-key",
            op,
            "--deadline",
            "60",
            "--json",
            "--",
            command,
        ]);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{op}: {e}: {}", text(&out)))
    };
    let run = "cd package && python3 -m unittest";
    let fix = "sed -i 's/return a - b/return a + b/' package/calc.py && echo '<b>notes</b>' > package/notes.txt";
    exec("run-1", run);
    exec("fix-1", fix);
    exec("run-2", run);
    exec("rm-1", "rm package/notes.txt");
    let refused = exec("out-1", "echo outside > README");
    assert_eq!(refused["transition"], "refused", "{refused}");

    let db = state.join("receipts.db");
    let public = key.join("public.key");
    let at = dir.join("session.html");
    let made = report(&at, &["--receipt-db", s(&db), "--trusted-key", s(&public), "--session", s(&state)]);
    assert_eq!(made.status.code(), Some(0), "{}", text(&made));
    let page = browse(&at, None);
    assert_eq!(page["verification"]["cls"], "ok");
    let by_command = |page: &Value, command: &str| -> Vec<Value> {
        page["rows"].as_array().unwrap().iter().filter(|r| r["what"] == command).cloned().collect()
    };
    let changes = |r: &Value| -> Vec<(String, String)> {
        r["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["kind"].as_str().unwrap().to_string(), c["path"].as_str().unwrap().to_string()))
            .collect()
    };
    let pair = |k: &str, p: &str| (k.to_string(), p.to_string());
    let runs = by_command(&page, run);
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert_eq!(r["cells"]["changes"]["value"], 0, "bytecode in the scratch path is no change: {r}");
    }
    let fixed = &by_command(&page, fix)[0];
    assert_eq!(changes(fixed), vec![pair("added", "package/notes.txt"), pair("modified", "package/calc.py")]);
    assert_eq!(fixed["cells"]["changes"]["value"], 2);
    let removed = &by_command(&page, "rm package/notes.txt")[0];
    assert_eq!(changes(removed), vec![pair("removed", "package/notes.txt")]);
    assert_eq!(page["figures"]["commands"], "5");
    let refusal =
        page["refusals"].as_array().unwrap().iter().find(|f| f["text"].as_str().unwrap().contains("repository"));
    let refusal = refusal.unwrap_or_else(|| panic!("no refused transition: {}", page["refusals"]));
    assert!(refusal["reasons"][0].as_str().unwrap().contains("outside the source paths"), "{refusal}");
    let outside = &by_command(&page, "echo outside > README")[0];
    assert_eq!(outside["cells"]["exit"]["text"], "exit:0, refused", "{outside}");
    assert_eq!(outside["cells"]["changes"]["value"], 0, "a refused change was put back");

    // A governed session's state holds its workspace at workspace/.
    let session = dir.join("session");
    std::fs::create_dir(&session).unwrap();
    std::fs::write(session.join("session.json"), "{}").unwrap();
    std::fs::rename(&state, session.join("workspace")).unwrap();
    let state = session.join("workspace");
    let db = state.join("receipts.db");
    let governed = dir.join("governed.html");
    let made = report(&governed, &["--receipt-db", s(&db), "--trusted-key", s(&public), "--session", s(&session)]);
    assert_eq!(made.status.code(), Some(0), "{}", text(&made));
    assert_eq!(changes(&by_command(&browse(&governed, None), fix)[0]).len(), 2);
    let neither = report(&dir.join("x.html"), &["--receipt-db", s(&db), "--session", s(&dir.0)]);
    assert_eq!(neither.status.code(), Some(2), "{}", text(&neither));
    assert!(text(&neither).contains("neither a repository workspace's state"), "{}", text(&neither));

    // A snapshot edited on disk: the page fails at the top and shows no changes for it.
    let after = receipts_detail(&db, fix)["after"].as_str().unwrap().trim_start_matches("sha256:").to_string();
    let snapshot = state.join("snapshots").join(format!("{after}.json"));
    let edited = std::fs::read_to_string(&snapshot).unwrap().replace("notes.txt", "other.txt");
    std::fs::write(&snapshot, edited).unwrap();
    let tampered = dir.join("tampered.html");
    let made = report(&tampered, &["--receipt-db", s(&db), "--trusted-key", s(&public), "--session", s(&state)]);
    assert_eq!(made.status.code(), Some(1), "{}", text(&made));
    let page = browse(&tampered, None);
    let v = &page["verification"];
    assert_eq!(v["cls"], "failed");
    assert!(
        v["problems"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().contains("does not match its digest")),
        "{v}"
    );
    assert_eq!(by_command(&page, fix)[0]["cells"]["changes"]["text"], "unreadable");
}

/// The `tool_call` detail of the command `command` in the store.
fn receipts_detail(db: &Path, command: &str) -> Value {
    listed(db).into_iter().map(|r| r["receipt"]["body"]["detail"].clone()).find(|d| d["command"] == command).unwrap()
}

/// Bad input is refused before anything is written: a directory as the page, no key with a
/// checkpoint, `--last 0`, a missing store.
#[test]
fn a_report_refuses_bad_input_and_writes_nothing() {
    let dir = Scratch::new("report-usage");
    let db = dir.join("absent.db");
    for (args, code, says) in [
        (vec!["--out", s(&dir.0), "--receipt-db", s(&db)], 2, "is a directory"),
        (vec!["--out", "p.html", "--receipt-db", s(&db), "--checkpoint", "c.json"], 2, "--trusted-key"),
        (vec!["--out", "p.html", "--receipt-db", s(&db), "--last", "0"], 2, "--last"),
        (vec!["--out", s(&dir.join("p.html")), "--receipt-db", s(&db)], 1, "is not a receipt store"),
    ] {
        let mut all = vec!["receipt", "report"];
        all.extend(args);
        let out = chio(&all);
        assert_eq!(out.status.code(), Some(code), "{all:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{all:?}: {}", text(&out));
    }
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0, "nothing was written");
}

/// A launch receipt whose record this chio cannot read (another version's schema) is shown by
/// its argv, and its row says why no fact is shown — rather than a blank row.
#[test]
fn a_record_this_chio_cannot_read_is_shown_with_why() {
    let dir = Scratch::new("report-foreign-record");
    let key = new_key(&dir, "key");
    let db = dir.join("r.db");
    let seed = chio_kernel::keys::read_seed(&key.join("signing.seed")).unwrap();
    let mut store = chio_kernel::store::Store::open(&db, true).unwrap();
    let draft = chio_kernel::receipt::Draft {
        kind: Some(chio_kernel::receipt::Kind::LaunchEnforcement),
        outcome: "FullyEnforced".into(),
        launch_record: Some(
            serde_json::json!({"schema": "chio.cage.launch-record.v0", "argv": ["/old/tool", "<i>x</i>"]}),
        ),
        ..Default::default()
    };
    store.append(&seed, draft).unwrap();
    drop(store);
    let at = dir.join("p.html");
    let made = report(&at, &["--receipt-db", s(&db), "--trusted-key", s(&key.join("public.key"))]);
    assert_eq!(made.status.code(), Some(0), "{}", text(&made));
    let page = std::fs::read_to_string(&at).unwrap();
    assert!(page.contains("<code>/old/tool &lt;i&gt;x&lt;/i&gt;</code>"), "{page}");
    assert!(page.contains("No facts: its launch record cannot be read: missing field"), "{page}");
}
