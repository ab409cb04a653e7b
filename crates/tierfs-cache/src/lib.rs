//! The cache tiers: the RAM tier ([`RamCache`]), the single-flight table that makes concurrent
//! misses on one block wait for one fetch ([`SingleFlight`]), and the persistent SSD tier
//! ([`SsdCache`]), the write-back journal ([`Journal`]), and the memory-pressure monitor that
//! sizes the RAM tier ([`PressureMonitor`]), and the shared tier many hosts read through
//! ([`SharedCache`]).

pub mod journal;
mod key;
pub mod pressure;
pub mod private;
mod ram;
pub mod shared;
mod singleflight;
pub mod ssd;

pub use journal::{
    FileRef, Journal, JournalConfig, JournalError, JournalReport, JournalState, JournalStats,
    PendingWrite, Record, Replay,
};
pub use key::BlockKey;
pub use pressure::{PressureConfig, PressureMonitor, PressureStats};
pub use ram::{RamCache, RamStats};
pub use shared::{
    ChunkName, ChunkSource, SharedCache, SharedConfig, SharedSnapshot, SharedStats, SharedStore,
};
pub use singleflight::{Claim, FlightGuard, SingleFlight, Waiter};
/// (total, available) bytes of the filesystem holding a directory (statvfs).
pub use ssd::device_space;
pub use ssd::{
    Admit, AdmitError, SsdCache, SsdConfig, SsdError, SsdIdentity, SsdKey, SsdStats, KIND_ATTR,
    KIND_DATA, KIND_DIR, KIND_LINK,
};
