//! The installed host under a real systemd: a Debian root with systemd boots in systemd-nspawn
//! (`../shared/notes/systemd-in-nspawn.md`), the `.deb` built by `packaging/deb/build-deb.sh`
//! (the static release binary, as shipped) is installed inside, and then, as docs/installed-host.md shows:
//! the documented wrapped preflight through `systemd-run … -p LoadCredential=… chio security
//! supervise --exec … -- chio security preflight --require-enforcement …` exits 0 with enforced
//! launch material and 1 with a shadow policy; `chio-supervisor.service` (Type=notify) is active
//! only once it listens; an unprivileged user of group chio launches through its socket; and
//! `systemctl stop` ends the daemon within its grace with no cage left.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chio_tests::{privileged, skip, Scratch};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The unit the image runs at boot: the test's script, bound in at /results/run.sh.
const RUNNER: &str = "[Unit]\nDescription=chio test script\nConditionPathExists=/results/run.sh\n\
[Service]\nType=oneshot\nExecStart=/bin/sh /results/run.sh\nStandardOutput=file:/results/out.txt\n\
StandardError=inherit\n[Install]\nWantedBy=multi-user.target\n";

/// What the image holds beside minbase: systemd, and curl to fetch the daemon's metrics as the
/// guide does.
const PACKAGES: &str = "systemd,systemd-sysv,dbus,util-linux,passwd,curl";

