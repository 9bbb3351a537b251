//! An OCI bundle's `config.json` as a cage plan, or the reasons it cannot be one. The cage
//! gives every container the same confinement; a config may ask for less of what the node
//! allows (smaller ceilings), never for more. What it asks for that the cage provides in its
//! own way (its `/proc`, `/dev`, `/tmp`) is taken as provided; what it asks for that the cage
//! would not give (a writable root, a host namespace, an added capability, a hook, a bind from
//! outside the node's allow-list) refuses the container at `create`, every reason listed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use chio_cage::{AskedRlimit, Bind, CagePlan, Limits, Mode, NetMode, RlimitResource, RootSpec, Tmpfs};
use oci_spec::runtime::{LinuxNamespaceType, Mount, PosixRlimitType, Process, Spec};

use super::node::NodeConfig;

/// The capabilities an engine gives a container by default (runc's, containerd's and
/// podman's list). A config naming only these is an ordinary container: the cage grants none
/// of them. One naming any other capability asks for more than an ordinary container and is
/// refused.
pub const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The annotation keys a record carries for a container: its id and bundle, and each of the
/// bundle's own annotations under this prefix (a CRI pod's name and namespace, an image).
pub const ANNOTATION_PREFIX: &str = "oci.annotation.";

/// A bundle made into a plan.
#[derive(Debug)]
pub struct Translated {
    /// The plan (detached: the engine holds the container's stdio and its end).
    pub plan: CagePlan,
    /// A network namespace to join (a CRI pod's), by path.
    pub netns: Option<PathBuf>,
}

/// Read `BUNDLE/config.json` and make it a plan for container `id`, or list why not.
pub fn translate(id: &str, bundle: &Path, node: &NodeConfig) -> Result<Translated, Vec<String>> {
    let config = bundle.join("config.json");
    let spec = Spec::load(&config).map_err(|e| vec![format!("reading {}: {e}", config.display())])?;
    Translation::new(id, bundle, node).run(&spec)
}

/// The plan for a process `exec` runs in a started container: the container's own plan
/// (`base`: its ceilings, network rules, seccomp profile) with the process's arguments,
/// environment, working directory, user, terminal and rlimits — which, as at `create`, may
/// only lower the ceilings and ask for no capability beyond an ordinary container's.
pub fn exec_plan(id: &str, base: &CagePlan, p: &Process, node: &NodeConfig) -> Result<CagePlan, Vec<String>> {
    let bundle = PathBuf::new();
    let mut t = Translation::new(id, &bundle, node);
    // What built the container's root and namespaces is not redone: the process enters them.
    t.plan = CagePlan {
        argv: Vec::new(),
        env: Vec::new(),
        annotations: BTreeMap::new(),
        join: Vec::new(),
        binds: Vec::new(),
        hostname: None,
        tmpfs: Vec::new(),
        masked: Vec::new(),
        read_only: Vec::new(),
        ..base.clone()
    };
    t.notes.extend(base.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    t.note("exec", "a further process run in the container by exec, in its namespaces, cgroup and confinement");
    t.process(p);
    if !t.refused.is_empty() {
        return Err(t.refused);
    }
    t.within_host_limits();
    t.plan.annotations = t.notes;
    Ok(t.plan)
}

struct Translation<'a> {
    bundle: &'a Path,
    node: &'a NodeConfig,
    refused: Vec<String>,
    /// What the cage does instead of what the config asked (recorded, never silent).
    notes: BTreeMap<String, String>,
    plan: CagePlan,
    netns: Option<PathBuf>,
}

impl<'a> Translation<'a> {
    fn new(id: &str, bundle: &'a Path, node: &'a NodeConfig) -> Self {
        let mut plan = CagePlan::new(Vec::new());
        plan.mode = Mode::Enforced;
        plan.detached = true;
        plan.net = NetMode::Loopback;
        plan.staging_dir = node.staging_dir.clone();
        // No deadline and no output cap: a detached launch enforces neither (the record says
        // 0 for both, and why, in its annotations).
        plan.limits = Limits { wall_ms: 0, output_bytes: 0, ..node.ceilings.clone() };
        plan.env.clear();
        let mut notes = BTreeMap::new();
        notes.insert("oci.id".into(), id.to_string());
        notes.insert("oci.bundle".into(), bundle.display().to_string());
        notes.insert(
            "oci.after_exec".into(),
            "the engine supervises the container after its observed exec: no chio deadline or output cap".into(),
        );
        Translation { bundle, node, refused: Vec::new(), notes, plan, netns: None }
    }

