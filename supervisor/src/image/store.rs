//! The image store under a state directory (mode 0700): `images/<id>.json` per image,
//! `rootfs/<chain-id>/` one flattened tree per ChainID (shared by images with the same layers),
//! `tmp/` for extractions in progress, renamed into place only when complete — a crash or a
//! refusal leaves nothing half-imported. One import at a time (an exclusive lock file). Each image
//! records a digest of its extracted tree so `verify` can detect later tampering.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::extract::{self, Budgets, LayerReport, Totals};
use super::import::{self, Hashing, ImportError, Selection};
use super::pipeline::{self, LayerDigests, StreamError};
use super::source::Source;

/// One layer as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    /// Compressed blob digest (OCI) or null (legacy `docker save`).
    pub digest: Option<String>,
    /// Uncompressed DiffID.
    pub diff_id: String,
    /// Bytes read from the source.
    pub size: u64,
}

/// An imported image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// `sha256:` of the config: the image ID.
    pub image_id: String,
    /// References (tags) and the `--name` given at import.
    pub references: Vec<String>,
    /// `os/arch[/variant]`.
    pub platform: String,
    /// Entrypoint, Cmd, Env, WorkingDir, User from the config.
    pub config: Value,
    /// Layers, bottom first.
    pub layers: Vec<LayerRecord>,
    /// ChainID of the top layer: the flattened tree's name.
    pub chain_id: String,
    /// Digest of the extracted tree.
    pub tree_sha256: String,
    /// Files kept with setuid/setgid bits (the cage mounts nosuid).
    pub setuid: Vec<String>,
    /// Device nodes and FIFOs that were not created.
    pub skipped: Vec<String>,
}

/// The store.
pub struct ImageStore {
    dir: PathBuf,
}

fn hex_of(d: &str) -> &str {
    d.strip_prefix("sha256:").unwrap_or(d)
}

/// ChainIDs of a layer stack (OCI image spec): ChainID(L0) = DiffID(L0),
/// ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln)).
pub fn chain_id(diff_ids: &[String]) -> Option<String> {
    let mut it = diff_ids.iter();
    let mut chain = it.next()?.clone();
    for d in it {
        let mut h = Sha256::new();
        h.update(format!("{chain} {d}").as_bytes());
        chain = import::digest_text(h);
    }
    Some(chain)
}

