//! The seccomp compiler: the reviewed table (`policies/seccomp-x86_64.tsv`) into classic BPF, a
//! binary search over runs of syscall numbers with one decision. Pure code over `libc`'s
//! types and constants: the crate's build script compiles the target's filter with it (so a
//! launch only copies the finished program), and the crate compiles a workload's own profile
//! with it at run time.

use std::collections::BTreeMap;

/// Every `CLONE_NEW*` flag (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME).
pub const CLONE_NEW_MASK: u64 = 0x7E02_0080;
/// TIOCSTI: push a byte into a terminal's input queue.
pub const TIOCSTI: u64 = 0x5412;
/// TIOCLINUX: console subcommands, including selection paste.
pub const TIOCLINUX: u64 = 0x541C;

/// A classic BPF program.
pub type Program = Vec<libc::sock_filter>;

pub(crate) const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
pub(crate) const RET_KILL_PROCESS: u32 = 0x8000_0000;
pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
pub(crate) const RET_ERRNO: u32 = 0x0005_0000;
pub(crate) const LD_ABS: u16 = 0x20;
pub(crate) const JEQ: u16 = 0x15;
pub(crate) const JGT: u16 = 0x25;
pub(crate) const JGE: u16 = 0x35;
pub(crate) const JSET: u16 = 0x45;
pub(crate) const JA: u16 = 0x05;
pub(crate) const AND_K: u16 = 0x54;
pub(crate) const RET: u16 = 0x06;
/// Offsets in `struct seccomp_data`: nr, arch, and the low 32 bits of each argument.
pub(crate) const OFF_NR: u32 = 0;
pub(crate) const OFF_ARCH: u32 = 4;
pub(crate) const fn off_arg_low(i: u32) -> u32 {
    16 + 8 * i
}

pub(crate) fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

pub(crate) fn ret(k: u32) -> libc::sock_filter {
    ins(RET, 0, 0, k)
}

pub(crate) fn eperm() -> libc::sock_filter {
    ret(RET_ERRNO | libc::EPERM as u32)
}

/// What one syscall number leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Allow,
    Enosys,
    /// clone: no CLONE_NEW* flag (they all live in the low 32 bits).
    CloneNoNamespaces,
    /// ioctl: anything but TIOCSTI/TIOCLINUX, compared on the low 32 bits the kernel uses, so
    /// `TIOCSTI | 1 << 32` cannot slip past.
    IoctlNoTiocsti,
    /// socket: unix, IPv4/IPv6 TCP and UDP only — no netlink, vsock, packet, raw,
    /// `SOCK_PACKET`, MPTCP or SCTP (landlock's TCP rules do not see those).
    SocketFamilies,
    /// socketpair: unix only.
    SocketpairUnix,
    /// The mode in argument `n` carries no set-id bit.
    ModeNoSetid(u32),
    /// open/openat: flags in the first argument, mode in the second; when the call can create a
    /// file (O_CREAT, O_TMPFILE) the mode carries no set-id bit.
    CreateNoSetid(u32, u32),
    /// prlimit64: only on the caller itself (pid 0), never on another process (the init).
    PrlimitSelf,
    /// fallocate: plain allocation (size grows, RLIMIT_FSIZE applies), hole punching and zero
    /// ranges; never FALLOC_FL_KEEP_SIZE reservations past the end of a file.
    FallocateInFile,
    /// Answered 0 without running (`SECCOMP_RET_ERRNO` with errno 0): a call whose effect is
    /// host-wide (sync) and that callers need to succeed.
    Skip,
    /// fadvise64: advice in argument `n` that leaves the page cache as it is (NORMAL, RANDOM,
    /// SEQUENTIAL, WILLNEED); never DONTNEED or NOREUSE, which evict shared host files' pages.
    FadviseKeepsCache(u32),
}

/// Set-user-id and set-group-id bits of a mode.
pub(crate) const SETID_BITS: u32 = 0o6000;
/// Open flags that can create a file.
pub(crate) const CREATE_FLAGS: u32 = libc::O_CREAT as u32 | 0o20000000;
/// fallocate modes allowed: 0, PUNCH_HOLE | KEEP_SIZE, ZERO_RANGE.
pub(crate) const FALLOCATE_MODES: [u32; 3] = [0, 3, 0x10];
/// fadvise advice allowed: POSIX_FADV_NORMAL, RANDOM, SEQUENTIAL, WILLNEED.
pub(crate) const FADVISE_KEEPING_CACHE: [u32; 4] = [0, 1, 2, 3];

pub(crate) fn ld(arg: u32) -> libc::sock_filter {
    ins(LD_ABS, 0, 0, off_arg_low(arg))
}

