//! `chio session claims`: what a session shows an operator, each claim computed from its state —
//! the operator's signed authorization, the worker's launch record, the model-call journal, the
//! workspace's receipts exported and verified as a recipient would (against the source
//! repository, under the pinned key), and the bundle's checks against a wrong key and an edited
//! patch. Reading the state changes nothing in it.

use std::fs;
use std::path::Path;

use serde_json::Value;

use super::{gateway, open, status, Session};
use crate::repository::claims::{bundle_claims, Claim, Claims};
use crate::repository::export::{self, VerifyRequest};
use crate::repository::git_source;
use crate::repository::workspace::{self, RepoError};

/// The session's claims; `pinned_key` is the kernel key the recipient pins (hex), `None` the
/// workspace's own (said in the evidence: a recipient should pin the key it was given).
pub fn claims(dir: &Path, pinned_key: Option<&str>) -> Result<Claims, RepoError> {
    let s = open(dir)?;
    let st = status(dir)?;
    let mut out = vec![
        authorized(&s),
        Claim::new("session_completed", st.state == "completed", format!("the session is {} (status)", st.state)),
        submitted(&st),
        worker_enforced(&s),
        credential_kept_out(&s),
    ];
    out.extend(journal_claims(&s, &st)?);
    out.push(spend(&s)?);
    // The recipient's check, on a bundle exported now into a scratch directory.
    export::sweep_stale(&std::env::temp_dir(), "claims");
    let tmp = export::scratch(&std::env::temp_dir(), "claims")?;
    let bundle = tmp.dir.join("bundle");
    let (commit, key, scope, own_key) = {
        let ws = workspace::open(&s.workspace_dir())?;
        export::export(&ws, &bundle)?;
        let own = ws.config.kernel_public_key.clone();
        (ws.config.source_commit.clone(), pinned_key.map_or(own.clone(), str::to_string), ws.config.source_paths, own)
    };
    let request = VerifyRequest {
        bundle,
        repository: s.config.repository.clone(),
        revision: commit.clone(),
        source_paths: scope,
        kernel_key: key.clone(),
        server_id: None,
    };
    let (_, mut checked) = bundle_claims(&request);
    if pinned_key.is_none() {
        for c in checked.iter_mut().filter(|c| c.name == "verified_receipts") {
            c.evidence += " (the key is the workspace's own: pin the one you were given with --kernel-key)";
        }
    } else if key != own_key {
        for c in checked.iter_mut().filter(|c| c.name == "verified_receipts") {
            c.evidence += &format!(" (the workspace names kernel key {own_key})");
        }
    }
    let baseline = checked.iter().any(|c| c.name == "baseline_matches" && c.holds);
    out.extend(checked);
    out.push(source_unchanged(&s, &commit, baseline, &tmp.dir));
    out.push(refusals_signed(&s, &key));
    Ok(Claims::of("session", out))
}

fn authorized(s: &Session) -> Claim {
    const NAME: &str = "operator_authorized";
    match s.check_authorized() {
        Ok(_) => {
            let key = fs::read_to_string(s.dir.join("operator.key")).unwrap_or_default();
            Claim::new(
                NAME,
                true,
                format!(
                    "authorization.signed.json verifies under the operator key {} and admits this session's exact \
                     provisioning request",
                    key.trim()
                ),
            )
        }
        Err(e) => Claim::new(NAME, false, e.to_string()),
    }
}

fn submitted(st: &super::SessionStatus) -> Claim {
    let status = st.outcome.as_ref().and_then(|o| o.agent_exit_status.clone());
    Claim::new(
        "agent_submitted",
        st.outcome.as_ref().is_some_and(|o| o.submitted),
        format!("the agent's trajectory ends {}", status.as_deref().unwrap_or("without a status")),
    )
}

