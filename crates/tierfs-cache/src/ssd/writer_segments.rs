//! Segments of the writer thread: a new one started when the current one is full (the
//! oldest reclaimed until it fits under the cap and the device's free space), and the oldest
//! given back to the write-back journal when it needs room.

use super::io;
use super::recover::SegInfo;
use super::segment::{self, Segment};
use super::stats::inc;
use super::writer::Writer;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

impl Writer {
    /// Whether one more segment fits: under the cap, and the device keeps `min_free_pct` free.
    pub(super) fn space_ok(&self) -> bool {
        let cfg = &self.sh.cfg;
        let seg = cfg.segment_size;
        if self.sh.fill.load(Relaxed) + seg > self.sh.cap {
            return false;
        }
        match io::device_space(&self.sh.dir) {
            Ok((total, free)) => {
                let keep = (total as u128 * cfg.min_free_pct as u128 / 100) as u64;
                free.saturating_sub(seg) >= keep
            }
            // Unknown: the cap alone applies.
            Err(_) => true,
        }
    }

    /// Starts a new segment, reclaiming the oldest ones until it fits. False if it cannot
    /// (the device is full of other files, or an I/O error): admission stops until space
    /// comes back.
    pub(super) fn roll(&mut self) -> bool {
        self.cur = None;
        while !self.space_ok() {
            if !self.reclaim_oldest() {
                if !self.sh.full.swap(true, Relaxed) {
                    tracing::warn!(
                        "SSD cache: no room for another segment in {} (cap or min free space); admission paused",
                        self.sh.dir.display()
                    );
                }
                self.last_full_check = Instant::now();
                return false;
            }
        }
        self.sh.full.store(false, Relaxed);
        let seq = self.next_seq;
        let path = self.sh.dir.join(segment::file_name(seq));
        let file = match io::open_segment(&path, true, &self.sh.direct) {
            Ok(f) => f,
            Err(e) => {
                inc(&self.sh.ctr.io_errors);
                tracing::warn!("SSD cache: cannot create {}: {e}", path.display());
                return false;
            }
        };
        self.next_seq += 1;
        let seg = Arc::new(Segment::new(seq, path, file));
        self.segs.insert(
            seq,
            SegInfo {
                seg: seg.clone(),
                len: 0,
            },
        );
        self.sh.segments.store(self.segs.len() as u64, Relaxed);
        self.cur = Some(seg);
        self.cur_off = 0;
        true
    }

    /// Drops the oldest segments, never the one being written, until `bytes` are freed; hot
    /// entries are not rewritten (that would take the space back). Returns the bytes freed.
    pub(super) fn give_back(&mut self, bytes: u64) -> u64 {
        let mut freed = 0;
        while freed < bytes {
            let cur = self.cur.as_ref().map(|c| c.seq);
            let Some((&oldest, info)) = self.segs.first_key_value() else {
                break;
            };
            if Some(oldest) == cur {
                break;
            }
            let len = info.len;
            let before = self.reinserts.len();
            if !self.reclaim_oldest() {
                break;
            }
            // Its hot entries are dropped too, not rewritten: each would keep the unlinked
            // file (and all its blocks) open through the index.
            for (key, loc) in self.reinserts.drain(before..) {
                self.sh.index.remove_if_is(&key, &loc);
            }
            freed += len;
        }
        if freed > 0 {
            tracing::warn!(
                "SSD cache: gave back {freed} bytes of {} to the write-back journal",
                self.sh.dir.display()
            );
        }
        freed
    }

    /// Drops the oldest segment: its hit entries are queued for rewriting (they stay readable
    /// from the unlinked file until then), the others leave the index, the file is unlinked.
    fn reclaim_oldest(&mut self) -> bool {
        let Some((seq, info)) = self.segs.pop_first() else {
            return false;
        };
        let mut keys = std::mem::take(&mut *info.seg.keys.lock());
        // A key written twice into this segment is listed twice: visit it once.
        keys.sort_unstable_by_key(|k| (k.dev, k.ino, k.idx, k.kind));
        keys.dedup();
        for key in keys {
            let hot = self.sh.index.with_entry(&key, |shard| {
                let (here, hit) = match shard.get(&key) {
                    Some(e) => (Arc::ptr_eq(&e.seg, &info.seg), e.hit.load(Relaxed)),
                    None => return None,
                };
                if !here {
                    return None;
                }
                if hit {
                    return shard.get(&key).map(|e| e.loc());
                }
                shard.remove(&key);
                None
            });
            if let Some(loc) = hot {
                self.reinserts.push_back((key, loc));
            }
        }
        // A kept read-around window would hold the unlinked file's space.
        self.sh.windows.forget(&info.seg);
        if let Err(e) = std::fs::remove_file(&info.seg.path) {
            tracing::warn!("SSD cache: cannot remove {}: {e}", info.seg.path.display());
        }
        self.sh.fill.fetch_sub(info.len, Relaxed);
        self.sh.segments.store(self.segs.len() as u64, Relaxed);
        inc(&self.sh.ctr.reclaimed_segments);
        self.dirty.retain(|s| s.seq != seq);
        self.changed = true;
        true
    }
}
