//! Claims: what a bundle (and a session, `session::claims`) shows, each one computed from the
//! evidence — the receipts under the pinned key, the recipient's own baseline, the patch applied
//! — and checked against the two ways a recipient is most easily fooled: a bundle verified under
//! a key that did not sign it, and a patch edited after signing. Never asserted: a claim that
//! was not computed is `false`, with the reason as its evidence.

use serde::Serialize;

use super::export::{verify_with_patch, VerifyReport, VerifyRequest};

/// Schema of a claims document.
pub const CLAIMS_SCHEMA: &str = "chio.claims.v1";

/// One claim, with what backs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Claim {
    /// Its name (`verified_receipts`, `edited_patch_refused`, ...).
    pub name: String,
    /// Whether the evidence shows it.
    pub holds: bool,
    /// A count, where the claim is one (`model_calls`, `verified_receipts`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    /// What was checked, in words.
    pub evidence: String,
}

impl Claim {
    /// A claim.
    pub fn new(name: &str, holds: bool, evidence: impl Into<String>) -> Claim {
        Claim { name: name.into(), holds, value: None, evidence: evidence.into() }
    }

    /// A claim that is a count.
    pub fn count(name: &str, holds: bool, value: u64, evidence: impl Into<String>) -> Claim {
        Claim { name: name.into(), holds, value: Some(value), evidence: evidence.into() }
    }
}

/// A claims document: every claim, and whether all of them hold.
#[derive(Debug, Clone, Serialize)]
pub struct Claims {
    /// Always [`CLAIMS_SCHEMA`].
    pub schema: String,
    /// What the claims are about (`bundle`, `session`).
    pub subject: String,
    /// True when every claim holds.
    pub all_hold: bool,
    /// The claims, in a fixed order.
    pub claims: Vec<Claim>,
}

impl Claims {
    /// The document of `claims` about `subject`.
    pub fn of(subject: &str, claims: Vec<Claim>) -> Claims {
        Claims {
            schema: CLAIMS_SCHEMA.into(),
            subject: subject.into(),
            all_hold: claims.iter().all(|c| c.holds),
            claims,
        }
    }

    /// The claim named `name`.
    pub fn get(&self, name: &str) -> Option<&Claim> {
        self.claims.iter().find(|c| c.name == name)
    }
}

/// The bundle's claims under `r` (the recipient's checkout, commit, scope and pinned key), and
/// the verification report they were computed from.
pub fn bundle_claims(r: &VerifyRequest) -> (VerifyReport, Vec<Claim>) {
    let report = verify_with_patch(r, None);
    let why = report.error.as_deref().unwrap_or("none");
    let mut claims = vec![
        Claim::count(
            "verified_receipts",
            report.verified_receipts > 0,
            report.verified_receipts as u64,
            format!(
                "receipts.ndjson verified under the pinned key {} as one chain: {} receipt(s); first mismatch: {why}",
                short(&r.kernel_key),
                report.verified_receipts
            ),
        ),
        Claim::count(
            "verified_transitions",
            report.verified_transitions > 0 && report.final_matches,
            report.verified_transitions as u64,
            format!(
                "{} committed transition(s) derived from the receipts equal transitions.json and end at final.tar: {}",
                report.verified_transitions, report.final_matches
            ),
        ),
        Claim::new(
            "baseline_matches",
            report.baseline_matches,
            format!(
                "the baseline recomputed from {} at {} (scope {:?}) equals the bundle's",
                r.repository.display(),
                r.revision,
                r.source_paths
            ),
        ),
        Claim::new(
            "patch_verified",
            report.patch_matches && report.error.is_none(),
            "changes.patch applied to the recipient's baseline gives exactly the final snapshot, inside the scope",
        ),
    ];
    claims.push(wrong_key_refused(r));
    claims.push(edited_patch_refused(r));
    (report, claims)
}

fn short(key: &str) -> String {
    key.chars().take(16).collect::<String>() + "…"
}

