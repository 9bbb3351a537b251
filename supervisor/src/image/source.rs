//! Where an image's files come from, read in place: an OCI layout directory, or a tar archive
//! (`docker save`, `oci-archive`) indexed once and then read with seeks — the outer archive is never
//! unpacked to disk. Members that are symlinks to other members (legacy `docker save` layer
//! sharing) are resolved by path arithmetic within the archive, never on disk.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Largest JSON document (index, manifest, config) read into memory.
pub const MAX_JSON: u64 = 8 << 20;

/// A member of the outer archive.
#[derive(Debug, Clone)]
pub struct Member {
    offset: u64,
    size: u64,
    link: Option<String>,
}

/// A member's bytes, read at their offsets in the archive (positional reads: readers of several
/// members share the one open archive).
struct MemberReader<'a> {
    file: &'a File,
    at: u64,
    end: u64,
}

impl Read for MemberReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(usize::try_from(self.end - self.at).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.at += n as u64;
        Ok(n)
    }
}

/// Files of an image, by relative path.
pub enum Source {
    /// An OCI image layout directory (an `O_PATH` fd of it; its files are opened beneath it).
    Dir(OwnedFd),
    /// A tar archive and its member index.
    Tar {
        /// The archive, opened once: what was indexed is what is read (its path is never
        /// opened again, so a file put in its place meanwhile is not read).
        file: File,
        /// Member name (normalized) to location.
        members: HashMap<String, Member>,
    },
}

fn normalize(name: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out.join("/"))
}

/// How the file at `path` is compressed, from its magic bytes (`docker load` takes a gzip- or
/// zstd-compressed `docker save` too).
pub fn compression(path: &Path) -> io::Result<Option<&'static str>> {
    if path.is_dir() {
        return Ok(None);
    }
    let (file, meta) = open_nonblocking(path)?;
    if !meta.is_file() {
        // A FIFO or a device: Source::open refuses it, without reading a byte.
        return Ok(None);
    }
    let mut head = [0u8; 4];
    let n = (&file).read(&mut head)?;
    Ok(match &head[..n] {
        [0x1f, 0x8b, ..] => Some("gzip"),
        [0x28, 0xb5, 0x2f, 0xfd] => Some("zstd"),
        _ => None,
    })
}

/// True when `block` is a tar header (its checksum holds).
fn is_tar_header(block: &[u8; 512]) -> bool {
    let field = &block[148..156];
    let text: String = field.iter().take_while(|b| **b != 0 && **b != b' ').map(|b| *b as char).collect();
    let Ok(want) = u32::from_str_radix(text.trim(), 8) else { return false };
    let sum: u32 =
        block.iter().enumerate().map(|(i, b)| if (148..156).contains(&i) { 32 } else { u32::from(*b) }).sum();
    sum == want
}

/// Open `path` for reading without waiting for a FIFO's writer, and what it is (only a regular
/// file is read further).
fn open_nonblocking(path: &Path) -> io::Result<(File, std::fs::Metadata)> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    Ok((file, meta))
}

