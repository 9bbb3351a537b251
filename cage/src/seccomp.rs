//! The seccomp allow-list. Default action is `EPERM`: a system call must be named here to be
//! usable. It is enough for bash, coreutils, python3 and cargo/rustc. It excludes namespace
//! creation, the mount API, ptrace and cross-process memory access, bpf, perf, keyrings,
//! userfaultfd, kexec and module loading, and filters `clone`, `ioctl`, `socket` and
//! `socketpair` by argument. `clone3` and `io_uring_*` answer `ENOSYS`, so libc and runtimes fall
//! back to what is allowed instead of failing hard.
//!
//! The policy is one declarative table, `policies/seccomp-x86_64.tsv`: a line per syscall
//! number of the kernel's table with its name, its decision — `allow`, `eperm`, `enosys` or an
//! `if-…` argument condition — and the reason, which a reviewer reads against the kernel's
//! syscall list (a test checks the table covers `unistd_64.h`). The build script compiles the
//! target's filter from it (`bpf.rs`; a table it cannot read fails the build), so a launch only
//! copies the finished program: compiling it in every one-shot `chio` cost about 0.1 ms.
//! `ENOSYS` makes callers fall back: glibc retries clone3 as clone; io_uring users fall back to
//! plain I/O; `openat2` hides its mode in a struct a filter cannot read (callers fall
//! back to openat, whose mode is checked); native AIO (`io_setup`) draws on the host-wide
//! `fs.aio-max-nr` and inotify instances on the per-uid pool every process of that uid on the
//! host shares, so a cage could exhaust them for the host.
//!
//! The filter is compiled here into classic BPF as a binary search over runs of consecutive
//! syscall numbers with one decision (the policy has under a hundred): about a dozen
//! instructions run per decision instead of a linear chain of ~1,400, and the program is 278
//! instructions. Both matter — the kernel pre-evaluates every filter for every syscall number
//! when it is attached, and JIT-compiles it, at every launch (1.3 ms with a linear filter,
//! 0.15 ms with a search over each number, 0.10 ms now), and conditional syscalls (openat,
//! ioctl, socket) run it live.

// The table's parser and its conditions' code run in the build script; in the crate only the
// tests reach them, to check the built program against the table compiled again.
#[cfg_attr(not(test), allow(dead_code))]
mod bpf;
pub(crate) use bpf::*;
pub use bpf::{Program, CLONE_NEW_MASK, TIOCLINUX, TIOCSTI};

/// The reviewed policy: `policies/seccomp-x86_64.tsv`.
const POLICY: &str = include_str!("../../policies/seccomp-x86_64.tsv");

// The target's filter as the build script compiled it from `POLICY` (`TARGET_FILTER`).
include!(concat!(env!("OUT_DIR"), "/seccomp_target.rs"));

/// The compiled filters and their digest.
#[derive(Clone)]
pub struct Filters {
    /// The target's filter.
    pub target: Program,
    /// The init's own, much smaller filter.
    pub init: Program,
    /// SHA-256 over every instruction of the target's filter.
    pub sha256: String,
    /// The plan's own profile compiled, installed over the target's filter, and its SHA-256.
    pub stacked: Option<(Program, String)>,
}

impl Filters {
    /// These filters with `profile` compiled to be stacked over the target's.
    pub fn with_profile(&self, profile: &crate::profile::SyscallProfile) -> Result<Filters, String> {
        let prog = crate::profile::compile(profile).map_err(|e| format!("the plan's syscall profile: {e}"))?;
        let sha = crate::profile::sha256(&prog);
        Ok(Filters { stacked: Some((prog, sha)), ..self.clone() })
    }
}

