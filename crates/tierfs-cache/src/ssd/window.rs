//! Read-around for small entries: the log keeps entries in the order they were admitted, and
//! small files are usually read again in the order they were first read (`grep -r`, a build,
//! a training epoch over many small samples). So a miss on a small entry reads the 1 MiB window
//! of the log around it, and the next entries are found in memory: one I/O per ~100 small files
//! instead of one each, which is what turns an SSD's 80-100 us per read at queue depth one into
//! tens of thousands of files per second.
//!
//! The window is read only while it pays: each window read must, on average, serve at least
//! one other entry, or later misses go back to reading just the entry (random access to small
//! files must not read 1 MiB per 8 KiB).
//! Data in a window is verified per entry when it is served, like any other read.

use super::aligned::{AlignedBuf, PAGE};
use super::segment::Segment;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Size of one read-around window.
pub(crate) const WINDOW: u64 = 1 << 20;
/// Entries smaller than this are read with read-around.
pub(crate) const SMALL: u32 = 64 << 10;
/// Windows kept in memory (16 MiB).
const KEEP: usize = 16;

/// A window to read: segment and start offset.
type WindowAt = (Arc<Segment>, u64);

struct Window {
    seg: Arc<Segment>,
    start: u64,
    data: Bytes,
}

#[derive(Default)]
pub(crate) struct Windows {
    kept: Mutex<VecDeque<Window>>,
    /// To the prefetch thread: read this window of this segment ahead of the reader.
    prefetch: Mutex<Option<crossbeam_channel::Sender<WindowAt>>>,
    /// Window reads and the hits they served, recent history (halved as it grows).
    reads: AtomicU64,
    hits: AtomicU64,
    /// Totals for the stats.
    pub total_reads: AtomicU64,
    pub total_hits: AtomicU64,
}

impl Windows {
    /// The bytes of `seg` covering `[off, off + len)` if a kept window holds them, and the
    /// file offset they start at.
    pub fn find(&self, seg: &Arc<Segment>, off: u64, len: u32) -> Option<(Bytes, u64)> {
        let kept = self.kept.lock();
        let w = kept.iter().find(|w| {
            Arc::ptr_eq(&w.seg, seg)
                && w.start <= off
                && off + len as u64 <= w.start + w.data.len() as u64
        })?;
        self.hits.fetch_add(1, Relaxed);
        self.total_hits.fetch_add(1, Relaxed);
        let found = (w.data.clone(), w.start);
        // A reader in the second half of a window will want the next one: read it now, in
        // the background, so the reader finds it in memory (a log-order read-ahead).
        let next = w.start + w.data.len() as u64;
        let want_next = off >= w.start + w.data.len() as u64 / 2
            && !kept
                .iter()
                .any(|k| Arc::ptr_eq(&k.seg, seg) && k.start == next);
        drop(kept);
        if want_next {
            if let Some(tx) = self.prefetch.lock().as_ref() {
                let _ = tx.try_send((seg.clone(), next));
            }
        }
        Some(found)
    }

    /// Starts the thread that reads windows ahead (see [`Windows::find`]).
    pub fn start_prefetch(self: &Arc<Self>) {
        let (tx, rx) = crossbeam_channel::bounded::<WindowAt>(4);
        *self.prefetch.lock() = Some(tx);
        // The thread holds only a weak reference: it ends when the cache is dropped or
        // `stop_prefetch` closes the channel.
        let me = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("tierfs-ssd-ra".into())
            .spawn(move || {
                while let Ok((seg, start)) = rx.recv() {
                    let Some(w) = me.upgrade() else { return };
                    let have = w
                        .kept
                        .lock()
                        .iter()
                        .any(|k| Arc::ptr_eq(&k.seg, &seg) && k.start == start);
                    if !have {
                        let _ = w.read(&seg, start, 1);
                    }
                }
            });
    }

    pub fn stop_prefetch(&self) {
        self.prefetch.lock().take();
    }

    /// Whether the next miss should read a whole window.
    pub fn worth_it(&self) -> bool {
        let (r, h) = (self.reads.load(Relaxed), self.hits.load(Relaxed));
        r < 4 || h >= r
    }

    /// Reads the window around `[off, off + len)` and keeps it. None on an I/O error.
    pub fn read(&self, seg: &Arc<Segment>, off: u64, len: u32) -> Option<(Bytes, u64)> {
        let page = PAGE as u64;
        let start = off / WINDOW * WINDOW;
        let end = ((off + len as u64).div_ceil(WINDOW) * WINDOW).max(start + WINDOW);
        // Not past the end of the file (a short read would fail read_exact).
        let file_len = seg.file.metadata().ok()?.len() / page * page;
        let end = end.min(file_len.max((off + len as u64).div_ceil(page) * page));
        if end <= start {
            return None;
        }
        let n = (end - start) as usize;
        let mut buf = AlignedBuf::new(n)?;
        seg.file
            .read_exact_at(&mut buf.as_mut_slice()[..n], start)
            .ok()?;
        let data = Bytes::from_owner(buf).slice(0..n);
        self.total_reads.fetch_add(1, Relaxed);
        if self.reads.fetch_add(1, Relaxed) >= 64 {
            self.reads.store(32, Relaxed);
            self.hits.store(self.hits.load(Relaxed) / 2, Relaxed);
        }
        let mut kept = self.kept.lock();
        if kept.len() >= KEEP {
            kept.pop_front();
        }
        kept.push_back(Window {
            seg: seg.clone(),
            start,
            data: data.clone(),
        });
        Some((data, start))
    }

    /// Forgets the windows of a segment (it is being reclaimed).
    pub fn forget(&self, seg: &Arc<Segment>) {
        self.kept.lock().retain(|w| !Arc::ptr_eq(&w.seg, seg));
    }
}
