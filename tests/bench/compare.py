#!/usr/bin/env python3
"""Every launch figure of this build against an earlier one, in one run (not part of the test run).

  sudo python3 tests/bench/compare.py --rev REV [--runs N] [--load S] [--no-agents]

Builds this tree's static release `chio` and REV's (a tag, a commit, `HEAD~3`: tests/bench/
revision.py), then runs, each with the other build interleaved as `--compare`:
  - launch.py   the one-shot `chio cage run` (cgroup v1 as the host has it, and v2 in a private
                mount), with bubblewrap and a bare exec beside it
  - daemon.py   the daemon's raw round trip, a client process through the daemon, the one-shot
                form, bubblewrap and the C floor (cold, warm, and serving as a daemon); with
                --load S, the daemon's RSS over S seconds of load
  - agents.py   mini-swe-agent's environments, per command (with target/msa-venv/bin/python;
                skipped when that is missing or with --no-agents)
and prints one table: each figure for this build and REV, their ratio, and the ratios the
performance goals are stated in (docs/performance.md), beside each goal. Every bench's own
output is printed first, as it ran.
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import revision  # noqa: E402


def run(cmd):
    """Run a bench, echo its output, return it."""
    print(f"$ {' '.join(cmd)}", flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    text = out.stdout.decode(errors="replace")
    print(text, flush=True)
    if out.returncode != 0:
        raise SystemExit(f"{cmd[1]} failed (exit {out.returncode})")
    return text


def num(pattern, text):
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else None


def median(name, text):
    """The median column of a bench's `  NAME  median  tail` line."""
    return num(rf"^\s+{re.escape(name)}\s+([0-9.]+)\s+[0-9.]+\s*$", text)


def tail(name, text):
    return num(rf"^\s+{re.escape(name)}\s+[0-9.]+\s+([0-9.]+)\s*$", text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", required=True, help="the earlier commit or tag to compare with")
    ap.add_argument("--runs", type=int, default=150)
    ap.add_argument("--load", type=float, default=0.0, help="seconds of daemon load (RSS before and after)")
    ap.add_argument("--no-agents", action="store_true")
    a = ap.parse_args()
    old = revision.build(a.rev)
    py = sys.executable
    launch = run([py, os.path.join(HERE, "launch.py"), "--runs", str(a.runs), "--soak", "0", "--compare", old])
    daemon = run([py, os.path.join(HERE, "daemon.py"), "--runs", str(a.runs), "--load", str(a.load), "--compare", old])
    venv = os.path.join(REPO, "target", "msa-venv", "bin", "python")
    agents = None
    if not a.no_agents and os.path.exists(venv):
        agents = run([venv, os.path.join(HERE, "agents.py"), "--runs", str(max(10, a.runs // 5)), "--compare", old])

    rows = []  # (figure, this, earlier, goal)

    def pair(figure, this, earlier):
        rows.append((figure, this, earlier, ""))

    def ratio(figure, value, goal=""):
        rows.append((figure, value, None, goal))

    pair("one-shot /true, ms", median("chio", launch), median("chio-other", launch))
    for where in ("image /true", "workspace /true", "workspace script"):
        m = re.search(rf"{re.escape(where)}\s+chio\s+([0-9.]+) chio-other\s+([0-9.]+)", launch)
        if m:
            pair(f"one-shot, {where}, ms", float(m.group(1)), float(m.group(2)))
    ratio("one-shot / bubblewrap", num(r"ratio chio/bwrap = ([0-9.]+)", launch), "<= 0.83")
    ratio("one-shot on cgroup v2 / bubblewrap", num(r"chio-v2/bwrap = ([0-9.]+)", launch), "<= 0.83")
    pair("daemon raw round trip, ms", median("daemon-raw", daemon), median("daemon-raw-old", daemon))
    raw, warm = median("daemon-raw", daemon), median("c-floor-warm", daemon)
    ratio("daemon raw / warm C floor", raw / warm if raw and warm else None, "<= 1.3")
    shape = median("c-floor-daemon", daemon)
    ratio("daemon raw / C floor of the daemon's shape", raw / shape if raw and shape else None)
    ratio("C floor of the daemon's shape / warm C floor", shape / warm if shape and warm else None)
    p95 = tail("daemon-raw", daemon)
    ratio("daemon raw p95 / median", p95 / raw if raw and p95 else None, "<= 2")
    pair("a client process through the daemon, ms", median("daemon-cli", daemon), median("daemon-cli-old", daemon))
    cli, one = median("daemon-cli", daemon), median("one-shot", daemon)
    ratio("client through the daemon / one-shot", cli / one if cli and one else None, "<= 0.6")
    rss = re.search(r"daemon RSS ([0-9]+) -> ([0-9]+) KiB", daemon)
    if rss:
        before, after = int(rss.group(1)) / 1024, int(rss.group(2)) / 1024
        ratio("daemon RSS after load, MB", after, "<= 20")
        ratio("daemon RSS growth over the load, MB", after - before, "flat")
    if agents:
        for cmd in ("'true'", "'ls -la'", "\"python3 -c 'print(1)'\""):
            m = re.search(rf"{re.escape(cmd)}: chio / bubblewrap ([0-9.]+)\s+chio-daemon / bubblewrap ([0-9.]+)", agents)
            if m:
                ratio(f"agent {cmd}: one-shot env / bubblewrap env", float(m.group(1)), "<= 1.1")
                ratio(f"agent {cmd}: daemon env / bubblewrap env", float(m.group(2)), "<= 1.0")
        m = re.search(r"chio / chio-old: ([0-9.]+)\s+chio-daemon / chio-daemon-old: ([0-9.]+)", agents)
        if m:
            ratio(f"agent one-shot env, this / {a.rev}", float(m.group(1)))
            ratio(f"agent daemon env, this / {a.rev}", float(m.group(2)))

    print(f"\n{'figure':60s} {'this':>8s} {a.rev[:10]:>10s} {'ratio':>7s}   goal")
    for figure, this, earlier, goal in rows:
        fmt = lambda v: f"{v:8.2f}" if v is not None else f"{'n/a':>8s}"  # noqa: E731
        if earlier is not None:
            r = f"{this / earlier:7.3f}" if this and earlier else f"{'n/a':>7s}"
            print(f"{figure:60s} {fmt(this)} {fmt(earlier):>10s} {r}")
        else:
            print(f"{figure:60s} {fmt(this)} {'':>10s} {'':>7s}   {goal}")


if __name__ == "__main__":
    main()
