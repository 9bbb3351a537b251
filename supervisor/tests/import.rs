//! Image import from every format the tests can write themselves (OCI layout directory,
//! oci-archive, Docker 25+ and legacy `docker save`), giving the same tree for the same image; and
//! the hostile set: digest and size mismatches, wrong layer order, missing blobs, media-type
//! confusion, a decompression bomb and a hostile layer — each refused with nothing half-imported.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use chio_supervisor::image::extract::Budgets;
use chio_supervisor::image::import::{ImportError, Selection};
use chio_supervisor::image::store::ImageStore;
use serde_json::json;
use sha2::{Digest, Sha256};

fn hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn layer(files: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, data.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 3).unwrap()
}

struct Image {
    layers_plain: Vec<Vec<u8>>,
    layers_blob: Vec<Vec<u8>>,
    config: Vec<u8>,
}

fn image() -> Image {
    let l1 = layer(&[("usr/bin/tool", "v1"), ("etc/os-release", "ID=test\n"), ("etc/gone", "x")]);
    let l2 = layer(&[("usr/bin/tool", "v2"), ("etc/.wh.gone", "")]);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/bin"], "WorkingDir": "/work", "Entrypoint": ["/usr/bin/tool"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&l1)), format!("sha256:{}", hex(&l2))]}
    }))
    .unwrap();
    Image { layers_blob: vec![gzip(&l1), zstd(&l2)], layers_plain: vec![l1, l2], config }
}

fn desc(media: &str, data: &[u8]) -> serde_json::Value {
    json!({"mediaType": media, "digest": format!("sha256:{}", hex(data)), "size": data.len()})
}

/// Write an OCI layout; `tweak` may edit the manifest JSON before it is written.
fn oci_dir(dir: &Path, img: &Image, tweak: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |data: &[u8]| std::fs::write(blobs.join(hex(data)), data).unwrap();
    put(&img.config);
    let mut layers = Vec::new();
    for (blob, media) in img
        .layers_blob
        .iter()
        .zip(["application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.layer.v1.tar+zstd"])
    {
        put(blob);
        layers.push(desc(media, blob));
    }
    let mut manifest = json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": desc("application/vnd.oci.image.config.v1+json", &img.config), "layers": layers,
    });
    tweak(&mut manifest);
    let m = serde_json::to_vec(&manifest).unwrap();
    put(&m);
    let mut md = desc("application/vnd.oci.image.manifest.v1+json", &m);
    md["annotations"] = json!({"org.opencontainers.image.ref.name": "app:1"});
    md["platform"] = json!({"os": "linux", "architecture": "amd64"});
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [md]})).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    dir.to_path_buf()
}

fn tar_dir(dir: &Path, out: &Path) -> PathBuf {
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    b.append_dir_all(".", dir).unwrap();
    b.finish().unwrap();
    out.to_path_buf()
}

fn legacy(dir: &Path, img: &Image) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = format!("{}.json", hex(&img.config));
    std::fs::write(dir.join(&cfg), &img.config).unwrap();
    let mut names = Vec::new();
    for (i, l) in img.layers_plain.iter().enumerate() {
        let d = dir.join(format!("layer{i}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("layer.tar"), l).unwrap();
        names.push(format!("layer{i}/layer.tar"));
    }
    // A third layer entry reusing layer0 through a symlink member, as docker save does for shared layers.
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&json!([{"Config": cfg, "RepoTags": ["app:1"], "Layers": names}])).unwrap(),
    )
    .unwrap();
    let out = dir.with_extension("tar");
    tar_dir(dir, &out)
}

struct Env {
    base: PathBuf,
    store: ImageStore,
}

