//! `chio image` end to end: an OCI layout the test writes from the probe rootfs is imported,
//! listed, inspected, run with `chio cage run --image` (its WorkingDir honoured), verified, found
//! tampered after a change, and removed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use chio_tests::{build_rootfs, chio_bin, oci_layout_with, parse, privileged, programs_rootfs, Scratch};

const PROBE: &str = env!("CARGO_BIN_EXE_chio-probe");

fn chio(args: &[&str]) -> Output {
    Command::new(chio_bin(&PathBuf::from(PROBE))).args(args).stdin(Stdio::null()).output().unwrap()
}

/// `chio args`, which must end within `secs` seconds (else it is killed and the test fails).
fn chio_within(args: &[&str], secs: u64) -> Output {
    let child = Command::new(chio_bin(&PathBuf::from(PROBE)))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    chio_tests::output_within(child, std::time::Duration::from_secs(secs), &format!("chio {args:?}"))
}

/// An OCI layout with one gzip layer holding `rootfs`.
fn oci_layout(rootfs: &Path, out: &Path) {
    oci_layout_with(rootfs, out, serde_json::json!({"Env": ["GREETING=from-image"], "WorkingDir": "/etc"}), "probe:1");
}

#[test]
fn import_run_verify_and_remove() {
    if !privileged("images_cli") {
        return;
    }
    let dir = Scratch::new("images");
    let rootfs = dir.join("rootfs");
    build_rootfs(&rootfs, Path::new(PROBE));
    std::fs::remove_file(rootfs.join("probe-suid")).unwrap();
    let layout = dir.join("layout");
    oci_layout(&rootfs, &layout);
    let state = dir.join("state");
    let s = state.to_str().unwrap();
    let out = chio(&["image", "import", layout.to_str().unwrap(), "--state-dir", s, "--name", "mine"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(id.starts_with("sha256:"));
    let list = String::from_utf8(chio(&["image", "list", "--state-dir", s]).stdout).unwrap();
    assert!(list.contains("probe:1") && list.contains("mine"), "{list}");
    let inspect: serde_json::Value =
        serde_json::from_slice(&chio(&["image", "inspect", "probe:1", "--state-dir", s]).stdout).unwrap();
    assert_eq!(inspect["image_id"], id);

    let run = parse(chio(&["cage", "run", "--json", "--state-dir", s, "--image", "probe:1", "--", "/probe", "euid"]));
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(run.stdout.starts_with("REFUSED: euid is 65534"));
    assert_eq!(run.record["observed"]["cwd"], "/etc", "the image's WorkingDir is the default cwd");
    let rootfs_path = inspect["rootfs"].as_str().unwrap();
    assert!(run.record["reported"]["mounts"].to_string().contains(rootfs_path));

    assert!(chio(&["image", "verify", "mine", "--state-dir", s]).status.success());
    std::fs::write(Path::new(rootfs_path).join("etc/hostname"), "tampered").unwrap();
    let v = chio(&["image", "verify", "mine", "--state-dir", s]);
    assert_eq!(v.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&v.stderr).contains("modified since import"));
    // An image a running launch uses cannot be removed; the launch is named.
    let mut running = Command::new(chio_bin(Path::new(PROBE)))
        .args(["cage", "run", "--state-dir", s, "--image", "mine", "--", "/probe", "sleeper", "chio-image-in-use"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(running.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "SLEEPING");
    let busy = chio(&["image", "rm", "mine", "--state-dir", s]);
    let err = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(busy.status.code(), Some(1), "{err}");
    assert!(err.contains("in use by a running launch") && err.contains(&format!("pid {}", running.id())), "{err}");
    assert!(Path::new(rootfs_path).exists(), "the rootfs under a running cage is kept");
    running.kill().unwrap();
    running.wait().unwrap();
    // Once the launch is over (its cage's processes gone, which takes a moment after a
    // SIGKILL of the supervisor), it goes.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !chio(&["image", "rm", "mine", "--state-dir", s]).status.success() {
        assert!(std::time::Instant::now() < until, "the image stayed in use after its launch ended");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!Path::new(rootfs_path).exists());
    let missing = chio(&["cage", "run", "--state-dir", s, "--image", "probe:1", "--", "/probe"]);
    assert_eq!(missing.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no image named"));
}

/// `--image` without a command runs the image's Entrypoint and Cmd as its User, like
/// `docker run`; a command replaces Cmd, `--entrypoint` the entrypoint, `--uid` the user; the
/// record names where they came from.
#[test]
fn image_entrypoint_cmd_and_user() {
    if !privileged("image_entrypoint") {
        return;
    }
    let dir = Scratch::new("image-entry");
    let rootfs = dir.join("rootfs");
    build_rootfs(&rootfs, Path::new(PROBE));
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0::/:/probe\nbuilder:x:1234:4321::/:/probe\n").unwrap();
    let layout = dir.join("layout");
    let config = serde_json::json!({"Entrypoint": ["/probe"], "Cmd": ["euid"], "User": "builder"});
    oci_layout_with(&rootfs, &layout, config, "entry:1");
    let state = dir.join("state");
    let s = state.to_str().unwrap();
    assert!(chio(&["image", "import", layout.to_str().unwrap(), "--state-dir", s]).status.success());
    let run = parse(chio(&["cage", "run", "--json", "--state-dir", s, "--image", "entry:1"]));
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert!(run.stdout.starts_with("REFUSED: euid is 1234"), "{}", run.stdout);
    assert_eq!(run.record["argv"], serde_json::json!(["/probe", "euid"]));
    assert_eq!(run.record["observed"]["gids"][0], 4321, "the user's passwd group");
    assert_eq!(run.record["annotations"]["image.user"], "\"builder\"");
    // A command replaces Cmd after the entrypoint; --uid/--gid replace the user.
    let run = parse(chio(&[
        "cage",
        "run",
        "--json",
        "--state-dir",
        s,
        "--image",
        "entry:1",
        "--uid",
        "2000",
        "--gid",
        "2000",
        "--",
        "euid",
    ]));
    assert!(run.stdout.starts_with("REFUSED: euid is 2000"), "{}", run.stdout);
    // --entrypoint replaces the entrypoint.
    let run = parse(chio(&[
        "cage",
        "run",
        "--json",
        "--state-dir",
        s,
        "--image",
        "entry:1",
        "--entrypoint",
        "/probe-suid",
        "--",
        "euid",
    ]));
    assert_eq!(run.record["argv"], serde_json::json!(["/probe-suid", "euid"]));
}

/// Import refusals that name the problem: a state directory that is a file, a bad --platform.
#[test]
fn import_refusals_name_the_problem() {
    if !privileged("import_refusals") {
        return;
    }
    let dir = Scratch::new("import-refusals");
    let file = dir.join("state-file");
    std::fs::write(&file, "").unwrap();
    let out = chio(&["image", "import", "/etc/hostname", "--state-dir", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a directory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = dir.join("state");
    let out =
        chio(&["image", "import", "/etc/hostname", "--platform", "bogus", "--state-dir", state.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("OS/ARCH"));
    assert!(!state.exists(), "a refused import creates no store");
    // Listing: no store yet is an empty list (and creates none); a file is refused.
    let out = chio(&["image", "list", "--state-dir", state.to_str().unwrap()]);
    assert!(out.status.success() && out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!state.exists(), "listing creates no store");
    let out = chio(&["image", "list", "--state-dir", file.to_str().unwrap()]);
    let says = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && says.contains("is not a directory"), "a file as the store: {says}");
    // A store in a directory another user owns is refused (its owner could replace the trees
    // cages run on), for an import and for a listing alike.
    let theirs = dir.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let store = theirs.join("store");
    for args in [&["image", "import", "/etc/hostname"][..], &["image", "list"][..]] {
        std::fs::create_dir_all(&store).unwrap();
        let out = chio(&[args, &["--state-dir", store.to_str().unwrap()]].concat());
        let says = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && says.contains("is owned by uid 65534"), "{args:?}: {says}");
        assert_eq!(std::fs::read_dir(&store).unwrap().count(), 0, "{args:?}");
    }
    // A FIFO as the archive is refused at once, not waited on for a writer.
    let fifo = dir.join("fifo.tar");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let out = chio_within(&["image", "import", fifo.to_str().unwrap(), "--state-dir", state.to_str().unwrap()], 20);
    let says = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && says.contains("is not an image"), "a FIFO: {says}");
}

/// A compressed archive is decompressed into the store's `tmp/` before it is read, at most
/// `--max-bytes` of it: a gzip bomb (here 1 MiB and one byte of zeros, about a kilobyte packed)
/// is refused for its size, naming the limit, and leaves nothing in `tmp/`; exactly the limit
/// passes that step (and is then refused as what it is: not an image), and so does any size
/// under a larger limit. zstd is bounded the same way.
#[test]
fn a_compressed_archive_is_decompressed_only_up_to_the_limit() {
    if !privileged("import_bomb") {
        return;
    }
    let dir = Scratch::new("import-bomb");
    let state = dir.join("state");
    let packed = |n: usize, tool: &str| -> PathBuf {
        let plain = dir.join(&format!("zeros-{n}"));
        std::fs::write(&plain, vec![0u8; n]).unwrap();
        assert!(Command::new(tool).args(["-q", "-f"]).arg(&plain).status().unwrap().success());
        let ext = if tool == "gzip" { "gz" } else { "zst" };
        let _ = std::fs::remove_file(&plain);
        dir.join(&format!("zeros-{n}.{ext}"))
    };
    let import = |file: &Path, max: &str| -> String {
        let out = chio(&[
            "image",
            "import",
            file.to_str().unwrap(),
            "--max-bytes",
            max,
            "--state-dir",
            state.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", file.display());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    const MIB: usize = 1 << 20;
    for tool in ["gzip", "zstd"] {
        let over = import(&packed(MIB + 1, tool), "1M");
        assert!(over.contains("decompresses to more than 1048576 bytes (--max-bytes)"), "{tool}: {over}");
        let at = import(&packed(MIB, tool), "1M");
        assert!(!at.contains("decompresses to more than") && at.contains("not an image"), "{tool}: {at}");
        let under = import(&packed(MIB + 1, tool), "2M");
        assert!(!under.contains("decompresses to more than") && under.contains("not an image"), "{tool}: {under}");
    }
    let left: Vec<_> = std::fs::read_dir(state.join("tmp")).unwrap().collect();
    assert!(left.is_empty(), "left in tmp/: {left:?}");
}

/// `packaging/images/build-images.py --pack` (the packer behind the session images, which are
/// made with debootstrap) writes a `docker save` archive chio imports and runs: here from a
/// root of the host's own programs, which is what a test can build quickly.
#[test]
fn the_image_packer_writes_an_archive_chio_imports_and_runs() {
    if !privileged("image_packer") {
        return;
    }
    let dir = Scratch::new("packer");
    let root = dir.join("root");
    programs_rootfs(&root, &["/bin/sh", "/bin/cat"]);
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/motd"), "packed\n").unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/images/build-images.py");
    let pack = |archive: &Path| {
        let out = Command::new("python3")
            .arg(&script)
            .args(["--pack", root.to_str().unwrap(), "--tag", "chio/packed:1", "--out", archive.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let archive = dir.join("packed.tar");
    pack(&archive);
    let state = dir.join("state");
    let s = state.to_str().unwrap();
    let out = chio(&["image", "import", archive.to_str().unwrap(), "--state-dir", s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = parse(chio(&[
        "cage",
        "run",
        "--json",
        "--state-dir",
        s,
        "--image",
        "chio/packed:1",
        "--",
        "/bin/cat",
        "/etc/motd",
    ]));
    assert_eq!(run.state(), "FullyEnforced", "{}", run.stderr);
    assert_eq!(run.stdout, "packed\n");
    // The same root packs to the same image id: the archive is deterministic.
    let again = dir.join("again.tar");
    pack(&again);
    assert_eq!(std::fs::read(&archive).unwrap(), std::fs::read(&again).unwrap());
}

/// An OCI layout holds plain files and directories only. A symlink planted in one — for a blob,
/// or for the directory of blobs — is refused, never followed, even when what it points at has
/// exactly the digest the manifest names (so the digest check alone would pass it): reading
/// through it would have the importer open files outside the layout (another's layout, host
/// files). A FIFO in place of a blob is refused without blocking on it, and a layout reached
/// through a symlink is refused as every operator path is. Control: the untouched layout.
#[test]
fn a_layout_with_a_planted_link_or_fifo_is_refused() {
    if !privileged("images_layout_links") {
        return;
    }
    let dir = Scratch::new("images-links");
    let rootfs = dir.join("rootfs");
    build_rootfs(&rootfs, Path::new(PROBE));
    std::fs::remove_file(rootfs.join("probe-suid")).unwrap();
    let layout = dir.join("layout");
    oci_layout(&rootfs, &layout);
    let blobs = layout.join("blobs/sha256");
    // The largest blob is the layer.
    let layer = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let outside = dir.join("outside");
    assert!(Command::new("cp").arg("-a").arg(&blobs).arg(&outside).status().unwrap().success());
    let import = |what: &str, path: &Path, state: &str| -> Output {
        let started = std::time::Instant::now();
        let s = dir.join(state);
        let out = chio(&["image", "import", path.to_str().unwrap(), "--state-dir", s.to_str().unwrap()]);
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{what}: {:?}", started.elapsed());
        out
    };
    let refused = |what: &str, out: Output, says: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: imported");
        assert!(err.contains(says), "{what}: {err}");
    };
    // A blob that is a link to an identical copy outside the layout.
    let copy = |tag: &str| {
        let c = dir.join(tag);
        assert!(Command::new("cp").arg("-a").arg(&layout).arg(&c).status().unwrap().success());
        c
    };
    let l = copy("blob-link");
    let name = layer.file_name().unwrap();
    std::fs::remove_file(l.join("blobs/sha256").join(name)).unwrap();
    std::os::unix::fs::symlink(outside.join(name), l.join("blobs/sha256").join(name)).unwrap();
    refused("a blob that is a link", import("blob link", &l, "s1"), "symbolic link");
    // The blob directory itself a link to identical blobs outside.
    let l = copy("dir-link");
    std::fs::remove_dir_all(l.join("blobs/sha256")).unwrap();
    std::os::unix::fs::symlink(&outside, l.join("blobs/sha256")).unwrap();
    refused("a blob directory that is a link", import("dir link", &l, "s2"), "symbolic link");
    // A FIFO where the layer should be: refused at once, not waited on.
    let l = copy("fifo");
    std::fs::remove_file(l.join("blobs/sha256").join(name)).unwrap();
    assert!(Command::new("mkfifo").arg(l.join("blobs/sha256").join(name)).status().unwrap().success());
    refused("a FIFO blob", import("fifo", &l, "s3"), "not a regular file");
    // The layout named through a link.
    let via = dir.join("via");
    std::os::unix::fs::symlink(&layout, &via).unwrap();
    refused("a layout path through a link", import("path link", &via, "s4"), "symbolic link");
    // Not a link, but no layout either: an index.json without its oci-layout marker.
    let l = copy("no-marker");
    std::fs::remove_file(l.join("oci-layout")).unwrap();
    refused("an index without oci-layout", import("no marker", &l, "s6"), "not an OCI layout");
    // An index.json past the 8 MiB a JSON document may have is refused by its size.
    let l = copy("big-index");
    let mut index = std::fs::read(l.join("index.json")).unwrap();
    index.resize(9 << 20, b' ');
    std::fs::write(l.join("index.json"), index).unwrap();
    refused("an oversized index", import("big index", &l, "s7"), "(limit 8388608)");
    // Bytes that are not a tar archive, long enough to hold a tar header, are not an image.
    let noise = dir.join("noise");
    std::fs::write(&noise, (0..8192u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect::<Vec<_>>()).unwrap();
    refused("random bytes", import("noise", &noise, "s8"), "is not an image");
    // Control: the layout as written imports.
    let out = import("control", &layout, "s5");
    assert!(out.status.success(), "control: {}", String::from_utf8_lossy(&out.stderr));
}

/// Several images in one store: each root is its own tree, named by its layers' ChainID (two
/// images with different layers never share one; two with the same layers and different
/// configs do), a name given again moves to the new image, and removing an image keeps a tree
/// another image still uses.
#[test]
fn images_in_one_store_keep_their_own_trees_and_names() {
    if !privileged("images_one_store") {
        return;
    }
    let dir = Scratch::new("images-store");
    let state = dir.join("state");
    let s = state.to_str().unwrap();
    let layout = |tag: &str, marker: &str, env: &str| -> PathBuf {
        let rootfs = dir.join(&format!("rootfs-{marker}"));
        if !rootfs.exists() {
            // (The probe's set-user-id copy stays: the record lists it.)
            build_rootfs(&rootfs, Path::new(PROBE));
            std::fs::write(rootfs.join("marker"), marker).unwrap();
        }
        let out = dir.join(&format!("layout-{tag}"));
        oci_layout_with(&rootfs, &out, serde_json::json!({"Env": [env]}), &format!("img:{tag}"));
        out
    };
    let import = |l: &Path, name: &str| -> String {
        let out = chio(&["image", "import", l.to_str().unwrap(), "--state-dir", s, "--name", name]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let inspect = |what: &str| -> serde_json::Value {
        let out = chio(&["image", "inspect", what, "--state-dir", s]);
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let a = import(&layout("a", "a", "V=1"), "mine");
    let b = import(&layout("b", "b", "V=1"), "mine");
    let c = import(&layout("c", "a", "V=2"), "other");
    assert!(a != b && a != c && b != c, "three images: {a} {b} {c}");
    let root = |id: &str| inspect(id)["rootfs"].as_str().unwrap().to_string();
    let (ra, rb, rc) = (root(&a), root(&b), root(&c));
    assert_ne!(ra, rb, "different layers, different trees");
    assert_eq!(ra, rc, "the same layers, one tree");
    assert_eq!(std::fs::read_to_string(Path::new(&ra).join("marker")).unwrap(), "a");
    // Importing a present image again verifies its tree and keeps it (not extracted anew).
    let ino = |p: &str| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(Path::new(p).join("marker")).unwrap());
    let before = ino(&ra);
    let setuid = inspect(&a)["setuid"].clone();
    assert!(setuid.to_string().contains("probe-suid"), "the record lists the set-user-id file: {setuid}");
    assert_eq!(import(&dir.join("layout-a"), "again"), a);
    assert_eq!(ino(&ra), before, "a present tree was extracted again");
    assert_eq!(inspect(&a)["setuid"], setuid, "what the extraction found is kept by a re-import");
    assert_eq!(std::fs::read_to_string(Path::new(&rb).join("marker")).unwrap(), "b");
    // A tree removed by hand behind the store's back is extracted again by a re-import.
    std::fs::remove_dir_all(&rb).unwrap();
    assert_eq!(import(&dir.join("layout-b"), "mine"), b);
    assert_eq!(std::fs::read_to_string(Path::new(&rb).join("marker")).unwrap(), "b");
    // "mine" moved from a to b; a keeps its own reference.
    assert_eq!(inspect("mine")["image_id"], b.as_str());
    let refs = inspect(&a)["references"].to_string();
    assert!(refs.contains("img:a") && !refs.contains("mine"), "{refs}");
    // An ID prefix of 12 hex digits finds an image; a shorter one is not an ID.
    assert_eq!(inspect(&a["sha256:".len().."sha256:".len() + 12])["image_id"], a.as_str());
    assert!(!chio(&["image", "inspect", &a["sha256:".len().."sha256:".len() + 11], "--state-dir", s]).status.success());
    // Removing a keeps the tree c still uses; removing c then removes it.
    assert!(chio(&["image", "rm", &a, "--state-dir", s]).status.success());
    assert!(Path::new(&rc).join("marker").exists(), "a tree another image uses was removed");
    assert!(chio(&["image", "verify", &c, "--state-dir", s]).status.success());
    assert!(chio(&["image", "rm", &c, "--state-dir", s]).status.success());
    assert!(!Path::new(&rc).exists(), "an unused tree was left");
    assert!(Path::new(&rb).join("marker").exists());
}

/// A `docker save` archive of several images (the legacy layout, where a config's file name is
/// its digest): without `--ref` it is refused as ambiguous, `--ref` picks by tag (whole, its tag
/// part, or its repository part), a `--ref` no tag matches is refused, and a config whose
/// content is not its name's digest is refused as tampered.
#[test]
fn a_docker_save_archive_of_several_images_is_chosen_by_ref() {
    if !privileged("images_docker_save") {
        return;
    }
    let dir = Scratch::new("images-save");
    let roots: Vec<PathBuf> = ["a", "b"]
        .iter()
        .map(|m| {
            let r = dir.join(&format!("rootfs-{m}"));
            build_rootfs(&r, Path::new(PROBE));
            std::fs::remove_file(r.join("probe-suid")).unwrap();
            std::fs::write(r.join("marker"), m).unwrap();
            r
        })
        .collect();
    let two = dir.join("two.tar");
    chio_tests::docker_save_with(&two, &[("app-a:1", &roots[0], "WHO=a"), ("app-b:2", &roots[1], "WHO=b")], false);
    let state = dir.join("state");
    let s = state.to_str().unwrap();
    let import = |file: &Path, with: &[&str]| -> Output {
        let mut args = vec!["image", "import", file.to_str().unwrap(), "--state-dir", s];
        args.extend_from_slice(with);
        chio(&args)
    };
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let out = import(&two, &[]);
    assert!(
        !out.status.success() && err(&out).contains("2 images in manifest.json; choose one with --ref"),
        "{}",
        err(&out)
    );
    let out = import(&two, &["--ref", "nothing:9"]);
    assert!(!out.status.success() && err(&out).contains("no image in manifest.json matches"), "{}", err(&out));
    for (reference, who) in [("app-a:1", "WHO=a"), ("2", "WHO=b"), ("app-a", "WHO=a")] {
        let out = import(&two, &["--ref", reference]);
        assert!(out.status.success(), "{reference}: {}", err(&out));
        let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let inspect: serde_json::Value =
            serde_json::from_slice(&chio(&["image", "inspect", &id, "--state-dir", s]).stdout).unwrap();
        assert_eq!(inspect["config"]["Env"][0], who, "{reference}: {inspect}");
    }
    // Cut short, the archive is refused as such.
    let cut = dir.join("cut.tar");
    let bytes = std::fs::read(&two).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 4]).unwrap();
    let out = import(&cut, &["--ref", "app-a:1"]);
    assert!(!out.status.success() && err(&out).contains("ends early"), "{}", err(&out));
    // Cut where a member ends (the tar reader takes that for the archive's end): the end
    // marker, two zero blocks, is missing; with one of its blocks left it is whole.
    for (cut_at, whole) in [(bytes.len() - 1024, false), (bytes.len() - 512, true)] {
        std::fs::write(&cut, &bytes[..cut_at]).unwrap();
        let out = import(&cut, &["--ref", "app-a:1"]);
        assert_eq!(out.status.success(), whole, "cut at {cut_at} of {}: {}", bytes.len(), err(&out));
        assert_eq!(err(&out).contains("ends early"), !whole, "{}", err(&out));
    }
    // A layer member that is a symlink to another member (how `docker save` shares a layer)
    // resolves inside the archive, relative or from its top; one that leaves the archive, or
    // loops, is refused.
    let sha = chio_tests::hex(&chio_tests::layer_tar(&roots[0]));
    for (link, ok, says) in [
        (format!("../{sha}/layer.tar"), true, ""),
        (format!("/{sha}/layer.tar"), true, ""),
        ("../../../../etc/passwd".to_string(), false, "is not in the image"),
        ("layer.tar".to_string(), false, "too many links"),
    ] {
        let linked = dir.join("linked.tar");
        chio_tests::docker_save_linked(&linked, &roots[0], &link);
        let out = import(&linked, &[]);
        assert_eq!(out.status.success(), ok, "{link}: {}", err(&out));
        assert!(err(&out).contains(says), "{link}: {}", err(&out));
    }
    let tampered = dir.join("tampered.tar");
    chio_tests::docker_save_with(&tampered, &[("app-a:1", &roots[0], "WHO=a")], true);
    let out = import(&tampered, &[]);
    assert!(!out.status.success() && err(&out).contains("does not match its name"), "{}", err(&out));
}

/// `--ref` on an OCI layout picks the manifest by its reference name: whole, its tag, or its
/// last path part; a reference that names it in none of these ways finds nothing.
#[test]
fn an_oci_layout_is_chosen_by_its_reference() {
    if !privileged("images_oci_ref") {
        return;
    }
    let dir = Scratch::new("images-oci-ref");
    let rootfs = dir.join("rootfs");
    build_rootfs(&rootfs, Path::new(PROBE));
    std::fs::remove_file(rootfs.join("probe-suid")).unwrap();
    let layout = dir.join("layout");
    oci_layout_with(&rootfs, &layout, serde_json::json!({}), "example.org/team/img:7");
    let state = dir.join("state");
    for (reference, found) in [
        ("example.org/team/img:7", true),
        ("7", true),
        ("img:7", true),
        ("img:8", false),
        ("team/img:7x", false),
        ("example.org", false),
    ] {
        let out = chio(&[
            "image",
            "import",
            layout.to_str().unwrap(),
            "--ref",
            reference,
            "--state-dir",
            state.to_str().unwrap(),
        ]);
        assert_eq!(out.status.success(), found, "{reference}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
