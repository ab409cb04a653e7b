//! The read path: RAM tier hit, else one single-flight fetch from the backing store, with
//! sequential read-ahead. Every fetch is checked against the file's fingerprint afterwards, so
//! blocks of a version that changed mid-fetch are never cached or returned.

use crate::file_state::{racy, Version};
use crate::fs::{Fs, OpenFile};
use crate::meta_codec::version_of;
use crate::served::Admit;
use crate::stats::{FsStats, Gauge};
use crate::stream_depth::{DepthProbe, WINDOW_CHUNKS};
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_cache::{BlockKey, Claim, FlightGuard, SsdKey, KIND_DATA};
use tierfs_store::{Errno, Result, Store};

#[derive(Clone, Debug)]
pub(crate) enum FetchError {
    Errno(Errno),
    /// The backing file changed while the fetch ran.
    Stale,
}

pub(crate) type FetchResult = std::result::Result<Bytes, FetchError>;

/// Sequential-access detector and read-ahead cursor of one open file.
#[derive(Default)]
pub(crate) struct ReadAhead {
    /// Block a sequential reader asks for next (the stream's head).
    next: u64,
    /// Current window, blocks; doubles while the reader stays sequential.
    window: u64,
    /// Read-ahead should reach this block (exclusive).
    scheduled_to: u64,
    /// Read-ahead has fetched (or claimed) up to this block (exclusive).
    fetched_to: u64,
    /// Version the cursor belongs to.
    gen: u64,
    /// Read-ahead workers fetching for this file.
    workers: u32,
    /// How many may (see `stream_depth`); made when the stream turns out sequential.
    probe: Option<DepthProbe>,
}

const MAX_STALE_RETRIES: usize = 3;

/// The blocks covering `[offset, end)` and the range itself.
struct Span {
    first: u64,
    last: u64,
    offset: u64,
    end: u64,
}

impl<S: Store> Fs<S> {
    fn key(&self, _of: &OpenFile<S>, gen: u64, idx: u64) -> BlockKey {
        BlockKey { gen, idx }
    }

    /// The block's key in the SSD tier: backing identity, not the process-local `gen`, so it
    /// stays valid across restarts; the version (from the fingerprint) is checked per read.
    fn ssd_key(&self, of: &OpenFile<S>, idx: u64) -> SsdKey {
        let (dev, ino) = of.state.id();
        SsdKey {
            kind: KIND_DATA,
            dev,
            ino,
            idx,
        }
    }

    /// Length of block `idx` in version `v`.
    fn block_len(&self, v: &Version, idx: u64) -> u64 {
        let bs = self.cfg.block_size;
        v.fp.size.saturating_sub(idx * bs).min(bs)
    }

    fn ssd_buffered(&self, of: &OpenFile<S>, v: &Version, idx: u64) -> Option<Bytes> {
        let ssd = self.ssd.as_ref()?;
        let b = ssd.get_buffered(&self.ssd_key(of, idx), version_of(&v.fp))?;
        (b.len() as u64 == self.block_len(v, idx)).then_some(b)
    }

