#!/usr/bin/env python3
"""What a one-shot launch's processes block on in the kernel (not part of the test run).

  sudo tests/bench/trace/waits.py [--runs N] [--chio PATH] [--v2]

Records `sched:sched_switch` with kernel stacks on every CPU (`perf record -a -g`) over N
one-shot launches of `chio cage run --rootfs R -- /true` (the rootfs of tests/bench/launch.py),
then pairs each time a chio process (the supervisor, `chio-init`, `chio-janitor`) leaves the CPU
blocked (state D: uninterruptible) with the moment it runs again. Each wait is named by the
first frame of its stack that says what it waited for (a lock, an RCU grace period, a vfork,
a migration), and the table gives, per process and reason, how often a launch waited and the
total per launch. Interruptible sleeps (a read, a poll, a waitpid) are left out: those are the
launch's own handshakes, which the timeline (`timeline.py`) shows.

`--v2` runs the launches with their cgroups in a private cgroup2 mount (CHIO_CGROUP_V2_ROOT),
with the ceilings off, as launch.py's chio-v2 does.
"""
import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import launch  # noqa: E402  (tests/bench/launch.py: the rootfs and the installed copy)

HEAD = re.compile(
    r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+\[\d+\]\s+(?P<t>[\d.]+):\s+sched:sched_switch:\s+"
    r"prev_comm=(?P<pc>.+?) prev_pid=(?P<pp>\d+) prev_prio=\d+ prev_state=(?P<ps>\S+) ==> "
    r"next_comm=(?P<nc>.+?) next_pid=(?P<np>\d+)"
)

# Frames that only say "it blocked": the reason is the first frame after them.
GENERIC = re.compile(
    r"^(__schedule|schedule|schedule_timeout|schedule_preempt_disabled|io_schedule|preempt_schedule"
    r"|rwsem_down_\w+|down_read|down_write|down_read_killable|down_write_killable|__down\w*"
    r"|__mutex_lock\w*|mutex_lock\w*|percpu_down_\w+|rt_mutex\w*|__rt_mutex\w*|rwbase_\w+"
    r"|wait_for_completion\w*|__wait_for_common|wait_for_common\w*|do_wait_for_common"
    r"|__flush_work|flush_work|__synchronize_srcu|synchronize_srcu\w*|schedule_hrtimeout\w*"
    r"|usleep_range_state|msleep|__cond_resched|osq_lock|mutex_spin_on_owner)(\.\w+)?$"
)


def reason(stack):
    for sym in stack:
        if not GENERIC.match(sym):
            return sym
    return stack[-1] if stack else "?"


def parse(text):
    """(comm, reason, wait in µs) for each D-state wait of a chio process."""
    out_at = {}
    waits = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        m = HEAD.match(lines[0]) if lines and lines[0] else None
        if not m:
            continue
        t = float(m["t"])
        np = m["np"]
        if np in out_at:
            t0, comm, why = out_at.pop(np)
            waits.append((comm, why, (t - t0) * 1e6))
        if m["pc"].startswith("chio") and m["ps"].startswith("D"):
            stack = []
            for frame in lines[1:]:
                parts = frame.split()
                if len(parts) >= 2:
                    stack.append(parts[1].split("+")[0])
            out_at[m["pp"]] = (t, m["pc"], reason(stack))
    return waits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--chio", help="the chio to trace (default: the static release build)")
    ap.add_argument("--v2", action="store_true", help="launch cgroups in a private cgroup2 mount")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    chio = a.chio or launch.build_chio()
    with tempfile.TemporaryDirectory(prefix="chio-waits-") as tmp:
        root = launch.build_rootfs(tmp)
        chio = launch.installed(chio, os.path.join(tmp, "bin"))
        env = dict(os.environ)
        cg2 = None
        if a.v2:
            cg2 = os.path.join(tmp, "cgroup2")
            os.makedirs(cg2)
            launch.sh("mount", "-t", "cgroup2", "none", cg2)
            env["CHIO_CGROUP_V2_ROOT"] = os.path.join(cg2, f"chio-waits-{os.getpid()}")
            os.makedirs(env["CHIO_CGROUP_V2_ROOT"])
        try:
            data = os.path.join(tmp, "perf.data")
            loop = (
                "import subprocess,sys,time\n"
                "for _ in range(int(sys.argv[1])):\n"
                "    subprocess.run(sys.argv[2:], check=True, stdout=subprocess.DEVNULL)\n"
                "    time.sleep(0.005)\n"
            )
            # (The private mount has only the controllers the host's v2 tree has: ceilings off.)
            off = ["--memory", "none", "--pids", "none", "--cpus", "none"] if a.v2 else []
            cmd = [chio, "cage", "run", *off, "--rootfs", root, "--", "/true"]
            launch.timed(cmd, env=env)  # warm the page cache, and fail early
            launch.sh(
                "perf", "record", "-q", "-a", "-g", "-e", "sched:sched_switch", "-o", data, "--",
                sys.executable, "-c", loop, str(a.runs), *cmd,
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            text = subprocess.run(
                ["perf", "script", "-i", data, "-F", "comm,tid,cpu,time,event,trace,ip,sym"],
                check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            ).stdout.decode(errors="replace")
        finally:
            if cg2:
                os.rmdir(env["CHIO_CGROUP_V2_ROOT"])
                launch.sh("umount", cg2)
    by = collections.defaultdict(list)
    for comm, why, us in parse(text):
        by[(comm, why)].append(us)
    print(f"D-state waits of chio processes over {a.runs} one-shot launches ({'v2' if a.v2 else 'host hierarchy'})")
    print(f"{'process':<14} {'waiting in':<40} {'per launch':>10} {'median µs':>10} {'µs/launch':>10}")
    rows = sorted(by.items(), key=lambda kv: -sum(kv[1]))
    for (comm, why), us in rows:
        print(f"{comm:<14} {why[:40]:<40} {len(us) / a.runs:>10.2f} {statistics.median(us):>10.0f} {sum(us) / a.runs:>10.1f}")
    for comm in sorted({c for c, _ in by}):
        total = sum(sum(us) for (c, _), us in by.items() if c == comm)
        print(f"total {comm}: {total / a.runs:.0f} µs/launch blocked")


if __name__ == "__main__":
    main()
