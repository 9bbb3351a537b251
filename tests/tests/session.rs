//! Governed sessions end to end: the Python calculator task, with mini-swe-agent's real
//! DefaultAgent and LitellmModel in the worker's own cage (no network, no credential), the model
//! a scripted OpenAI-compatible provider on the host's loopback behind the session's gateway,
//! every command through the repository leg's socket; then the result verified and applied in a
//! recipient's checkout, and a rerun that makes no new model call and no new launch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chio_tests::{calculator_repo, chio_bin, git, privileged, skip, wait_gone, Scratch};
use serde_json::{json, Value};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");
const SECRET: &str = "sk-test-provider-credential-0123456789";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `chio ARGS`: a session step that has not ended in two minutes (a walkthrough's whole run takes
/// seconds) is a hang, and fails its test there rather than at the agent's wall time.
fn chio(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(chio_bin(&PathBuf::from(PROBE)));
    c.args(args).envs(env.iter().copied()).stdin(Stdio::null());
    chio_tests::run_within(&mut c, Duration::from_secs(120), &format!("chio {}", args.first().unwrap_or(&"")))
}

/// What the scripted provider saw: (Authorization header, request body) per call.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// An OpenAI-compatible provider on loopback. Its answer depends on the conversation, not on
/// how often it was called: step N (N tool results so far) gets a bash tool call running
/// `commands[N]`. While `hold` names a step, a call for that step is not answered.
struct Provider {
    url: String,
    seen: Seen,
    hold: Arc<Mutex<Option<usize>>>,
}

fn scripted_provider(commands: &'static [&'static str]) -> Provider {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let (seen, hold): (Seen, Arc<Mutex<Option<usize>>>) = Default::default();
    let (log, held) = (seen.clone(), hold.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (log, held) = (log.clone(), held.clone());
            std::thread::spawn(move || serve_provider(conn, commands, &log, &held));
        }
    });
    Provider { url, seen, hold }
}

/// The steps the provider was asked for, in order.
fn steps(seen: &Seen) -> Vec<usize> {
    seen.lock().unwrap().iter().map(|(_, body)| step_of(body)).collect()
}

fn step_of(body: &str) -> usize {
    let v: Value = serde_json::from_str(body).unwrap();
    v["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "tool").count()
}

fn serve_provider(conn: TcpStream, commands: &[&str], log: &Mutex<Vec<(String, String)>>, hold: &Mutex<Option<usize>>) {
    let mut out = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let (mut auth, mut length) = (String::new(), 0usize);
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            match k.to_ascii_lowercase().as_str() {
                "authorization" => auth = v.trim().to_string(),
                "content-length" => length = v.trim().parse().unwrap(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body).unwrap();
        let body = String::from_utf8_lossy(&body).into_owned();
        let n = step_of(&body);
        log.lock().unwrap().push((auth, body));
        while *hold.lock().unwrap() == Some(n) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let command = commands.get(n).copied().unwrap_or("echo the script is over");
        let answer = json!({
            "id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": format!("step {n}"),
                "tool_calls": [{"id": format!("call_{n}"), "type": "function",
                    "function": {"name": "bash", "arguments": json!({"command": command}).to_string()}}]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        })
        .to_string();
        let head =
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", answer.len());
        if out.write_all(head.as_bytes()).and_then(|_| out.write_all(answer.as_bytes())).is_err() {
            return;
        }
    }
}

const FIX: &[&str] = &[
    "cd package && python3 -m unittest",
    "sed -i 's/return a - b/return a + b  # fixed/' package/calc.py",
    "cd package && python3 -m unittest",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
];

/// The venv holding mini-swe-agent (`.ci/run` makes it), or None (skipped, failing under CI).
fn venv() -> Option<(PathBuf, PathBuf)> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let python = std::env::var_os("CHIO_MSA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/msa-venv/bin/python"));
    if !python.exists() {
        skip("session", &format!("{} is missing (run .ci/run, or set CHIO_MSA_PYTHON)", python.display()));
        return None;
    }
    Some((python, repo.join("packaging/mini-swe-agent")))
}

