//! Tunables of write-back (`writeback.*`); defaults, units and reasons in docs/tunables.md.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WbMode {
    /// Every write is on the backing store when it is acknowledged.
    Through,
    /// A write is acknowledged once it is in RAM and in the journal; flushers write it back.
    Back,
}

/// What fsync/fdatasync wait for in write-back mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncMode {
    /// The file's data (and metadata for fsync) durable on the backing store.
    Backing,
    /// The file's writes durable in the journal on the cache device.
    Journal,
}

/// What close(2) does in write-back mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseMode {
    /// Nothing: the flushers write the data back in the background.
    Async,
    /// The file's data is written back and synced before close returns.
    Flush,
}

#[derive(Clone, Debug)]
pub struct WbConfig {
    pub mode: WbMode,
    pub flushers: usize,
    /// Above this many dirty bytes, writers are slowed gradually.
    pub dirty_soft: u64,
    /// At this many dirty bytes, writers wait for the flushers.
    pub dirty_hard: u64,
    pub fsync: FsyncMode,
    pub close: CloseMode,
    /// Journal capacity on the cache device, bytes.
    pub journal_size: u64,
    /// Journal segment size, bytes.
    pub journal_segment: u64,
    /// Largest single backing write of a flush.
    pub chunk: u64,
    /// Bytes a flusher writes to one file before it syncs it and moves on (a flush group).
    pub group: u64,
    /// Space taken from the backing store's free space at a time.
    pub reserve_chunk: u64,
    /// Longest wait between retries of a failing flush.
    pub retry_max: Duration,
    /// Namespace operations of new objects (create, mkdir, their setattrs) are journaled
    /// and acknowledged before the store has them (`writeback.namespace=back`).
    pub namespace_back: bool,
    /// How long deferred namespace operations may gather before the namespace flusher
    /// applies them while more keep coming (`writeback.namespace_delay`); zero: at once.
    pub namespace_delay: Duration,
    /// A burst of namespace operations is over when none came for this long: the flusher
    /// starts then (`writeback.namespace_quiet`).
    pub namespace_quiet: Duration,
    /// Namespace operations of one group the namespace flusher has at the store at once
    /// (`writeback.namespace_threads`; see `ns_order`).
    pub namespace_threads: usize,
}

impl Default for WbConfig {
    fn default() -> Self {
        WbConfig {
            mode: WbMode::Through,
            flushers: 4,
            dirty_soft: 3 << 30,
            dirty_hard: 4 << 30,
            fsync: FsyncMode::Backing,
            close: CloseMode::Async,
            journal_size: 8 << 30,
            journal_segment: 64 << 20,
            chunk: 4 << 20,
            group: 256 << 20,
            reserve_chunk: 256 << 20,
            retry_max: Duration::from_secs(30),
            namespace_back: true,
            namespace_delay: Duration::from_secs(5),
            namespace_quiet: Duration::from_millis(100),
            namespace_threads: 8,
        }
    }
}

/// The write-back tunables that may change while the mount runs (`tierfs ctl set`); the rest
/// of [`WbConfig`] is fixed when write-back starts (the journal's geometry is on disk).
pub(crate) struct WbLive {
    dirty_soft: AtomicU64,
    dirty_hard: AtomicU64,
    fsync: AtomicU8,
    close: AtomicU8,
    /// Flusher threads wanted (`writeback.flushers`).
    pub flushers: AtomicUsize,
    /// Flusher threads running: above `flushers`, the next one to look for work retires.
    /// Changed only under `resize`, so a change of `flushers` and a retirement cannot cross.
    pub running: AtomicUsize,
    pub resize: parking_lot::Mutex<()>,
    /// Flusher threads ever started (names them).
    pub started: AtomicUsize,
}

impl WbLive {
    pub fn new(cfg: &WbConfig) -> WbLive {
        let live = WbLive {
            dirty_soft: AtomicU64::new(0),
            dirty_hard: AtomicU64::new(0),
            fsync: AtomicU8::new(0),
            close: AtomicU8::new(0),
            flushers: AtomicUsize::new(cfg.flushers.max(1)),
            running: AtomicUsize::new(0),
            resize: Default::default(),
            started: AtomicUsize::new(0),
        };
        live.set_limits(cfg.dirty_soft, cfg.dirty_hard);
        live.set_fsync(cfg.fsync);
        live.set_close(cfg.close);
        live
    }

    /// (dirty_soft, dirty_hard), hard above soft.
    pub fn limits(&self) -> (u64, u64) {
        let soft = self.dirty_soft.load(Relaxed);
        (soft, self.dirty_hard.load(Relaxed).max(soft + 1))
    }

    pub fn set_limits(&self, soft: u64, hard: u64) {
        self.dirty_soft.store(soft, Relaxed);
        self.dirty_hard.store(hard, Relaxed);
    }

    pub fn fsync(&self) -> FsyncMode {
        match self.fsync.load(Relaxed) {
            0 => FsyncMode::Backing,
            _ => FsyncMode::Journal,
        }
    }

    pub fn set_fsync(&self, m: FsyncMode) {
        self.fsync.store(m as u8, Relaxed);
    }

    pub fn close(&self) -> CloseMode {
        match self.close.load(Relaxed) {
            0 => CloseMode::Async,
            _ => CloseMode::Flush,
        }
    }

    pub fn set_close(&self, m: CloseMode) {
        self.close.store(m as u8, Relaxed);
    }
}
