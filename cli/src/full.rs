//! `chio-full`: every chio command (`chio` hands it all but `cage run`).

fn main() {
    chio_cli::full()
}
