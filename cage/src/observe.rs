//! What the supervisor reads from `/proc/<target>` at the exec stop, before one instruction of
//! the target runs, and the checks those facts must pass.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;

use crate::record::{NamespaceFact, Observed};

/// Namespaces that must differ from the supervisor's.
pub const REQUIRED_NS: [&str; 6] = ["mnt", "pid", "net", "ipc", "uts", "cgroup"];

/// What the facts must be.
pub struct Expect<'a> {
    /// Device and inode of the verified executable.
    pub exe: (u64, u64),
    /// uid of the plan.
    pub uid: u32,
    /// gid of the plan.
    pub gid: u32,
    /// cgroup directory name of the launch and the number of hierarchies it was created in:
    /// that many lines of `/proc/<pid>/cgroup` must end with it.
    pub cgroup: Option<(&'a str, usize)>,
    /// Working directory inside the cage.
    pub cwd: &'a str,
}

/// The supervisor's own namespaces, read once per launch.
pub fn own_namespaces() -> BTreeMap<String, String> {
    REQUIRED_NS
        .iter()
        .filter_map(|n| {
            let link = fs::read_link(format!("/proc/self/ns/{n}")).ok()?;
            Some((n.to_string(), link.to_string_lossy().into_owned()))
        })
        .collect()
}

fn field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')).map(str::trim))
}

fn numbers(s: Option<&str>) -> Vec<u32> {
    s.unwrap_or("").split_whitespace().filter_map(|x| x.parse().ok()).collect()
}

/// Read the facts of `pid`.
pub fn read(pid: i32, host_ns: &BTreeMap<String, String>) -> Observed {
    let base = format!("/proc/{pid}");
    let mut o = Observed { pid, ..Observed::default() };
    if let Ok(m) = fs::metadata(format!("{base}/exe")) {
        o.exe_device = m.dev();
        o.exe_inode = m.ino();
    }
    let status = fs::read_to_string(format!("{base}/status")).unwrap_or_default();
    o.no_new_privs = numbers(field(&status, "NoNewPrivs")).first().copied().unwrap_or(0);
    o.seccomp = numbers(field(&status, "Seccomp")).first().copied().unwrap_or(0);
    o.seccomp_filters = numbers(field(&status, "Seccomp_filters")).first().copied().unwrap_or(0);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        o.capabilities.insert(cap.to_string(), field(&status, cap).unwrap_or("missing").to_string());
    }
    o.uids = numbers(field(&status, "Uid"));
    o.gids = numbers(field(&status, "Gid"));
    o.groups = numbers(field(&status, "Groups"));
    for (name, host) in host_ns {
        let cage =
            fs::read_link(format!("{base}/ns/{name}")).map(|l| l.to_string_lossy().into_owned()).unwrap_or_default();
        o.namespaces.insert(name.clone(), NamespaceFact { cage, host: host.clone() });
    }
    o.cgroup = fs::read_to_string(format!("{base}/cgroup")).unwrap_or_default();
    if let Ok(dir) = fs::read_dir(format!("{base}/fd")) {
        o.fds = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
        o.fds.sort_unstable();
    }
    o.cwd = fs::read_link(format!("{base}/cwd")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    o
}

/// Every way `o` falls short of `e`, in operator words. Empty means all facts hold.
pub fn violations(o: &Observed, e: &Expect<'_>) -> Vec<String> {
    let mut v = Vec::new();
    if (o.exe_device, o.exe_inode) != e.exe {
        v.push(format!(
            "executed file is {}:{} but the verified file is {}:{}",
            o.exe_device, o.exe_inode, e.exe.0, e.exe.1
        ));
    }
    if o.no_new_privs != 1 {
        v.push(format!("NoNewPrivs is {} (want 1)", o.no_new_privs));
    }
    if o.seccomp != 2 || o.seccomp_filters != 1 {
        v.push(format!(
            "Seccomp is {} with {} filters (want mode 2 with exactly our filter)",
            o.seccomp, o.seccomp_filters
        ));
    }
    for (name, value) in &o.capabilities {
        if u64::from_str_radix(value, 16) != Ok(0) {
            v.push(format!("{name} is {value} (want 0)"));
        }
    }
    if o.uids.len() != 4 || o.uids.iter().any(|u| *u != e.uid) {
        v.push(format!("uids are {:?} (want all {})", o.uids, e.uid));
    }
    if o.gids.len() != 4 || o.gids.iter().any(|g| *g != e.gid) {
        v.push(format!("gids are {:?} (want all {})", o.gids, e.gid));
    }
    if !o.groups.is_empty() {
        v.push(format!("supplementary groups {:?} (want none)", o.groups));
    }
    for name in REQUIRED_NS {
        match o.namespaces.get(name) {
            Some(f) if !f.cage.is_empty() && f.cage != f.host => {}
            Some(f) => v.push(format!("{name} namespace {} is the supervisor's", f.cage)),
            None => v.push(format!("{name} namespace could not be read")),
        }
    }
    if let Some((name, hierarchies)) = e.cgroup {
        let suffix = format!("/{name}");
        if o.cgroup.lines().filter(|l| l.ends_with(&suffix)).count() != hierarchies {
            v.push(format!("target is not in the launch cgroup {name}: {}", o.cgroup.trim().replace('\n', "; ")));
        }
    }
    if o.fds != [0, 1, 2] {
        v.push(format!("open fds are {:?} (want only 0, 1, 2)", o.fds));
    }
    if o.cwd != e.cwd {
        v.push(format!("cwd is {:?} (want {:?})", o.cwd, e.cwd));
    }
    if !o.status_channel_eof {
        v.push("a cage process still holds the status channel".to_string());
    }
    v
}