impl ImageStore {
    /// Open (creating) the store at `dir`, mode 0700.
    pub fn open(dir: &Path) -> io::Result<ImageStore> {
        if dir.exists() && !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the state directory {} is not a directory", dir.display()),
            ));
        }
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        // The images' trees are what cages run on: no one but root may be able to replace them.
        let dir = chio_cage::path::private_dir(dir)?;
        for sub in ["images", "rootfs", "tmp"] {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir.join(sub))?;
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        Ok(ImageStore { dir })
    }

    /// Open an existing store without creating or changing anything (for the read-only
    /// commands); a missing directory is a store with no image.
    pub fn open_existing(dir: &Path) -> io::Result<ImageStore> {
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(ImageStore { dir: chio_cage::path::private_dir(dir)? }),
            Ok(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a directory", dir.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(ImageStore { dir: dir.to_path_buf() }),
            Err(e) => Err(e),
        }
    }

    /// Path of an image's root filesystem.
    pub fn rootfs(&self, rec: &ImageRecord) -> PathBuf {
        self.dir.join("rootfs").join(hex_of(&rec.chain_id))
    }

    fn lock(&self) -> io::Result<fs::File> {
        let f = fs::OpenOptions::new().create(true).truncate(false).write(true).open(self.dir.join("lock"))?;
        // Raw flock(2), released when the file is closed: std's File::lock is newer than our
        // MSRV, and nix's Flock unlocks on drop, which would end a lock inherited copies hold.
        // SAFETY: flock on our own open file.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f)
    }

    /// Import the image at `path`, telling `progress` how it goes.
    pub fn import(
        &self,
        path: &Path,
        sel: &Selection,
        name: Option<&str>,
        budgets: &Budgets,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<ImageRecord, ImportError> {
        let _lock = self.lock()?;
        // A compressed `docker save` (docker load takes one) is decompressed once into the
        // store's tmp/, bounded like a layer, and read from there.
        let inflated = match crate::image::source::compression(path)? {
            Some(kind) => Some(self.inflate(path, kind, budgets.max_bytes)?),
            None => None,
        };
        let src = Source::open(inflated.as_ref().map_or(path, |t| t.0.as_path()))?;
        let res = import::resolve(&src, sel)?;
        let sizes: io::Result<Vec<u64>> = res.layers.iter().map(|l| src.size(&l.name)).collect();
        progress(Progress::Start {
            image_id: &res.image_id,
            layers: res.layers.len(),
            total_bytes: sizes?.iter().sum(),
        });
        let ids: Vec<String> = res.layers.iter().map(|l| l.diff_id.clone()).collect();
        let chain = chain_id(&ids).ok_or_else(|| ImportError::Invalid("an image without layers".into()))?;
        let target = self.dir.join("rootfs").join(hex_of(&chain));
        let records = self.list()?;
        let vouching = records.iter().find(|r| r.chain_id == chain).cloned();
        let recorded = vouching.as_ref().map(|r| r.tree_sha256.clone());
        if recorded.is_none() && target.is_dir() {
            // A tree no image record vouches for (an import that died between its rename and
            // its record): it cannot be verified, so it is extracted again.
            fs::remove_dir_all(&target)?;
        }
        let present = recorded.is_some() && target.is_dir();
        let tmp = self.dir.join("tmp").join(format!("{}-{}", hex_of(&chain), std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::DirBuilder::new().mode(0o755).create(&tmp)?;
        let outcome = if present {
            self.verify_present(&src, &res, &records, &target, recorded.as_deref().unwrap_or_default(), progress)
        } else {
            self.stream_layers(&src, &res, Some(&tmp), budgets, progress).and_then(|(layers, report)| {
                fs::rename(&tmp, &target)?;
                // The content digests taken while writing stand in for reading the tree back.
                let tree = tree_digest_with(&target, Some(&report.content))?;
                Ok((layers, report, tree))
            })
        };
        let _ = fs::remove_dir_all(&tmp);
        let (layers, report, tree) = outcome?;
        let c = &res.config["config"];
        // Names accumulate like `docker load` tags: the image keeps the names it had, gains the
        // new ones, and a name that named another image moves here (never two images under one
        // name).
        let mut references: Vec<String> =
            records.iter().filter(|r| r.image_id == res.image_id).flat_map(|r| r.references.clone()).collect();
        references
            .extend(res.references.iter().chain(name.map(str::to_string).as_ref()).map(|r| normalize_reference(r)));
        let mut seen = HashSet::new();
        references.retain(|r| seen.insert(r.clone()));
        self.take_names(&records, &res.image_id, &references)?;
        let rec = ImageRecord {
            image_id: res.image_id.clone(),
            references,
            platform: format!(
                "{}/{}",
                res.config["os"].as_str().unwrap_or("?"),
                res.config["architecture"].as_str().unwrap_or("?")
            ),
            config: serde_json::json!({
                "Entrypoint": c["Entrypoint"], "Cmd": c["Cmd"], "Env": c["Env"], "WorkingDir": c["WorkingDir"], "User": c["User"],
            }),
            layers,
            chain_id: chain,
            tree_sha256: tree,
            // A present tree was not extracted now: what its extraction found still holds.
            setuid: match &vouching {
                Some(v) if present => v.setuid.clone(),
                _ => report.setuid,
            },
            skipped: match &vouching {
                Some(v) if present => v.skipped.clone(),
                _ => report.skipped_devices.into_iter().chain(report.skipped_fifos).collect(),
            },
        };
        let meta = self.dir.join("images").join(format!("{}.json", hex_of(&rec.image_id)));
        let tmp_meta = meta.with_extension("json.tmp");
        fs::write(&tmp_meta, serde_json::to_vec_pretty(&rec).map_err(|e| ImportError::Invalid(e.to_string()))?)?;
        fs::rename(&tmp_meta, &meta)?;
        progress(Progress::Done { image_id: &rec.image_id, already_present: present });
        Ok(rec)
    }

    /// Re-import of an image whose tree is present: verify the layers (a blob whose digest an
    /// earlier import already tied to this DiffID needs only its digest checked — content
    /// addressing — the others are decompressed and hashed) and, on another CPU meanwhile,
    /// that the tree still has the digest recorded when it was extracted.
    fn verify_present(
        &self,
        src: &Source,
        res: &import::Resolved,
        records: &[ImageRecord],
        target: &Path,
        recorded: &str,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<(Vec<LayerRecord>, LayerReport, String), ImportError> {
        let verified: HashSet<(&str, &str)> = records
            .iter()
            .flat_map(|r| r.layers.iter())
            .filter_map(|l| Some((l.digest.as_deref()?, l.diff_id.as_str())))
            .collect();
        let (layers, tree) = std::thread::scope(|scope| {
            let tree = scope.spawn(|| tree_digest_with(target, None));
            let layers = self.verify_layers(src, res, &verified, progress);
            (layers, tree.join().unwrap_or_else(|_| Err(io::Error::other("the tree digest panicked"))))
        });
        let (layers, report) = layers?;
        let tree = tree?;
        if tree != recorded {
            return Err(ImportError::Digest(format!(
                "the stored tree {} was modified after it was extracted (digest {tree}, recorded {recorded}); \
                 `chio image verify` names the images using it, `chio image rm` them and import again",
                target.display()
            )));
        }
        Ok((layers, report, tree))
    }

    /// Verify every layer without extracting: blobs already tied to their DiffID by an earlier
    /// import are only hashed; the others are streamed in full.
    fn verify_layers(
        &self,
        src: &Source,
        res: &import::Resolved,
        verified: &HashSet<(&str, &str)>,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<(Vec<LayerRecord>, LayerReport), ImportError> {
        let known = |l: &import::LayerRef| {
            l.blob.as_ref().is_some_and(|(d, _)| verified.contains(&(d.as_str(), l.diff_id.as_str())))
        };
        if !res.layers.iter().all(known) {
            return self.stream_layers(src, res, None, &Budgets::default(), progress);
        }
        let mut out = Vec::new();
        let mut done = 0;
        for (i, layer) in res.layers.iter().enumerate() {
            let (digest, size) = Hashing::new(src.read(&layer.name)?).finish()?;
            done += size;
            progress(Progress::Bytes { done });
            import::check_blob(i, (&digest, size), layer.blob.as_ref())?;
            progress(Progress::Layer { index: i + 1, count: res.layers.len(), diff_id: &layer.diff_id });
            out.push(LayerRecord { digest: Some(digest), diff_id: layer.diff_id.clone(), size });
        }
        Ok((out, LayerReport::default()))
    }

    /// Stream every layer once: compressed digest, decompression, DiffID, and (with `into`)
    /// extraction. Without `into` the layers are only verified.
    fn stream_layers(
        &self,
        src: &Source,
        res: &import::Resolved,
        into: Option<&Path>,
        budgets: &Budgets,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<(Vec<LayerRecord>, LayerReport), ImportError> {
        let root = match into {
            Some(p) => Some(fs::File::open(p)?),
            None => None,
        };
        let mut totals = Totals::default();
        let mut report = LayerReport::default();
        let mut out = Vec::new();
        let mut before = 0u64; // blob bytes of the layers already done
        let mut next_report = 0u64;
        for (i, layer) in res.layers.iter().enumerate() {
            let mut bytes = |n: u64| {
                if before + n >= next_report {
                    progress(Progress::Bytes { done: before + n });
                    next_report = before + n + (1 << 20);
                }
            };
            let streamed = pipeline::stream_layer(src, &layer.name, budgets.max_bytes, &mut bytes, |tar| match &root {
                Some(dir) => extract::apply_layer(dir.as_fd(), tar, budgets, &mut totals).map(Some),
                None => io::copy(tar, &mut io::sink())
                    .map(|_| None)
                    .map_err(|err| extract::ExtractError::Io { path: String::new(), err }),
            });
            let (extracted, digests) = streamed.map_err(|e| match e {
                StreamError::Consumer(e) => ImportError::Invalid(format!("layer {i} ({}): {e}", layer.name)),
                StreamError::Source(e) => {
                    ImportError::Io(io::Error::new(e.kind(), format!("layer {i} ({}): {e}", layer.name)))
                }
            })?;
            if let Some(r) = extracted {
                report.setuid.extend(r.setuid);
                report.content.extend(r.content);
                report.skipped_devices.extend(r.skipped_devices);
                report.skipped_fifos.extend(r.skipped_fifos);
            }
            let LayerDigests { blob: (blob_digest, blob_size), diff_id: (diff_id, _) } = digests;
            before += blob_size;
            progress(Progress::Bytes { done: before }); // the layer's last bytes, unthrottled
            import::check_blob(i, (&blob_digest, blob_size), layer.blob.as_ref())?;
            if diff_id != layer.diff_id {
                return Err(ImportError::Digest(format!(
                    "layer {i}: uncompressed digest {diff_id} is not the config's diff_id {} (corrupt, or layers out of order)",
                    layer.diff_id
                )));
            }
            progress(Progress::Layer { index: i + 1, count: res.layers.len(), diff_id: &diff_id });
            out.push(LayerRecord { digest: layer.blob.as_ref().map(|b| b.0.clone()), diff_id, size: blob_size });
        }
        Ok((out, report))
    }

    /// Remove `names` from every image but `keep` (rewriting their records).
    fn take_names(&self, records: &[ImageRecord], keep: &str, names: &[String]) -> io::Result<()> {
        for r in records.iter().filter(|r| r.image_id != keep && r.references.iter().any(|n| names.contains(n))) {
            let mut r = r.clone();
            r.references.retain(|n| !names.contains(n));
            let meta = self.dir.join("images").join(format!("{}.json", hex_of(&r.image_id)));
            let tmp = meta.with_extension("json.tmp");
            fs::write(&tmp, serde_json::to_vec_pretty(&r).map_err(io::Error::other)?)?;
            fs::rename(&tmp, &meta)?;
        }
        Ok(())
    }

    /// Every imported image.
    pub fn list(&self) -> io::Result<Vec<ImageRecord>> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(self.dir.join("images")) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            r => r?,
        };
        for e in entries {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "json") {
                let rec: ImageRecord = serde_json::from_slice(&fs::read(&p)?)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display())))?;
                out.push(rec);
            }
        }
        out.sort_by(|a, b| a.image_id.cmp(&b.image_id));
        Ok(out)
    }

    /// The image named by a reference, a full ID, or an unambiguous ID prefix (12+ hex digits).
    pub fn find(&self, what: &str) -> io::Result<ImageRecord> {
        let all = self.list()?;
        let full = normalize_reference(what);
        let by_ref: Vec<&ImageRecord> =
            all.iter().filter(|r| r.references.iter().any(|n| *n == full || n == what)).collect();
        let hex = hex_of(what);
        let by_id: Vec<&ImageRecord> =
            all.iter().filter(|r| hex.len() >= 12 && hex_of(&r.image_id).starts_with(hex)).collect();
        match (by_ref.as_slice(), by_id.as_slice()) {
            ([one], _) | ([], [one]) => Ok((*one).clone()),
            ([], []) => {
                Err(io::Error::new(io::ErrorKind::NotFound, format!("no image named {what:?} (see chio image list)")))
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what:?} names several images; use the full image ID"),
            )),
        }
    }

    /// Recompute the tree digest of an image's rootfs: true when it is unchanged since import.
    pub fn verify(&self, rec: &ImageRecord) -> io::Result<bool> {
        Ok(tree_digest(&self.rootfs(rec))? == rec.tree_sha256)
    }

    /// Decompress `path` into tmp/, at most `max` bytes.
    fn inflate(&self, path: &Path, kind: &str, max: u64) -> Result<TempFile, ImportError> {
        let out = TempFile(self.dir.join("tmp").join(format!("archive-{}.tar", std::process::id())));
        let input = io::BufReader::new(fs::File::open(path)?);
        let mut reader: Box<dyn io::Read> = match kind {
            "gzip" => Box::new(flate2::read::MultiGzDecoder::new(input)),
            _ => Box::new(zstd::stream::read::Decoder::new(input)?),
        };
        let mut file =
            std::os::unix::fs::OpenOptionsExt::mode(fs::OpenOptions::new().write(true).create_new(true), 0o600)
                .open(&out.0)?;
        let n = io::copy(&mut io::Read::take(&mut reader, max + 1), &mut file)
            .map_err(|e| ImportError::Invalid(format!("{} ({kind}) does not decompress: {e}", path.display())))?;
        if n > max {
            return Err(ImportError::Invalid(format!(
                "{} decompresses to more than {max} bytes (--max-bytes)",
                path.display()
            )));
        }
        Ok(out)
    }

    /// Hold an image's root filesystem for a launch: a shared lock on its directory, released
    /// when the returned file is closed (by every process of the launch that inherited it). An
    /// image being removed cannot be held.
    pub fn hold(&self, rec: &ImageRecord) -> io::Result<fs::File> {
        let dir = fs::File::open(self.rootfs(rec))?;
        // SAFETY: flock on our own open directory fd (raw: see `lock`).
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&dir), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, format!("image {} is being removed", rec.image_id)));
        }
        Ok(dir)
    }

    /// Remove an image and any rootfs no other image uses. An image whose root filesystem a
    /// running launch holds is refused, naming the launch's processes.
    pub fn remove(&self, rec: &ImageRecord) -> io::Result<bool> {
        let _lock = self.lock()?;
        let rootfs = fs::File::open(self.rootfs(rec))?;
        // SAFETY: flock on our own open directory fd; held until the removal is done (raw: see
        // `lock`).
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&rootfs), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let users = lock_holders(&rootfs);
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("image {} is in use by a running launch ({users}); stop it first", rec.image_id),
            ));
        }
        fs::remove_file(self.dir.join("images").join(format!("{}.json", hex_of(&rec.image_id))))?;
        let still_used = self.list()?.iter().any(|r| r.chain_id == rec.chain_id);
        if !still_used {
            fs::remove_dir_all(self.rootfs(rec))?;
        }
        Ok(!still_used)
    }
}

