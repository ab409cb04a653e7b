//! The cache tiers. This issue has the RAM tier ([`RamCache`]) and the single-flight table that
//! makes concurrent misses on one block wait for one fetch ([`SingleFlight`]). Later: `ssd`,
//! `meta`, `writeback`, `pressure`.

mod key;
mod ram;
mod singleflight;

pub use key::BlockKey;
pub use ram::{RamCache, RamStats};
pub use singleflight::{Claim, FlightGuard, SingleFlight};
