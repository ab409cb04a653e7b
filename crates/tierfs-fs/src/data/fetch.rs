//! Loading blocks a reader or read-ahead needs: single-flight claims (one fetch per block at
//! a time), the SSD tier first, then the shared tier if there is one (`shared_tier`), then
//! contiguous runs from the backing store, each checked against the file's fingerprint
//! afterwards so a version that changed mid-fetch is never cached or returned.

use super::seq_gate::Ticket;
use super::{FetchError, FetchResult, Objects, OpenFile};
use crate::meta_codec::version_of;
use crate::stats::{FsStats, Gauge};
use crate::version::{racy, Version};
use bytes::Bytes;
use tierfs_cache::{BlockKey, Claim, FlightGuard, SsdKey};
use tierfs_store::Store;

impl<S: Store> Objects<S> {
    /// Completes the claimed blocks the SSD tier holds (whole, verified, read in large runs)
    /// and puts them in the RAM tier; returns the claims it could not serve.
    pub(crate) fn load_from_ssd<'a>(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        leaders: Vec<FlightGuard<'a, BlockKey, FetchResult>>,
        out: &mut Vec<(u64, Bytes)>,
    ) -> Vec<FlightGuard<'a, BlockKey, FetchResult>> {
        let Some(ssd) = &self.sh.ssd else {
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
                    FsStats::add(&self.sh.stats.ssd_blocks, 1);
                    self.sh.cache.insert(*g.key(), b.clone());
                    out.push((idx, b.clone()));
                    g.complete(Ok(b));
                }
                None => rest.push(g),
            }
        }
        rest
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
            if let Some(b) = self.sh.cache.peek(&key) {
                out.push((idx, b));
                continue;
            }
            match self.flights.claim(key) {
                Claim::Leader(g) => {
                    // A fetch may have finished between the peek and the claim.
                    if let Some(b) = self.sh.cache.peek(&key) {
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
        // A sequential stream's place at the store is taken now (see `seq_gate`).
        let mut ticket = match leaders.first() {
            Some(g) if self.serial(of, !wait) => {
                Some(of.seq_fetch.ticket(g.key().idx * self.sh.cfg.block_size))
            }
            _ => None,
        };
        if !leaders.is_empty() {
            leaders = self.load_from_ssd(of, v, leaders, &mut out);
        }
        let mut result: std::result::Result<(), FetchError> = Ok(());
        if !leaders.is_empty() {
            if let Some(tier) = self.shared_tier_for(v) {
                let all = std::mem::take(&mut leaders);
                result = self.load_through_shared(of, v, tier, all, !wait, ticket.take(), &mut out);
            }
        }
        // Contiguous leader blocks are fetched with one backing read each, up to fetch_chunk.
        let per_run = (self.sh.cfg.fetch_chunk / self.sh.cfg.block_size).max(1) as usize;
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
            match self.fetch_run(of, v, run, !wait, ticket.take()) {
                Ok(mut got) => out.append(&mut got),
                Err(e) => result = Err(e),
            }
        }
        // Given up before waiting for other readers' fetches: one of them may be queued
        // behind it at the gate (a place nobody takes would hold it there).
        drop(ticket);
        result?;
        for (idx, w) in followers {
            FsStats::add(&self.sh.stats.singleflight_waits, 1);
            out.push((idx, w.wait()?));
        }
        Ok(out)
    }

    /// While the file is read sequentially, its backing reads go one at a time, lowest offset
    /// first (`seq_gate`): two reads of one stream in flight interleave at the store and cost
    /// a seek each on one disk head. Random readers (no read-ahead window) keep their
    /// parallelism; at a depth above 1 (a latency-bound store, see `stream_depth`) reads go
    /// in parallel.
    fn serial(&self, of: &OpenFile<S>, readahead: bool) -> bool {
        let ra = of.ra.lock();
        (readahead || ra.window > 0) && ra.depth() <= 1
    }

    /// One backing read for a run of contiguous blocks this thread leads.
    pub(crate) fn fetch_run(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        run: Vec<FlightGuard<'_, BlockKey, FetchResult>>,
        readahead: bool,
        ticket: Option<Ticket<'_>>,
    ) -> std::result::Result<Vec<(u64, Bytes)>, FetchError> {
        let bs = self.sh.cfg.block_size;
        let first = run[0].key().idx;
        let start = first * bs;
        let end = ((first + run.len() as u64) * bs).min(v.fp.size);
        let (buf, cacheable) = match self.read_checked(of, v, start, end, readahead, ticket) {
            Ok(r) => r,
            Err(e) => {
                for g in run {
                    g.complete(Err(e.clone()));
                }
                return Err(e);
            }
        };
        self.count_fetched(readahead, run.len() as u64);
        let mut out = Vec::with_capacity(run.len());
        for (i, g) in run.into_iter().enumerate() {
            let s = i * bs as usize;
            let e = ((i + 1) * bs as usize).min(buf.len());
            // One allocation per block, so evicting one block frees its memory.
            let block = Bytes::copy_from_slice(&buf[s..e]);
            let key = *g.key();
            if cacheable {
                self.keep_block(of, v, key, &block, readahead);
            }
            g.complete(Ok(block.clone()));
            out.push((key.idx, block));
        }
        Ok(out)
    }

    pub(crate) fn count_fetched(&self, readahead: bool, blocks: u64) {
        let counter = if readahead {
            &self.sh.stats.readahead_blocks
        } else {
            &self.sh.stats.fetched_blocks
        };
        FsStats::add(counter, blocks);
    }

    /// Puts a block of version `v` in the RAM tier (`ahead`: read ahead of a sequential
    /// reader, see `RamCache::insert_ahead`) and offers it to the SSD tier (admission at
    /// fill, within the SSD tier's write budget).
    pub(crate) fn keep_block(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        key: BlockKey,
        block: &Bytes,
        ahead: bool,
    ) {
        if ahead {
            self.sh.cache.insert_ahead(key, block.clone());
        } else {
            self.sh.cache.insert(key, block.clone());
        }
        if let Some(ssd) = &self.sh.ssd {
            ssd.offer(self.ssd_key(of, key.idx), version_of(&v.fp), block.clone());
        }
    }

    /// Reads bytes `start..end` of version `v` from the backing store, then checks the
    /// version still holds: the data and whether it may be cached (not racy).
    pub(crate) fn read_checked(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        start: u64,
        end: u64,
        readahead: bool,
        ticket: Option<Ticket<'_>>,
    ) -> std::result::Result<(Bytes, bool), FetchError> {
        let _inflight = Gauge::new(&self.sh.stats.fetch_inflight_bytes, end - start);
        let want = (end - start) as usize;
        // A ticket for another offset (the SSD tier served the blocks before this run) is
        // given up before waiting: held, it would hold this very read back.
        let serial = match ticket {
            Some(t) if t.offset() == start && self.serial(of, readahead) => {
                Some(t.enter(want as u64))
            }
            other => {
                drop(other);
                self.serial(of, readahead)
                    .then(|| of.seq_fetch.enter(start, want as u64))
            }
        };
        let handle = self.handle(of).map_err(FetchError::Errno)?;
        let read = self.sh.store.read_bytes(handle, start, want);
        drop(serial);
        // The version check comes after the data: if the fingerprint still matches, the data
        // read in between belongs to that version.
        let outcome = match &read {
            Err(e) => Err(FetchError::Errno(*e)),
            Ok(b) if b.len() < want => Err(FetchError::Stale),
            Ok(_) => match self.sh.fstat_as(&of.state, handle) {
                Err(e) => Err(FetchError::Errno(e)),
                Ok(a) if a.fingerprint() != v.fp => Err(FetchError::Stale),
                // A write that started before our read may still be running: the same
                // fingerprint does not prove these bytes are one version. Serve, don't cache.
                Ok(a) => Ok(!racy(&a.fingerprint())),
            },
        };
        match outcome {
            Ok(cacheable) => Ok((read.unwrap_or_default(), cacheable)),
            Err(e) => {
                if matches!(e, FetchError::Stale) {
                    FsStats::add(&self.sh.stats.stale_fetches, 1);
                }
                Err(e)
            }
        }
    }
}
