//! The dirty data of one file in write-back mode: extents not yet on the backing store, each
//! tagged with the journal sequence number of the write that produced it.
//!
//! Tags make flushing race-free without holding the file's lock during backing I/O: a flusher
//! snapshots a run of extents, writes it, and then removes only extents whose tag was in its
//! snapshot and that lie inside what it wrote. Every write has its own tag, and the part of a
//! write still visible can only shrink, so such an extent's bytes are exactly bytes that were
//! written. Anything rewritten meanwhile carries a newer tag and stays dirty.
//!
//! Extents are kept as written, never merged: merging copies, and a writer of 4 KiB pieces
//! would copy each byte many times. Contiguous extents are coalesced at flush time instead,
//! into one backing write of up to `writeback.chunk` ([`Dirty::take_run`]).

use bytes::Bytes;
use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

#[derive(Clone, Debug)]
struct Extent {
    data: Bytes,
    seq: u64,
}

/// A run of dirty bytes taken for flushing: contiguous extents in offset order (shared, not
/// copied: written with one gather write), with the tags they carry.
pub struct Run {
    pub offset: u64,
    pub pieces: Vec<Bytes>,
    pub len: u64,
    pub(crate) seqs: HashSet<u64>,
}

impl Run {
    /// The run's bytes in one buffer (tests).
    #[cfg(test)]
    pub fn bytes(&self) -> Vec<u8> {
        self.pieces.concat()
    }
}

pub struct Dirty {
    extents: BTreeMap<u64, Extent>,
    /// Bytes held by `extents`.
    pub bytes: u64,
    /// The file's size as the application sees it (the backing size grown by our writes).
    pub size: u64,
    /// Modification time of the last write, ns since the epoch.
    pub mtime_ns: i64,
    /// `mtime_ns` was set by the application (utimensat after writing: `cp -p`, `tar x`),
    /// not by a write: it says nothing of when the file changed; `set_at_ns` does (the
    /// utimensat's own time: its ctime).
    pub mtime_set: bool,
    pub set_at_ns: i64,
    /// When the oldest dirty byte still held was written.
    pub since: Instant,
    /// The newest tag ever applied (for the DONE record when everything is flushed).
    pub max_seq: u64,
    /// A flush error not yet reported to the application (at its next fsync or close).
    pub error: Option<tierfs_store::Errno>,
    /// Backing path, relative to the backing root (what the journal names the file by).
    pub path: Vec<u8>,
    /// Backing space reserved for this file's dirty bytes and not yet given back.
    pub reserved: u64,
    /// When the application last wrote (a flusher that catches up with a file still being
    /// written leaves the sync for later).
    pub last_write: Instant,
    /// The version of the file these writes were made on (None after a replay): a store that
    /// can tell refuses to let them overwrite another writer's version (`Store::open_based`).
    pub base: Option<tierfs_store::Fingerprint>,
    /// Runs the namespace flusher wrote to the store before the file was published (a
    /// rename over a file of the store lands after its data, `ns_replace`): still dirty, so
    /// that reads of the unpublished file see them, and dropped, not written again, by the
    /// next data flush (only what no later write replaced, as for any run).
    pub ahead: Vec<Run>,
    /// Some of the data may be on the store before the file was published (set before the
    /// first such write): a truncate of the unpublished file is then done on the store, not
    /// by dropping its dirty data (`ns_truncate`).
    pub written_ahead: bool,
    /// A truncate to zero of the file of the store these writes follow is queued for the
    /// namespace flusher and not yet on the store (`ns_chattr`): the store's bytes are not
    /// the file's (reads see zeros but for the extents), and the flushers wait for it.
    pub truncate_pending: bool,
    /// The seq of a deferred extending truncate of the new file (`ns_truncate`; its journal
    /// record is an empty DATA record at the new size) whose flush has not set the store
    /// file's size to `size` yet: a linker's `ftruncate` of its output before it writes it
    /// through mmap. Not clean until then, though no extent may be left.
    pub grow: Option<u64>,
}