    fn refuse(&mut self, why: impl Into<String>) {
        self.refused.push(why.into());
    }

    fn note(&mut self, key: &str, what: impl Into<String>) {
        self.notes.insert(format!("oci.{key}"), what.into());
    }

    fn run(mut self, spec: &Spec) -> Result<Translated, Vec<String>> {
        self.version(spec.version());
        self.root(spec);
        match spec.process() {
            Some(p) => self.process(p),
            None => self.refuse("the config has no process to run"),
        }
        self.mounts(spec.mounts().as_deref().unwrap_or_default());
        self.linux(spec);
        if spec.hooks().as_ref().is_some_and(|h| {
            let n = |v: &Option<Vec<_>>| v.as_ref().map_or(0, Vec::len);
            #[allow(deprecated)]
            let prestart = n(h.prestart());
            prestart
                + n(h.create_runtime())
                + n(h.create_container())
                + n(h.start_container())
                + n(h.poststart())
                + n(h.poststop())
                > 0
        }) {
            self.refuse("hooks: chio runs no host programs on a container's behalf (remove the config's hooks)");
        }
        if let Some(h) = spec.hostname().as_ref().filter(|h| !h.is_empty()) {
            self.plan.hostname = Some(h.clone());
        }
        for (k, v) in spec.annotations().iter().flatten() {
            self.notes.insert(format!("{ANNOTATION_PREFIX}{k}"), v.clone());
        }
        if !self.refused.is_empty() {
            return Err(self.refused);
        }
        self.within_host_limits();
        self.plan.annotations = self.notes;
        Ok(Translated { plan: self.plan, netns: self.netns })
    }

    /// Without CAP_SYS_RESOURCE (a host that withholds it, as some VMs do) no process can raise
    /// a hard limit above its own: the cage's init would fail setting one, after `create` has
    /// returned. Such a limit is lowered to this process's own, and the record says so.
    fn within_host_limits(&mut self) {
        if holds_sys_resource() {
            return;
        }
        use nix::sys::resource::{getrlimit, Resource};
        let l = &mut self.plan.limits;
        let mut lowered = Vec::new();
        let mut clamp = |name: &str, r: Resource, v: &mut u64| {
            if let Ok((_, hard)) = getrlimit(r) {
                if *v > hard {
                    lowered.push(format!("{name} {} to {hard}", *v));
                    *v = hard;
                }
            }
        };
        clamp("nofile", Resource::RLIMIT_NOFILE, &mut l.nofile);
        clamp("fsize", Resource::RLIMIT_FSIZE, &mut l.fsize_bytes);
        clamp("core", Resource::RLIMIT_CORE, &mut l.core_bytes);
        clamp("sigpending", Resource::RLIMIT_SIGPENDING, &mut l.sigpending);
        clamp("memlock", Resource::RLIMIT_MEMLOCK, &mut l.memlock_bytes);
        if !lowered.is_empty() {
            self.note(
                "rlimits_lowered",
                format!("{}: chio lacks CAP_SYS_RESOURCE and cannot raise a hard limit", lowered.join(", ")),
            );
        }
    }

