//! A layer streamed on two CPUs. A producer thread reads the blob, hashes it, decompresses it
//! and hashes the tar stream; the calling thread consumes the tar stream (extraction) from a
//! bounded channel of chunks, so memory stays bounded (`DEPTH` chunks in flight) and the
//! hashing and inflating overlap the file writes instead of preceding each of them.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};

use super::import::{decompress, Hashing};
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
/// follows the tar's end-of-archive marker.
pub fn stream_layer<T, E>(
    src: &Source,
    name: &str,
    progress: &mut dyn FnMut(u64),
    consume: impl FnOnce(&mut ChunkReader<'_>) -> Result<T, E>,
) -> Result<(T, LayerDigests), StreamError<E>> {
    let read = AtomicU64::new(0);
    let cancel = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (tx, rx) = sync_channel::<Vec<u8>>(DEPTH);
        let producer = scope.spawn(|| -> io::Result<Option<LayerDigests>> {
            let counted = Counted { inner: src.read(name)?, read: &read };
            let mut raw = Hashing::new(counted);
            let mut plain = Hashing::new(decompress(&mut raw)?);
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
                    break; // the consumer is done: finish the digests below
                }
            }
            drop(tx);
            if cancel.load(Ordering::Relaxed) {
                return Ok(None); // refused: no digest is worth reading the rest (a bomb's tail)
            }
            let diff_id = plain.finish()?;
            let blob = raw.finish()?;
            Ok(Some(LayerDigests { blob, diff_id }))
        });
        let mut reader = ChunkReader { rx, chunk: Vec::new(), pos: 0, read: &read, progress };
        let consumed = consume(&mut reader);
        if consumed.is_err() {
            cancel.store(true, Ordering::Relaxed);
        }
        drop(reader); // unblocks a producer waiting to send
        let produced = producer.join().unwrap_or_else(|_| Err(io::Error::other("the layer reader panicked")));
        // A broken blob is the cause when both fail (the consumer then saw a cut-off stream).
        match (consumed, produced) {
            (_, Err(e)) => Err(StreamError::Source(e)),
            (Err(e), _) => Err(StreamError::Consumer(e)),
            (Ok(t), Ok(Some(d))) => Ok((t, d)),
            (Ok(_), Ok(None)) => Err(StreamError::Source(io::Error::other("layer streaming was cancelled"))),
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

/// The consumer's end: the decompressed tar stream, chunk by chunk.
pub struct ChunkReader<'a> {
    rx: Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    pos: usize,
    read: &'a AtomicU64,
    progress: &'a mut dyn FnMut(u64),
}

impl Read for ChunkReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.chunk.len() {
            match self.rx.recv() {
                Ok(c) => (self.chunk, self.pos) = (c, 0),
                Err(_) => return Ok(0), // the producer finished (or failed: it says so on join)
            }
            (self.progress)(self.read.load(Ordering::Relaxed));
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