/// Whether `file` holds a block of zeros (a tar archive's end marker) at `offset`.
fn zero_block_at(file: &File, offset: u64) -> io::Result<bool> {
    let mut block = [0u8; 512];
    match file.read_exact_at(&mut block, offset) {
        Ok(()) => Ok(block.iter().all(|b| *b == 0)),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// A message about an archive that never carries raw bytes of it to the terminal.
fn printable(s: &str) -> String {
    s.chars().map(|c| if c.is_control() || c == '\u{fffd}' { '?' } else { c }).collect()
}

impl Source {
    /// Open `path`: a directory is an OCI layout; anything else is read as a tar archive.
    pub fn open(path: &Path) -> io::Result<Source> {
        if path.is_dir() {
            // The operator's path is walked as every host path is: through no symlink.
            return Ok(Source::Dir(chio_cage::path::open_host(&std::path::absolute(path)?, libc::O_DIRECTORY)?));
        }
        let not_an_image = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is not an image: neither a tar archive (docker save, oci-archive) nor an OCI layout directory",
                    path.display()
                ),
            )
        };
        let (file, meta) = open_nonblocking(path)?;
        let len = meta.len();
        let mut first = [0u8; 512];
        if !meta.is_file() || file.read_exact_at(&mut first, 0).is_err() || !is_tar_header(&first) {
            return Err(not_an_image());
        }
        let mut archive = tar::Archive::new(&file);
        let mut members = HashMap::new();
        let broken = |e: io::Error| {
            let why = if e.kind() == io::ErrorKind::UnexpectedEof || e.to_string().contains("entire block") {
                "it ends early (a truncated download or copy?)".to_string()
            } else {
                printable(&e.to_string())
            };
            io::Error::new(io::ErrorKind::InvalidData, format!("{} is a damaged tar archive: {why}", path.display()))
        };
        // Where the last member's data (padded to a block) ends: the end-of-archive block must
        // follow, else the archive was cut at a member boundary, which the tar reader takes for
        // its end.
        let mut end = 0;
        for entry in archive.entries_with_seek().map_err(broken)? {
            let entry = entry.map_err(broken)?;
            end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let Some(name) = normalize(&name) else { continue };
            let kind = entry.header().entry_type();
            let link = match kind {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    entry.link_name_bytes().map(|l| String::from_utf8_lossy(&l).into_owned())
                }
                _ => None,
            };
            if kind.is_file() || link.is_some() {
                members.insert(name, Member { offset: entry.raw_file_position(), size: entry.size(), link });
            }
        }
        // Indexing seeks over member data: a member that would end past the file's end means
        // the archive was cut short.
        if members.values().any(|m| m.offset + m.size > len) || !zero_block_at(&file, end)? {
            return Err(broken(io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(Source::Tar { file, members })
    }

    /// Whether `name` exists: false only when it is absent; a file there that may not be read
    /// (a link in a layout, a FIFO, a loop of links in an archive) is an error, not an absence.
    pub fn exists(&self, name: &str) -> io::Result<bool> {
        let found = match self {
            Source::Dir(d) => layout_file(d, name, libc::O_PATH).map(drop),
            Source::Tar { .. } => self.resolve(name).map(drop),
        };
        match found {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Resolve a member through symlinks inside the archive (bounded, no escape above the top).
    fn resolve(&self, name: &str) -> io::Result<(u64, u64)> {
        let Source::Tar { members, .. } = self else { return Err(io::ErrorKind::Unsupported.into()) };
        let mut cur = normalize(name).ok_or_else(|| not_found(name))?;
        for _ in 0..16 {
            let m = members.get(&cur).ok_or_else(|| not_found(name))?;
            match &m.link {
                None => return Ok((m.offset, m.size)),
                Some(link) => {
                    let base = if link.starts_with('/') {
                        String::new()
                    } else {
                        cur.rsplit_once('/').map_or(String::new(), |(d, _)| d.to_string())
                    };
                    cur = normalize(&format!("{base}/{link}")).ok_or_else(|| not_found(name))?;
                }
            }
        }
        Err(io::Error::new(io::ErrorKind::InvalidData, format!("{name}: too many links inside the archive")))
    }

    /// Size of `name`.
    pub fn size(&self, name: &str) -> io::Result<u64> {
        match self {
            Source::Dir(d) => Ok(layout_file(d, name, libc::O_PATH)?.1),
            Source::Tar { .. } => Ok(self.resolve(name)?.1),
        }
    }

    /// A reader of `name`'s content.
    pub fn read(&self, name: &str) -> io::Result<Box<dyn Read + '_>> {
        match self {
            Source::Dir(d) => {
                let (f, len) = layout_file(d, name, libc::O_RDONLY)?;
                Ok(Box::new(File::from(f).take(len)))
            }
            Source::Tar { file, .. } => {
                let (offset, size) = self.resolve(name)?;
                Ok(Box::new(MemberReader { file, at: offset, end: offset + size }))
            }
        }
    }

    /// A small JSON document, size-capped.
    pub fn json(&self, name: &str) -> io::Result<serde_json::Value> {
        let size = self.size(name)?;
        if size > MAX_JSON {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name} is {size} bytes (limit {MAX_JSON})"),
            ));
        }
        let mut buf = Vec::with_capacity(size as usize);
        self.read(name)?.take(MAX_JSON).read_to_end(&mut buf)?;
        serde_json::from_slice(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}")))
    }
}

/// The layout file `name` opened beneath the layout `dir` and its size. A layout holds plain
/// files and directories only: a symlink anywhere on the way (planted to read a host file, or
/// one another layout controls) is refused, never followed; a FIFO or device is refused
/// without blocking on it (`O_NONBLOCK`).
fn layout_file(dir: &OwnedFd, name: &str, flags: i32) -> io::Result<(OwnedFd, u64)> {
    let rel = normalize(name).ok_or_else(|| not_found(name))?;
    // (openat2 refuses O_PATH with any flag but a few: O_NONBLOCK only where the file opens.)
    let nonblock = if flags & libc::O_PATH == 0 { libc::O_NONBLOCK } else { 0 };
    let f =
        chio_cage::path::open_beneath(dir.as_fd(), Path::new(&rel), flags | nonblock).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => not_found(name),
            _ => e,
        })?;
    let meta = nix::sys::stat::fstat(&f)?;
    if meta.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{name} is not a regular file")));
    }
    Ok((f, meta.st_size as u64))
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{name} is not in the image"))
}
