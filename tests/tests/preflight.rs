//! `chio security preflight` on this host: the platform with its trial cage, the bearer roles'
//! tokens, the launch material (all six parts or none, admitted as a launch would be, a trial
//! launch to the exec observation, shadow mode), and receipt stores (absent, foreign, corrupt,
//! healthy) — each finding's severity and the exit status of the worst.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chio_tests::{chio_bin, copy_executable, privileged, signed_launch, signed_launch_on, Scratch, SignedLaunch};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn preflight(args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    preflight_under(&[], args, env)
}

/// `chio security preflight --json ARGS` run by `wrapper` (a program and its arguments, which
/// end by running the rest of its command line).
fn preflight_under(wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> (i32, Value) {
    let chio = chio_bin(&PathBuf::from(PROBE));
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&chio);
            c
        }
        None => Command::new(&chio),
    };
    let out: Output = cmd
        .args(["security", "preflight", "--json"])
        .args(args)
        .env_remove("CHIO_AUTH_TOKEN")
        .env_remove("CHIO_ADMIN_TOKEN")
        .env_remove("CHIO_CONTROL_TOKEN")
        .env_remove("CHIO_REMOTE_AUTHORITY_WORKLOAD_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap(), v)
}

fn finding<'a>(doc: &'a Value, probe: &str) -> &'a Value {
    doc["findings"].as_array().unwrap().iter().find(|f| f["probe"] == probe).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_platform_and_the_bearer_roles() {
    if !privileged("preflight_platform") {
        return;
    }
    let (code, doc) = preflight(&["--require-enforcement"], &[]);
    assert_eq!(code, 0, "{doc}");
    let platform = finding(&doc, "security.platform");
    assert_eq!(platform["severity"], "ok", "{platform}");
    assert_eq!(platform["context"]["trial_launch"], "FullyEnforced");
    assert_eq!(platform["context"]["cgroup_controllers_missing"], "[]");
    let probes: Vec<&str> = doc["findings"].as_array().unwrap().iter().map(|f| f["probe"].as_str().unwrap()).collect();
    assert_eq!(
        probes,
        ["security.platform", "security.bearer_roles", "security.native_launch", "security.durable_stores"]
    );
    assert_eq!(finding(&doc, "security.bearer_roles")["severity"], "info", "none set");

    let (code, doc) = preflight(&[], &[("CHIO_AUTH_TOKEN", "t-1"), ("CHIO_CONTROL_TOKEN", "t-2")]);
    assert_eq!((code, &finding(&doc, "security.bearer_roles")["severity"]), (0, &Value::from("ok")));
    for (env, why) in [
        (&[("CHIO_AUTH_TOKEN", "same"), ("CHIO_ADMIN_TOKEN", "same")][..], "share one value"),
        (&[("CHIO_CONTROL_TOKEN", "tok\n")][..], "padded"),
        (&[("CHIO_REMOTE_AUTHORITY_WORKLOAD_TOKEN", "")][..], "empty"),
    ] {
        let (code, doc) = preflight(&[], env);
        let f = finding(&doc, "security.bearer_roles");
        assert_eq!((code, &f["severity"]), (1, &Value::from("error")), "{f}");
        assert!(f["summary"].as_str().unwrap().contains(why), "{f}");
        assert!(!doc.to_string().contains("same") && !doc.to_string().contains("tok\\n"), "a token was printed");
    }
}

