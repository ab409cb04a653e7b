use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of the filesystem core.
#[derive(Default)]
pub struct FsStats {
    pub read_requests: AtomicU64,
    pub read_bytes: AtomicU64,
    /// Read requests answered entirely from the RAM tier.
    pub read_ram_only: AtomicU64,
    /// Read requests answered on the FUSE thread (RAM tier or an SSD read-around window).
    pub read_inline: AtomicU64,
    pub write_requests: AtomicU64,
    pub write_bytes: AtomicU64,
    /// Blocks fetched from the backing store for a reader that was waiting.
    pub fetched_blocks: AtomicU64,
    /// Blocks fetched ahead of the reader.
    pub readahead_blocks: AtomicU64,
    /// Misses that waited for another reader's fetch of the same block.
    pub singleflight_waits: AtomicU64,
    /// Fetches discarded because the backing file changed while they ran.
    pub stale_fetches: AtomicU64,
    /// Times a backing file was found changed behind our back (its cached blocks dropped).
    pub version_changes: AtomicU64,
    /// Reads failed with ESTALE because the file changed behind our back while the kernel
    /// held data of its old version (`meta.cto=off`): serving them would mix two versions.
    pub version_mix_refusals: AtomicU64,
    /// Lookups, getattrs, listings and symlink reads answered by the metadata cache.
    pub meta_hits: AtomicU64,
    /// Directory listings and symlink targets brought back from the SSD tier.
    pub meta_ssd_hits: AtomicU64,
    /// Blocks read from the SSD tier into the RAM tier.
    pub ssd_blocks: AtomicU64,
    /// Partial-block reads answered straight from the SSD tier (not promoted to RAM).
    pub ssd_range_reads: AtomicU64,
    /// Blocks the shared tier served.
    pub shared_blocks: AtomicU64,
    /// Directories listed from the backing store (with attributes, or for names first).
    pub meta_listings: AtomicU64,
    /// Fan-outs that asked the store for the attributes of a names-first listing's entries
    /// (`namespace::entry_attrs`; each entry is counted as a store lookup).
    pub meta_entry_stats: AtomicU64,
    /// Listings whose trust ran out renewed by one request for their directory's attributes
    /// (unchanged: its names stand), instead of listing it again.
    pub meta_renewals: AtomicU64,
    /// Opens whose close-to-open check was a store answer asked for after they began by
    /// another request (their own lookup or permission check, an open of the same file),
    /// so they made none of their own.
    pub cto_shared: AtomicU64,
    /// Opens that asked the store for their close-to-open check, and how long those checks
    /// took in all (microseconds): what close-to-open costs per open on this store.
    pub cto_checks: AtomicU64,
    pub cto_check_us: AtomicU64,
    /// A close-to-open check of the store's root at mount, the median of three
    /// (microseconds; 0 where the store's check is its open, S3): its round trip as tierfs
    /// pays it.
    pub store_check_us: AtomicU64,
    /// Opens answered without the backing store (`meta.cto=off`).
    pub lazy_opens: AtomicU64,
    /// Read-only opens checked by the store's fresh attributes, the backing file opened only
    /// if a read misses the caches (`Store::revalidate`).
    pub checked_opens: AtomicU64,
    /// chown(2)s to the owner and group the object already had, not sent to the store
    /// (`Objects::chown_changes_nothing`).
    pub unchanged_chowns: AtomicU64,
    /// Files loaded ahead of a directory walk (`data/siblings.rs`).
    pub prefetched_files: AtomicU64,
    /// Loads ahead of a walk decided (queued for the prefetch pool): counted when decided,
    /// at the open or first read that showed the walk, before any of them ran.
    pub prefetch_queued: AtomicU64,
    /// Opens the kernel asked us for (none after the first with FUSE no-open).
    pub opens: AtomicU64,
    /// Implicit per-inode files made for reads and writes of files the kernel opened
    /// without asking (FUSE no-open, `meta.cto=off`).
    pub implicit_files: AtomicU64,
    /// `tierfs warm` / `tierfs evict` requests.
    pub warm: WarmCounters,
    /// Bytes of backing reads in flight (their buffers; a gauge).
    pub fetch_inflight_bytes: AtomicU64,
}

/// Counts `n` bytes in a gauge while alive.
pub(crate) struct Gauge<'a>(&'a AtomicU64, u64);

impl<'a> Gauge<'a> {
    pub fn new(c: &'a AtomicU64, n: u64) -> Gauge<'a> {
        c.fetch_add(n, Relaxed);
        Gauge(c, n)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Relaxed);
    }
}

