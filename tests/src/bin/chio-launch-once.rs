//! Teardown probe: one launch through the cage library in this single-threaded process, made
//! to fail on purpose, then a look at what the launch left as this process's children. A
//! failed launch must have killed and reaped its init (and its janitor): no child, not even a
//! zombie, may remain once `launch` has returned. Prints one JSON line.
//!
//! usage: chio-launch-once ROOTFS HOW -- COMMAND...
//! HOW: a setup stage's name (that stage fails), `withdrawn` (the gate says no after the target
//! was seized), `evidence` (the exec-stop hook cannot record the evidence) or `none`.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::PathBuf;

use chio_cage::{launch, CagePlan, RootSpec, Sinks, Stage};

/// Every child of this process, as its tasks' `children` files list them (zombies included).
fn children() -> Vec<String> {
    let mut all = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in list.split_whitespace() {
            // "pid (comm) state": which process it is, and whether it is a zombie.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            all.push(stat.split(' ').take(3).collect::<Vec<_>>().join(" "));
        }
    }
    all
}

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.len() < 5 || args[3] != "--" {
        eprintln!("usage: chio-launch-once ROOTFS HOW -- COMMAND...");
        std::process::exit(2);
    }
    let how = args[2].to_string_lossy().into_owned();
    let mut plan = CagePlan::new(args[4..].to_vec());
    plan.root = RootSpec::Directory(PathBuf::from(&args[1]));
    if !["none", "withdrawn", "evidence"].contains(&how.as_str()) {
        let Some(stage) = Stage::parse(&how) else {
            eprintln!("chio-launch-once: {how} names no stage");
            std::process::exit(2);
        };
        plan.test.fail_stage = Some(stage);
    }
    let before = children();
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let mut sinks = Sinks::new(stdout.as_fd(), stderr.as_fd());
    let refuse = || false;
    let mut no_evidence = |_: &chio_cage::LaunchRecord| Err("the evidence store is gone (on purpose)".to_string());
    match how.as_str() {
        "withdrawn" => sinks.gate = Some(&refuse),
        "evidence" => sinks.on_enforced = Some(&mut no_evidence),
        _ => {}
    }
    let rec = launch(&plan, &mut sinks);
    drop(sinks);
    let line = serde_json::json!({
        "state": rec.state,
        "failure": rec.failure,
        "children_before": before,
        "children_after": children(),
    });
    println!("{line}");
}
