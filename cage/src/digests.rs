//! Digests a long-lived supervisor's launches share. Every launch hashes the file its target
//! executes (0.5 ms for a static `/true`, 0.8 ms for bash, 4 ms for python3 here); a daemon
//! launching the same tools again and again would hash the same bytes each time. The launcher
//! maps this table once, shared, before it forks anything, so every launch child (forked from
//! it) reads and fills the same slots: a file already hashed by an earlier launch, found
//! unchanged, is not hashed again.
//!
//! "Unchanged" is the rule the single launch already applies between its early hash and the
//! exec stop (see `prehash`): the same device, inode, size, mtime and ctime. Any write
//! moves ctime, which no caller can set, and since Linux 6.13 a change after a `stat` always
//! gets a new, finer timestamp. A miss only costs the hash.
//!
//! Each slot is a seqlock of atomics, so a reader never sees half an entry: a writer makes the
//! sequence odd, writes, and makes it even again; a reader takes the entry only if the sequence
//! was even and unchanged around its copy. Memory, not a descriptor: nothing for a cage to
//! inherit, and gone from the target at its exec.

use std::io;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};

/// Slots in the table (direct-mapped: a new entry replaces the one in its slot).
const SLOTS: usize = 256;
/// The identity words and the digest words of an entry.
const ID_WORDS: usize = 7;
const WORDS: usize = ID_WORDS + 4;

/// The identity of a file's contents: device, inode, size, mtime (s, ns), ctime (s, ns).
pub type Identity = [i64; ID_WORDS];

#[repr(C)]
struct Slot {
    seq: AtomicU64,
    words: [AtomicU64; WORDS],
}

/// A handle on the shared table (it lives as long as the process and every child forked after
/// it was made).
#[derive(Clone, Copy)]
pub struct Digests {
    slots: &'static [Slot],
}

impl std::fmt::Debug for Digests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digests({} slots)", self.slots.len())
    }
}

impl Digests {
    /// Map an empty shared table.
    pub fn new() -> io::Result<Digests> {
        let len = NonZeroUsize::new(SLOTS * std::mem::size_of::<Slot>()).ok_or(io::ErrorKind::InvalidInput)?;
        // SAFETY: a fresh anonymous mapping; zeroed memory is a valid array of atomics, and the
        // mapping is never unmapped, so the 'static slice stays valid.
        let slots = unsafe {
            let p = mmap_anonymous(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED)?;
            std::slice::from_raw_parts(p.as_ptr().cast::<Slot>(), SLOTS)
        };
        Ok(Digests { slots })
    }

    fn slot(&self, id: &Identity) -> &Slot {
        let h = id.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| (h ^ *w as u64).wrapping_mul(0x0100_0000_01b3));
        &self.slots[(h % SLOTS as u64) as usize]
    }

    /// The SHA-256 recorded for a file of this identity, if any.
    pub fn get(&self, id: &Identity) -> Option<[u8; 32]> {
        let s = self.slot(id);
        let before = s.seq.load(Ordering::Acquire);
        if before == 0 || before % 2 == 1 {
            return None;
        }
        let words: [u64; WORDS] = std::array::from_fn(|i| s.words[i].load(Ordering::Acquire));
        if s.seq.load(Ordering::Acquire) != before || words[..ID_WORDS].iter().zip(id).any(|(a, b)| *a != *b as u64) {
            return None;
        }
        let mut sha = [0u8; 32];
        for (chunk, w) in sha.chunks_mut(8).zip(&words[ID_WORDS..]) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        Some(sha)
    }

    /// Record `sha` for a file of this identity. A slot another launch is writing is left to it.
    pub fn put(&self, id: &Identity, sha: &[u8; 32]) {
        let s = self.slot(id);
        let seq = s.seq.load(Ordering::Acquire);
        if seq % 2 == 1 || s.seq.compare_exchange(seq, seq + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        for (w, v) in s.words.iter().zip(id.iter().map(|v| *v as u64)) {
            w.store(v, Ordering::Release);
        }
        for (w, chunk) in s.words[ID_WORDS..].iter().zip(sha.chunks(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_le_bytes(b), Ordering::Release);
        }
        s.seq.store(seq + 2, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry a forked child writes is the parent's to read, and only for the same identity.
    #[test]
    fn children_share_entries_by_exact_identity() {
        let d = Digests::new().expect("map");
        let id: Identity = [1, 2, 3, 4, 5, 6, 7];
        let sha = [7u8; 32];
        assert_eq!(d.get(&id), None);
        // SAFETY: the child only touches the shared table and exits.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                d.put(&id, &sha);
                // SAFETY: leaving the forked test child at once.
                unsafe { libc::_exit(0) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                nix::sys::wait::waitpid(child, None).expect("wait");
            }
        }
        assert_eq!(d.get(&id), Some(sha));
        for i in 0..ID_WORDS {
            let mut other = id;
            other[i] += 1;
            assert_eq!(d.get(&other), None, "identity word {i} differs: no digest");
        }
        // Nor when it shares the slot: the identity itself is compared, word by word.
        for i in 0..ID_WORDS {
            let mut other = id;
            while std::ptr::eq(d.slot(&other), d.slot(&id)) == (other == id) {
                other[i] += 1;
            }
            assert_eq!(d.get(&other), None, "identity word {i} differs in the same slot: no digest");
        }
        // A later entry for the same file replaces the earlier one.
        d.put(&id, &[9u8; 32]);
        assert_eq!(d.get(&id), Some([9u8; 32]));
    }

    /// A slot another launch is writing (its sequence odd) is neither read, which could give a
    /// digest half old and half new, nor written by a second writer.
    #[test]
    fn a_slot_being_written_is_left_alone() {
        let d = Digests::new().expect("map");
        let id: Identity = [11, 12, 13, 14, 15, 16, 17];
        d.put(&id, &[1u8; 32]);
        let seq = &d.slot(&id).seq;
        seq.fetch_add(1, Ordering::AcqRel);
        assert_eq!(d.get(&id), None, "read while being written");
        d.put(&id, &[2u8; 32]);
        seq.fetch_add(1, Ordering::AcqRel);
        assert_eq!(d.get(&id), Some([1u8; 32]), "written by a second writer");
    }
}
