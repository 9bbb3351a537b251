//! What the supervisor reads from `/proc/<target>` at the exec stop, before one instruction of
//! the target runs, and the checks those facts must pass.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::os::fd::{AsFd, BorrowedFd};

use crate::record::{FdFile, InitFacts, NamespaceFact, Observed};
use crate::sys;

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
    /// A script kept open for its interpreter: its fd number, device and inode.
    pub script: Option<(i32, u64, u64)>,
    /// Seccomp filters the supervisor itself runs under (inherited by every process it starts).
    pub inherited_filters: u32,
    /// Filters the cage installs on the target: chio's, and the workload's own profile when
    /// the plan brings one.
    pub cage_filters: u32,
}

/// How many seccomp filters this process runs under (0 without any).
pub fn own_seccomp_filters() -> u32 {
    let status = sys::read_proc("/proc/self/status").unwrap_or_default();
    numbers(field(&status, "Seccomp_filters")).first().copied().unwrap_or(0)
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

/// Read the facts of `pid`, every file relative to one `/proc/<pid>` directory fd (a fact that
/// cannot be read stays empty, which `violations` reports).
pub fn read(pid: i32, host_ns: &BTreeMap<String, String>) -> Observed {
    let mut o = Observed { pid, ..Observed::default() };
    let Ok(base) = CString::new(format!("/proc/{pid}")) else { return o };
    let Ok(dir) = sys::openat(nix::fcntl::AT_FDCWD, &base, libc::O_PATH | libc::O_DIRECTORY, 0) else {
        return o;
    };
    let dir = dir.as_fd();
    // Following the magic link is the point: the file the target runs.
    if let Ok(st) = sys::fstatat(dir, c"exe", 0) {
        (o.exe_device, o.exe_inode) = (st.st_dev, st.st_ino);
    }
    let status = read_at(dir, c"status");
    o.no_new_privs = number(&status, "NoNewPrivs");
    o.seccomp = number(&status, "Seccomp");
    o.seccomp_filters = number(&status, "Seccomp_filters");
    o.capabilities = capabilities(&status);
    o.uids = numbers(field(&status, "Uid"));
    o.gids = numbers(field(&status, "Gid"));
    o.groups = numbers(field(&status, "Groups"));
    for (name, host) in host_ns {
        let cage = CString::new(format!("ns/{name}")).ok().map(|p| link_at(dir, &p)).unwrap_or_default();
        o.namespaces.insert(name.clone(), NamespaceFact { cage, host: host.clone() });
    }
    o.cgroup = read_at(dir, c"cgroup");
    if let Ok(fds) = sys::openat(dir, c"fd", libc::O_RDONLY | libc::O_DIRECTORY, 0) {
        let names = crate::path::read_dir_names(fds.as_fd()).unwrap_or_default();
        o.fds = names.iter().filter_map(|n| n.to_str().ok()?.parse().ok()).collect();
        o.fds.sort_unstable();
        for n in names.iter().filter(|n| !matches!(n.to_bytes(), b"0" | b"1" | b"2")) {
            let fd: i32 = n.to_str().ok().and_then(|s| s.parse().ok()).unwrap_or(-1);
            // Following the magic link: the file the fd is open on.
            if let Ok(st) = sys::fstatat(fds.as_fd(), n, 0) {
                o.fd_files.push(FdFile { fd, device: st.st_dev, inode: st.st_ino });
            }
        }
        o.fd_files.sort_unstable();
    }
    o.cwd = link_at(dir, c"cwd");
    o
}

/// The cage's init `pid`, read once the status channel reached EOF (see [`InitFacts`]).
pub fn read_init(pid: i32) -> InitFacts {
    let status = sys::read_proc(format!("/proc/{pid}/status")).unwrap_or_default();
    InitFacts {
        pid,
        state: field(&status, "State").and_then(|s| s.get(..1)).unwrap_or("").to_string(),
        uids: numbers(field(&status, "Uid")),
        gids: numbers(field(&status, "Gid")),
        capabilities: capabilities(&status),
        no_new_privs: number(&status, "NoNewPrivs"),
        seccomp: number(&status, "Seccomp"),
        seccomp_filters: number(&status, "Seccomp_filters"),
    }
}

/// The first number of a status field (0 when missing).
fn number(status: &str, key: &str) -> u32 {
    numbers(field(status, key)).first().copied().unwrap_or(0)
}

/// Every capability set of a status file, as hex ("missing" when absent).
fn capabilities(status: &str) -> BTreeMap<String, String> {
    ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
        .iter()
        .map(|cap| (cap.to_string(), field(status, cap).unwrap_or("missing").to_string()))
        .collect()
}

fn read_at(dir: BorrowedFd<'_>, name: &CStr) -> String {
    let file = sys::openat(dir, name, libc::O_RDONLY, 0).map(std::fs::File::from);
    file.and_then(sys::read_whole).unwrap_or_default()
}

fn link_at(dir: BorrowedFd<'_>, name: &CStr) -> String {
    sys::readlinkat(dir, name).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
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
    // Filters only ever narrow what is allowed: the supervisor's own (its service manager's)
    // stay on everything it starts, and the cage's must be there, once, on top of them.
    if o.seccomp != 2 || o.seccomp_filters != e.inherited_filters + e.cage_filters {
        v.push(format!(
            "Seccomp is {} with {} filters (want mode 2 with the cage's {} on top of the {} the supervisor runs under)",
            o.seccomp, o.seccomp_filters, e.cage_filters, e.inherited_filters
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
    match e.script {
        None if o.fds != [0, 1, 2] => v.push(format!("open fds are {:?} (want only 0, 1, 2)", o.fds)),
        Some((n, dev, ino)) => {
            if o.fds != [0, 1, 2, n] {
                v.push(format!("open fds are {:?} (want only 0, 1, 2 and the script at {n})", o.fds));
            }
            if !o.fd_files.contains(&FdFile { fd: n, device: dev, inode: ino }) {
                v.push(format!("fd {n} is not the hashed script {dev}:{ino}: {:?}", o.fd_files));
            }
        }
        None => {}
    }
    if o.cwd != e.cwd {
        v.push(format!("cwd is {:?} (want {:?})", o.cwd, e.cwd));
    }
    if !o.status_channel_eof {
        v.push("a cage process still holds the status channel".to_string());
    }
    v.extend(init_violations(&o.init, e));
    v
}

/// Every way the cage's init holds more than the target may (see [`InitFacts`]).
fn init_violations(i: &InitFacts, e: &Expect<'_>) -> Vec<String> {
    if !matches!(i.state.as_str(), "R" | "S" | "D") {
        let state = if i.state.is_empty() { "unreadable" } else { i.state.as_str() };
        return vec![format!("the cage's init {} is not there to supervise the target (state {state})", i.pid)];
    }
    let mut v = Vec::new();
    if i.uids.len() != 4 || i.uids.iter().any(|u| *u != e.uid) {
        v.push(format!("the cage's init runs with uids {:?} (want all {})", i.uids, e.uid));
    }
    if i.gids.len() != 4 || i.gids.iter().any(|g| *g != e.gid) {
        v.push(format!("the cage's init runs with gids {:?} (want all {})", i.gids, e.gid));
    }
    for (name, value) in &i.capabilities {
        if u64::from_str_radix(value, 16) != Ok(0) {
            v.push(format!("the cage's init holds {name} {value} (want 0)"));
        }
    }
    if i.no_new_privs != 1 {
        v.push(format!("the cage's init has NoNewPrivs {} (want 1)", i.no_new_privs));
    }
    if i.seccomp != 2 || i.seccomp_filters != e.inherited_filters + 1 {
        v.push(format!(
            "the cage's init has Seccomp {} with {} filters (want mode 2 with its filter on top of the {} the supervisor runs under)",
            i.seccomp, i.seccomp_filters, e.inherited_filters
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Facts of a target that meets `expect()` exactly.
    fn good() -> Observed {
        let caps = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
        Observed {
            exe_device: 1,
            exe_inode: 2,
            no_new_privs: 1,
            seccomp: 2,
            seccomp_filters: 1,
            capabilities: caps.iter().map(|c| (c.to_string(), "0000000000000000".to_string())).collect(),
            uids: vec![65534; 4],
            gids: vec![65534; 4],
            namespaces: REQUIRED_NS
                .iter()
                .map(|n| (n.to_string(), NamespaceFact { cage: format!("{n}:[2]"), host: format!("{n}:[1]") }))
                .collect(),
            cgroup: "0::/chio-1-x\n".into(),
            fds: vec![0, 1, 2],
            cwd: "/".into(),
            status_channel_eof: true,
            init: InitFacts {
                pid: 7,
                state: "S".into(),
                uids: vec![65534; 4],
                gids: vec![65534; 4],
                capabilities: caps.iter().map(|c| (c.to_string(), "0000000000000000".to_string())).collect(),
                no_new_privs: 1,
                seccomp: 2,
                seccomp_filters: 1,
            },
            ..Observed::default()
        }
    }

    fn expect() -> Expect<'static> {
        Expect {
            exe: (1, 2),
            uid: 65534,
            gid: 65534,
            cgroup: Some(("chio-1-x", 1)),
            cwd: "/",
            script: None,
            inherited_filters: 0,
            cage_filters: 1,
        }
    }

    /// `read_init` of this process and of a child that has ended but is not reaped yet (what an
    /// init that gave up is while the supervisor has not waited for it).
    #[test]
    fn reading_an_init_alive_and_ended() {
        let (pid, uid) = (nix::unistd::getpid().as_raw(), nix::unistd::getuid().as_raw());
        let i = read_init(pid);
        // The test harness's main thread (whose state the process shows) waits, or runs.
        assert!(matches!(i.state.as_str(), "R" | "S"), "{:?}", i.state);
        assert_eq!((i.pid, i.uids.clone()), (pid, vec![uid; 4]));
        assert_eq!(i.seccomp_filters, own_seccomp_filters());
        assert!(i.capabilities.values().all(|v| u64::from_str_radix(v, 16).is_ok()), "{:?}", i.capabilities);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let cpid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while read_init(cpid).state != "Z" && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let ended = Observed { init: read_init(cpid), ..good() };
        let v = violations(&ended, &expect());
        assert!(v.iter().any(|m| m.contains("(state Z)")), "{v:?}");
        child.wait().unwrap();
        assert_eq!(read_init(cpid).state, "", "a reaped init's status is gone");
    }

    /// `read` of this very process: every fact comes from the kernel, compared with what the
    /// test reads itself.
    #[test]
    fn reading_a_live_process() {
        use std::os::unix::fs::MetadataExt;
        let own = own_namespaces();
        assert_eq!(own.keys().map(String::as_str).collect::<Vec<_>>(), {
            let mut n = REQUIRED_NS.to_vec();
            n.sort_unstable();
            n
        });
        for (name, link) in &own {
            assert!(link.starts_with(&format!("{name}:[")), "{name} -> {link}");
        }
        let (pid, uid, gid) =
            (nix::unistd::getpid().as_raw(), nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let o = read(pid, &own);
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        assert_eq!((o.exe_device, o.exe_inode), (exe.dev(), exe.ino()));
        assert_eq!(o.uids, vec![uid; 4]);
        assert_eq!(o.gids, vec![gid; 4]);
        assert_eq!(o.cwd, std::env::current_dir().unwrap().to_string_lossy());
        assert!(o.fds.starts_with(&[0, 1, 2]), "{:?}", o.fds);
        assert_eq!(o.pid, pid);
        assert!(o.fd_files.iter().all(|f| f.fd > 2 && o.fds.contains(&f.fd)), "{:?}", o.fd_files);
        // This test's own open files above 2 are listed with their identity.
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let n = std::os::fd::AsRawFd::as_raw_fd(&f);
        let o = read(pid, &own);
        assert!(
            o.fd_files.contains(&FdFile { fd: n, device: exe.dev(), inode: exe.ino() }),
            "fd {n}: {:?}",
            o.fd_files
        );
        assert!(!o.cgroup.is_empty());
        assert!(o.capabilities.values().all(|v| u64::from_str_radix(v, 16).is_ok()), "{:?}", o.capabilities);
        for (name, f) in &o.namespaces {
            assert_eq!(f.cage, f.host, "{name}: the same process is in its own namespaces");
        }
        // So it fails the checks a cage must pass: its namespaces are the supervisor's.
        let inherited_filters = own_seccomp_filters();
        assert_eq!(o.seccomp_filters, inherited_filters, "this process's own filters, as the kernel counts them");
        let e = Expect {
            exe: (o.exe_device, o.exe_inode),
            uid,
            gid,
            cgroup: None,
            cwd: &o.cwd,
            script: None,
            inherited_filters,
            cage_filters: 1,
        };
        assert!(violations(&o, &e).iter().any(|v| v.contains("mnt namespace")));
    }

    #[test]
    fn a_target_meeting_every_fact_has_no_violation() {
        assert_eq!(violations(&good(), &expect()), Vec::<String>::new());
    }

    /// Under a service manager's filters the target carries them and ours: exactly one more.
    #[test]
    fn inherited_filters_count_and_ours_is_still_required_on_top() {
        let e = Expect { inherited_filters: 5, ..expect() };
        let with = |n, i| {
            let mut o = Observed { seccomp_filters: n, ..good() };
            o.init.seccomp_filters = i;
            o
        };
        assert_eq!(violations(&with(6, 6), &e), Vec::<String>::new());
        for (n, i) in [(5, 6), (7, 6), (1, 6), (6, 5), (6, 7), (6, 1)] {
            let v = violations(&with(n, i), &e);
            assert!(v.len() == 1 && v[0].contains("on top of the 5 the supervisor runs under"), "{n} {i}: {v:?}");
            assert_eq!(v[0].contains("the cage's init"), i != 6, "{n} {i}: {v:?}");
        }
        // With the workload's own profile the target carries two of the cage's; the init one.
        let e = Expect { cage_filters: 2, ..e };
        assert_eq!(violations(&with(7, 6), &e), Vec::<String>::new());
        for (n, i) in [(6, 6), (8, 6), (7, 7)] {
            assert_eq!(violations(&with(n, i), &e).len(), 1, "{n} {i}");
        }
    }

    /// Each fact, made false on its own, is reported and named.
    #[test]
    fn each_fact_alone_is_a_violation() {
        type Breaker = fn(&mut Observed);
        let cases: &[(&str, Breaker)] = &[
            ("executed file", |o| o.exe_inode = 3),
            ("executed file", |o| o.exe_device = 9),
            ("NoNewPrivs", |o| o.no_new_privs = 0),
            ("Seccomp is 0", |o| o.seccomp = 0),
            ("with 2 filters", |o| o.seccomp_filters = 2),
            ("CapInh", |o| drop(o.capabilities.insert("CapInh".into(), "0000000000000400".into()))),
            ("CapPrm", |o| drop(o.capabilities.insert("CapPrm".into(), "0000000000000001".into()))),
            ("CapEff", |o| drop(o.capabilities.insert("CapEff".into(), "8000000000000000".into()))),
            ("CapBnd", |o| drop(o.capabilities.insert("CapBnd".into(), "000001ffffffffff".into()))),
            ("CapAmb", |o| drop(o.capabilities.insert("CapAmb".into(), "missing".into()))),
            ("uids", |o| o.uids[2] = 0),
            ("uids", |o| o.uids.truncate(3)),
            ("gids", |o| o.gids[3] = 0),
            ("supplementary groups", |o| o.groups = vec![27]),
            ("mnt namespace", |o| o.namespaces.get_mut("mnt").unwrap().cage = "mnt:[1]".into()),
            ("pid namespace", |o| o.namespaces.get_mut("pid").unwrap().cage = "pid:[1]".into()),
            ("net namespace", |o| o.namespaces.get_mut("net").unwrap().cage = String::new()),
            ("ipc namespace could not be read", |o| drop(o.namespaces.remove("ipc"))),
            ("uts namespace", |o| o.namespaces.get_mut("uts").unwrap().cage = "uts:[1]".into()),
            ("cgroup namespace", |o| o.namespaces.get_mut("cgroup").unwrap().cage = "cgroup:[1]".into()),
            ("launch cgroup", |o| o.cgroup = "0::/other\n".into()),
            ("open fds", |o| o.fds = vec![0, 1, 2, 3]),
            ("open fds", |o| o.fds = vec![0, 1]),
            ("cwd", |o| o.cwd = "/tmp".into()),
            ("status channel", |o| o.status_channel_eof = false),
            ("init 7 is not there to supervise the target (state Z)", |o| o.init.state = "Z".into()),
            ("init 7 is not there to supervise the target (state unreadable)", |o| o.init.state = String::new()),
            ("init runs with uids [0, 0, 0, 0]", |o| o.init.uids = vec![0; 4]),
            ("init runs with uids", |o| o.init.uids.truncate(2)),
            ("init runs with gids", |o| o.init.gids[1] = 0),
            ("init holds CapEff", |o| drop(o.init.capabilities.insert("CapEff".into(), "000001ffffffffff".into()))),
            ("init holds CapBnd", |o| drop(o.init.capabilities.insert("CapBnd".into(), "missing".into()))),
            ("init has NoNewPrivs 0", |o| o.init.no_new_privs = 0),
            ("init has Seccomp 0", |o| o.init.seccomp = 0),
            ("init has Seccomp 2 with 0 filters", |o| o.init.seccomp_filters = 0),
        ];
        for (fact, brk) in cases {
            let mut o = good();
            brk(&mut o);
            let v = violations(&o, &expect());
            assert_eq!(v.len(), 1, "{fact}: exactly one violation, got {v:?}");
            assert!(v[0].contains(fact), "{fact}: named in {v:?}");
        }
    }

    #[test]
    fn status_fields_parse_as_the_kernel_prints_them() {
        let status = "Name:\tprobe\nUid:\t65534\t65534\t65534\t65534\nGroups:\t\nNoNewPrivs:\t1\nSeccomp:\t2\n";
        assert_eq!(numbers(field(status, "Uid")), vec![65534; 4]);
        assert_eq!(numbers(field(status, "Groups")), Vec::<u32>::new());
        assert_eq!(field(status, "NoNewPrivs"), Some("1"));
        assert_eq!(field(status, "Seccomp_filters"), None, "a prefix of another key is not a match");
        assert_eq!(field(status, "Seccomp"), Some("2"));
    }

    #[test]
    fn the_launch_cgroup_must_hold_in_every_hierarchy() {
        let mut o = good();
        o.cgroup = "2:cpu:/chio-1-x\n1:pids:/chio-1-x\n0::/\n".into();
        let e = Expect { cgroup: Some(("chio-1-x", 2)), ..expect() };
        assert!(violations(&o, &e).is_empty());
        o.cgroup = "2:cpu:/chio-1-x\n1:pids:/\n0::/\n".into();
        assert!(violations(&o, &e)[0].contains("launch cgroup"));
        // A name that merely ends the same way is not the launch cgroup.
        o.cgroup = "2:cpu:/xchio-1-x\n1:pids:/xchio-1-x\n".into();
        assert!(!violations(&o, &e).is_empty());
    }

    #[test]
    fn a_script_fd_is_allowed_only_as_the_hashed_script() {
        let mut o = good();
        o.fds = vec![0, 1, 2, 5];
        o.fd_files = vec![FdFile { fd: 5, device: 7, inode: 8 }];
        assert_eq!(violations(&o, &expect()).len(), 1, "an extra fd without a script");
        let e = Expect { script: Some((5, 7, 8)), ..expect() };
        assert_eq!(violations(&o, &e), Vec::<String>::new());
        let other = Expect { script: Some((5, 7, 9)), ..expect() };
        assert!(violations(&o, &other)[0].contains("not the hashed script"));
        o.fds.push(6);
        assert!(violations(&o, &e)[0].contains("open fds"));
        // The script expected but its fd missing.
        assert!(!violations(&good(), &e).is_empty());
    }
}