/// A session over `repo`'s `package/`; `extra` fields (an image, scratch paths) replace the defaults.
fn session_config(repo: &Path, url: &str, python: &Path, package: &Path, extra: &Value) -> Value {
    let venv = python.parent().unwrap().parent().unwrap();
    // The interpreter behind the venv (pyenv's, say) must be in the worker's root too.
    let real = std::fs::canonicalize(python).unwrap();
    let prefix = real.parent().unwrap().parent().unwrap().to_path_buf();
    let mut read_only = vec![venv.to_path_buf(), package.to_path_buf()];
    if !prefix.starts_with("/usr") {
        read_only.push(prefix);
    }
    let mut c = json!({
        "schema": "chio.session.v1",
        "repository": repo, "revision": "HEAD", "source_paths": ["package"],
        "scratch_paths": ["package/__pycache__"],
        "command_timeout_s": 60,
        "agent": {"step_limit": 8, "wall_time_s": 240},
        "model": {"name": "scripted", "base_url": url, "credential_env": "CHIO_TEST_PROVIDER_KEY"},
        "worker": {"python": python, "read_only_paths": read_only, "env": {"PYTHONPATH": package}}
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// Nothing runs before an admitted authorization: init writes a request that grants nothing; a
/// stranger's signature is refused; a run without the credential is refused.
#[test]
fn a_session_runs_nothing_until_the_operator_authorizes_its_exact_request() {
    if !privileged("session_refusals") {
        return;
    }
    let Some((python, package)) = venv() else { return };
    let dir = Scratch::new("session-refusals");
    let repo = calculator_repo(&dir.0);
    for who in ["kernel", "operator", "stranger"] {
        assert!(chio(&["keys", "generate", "--out", s(&dir.join(who))], &[]).status.success());
    }
    let provider = scripted_provider(FIX);
    let (config, task, state) = (dir.join("session.json"), dir.join("issue.md"), dir.join("state"));
    std::fs::write(&config, session_config(&repo, &provider.url, &python, &package, &json!({})).to_string()).unwrap();
    std::fs::write(&task, "fix add\n").unwrap();
    let init = ["session", "init", "--config", s(&config), "--task-file", s(&task), "--state", s(&state)];
    assert_eq!(chio(&init, &[]).status.code(), Some(2), "--kernel-key is required");
    // A worker path that is not there cannot be bound: refused at init, before anyone signs.
    let absent = dir.join("no-such-venv");
    let mut c = session_config(&repo, &provider.url, &python, &package, &json!({}));
    c["worker"]["read_only_paths"].as_array_mut().unwrap().push(json!(absent));
    let bad = dir.join("absent-path.json");
    std::fs::write(&bad, c.to_string()).unwrap();
    let (seed, bad_state) = (dir.join("kernel/signing.seed"), dir.join("bad-state"));
    let key = ["--kernel-key", s(&seed)];
    let out = chio(
        &[&["session", "init", "--config", s(&bad), "--task-file", s(&task)][..], &["--state", s(&bad_state)], &key]
            .concat(),
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(s(&absent)) && err.contains("cannot be bound into the worker's cage"), "{err}");
    assert!(!dir.join("bad-state/provisioning-request.json").exists(), "nothing to sign was written");
    assert!(chio(&[&init[..], &["--kernel-key", s(&dir.join("kernel/signing.seed"))]].concat(), &[]).status.success());
    let request_path = state.join("provisioning-request.json");
    let request: Value = serde_json::from_slice(&std::fs::read(&request_path).unwrap()).unwrap();
    assert_eq!(request["commands"]["argv_prefix"], json!(["/bin/bash", "--noprofile", "--norc", "-c"]));
    // What the operator signs is the deadline each command gets: the configuration's 60 s.
    assert_eq!(
        (&request["commands"]["deadline_s"], &request["commands"]["limits"]["wall_ms"]),
        (&json!(60), &json!(60000))
    );
    assert!(request["worker"]["network"].as_str().unwrap().starts_with("loopback only"));
    // The worker's variables the operator signs: chio's fixed ones (no network lookups, no cost
    // tracking, no bytecode) and the configured PYTHONPATH.
    let env = json!([
        "HOME",
        "LITELLM_LOCAL_MODEL_COST_MAP",
        "MSWEA_COST_TRACKING",
        "MSWEA_SILENT_STARTUP",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPATH"
    ]);
    assert_eq!(request["worker"]["env"], env);
    assert!(!request.to_string().contains(SECRET));

    let run = |env: &[(&str, &str)]| chio(&["session", "run", "--state", s(&state)], env);
    let with_key = [("CHIO_TEST_PROVIDER_KEY", SECRET)];
    let out = run(&with_key);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not prepared"));
    let auth = dir.join("auth.json");
    let seed = dir.join("stranger/signing.seed");
    let out = chio(&["session", "authorize", "--key", s(&seed), "--request", s(&request_path), "--out", s(&auth)], &[]);
    assert!(out.status.success());
    let key = dir.join("operator/public.key");
    let out =
        chio(&["session", "prepare", "--state", s(&state), "--authorization", s(&auth), "--trusted-key", s(&key)], &[]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the pinned key"));
    assert_eq!(run(&with_key).status.code(), Some(3), "still not prepared");
    assert!(provider.seen.lock().unwrap().is_empty(), "nothing reached the model");

    // Status reads what it reports: before any run no model call is journaled; a journal or an
    // outcome it cannot read is an error, never "none".
    let status = || chio(&["session", "status", "--state", s(&state), "--json"], &[]);
    let out = status();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&v["state"], &v["model_calls"]), (&json!("initialized"), &json!(0)), "{v}");
    // Recover with nothing to recover succeeds; a run marker it cannot remove is an error.
    let recover = || chio(&["session", "recover", "--state", s(&state)], &[]);
    let out = recover();
    assert!(out.status.success(), "nothing to recover: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::create_dir(state.join("running")).unwrap();
    assert!(!recover().status.success(), "a run marker left in place taken for removed");
    std::fs::remove_dir(state.join("running")).unwrap();
    std::fs::write(state.join("model-calls"), "").unwrap();
    assert!(!status().status.success(), "a journal that is no directory read as no calls");
    std::fs::remove_file(state.join("model-calls")).unwrap();
    std::fs::create_dir(state.join("outcome.json")).unwrap();
    assert!(!status().status.success(), "an outcome that cannot be read taken for none");
}

/// The seed's claims about a finished walkthrough.
#[derive(Debug, Default)]
struct Claims {
    verified_transitions: u64,
    verified_receipts: u64,
    source_unchanged: bool,
    recipient_tests_passed: bool,
    wrong_recipient_key_refused: bool,
    completed_replay_did_no_new_model_work: bool,
    offline_combined_export: bool,
}

/// A walkthrough end to end: init → authorize → prepare → run (the worker caged, the scripted
/// provider behind the gateway) → result → verify-export in a recipient clone with the chosen
/// key → `git apply` → the recipient's tests (`test` run in its `package/`) pass.
fn walkthrough(dir: &Scratch, repo: &Path, commands: &'static [&'static str], extra: &Value, test: &[&str]) -> Claims {
    let provider = scripted_provider(commands);
    let source_before = (git(repo, &["rev-parse", "HEAD"]), git(repo, &["status", "--porcelain"]));
    let Some(state) = prepared(dir, repo, &provider, extra) else { return Claims::default() };
    let with_key = [("CHIO_TEST_PROVIDER_KEY", SECRET)];
    let out = chio(&["session", "run", "--state", s(&state), "--json"], &with_key);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run: {}\n{stderr}", String::from_utf8_lossy(&out.stdout));
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((outcome["submitted"].as_bool(), outcome["model_calls"].as_u64()), (Some(true), Some(4)), "{outcome}");
    {
        let calls = provider.seen.lock().unwrap();
        assert!(calls.iter().all(|(auth, body)| *auth == format!("Bearer {SECRET}") && !body.contains(SECRET)));
        // The agent saw the tests fail, then pass.
        assert!(calls[1].1.contains("FAILED") && calls[3].1.to_lowercase().contains("ok"), "{}", calls[3].1);
    }
    let worker: Value = serde_json::from_slice(&std::fs::read(state.join("worker-launch.json")).unwrap()).unwrap();
    assert_eq!(worker["state"], "FullyEnforced", "{worker}");
    // The worker ran under the ceilings the operator signed: room for the Python agent (1 GiB, 16 MiB
    // of output kept), the agent's wall time.
    let request: Value =
        serde_json::from_slice(&std::fs::read(state.join("provisioning-request.json")).unwrap()).unwrap();
    let limits = &worker["limits"];
    assert_eq!(*limits, request["worker"]["limits"], "the worker's ceilings are not the signed ones");
    let wall_ms = extra.get("agent").map_or(240, |a| a["wall_time_s"].as_u64().unwrap()) * 1000;
    assert_eq!(
        (limits["memory_bytes"].as_u64(), limits["output_bytes"].as_u64(), limits["wall_ms"].as_u64()),
        (Some(1 << 30), Some(16 << 20), Some(wall_ms)),
        "{limits}"
    );
    assert!(!worker.to_string().contains(SECRET) && !worker.to_string().contains("CHIO_TEST_PROVIDER_KEY"));

    let result = dir.join("result");
    let out = chio(&["session", "result", "--state", s(&state), "--out", s(&result)], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trajectory: Value = serde_json::from_slice(&std::fs::read(result.join("trajectory.json")).unwrap()).unwrap();
    assert_eq!(trajectory["info"]["exit_status"], "Submitted");
    let recipient = dir.join("recipient");
    git(&dir.0, &["clone", "-q", s(repo), s(&recipient)]);
    let verify = |key: &Path| {
        let bundle = result.join("bundle");
        let args = ["repository", "verify-export", "--bundle", s(&bundle), "--repository", s(&recipient)];
        // The server id `session init` named, pinned by the recipient.
        let rest =
            ["--revision", "HEAD", "--source-path", "package", "--kernel-key", s(key), "--server-id", "calc-sandbox"];
        chio(&[&args[..], &rest].concat(), &[])
    };
    let out = verify(&dir.join("kernel/public.key"));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(out.status.success(), "{report} {}", String::from_utf8_lossy(&out.stderr));
    let wrong = verify(&dir.join("operator/public.key"));
    git(&recipient, &["apply", s(&result.join("bundle/changes.patch"))]);
    let tested = Command::new(test[0]).args(&test[1..]).current_dir(recipient.join("package")).output().unwrap();

    let status = |st: &Path| {
        let v: Value =
            serde_json::from_slice(&chio(&["session", "status", "--state", s(st), "--json"], &[]).stdout).unwrap();
        (v["state"].as_str().unwrap().to_string(), v["workspace"]["receipts"].as_u64().unwrap())
    };
    let before = status(&state);
    let rerun = chio(&["session", "run", "--state", s(&state)], &with_key);
    // The operator's claims document agrees with what this test computed itself, every claim
    // holding; pinned to a key that signed nothing, the receipts' claim fails and says why.
    let (code, doc) = claims(&state, &dir.join("kernel/public.key"));
    assert_eq!((code, &doc["all_hold"]), (0, &json!(true)), "{doc}");
    for (name, value) in [("verified_receipts", &report["verified_receipts"]), ("model_calls", &json!(4))] {
        assert_eq!(&claim(&doc, name)["value"], value, "{name}: {doc}");
    }
    assert_eq!(claim(&doc, "verified_transitions")["value"], report["verified_transitions"], "{doc}");
    for name in ["source_unchanged", "wrong_recipient_key_refused", "edited_patch_refused", "worker_fully_enforced"] {
        assert_eq!(claim(&doc, name)["holds"], true, "{name}: {doc}");
    }
    let text =
        chio(&["session", "claims", "--state", s(&state), "--kernel-key", s(&dir.join("kernel/public.key"))], &[]);
    let text = String::from_utf8_lossy(&text.stdout);
    eprintln!("{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("holds ")).count(), doc["claims"].as_array().unwrap().len());
    let (code, doc) = claims(&state, &dir.join("operator/public.key"));
    assert_eq!((code, &claim(&doc, "verified_receipts")["holds"]), (5, &json!(false)), "{doc}");
    assert!(claim(&doc, "verified_receipts")["evidence"].as_str().unwrap().contains("not the pinned key"), "{doc}");
    let mut names: Vec<String> =
        std::fs::read_dir(&result).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    Claims {
        verified_transitions: report["verified_transitions"].as_u64().unwrap(),
        verified_receipts: report["verified_receipts"].as_u64().unwrap(),
        source_unchanged: (git(repo, &["rev-parse", "HEAD"]), git(repo, &["status", "--porcelain"])) == source_before,
        recipient_tests_passed: tested.status.success(),
        wrong_recipient_key_refused: wrong.status.code() == Some(5),
        completed_replay_did_no_new_model_work: rerun.status.success()
            && provider.seen.lock().unwrap().len() == 4
            && status(&state) == before,
        offline_combined_export: names == ["bundle", "outcome.json", "trajectory.json"]
            && ["changes.patch", "receipts.ndjson"].iter().all(|f| result.join("bundle").join(f).exists()),
    }
}

fn assert_claims(c: &Claims, receipts_at_least: u64) {
    eprintln!("claims: {c:?}");
    assert_eq!(c.verified_transitions, 4, "one a command: {c:?}");
    assert!(c.verified_receipts >= receipts_at_least, "{c:?}");
    assert!(c.source_unchanged && c.recipient_tests_passed && c.wrong_recipient_key_refused, "{c:?}");
    assert!(c.completed_replay_did_no_new_model_work && c.offline_combined_export, "{c:?}");
}

/// The Python walkthrough: `python3 -m unittest` fails, `add` is fixed, it passes, submitted.
#[test]
fn python_calculator_walkthrough() {
    if !privileged("python_walkthrough") {
        return;
    }
    let dir = Scratch::new("session-python");
    let repo = calculator_repo(&dir.0);
    let claims = walkthrough(&dir, &repo, FIX, &json!({}), &["python3", "-m", "unittest"]);
    if venv().is_some() {
        assert_claims(&claims, 12);
    }
}

/// The Rust calculator: a Cargo library in `package/` whose `add` subtracts, its test, and (as
/// for Python) a dirty change and an untracked file that must never enter.
fn rust_calculator_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("rcalc");
    std::fs::create_dir_all(repo.join("package/src")).unwrap();
    git(&repo, &["init", "-q"]);
    let manifest = "[package]\nname = \"calculator\"\nversion = \"0.1.0\"\nedition = \"2018\"\n\n[dependencies]\n";
    std::fs::write(repo.join("package/Cargo.toml"), manifest).unwrap();
    let lock = "# This file is automatically @generated by Cargo.\n# It is not intended for manual editing.\nversion = 3\n\n[[package]]\nname = \"calculator\"\nversion = \"0.1.0\"\n";
    std::fs::write(repo.join("package/Cargo.lock"), lock).unwrap();
    let lib = "pub fn add(a: i64, b: i64) -> i64 {\n    a - b\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn adds() {\n        assert_eq!(super::add(2, 3), 5);\n    }\n}\n";
    std::fs::write(repo.join("package/src/lib.rs"), lib).unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "calculator"]);
    std::fs::write(repo.join("package/src/lib.rs"), "DIRTY\n").unwrap();
    std::fs::write(repo.join("package/untracked.rs"), "UNTRACKED\n").unwrap();
    repo
}

const FIX_RUST: &[&str] = &[
    "cd package && cargo test --offline",
    "sed -i 's/    a - b/    a + b/' package/src/lib.rs",
    "cd package && cargo test --offline",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
];

/// The Rust image (`packaging/images/build-images.py --only rust`: debootstrap, Debian's cargo
/// and rustc), built once into `target/test-images` and kept there; None when it cannot be built
/// here (skipped, failing under CI).
fn rust_image() -> Option<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let script = repo.join("packaging/images/build-images.py");
    let out = repo.join("target/test-images");
    let tar = out.join("rust.tar");
    // Two tests (the walkthrough, qualify) want it: the first builds it while the other waits on
    // the lock, then finds it complete.
    std::fs::create_dir_all(&out).unwrap();
    let lock = std::fs::File::create(out.join("rust.lock")).unwrap();
    // SAFETY: flock on our own open file, released when `lock` is dropped at the return.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) }, 0);
    let fresh = |t: &Path| {
        let age = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        age(t).is_some() && age(t) >= age(&script)
    };
    if !fresh(&tar) {
        if Command::new("debootstrap").arg("--version").output().is_err() {
            skip("rust_walkthrough", "debootstrap is missing (apt-get install debootstrap; .ci/run does)");
            return None;
        }
        let built = Command::new("python3").arg(&script).args(["--only", "rust", "--out", s(&out)]).output().unwrap();
        assert!(built.status.success(), "building the Rust image: {}", String::from_utf8_lossy(&built.stderr));
    }
    Some(tar)
}

