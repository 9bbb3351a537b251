#!/bin/sh
# Example launch material for a first `chio security preflight`: a publisher and an operator key,
# a publisher-signed manifest of this host's /bin/true (its real SHA-256), and two
# operator-signed cage launch policies admitting it — one enforced, one shadow — on the host's
# /usr as a read-only root filesystem, as uid/gid 65534. Installed by the Debian package as
# /usr/share/chio/examples/make-material.sh.
#
#   sudo /usr/share/chio/examples/make-material.sh /etc/chio/example
#
# then prints the preflight command lines that use it. DIR must be missing or empty.
#
# DIR is also laid out as a chio-tool@ instance (the enforced policy as policy.signed.json, the
# two public keys as publisher.key and operator.key, the command in tool.env): made at
# /etc/chio/tools/example-true, it is what `systemctl start chio-tool@example-true` launches.
set -eu
dir=${1:?usage: make-material.sh DIR}
chio=${CHIO:-chio}
if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "make-material.sh: $dir is not empty" >&2
    exit 2
fi
mkdir -p "$dir"
"$chio" keys generate --out "$dir/publisher" >/dev/null
"$chio" keys generate --out "$dir/operator" >/dev/null
sha=$(sha256sum /usr/bin/true | cut -d' ' -f1)
cat > "$dir/manifest.json" <<MANIFEST
{"schema": "chio.tool-manifest.v1", "server_id": "example-true", "name": "Example: true",
 "version": "1.0.0", "tools": [{"name": "true", "description": "does nothing, successfully"}],
 "target": {"path": "/bin/true", "sha256": "$sha", "argv": ["/bin/true"]},
 "permissions": {"read_paths": [], "write_paths": [], "network": [], "env": [], "syscall_profile": "default"}}
MANIFEST
digest=$("$chio" manifest sign --key "$dir/publisher/signing.seed" --in "$dir/manifest.json" --out "$dir/manifest.signed.json")
for mode in enforced shadow; do
    cat > "$dir/policy-$mode.json" <<POLICY
{"schema": "chio.cage-launch-policy.v1", "policy_id": "example-true-$mode", "mode": "$mode",
 "manifest": {"sha256": "$digest", "publisher_key": "$(cat "$dir/publisher/public.key")"},
 "launch": {"path": "/bin/true", "argv": ["/bin/true"]},
 "ceilings": {"read_paths": [], "write_paths": [], "network": [], "env": [], "syscall_profile": "default",
  "memory_bytes": 268435456, "swap_bytes": 0, "pids": 32, "cpu_millis": 1000, "wall_ms": 60000,
  "output_bytes": 65536, "tmp_bytes": 8388608},
 "identity": {"uid": 65534, "gid": 65534}, "rootfs": {"directory": "/usr"}, "receipts": {"required": false}}
POLICY
    "$chio" policy sign --key "$dir/operator/signing.seed" --in "$dir/policy-$mode.json" --out "$dir/policy-$mode.signed.json" >/dev/null
done
# The chio-tool@ instance layout.
cp "$dir/policy-enforced.signed.json" "$dir/policy.signed.json"
cp "$dir/publisher/public.key" "$dir/publisher.key"
cp "$dir/operator/public.key" "$dir/operator.key"
printf 'TOOL_COMMAND=/bin/true\n' > "$dir/tool.env"
for mode in enforced shadow; do
    echo "chio security preflight --require-enforcement --signed-manifest $dir/manifest.signed.json" \
        "--manifest-public-key $dir/publisher/public.key --cage-policy $dir/policy-$mode.signed.json" \
        "--cage-policy-signer $dir/operator/public.key --server-id example-true -- /bin/true"
done