fn env(tag: &str) -> Env {
    let base = common::scratch().join(format!("chio-import-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let store = ImageStore::open(&base.join("state")).unwrap();
    Env { base, store }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

impl Env {
    fn import(
        &self,
        p: &Path,
    ) -> Result<chio_supervisor::image::store::ImageRecord, chio_supervisor::image::import::ImportError> {
        self.import_with(p, &Budgets::default())
    }
    fn import_with(
        &self,
        p: &Path,
        b: &Budgets,
    ) -> Result<chio_supervisor::image::store::ImageRecord, chio_supervisor::image::import::ImportError> {
        let sel = Selection { reference: None, platform: "linux/amd64".into() };
        self.store.import(p, &sel, None, b, &mut |_| {})
    }
    /// Nothing half-imported: no rootfs, no temp, no image record.
    fn empty(&self) {
        for sub in ["rootfs", "tmp", "images"] {
            let n = std::fs::read_dir(self.base.join("state").join(sub)).unwrap().count();
            assert_eq!(n, 0, "state/{sub} is not empty");
        }
    }
}

#[test]
fn every_format_gives_the_same_tree() {
    let img = image();
    let e = env("formats");
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    let a = e.import(&dir).unwrap();
    let root = e.store.rootfs(&a);
    assert_eq!(std::fs::read_to_string(root.join("usr/bin/tool")).unwrap(), "v2");
    assert!(!root.join("etc/gone").exists(), "whiteout applied");
    assert_eq!(a.references, ["docker.io/library/app:1"], "references in normal form");
    assert_eq!(a.config["WorkingDir"], "/work");
    let archive = tar_dir(&dir, &e.base.join("oci-archive.tar"));
    let b = e.import(&archive).unwrap();
    // Docker 25+: an OCI layout plus a legacy manifest.json in the same tar.
    std::fs::write(dir.join("manifest.json"), "[]").unwrap();
    let docker25 = tar_dir(&dir, &e.base.join("docker25.tar"));
    let c = e.import(&docker25).unwrap();
    let d = e.import(&legacy(&e.base.join("legacy"), &img)).unwrap();
    for r in [&b, &c, &d] {
        assert_eq!(r.image_id, a.image_id);
        assert_eq!(r.chain_id, a.chain_id);
        assert_eq!(r.tree_sha256, a.tree_sha256);
    }
    assert!(e.store.verify(&a).unwrap());
    std::fs::write(root.join("usr/bin/tool"), "tampered").unwrap();
    assert!(!e.store.verify(&a).unwrap(), "tampering is detected");
}

#[test]
fn reimport_verifies_without_extracting_and_rm_collects() {
    let img = image();
    let e = env("reimport");
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    let a = e.import(&dir).unwrap();
    let marker = e.store.rootfs(&a).join("etc/os-release");
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&marker).unwrap());
    let mut events = Vec::new();
    let sel = Selection { reference: Some("app:1".into()), platform: Selection::host_platform() };
    e.store.import(&dir, &sel, Some("mine"), &Budgets::default(), &mut |p| events.push(format!("{p:?}"))).unwrap();
    assert!(events.iter().any(|l| l.contains("already_present: true")), "{events:?}");
    assert!(events.iter().any(|l| l.starts_with("Bytes")), "byte progress is reported: {events:?}");
    assert_eq!(events.iter().filter(|l| l.starts_with("Layer")).count(), img.layers_blob.len(), "{events:?}");
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&marker).unwrap()), ino, "not re-extracted");
    let found = e.store.find("mine").unwrap();
    assert!(e.store.remove(&found).unwrap(), "last user of the rootfs: collected");
    e.empty();
}

