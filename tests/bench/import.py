#!/usr/bin/env python3
"""Image import benchmark (not part of the test run).

  sudo tests/bench/import.py [--runs N] [--synthetic [--mib 200] [--files 6000]] [--disk] [--archive] [--compare OLD_CHIO]

The image (by default) is a real Debian root: `debootstrap --variant=minbase bookworm` (cached in
/var/tmp/chio-bench-minbase; debootstrap is installed with apt-get if missing), cut into three
gzip layers (default compression, as docker writes them): everything but /usr/share, /usr/share,
and a small top layer with a whiteout and a replaced file. --synthetic writes ~200 MiB of random
files instead (incompressible, the earlier benchmark). Timed, interleaved in the same run:
  - chio:   chio image import LAYOUT --state-dir <fresh>     (verify every digest + safe extract)
  - tar:    tar -xzf of each layer in order into a fresh dir  (GNU tar; no verification)
  - umoci:  umoci raw unpack --image LAYOUT:bench <fresh>     (installed with apt-get if missing)
  - re-import of a present image (chio: verification only)
Targets are on a tmpfs, so what is timed is each tool's own work: on this VM's disk the kernel's
writeback of earlier runs swamps it (system time of one identical import varied 1.7-7 s).
--disk puts them under /var/tmp instead. Prints medians and ratios.
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


def minbase_rootfs():
    """A debootstrap minbase tree, made once and cached."""
    root = "/var/tmp/chio-bench-minbase"
    if os.path.exists(os.path.join(root, "usr", "bin", "dpkg")):
        return root
    if not shutil.which("debootstrap"):
        sh("apt-get", "install", "-y", "-qq", "debootstrap", stdout=subprocess.DEVNULL, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    shutil.rmtree(root, ignore_errors=True)
    print("debootstrap --variant=minbase bookworm (once) ...", file=sys.stderr)
    sh("debootstrap", "--variant=minbase", "bookworm", root, "http://deb.debian.org/debian", stdout=subprocess.DEVNULL)
    return root


def tar_of(root, keep):
    """A PAX tar (bytes) of the entries under `root` for which keep(relative path) is true."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort(); filenames.sort()
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name); rel = os.path.relpath(full, root)
                if keep(rel):
                    t.add(full, arcname=rel, recursive=False)
    return buf.getvalue()