    /// The runtime spec's major version 1 (`1.0.2`, `1.2.0`, `1.1.0-rc.1`): a config of another
    /// major version, or a version that is not one, may mean what this translation does not.
    fn version(&mut self, v: &str) {
        let core = v.split(['-', '+']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        let numeric = parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !numeric || parts[0] != "1" {
            self.refuse(format!("ociVersion {v:?} is not a 1.x.y runtime-spec version"));
        }
    }

    fn root(&mut self, spec: &Spec) {
        let Some(root) = spec.root() else { return self.refuse("the config names no root filesystem") };
        let path = match root.path().is_absolute() {
            true => root.path().clone(),
            false => self.bundle.join(root.path()),
        };
        if root.readonly() != Some(true) {
            self.refuse(
                "root.readonly is not true: chio gives every container a read-only root (podman --read-only, \
                 ctr run --readonly, Kubernetes readOnlyRootFilesystem: true)",
            );
        }
        if std::fs::canonicalize(&path).is_ok_and(|p| p == Path::new("/")) {
            self.refuse("the root filesystem is the host's /");
        }
        self.plan.root = RootSpec::Directory(path);
    }

    fn process(&mut self, p: &Process) {
        let args = p.args().clone().unwrap_or_default();
        if args.is_empty() {
            self.refuse("process.args is empty: nothing to run");
        }
        self.plan.argv = args.into_iter().map(OsString::from).collect();
        for e in p.env().iter().flatten() {
            match e.split_once('=') {
                Some((k, v)) => self.plan.env.push((k.into(), v.into())),
                None => self.refuse(format!("process.env entry {e:?} has no '='")),
            }
        }
        self.plan.cwd = p.cwd().clone();
        self.plan.terminal = p.terminal() == Some(true);
        let user = p.user();
        (self.plan.uid, self.plan.gid) = (user.uid(), user.gid());
        let extra: Vec<u32> = user.additional_gids().iter().flatten().copied().filter(|g| *g != user.gid()).collect();
        if !extra.is_empty() {
            self.note("dropped.additional_gids", format!("{extra:?}: the cage's process has its one group"));
        }
        if let Some(caps) = p.capabilities() {
            let mut asked = std::collections::BTreeSet::new();
            for set in [caps.bounding(), caps.effective(), caps.inheritable(), caps.permitted(), caps.ambient()] {
                for c in set.iter().flatten() {
                    asked.insert(
                        serde_json::to_value(c).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
                    );
                }
            }
            let added: Vec<&String> = asked.iter().filter(|c| !DEFAULT_CAPABILITIES.contains(&c.as_str())).collect();
            if !added.is_empty() {
                self.refuse(format!(
                    "capabilities {added:?} are beyond an ordinary container's: chio grants a container no capability"
                ));
            }
            if !asked.is_empty() {
                let listed: Vec<&str> = asked.iter().map(String::as_str).collect();
                self.note("dropped.capabilities", format!("{}: the cage's process holds none", listed.join(",")));
            }
        }
        if p.no_new_privileges() != Some(true) {
            self.note("no_new_privileges", "set by the cage whatever the config says");
        }
        if let Some(profile) = p.apparmor_profile().as_ref().filter(|s| !s.is_empty()) {
            self.refuse(format!(
                "process.apparmorProfile {profile:?}: chio does not load AppArmor profiles; its landlock and \
                 seccomp confine the container (run the engine without an AppArmor profile for this runtime)"
            ));
        }
        if p.selinux_label().as_ref().is_some_and(|s| !s.is_empty()) {
            self.refuse("process.selinuxLabel: chio does not apply SELinux labels");
        }
        for r in p.rlimits().iter().flatten() {
            let (soft, hard) = (r.soft(), r.hard());
            if soft > hard {
                self.refuse(format!("process.rlimits {:?}: soft {soft} above hard {hard}", r.typ()));
                continue;
            }
            let l = &mut self.plan.limits;
            let lower = |to: &mut u64| *to = (*to).min(hard);
            let lower_opt = |to: &mut Option<u64>| *to = Some(to.map_or(hard, |c| c.min(hard)));
            use PosixRlimitType as T;
            use RlimitResource as R;
            // The ceilings the plan names are lowered to the hard value (the record shows them);
            // every asked limit, these too, is then set with its own soft value.
            let resource = match r.typ() {
                T::RlimitNofile => {
                    lower(&mut l.nofile);
                    R::Nofile
                }
                T::RlimitCore => {
                    lower(&mut l.core_bytes);
                    R::Core
                }
                T::RlimitFsize => {
                    lower(&mut l.fsize_bytes);
                    R::Fsize
                }
                T::RlimitSigpending => {
                    lower(&mut l.sigpending);
                    R::Sigpending
                }
                T::RlimitMemlock => {
                    lower(&mut l.memlock_bytes);
                    R::Memlock
                }
                T::RlimitCpu => {
                    lower_opt(&mut l.cpu_seconds);
                    R::Cpu
                }
                T::RlimitAs => {
                    lower_opt(&mut l.address_space_bytes);
                    R::As
                }
                T::RlimitData => R::Data,
                T::RlimitStack => R::Stack,
                T::RlimitRss => R::Rss,
                T::RlimitNproc => R::Nproc,
                T::RlimitLocks => R::Locks,
                T::RlimitMsgqueue => R::Msgqueue,
                T::RlimitNice => R::Nice,
                T::RlimitRtprio => R::Rtprio,
                T::RlimitRttime => R::Rttime,
            };
            l.asked.retain(|a| a.resource != resource);
            l.asked.push(AskedRlimit { resource, soft, hard });
        }
    }

    fn mounts(&mut self, mounts: &[Mount]) {
        for m in mounts {
            let dest = m.destination();
            let kind = m.typ().as_deref().unwrap_or("");
            let opts: Vec<&str> = m.options().iter().flatten().map(String::as_str).collect();
            let is_bind = kind == "bind" || opts.iter().any(|o| matches!(*o, "bind" | "rbind"));
            let shown = dest.display().to_string();
            match (shown.as_str(), kind) {
                ("/dev/shm", _) if is_bind => self.note(
                    "dev_shm",
                    format!(
                        "the cage's own /dev/shm (its ipc namespace is its own), not the bind of {}",
                        m.source().as_deref().unwrap_or(Path::new("")).display()
                    ),
                ),
                (_, _) if is_bind => self.bind(m, &opts),
                ("/proc", "proc") | ("/dev", "tmpfs") => {}
                ("/dev/shm", "tmpfs") => {
                    if let Some(b) = size_of(&opts) {
                        self.plan.limits.shm_bytes = self.plan.limits.shm_bytes.min(b);
                    }
                }
                ("/tmp", "tmpfs") => {
                    if let Some(b) = size_of(&opts) {
                        self.plan.limits.tmp_bytes = self.plan.limits.tmp_bytes.min(b);
                    }
                }
                ("/dev/pts", "devpts")
                | ("/dev/mqueue", "mqueue")
                | ("/sys", "sysfs")
                | ("/sys/fs/cgroup", "cgroup") => {
                    self.note(&format!("not_mounted.{}", shown.trim_start_matches('/')), "the cage does not mount it")
                }
                (_, "tmpfs") => {
                    let bytes =
                        size_of(&opts).unwrap_or(self.node.ceilings.tmp_bytes).min(self.node.ceilings.tmp_bytes);
                    self.plan.tmpfs.push(Tmpfs { dest: dest.clone(), bytes });
                }
                _ => self.refuse(format!("the {kind:?} mount at {shown} is not one chio provides")),
            }
        }
    }

    fn bind(&mut self, m: &Mount, opts: &[&str]) {
        let dest = m.destination();
        let Some(source) = m.source() else {
            return self.refuse(format!("the bind at {} has no source", dest.display()));
        };
        let writable = !opts.contains(&"ro");
        match self.node.bind_source(source) {
            None => self.refuse(format!(
                "a bind of {} at {}: the source is outside the node's bind_sources",
                source.display(),
                dest.display()
            )),
            Some(allowed) if writable && !allowed.writable => self.refuse(format!(
                "a writable bind of {} at {}: the node allows only read-only binds from {} (mount it ro)",
                source.display(),
                dest.display(),
                allowed.path.display()
            )),
            Some(_) => self.plan.binds.push(Bind { source: source.clone(), dest: dest.clone(), writable }),
        }
    }

    fn linux(&mut self, spec: &Spec) {
        let Some(linux) = spec.linux() else { return self.refuse("the config has no linux section") };
        let mut have = std::collections::BTreeSet::new();
        for ns in linux.namespaces().iter().flatten() {
            let kind = ns.typ();
            have.insert(kind.to_string());
            match (kind, ns.path()) {
                (LinuxNamespaceType::User, _) => self.refuse("a user namespace: chio does not map user ids"),
                (LinuxNamespaceType::Time, _) => self.refuse("a time namespace is not supported"),
                (LinuxNamespaceType::Network, Some(p)) => match is_hosts_namespace(p, "net") {
                    Ok(false) => self.netns = Some(p.clone()),
                    Ok(true) => self.refuse(format!("the network namespace {} is the host's", p.display())),
                    Err(e) => self.refuse(format!("the network namespace {}: {e}", p.display())),
                },
                (LinuxNamespaceType::Ipc | LinuxNamespaceType::Uts, Some(p)) => {
                    let name = kind.to_string();
                    match is_hosts_namespace(p, &name) {
                        Ok(false) => self.plan.join.push((name, p.clone())),
                        Ok(true) => self.refuse(format!("the {name} namespace {} is the host's", p.display())),
                        Err(e) => self.refuse(format!("the {name} namespace {}: {e}", p.display())),
                    }
                }
                (_, Some(p)) => {
                    self.refuse(format!("joining the {kind} namespace {} is not supported yet", p.display()))
                }
                (_, None) => {}
            }
        }
        for need in ["pid", "mnt", "net", "ipc", "uts"] {
            if !have.contains(need) {
                self.refuse(format!("no {need} namespace: the container would share the host's"));
            }
        }
        if linux.uid_mappings().as_ref().is_some_and(|m| !m.is_empty()) {
            self.refuse("uid mappings: chio does not map user ids");
        }
        if linux.sysctl().as_ref().is_some_and(|s| !s.is_empty()) {
            self.refuse("sysctl: chio sets no kernel parameters for a container");
        }
        if linux.devices().as_ref().is_some_and(|d| !d.is_empty()) {
            self.refuse(
                "linux.devices: the cage's /dev holds only null, zero, full, random, urandom and tty of its own",
            );
        }
        if let Some(r) = linux.resources() {
            let l = &mut self.plan.limits;
            if let Some(limit) = r.memory().as_ref().and_then(|m| m.limit()).filter(|v| *v > 0) {
                l.memory_bytes = Some(l.memory_bytes.map_or(limit as u64, |c| c.min(limit as u64)));
            }
            if let Some(limit) = r.pids().as_ref().map(|p| p.limit()).filter(|v| *v > 0) {
                l.pids = Some(l.pids.map_or(limit as u64, |c| c.min(limit as u64)));
            }
            if let Some(cpu) = r.cpu() {
                if let (Some(q), Some(p)) = (cpu.quota().filter(|q| *q > 0), cpu.period().filter(|p| *p > 0)) {
                    let millis = (q as u64).saturating_mul(1000) / p;
                    l.cpu_millis = Some(l.cpu_millis.map_or(millis, |c| c.min(millis)));
                }
            }
        }
        // The engine's place for the container's cgroup (the cage checks it is plain names).
        self.plan.cgroup_path = linux.cgroups_path().clone();
        if let Some(s) = linux.seccomp() {
            match super::profile::translate(s) {
                Ok(t) => {
                    let stacked = t.profile.as_ref().map_or(0, |p| p.rules.len());
                    self.plan.syscall_profile = t.profile;
                    let mut what = match self.plan.syscall_profile {
                        Some(_) => format!(
                            "the config's profile ({stacked} rules) is stacked under chio's allow-list: the \
                             stricter answer holds for every call"
                        ),
                        None => "the config's profile allows every call: chio's own allow-list applies".into(),
                    };
                    for n in t.notes {
                        what.push_str("; ");
                        what.push_str(&n);
                    }
                    self.note("seccomp", what);
                }
                Err(why) => self.refused.extend(why),
            }
        }
        // Hidden and read-only paths only ever take access away: applied as asked (a path the
        // root lacks is skipped, as runc skips it).
        self.plan.masked = linux.masked_paths().iter().flatten().map(PathBuf::from).collect();
        self.plan.read_only = linux.readonly_paths().iter().flatten().map(PathBuf::from).collect();
    }
}

/// `size=` of a tmpfs's options, in bytes (k, m, g suffixes).
fn size_of(opts: &[&str]) -> Option<u64> {
    let v = opts.iter().find_map(|o| o.strip_prefix("size="))?;
    let (num, mult) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 1 << 10),
        'm' | 'M' => (&v[..v.len() - 1], 1 << 20),
        'g' | 'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok().map(|n| n.saturating_mul(mult))
}