#[test]
fn hostile_images_are_refused_with_nothing_half_imported() {
    let img = image();
    // A layer blob whose bytes do not match its digest.
    let e = env("bad-blob");
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    let blob = dir.join("blobs/sha256").join(hex(&img.layers_blob[1]));
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let r = e.import(&dir);
    // Either the decompressor or the digest catches it first; either way the layer is named.
    let named = |m: &str| m.contains("layer 1") || m.contains(&hex(&img.layers_blob[1]));
    assert!(
        matches!(&r, Err(ImportError::Digest(m)) if named(m))
            || matches!(&r, Err(ImportError::Io(io)) if named(&io.to_string())),
        "a changed byte names its layer: {r:?}"
    );
    e.empty();
    // A descriptor with the wrong size.
    let e = env("bad-size");
    let dir = oci_dir(&e.base.join("oci"), &img, |m| m["layers"][0]["size"] = json!(3));
    assert!(e.import(&dir).unwrap_err().to_string().contains("descriptor says"));
    e.empty();
    // Layers in the wrong order (the Docker 25.0.0 bug): DiffIDs no longer match by position.
    let e = env("order");
    let dir = oci_dir(&e.base.join("oci"), &img, |m| {
        let l = m["layers"].as_array_mut().unwrap();
        l.swap(0, 1);
    });
    assert!(e.import(&dir).unwrap_err().to_string().contains("out of order"));
    e.empty();
    // A missing blob.
    let e = env("missing");
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    std::fs::remove_file(dir.join("blobs/sha256").join(hex(&img.layers_blob[0]))).unwrap();
    let r = e.import(&dir);
    assert!(
        matches!(&r, Err(ImportError::Io(io)) if io.kind() == std::io::ErrorKind::NotFound)
            || matches!(&r, Err(ImportError::Invalid(m)) if m.contains("missing") || m.contains("not found")),
        "a missing blob is reported as missing: {r:?}"
    );
    e.empty();
    // Media-type confusion: the index says "index" for a manifest.
    let e = env("media");
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    let idx = dir.join("index.json");
    let text = std::fs::read_to_string(&idx).unwrap().replace("image.manifest.v1+json", "image.index.v1+json");
    std::fs::write(&idx, text).unwrap();
    assert!(e.import(&dir).unwrap_err().to_string().contains("descriptor says"));
    e.empty();
}

#[test]
fn bombs_and_hostile_layers_are_refused() {
    // A gzip bomb: 64 MiB of zeros compress to ~64 KiB; the content budget stops it.
    let zeros = vec![0u8; 64 << 20];
    let l = {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(zeros.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, "zeros", &zeros[..]).unwrap();
        b.into_inner().unwrap()
    };
    let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&l))]}})).unwrap();
    let bomb = Image { layers_blob: vec![gzip(&l)], layers_plain: vec![l], config };
    let e = env("bomb");
    let dir = oci_dir(&e.base.join("oci"), &bomb, |m| {
        m["layers"].as_array_mut().unwrap().truncate(1);
    });
    let small = Budgets { max_bytes: 8 << 20, ..Budgets::default() };
    assert!(e.import_with(&dir, &small).unwrap_err().to_string().contains("budget"));
    e.empty();
    // A layer trying to write outside through '..'.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.as_old_mut().name[..9].copy_from_slice(b"../escape");
    h.set_size(1);
    h.set_mode(0o644);
    h.set_cksum();
    b.append(&h, &b"x"[..]).unwrap();
    let evil = b.into_inner().unwrap();
    let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&evil))]}})).unwrap();
    let img = Image { layers_blob: vec![gzip(&evil)], layers_plain: vec![evil], config };
    let e = env("evil");
    let dir = oci_dir(&e.base.join("oci"), &img, |m| {
        m["layers"].as_array_mut().unwrap().truncate(1);
    });
    assert!(e.import(&dir).unwrap_err().to_string().contains("'..'"));
    e.empty();
    assert!(!e.base.join("state/escape").exists() && !e.base.join("escape").exists());
}

#[test]
fn archive_members_that_are_symlinks_resolve_inside_the_archive() {
    use chio_supervisor::image::source::Source;
    use std::io::Read;
    let e = env("members");
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o644);
    b.append_data(&mut h, "a/layer.tar", &b"hello"[..]).unwrap();
    for (name, target) in
        [("b/layer.tar", "../a/layer.tar"), ("c/layer.tar", "/a/layer.tar"), ("d/layer.tar", "../../etc/passwd")]
    {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, name, target).unwrap();
    }
    let path = e.base.join("members.tar");
    std::fs::write(&path, b.into_inner().unwrap()).unwrap();
    let src = Source::open(&path).unwrap();
    for name in ["b/layer.tar", "c/layer.tar"] {
        let mut s = String::new();
        src.read(name).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello", "{name}");
    }
    let err = src.read("d/layer.tar").err().expect("a member link cannot climb out of the archive");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
}