/// Each call a launch makes is asked of the kernel: under a filter that makes one of them fail
/// with ENOSYS (a kernel without it, as far as chio can tell) the platform is fatal and the
/// finding names it. The control: a filter that takes nothing a launch needs is a warning (chio
/// is itself filtered), and the trial cage still reaches FullyEnforced.
#[test]
fn a_kernel_without_a_call_the_launch_makes_is_fatal() {
    if !privileged("preflight_syscalls") {
        return;
    }
    let f = |nr: &str| {
        let (code, doc) = preflight_under(&[PROBE, "without", nr], &[], &[]);
        (code, finding(&doc, "security.platform").clone())
    };
    for (nr, name, key) in [
        (libc::SYS_openat2, "openat2", "openat2"),
        (libc::SYS_pidfd_open, "pidfd_open", "pidfd_open"),
        (libc::SYS_close_range, "close_range", "close_range"),
        (libc::SYS_execveat, "execveat(AT_EMPTY_PATH)", "execveat_empty_path"),
    ] {
        let (code, p) = f(&nr.to_string());
        assert_eq!((code, &p["severity"]), (2, &Value::from("fatal")), "{name}: {p}");
        assert_eq!(p["summary"], format!("{name} is not available: a launch needs it"), "{p}");
        assert_eq!(p["context"][key], "no", "{p}");
    }
    // A kernel without landlock, as far as chio can tell: ABI 0, below the floor (and no cage can
    // be built, so the trial is fatal too); the problem is in the document beside the summary.
    let (code, p) = f(&libc::SYS_landlock_create_ruleset.to_string());
    assert_eq!((code, &p["context"]["landlock_abi"]), (2, &Value::from("0")), "{p}");
    let problems = p["problems"].as_array().unwrap_or_else(|| panic!("{p}"));
    assert!(
        problems.iter().any(|x| x["summary"].as_str().unwrap().starts_with("landlock ABI 0: enforced launches need 4")),
        "{p}"
    );
    let (code, p) = f(&libc::SYS_acct.to_string());
    assert_eq!((code, &p["severity"]), (0, &Value::from("warning")), "{p}");
    assert!(p["summary"].as_str().unwrap().contains("runs under a seccomp filter"), "{p}");
    assert_eq!(
        (&p["context"]["seccomp_mode_of_chio"], &p["context"]["trial_launch"]),
        (&"2".into(), &"FullyEnforced".into())
    );
}

/// `sh -c SCRIPT` in a mount namespace of its own, then the rest of the command line.
fn in_private_mounts(script: &str) -> Vec<String> {
    ["unshare", "-m", "--propagation", "private", "sh", "-c", &format!("set -e\n{script}\nexec \"$@\""), "sh"]
        .map(String::from)
        .to_vec()
}

