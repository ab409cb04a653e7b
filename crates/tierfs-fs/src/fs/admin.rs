//! The rest of [`Fs`]'s API, beside the filesystem operations: counters, tunables changed at
//! run time, the memory-pressure monitor, and starting and stopping write-back.

use super::Fs;
use crate::stats::{FsStats, StatsSnapshot};
use crate::writeback::{CloseMode, FsyncMode, WbConfig, Writeback};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tierfs_cache::{PressureConfig, PressureMonitor};
use tierfs_store::Store;

const NO_WRITEBACK: &str = "write-back is off on this mount (writeback.mode=through)";

impl<S: Store> Fs<S> {
    /// Hands the RAM tier's size to the memory-pressure monitor: with `enabled`, its target
    /// follows the host's memory between `cfg.min` and `cfg.max`; without, it is fixed at
    /// `cfg.max` (either way `ram.min`/`ram.max` can be changed at run time through
    /// [`Fs::pressure`]). Once per mount.
    pub fn start_pressure(&self, cfg: PressureConfig, enabled: bool) -> std::io::Result<()> {
        let mon = if enabled {
            PressureMonitor::start(self.sh.cache.clone(), cfg)?
        } else {
            PressureMonitor::fixed(self.sh.cache.clone(), cfg)
        };
        self.pressure
            .set(mon)
            .map_err(|_| std::io::Error::other("the pressure monitor is already running"))
    }

    /// The memory-pressure monitor, once started: `set_limits` changes `ram.min`/`ram.max`.
    pub fn pressure(&self) -> Option<&PressureMonitor> {
        self.pressure.get()
    }

    /// `meta.ttl`: cached attributes, listings and file fingerprints are judged by the new
    /// age limit from now on.
    pub fn set_meta_ttl(&self, ttl: Duration) {
        self.ns.meta.set_ttl(ttl);
    }

    /// `meta.ttl_min` (None: follow `meta.ttl`), for records made from now on.
    pub fn set_meta_ttl_min(&self, min: Option<Duration>) {
        self.ns.meta.set_ttl_min(min);
    }

    /// `meta.max_entries`, enforced at the next insertion.
    pub fn set_meta_max_entries(&self, n: usize) {
        self.ns.meta.set_max_entries(n);
    }

    /// `readahead.max`, for read-ahead decisions from now on (0 stops read-ahead).
    pub fn set_readahead_max(&self, bytes: u64) {
        self.data.readahead_max.store(bytes, Relaxed);
    }

    /// `prefetch.files` and `prefetch.max_file`: how far ahead of a directory walk files
    /// are loaded, and up to what size (`data/siblings.rs`).
    pub fn set_prefetch(&self, files: usize, max_file: u64) {
        self.data.prefetch_files.store(files, Relaxed);
        self.data.prefetch_max_file.store(max_file, Relaxed);
    }

    /// `ram.max`: the RAM tier's cap; shrinking evicts at once.
    pub fn set_ram_max(&self, bytes: u64) {
        // With the memory-pressure monitor running, `ram.max` is its upper bound: the
        // monitor sets the cap (its target) within it. Without it, the cap itself.
        match self.pressure() {
            Some(p) => {
                if p.set_limits(None, Some(bytes)).is_err() {
                    // ram.min above the new max: the min follows it down.
                    let _ = p.set_limits(Some(bytes), Some(bytes));
                }
            }
            None => self.sh.cache.set_capacity(bytes),
        }
    }

    /// Turns write-back on for this mount: opens the journal in `dir`, replays it, starts
    /// the flushers. Errors are one line for the user.
    pub fn start_writeback(
        &self,
        cfg: WbConfig,
        dir: &Path,
        reset: bool,
    ) -> std::result::Result<(), String> {
        let wb = Writeback::start(self.data.clone(), cfg, dir, reset)?;
        self.wb
            .set(wb)
            .map_err(|_| "write-back started twice".to_string())
    }

    /// A write-through mount over a cache dir that holds a write-back journal: its pending
    /// writes go to the backing store first; the journal is then closed, not used.
    pub fn replay_journal(
        &self,
        cfg: WbConfig,
        dir: &Path,
        reset: bool,
    ) -> std::result::Result<(), String> {
        crate::writeback::replay_journal(&self.sh.store, self.sh.ssd.clone(), cfg, dir, reset)
    }

    /// Whether this mount writes back (`writeback.mode=back`).
    pub fn writeback_enabled(&self) -> bool {
        self.wb().is_some()
    }

    /// `tierfs unmount`: writes every dirty byte to the backing store now and returns once
    /// they are there (the mount keeps serving; later writes are dirty again).
    pub fn sync_all(&self) -> Result<(), String> {
        match self.wb() {
            Some(wb) => wb
                .flush_all()
                .map_err(|e| format!("writing dirty data to the store: {e}")),
            None => Ok(()),
        }
    }

    /// A count that moves whenever write-back gets something onto the store (a namespace
    /// operation applied, bytes flushed, a file synced), read without a lock: the exit
    /// watch waits for a drain that makes progress, not for a store that hangs.
    pub fn drain_progress(&self) -> u64 {
        self.wb().map_or(0, |wb| wb.progress())
    }

    /// Unmount (or SIGTERM): drains every dirty byte to the backing store, then stops the
    /// flushers and closes the journal.
    pub fn shutdown_writeback(&self) {
        if let Some(wb) = self.wb() {
            wb.shutdown_writeback();
        }
    }