#[test]
fn containerd_style_nested_index_with_attestations_and_absent_platforms() {
    let img = image();
    let e = env("containerd");
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    let blobs = dir.join("blobs/sha256");
    // Lift the manifest descriptor out of index.json into a nested image index that also lists an
    // arm64 manifest whose blob is absent and an attestation manifest.
    let top: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let mut ours = top["manifests"][0].clone();
    ours.as_object_mut().unwrap().remove("annotations");
    let attestation = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{}", hex(b"{}")), "size": 2}, "layers": []})).unwrap();
    std::fs::write(blobs.join(hex(&attestation)), &attestation).unwrap();
    let mut att = desc("application/vnd.oci.image.manifest.v1+json", &attestation);
    att["annotations"] = json!({"vnd.docker.reference.type": "attestation-manifest"});
    att["platform"] = json!({"os": "unknown", "architecture": "unknown"});
    let absent = json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{}", "0".repeat(64)),
        "size": 123, "platform": {"os": "linux", "architecture": "arm64"}});
    let nested =
        serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [absent, ours, att]}))
        .unwrap();
    std::fs::write(blobs.join(hex(&nested)), &nested).unwrap();
    let mut nd = desc("application/vnd.oci.image.index.v1+json", &nested);
    nd["annotations"] = json!({"io.containerd.image.name": "docker.io/library/app:1"});
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [nd]})).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("manifest.json"), "[]").unwrap();
    let archive = tar_dir(&dir, &e.base.join("docker25-containerd.tar"));
    let rec = e.import(&archive).unwrap();
    assert_eq!(rec.references, ["docker.io/library/app:1"]);
    assert_eq!(std::fs::read_to_string(e.store.rootfs(&rec).join("usr/bin/tool")).unwrap(), "v2");
    // Asking for the absent platform is refused clearly.
    let sel = Selection { reference: None, platform: "linux/arm64".into() };
    let err = e.store.import(&archive, &sel, None, &Budgets::default(), &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("no image for platform linux/arm64"), "{err}");
}

#[test]
fn reimport_refuses_a_tampered_tree_and_a_tampered_blob() {
    let img = image();
    let e = env("reimport-tamper");
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    let a = e.import(&dir).unwrap();
    let rootfs = e.store.rootfs(&a);
    // Control: an untouched tree re-imports (verification only) to the same record.
    assert_eq!(e.import(&dir).unwrap().tree_sha256, a.tree_sha256);
    // A file of the stored tree edited after import: re-import must not bless it.
    let marker = rootfs.join("etc/os-release");
    std::fs::write(&marker, "tampered\n").unwrap();
    let err = e.import(&dir).unwrap_err().to_string();
    assert!(err.contains("modified after it was extracted"), "{err}");
    assert_eq!(e.store.find(&a.image_id).unwrap().tree_sha256, a.tree_sha256, "the record is unchanged");
    // A layer blob changed after the first import: its digest is still checked on re-import.
    let e2 = env("reimport-blob");
    let dir = oci_dir(&e2.base.join("oci"), &img, |_| {});
    e2.import(&dir).unwrap();
    let blob = dir.join("blobs/sha256").join(hex(&img.layers_blob[0]));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let err = e2.import(&dir).unwrap_err().to_string();
    assert!(err.contains("descriptor says"), "{err}");
}

#[test]
fn a_tree_no_record_vouches_for_is_extracted_again() {
    let img = image();
    let e = env("orphan-tree");
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    let a = e.import(&dir).unwrap();
    let rootfs = e.store.rootfs(&a);
    // An import that died between renaming its tree into place and writing its record.
    for rec in std::fs::read_dir(e.base.join("state/images")).unwrap() {
        std::fs::remove_file(rec.unwrap().path()).unwrap();
    }
    std::fs::write(rootfs.join("etc/os-release"), "left over\n").unwrap();
    let b = e.import(&dir).unwrap();
    assert_eq!(b.tree_sha256, a.tree_sha256, "extracted afresh, not trusted");
    assert_ne!(std::fs::read_to_string(rootfs.join("etc/os-release")).unwrap(), "left over\n");
}