/// A reference in the docker CLI's normal form: `app` is `docker.io/library/app:latest`,
/// `user/app:1` is `docker.io/user/app:1`; a first component with a `.` or `:` (or `localhost`)
/// is a registry and is kept; a digest reference keeps its digest.
pub fn normalize_reference(r: &str) -> String {
    let (name, suffix) = match r.split_once('@') {
        Some((n, d)) => (n, format!("@{d}")),
        None => match r.rfind(':') {
            Some(i) if !r[i..].contains('/') => (&r[..i], r[i..].to_string()),
            _ => (r, ":latest".to_string()),
        },
    };
    let registry = name.split_once('/').is_some_and(|(first, _)| first.contains(['.', ':']) || first == "localhost");
    let full = match (registry, name.contains('/')) {
        (true, _) => name.to_string(),
        (false, true) => format!("docker.io/{name}"),
        (false, false) => format!("docker.io/library/{name}"),
    };
    format!("{full}{suffix}")
}

/// A file removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// The processes holding a lock on `f`'s inode, from /proc/locks: "pid N (command)".
fn lock_holders(f: &fs::File) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = f.metadata() else { return "unknown processes".into() };
    let suffix = format!(":{}", m.ino());
    let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
    let pids: Vec<String> = locks
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  READ 1234 fd:01:5678 0 EOF" (a "->" marks a waiter).
            let (pid, id) = if w.get(1) == Some(&"->") { (w.get(5)?, w.get(6)?) } else { (w.get(4)?, w.get(5)?) };
            id.ends_with(&suffix).then(|| {
                let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmd: String = String::from_utf8_lossy(&cmd).replace('\0', " ").chars().take(80).collect();
                format!("pid {pid}: {}", cmd.trim())
            })
        })
        .collect();
    if pids.is_empty() {
        "unknown processes".into()
    } else {
        pids.join("; ")
    }
}

