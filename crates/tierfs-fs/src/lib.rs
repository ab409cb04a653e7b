//! The filesystem core: the inode table (kernel inode <-> backing identity), open handles, the
//! read and write paths over the cache tiers, read-ahead and coherence with the backing store.
//! It speaks in inode numbers, names and errnos and knows nothing of the FUSE wire: the `fuse`
//! crate is a thin adapter over it, and it can be driven directly in tests.
//!
//! Parts, each using only those below it (docs/architecture.md, checked by
//! `tests/layering.rs`): `fs` (the dispatcher, [`Fs`]) over `writeback` over `data` (object
//! data) over `namespace` over `shared` and the leaf modules.

mod config;
mod counted;
mod data;
mod deadline;
mod dirty;
mod fast_map;
mod file_state;
mod fs;
mod health;
mod identity;
mod inode;
mod meta;
mod meta_codec;
mod namespace;
mod pool;
mod served;
mod shared;
mod stats;
mod stream_depth;
mod tune;
mod version;
mod writeback;
mod writebuf;

pub use config::FsConfig;
pub use counted::{BackingStats, CountedStore};
pub use data::{EvictReport, OpenReply, WarmError, WarmReport};
pub use fs::Fs;
pub use namespace::{DirEntryOut, DirOpen, DirPage, Entry, Requester};
pub use pool::Pool;
pub use served::KernelCache;
pub use stats::{FsStats, StatsSnapshot, WarmStats, GAUGES};
pub use tierfs_cache::pressure::one_malloc_arena;
pub use tierfs_cache::{
    PressureConfig, PressureMonitor, PressureStats, SsdCache, SsdConfig, SsdError, SsdIdentity,
    SsdStats,
};
pub use tierfs_store::{
    Attr, Errno, FileKind, Result, SetAttr, StatFs, Store, TimeSpec, TimeUpdate,
};
pub use tune::AtomicDuration;
pub use version::RACY_WINDOW;
pub use writeback::{CloseMode, FsyncMode, ReserveStats, WbConfig, WbMode, WbStats};

/// Inode number of the root directory, as FUSE requires.
pub const ROOT_INO: u64 = 1;
