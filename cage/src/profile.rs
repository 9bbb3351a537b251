//! A syscall profile a plan brings of its own (an OCI config's `linux.seccomp`), compiled into a
//! second filter stacked under chio's allow-list. The kernel runs every filter a process has
//! and takes the strictest verdict, so a profile can narrow what the cage allows and never
//! widen it: what chio refuses stays refused whatever the profile says.
//!
//! Within the profile, a syscall's rules are tried strictest verdict first and the first whose
//! argument checks all hold decides; none holding, the default does. (libseccomp resolves
//! overlapping rules by its own precedence; taking the strictest that matches never allows
//! what any matching rule refuses.) Argument checks compare all 64 bits, as libseccomp does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::seccomp::{self, ins, ret, Program};

/// A profile: a verdict for every syscall no rule decides, and the rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallProfile {
    /// The verdict for a syscall no rule matches.
    pub default: Verdict,
    /// The rules, each for one syscall number (x86_64).
    pub rules: Vec<SyscallRule>,
}

/// One rule: syscall `nr` gets `verdict` when every argument check holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallRule {
    /// The x86_64 syscall number.
    pub nr: u32,
    /// What the kernel answers.
    pub verdict: Verdict,
    /// Checks on the arguments, all of which must hold (none: always).
    #[serde(default)]
    pub args: Vec<ArgCheck>,
}

/// A comparison of one argument (the whole 64 bits) with a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgCheck {
    /// Which argument, 0 to 5.
    pub index: u8,
    /// How it is compared.
    pub op: CmpOp,
    /// The value compared with (for `MaskedEq`, the mask).
    pub value: u64,
    /// For `MaskedEq`, the value the masked argument must equal.
    #[serde(default)]
    pub value_two: u64,
}

/// The comparisons of the OCI runtime spec (libseccomp's `SCMP_CMP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CmpOp {
    /// The argument differs from `value`.
    Ne,
    /// The argument is below `value`.
    Lt,
    /// The argument is at most `value`.
    Le,
    /// The argument is `value`.
    Eq,
    /// The argument is at least `value`.
    Ge,
    /// The argument is above `value`.
    Gt,
    /// The argument masked with `value` is `value_two`.
    MaskedEq,
}

/// What a profile may answer. Not `SCMP_ACT_TRACE` or `SCMP_ACT_NOTIFY`: those hand the call
/// to another process, and the cage's only tracer is chio's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The process is killed (the strictest: verdicts are ordered as the kernel ranks them).
    KillProcess,
    /// The calling thread is killed.
    KillThread,
    /// The thread gets SIGSYS.
    Trap,
    /// The call fails with this errno.
    Errno(u16),
    /// The call runs and is logged.
    Log,
    /// The call runs.
    Allow,
}

impl Verdict {
    fn ret(self) -> u32 {
        match self {
            Verdict::KillProcess => 0x8000_0000,
            Verdict::KillThread => 0,
            Verdict::Trap => 0x0003_0000,
            Verdict::Errno(e) => 0x0005_0000 | u32::from(e),
            Verdict::Log => 0x7ffc_0000,
            Verdict::Allow => 0x7fff_0000,
        }
    }
}

/// The largest errno a filter can return (the kernel caps SECCOMP_RET_DATA there).
const MAX_ERRNO: u16 = 4095;

/// A jump target while a rule is assembled: the next instruction plus `n`, or the rule's end
/// (where the next rule, or the default, begins).
#[derive(Clone, Copy)]
enum To {
    Skip(u8),
    Fail,
}

/// An instruction whose jumps may still point at the rule's end.
struct Pending {
    code: u16,
    jt: To,
    jf: To,
    k: u32,
}

fn op(code: u16, jt: To, jf: To, k: u32) -> Pending {
    Pending { code, jt, jf, k }
}

fn load(k: u32) -> Pending {
    op(seccomp::LD_ABS, To::Skip(0), To::Skip(0), k)
}

