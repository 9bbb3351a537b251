#!/usr/bin/env python3
"""Add temporary timing marks to the sources (see timeline.py for the whole recipe). Run from the
repository's root on a clean tree; `git checkout -- . && rm cage/src/trace.rs` removes them."""
import re
TRACE = '''//! TEMPORARY timing marks (tests/bench/trace/instrument.py): never committed.
#![allow(missing_docs)]
use std::sync::OnceLock;
static F: OnceLock<bool> = OnceLock::new();
/// Marks go to fd 1000, which `sys::close_from` keeps in a traced build: a target's marks after
/// it closed its descriptors land too.
pub fn t(label: &str) {
    // SAFETY: plain syscalls on a path, a fixed descriptor number and a local buffer.
    let ok = F.get_or_init(|| unsafe {
        let fd = libc::open(c"/tmp/chio-trace".as_ptr(), libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let r = libc::dup3(fd, 1000, libc::O_CLOEXEC);
        libc::close(fd);
        r == 1000
    });
    if *ok {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let ns = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128;
        let line = format!("{} {} {}\\n", std::process::id(), label, ns);
        unsafe { libc::write(1000, line.as_ptr().cast(), line.len()) };
    }
}
'''
open('cage/src/trace.rs','w').write(TRACE)
# close_from spares fd 1000 (the marks' file) in a traced build.
s=open('cage/src/sys.rs').read()
CLOSE_FROM = "pub fn close_from(first: u32) -> io::Result<()> {\n    close_range(first, u32::MAX)\n}"
assert CLOSE_FROM in s, "sys::close_from changed: update instrument.py (the target's marks would be lost)"
s=s.replace(CLOSE_FROM, "pub fn close_from(first: u32) -> io::Result<()> {\n    if first < 1000 {\n        close_range(first, 999)?;\n    }\n    close_range(first.max(1001), u32::MAX)\n}")
open('cage/src/sys.rs','w').write(s)
s=open('cage/src/lib.rs').read(); s=s.replace("pub mod sys;","pub mod sys;\npub mod trace;",1); open('cage/src/lib.rs','w').write(s)
def before(p, anchor, label, crate="chio_cage", last=False):
    s=open(p).read()
    i=s.rfind(anchor) if last else s.find(anchor)
    if i<0: print("MISSING", p, label); return
    # indentation of the anchor line
    ls=s.rfind("\n",0,i)+1
    ind=s[ls:i] if s[ls:i].strip()=="" else re.match(r"\s*", s[ls:]).group(0)
    s=s[:ls]+f"{ind}{crate}::trace::t(\"{label}\");\n"+s[ls:]
    open(p,'w').write(s)
C='crate'
before('cage/src/launch.rs', "let (mut rec, teardown) = launch_to_end", "K0", C)
before('cage/src/launch.rs', "let mut rec = new_record(plan);", "K_start", C)
before('cage/src/supervise.rs', "read_result(&r.result, &mut outcome);\n            result_read = true;", "R_result", C)
before('cage/src/supervise.rs', "if !result_read {\n                outcome.wall_ms", "R_reaped", C)
for lab, anc in [("I_start","hide_argv().map_err"),("I_unshared","let prepared = Prepared::build"),("I_built","fault::fail_at(ctx.plan, Stage::Mounts)?;"),("I_attached","fault::fail_at(ctx.plan, Stage::Pivot)?;"),("I_pivoted","    Ok(prepared)\n}"),("I_net","if ctx.await_cgroup {"),("I_joined","fault::fail_at(ctx.plan, Stage::Namespaces)?;\n    // We are in the launch cgroup"),("I_spawn","let target = spawn_target(ctx, &granted)"),("T_start","let sock = match arrange_fds(ctx)")]:
    before('cage/src/inside.rs', anc, lab, C)
# An init cloned ahead (the daemon's spare): its plan-dependent steps come last in inside.rs.
for lab, anc in [("A_plan","let [stdout_w, stderr_w, result_w, stdin_r] = a.pipes;"),("A_built","fault::fail_at(ctx.plan, Stage::Network)?;\n    if ctx.plan.net == NetMode::Loopback {\n        loopback_up().map_err(|e| FailCode::LoopbackFailed.at(Stage::Network, e))?;\n    }\n    await_ceilings"),("A_ceilings","    fault::fail_at(ctx.plan, Stage::Namespaces)?;\n    block_forwarded_signals"),("A_spawn","let target = spawn_target(ctx, &granted)")]:
    before('cage/src/inside.rs', anc, lab, C, last=True)
