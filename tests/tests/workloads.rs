//! Real workloads run unchanged inside the default cage: bash with coreutils, `python3 -m
//! unittest`, and `cargo test --offline` / `cargo run` with the host toolchain bound read-only.
//! This is what keeps the seccomp allow-list and landlock rules honest in the other direction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use chio_tests::{cage, chio_bin, privileged, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn workspace() -> Scratch {
    let ws = Scratch::new("workload");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("Cargo.toml"), "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n")
        .unwrap();
    std::fs::write(
        ws.join("src/main.rs"),
        "fn main() { println!(\"hello from cargo\"); }\n#[test]\nfn adds() { assert_eq!(2, 1 + 1); }\n",
    )
    .unwrap();
    std::fs::write(
        ws.join("test_x.py"),
        "import unittest\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(1 + 1, 2)\n",
    )
    .unwrap();
    let chown = Command::new("chown").args(["-R", "65534:65534"]).arg(&ws.0).status().unwrap();
    assert!(chown.success());
    ws
}

#[test]
fn bash_python_and_cargo_work_in_the_default_cage() {
    if !privileged("workloads") {
        return;
    }
    let chio = chio_bin(&PathBuf::from(PROBE));
    let ws = workspace();
    let sysroot = Command::new("rustc").args(["--print", "sysroot"]).output().unwrap();
    let sysroot = String::from_utf8(sysroot.stdout).unwrap().trim().to_string();
    let bind = format!("{sysroot}:/opt/rust");
    let script = "set -e; python3 -m unittest -q 2>&1 | tail -1; cargo test --offline -q 2>&1 | grep 'test result'; \
                  cargo run -q --offline; echo a b c | awk '{print $2}' | sed s/b/B/ | sort | uniq | wc -l";
    let run = cage(
        &chio,
        &[
            "--workspace",
            ws.0.to_str().unwrap(),
            "--ro-bind",
            &bind,
            "--env",
            "PATH=/opt/rust/bin:/usr/bin:/bin",
            "--env",
            "CARGO_HOME=/workspace/.cargo",
            "--timeout",
            "120s",
        ],
        &["/bin/bash", "--noprofile", "--norc", "-c", script],
    );
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(run.code, 0, "stdout={} stderr={}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[0], "OK", "python3 -m unittest: {}", run.stdout);
    assert!(lines[1].starts_with("test result: ok. 1 passed"), "cargo test: {}", run.stdout);
    assert_eq!(lines[2], "hello from cargo");
    assert_eq!(lines[3], "1");
    assert!(ws.join("target").is_dir(), "cargo wrote its target dir in the workspace");
}