/// A Debian root (`suite`) with systemd, built once into `target/test-images` (a minute or
/// two; needs debootstrap and the Debian mirror) and reused; each boot runs on a volatile
/// overlay of it.
fn systemd_image(suite: &str) -> Option<PathBuf> {
    let dir = repo().join(format!("target/test-images/systemd-{suite}"));
    // The suite's tests run in parallel and more than one boots this image: on a fresh checkout
    // the first builds it while the others wait on the lock, then find it complete.
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    let lock = std::fs::File::create(dir.with_extension("lock")).unwrap();
    // SAFETY: flock on our own open file, released when `lock` is dropped at the return (raw
    // libc: std's File::lock is newer than the workspace's MSRV).
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) }, 0);
    // An image built with other packages is built again.
    if std::fs::read_to_string(dir.join(".complete")).is_ok_and(|c| c == PACKAGES) {
        return Some(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let tmp = dir.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    // The root's own mode is the container's `/`: others must be able to enter it.
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={PACKAGES}"), suite])
        .arg(&tmp)
        .arg("http://deb.debian.org/debian")
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!("debootstrap failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    std::fs::write(tmp.join("etc/systemd/system/chio-test-runner.service"), RUNNER).unwrap();
    let wants = tmp.join("etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants).unwrap();
    std::os::unix::fs::symlink("/etc/systemd/system/chio-test-runner.service", wants.join("chio-test-runner.service"))
        .unwrap();
    std::fs::write(tmp.join(".complete"), PACKAGES).unwrap();
    std::fs::rename(&tmp, &dir).unwrap();
    Some(dir)
}

/// What the booted container runs (as root, from the runner unit), printing `key=value` lines.
const SCRIPT: &str = r#"set -u
cd /
# nspawn mounts the cgroup v1 hierarchies read-only; the host's are bound at /mnt/hostcg.
for c in memory cpu cpuacct pids; do mount --bind /mnt/hostcg/$c /sys/fs/cgroup/$c; done
dpkg -i /results/chio.deb >/dev/null 2>&1; echo "installed=$?"
echo "group=$(getent group chio | cut -d: -f1)"
chio keys generate --out /etc/chio/kernel-key >/dev/null 2>&1
# The shipped example material, made as docs/installed-host.md shows.
/usr/share/chio/examples/make-material.sh /etc/chio/example > /results/material.txt; echo "material=$?"
E=/etc/chio/example
printf 'session-s3cret\n' > /etc/chio/credentials/session-token
chmod 600 /etc/chio/credentials/session-token
# The documented wrapped launch: the token from a systemd credential, never in a unit file.
for mode in enforced shadow; do
  systemd-run --wait --pipe --collect -p LoadCredential=session-token:/etc/chio/credentials/session-token \
    /usr/bin/chio security supervise --exec --credential-env CHIO_AUTH_TOKEN=session-token -- \
    /usr/bin/chio security preflight --require-enforcement --signed-manifest $E/manifest.signed.json \
    --manifest-public-key $E/publisher/public.key --cage-policy $E/policy-$mode.signed.json \
    --cage-policy-signer $E/operator/public.key --server-id example-true -- /bin/true > /results/preflight-$mode.txt 2>&1
  echo "preflight_$mode=$?"
done
# chio-tool@ on a fresh install (no receipt store yet): the example material laid out as an
# instance, its credential; the unit's preflight, then its launch.
/usr/share/chio/examples/make-material.sh /etc/chio/tools/example-true >/dev/null; echo "tool_material=$?"
printf 'tool-s3cret\n' > /etc/chio/credentials/example-true-auth-token
chmod 600 /etc/chio/credentials/example-true-auth-token
echo "store_before=$(test -e /var/lib/chio/receipts.db && echo yes || echo no)"
systemctl start chio-tool@example-true.service; echo "tool=$?"
for i in $(seq 100); do [ "$(systemctl is-active chio-tool@example-true.service)" = inactive ] && break; sleep 0.1; done
echo "tool_result=$(systemctl show -p Result --value chio-tool@example-true.service)"
echo "tool_status=$(systemctl show -p ExecMainStatus --value chio-tool@example-true.service)"
echo "tool_receipts=$(chio receipt list --receipt-db /var/lib/chio/receipts.db 2>/dev/null | wc -l)"
journalctl -u chio-tool@example-true.service --no-pager > /results/tool.txt 2>&1
# The wrapped preflight as an unprivileged service user: what it cannot prove is said, not fatal.
systemd-run --wait --pipe --collect -p User=nobody -p LoadCredential=session-token:/etc/chio/credentials/session-token \
  /usr/bin/chio security supervise --exec --credential-env CHIO_AUTH_TOKEN=session-token -- \
  /usr/bin/chio security preflight --require-enforcement > /results/preflight-nobody.txt 2>&1
echo "preflight_nobody=$?"
# The shipped unprivileged edge pair: chio-edge-preflight@demo (the edge's own preflight, as
# chio-edge, with its credentials), then chio-edge@demo, ready once its socket accepts.
cat > /usr/local/bin/demo-edge <<'EDGE'
#!/usr/bin/perl
use IO::Socket::UNIX;
open(my $f, '>', "$ENV{STATE_DIRECTORY}/seen") or die;
printf $f "%s %d %d\n", scalar(getpwuid($<)), length($ENV{CHIO_AUTH_TOKEN}), length($ENV{CHIO_CONTROL_TOKEN});
close $f;
my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => "$ENV{RUNTIME_DIRECTORY}/edge.sock", Listen => 5) or die;
while (my $c = $s->accept) { close $c }
EDGE
chmod 755 /usr/local/bin/demo-edge
mkdir -p /etc/chio/edge
printf 'EDGE_COMMAND=/usr/local/bin/demo-edge\n' > /etc/chio/edge/demo.env
printf 'edge-auth-s3cret\n' > /etc/chio/credentials/demo-auth-token
printf 'edge-control-s3cret\n' > /etc/chio/credentials/demo-control-token
chmod 600 /etc/chio/credentials/demo-auth-token /etc/chio/credentials/demo-control-token
systemctl start chio-edge@demo.service; echo "edge=$?"
echo "edge_active=$(systemctl is-active chio-edge@demo.service)"
echo "edge_preflight=$(systemctl show -p Result --value chio-edge-preflight@demo.service)"
journalctl -u chio-edge-preflight@demo.service -u chio-edge@demo.service --no-pager > /results/edge.txt 2>&1
echo "edge_seen=$(cat /var/lib/chio-edge/demo/seen 2>/dev/null)"
systemctl stop chio-edge@demo.service; echo "edge_stopped=$(systemctl is-active chio-edge@demo.service)"
# The daemon, for an unprivileged user of group chio (its role by uid).
useradd -m -G chio runner
useradd -m -G chio other
cat > /etc/chio/supervisor.json <<C
{"schema":"chio.supervisor-config.v1","clients":[{"uid":$(id -u runner),"role":"admin"}],
 "kernel_key":"/etc/chio/kernel-key/signing.seed","stop_grace_s":2,"metrics":"127.0.0.1:9464"}
C
systemctl start chio-supervisor.service
echo "supervisor=$(systemctl is-active chio-supervisor.service)"
echo "socket=$(stat -c '%a %U %G' /run/chio/supervisor.sock)"
R="setpriv --reuid runner --regid runner --init-groups"
echo "launch=$($R chio cage run --supervisor /run/chio/supervisor.sock -- /bin/sh -c 'echo as-$(id -u)' 2>/dev/null)"
# Another member of group chio reaches the socket but not a role; nobody not even the socket.
echo "stranger=$(setpriv --reuid other --regid other --init-groups chio cage run --supervisor /run/chio/supervisor.sock -- /bin/true >/dev/null 2>&1; echo $?)"
# The metrics, fetched as docs/installed-host.md shows (the host parses them).
curl -s http://127.0.0.1:9464/metrics > /results/metrics.txt; echo "metrics=$?"
# The refusal in the journal, found by its fields as docs/installed-host.md shows.
journalctl --sync 2>/dev/null
echo "journal_refused=$(journalctl -u chio-supervisor CHIO_OUTCOME=refused CHIO_REASON=not_a_client CHIO_PEER_UID=$(id -u other) -o cat --no-pager | grep -c 'may not use this supervisor')"
echo "journal_ran=$(journalctl -u chio-supervisor CHIO_OUTCOME=ran CHIO_STATE=FullyEnforced CHIO_PEER_UID=$(id -u runner) -o json --no-pager | grep -c '"CHIO_LAUNCH_ID"')"
echo "nobody=$(setpriv --reuid nobody --regid nogroup --clear-groups chio cage run --supervisor /run/chio/supervisor.sock -- /bin/true 2>&1 | grep -c 'Permission denied')"
$R chio cage run --supervisor /run/chio/supervisor.sock -- /bin/sh -c 'sleep 60; : long-launch' >/dev/null 2>&1 &
# The cage's shell (comm dash: executed from its fd), not the client (comm chio), which may be
# all that exists yet.
caged() { for f in $(grep -l '[l]ong-launch' /proc/[0-9]*/cmdline 2>/dev/null); do [ "$(cat ${f%/cmdline}/comm 2>/dev/null)" != chio ] && echo; done | wc -l; }
for i in $(seq 100); do [ "$(caged)" -gt 0 ] && break; sleep 0.05; done
echo "running=$(caged)"
# That launch's own pids cgroup, by its shell's /proc/PID/cgroup: the root of the pids hierarchy
# seen here is the host's, where another test's container may have launch cgroups of its own.
# (Its memory cgroup lies outside this container's view of that hierarchy: `/../../chio-…`.)
for f in $(grep -l '[l]ong-launch' /proc/[0-9]*/cmdline 2>/dev/null); do
  [ "$(cat ${f%/cmdline}/comm 2>/dev/null)" != chio ] && grep -E '^[0-9]+:pids:' ${f%/cmdline}/cgroup
done | sort -u | while IFS=: read -r _ c p; do echo "/sys/fs/cgroup/$c$p"; done > /tmp/cage-cgroups
echo "cage_cgroups=$(for d in $(cat /tmp/cage-cgroups); do [ -d "$d" ] && case "$d" in /sys/fs/cgroup/pids/chio-*) echo;; esac; done | wc -l)"
T0=$(date +%s%N); systemctl stop chio-supervisor.service; T1=$(date +%s%N)
echo "stop_ms=$(( (T1 - T0) / 1000000 ))"
echo "stopped=$(systemctl is-active chio-supervisor.service)"
sleep 0.5
echo "left=$(grep -l '[l]ong-launch' /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"
echo "cgroups=$(for d in $(cat /tmp/cage-cgroups); do [ -e "$d" ] && echo; done | wc -l)"
echo "receipts=$(chio receipt list --receipt-db /var/lib/chio/receipts.db 2>/dev/null | wc -l)"
chio receipt list --receipt-db /var/lib/chio/receipts.db > /results/receipts.ndjson 2>/dev/null
# The report, made as docs/installed-host.md shows (the host opens it in Chromium).
chio receipt report --receipt-db /var/lib/chio/receipts.db --trusted-key /etc/chio/kernel-key/public.key \
  --out /root/report.html 2> /results/report.txt; echo "report=$?"
cp /root/report.html /results/report.html
echo "done=1"
systemctl start --no-block poweroff.target
"#;

/// Whether this host can boot a container here (privileged, with nspawn and debootstrap); the
/// `suite` image, built if need be.
fn bootable(test: &str, suite: &str) -> Option<PathBuf> {
    if !privileged(test) {
        return None;
    }
    for tool in ["systemd-nspawn", "debootstrap"] {
        if Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| !o.status.success()) {
            skip(test, &format!("{tool} is missing (apt-get install systemd-container debootstrap; .ci/run does)"));
            return None;
        }
    }
    let image = systemd_image(suite);
    if image.is_none() {
        skip(test, "the systemd image could not be built (debootstrap needs the Debian mirror)");
    }
    image
}

/// The `.deb` as `packaging/deb/build-deb.sh` builds it, at `results/chio.deb`, with `script` at
/// `results/run.sh` for the runner unit.
fn stage(results: &Scratch, script: &str) {
    let built = Command::new(repo().join("packaging/deb/build-deb.sh"))
        .args(["--out", results.0.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let deb = PathBuf::from(String::from_utf8(built.stdout).unwrap().trim());
    std::fs::rename(&deb, results.join("chio.deb")).unwrap();
    std::fs::write(results.join("run.sh"), script).unwrap();
}

/// One boot at a time: with `--keep-unit` each container's systemd runs in the test's own
/// cgroup, and two would manage one tree (the first to power off kills the other's services).
static ONE_BOOT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Boot `image` with `results` at /results until it powers off (at most 300 s); what the script
/// printed.
fn boot(mut nspawn: Command, image: &Path, results: &Scratch) -> String {
    let _one = ONE_BOOT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    nspawn
        .args(["-b", "--register=no", "--keep-unit", "--volatile=overlay", "--quiet"])
        .arg("-D")
        .arg(image)
        .arg(format!("--bind={}:/results", results.0.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = nspawn.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("the container did not power off within 300 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(results.join("out.txt")).unwrap_or_default()
}

/// The value the script printed as `key=value` (empty if it did not).
fn printed(out: &str, key: &str) -> String {
    out.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or("").to_string()
}

#[test]
fn the_package_under_a_booted_systemd() {
    let Some(image) = bootable("nspawn", "bookworm") else { return };
    let results = Scratch::new("nspawn");
    stage(&results, SCRIPT);
    let mut nspawn = Command::new("systemd-nspawn");
    nspawn.arg("--capability=all");
    for c in ["memory", "cpu", "cpuacct", "pids"] {
        nspawn.arg(format!("--bind=/sys/fs/cgroup/{c}:/mnt/hostcg/{c}"));
    }
    // nspawn's own syscall filter hides landlock from the container ("ABI 0").
    nspawn.env("SYSTEMD_SECCOMP", "0");
    let out = boot(nspawn, &image, &results);
    let get = |k: &str| printed(&out, k);
    let show = |f: &str| std::fs::read_to_string(results.join(f)).unwrap_or_default();
    assert_eq!(get("done"), "1", "the script did not finish:\n{out}");
    assert_eq!((get("installed"), get("group"), get("material")), ("0".into(), "chio".into(), "0".into()), "{out}");
    assert_eq!(show("material.txt").lines().count(), 2, "the two preflight command lines: {}", show("material.txt"));
    assert_eq!(get("preflight_enforced"), "0", "{}", show("preflight-enforced.txt"));
    assert_eq!(get("preflight_shadow"), "1", "{}", show("preflight-shadow.txt"));
    assert!(show("preflight-shadow.txt").contains("error    security.native_launch: the policy is in shadow mode"));
    // chio-tool@ started on a fresh install: its preflight took the store not made yet as new,
    // and its launch made it, receipted.
    assert_eq!((get("tool_material"), get("store_before")), ("0".into(), "no".into()), "{out}");
    assert_eq!(
        (get("tool"), get("tool_result"), get("tool_status")),
        ("0".into(), "success".into(), "0".into()),
        "{out}\n{}",
        show("tool.txt")
    );
    assert!(get("tool_receipts").parse::<u32>().unwrap_or(0) >= 2, "{out}\n{}", show("tool.txt"));
    assert_eq!(get("preflight_nobody"), "0", "{}", show("preflight-nobody.txt"));
    assert!(show("preflight-nobody.txt").contains("not proven as uid 65534"), "{}", show("preflight-nobody.txt"));
    // The credential reached it: its token is checked, not "none set".
    assert!(
        !show("preflight-nobody.txt").contains("info     security.bearer_roles"),
        "{}",
        show("preflight-nobody.txt")
    );
    // The unprivileged edge pair: its preflight passed as chio-edge (the trial root's, its
    // session store new), the edge got both tokens, was ready on its socket, and stopped.
    assert_eq!(
        (get("edge"), get("edge_active"), get("edge_preflight")),
        ("0".into(), "active".into(), "success".into()),
        "{out}\n{}",
        show("edge.txt")
    );
    assert_eq!(get("edge_seen"), "chio-edge 16 19", "{out}\n{}", show("edge.txt"));
    assert!(show("edge.txt").contains("not proven as uid"), "{}", show("edge.txt"));
    // Its unit's filter (RestrictSUIDSGID= takes openat2 away) is said, not fatal: the edge
    // launches nothing itself.
    assert!(show("edge.txt").contains("openat2 is not available to this process"), "{}", show("edge.txt"));
    assert!(show("edge.txt").contains("new: not created yet; its service creates it"), "{}", show("edge.txt"));
    assert_eq!(get("edge_stopped"), "inactive", "{out}");
    assert_eq!(get("supervisor"), "active", "{out}");
    assert_eq!(get("socket"), "660 root chio", "{out}");
    assert_eq!(get("launch"), "as-65534", "{out}");
    assert_eq!(get("stranger"), "77", "a peer outside the configuration is refused by the daemon: {out}");
    assert_eq!(get("nobody"), "1", "outside group chio the socket itself is closed: {out}");
    // The metrics as the guide fetches them: they parse, and count that launch and that refusal.
    assert_eq!(get("metrics"), "0", "{out}");
    let m = chio_tests::scrape_openmetrics(&format!("file:{}", results.join("metrics.txt").display()));
    let ran = [("op", "launch"), ("outcome", "ran"), ("state", "FullyEnforced")];
    assert_eq!(chio_tests::metric(&m, "chio_launches_total", &ran), 1.0, "{m:?}");
    assert_eq!(chio_tests::metric(&m, "chio_refusals_total", &[("reason", "not_a_client")]), 1.0, "{m:?}");
    // The journal holds them with their fields: journalctl finds each by them.
    assert_eq!((get("journal_refused"), get("journal_ran")), ("1".into(), "1".into()), "{out}");
    assert_eq!(get("running"), "1", "{out}");
    assert_eq!(get("cage_cgroups"), "1", "the running launch's pids cgroup was found: {out}");
    let stop_ms: u64 = get("stop_ms").parse().unwrap();
    assert!((2000..7000).contains(&stop_ms), "the stop took {stop_ms} ms with a 2 s grace: {out}");
    assert_eq!((get("stopped"), get("left"), get("cgroups")), ("inactive".into(), "0".into(), "0".into()), "{out}");
    assert!(get("receipts").parse::<u32>().unwrap() >= 2, "the launch's receipts in the daemon's store: {out}");
    // The report as the guide makes it: verified under the kernel key, and it shows every launch
    // of the store (the tool's and the daemon's) with its state.
    assert_eq!(get("report"), "0", "{out}\n{}", show("report.txt"));
    let page = chio_tests::browse(&results.join("report.html"), None);
    assert_eq!(page["verification"]["cls"], "ok", "{}", page["verification"]);
    assert_eq!(page["network"], serde_json::json!([]));
    let listed: Vec<serde_json::Value> =
        show("receipts.ndjson").lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(page["figures"]["receipts"], listed.len().to_string());
    let launches: Vec<&serde_json::Value> = listed.iter().filter(|r| r["kind"] == "launch_enforcement").collect();
    assert_eq!(page["figures"]["launches"], launches.len().to_string());
    for l in &launches {
        let row = page["rows"].as_array().unwrap().iter().find(|r| r["seq"] == l["seq"]).unwrap();
        assert_eq!(row["cells"]["state"]["text"], l["outcome"], "{row}");
    }
}

/// What the current Debian's systemd runs: the credential as it hands one to a `User=` service,
/// then the wrapped launch as that user and as root.
const CREDENTIAL_SCRIPT: &str = r#"set -u
dpkg -i /results/chio.deb >/dev/null 2>&1; echo "installed=$?"
echo "systemd=$(systemctl --version | head -1 | cut -d' ' -f2)"
# The shipped units as this systemd reads them: no error and no warning.
(cd /usr/lib/systemd/system && systemd-analyze verify --man=no chio-supervisor.service chio-preflight.service \
  chio-receipts-verify.service chio-receipts-verify.timer chio-tool@demo.service chio-edge@demo.service \
  chio-edge-preflight@demo.service > /results/verify.txt 2>&1)
echo "verify=$?"
printf 'session-s3cret\n' > /etc/chio/credentials/session-token
chmod 600 /etc/chio/credentials/session-token
L=LoadCredential=session-token:/etc/chio/credentials/session-token
echo "credential=$(systemd-run --wait --pipe --collect -p $L -p User=nobody /bin/sh -c 'stat -c "%a %U" "$CREDENTIALS_DIRECTORY/session-token"' 2>/dev/null)"
for user in nobody root; do
  echo "$user=$(systemd-run --wait --pipe --collect -p $L -p User=$user /usr/bin/chio security supervise --exec \
    --credential-env CHIO_AUTH_TOKEN=session-token -- /bin/sh -c 'printf %s "$CHIO_AUTH_TOKEN"' 2>/results/$user.err)"
done
echo "done=1"
systemctl start --no-block poweroff.target
"#;

/// systemd 254 and later put credentials on a tmpfs (with `noswap`) and grant a `User=` service
/// its credential by an ACL entry on a root-owned file (mode 0440), where bookworm's 252 used
/// ramfs and ownership. The documented wrapped launch under Debian trixie's systemd, as a
/// `User=` service and as root, gets its token; and that systemd verifies the shipped units
/// without a warning.
#[test]
fn credentials_under_a_current_systemd() {
    let Some(image) = bootable("nspawn_trixie", "trixie") else { return };
    let results = Scratch::new("nspawn-trixie");
    stage(&results, CREDENTIAL_SCRIPT);
    // systemd 256 and later refuse cgroup v1; this host's is a v1 hybrid, so the container gets a
    // unified hierarchy of its own (nothing here builds a cage).
    let mut nspawn = Command::new("systemd-nspawn");
    nspawn.env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1");
    let out = boot(nspawn, &image, &results);
    let get = |k: &str| printed(&out, k);
    let err = |u: &str| std::fs::read_to_string(results.join(&format!("{u}.err"))).unwrap_or_default();
    assert_eq!((get("done"), get("installed")), ("1".into(), "0".into()), "{out}");
    assert!(get("systemd").parse::<u32>().is_ok_and(|v| v >= 254), "{out}");
    let verify = std::fs::read_to_string(results.join("verify.txt")).unwrap_or_default();
    assert_eq!((get("verify").as_str(), verify.as_str()), ("0", ""), "systemd-analyze verify on the shipped units");
    assert_eq!(get("credential"), "440 root", "the credential as systemd gives it: {out}");
    assert_eq!(get("nobody"), "session-s3cret", "{}", err("nobody"));
    assert_eq!(get("root"), "session-s3cret", "{}", err("root"));
}

/// What a booted systemd on cgroup v2 runs: preflight (its failure ignored: this container's v2
/// hierarchy lacks the ceilings' controllers, which the host keeps on v1), then the daemon and
/// one long launch through it, and where each sits in the cgroup tree.
const V2_SCRIPT: &str = r#"set -u
dpkg -i /results/chio.deb >/dev/null 2>&1; echo "installed=$?"
mkdir -p /etc/systemd/system/chio-preflight.service.d
printf '[Service]\nExecStart=\nExecStart=-/bin/sh -c "/usr/bin/chio security preflight --json > /results/preflight.json"\n' \
  > /etc/systemd/system/chio-preflight.service.d/test.conf
systemctl daemon-reload
echo '{"schema":"chio.supervisor-config.v1","stop_grace_s":2}' > /etc/chio/supervisor.json
systemctl start chio-supervisor.service
echo "supervisor=$(systemctl is-active chio-supervisor.service)"
U=$(systemctl show -p ControlGroup --value chio-supervisor.service)
echo "unit=$U"
echo "daemon=$(grep '^0::' /proc/$(systemctl show -p MainPID --value chio-supervisor.service)/cgroup)"
chio cage run --supervisor /run/chio/supervisor.sock --memory none --pids none --cpus none -- \
  /bin/sh -c 'sleep 60; : long-launch' >/dev/null 2>/results/launch.err &
caged() { for f in $(grep -l '[l]ong-launch' /proc/[0-9]*/cmdline 2>/dev/null); do [ "$(cat ${f%/cmdline}/comm 2>/dev/null)" != chio ] && echo ${f%/cmdline}; done; }
for i in $(seq 100); do [ -n "$(caged)" ] && break; sleep 0.05; done
echo "cage=$(grep -h '^0::' $(caged | head -1)/cgroup)"
systemctl stop chio-supervisor.service
echo "stopped=$(systemctl is-active chio-supervisor.service)"
echo "left=$(caged | wc -l)"
echo "launches=$(ls /sys/fs/cgroup$U/launches 2>/dev/null | grep -c '^chio-')"
echo "outside=$(ls /sys/fs/cgroup | grep -c '^chio')"
echo "preflight=$(grep -o '"cgroup_delegated": *"[^"]*"' /results/preflight.json | sed 's/.*: *//')"
echo "done=1"
systemctl start --no-block poweroff.target
"#;

/// Under a real systemd on cgroup v2 (Debian trixie's, in a unified hierarchy of the
/// container's own) with the shipped `Delegate=yes`: the daemon runs in its unit's leaf
/// `supervisor`, its cage in the unit's `launches` — where systemd accounts for it and its stop
/// reaches it — and `systemctl stop` leaves no cage and no launch cgroup; the preflight unit
/// finds its own cgroup delegated by the mark systemd puts on it.
#[test]
fn the_daemons_cages_stay_in_its_unit_on_cgroup_v2() {
    let Some(image) = bootable("nspawn_v2", "trixie") else { return };
    let results = Scratch::new("nspawn-v2");
    stage(&results, V2_SCRIPT);
    let mut nspawn = Command::new("systemd-nspawn");
    nspawn.arg("--capability=all").env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1").env("SYSTEMD_SECCOMP", "0");
    let out = boot(nspawn, &image, &results);
    let get = |k: &str| printed(&out, k);
    let err = std::fs::read_to_string(results.join("launch.err")).unwrap_or_default();
    assert_eq!((get("done"), get("installed")), ("1".into(), "0".into()), "{out}");
    assert_eq!(get("supervisor"), "active", "{out}");
    let unit = get("unit");
    assert_eq!(unit, "/system.slice/chio-supervisor.service", "{out}");
    assert_eq!(get("daemon"), format!("0::{unit}/supervisor"), "{out}");
    assert!(get("cage").starts_with(&format!("0::{unit}/launches/chio-")), "{out}\n{err}");
    assert_eq!((get("stopped"), get("left"), get("launches")), ("inactive".into(), "0".into(), "0".into()), "{out}");
    assert_eq!(get("outside"), "0", "a launch cgroup outside the units: {out}");
    assert_eq!(get("preflight"), "\"/sys/fs/cgroup/system.slice/chio-preflight.service\"", "{out}");
}