/// What the argument conditions refuse, in operator words (the launch record lists them).
pub const REFUSALS: &[&str] = &[
    "set-user-id and set-group-id mode bits (chmod, fchmod, fchmodat, fchmodat2, mkdir, mkdirat, mknod, mknodat, creat, open and openat with O_CREAT or O_TMPFILE): a cage never leaves a set-id file for the host",
    "openat2, io_uring, native AIO and inotify instances (ENOSYS)",
    "namespace flags of clone; clone3 (ENOSYS)",
    "TIOCSTI and TIOCLINUX ioctls",
    "sockets other than unix and IPv4/IPv6 TCP or UDP (no MPTCP, SCTP, ICMP, raw, packet or SOCK_PACKET)",
    "prlimit on any process but the caller",
    "fallocate modes that reserve space past the end of a file (FALLOC_FL_KEEP_SIZE beyond punching holes)",
    "page-cache eviction and probing of shared files: fadvise DONTNEED and NOREUSE, readahead (EPERM), mincore (ENOSYS)",
    "host-wide writeback: sync and syncfs answer 0 without running",
];

/// What the cage's init still does once the target exists: wait for signals and children,
/// forward signals, report the target's end and exit, and (first) close what it inherited.
/// Nothing else.
const INIT_ALLOWED: &[libc::c_long] = &[
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_restart_syscall,
    libc::SYS_wait4,
    libc::SYS_kill,
    libc::SYS_getrusage,
    libc::SYS_write,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_close_range,
];

/// A copy of the target's and the init's filters (x86_64).
pub fn build() -> Result<Filters, String> {
    compiled().clone()
}

/// The filters, made once per process: every launch of a one-shot `chio` or of the daemon's
/// launch processes (forked from a launcher that made them first) uses this copy.
pub fn compiled() -> &'static Result<Filters, String> {
    static FILTERS: std::sync::OnceLock<Result<Filters, String>> = std::sync::OnceLock::new();
    FILTERS.get_or_init(compile_filters)
}

/// The target's filter (compiled from the table when the crate was built) and the init's.
fn compile_filters() -> Result<Filters, String> {
    let target: Program = TARGET_FILTER.iter().map(|&(code, jt, jf, k)| ins(code, jt, jf, k)).collect();
    let init = compile(&INIT_ALLOWED.iter().map(|nr| (*nr as u32, Action::Allow)).collect());
    check_len(&target)?;
    let sha256 = crate::profile::sha256(&target);
    Ok(Filters { target, init, sha256, stacked: None })
}

/// The kernel takes at most BPF_MAXINSNS (4096) instructions.
pub(crate) fn check_len(prog: &Program) -> Result<(), String> {
    match prog.len() {
        0..=4096 => Ok(()),
        n => Err(format!("the seccomp filter has {n} instructions, more than the kernel takes")),
    }
}

