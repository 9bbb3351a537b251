//! The sweep of orphaned launch cgroups against a cage made in another pid namespace, in a test
//! binary of its own: its children end while the library's unit tests wait for SIGCHLD.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use chio_cage::cgroup::{sweep, Hierarchy};

/// The pids listed in a cgroup directory.
fn procs(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines().map(str::to_string).collect()
}

/// A cgroup directory no launch sweeps (its name is no launch name), with what
/// is left in it killed and removed when the test ends.
struct PrivateParent(PathBuf);

impl Drop for PrivateParent {
    fn drop(&mut self) {
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten().filter(|e| e.path().is_dir()) {
            for p in procs(&e.path()) {
                let _ = Command::new("kill").args(["-9", &p]).status();
            }
            let until = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(e.path()).is_err() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A child killed and reaped when the test ends, however it ends.
struct Gone(Child);

impl Drop for Gone {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An orphan's cage (its processes in a pid namespace made from ours) is killed and its
/// cgroup removed; a cgroup whose processes live in a pid namespace made elsewhere — a
/// container's chio, whose supervisor's pid means nothing here — is left, its process alive.
#[test]
fn the_sweep_kills_only_cages_made_from_this_pid_namespace() {
    // The pids hierarchy on a v1 host, the unified one on a v2 host (needs root, as the
    // library's cgroup tests do).
    let v1 = Path::new("/sys/fs/cgroup/pids");
    let base = if v1.is_dir() { v1 } else { Path::new("/sys/fs/cgroup") };
    let parent = PrivateParent(base.join(format!("sweep-test-{}", std::process::id())));
    std::fs::create_dir(&parent.0).unwrap();
    let mut dead = Command::new("/bin/true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    // `unshare --pid --fork` once: a namespace made from ours; twice: one made from another.
    let cage_in = |rnd: &str, depth: usize| {
        let dir = parent.0.join(format!("chio-{pid}-{rnd}"));
        std::fs::create_dir(&dir).unwrap();
        let mut c = Command::new("unshare");
        for _ in 1..depth {
            c.args(["--pid", "--fork", "unshare"]);
        }
        c.args(["--pid", "--fork", "sh", "-c", "echo $$ > \"$0\"; exec sleep 30"]).arg(dir.join("cgroup.procs"));
        let child = Gone(c.spawn().unwrap());
        let until = Instant::now() + Duration::from_secs(5);
        while procs(&dir).is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(procs(&dir).len(), 1, "the caged sleep joined {}", dir.display());
        (dir, child)
    };
    let ((ours, _a), (theirs, _b)) = (cage_in("00112233aabbcc01", 1), cage_in("00112233aabbcc02", 2));
    let in_theirs = procs(&theirs);
    // The sweep of a launch cgroups' parent (what `Hierarchy::V2` names); the killed sleep
    // leaves its cgroup a moment after the kill, so a later sweep removes it.
    let until = Instant::now() + Duration::from_secs(5);
    while ours.exists() && Instant::now() < until {
        sweep(&Hierarchy::V2(parent.0.clone()));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!ours.exists(), "the orphan made from here was not swept");
    assert!(theirs.exists(), "another pid namespace's launch cgroup was swept");
    assert_eq!(procs(&theirs), in_theirs, "another pid namespace's cage was killed");
}
