//! Who besides a file's owner can read or write it: the mode's group and other bits, or — when
//! the file carries a POSIX access ACL, whose mode group bits are then only the ACL's mask —
//! the ACL's own entries (the kernel's `posix_acl_xattr` layout, `linux/posix_acl_xattr.h`).
//!
//! systemd gives a service's user read access to a credential it wrote as root with an ACL entry
//! for that user (`user:UID:r--`, so `ls` shows mode 0440) wherever the file system has ACLs —
//! the tmpfs of systemd 254 and later, or a plain directory — and by ownership on ramfs.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;

use xattr::FileExt;

/// The xattr holding a file's access ACL.
const ACCESS_ACL: &str = "system.posix_acl_access";
/// `POSIX_ACL_XATTR_VERSION`.
const ACL_VERSION: u32 = 2;
const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
/// Read or write (execute alone reads nothing).
const READ_WRITE: u16 = 0o6;

/// Who other than the owner and `reader` (a uid: this process's) can read or write the open
/// file `f`, in words (`None`: no one). An ACL chio cannot read counts as shared.
pub fn shared_beyond(f: &File, meta: &Metadata, reader: u32) -> io::Result<Option<String>> {
    // A file system without extended attributes (ramfs, where systemd 252 puts credentials)
    // has no ACLs: its mode says it all.
    let acl = match f.get_xattr(ACCESS_ACL) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => None,
        other => other?,
    };
    let Some(acl) = acl else {
        let bits = meta.mode() & 0o066;
        return Ok((bits != 0).then(|| format!("group or others (mode {:o})", meta.mode() & 0o777)));
    };
    let entries = match parse(&acl) {
        Some(entries) => entries,
        None => return Ok(Some("an access ACL chio cannot read".into())),
    };
    let mask = entries.iter().find(|e| e.0 == ACL_MASK).map_or(0o7, |e| e.1);
    let mut who = Vec::new();
    for &(tag, perm, id) in &entries {
        let granted = match tag {
            ACL_USER_OBJ | ACL_MASK => 0,
            ACL_USER if id == reader => 0,
            ACL_USER | ACL_GROUP_OBJ | ACL_GROUP => perm & mask,
            _ => perm,
        };
        if granted & READ_WRITE != 0 {
            who.push(match tag {
                ACL_USER => format!("user {id}"),
                ACL_GROUP_OBJ => "its group".into(),
                ACL_GROUP => format!("group {id}"),
                ACL_OTHER => "others".into(),
                _ => format!("an ACL entry of tag {tag:#x}"),
            });
        }
    }
    Ok((!who.is_empty()).then(|| format!("{} (by its ACL)", who.join(", "))))
}

/// The entries `(tag, permissions, id)` of an ACL xattr; `None` if it is not one.
fn parse(acl: &[u8]) -> Option<Vec<(u16, u16, u32)>> {
    let (header, body) = acl.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*header) != ACL_VERSION || body.len() % 8 != 0 {
        return None;
    }
    let entries: Vec<_> = body
        .chunks_exact(8)
        .map(|e| {
            let u16_at = |i: usize| u16::from_le_bytes([e[i], e[i + 1]]);
            (u16_at(0), u16_at(2), u32::from_le_bytes([e[4], e[5], e[6], e[7]]))
        })
        .collect();
    let known = [ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER];
    entries.iter().all(|e| known.contains(&e.0)).then_some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = ACL_VERSION.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            v.extend(tag.to_le_bytes());
            v.extend(perm.to_le_bytes());
            v.extend(id.to_le_bytes());
        }
        v
    }

    #[test]
    fn acl_entries_are_read_and_anything_else_is_not_an_acl() {
        let entries = [(ACL_USER_OBJ, 4, u32::MAX), (ACL_USER, 4, 65534), (ACL_MASK, 4, u32::MAX)];
        assert_eq!(parse(&acl(&entries)), Some(entries.to_vec()));
        let mut truncated = acl(&entries);
        truncated.pop();
        assert_eq!(parse(&truncated), None);
        let mut version = acl(&entries);
        version[0] = 1;
        assert_eq!(parse(&version), None);
        assert_eq!(parse(&acl(&[(0x40, 4, 0)])), None, "an unknown tag");
        assert_eq!(parse(&[2, 0]), None);
    }
}
