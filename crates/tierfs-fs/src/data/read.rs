//! The read path: RAM tier hit, else one single-flight fetch from the backing store, with
//! sequential read-ahead. Every fetch is checked against the file's fingerprint afterwards, so
//! blocks of a version that changed mid-fetch are never cached or returned.

use super::{FetchError, Objects, OpenFile};
use crate::meta_codec::version_of;
use crate::served::Admit;
use crate::stats::FsStats;
use crate::version::Version;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use tierfs_cache::{BlockKey, SsdKey, KIND_DATA};
use tierfs_store::{Errno, Result, Store};

const MAX_STALE_RETRIES: usize = 3;

/// The blocks covering `[offset, end)` and the range itself.
pub(crate) struct Span {
    pub first: u64,
    pub last: u64,
    pub offset: u64,
    pub end: u64,
}

impl<S: Store> Objects<S> {
    pub(crate) fn key(&self, _of: &OpenFile<S>, gen: u64, idx: u64) -> BlockKey {
        BlockKey { gen, idx }
    }

    /// The block's key in the SSD tier: backing identity, not the process-local `gen`, so it
    /// stays valid across restarts; the version (from the fingerprint) is checked per read.
    pub(crate) fn ssd_key(&self, of: &OpenFile<S>, idx: u64) -> SsdKey {
        let (dev, ino) = of.state.id();
        SsdKey {
            kind: KIND_DATA,
            dev,
            ino,
            idx,
        }
    }

    /// Length of block `idx` in version `v`.
    pub(crate) fn block_len(&self, v: &Version, idx: u64) -> u64 {
        let bs = self.sh.cfg.block_size;
        v.fp.size.saturating_sub(idx * bs).min(bs)
    }

    pub(crate) fn ssd_buffered(&self, of: &OpenFile<S>, v: &Version, idx: u64) -> Option<Bytes> {
        let ssd = self.sh.ssd.as_ref()?;
        let b = ssd.get_buffered(&self.ssd_key(of, idx), version_of(&v.fp))?;
        (b.len() as u64 == self.block_len(v, idx)).then_some(b)
    }

    pub(crate) fn span(&self, v: &Version, offset: u64, size: u32) -> Option<Span> {
        let end = (offset + size as u64).min(v.fp.size);
        if offset >= end {
            return None;
        }
        let bs = self.sh.cfg.block_size;
        Some(Span {
            first: offset / bs,
            last: (end - 1) / bs,
            offset,
            end,
        })
    }

    /// The fast path, safe to run on a FUSE worker thread: answers only if every block is in
    /// RAM and the file's fingerprint is fresh, and never blocks on I/O. Hands the data to
    /// `reply` and returns whether it did. A request spanning several blocks is assembled in a per-thread buffer
    /// that is reused, not in a fresh allocation: a fresh 1 MiB buffer per request costs page
    /// faults that halved warm read throughput.
    pub fn read_cached_with(
        self: &Arc<Self>,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        reply: impl FnOnce(&[u8]),
    ) -> bool {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let Ok(of) = self.file_for(ino, fh, false) else {
            return false;
        };
        if of
            .state
            .expired(|fp, at| self.ns.meta.version_expired(fp, at))
            || of
                .state
                .has_dirty
                .load(std::sync::atomic::Ordering::Acquire)
        {
            return false;
        }
        let Some(guard) = of.state.rw.try_read() else {
            return false;
        };
        let v = of.state.version();
        // `meta.cto=off`: the kernel may hold another version's data; the I/O path decides.
        if !self.sh.cfg.meta_cto && !of.state.served.is(v.gen) {
            return false;
        }
        let Some(span) = self.span(&v, offset, size) else {
            drop(guard);
            self.count_read(0, true);
            reply(&[]);
            return true;
        };
        let mut blocks = Vec::with_capacity((span.last - span.first + 1) as usize);
        for idx in span.first..=span.last {
            let key = self.key(&of, v.gen, idx);
            match self.sh.cache.peek(&key) {
                Some(b) => blocks.push(b),
                // A small block the SSD tier holds in a read-around window: no I/O either.
                None => match self.ssd_buffered(&of, &v, idx) {
                    Some(b) => {
                        FsStats::add(&self.sh.stats.ssd_blocks, 1);
                        self.sh.cache.insert(key, b.clone());
                        blocks.push(b);
                    }
                    None => return false,
                },
            }
        }
        drop(guard);
        let bs = self.sh.cfg.block_size;
        let base = span.first * bs;
        let len = (span.end - span.offset) as usize;
        let ok = if blocks.len() == 1 {
            let (s, e) = ((span.offset - base) as usize, (span.end - base) as usize);
            if blocks[0].len() < e {
                return false;
            }
            reply(&blocks[0][s..e]);
            true
        } else {
            SCRATCH.with(|buf| {
                let mut buf = buf.borrow_mut();
                buf.clear();
                let ok = self.for_each_piece(&span, &blocks, |p| buf.extend_from_slice(p));
                if ok {
                    reply(&buf);
                }
                ok
            })
        };
        if ok {
            self.sh.cache.count_hits(blocks.len() as u64, len as u64);
            self.count_read(len as u64, true);
            FsStats::add(&self.sh.stats.read_inline, 1);
            self.read_ahead(&of, &v, &span);
        }
        ok
    }