/// Whether this process holds CAP_SYS_RESOURCE in its effective set.
fn holds_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff =
        status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|h| u64::from_str_radix(h.trim(), 16).ok());
    // CAP_SYS_RESOURCE is capability 24.
    eff.is_some_and(|e| e & (1 << 24) != 0)
}

/// Whether the namespace file at `path` is the host's own namespace of `kind` (this process's).
fn is_hosts_namespace(path: &Path, kind: &str) -> std::io::Result<bool> {
    let theirs = std::fs::metadata(path)?;
    let ours = std::fs::metadata(format!("/proc/self/ns/{kind}"))?;
    Ok((theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(edit: impl FnOnce(&mut serde_json::Value)) -> (tempdir::Dir, Result<Translated, Vec<String>>) {
        let dir = tempdir::Dir::new();
        std::fs::create_dir(dir.0.join("rootfs")).unwrap();
        let mut v = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/true"], "env": ["PATH=/bin"], "cwd": "/",
                "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"]}},
            "root": {"path": "rootfs", "readonly": true},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["size=65536k"]},
                {"destination": "/sys", "type": "sysfs", "source": "sysfs"}
            ],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                {"type": "network"}]},
            "annotations": {"io.kubernetes.pod.name": "web"},
            "hostname": "web-0"
        });
        edit(&mut v);
        std::fs::write(dir.0.join("config.json"), v.to_string()).unwrap();
        let t = translate("c1", &dir.0, &NodeConfig::default());
        (dir, t)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!(
                    "chio-oci-bundle-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn an_ordinary_container_becomes_a_detached_plan() {
        let (dir, t) = config(|_| {});
        let t = t.unwrap();
        assert!(t.plan.detached);
        assert_eq!(t.plan.hostname.as_deref(), Some("web-0"));
        assert_eq!(t.plan.root, RootSpec::Directory(dir.0.join("rootfs")));
        assert_eq!(t.plan.argv, vec![OsString::from("/bin/true")]);
        assert_eq!(t.plan.tmpfs, vec![Tmpfs { dest: "/run".into(), bytes: 64 << 20 }]);
        assert_eq!(t.plan.annotations["oci.annotation.io.kubernetes.pod.name"], "web");
        assert_eq!(t.plan.annotations["oci.dropped.capabilities"], "CAP_CHOWN,CAP_KILL: the cage's process holds none");
        assert!(t.plan.annotations.contains_key("oci.not_mounted.sys"));
        for v in ["1.0.2", "1.2.0", "1.1.0-rc.1", "1.0.2-dev"] {
            let (_dir, t) = config(|c| c["ociVersion"] = v.into());
            assert!(t.is_ok(), "{v}");
        }
    }

    /// Every kind of asking for more is refused with its reason.
    #[test]
    fn what_the_node_refuses_is_named() {
        type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("root.readonly", Box::new(|v| v["root"]["readonly"] = false.into())),
            (
                "no net namespace",
                Box::new(|v| v["linux"]["namespaces"].as_array_mut().unwrap().pop().map(drop).unwrap()),
            ),
            ("CAP_SYS_ADMIN", Box::new(|v| v["process"]["capabilities"]["bounding"][0] = "CAP_SYS_ADMIN".into())),
            (
                "outside the node's bind_sources",
                Box::new(|v| {
                    v["mounts"].as_array_mut().unwrap().push(serde_json::json!(
                    {"destination": "/host", "type": "bind", "source": "/etc", "options": ["rbind", "ro"]}))
                }),
            ),
            ("hooks", Box::new(|v| v["hooks"] = serde_json::json!({"prestart": [{"path": "/bin/true"}]}))),
            (
                "user namespace",
                Box::new(|v| {
                    v["linux"]["namespaces"].as_array_mut().unwrap().push(serde_json::json!({"type": "user"}))
                }),
            ),
            ("is the host's", Box::new(|v| v["linux"]["namespaces"][4]["path"] = "/proc/self/ns/net".into())),
            ("\"invalid\" is not a 1.x.y", Box::new(|v| v["ociVersion"] = "invalid".into())),
            ("\"2.0.0\" is not a 1.x.y", Box::new(|v| v["ociVersion"] = "2.0.0".into())),
            ("\"1.0\" is not a 1.x.y", Box::new(|v| v["ociVersion"] = "1.0".into())),
        ];
        for (want, edit) in cases {
            let (_dir, t) = config(edit);
            let why = t.unwrap_err().join("; ");
            assert!(why.contains(want), "{want}: {why}");
        }
    }
}
