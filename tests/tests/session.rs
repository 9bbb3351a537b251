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

use chio_tests::{calculator_repo, chio_bin, git, privileged, skip, wait_gone, Scratch};
use serde_json::{json, Value};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");
const SECRET: &str = "sk-test-provider-credential-0123456789";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn chio(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
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

fn session_config(repo: &Path, url: &str, python: &Path, package: &Path) -> Value {
    let venv = python.parent().unwrap().parent().unwrap();
    // The interpreter behind the venv (pyenv's, say) must be in the worker's root too.
    let real = std::fs::canonicalize(python).unwrap();
    let prefix = real.parent().unwrap().parent().unwrap().to_path_buf();
    let mut read_only = vec![venv.to_path_buf(), package.to_path_buf()];
    if !prefix.starts_with("/usr") {
        read_only.push(prefix);
    }
    json!({
        "schema": "chio.session.v1",
        "repository": repo, "revision": "HEAD", "source_paths": ["package"],
        "scratch_paths": ["package/__pycache__"],
        "command_timeout_s": 60,
        "agent": {"step_limit": 8, "wall_time_s": 240},
        "model": {"name": "scripted", "base_url": url, "credential_env": "CHIO_TEST_PROVIDER_KEY"},
        "worker": {"python": python, "read_only_paths": read_only, "env": {"PYTHONPATH": package}}
    })
}

#[test]
fn python_calculator_session_with_a_caged_worker_and_a_gateway() {
    if !privileged("session") {
        return;
    }
    let Some((python, package)) = venv() else { return };
    let dir = Scratch::new("session-calc");
    let repo = calculator_repo(&dir.0);
    for who in ["kernel", "operator", "stranger"] {
        assert!(chio(&["keys", "generate", "--out", s(&dir.join(who))], &[]).status.success());
    }
    let provider = scripted_provider(FIX);
    let seen = provider.seen.clone();
    let config = dir.join("session.json");
    std::fs::write(&config, session_config(&repo, &provider.url, &python, &package).to_string()).unwrap();
    let task = dir.join("issue.md");
    std::fs::write(&task, "add() subtracts; make the tests in package/ pass.\n").unwrap();
    let state = dir.join("state");
    let out = chio(
        &["session", "init", "--config", s(&config), "--task-file", s(&task), "--state", s(&state), "--kernel-key"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "--kernel-key needs a value");
    let out = chio(
        &[
            "session",
            "init",
            "--config",
            s(&config),
            "--task-file",
            s(&task),
            "--state",
            s(&state),
            "--kernel-key",
            s(&dir.join("kernel/signing.seed")),
        ],
        &[],
    );
    assert!(out.status.success(), "init: {}", String::from_utf8_lossy(&out.stderr));
    let request_path = state.join("provisioning-request.json");
    let request: Value = serde_json::from_slice(&std::fs::read(&request_path).unwrap()).unwrap();
    assert_eq!(request["commands"]["argv_prefix"], json!(["/bin/bash", "--noprofile", "--norc", "-c"]));
    assert!(request["worker"]["network"].as_str().unwrap().starts_with("loopback only"));

    // Nothing runs before an admitted authorization; a stranger's signature is not one.
    let run = |env: &[(&str, &str)]| chio(&["session", "run", "--state", s(&state), "--json"], env);
    let with_key = [("CHIO_TEST_PROVIDER_KEY", SECRET)];
    let out = run(&with_key);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not prepared"));
    let auth = dir.join("auth.json");
    let authorize = |who: &str| {
        let seed = dir.join(who).join("signing.seed");
        let out =
            chio(&["session", "authorize", "--key", s(&seed), "--request", s(&request_path), "--out", s(&auth)], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let prepare = || {
        let key = dir.join("operator/public.key");
        chio(&["session", "prepare", "--state", s(&state), "--authorization", s(&auth), "--trusted-key", s(&key)], &[])
    };
    authorize("stranger");
    let out = prepare();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the pinned key"));
    authorize("operator");
    assert!(prepare().status.success());
    // The credential must be there (and only the gateway gets it).
    assert_eq!(run(&[]).status.code(), Some(2));

    let out = run(&with_key);
    assert!(
        out.status.success(),
        "run: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["submitted"], true, "{outcome}");
    assert_eq!(outcome["model_calls"], 4, "{outcome}");
    {
        let calls = seen.lock().unwrap();
        assert_eq!(calls.len(), 4);
        for (auth, body) in calls.iter() {
            assert_eq!(auth, &format!("Bearer {SECRET}"), "the gateway adds the credential");
            assert!(!body.contains(SECRET));
        }
        // The agent saw the failing test, then the passing one.
        assert!(calls[1].1.contains("FAILED") && calls[3].1.contains("OK"), "{}", calls[3].1);
    }
    // The worker's cage: no network, and nothing of the credential in its environment.
    let worker: Value = serde_json::from_slice(&std::fs::read(state.join("worker-launch.json")).unwrap()).unwrap();
    assert_eq!(worker["state"], "FullyEnforced", "{worker}");
    assert!(!worker.to_string().contains(SECRET) && !worker.to_string().contains("CHIO_TEST_PROVIDER_KEY"));

    // The result, verified and applied by a recipient with its own checkout and key.
    let result = dir.join("result");
    let out = chio(&["session", "result", "--state", s(&state), "--out", s(&result)], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trajectory: Value = serde_json::from_slice(&std::fs::read(result.join("trajectory.json")).unwrap()).unwrap();
    assert_eq!(trajectory["info"]["exit_status"], "Submitted");
    let recipient = dir.join("recipient");
    git(&dir.0, &["clone", "-q", s(&repo), s(&recipient)]);
    let out = chio(
        &[
            "repository",
            "verify-export",
            "--bundle",
            s(&result.join("bundle")),
            "--repository",
            s(&recipient),
            "--revision",
            "HEAD",
            "--source-path",
            "package",
            "--kernel-key",
            s(&dir.join("kernel/public.key")),
        ],
        &[],
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(out.status.success(), "{report} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(report["verified_transitions"], 4, "one a command: {report}");
    git(&recipient, &["apply", s(&result.join("bundle/changes.patch"))]);
    let t = Command::new("python3").args(["-m", "unittest"]).current_dir(recipient.join("package")).output().unwrap();
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));

    // A rerun of the completed session: no new model call, no new launch.
    let receipts = |st: &Path| {
        let out = chio(&["session", "status", "--state", s(st), "--json"], &[]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["state"].as_str().unwrap().to_string(), v["workspace"]["receipts"].as_u64().unwrap())
    };
    let before = receipts(&state);
    assert_eq!(before.0, "completed");
    let out = run(&with_key);
    assert!(out.status.success());
    assert_eq!(seen.lock().unwrap().len(), 4, "a completed session called the model again");
    assert_eq!(receipts(&state), before, "a completed session launched again");
}

/// Keys, configuration, task, init, the operator's authorization, prepare: a session ready to run.
fn prepared(dir: &Scratch, repo: &Path, provider: &Provider) -> Option<PathBuf> {
    let (python, package) = venv()?;
    for who in ["kernel", "operator"] {
        assert!(chio(&["keys", "generate", "--out", s(&dir.join(who))], &[]).status.success());
    }
    let (config, task, state) = (dir.join("session.json"), dir.join("issue.md"), dir.join("state"));
    std::fs::write(&config, session_config(repo, &provider.url, &python, &package).to_string()).unwrap();
    std::fs::write(&task, "make the tests in package/ pass\n").unwrap();
    let seed = dir.join("kernel/signing.seed");
    let init = ["session", "init", "--config", s(&config), "--task-file", s(&task), "--state", s(&state)];
    assert!(chio(&[&init[..], &["--kernel-key", s(&seed)]].concat(), &[]).status.success());
    let (auth, request) = (dir.join("auth.json"), state.join("provisioning-request.json"));
    let operator = dir.join("operator/signing.seed");
    let out = chio(&["session", "authorize", "--key", s(&operator), "--request", s(&request), "--out", s(&auth)], &[]);
    assert!(out.status.success());
    let key = dir.join("operator/public.key");
    let out =
        chio(&["session", "prepare", "--state", s(&state), "--authorization", s(&auth), "--trusted-key", s(&key)], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(state)
}

fn session_state(state: &Path) -> (String, u64) {
    let out = chio(&["session", "status", "--state", s(state), "--json"], &[]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["state"].as_str().unwrap().to_string(), v["workspace"]["receipts"].as_u64().unwrap_or(0))
}

/// A run killed while the model is thinking: nothing of it is left running; it must be
/// recovered before anything else; the next run gets the journaled answers and the retained
/// command results again (no new model call, no new launch for them) and finishes the task.
#[test]
fn a_killed_run_recovers_and_replays_without_new_model_work() {
    if !privileged("session_crash") {
        return;
    }
    let dir = Scratch::new("session-crash");
    let repo = calculator_repo(&dir.0);
    let provider = scripted_provider(FIX);
    let Some(state) = prepared(&dir, &repo, &provider) else { return };
    *provider.hold.lock().unwrap() = Some(2);
    let mut run = Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(["session", "run", "--state", s(&state)])
        .env("CHIO_TEST_PROVIDER_KEY", SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !steps(&provider.seen).contains(&2) {
        assert!(std::time::Instant::now() < until, "the agent never reached step 2: {:?}", steps(&provider.seen));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    run.kill().unwrap();
    run.wait().unwrap();
    *provider.hold.lock().unwrap() = None;
    // The gateway, the leg and the worker died with the run.
    assert_eq!(wait_gone(s(&state), std::time::Duration::from_secs(10)), Vec::<u32>::new());
    let (st, _) = session_state(&state);
    assert_eq!(st, "running_or_interrupted");
    let again = chio(&["session", "run", "--state", s(&state)], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    assert_eq!(again.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&again.stderr).contains("session recover"));
    assert!(chio(&["session", "recover", "--state", s(&state)], &[]).status.success());
    let (_, receipts) = session_state(&state);

    let out = chio(&["session", "run", "--state", s(&state), "--json"], &[("CHIO_TEST_PROVIDER_KEY", SECRET)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["submitted"], true, "{outcome}");
    // Steps 0 and 1 came from the journal; 2 was in flight at the kill (never answered), so it
    // is asked again.
    assert_eq!(steps(&provider.seen), vec![0, 1, 2, 2, 3]);
    // Commands 0 and 1 replayed their retained results: only 2 and 3 launched (three receipts
    // each: enforcement, terminal, tool_call).
    let (st, after) = session_state(&state);
    assert_eq!((st.as_str(), after - receipts), ("completed", 6));
}
