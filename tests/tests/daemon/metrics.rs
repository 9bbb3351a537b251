//! The daemon's metrics endpoint, scraped by a real OpenMetrics parser (the Python
//! `prometheus_client`'s, Debian's python3-prometheus-client): what it counts is what the
//! daemon did, it parses under load, a scraper holds no more than its share, and it listens
//! only where no other host reaches.

use super::*;
use chio_tests::Samples;
use std::net::{TcpListener, TcpStream};

fn scrape(at: &str) -> Samples {
    chio_tests::scrape_openmetrics(at)
}

fn value(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    chio_tests::metric(samples, name, labels)
}

const ENFORCED_RAN: [(&str, &str); 3] = [("op", "launch"), ("outcome", "ran"), ("state", "FullyEnforced")];

/// Scrape until `holds` is true of the samples (5 s at most).
fn scrape_until(at: &str, what: &str, holds: impl Fn(&Samples) -> bool) -> Samples {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let m = scrape(at);
        if holds(&m) {
            return m;
        }
        assert!(Instant::now() < until, "{what}: {m:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Launches, refusals of each kind the daemon and its launch processes make, a ceiling hit
/// and a running cage, with clients launching while a scraper scrapes: every scrape parses,
/// no counter goes back, and the last one counts exactly what was done.
#[test]
fn the_metrics_count_what_the_daemon_did_and_parse_under_load() {
    if !privileged("daemon_metrics") {
        return;
    }
    let dir = Scratch::new("daemon-metrics");
    assert!(Command::new(chio()).args(["keys", "generate", "--out", s(&dir.join("key"))]).status().unwrap().success());
    let sock = dir.join("m.sock");
    let conf = json!({"metrics": sock, "kernel_key": dir.join("key/signing.seed"),
                      "clients": [{"uid": 65533, "role": "launch"}]});
    let d = Daemon::start(&dir, config(conf));
    let at = format!("unix:{}", s(&sock));
    assert!(d.log().contains(&format!("metrics at unix:{} /metrics", s(&sock))), "{}", d.log());
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "the metrics socket is root's and group chio's");
    assert_eq!(value(&scrape(&at), "chio_launches_total", &ENFORCED_RAN), 0.0);

    // Each client launches at least `each` times, and on until two scrapes have been taken
    // during the load (a scrape is a Python process: on a busy machine a client's launches
    // can all be done before it answers).
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (clients, each) = (3, 4);
    let (done, launched, scraped) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
    let scrapes = std::thread::scope(|sc| {
        for _ in 0..clients {
            sc.spawn(|| {
                for n in 1..=100 {
                    let out = d.run(None, &["--", "/bin/true"], None);
                    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
                    launched.fetch_add(1, SeqCst);
                    if n >= each && scraped.load(SeqCst) >= 2 {
                        break;
                    }
                }
                done.fetch_add(1, SeqCst);
            });
        }
        // Scraped while they launch: each parses, and no count goes back.
        let (mut scrapes, mut last) = (0, 0.0);
        while done.load(SeqCst) < clients {
            let ran = value(&scrape(&at), "chio_launches_total", &ENFORCED_RAN);
            assert!(ran >= last, "launches went from {last} to {ran}");
            (scrapes, last) = (scrapes + 1, ran);
            scraped.store(scrapes, SeqCst);
        }
        scrapes
    });
    assert!(scrapes >= 2, "{scrapes} scrapes during the load");

    // A ceiling, a cage alive, and a refusal of each kind: by the daemon (a stranger, a bad
    // line) and by the launch process (the launch role without a signed policy).
    let hit = d.run(None, &["--json", "--timeout", "1s", "--", "/bin/sleep", "5"], None);
    assert_eq!(record(&hit)["outcome"]["limit_hit"], json!(["wall_time"]), "{}", text(&hit.stderr));
    let tag = format!("metrics-live-{}", std::process::id());
    let mut held = Command::new(chio());
    held.args(["cage", "run", "--supervisor", s(&d.socket), "--timeout", "20s", "--"]);
    held.args(["/bin/sh", "-c", &format!("sleep 1; : {tag}")]).stdout(Stdio::null()).stderr(Stdio::null());
    let held = held.spawn().unwrap();
    d.wait_for_shell(&tag);
    let m = scrape(&at);
    assert!(value(&m, "chio_live_cages", &[]) >= 1.0, "a cage runs: {m:?}");
    assert_eq!(chio_tests::output_within(held, Duration::from_secs(20), "the held launch").status.code(), Some(0));
    let stranger = d.run(Some(65534), &["--", "/bin/true"], None);
    assert_eq!(stranger.status.code(), Some(77), "{}", text(&stranger.stderr));
    let bad = raw(&d.socket, b"garbage\n");
    assert_eq!(bad["reason"], "bad_request", "the refusal names its reason: {bad}");
    let unsigned = d.run(Some(65533), &["--", "/bin/true"], None);
    assert_ne!(unsigned.status.code(), Some(0), "{}", text(&unsigned.stderr));

    let m = scrape_until(&at, "idle: no cage alive, the spare ready", |m| {
        value(m, "chio_live_cages", &[]) == 0.0 && value(m, "chio_spare_ready", &[]) == 1.0
    });
    let ran = (launched.load(SeqCst) + 2) as f64;
    assert_eq!(value(&m, "chio_launches_total", &ENFORCED_RAN), ran, "{m:?}");
    assert_eq!(value(&m, "chio_launches_total", &[("outcome", "refused"), ("state", "none")]), 1.0);
    assert_eq!(value(&m, "chio_launches_total", &[]), ran + 1.0, "nothing else was dispatched");
    assert_eq!(value(&m, "chio_limit_hits_total", &[("kind", "wall_time")]), 1.0);
    assert_eq!(value(&m, "chio_limit_hits_total", &[]), 1.0);
    for (reason, n) in [("not_a_client", 1.0), ("bad_request", 1.0), ("not_admitted", 1.0)] {
        assert_eq!(value(&m, "chio_refusals_total", &[("reason", reason)]), n, "{reason}");
    }
    assert_eq!(value(&m, "chio_refusals_total", &[]), 3.0, "no other refusal");
    assert_eq!(value(&m, "chio_launch_queue_depth", &[]), 0.0);
    let count = |name: &str, labels: &[(&str, &str)]| value(&m, &format!("{name}_count"), labels);
    let mean = |name: &str| value(&m, &format!("{name}_sum"), &[]) / count(name, &[]);
    assert_eq!(count("chio_launch_exec_observed_seconds", &[]), ran, "every target's exec was observed");
    assert_eq!(count("chio_launch_answer_seconds", &[]), ran + 1.0, "every dispatched request was answered");
    let (to_exec, to_answer) = (mean("chio_launch_exec_observed_seconds"), mean("chio_launch_answer_seconds"));
    assert!(to_exec > 0.0 && to_exec < to_answer, "exec observed {to_exec} s, answered {to_answer} s");
    let bucketed = value(&m, "chio_launch_exec_observed_seconds_bucket", &[("le", "+Inf")]);
    assert_eq!(bucketed, ran, "the +Inf bucket holds every observation");
    assert_eq!(count("chio_store_write_seconds", &[("op", "journal_complete")]), ran + 1.0);
    assert!(count("chio_store_write_seconds", &[("op", "journal_begin")]) >= ran + 1.0);
    // An enforcement and a terminal receipt for each launch that ran.
    assert!(count("chio_store_write_seconds", &[("op", "receipt")]) >= 2.0 * ran, "{m:?}");
}

/// A free loopback port (a moment ago).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Scrapers that connect and say nothing hold at most their four places: a fifth is closed
/// unanswered (with three held, a scrape is answered: the control), launches go on meanwhile,
/// and once they leave the next scrape is answered. The daemon will not serve its metrics on
/// an address other hosts reach, nor start when its metrics port is taken.
#[test]
fn a_scraper_holds_no_more_than_its_share_and_the_endpoint_is_loopback_only() {
    if !privileged("daemon_metrics_bounds") {
        return;
    }
    let dir = Scratch::new("daemon-metrics-bounds");
    let port = free_port();
    let d = Daemon::start(&dir, config(json!({"metrics": format!("127.0.0.1:{port}")})));
    let url = format!("http://127.0.0.1:{port}/metrics");
    assert!(d.log().contains(&format!("metrics at {url}")), "{}", d.log());
    let idle =
        |n: usize| -> Vec<TcpStream> { (0..n).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect() };
    let answered = || {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
        let mut got = String::new();
        let _ = c.read_to_string(&mut got);
        got.starts_with("HTTP/1.1 200 OK")
    };
    let three = idle(3);
    std::thread::sleep(Duration::from_millis(100));
    assert!(answered(), "with three scrapers idle, a fourth is answered");
    let four = idle(1);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!answered(), "with four scrapers idle, a fifth is closed unanswered");
    assert_eq!(d.run(None, &["--", "/bin/true"], None).status.code(), Some(0), "launches go on meanwhile");
    drop((three, four));
    let until = Instant::now() + Duration::from_secs(5);
    while !answered() {
        assert!(Instant::now() < until, "the endpoint did not come back once the idle scrapers left");
        std::thread::sleep(Duration::from_millis(50));
    }
    let m = scrape(&url);
    assert_eq!(value(&m, "chio_launches_total", &ENFORCED_RAN), 1.0, "{m:?}");
    drop(d);

    // Refused at the start: a metrics address another host reaches, a port in use.
    let serve = |metrics: &str| -> (Option<i32>, String) {
        let conf = dir.join("refused.json");
        std::fs::write(&conf, config(json!({"metrics": metrics})).to_string()).unwrap();
        let mut c = Command::new(chio());
        c.args(["supervisor", "serve", "--socket", s(&dir.join("r.sock")), "--state-dir", s(&dir.join("state"))]);
        c.args(["--config", s(&conf)]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let out = chio_tests::output_within(c.spawn().unwrap(), Duration::from_secs(10), "a refused daemon");
        (out.status.code(), text(&out.stderr))
    };
    let (code, err) = serve(&format!("0.0.0.0:{port}"));
    assert!(code != Some(0) && err.contains("is not a loopback address"), "{code:?} {err}");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let (code, err) = serve(&taken.local_addr().unwrap().to_string());
    assert!(code != Some(0) && err.contains("metrics: listening on 127.0.0.1"), "{code:?} {err}");
    assert!(!dir.join("r.sock").exists(), "a daemon refused at its start leaves no socket");
}
