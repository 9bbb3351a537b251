"""The static release build of a named commit, for a benchmark's `--compare-rev REV`.

A hot-path change is judged against the build it replaces, timed in the same run: this builds
REV (a tag, a commit, `HEAD~3`) the way `packaging/build-release` builds the current tree —
glibc static-pie, release profile, the lock file as committed — in a worktree of its own under
`target/bench-revs/`, and keeps the binary by commit id so a second run reuses it. Every build
shares one cargo target directory there, so only what changed between commits is rebuilt.
"""
import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REVS = os.path.join(REPO, "target", "bench-revs")


def commit_of(rev):
    out = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if out.returncode != 0:
        raise SystemExit(f"--compare-rev {rev}: not a commit of this repository ({out.stderr.decode().strip()})")
    return out.stdout.decode().strip()


def build(rev):
    """The path of REV's static release `chio`, built once per commit (with its `chio-full`
    beside it, for a commit that has one)."""
    sha = commit_of(rev)
    binary = os.path.join(REVS, sha[:12], "chio")
    if os.path.exists(binary):
        return binary
    os.makedirs(REVS, exist_ok=True)
    tree = os.path.join(REVS, f"tree-{sha[:12]}")
    if os.path.exists(tree):
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", tree], check=False)
        shutil.rmtree(tree, ignore_errors=True)
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "-q", tree, sha], check=True)
    try:
        triple = subprocess.run(["rustc", "-vV"], check=True, stdout=subprocess.PIPE).stdout.decode()
        triple = next(l.split(": ", 1)[1] for l in triple.splitlines() if l.startswith("host: "))
        target = os.path.join(REVS, "target")
        env = {**os.environ, "CARGO_TARGET_DIR": target,
               "RUSTFLAGS": (os.environ.get("RUSTFLAGS", "") + " -C target-feature=+crt-static").strip()}
        print(f"building {rev} ({sha[:12]}) as a static release build ...", flush=True)
        subprocess.run(["cargo", "build", "--release", "--quiet", "--locked", "-p", "chio-cli", "--target", triple],
                       cwd=tree, env=env, check=True)
        built = os.path.join(target, triple, "release")
        os.makedirs(os.path.dirname(binary), exist_ok=True)
        if subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{sha}:cli/src/full.rs"],
                          stderr=subprocess.DEVNULL).returncode == 0:
            shutil.copy2(os.path.join(built, "chio-full"), os.path.join(os.path.dirname(binary), "chio-full"))
        shutil.copy2(os.path.join(built, "chio"), binary)
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", tree], check=False)
    return binary
