#!/usr/bin/env python3
"""Per-command latency of the mini-swe-agent environments (not part of the test run).

  sudo target/msa-venv/bin/python tests/bench/agents.py [--runs N] [--compare OLD_CHIO | --compare-rev REV]

The same scripted commands (`true`, `ls -la`, `python3 -c 'print(1)'`), interleaved in one run so
machine noise hits all alike (the forms in a new order each round, each after --settle seconds
idle, default 5 ms), through:
  - local:      mini-swe-agent's LocalEnvironment (no confinement)
  - bubblewrap: mini-swe-agent's BubblewrapEnvironment (its default wrapper arguments: a mount
                namespace; the host's network, pids, IPC and hostname shared)
  - bubblewrap-all: the same with `--unshare-all --die-with-parent`: the namespaces chio makes
  - chio:       ChioEnvironment (namespaces, landlock, seccomp, cgroup ceilings, exec observation)
  - chio-daemon: ChioEnvironment with `supervisor` set: each command one request on the daemon's
                socket (`chio supervisor serve`, started here), no chio process per command
  - chio-repo:  ChioRepositoryEnvironment (the above plus the workspace walk, snapshot and three
                durable signed receipts per command)
  - chio-repo-d: the same with `supervisor` set: each command one `repository` request on the
                daemon's socket
Prints median and p95 in ms (overall and per command), and chio's ratio to bubblewrap. Uses the installable static release
`chio` (packaging/build-release, built here). `--compare` adds `chio-old` and `chio-daemon-old`: the
same two forms from an earlier build (and a daemon of its own), interleaved with the rest;
`--compare-rev REV` builds that commit first (tests/bench/revision.py).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "packaging", "mini-swe-agent"))
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

from minisweagent.environments.extra.bubblewrap import (  # noqa: E402
    BubblewrapEnvironment,
    BubblewrapEnvironmentConfig,
)
from minisweagent.environments.local import LocalEnvironment  # noqa: E402

from chio_minisweagent import ChioEnvironment, ChioRepositoryEnvironment  # noqa: E402

COMMANDS = ["true", "ls -la", "python3 -c 'print(1)'"]
BWRAP_DEFAULT_ARGS = BubblewrapEnvironmentConfig().wrapper_args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--compare", help="an earlier chio build, timed as chio-old and chio-daemon-old")
    ap.add_argument("--compare-rev", help="a commit or tag: its static release build is --compare")
    ap.add_argument("--settle", type=float, default=0.005, help="seconds idle before each timed command")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import launch  # installed: a build's binaries copied into the run's directory
    if a.compare_rev:
        import revision
        a.compare = revision.build(a.compare_rev)
    chio = subprocess.run([os.path.join(REPO, "packaging", "build-release")], check=True,
                          stdout=subprocess.PIPE).stdout.decode().strip()
    tmp = tempfile.mkdtemp(prefix="chio-bench-agents-")
    # Both builds timed from fresh copies, as launch.py times them.
    chio = launch.installed(chio, os.path.join(tmp, "new"))
    daemons = []
    try:
        with open(os.path.join(tmp, "supervisor.json"), "w") as f:
            f.write('{"schema": "chio.supervisor-config.v1"}')

        def serve(binary, name):
            sock = os.path.join(tmp, f"{name}.sock")
            log = open(os.path.join(tmp, f"{name}.log"), "w+")
            daemons.append(subprocess.Popen([binary, "supervisor", "serve", "--socket", sock, "--config",
                                             os.path.join(tmp, "supervisor.json"), "--state-dir",
                                             os.path.join(tmp, f"{name}-state")],
                                            stdin=subprocess.DEVNULL, stderr=log))
            while "listening on" not in open(log.name).read():
                if daemons[-1].poll() is not None:
                    raise SystemExit(f"{binary} supervisor serve: {open(log.name).read()}")
                time.sleep(0.01)
            return sock

        sock = serve(chio, "d")
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        for i in range(20):
            with open(os.path.join(work, f"f{i}.py"), "w") as f:
                f.write(f"x = {i}\n")
        repo = os.path.join(tmp, "repo")
        shutil.copytree(work, os.path.join(repo, "pkg"))
        git = ["git", "-c", "user.name=b", "-c", "user.email=b@example.com"]
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "b"]):
            subprocess.run(git + args, cwd=repo, check=True)
        subprocess.run([chio, "keys", "generate", "--out", os.path.join(tmp, "key")], check=True, capture_output=True)
        state, state_d = os.path.join(tmp, "state"), os.path.join(tmp, "state-d")
        for st in (state, state_d):
            subprocess.run([chio, "repository", "init", "--state", st, "--repository", repo, "--revision", "HEAD",
                            "--source-path", "pkg", "--kernel-key", os.path.join(tmp, "key", "signing.seed")],
                           check=True, capture_output=True)
        envs = {
            "local": LocalEnvironment(cwd=work),
            "bubblewrap": BubblewrapEnvironment(cwd=work),
            # The same wrapper with the namespaces chio makes (pid, network, IPC, UTS, cgroup):
            # mini-swe-agent's default shares the host's network and pids.
            "bubblewrap-all": BubblewrapEnvironment(cwd=work, wrapper_args=["--unshare-all", "--die-with-parent",
                                                                            *BWRAP_DEFAULT_ARGS]),
            "chio": ChioEnvironment(chio=chio, cwd=work),
            "chio-daemon": ChioEnvironment(supervisor=sock, cwd=work),
            "chio-repo": ChioRepositoryEnvironment(chio=chio, state_dir=state, run_id="bench"),
            "chio-repo-d": ChioRepositoryEnvironment(supervisor=sock, state_dir=state_d, run_id="bench-d"),
        }
        if a.compare:
            old = launch.installed(a.compare, os.path.join(tmp, "old"))
            envs["chio-old"] = ChioEnvironment(chio=old, cwd=work)
            envs["chio-daemon-old"] = ChioEnvironment(supervisor=serve(old, "d-old"), cwd=work)
        times = {k: [] for k in envs}
        per_cmd = {(k, c): [] for k in envs for c in COMMANDS}
        for _ in range(a.runs):
            for cmd in COMMANDS:
                # A new order each time, each form after a moment idle: in a fixed order a form
                # ran while the one before it (a daemon's launch, which answers before it tears
                # its cage down and writes its receipts) was still at work, and read up to 15%
                # slower — the same build timed twice read 0.85 of itself.
                for name, env in launch.shuffled(envs):
                    time.sleep(a.settle)
                    t = time.perf_counter()
                    out = env.execute({"command": cmd})
                    ms = (time.perf_counter() - t) * 1000
                    times[name].append(ms)
                    per_cmd[(name, cmd)].append(ms)
                    if out["returncode"] != 0:
                        raise SystemExit(f"{name}: {cmd}: {out}")
        print("median ms per command: " + "  ".join(f"{c!r}" for c in COMMANDS))
        for name in envs:
            print(f"  {name:15s}" + "".join(f"{statistics.median(per_cmd[(name, c)]):10.1f}" for c in COMMANDS))
        med = {}
        for name, xs in times.items():
            xs.sort()
            med[name] = statistics.median(xs)
            print(f"{name:15s} median {med[name]:6.1f} ms   p95 {xs[int(len(xs) * 0.95) - 1]:6.1f} ms")
        print(f"chio / bubblewrap: {med['chio'] / med['bubblewrap']:.2f}   "
              f"chio-daemon / bubblewrap: {med['chio-daemon'] / med['bubblewrap']:.2f}   "
              f"chio / bubblewrap-all: {med['chio'] / med['bubblewrap-all']:.2f}")
        for c in COMMANDS:
            b = statistics.median(per_cmd[("bubblewrap", c)])
            ball = statistics.median(per_cmd[("bubblewrap-all", c)])
            one, dmn = statistics.median(per_cmd[("chio", c)]), statistics.median(per_cmd[("chio-daemon", c)])
            print(f"  {c!r}: chio / bubblewrap {one / b:.2f}   chio-daemon / bubblewrap {dmn / b:.2f}   "
                  f"chio / bubblewrap-all {one / ball:.2f}   chio-daemon / bubblewrap-all {dmn / ball:.2f}")
        if a.compare:
            print(f"chio / chio-old: {med['chio'] / med['chio-old']:.3f}   "
                  f"chio-daemon / chio-daemon-old: {med['chio-daemon'] / med['chio-daemon-old']:.3f}")
    finally:
        for d in daemons:
            d.terminate()
            d.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
