//! A container's launch cgroup seen from the runtime's later calls (`ps`, `kill --all`,
//! `pause`, `delete`), by the directories its record names.

use std::path::{Path, PathBuf};

/// Every process in the cgroup directories (deduplicated, in order).
pub fn procs(dirs: &[PathBuf]) -> Vec<i32> {
    let mut pids: Vec<i32> = dirs
        .iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<i32>>())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The unified hierarchy's directory among `dirs`, if the cgroup is on v2.
fn v2(dirs: &[PathBuf]) -> Option<&Path> {
    dirs.iter().map(PathBuf::as_path).find(|d| d.join("cgroup.freeze").exists())
}

/// Whether the cgroup is frozen (v2's `cgroup.freeze`).
pub fn frozen(dirs: &[PathBuf]) -> bool {
    v2(dirs).and_then(|d| std::fs::read_to_string(d.join("cgroup.freeze")).ok()).is_some_and(|s| s.trim() == "1")
}

/// Freeze or thaw the cgroup (v2).
pub fn freeze(dirs: &[PathBuf], on: bool) -> Result<(), String> {
    let d = v2(dirs).ok_or(
        "pause and resume need cgroup v2's freezer: this container's cgroup is on v1, which chio does not \
         freeze yet",
    )?;
    std::fs::write(d.join("cgroup.freeze"), if on { "1" } else { "0" })
        .map_err(|e| format!("writing {}: {e}", d.join("cgroup.freeze").display()))
}

/// Kill everything in the cgroup and remove its directories (each absent one is fine).
pub fn remove(dirs: &[PathBuf]) -> Result<(), String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    for d in dirs {
        loop {
            for pid in procs(std::slice::from_ref(d)) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            match std::fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if std::time::Instant::now() > deadline => {
                    return Err(format!("removing the container's cgroup {}: {e}", d.display()))
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    }
    Ok(())
}
