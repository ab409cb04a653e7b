//! The write path (write-through): the backing store first, then the cached blocks and the
//! fingerprint, under the file's exclusive lock, so a concurrent reader sees all of a write
//! or none of it.

use super::{Objects, OpenFile};
use crate::stats::FsStats;
use bytes::Bytes;
use tierfs_cache::BlockKey;
use tierfs_store::{Result, Store};

impl<S: Store> Objects<S> {
    /// A write in write-through mode (or of a file write-back cannot journal).
    pub(crate) fn write_through(&self, of: &OpenFile<S>, offset: u64, data: &Bytes) -> Result<u32> {
        let handle = self.handle(of)?;
        of.state
            .changed_direct
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _w = of.state.rw.write();
        // The cached blocks must belong to what the backing file holds now, or patching them
        // would mix versions. Within `meta.ttl` of the last check the fingerprint is trusted,
        // as reads trust it; past it, the store is asked (under the lock, so what it says
        // includes every earlier write of ours: see `FileState::settle_own_writes`).
        if of
            .state
            .expired(|fp, at| self.ns.meta.version_expired(fp, at))
        {
            let before = self.sh.fstat_as(&of.state, handle)?;
            self.sh.settle_own_writes(&of.state, &before);
        }
        let v = of.state.version();
        // Until `wrote` below (see `FileState::own_change`).
        let _own = of.state.own_change();
        let at = match self.sh.store.write(handle, offset, data) {
            Ok(at) => at,
            Err(e) => {
                // Part of it may have landed.
                of.state.invalidate(None);
                self.ns.meta.drop_attr(of.inode.id());
                return Err(e);
            }
        };
        FsStats::add(&self.sh.stats.write_requests, 1);
        FsStats::add(&self.sh.stats.write_bytes, data.len() as u64);
        // No fstat after the write: on a network store it is a round trip per write (sshfs
        // drops its attributes at every write), which halved write-through throughput. The
        // new size is what the write explains; the times are learnt at the next check (a
        // read or write after `meta.ttl`, a read that misses, an open, a getattr), which
        // also catches a writer at the same time that changed the size.
        self.ns.meta.drop_attr(of.inode.id());
        let new_size = v.fp.size.max(at + data.len() as u64);
        self.patch_blocks_shared(v.gen, v.fp.size, at, data, new_size);
        of.state.wrote(v.gen, new_size);
        Ok(data.len() as u32)
    }

    /// copy_file_range: the store copies (`Store::copy_range`: a reflink or a server-side
    /// copy, so the data never comes through us), under the destination's exclusive lock (it
    /// is a write) and the source's shared one. The destination's cached blocks are dropped:
    /// its new contents never passed through the tiers. (The kernel drops its own pages of
    /// the destination range.) ENOSYS: the store cannot; the kernel then copies by reading
    /// and writing through us.
    pub(crate) fn copy_range(
        &self,
        src: &OpenFile<S>,
        off_in: u64,
        dst: &OpenFile<S>,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let (hs, hd) = (self.handle(src)?, self.handle(dst)?);
        dst.state
            .changed_direct
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _w = dst.state.rw.write();
        let _r = (!std::sync::Arc::ptr_eq(&src.state, &dst.state)).then(|| src.state.rw.read());
        let r = self.sh.store.copy_range(hs, off_in, hd, off_out, len);
        if r != Err(tierfs_store::Errno(libc::ENOSYS)) {
            self.ns.meta.drop_attr(dst.inode.id());
            let attr = self.sh.fstat_as(&dst.state, hd).ok();
            dst.state.invalidate(attr.as_ref());
        }
        if let Ok(n) = r {
            FsStats::add(&self.sh.stats.write_requests, 1);
            FsStats::add(&self.sh.stats.write_bytes, n);
        }
        r
    }

    /// Applies a write that landed at `at` to the cached blocks of generation `gen`: cached
    /// blocks are patched (and zero-extended where the file grew), blocks the write covers
    /// whole are inserted, others are left to be fetched. The caller hands the data over as a
    /// buffer of its own: a block the write covers whole and that is not cached yet is cached
    /// as a slice of that buffer, not a copy. Why: every copy is a fresh 64 KiB allocation
    /// while the RAM tier grows (and after the pressure monitor hands freed memory back), and
    /// the kernel's zeroing of those fresh pages cost as much as the store's own write (perf,
    /// 1 MiB write-through writes to a tmpfs store: 38% of the daemon's time in clear_page).
    /// The buffer then lives as long as one of its blocks is cached; the blocks of one write
    /// are inserted together and age together.
    pub(crate) fn patch_blocks_shared(
        &self,
        gen: u64,
        old_size: u64,
        at: u64,
        data: &Bytes,
        new_size: u64,
    ) {
        let bs = self.sh.cfg.block_size;
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
            let old = self.sh.cache.peek(&key);
            let covers = at <= bstart && end >= bstart + blen;
            if old.is_none() && !covers {
                continue;
            }
            if old.is_none() {
                // Covered whole and not cached: a slice of the caller's buffer (see
                // above).
                let s = (bstart - at) as usize;
                self.sh.cache.insert(key, data.slice(s..s + blen as usize));
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
            self.sh.cache.insert(key, Bytes::from(buf));
        }
    }

    /// The store set `st`'s file to `size` bytes (it was `old_size`), answering `a`: the
    /// cached blocks go with the old version, and an empty file extended so has its zeros
    /// cached (`cache_zeros`). Shared by a truncate done on the store and write-back's
    /// deferred one (`writeback::ns_truncate`).
    pub(crate) fn resized(
        &self,
        st: &crate::file_state::FileState,
        old_size: u64,
        a: &tierfs_store::Attr,
        size: u64,
    ) {
        st.invalidate(Some(a));
        if old_size == 0 && a.size == size {
            self.cache_zeros(st.version().gen, size);
        }
    }

    /// An empty file just extended to `size` by a truncate (generation `gen`): it reads as
    /// zeros, so its blocks are cached as zeros (slices of one shared zero block: no memory
    /// per block) instead of fetched from the store at the first read. Linkers (`lld`,
    /// `mold`) make their output so: `ftruncate` to the final size, then write it through
    /// `mmap`, whose first touch of each page reads it. A build's every build script and
    /// proc-macro fetched its size in zeros from the store. Up to [`ZERO_FILL_MAX`]: a sparse
    /// file made huge is left to be read from the store (a block read, rarely, in a hole).
    pub(crate) fn cache_zeros(&self, gen: u64, size: u64) {
        if size > ZERO_FILL_MAX {
            return;
        }
        let bs = self.sh.cfg.block_size;
        let zero = Bytes::from(vec![0u8; bs as usize]);
        for idx in 0..size.div_ceil(bs) {
            let len = bs.min(size - idx * bs) as usize;
            self.sh
                .cache
                .insert(BlockKey { gen, idx }, zero.slice(..len));
        }
    }
}

/// The largest file [`Objects::cache_zeros`] caches the zeros of.
const ZERO_FILL_MAX: u64 = 64 << 20;