/// Load argument `arg` (low 32 bits, `& mask` when given) and go to the body of the first case
/// listing its value; no case matches → EPERM. Every body ends in a return.
pub(crate) fn switch(arg: u32, mask: Option<u32>, cases: &[(&[u32], Program)]) -> Program {
    let compares: usize = cases.iter().map(|(v, _)| v.len()).sum();
    let mut p = vec![ld(arg)];
    if let Some(m) = mask {
        p.push(ins(AND_K, 0, 0, m));
    }
    let mut starts = Vec::with_capacity(cases.len());
    let mut at = 0;
    for (_, body) in cases {
        starts.push(at);
        at += body.len();
    }
    let mut k = 0;
    for ((values, _), start) in cases.iter().zip(&starts) {
        for v in values.iter() {
            // Skip the remaining compares and the EPERM, then into the body.
            let jt = compares - k - 1 + 1 + start;
            p.push(ins(JEQ, u8::try_from(jt).unwrap_or(u8::MAX), 0, *v));
            k += 1;
        }
    }
    p.push(eperm());
    for (_, body) in cases {
        p.extend(body.iter().copied());
    }
    p
}

/// IPv4/IPv6: stream or datagram sockets of protocol 0, TCP or UDP. (The kernel itself refuses
/// TCP over datagram and UDP over stream; what matters here is that no other protocol — MPTCP,
/// SCTP, ICMP — and no raw or `SOCK_PACKET` type passes: landlock's TCP rules see only TCP.)
pub(crate) fn inet_socket() -> Program {
    let protocols = [0, libc::IPPROTO_TCP as u32, libc::IPPROTO_UDP as u32];
    let types = [libc::SOCK_STREAM as u32, libc::SOCK_DGRAM as u32];
    switch(1, Some(0xf), &[(&types, switch(2, None, &[(&protocols, vec![ret(RET_ALLOW)])]))])
}

/// Code for an action; the accumulator may be overwritten (every path returns).
pub(crate) fn action_code(a: Action) -> Program {
    let allow = ret(RET_ALLOW);
    match a {
        Action::Allow => vec![allow],
        Action::Enosys => vec![ret(RET_ERRNO | libc::ENOSYS as u32)],
        Action::CloneNoNamespaces => vec![ld(0), ins(JSET, 0, 1, CLONE_NEW_MASK as u32), eperm(), allow],
        Action::IoctlNoTiocsti => {
            vec![ld(1), ins(JEQ, 2, 0, TIOCSTI as u32), ins(JEQ, 1, 0, TIOCLINUX as u32), allow, eperm()]
        }
        // Unix sockets of any type the kernel has for them (stream, datagram, seqpacket).
        Action::SocketFamilies => switch(
            0,
            None,
            &[(&[libc::AF_UNIX as u32], vec![allow]), (&[libc::AF_INET as u32, libc::AF_INET6 as u32], inet_socket())],
        ),
        Action::SocketpairUnix => switch(0, None, &[(&[libc::AF_UNIX as u32], vec![allow])]),
        Action::ModeNoSetid(arg) => vec![ld(arg), ins(JSET, 0, 1, SETID_BITS), eperm(), allow],
        Action::CreateNoSetid(flags, mode) => {
            vec![ld(flags), ins(JSET, 0, 3, CREATE_FLAGS), ld(mode), ins(JSET, 0, 1, SETID_BITS), eperm(), allow]
        }
        Action::PrlimitSelf => switch(0, None, &[(&[0], vec![allow])]),
        Action::FallocateInFile => switch(1, None, &[(&FALLOCATE_MODES, vec![allow])]),
        Action::Skip => vec![ret(RET_ERRNO)],
        Action::FadviseKeepsCache(arg) => switch(arg, None, &[(&FADVISE_KEEPING_CACHE, vec![allow])]),
    }
}

/// Consecutive syscall numbers with one decision, from the first number up to the next run's
/// (`None`: EPERM). The policy's ~470 numbers make under a hundred runs: the search compares
/// the number with run boundaries, not with each listed number.
pub(crate) type Run<T = Action> = (u32, Option<T>);

/// The runs of `cases`, from 0 on; the numbers past the last case are one run with no case.
pub(crate) fn runs<T: Clone + PartialEq>(cases: &BTreeMap<u32, T>) -> Vec<Run<T>> {
    let mut out: Vec<Run<T>> = vec![(0, None)];
    for (&nr, a) in cases {
        for r in [(nr, Some(a.clone())), (nr + 1, None)] {
            match out.last_mut() {
                // The EPERM run after the previous number would be empty.
                Some(last) if last.0 == r.0 => *last = r,
                _ => out.push(r),
            }
        }
    }
    out.dedup_by(|next, prev| next.1 == prev.1);
    out
}

/// Binary search over `runs` (the accumulator holds the syscall number, at least the first
/// run's); every path ends in a return.
pub(crate) fn search(runs: &[Run]) -> Program {
    search_with(runs, &|d: &Option<Action>| d.map_or_else(|| vec![eperm()], action_code))
}

