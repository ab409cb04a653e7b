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
/// Windows kept in memory (32 MiB).
const KEEP: usize = 32;
/// Windows read ahead of the reader, each by its own thread: the queue depth the SSD sees
/// (one 1 MiB read at a time reached ~300 MB/s here, a third of the device).
const AHEAD: u64 = 4;

/// A window to read: segment and start offset.
type WindowAt = (Arc<Segment>, u64);

/// Window buffers for reuse: a fresh 1 MiB buffer per window costs 256 page faults and a
/// zeroing (together ~10% of the daemon's CPU in an after-remount `grep -r`).
static SPARE: Mutex<Vec<AlignedBuf>> = Mutex::new(Vec::new());
const SPARE_MAX: usize = 2 * KEEP;

/// A window buffer that goes back to [`SPARE`] when the last slice of it is dropped.
struct Recycled(Option<AlignedBuf>);

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref().map_or(&[], |b| b.as_slice())
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            let mut spare = SPARE.lock();
            if spare.len() < SPARE_MAX {
                spare.push(b);
            }
        }
    }
}

fn window_buf(n: usize) -> Option<AlignedBuf> {
    if n == WINDOW as usize {
        if let Some(b) = SPARE.lock().pop() {
            return Some(b);
        }
    }
    AlignedBuf::new(n)
}

struct Window {
    seg: Arc<Segment>,
    start: u64,
    data: Bytes,
}

#[derive(Default)]
pub(crate) struct Windows {
    kept: Mutex<VecDeque<Window>>,
    /// To the prefetch threads: read this window of this segment ahead of the reader.
    prefetch: Mutex<Option<crossbeam_channel::Sender<WindowAt>>>,
    /// Windows being read (segment address, start): a reader that needs one waits for it
    /// instead of reading the same megabyte again.
    inflight: Mutex<Vec<(usize, u64)>>,
    read_done: parking_lot::Condvar,
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
        let holds = |w: &Window, at: u64| {
            Arc::ptr_eq(&w.seg, seg) && w.start <= at && at < w.start + w.data.len() as u64
        };
        let end = off + len as u64;
        let w = kept.iter().find(|w| holds(w, off))?;
        if end > w.start + w.data.len() as u64 {
            // The entry continues in the next window: copy it out of the two.
            let w2 = kept
                .iter()
                .find(|k| holds(k, w.start + w.data.len() as u64))?;
            if end > w2.start + w2.data.len() as u64 {
                return None;
            }
            let mut out = Vec::with_capacity(len as usize);
            out.extend_from_slice(&w.data[(off - w.start) as usize..]);
            out.extend_from_slice(&w2.data[..(end - w2.start) as usize]);
            self.hits.fetch_add(1, Relaxed);
            self.total_hits.fetch_add(1, Relaxed);
            return Some((Bytes::from(out), off));
        }
        self.hits.fetch_add(1, Relaxed);
        self.total_hits.fetch_add(1, Relaxed);
        let found = (w.data.clone(), w.start);
        // A reader in the second half of a window will want the next one: read it now, in
        // the background, so the reader finds it in memory (a log-order read-ahead).
        // AHEAD windows ahead, read in parallel while the reader consumes this one.
        let next = w.start + w.data.len() as u64;
        let wanted: Vec<u64> = if off >= w.start + w.data.len() as u64 / 2 {
            (0..AHEAD)
                .map(|i| next + i * WINDOW)
                .filter(|&n| {
                    !kept
                        .iter()
                        .any(|k| Arc::ptr_eq(&k.seg, seg) && k.start == n)
                })
                .collect()
        } else {
            Vec::new()
        };
        drop(kept);
        if !wanted.is_empty() {
            let inflight = self.inflight.lock();
            let key = Arc::as_ptr(seg) as usize;
            if let Some(tx) = self.prefetch.lock().as_ref() {
                for n in wanted {
                    if !inflight.contains(&(key, n)) {
                        let _ = tx.try_send((seg.clone(), n));
                    }
                }
            }
        }
        Some(found)
    }

    /// Starts the thread that reads windows ahead (see [`Windows::find`]).
    pub fn start_prefetch(self: &Arc<Self>) {
        let (tx, rx) = crossbeam_channel::bounded::<WindowAt>(2 * AHEAD as usize);
        *self.prefetch.lock() = Some(tx);
        // The threads hold only a weak reference: they end when the cache is dropped or
        // `stop_prefetch` closes the channel.
        for i in 0..AHEAD {
            let me = Arc::downgrade(self);
            let rx = rx.clone();
            let _ = std::thread::Builder::new()
                .name(format!("tierfs-ssd-ra-{i}"))
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
        let key = (Arc::as_ptr(seg) as usize, start);
        {
            let mut inflight = self.inflight.lock();
            if inflight.contains(&key) {
                while inflight.contains(&key) {
                    self.read_done.wait(&mut inflight);
                }
                drop(inflight);
                return self.find(seg, off, len);
            }
            inflight.push(key);
        }
        let result = self.read_at(seg, start, end);
        self.inflight.lock().retain(|k| *k != key);
        self.read_done.notify_all();
        result
    }

    fn read_at(&self, seg: &Arc<Segment>, start: u64, end: u64) -> Option<(Bytes, u64)> {
        let n = (end - start) as usize;
        let mut buf = window_buf(n)?;
        seg.file
            .read_exact_at(&mut buf.as_mut_slice()[..n], start)
            .ok()?;
        let data = if buf.as_slice().len() == WINDOW as usize {
            Bytes::from_owner(Recycled(Some(buf))).slice(0..n)
        } else {
            Bytes::from_owner(buf).slice(0..n)
        };
        self.total_reads.fetch_add(1, Relaxed);
        if self.reads.fetch_add(1, Relaxed) >= 64 {
            self.reads.store(32, Relaxed);
            self.hits.store(self.hits.load(Relaxed) / 2, Relaxed);
        }
        // Kept as aligned 1 MiB windows even when an entry crossing a boundary made the read
        // longer: windows of different sizes would overlap and the same bytes be read twice.
        let mut kept = self.kept.lock();
        let mut at = 0usize;
        while at < n {
            let piece = (n - at).min(WINDOW as usize);
            if kept.len() >= KEEP {
                kept.pop_front();
            }
            kept.push_back(Window {
                seg: seg.clone(),
                start: start + at as u64,
                data: data.slice(at..at + piece),
            });
            at += piece;
        }
        Some((data, start))
    }

    /// Forgets the windows of a segment (it is being reclaimed).
    pub fn forget(&self, seg: &Arc<Segment>) {
        self.kept.lock().retain(|w| !Arc::ptr_eq(&w.seg, seg));
    }
}