/// The worker's launch record, as the run kept it.
fn worker_record(s: &Session) -> Result<Value, String> {
    let bytes = crate::repository::bounded::read_regular(&s.dir.join("worker-launch.json"), 16 << 20, libc::O_NOFOLLOW)
        .map_err(|e| format!("worker-launch.json: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("worker-launch.json: {e}"))
}

fn worker_enforced(s: &Session) -> Claim {
    const NAME: &str = "worker_fully_enforced";
    match worker_record(s) {
        Ok(r) => Claim::new(
            NAME,
            r["state"] == "FullyEnforced",
            format!(
                "the worker's launch record: {} at the observed exec of {} (sha256 {})",
                r["state"].as_str().unwrap_or("no state"),
                r["target"]["path"].as_str().unwrap_or("?"),
                r["target"]["sha256"].as_str().unwrap_or("?")
            ),
        ),
        Err(e) => Claim::new(NAME, false, e),
    }
}

fn credential_kept_out(s: &Session) -> Claim {
    const NAME: &str = "credential_never_in_worker";
    let name = &s.config.model.credential_env;
    let signed = s.request.worker.env.iter().any(|v| v == name);
    let recorded = worker_record(s).map(|r| r.to_string().contains(name.as_str()));
    match recorded {
        Ok(recorded) => Claim::new(
            NAME,
            !signed && !recorded,
            format!(
                "{name} is {} the worker's signed variables and {} its launch record",
                if signed { "among" } else { "not among" },
                if recorded { "named in" } else { "absent from" }
            ),
        ),
        Err(e) => Claim::new(NAME, false, e),
    }
}

/// The model-call journal: calls answered, none of unknown outcome, none sent twice, no new
/// model work after the outcome was written.
fn journal_claims(s: &Session, st: &super::SessionStatus) -> Result<Vec<Claim>, RepoError> {
    let calls = s.model_calls()?;
    let limit = u64::from(s.config.agent.step_limit);
    let unknown = gateway::unknown_call(&s.calls_dir())?;
    let resent = gateway::resent_calls(&s.calls_dir())?;
    let journaled = Claim::count(
        "model_calls",
        unknown.is_none() && calls <= limit,
        calls,
        match unknown {
            Some(n) => {
                format!("{calls} answered call(s) journaled; call {n} was sent and never answered (unknown outcome)")
            }
            None => format!(
                "{calls} answered call(s) journaled in model-calls/, none of unknown outcome, step limit {limit}"
            ),
        },
    );
    let once = Claim::new(
        "no_model_call_sent_twice",
        resent.is_empty(),
        if resent.is_empty() {
            "no call of the journal was sent again (no NNNNNN.resent record)".to_string()
        } else {
            format!(
                "call(s) {resent:?} of unknown outcome were sent again (run --resend-unknown): possibly billed twice"
            )
        },
    );
    let replay = match &st.outcome {
        Some(o) => Claim::new(
            "completed_replay_did_no_new_model_work",
            o.model_calls == calls && unknown.is_none(),
            format!(
                "the outcome counted {} model call(s) and the journal holds {calls}: a later run answered from the journal",
                o.model_calls
            ),
        ),
        None => Claim::new("completed_replay_did_no_new_model_work", false, "the session has no completed run"),
    };
    Ok(vec![journaled, once, replay])
}

/// The session's model spend against its budget, from the journal's priced calls.
fn spend(s: &Session) -> Result<Claim, RepoError> {
    const NAME: &str = "model_spend_within_budget";
    let spent = gateway::spent(&s.calls_dir())?;
    let attempts = gateway::attempts(&s.calls_dir())?;
    Ok(match &s.config.model.budget {
        Some(b) => Claim::count(
            NAME,
            spent <= b.max_cost_microusd,
            spent,
            format!(
                "{spent} µUSD spent of a {} µUSD ceiling ({} and {} µUSD a million prompt and completion tokens, at                  most {} completion tokens a call); {attempts} request(s) sent to the provider",
                b.max_cost_microusd, b.input_microusd_per_mtok, b.output_microusd_per_mtok, b.max_output_tokens
            ),
        ),
        None => Claim::count(
            NAME,
            true,
            spent,
            format!("no budget configured (no prices: spend not counted); {attempts} request(s) sent to the provider"),
        ),
    })
}

/// Every refusal of the gateway's budget or grant limits is a signed denial, the store's chain
/// whole under the key.
fn refusals_signed(s: &Session, key: &str) -> Claim {
    const NAME: &str = "refusals_signed";
    let db = s.dir.join("model-receipts.db");
    if !db.exists() {
        return Claim::count(NAME, true, 0, "no call was refused by the budget or the grant (no model-receipts.db)");
    }
    let counted = chio_kernel::store::Store::open_read_only(&db).and_then(|store| {
        let chain = store.verify_chain(Some(key), None, None)?;
        let denials = store.list(&chio_kernel::store::Filter {
            kind: Some("denial".into()),
            limit: i64::MAX as u64,
            ..Default::default()
        })?;
        Ok((chain, denials.len() as u64))
    });
    match counted {
        Ok((chain, n)) => Claim::count(
            NAME,
            chain.problems.is_empty(),
            n,
            if chain.problems.is_empty() {
                format!(
                    "{n} refusal(s), each a denial receipt in model-receipts.db; {} receipt(s) verified as one chain",
                    chain.checked
                )
            } else {
                {
                    let problems: Vec<String> =
                        chain.problems.iter().map(|(seq, id, why)| format!("receipt {seq} ({id}): {why}")).collect();
                    format!("model-receipts.db does not verify: {}", problems.join("; "))
                }
            },
        ),
        Err(e) => Claim::new(NAME, false, format!("model-receipts.db: {e}")),
    }
}

/// The configured revision still names the session's commit in the source repository, and the
/// baseline recomputed from it (the recipient's check) is the session's.
fn source_unchanged(s: &Session, commit: &str, baseline: bool, scratch: &Path) -> Claim {
    const NAME: &str = "source_unchanged";
    let at = scratch.join("resolve");
    let now = fs::create_dir(&at)
        .map_err(|e| e.to_string())
        .and_then(|()| git_source::resolve(&s.config.repository, &s.config.revision, &at).map_err(|e| e.to_string()));
    match now {
        Ok(c) if c == commit => Claim::new(
            NAME,
            baseline,
            format!(
                "{} {:?} still names commit {commit}, whose tree in scope {} the session's baseline",
                s.config.repository.display(),
                s.config.revision,
                if baseline { "is" } else { "is not" }
            ),
        ),
        Ok(c) => {
            Claim::new(NAME, false, format!("{:?} now names {c}, not the session's commit {commit}", s.config.revision))
        }
        Err(e) => Claim::new(NAME, false, format!("the source repository could not be read: {e}")),
    }
}
