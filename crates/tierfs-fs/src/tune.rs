//! Tunables of the filesystem core that may change while the mount runs (`tierfs ctl set`):
//! each is an atomic read at every use, so a change takes effect at the next request.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A duration that can be changed at run time (nanoseconds; up to 584 years).
#[derive(Debug)]
pub struct AtomicDuration(AtomicU64);

impl AtomicDuration {
    pub fn new(d: Duration) -> AtomicDuration {
        AtomicDuration(AtomicU64::new(Self::nanos(d)))
    }

    fn nanos(d: Duration) -> u64 {
        d.as_nanos().min(u64::MAX as u128) as u64
    }

    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Relaxed))
    }

    pub fn set(&self, d: Duration) {
        self.0.store(Self::nanos(d), Relaxed);
    }
}
