#!/bin/sh
# Build the Debian package: the static chio binaries (`chio`, the launch path, and `chio-full`,
# every other command, which `chio` hands them to), its systemd units, sysusers.d and tmpfiles.d
# files, man pages and shell completions (both generated from the binary's own clap
# definitions). One command, from the repository root:
#
#   packaging/deb/build-deb.sh [--binary PATH] [--out DIR]
#
# Without --binary it builds the release binaries statically linked (glibc static-pie:
# `-C target-feature=+crt-static`), so they run on any x86_64 Linux host; --binary names a built
# `chio`, with its `chio-full` beside it. Writes
# OUT/chio_VERSION_amd64.deb (OUT defaults to target/deb). Needs dpkg-deb.
set -eu
cd "$(dirname "$0")/../.."
binary=""
out="target/deb"
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "usage: $0 [--binary PATH] [--out DIR]" >&2; exit 2 ;;
    esac
done
if [ -z "$binary" ]; then
    RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --target x86_64-unknown-linux-gnu -p chio-cli
    binary="target/x86_64-unknown-linux-gnu/release/chio"
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
mkdir -p "$out"
root=$(mktemp -d "$out/.root.XXXXXX")
trap 'rm -rf "$root"' EXIT

full="$(dirname "$binary")/chio-full"
[ -x "$full" ] || { echo "$full is missing: chio-full is built beside chio (cargo build -p chio-cli)" >&2; exit 1; }
install -D -m 0755 "$binary" "$root/usr/bin/chio"
install -D -m 0755 "$full" "$root/usr/bin/chio-full"
for unit in packaging/systemd/*.service packaging/systemd/*.timer; do
    install -D -m 0644 "$unit" "$root/usr/lib/systemd/system/$(basename "$unit")"
done
install -D -m 0644 packaging/systemd/chio.sysusers "$root/usr/lib/sysusers.d/chio.conf"
install -D -m 0644 packaging/systemd/chio.tmpfiles "$root/usr/lib/tmpfiles.d/chio.conf"
install -D -m 0755 packaging/examples/make-material.sh "$root/usr/share/chio/examples/make-material.sh"
mkdir -p "$root/usr/share/man/man1"
"$root/usr/bin/chio" internal man --out "$root/usr/share/man/man1"
gzip -9n "$root"/usr/share/man/man1/*.1
"$root/usr/bin/chio" completions bash | install -D -m 0644 /dev/stdin "$root/usr/share/bash-completion/completions/chio"
"$root/usr/bin/chio" completions zsh | install -D -m 0644 /dev/stdin "$root/usr/share/zsh/vendor-completions/_chio"
"$root/usr/bin/chio" completions fish | install -D -m 0644 /dev/stdin "$root/usr/share/fish/vendor_completions.d/chio.fish"

mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CONTROL
Package: chio
Version: $version
Architecture: amd64
Maintainer: chio developers <chio@localhost>
Section: admin
Priority: optional
Depends: systemd (>= 247)
Description: Linux-native sandbox supervisor with verified launches
 chio builds each command's cage from kernel primitives (namespaces, a read-only root,
 landlock, seccomp, capabilities, cgroups), observes the exec of the exact verified binary,
 and records signed receipts. Includes preflight, supervise and the repository leg.
CONTROL
cat > "$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemd-sysusers chio.conf || true
    systemd-tmpfiles --create chio.conf || true
    systemctl daemon-reload || true
fi
POSTINST
chmod 0755 "$root/DEBIAN/postinst"
deb="$out/chio_${version}_amd64.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
