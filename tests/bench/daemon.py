#!/usr/bin/env python3
"""Daemon benchmark and load test for `chio supervisor serve` (not part of the test run).

  sudo tests/bench/daemon.py [--runs N] [--load SECONDS] [--clients N] [--compare OLD_CHIO | --compare-rev REV]

Builds the static release binary and a rootfs holding one static /true, starts the daemon in
the foreground on a private socket and state directory, and times, interleaved in the same run:
  - daemon-raw: one request on the daemon's socket from this process (a persistent client such
                as an agent host: no client process), stdout/stderr passed as descriptors, on a
                connection of its own
  - daemon-kept: the same on one connection kept from request to request (as the agent
                environment keeps its own)
  - daemon-cli: chio cage run --supervisor S --rootfs R -- /true   (a client process per launch)
  - one-shot:   chio cage run --rootfs R -- /true
  - bwrap:      bwrap --unshare-all --die-with-parent --new-session --ro-bind R / --proc /proc
                --dev /dev --tmpfs /tmp /true
  - bare:       R/true spawned from this script (no cage: the spawn and glibc's start-up)
  - c-floor:    tests/bench/floor.c built with gcc: one C process making the same namespaces and
                root and exec'ing /true (no daemon, observation, ceilings, landlock or seccomp)
  - c-floor-warm: the same program's third launch in a row, each after --settle idle as every
                form is, timed inside it (clone to waitpid): the floor from a process already
                running, as the daemon is, to compare with daemon-raw (c-floor adds the floor
                program's own spawn and start-up)
  - c-floor-daemon: the same program serving requests as chio's daemon does (`floor ROOT STAGING
                serve SOCKET`): a request line and two descriptors read by a server, handed to a
                worker forked ahead, which launches the floor's cage and answers the client
                itself; timed as daemon-raw is. The floor of a daemon of chio's shape: the same
                process hops (client, server, worker, client), none of the journal, admission,
                observation or checks
Each round takes the forms in a new order, each after --settle seconds idle (default 5 ms: a
daemon's teardown and its spare's work ahead happen after the answer and must not be charged to
whichever form is timed next; an agent's commands are seconds apart). It prints median and p95 of each and the record's request-to-exec-observed time (timings_us).
With --compare, a second daemon from OLD_CHIO (an earlier build) serves daemon-raw-old and
daemon-cli-old (OLD_CHIO's own client), timed interleaved with the rest, for before/after ratios
from one run.
The load test then runs N clients (default 2 x cores) launching back to back for SECONDS and
reports launches, failures, the daemon's RSS and descriptors before and after, and what is left
(processes, launch cgroups).
"""
import argparse
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import launch as lb  # noqa: E402  (build_chio, ensure_bwrap, build_rootfs, timed)


# The top level of a Debian image (debootstrap), less what the cage provides itself.
IMAGE_TOP = ["bin", "boot", "etc", "home", "lib", "lib64", "media", "mnt", "opt", "root", "run", "sbin", "srv",
             "sys", "usr", "var"]


