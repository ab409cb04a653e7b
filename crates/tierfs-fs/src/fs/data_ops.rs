//! The data operations of [`Fs`]: reads (the fast path included), writes, copy_file_range,
//! and pre-loading or evicting files. Write-back takes writes when it is on; reads of a file
//! with dirty data go through its overlay (see `data`).

use super::Fs;
use crate::data::{EvictReport, WarmError, WarmReport};
use crate::namespace::is_provisional;
use crate::stats::FsStats;
use bytes::Bytes;
use std::path::Path;
use std::sync::atomic::Ordering::Acquire;
use tierfs_store::{Errno, Result, Store};

/// In write-back, a source smaller than this is copied through reads and writes when the
/// store's copy would wait for write-back first (see [`Fs::copy_file_range`]).
const COPY_BY_STORE_MIN: u64 = 1 << 20;

impl<S: Store> Fs<S> {
    /// The fast path, safe to run on a FUSE worker thread: answers only if every block is in
    /// RAM (or an SSD read-around window) and the file's fingerprint is fresh, and never
    /// blocks on I/O. Hands the data to `reply` and returns whether it did.
    pub fn read_cached_with(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        reply: impl FnOnce(&[u8]),
    ) -> bool {
        let served = self.data.read_cached_with(ino, fh, offset, size, reply);
        if served {
            self.walk_without_open(ino, fh, offset);
        }
        served
    }

    /// With FUSE no-open (`meta.cto=off`) no OPEN reaches us: the first read of a file (handle
    /// 0, offset 0) is where a directory walk shows (see `data/siblings.rs`).
    fn walk_without_open(&self, ino: u64, fh: u64, offset: u64) {
        if fh == 0 && offset == 0 {
            self.data.opened_for_walk(ino);
        }
    }

    /// The full read path; may block on the backing store.
    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Bytes> {
        let of = self.data.file_for(ino, fh, false)?;
        self.walk_without_open(ino, fh, offset);
        if let Some(wb) = self.wb() {
            if of.state.has_dirty.load(Acquire) {
                return wb.read_over_dirty(&of, offset, size);
            }
        }
        self.cached_if_gone(|| self.data.read(&of, offset, size))
    }

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
        let of = self.data.file_for(ino, fh, true)?;
        if data.is_empty() {
            return Ok(0);
        }
        if offset.saturating_add(data.len() as u64) > self.sh.store.max_file_size() {
            // (See `Fs::setattr`.)
            return Err(Errno(libc::EFBIG));
        }
        let r = match self.wb() {
            Some(wb) => wb
                .write_back(&of, offset, data)
                .inspect(|&n| self.count_write(n)),
            None => self.data.write_through(&of, offset, &data),
        };
        self.ns.listed_changed(&of.inode);
        r
    }

    /// copy_file_range from `(ino_in, fh_in)` to `(ino_out, fh_out)`: done by the store
    /// (see `Objects::copy_range`), after write-back has put both files' dirty data on it,
    /// so the copy reads what the application wrote and lands after it. At most 1 GiB per
    /// call (the reply carries a 32-bit count; the caller loops, as for any short copy).
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u32> {
        let src = self.data.file_for(ino_in, fh_in, false)?;
        let dst = self.data.file_for(ino_out, fh_out, true)?;
        if let Some(wb) = self.wb() {
            // A copy by the store would wait for write-back: for a file it made (its create),
            // one with dirty data (its flush) or with a deferred setattr (a truncate by `cp`
            // over an existing file). For a small file EXDEV makes the kernel copy through
            // reads and writes instead (`splice_copy_file_range`; `cp` falls back so itself
            // on older kernels), which write-back absorbs: `cp -r` of 100 files of 2 KB into
            // a new directory over sshfs took 4.8 s, each waiting for its create on the
            // store; 0.07-0.2 s so. A large one is worth the wait: the store's copy does not
            // move its bytes through tierfs and back.
            let waits = |of: &crate::data::OpenFile<S>| {
                is_provisional(of.inode.id())
                    || of.state.has_dirty.load(Acquire)
                    || wb.chattr_pending(of.inode.ino)
            };
            let small = || {
                self.getattr(ino_in)
                    .is_ok_and(|a| a.size < COPY_BY_STORE_MIN)
            };
            if (waits(&src) || waits(&dst)) && small() {
                return Err(Errno(libc::EXDEV));
            }
            wb.settle_file(&src.inode)?;
            wb.settle_file(&dst.inode)?;
        }
        let n = self
            .data
            .copy_range(&src, off_in, &dst, off_out, len.min(1 << 30));
        self.ns.listed_changed(&dst.inode);
        Ok(n? as u32)
    }

    fn count_write(&self, n: u32) {
        FsStats::add(&self.sh.stats.write_requests, 1);
        FsStats::add(&self.sh.stats.write_bytes, n as u64);
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
    /// I/O pool, when nothing in it can wait. `Err` gives the data back: the caller sends it
    /// to [`Fs::write_owned`] on a thread that may wait.
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
        let of = match self.data.file_for(ino, fh, true) {
            Ok(of) => of,
            Err(e) => return Ok(Err(e)),
        };
        let r = wb.write_back_with(&of, offset, data, true)?;
        if let Ok(n) = r {
            self.count_write(n);
        }
        self.ns.listed_changed(&of.inode);
        Ok(r)
    }

    /// Pre-loads the regular file at `rel` into the SSD tier. With `budget`, admission waits
    /// for the SSD write budget; without, it takes none.
    pub fn warm_file(
        &self,
        rel: &Path,
        budget: bool,
    ) -> std::result::Result<WarmReport, WarmError> {
        self.data.warm_file(rel, budget)
    }

    /// Drops what the tiers hold of the object at `rel`.
    pub fn evict_path(&self, rel: &Path) -> std::result::Result<EvictReport, Errno> {
        self.data.evict_path(rel)
    }
}
