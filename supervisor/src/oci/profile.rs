//! A config's `linux.seccomp` as the cage's syscall profile, stacked under chio's allow-list:
//! the container gets the stricter answer of the two for every call, so the profile can take
//! away what chio allows and never give what chio refuses.
//!
//! Refused: actions that hand a call to another process (`SCMP_ACT_NOTIFY`, a listener
//! socket, `SCMP_ACT_TRACE` — the cage's only tracer is chio's), an argument index past the
//! six a syscall has, an errno past 4095. Syscall names this host's table does not know are
//! skipped, as runc skips them, and listed in the record; so are the filter flags and
//! architectures the cage does not use (chio's filter kills every other architecture).

use chio_cage::{ArgCheck, CmpOp, SyscallProfile, SyscallRule, Verdict};
use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompAction, LinuxSeccompOperator};

/// What a config's profile becomes.
pub struct Translated {
    /// The profile to stack (None: the config's allows everything, nothing to stack).
    pub profile: Option<SyscallProfile>,
    /// What was skipped or ignored, for the record.
    pub notes: Vec<String>,
}

fn verdict(action: LinuxSeccompAction, errno: Option<u32>, what: &str) -> Result<Verdict, String> {
    Ok(match action {
        LinuxSeccompAction::ScmpActAllow => Verdict::Allow,
        LinuxSeccompAction::ScmpActLog => Verdict::Log,
        LinuxSeccompAction::ScmpActErrno => {
            let e = errno.unwrap_or(libc::EPERM as u32);
            Verdict::Errno(
                u16::try_from(e)
                    .ok()
                    .filter(|e| *e <= 4095)
                    .ok_or_else(|| format!("seccomp: {what} returns errno {e}, past 4095"))?,
            )
        }
        LinuxSeccompAction::ScmpActTrap => Verdict::Trap,
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => Verdict::KillThread,
        LinuxSeccompAction::ScmpActKillProcess => Verdict::KillProcess,
        LinuxSeccompAction::ScmpActTrace | LinuxSeccompAction::ScmpActNotify => {
            return Err(format!(
                "seccomp: {what} is {action}, which hands the call to another process (the cage's only tracer \
                 is chio's own)"
            ))
        }
    })
}

fn cmp(op: LinuxSeccompOperator) -> CmpOp {
    match op {
        LinuxSeccompOperator::ScmpCmpNe => CmpOp::Ne,
        LinuxSeccompOperator::ScmpCmpLt => CmpOp::Lt,
        LinuxSeccompOperator::ScmpCmpLe => CmpOp::Le,
        LinuxSeccompOperator::ScmpCmpEq => CmpOp::Eq,
        LinuxSeccompOperator::ScmpCmpGe => CmpOp::Ge,
        LinuxSeccompOperator::ScmpCmpGt => CmpOp::Gt,
        LinuxSeccompOperator::ScmpCmpMaskedEq => CmpOp::MaskedEq,
    }
}

/// Translate `s`, or every reason it cannot be stacked.
pub fn translate(s: &LinuxSeccomp) -> Result<Translated, Vec<String>> {
    let mut refused = Vec::new();
    let mut notes = Vec::new();
    if s.listener_path().is_some() {
        refused.push("seccomp: a listener path asks for a user-space supervisor of syscalls".to_string());
    }
    let default = verdict(s.default_action(), s.default_errno_ret(), "the default action").unwrap_or_else(|e| {
        refused.push(e);
        Verdict::Allow
    });
    let mut rules = Vec::new();
    let mut unknown = Vec::new();
    for (i, sc) in s.syscalls().iter().flatten().enumerate() {
        let v = match verdict(sc.action(), sc.errno_ret(), &format!("syscalls[{i}]")) {
            Ok(v) => v,
            Err(e) => {
                refused.push(e);
                continue;
            }
        };
        let mut args = Vec::new();
        for a in sc.args().iter().flatten() {
            match u8::try_from(a.index()).ok().filter(|i| *i < 6) {
                Some(index) => args.push(ArgCheck {
                    index,
                    op: cmp(a.op()),
                    value: a.value(),
                    value_two: a.value_two().unwrap_or(0),
                }),
                None => refused.push(format!("seccomp: syscalls[{i}] checks argument {} of 6", a.index())),
            }
        }
        for name in sc.names() {
            match chio_cage::seccomp::syscall_number(name) {
                Some(nr) => rules.push(SyscallRule { nr, verdict: v, args: args.clone() }),
                None => unknown.push(name.clone()),
            }
        }
    }
    if !refused.is_empty() {
        return Err(refused);
    }
    if !unknown.is_empty() {
        unknown.sort();
        unknown.dedup();
        notes.push(format!("syscalls this host's table does not have, skipped: {}", unknown.join(", ")));
    }
    if s.flags().as_ref().is_some_and(|f| !f.is_empty()) {
        notes.push("filter flags are not applied (the stacked filter is installed plainly)".into());
    }
    let profile = match default == Verdict::Allow && rules.iter().all(|r| r.verdict == Verdict::Allow) {
        true => None,
        false => Some(SyscallProfile { default, rules }),
    };
    Ok(Translated { profile, notes })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(v: serde_json::Value) -> LinuxSeccomp {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_engines_profile_becomes_rules_by_number() {
        let t = translate(&parse(serde_json::json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "defaultErrnoRet": 1,
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"],
            "syscalls": [
                {"names": ["read", "write", "no_such_call"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
                {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]}
            ]
        })))
        .unwrap();
        let p = t.profile.unwrap();
        assert_eq!(p.default, Verdict::Errno(1));
        let nrs: Vec<u32> = p.rules.iter().map(|r| r.nr).collect();
        assert_eq!(nrs, [0, 1, 435, 135]);
        assert_eq!(p.rules[2].verdict, Verdict::Errno(38));
        assert_eq!(p.rules[3].args, vec![ArgCheck { index: 0, op: CmpOp::Eq, value: 8, value_two: 0 }]);
        assert!(t.notes[0].contains("no_such_call"), "{:?}", t.notes);
    }

    #[test]
    fn what_hands_a_call_away_is_refused() {
        for (v, want) in [
            (serde_json::json!({"defaultAction": "SCMP_ACT_NOTIFY"}), "SCMP_ACT_NOTIFY"),
            (
                serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW",
                    "syscalls": [{"names": ["read"], "action": "SCMP_ACT_TRACE"}]}),
                "SCMP_ACT_TRACE",
            ),
            (
                serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/agent.sock"}),
                "listener path",
            ),
            (
                serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"],
                    "action": "SCMP_ACT_ERRNO", "args": [{"index": 6, "value": 0, "op": "SCMP_CMP_EQ"}]}]}),
                "argument 6",
            ),
            (serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 70000}), "errno 70000"),
        ] {
            let why = translate(&parse(v)).err().unwrap().join("; ");
            assert!(why.contains(want), "{want}: {why}");
        }
    }

    #[test]
    fn a_profile_that_allows_everything_stacks_nothing() {
        let t = translate(&parse(serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]})))
        .unwrap();
        assert!(t.profile.is_none());
    }
}
