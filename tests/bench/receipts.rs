//! Receipt benchmark (not part of the test run):
//!
//!   cargo run --release -p chio-tests --bin chio-receipt-bench [DIR]
//!
//! Times canonicalize+sign and verify of a launch receipt carrying a real-sized launch record,
//! and appends to a store on disk: one durable commit (fsync) per receipt, and group commits of
//! 100. Prints medians and receipts per second. DIR defaults to the system temp dir; point it at
//! the disk the store will live on.

use std::path::PathBuf;
use std::time::Instant;

use chio_kernel::receipt::{self, Body, Draft, Kind};
use chio_kernel::{keys, store::Store, time};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn record() -> serde_json::Value {
    // Shaped like a real chio.cage.launch-record.v1 (about 3 KiB).
    let mounts: Vec<String> = (0..18).map(|i| format!("ro bind of /var/lib/chio/rootfs/entry-{i}")).collect();
    serde_json::json!({
        "schema": "chio.cage.launch-record.v1", "state": "FullyEnforced", "mode": "enforced",
        "argv": ["/bin/bash", "--noprofile", "--norc", "-c", "cargo test --offline"],
        "target": {"path": "/usr/bin/bash", "sha256": "f".repeat(64), "device": 65024, "inode": 247076},
        "observed": {"pid": 4242, "no_new_privs": 1, "seccomp": 2, "seccomp_filters": 1, "uids": [65534, 65534, 65534, 65534],
            "capabilities": {"CapAmb": "0000000000000000", "CapBnd": "0000000000000000", "CapEff": "0000000000000000"},
            "cgroup": "0::/chio/chio-1-0123456789abcdef\n", "fds": [0, 1, 2], "cwd": "/workspace", "status_channel_eof": true},
        "reported": {"landlock_abi": 7, "landlock_fs": "FullyEnforced", "seccomp_filter_sha256": "e".repeat(64), "mounts": mounts},
        "outcome": {"exit_code": 0, "wall_ms": 1234, "cpu_ms": 987, "peak_memory_bytes": 123456789, "limit_hit": []},
        "timings_us": {"resolve": 550, "cgroup": 800, "cage_ready": 3600, "exec_observed": 5100}
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("chio-receipt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let key = keys::generate()?;
    let pk = keys::hex(key.verifying_key().as_bytes());
    let body = Body {
        schema: receipt::SCHEMA.into(),
        kind: Kind::LaunchEnforcement,
        seq: 1,
        prev: receipt::GENESIS.into(),
        issued_at: time::rfc3339(time::now_ms()),
        tool_server: None,
        outcome: "FullyEnforced".into(),
        launch_record: Some(record()),
        launch: None,
        detail: None,
    };
    let (mut sign_us, mut verify_us) = (Vec::new(), Vec::new());
    let mut bytes = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        let env = receipt::sign(&key, &body)?;
        bytes = serde_json::to_vec(&env)?;
        sign_us.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        receipt::verify(&bytes, &pk)?;
        verify_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!("receipt of {} bytes (launch record embedded)", bytes.len());
    println!("  canonicalize+sign  median {:8.1} us", median(sign_us));
    println!("  verify             median {:8.1} us", median(verify_us));

    let draft = || Draft {
        kind: Some(Kind::LaunchEnforcement),
        outcome: "FullyEnforced".into(),
        launch_record: Some(record()),
        ..Draft::default()
    };
    let mut store = Store::open(&dir.join("durable.db"), true)?;
    let mut per = Vec::new();
    let t0 = Instant::now();
    for _ in 0..300 {
        let t = Instant::now();
        store.append(&key, draft())?;
        per.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let rate = 300.0 / t0.elapsed().as_secs_f64();
    println!("  durable append (one fsync per receipt)  median {:6.2} ms/receipt, {rate:8.0} receipts/s", median(per));

    let mut store = Store::open(&dir.join("group.db"), true)?;
    let t0 = Instant::now();
    for _ in 0..30 {
        store.append_batch(&key, (0..100).map(|_| draft()).collect())?;
    }
    let rate = 3000.0 / t0.elapsed().as_secs_f64();
    println!("  group commit (100 per transaction)                         {rate:8.0} receipts/s");
    let report = store.verify_chain(Some(&pk), None, None)?;
    println!("  verify-chain of {} receipts: {} problems", report.checked, report.problems.len());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
