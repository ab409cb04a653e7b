//! Serving entries of the SSD tier: the index looked up (a stale version dropped), a small
//! entry read with the read-around window around it, adjacent entries of one file read as
//! one run, hits counted, and an entry whose read failed dropped (the caller reads the store
//! instead). The page reads and their CRC checks are `read.rs`.

use super::read::{self, read_verified, ReadFail};
use super::stats::inc;
use super::{index, window, SsdCache, SsdKey};
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl SsdCache {
    /// The whole entry if it is stored with this version; every page CRC verified.
    pub fn get(&self, key: &SsdKey, version: u64) -> Option<Bytes> {
        self.read(key, version, 0, u32::MAX)
    }

    /// Bytes `offset .. offset + len` of the entry (clipped to its end); reads and verifies
    /// only the 4 KiB pages they touch. None if `offset` is past the end.
    pub fn read_range(&self, key: &SsdKey, version: u64, offset: u32, len: u32) -> Option<Bytes> {
        self.read(key, version, offset, len)
    }

    fn read(&self, key: &SsdKey, version: u64, offset: u32, len: u32) -> Option<Bytes> {
        let sh = &self.sh;
        let Some(loc) = sh.index.lookup(key, true) else {
            inc(&sh.ctr.misses);
            return None;
        };
        if loc.version != version {
            inc(&sh.ctr.misses);
            if sh.index.remove_if_is(key, &loc) {
                inc(&sh.ctr.stale_drops);
            }
            return None;
        }
        let small_whole = offset == 0 && len == u32::MAX && loc.len < window::SMALL;
        let around = if small_whole {
            sh.windows.find(&loc.seg, loc.off, loc.len).or_else(|| {
                sh.windows
                    .worth_it()
                    .then(|| sh.windows.read(&loc.seg, loc.off, loc.len))
                    .flatten()
            })
        } else {
            None
        };
        let result = match around {
            Some((data, base)) => read::verify_in(key, &loc, &data, base),
            None => read_verified(key, &loc, offset, len),
        };
        match result {
            Ok(b) => {
                inc(&sh.ctr.hits);
                sh.ctr.hit_bytes.fetch_add(b.len() as u64, Relaxed);
                Some(b)
            }
            Err(ReadFail::Range) => {
                inc(&sh.ctr.misses);
                None
            }
            Err(f) => {
                self.failed(key, &loc, f);
                None
            }
        }
    }

    /// Whole entries of one version (the blocks of one file version), in the order of
    /// `keys`. Entries stored next to each other are read with one I/O: the blocks of a file
    /// admitted in order lie in order in the log, so a sequential reader gets large reads
    /// instead of one 64 KiB read per block.
    pub fn get_many(&self, keys: &[SsdKey], version: u64) -> Vec<Option<Bytes>> {
        if let [key] = keys {
            // One entry: the single read path, with read-around for small ones.
            return vec![self.get(key, version)];
        }
        let sh = &self.sh;
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        let mut found: Vec<(usize, SsdKey, index::Loc)> = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            match sh.index.lookup(k, true) {
                Some(loc) if loc.version == version => found.push((i, *k, loc)),
                Some(loc) => {
                    inc(&sh.ctr.misses);
                    if sh.index.remove_if_is(k, &loc) {
                        inc(&sh.ctr.stale_drops);
                    }
                }
                None => inc(&sh.ctr.misses),
            }
        }
        found.sort_by(|a, b| {
            (Arc::as_ptr(&a.2.seg) as usize, a.2.off)
                .cmp(&(Arc::as_ptr(&b.2.seg) as usize, b.2.off))
        });
        let mut start = 0;
        while start < found.len() {
            let mut end = start + 1;
            while end < found.len() {
                let (p, n) = (&found[end - 1].2, &found[end].2);
                // Another segment ends the run (and its offsets are not comparable: the span
                // below would underflow).
                if !Arc::ptr_eq(&p.seg, &n.seg) {
                    break;
                }
                let gap = n.off.saturating_sub(p.off + p.len as u64);
                let span = n.off + n.len as u64 - found[start].2.off;
                // Close enough: only summary pages and padding between them.
                if gap > 64 << 10 || span > read::MAX_RUN_READ {
                    break;
                }
                end += 1;
            }
            let run: Vec<(SsdKey, index::Loc)> = found[start..end]
                .iter()
                .map(|(_, k, l)| (*k, l.clone()))
                .collect();
            for ((i, k, loc), r) in found[start..end].iter().zip(read::read_run(&run)) {
                match r {
                    Ok(b) => {
                        inc(&sh.ctr.hits);
                        sh.ctr.hit_bytes.fetch_add(b.len() as u64, Relaxed);
                        out[*i] = Some(b);
                    }
                    Err(f) => self.failed(k, loc, f),
                }
            }
            start = end;
        }
        out
    }

    /// A read of the entry at `loc` failed: counted, and the entry dropped (the caller reads
    /// the backing store instead; nothing unverified is ever returned).
    fn failed(&self, key: &SsdKey, loc: &index::Loc, f: ReadFail) {
        let sh = &self.sh;
        if f == ReadFail::Checksum {
            inc(&sh.ctr.checksum_errors);
            tracing::warn!(
                "SSD cache: checksum mismatch in {} at byte {}; entry dropped",
                loc.seg.path.display(),
                loc.off
            );
        } else {
            inc(&sh.ctr.io_errors);
        }
        inc(&sh.ctr.misses);
        sh.index.remove_if_is(key, loc);
    }

    /// The entry if it can be served without I/O (from a read-around window), for callers
    /// that must not block.
    pub fn get_buffered(&self, key: &SsdKey, version: u64) -> Option<Bytes> {
        let sh = &self.sh;
        let loc = sh.index.lookup(key, false)?;
        if loc.version != version || loc.len >= window::SMALL {
            return None;
        }
        let (data, base) = sh.windows.find(&loc.seg, loc.off, loc.len)?;
        let b = read::verify_in(key, &loc, &data, base).ok()?;
        sh.index.lookup(key, true);
        inc(&sh.ctr.hits);
        sh.ctr.hit_bytes.fetch_add(b.len() as u64, Relaxed);
        Some(b)
    }

    pub fn contains(&self, key: &SsdKey, version: u64) -> bool {
        self.sh.index.contains(key, version)
    }
}