def top_layer():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in (("etc/.wh.motd", b""), ("etc/hostname", b"bench\n")):
            ti = tarfile.TarInfo(name); ti.size = len(data); ti.mode = 0o644; t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def write_layout(dir, plains, level):
    blobs = os.path.join(dir, "blobs", "sha256"); os.makedirs(blobs)
    def put(data):
        h = hashlib.sha256(data).hexdigest()
        open(os.path.join(blobs, h), "wb").write(data)
        return {"digest": "sha256:" + h, "size": len(data)}
    layers = []
    for p in plains:
        d = put(gzip.compress(p, compresslevel=level)); d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"; layers.append(d)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(p).hexdigest() for p in plains]}}).encode()
    c = put(config); c["mediaType"] = "application/vnd.oci.image.config.v1+json"
    m = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": c, "layers": layers}).encode())
    m["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    m["annotations"] = {"org.opencontainers.image.ref.name": "bench"}
    json.dump({"schemaVersion": 2, "manifests": [m]}, open(os.path.join(dir, "index.json"), "w"))
    open(os.path.join(dir, "oci-layout"), "w").write('{"imageLayoutVersion":"1.0.0"}')
    return [os.path.join(blobs, l["digest"][7:]) for l in layers], sum(len(p) for p in plains), sum(l["size"] for l in layers)


def minbase_layout(dir):
    root = minbase_rootfs()
    share = lambda rel: rel == "usr/share" or rel.startswith("usr/share/")
    plains = [tar_of(root, lambda r: not share(r)), tar_of(root, share), top_layer()]
    files = sum(len(f) + len(d) for _, d, f in os.walk(root))
    return write_layout(dir, plains, 6) + (files, "debootstrap minbase bookworm")


def synthetic_layout(dir, mib, files):
    rng = random.Random(42)
    per = mib * (1 << 20) // 3
    plains = [layer_bytes(rng, files // 3, per, "usr"), layer_bytes(rng, files // 3, per, "opt"),
              layer_bytes(rng, files // 3, per, "srv", extra=["usr/.wh.link0"])]
    return write_layout(dir, plains, 1) + (files, "synthetic random files")


def timed(fn):
    t = time.perf_counter(); fn(); return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(); ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--mib", type=int, default=200); ap.add_argument("--files", type=int, default=6000)
    ap.add_argument("--disk", action="store_true", help="extract under /var/tmp instead of a tmpfs")
    ap.add_argument("--compare", help="an earlier chio build, timed interleaved as chio-old")
    ap.add_argument("--archive", action="store_true",
                    help="chio imports the layout packed in one tar (an oci-archive: its members read in place)")
    a = ap.parse_args()
    # The installable artifact: the static release build.
    chio = subprocess.run([os.path.join(REPO, "packaging", "build-release")], check=True,
                          stdout=subprocess.PIPE).stdout.decode().strip()
    if not shutil.which("umoci"):
        sh("apt-get", "install", "-y", "-qq", "umoci", stdout=subprocess.DEVNULL, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    with tempfile.TemporaryDirectory(prefix="chio-import-bench-", dir="/var/tmp") as tmp:
        layout = os.path.join(tmp, "layout"); os.makedirs(layout)
        blobs, plain, packed, files, what = synthetic_layout(layout, a.mib, a.files) if a.synthetic else minbase_layout(layout)
        print(f"image: {what}: {plain / 2**20:.0f} MiB in {files} files and directories, 3 gzip layers ({packed / 2**20:.0f} MiB)")
        if a.archive:
            packed_layout = os.path.join(tmp, "layout.tar")
            sh("tar", "-cf", packed_layout, "-C", layout, ".")
            print("  chio imports it as one archive (oci-archive); tar and umoci read the layout")
        out = os.path.join(tmp, "out"); os.makedirs(out)
        if not a.disk:
            sh("mount", "-t", "tmpfs", "-o", "size=8g,mode=0700", "chio-bench", out)
        try:
            bench(a, chio, packed_layout if a.archive else layout, layout, blobs, out)
        finally:
            if not a.disk:
                sh("umount", out)


def bench(a, chio, source, layout, blobs, out):
    print(f"  targets on {'disk (/var/tmp)' if a.disk else 'tmpfs'}, {a.runs} runs each, interleaved")
    # Each tool's previous tree is removed (and the disk synced) before its clock starts.
    def fresh(name):
        d = os.path.join(out, name); shutil.rmtree(d, ignore_errors=True); sh("sync"); return d
    def run_chio(d, binary=chio):
        sh(binary, "image", "import", source, "--state-dir", d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def run_tar(d):
        os.makedirs(d)
        for b in blobs:
            sh("tar", "-xzf", b, "-C", d)
    def run_umoci(d):
        sh("umoci", "raw", "unpack", "--rootless", "--image", layout + ":bench", d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runners = [("chio", run_chio), ("tar", run_tar), ("umoci", run_umoci)]
    if a.compare:
        runners.append(("chio-old", lambda d: run_chio(d, a.compare)))
    t = {k: [] for k, _ in runners}
    for _ in range(a.runs):
        for k, fn in runners:
            d = fresh(k)
            t[k].append(timed(lambda: fn(d)))
    reimport = statistics.median(timed(lambda: run_chio(os.path.join(out, "chio"))) for _ in range(a.runs))
    med = {k: statistics.median(v) for k, v in t.items()}
    for k, v in med.items():
        print(f"  {k:6s} median {v:6.2f} s")
    print(f"  chio re-import of the present image (verify only) median {reimport:.2f} s")
    print(f"  ratio chio/tar = {med['chio'] / med['tar']:.2f}   umoci/chio = {med['umoci'] / med['chio']:.2f}")
    if a.compare:
        print(f"  ratio chio/chio-old = {med['chio'] / med['chio-old']:.3f}")


if __name__ == "__main__":
    main()