impl Dirty {
    pub fn new(size: u64, path: Vec<u8>) -> Dirty {
        Dirty {
            extents: BTreeMap::new(),
            bytes: 0,
            size,
            mtime_ns: 0,
            mtime_set: false,
            set_at_ns: 0,
            since: Instant::now(),
            max_seq: 0,
            error: None,
            path,
            reserved: 0,
            last_write: Instant::now(),
            base: None,
            ahead: Vec::new(),
            written_ahead: false,
            truncate_pending: false,
            grow: None,
        }
    }

    pub fn is_clean(&self) -> bool {
        self.extents.is_empty() && self.grow.is_none()
    }

    /// Cuts `[start, end)` out of the extents, keeping what lies outside it.
    fn punch(&mut self, start: u64, end: u64) {
        let first = self
            .extents
            .range(..start)
            .next_back()
            .filter(|(o, e)| **o + e.data.len() as u64 > start)
            .map(|(o, _)| *o);
        let keys: Vec<u64> = first
            .into_iter()
            .chain(self.extents.range(start..end).map(|(o, _)| *o))
            .collect();
        for o in keys {
            let Some(e) = self.extents.remove(&o) else {
                continue;
            };
            let len = e.data.len() as u64;
            self.bytes -= len;
            if o < start {
                let keep = e.data.slice(..(start - o) as usize);
                self.bytes += keep.len() as u64;
                self.extents.insert(
                    o,
                    Extent {
                        data: keep,
                        seq: e.seq,
                    },
                );
            }
            if o + len > end {
                let keep = e.data.slice((end - o) as usize..);
                self.bytes += keep.len() as u64;
                self.extents.insert(
                    end,
                    Extent {
                        data: keep,
                        seq: e.seq,
                    },
                );
            }
        }
    }

    /// Applies a write tagged `seq`.
    pub fn write(&mut self, offset: u64, data: Bytes, seq: u64, mtime_ns: i64) {
        if data.is_empty() {
            return;
        }
        if self.extents.is_empty() {
            self.since = Instant::now();
        }
        let end = offset + data.len() as u64;
        self.punch(offset, end);
        self.size = self.size.max(end);
        self.mtime_ns = mtime_ns;
        self.mtime_set = false;
        self.max_seq = self.max_seq.max(seq);
        self.bytes += data.len() as u64;
        self.extents.insert(offset, Extent { data, seq });
    }

    /// Copies the dirty bytes of `[offset, offset + buf.len())` over `buf`.
    pub fn overlay(&self, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        let first = self
            .extents
            .range(..offset)
            .next_back()
            .filter(|(o, e)| **o + e.data.len() as u64 > offset)
            .map(|(o, e)| (*o, e));
        for (o, e) in first
            .into_iter()
            .chain(self.extents.range(offset..end).map(|(o, e)| (*o, e)))
        {
            let s = o.max(offset);
            let t = (o + e.data.len() as u64).min(end);
            if s >= t {
                continue;
            }
            buf[(s - offset) as usize..(t - offset) as usize]
                .copy_from_slice(&e.data[(s - o) as usize..(t - o) as usize]);
        }
    }

    /// Takes the first contiguous run of extents at or after `from`, up to `max`
    /// bytes, for one backing write. Extents stay until [`Dirty::flushed`].
    pub fn take_run(&self, from: u64, max: usize) -> Option<Run> {
        let mut it = self.extents.range(from..);
        let (&o, e) = it.next()?;
        let mut run = Run {
            offset: o,
            pieces: vec![e.data.clone()],
            len: e.data.len() as u64,
            seqs: HashSet::new(),
        };
        run.seqs.insert(e.seq);
        for (&no, ne) in it {
            if no != o + run.len || run.len + ne.data.len() as u64 > max as u64 {
                break;
            }
            run.pieces.push(ne.data.clone());
            run.len += ne.data.len() as u64;
            run.seqs.insert(ne.seq);
        }
        Some(run)
    }

