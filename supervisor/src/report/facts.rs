//! The enforcement facts of a launch record an auditor looks for, each marked as observed by
//! the supervisor from `/proc` or reported by the cage's own code (the record keeps the two
//! apart, and so does the page), and whether it holds as a `FullyEnforced` launch needs.

use chio_cage::LaunchRecord;

/// One fact of a launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// What it is about (`namespaces`, `capabilities`, ...).
    pub name: &'static str,
    /// What the record says, in words.
    pub value: String,
    /// `observed` (read from `/proc` at the exec stop) or `reported` (by the cage's code).
    pub source: &'static str,
    /// It holds as an enforced launch needs.
    pub holds: bool,
}

fn fact(name: &'static str, source: &'static str, holds: bool, value: String) -> Fact {
    Fact { name, value, source, holds }
}

/// The facts of `rec` (none for a launch that failed before its exec stop).
pub fn of(rec: &LaunchRecord) -> Vec<Fact> {
    let mut facts = Vec::new();
    if let Some(t) = &rec.target {
        let interpreter = t.interpreter.as_ref().map(|i| format!(" via {} sha256:{}", i.path, i.sha256));
        facts.push(fact(
            "executable",
            "observed",
            !t.sha256.is_empty(),
            format!("{} sha256:{}{}", t.path, t.sha256, interpreter.unwrap_or_default()),
        ));
    }
    let Some(o) = &rec.observed else { return facts };
    let own: Vec<&str> = o.namespaces.iter().filter(|(_, n)| n.cage != n.host).map(|(k, _)| k.as_str()).collect();
    let shared: Vec<&str> = o.namespaces.iter().filter(|(_, n)| n.cage == n.host).map(|(k, _)| k.as_str()).collect();
    let ns = if shared.is_empty() {
        format!("its own {}", own.join(", "))
    } else {
        format!("its own {}; the host's {}", own.join(", "), shared.join(", "))
    };
    facts.push(fact("namespaces", "observed", shared.is_empty() && !own.is_empty(), ns));
    let held: Vec<&str> =
        o.capabilities.iter().filter(|(_, v)| !v.trim_start_matches('0').is_empty()).map(|(k, _)| k.as_str()).collect();
    let caps = if held.is_empty() {
        format!("none ({} sets empty)", o.capabilities.len())
    } else {
        format!("held in {}", held.join(", "))
    };
    facts.push(fact("capabilities", "observed", held.is_empty() && o.capabilities.len() == 5, caps));
    facts.push(fact(
        "no_new_privs",
        "observed",
        o.no_new_privs == 1,
        if o.no_new_privs == 1 { "set".into() } else { "not set".into() },
    ));
    facts.push(fact(
        "seccomp",
        "observed",
        o.seccomp == 2 && o.seccomp_filters > o.seccomp_filters_inherited,
        format!("mode {} with {} filter(s), {} inherited", o.seccomp, o.seccomp_filters, o.seccomp_filters_inherited),
    ));
    let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join("/");
    facts.push(fact(
        "identity",
        "observed",
        !o.uids.contains(&0) && !o.gids.contains(&0),
        format!("uid {} gid {}", ids(&o.uids), ids(&o.gids)),
    ));
    facts.push(fact(
        "init",
        "observed",
        o.status_channel_eof && o.init.no_new_privs == 1 && o.init.seccomp == 2 && !o.init.uids.contains(&0),
        format!("state {}, uid {}, seccomp mode {}", o.init.state, ids(&o.init.uids), o.init.seccomp),
    ));
    if let Some(c) = &rec.cgroup {
        facts.push(fact(
            "cgroup",
            "observed",
            !c.paths.is_empty(),
            format!("{} ({} dir(s))", c.version, c.paths.len()),
        ));
    }
    if let Some(r) = &rec.reported {
        let ok = |s: &str| s == "FullyEnforced";
        facts.push(fact(
            "landlock",
            "reported",
            ok(&r.landlock_fs) && ok(&r.landlock_net) && ok(&r.landlock_scope),
            format!("ABI {}: fs {}, net {}, scope {}", r.landlock_abi, r.landlock_fs, r.landlock_net, r.landlock_scope),
        ));
        facts.push(fact(
            "seccomp_filter",
            "reported",
            !r.seccomp_filter_sha256.is_empty(),
            r.seccomp_filter_sha256.clone(),
        ));
    }
    let limits = &rec.limits;
    let or_none = |v: Option<u64>, unit: &str| v.map_or_else(|| "none".to_string(), |v| format!("{v}{unit}"));
    facts.push(fact(
        "limits",
        "plan",
        true,
        format!(
            "memory {}, pids {}, cpu {}, wall {} ms, network {:?}",
            or_none(limits.memory_bytes, " B"),
            or_none(limits.pids, ""),
            or_none(limits.cpu_millis, " m"),
            limits.wall_ms,
            rec.net
        )
        .to_lowercase(),
    ));
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the cage writes it at an exec stop (trimmed to what the facts read).
    fn record(edit: impl FnOnce(&mut serde_json::Value)) -> LaunchRecord {
        let mut v = serde_json::json!({
            "schema": "chio.cage.launch-record.v1", "state": "FullyEnforced", "mode": "enforced",
            "not_confined": [], "failure": null, "argv": ["/bin/true"],
            "target": {"path": "/bin/true", "sha256": "ab", "device": "1", "inode": "2"},
            "observed": {
                "pid": 9, "exe_device": "1", "exe_inode": "2", "no_new_privs": 1, "seccomp": 2,
                "seccomp_filters": 1, "seccomp_filters_inherited": 0,
                "capabilities": {"CapAmb": "0", "CapBnd": "0", "CapEff": "0", "CapInh": "0", "CapPrm": "0"},
                "uids": [65534, 65534, 65534, 65534], "gids": [65534, 65534, 65534, 65534], "groups": [],
                "namespaces": {"net": {"cage": "net:[2]", "host": "net:[1]"}, "pid": {"cage": "pid:[4]", "host": "pid:[3]"}},
                "cgroup": "", "fds": [0, 1, 2], "cwd": "/", "status_channel_eof": true,
                "init": {"pid": 8, "state": "S", "uids": [65534], "gids": [65534], "capabilities": {},
                         "no_new_privs": 1, "seccomp": 2, "seccomp_filters": 1}
            },
            "reported": {
                "landlock_abi": 7, "landlock_fs": "FullyEnforced", "landlock_net": "FullyEnforced",
                "landlock_scope": "FullyEnforced", "seccomp_filter_sha256": "cd", "capabilities_cleared": true,
                "securebits": 239, "proc_verified": true, "loopback_up": false, "mounts": []
            },
            "namespaces": ["net", "pid"], "net": "none", "cgroup": {"version": "v1", "paths": ["/sys/fs/cgroup/pids/chio-1"]},
            "limits": {"memory_bytes": 1024, "swap_bytes": 0, "pids": 64, "cpu_millis": null, "wall_ms": 1000,
                       "output_bytes": 1, "tmp_bytes": 1, "shm_bytes": 1, "nofile": 1, "fsize_bytes": 1,
                       "core_bytes": 0, "cpu_seconds": null, "address_space_bytes": null, "sigpending": 1,
                       "memlock_bytes": 1},
            "outcome": null, "started_at": "2026-12-06T00:00:00.000Z", "exec_observed_at": null,
            "ended_at": null, "timings_us": {}
        });
        edit(&mut v);
        serde_json::from_value(v).unwrap()
    }

    fn holds(facts: &[Fact], name: &str) -> bool {
        facts.iter().find(|f| f.name == name).unwrap().holds
    }

    #[test]
    fn each_fact_fails_when_its_observation_does() {
        let good = of(&record(|_| {}));
        assert!(good.iter().all(|f| f.holds), "{good:?}");
        let shared = of(&record(|v| v["observed"]["namespaces"]["net"]["cage"] = "net:[1]".into()));
        assert!(!holds(&shared, "namespaces"));
        assert!(shared.iter().any(|f| f.value.contains("the host's net")));
        assert!(!holds(
            &of(&record(|v| v["observed"]["capabilities"]["CapBnd"] = "0000000000000400".into())),
            "capabilities"
        ));
        assert!(!holds(&of(&record(|v| v["observed"]["no_new_privs"] = 0.into())), "no_new_privs"));
        assert!(!holds(&of(&record(|v| v["observed"]["seccomp_filters_inherited"] = 1.into())), "seccomp"));
        assert!(!holds(&of(&record(|v| v["observed"]["uids"][1] = 0.into())), "identity"));
        assert!(!holds(&of(&record(|v| v["observed"]["init"]["seccomp"] = 0.into())), "init"));
        assert!(!holds(&of(&record(|v| v["cgroup"]["paths"] = serde_json::json!([]))), "cgroup"));
        for class in ["landlock_fs", "landlock_net", "landlock_scope"] {
            assert!(!holds(&of(&record(|v| v["reported"][class] = "PartiallyEnforced".into())), "landlock"), "{class}");
        }
        assert!(!holds(&of(&record(|v| v["reported"]["seccomp_filter_sha256"] = "".into())), "seccomp_filter"));
        let value = |facts: &[Fact], name: &str| facts.iter().find(|f| f.name == name).unwrap().value.clone();
        assert_eq!(value(&good, "no_new_privs"), "set");
        assert_eq!(value(&of(&record(|v| v["observed"]["no_new_privs"] = 0.into())), "no_new_privs"), "not set");
        assert_eq!(good.len(), 11, "{good:?}");
        assert!(of(&record(|v| v["observed"] = serde_json::Value::Null)).iter().all(|f| f.name != "namespaces"));
    }
}
