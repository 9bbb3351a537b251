#!/usr/bin/env python3
"""Build the session images from Debian packages, without Docker, as `docker save` archives.

  sudo python3 packaging/images/build-images.py --out DIR [--only python,rust,worker]
               [--suite bookworm] [--mirror http://deb.debian.org/debian]
  sudo python3 packaging/images/build-images.py --pack ROOTFS --tag NAME:TAG --out FILE.tar

Images (each one layer, root-owned, no Docker engine involved):
  python  chio/python:<suite>  bash, coreutils, git, python3       the Python execution image
  rust    chio/rust:<suite>    the above plus cargo and rustc       the Rust execution image
  worker  chio/worker:<suite>  python3 and a venv at /opt/msa with mini-swe-agent and this
                               repository's chio_minisweagent      the session worker image

Each root is made with `debootstrap --variant=minbase` (needs root and the Debian mirror), the
worker's venv with pip inside the new root (needs PyPI), then packed deterministically (sorted
entries, numeric owners, mtimes clamped to SOURCE_DATE_EPOCH or 0) into `DIR/<name>.tar`. Import
with `chio image import DIR/<name>.tar`. `--pack` packs an existing root directory only.
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MINI_SWE_AGENT = "mini-swe-agent>=2,<3"
PACKAGES = {
    "python": ["bash", "coreutils", "git", "python3"],
    # debootstrap resolves no virtual packages: libc6-dev stands for the libc-dev rustc needs.
    "rust": ["bash", "coreutils", "git", "python3", "libc6-dev", "gcc", "cargo", "rustc"],
    "worker": ["bash", "coreutils", "python3", "python3-venv", "ca-certificates"],
}
# The image's environment beyond PATH. Rust: cargo's home in /tmp, not in the workspace (HOME is
# /workspace in the leg, and a new `.cargo` there is outside any scope); test binaries without
# debuginfo, so the linker's output stays within the leg's 16 MiB file-size ceiling.
ENV = {
    "rust": ["CARGO_HOME=/tmp/cargo", "CARGO_PROFILE_DEV_DEBUG=0", "CARGO_PROFILE_DEV_STRIP=debuginfo"],
}
PATH = "/opt/msa/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Left out of every image: caches, logs and what only a booted system uses.
PRUNE = ["var/cache/apt", "var/lib/apt/lists", "var/log", "tmp", "root/.cache", "proc", "sys", "dev", "run"]


def run(*argv, **kw):
    print("+", " ".join(argv), file=sys.stderr)
    subprocess.run(argv, check=True, **kw)


def debootstrap(root, packages, suite, mirror):
    run("debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, root, mirror)


def install_worker(root):
    """A venv at /opt/msa with mini-swe-agent and chio_minisweagent, built inside the root."""
    src = os.path.join(root, "tmp", "chio-minisweagent")
    shutil.copytree(os.path.join(REPO, "packaging", "mini-swe-agent"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copy("/etc/resolv.conf", os.path.join(root, "etc", "resolv.conf"))
    # pip in the new root trusts what the host trusts (a host behind a TLS-inspecting proxy has
    # its CA in its own bundle, not in Debian's); the copy goes with /tmp when the root is pruned.
    host_ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    shutil.copy(host_ca, os.path.join(root, "tmp", "host-ca.crt"))
    # In the environment, not a flag: pip's build-isolation subprocess must see it too.
    ca = "/tmp/host-ca.crt"
    env = {**os.environ, "PIP_CERT": ca, "SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca, "CURL_CA_BUNDLE": ca}
    try:
        run("chroot", root, "python3", "-m", "venv", "/opt/msa", env=env)
        run("chroot", root, "/opt/msa/bin/pip", "install", "--no-cache-dir", "-q", MINI_SWE_AGENT,
            "/tmp/chio-minisweagent", env=env)
    finally:
        os.unlink(os.path.join(root, "etc", "resolv.conf"))


def prune(root):
    for rel in PRUNE:
        p = os.path.join(root, rel)
        if os.path.isdir(p) and not os.path.islink(p):
            for entry in os.listdir(p):
                q = os.path.join(p, entry)
                shutil.rmtree(q) if os.path.isdir(q) and not os.path.islink(q) else os.unlink(q)


def layer_tar(root, out, epoch):
    """Tar `root` deterministically into `out`; returns its sha256."""
    def entries(top):
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                yield os.path.join(dirpath, name)

    digest = hashlib.sha256()

    class Hashing(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def writable(self):
            return True

        def write(self, b):
            digest.update(b)
            return self.f.write(b)

    with open(out, "wb") as raw:
        with tarfile.open(fileobj=Hashing(raw), mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in entries(root):
                rel = os.path.relpath(path, root)
                info = tar.gettarinfo(path, arcname=rel)
                # Sockets (None), devices and FIFOs: an image holds none (the cage makes /dev).
                if info is None or info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE):
                    continue
                info.uname = info.gname = ""
                info.mtime = min(int(info.mtime), epoch)
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return digest.hexdigest()


def pack(root, tag, out, cmd=("/bin/bash",), env=()):
    """Write `root` as a one-layer `docker save` archive named `tag` at `out`."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as work:
        layer_sha = layer_tar(root, os.path.join(work, "layer.tar"), epoch)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": [f"PATH={PATH}", *env], "Cmd": list(cmd), "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_sha}"]},
            "history": [{"created_by": "chio packaging/images/build-images.py"}],
        }
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        config_sha = hashlib.sha256(config_bytes).hexdigest()
        os.makedirs(os.path.join(work, layer_sha))
        os.rename(os.path.join(work, "layer.tar"), os.path.join(work, layer_sha, "layer.tar"))
        with open(os.path.join(work, f"{config_sha}.json"), "wb") as f:
            f.write(config_bytes)
        manifest = [{"Config": f"{config_sha}.json", "RepoTags": [tag], "Layers": [f"{layer_sha}/layer.tar"]}]
        with open(os.path.join(work, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        # Written beside OUT and renamed over it: a reader never meets half an archive, and a
        # build killed midway leaves OUT as it was.
        partial = f"{out}.partial"
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            for name in ["manifest.json", f"{config_sha}.json", layer_sha, f"{layer_sha}/layer.tar"]:
                info = tar.gettarinfo(os.path.join(work, name), arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = epoch
                if info.isreg():
                    with open(os.path.join(work, name), "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        os.replace(partial, out)
    print(f"{out}: {tag}, config sha256:{config_sha}", file=sys.stderr)


def build(name, out_dir, suite, mirror):
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=f".{name}-root-") as root:
        debootstrap(root, PACKAGES[name], suite, mirror)
        if name == "worker":
            install_worker(root)
        prune(root)
        pack(root, f"chio/{name}:{suite}", os.path.join(out_dir, f"{name}.tar"), env=ENV.get(name, ()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="python,rust,worker")
    ap.add_argument("--suite", default="bookworm")
    ap.add_argument("--mirror", default="http://deb.debian.org/debian")
    ap.add_argument("--pack", metavar="ROOTFS", help="only pack this root directory")
    ap.add_argument("--tag", help="the name:tag of a packed root")
    a = ap.parse_args()
    if a.pack:
        if not a.tag:
            ap.error("--pack needs --tag")
        pack(a.pack, a.tag, a.out)
        return
    if os.geteuid() != 0:
        ap.error("debootstrap and chroot need root")
    os.makedirs(a.out, exist_ok=True)
    for name in a.only.split(","):
        if name not in PACKAGES:
            ap.error(f"unknown image {name!r}: give python, rust or worker")
        build(name, a.out, a.suite, a.mirror)


if __name__ == "__main__":
    main()
