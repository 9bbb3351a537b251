//! Crash safety of the receipt store: a writer is SIGKILLed mid-stream many times; afterwards
//! the chain verifies end to end and every receipt whose append had returned is present.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use chio_kernel::{keys, store::Store};
use chio_tests::Scratch;

const WRITER: &str = env!("CARGO_BIN_EXE_chio-receipt-writer");

#[test]
fn sigkilled_writers_lose_no_acknowledged_receipt() {
    let dir = Scratch::new("crash");
    let seed = dir.join("kernel.seed");
    let key = keys::generate().unwrap();
    keys::write_seed(&seed, &key).unwrap();
    let db = dir.join("receipts.db");
    let mut acked: Vec<(u64, String)> = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..30 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let wait_for = 1 + (x % 25) as usize;
        let mut child = Command::new(WRITER)
            .arg(&db)
            .arg(&seed)
            .arg("1000000")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        for _ in 0..wait_for {
            let line = lines.next().unwrap().unwrap();
            let mut parts = line.split_whitespace().skip(1);
            acked.push((parts.next().unwrap().parse().unwrap(), parts.next().unwrap().to_string()));
        }
        // Kill it mid-stream (it keeps appending while we read); alternate an immediate kill with
        // one after a short pause so both "between commits" and "inside a commit" are hit.
        if round % 2 == 1 {
            std::thread::sleep(std::time::Duration::from_micros(x % 3000));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let store = Store::open(Path::new(&db), false).unwrap();
    let pk = keys::hex(key.verifying_key().as_bytes());
    let report = store.verify_chain(Some(&pk), None, None).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.checked >= acked.len() as u64);
    let all = store.list(&chio_kernel::store::Filter { limit: u64::MAX >> 1, ..Default::default() }).unwrap();
    for (seq, id) in &acked {
        let row = all.iter().find(|r| r.seq == *seq).unwrap_or_else(|| panic!("acknowledged receipt {seq} lost"));
        assert_eq!(&row.id, id, "receipt {seq}");
    }
    eprintln!("{} rounds, {} acknowledged, {} in the store, chain intact", 30, acked.len(), report.checked);
}