#[test]
fn a_bomb_after_the_tar_end_marker_is_bounded() {
    // A small valid tar followed by 16 MiB of zeros, all covered by the DiffID (so the digests
    // match): the tail is hashed, and counts against the decompressed budget.
    let mut l = {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        b.append_data(&mut h, "hello", &b"hi"[..]).unwrap();
        b.into_inner().unwrap()
    };
    l.extend(std::iter::repeat_n(0u8, 16 << 20));
    let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&l))]}})).unwrap();
    let img = Image { layers_blob: vec![gzip(&l)], layers_plain: vec![l], config };
    let e = env("tail-bomb");
    let dir = oci_dir(&e.base.join("oci"), &img, |m| {
        m["layers"].as_array_mut().unwrap().truncate(1);
    });
    // A budget no chunk boundary meets exactly is still enforced; the whole stream's length
    // exactly is admitted (below).
    let small = Budgets { max_bytes: (4 << 20) + 12_345, ..Budgets::default() };
    let err = e.import_with(&dir, &small).unwrap_err().to_string();
    assert!(err.contains("exceeds the budget"), "{err}");
    e.empty();
    let exact = Budgets { max_bytes: img.layers_plain[0].len() as u64, ..Budgets::default() };
    let rec = e.import_with(&dir, &exact).unwrap();
    assert!(e.store.remove(&rec).unwrap());
    // Control: with room for it, the same layer imports (the tail is part of its DiffID).
    let rec = e.import(&dir).unwrap();
    assert_eq!(std::fs::read_to_string(e.store.rootfs(&rec).join("hello")).unwrap(), "hi");
}

/// Names accumulate like `docker load` tags, a name moves to the image imported under it, no
/// name is stored twice, and references are matched in the docker CLI's normal form.
#[test]
fn names_accumulate_move_and_are_normalized() {
    let img = image();
    let mut other = image();
    let mut cfg: serde_json::Value = serde_json::from_slice(&img.config).unwrap();
    cfg["config"]["Env"] = json!(["PATH=/bin"]);
    other.config = serde_json::to_vec(&cfg).unwrap();
    let e = env("names");
    let (a_dir, b_dir) = (oci_dir(&e.base.join("a"), &img, |_| {}), oci_dir(&e.base.join("b"), &other, |_| {}));
    let sel = Selection { reference: None, platform: "linux/amd64".into() };
    let import =
        |dir: &Path, name: &str| e.store.import(dir, &sel, Some(name), &Budgets::default(), &mut |_| {}).unwrap();
    let a = import(&a_dir, "app:1");
    import(&a_dir, "first");
    for name in ["app:1", "docker.io/library/app:1", "first", "first:latest", "docker.io/library/first:latest"] {
        assert_eq!(e.store.find(name).unwrap().image_id, a.image_id, "{name} names the first image");
    }
    let b = import(&b_dir, "app:1");
    assert_ne!(a.image_id, b.image_id);
    assert_eq!(e.store.find("app:1").unwrap().image_id, b.image_id, "the name moved to the new image");
    let a_now = e.store.find("first").unwrap();
    assert!(!a_now.references.iter().any(|r| r.contains("app:1")), "{:?}", a_now.references);
    import(&b_dir, "app:1");
    let b_now = e.store.find("app:1").unwrap();
    assert_eq!(
        b_now.references.iter().filter(|r| *r == "docker.io/library/app:1").count(),
        1,
        "{:?}",
        b_now.references
    );
    for (given, normal) in [
        ("app", "docker.io/library/app:latest"),
        ("user/app:2", "docker.io/user/app:2"),
        ("localhost:5000/app", "localhost:5000/app:latest"),
        ("registry.example.com/team/app:3", "registry.example.com/team/app:3"),
        ("app@sha256:abc", "docker.io/library/app@sha256:abc"),
    ] {
        assert_eq!(chio_supervisor::image::store::normalize_reference(given), normal);
    }
}