before('supervisor/src/daemon/server.rs', "line.extend_from_slice(&buf[..n]);", "S_read")
before('supervisor/src/daemon/server.rs', "if let Some(Err(why)) = settle(settling).await", "S_replied")
before('supervisor/src/daemon/server.rs', "let submitted = submit(s, &job, fds, &conn);", "S_submit")
before('supervisor/src/daemon/server.rs', "let delivered = match submitted {", "S_begun")
before('supervisor/src/daemon/server.rs', "let summary: Summary =", "S_answer")
before('supervisor/src/daemon/launcher.rs', "running.insert(s.pid, Some(s.sock));", "L_handed")
before('supervisor/src/daemon/launcher.rs', "let _ = nix::unistd::write(&theirs, TAKEN);", "P_recv")
before('supervisor/src/daemon/launcher.rs', "let sending = word.is_some_and(", "P_answered")
before('supervisor/src/daemon/launcher.rs', "let _ = nix::unistd::write(&launcher, &root_word(ANSWERED", "P_written")
before('supervisor/src/daemon/job.rs', "let admitted = super::admit::launch(", "P_parsed")
before('supervisor/src/daemon/job.rs', "Some(match admitted {", "P_go")
before('supervisor/src/launch/mod.rs', "let (rec, left) = chio_cage::launch_to_end", "C_planned")
before('supervisor/src/launch/mod.rs', "let teardown = match how.teardown {", "C_launched")
before('supervisor/src/launch/mod.rs', "let status = if unrecorded", "C_reported")
# The one-shot CLI (timeline.py with ONESHOT=1): its main, its parsed command line, its exit.
before('cli/src/lib.rs', "refuse_test_switches();\n    let args: Vec<OsString> = std::env::args_os().collect();", "M_main")
before('cli/src/lib.rs', "exit_with(cage_cmd::run(&run), 125);", "M_parsed")
before('cli/src/lib.rs', "match code {\n        Ok(c) => std::process::exit(c),", "M_exit")
# A `--supervisor` client (timeline.py with CLIENT=1): its request built, connected, sent, answered.
before('cli/src/daemon/client.rs', "    let cwd = open_cwd()?;\n    let passed = Passed::ours(cwd.as_fd(), interactive)?;", "Q_built", "chio_cage")
before('cli/src/daemon/client.rs', "    let mut line = serde_json::to_vec(request)?;", "Q_connected", "chio_cage")
before('cli/src/daemon/client.rs', "    let mut reply = String::new();", "Q_sent", "chio_cage")
before('cli/src/daemon/client.rs', "    if reply.is_empty() {\n        sent.with_context", "Q_answer", "chio_cage")
before('cli/src/cage_cmd.rs', "    Ok(status as i32)\n}", "Q_reported", "chio_cage")
# The target's setup, step by step (inside.rs, target_setup).
for lab, anc in [("T_hello", "    reset_signals();\n    // A fixed"),
                 ("T_rlimits", "    let last = identity::last_cap();\n    fault::fail_at(ctx.plan, Stage::Capabilities)?;"),
                 ("T_ids", "    if plan.enter.is_some() {\n        // Entering"),
                 ("T_cleared", "    reported.capabilities_cleared = identity::caps_all_clear(last);"),
                 ("T_landlock", "    let target = find_target(plan)?;"),
                 ("T_readysent", "    if let Some(script) = target.script {\n        // The sealed"),
                 ("T_seccomp", "    if late_caps {\n        identity::clear_caps()"),
                 ("T_go", "    fault::fail_at(ctx.plan, Stage::Exec)?;\n    if fault::on(plan, &TestHook::Touch)")]:
    before('cage/src/inside.rs', anc, lab, C)
# The supervisor while the cage sets up, and at the exec stop (launch.rs).
for lab, anc in [("C_janitor", "    let pidfd = sys::pidfd_open(init).map_err("),
                 ("C_ownfacts", "    let exec_at =\n        verify_and_exec("),
                 ("C_hello", "    let (tpid, sender) = match (cage_msg(hello.msg, hello.pid)?, hello.pidfd) {"),
                 ("C_seized", "    if hooks.gate.is_some_and(|open| !open()) {\n        let _ = channel::send_byte(sock.as_raw_fd(), ABORT);\n        release_tracee"),
                 ("C_gosent", "    let r = go.and_then(|()| {"),
                 ("C_warmed", "        verify_traced(plan, rec, host, sock, (tpid, hashes), (parked_ready, hooks.enforced))"),
                 ("C_verified", "    let traced = Traced { plan, host, tpid, exe: exe_id, script, settled, pending, sock };"),
                 ("C_obsread", "        observed.status_channel_eof = eof_within(self.sock, 2000);"),
                 ("C_checked", "        if ptrace::detach(Pid::from_raw(self.tpid), None).is_err() {")]:
    before('cage/src/launch.rs', anc, lab, C)
