//! Write-back (`writeback.mode=back`), after PxFS fastwrite and HAMMER's flusher: a write is
//! acknowledged once it is in RAM and appended to the journal on the cache device; space on
//! the backing store is reserved at write(2) time; flushers write dirty data back sorted by
//! (file, offset) in large coalesced writes, a flush group at a time, and sync it before
//! anything is marked clean; writers are slowed above `dirty_soft` and wait at `dirty_hard`.
//! Semantics and formats: docs/writeback.md.
//!
//! It stands on the data path (`crate::data`) and the namespace, which know nothing of it;
//! `Fs` puts it in order with them. Files: `crate::dirty` (one file's dirty extents); in `data/`: `reserve` (space
//! reservation), `write` (the write path, reads and attributes over dirty data, flow control),
//! `flush` (flushers, namespace ordering), `sync` (fsync, close), `replay` (the journal at
//! start); in `namespace/`: the deferred namespace operations (`ns` and `ns_*`, `applying`,
//! `attr_shadow`, `kept_times`); here: `shutdown` (the drain at unmount), `tune` (tunables
//! changed at run time), `config`, `stats`.

// The two parts in folders of their own: `data/` (dirty data, the journal's writes, space
// reservation, flushers, fsync and close, replay of data) and `namespace/` (deferred
// namespace operations: queue, records, ordering, apply, replay). The module tree stays
// flat (`#[path]`): the parts share `Writeback` and each other's `pub(super)` items as
// before, and no import runs in a circle (tests/layering.rs, farm-studio).
mod config;
mod shutdown;
mod stats;
mod tune;

#[path = "data/flush.rs"]
mod flush;
#[path = "data/replay.rs"]
mod replay;
#[path = "data/replay_lost.rs"]
mod replay_lost;
#[path = "data/reserve.rs"]
mod reserve;
#[path = "data/settle.rs"]
mod settle;
#[path = "data/sync.rs"]
mod sync;
#[path = "data/write.rs"]
mod write;

#[path = "namespace/applying.rs"]
mod applying;
#[path = "namespace/attr_shadow.rs"]
mod attr_shadow;
#[path = "namespace/kept_times.rs"]
mod kept_times;
#[path = "namespace/ns.rs"]
mod ns;
#[path = "namespace/ns_apply.rs"]
mod ns_apply;
#[path = "namespace/ns_chattr.rs"]
mod ns_chattr;
#[path = "namespace/ns_defer.rs"]
mod ns_defer;
#[path = "namespace/ns_fold.rs"]
mod ns_fold;
#[path = "namespace/ns_link.rs"]
mod ns_link;
#[path = "namespace/ns_lost.rs"]
mod ns_lost;
#[path = "namespace/ns_mknod.rs"]
mod ns_mknod;
#[path = "namespace/ns_move.rs"]
mod ns_move;
#[path = "namespace/ns_narrow.rs"]
mod ns_narrow;
#[path = "namespace/ns_order.rs"]
mod ns_order;
#[path = "namespace/ns_path.rs"]
mod ns_path;
#[path = "namespace/ns_queue.rs"]
mod ns_queue;
#[path = "namespace/ns_record.rs"]
mod ns_record;
#[path = "namespace/ns_remove.rs"]
mod ns_remove;
#[path = "namespace/ns_rename.rs"]
mod ns_rename;
#[path = "namespace/ns_replace.rs"]
mod ns_replace;
#[path = "namespace/ns_replay.rs"]
mod ns_replay;
#[path = "namespace/ns_replay_make.rs"]
mod ns_replay_make;
#[path = "namespace/ns_truncate.rs"]
mod ns_truncate;

pub use config::{CloseMode, FsyncMode, WbConfig, WbMode};
pub(crate) use replay::replay_journal;

pub use crate::stats::ReserveStats;
pub use crate::stats::WbStats;

use crate::data::Objects;
use crate::inode::Inode;
use crate::namespace::Namespace;
use crate::shared::{Shared, St};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use tierfs_cache::journal::Journal;
use tierfs_store::Store;

/// Dirty files by backing identity (device, inode).
pub(crate) type DirtyFiles<S> = BTreeMap<(u64, u64), Arc<Inode<St<S>>>>;

