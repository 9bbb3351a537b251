//! Reading an image out of a [`Source`]: find the manifest (OCI layout, Docker 25+ `docker save`
//! with an OCI layout inside, or a legacy `docker save`), verify every blob's size and SHA-256 and
//! the manifest's media type against its descriptor, and check the layer list against the config's
//! `rootfs.diff_ids`. Layers are then streamed once: compressed digest, decompression (sniffed from
//! magic bytes: gzip with a multi-member decoder, zstd, or plain), DiffID, and extraction together.

use std::io::{self, BufRead, BufReader, Read};

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::source::Source;

/// OCI/Docker media types we read.
const INDEX_TYPES: [&str; 2] =
    ["application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"];
const MANIFEST_TYPES: [&str; 2] =
    ["application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"];

/// Why an import was refused.
#[derive(Debug)]
pub enum ImportError {
    /// The input is not an image we understand, or is inconsistent.
    Invalid(String),
    /// A blob's size or digest does not match its descriptor.
    Digest(String),
    /// I/O error.
    Io(io::Error),
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImportError::Invalid(e) | ImportError::Digest(e) => write!(f, "{e}"),
            ImportError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ImportError {}

impl From<io::Error> for ImportError {
    fn from(e: io::Error) -> Self {
        ImportError::Io(e)
    }
}

fn invalid(s: impl Into<String>) -> ImportError {
    ImportError::Invalid(s.into())
}

/// Which image of an archive, and for which platform.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Reference (tag) to pick when the archive holds several images.
    pub reference: Option<String>,
    /// `os/arch[/variant]`.
    pub platform: String,
}

impl Selection {
    /// The host's platform.
    pub fn host_platform() -> String {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        format!("linux/{arch}")
    }
}

/// One layer to stream.
#[derive(Debug, Clone)]
pub struct LayerRef {
    /// File in the source.
    pub name: String,
    /// Compressed blob digest and size (OCI); legacy layers are only checked by DiffID.
    pub blob: Option<(String, u64)>,
    /// Expected `sha256:` DiffID of the uncompressed tar.
    pub diff_id: String,
}

/// A verified image description, before its layers are streamed.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// `sha256:<hex>` of the config blob: the image ID.
    pub image_id: String,
    /// The config document.
    pub config: Value,
    /// References (tags) naming it in the source.
    pub references: Vec<String>,
    /// Layers, bottom first.
    pub layers: Vec<LayerRef>,
}

fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sha256:<hex>` of a finished SHA-256: the form of every digest in image documents.
pub fn digest_text(hash: Sha256) -> String {
    format!("sha256:{}", hex(&hash.finalize()))
}

/// Refuse a layer blob whose digest or size is not its descriptor's (`want`, when it has one).
pub fn check_blob(i: usize, got: (&str, u64), want: Option<&(String, u64)>) -> Result<(), ImportError> {
    let (digest, size) = got;
    match want {
        Some((want, want_size)) if size != *want_size || digest != want => Err(ImportError::Digest(format!(
            "layer {i}: blob is {digest} ({size} bytes), descriptor says {want} ({want_size} bytes)"
        ))),
        _ => Ok(()),
    }
}

/// Read a small blob and check its size and digest.
fn verified_blob(src: &Source, digest: &str, size: Option<u64>) -> Result<Vec<u8>, ImportError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| invalid(format!("unsupported digest {digest:?}")))?;
    let name = format!("blobs/sha256/{hex}");
    let actual = src.size(&name)?;
    if let Some(want) = size {
        if actual != want {
            return Err(ImportError::Digest(format!("{digest}: {actual} bytes, descriptor says {want}")));
        }
    }
    if actual > super::source::MAX_JSON {
        return Err(invalid(format!("{digest}: {actual}-byte document exceeds the limit")));
    }
    let mut data = Vec::with_capacity(actual as usize);
    // Never more than the size checked above (a layout's file is opened again to be read).
    src.read(&name)?.take(actual).read_to_end(&mut data)?;
    if sha256_hex(&data) != hex {
        return Err(ImportError::Digest(format!("{digest}: content does not match its digest")));
    }
    Ok(data)
}

fn json(data: &[u8], what: &str) -> Result<Value, ImportError> {
    serde_json::from_slice(data).map_err(|e| invalid(format!("{what}: {e}")))
}

/// The image configuration's typed view (oci-spec), for its platform and layer list; the
/// document itself is kept as JSON for the store's record.
fn typed_config(data: &[u8], what: &str) -> Result<ImageConfiguration, ImportError> {
    serde_json::from_slice(data).map_err(|e| invalid(format!("{what}: not an image configuration: {e}")))
}

fn diff_ids(config: &ImageConfiguration) -> Vec<String> {
    config.rootfs().diff_ids().clone()
}

fn platform_text(os: &str, arch: &str, variant: Option<&String>) -> String {
    match variant {
        Some(var) => format!("{os}/{arch}/{var}"),
        None => format!("{os}/{arch}"),
    }
}

fn platform_of_config(c: &ImageConfiguration) -> String {
    platform_text(&c.os().to_string(), &c.architecture().to_string(), c.variant().as_ref())
}

fn platform_of_descriptor(d: &Descriptor) -> Option<String> {
    let p = d.platform().as_ref()?;
    Some(platform_text(&p.os().to_string(), &p.architecture().to_string(), p.variant().as_ref()))
}

fn platform_matches(have: &str, want: &str) -> bool {
    have == want || (want.matches('/').count() == 1 && have.starts_with(&format!("{want}/")))
}

/// Find and verify the image in `src`.
pub fn resolve(src: &Source, sel: &Selection) -> Result<Resolved, ImportError> {
    if src.exists("index.json")? && src.exists("oci-layout")? {
        resolve_oci(src, sel)
    } else if src.exists("manifest.json")? {
        resolve_legacy(src, sel)
    } else {
        Err(invalid("not an OCI layout (no index.json and oci-layout) nor a docker save archive (no manifest.json)"))
    }
}

struct Candidate {
    manifest: ImageManifest,
    descriptor: Descriptor,
    refs: Vec<String>,
}

/// A descriptor's annotation `key`, if any.
fn annotation<'a>(d: &'a Descriptor, key: &str) -> Option<&'a str> {
    d.annotations().as_ref()?.get(key).map(String::as_str)
}

fn collect(
    src: &Source,
    descriptors: &[Descriptor],
    refs: &[String],
    out: &mut Vec<Candidate>,
    depth: u32,
) -> Result<(), ImportError> {
    if depth > 4 {
        return Err(invalid("image indexes nested too deeply"));
    }
    for d in descriptors {
        let media = d.media_type().to_string();
        let digest = d.digest().to_string();
        if annotation(d, "vnd.docker.reference.type") == Some("attestation-manifest") {
            continue;
        }
        let mut names = refs.to_vec();
        for key in ["org.opencontainers.image.ref.name", "io.containerd.image.name"] {
            if let Some(n) = annotation(d, key) {
                names.push(n.to_string());
            }
        }
        let hex = digest.trim_start_matches("sha256:");
        if !src.exists(&format!("blobs/sha256/{hex}"))? {
            // containerd-store exports omit blobs of other platforms.
            continue;
        }
        let blob = verified_blob(src, &digest, Some(d.size()))?;
        // The document's own mediaType decides how it is read; it must be the descriptor's.
        let doc = json(&blob, &digest)?;
        let actual_media = doc["mediaType"].as_str().unwrap_or(&media).to_string();
        if actual_media != media {
            return Err(invalid(format!("{digest}: descriptor says {media} but the document is {actual_media}")));
        }
        if INDEX_TYPES.contains(&actual_media.as_str()) {
            let inner: ImageIndex =
                serde_json::from_value(doc).map_err(|e| invalid(format!("{digest}: not an image index: {e}")))?;
            collect(src, inner.manifests(), &names, out, depth + 1)?;
        } else if MANIFEST_TYPES.contains(&actual_media.as_str()) {
            let manifest: ImageManifest =
                serde_json::from_value(doc).map_err(|e| invalid(format!("{digest}: not an image manifest: {e}")))?;
            out.push(Candidate { manifest, descriptor: d.clone(), refs: names });
        } else {
            return Err(invalid(format!("{digest}: unsupported media type {actual_media:?}")));
        }
    }
    Ok(())
}

fn resolve_oci(src: &Source, sel: &Selection) -> Result<Resolved, ImportError> {
    let index: ImageIndex =
        serde_json::from_value(src.json("index.json")?).map_err(|e| invalid(format!("index.json: {e}")))?;
    let mut candidates = Vec::new();
    collect(src, index.manifests(), &[], &mut candidates, 0)?;
    let mut chosen: Vec<(Candidate, Value, ImageConfiguration, String)> = Vec::new();
    for c in candidates {
        if let Some(r) = &sel.reference {
            if !c
                .refs
                .iter()
                .any(|n| n == r || n.ends_with(&format!(":{r}")) || n.rsplit_once('/').is_some_and(|(_, t)| t == r))
            {
                continue;
            }
        }
        let cfg_desc = c.manifest.config();
        let cfg_digest = cfg_desc.digest().to_string();
        let data = verified_blob(src, &cfg_digest, Some(cfg_desc.size()))?;
        let typed = typed_config(&data, &cfg_digest)?;
        let platform = platform_of_descriptor(&c.descriptor).unwrap_or_else(|| platform_of_config(&typed));
        if !platform_matches(&platform, &sel.platform) {
            continue;
        }
        chosen.push((c, json(&data, &cfg_digest)?, typed, cfg_digest));
    }
    let (c, config, typed, cfg_digest) = match chosen.len() {
        1 => chosen.remove(0),
        0 => {
            return Err(invalid(format!(
                "no image for platform {} {}",
                sel.platform,
                sel.reference.as_deref().map(|r| format!("and reference {r}")).unwrap_or_default()
            )))
        }
        n => return Err(invalid(format!("{n} images match; choose one with --ref"))),
    };
    let ids = diff_ids(&typed);
    let layer_descs = c.manifest.layers();
    if layer_descs.len() != ids.len() {
        return Err(invalid(format!(
            "manifest has {} layers but the config lists {} diff_ids",
            layer_descs.len(),
            ids.len()
        )));
    }
    let mut layers = Vec::new();
    for (d, diff_id) in layer_descs.iter().zip(ids) {
        let digest = d.digest().to_string();
        let hex = digest.strip_prefix("sha256:").ok_or_else(|| invalid(format!("unsupported digest {digest}")))?;
        layers.push(LayerRef { name: format!("blobs/sha256/{hex}"), blob: Some((digest.clone(), d.size())), diff_id });
    }
    Ok(Resolved { image_id: cfg_digest, config, references: c.refs, layers })
}

fn resolve_legacy(src: &Source, sel: &Selection) -> Result<Resolved, ImportError> {
    let manifest = src.json("manifest.json")?;
    let entries = manifest.as_array().ok_or_else(|| invalid("manifest.json is not a list"))?;
    let matching: Vec<&Value> = entries
        .iter()
        .filter(|e| match &sel.reference {
            None => true,
            Some(r) => e["RepoTags"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .any(|t| t == r || t.ends_with(&format!(":{r}")) || t.starts_with(&format!("{r}:"))),
        })
        .collect();
    let entry = match matching.len() {
        1 => matching[0],
        0 => return Err(invalid("no image in manifest.json matches")),
        n => return Err(invalid(format!("{n} images in manifest.json; choose one with --ref"))),
    };
    let cfg_name = entry["Config"].as_str().ok_or_else(|| invalid("manifest.json entry without Config"))?;
    let size = src.size(cfg_name)?;
    if size > super::source::MAX_JSON {
        return Err(invalid("config too large"));
    }
    let mut data = Vec::new();
    src.read(cfg_name)?.take(size).read_to_end(&mut data)?;
    let image_id = format!("sha256:{}", sha256_hex(&data));
    // The config's file name is its digest: check it.
    let named = cfg_name.trim_end_matches(".json").rsplit('/').next().unwrap_or_default();
    if named.len() == 64 && format!("sha256:{named}") != image_id {
        return Err(ImportError::Digest(format!("{cfg_name}: content does not match its name")));
    }
    let config = json(&data, cfg_name)?;
    let typed = typed_config(&data, cfg_name)?;
    let platform = platform_of_config(&typed);
    if !platform_matches(&platform, &sel.platform) {
        return Err(invalid(format!("the image is for {platform}, not {}", sel.platform)));
    }
    let ids = diff_ids(&typed);
    let names: Vec<String> =
        entry["Layers"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect();
    if names.len() != ids.len() {
        return Err(invalid(format!(
            "manifest.json lists {} layers but the config lists {} diff_ids",
            names.len(),
            ids.len()
        )));
    }
    let references =
        entry["RepoTags"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect();
    let layers = names.into_iter().zip(ids).map(|(name, diff_id)| LayerRef { name, blob: None, diff_id }).collect();
    Ok(Resolved { image_id, config, references, layers })
}

/// A reader that hashes and counts what passes through.
pub struct Hashing<R> {
    inner: R,
    hash: Sha256,
    /// Bytes read so far.
    pub count: u64,
}

impl<R: Read> Hashing<R> {
    /// Wrap `inner`.
    pub fn new(inner: R) -> Self {
        Hashing { inner, hash: Sha256::new(), count: 0 }
    }

    /// Read to the end (so the digest covers everything) and return `sha256:<hex>`.
    pub fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((digest_text(self.hash), self.count))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// A decompressing reader chosen from the stream's magic bytes.
pub fn decompress<'a, R: Read + 'a>(raw: R) -> io::Result<Box<dyn Read + 'a>> {
    let mut buf = BufReader::new(raw);
    let magic = buf.fill_buf()?.get(..4).map(<[u8]>::to_vec).unwrap_or_default();
    Ok(match magic.as_slice() {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::MultiGzDecoder::new(buf)),
        [0x28, 0xb5, 0x2f, 0xfd] => Box::new(zstd::stream::read::Decoder::with_buffer(buf)?),
        // zstd skippable frames: 0x184D2A50..=0x184D2A5F, little endian.
        [b0, 0x2a, 0x4d, 0x18] if b0 & 0xf0 == 0x50 => Box::new(zstd::stream::read::Decoder::with_buffer(buf)?),
        _ => Box::new(buf),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob is named by a SHA-256 digest of exactly 64 hex digits and nothing else: a
    /// descriptor's digest becomes a path in the layout, so nothing but hex may reach it.
    #[test]
    fn a_blob_digest_is_sha256_of_64_hex_digits() {
        let d = std::env::temp_dir().join(format!("chio-unit-digest-{}", std::process::id()));
        std::fs::create_dir_all(d.join("blobs/sha256")).unwrap();
        let body = b"{}";
        let hex = format!("{:x}", Sha256::digest(body));
        std::fs::write(d.join("blobs/sha256").join(&hex), body).unwrap();
        let src = Source::open(&d).unwrap();
        assert_eq!(verified_blob(&src, &format!("sha256:{hex}"), Some(2)).unwrap(), body, "control");
        let bad = [
            format!("sha256:{}", &hex[..63]),
            format!("sha256:{}g", &hex[..63]),
            format!("sha256:{}", "../".repeat(21) + "x"),
            format!("sha512:{hex}"),
            hex.clone(),
        ];
        for digest in &bad {
            let err = verified_blob(&src, digest, None).unwrap_err().to_string();
            assert!(err.contains("unsupported digest"), "{digest}: {err}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A zstd stream may open with skippable frames (magic 0x184D2A50 to 0x184D2A5F, as some
    /// tools write for metadata): such a layer is zstd, and its content is what follows. A
    /// stream that only looks close (0x184D2A40) is not zstd.
    #[test]
    fn zstd_after_skippable_frames_is_zstd() {
        let packed = zstd::stream::encode_all(&b"layer bytes"[..], 3).unwrap();
        for magic in [0x50u8, 0x5f] {
            let mut stream = vec![magic, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3];
            stream.extend_from_slice(&packed);
            let mut out = Vec::new();
            decompress(&stream[..]).unwrap().read_to_end(&mut out).unwrap();
            assert_eq!(out, b"layer bytes", "magic {magic:#x}");
        }
        let plain = [0x40u8, 0x2a, 0x4d, 0x18, 9, 9];
        let mut out = Vec::new();
        decompress(&plain[..]).unwrap().read_to_end(&mut out).unwrap();
        assert_eq!(out, plain, "not a skippable frame: read as it is");
    }
}