/// SHA-256 over every entry of a tree (sorted path, type, mode, owner, size, content digest or
/// link target), never following a symlink.
pub fn tree_digest(root: &Path) -> io::Result<String> {
    tree_digest_with(root, None)
}

/// [`tree_digest`], taking regular files' content digests from `known` (by inode) when given.
fn tree_digest_with(root: &Path, known: Option<&HashMap<u64, [u8; 32]>>) -> io::Result<String> {
    let mut h = Sha256::new();
    walk(root, Path::new(""), &mut h, known)?;
    Ok(import::digest_text(h))
}

fn walk(root: &Path, rel: &Path, h: &mut Sha256, known: Option<&HashMap<u64, [u8; 32]>>) -> io::Result<()> {
    let mut names: Vec<_> =
        fs::read_dir(root.join(rel))?.map(|e| e.map(|e| e.file_name())).collect::<Result<_, _>>()?;
    names.sort();
    for name in names {
        let p = rel.join(&name);
        let full = root.join(&p);
        let m = fs::symlink_metadata(&full)?;
        h.update(format!("{}\0{:o}\0{}\0{}\0{}\0", p.display(), m.mode(), m.uid(), m.gid(), m.size()).as_bytes());
        if m.file_type().is_symlink() {
            h.update(fs::read_link(&full)?.as_os_str().as_encoded_bytes());
        } else if m.is_file() {
            match known.and_then(|k| k.get(&m.ino())) {
                Some(d) => h.update(d),
                None => {
                    let mut f = fs::File::open(&full)?;
                    let mut fh = Sha256::new();
                    io::copy(&mut f, &mut fh)?;
                    h.update(fh.finalize());
                }
            }
        } else if m.is_dir() {
            walk(root, &p, h, known)?;
        }
        h.update(b"\n");
    }
    Ok(())
}