/// One argument check; falling through past its last instruction means it holds.
fn check(a: &ArgCheck) -> Vec<Pending> {
    use seccomp::{AND_K, JEQ, JGE, JGT};
    let (lo, hi) = (seccomp::off_arg_low(u32::from(a.index)), seccomp::off_arg_low(u32::from(a.index)) + 4);
    let (vh, vl) = ((a.value >> 32) as u32, a.value as u32);
    let (ok, fail) = (To::Skip(0), To::Fail);
    match a.op {
        CmpOp::Eq => vec![load(hi), op(JEQ, ok, fail, vh), load(lo), op(JEQ, ok, fail, vl)],
        // Unequal high halves hold at once (skip the low half's two instructions).
        CmpOp::Ne => vec![load(hi), op(JEQ, ok, To::Skip(2), vh), load(lo), op(JEQ, fail, ok, vl)],
        CmpOp::MaskedEq => {
            let (dh, dl) = ((a.value_two >> 32) as u32, a.value_two as u32);
            vec![
                load(hi),
                op(AND_K, ok, ok, vh),
                op(JEQ, ok, fail, dh),
                load(lo),
                op(AND_K, ok, ok, vl),
                op(JEQ, ok, fail, dl),
            ]
        }
        // A greater high half decides; an equal one defers to the low half; a smaller fails.
        CmpOp::Gt | CmpOp::Ge => {
            let low = if a.op == CmpOp::Gt { JGT } else { JGE };
            vec![load(hi), op(JGT, To::Skip(3), ok, vh), op(JEQ, ok, fail, vh), load(lo), op(low, ok, fail, vl)]
        }
        // The complement: a greater high half fails; a smaller one holds.
        CmpOp::Lt | CmpOp::Le => {
            let low = if a.op == CmpOp::Lt { JGE } else { JGT };
            vec![load(hi), op(JGT, fail, ok, vh), op(JEQ, ok, To::Skip(2), vh), load(lo), op(low, fail, ok, vl)]
        }
    }
}

/// The rules of one syscall, strictest first, then the default: every path returns.
fn body(rules: &[&SyscallRule], default: Verdict) -> Result<Program, String> {
    let mut sorted: Vec<&SyscallRule> = rules.to_vec();
    sorted.sort_by_key(|r| (r.verdict, !r.args.is_empty()));
    let mut out = Program::new();
    for r in sorted {
        let mut pending: Vec<Pending> = r.args.iter().flat_map(check).collect();
        pending.push(op(seccomp::RET, To::Skip(0), To::Skip(0), r.verdict.ret()));
        let end = pending.len();
        for (i, p) in pending.iter().enumerate() {
            let resolve = |t: To| match t {
                To::Skip(n) => Ok(n),
                To::Fail => {
                    u8::try_from(end - i - 1).map_err(|_| format!("syscall {}: too many argument checks", r.nr))
                }
            };
            out.push(ins(p.code, resolve(p.jt)?, resolve(p.jf)?, p.k));
        }
        if r.args.is_empty() {
            // An unconditional rule decides: the rest of this syscall's rules cannot be reached.
            return Ok(out);
        }
    }
    out.push(ret(default.ret()));
    Ok(out)
}

/// The profile's rules, grouped by syscall number.
fn by_number(p: &SyscallProfile) -> Result<BTreeMap<u32, Vec<&SyscallRule>>, String> {
    let mut cases: BTreeMap<u32, Vec<&SyscallRule>> = BTreeMap::new();
    for r in &p.rules {
        if let Some(a) = r.args.iter().find(|a| a.index > 5) {
            return Err(format!("syscall {}: argument index {} (a syscall has 6)", r.nr, a.index));
        }
        if matches!(r.verdict, Verdict::Errno(e) if e > MAX_ERRNO) {
            return Err(format!("syscall {}: errno {:?} is over {MAX_ERRNO}", r.nr, r.verdict));
        }
        cases.entry(r.nr).or_default().push(r);
    }
    if matches!(p.default, Verdict::Errno(e) if e > MAX_ERRNO) {
        return Err(format!("default errno {:?} is over {MAX_ERRNO}", p.default));
    }
    Ok(cases)
}

