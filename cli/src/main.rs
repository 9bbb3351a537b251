//! `chio`: the launch path's executable (`chio cage run`); every other command is `chio-full`'s.

fn main() {
    chio_cli::launch()
}