/// What is not an image is named as such (never raw bytes of it on the terminal); a truncated
/// archive is called truncated; a gzip- or zstd-compressed `docker save` imports as itself.
#[test]
fn wrong_inputs_are_named_and_compressed_archives_import() {
    let img = image();
    let e = env("inputs");
    for (name, bytes) in [
        ("text.txt", b"hello world\n".to_vec()),
        ("random.bin", (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect()),
    ] {
        let p = e.base.join(name);
        std::fs::write(&p, bytes).unwrap();
        let err = e.import(&p).unwrap_err().to_string();
        assert!(err.contains("is not an image"), "{name}: {err}");
        assert!(err.chars().all(|c| !c.is_control()), "{name}: {err:?}");
    }
    let archive = legacy(&e.base.join("legacy"), &img);
    let bytes = std::fs::read(&archive).unwrap();
    let cut = e.base.join("truncated.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = e.import(&cut).unwrap_err().to_string();
    assert!(err.contains("ends early") || err.contains("damaged"), "{err}");
    e.empty();
    let plain = e.import(&archive).unwrap();
    for (name, packed) in [("save.tar.gz", gzip(&bytes)), ("save.tar.zst", zstd(&bytes))] {
        let p = e.base.join(name);
        std::fs::write(&p, packed).unwrap();
        let r = e.import(&p).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(r.image_id, plain.image_id, "{name}");
    }
    assert_eq!(std::fs::read_dir(e.base.join("state/tmp")).unwrap().count(), 0, "the decompressed copy is removed");
}

/// A descriptor's digest must be `sha256:` and 64 hex digits before it names a file: anything
/// else (here 64 characters that would climb out of `blobs/`) is refused, not looked up.
#[test]
fn a_digest_that_is_not_hex_never_names_a_file() {
    let img = image();
    let e = env("digest-form");
    let climbing = format!("sha256:{}", "../".repeat(21) + "x");
    let dir = oci_dir(&e.base.join("oci"), &img, |m| m["config"]["digest"] = json!(climbing));
    let err = e.import(&dir).unwrap_err().to_string();
    // oci-spec refuses it as it parses the manifest; `verified_blob` would refuse it again.
    assert!(err.contains("Invalid encoded value") || err.contains("unsupported digest"), "{err}");
    e.empty();
}

/// A config blob is read into memory only up to 8 MiB: one byte more is refused before it is
/// read; exactly 8 MiB (the same config padded with spaces) imports.
#[test]
fn a_config_blob_is_bounded_at_eight_mib() {
    let pad = |img: &mut Image, len: usize| {
        let mut c = image().config;
        c.resize(len, b' ');
        img.config = c;
    };
    let e = env("config-big");
    let mut img = image();
    pad(&mut img, (8 << 20) + 1);
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    let err = e.import(&dir).unwrap_err().to_string();
    assert!(err.contains("exceeds the limit"), "{err}");
    e.empty();
    let e = env("config-exact");
    let mut img = image();
    pad(&mut img, 8 << 20);
    let dir = oci_dir(&e.base.join("oci"), &img, |_| {});
    e.import(&dir).unwrap();
}

/// Two images with the same layers (another config) share one root filesystem: removing one
/// keeps the tree the other still uses; removing the last collects it. An image with other
/// layers beside them changes neither.
#[test]
fn a_shared_root_filesystem_outlives_all_but_its_last_image() {
    let e = env("shared-rootfs");
    let img = image();
    let mut twin = image();
    let mut config: serde_json::Value = serde_json::from_slice(&twin.config).unwrap();
    config["config"]["WorkingDir"] = json!("/elsewhere");
    twin.config = serde_json::to_vec(&config).unwrap();
    let other = {
        let l = layer(&[("other", "x")]);
        let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&l))]}}))
        .unwrap();
        Image { layers_blob: vec![gzip(&l)], layers_plain: vec![l], config }
    };
    let a = e.import(&oci_dir(&e.base.join("a"), &img, |_| {})).unwrap();
    let b = e.import(&oci_dir(&e.base.join("b"), &twin, |_| {})).unwrap();
    let c = e.import(&oci_dir(&e.base.join("c"), &other, |m| m["layers"].as_array_mut().unwrap().truncate(1))).unwrap();
    assert_ne!(a.image_id, b.image_id);
    assert_eq!(e.store.rootfs(&a), e.store.rootfs(&b), "one tree for the same layers");
    assert!(!e.store.remove(&a).unwrap(), "the twin still uses the tree");
    assert!(e.store.rootfs(&b).join("usr/bin/tool").exists());
    assert!(e.store.remove(&b).unwrap(), "its last image: collected");
    assert!(!e.store.rootfs(&b).exists());
    assert!(e.store.rootfs(&c).join("other").exists(), "another image's tree is untouched");
    assert!(e.store.remove(&c).unwrap());
    e.empty();
}