fn apply(prog: &Program, what: &str) -> Result<(), String> {
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    // SAFETY: fprog points at a live program of the given length (raw: nix has no seccomp).
    let r = unsafe {
        libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER as libc::c_ulong, &fprog as *const libc::sock_fprog)
    };
    if r != 0 {
        return Err(format!("installing the {what} seccomp filter: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Install the target's filter on the calling thread (no_new_privs must already be set), then
/// the plan's own profile over it: the kernel takes the strictest verdict of the two, and of
/// two errnos the later filter's (so the workload sees the errno its profile names).
pub fn install(filters: &Filters) -> Result<(), String> {
    apply(&filters.target, "target's")?;
    match &filters.stacked {
        Some((prog, _)) => apply(prog, "workload's own"),
        None => Ok(()),
    }
}

/// The x86_64 number of syscall `name`, from the policy table (which lists every number of the
/// kernel's table); None for a name the table does not have.
pub fn syscall_number(name: &str) -> Option<u32> {
    static NUMBERS: std::sync::OnceLock<std::collections::HashMap<&'static str, u32>> = std::sync::OnceLock::new();
    NUMBERS
        .get_or_init(|| {
            POLICY
                .lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let mut f = l.split('\t');
                    let nr = f.next()?.parse().ok()?;
                    Some((f.next()?, nr))
                })
                .collect()
        })
        .get(name)
        .copied()
}

/// Install the init's filter on the calling thread (no_new_privs must already be set).
pub fn install_init(filters: &Filters) -> Result<(), String> {
    apply(&filters.init, "init's")
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A classic-BPF interpreter for the instructions `compile` emits.
    pub(crate) fn run(prog: &Program, nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_ABS => acc = u32::from_le_bytes(data[i.k as usize..i.k as usize + 4].try_into().unwrap()),
                JA => pc += i.k as usize,
                AND_K => acc &= i.k,
                JEQ | JGT | JGE | JSET => {
                    let hit = match i.code {
                        JEQ => acc == i.k,
                        JGT => acc > i.k,
                        JGE => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if hit { i.jt } else { i.jf });
                }
                RET => return i.k,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    fn decide(nr: libc::c_long, args: [u64; 6]) -> u32 {
        run(&build().unwrap().target, nr as u32, AUDIT_ARCH_X86_64, args)
    }

    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;

    /// The program the build script compiled is the table compiled now, instruction for
    /// instruction, and its digest is the one launch records carry.
    #[test]
    fn the_built_filter_is_the_table_compiled() {
        let now = compile(&target_cases(POLICY).unwrap());
        let built = &build().unwrap().target;
        let fields = |p: &Program| p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect::<Vec<_>>();
        assert_eq!(fields(built), fields(&now));
        assert_eq!(build().unwrap().sha256, crate::profile::sha256(&now));
    }

    /// A decision the compiler does not know, a condition bound to a syscall whose arguments it
    /// does not read, or an argument index past the six there are: the table is refused.
    #[test]
    fn a_table_line_it_cannot_compile_is_refused() {
        assert_eq!(Action::parse("allow", "read"), Ok(Some(Action::Allow)));
        assert_eq!(Action::parse("eperm", "mount"), Ok(None));
        assert_eq!(Action::parse("if-no-setid-mode:2", "fchmodat"), Ok(Some(Action::ModeNoSetid(2))));
        for (decision, name) in [
            ("allow-ish", "read"),
            ("if-not-tiocsti", "write"),
            ("if-self", "kill"),
            ("if-no-setid-mode:6", "chmod"),
            ("if-no-setid-mode", "chmod"),
            ("if-create-no-setid:1", "open"),
            ("if-no-setid-mode:x", "chmod"),
            ("if-keeps-cache:3", "read"),
            ("if-keeps-cache", "fadvise64"),
        ] {
            assert!(Action::parse(decision, name).is_err(), "{decision} for {name}");
        }
    }

    /// The search compares with the boundaries of runs of one decision: a search over each
    /// listed number needs at least one instruction per number.
    #[test]
    fn the_filter_searches_runs_not_numbers() {
        let f = build().unwrap();
        let cases = target_cases(POLICY).unwrap();
        // A search over each number takes a compare and a return per number.
        assert!(f.target.len() < 2 * cases.len(), "{} instructions for {} numbers", f.target.len(), cases.len());
        let r = runs(&cases);
        assert_eq!(r[0].0, 0);
        assert!(r.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 != w[1].1), "runs sorted, neighbours differ");
    }

    #[test]
    fn every_syscall_number_gets_exactly_its_action() {
        let f = build().unwrap();
        let cases = target_cases(POLICY).unwrap();
        for nr in 0..600u32 {
            let got = run(&f.target, nr, AUDIT_ARCH_X86_64, [0; 6]);
            let want = match cases.get(&nr) {
                // All-zero arguments: socket(AF_UNSPEC) is refused; the rest allow zeros.
                None | Some(Action::SocketFamilies | Action::SocketpairUnix) => EPERM,
                Some(Action::Enosys) => RET_ERRNO | libc::ENOSYS as u32,
                Some(Action::Skip) => RET_ERRNO,
                Some(_) => RET_ALLOW,
            };
            assert_eq!(got, want, "syscall {nr}");
        }
        assert_eq!(run(&f.target, libc::SYS_read as u32 | X32_SYSCALL_BIT, AUDIT_ARCH_X86_64, [0; 6]), EPERM);
        assert_eq!(run(&f.target, 0, 0x4000_0003, [0; 6]), RET_KILL_PROCESS, "i386 syscalls are killed");
        assert!(f.target.len() < 800, "compact: {} instructions", f.target.len());
    }

    /// The reviewed policy (`policies/seccomp-x86_64.tsv`): number → (name, decision).
    fn policy() -> BTreeMap<u32, (String, String)> {
        include_str!("../../policies/seccomp-x86_64.tsv")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 4, "policy line {l:?}: number, name, decision, reason");
                assert!(!f[3].trim().is_empty(), "policy line {l:?} gives no reason");
                (f[0].parse().unwrap(), (f[1].to_string(), f[2].to_string()))
            })
            .collect()
    }

    /// Check one argument condition of the table with arguments chosen here, not by the filter.
    fn check_condition(nr: u32, name: &str, cond: &str, decide: &dyn Fn([u64; 6]) -> u32) {
        let with = |i: usize, v: u64| {
            let mut a = [0u64; 6];
            a[i] = v;
            a
        };
        let (kind, params) = cond.split_once(':').unwrap_or((cond, ""));
        let p: Vec<usize> = params.split(',').filter(|x| !x.is_empty()).map(|x| x.parse().unwrap()).collect();
        let cases: Vec<([u64; 6], u32)> = match kind {
            "if-no-setid-mode" => {
                vec![(with(p[0], 0o644), RET_ALLOW), (with(p[0], 0o4755), EPERM), (with(p[0], 0o2711), EPERM)]
            }
            "if-create-no-setid" => {
                let mut creat_suid = with(p[0], libc::O_CREAT as u64 | 1);
                creat_suid[p[1]] = 0o4755;
                let mut tmp_sgid = with(p[0], libc::O_TMPFILE as u64 | 2);
                tmp_sgid[p[1]] = 0o2755;
                let mut plain_read = with(p[0], libc::O_RDONLY as u64);
                plain_read[p[1]] = 0o4755;
                let mut creat_plain = with(p[0], libc::O_CREAT as u64 | 1);
                creat_plain[p[1]] = 0o644;
                vec![(creat_suid, EPERM), (tmp_sgid, EPERM), (plain_read, RET_ALLOW), (creat_plain, RET_ALLOW)]
            }
            "if-no-new-namespace" => {
                let mut v: Vec<([u64; 6], u32)> = [
                    libc::CLONE_NEWNS,
                    libc::CLONE_NEWUSER,
                    libc::CLONE_NEWPID,
                    libc::CLONE_NEWNET,
                    libc::CLONE_NEWIPC,
                    libc::CLONE_NEWUTS,
                    libc::CLONE_NEWCGROUP,
                    0x80, // CLONE_NEWTIME
                ]
                .iter()
                .map(|f| (with(0, *f as u64 | libc::SIGCHLD as u64), EPERM))
                .collect();
                v.push((with(0, libc::SIGCHLD as u64 | libc::CLONE_VM as u64 | libc::CLONE_VFORK as u64), RET_ALLOW));
                v
            }
            "if-not-tiocsti" => vec![
                (with(1, 0x5412), EPERM),
                (with(1, 0x5412 | 1 << 32), EPERM),
                (with(1, 0x541C), EPERM),
                (with(1, libc::TCGETS), RET_ALLOW),
                (with(1, libc::FIONREAD), RET_ALLOW),
            ],
            "if-plain-socket" => {
                let s = |f: i32, t: i32, pr: i32| [f as u64, t as u64, pr as u64, 0, 0, 0];
                vec![
                    (s(libc::AF_UNIX, libc::SOCK_STREAM, 0), RET_ALLOW),
                    (s(libc::AF_INET, libc::SOCK_STREAM, 0), RET_ALLOW),
                    (s(libc::AF_INET6, libc::SOCK_DGRAM, libc::IPPROTO_UDP), RET_ALLOW),
                    (s(libc::AF_INET, libc::SOCK_STREAM, 262), EPERM),
                    (s(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP), EPERM),
                    (s(libc::AF_INET, 10, 0), EPERM),
                    (s(libc::AF_NETLINK, libc::SOCK_DGRAM, 0), EPERM),
                    (s(libc::AF_PACKET, libc::SOCK_DGRAM, 0), EPERM),
                    (s(libc::AF_VSOCK, libc::SOCK_STREAM, 0), EPERM),
                ]
            }
            "if-unix" => vec![(with(0, libc::AF_UNIX as u64), RET_ALLOW), (with(0, libc::AF_INET as u64), EPERM)],
            "if-self" => vec![(with(0, 0), RET_ALLOW), (with(0, 1), EPERM)],
            "if-within-file" => {
                vec![(with(1, 0), RET_ALLOW), (with(1, 3), RET_ALLOW), (with(1, 1), EPERM), (with(1, 0x11), EPERM)]
            }
            "if-keeps-cache" => {
                let mut v: Vec<([u64; 6], u32)> = (0..=3).map(|a| (with(p[0], a), RET_ALLOW)).collect();
                // DONTNEED, NOREUSE, anything past them, and DONTNEED in the low 32 bits.
                v.extend([4, 5, 6, u64::from(u32::MAX), 4 | 1 << 32].map(|a| (with(p[0], a), EPERM)));
                v
            }
            _ => panic!("{nr} {name}: the policy names condition {cond:?}, which this test does not know"),
        };
        for (args, want) in cases {
            assert_eq!(decide(args), want, "{nr} {name} under {cond} with {args:x?}");
        }
    }

    #[test]
    fn the_filter_decides_what_the_reviewed_policy_says() {
        let f = build().unwrap();
        let table = policy();
        for nr in 0..1024u32 {
            let decide = |args: [u64; 6]| run(&f.target, nr, AUDIT_ARCH_X86_64, args);
            let (name, decision) = table.get(&nr).map_or(("(none)", "eperm"), |(n, d)| (n.as_str(), d.as_str()));
            match decision {
                "eperm" => assert_eq!(decide([0; 6]), EPERM, "{nr} {name} must be refused"),
                "enosys" => assert_eq!(decide([0; 6]), RET_ERRNO | libc::ENOSYS as u32, "{nr} {name}"),
                "skip" => {
                    assert_eq!(decide([0; 6]), RET_ERRNO, "{nr} {name}: answered 0, not run");
                    assert_eq!(decide([u64::MAX; 6]), RET_ERRNO, "{nr} {name}: whatever its arguments");
                }
                "allow" => {
                    assert_eq!(decide([0; 6]), RET_ALLOW, "{nr} {name}");
                    assert_eq!(decide([u64::MAX; 6]), RET_ALLOW, "{nr} {name}: allowed whatever its arguments");
                }
                cond => check_condition(nr, name, cond, &decide),
            }
        }
    }

    /// Every syscall the kernel headers list has a reviewed line, under the same number.
    #[test]
    fn the_policy_covers_the_kernels_syscall_list() {
        let header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
        let Ok(text) = std::fs::read_to_string(header) else {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            assert!(!ci, "{header} is missing (Debian package linux-libc-dev); CI=true forbids skipping");
            eprintln!("SKIP the_policy_covers_the_kernels_syscall_list: {header} is missing");
            return;
        };
        let table = policy();
        let mut seen = 0;
        for line in text.lines() {
            let mut w = line.split_whitespace();
            let (Some("#define"), Some(name), Some(nr)) = (w.next(), w.next(), w.next()) else { continue };
            let (Some(name), Ok(nr)) = (name.strip_prefix("__NR_"), nr.parse::<u32>()) else { continue };
            let reviewed = table.get(&nr).map(|(n, _)| n.as_str());
            assert_eq!(reviewed, Some(name), "syscall {nr} ({name}) of {header} is not reviewed in the policy table");
            seen += 1;
        }
        assert!(seen > 300, "only {seen} syscalls found in {header}");
    }

    #[test]
    fn argument_filters() {
        let newuser = libc::CLONE_NEWUSER as u64 | libc::SIGCHLD as u64;
        assert_eq!(decide(libc::SYS_clone, [newuser, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(decide(libc::SYS_clone, [libc::SIGCHLD as u64 | libc::CLONE_VM as u64, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(decide(libc::SYS_ioctl, [0, TIOCSTI, 0, 0, 0, 0]), EPERM);
        assert_eq!(decide(libc::SYS_ioctl, [0, TIOCSTI | 1 << 32, 0, 0, 0, 0]), EPERM);
        assert_eq!(decide(libc::SYS_ioctl, [0, TIOCLINUX, 0, 0, 0, 0]), EPERM);
        assert_eq!(decide(libc::SYS_ioctl, [0, libc::TCGETS, 0, 0, 0, 0]), RET_ALLOW);
        for (family, want) in [
            (libc::AF_UNIX, RET_ALLOW),
            (libc::AF_INET6, RET_ALLOW),
            (libc::AF_NETLINK, EPERM),
            (libc::AF_VSOCK, EPERM),
            (libc::AF_PACKET, EPERM),
        ] {
            let stream = libc::SOCK_STREAM as u64;
            assert_eq!(decide(libc::SYS_socket, [family as u64, stream, 0, 0, 0, 0]), want, "family {family}");
        }
        assert_eq!(decide(libc::SYS_socketpair, [libc::AF_INET as u64, 0, 0, 0, 0, 0]), EPERM);
    }

    #[test]
    fn set_id_modes_are_refused_wherever_a_mode_is_set() {
        let (creat, tmpfile) = (libc::O_CREAT as u64 | libc::O_WRONLY as u64, libc::O_TMPFILE as u64 | 2);
        for (nr, args) in [
            (libc::SYS_chmod, [0, 0o4755, 0, 0, 0, 0]),
            (libc::SYS_fchmod, [3, 0o2755, 0, 0, 0, 0]),
            (libc::SYS_fchmodat, [3, 0, 0o4700, 0, 0, 0]),
            (libc::SYS_fchmodat2, [3, 0, 0o6755, 0, 0, 0]),
            (libc::SYS_mkdir, [0, 0o2775, 0, 0, 0, 0]),
            (libc::SYS_mkdirat, [3, 0, 0o2775, 0, 0, 0]),
            (libc::SYS_mknod, [0, libc::S_IFREG as u64 | 0o4755, 0, 0, 0, 0]),
            (libc::SYS_mknodat, [3, 0, libc::S_IFREG as u64 | 0o4755, 0, 0, 0]),
            (libc::SYS_creat, [0, 0o4755, 0, 0, 0, 0]),
            (libc::SYS_open, [0, creat, 0o4755, 0, 0, 0]),
            (libc::SYS_openat, [3, 0, creat, 0o2755, 0, 0]),
            (libc::SYS_openat, [3, 0, tmpfile, 0o4755, 0, 0]),
        ] {
            assert_eq!(decide(nr, args), EPERM, "syscall {nr} {args:?}");
            let mut plain = args;
            for a in plain.iter_mut() {
                if *a & 0o6000 != 0 && *a < 0o200000 {
                    *a &= !0o6000;
                }
            }
            assert_eq!(decide(nr, plain), RET_ALLOW, "syscall {nr} {plain:?}");
        }
        // Without O_CREAT the mode argument is not one: whatever it holds, the open goes on.
        assert_eq!(decide(libc::SYS_openat, [3, 0, libc::O_RDONLY as u64, 0o4755, 0, 0]), RET_ALLOW);
        assert_eq!(decide(libc::SYS_openat2, [3, 0, 0, 24, 0, 0]), RET_ERRNO | libc::ENOSYS as u32);
    }

    #[test]
    fn host_wide_pools_and_the_init_are_out_of_reach() {
        let enosys = RET_ERRNO | libc::ENOSYS as u32;
        for nr in [libc::SYS_io_setup, libc::SYS_inotify_init, libc::SYS_inotify_init1] {
            assert_eq!(decide(nr, [64, 0, 0, 0, 0, 0]), enosys, "syscall {nr}");
        }
        assert_eq!(decide(libc::SYS_prlimit64, [0, 7, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(decide(libc::SYS_prlimit64, [1, 7, 0, 0, 0, 0]), EPERM);
        for (mode, want) in
            [(0, RET_ALLOW), (3, RET_ALLOW), (0x10, RET_ALLOW), (1, EPERM), (0x11, EPERM), (0x20, EPERM)]
        {
            assert_eq!(decide(libc::SYS_fallocate, [3, mode, 0, 1 << 20, 0, 0]), want, "fallocate mode {mode:#x}");
        }
    }

    #[test]
    fn only_plain_unix_tcp_and_udp_sockets() {
        let (inet, inet6, unix) = (libc::AF_INET as u64, libc::AF_INET6 as u64, libc::AF_UNIX as u64);
        let (stream, dgram, seq, raw) =
            (libc::SOCK_STREAM as u64, libc::SOCK_DGRAM as u64, libc::SOCK_SEQPACKET as u64, libc::SOCK_RAW as u64);
        let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64;
        for (family, kind, proto, want) in [
            (inet, stream, 0, RET_ALLOW),
            (inet6, stream | flags, 6, RET_ALLOW),
            (inet, dgram, 17, RET_ALLOW),
            (inet, dgram, 0, RET_ALLOW),
            (unix, stream, 0, RET_ALLOW),
            (unix, seq | flags, 0, RET_ALLOW),
            (inet, stream, 262, EPERM),  // MPTCP
            (inet6, stream, 132, EPERM), // SCTP
            (inet, seq, 132, EPERM),
            (inet, 10, 0, EPERM), // SOCK_PACKET
            (inet, raw, 1, EPERM),
            (inet, dgram, 1, EPERM), // ICMP "ping" sockets
        ] {
            assert_eq!(
                decide(libc::SYS_socket, [family, kind, proto, 0, 0, 0]),
                want,
                "socket({family}, {kind:#x}, {proto})"
            );
        }
        assert_eq!(decide(libc::SYS_socketpair, [unix, stream, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(decide(libc::SYS_socketpair, [inet, stream, 0, 0, 0, 0]), EPERM);
    }

    #[test]
    fn dangerous_calls_are_not_listed() {
        let a = build().unwrap();
        assert_eq!(a.sha256, build().unwrap().sha256);
        for denied in [
            libc::SYS_mount,
            libc::SYS_ptrace,
            libc::SYS_bpf,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_keyctl,
            libc::SYS_userfaultfd,
            libc::SYS_perf_event_open,
            libc::SYS_process_vm_readv,
            libc::SYS_pivot_root,
            libc::SYS_kexec_load,
            libc::SYS_init_module,
            libc::SYS_open_tree,
        ] {
            assert_eq!(decide(denied, [0; 6]), EPERM, "syscall {denied}");
        }
        let init = build().unwrap().init;
        assert_eq!(run(&init, libc::SYS_wait4 as u32, AUDIT_ARCH_X86_64, [0; 6]), RET_ALLOW);
        assert_eq!(run(&init, libc::SYS_openat as u32, AUDIT_ARCH_X86_64, [0; 6]), EPERM);
    }

    #[test]
    fn helpers() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
        assert!(check_len(&vec![ret(RET_ALLOW); 4096]).is_ok());
        assert!(check_len(&vec![ret(RET_ALLOW); 4097]).is_err_and(|e| e.contains("4097 instructions")));
    }

    /// In a forked child: install a filter for real, then make one call it refuses; the child's
    /// exit status says whether the kernel refused it.
    fn refused_after_install(install: fn(&Filters) -> Result<(), String>, nr: libc::c_long) -> bool {
        let f = build().unwrap();
        // SAFETY: the child only calls prctl, the install and one raw syscall, then _exit.
        unsafe {
            let pid = libc::fork();
            if pid == 0 {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if install(&f).is_err() {
                    libc::_exit(2);
                }
                let r = libc::syscall(nr, 0, 0, 0);
                let refused = r == -1 && *libc::__errno_location() == libc::EPERM;
                libc::_exit(if refused { 0 } else { 1 });
            }
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0
        }
    }

    #[test]
    fn installed_filters_refuse_for_real() {
        // getppid is allowed for the target and not for the init; umask(0) is harmless either way.
        assert!(refused_after_install(install_init, libc::SYS_getppid), "the init's filter is in force");
        assert!(!refused_after_install(install, libc::SYS_getppid), "the target may getppid");
        assert!(refused_after_install(install, libc::SYS_vhangup), "the target's filter is in force");
    }

    #[test]
    #[ignore = "timing, run by hand: cargo test --release -p chio-cage install_cost -- --ignored --nocapture"]
    fn install_cost() {
        let f = build().unwrap();
        // SAFETY: test-only fork; the child only installs the filter and exits.
        unsafe {
            let pid = libc::fork();
            if pid == 0 {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                let t = std::time::Instant::now();
                install(&f).unwrap();
                eprintln!("install of {} instructions took {:?}", f.target.len(), t.elapsed());
                libc::_exit(0);
            }
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
        }
    }
}
