//! Read-ahead: a sequential stream is detected per open file and fetched ahead of the reader
//! by workers of the read-ahead pool, as many at once as the stream's measured depth allows
//! (one on a disk head, several on a latency-bound link: see `stream_depth`).

use super::read::Span;
use super::{Objects, OpenFile};
use crate::stream_depth::{DepthProbe, WINDOW_CHUNKS};
use crate::version::{racy, Version};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_store::Store;

/// Sequential-access detector and read-ahead cursor of one open file.
#[derive(Default)]
pub(crate) struct ReadAhead {
    /// Block a sequential reader asks for next (the stream's head).
    pub next: u64,
    /// Current window, blocks; doubles while the reader stays sequential.
    pub window: u64,
    /// Read-ahead should reach this block (exclusive).
    pub scheduled_to: u64,
    /// Read-ahead has fetched (or claimed) up to this block (exclusive).
    pub fetched_to: u64,
    /// Version the cursor belongs to.
    pub gen: u64,
    /// Read-ahead workers fetching for this file.
    pub workers: u32,
    /// How many may (see `stream_depth`); made when the stream turns out sequential.
    pub probe: Option<DepthProbe>,
}

impl ReadAhead {
    /// Backing reads the stream may have in flight.
    pub(crate) fn depth(&self) -> u32 {
        self.probe.as_ref().map_or(1, |p| p.level())
    }
}

impl<S: Store> Objects<S> {
    /// Detects sequential reading and extends the read-ahead target. One worker per open file
    /// fetches toward the target in order, one chunk at a time: on a single disk head (or one
    /// NFS stream) parallel or out-of-order fetches of one file cost a seek each, which is what
    /// read-ahead exists to avoid.
    pub(crate) fn read_ahead(self: &Arc<Self>, of: &Arc<OpenFile<S>>, v: &Version, span: &Span) {
        let max_blocks = self.readahead_max.load(Relaxed) / self.sh.cfg.block_size;
        // Blocks of a racy version are not cached: fetching them ahead would be wasted.
        if max_blocks == 0 || racy(&v.fp) {
            return;
        }
        let nblocks = v.fp.size.div_ceil(self.sh.cfg.block_size);
        let chunk = (self.sh.cfg.fetch_chunk / self.sh.cfg.block_size).max(1);
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
                .get_or_insert_with(|| self.seq_depth.probe(self.sh.cfg.readahead_depth))
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
    pub(crate) fn read_ahead_worker(&self, of: &OpenFile<S>) {
        let chunk = (self.sh.cfg.fetch_chunk / self.sh.cfg.block_size).max(1);
        let window = WINDOW_CHUNKS * chunk * self.sh.cfg.block_size;
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
                .filter(|&i| !self.sh.cache.contains(&self.key(of, gen, i)))
                .collect();
            if self.load_blocks(of, &v, &idxs, false).is_err() {
                stop();
                return;
            }
            let bytes = idxs.len() as u64 * self.sh.cfg.block_size;
            let settled = of
                .ra
                .lock()
                .probe
                .as_mut()
                .and_then(|p| p.completed(bytes, window));
            if let Some(v) = settled {
                tracing::debug!("read-ahead: a sequential stream settled on {v:?}");
                self.seq_depth.settled(v);
            }
        }
    }
}