def read_answer(s):
    """One answer line (b"" when the daemon closed the connection first)."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


# The chio binary each daemon's socket belongs to (its request lines are that chio's).
CHIO_OF = {}
_templates = {}


def line_for(sock_path, args, rid):
    """The launch request line `chio cage run ARGS --supervisor` of the daemon's own chio sends,
    as `rid`: chio.supervisor.v2 (written once by `chio internal request`), or for a chio from
    before it (an earlier build under --compare) the argv form it speaks."""
    chio = CHIO_OF[sock_path]
    key = (chio, tuple(args))
    if key not in _templates:
        done = subprocess.run([chio, "internal", "request", "--id", "template", "--", "cage", "run", *args],
                              capture_output=True, text=True)
        _templates[key] = json.loads(done.stdout) if done.returncode == 0 else None
    template = _templates[key]
    if template is None:
        return json.dumps({"id": rid, "op": "launch", "args": args, "fds": {"cwd": False, "stdin": False}}).encode() + b"\n"
    return json.dumps({**template, "id": rid}).encode() + b"\n"


def request(sock_path, args, rid, line=None):
    """One launch on a fresh connection; returns (ms, answer)."""
    line = line or line_for(sock_path, args, rid)
    null = os.open("/dev/null", os.O_WRONLY)
    t = time.perf_counter()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock_path)
        socket.send_fds(s, [line], [null, null])
        buf = read_answer(s)
    finally:
        s.close()
        os.close(null)
    ms = (time.perf_counter() - t) * 1000.0
    return ms, json.loads(buf)


class Kept:
    """One connection kept from request to request (as the agent environment keeps its own)."""

    def __init__(self, sock_path):
        self.path = sock_path
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(sock_path)
        self.null = os.open("/dev/null", os.O_WRONLY)

    def request(self, args, rid):
        line = line_for(self.path, args, rid)
        t = time.perf_counter()
        socket.send_fds(self.s, [line], [self.null, self.null])
        buf = read_answer(self.s)
        if not buf:
            raise SystemExit("the daemon closed the kept connection")
        return (time.perf_counter() - t) * 1000.0, json.loads(buf)


def status(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def cgroups_left():
    """Launch cgroups, except the one a live spare made ahead of its job."""
    left = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        left += [d for d in dirnames if re.fullmatch(r"chio-\d+-[0-9a-f]{16}", d) and not is_spare(d.split("-")[1])]
    return sorted(set(left))


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return "0"


def is_spare(pid):
    return comm(pid) == "chio-spare"


def pct(v, p):
    return sorted(v)[min(len(v) - 1, int(len(v) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--load", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=2 * os.cpu_count())
    ap.add_argument("--settle", type=float, default=0.005, help="seconds idle before each timed launch")
    ap.add_argument("--compare", help="an earlier chio build to time through its own daemon")
    ap.add_argument("--compare-rev", help="a commit or tag: its static release build is --compare")
    ap.add_argument("--chio", help="time this build instead of building one (compare builds made the same way)")
    ap.add_argument("--image-shape", action="store_true",
                    help="give the rootfs the top level of a distribution image (bin, etc, usr, var...: "
                         "each a bind the cage makes) beside /true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    if a.compare_rev:
        import revision
        a.compare = revision.build(a.compare_rev)
    chio = a.chio or lb.build_chio()
    bwrap = lb.ensure_bwrap()
    with tempfile.TemporaryDirectory(prefix="chio-bench-daemon-") as tmp:
        root = lb.build_rootfs(tmp)
        # Fresh copies side by side, as launch.py times them (a binary run from the build tree
        # measured slower than its own copy).
        chio = lb.installed(chio, os.path.join(tmp, "new"))
        if a.compare:
            a.compare = lb.installed(a.compare, os.path.join(tmp, "old"))
        if a.image_shape:
            for d in IMAGE_TOP:
                os.makedirs(os.path.join(root, d), exist_ok=True)
        sock = os.path.join(tmp, "s.sock")
        conf = os.path.join(tmp, "supervisor.json")
        with open(conf, "w") as f:
            json.dump({"schema": "chio.supervisor-config.v1", "max_launches": 64, "max_connections": 256,
                       "max_launches_per_client": 64, "max_connections_per_client": 256}, f)
        daemons = [start_daemon(chio, tmp, "new", conf)]
        CHIO_OF[daemons[0][1]] = chio
        try:
            if a.compare:
                daemons.append(start_daemon(a.compare, tmp, "old", conf))
                CHIO_OF[daemons[1][1]] = a.compare
            old_sock = daemons[1][1] if a.compare else None
            bench(a, chio, bwrap, root, daemons[0][1], daemons[0][0].pid, old_sock)
        finally:
            for d, _ in daemons:
                d.terminate()
                d.wait()


def start_daemon(chio, tmp, name, conf):
    """A daemon from `chio` on its own socket and state directory; returns (process, socket)."""
    sock = os.path.join(tmp, f"{name}.sock")
    log = open(os.path.join(tmp, f"{name}.log"), "w+")
    d = subprocess.Popen([chio, "supervisor", "serve", "--socket", sock, "--config", conf,
                          "--state-dir", os.path.join(tmp, f"state-{name}")], stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.time() + 10
    while "listening on" not in open(log.name).read():
        if time.time() > deadline:
            d.terminate()
            raise SystemExit(f"the daemon {chio} did not start")
        time.sleep(0.01)
    return d, sock


def c_floor(tmp):
    """tests/bench/floor.c built in `tmp` (the floor of a cage of this shape), or None without gcc."""
    if not shutil.which("gcc"):
        return None
    out = os.path.join(tmp, "floor")
    subprocess.run(["gcc", "-O2", "-o", out, os.path.join(HERE, "floor.c")], check=True)
    os.makedirs(os.path.join(tmp, "floor-staging"), exist_ok=True)
    return [out]


def floor_daemon(cmd, tmp):
    """The floor program serving on a socket of its own in `tmp`; returns (process, socket)."""
    sock = os.path.join(tmp, "floor.sock")
    d = subprocess.Popen(cmd + ["serve", sock], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    if not d.stdout.readline().startswith(b"listening on"):
        d.kill()
        raise SystemExit("the floor daemon did not start")
    return d, sock


def floor_warm(cmd, settle):
    """The floor program's third launch in a row, each after `settle` seconds idle, as it timed
    it (ms)."""
    out = subprocess.run(cmd + ["3", str(int(settle * 1e6))], check=True, capture_output=True, text=True).stdout.split()
    return int(out[-1]) / 1000.0


def bench(a, chio, bwrap, root, sock, dpid, old_sock=None):
    args = ["--rootfs", root, "--", "/true"]
    cmds = {
        "daemon-cli": [chio, "cage", "run", "--supervisor", sock] + args,
        "one-shot": [chio, "cage", "run"] + args,
    }
    if old_sock:
        # The earlier build's own client through its own daemon: a change to the client's path shows.
        cmds["daemon-cli-old"] = [CHIO_OF[old_sock], "cage", "run", "--supervisor", old_sock] + args
    # The same /true spawned from this script: what c-floor, one-shot and bwrap pay beyond their cage.
    cmds["bare"] = [os.path.join(root, "true")]
    floor = c_floor(os.path.dirname(root))
    if floor:
        cmds["c-floor"] = floor + [root, os.path.join(os.path.dirname(root), "floor-staging")]
    if bwrap:
        cmds["bwrap"] = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", root, "/",
                         "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/true"]
    n = [0]
    marks = []

    def raw(at=sock):
        n[0] += 1
        ms, ans = request(at, args, f"bench-{os.getpid()}-{n[0]}")
        if ans.get("exit_status") != 0:
            raise SystemExit(f"daemon launch failed: {ans}")
        if at == sock:
            marks.append(ans["record"]["timings_us"])
        return ms, ans["record"]["timings_us"]["exec_observed"] / 1000.0

    served = floor_daemon(cmds["c-floor"], os.path.dirname(root)) if floor else None

    def floor_raw():
        # The same bytes as chio's request, so both servers read as much.
        ms, ans = request(served[1], args, "", line=line_for(sock, args, f"floor-{n[0]}"))
        if ans.get("exit_status") != 0:
            raise SystemExit(f"the floor daemon's launch failed: {ans}")
        return ms

    for _ in range(5):
        if served:
            floor_raw()
        raw()
        if old_sock:
            raw(old_sock)
        for cmd in cmds.values():
            lb.timed(cmd)
    kept = Kept(sock)
    kept.request(args, f"kept-{os.getpid()}-0")
    samples = {k: [] for k in ["daemon-raw", "daemon-kept"] + (["daemon-raw-old"] if old_sock else []) + list(cmds)}
    observed = []

    def daemon_raw():
        ms, obs = raw()
        observed.append(obs)
        return ms

    def daemon_kept():
        n[0] += 1
        return kept.request(args, f"kept-{os.getpid()}-{n[0]}")[0]

    runs = {"daemon-raw": daemon_raw, "daemon-kept": daemon_kept}
    if old_sock:
        runs["daemon-raw-old"] = lambda: raw(old_sock)[0]
    for k, cmd in cmds.items():
        runs[k] = lambda cmd=cmd: lb.timed(cmd)
    if floor:
        runs["c-floor-warm"] = lambda: floor_warm(cmds["c-floor"], a.settle)
        samples["c-floor-warm"] = []
        runs["c-floor-daemon"] = floor_raw
        samples["c-floor-daemon"] = []
    order = list(runs)
    for _ in range(a.runs):
        # A daemon answers before it tears the cage down and then its spare gets the next launch
        # ready: whatever is timed right after it would pay for that work. Each round takes the
        # forms in a new order and lets the machine settle before each.
        random.shuffle(order)
        for k in order:
            time.sleep(a.settle)
            samples[k].append(runs[k]())
    if served:
        served[0].kill()
        served[0].wait()
    print(f"launch of a static /true, {a.runs} runs each, interleaved (median, p95 ms):")
    for k, v in samples.items():
        print(f"  {k:14s} {statistics.median(v):7.2f}  {pct(v, 0.95):7.2f}")
    print(f"  daemon request to exec observed (record): {statistics.median(observed):.2f}  {pct(observed, 0.95):.2f}")
    print("  the record's marks through the daemon (median us since the launch began):")
    for k in marks[-1]:
        print(f"    {k:16s} {statistics.median(m[k] for m in marks[5:] if k in m):8.0f}")
    if old_sock:
        print(f"  ratio daemon-raw/daemon-raw-old = "
              f"{statistics.median(samples['daemon-raw']) / statistics.median(samples['daemon-raw-old']):.2f}")
        print(f"  ratio daemon-cli/daemon-cli-old = "
              f"{statistics.median(samples['daemon-cli']) / statistics.median(samples['daemon-cli-old']):.2f}")
    if "bwrap" in samples:
        b = statistics.median(samples["bwrap"])
        print(f"  ratio daemon-raw/bwrap = {statistics.median(samples['daemon-raw']) / b:.2f}  "
              f"one-shot/bwrap = {statistics.median(samples['one-shot']) / b:.2f}")
        if "c-floor" in samples:
            print(f"  ratio c-floor/bwrap = {statistics.median(samples['c-floor']) / b:.2f}")
    if "c-floor-warm" in samples:
        print(f"  ratio daemon-raw/c-floor-warm = "
              f"{statistics.median(samples['daemon-raw']) / statistics.median(samples['c-floor-warm']):.2f}")
        print(f"  ratio daemon-raw/c-floor-daemon = "
              f"{statistics.median(samples['daemon-raw']) / statistics.median(samples['c-floor-daemon']):.2f}  "
              f"c-floor-daemon/c-floor-warm = "
              f"{statistics.median(samples['c-floor-daemon']) / statistics.median(samples['c-floor-warm']):.2f}")
    kept.s.close()
    os.close(kept.null)
    if a.load > 0:
        load(a, args, sock, dpid)


def load(a, args, sock, dpid):
    time.sleep(0.5)
    rss0, fds0 = status(dpid)
    stop = time.time() + a.load
    counts, failures, lock = [0], [], threading.Lock()

    def client(i):
        k = 0
        while time.time() < stop:
            k += 1
            try:
                _, ans = request(sock, args, f"load-{os.getpid()}-{i}-{k}")
                ok = ans.get("exit_status") == 0
            except Exception as e:  # noqa: BLE001 — any failure is counted and shown
                ans, ok = str(e), False
            with lock:
                counts[0] += 1
                if not ok:
                    failures.append(ans)

    rss_mid = []
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        rss_mid.append(status(dpid)[0])
    for t in threads:
        t.join()
    time.sleep(1.0)
    rss1, fds1 = status(dpid)
    left = [p for p in os.listdir("/proc") if p.isdigit() and comm(p) in ("chio-launch", "chio-init", "true")
            and not is_spare(parent(p))]  # the spare's init, cloned ahead of the next request
    print(f"load: {a.clients} clients for {a.load:.0f} s: {counts[0]} launches "
          f"({counts[0] / a.load:.1f}/s), {len(failures)} failed")
    print(f"  daemon RSS {rss0} -> {rss1} KiB (max during {max(rss_mid or [rss1])}), fds {fds0} -> {fds1}, "
          f"processes left {left}, launch cgroups left {cgroups_left()}")
    if failures:
        print("  first failure:", failures[0])
    if failures or fds1 != fds0 or left:
        sys.exit(1)


if __name__ == "__main__":
    main()