/// Binary search over `runs`, each run's code from `body` (which must end every path in a
/// return).
pub(crate) fn search_with<T>(runs: &[Run<T>], body: &dyn Fn(&Option<T>) -> Program) -> Program {
    let [(_, decision)] = runs else {
        let mid = runs.len() / 2;
        let (left, right) = (search_with(&runs[..mid], body), search_with(&runs[mid..], body));
        // nr >= the right half's first number: over the left half.
        let mut out = match u8::try_from(left.len()) {
            Ok(n) => vec![ins(JGE, n, 0, runs[mid].0)],
            Err(_) => vec![ins(JGE, 0, 1, runs[mid].0), ins(JA, 0, 0, left.len() as u32)],
        };
        out.extend(left);
        out.extend(right);
        return out;
    };
    body(decision)
}

/// A whole filter: x86_64 only (anything else is killed), x32 numbers refused, then the search.
pub(crate) fn compile(cases: &BTreeMap<u32, Action>) -> Program {
    let mut out = vec![
        ins(LD_ABS, 0, 0, OFF_ARCH),
        ins(JEQ, 1, 0, AUDIT_ARCH_X86_64),
        ret(RET_KILL_PROCESS),
        ins(LD_ABS, 0, 0, OFF_NR),
        ins(JGE, 0, 1, X32_SYSCALL_BIT),
        eperm(),
    ];
    out.extend(search(&runs(cases)));
    out
}

/// The target's decisions from `policy` (the text of `policies/seccomp-x86_64.tsv`): number →
/// action (`eperm` lines, and numbers the table lacks, get the default EPERM).
pub(crate) fn target_cases(policy: &str) -> Result<BTreeMap<u32, Action>, String> {
    let mut cases = BTreeMap::new();
    for (i, line) in policy.lines().enumerate().filter(|(_, l)| !l.starts_with('#') && !l.trim().is_empty()) {
        let at = || format!("policies/seccomp-x86_64.tsv line {}", i + 1);
        let mut f = line.split('\t');
        let (Some(nr), Some(name), Some(decision), Some(reason), None) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return Err(format!("{}: give number, name, decision and reason, tab-separated", at()));
        };
        let nr: u32 = nr.parse().map_err(|_| format!("{}: {nr:?} is not a syscall number", at()))?;
        if reason.trim().is_empty() {
            return Err(format!("{}: {name} gives no reason", at()));
        }
        let action = Action::parse(decision, name).map_err(|e| format!("{}: {e}", at()))?;
        if let Some(a) = action {
            if cases.insert(nr, a).is_some() {
                return Err(format!("{}: syscall {nr} appears twice", at()));
            }
        }
    }
    Ok(cases)
}

impl Action {
    /// The action a table decision names for syscall `name` (None: EPERM). A condition is bound
    /// to the syscall whose arguments it reads.
    pub(crate) fn parse(decision: &str, name: &str) -> Result<Option<Action>, String> {
        match decision {
            "allow" => return Ok(Some(Action::Allow)),
            "eperm" => return Ok(None),
            "enosys" => return Ok(Some(Action::Enosys)),
            "skip" => return Ok(Some(Action::Skip)),
            _ => {}
        }
        let (kind, params) = decision.split_once(':').unwrap_or((decision, ""));
        let p: Vec<u32> = params
            .split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().map_err(|_| x))
            .collect::<Result<_, _>>()
            .map_err(|x| format!("{decision:?}: {x:?} is not an argument index"))?;
        let only = |want: &str, a: Action| {
            if name == want {
                Ok(Some(a))
            } else {
                Err(format!("{decision:?} applies to {want}, not {name}"))
            }
        };
        let arg = |i: usize| {
            p.get(i)
                .copied()
                .filter(|a| *a < 6)
                .ok_or_else(|| format!("{decision:?}: argument index missing or past 5"))
        };
        match kind {
            "if-no-new-namespace" => only("clone", Action::CloneNoNamespaces),
            "if-not-tiocsti" => only("ioctl", Action::IoctlNoTiocsti),
            "if-plain-socket" => only("socket", Action::SocketFamilies),
            "if-unix" => only("socketpair", Action::SocketpairUnix),
            "if-self" => only("prlimit64", Action::PrlimitSelf),
            "if-within-file" => only("fallocate", Action::FallocateInFile),
            "if-keeps-cache" => only("fadvise64", Action::FadviseKeepsCache(arg(0)?)),
            "if-no-setid-mode" => Ok(Some(Action::ModeNoSetid(arg(0)?))),
            "if-create-no-setid" => Ok(Some(Action::CreateNoSetid(arg(0)?, arg(1)?))),
            _ => Err(format!("unknown decision {decision:?}")),
        }
    }
}
