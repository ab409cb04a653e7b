//! Tunables of the filesystem core that may change while the mount runs (`tierfs ctl set`):
//! each is an atomic read at every use, so a change takes effect at the next request.

use crate::fs::Fs;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tierfs_store::Store;

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

impl<S: Store> Fs<S> {
    /// `meta.ttl`: cached attributes, listings and file fingerprints are judged by the new
    /// age limit from now on.
    pub fn set_meta_ttl(&self, ttl: Duration) {
        self.meta.set_ttl(ttl);
    }

    /// `meta.max_entries`, enforced at the next insertion.
    pub fn set_meta_max_entries(&self, n: usize) {
        self.meta.set_max_entries(n);
    }

    /// `readahead.max`, for read-ahead decisions from now on (0 stops read-ahead).
    pub fn set_readahead_max(&self, bytes: u64) {
        self.readahead_max.store(bytes, Relaxed);
    }

    /// `ram.max`: the RAM tier's cap; shrinking evicts at once.
    pub fn set_ram_max(&self, bytes: u64) {
        // With the memory-pressure monitor running, `ram.max` is its upper bound: the
        // monitor sets the cap (its target) within it. Without it, the cap itself.
        match self.pressure() {
            Some(p) => {
                if p.set_limits(None, Some(bytes)).is_err() {
                    // ram.min above the new max: the min follows it down.
                    let _ = p.set_limits(Some(bytes), Some(bytes));
                }
            }
            None => self.cache.set_capacity(bytes),
        }
    }
}