/// An image is found by a reference, its full ID or a prefix of at least 12 hex digits — never
/// by an ID it does not have, nor by a shorter prefix, even when it is the only image.
#[test]
fn an_image_is_found_only_by_what_names_it() {
    let e = env("find");
    let rec = e.import(&oci_dir(&e.base.join("oci"), &image(), |_| {})).unwrap();
    let id = rec.image_id.strip_prefix("sha256:").unwrap().to_string();
    for good in [rec.image_id.clone(), id.clone(), id[..12].to_string(), "app:1".to_string()] {
        assert_eq!(e.store.find(&good).unwrap().image_id, rec.image_id, "{good}");
    }
    let other = if id.starts_with('0') { "1" } else { "0" }.repeat(64);
    for bad in [other.as_str(), &id[..11], "nope:1"] {
        let err = e.store.find(bad).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{bad}: {err}");
        assert!(err.to_string().contains("no image named"), "{bad}: {err}");
    }
}

/// An index listing the same reference for two platforms: the one asked for is imported (the
/// host's by default), a bare architecture never matches a longer one, and a variant asked for
/// without one in the index matches nothing.
#[test]
fn the_platform_asked_for_is_the_one_imported() {
    let e = env("platforms");
    let dir = oci_dir(&e.base.join("oci"), &image(), |_| {});
    let blobs = dir.join("blobs/sha256");
    let l = layer(&[("usr/bin/tool", "arm")]);
    let blob = gzip(&l);
    let config = serde_json::to_vec(&json!({"architecture": "arm64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", hex(&l))]}}))
    .unwrap();
    let manifest =
        serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": desc("application/vnd.oci.image.config.v1+json", &config),
        "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", &blob)]}))
        .unwrap();
    for data in [&blob, &config, &manifest] {
        std::fs::write(blobs.join(hex(data)), data).unwrap();
    }
    let mut index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let mut arm = desc("application/vnd.oci.image.manifest.v1+json", &manifest);
    arm["annotations"] = json!({"org.opencontainers.image.ref.name": "app:1"});
    arm["platform"] = json!({"os": "linux", "architecture": "arm64"});
    index["manifests"].as_array_mut().unwrap().push(arm);
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    let import = |platform: &str| {
        let sel = Selection { reference: Some("app:1".into()), platform: platform.into() };
        e.store.import(&dir, &sel, None, &Budgets::default(), &mut |_| {})
    };
    let tool = |rec: &chio_supervisor::image::store::ImageRecord| {
        std::fs::read_to_string(e.store.rootfs(rec).join("usr/bin/tool")).unwrap()
    };
    assert_eq!(tool(&import("linux/arm64").unwrap()), "arm");
    assert_eq!(tool(&import("linux/amd64").unwrap()), "v2");
    for none in ["linux/arm", "linux/amd64/v2", "windows/amd64"] {
        let err = import(none).unwrap_err().to_string();
        assert!(err.contains(&format!("no image for platform {none}")), "{none}: {err}");
    }
}
