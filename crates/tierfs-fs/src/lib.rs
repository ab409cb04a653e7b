//! The filesystem core: the inode table (kernel inode <-> backing identity), open handles, the
//! read and write paths over the cache tiers, read-ahead and coherence with the backing store.
//! It speaks in inode numbers, names and errnos and knows nothing of the FUSE wire: the `fuse`
//! crate is a thin adapter over it, and it can be driven directly in tests.

mod config;
mod counted;
mod file_state;
mod fs;
mod identity;
mod inode;
mod meta;
mod meta_codec;
mod pool;
mod read;
mod served;
mod stats;
mod stream_depth;
mod tune;
mod warm;
mod write;
mod writeback;
mod writebuf;

pub use config::FsConfig;
pub use counted::{BackingStats, CountedStore};
pub use file_state::RACY_WINDOW;
pub use fs::{DirEntryOut, DirOpen, Entry, Fs, OpenReply, Requester};
pub use pool::Pool;
pub use served::KernelCache;
pub use stats::{FsStats, StatsSnapshot, GAUGES};
pub use tierfs_cache::pressure::one_malloc_arena;
pub use tierfs_cache::{
    PressureConfig, PressureMonitor, PressureStats, SsdCache, SsdConfig, SsdError, SsdIdentity,
    SsdStats,
};
pub use tierfs_store::{
    Attr, Errno, FileKind, Result, SetAttr, StatFs, Store, TimeSpec, TimeUpdate,
};
pub use tune::AtomicDuration;
pub use warm::{EvictReport, WarmError, WarmReport, WarmStats};
pub use writeback::{CloseMode, FsyncMode, ReserveStats, WbConfig, WbMode, WbStats};

/// Inode number of the root directory, as FUSE requires.
pub const ROOT_INO: u64 = 1;