/// The fields of [`StatsSnapshot`] (as dotted paths of its JSON form) that are levels, not
/// counts: the Prometheus endpoint types them as gauges, and every other number as a counter
/// (`tierfs_<path>_total`). A new field that can go down belongs here.
pub const GAUGES: &[&str] = &[
    "block_size",
    "backing.gone",
    "backing.hung",
    "ram.blocks",
    "ram.bytes",
    "ram.cap_bytes",
    "ssd.write_rate",
    "ssd.write_burst",
    "ssd.cur_burst",
    "ssd.fill_bytes",
    "ssd.live_bytes",
    "ssd.cap_bytes",
    "ssd.segments",
    "ssd.entries",
    "ssd.rebuild_ms",
    "ssd.rebuilt_entries",
    "ssd.device_free_bytes",
    "writeback.dirty_bytes",
    "writeback.dirty_files",
    "writeback.dirty_soft",
    "writeback.dirty_hard",
    "writeback.flushers",
    "writeback.oldest_dirty_ms",
    "writeback.flush_rate_bps",
    "writeback.replay_ms",
    "writeback.reserve.credit_bytes",
    "writeback.reserve.reserved_bytes",
    "writeback.reserve.reserved_inodes",
    "writeback.journal.used_bytes",
    "writeback.journal.cap_bytes",
    "writeback.journal.segments",
    "writeback.journal.group_commit_max_batch",
    "writeback.journal.group_commit_max_writes",
    "writeback.journal.oldest_seq",
    "writeback.journal.durable_seq",
    "writeback.journal.appended_seq",
    "writeback.journal.written_seq",
    "meta_attrs",
    "meta_dirs",
    "meta_links",
    "inodes",
    "file_states",
    "open_files",
    "open_dirs",
    "store_check_us",
    "ssd.queued_bytes",
    "shared.chunk_size",
    "shared.down",
    "shared.queued_bytes",
    "shared.later",
    "pressure.target",
    "pressure.size",
    "pressure.min",
    "pressure.max",
    "pressure.free_floor",
    "pressure.grow_wait_ms",
    "pressure.mem_total",
    "pressure.mem_available",
    "pressure.cgroup_limit",
    "pressure.cgroup_usage",
    "pressure.cgroup_file",
    "pressure.cgroup_room",
    "pressure.psi_stall_pct",
    "pressure.rss",
    "pressure.bufspace",
    "pressure.wired",
    "pressure.wired_fetch",
    "pressure.wired_ssd_queue",
    "pressure.wired_dirty",
];

/// Everything `tierfs stats` shows, as one serializable snapshot.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StatsSnapshot {
    pub store_id: String,
    pub block_size: u64,
    pub ram: tierfs_cache::RamStats,
    pub backing: crate::counted::BackingStats,
    pub read_requests: u64,
    pub read_bytes: u64,
    pub read_ram_only: u64,
    pub read_inline: u64,
    pub write_requests: u64,
    pub write_bytes: u64,
    pub fetched_blocks: u64,
    pub readahead_blocks: u64,
    pub singleflight_waits: u64,
    pub stale_fetches: u64,
    pub version_changes: u64,
    #[serde(default)]
    pub version_mix_refusals: u64,
    pub meta_hits: u64,
    pub meta_ssd_hits: u64,
    pub ssd_blocks: u64,
    pub ssd_range_reads: u64,
    /// The SSD tier's own counters; absent without one.
    pub ssd: Option<tierfs_cache::SsdStats>,
    /// Blocks served from the shared tier (`shared_blocks`), and the tier's own counters;
    /// absent without one.
    #[serde(default)]
    pub shared_blocks: u64,
    #[serde(default)]
    pub shared: Option<tierfs_cache::SharedSnapshot>,
    pub meta_listings: u64,
    #[serde(default)]
    pub meta_entry_stats: u64,
    #[serde(default)]
    pub meta_renewals: u64,
    #[serde(default)]
    pub cto_shared: u64,
    #[serde(default)]
    pub cto_checks: u64,
    #[serde(default)]
    pub cto_check_us: u64,
    #[serde(default)]
    pub store_check_us: u64,
    pub lazy_opens: u64,
    pub checked_opens: u64,
    #[serde(default)]
    pub unchanged_chowns: u64,
    pub prefetched_files: u64,
    #[serde(default)]
    pub prefetch_queued: u64,
    pub opens: u64,
    pub implicit_files: u64,
    /// Write-back counters; absent in write-through mode.
    #[serde(default)]
    pub writeback: Option<WbStats>,
    /// The memory-pressure monitor and the RAM tier's target, bufspace and wired bytes.
    #[serde(default)]
    pub pressure: tierfs_cache::PressureStats,
    pub meta_attrs: u64,
    pub meta_dirs: u64,
    pub meta_links: u64,
    pub inodes: u64,
    pub file_states: u64,
    pub open_files: u64,
    pub open_dirs: u64,
    /// `tierfs warm` / `tierfs evict` requests.
    #[serde(default)]
    pub warm: WarmStats,
}

