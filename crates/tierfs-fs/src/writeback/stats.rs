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
    /// Flushes refused because another writer changed the object first (S3 If-Match): the
    /// data was kept in the lost directory, the application told at its next fsync/close.
    pub flush_conflicts: AtomicU64,
    pub throttled_writes: AtomicU64,
    pub throttle_ms: AtomicU64,
    pub hard_waits: AtomicU64,
    pub journal_full_waits: AtomicU64,
    pub enospc: AtomicU64,
    /// Writes the journal had no room for on the cache device: written through to the store.
    pub journal_no_space: AtomicU64,
    pub replayed_writes: AtomicU64,
    pub replayed_bytes: AtomicU64,
    pub replay_lost_files: AtomicU64,
    /// Damaged stretches of the journal that may have cost an acknowledged write.
    pub replay_damage: AtomicU64,
    /// Pending writes not replayed because of damage (saved under journal/lost/).
    pub replay_lost_writes: AtomicU64,
    pub replay_ms: AtomicU64,
    pub drained_bytes: AtomicU64,
    /// Namespace operations deferred (journaled, acknowledged before the store had them).
    pub ns_deferred: AtomicU64,
    /// Of them, applied to the store.
    pub ns_applied: AtomicU64,
    /// Creates withdrawn by an unlink before the namespace flusher took them.
    pub ns_dropped: AtomicU64,
    /// Unlinks of files and symlinks of the store deferred (`ns_remove`).
    pub ns_removed: AtomicU64,
    /// Renames of new files over files and symlinks of the store deferred (`ns_replace`).
    pub ns_replaced: AtomicU64,
    /// Links of files write-back made deferred (`ns_link`).
    pub ns_linked: AtomicU64,
    /// Truncates to zero of files write-back made deferred (`ns_truncate`).
    pub ns_truncated: AtomicU64,
    /// Groups the namespace flusher applied (each: its directories synced, one DONE).
    pub ns_groups: AtomicU64,
    /// Deferred operations the store refused (a name made by someone else first, a
    /// directory removed): the object's data kept under journal/lost/.
    pub ns_conflicts: AtomicU64,
    /// Failures that may pass (the store gone or failing): retried.
    pub ns_errors: AtomicU64,
    /// Namespace records applied at replay.
    pub ns_replayed: AtomicU64,
    /// Operations that had to wait for the namespace flusher (a rename, unlink, listing,
    /// fsync... after deferred ones), and the time they waited, ms.
    pub ns_waits: AtomicU64,
    pub ns_wait_ms: AtomicU64,
}
