//! What ran is what was hashed: the record's digest is of the bytes that execute, whatever a
//! writer of the target's file does around the launch. Each attack comes with a control that
//! shows it changes what a naive launch runs, so no test passes because its attack missed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chio_tests::{
    copy_executable, file_identity as identity, output_within, parse, CageRun, DirtyMapping, Scratch, Suite,
};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn sha256_file(p: impl AsRef<Path>) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(p).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `chio cage run --json` of `argv` over the workspace `ws`, on the probe rootfs, with `hook`.
fn launch(e: &Suite, ws: &Scratch, hook: Option<&str>, extra: &[&str], argv: &[&str]) -> Command {
    let mut cmd = Command::new(&e.chio);
    cmd.args(["cage", "run", "--json", "--rootfs", e.rootfs.to_str().unwrap(), "--workspace"])
        .arg(&ws.0)
        .args(extra)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(h) = hook {
        cmd.env("CHIO_TEST_HOOK", h);
    }
    cmd
}

/// A copy of the probe in the workspace, owned by the cage's uid (which may write it).
fn probe_copy(ws: &Scratch) -> std::path::PathBuf {
    let copy = ws.join("probe");
    copy_executable(Path::new(PROBE), &copy);
    std::os::unix::fs::chown(&copy, Some(65534), Some(65534)).unwrap();
    copy
}

/// A writer of the workspace (another cage on it, a host process of its uid) maps the target
/// shared and writable and dirties its last page before the launch. Once the supervisor has
/// opened the file and closed it again (where it used to hash it early), it writes other bytes
/// through the mapping — a write to an already-dirty shared page takes no fault, so neither
/// mtime nor ctime moves — and unmaps before the exec, so the exec meets no writer (no ETXTBSY).
/// The identity rule (device, inode, size, mtime, ctime) sees nothing. The record must still
/// name the bytes that were executed: `--expect-sha256` of the bytes as they were refuses the
/// launch, and the record's digest is of the bytes as they are.
///
/// Control: the attack did change the file without moving its identity (asserted), and the
/// same launch without it runs under the same expected digest.
#[test]
fn a_binary_rewritten_through_a_dirty_shared_mapping_is_refused_by_its_digest() {
    let Some(e) = Suite::new("dirty_shared_mapping", PROBE) else { return };
    let ws = Scratch::new("what-ran-mapping");
    ws.give_to_nobody();
    let copy = probe_copy(&ws);
    let was = sha256_file(&copy);

    let mapping = DirtyMapping::new(&copy);
    let before = identity(&copy);

    let watch = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).unwrap();
    watch.add_watch(&copy, AddWatchFlags::IN_CLOSE_NOWRITE).unwrap();
    let child =
        launch(&e, &ws, Some("go_late"), &["--expect-sha256", &was], &["/workspace/probe", "write", "/workspace/ran"])
            .spawn()
            .unwrap();
    // The supervisor's first look at the file ends with its close (the cage keeps its own open
    // until the exec); the go_late hook holds the exec 300 ms after that.
    let closed = wait_event(&watch, AddWatchFlags::IN_CLOSE_NOWRITE, Duration::from_secs(20));
    assert!(closed, "the supervisor never looked at the target before its exec");
    mapping.swap();
    let run = parse(output_within(child, Duration::from_secs(60), "the launch under the mapping swap"));

    assert_eq!(identity(&copy), before, "control: the write through the dirty page moved no timestamp");
    let now = sha256_file(&copy);
    assert_ne!(now, was, "control: the attack changed the file's bytes");
    assert_eq!(run.state(), "BootstrapFailed", "other bytes ran under the approved digest: {}", run.stderr);
    assert_eq!(run.record["failure"]["code"], "digest_mismatch", "{}", run.record["failure"]);
    assert_eq!(run.record["target"]["sha256"], now.as_str(), "the record names the bytes that were executed");
    assert!(!ws.join("ran").exists(), "the changed file ran");

    // Control: the same launch of the file as it was runs.
    std::fs::remove_file(&copy).unwrap();
    probe_copy(&ws);
    let control = parse(
        launch(&e, &ws, Some("go_late"), &["--expect-sha256", &was], &["/workspace/probe", "write", "/workspace/ran"])
            .output()
            .unwrap(),
    );
    assert_eq!(control.state(), "FullyEnforced", "control: {}", control.stderr);
    assert!(ws.join("ran").exists(), "control: the target runs");
}

