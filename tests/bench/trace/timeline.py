#!/usr/bin/env python3
"""Where a launch through the daemon spends its time, across processes (not part of the test run).

  git stash -u   # (or commit first: instrument.py edits the sources, `git checkout -- .` undoes it)
  python3 tests/bench/trace/instrument.py && packaging/build-release
  sudo python3 tests/bench/trace/timeline.py [RUNS]          # a rootfs with a static /true
  sudo HOSTROOT=1 python3 tests/bench/trace/timeline.py      # the agents' shape: host root, bash
  sudo ONESHOT=1 python3 tests/bench/trace/timeline.py       # `chio cage run` itself, no daemon
  sudo CLIENT=1 OFFSETS=1 python3 tests/bench/trace/timeline.py  # a `--supervisor` client process (read
                                                             # its offsets: its exit comes after the answer)
  sudo OFFSETS=1 python3 tests/bench/trace/timeline.py       # also each mark's median time from K_start
  git checkout -- . && rm cage/src/trace.rs

instrument.py adds `chio_cage::trace::t("LABEL")` calls that append `pid LABEL monotonic_ns` to
/tmp/chio-trace when that file exists (this script creates it before the daemon starts and
removes it after). The marks of the launch record (`timings_us`, relative to K_start) are merged
in. Prints the median of each step of the chain below, over RUNS requests (default 100); a
negative step means its two marks overlap (the journal entry lands while the job is parsed).
Each step goes from one mark to the next mark of the chain that the run has (an init cloned
ahead has no I_ marks, a launch that cloned its own has no A_ marks). Marks of two processes
overlap (the target sets itself up while the supervisor seizes it), so a step between them can be
negative: OFFSETS=1's median time of each mark from K_start is the consistent view.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))
import daemon as db  # noqa: E402
import launch as lb  # noqa: E402

CHIO = os.path.join(REPO, "target/x86_64-unknown-linux-gnu/release/chio")
TRACE = "/tmp/chio-trace"
CHAIN = ["client_start", "M_main", "M_parsed", "Q_built", "Q_connected", "Q_sent", "S_read", "S_submit", "P_recv", "L_handed", "P_parsed", "S_begun", "P_go",
         "C_planned", "K_start", "m_resolve", "I_start", "A_plan", "m_cgroup", "I_unshared", "I_built",
         "I_attached", "I_pivoted", "A_built", "I_net", "I_joined", "A_ceilings", "I_spawn", "A_spawn", "C_janitor", "C_ownfacts", "C_hello", "C_seized", "C_gosent", "T_start", "T_hello", "T_rlimits", "T_ids",
         "T_cleared", "T_landlock", "T_readysent", "C_warmed", "m_cage_ready", "C_verified", "T_seccomp", "T_go", "m_exec_stop",
         "C_obsread", "C_checked", "m_exec_observed",
         "R_result", "m_target_ended", "C_launched", "C_reported", "M_exit", "P_answered", "S_answer", "S_replied",
         "Q_answer", "Q_reported", "client_end"]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with tempfile.TemporaryDirectory(prefix="chio-trace-") as tmp:
        args = ["--rootfs", lb.build_rootfs(tmp), "--", "/true"]
        if os.environ.get("HOSTROOT"):
            os.makedirs(tmp + "/ws")
            args = ["--workspace", tmp + "/ws", "--cwd", "/workspace", "--uid", "0", "--gid", "0", "--memory", "512M",
                    "--pids", "64", "--cpus", "1", "--net", "none", "--", "/bin/bash", "-c", "true"]
        conf = os.path.join(tmp, "c.json")
        with open(conf, "w") as f:
            json.dump({"schema": "chio.supervisor-config.v1"}, f)
        open(TRACE, "w").close()
        runs = []
        if os.environ.get("ONESHOT"):
            try:
                for i in range(10 + n):
                    t0 = time.monotonic_ns()
                    out = subprocess.run([CHIO, "cage", "run", "--json", *args], stderr=subprocess.PIPE, check=True)
                    t1 = time.monotonic_ns()
                    if i >= 10:
                        runs.append((t0, t1, json.loads(out.stderr.decode().strip().splitlines()[-1])["timings_us"]))
                    time.sleep(0.01)
            finally:
                with open(TRACE) as f:
                    events = [(l.split()[1], int(l.split()[2])) for l in f if len(l.split()) == 3]
                os.unlink(TRACE)
            report(runs, events, n)
            return
        d, sock = db.start_daemon(CHIO, tmp, "new", conf)
        db.CHIO_OF[sock] = CHIO
        try:
            for i in range(10):
                db.request(sock, args, f"warm-{i}-{time.time_ns()}")
            client = [CHIO, "cage", "run", "--supervisor", sock, "--json", *args]
            for i in range(n):
                t0 = time.monotonic_ns()
                if os.environ.get("CLIENT"):
                    out = subprocess.run(client, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
                    # (The client's end is taken before its record is parsed: that is this script's time.)
                    t1 = time.monotonic_ns()
                    marks = json.loads(out.stderr.decode().strip().splitlines()[-1])["timings_us"]
                else:
                    marks = db.request(sock, args, f"trace-{i}-{time.time_ns()}")[1]["record"]["timings_us"]
                    t1 = time.monotonic_ns()
                runs.append((t0, t1, marks))
                time.sleep(0.01)
        finally:
            d.terminate()
            d.wait()
            with open(TRACE) as f:
                events = [(l.split()[1], int(l.split()[2])) for l in f if len(l.split()) == 3]
            os.unlink(TRACE)
    report(runs, events, n)


def marks_of(run, events):
    """One run's marks: the trace's within its round trip, and its record's (relative to K_start)."""
    t0, t1, marks = run
    seen = {"client_start": t0, "client_end": t1}
    for label, ns in events:
        if t0 <= ns <= t1:
            seen.setdefault(label, ns)
    if "K_start" in seen:
        for k, us in marks.items():
            seen["m_" + k] = seen["K_start"] + us * 1000
    return seen


def report(runs, events, n):
    """The median of each step of CHAIN over the runs (and with OFFSETS, of each mark's time)."""
    steps, offs = {}, {}
    for run in runs:
        seen = marks_of(run, events)
        present = [c for c in CHAIN if c in seen]
        for a, b in zip(present, present[1:]):
            steps.setdefault((a, b), []).append((seen[b] - seen[a]) / 1000)
        if "K_start" in seen:
            for k, v in seen.items():
                offs.setdefault(k, []).append((v - seen["K_start"]) / 1000)
    for a, b in sorted(steps, key=lambda ab: (CHAIN.index(ab[0]), CHAIN.index(ab[1]))):
        if len(steps[(a, b)]) * 10 >= n:  # a pair seen in fewer than 1 run in 10 is noise
            print(f"{statistics.median(steps[(a, b)]):8.0f} us  {a} -> {b}  ({len(steps[(a, b)])})")
    if os.environ.get("OFFSETS"):
        for k in sorted(offs, key=lambda k: statistics.median(offs[k])):
            if len(offs[k]) * 10 >= n:
                print(f"  {statistics.median(offs[k]):8.0f} us  {k}")
    print(f"round trip median {statistics.median([(t1 - t0) / 1000 for t0, t1, _ in runs]):.0f} us")


if __name__ == "__main__":
    main()
