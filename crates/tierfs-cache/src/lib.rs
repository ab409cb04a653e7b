//! The cache tiers: the RAM tier ([`RamCache`]), the single-flight table that makes concurrent
//! misses on one block wait for one fetch ([`SingleFlight`]), and the persistent SSD tier
//! ([`SsdCache`]), and the write-back journal ([`Journal`]). Later: `meta`, `writeback`,
//! `pressure`.

pub mod journal;
mod key;
mod ram;
mod singleflight;
pub mod ssd;

pub use journal::{
    FileRef, Journal, JournalConfig, JournalError, JournalReport, JournalState, JournalStats,
    PendingWrite, Record, Replay,
};
pub use key::BlockKey;
pub use ram::{RamCache, RamStats};
pub use singleflight::{Claim, FlightGuard, SingleFlight};
pub use ssd::{
    Admit, AdmitError, SsdCache, SsdConfig, SsdError, SsdIdentity, SsdKey, SsdStats, KIND_ATTR,
    KIND_DATA, KIND_DIR, KIND_LINK,
};
