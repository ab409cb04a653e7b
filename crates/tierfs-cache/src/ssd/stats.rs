//! Counters of the SSD tier (see `tierfs stats`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default, Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SsdStats {
    pub hits: u64,
    pub misses: u64,
    pub hit_bytes: u64,
    /// Bytes written to segment files (summaries and padding included).
    pub written_bytes: u64,
    pub clusters_written: u64,
    /// Entries `offer` queued for writing.
    pub admitted: u64,
    pub admitted_bytes: u64,
    /// Of `admitted_bytes`, admitted without the write budget (`tierfs warm --no-budget`).
    pub admitted_unbudgeted_bytes: u64,
    /// Entries dropped on request (`tierfs evict`).
    pub evicted: u64,
    /// Offers refused: not enough write budget.
    pub dropped_budget: u64,
    /// Offers refused: the writer's queue is full.
    pub dropped_queue: u64,
    /// Offers refused: the device is too full (`min_free_pct`) even with the cache emptied.
    pub dropped_full: u64,
    /// Offers refused: kind disabled, or larger than a cluster.
    pub dropped_other: u64,
    /// Offers of an entry already stored or queued (not written again).
    pub duplicates: u64,
    pub write_rate: u64,
    pub write_burst: u64,
    /// Budget tokens now (bytes that may be admitted at once).
    pub cur_burst: u64,
    /// Bytes of segment files.
    pub fill_bytes: u64,
    /// Bytes of the entries that can be served (less than `fill_bytes` by what was evicted
    /// or replaced and not reclaimed yet).
    #[serde(default)]
    pub live_bytes: u64,
    pub cap_bytes: u64,
    pub segments: u64,
    pub entries: u64,
    /// Reads whose data did not match its checksum (the entry is dropped, never served).
    pub checksum_errors: u64,
    /// Read-around windows read (on a miss, or ahead of the reader) and entries served from them.
    pub window_reads: u64,
    pub window_hits: u64,
    /// Reads or writes that failed with an I/O error.
    pub io_errors: u64,
    /// Entries dropped because the version asked for differs from the stored one.
    pub stale_drops: u64,
    /// Hit entries rewritten when their segment was reclaimed.
    pub reinsertions: u64,
    pub reclaimed_segments: u64,
    pub checkpoints: u64,
    pub rebuild_ms: u64,
    pub rebuilt_entries: u64,
    /// Free space of the device holding the tier (statvfs).
    pub device_free_bytes: u64,
    /// Bytes of admitted entries waiting in memory for the writer (bounded by 64 clusters).
    #[serde(default)]
    pub queued_bytes: u64,
}

/// The live counters behind [`SsdStats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub hit_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub clusters_written: AtomicU64,
    pub admitted: AtomicU64,
    pub admitted_bytes: AtomicU64,
    pub admitted_unbudgeted_bytes: AtomicU64,
    pub evicted: AtomicU64,
    pub dropped_budget: AtomicU64,
    pub dropped_queue: AtomicU64,
    pub dropped_full: AtomicU64,
    pub dropped_other: AtomicU64,
    pub duplicates: AtomicU64,
    pub checksum_errors: AtomicU64,
    pub io_errors: AtomicU64,
    pub stale_drops: AtomicU64,
    pub reinsertions: AtomicU64,
    pub reclaimed_segments: AtomicU64,
    pub checkpoints: AtomicU64,
    pub rebuild_ms: AtomicU64,
    pub rebuilt_entries: AtomicU64,
}

pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

impl Counters {
    /// Copies the counters; the caller fills in the gauges.
    pub fn snapshot(&self) -> SsdStats {
        let g = |c: &AtomicU64| c.load(Relaxed);
        SsdStats {
            hits: g(&self.hits),
            misses: g(&self.misses),
            hit_bytes: g(&self.hit_bytes),
            written_bytes: g(&self.written_bytes),
            clusters_written: g(&self.clusters_written),
            admitted: g(&self.admitted),
            admitted_bytes: g(&self.admitted_bytes),
            admitted_unbudgeted_bytes: g(&self.admitted_unbudgeted_bytes),
            evicted: g(&self.evicted),
            dropped_budget: g(&self.dropped_budget),
            dropped_queue: g(&self.dropped_queue),
            dropped_full: g(&self.dropped_full),
            dropped_other: g(&self.dropped_other),
            duplicates: g(&self.duplicates),
            checksum_errors: g(&self.checksum_errors),
            io_errors: g(&self.io_errors),
            stale_drops: g(&self.stale_drops),
            reinsertions: g(&self.reinsertions),
            reclaimed_segments: g(&self.reclaimed_segments),
            checkpoints: g(&self.checkpoints),
            rebuild_ms: g(&self.rebuild_ms),
            rebuilt_entries: g(&self.rebuilt_entries),
            ..SsdStats::default()
        }
    }
}