/// The bundle verified under a key made now, which signed nothing: it must be refused for the
/// key.
fn wrong_key_refused(r: &VerifyRequest) -> Claim {
    const NAME: &str = "wrong_recipient_key_refused";
    let key = match chio_kernel::keys::generate() {
        Ok(k) => chio_kernel::keys::hex(k.verifying_key().as_bytes()),
        Err(e) => return Claim::new(NAME, false, format!("no key could be made to try: {e}")),
    };
    let wrong = VerifyRequest { kernel_key: key.clone(), ..r.clone() };
    let report = verify_with_patch(&wrong, None);
    match report.error {
        Some(e) if e.contains("not the pinned key") => {
            Claim::new(NAME, true, format!("under a fresh key {} the bundle was refused: {e}", short(&key)))
        }
        Some(e) => {
            Claim::new(NAME, false, format!("under a fresh key the bundle was refused, but not for the key: {e}"))
        }
        None => Claim::new(
            NAME,
            false,
            format!("the bundle verified under a fresh key {} that signed nothing", short(&key)),
        ),
    }
}

/// The bundle verified with its patch edited: it must be refused for the patch.
fn edited_patch_refused(r: &VerifyRequest) -> Claim {
    const NAME: &str = "edited_patch_refused";
    let patch = match super::export::read_bundle(r, "changes.patch") {
        Ok(p) => p,
        Err(e) => return Claim::new(NAME, false, format!("changes.patch could not be read to edit: {e}")),
    };
    let (edited, how) = edit(&patch, r.source_paths.first().map_or("", String::as_str));
    let report = verify_with_patch(r, Some(&edited));
    match report.error {
        Some(e) if e.contains("changes.patch") => Claim::new(NAME, true, format!("{how}: refused: {e}")),
        Some(e) => Claim::new(NAME, false, format!("{how}: refused, but not for the patch: {e}")),
        None => Claim::new(NAME, false, format!("{how}: the edited patch verified")),
    }
}

/// `patch` edited as a sender would after signing: its last added line changed, or (an empty
/// patch) a new file added under `scope`.
fn edit(patch: &[u8], scope: &str) -> (Vec<u8>, String) {
    let text = String::from_utf8_lossy(patch);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let last_added = lines.iter().rposition(|l| l.starts_with('+') && !l.starts_with("+++"));
    match last_added {
        Some(i) => {
            let mut out = String::new();
            for (n, l) in lines.iter().enumerate() {
                if n == i {
                    out.push_str(l.trim_end_matches('\n'));
                    out.push_str(" # edited\n");
                } else {
                    out.push_str(l);
                }
            }
            (out.into_bytes(), format!("line {} of changes.patch edited", i + 1))
        }
        None => {
            let path = match scope {
                "" | super::git_source::WHOLE_TREE => "chio-claims-edit.txt".to_string(),
                s => format!("{s}/chio-claims-edit.txt"),
            };
            let added = format!(
                "diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+edited\n"
            );
            let mut out = patch.to_vec();
            out.extend_from_slice(added.as_bytes());
            (out, format!("a new file {path} added to changes.patch"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_changes_the_last_added_line_or_adds_a_file() {
        let patch = b"diff --git a/p/x b/p/x\n--- a/p/x\n+++ b/p/x\n@@ -1 +1 @@\n-a\n+b\n";
        let (e, how) = edit(patch, "p");
        assert!(String::from_utf8(e).unwrap().ends_with("+b # edited\n"), "{how}");
        let (e, _) = edit(b"", "p");
        assert!(String::from_utf8(e).unwrap().contains("+++ b/p/chio-claims-edit.txt"));
    }

    #[test]
    fn all_hold_only_when_every_claim_does() {
        let c = Claims::of("bundle", vec![Claim::new("a", true, ""), Claim::new("b", false, "")]);
        assert!(!c.all_hold);
        assert!(Claims::of("bundle", vec![Claim::new("a", true, "")]).all_hold);
    }
}