    /// Drops what `run` wrote (see the module comment); returns the bytes dropped.
    pub fn flushed(&mut self, run: &Run) -> u64 {
        let (start, end) = (run.offset, run.offset + run.len);
        let gone: Vec<u64> = self
            .extents
            .range(start..end)
            .filter(|(o, e)| run.seqs.contains(&e.seq) && **o + e.data.len() as u64 <= end)
            .map(|(o, _)| *o)
            .collect();
        let mut n = 0;
        for o in gone {
            if let Some(e) = self.extents.remove(&o) {
                n += e.data.len() as u64;
            }
        }
        self.bytes -= n;
        n
    }

    /// Everything with a tag at or below this is on the backing store (or superseded by a
    /// newer write that is still dirty): what a DONE record may claim.
    pub fn done_upto(&self) -> u64 {
        match self.extents.values().map(|e| e.seq).chain(self.grow).min() {
            Some(m) => m - 1,
            None => self.max_seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_apply(m: &mut Vec<u8>, off: u64, d: &[u8]) {
        let end = off as usize + d.len();
        if m.len() < end {
            m.resize(end, 0);
        }
        m[off as usize..end].copy_from_slice(d);
    }

    /// Random writes, overlays and flushes against a byte model: after flushing everything
    /// (applying runs to a "backing" buffer), backing equals the model, and at every step
    /// backing overlaid with the dirty extents equals the model.
    #[test]
    fn random_writes_flushes_and_overlays_match_a_model() {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _round in 0..50 {
            let mut d = Dirty::new(0, b"f".to_vec());
            let mut model: Vec<u8> = Vec::new();
            let mut backing: Vec<u8> = Vec::new();
            let mut seq = 0;
            for _ in 0..200 {
                match rnd(4) {
                    0..=1 => {
                        let off = rnd(64 << 10);
                        let len = 1 + rnd(8 << 10) as usize;
                        seq += 1;
                        let v = vec![(seq % 251) as u8; len];
                        d.write(off, Bytes::from(v.clone()), seq, 0);
                        model_apply(&mut model, off, &v);
                    }
                    2 => {
                        if let Some(run) = d.take_run(rnd(64 << 10), 1 + rnd(32 << 10) as usize) {
                            // A write racing with the flush, after the snapshot.
                            if rnd(2) == 0 {
                                let off = run.offset + rnd(run.len + 1);
                                seq += 1;
                                let v = vec![(seq % 251) as u8; 100];
                                d.write(off, Bytes::from(v.clone()), seq, 0);
                                model_apply(&mut model, off, &v);
                            }
                            model_apply(&mut backing, run.offset, &run.bytes());
                            d.flushed(&run);
                        }
                    }
                    _ => {
                        let mut view = backing.clone();
                        view.resize(d.size as usize, 0);
                        d.overlay(0, &mut view);
                        assert_eq!(view, model);
                    }
                }
            }
            while let Some(run) = d.take_run(0, 1 << 20) {
                model_apply(&mut backing, run.offset, &run.bytes());
                d.flushed(&run);
            }
            assert!(d.is_clean());
            assert_eq!(d.bytes, 0);
            backing.resize(d.size as usize, 0);
            assert_eq!(backing, model);
            assert_eq!(d.done_upto(), seq);
        }
    }

    #[test]
    fn small_adjacent_writes_coalesce_at_flush_and_done_upto_waits_for_the_oldest() {
        let mut d = Dirty::new(0, vec![]);
        for i in 0..256u64 {
            d.write(i * 4096, Bytes::from(vec![1u8; 4096]), i + 1, 0);
        }
        assert_eq!(d.extents.len(), 256);
        assert_eq!(d.bytes, 1 << 20);
        d.write(10 << 20, Bytes::from(vec![2u8; 10]), 300, 0);
        let run = d.take_run(0, 8 << 20).unwrap();
        assert_eq!(run.len, 1 << 20);
        d.flushed(&run);
        assert_eq!(d.done_upto(), 299);
        let mut tail = [0u8; 12];
        d.overlay((10 << 20) - 1, &mut tail);
        assert_eq!(tail, [0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0]);
    }
}