/// What an import reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// The image is resolved: its ID, its layer count and the size of all layer blobs.
    Start {
        /// Config digest.
        image_id: &'a str,
        /// Number of layers.
        layers: usize,
        /// Bytes of layer blobs to read (compressed, as stored).
        total_bytes: u64,
    },
    /// Layer blob bytes read so far, all layers together (about every MiB).
    Bytes {
        /// Bytes read.
        done: u64,
    },
    /// One layer verified (and extracted, unless its tree was already present).
    Layer {
        /// 1-based position.
        index: usize,
        /// Number of layers.
        count: usize,
        /// The verified DiffID.
        diff_id: &'a str,
    },
    /// The image is in the store.
    Done {
        /// Config digest.
        image_id: &'a str,
        /// Its tree was already extracted and was only verified.
        already_present: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OCI image spec's ChainID: the first layer's DiffID, then the digest of the previous
    /// ChainID, a space, and the next DiffID (the vector computed here with sha256sum).
    #[test]
    fn chain_ids_follow_the_image_spec() {
        let l0 = format!("sha256:{}", "a".repeat(64));
        let l1 = format!("sha256:{}", "b".repeat(64));
        assert_eq!(chain_id(&[]), None);
        assert_eq!(chain_id(std::slice::from_ref(&l0)), Some(l0.clone()));
        // printf 'sha256:aaa…a sha256:bbb…b' | sha256sum
        let want = "sha256:ccd722928bd92476ba1745586fed6e45a102504185ad88cd89e01ff116fd146c";
        assert_eq!(chain_id(&[l0.clone(), l1.clone()]).unwrap(), want);
        assert_ne!(chain_id(&[l1, l0]).unwrap(), want, "the order of layers matters");
    }
}
