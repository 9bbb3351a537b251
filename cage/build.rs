//! Compiles the target's seccomp filter from the reviewed table, `policies/seccomp-x86_64.tsv`,
//! with the crate's own compiler (`src/seccomp/bpf.rs`), into `$OUT_DIR/seccomp_target.rs`: a
//! launch then copies a finished program instead of parsing and compiling the table (about
//! 0.1 ms of every one-shot `chio`), and a table that does not compile fails the build.

use std::fmt::Write as _;
use std::path::PathBuf;

#[allow(dead_code)]
#[path = "src/seccomp/bpf.rs"]
mod bpf;

const TABLE: &str = "../policies/seccomp-x86_64.tsv";

fn main() {
    println!("cargo:rerun-if-changed={TABLE}");
    println!("cargo:rerun-if-changed=src/seccomp/bpf.rs");
    let table = std::fs::read_to_string(TABLE).unwrap_or_else(|e| panic!("reading {TABLE}: {e}"));
    let cases = bpf::target_cases(&table).unwrap_or_else(|e| panic!("{e}"));
    let prog = bpf::compile(&cases);
    let mut out = format!(
        "/// The target's filter, compiled from `policies/seccomp-x86_64.tsv` by `build.rs`: (code, jt, jf, k).\n\
         const TARGET_FILTER: [(u16, u8, u8, u32); {}] = [\n",
        prog.len()
    );
    for i in &prog {
        let _ = writeln!(out, "    ({:#06x}, {}, {}, {:#x}),", i.code, i.jt, i.jf, i.k);
    }
    out.push_str("];\n");
    let Some(out_dir) = std::env::var_os("OUT_DIR") else { panic!("OUT_DIR is not set: run by cargo") };
    let dest = PathBuf::from(out_dir).join("seccomp_target.rs");
    std::fs::write(&dest, out).unwrap_or_else(|e| panic!("writing {}: {e}", dest.display()));
}
