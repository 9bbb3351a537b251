#!/usr/bin/env python3
"""Launch benchmark and soak for `chio cage run` (not part of the test run).

  sudo tests/bench/launch.py [--runs N] [--soak N] [--compare OTHER_CHIO | --compare-rev REV]

Builds a rootfs holding one static binary (`int main(){return 0;}` from gcc -static), then times,
interleaved in the same run so machine noise hits all three alike:
  - chio:  chio cage run --rootfs R -- /true   (namespaces, landlock, seccomp, cgroup, exec observation)
           on the host's cgroup hierarchy as detected (v1 on a hybrid host)
  - chio-v2: the same with CHIO_CGROUP_V2_ROOT in a cgroup2 mount made for the run (with only
           the controllers the host's v2 tree has, so ceilings are off: --memory/--pids/--cpus none)
  - bwrap: bwrap --unshare-all --die-with-parent --new-session --ro-bind R / --proc /proc --dev /dev
           --tmpfs /tmp /true                   (installed with apt-get if missing)
  - bare:  R/true                               (the floor: fork+exec from this script)
and prints medians and the chio/bwrap ratio; then the same launch with the target on the image,
in a workspace (hashed at the exec stop) and as a script in a workspace (run from a sealed copy).
`--compare` times another chio binary (say, the
release build of an earlier commit) the same way, interleaved, as `chio-other`, and prints
the ratio of this build to it; `--compare-rev REV` builds that commit first (tests/bench/revision.py). The soak runs N launches two at a time and checks
that no process, mount, cgroup or fd is left behind.
"""
import argparse
import concurrent.futures
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def build_chio():
    """The installable artifact: the static release build (packaging/build-release)."""
    out = subprocess.run([os.path.join(REPO, "packaging", "build-release")], check=True, stdout=subprocess.PIPE)
    return out.stdout.decode().strip()


def ensure_bwrap():
    if shutil.which("bwrap"):
        return shutil.which("bwrap")
    print("installing bubblewrap with apt-get ...", file=sys.stderr)
    sh("apt-get", "update", "-qq", stdout=subprocess.DEVNULL)
    sh("apt-get", "install", "-y", "-qq", "bubblewrap", stdout=subprocess.DEVNULL, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which("bwrap")


def build_rootfs(tmp):
    root = os.path.join(tmp, "rootfs")
    os.makedirs(root)
    for d in ("proc", "dev", "tmp"):  # bwrap needs its mount points in the image; chio makes its own
        os.makedirs(os.path.join(root, d))
    src = os.path.join(tmp, "true.c")
    with open(src, "w") as f:
        f.write("int main(void) { return 0; }\n")
    sh("gcc", "-static", "-O2", "-o", os.path.join(root, "true"), src)
    return root


def copied(src, dst):
    shutil.copy2(src, dst)
    return dst


def installed(chio, where):
    """A fresh copy of the build `chio` in the directory WHERE (made) as WHERE/chio, with the
    `chio-full` beside it if it has one (`chio` hands it every command but `cage run`; a build
    from before that split has none, its `chio` holding every command)."""
    os.makedirs(where, exist_ok=True)
    full = os.path.join(os.path.dirname(chio), "chio-full")
    if os.path.exists(full):
        copied(full, os.path.join(where, "chio-full"))
    return copied(chio, os.path.join(where, "chio"))


def shuffled(cmds):
    """The commands in a new random order (seeded: a rerun shuffles alike)."""
    items = list(cmds.items())
    SHUFFLE.shuffle(items)
    return items


SHUFFLE = random.Random(1)


def timed(cmd, env=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}): {r.stderr.decode()[-400:]}")
    return dt * 1000.0


def leftovers():
    """Processes, mounts and cgroups that a launch could leak."""
    procs = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"cage\0run" in cmd or cmd.startswith(b"/true"):
                procs.append(pid)
    with open("/proc/self/mountinfo") as f:
        mounts = sum(1 for _ in f)
    cgroups = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        cgroups += [d for d in dirnames if re.fullmatch(r"chio-\d+-[0-9a-f]{16}", d)]
    fds = len(os.listdir("/proc/self/fd"))
    return procs, mounts, cgroups, fds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--soak", type=int, default=500)
    ap.add_argument("--compare", help="another chio binary to time as chio-other")
    ap.add_argument("--compare-rev", help="a commit or tag: its static release build is timed as chio-other")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    if a.compare_rev:
        import revision
        a.compare = revision.build(a.compare_rev)
    chio = build_chio()
    bwrap = ensure_bwrap()
    with tempfile.TemporaryDirectory(prefix="chio-bench-") as tmp:
        root = build_rootfs(tmp)
        # Both builds timed from fresh copies side by side: the same binary run from the build
        # tree measured 5-9% slower than its copy elsewhere, which would pass for a regression.
        chio = installed(chio, os.path.join(tmp, "new"))
        if a.compare:
            a.compare = installed(a.compare, os.path.join(tmp, "other"))
        cg2 = os.path.join(tmp, "cgroup2")
        os.makedirs(cg2)
        sh("mount", "-t", "cgroup2", "none", cg2)
        v2root = os.path.join(cg2, f"chio-bench-{os.getpid()}")
        os.makedirs(v2root)
        v2env = {**os.environ, "CHIO_CGROUP_V2_ROOT": v2root}
        try:
            run_all(a, chio, bwrap, root, v2env)
            run_shapes(a, chio, root, tmp)
        finally:
            os.rmdir(v2root)
            sh("umount", cg2)