    pub(crate) fn count_read(&self, bytes: u64, ram_only: bool) {
        FsStats::add(&self.sh.stats.read_requests, 1);
        FsStats::add(&self.sh.stats.read_bytes, bytes);
        if ram_only {
            FsStats::add(&self.sh.stats.read_ram_only, 1);
        }
    }

    /// The full read path, of what the tiers and the backing store hold (no dirty data of
    /// write-back); may block on the backing store.
    pub(crate) fn read(
        self: &Arc<Self>,
        of: &Arc<OpenFile<S>>,
        offset: u64,
        size: u32,
    ) -> Result<Bytes> {
        let of = of.clone();
        // `meta.cto=off`: while the kernel drops its pages of an old version every read is
        // refused (see `admit_version`). Refused before fetching anything: the drop waits for
        // the pages that READs in flight hold locked, and a READ that first fetched from the
        // store held them that much longer (on a loaded machine, for seconds).
        if !self.sh.cfg.meta_cto && of.state.served.dropping() {
            FsStats::add(&self.sh.stats.version_mix_refusals, 1);
            return Err(Errno::ESTALE);
        }
        // While the store is gone or hangs (see `health`) what is cached is served unchecked,
        // even a fingerprint our own writes left provisional: the store cannot be asked. (The
        // check has a deadline: a store that stops answering during it is found hung.)
        let health = &self.sh.store.inner().health;
        if of
            .state
            .needs_check(|fp, at| self.ns.meta.version_expired(fp, at))
            && !health.gone()
        {
            match self.refresh(&of) {
                Err(Errno::ENOTCONN) if health.hung() || health.gone() => {}
                r => r?,
            }
        }
        for _ in 0..MAX_STALE_RETRIES {
            let guard = of.state.rw.read();
            let v = of.state.version();
            let Some(span) = self.span(&v, offset, size) else {
                self.count_read(0, true);
                return Ok(Bytes::new());
            };
            let mut blocks = Vec::with_capacity((span.last - span.first + 1) as usize);
            let mut missing = Vec::new();
            for idx in span.first..=span.last {
                match self.sh.cache.get(&self.key(&of, v.gen, idx)) {
                    Some(b) => blocks.push(Some(b)),
                    None => {
                        blocks.push(None);
                        missing.push(idx);
                    }
                }
            }
            let ram_only = missing.is_empty();
            // A small read inside one block that only the SSD tier holds (random reads of a
            // working set larger than RAM): read just its pages, without promoting the
            // whole block: reading 64 KiB to serve 4 KiB would cut SSD IOPS by 16.
            if let (1, true, Some(ssd)) =
                (missing.len(), span.first == span.last, self.sh.ssd.as_ref())
            {
                let bs = self.sh.cfg.block_size;
                let off = span.offset - span.first * bs;
                let len = span.end - span.offset;
                if len < self.block_len(&v, span.first) {
                    let key = self.ssd_key(&of, span.first);
                    if let Some(d) = ssd.read_range(&key, version_of(&v.fp), off as u32, len as u32)
                    {
                        drop(guard);
                        self.admit_version(&of, &v, offset)?;
                        FsStats::add(&self.sh.stats.ssd_range_reads, 1);
                        self.count_read(d.len() as u64, false);
                        return Ok(d);
                    }
                }
            }
            if !missing.is_empty() {
                match self.load_blocks(&of, &v, &missing, true) {
                    Ok(loaded) => {
                        for (idx, b) in loaded {
                            if (span.first..=span.last).contains(&idx) {
                                blocks[(idx - span.first) as usize] = Some(b);
                            }
                        }
                    }
                    Err(FetchError::Errno(e)) => return Err(e),
                    Err(FetchError::Stale) => {
                        drop(guard);
                        self.refresh(&of)?;
                        continue;
                    }
                }
            }
            drop(guard);
            let blocks: Option<Vec<Bytes>> = blocks.into_iter().collect();
            let Some(data) = blocks.and_then(|b| self.assemble(&span, &b)) else {
                // A block shorter than the file's size says: the file changed.
                self.refresh(&of)?;
                continue;
            };
            self.admit_version(&of, &v, offset)?;
            self.count_read(data.len() as u64, ram_only);
            self.read_ahead(&of, &v, &span);
            return Ok(data);
        }
        // The file keeps changing under us: serve what the backing store has now, uncached,
        // exactly as a direct read would.
        let mut buf = vec![0u8; size as usize];
        let n = self.sh.store.read(self.handle(&of)?, offset, &mut buf)?;
        buf.truncate(n);
        self.refresh(&of)?;
        self.admit_version(&of, &of.state.version(), offset)?;
        self.count_read(n as u64, false);
        Ok(Bytes::from(buf))
    }

