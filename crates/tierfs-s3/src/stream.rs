//! A sequential reader's reads from one long GET. Over S3 every request pays a round trip and
//! the server's own per-request work; a read-ahead chunk at a time, each its own ranged GET,
//! delivered 456 MB/s where one plain GET stream of the same object delivered 922 (same
//! server and run, bench/results/2026-12-05-s3-s3-1G-3.md), and parallel ranged GETs less
//! (327: two CPUs shared with the server). So a handle read in order keeps one GET open for
//! the rest of its range and takes each next read from its body: the kernel's socket buffer
//! receives ahead while the reader works.
//!
//! A stream serves only the read that starts where it stands, of the version the handle
//! reads (the GET is conditional on its ETag, so all it carries is that version). Anything
//! else (a read elsewhere, a stream that failed or ended early) is a ranged GET as before:
//! a stream never fails a read that a ranged GET would serve. A stream spans at most
//! [`SPAN`], so that a slow link finishes it within the client's request timeout.

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The most one GET of a stream asks for: 128 MiB is ~0.15 s at this machine's loopback
/// speed (a new GET's round trip costs ~3% of it) and 30 s (the request timeout) at 4.5 MB/s.
pub(crate) const SPAN: u64 = 128 << 20;

/// One GET being read in order.
pub(crate) struct Stream {
    /// The version its GET was conditional on.
    pub etag: Option<String>,
    /// The offset its next byte belongs at.
    pub pos: u64,
    /// Where its range ends.
    pub end: u64,
    /// Received and not handed out yet.
    pending: Bytes,
    body: BoxStream<'static, object_store::Result<Bytes>>,
}

/// How long after two reads of a handle were in flight at once no new stream is started for
/// it: tierfs keeps several reads of one sequential reader in flight where that measured
/// faster (a far store, see `tierfs_fs`'s `stream_depth`), and each would end the other's
/// stream and start its own (a GET per read again, and the rest of each body thrown away).
/// Short, because such a trial of a deeper level ends soon when it loses, and the stream
/// should come back then: with 1 s, cold `dd` of 1 GiB over the bench's emulation read
/// 403-502 MB/s, with 100 ms 536-625 (ranged GETs alone, before streams: 456-475).
pub(crate) const PARALLEL_HOLD: Duration = Duration::from_millis(100);

/// The stream of one handle, and where its reads have reached.
#[derive(Default)]
pub(crate) struct Streaming {
    /// The end of the handle's last read: a read starting here continues a sequential one.
    next: AtomicU64,
    cur: Mutex<Option<Stream>>,
    /// Reads of the handle in flight, and when two last were at once.
    inflight: AtomicU32,
    parallel_at: Mutex<Option<Instant>>,
}

/// A read of a handle in flight (see [`Streaming::enter`]).
pub(crate) struct InFlight<'a>(&'a Streaming);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Relaxed);
    }
}

impl Stream {
    pub(crate) fn new(
        etag: Option<String>,
        pos: u64,
        end: u64,
        body: BoxStream<'static, object_store::Result<Bytes>>,
    ) -> Stream {
        Stream {
            etag,
            pos,
            end,
            pending: Bytes::new(),
            body,
        }
    }

    /// The next `len` bytes (`len` <= `end - pos`), each frame of the body awaited by `wait`
    /// (which runs it on the client's runtime); None if the body failed or ended first.
    pub(crate) fn take(
        &mut self,
        len: usize,
        wait: impl Fn(
            &mut BoxStream<'static, object_store::Result<Bytes>>,
        ) -> Option<object_store::Result<Bytes>>,
    ) -> Option<Bytes> {
        if self.pending.len() >= len {
            self.pos += len as u64;
            return Some(self.pending.split_to(len));
        }
        let mut out = BytesMut::with_capacity(len);
        out.extend_from_slice(&std::mem::take(&mut self.pending));
        while out.len() < len {
            let mut frame = wait(&mut self.body)?.ok()?;
            let want = len - out.len();
            if frame.len() > want {
                self.pending = frame.split_off(want);
            }
            out.extend_from_slice(&frame);
        }
        self.pos += len as u64;
        Some(out.freeze())
    }
}

impl Streaming {
    /// Counts a read of the handle in flight until the guard is dropped.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        if self.inflight.fetch_add(1, Relaxed) > 0 {
            *self.parallel_at.lock() = Some(Instant::now());
        }
        InFlight(self)
    }

    /// Whether a new stream may start: the handle's reads have gone one at a time lately.
    pub(crate) fn serial(&self) -> bool {
        self.parallel_at
            .lock()
            .is_none_or(|t| t.elapsed() >= PARALLEL_HOLD)
    }

    /// Whether a read at `offset` continues the handle's last one.
    pub(crate) fn continues(&self, offset: u64) -> bool {
        self.next.load(Relaxed) == offset
    }

    /// Records that the handle's last read ended at `end`.
    pub(crate) fn read_to(&self, end: u64) {
        self.next.store(end, Relaxed);
    }

    /// The stream, unless another read of the handle is using it (that read goes by a
    /// ranged GET rather than wait).
    pub(crate) fn try_lock(&self) -> Option<parking_lot::MutexGuard<'_, Option<Stream>>> {
        self.cur.try_lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn stream_of(frames: Vec<&'static [u8]>, pos: u64) -> Stream {
        let end = pos + frames.iter().map(|f| f.len() as u64).sum::<u64>();
        let body = futures::stream::iter(frames.into_iter().map(|f| Ok(Bytes::from_static(f))));
        Stream::new(None, pos, end, body.boxed())
    }

    fn now(
        b: &mut BoxStream<'static, object_store::Result<Bytes>>,
    ) -> Option<object_store::Result<Bytes>> {
        futures::executor::block_on(b.next())
    }

    #[test]
    fn reads_take_the_body_in_order_across_frames() {
        let mut s = stream_of(vec![b"abc", b"defgh", b"ij"], 100);
        assert_eq!(s.take(2, now).as_deref(), Some(&b"ab"[..]));
        assert_eq!(s.pos, 102);
        assert_eq!(s.take(4, now).as_deref(), Some(&b"cdef"[..]));
        assert_eq!(s.take(1, now).as_deref(), Some(&b"g"[..]));
        assert_eq!(s.take(3, now).as_deref(), Some(&b"hij"[..]));
        assert_eq!(s.pos, s.end);
    }

    #[test]
    fn a_body_that_ends_early_or_fails_serves_nothing() {
        let mut s = stream_of(vec![b"abc"], 0);
        assert!(s.take(4, now).is_none());
        let body = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"ab")),
            Err(object_store::Error::Generic {
                store: "test",
                source: "connection reset".into(),
            }),
        ]);
        let mut s = Stream::new(None, 0, 10, body.boxed());
        assert!(s.take(3, now).is_none());
    }
}