/// The cgroup check judges the controllers as a launch does. On v1 a directory named for a
/// controller is not its hierarchy (a tmpfs over /sys/fs/cgroup with three plain directories:
/// all three missing, where a check of the names alone found none); on v2 it looks at the root
/// the launches use (`CHIO_CGROUP_V2_ROOT`, a private cgroup2 mount here) and what its parent
/// offers.
#[test]
fn cgroups_are_judged_as_a_launch_judges_them() {
    if !privileged("preflight_cgroups") {
        return;
    }
    let platform = |script: &str, env: &[(&str, &str)]| {
        let wrapper = in_private_mounts(script);
        let (code, doc) = preflight_under(&wrapper.iter().map(String::as_str).collect::<Vec<_>>(), &[], env);
        (code, finding(&doc, "security.platform").clone())
    };
    let (code, p) = platform(
        "mount -t tmpfs none /sys/fs/cgroup\nmkdir /sys/fs/cgroup/memory /sys/fs/cgroup/pids /sys/fs/cgroup/cpu",
        &[],
    );
    assert_eq!(code, 2, "the trial cage cannot make its cgroup: {p}");
    assert_eq!(
        (&p["context"]["cgroup"], &p["context"]["cgroup_controllers_missing"]),
        (&"v1".into(), &r#"["memory", "pids", "cpu"]"#.into()),
        "{p}"
    );

    // The cgroup2 hierarchy is one per host: this run's launch root is named for its scratch
    // directory, and must be empty again when preflight is done (its rmdir says so).
    let mnt = Scratch::new("preflight-cg2");
    let sub = mnt.0.file_name().unwrap().to_str().unwrap().to_string();
    let script = "set -e\nmount -t cgroup2 none \"$1\"\nmkdir \"$1/$2\"\ncat \"$1/cgroup.controllers\" >&2\n\
                  r=\"$1/$2\"\nshift 2\ncode=0\nCHIO_CGROUP_V2_ROOT=\"$r\" \"$@\" || code=$?\nrmdir \"$r\"\n\
                  echo REMOVED >&2\nexit $code";
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh", s(&mnt.0), &sub])
        .arg(chio_bin(&PathBuf::from(PROBE)))
        .args(["security", "preflight", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let p = finding(&doc, "security.platform");
    let offered = stderr.lines().next().unwrap_or_default().trim().to_string();
    let missing: Vec<&str> =
        ["memory", "pids", "cpu"].into_iter().filter(|c| !offered.split(' ').any(|o| o == *c)).collect();
    assert!(!missing.is_empty(), "this test needs a cgroup2 root without the ceilings' controllers: {offered}");
    assert_eq!(p["context"]["cgroup"], "v2", "{p}");
    assert_eq!(p["context"]["cgroup_root"], format!("{}/{sub}", s(&mnt.0)), "{p}");
    assert_eq!(p["context"]["cgroup_controllers"], offered.as_str(), "{p}");
    assert_eq!(p["context"]["cgroup_controllers_missing"], format!("{missing:?}"), "{p}");
    assert!(p["severity"] != "ok" && out.status.code() != Some(0), "{p}");
    let said = format!("cgroup v2 controllers {missing:?} are not delegated to {}", s(&mnt.0));
    assert!(p["problems"].as_array().unwrap().iter().any(|x| x["summary"] == said.as_str()), "{said}: {p}");
    assert!(stderr.contains("REMOVED"), "the trial left a cgroup in the launch root: {stderr}");
}

/// On cgroup v2 the platform probe says where launch cgroups go: inside the cgroup a service
/// manager delegated to chio (marked `trusted.delegate`, as systemd marks a `Delegate=yes`
/// unit's), under its `launches`; else under `/sys/fs/cgroup/chio`, with the note that this
/// process's own cgroup is not delegated. (A private cgroup2 mount over `/sys/fs/cgroup`; the
/// cgroup, named for this test's scratch directory, is removed afterwards.)
#[test]
fn where_v2_launch_cgroups_go_is_said() {
    if !privileged("preflight_delegated") {
        return;
    }
    let scratch = Scratch::new("preflight-deleg");
    let sub = scratch.0.file_name().unwrap().to_str().unwrap().to_string();
    // (marked delegated, chio moved into the cgroup first): a process left in the root cgroup
    // is no unit's, and is not warned about.
    for (marked, moved) in [(true, true), (false, true), (false, false)] {
        let enter = if moved { "echo 0 > \"$D/cgroup.procs\"; " } else { "" };
        let mark = if marked {
            r#"python3 -c 'import os, sys; os.setxattr(sys.argv[1], "trusted.delegate", b"1")' "$D""#
        } else {
            ":"
        };
        let script = format!(
            "mount -t cgroup2 none /sys/fs/cgroup\nD=/sys/fs/cgroup/{sub}\nmkdir \"$D\"\n{mark}\n\
             code=0\n({enter}exec \"$@\") || code=$?\n\
             find \"$D\" -depth -type d -exec rmdir {{}} +\nrmdir /sys/fs/cgroup/chio 2>/dev/null\nexit $code"
        );
        let wrapper = ["unshare", "-m", "--propagation", "private", "sh", "-c", &script, "sh"];
        let (_, doc) = preflight_under(&wrapper, &[], &[]);
        let p = finding(&doc, "security.platform");
        let unit = format!("/sys/fs/cgroup/{sub}");
        let (delegated, root) = if marked {
            (unit.clone(), format!("{unit}/launches"))
        } else {
            ("no".into(), "/sys/fs/cgroup/chio".into())
        };
        assert_eq!(p["context"]["cgroup"], "v2", "{p}");
        assert_eq!(
            (&p["context"]["cgroup_delegated"], &p["context"]["cgroup_root"]),
            (&delegated.into(), &root.into())
        );
        let warned = p["problems"].as_array().into_iter().flatten().any(|x| {
            x["summary"]
                .as_str()
                .unwrap()
                .starts_with("launch cgroups go under /sys/fs/cgroup/chio, outside this process's cgroup")
        });
        assert_eq!(warned, !marked && moved, "marked {marked}, moved {moved}: {p}");
    }
}

/// Yama's ptrace_scope 3 forbids ptrace altogether: fatal, since the exec observation is ptrace;
/// 2 (admin only) is what a root supervisor works under.
#[test]
fn ptrace_forbidden_by_yama_is_fatal() {
    if !privileged("preflight_yama") {
        return;
    }
    for (scope, code, severity) in [("3", 2, "fatal"), ("2", 0, "ok")] {
        // A tmpfs over /proc/sys/kernel holds this scope (and the one other file chio reads there).
        let script = format!(
            "cap=$(cat /proc/sys/kernel/cap_last_cap)\nmount -t tmpfs none /proc/sys/kernel\nmkdir /proc/sys/kernel/yama\n\
             echo {scope} > /proc/sys/kernel/yama/ptrace_scope\necho $cap > /proc/sys/kernel/cap_last_cap"
        );
        let wrapper = in_private_mounts(&script);
        let (got, doc) = preflight_under(&wrapper.iter().map(String::as_str).collect::<Vec<_>>(), &[], &[]);
        let p = finding(&doc, "security.platform");
        assert_eq!(
            (got, &p["severity"], &p["context"]["yama_ptrace_scope"]),
            (code, &severity.into(), &scope.into()),
            "{p}"
        );
        if scope == "3" {
            assert!(p["summary"].as_str().unwrap().contains("ptrace_scope is 3"), "{p}");
        }
    }
}

/// The six parts of launch material for `p` (its command is given after `--` by the caller).
fn material(p: &SignedLaunch, manifest_key: &Path, server: &str) -> Vec<String> {
    [
        "--signed-manifest",
        s(&p.manifest),
        "--manifest-public-key",
        s(manifest_key),
        "--cage-policy",
        s(&p.policy),
        "--cage-policy-signer",
        s(&p.operator),
        "--server-id",
        server,
    ]
    .iter()
    .map(|x| x.to_string())
    .collect()
}

#[test]
fn launch_material_is_all_or_nothing_and_loaded_as_a_launch() {
    if !privileged("preflight_launch") {
        return;
    }
    let argv = ["/probe", "euid"];
    let p = signed_launch(Path::new(PROBE), &argv, 65534, "enforced");
    let publisher = p.dir.join("publisher/public.key");
    let ours = |manifest_key: &Path, server: &str| material(&p, manifest_key, server);
    let run = |args: Vec<String>, command: &[&str], extra: &[&str]| {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.extend(extra);
        all.push("--");
        all.extend(command);
        preflight(&all, &[])
    };
    let (code, doc) = run(ours(&publisher, "probe"), &argv, &["--require-enforcement"]);
    let f = finding(&doc, "security.native_launch");
    assert_eq!((code, &f["severity"]), (0, &Value::from("ok")), "{f}");
    assert_eq!(f["context"]["trial_launch"], "FullyEnforced");

    // A partial set names what is missing.
    let (code, doc) = preflight(&["--cage-policy", s(&p.policy), "--server-id", "probe"], &[]);
    let f = finding(&doc, "security.native_launch");
    assert_eq!(code, 1);
    assert!(f["summary"].as_str().unwrap().contains("missing --signed-manifest, --manifest-public-key"), "{f}");
    // Each part is checked as a launch checks it.
    for (args, command, why) in [
        (ours(&publisher, "other"), &argv[..], "not --server-id"),
        (ours(&p.operator, "probe"), &argv[..], "not the pinned manifest key"),
        (ours(&publisher, "probe"), &["/probe", "egid"][..], "not the admitted argv"),
    ] {
        let (code, doc) = run(args, command, &[]);
        let f = finding(&doc, "security.native_launch");
        assert_eq!((code, &f["severity"]), (1, &Value::from("error")), "{why}: {f}");
        assert!(f["summary"].as_str().unwrap().contains(why), "{why}: {f}");
    }

    // Admitted, but this host cannot reach FullyEnforced for it (its root has no /probe): the
    // trial launch says so.
    let empty = Scratch::new("preflight-empty-root");
    let broken = signed_launch_on(Path::new(PROBE), &argv, 65534, "enforced", &empty.0);
    let args = material(&broken, &broken.dir.join("publisher/public.key"), "probe");
    let (code, doc) = run(args, &argv, &[]);
    let f = finding(&doc, "security.native_launch");
    assert_eq!(code, 1, "{f}");
    assert!(f["summary"].as_str().unwrap().contains("did not reach FullyEnforced: target_not_found"), "{f}");

    // A shadow policy: a warning, an error when enforcement is required.
    let shadow = signed_launch(Path::new(PROBE), &argv, 65534, "shadow");
    let args = material(&shadow, &shadow.dir.join("publisher/public.key"), "probe");
    let (code, doc) = run(args.clone(), &argv, &[]);
    assert_eq!((code, &finding(&doc, "security.native_launch")["severity"]), (0, &Value::from("warning")));
    let (code, doc) = run(args, &argv, &["--require-enforcement"]);
    assert_eq!((code, &finding(&doc, "security.native_launch")["severity"]), (1, &Value::from("error")));
}

#[test]
fn receipt_stores_absent_foreign_corrupt_and_healthy() {
    if !privileged("preflight_stores") {
        return;
    }
    let dir = Scratch::new("preflight-stores");
    let chio = chio_bin(&PathBuf::from(PROBE));
    let key = dir.join("key");
    assert!(Command::new(&chio).args(["keys", "generate", "--out", s(&key)]).output().unwrap().status.success());
    let healthy = dir.join("healthy.db");
    let seed = key.join("signing.seed");
    let out = Command::new(&chio)
        .args(["cage", "run", "--receipt-db", s(&healthy), "--kernel-key", s(&seed), "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, doc) = preflight(&["--receipt-db", s(&healthy)], &[]);
    let f = finding(&doc, "security.durable_stores");
    assert_eq!((code, &f["severity"]), (0, &Value::from("ok")), "{f}");
    assert!(f["context"][s(&healthy)].as_str().unwrap().starts_with("healthy"), "{f}");

    let foreign = dir.join("notes.txt");
    std::fs::write(&foreign, "not a database").unwrap();
    let corrupt = dir.join("corrupt.db");
    let mut bytes = std::fs::read(&healthy).unwrap();
    let page = 4096.min(bytes.len() / 2);
    for b in &mut bytes[page..] {
        *b = 0x5a;
    }
    std::fs::write(&corrupt, bytes).unwrap();
    // A store that opens but fails `quick_check`: an operation without the request digest its
    // schema requires, put there by loosening the schema, writing, and tightening it again.
    let forged = dir.join("forged.db");
    std::fs::copy(&healthy, &forged).unwrap();
    let sql = |path: &Path, script: &str| {
        let py =
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nc.executescript(sys.argv[2])\nc.commit()\nc.close()";
        let out = Command::new("python3").args(["-c", py, s(path), script]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let schema = |from: &str, to: &str| {
        format!("PRAGMA writable_schema=ON; UPDATE sqlite_schema SET sql=replace(sql, '{from}', '{to}') WHERE name='operations';")
    };
    sql(&forged, &schema("request_sha256 TEXT NOT NULL", "request_sha256 TEXT"));
    sql(&forged, "INSERT INTO operations VALUES ('k', NULL, 'pending', NULL, 1);");
    sql(&forged, &schema("request_sha256 TEXT", "request_sha256 TEXT NOT NULL"));
    // A store moved out of WAL works, but not as chio writes it: a warning.
    let rollback = dir.join("rollback.db");
    std::fs::copy(&healthy, &rollback).unwrap();
    sql(&rollback, "PRAGMA journal_mode=DELETE;");
    let (code, doc) = preflight(&["--receipt-db", s(&rollback)], &[]);
    let f = finding(&doc, "security.durable_stores");
    assert_eq!((code, &f["severity"]), (0, &Value::from("warning")), "{f}");
    assert!(f["context"][s(&rollback)].as_str().unwrap().contains("journal mode delete"), "{f}");
    // A store not made yet (a fresh install): news when only root can write its directory, an
    // error when the directory is missing or others could put a store there first.
    let (code, doc) = preflight(&["--receipt-db", s(&dir.join("new.db"))], &[]);
    let f = finding(&doc, "security.durable_stores");
    assert_eq!((code, &f["severity"]), (0, &Value::from("info")), "{f}");
    assert!(f["context"][s(&dir.join("new.db"))].as_str().unwrap().starts_with("new: not created yet"), "{f}");
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    for (path, why) in [
        (dir.join("no-dir/absent.db"), "absent, and so is its directory"),
        (shared.join("absent.db"), "absent, and its directory"),
        (foreign.join("x.db"), "unreadable: Not a directory"),
        (forged, "corrupt: quick_check says NULL value in operations.request_sha256"),
        (dir.0.clone(), "not a regular file"),
        (foreign.clone(), "unreadable or foreign"),
        (corrupt, "corrupt"),
    ] {
        let (code, doc) = preflight(&["--receipt-db", s(&path)], &[]);
        let f = finding(&doc, "security.durable_stores");
        assert_eq!((code, &f["severity"]), (1, &Value::from("error")), "{why}: {f}");
        assert!(f["context"][s(&path)].as_str().unwrap().starts_with(why), "{why}: {f}");
    }
    // A service's session store (`--session-db`), checked like a receipt store but for its
    // schema: an SQLite database that passes quick_check, new in a directory only root can
    // write, and not a text file or a corrupt one.
    let session = dir.join("session.db");
    sql(&session, "PRAGMA journal_mode=WAL; CREATE TABLE sessions (id TEXT PRIMARY KEY, data BLOB);");
    let mut broken = std::fs::read(&session).unwrap();
    let half = broken.len() / 2;
    for b in &mut broken[half.min(4096)..] {
        *b = 0x5a;
    }
    let broken_db = dir.join("broken-session.db");
    std::fs::write(&broken_db, broken).unwrap();
    for (path, severity, why) in [
        (session.clone(), "ok", "healthy session store (journal wal"),
        (dir.join("new-session.db"), "info", "new: not created yet; its service creates it"),
        (foreign.clone(), "error", "unreadable or not SQLite"),
        (dir.join("no-dir/session.db"), "error", "absent, and so is its directory"),
    ] {
        let (code, doc) = preflight(&["--session-db", s(&path)], &[]);
        let f = finding(&doc, "security.durable_stores");
        assert_eq!(&f["severity"], &Value::from(severity), "{why}: {f}");
        assert_eq!(code, if severity == "error" { 1 } else { 0 }, "{f}");
        assert!(f["context"][s(&path)].as_str().unwrap().starts_with(why), "{why}: {f}");
    }
    let (code, doc) = preflight(&["--session-db", s(&broken_db)], &[]);
    assert_eq!(code, 1, "a corrupt session store: {doc}");
    // A lesser problem beside a worse is still said: the warning of the store moved out of WAL
    // next to an absent store's error, in the document and in the text.
    let absent = dir.join("no-dir/absent.db");
    let both = ["--receipt-db", s(&absent), "--receipt-db", s(&rollback)];
    let (code, doc) = preflight(&both, &[]);
    let f = finding(&doc, "security.durable_stores");
    assert_eq!((code, &f["severity"]), (1, &Value::from("error")), "{f}");
    assert!(f["summary"].as_str().unwrap().starts_with(&format!("{}: absent", s(&absent))), "{f}");
    let warned = f["problems"].as_array().unwrap().iter().any(|p| {
        p["severity"] == "warning" && p["summary"].as_str().unwrap().starts_with(&format!("{}: ", s(&rollback)))
    });
    assert!(warned, "{f}");
    let text = Command::new(&chio).args(["security", "preflight"]).args(both).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("also warning: {}: ", s(&rollback))), "{text}");
}

/// As a user other than root, preflight checks what it can — the kernel's mechanisms, the
/// launch material's signatures and admission — and says which probe needs root, a warning
/// with exit 0, not a fatal error; as root without the capabilities (a unit's bounding set) the
/// trial still fails, fatal, as every launch would.
#[test]
fn unprivileged_preflight_says_what_needs_root() {
    if !privileged("preflight_unprivileged") {
        return;
    }
    // A copy of chio the user can reach whatever the checkout's directories allow.
    let dir = Scratch::new("preflight-nobody");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let copy = dir.join("chio");
    let chio = chio_bin(&PathBuf::from(PROBE));
    copy_executable(&chio, &copy);
    copy_executable(&chio.with_file_name("chio-full"), &dir.join("chio-full"));
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&copy)
        .args(["security", "preflight", "--json", "--require-enforcement"])
        .env_remove("CHIO_AUTH_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let code = out.status.code().unwrap();
    let platform = finding(&doc, "security.platform");
    assert_eq!((code, &platform["severity"]), (0, &Value::from("warning")), "{platform}");
    assert_eq!(platform["context"]["trial_launch"], "not run: needs root");
    let said = platform["summary"].as_str().unwrap();
    assert!(said.contains("not proven as uid 65534") && said.contains("CAP_SYS_ADMIN"), "{said}");
    assert_eq!(platform["context"]["landlock_abi"].as_str().map(|a| a.parse::<u32>().unwrap() >= 4), Some(true));
    // Root without the capabilities a cage needs: the trial runs and fails, fatal.
    let dropped = ["setpriv", "--inh-caps=-all", "--bounding-set=-sys_admin"];
    let (code, doc) = preflight_under(&dropped, &[], &[]);
    let platform = finding(&doc, "security.platform");
    assert_eq!((code, &platform["severity"]), (2, &Value::from("fatal")), "{platform}");
}