/// The write-back machinery of one mount (present only with `writeback.mode=back`).
pub struct Writeback<S: Store> {
    /// What it stands on: it writes through the data path and orders itself with the
    /// namespace's operations (see `settle_name`).
    pub(crate) sh: Arc<Shared<S>>,
    pub(crate) ns: Arc<Namespace<S>>,
    pub(crate) data: Arc<Objects<S>>,
    /// As started; what may change at run time is in `live`.
    pub(crate) cfg: WbConfig,
    pub(crate) live: config::WbLive,
    pub(crate) journal: Journal,
    pub(crate) reserve: reserve::Reservations,
    /// Inodes promised to deferred creates (`writeback.namespace=back`).
    pub(crate) inodes: reserve::InodeReservations,
    pub(crate) c: stats::WbCounters,
    /// Files with dirty data, by backing identity: the flushers walk it in order (sorted
    /// flushing). Lock order: a file's `dirty` before this.
    pub(crate) files: Mutex<DirtyFiles<S>>,
    /// Where the flushers' elevator stands in `files`.
    pub(crate) cursor: Mutex<(u64, u64)>,
    /// Wakes flushers (new dirty data) and throttled writers (data flushed).
    pub(crate) wake: Condvar,
    pub(crate) wake_lock: Mutex<()>,
    pub(crate) stop: AtomicBool,
    pub(crate) threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// For the flush rate in stats: when it was last computed, bytes flushed then, the rate.
    pub(crate) rate: Mutex<(std::time::Instant, u64, u64)>,
    /// On a store that publishes at sync (S3): the flusher's handle of a file whose flush
    /// was left unsynced (still being written), kept so its staged contents carry over to the
    /// next flush group instead of being uploaded or staged again.
    pub(crate) held: Mutex<std::collections::HashMap<(u64, u64), crate::shared::Handle<S>>>,
    /// Deferred namespace operations on their way to the namespace flusher (see `ns`).
    pub(crate) nsq: ns_queue::NsQueue<S>,
    /// The kinds of special file the store makes (`ns_mknod`).
    pub(crate) made_kinds: ns_mknod::MadeKinds,
    /// The journal's directory (its `lost/` keeps what the store refused).
    pub(crate) dir: std::path::PathBuf,
    /// Times shown that the store's own stamps must not move (`kept_times`).
    pub(crate) kept_times: kept_times::KeptTimes,
}

impl<S: Store> Writeback<S> {
    pub(crate) fn notify(&self) {
        let _g = self.wake_lock.lock();
        self.wake.notify_all();
    }

    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.c.dirty_bytes.load(Relaxed)
    }
}

impl<S: Store> Writeback<S> {
    pub(crate) fn stats(&self) -> WbStats {
        let g = |c: &std::sync::atomic::AtomicU64| c.load(Relaxed);
        let c = &self.c;
        let oldest = self
            .files
            .lock()
            .values()
            .filter_map(|i| i.file.as_ref()?.dirty.try_lock()?.as_ref().map(|d| d.since))
            .min()
            .map(|t| t.elapsed().as_millis() as u64)
            .unwrap_or(0);
        let flushed = g(&c.flushed_bytes);
        let flush_rate = {
            let mut r = self.rate.lock();
            let dt = r.0.elapsed().as_secs_f64();
            if dt >= 1.0 {
                *r = (
                    std::time::Instant::now(),
                    flushed,
                    ((flushed - r.1) as f64 / dt) as u64,
                );
            }
            r.2
        };
        let (ns_pending, ns_oldest_ms) = self.ns_pending();
        let ns_group = self.ns_group_ms();
        WbStats {
            mode: "back".into(),
            flush_rate_bps: flush_rate,
            dirty_bytes: g(&c.dirty_bytes),
            dirty_files: g(&c.dirty_files),
            dirty_soft: self.live.limits().0,
            dirty_hard: self.live.limits().1,
            flushers: self.live.running.load(Relaxed) as u64,
            oldest_dirty_ms: oldest,
            written_bytes: g(&c.written_bytes),
            inline_writes: g(&c.inline_writes),
            flushed_bytes: g(&c.flushed_bytes),
            flush_writes: g(&c.flush_writes),
            flush_syncs: g(&c.flush_syncs),
            flush_errors: g(&c.flush_errors),
            flush_conflicts: g(&c.flush_conflicts),
            throttled_writes: g(&c.throttled_writes),
            throttle_ms: g(&c.throttle_ms),
            hard_waits: g(&c.hard_waits),
            journal_full_waits: g(&c.journal_full_waits),
            enospc: g(&c.enospc),
            journal_no_space: g(&c.journal_no_space),
            replayed_writes: g(&c.replayed_writes),
            replayed_bytes: g(&c.replayed_bytes),
            replay_lost_files: g(&c.replay_lost_files),
            replay_damage: g(&c.replay_damage),
            replay_lost_writes: g(&c.replay_lost_writes),
            replay_ms: g(&c.replay_ms),
            namespace: crate::stats::NsStats {
                deferred: g(&c.ns_deferred),
                applied: g(&c.ns_applied),
                pending: ns_pending,
                oldest_ms: ns_oldest_ms,
                groups: g(&c.ns_groups),
                group_ms_median: ns_group.0,
                group_ms_p99: ns_group.1,
                conflicts: g(&c.ns_conflicts),
                errors: g(&c.ns_errors),
                replayed: g(&c.ns_replayed),
                waits: g(&c.ns_waits),
                wait_ms: g(&c.ns_wait_ms),
                dropped: g(&c.ns_dropped),
                removed: g(&c.ns_removed),
                replaced: g(&c.ns_replaced),
                linked: g(&c.ns_linked),
                truncated: g(&c.ns_truncated),
            },
            reserve: ReserveStats {
                reserved_inodes: self.inodes.reserved(),
                ..self.reserve.stats()
            },
            journal: Some(self.journal.stats()),
        }
    }
}
