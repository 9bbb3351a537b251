//! The daemon's log in the foreground: `--log-format json` writes one JSON object a line, each
//! launch's and each refusal's fields at its top level — what the journal gets as `CHIO_*`
//! fields under systemd (tests/tests/nspawn.rs filters them with journalctl).

use super::*;

/// The log's JSON lines (every line must be one).
fn json_lines(log: &str) -> Vec<Value> {
    log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}"))).collect()
}

#[test]
fn the_json_log_carries_each_launchs_and_each_refusals_fields() {
    if !privileged("daemon_log_json") {
        return;
    }
    let dir = Scratch::new("daemon-log-json");
    assert!(Command::new(chio()).args(["keys", "generate", "--out", s(&dir.join("key"))]).status().unwrap().success());
    let conf =
        config(json!({"kernel_key": dir.join("key/signing.seed"), "clients": [{"uid": 65533, "role": "launch"}]}));
    let d = Daemon::spawn_with(&dir, conf, Command::new(chio()), &["--log-format", "json"]);
    let out = d.run(None, &["--json", "--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let receipts = record(&out);
    let stranger = d.run(Some(65534), &["--", "/bin/true"], None);
    assert_eq!(stranger.status.code(), Some(77));
    let unsigned = d.run(Some(65533), &["--", "/bin/true"], None);
    assert_ne!(unsigned.status.code(), Some(0));
    let bad = raw(&d.socket, b"garbage\n");
    assert_eq!(bad["reason"], "bad_request");
    drop(receipts);
    let until = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let lines = json_lines(&d.log());
        if lines.iter().filter(|l| l["outcome"] == "refused").count() >= 3 || Instant::now() > until {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(lines.iter().all(|l| l["level"].is_string() && l["timestamp"].is_string()), "{lines:?}");
    assert!(lines.iter().any(|l| l["message"].as_str().is_some_and(|m| m.starts_with("listening on"))), "{lines:?}");
    let ran: Vec<&Value> = lines.iter().filter(|l| l["outcome"] == "ran").collect();
    assert_eq!(ran.len(), 1, "{lines:?}");
    let ran = ran[0];
    assert_eq!(
        (ran["peer_uid"].as_u64(), ran["state"].as_str(), ran["role"].as_str()),
        (Some(0), Some("FullyEnforced"), Some("admin")),
        "{ran}"
    );
    assert!(ran["request_id"].as_str().is_some_and(|r| !r.is_empty()), "{ran}");
    assert!(ran["launch_id"].as_str().is_some_and(|r| !r.is_empty()), "the launch's enforcement receipt: {ran}");
    let refused = |reason: &str| lines.iter().find(|l| l["outcome"] == "refused" && l["reason"] == reason).cloned();
    let stranger = refused("not_a_client").unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(stranger["peer_uid"].as_u64(), Some(65534), "{stranger}");
    assert!(stranger["message"].as_str().is_some_and(|m| m.contains("may not use this supervisor")), "{stranger}");
    let unsigned = refused("not_admitted").unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(unsigned["peer_uid"].as_u64(), Some(65533), "{unsigned}");
    assert!(unsigned["request_id"].as_str().is_some(), "{unsigned}");
    assert!(refused("bad_request").is_some(), "{lines:?}");
}

/// `--log-format journal` where no journal listens is refused at the start, never a silent
/// fallback; an unknown format is refused by the parser.
#[test]
fn a_journal_that_is_not_there_is_refused_at_the_start() {
    if !privileged("daemon_log_journal") {
        return;
    }
    let dir = Scratch::new("daemon-log-journal");
    std::fs::write(dir.join("c.json"), config(json!({})).to_string()).unwrap();
    let serve = |format: &str, unshared: bool| {
        // In a mount namespace of its own with an empty /run: no journal socket there.
        let mut c = if unshared {
            let mut c = Command::new("unshare");
            c.args(["-m", "--propagation", "private", "sh", "-c", r#"mount -t tmpfs none /run && exec "$@""#, "sh"]);
            c.arg(chio());
            c
        } else {
            Command::new(chio())
        };
        c.args(["supervisor", "serve", "--socket", s(&dir.join("s.sock")), "--state-dir", s(&dir.join("state"))]);
        c.args(["--config", s(&dir.join("c.json")), "--log-format", format]);
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let out = chio_tests::output_within(c.spawn().unwrap(), Duration::from_secs(10), "a refused daemon");
        (out.status.code(), text(&out.stderr))
    };
    let (code, err) = serve("journal", true);
    assert!(code != Some(0) && err.contains("--log-format journal: the journal's socket"), "{code:?} {err}");
    let (code, err) = serve("syslog", false);
    assert!(code == Some(2) && err.contains("invalid value 'syslog'"), "{code:?} {err}");
}
