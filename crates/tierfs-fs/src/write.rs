//! The write path (write-through): the backing store first, then the cached blocks and the
//! fingerprint, under the file's exclusive lock, so a concurrent reader sees all of a write
//! or none of it.

use crate::fs::{Fs, OpenFile};
use crate::stats::FsStats;
use bytes::Bytes;
use tierfs_cache::BlockKey;
use tierfs_store::{Result, Store};

impl<S: Store> Fs<S> {
    pub fn write(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_owned(ino, fh, offset, data.to_vec())
    }

    /// [`Fs::write`] of a buffer the caller gives away: write-back keeps it as the dirty
    /// extent without copying it.
    pub fn write_owned(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        data: impl Into<Bytes>,
    ) -> Result<u32> {
        let data: Bytes = data.into();
        let of = self.file_for(ino, fh, true)?;
        if data.is_empty() {
            return Ok(0);
        }
        match self.wb() {
            Some(wb) => {
                let n = self.write_back(wb, &of, offset, data)?;
                FsStats::add(&self.stats.write_requests, 1);
                FsStats::add(&self.stats.write_bytes, n as u64);
                Ok(n)
            }
            None => self.write_through(&of, offset, &data),
        }
    }

    /// The request's data as a buffer the core may keep: in write-back mode from huge-page
    /// regions (see `writebuf`), since it stays in RAM until flushed.
    pub fn write_buf(&self, data: &[u8]) -> Bytes {
        match self.wb() {
            Some(_) => self.write_bufs.copy(data),
            None => Bytes::copy_from_slice(data),
        }
    }

    /// A write-back write answered on the calling (FUSE) thread, without a hand-off to the
    /// I/O pool, when nothing in it can wait (see [`Fs::write_back_with`]). `Err` gives the
    /// data back: the caller sends it to [`Fs::write_owned`] on a thread that may wait.
    pub fn try_write_inline(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        data: Bytes,
    ) -> std::result::Result<Result<u32>, Bytes> {
        let Some(wb) = self.wb() else {
            return Err(data);
        };
        if data.is_empty() {
            return Err(data);
        }
        let of = match self.file_for(ino, fh, true) {
            Ok(of) => of,
            Err(e) => return Ok(Err(e)),
        };
        let r = self.write_back_with(wb, &of, offset, data, true)?;
        if let Ok(n) = r {
            FsStats::add(&self.stats.write_requests, 1);
            FsStats::add(&self.stats.write_bytes, n as u64);
        }
        Ok(r)
    }

    /// A write in write-through mode (or of a file write-back cannot journal).
    pub(crate) fn write_through(&self, of: &OpenFile<S>, offset: u64, data: &Bytes) -> Result<u32> {
        let handle = self.handle(of)?;
        let _w = of.state.rw.write();
        // The cached blocks must belong to what the backing file holds now, or patching them
        // would mix versions.
        let before = self.fstat_as(&of.state, handle)?;
        self.observe(&of.state, &before);
        let v = of.state.version();
        let at = match self.store.write(handle, offset, data) {
            Ok(at) => at,
            Err(e) => {
                // Part of it may have landed.
                of.state.invalidate(None);
                return Err(e);
            }
        };
        FsStats::add(&self.stats.write_requests, 1);
        FsStats::add(&self.stats.write_bytes, data.len() as u64);
        let Ok(after) = self.fstat_as(&of.state, handle) else {
            of.state.invalidate(None);
            self.meta.drop_attr(of.inode.id());
            return Ok(data.len() as u32);
        };
        self.meta.put_attr(&after, std::time::Instant::now());
        let end = at + data.len() as u64;
        if after.size != v.fp.size.max(end) {
            // Someone else changed the file at the same time: we cannot tell what it holds.
            of.state.invalidate(Some(&after));
        } else {
            self.patch_blocks(v.gen, v.fp.size, at, data, after.size);
            of.state.set_after_own_write(v.gen, &after);
        }
        Ok(data.len() as u32)
    }

    /// Applies a write that landed at `at` to the cached blocks of generation `gen`: cached
    /// blocks are patched (and zero-extended where the file grew), blocks the write covers
    /// whole are inserted, others are left to be fetched.
    pub(crate) fn patch_blocks(
        &self,
        gen: u64,
        old_size: u64,
        at: u64,
        data: &[u8],
        new_size: u64,
    ) {
        self.patch_blocks_inner(gen, old_size, at, data, new_size, true)
    }

    /// [`Fs::patch_blocks`] of the cached blocks only: none is created.
    pub(crate) fn patch_cached_blocks(
        &self,
        gen: u64,
        old_size: u64,
        at: u64,
        data: &[u8],
        new_size: u64,
    ) {
        self.patch_blocks_inner(gen, old_size, at, data, new_size, false)
    }

    fn patch_blocks_inner(
        &self,
        gen: u64,
        old_size: u64,
        at: u64,
        data: &[u8],
        new_size: u64,
        allocate: bool,
    ) {
        let bs = self.cfg.block_size;
        let end = at + data.len() as u64;
        let mut idxs: Vec<u64> = (at / bs..=(end - 1) / bs).collect();
        if !old_size.is_multiple_of(bs) && at > old_size && old_size / bs < at / bs {
            idxs.insert(0, old_size / bs); // the old last block, now followed by zeros
        }
        for idx in idxs {
            let bstart = idx * bs;
            let blen = bs.min(new_size.saturating_sub(bstart));
            if blen == 0 {
                continue;
            }
            let key = BlockKey { gen, idx };
            let old = self.cache.peek(&key);
            let covers = at <= bstart && end >= bstart + blen;
            if old.is_none() && !(covers && allocate) {
                continue;
            }
            let mut buf = vec![0u8; blen as usize];
            if let Some(o) = &old {
                let n = o.len().min(buf.len());
                buf[..n].copy_from_slice(&o[..n]);
            }
            let (s, e) = (at.max(bstart), end.min(bstart + blen));
            if s < e {
                buf[(s - bstart) as usize..(e - bstart) as usize]
                    .copy_from_slice(&data[(s - at) as usize..(e - at) as usize]);
            }
            self.cache.insert(key, Bytes::from(buf));
        }
    }
}
