#!/usr/bin/env python3
"""Containers through engines: chio as the OCI runtime beside runc and crun (not part of the tests).

  sudo tests/bench/oci.py [--runs N]

Builds an image holding one static binary (`int main(){return 0;}` from gcc -static), imports it
into a private containerd (no CRI) and private podman storage, then times, interleaved in one
run so machine noise hits all alike, the same container through each runtime:
  - ctr run --rm --read-only --runc-binary RUNTIME IMAGE ID /true     (the runc v2 shim)
  - podman --runtime RUNTIME run --rm --read-only --network none IMAGE /true   (conmon)
with RUNTIME one of chio (the static release build, as chio-runc), runc and crun. Every runtime
gets the same flags; podman's `--ulimit nofile=H:H --ulimit nproc=32768:32768` (H the hard limit)
because runc and crun fail to raise a limit on hosts that withhold CAP_SYS_RESOURCE. Prints the
median and p90 of each, and each runtime's ratio to runc and crun.
"""
import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch  # noqa: E402  (build_chio, build_rootfs, sh)

RUNTIMES = ("chio", "runc", "crun")
IMAGE_CTR = "docker.io/library/chio-bench:1"
IMAGE_PODMAN = "localhost/chio-bench:1"


def oci_archive(root, out):
    """An OCI archive (index.json, blobs) of `root` as one uncompressed layer, for ctr import."""
    import hashlib
    import io
    import json

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(root, arcname=".")
    layer = buf.getvalue()

    def digest(b):
        return "sha256:" + hashlib.sha256(b).hexdigest()

    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/true"]},
                      "rootfs": {"type": "layers", "diff_ids": [digest(layer)]}}).encode()
    man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(cfg), "size": len(cfg)},
                      "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer), "size": len(layer)}]}).encode()
    idx = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "digest": digest(man), "size": len(man), "annotations": {"io.containerd.image.name": IMAGE_CTR}}]}).encode()
    with tarfile.open(out, "w") as t:
        for name, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", idx)] + [
            ("blobs/sha256/" + digest(b)[7:], b) for b in (layer, cfg, man)
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


class Containerd:
    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "containerd")
        os.makedirs(self.dir)
        cfg = os.path.join(self.dir, "config.toml")
        with open(cfg, "w") as f:
            f.write(f'version = 2\nroot = "{self.dir}/root"\nstate = "{self.dir}/state"\n'
                    f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{self.dir}/sock"\n')
        self.proc = subprocess.Popen(["containerd", "--config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            if subprocess.run(self.ctr("version"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                return
            time.sleep(0.05)
        raise SystemExit("containerd did not start")

    def ctr(self, *args):
        return ["ctr", "--address", os.path.join(self.dir, "sock"), *args]

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        with open("/proc/self/mountinfo") as f:
            for m in [l.split()[4] for l in f if l.split()[4].startswith(self.dir)]:
                subprocess.run(["umount", "-l", m])


def podman(tmp, runtime, *args):
    d = os.path.join(tmp, "podman")
    return ["podman", "--root", f"{d}/root", "--runroot", f"{d}/runroot", "--tmpdir", f"{d}/tmp",
            "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
            "--runtime", runtime,
            *(["--runtime-flag", f"node-config={d}/node.json"] if runtime.endswith("chio-runc") else []), *args]


def timed(cmd, env=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    dt = (time.perf_counter() - t) * 1000.0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed ({r.returncode}): {r.stderr.decode()[-600:]}")
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    chio = launch.build_chio()
    tmp = tempfile.mkdtemp(prefix="chio-bench-oci-")
    ctd = None
    try:
        # The runtime is chio-full's (`chio` would hand the command line to it: one exec more).
        runc_link = os.path.join(tmp, "chio-runc")
        os.symlink(os.path.join(os.path.dirname(chio), "chio-full"), runc_link)
        binaries = {"chio": runc_link, "runc": shutil.which("runc"), "crun": shutil.which("crun")}
        root = launch.build_rootfs(tmp)
        for d in ("etc", "var/tmp", "run"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        for f in ("etc/hosts", "etc/hostname", "etc/resolv.conf"):
            open(os.path.join(root, f), "w").close()
        archive = os.path.join(tmp, "image.tar")
        oci_archive(root, archive)
        ctd = Containerd(tmp)
        launch.sh(*ctd.ctr("image", "import", archive), stdout=subprocess.DEVNULL)
        pd = os.path.join(tmp, "podman")
        os.makedirs(pd)
        with open(os.path.join(pd, "containers.conf"), "w") as f:
            f.write("[containers]\ndefault_sysctls = []\n")
        with open(os.path.join(pd, "node.json"), "w") as f:
            f.write('{"bind_sources": [{"path": "%s/runroot", "writable": true}]}' % pd)
        env = {**os.environ, "CONTAINERS_CONF": os.path.join(pd, "containers.conf")}
        rootfs_tar = os.path.join(tmp, "rootfs.tar")
        launch.sh("tar", "-C", root, "-cf", rootfs_tar, ".")
        launch.sh(*podman(tmp, binaries["runc"], "import", rootfs_tar, IMAGE_PODMAN), stdout=subprocess.DEVNULL, env=env)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        ulimits = ["--ulimit", f"nofile={hard}:{hard}", "--ulimit", "nproc=32768:32768"]
        n = [0]

        def cmds():
            n[0] += 1
            c = {}
            for rt, path in binaries.items():
                c[f"ctr {rt}"] = (ctd.ctr("run", "--rm", "--read-only", "--runc-binary", path, IMAGE_CTR, f"b{n[0]}{rt}", "/true"), None)
                c[f"podman {rt}"] = (podman(tmp, path, "run", "--rm", "--read-only", "--network", "none", *ulimits, IMAGE_PODMAN, "/true"), env)
            return c

        # Warm every path once; a runtime an engine cannot use on this host (crun refuses a
        # cgroup v1/v2 hybrid under ctr) is left out of that engine's rows, with its reason.
        dropped = {}
        for _ in range(2):
            for k, (cmd, e) in cmds().items():
                if k in dropped:
                    continue
                try:
                    timed(cmd, e)
                except SystemExit as why:
                    dropped[k] = str(why)[-200:]
        for k, why in dropped.items():
            print(f"  {k}: not timed: {why}")
        times = {k: [] for k in cmds() if k not in dropped}
        shuffle = random.Random(1)
        for _ in range(a.runs):
            items = [(k, v) for k, v in cmds().items() if k not in dropped]
            shuffle.shuffle(items)
            for k, (cmd, e) in items:
                times[k].append(timed(cmd, e))
        med = {k: statistics.median(v) for k, v in times.items()}
        p90 = {k: sorted(v)[int(len(v) * 0.9) - 1] for k, v in times.items()}
        print(f"a container running a static /true, {a.runs} runs each, interleaved (median, p90 ms):")
        for engine in ("ctr", "podman"):
            for rt in RUNTIMES:
                k = f"{engine} {rt}"
                if k in med:
                    print(f"  {k:14} {med[k]:7.1f} {p90[k]:7.1f}")
            c = med.get(f"{engine} chio")
            ratios = [f"chio/{rt} {c / med[f'{engine} {rt}']:.2f}" for rt in ("runc", "crun") if c and f"{engine} {rt}" in med]
            print(f"  {engine}: {', '.join(ratios)}")
    finally:
        if ctd:
            ctd.stop()
        subprocess.run(podman(tmp, shutil.which("runc"), "system", "reset", "--force"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
