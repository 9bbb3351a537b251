#!/usr/bin/env python3
"""Repository-leg benchmark (not part of the test run).

  sudo tests/bench/repository.py [--runs N] [--sizes 1000,8000]

For each workspace size it builds a git repository of that many small files under one source
path, runs `chio repository init`, then times `chio repository execute` round trips (journal
intent, cage launch over the host's system directories, teardown, the workspace walk, snapshot
commit, three durable receipts) — each with a fresh operation key:
  - true:  `true` (nothing changes; the floor of a round trip)
  - edit:  `echo N >> pkg/f0.txt` (one file changes: a new object and a new snapshot)
and, interleaved in the same run, `chio cage run --workspace W -- /bin/true` on the same host
root (the launch alone), so the difference is the leg's own cost. Prints median and p95 in ms.
The Docker leg this replaces took >= 300 ms a command (docker create + start + tar in and out).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def chio_binary():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "chio-cli"], cwd=REPO, check=True)
    return os.path.join(REPO, "target", "release", "chio")


def git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@example.com", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"})


def make_repo(root, files):
    repo = os.path.join(root, "src")
    os.makedirs(repo)
    git(repo, "init", "-q")
    per_dir = 100
    for i in range(files):
        d = os.path.join(repo, "pkg", f"d{i // per_dir}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d if i else os.path.join(repo, "pkg"), f"f{i}.txt"), "w") as f:
            f.write(f"line {i}\n" * 8)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bench")
    return repo


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - t) * 1000


def summary(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(len(xs) * 0.95))]


def bench(chio, files, runs):
    tmp = tempfile.mkdtemp(prefix="chio-bench-repo-")
    try:
        repo = make_repo(tmp, files)
        subprocess.run([chio, "keys", "generate", "--out", os.path.join(tmp, "key")], check=True, stderr=subprocess.DEVNULL)
        state = os.path.join(tmp, "ws")
        t = timed([chio, "repository", "init", "--state", state, "--repository", repo, "--revision", "HEAD",
                   "--source-path", "pkg", "--kernel-key", os.path.join(tmp, "key", "signing.seed")])
        launch_ws = os.path.join(tmp, "launch-ws")
        shutil.copytree(os.path.join(state, "workspace"), launch_ws, symlinks=True)
        series = {"true": [], "edit": [], "launch": []}
        for i in range(runs):
            series["true"].append(timed([chio, "repository", "execute", "--state", state, "--operation-key", f"t{i}",
                                         "--deadline", "60", "--", "true"]))
            series["edit"].append(timed([chio, "repository", "execute", "--state", state, "--operation-key", f"e{i}",
                                         "--deadline", "60", "--", f"echo {i} >> pkg/f0.txt"]))
            series["launch"].append(timed([chio, "cage", "run", "--workspace", launch_ws, "--uid", "0", "--gid", "0",
                                           "--", "/bin/true"]))
        print(f"{files} files (init {t:.0f} ms):")
        for name, xs in series.items():
            med, p95 = summary(xs)
            print(f"  {name:7s} median {med:6.1f} ms   p95 {p95:6.1f} ms")
        med = {k: summary(v)[0] for k, v in series.items()}
        print(f"  the leg's own cost over the launch: true +{med['true'] - med['launch']:.1f} ms, "
              f"edit +{med['edit'] - med['launch']:.1f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--sizes", default="1000,8000")
    a = ap.parse_args()
    chio = chio_binary()
    for n in (int(x) for x in a.sizes.split(",")):
        bench(chio, n, a.runs)


if __name__ == "__main__":
    main()
