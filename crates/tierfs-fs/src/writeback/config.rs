//! Tunables of write-back (`writeback.*`); defaults, units and reasons in docs/tunables.md.

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
        }
    }
}
