//! A layer streamed on two CPUs. A producer thread reads the blob, hashes it and decompresses
//! it; the calling thread hashes the decompressed stream (the DiffID) as chunks arrive and
//! consumes it (extraction) from a bounded channel, so memory stays bounded (`DEPTH` chunks in
//! flight) and inflating overlaps the file writes instead of preceding each of them. (Inflating
//! is the dearer half; the DiffID hash sits on the consumer's side to even the two out.)

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};

use sha2::{Digest, Sha256};

use super::import::{decompress, digest_text, Hashing};
use super::source::Source;

const CHUNK: usize = 256 << 10;
const DEPTH: usize = 8;

/// Digests of one layer, taken over every byte of it.
#[derive(Debug)]
pub struct LayerDigests {
    /// `sha256:` of the blob as stored, and its size.
    pub blob: (String, u64),
    /// `sha256:` of the decompressed tar stream (the DiffID), and its size.
    pub diff_id: (String, u64),
}

/// Why streaming a layer stopped.
#[derive(Debug)]
pub enum StreamError<E> {
    /// The consumer refused the stream.
    Consumer(E),
    /// Reading or decompressing the blob failed.
    Source(io::Error),
}

/// Stream layer blob `name` of `src` through `consume`, with the blob's compressed bytes read so
/// far reported to `progress` as chunks arrive. The digests cover the whole stream, also what
/// follows the tar's end-of-archive marker; a decompressed stream longer than `max_stream`
/// bytes is refused (a bomb hidden after the end marker included).
pub fn stream_layer<T, E>(
    src: &Source,
    name: &str,
    max_stream: u64,
    progress: &mut dyn FnMut(u64),
    consume: impl FnOnce(&mut ChunkReader<'_>) -> Result<T, E>,
) -> Result<(T, LayerDigests), StreamError<E>> {
    let read = AtomicU64::new(0);
    let cancel = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (tx, rx) = sync_channel::<Vec<u8>>(DEPTH);
        let producer = scope.spawn(|| -> io::Result<Option<(String, u64)>> {
            let tx = tx; // owned here: the channel closes when the producer is done
            let counted = Counted { inner: src.read(name)?, read: &read };
            let mut raw = Hashing::new(counted);
            let mut plain = decompress(&mut raw)?;
            loop {
                if cancel.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                let mut buf = vec![0u8; CHUNK];
                let n = read_full(&mut plain, &mut buf)?;
                if n == 0 {
                    break;
                }
                buf.truncate(n);
                if tx.send(buf).is_err() {
                    return Ok(None); // the consumer refused the layer
                }
            }
            drop(plain);
            raw.finish().map(Some)
        });
        let mut reader = ChunkReader {
            rx,
            chunk: Vec::new(),
            pos: 0,
            read: &read,
            progress,
            hash: Sha256::new(),
            size: 0,
            max_stream,
        };
        let consumed = consume(&mut reader);
        // The DiffID covers the whole stream, also what follows the tar's end marker.
        let diff_id = consumed.as_ref().ok().map(|_| reader.drain());
        if !matches!(diff_id, Some(Ok(_))) {
            cancel.store(true, Ordering::Relaxed);
        }
        drop(reader); // unblocks a producer waiting to send
        let produced = producer.join().unwrap_or_else(|_| Err(io::Error::other("the layer reader panicked")));
        // A broken blob is the cause when both fail (the consumer then saw a cut-off stream).
        match (consumed, produced, diff_id) {
            (_, Err(e), _) => Err(StreamError::Source(e)),
            (Err(e), _, _) => Err(StreamError::Consumer(e)),
            (Ok(_), _, Some(Err(e))) => Err(StreamError::Source(e)),
            (Ok(t), Ok(Some(blob)), Some(Ok(diff_id))) => Ok((t, LayerDigests { blob, diff_id })),
            (Ok(_), _, _) => Err(StreamError::Source(io::Error::other("layer streaming was cancelled"))),
        }
    })
}

/// Fill `buf` as far as the stream allows; 0 only at its end.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Counts the compressed bytes read, for progress.
struct Counted<'a, R> {
    inner: R,
    read: &'a AtomicU64,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The consumer's end: the decompressed tar stream, chunk by chunk, hashed as it arrives.
pub struct ChunkReader<'a> {
    rx: Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    pos: usize,
    read: &'a AtomicU64,
    progress: &'a mut dyn FnMut(u64),
    hash: Sha256,
    size: u64,
    max_stream: u64,
}

impl ChunkReader<'_> {
    /// Take the next chunk into the hash: `Ok(false)` at the end of the stream.
    fn next_chunk(&mut self) -> io::Result<bool> {
        let Ok(c) = self.rx.recv() else {
            return Ok(false); // the producer finished (or failed: it says so on join)
        };
        self.size += c.len() as u64;
        if self.size > self.max_stream {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the decompressed layer exceeds the budget of {} bytes", self.max_stream),
            ));
        }
        self.hash.update(&c);
        (self.chunk, self.pos) = (c, 0);
        (self.progress)(self.read.load(Ordering::Relaxed));
        Ok(true)
    }

    /// Hash the rest of the stream; return `sha256:<hex>` of all of it and its size.
    fn drain(&mut self) -> io::Result<(String, u64)> {
        while self.next_chunk()? {}
        Ok((digest_text(std::mem::take(&mut self.hash)), self.size))
    }
}

impl Read for ChunkReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.chunk.len() && !self.next_chunk()? {
            return Ok(0);
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
