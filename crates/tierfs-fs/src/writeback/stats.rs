//! Counters of write-back, shown by `tierfs stats`.

use std::sync::atomic::AtomicU64;

#[derive(Default)]
pub struct WbCounters {
    pub dirty_bytes: AtomicU64,
    pub dirty_files: AtomicU64,
    pub written_bytes: AtomicU64,
    pub inline_writes: AtomicU64,
    pub flushed_bytes: AtomicU64,
    pub flush_writes: AtomicU64,
    pub flush_syncs: AtomicU64,
    pub flush_errors: AtomicU64,
    pub throttled_writes: AtomicU64,
    pub throttle_ms: AtomicU64,
    pub hard_waits: AtomicU64,
    pub journal_full_waits: AtomicU64,
    pub enospc: AtomicU64,
    pub replayed_writes: AtomicU64,
    pub replayed_bytes: AtomicU64,
    pub replay_lost_files: AtomicU64,
    pub replay_ms: AtomicU64,
    pub drained_bytes: AtomicU64,
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
    pub throttled_writes: u64,
    pub throttle_ms: u64,
    pub hard_waits: u64,
    pub journal_full_waits: u64,
    pub enospc: u64,
    pub replayed_writes: u64,
    pub replayed_bytes: u64,
    pub replay_lost_files: u64,
    pub replay_ms: u64,
    pub reserve: super::reserve::ReserveStats,
    pub journal: Option<tierfs_cache::journal::JournalStats>,
}