/// The Rust walkthrough: commands on the Rust image (the worker on the host's Python), cargo's
/// build output in a scratch path, `cargo test --offline` in the recipient's clone.
#[test]
fn rust_calculator_walkthrough() {
    if !privileged("rust_walkthrough") {
        return;
    }
    let Some(image) = rust_image() else { return };
    let dir = Scratch::new("session-rust");
    let out = chio(&["image", "import", s(&image), "--state-dir", s(&dir.join("images"))], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let repo = rust_calculator_repo(&dir.0);
    let extra = json!({"image": "chio/rust:bookworm", "scratch_paths": ["package/target"], "command_timeout_s": 240});
    let claims = walkthrough(&dir, &repo, FIX_RUST, &extra, &["cargo", "test", "--offline", "-q"]);
    if venv().is_some() {
        assert_claims(&claims, 12);
    }
}

/// Keys, configuration, task, init, the operator's authorization, prepare: a session ready to run.
fn prepared(dir: &Scratch, repo: &Path, provider: &Provider, extra: &Value) -> Option<PathBuf> {
    let (python, package) = venv()?;
    Some(prepared_with(dir, &session_config(repo, &provider.url, &python, &package, extra)))
}

/// [`prepared`] with this session configuration.
fn prepared_with(dir: &Scratch, session: &Value) -> PathBuf {
    prepared_granting(dir, session, &[])
}

/// [`prepared_with`], the operator's authorization signed with `grant` (`--max-calls N`, ...).
fn prepared_granting(dir: &Scratch, session: &Value, grant: &[&str]) -> PathBuf {
    for who in ["kernel", "operator"] {
        assert!(chio(&["keys", "generate", "--out", s(&dir.join(who))], &[]).status.success());
    }
    let (config, task, state) = (dir.join("session.json"), dir.join("issue.md"), dir.join("state"));
    std::fs::write(&config, session.to_string()).unwrap();
    std::fs::write(&task, "make the tests in package/ pass\n").unwrap();
    let seed = dir.join("kernel/signing.seed");
    let init = ["session", "init", "--config", s(&config), "--task-file", s(&task), "--state", s(&state)];
    let store = dir.join("images");
    let named = ["--server-id", "calc-sandbox"];
    let out = chio(&[&init[..], &["--kernel-key", s(&seed), "--image-store", s(&store)], &named].concat(), &[]);
    assert!(out.status.success(), "init: {}", String::from_utf8_lossy(&out.stderr));
    let (auth, request) = (dir.join("auth.json"), state.join("provisioning-request.json"));
    let operator = dir.join("operator/signing.seed");
    let authorize = ["session", "authorize", "--key", s(&operator), "--request", s(&request), "--out", s(&auth)];
    let out = chio(&[&authorize[..], grant].concat(), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let key = dir.join("operator/public.key");
    let out =
        chio(&["session", "prepare", "--state", s(&state), "--authorization", s(&auth), "--trusted-key", s(&key)], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    state
}

/// The operator's budget and grant hold: the provider's prices, an output cap and a cost ceiling
/// in the configuration, a call count in the signed authorization. Each call is sent asking for
/// the cap at most; the call past the granted count is refused before the provider sees it, with
/// a signed denial naming the rule; the claims report the spend and the signed refusal. A grant
/// that has ended starts nothing.
#[test]
fn budgets_and_the_grant_hold_the_model_calls() {
    if !privileged("session_budget") {
        return;
    }
    let Some((python, package)) = venv() else { return };
    let dir = Scratch::new("session-budget");
    let repo = calculator_repo(&dir.0);
    let provider = scripted_provider(FIX);
    let mut config = session_config(&repo, &provider.url, &python, &package, &json!({}));
    // 1 USD a million tokens either way: the provider's 1 + 1 tokens a call cost 2 µUSD.
    config["model"]["budget"] = json!({"input_microusd_per_mtok": 1_000_000, "output_microusd_per_mtok": 1_000_000,
                                       "max_output_tokens": 256, "max_cost_microusd": 5_000_000});
    let state = prepared_granting(&dir, &config, &["--max-calls", "2"]);
    let out = chio(&["session", "run", "--state", s(&state), "--json"], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    assert_eq!(out.status.code(), Some(1), "not submitted: {}", String::from_utf8_lossy(&out.stderr));
    {
        let seen = provider.seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "the third call reached the provider");
        for (_, body) in seen.iter() {
            let v: Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["max_tokens"], 256, "the budget's cap was not asked for");
        }
    }
    let receipts =
        chio(&["receipt", "list", "--receipt-db", s(&state.join("model-receipts.db")), "--kind", "denial"], &[]);
    let text = String::from_utf8_lossy(&receipts.stdout);
    let denial: Value = serde_json::from_str(text.lines().next().expect("a denial receipt")).unwrap();
    let detail = &denial["receipt"]["body"]["detail"];
    assert_eq!((&detail["rule"], &detail["model_call"]), (&json!("max_calls"), &json!(2)), "{denial}");
    let (code, doc) = claims(&state, &dir.join("kernel/public.key"));
    assert_eq!(code, 5, "not submitted: {doc}");
    let refusals = claim(&doc, "refusals_signed");
    assert_eq!((&refusals["value"], &refusals["holds"]), (&json!(1), &json!(true)), "{refusals}");
    let spend = claim(&doc, "model_spend_within_budget");
    assert_eq!((&spend["value"], &spend["holds"]), (&json!(4), &json!(true)), "{spend}");

    // A grant of one second, used two seconds later: nothing starts, the provider sees nothing.
    let later = Scratch::new("session-expired");
    let repo = calculator_repo(&later.0);
    let provider = scripted_provider(FIX);
    let config = session_config(&repo, &provider.url, &python, &package, &json!({}));
    let state = prepared_granting(&later, &config, &["--valid-for", "1s"]);
    std::thread::sleep(Duration::from_millis(2100));
    let out = chio(&["session", "run", "--state", s(&state)], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("not_after") && err.contains("no run starts"), "{err}");
    assert!(provider.seen.lock().unwrap().is_empty());
}

/// A worker on an image runs on the very image the operator signed for: the request names the
/// image's id (resolved at init from the reference in the configuration), and the worker's cage
/// is launched on that image from the store init found it in (its record names the image). The
/// image here holds no Python: the run fails, its record kept.
#[test]
fn a_worker_image_is_the_one_the_operator_signed() {
    if !privileged("session_worker_image") {
        return;
    }
    let Some((python, package)) = venv() else { return };
    let dir = Scratch::new("session-worker-image");
    let repo = calculator_repo(&dir.0);
    let provider = scripted_provider(FIX);
    let archive = dir.join("worker.tar");
    chio_tests::docker_save_with(
        &archive,
        &[("chio/worker:test", chio_tests::shared_rootfs(Path::new(PROBE)), "A=1")],
        false,
    );
    let images = dir.join("images");
    let out = chio(&["image", "import", s(&archive), "--state-dir", s(&images)], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let image_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut session = session_config(&repo, &provider.url, &python, &package, &json!({}));
    session["worker"]["image"] = json!("chio/worker:test");
    session["worker"]["read_only_paths"] = json!([]);
    let state = prepared_with(&dir, &session);
    let request: Value =
        serde_json::from_slice(&std::fs::read(state.join("provisioning-request.json")).unwrap()).unwrap();
    assert_eq!(request["worker"]["image_id"], json!(image_id), "the signed request names another image");
    let out = chio(&["session", "run", "--state", s(&state)], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    assert!(!out.status.success(), "a worker without Python ran");
    let record: Value = serde_json::from_slice(
        &std::fs::read(state.join("worker-launch.json"))
            .unwrap_or_else(|e| panic!("no worker launch record ({e}): {}", String::from_utf8_lossy(&out.stderr))),
    )
    .unwrap();
    assert_eq!(record["annotations"]["image.id"], json!(image_id), "{record}");
    assert!(steps(&provider.seen).is_empty(), "the provider was called");
}

fn session_state(state: &Path) -> (String, u64) {
    let out = chio(&["session", "status", "--state", s(state), "--json"], &[]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["state"].as_str().unwrap().to_string(), v["workspace"]["receipts"].as_u64().unwrap_or(0))
}

/// A run killed while the model is thinking: nothing of it is left running; it must be
/// recovered before anything else; the call that was at the provider is never sent again
/// unasked (the next run stops naming it); with `--resend-unknown` the run gets the journaled
/// answers and the retained command results again (no new model call, no new launch for them),
/// sends that one call again, recorded, and finishes the task.
#[test]
fn a_killed_run_recovers_and_replays_without_new_model_work() {
    if !privileged("session_crash") {
        return;
    }
    let dir = Scratch::new("session-crash");
    let repo = calculator_repo(&dir.0);
    let provider = scripted_provider(FIX);
    let Some(state) = prepared(&dir, &repo, &provider, &json!({})) else { return };
    *provider.hold.lock().unwrap() = Some(2);
    let mut run = chio_tests::Reaped(
        Command::new(chio_bin(&PathBuf::from(PROBE)))
            .args(["session", "run", "--state", s(&state)])
            .env("CHIO_TEST_PROVIDER_KEY", SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Each call at the provider was journaled in the session's state, where recovery looks: as
    // sent before it went, then as answered.
    let journal = state.join("model-calls");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !steps(&provider.seen).contains(&2) {
        assert!(std::time::Instant::now() < until, "the agent never reached step 2: {:?}", steps(&provider.seen));
        if let Some(status) = run.0.try_wait().unwrap() {
            panic!("the run ended ({status}) before the agent reached step 2: {:?}", steps(&provider.seen));
        }
        if let Some(n) = steps(&provider.seen).last() {
            let journaled =
                journal.join(format!("{n:06}.sent")).is_file() || journal.join(format!("{n:06}.json")).is_file();
            assert!(journaled, "call {n} was sent unjournaled in {journal:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // While it runs: its status says so, and neither a second run nor a recovery may start.
    assert_eq!(session_state(&state).0, "running");
    assert!(journal.join("000001.json").is_file() && journal.join("000002.sent").is_file(), "{journal:?}");
    let second = chio(&["session", "run", "--state", s(&state)], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    assert_eq!(second.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&second.stderr).contains("in progress"));
    assert_eq!(chio(&["session", "recover", "--state", s(&state)], &[]).status.code(), Some(3));
    run.0.kill().unwrap();
    run.0.wait().unwrap();
    *provider.hold.lock().unwrap() = None;
    // The gateway, the leg and the worker died with the run.
    assert_eq!(wait_gone(s(&state), std::time::Duration::from_secs(10)), Vec::<u32>::new());
    let (st, _) = session_state(&state);
    assert_eq!(st, "interrupted");
    let again = chio(&["session", "run", "--state", s(&state)], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    assert_eq!(again.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&again.stderr).contains("session recover"));
    assert!(chio(&["session", "recover", "--state", s(&state)], &[]).status.success());
    let (_, receipts) = session_state(&state);
    // Step 2 was at the provider at the kill, never answered: its outcome is unknown (it may
    // have been done and billed), so the next run stops naming it and sends nothing.
    let status: Value =
        serde_json::from_slice(&chio(&["session", "status", "--state", s(&state), "--json"], &[]).stdout).unwrap();
    assert_eq!(status["model_call_outcome_unknown"], 2, "{status}");
    let stopped = chio(&["session", "run", "--state", s(&state), "--json"], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    let said = String::from_utf8_lossy(&stopped.stderr);
    assert!(
        !stopped.status.success() && said.contains("model call 2") && said.contains("outcome is unknown"),
        "{said}"
    );
    assert!(said.contains("--resend-unknown"), "the refusal says how to go on: {said}");
    assert_eq!(steps(&provider.seen), vec![0, 1, 2], "the call of unknown outcome was sent again");
    assert_eq!(session_state(&state).0, "prepared", "resumable");

    // The operator's choice, recorded: the call is sent again and the run finishes.
    let out = chio(
        &["session", "run", "--state", s(&state), "--json", "--resend-unknown"],
        &[("CHIO_TEST_PROVIDER_KEY", SECRET)],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["submitted"], true, "{outcome}");
    // Steps 0 and 1 came from the journal; 2 was sent again on the operator's word.
    assert_eq!(steps(&provider.seen), vec![0, 1, 2, 2, 3]);
    assert!(state.join("model-calls/000002.resent").exists(), "the resend is recorded");
    // Commands 0 and 1 replayed their retained results: only 2 and 3 launched (three receipts
    // each: enforcement, terminal, tool_call).
    let (st, after) = session_state(&state);
    assert_eq!((st.as_str(), after - receipts), ("completed", 6));
    // The claims say so: the call sent twice turns its claim false, the rest hold.
    let (code, doc) = claims(&state, &dir.join("kernel/public.key"));
    assert_eq!(code, 5, "{doc}");
    let failed: Vec<&str> = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["holds"] == false)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["no_model_call_sent_twice"], "{doc}");
    assert!(claim(&doc, "no_model_call_sent_twice")["evidence"].as_str().unwrap().contains("[2]"), "{doc}");
}

/// `chio session claims --json` pinned to `key`: (exit status, the document).
fn claims(state: &Path, key: &Path) -> (i32, Value) {
    let out = chio(&["session", "claims", "--state", s(state), "--kernel-key", s(key), "--json"], &[]);
    let doc = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("claims: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap(), doc)
}

/// The claim `name` of a claims document.
fn claim<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["claims"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("{name}: {doc}"))
}

/// The worker's wall-clock limit ends it in the middle of a command: the run still ends cleanly —
/// the command's cage is gone, its operation settled as of unknown outcome (never run again),
/// the workspace back at its last committed snapshot — and the result can be taken.
#[test]
fn a_worker_stopped_mid_command_leaves_a_settled_workspace() {
    if !privileged("session_wall_time") {
        return;
    }
    let dir = Scratch::new("session-wall");
    let repo = calculator_repo(&dir.0);
    // `sleep` sums its arguments: the second is this test process's tag (another run of this
    // suite on the host, in a pid namespace of its own or not, has another).
    let tag = format!("0.{:0>10}", std::process::id());
    let sleep: &'static str = Box::leak(format!("sleep 61 {tag}").into_boxed_str());
    let slow: &'static [&'static str] = Box::leak(Box::new(["echo step-zero > package/zero.txt", sleep]));
    let provider = scripted_provider(slow);
    // 25 s: the first step must be committed by then on a loaded machine (at 12 test threads
    // 8 s was not, and once 15 s was not: the agent had made no model call yet).
    let extra = json!({"agent": {"step_limit": 8, "wall_time_s": 25}});
    let Some(state) = prepared(&dir, &repo, &provider, &extra) else { return };
    let out = chio(&["session", "run", "--state", s(&state), "--json"], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    assert_eq!(out.status.code(), Some(1), "not submitted: {}", String::from_utf8_lossy(&out.stderr));
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["worker_limits_hit"], json!(["wall_time"]), "{outcome}");
    assert_eq!(outcome["submitted"], false);
    assert_eq!(outcome["agent_exit_status"], Value::Null, "an empty status is no status: {outcome}");
    assert_eq!(wait_gone(&tag, std::time::Duration::from_secs(10)), Vec::<u32>::new(), "the command outlived the run");
    let st: Value =
        serde_json::from_slice(&chio(&["session", "status", "--state", s(&state), "--json"], &[]).stdout).unwrap();
    assert_eq!(st["state"], "completed", "{st}");
    let ops = &st["workspace"]["operations"];
    assert_eq!((ops["completed"].as_u64(), ops["outcome_unknown"].as_u64()), (Some(1), Some(1)), "{st}");
    // In words: why the agent has no status, and the ceiling it hit.
    let text = chio(&["session", "status", "--state", s(&state)], &[]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("  agent stopped without a status") && text.contains("ceilings hit: wall_time"), "{text}");
    // A reader that went away (`| head -1`): said on stderr, exit 1, no panic.
    let (read, write) = std::io::pipe().unwrap();
    drop(read);
    let out = Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(["session", "status", "--state", s(&state)])
        .stdout(write)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("writing to stdout") && !err.contains("panicked"), "{err}");
    let result = dir.join("result");
    let out = chio(&["session", "result", "--state", s(&state), "--out", s(&result)], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let patch = std::fs::read_to_string(result.join("bundle/changes.patch")).unwrap();
    assert!(patch.contains("package/zero.txt"), "the committed step is in the result: {patch}");
}

/// What a session runs is what the operator signed. After `prepare`: the task edited, the
/// provider's URL edited, or the task edited together with the request's digest of it (so the
/// files agree with each other but not with the signature) — each run is refused before
/// anything starts, and the provider sees no call. Control: put back, the session runs — with
/// the worker's read-only paths bound read-only (its record says so), and `result`, run as
/// root, copying nothing of a root-only file the worker's trajectory was swapped for a link to.
#[test]
fn an_edited_task_or_provider_never_runs_under_the_old_signature() {
    if !privileged("session_edited") {
        return;
    }
    let dir = Scratch::new("session-edited");
    let repo = calculator_repo(&dir.0);
    let provider = scripted_provider(FIX);
    let Some(state) = prepared(&dir, &repo, &provider, &json!({})) else { return };
    let run = || chio(&["session", "run", "--state", s(&state), "--json"], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    let (task, config, request) =
        (state.join("task.md"), state.join("session.json"), state.join("provisioning-request.json"));
    let originals: Vec<(PathBuf, Vec<u8>)> =
        [&task, &config, &request].iter().map(|p| (p.to_path_buf(), std::fs::read(p).unwrap())).collect();
    let restore = || {
        for (p, b) in &originals {
            std::fs::write(p, b).unwrap();
        }
    };
    let refused = |what: &str, why: &str| {
        let out = run();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{what}: {err}");
        assert_eq!(steps(&provider.seen), Vec::<usize>::new(), "{what}: the provider was called");
    };
    std::fs::write(&task, "delete everything\n").unwrap();
    refused("an edited task", "task.md does not match");
    restore();
    let mut c: Value = serde_json::from_slice(&originals[1].1).unwrap();
    c["model"]["base_url"] = json!("http://127.0.0.1:9/v1");
    std::fs::write(&config, c.to_string()).unwrap();
    refused("an edited provider URL", "does not match session.json");
    restore();
    // The request made to agree with an edited task: the files agree, the signature does not.
    let edited = "delete everything\n";
    std::fs::write(&task, edited).unwrap();
    let mut r: Value = serde_json::from_slice(&originals[2].1).unwrap();
    r["task_sha256"] = json!(chio_tests::hex(edited.as_bytes()));
    std::fs::write(&request, r.to_string()).unwrap();
    refused("an edited task with its request", "the authorization is not admitted");
    restore();
    // A call journal that cannot be read may hold a call of unknown outcome: the run is refused
    // before it starts (no run marker left to recover), naming it.
    let journal = state.join("model-calls");
    let _ = std::fs::remove_dir(&journal);
    std::fs::write(&journal, "").unwrap();
    refused("an unreadable call journal", "model-calls");
    assert!(!state.join("running").exists(), "the refused run left a run marker");
    std::fs::remove_file(&journal).unwrap();
    let out = run();
    assert!(out.status.success(), "control: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!steps(&provider.seen).is_empty(), "control: the provider was called");

    // The worker's read-only paths were bound read-only (its record says so), its output
    // directory writable.
    let record: Value = serde_json::from_slice(&std::fs::read(state.join("worker-launch.json")).unwrap()).unwrap();
    let sources = record["reported"]["sources"].as_array().unwrap();
    let config: Value = serde_json::from_slice(&originals[1].1).unwrap();
    for p in config["worker"]["read_only_paths"].as_array().unwrap() {
        let bound = sources.iter().find(|x| x["dest"] == *p).unwrap_or_else(|| panic!("{p} not bound: {record}"));
        assert_eq!(bound["writable"], false, "{p} bound writable");
    }
    assert!(sources.iter().any(|x| x["dest"] == "/chio-out" && x["writable"] == true), "control: {sources:?}");
    // `result` (run as root) reads what the worker wrote without following a link: a trajectory
    // swapped for a link to a root-only file copies nothing of it. Control: the real one is copied.
    // A FIFO is not waited on. Each refusal is named in the report; the rest of the result stands.
    let result = |name: &str| {
        let got = dir.join(name);
        let out = chio(&["session", "result", "--state", s(&state), "--out", s(&got)], &[]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(got.join("outcome.json").is_file() && got.join("bundle").is_dir(), "{name}: {report}");
        (
            std::fs::read_to_string(got.join("trajectory.json")).ok(),
            report["trajectory_refused"].as_str().map(String::from),
        )
    };
    let (copied, refused) = result("result");
    assert!(copied.is_some_and(|t| !t.is_empty()) && refused.is_none(), "control: the trajectory, {refused:?}");
    let secret = dir.join("root-only");
    std::fs::write(&secret, "TOP SECRET").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let trajectory = state.join("out/trajectory.json");
    let real = std::fs::read(&trajectory).unwrap();
    std::fs::remove_file(&trajectory).unwrap();
    std::os::unix::fs::symlink(&secret, &trajectory).unwrap();
    let (copied, refused) = result("result-linked");
    assert!(!copied.unwrap_or_default().contains("TOP SECRET"), "result copied a host file through the worker's link");
    assert!(
        refused.as_deref().is_some_and(|r| r.contains("trajectory.json: a symbolic link, not followed")),
        "{refused:?}"
    );
    std::fs::remove_file(&trajectory).unwrap();
    nix::unistd::mkfifo(&trajectory, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (copied, refused) = result("result-fifo");
    assert!(copied.is_none(), "a FIFO's trajectory");
    assert!(refused.as_deref().is_some_and(|r| r.contains("not a regular file of at most")), "{refused:?}");
    std::fs::remove_file(&trajectory).unwrap();
    std::fs::write(&trajectory, real).unwrap();
}

/// The repository leg enforces what the operator authorized, whatever the worker asks: a
/// stranger's uid on its socket is refused; a deadline past the authorized one is refused
/// (control: the authorized one runs); the command one past the step limit is refused (control:
/// every command up to it runs).
#[test]
fn the_leg_holds_the_worker_to_its_authorization() {
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt;
    if !privileged("session_leg_bounds") {
        return;
    }
    let dir = Scratch::new("session-leg");
    let repo = calculator_repo(&dir.0);
    let provider = scripted_provider(FIX);
    let extra = json!({"command_timeout_s": 5, "agent": {"step_limit": 2, "wall_time_s": 60}});
    let Some(state) = prepared(&dir, &repo, &provider, &extra) else { return };
    std::fs::create_dir_all(state.join("run")).unwrap();
    /// The leg, killed when the test ends, however it ends.
    struct Leg(std::process::Child);
    impl Drop for Leg {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut leg = Leg(Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(["session", "leg", "--state", s(&state)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    let mut ready = String::new();
    BufReader::new(leg.0.stdout.take().unwrap()).read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");
    let socket = state.join("run/leg.sock");
    // Only the worker's cage has the socket's path (the state directory is root's); a stranger
    // reaches the socket here by a hard link in a directory anyone may enter, and meets the
    // leg's own check of its peer.
    let public = Scratch::new("session-leg-public");
    std::fs::hard_link(&socket, public.join("leg.sock")).unwrap();
    let ask = |c: &UnixStream, key: &str, deadline: u64| -> Value {
        let line = json!({"operation_key": key, "command": "echo ran", "deadline_s": deadline});
        writeln!(&*c, "{line}").unwrap();
        let mut answer = String::new();
        BufReader::new(c).read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap_or_else(|_| panic!("not an answer: {answer:?}"))
    };
    // A stranger's uid: refused at once, whatever it asks.
    let stranger = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            // Answered on connecting, before it says anything: a request sent after the refusal would
            // meet a closed socket.
            "import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1]); \
              print(s.makefile().readline().strip())",
        )
        .arg(public.join("leg.sock"))
        .uid(65533)
        .gid(65533)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&stranger.stdout);
    assert!(said.contains("uid 65533 may not use the leg"), "{said} {}", String::from_utf8_lossy(&stranger.stderr));
    let c = UnixStream::connect(&socket).unwrap();
    let over = ask(&c, "k-over", 6);
    assert!(over["error"].as_str().unwrap_or_default().contains("authorizes at most 5 s"), "{over}");
    for k in ["k1", "k2"] {
        let ran = ask(&c, k, 5);
        assert!(ran["error"].is_null() && ran["exit_status"] == 0, "control: {k} within the bounds runs: {ran}");
    }
    let past = ask(&c, "k3", 5);
    assert!(past["error"].as_str().unwrap_or_default().contains("step limit of 2"), "{past}");
}

/// A worker whose cage fails its setup (here at landlock, by the test build's switch) never
/// counts as a run: no outcome is recorded, the session stays resumable, the provider is never
/// called. Control: the same run without the failure completes.
#[test]
fn a_worker_cage_that_failed_setup_is_not_a_completed_run() {
    if !privileged("session_worker_failed") {
        return;
    }
    let dir = Scratch::new("session-worker-failed");
    let repo = calculator_repo(&dir.0);
    let provider = scripted_provider(FIX);
    let Some(state) = prepared(&dir, &repo, &provider, &json!({})) else { return };
    let failed = chio(
        &["session", "run", "--state", s(&state), "--json"],
        &[("CHIO_TEST_PROVIDER_KEY", SECRET), ("CHIO_TEST_FAIL_STAGE", "landlock")],
    );
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success() && err.contains("the worker's cage did not run"), "{err}");
    assert!(!state.join("outcome.json").exists(), "a failed worker recorded an outcome");
    assert_eq!(session_state(&state).0, "prepared");
    assert_eq!(steps(&provider.seen), Vec::<usize>::new());
    let out = chio(&["session", "run", "--state", s(&state), "--json"], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    assert!(out.status.success(), "control: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(session_state(&state).0, "completed");
}

/// `chio session qualify`: the operator's evidence without a provider account — the Python (and,
/// where the Rust image can be built, the Rust) calculator scenario run by chio itself against its
/// scripted provider, a run killed mid-command and recovered, a rerun, the recipient's tests in a
/// cage. Every claim holds, each with its evidence; the document names every claim the guide lists.
#[test]
fn qualify_shows_every_claim_with_its_evidence() {
    if !privileged("session_qualify") {
        return;
    }
    let Some((python, _)) = venv() else { return };
    let dir = Scratch::new("session-qualify");
    let mut args = vec!["session".to_string(), "qualify".into(), "--out".into(), s(&dir.join("q")).into()];
    args.extend(["--worker-python".into(), s(&python).into(), "--json".into()]);
    if let Some(image) = rust_image() {
        let store = dir.join("images");
        let out = chio(&["image", "import", s(&image), "--state-dir", s(&store)], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        args.extend(["--rust-image".into(), "chio/rust:bookworm".into(), "--image-store".into(), s(&store).into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = chio(&args, &[]);
    let printed: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("qualify: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(0), "{printed:#}");
    let written: Value = serde_json::from_slice(&std::fs::read(dir.join("q/claims.json")).unwrap()).unwrap();
    assert_eq!(printed, written);
    assert_eq!((&written["schema"], &written["all_hold"]), (&json!("chio.session-qualification.v1"), &json!(true)));
    let expected = [
        "operator_authorized",
        "agent_submitted",
        "worker_fully_enforced",
        "credential_never_in_worker",
        "model_calls",
        "no_model_call_sent_twice",
        "completed_replay_did_no_new_model_work",
        "verified_receipts",
        "verified_transitions",
        "patch_verified",
        "wrong_recipient_key_refused",
        "edited_patch_refused",
        "source_unchanged",
        "crash_recovered",
        "recovered_run_answered_from_the_journal",
        "completed_rerun_made_no_call_or_launch",
        "recipient_tests_passed",
        "source_worktree_untouched",
    ];
    let scenarios = written["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), if args.contains(&"--rust-image") { 2 } else { 1 });
    for sc in scenarios {
        let doc = &sc["claims"];
        for name in expected {
            let c = claim(doc, name);
            assert_eq!(c["holds"], true, "{}: {name}: {c}", sc["name"]);
            assert!(!c["evidence"].as_str().unwrap().is_empty(), "{name}");
        }
        assert_eq!(claim(doc, "model_calls")["value"], 5, "four commands, the crashed one, and the submit");
        // The scenario's state is there to be looked at again: the same claims from it.
        let state = Path::new(sc["dir"].as_str().unwrap()).join("state");
        let key = Path::new(sc["dir"].as_str().unwrap()).join("kernel-key/public.key");
        let (code, again) = claims(&state, &key);
        assert_eq!((code, &again["all_hold"]), (0, &json!(true)), "{again}");
    }
}