    /// Completes the claimed blocks the SSD tier holds (whole, verified, read in large runs)
    /// and puts them in the RAM tier; returns the claims it could not serve.
    fn load_from_ssd<'a>(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        leaders: Vec<FlightGuard<'a, BlockKey, FetchResult>>,
        out: &mut Vec<(u64, Bytes)>,
    ) -> Vec<FlightGuard<'a, BlockKey, FetchResult>> {
        let Some(ssd) = &self.ssd else {
            return leaders;
        };
        let keys: Vec<SsdKey> = leaders
            .iter()
            .map(|g| self.ssd_key(of, g.key().idx))
            .collect();
        let got = ssd.get_many(&keys, version_of(&v.fp));
        let mut rest = Vec::new();
        for (g, b) in leaders.into_iter().zip(got) {
            let idx = g.key().idx;
            // An entry of another length cannot belong to this version.
            match b.filter(|b| b.len() as u64 == self.block_len(v, idx)) {
                Some(b) => {
                    FsStats::add(&self.stats.ssd_blocks, 1);
                    self.cache.insert(*g.key(), b.clone());
                    out.push((idx, b.clone()));
                    g.complete(Ok(b));
                }
                None => rest.push(g),
            }
        }
        rest
    }

    fn span(&self, v: &Version, offset: u64, size: u32) -> Option<Span> {
        let end = (offset + size as u64).min(v.fp.size);
        if offset >= end {
            return None;
        }
        let bs = self.cfg.block_size;
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
        if of.state.expired(self.meta.ttl())
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
        if !self.cfg.meta_cto && !of.state.served.is(v.gen) {
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
            match self.cache.peek(&key) {
                Some(b) => blocks.push(b),
                // A small block the SSD tier holds in a read-around window: no I/O either.
                None => match self.ssd_buffered(&of, &v, idx) {
                    Some(b) => {
                        FsStats::add(&self.stats.ssd_blocks, 1);
                        self.cache.insert(key, b.clone());
                        blocks.push(b);
                    }
                    None => return false,
                },
            }
        }
        drop(guard);
        let bs = self.cfg.block_size;
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
            self.cache.count_hits(blocks.len() as u64, len as u64);
            self.count_read(len as u64, true);
            FsStats::add(&self.stats.read_inline, 1);
            self.read_ahead(&of, &v, &span);
        }
        ok
    }

    fn count_read(&self, bytes: u64, ram_only: bool) {
        FsStats::add(&self.stats.read_requests, 1);
        FsStats::add(&self.stats.read_bytes, bytes);
        if ram_only {
            FsStats::add(&self.stats.read_ram_only, 1);
        }
    }

    /// The full read path; may block on the backing store.
    pub fn read(self: &Arc<Self>, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Bytes> {
        let of = self.file_for(ino, fh, false)?;
        if of
            .state
            .has_dirty
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return self.read_over_dirty(&of, offset, size);
        }
        self.read_base(&of, offset, size)
    }

    /// What the tiers and the backing store hold (no dirty data of write-back).
    pub(crate) fn read_base(
        self: &Arc<Self>,
        of: &Arc<OpenFile<S>>,
        offset: u64,
        size: u32,
    ) -> Result<Bytes> {
        let of = of.clone();
        if of.state.expired(self.meta.ttl()) {
            let attr = self.fstat_as(&of.state, self.handle(&of)?)?;
            self.observe_data(&of.state, &attr);
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
                match self.cache.get(&self.key(&of, v.gen, idx)) {
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
                (missing.len(), span.first == span.last, self.ssd.as_ref())
            {
                let bs = self.cfg.block_size;
                let off = span.offset - span.first * bs;
                let len = span.end - span.offset;
                if len < self.block_len(&v, span.first) {
                    let key = self.ssd_key(&of, span.first);
                    if let Some(d) = ssd.read_range(&key, version_of(&v.fp), off as u32, len as u32)
                    {
                        drop(guard);
                        self.admit_version(&of, &v, offset)?;
                        FsStats::add(&self.stats.ssd_range_reads, 1);
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
        let n = self.store.read(self.handle(&of)?, offset, &mut buf)?;
        buf.truncate(n);
        self.refresh(&of)?;
        self.admit_version(&of, &of.state.version(), offset)?;
        self.count_read(n as u64, false);
        Ok(Bytes::from(buf))
    }

    fn refresh(&self, of: &OpenFile<S>) -> Result<()> {
        let attr = self.fstat_as(&of.state, self.handle(of)?)?;
        self.observe_data(&of.state, &attr);
        Ok(())
    }

    /// `meta.cto=off`: may data of version `v` read at `offset` go to the kernel, which may
    /// hold pages of an older version? ESTALE if it would mix two versions (see
    /// [`crate::served`]).
    fn admit_version(&self, of: &OpenFile<S>, v: &Version, offset: u64) -> Result<()> {
        if self.cfg.meta_cto {
            return Ok(());
        }
        match of.state.served.admit(v, offset) {
            Admit::Yes => Ok(()),
            Admit::YesDropOld => {
                self.drop_kernel_pages(of.inode.ino, &of.state, false);
                Ok(())
            }
            Admit::Refuse { drop } => {
                FsStats::add(&self.stats.version_mix_refusals, 1);
                if drop {
                    tracing::info!(
                        ino = of.inode.ino,
                        "file changed behind our back while the kernel held data of its old \
                         version: read refused with ESTALE rather than mixing two versions"
                    );
                    self.drop_kernel_pages(of.inode.ino, &of.state, true);
                }
                Err(Errno::ESTALE)
            }
        }
    }

    fn assemble(&self, span: &Span, blocks: &[Bytes]) -> Option<Bytes> {
        if blocks.len() == 1 {
            let base = span.first * self.cfg.block_size;
            let (s, e) = ((span.offset - base) as usize, (span.end - base) as usize);
            return (blocks[0].len() >= e).then(|| blocks[0].slice(s..e));
        }
        let mut out = BytesMut::with_capacity((span.end - span.offset) as usize);
        self.for_each_piece(span, blocks, |p| out.extend_from_slice(p))
            .then(|| out.freeze())
    }

    /// Feeds the part of each block that `span` covers to `f`, in order. False (and nothing
    /// fed) if a block is shorter than the file's size says: the file changed.
    fn for_each_piece(&self, span: &Span, blocks: &[Bytes], mut f: impl FnMut(&[u8])) -> bool {
        let bs = self.cfg.block_size;
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

    /// Loads the given blocks of version `v` (sorted). Blocks another reader is fetching are
    /// waited for when `wait`, skipped otherwise. The caller holds `of.state.rw` shared: claims
    /// are only ever made under it, so a writer cannot slip in between fetch and insert.
    pub(crate) fn load_blocks(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        idxs: &[u64],
        wait: bool,
    ) -> std::result::Result<Vec<(u64, Bytes)>, FetchError> {
        let mut out = Vec::with_capacity(idxs.len());
        let mut leaders: Vec<FlightGuard<'_, BlockKey, FetchResult>> = Vec::new();
        let mut followers = Vec::new();
        for &idx in idxs {
            let key = self.key(of, v.gen, idx);
            if let Some(b) = self.cache.peek(&key) {
                out.push((idx, b));
                continue;
            }
            match self.flights.claim(key) {
                Claim::Leader(g) => {
                    // A fetch may have finished between the peek and the claim.
                    if let Some(b) = self.cache.peek(&key) {
                        g.complete(Ok(b.clone()));
                        out.push((idx, b));
                    } else {
                        leaders.push(g);
                    }
                }
                Claim::Follower(w) if wait => followers.push((idx, w)),
                Claim::Follower(_) => {}
            }
        }
        if !leaders.is_empty() {
            leaders = self.load_from_ssd(of, v, leaders, &mut out);
        }
        // Contiguous leader blocks are fetched with one backing read each, up to fetch_chunk.
        let per_run = (self.cfg.fetch_chunk / self.cfg.block_size).max(1) as usize;
        let mut result: std::result::Result<(), FetchError> = Ok(());
        while !leaders.is_empty() {
            let mut n = 1;
            while n < leaders.len()
                && n < per_run
                && leaders[n].key().idx == leaders[n - 1].key().idx + 1
            {
                n += 1;
            }
            let run: Vec<_> = leaders.drain(..n).collect();
            if let Err(e) = &result {
                for g in run {
                    g.complete(Err(e.clone()));
                }
                continue;
            }
            match self.fetch_run(of, v, run, !wait) {
                Ok(mut got) => out.append(&mut got),
                Err(e) => result = Err(e),
            }
        }
        result?;
        for (idx, w) in followers {
            FsStats::add(&self.stats.singleflight_waits, 1);
            out.push((idx, w.wait()?));
        }
        Ok(out)
    }

    /// One backing read for a run of contiguous blocks this thread leads.
    fn fetch_run(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        run: Vec<FlightGuard<'_, BlockKey, FetchResult>>,
        readahead: bool,
    ) -> std::result::Result<Vec<(u64, Bytes)>, FetchError> {
        let bs = self.cfg.block_size;
        let first = run[0].key().idx;
        let start = first * bs;
        let end = ((first + run.len() as u64) * bs).min(v.fp.size);
        let _inflight = Gauge::new(&self.stats.fetch_inflight_bytes, end - start);
        let mut buf = vec![0u8; (end - start) as usize];
        // While the file is read sequentially, its backing reads go one at a time: two reads
        // of one stream in flight interleave at the store and cost a seek each on one disk
        // head. Random readers (no read-ahead window) keep their parallelism.
        // At a depth above 1 (a latency-bound store, see `stream_depth`) they go in parallel.
        let serial = {
            let ra = of.ra.lock();
            (readahead || ra.window > 0) && ra.depth() <= 1
        };
        let serial = serial.then(|| of.seq_fetch.lock());
        let handle = match self.handle(of) {
            Ok(h) => h,
            Err(e) => {
                for g in run {
                    g.complete(Err(FetchError::Errno(e)));
                }
                return Err(FetchError::Errno(e));
            }
        };
        let read = self.store.read(handle, start, &mut buf);
        drop(serial);
        // The version check comes after the data: if the fingerprint still matches, the data
        // read in between belongs to that version.
        let outcome = match read {
            Err(e) => Err(FetchError::Errno(e)),
            Ok(n) if n < buf.len() => Err(FetchError::Stale),
            Ok(_) => match self.fstat_as(&of.state, handle) {
                Err(e) => Err(FetchError::Errno(e)),
                Ok(a) if a.fingerprint() != v.fp => Err(FetchError::Stale),
                // A write that started before our read may still be running: the same
                // fingerprint does not prove these bytes are one version. Serve, don't cache.
                Ok(a) => Ok(!racy(&a.fingerprint())),
            },
        };
        let cacheable = match outcome {
            Ok(c) => c,
            Err(e) => {
                if matches!(e, FetchError::Stale) {
                    FsStats::add(&self.stats.stale_fetches, 1);
                }
                for g in run {
                    g.complete(Err(e.clone()));
                }
                return Err(e);
            }
        };
        let counter = if readahead {
            &self.stats.readahead_blocks
        } else {
            &self.stats.fetched_blocks
        };
        FsStats::add(counter, run.len() as u64);
        let mut out = Vec::with_capacity(run.len());
        for (i, g) in run.into_iter().enumerate() {
            let s = i * bs as usize;
            let e = ((i + 1) * bs as usize).min(buf.len());
            // One allocation per block, so evicting one block frees its memory.
            let block = Bytes::copy_from_slice(&buf[s..e]);
            let key = *g.key();
            if cacheable {
                self.cache.insert(key, block.clone());
                if let Some(ssd) = &self.ssd {
                    // Admission at fill, within the SSD tier's write budget.
                    ssd.offer(self.ssd_key(of, key.idx), version_of(&v.fp), block.clone());
                }
            }
            g.complete(Ok(block.clone()));
            out.push((key.idx, block));
        }
        Ok(out)
    }

    /// Detects sequential reading and extends the read-ahead target. One worker per open file
    /// fetches toward the target in order, one chunk at a time: on a single disk head (or one
    /// NFS stream) parallel or out-of-order fetches of one file cost a seek each, which is what
    /// read-ahead exists to avoid.
    fn read_ahead(self: &Arc<Self>, of: &Arc<OpenFile<S>>, v: &Version, span: &Span) {
        let max_blocks = self.readahead_max.load(Relaxed) / self.cfg.block_size;
        // Blocks of a racy version are not cached: fetching them ahead would be wasted.
        if max_blocks == 0 || racy(&v.fp) {
            return;
        }
        let nblocks = v.fp.size.div_ceil(self.cfg.block_size);
        let chunk = (self.cfg.fetch_chunk / self.cfg.block_size).max(1);
        let spawn = {
            let mut ra = of.ra.lock();
            // The kernel keeps several requests of one stream in flight and they may reach us
            // out of order: anything near the stream's head counts as sequential.
            let slack = ra.window + 8;
            let sequential = (span.first == 0 && span.offset == 0)
                || (ra.next > 0 && span.first + slack >= ra.next && span.first <= ra.next + slack);
            if !sequential {
                // Workers still running finish their chunk and count themselves out.
                let (workers, probe) = (ra.workers, ra.probe.take());
                *ra = ReadAhead {
                    next: span.last + 1,
                    workers,
                    probe,
                    ..ReadAhead::default()
                };
                return;
            }
            ra.next = ra.next.max(span.last + 1);
            if ra.gen != v.gen {
                ra.gen = v.gen;
                ra.fetched_to = 0;
                ra.scheduled_to = 0;
            }
            let depth = ra
                .probe
                .get_or_insert_with(|| {
                    DepthProbe::new(self.seq_depth.load(Relaxed), self.cfg.readahead_depth)
                })
                .level() as u64;
            // Room for `depth` chunks in flight, within `readahead.max`.
            ra.window = (ra.window * 2).clamp(4, max_blocks.max(4));
            let target = (ra.next + ra.window.max((depth * chunk).min(max_blocks))).min(nblocks);
            ra.scheduled_to = ra.scheduled_to.max(target);
            ra.fetched_to = ra.fetched_to.max(ra.next);
            let unclaimed = ra
                .scheduled_to
                .saturating_sub(ra.fetched_to)
                .div_ceil(chunk);
            let n = (depth as u32)
                .saturating_sub(ra.workers)
                .min(unclaimed as u32);
            ra.workers += n;
            n
        };
        for _ in 0..spawn {
            let (fs, of) = (self.clone(), of.clone());
            self.ra_pool.spawn(move || fs.read_ahead_worker(&of));
        }
    }

    /// One of a stream's read-ahead workers: fetches the stream's next unclaimed chunk until
    /// there is none. With a depth above 1 several run at once, on consecutive chunks.
    fn read_ahead_worker(&self, of: &OpenFile<S>) {
        let chunk = (self.cfg.fetch_chunk / self.cfg.block_size).max(1);
        let window = WINDOW_CHUNKS * chunk * self.cfg.block_size;
        loop {
            let (from, to, gen) = {
                let mut ra = of.ra.lock();
                if ra.fetched_to >= ra.scheduled_to || ra.workers > ra.depth() {
                    ra.workers -= 1;
                    if ra.workers == 0 {
                        if let Some(p) = ra.probe.as_mut() {
                            p.idle();
                        }
                    }
                    return;
                }
                let from = ra.fetched_to;
                let to = (from + chunk).min(ra.scheduled_to);
                ra.fetched_to = to;
                if let Some(p) = ra.probe.as_mut() {
                    p.started();
                }
                (from, to, ra.gen)
            };
            let stop = || of.ra.lock().workers -= 1;
            let _r = of.state.rw.read();
            let v = of.state.version();
            if v.gen != gen {
                stop();
                return; // the file changed; this read-ahead is for a version that is gone
            }
            let idxs: Vec<u64> = (from..to)
                .filter(|&i| !self.cache.contains(&self.key(of, gen, i)))
                .collect();
            if self.load_blocks(of, &v, &idxs, false).is_err() {
                stop();
                return;
            }
            let bytes = idxs.len() as u64 * self.cfg.block_size;
            let settled = of
                .ra
                .lock()
                .probe
                .as_mut()
                .and_then(|p| p.completed(bytes, window));
            if let Some(k) = settled {
                self.seq_depth.store(k, Relaxed);
            }
        }
    }
}

impl ReadAhead {
    /// Backing reads the stream may have in flight.
    fn depth(&self) -> u32 {
        self.probe.as_ref().map_or(1, |p| p.level())
    }
}