    /// Asks the store for the file's fingerprint. Under the file's lock (shared), so the
    /// answer includes every write of ours that finished and settles a provisional one
    /// (`FileState::settle_own_writes`). Within `store.timeout` on a store that can hang
    /// (ENOTCONN past it): a reader of a file it has had open longer than `meta.ttl` must not
    /// wait, unkillable, for a frozen server to answer about data the tiers hold. The caller
    /// must not hold the lock.
    pub(crate) fn refresh(&self, of: &Arc<OpenFile<S>>) -> Result<()> {
        let _r = of.state.rw.read();
        let fetched = std::time::Instant::now();
        let mut attr = if of.handle.get().is_some() {
            self.sh
                .store
                .inner()
                .fstat_owned(of.clone(), |of| of.handle.get().map(|h| h.inner()))?
        } else {
            // Opened from the caches, no backing handle yet: the node's attributes (with the
            // same deadline), not an open of the backing file, which has none.
            self.sh.store.getattr(&self.ns.node(&of.inode)?)?
        };
        (attr.dev, attr.ino) = of.state.id();
        self.sh.settle_fetched(&of.state, &attr, fetched);
        Ok(())
    }

    /// `meta.cto=off`: may data of version `v` read at `offset` go to the kernel, which may
    /// hold pages of an older version? ESTALE if it would mix two versions (see
    /// [`crate::served`]).
    pub(crate) fn admit_version(&self, of: &OpenFile<S>, v: &Version, offset: u64) -> Result<()> {
        if self.sh.cfg.meta_cto {
            return Ok(());
        }
        match of.state.served.admit(v, offset) {
            Admit::Yes => Ok(()),
            Admit::YesDropOld => {
                self.sh.drop_kernel_pages(of.inode.ino, &of.state, false);
                Ok(())
            }
            Admit::Refuse { drop } => {
                FsStats::add(&self.sh.stats.version_mix_refusals, 1);
                if drop {
                    tracing::info!(
                        ino = of.inode.ino,
                        "file changed behind our back while the kernel held data of its old \
                         version: read refused with ESTALE rather than mixing two versions"
                    );
                    self.sh.drop_kernel_pages(of.inode.ino, &of.state, true);
                }
                Err(Errno::ESTALE)
            }
        }
    }

    pub(crate) fn assemble(&self, span: &Span, blocks: &[Bytes]) -> Option<Bytes> {
        if blocks.len() == 1 {
            let base = span.first * self.sh.cfg.block_size;
            let (s, e) = ((span.offset - base) as usize, (span.end - base) as usize);
            return (blocks[0].len() >= e).then(|| blocks[0].slice(s..e));
        }
        let mut out = BytesMut::with_capacity((span.end - span.offset) as usize);
        self.for_each_piece(span, blocks, |p| out.extend_from_slice(p))
            .then(|| out.freeze())
    }

    /// Feeds the part of each block that `span` covers to `f`, in order. False (and nothing
    /// fed) if a block is shorter than the file's size says: the file changed.
    pub(crate) fn for_each_piece(
        &self,
        span: &Span,
        blocks: &[Bytes],
        mut f: impl FnMut(&[u8]),
    ) -> bool {
        let bs = self.sh.cfg.block_size;
        let base = span.first * bs;
        let range = |i: usize| {
            let bstart = base + i as u64 * bs;
            let s = span.offset.max(bstart) - bstart;
            let e = span.end.min(bstart + bs) - bstart;
            (s as usize, e as usize)
        };
        if blocks.iter().enumerate().any(|(i, b)| b.len() < range(i).1) {
            return false;
        }
        for (i, b) in blocks.iter().enumerate() {
            let (s, e) = range(i);
            f(&b[s..e]);
        }
        true
    }
}