impl FsStats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }
}

/// Counters of warm and evict requests (`tierfs stats`: `warm.*`).
#[derive(Default)]
pub struct WarmCounters {
    pub(crate) files: AtomicU64,
    pub(crate) admitted_bytes: AtomicU64,
    pub(crate) present_bytes: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) evicted_ssd_bytes: AtomicU64,
}

/// Write-back of namespace operations: see `WbCounters` for what each counts.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct NsStats {
    pub deferred: u64,
    pub applied: u64,
    /// Deferred and not yet on the store.
    pub pending: u64,
    /// Age of the oldest of them.
    pub oldest_ms: u64,
    pub groups: u64,
    /// Time to apply a group, median and 99th percentile of the last 256.
    pub group_ms_median: u64,
    pub group_ms_p99: u64,
    pub conflicts: u64,
    pub errors: u64,
    pub replayed: u64,
    /// Operations that waited for the deferred ones before them, and how long in all.
    #[serde(default)]
    pub waits: u64,
    #[serde(default)]
    pub wait_ms: u64,
    /// Files and symlinks unlinked before the store had them, and second names a deferred
    /// link left unlinked so: never sent to it.
    #[serde(default)]
    pub dropped: u64,
    /// Unlinks of files and symlinks of the store acknowledged before the store had them.
    #[serde(default)]
    pub removed: u64,
    /// Renames of new files over files of the store (`rsync`, an editor's save)
    /// acknowledged before the store had them.
    #[serde(default)]
    pub replaced: u64,
    /// Hard links of new files acknowledged before the store had them.
    #[serde(default)]
    pub linked: u64,
    /// Truncates to zero of new files acknowledged before the store had them (their data
    /// dropped, never sent).
    #[serde(default)]
    pub truncated: u64,
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct WarmStats {
    /// Files warmed.
    pub files: u64,
    /// Bytes warm admitted to the SSD tier, and bytes it found there already.
    pub admitted_bytes: u64,
    pub present_bytes: u64,
    /// Warm requests that failed.
    pub failed: u64,
    /// Objects evicted, and the bytes of SSD entries that dropped.
    pub evicted: u64,
    pub evicted_ssd_bytes: u64,
}

impl WarmCounters {
    pub fn snapshot(&self) -> WarmStats {
        let g = |c: &AtomicU64| c.load(Relaxed);
        WarmStats {
            files: g(&self.files),
            admitted_bytes: g(&self.admitted_bytes),
            present_bytes: g(&self.present_bytes),
            failed: g(&self.failed),
            evicted: g(&self.evicted),
            evicted_ssd_bytes: g(&self.evicted_ssd_bytes),
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct WbStats {
    pub mode: String,
    pub dirty_bytes: u64,
    pub dirty_files: u64,
    pub dirty_soft: u64,
    pub dirty_hard: u64,
    /// Flusher threads running (`writeback.flushers`, which `tierfs ctl set` may change).
    #[serde(default)]
    pub flushers: u64,
    pub oldest_dirty_ms: u64,
    /// Bytes/s written back, over the time since the previous stats call (at least 1 s).
    pub flush_rate_bps: u64,
    pub written_bytes: u64,
    /// Writes acknowledged on the FUSE thread itself (no hand-off to the I/O pool).
    #[serde(default)]
    pub inline_writes: u64,
    pub flushed_bytes: u64,
    pub flush_writes: u64,
    pub flush_syncs: u64,
    pub flush_errors: u64,
    /// Flushes refused because another writer changed the object first; data kept in lost.
    #[serde(default)]
    pub flush_conflicts: u64,
    pub throttled_writes: u64,
    pub throttle_ms: u64,
    pub hard_waits: u64,
    pub journal_full_waits: u64,
    pub enospc: u64,
    /// Writes the journal had no room for on the cache device (full), written through to
    /// the store instead.
    #[serde(default)]
    pub journal_no_space: u64,
    pub replayed_writes: u64,
    pub replayed_bytes: u64,
    pub replay_lost_files: u64,
    /// Damaged stretches of the journal found at replay that may have cost a write.
    #[serde(default)]
    pub replay_damage: u64,
    /// Pending writes set aside (journal/lost/) because damage may hide a newer one.
    #[serde(default)]
    pub replay_lost_writes: u64,
    pub replay_ms: u64,
    /// Write-back of namespace operations (`writeback.namespace=back`).
    #[serde(default)]
    pub namespace: NsStats,
    pub reserve: ReserveStats,
    pub journal: Option<tierfs_cache::journal::JournalStats>,
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ReserveStats {
    pub credit_bytes: u64,
    pub reserved_bytes: u64,
    /// Inodes promised to deferred creates not yet on the store.
    #[serde(default)]
    pub reserved_inodes: u64,
}
