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

/// The v1 freezer hierarchy's directory among `dirs`, if the container has one.
fn v1_freezer(dirs: &[PathBuf]) -> Option<&Path> {
    dirs.iter().map(PathBuf::as_path).find(|d| d.join("freezer.state").exists())
}

/// Whether the cgroup is frozen (v2's `cgroup.freeze`, v1's `freezer.state`).
pub fn frozen(dirs: &[PathBuf]) -> bool {
    let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).ok();
    match (v2(dirs), v1_freezer(dirs)) {
        (Some(d), _) => read(d, "cgroup.freeze").is_some_and(|s| s.trim() == "1"),
        (None, Some(d)) => read(d, "freezer.state").is_some_and(|s| s.trim() != "THAWED"),
        (None, None) => false,
    }
}

/// Freeze or thaw the cgroup, and wait until the kernel says it is (v1 freezes in steps).
pub fn freeze(dirs: &[PathBuf], on: bool) -> Result<(), String> {
    let (file, value) = match (v2(dirs), v1_freezer(dirs)) {
        (Some(d), _) => (d.join("cgroup.freeze"), if on { "1" } else { "0" }),
        (None, Some(d)) => (d.join("freezer.state"), if on { "FROZEN" } else { "THAWED" }),
        (None, None) => return Err("this container's cgroup has no freezer (the host mounts no v1 freezer)".into()),
    };
    std::fs::write(&file, value).map_err(|e| format!("writing {value} to {}: {e}", file.display()))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while frozen(dirs) != on {
        if std::time::Instant::now() > deadline {
            return Err(format!("{} did not reach {value} within 10 s", file.display()));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Ok(())
}

/// On cgroup v1, a freezer cgroup holding `pids`, named `<launch cgroup>-freezer`: the launch
/// cgroup has no freezer hierarchy, and `pause` needs one. (Not the launch cgroup's own name:
/// the exec stop checks the target is in that name in exactly the launch's hierarchies.) It
/// sits beside where the launch cgroup would in the freezer hierarchy: under the engine's
/// `cgroupsPath` parent when the config names one (`engine`; absolute from the hierarchy's
/// root, relative from this process's own), else under this process's own freezer cgroup.
/// Returns its directory, or None on v2 (whose launch cgroup freezes itself) or a host without
/// a v1 freezer.
pub fn v1_freezer_for(launch: &[PathBuf], pids: &[i32], engine: Option<&Path>) -> Result<Option<PathBuf>, String> {
    if v2(launch).is_some() {
        return Ok(None);
    }
    let mount = Path::new("/sys/fs/cgroup/freezer");
    let Some(name) = launch.first().and_then(|d| d.file_name()) else { return Ok(None) };
    if !mount.join("freezer.state").exists() && !mount.join("cgroup.procs").exists() {
        return Ok(None);
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let rel = own.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, ctl, path) = (p.next()?, p.next()?, p.next()?);
        ctl.split(',').any(|c| c == "freezer").then(|| path.trim_start_matches('/').to_string())
    });
    let mut parent = match engine {
        Some(e) if e.is_absolute() => mount.to_path_buf(),
        _ => mount.join(rel.unwrap_or_default()),
    };
    // (The launch cgroup was made from the same path, which the cage checked: plain names.)
    if let Some(up) = engine.and_then(Path::parent) {
        parent.push(up.strip_prefix("/").unwrap_or(up));
        std::fs::create_dir_all(&parent).map_err(|e| format!("making {}: {e}", parent.display()))?;
    }
    let mut name = name.to_os_string();
    name.push("-freezer");
    let dir = parent.join(name);
    std::fs::create_dir(&dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
    for pid in pids {
        if let Err(e) = std::fs::write(dir.join("cgroup.procs"), pid.to_string()) {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!("moving {pid} into {}: {e}", dir.display()));
        }
    }
    Ok(Some(dir))
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