def run_shapes(a, chio, root, tmp):
    """Where the target lives decides when it is hashed: on the image (root-owned, read-only in
    the cage) before the exec, in a workspace at the exec stop; a script is copied into a sealed
    memfd. Times each shape, interleaved, against --compare when given."""
    ws = os.path.join(tmp, "ws")
    os.makedirs(ws)
    shutil.copy(os.path.join(root, "true"), os.path.join(ws, "true"))
    with open(os.path.join(ws, "s.sh"), "w") as f:
        f.write("#!/true\n" + "# a script of a few KiB\n" * 200)
    for name in ("true", "s.sh"):
        os.chmod(os.path.join(ws, name), 0o755)
    os.chown(ws, 65534, 65534)
    shapes = {
        "image /true": ["--rootfs", root, "--", "/true"],
        "workspace /true": ["--rootfs", root, "--workspace", ws, "--", "/workspace/true"],
        "workspace script": ["--rootfs", root, "--workspace", ws, "--", "/workspace/s.sh"],
    }
    bins = {"chio": chio}
    if a.compare:
        bins["chio-other"] = a.compare
    cmds = {(b, sh_): [path, "cage", "run", *args] for b, path in bins.items() for sh_, args in shapes.items()}
    for cmd in cmds.values():
        for _ in range(5):
            timed(cmd)
    samples = {k: [] for k in cmds}
    for _ in range(a.runs):
        for k, cmd in shuffled(cmds):
            samples[k].append(timed(cmd))
    print(f"where the target lives, {a.runs} runs each, interleaved (median ms):")
    for sh_ in shapes:
        line = f"  {sh_:18s}" + "".join(f" {b} {statistics.median(samples[(b, sh_)]):6.2f}" for b in bins)
        if a.compare:
            ratio = statistics.median(samples[("chio", sh_)]) / statistics.median(samples[("chio-other", sh_)])
            line += f"   ratio {ratio:.3f}"
        print(line)


def run_all(a, chio, bwrap, root, v2env):
        cmds = {
            "chio": [chio, "cage", "run", "--rootfs", root, "--", "/true"],
            "chio-v2": [chio, "cage", "run", "--memory", "none", "--pids", "none", "--cpus", "none", "--rootfs", root, "--", "/true"],
            "bare": [os.path.join(root, "true")],
        }
        if a.compare:
            cmds["chio-other"] = [a.compare, "cage", "run", "--rootfs", root, "--", "/true"]
        envs = {"chio-v2": v2env}
        if bwrap:
            cmds["bwrap"] = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", root, "/",
                             "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/true"]
        for k, cmd in cmds.items():  # warm caches
            for _ in range(5):
                timed(cmd, envs.get(k))
        samples = {k: [] for k in cmds}
        for _ in range(a.runs):
            # A new order each round: a launch timed right after another's teardown (a bwrap's
            # namespaces and mounts are freed after it exits) would otherwise always pay for it.
            for k, cmd in shuffled(cmds):
                samples[k].append(timed(cmd, envs.get(k)))
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(f"launch of a static /true, {a.runs} runs each, interleaved (median, p90 ms):")
        for k, v in samples.items():
            p90 = sorted(v)[int(len(v) * 0.9)]
            print(f"  {k:10s} {med[k]:7.2f}  {p90:7.2f}")
        if "bwrap" in med:
            print(f"  ratio chio/bwrap = {med['chio'] / med['bwrap']:.2f}   chio-v2/bwrap = {med['chio-v2'] / med['bwrap']:.2f}")
        if "chio-other" in med:
            print(f"  ratio chio/chio-other = {med['chio'] / med['chio-other']:.3f}")

        if a.soak:
            before = leftovers()
            t = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex:
                codes = list(ex.map(lambda _: subprocess.run(cmds["chio"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode, range(a.soak)))
            elapsed = time.perf_counter() - t
            time.sleep(0.5)
            # A janitor reports its cgroup removed, then exits on its own: give the last a moment.
            deadline = time.time() + 1.0
            after = leftovers()
            while after[0] and time.time() < deadline:
                time.sleep(0.01); after = leftovers()
            failed = sum(1 for c in codes if c != 0)
            print(f"soak: {a.soak} launches, 2 at a time, {elapsed:.1f} s, {failed} failed")
            print(f"  processes left {after[0]}  mounts {before[1]} -> {after[1]}  chio cgroups {after[2]}  fds {before[3]} -> {after[3]}")
            ok = failed == 0 and not after[0] and after[1] == before[1] and not after[2] and after[3] == before[3]
            print("  soak: clean" if ok else "  soak: LEAK")
            if not ok:
                sys.exit(1)


if __name__ == "__main__":
    main()