/// Wait up to `within` for an event of `kind` on `watch`.
fn wait_event(watch: &Inotify, kind: AddWatchFlags, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Ok(events) = watch.read_events() {
            if events.iter().any(|ev| ev.mask.contains(kind)) {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// The script: it marks that it started, runs an external command (after which bash reads on
/// from its offset in the file), then writes what its tail says.
const SCRIPT: &str = "#!/bin/bash\n: > started\n/bin/sleep 1\necho ORIGINAL > out\n";

/// Rewrite the script's tail in place, same length, once it has started (`started` appears).
fn rewrite_tail_once_started(dir: &Path) -> std::thread::JoinHandle<bool> {
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(30);
        while !dir.join("started").exists() {
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let f = std::fs::OpenOptions::new().write(true).open(dir.join("run.sh")).unwrap();
        let at = SCRIPT.find("echo ORIGINAL").unwrap() as u64;
        f.write_all_at(b"echo SWAPPED!", at).unwrap();
        true
    })
}

fn write_script(dir: &Path) {
    let p = dir.join("run.sh");
    chio_tests::write_executable(&p, SCRIPT);
    std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
}

fn read(p: impl AsRef<Path>) -> String {
    let mut s = String::new();
    std::fs::File::open(p).unwrap().read_to_string(&mut s).unwrap();
    s
}

/// An interpreter reads its script lazily: bash reads on from its offset after every external
/// command, so a writer that rewrites the tail in place while the first lines run changes what
/// runs, and nothing like ETXTBSY protects a script. In a cage the interpreter reads a sealed
/// copy: the original tail runs and the record's digest is of the script as copied, while the
/// record names the script's path and the file it was copied from.
///
/// Control: the same script under the same rewrite, run by bash directly on the host, runs the
/// rewritten tail.
#[test]
fn a_script_rewritten_in_place_while_it_runs_is_not_what_runs() {
    let Some(e) = Suite::new("script_rewritten", PROBE) else { return };
    let ws = Scratch::new("what-ran-script");
    ws.give_to_nobody();
    write_script(&ws.0);
    let was = sha256_file(ws.join("run.sh"));
    let ino = std::fs::metadata(ws.join("run.sh")).unwrap().ino();
    let writer = rewrite_tail_once_started(&ws.0);
    let out = Command::new(&e.chio)
        .args(["cage", "run", "--json", "--workspace"])
        .arg(&ws.0)
        .args(["--", "/workspace/run.sh"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run: CageRun = parse(out);
    assert!(writer.join().unwrap(), "the script never started: {}", run.stderr);
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_ne!(sha256_file(ws.join("run.sh")), was, "the script's file was rewritten");
    assert_eq!(read(ws.join("out")), "ORIGINAL\n", "the rewritten tail ran");
    let target = &run.record["target"];
    assert_eq!(target["sha256"], was.as_str(), "the record's digest is of the bytes that ran");
    assert_eq!(target["path"], "/workspace/run.sh");
    assert_eq!(target["inode"], ino.to_string().as_str(), "the record names the script's file as opened");
    assert!(target["opened_as"].as_str().unwrap().starts_with("/dev/fd/"), "{target}");
    assert!(target["interpreter"]["path"].as_str().unwrap().ends_with("bash"), "{target}");

    // Control: bash on the host, reading the file itself, runs the rewritten tail.
    let host = Scratch::new("what-ran-script-host");
    write_script(&host.0);
    let writer = rewrite_tail_once_started(&host.0);
    let status = Command::new("/bin/bash").arg("run.sh").current_dir(&host.0).status().unwrap();
    assert!(writer.join().unwrap() && status.success());
    assert_eq!(read(host.join("out")), "SWAPPED!\n", "control: the attack changes what a naive launch runs");
}

/// A script's copy is sealed: the caged script cannot write to the file its interpreter reads,
/// even through the descriptor it holds (`/dev/fd/<n>`), though the script's own file is
/// writable to it. Control: the script appends to its own file.
#[test]
fn a_script_cannot_change_the_copy_it_is_read_from() {
    let Some(_e) = Suite::new("script_copy_sealed", PROBE) else { return };
    let ws = Scratch::new("what-ran-sealed");
    ws.give_to_nobody();
    let p = ws.join("run.sh");
    // $0 is /dev/fd/<n>, the copy; run.sh is the file.
    chio_tests::write_executable(
        &p,
        "#!/bin/bash\nif echo x >> \"$0\"; then echo copy-written; else echo copy-refused; fi\n\
         if echo '#' >> run.sh; then echo file-written; fi\n",
    );
    std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    let out = Command::new(chio_tests::chio_bin(Path::new(PROBE)))
        .args(["cage", "run", "--workspace"])
        .arg(&ws.0)
        .args(["--", "/workspace/run.sh"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("copy-refused"), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("file-written"), "control: the script's own file is writable: {stdout}");
}

/// The exec stop's digest stands because the kernel refuses every writer of an executing file
/// from its exec on (ETXTBSY), and a writer still open fails the exec. Checked on this kernel:
/// while a caged target runs, the host cannot open its file for writing; before and after, it can.
#[test]
fn the_kernel_refuses_writers_of_an_executing_file() {
    let Some(e) = Suite::new("executing_file_write_denied", PROBE) else { return };
    let ws = Scratch::new("what-ran-txtbsy");
    ws.give_to_nobody();
    let copy = probe_copy(&ws);
    let open_write = || std::fs::OpenOptions::new().write(true).open(&copy).map(drop);
    assert!(open_write().is_ok(), "control: the file is writable before it runs");
    let (dev, ino) = (std::fs::metadata(&copy).unwrap().dev(), std::fs::metadata(&copy).unwrap().ino());
    let child =
        launch(&e, &ws, None, &["--timeout", "3s"], &["/workspace/probe", "sleeper", "what-ran"]).spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let running = loop {
        if let Some(pid) = executing(dev, ino) {
            break Some(pid);
        }
        if Instant::now() > end {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let refused = open_write().map_err(|e| e.raw_os_error());
    let run = parse(output_within(child, Duration::from_secs(30), "the sleeping target"));
    assert!(running.is_some(), "the target never ran: {}", run.stderr);
    assert_eq!(refused, Err(Some(libc::ETXTBSY)), "a writer of the executing file");
    let end = Instant::now() + Duration::from_secs(10);
    while executing(dev, ino).is_some() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(open_write().is_ok(), "control: writable again once it is gone");
}

/// A process executing the file with this device and inode.
fn executing(dev: u64, ino: u64) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|d| {
        let pid: u32 = d.file_name().to_str()?.parse().ok()?;
        let m = std::fs::metadata(d.path().join("exe")).ok()?;
        (m.dev() == dev && m.ino() == ino).then_some(pid)
    })
}

/// A FUSE file system serving one file, `exe`: the bytes of the host file named on its command
/// line, as root's, mode 0755 (what a server may claim). Whoever mounts one can serve other bytes
/// to a later page fault, with the same owner, mode and times.
const SERVING_FS: &str = r#"
import errno, stat, sys
from fusepy import FUSE, Operations, FuseOSError

data = open(sys.argv[2], 'rb').read()

class S(Operations):
    def getattr(self, path, fh=None):
        if path == '/':
            return dict(st_mode=stat.S_IFDIR | 0o755, st_nlink=2)
        if path == '/exe':
            return dict(st_mode=stat.S_IFREG | 0o755, st_nlink=1, st_size=len(data), st_uid=0, st_gid=0)
        raise FuseOSError(errno.ENOENT)
    def readdir(self, path, fh):
        return ['.', '..', 'exe']
    def open(self, path, flags):
        return 0
    def read(self, path, size, offset, fh):
        return data[offset:offset + size]

FUSE(S(), sys.argv[1], foreground=True, allow_other=True, ro=True)
"#;

/// A file executed from a FUSE file system is refused, named: its server could serve other bytes
/// than were hashed to the pages the program faults in once it runs, and claims any owner, mode
/// and times. Control: the same bytes on a local file system, bound the same way, run.
#[test]
fn a_target_on_a_fuse_file_system_is_refused() {
    let Some(e) = Suite::new("target_on_fuse", PROBE) else { return };
    let mnt = Scratch::new("what-ran-fuse");
    let mut server = Command::new("/usr/bin/python3")
        .args(["-c", SERVING_FS])
        .arg(&mnt.0)
        .arg(PROBE)
        .stdin(Stdio::null())
        .spawn()
        .expect("python3 with fusepy (apt-get install python3-fusepy; .ci/run does)");
    let end = Instant::now() + Duration::from_secs(10);
    while !mnt.join("exe").exists() {
        assert!(Instant::now() < end, "the FUSE server did not mount");
        std::thread::sleep(Duration::from_millis(20));
    }
    let run_from = |dir: &Path| {
        let bind = format!("{}:/opt", dir.display());
        let out = Command::new(&e.chio)
            .args(["cage", "run", "--json", "--rootfs", e.rootfs.to_str().unwrap(), "--ro-bind", &bind])
            .args(["--", "/opt/exe", "euid"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        parse(out)
    };
    let run = run_from(&mnt.0);
    let _ = server.kill();
    let _ = server.wait();
    let _ = Command::new("umount").arg("-l").arg(&mnt.0).status();
    assert_eq!(run.state(), "BootstrapFailed", "{}", run.stderr);
    assert_eq!(run.record["failure"]["code"], "target_on_remote_fs", "{}", run.record["failure"]);
    assert!(run.stderr.contains("FUSE"), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "it ran: {}", run.stdout);
    let local = Scratch::new("what-ran-fuse-local");
    copy_executable(Path::new(PROBE), &local.join("exe"));
    let control = run_from(&local.0);
    assert_eq!(control.state(), "FullyEnforced", "control: {}", control.stderr);
}