    /// After the mount is gone and [`Fs::shutdown_writeback`]: the SSD tier flushed,
    /// checkpointed and closed. Its session ends cleanly (the next mount trusts this
    /// session's listing records, see `namespace::persisted`) only if write-back left nothing
    /// for the next mount to replay: a replay changes what they describe.
    pub fn close_ssd(&self) {
        let Some(ssd) = self.ssd() else { return };
        let left = self
            .wb()
            .is_some_and(|wb| wb.dirty_bytes() > 0 || wb.ns_pending().0 > 0);
        if left {
            ssd.shutdown();
        } else {
            ssd.close_session();
        }
    }

    /// `writeback.flushers` (see [`Writeback::set_flushers`]).
    pub fn set_flushers(&self, n: usize) -> Result<(), String> {
        self.wb().ok_or(NO_WRITEBACK)?.set_flushers(n)
    }

    /// `writeback.dirty_soft` and `writeback.dirty_hard`.
    pub fn set_dirty_limits(&self, soft: u64, hard: u64) -> Result<(), String> {
        self.wb().ok_or(NO_WRITEBACK)?.set_dirty_limits(soft, hard)
    }

    /// `writeback.fsync`, for every fsync from now on.
    pub fn set_fsync_mode(&self, m: FsyncMode) -> Result<(), String> {
        self.wb().ok_or(NO_WRITEBACK)?.set_fsync_mode(m)
    }

    /// `writeback.close`, for every close from now on.
    pub fn set_close_mode(&self, m: CloseMode) -> Result<(), String> {
        self.wb().ok_or(NO_WRITEBACK)?.set_close_mode(m)
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.sh.stats;
        let ssd = self.sh.ssd.as_ref().map(|s| s.stats());
        let writeback = self.wb().map(|wb| wb.stats());
        let mut pressure = match self.pressure.get() {
            Some(m) => m.stats(),
            None => tierfs_cache::PressureStats {
                target: self.sh.cache.capacity(),
                size: self.sh.cache.used_bytes(),
                max: self.sh.cache.capacity(),
                signals: "off".into(),
                rss: tierfs_cache::pressure::self_rss(),
                ..Default::default()
            },
        };
        // bufwiredspace: data memory that shrinking the RAM tier cannot free now. A block
        // queued for the SSD tier is usually also in the RAM tier (one allocation, counted
        // twice); the queue is bounded at 64 clusters.
        pressure.wired_fetch = FsStats::get(&s.fetch_inflight_bytes);
        pressure.wired_ssd_queue = ssd.as_ref().map_or(0, |s| s.queued_bytes);
        pressure.wired_dirty = writeback.as_ref().map_or(0, |w| w.dirty_bytes);
        pressure.wired = pressure.wired_fetch + pressure.wired_ssd_queue + pressure.wired_dirty;
        pressure.bufspace = pressure.size + pressure.wired;
        StatsSnapshot {
            store_id: self.sh.store.store_id().to_string(),
            block_size: self.sh.cfg.block_size,
            ram: self.sh.cache.stats(),
            backing: self.sh.store.inner().snapshot(),
            read_requests: FsStats::get(&s.read_requests),
            read_bytes: FsStats::get(&s.read_bytes),
            read_ram_only: FsStats::get(&s.read_ram_only),
            read_inline: FsStats::get(&s.read_inline),
            write_requests: FsStats::get(&s.write_requests),
            write_bytes: FsStats::get(&s.write_bytes),
            fetched_blocks: FsStats::get(&s.fetched_blocks),
            readahead_blocks: FsStats::get(&s.readahead_blocks),
            singleflight_waits: FsStats::get(&s.singleflight_waits),
            stale_fetches: FsStats::get(&s.stale_fetches),
            version_changes: FsStats::get(&s.version_changes),
            version_mix_refusals: FsStats::get(&s.version_mix_refusals),
            meta_hits: FsStats::get(&s.meta_hits),
            meta_ssd_hits: FsStats::get(&s.meta_ssd_hits),
            ssd_blocks: FsStats::get(&s.ssd_blocks),
            ssd_range_reads: FsStats::get(&s.ssd_range_reads),
            ssd,
            shared_blocks: FsStats::get(&s.shared_blocks),
            shared: self.sh.shared_tier.get().map(|t| t.snapshot()),
            meta_listings: FsStats::get(&s.meta_listings),
            meta_entry_stats: FsStats::get(&s.meta_entry_stats),
            meta_renewals: FsStats::get(&s.meta_renewals),
            cto_shared: FsStats::get(&s.cto_shared),
            cto_checks: FsStats::get(&s.cto_checks),
            cto_check_us: FsStats::get(&s.cto_check_us),
            store_check_us: FsStats::get(&s.store_check_us),
            lazy_opens: FsStats::get(&s.lazy_opens),
            checked_opens: FsStats::get(&s.checked_opens),
            unchanged_chowns: FsStats::get(&s.unchanged_chowns),
            prefetched_files: FsStats::get(&s.prefetched_files),
            prefetch_queued: FsStats::get(&s.prefetch_queued),
            opens: FsStats::get(&s.opens),
            implicit_files: FsStats::get(&s.implicit_files),
            writeback,
            pressure,
            meta_attrs: self.ns.meta.counts().0,
            meta_dirs: self.ns.meta.counts().1,
            meta_links: self.ns.meta.counts().2,
            inodes: self.ns.inodes.len() as u64,
            file_states: self.ns.inodes.file_states() as u64,
            open_files: self.data.files.len() as u64,
            open_dirs: self.ns.open_dirs() as u64,
            warm: s.warm.snapshot(),
        }
    }
}
