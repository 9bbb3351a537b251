#!/usr/bin/env python3
"""Image import benchmark (not part of the test run).

  sudo tests/bench/import.py [--runs N] [--mib 200] [--files 6000]

Synthesizes an OCI layout (3 gzip layers, ~200 MiB, ~6,000 files of mixed sizes, directories,
symlinks, a whiteout), then times, interleaved in the same run:
  - chio:   chio image import LAYOUT --state-dir <fresh>     (verify every digest + safe extract)
  - tar:    tar -xzf of each layer in order into a fresh dir  (GNU tar; no verification)
  - umoci:  umoci raw unpack --image LAYOUT:bench <fresh>     (installed with apt-get if missing)
  - re-import of a present image (chio: verification only)
and prints medians and ratios.
"""
import argparse, gzip, hashlib, io, json, os, random, shutil, statistics, subprocess, sys, tarfile, tempfile, time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def layer_bytes(rng, n_files, total, prefix, extra=()):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = [f"{prefix}/d{i:03d}" for i in range(max(1, n_files // 40))]
        for d in dirs:
            ti = tarfile.TarInfo(d); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; t.addfile(ti)
        sizes = [rng.choice([200, 1500, 8000, 30000]) for _ in range(n_files)]
        scale = total / sum(sizes)
        for i, s in enumerate(sizes):
            data = rng.randbytes(max(1, int(s * scale)))
            ti = tarfile.TarInfo(f"{rng.choice(dirs)}/f{i:05d}"); ti.size = len(data); ti.mode = 0o644
            t.addfile(ti, io.BytesIO(data))
        for i in range(20):
            ti = tarfile.TarInfo(f"{prefix}/link{i}"); ti.type = tarfile.SYMTYPE; ti.linkname = dirs[0]; t.addfile(ti)
        for name in extra:
            ti = tarfile.TarInfo(name); ti.size = 0; t.addfile(ti, io.BytesIO(b""))
    return buf.getvalue()


def build_layout(dir, mib, files):
    rng = random.Random(42)
    per = mib * (1 << 20) // 3
    plains = [layer_bytes(rng, files // 3, per, "usr"), layer_bytes(rng, files // 3, per, "opt"),
              layer_bytes(rng, files // 3, per, "srv", extra=["usr/.wh.link0"])]
    blobs = os.path.join(dir, "blobs", "sha256"); os.makedirs(blobs)
    def put(data):
        h = hashlib.sha256(data).hexdigest()
        open(os.path.join(blobs, h), "wb").write(data)
        return {"digest": "sha256:" + h, "size": len(data)}
    layers = []
    for p in plains:
        d = put(gzip.compress(p, compresslevel=1)); d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"; layers.append(d)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(p).hexdigest() for p in plains]}}).encode()
    c = put(config); c["mediaType"] = "application/vnd.oci.image.config.v1+json"
    m = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": c, "layers": layers}).encode())
    m["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    m["annotations"] = {"org.opencontainers.image.ref.name": "bench"}
    json.dump({"schemaVersion": 2, "manifests": [m]}, open(os.path.join(dir, "index.json"), "w"))
    open(os.path.join(dir, "oci-layout"), "w").write('{"imageLayoutVersion":"1.0.0"}')
    return [os.path.join(blobs, l["digest"][7:]) for l in layers], sum(len(p) for p in plains)


def timed(fn):
    t = time.perf_counter(); fn(); return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(); ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mib", type=int, default=200); ap.add_argument("--files", type=int, default=6000)
    a = ap.parse_args()
    # The installable artifact: the static release build.
    chio = subprocess.run([os.path.join(REPO, "packaging", "build-release")], check=True,
                          stdout=subprocess.PIPE).stdout.decode().strip()
    if not shutil.which("umoci"):
        sh("apt-get", "install", "-y", "-qq", "umoci", stdout=subprocess.DEVNULL, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    with tempfile.TemporaryDirectory(prefix="chio-import-bench-", dir="/var/tmp") as tmp:
        layout = os.path.join(tmp, "layout"); os.makedirs(layout)
        blobs, plain = build_layout(layout, a.mib, a.files)
        print(f"image: {plain / 2**20:.0f} MiB uncompressed, {a.files} files, 3 gzip layers")
        def fresh(name):
            d = os.path.join(tmp, name); shutil.rmtree(d, ignore_errors=True); return d
        def run_chio():
            sh(chio, "image", "import", layout, "--state-dir", fresh("state"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        def run_tar():
            d = fresh("tar"); os.makedirs(d)
            for b in blobs:
                sh("tar", "-xzf", b, "-C", d)
        def run_umoci():
            sh("umoci", "raw", "unpack", "--rootless", "--image", layout + ":bench", fresh("umoci"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t = {"chio": [], "tar": [], "umoci": []}
        for _ in range(a.runs):
            for k, fn in (("chio", run_chio), ("tar", run_tar), ("umoci", run_umoci)):
                sh("sync"); t[k].append(timed(fn))
        reimport = statistics.median(timed(lambda: sh(chio, "image", "import", layout, "--state-dir", os.path.join(tmp, "state"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)) for _ in range(a.runs))
        med = {k: statistics.median(v) for k, v in t.items()}
        for k, v in med.items():
            print(f"  {k:6s} median {v:6.2f} s")
        print(f"  chio re-import of the present image (verify only) median {reimport:.2f} s")
        print(f"  ratio chio/tar = {med['chio'] / med['tar']:.2f}   umoci/chio = {med['umoci'] / med['chio']:.2f}")


if __name__ == "__main__":
    main()
