//! How long a record of the metadata cache is trusted: a share of how long its object had
//! gone unchanged, within `meta.ttl_min` and `meta.ttl`.

use super::MetaCache;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime};
use tierfs_store::{Attr, Fingerprint};

/// The share of the time an object has gone unchanged that it is trusted for: an object last
/// changed an hour ago is trusted 6 minutes (within `meta.ttl`), one changed a second ago
/// `meta.ttl_min`. HTTP caches use the same tenth for a response without an expiry (RFC 9111,
/// 4.2.2); NFS clients grow an attribute's lifetime with its age, between `acregmin` (3 s)
/// and `acregmax` (60 s).
const TRUST_SHARE: u32 = 10;

impl MetaCache {
    /// Whether a file's version `fp`, checked against the store at `checked`, must be checked
    /// again: its [`MetaCache::trust`] has run out (never while the store is gone: what is
    /// cached is served).
    pub fn version_expired(&self, fp: &Fingerprint, checked: Instant) -> bool {
        !self.stale_ok.load(Relaxed)
            && checked.elapsed() >= self.trust_times(fp.mtime_ns.max(fp.ctime_ns), checked)
    }

    /// `meta.ttl_min` (at most `meta.ttl`).
    pub fn ttl_min(&self) -> Duration {
        self.ttl_min.read().unwrap_or(Duration::MAX).min(self.ttl())
    }

    /// A new `meta.ttl_min` (None: the same as `meta.ttl`); records made from now on follow it.
    pub fn set_ttl_min(&self, min: Option<Duration>) {
        *self.ttl_min.write() = min;
    }

    /// How long attributes `a`, validated at `at`, are trusted: a tenth of how long the object
    /// had gone unchanged by then (its newest mtime or ctime, on the store's clock), within
    /// `meta.ttl_min` and `meta.ttl`. An object that has not changed for long is unlikely to
    /// change in the next moments: a walk of a tree nobody is changing then costs no store
    /// request, while a file being written is asked for again after `meta.ttl_min`. A store
    /// clock ahead of ours makes everything look new (the minimum); one behind, old (at most
    /// `meta.ttl`).
    pub fn trust(&self, a: &Attr, at: Instant) -> Duration {
        let ns = |t: tierfs_store::TimeSpec| t.sec as i128 * 1_000_000_000 + t.nsec as i128;
        let changed = ns(a.mtime).max(ns(a.ctime));
        self.trust_times(changed.clamp(i64::MIN as i128, i64::MAX as i128) as i64, at)
    }

    /// [`MetaCache::trust`] of an object last changed at `changed_ns` (since the epoch).
    fn trust_times(&self, changed_ns: i64, at: Instant) -> Duration {
        let (min, max) = (self.ttl_min(), self.ttl());
        if min >= max {
            return max;
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let validated = now - at.elapsed().as_nanos() as i128;
        let unchanged = validated - changed_ns as i128;
        if unchanged <= 0 {
            return min;
        }
        let share =
            Duration::from_nanos((unchanged / TRUST_SHARE as i128).min(u64::MAX as i128) as u64);
        share.clamp(min, max)
    }
}