/// Compile a profile: x86_64 only (anything else killed), x32 numbers get the default, then a
/// binary search over the syscall numbers its rules name.
pub fn compile(p: &SyscallProfile) -> Result<Program, String> {
    let cases = by_number(p)?;
    let bodies: BTreeMap<u32, Program> =
        cases.iter().map(|(nr, rules)| Ok((*nr, body(rules, p.default)?))).collect::<Result<_, String>>()?;
    let default = vec![ret(p.default.ret())];
    let mut out = vec![
        ins(seccomp::LD_ABS, 0, 0, seccomp::OFF_ARCH),
        ins(seccomp::JEQ, 1, 0, seccomp::AUDIT_ARCH_X86_64),
        ret(seccomp::RET_KILL_PROCESS),
        ins(seccomp::LD_ABS, 0, 0, seccomp::OFF_NR),
    ];
    out.extend(seccomp::search_with(&seccomp::runs(&bodies), &|b: &Option<Program>| {
        b.clone().unwrap_or_else(|| default.clone())
    }));
    seccomp::check_len(&out)?;
    Ok(out)
}

/// SHA-256 over every instruction of a program, as the launch record gives it.
pub fn sha256(prog: &Program) -> String {
    let mut h = Sha256::new();
    for i in prog {
        h.update(i.code.to_le_bytes());
        h.update([i.jt, i.jf]);
        h.update(i.k.to_le_bytes());
    }
    seccomp::hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seccomp::tests::run;

    const X86_64: u32 = seccomp::AUDIT_ARCH_X86_64;
    const EPERM: Verdict = Verdict::Errno(libc::EPERM as u16);

    fn rule(nr: libc::c_long, verdict: Verdict, args: Vec<ArgCheck>) -> SyscallRule {
        SyscallRule { nr: nr as u32, verdict, args }
    }

    fn arg(index: u8, op: CmpOp, value: u64, value_two: u64) -> ArgCheck {
        ArgCheck { index, op, value, value_two }
    }

    /// Each comparison against values on both sides of a boundary in the high and the low
    /// half, with Rust's own comparison as the answer.
    #[test]
    fn every_comparison_compares_all_64_bits() {
        let v: u64 = 0x0000_0001_8000_0000;
        let probes =
            [0, 1, v - 1, v, v + 1, v + (1 << 32), v - (1 << 32), 0x8000_0000, u64::MAX, 0x0000_0001_0000_0000];
        type Holds = fn(u64, u64) -> bool;
        let ops: [(CmpOp, Holds); 6] = [
            (CmpOp::Eq, |a, b| a == b),
            (CmpOp::Ne, |a, b| a != b),
            (CmpOp::Lt, |a, b| a < b),
            (CmpOp::Le, |a, b| a <= b),
            (CmpOp::Gt, |a, b| a > b),
            (CmpOp::Ge, |a, b| a >= b),
        ];
        for (op, holds) in ops {
            let p = SyscallProfile {
                default: Verdict::Allow,
                rules: vec![rule(libc::SYS_ioctl, EPERM, vec![arg(2, op, v, 0)])],
            };
            let prog = compile(&p).unwrap();
            for x in probes {
                let got = run(&prog, libc::SYS_ioctl as u32, X86_64, [0, 0, x, 0, 0, 0]);
                let want = if holds(x, v) { EPERM.ret() } else { Verdict::Allow.ret() };
                assert_eq!(got, want, "{op:?}: {x:#x} against {v:#x}");
            }
        }
        let masked = SyscallProfile {
            default: Verdict::Allow,
            rules: vec![rule(libc::SYS_clone, EPERM, vec![arg(0, CmpOp::MaskedEq, 0x1_0000_00ff, 0x1_0000_0011)])],
        };
        let prog = compile(&masked).unwrap();
        for (x, refused) in [(0x1_0000_0011u64, true), (0x1_ffff_ff11, true), (0x11, false), (0x1_0000_0012, false)] {
            let got = run(&prog, libc::SYS_clone as u32, X86_64, [x, 0, 0, 0, 0, 0]);
            assert_eq!(got == EPERM.ret(), refused, "masked {x:#x}");
        }
    }

    /// The shape of the engines' default profiles: an errno default, an allow-list, a syscall
    /// allowed only for some argument values, and one refused with its own errno.
    #[test]
    fn an_allow_list_profile_decides_each_syscall() {
        let p = SyscallProfile {
            default: EPERM,
            rules: vec![
                rule(libc::SYS_read, Verdict::Allow, vec![]),
                rule(libc::SYS_write, Verdict::Allow, vec![]),
                rule(libc::SYS_personality, Verdict::Allow, vec![arg(0, CmpOp::Eq, 0, 0)]),
                rule(libc::SYS_personality, Verdict::Allow, vec![arg(0, CmpOp::Eq, 8, 0)]),
                rule(libc::SYS_clone3, Verdict::Errno(libc::ENOSYS as u16), vec![]),
            ],
        };
        let prog = compile(&p).unwrap();
        let at = |nr: libc::c_long, a0: u64| run(&prog, nr as u32, X86_64, [a0, 0, 0, 0, 0, 0]);
        assert_eq!(at(libc::SYS_read, 0), Verdict::Allow.ret());
        assert_eq!(at(libc::SYS_write, 0), Verdict::Allow.ret());
        assert_eq!(at(libc::SYS_personality, 8), Verdict::Allow.ret());
        assert_eq!(at(libc::SYS_personality, 0), Verdict::Allow.ret());
        assert_eq!(at(libc::SYS_personality, 0x40000), EPERM.ret(), "neither value: the default");
        assert_eq!(at(libc::SYS_clone3, 0), 0x0005_0000 | libc::ENOSYS as u32);
        assert_eq!(at(libc::SYS_mount, 0), EPERM.ret());
        assert_eq!(at(libc::SYS_open, 0), EPERM.ret(), "a number below every rule");
        assert_eq!(at(999, 0), EPERM.ret(), "a number past every rule");
        assert_eq!(run(&prog, 0, 0x4000_0003, [0; 6]), seccomp::RET_KILL_PROCESS, "i386 is killed");
    }

    /// Overlapping rules for one syscall: the strictest that matches decides, whatever their
    /// order in the profile; an unconditional one shadows looser rules.
    #[test]
    fn the_strictest_matching_rule_decides() {
        let p = SyscallProfile {
            default: Verdict::Allow,
            rules: vec![
                rule(libc::SYS_kill, Verdict::Allow, vec![arg(1, CmpOp::Eq, 9, 0)]),
                rule(libc::SYS_kill, Verdict::Errno(1), vec![arg(1, CmpOp::Ge, 9, 0)]),
                rule(libc::SYS_kill, Verdict::KillProcess, vec![arg(0, CmpOp::Eq, 1, 0)]),
                rule(libc::SYS_getpid, Verdict::Allow, vec![]),
                rule(libc::SYS_getpid, Verdict::Errno(13), vec![]),
            ],
        };
        let prog = compile(&p).unwrap();
        let kill = |pid: u64, sig: u64| run(&prog, libc::SYS_kill as u32, X86_64, [pid, sig, 0, 0, 0, 0]);
        assert_eq!(kill(5, 9), Verdict::Errno(1).ret(), "allow and errno both match: errno");
        assert_eq!(kill(1, 9), Verdict::KillProcess.ret());
        assert_eq!(kill(5, 2), Verdict::Allow.ret(), "no rule matches: the default");
        assert_eq!(run(&prog, libc::SYS_getpid as u32, X86_64, [0; 6]), Verdict::Errno(13).ret());
    }

    #[test]
    fn a_profile_it_cannot_compile_is_refused() {
        let bad_index =
            SyscallProfile { default: Verdict::Allow, rules: vec![rule(0, EPERM, vec![arg(6, CmpOp::Eq, 0, 0)])] };
        assert!(compile(&bad_index).unwrap_err().contains("argument index 6"));
        let bad_errno = SyscallProfile { default: Verdict::Allow, rules: vec![rule(0, Verdict::Errno(5000), vec![])] };
        assert!(compile(&bad_errno).unwrap_err().contains("over 4095"));
    }
}
