//! Snapshots as tar archives (the baseline and final archives of an export): written in index
//! order with fixed owners and times, so one snapshot has one archive; read back with the same
//! name, shape and size checks as every other tree the leg accepts.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use super::snapshot::{self, Ceilings, Index, Node, Objects, SnapshotError};

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Write `index` as a tar archive at `path`.
pub fn write(index: &Index, objects: &Objects, path: &Path) -> io::Result<()> {
    let mut b = tar::Builder::new(File::create(path)?);
    for (p, node) in index {
        match node {
            Node::Dir => b.append_data(&mut header(tar::EntryType::Directory, 0o755, 0), p, io::empty())?,
            Node::File { sha256, size, executable } => {
                let bytes = objects.get(sha256)?;
                let mode = if *executable { 0o755 } else { 0o644 };
                b.append_data(&mut header(tar::EntryType::Regular, mode, *size), p, bytes.as_slice())?;
            }
            Node::Symlink { target } => {
                b.append_link(&mut header(tar::EntryType::Symlink, 0o777, 0), p, target)?;
            }
        }
    }
    b.into_inner()?.sync_all()
}

fn text(bytes: &[u8], what: &str) -> Result<String, SnapshotError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| SnapshotError::Refused(format!("{what} is not UTF-8")))
}

/// Read an archive into an index, storing contents in `objects`. Anything but directories,
/// regular files and symlinks, a duplicate, or a name the leg refuses, refuses the archive.
/// A member's stated size is a claim: memory is taken as its bytes arrive, and a member whose
/// bytes end before its size refuses the archive.
pub fn read(file: File, objects: &Objects, c: &Ceilings) -> Result<Index, SnapshotError> {
    let mut a = tar::Archive::new(file);
    let mut index = Index::new();
    let mut total = 0u64;
    for e in a.entries()? {
        let mut e = e?;
        let name = text(&e.path_bytes(), "an archive member's name")?;
        let name = name.trim_end_matches('/').to_string();
        snapshot::check_path(&name)?;
        let node = match e.header().entry_type() {
            tar::EntryType::Directory => Node::Dir,
            tar::EntryType::Regular => {
                let size = e.header().size()?;
                total = total.saturating_add(size);
                if size > c.max_file_bytes || total > c.max_total_bytes {
                    return Err(SnapshotError::Refused(format!("{name:?}: the archive exceeds the size ceilings")));
                }
                let mut bytes = Vec::with_capacity(size.min(1 << 20) as usize);
                (&mut e).take(size).read_to_end(&mut bytes)?;
                if bytes.len() as u64 != size {
                    return Err(SnapshotError::Refused(format!("{name:?}: the archive ends inside this member")));
                }
                Node::File { sha256: objects.put(&bytes)?, size, executable: e.header().mode()? & 0o100 != 0 }
            }
            tar::EntryType::Symlink => {
                let target =
                    e.link_name_bytes().ok_or_else(|| SnapshotError::Refused(format!("{name:?}: no link target")))?;
                Node::Symlink { target: text(&target, "a link target")? }
            }
            other => return Err(SnapshotError::Refused(format!("{name:?}: archive member type {other:?} is refused"))),
        };
        if index.insert(name.clone(), node).is_some() {
            return Err(SnapshotError::Refused(format!("{name:?}: a duplicate archive member")));
        }
        if index.len() as u64 > c.max_entries {
            return Err(SnapshotError::Refused(format!("more than {} archive members", c.max_entries)));
        }
    }
    snapshot::check_index(&index, c)?;
    Ok(index)
}
