//! Crash-test helper: appends receipts to a store forever (or N times), printing
//! `ACK <seq> <id>` only after each append has returned — i.e. after the commit. The suite
//! SIGKILLs it at random points and then checks every acknowledged receipt survived.

use std::io::Write;
use std::path::Path;

use chio_kernel::receipt::{Draft, Kind};
use chio_kernel::{keys, store::Store};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: chio-receipt-writer DB SEED COUNT");
        std::process::exit(2);
    }
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let key = keys::read_seed(Path::new(&args[2]))?;
        let mut store = Store::open(Path::new(&args[1]), true)?;
        let count: u64 = args[3].parse()?;
        let mut out = std::io::stdout().lock();
        for i in 0..count {
            let draft = Draft {
                kind: Some(Kind::ToolCall),
                tool_server: Some("crash-test".into()),
                outcome: format!("call-{i}"),
                detail: Some(serde_json::json!({ "i": i, "pad": "x".repeat(200) })),
                ..Draft::default()
            };
            let r = store.append(&key, draft)?.receipt;
            writeln!(out, "ACK {} {}", r.body.seq, r.id)?;
            out.flush()?;
        }
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("chio-receipt-writer: {e}");
        std::process::exit(1);
    }
}
