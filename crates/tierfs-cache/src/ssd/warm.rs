//! Admission on an operator's request (`tierfs warm`, `tierfs evict`).
//!
//! `offer` never blocks and drops what the budget or the queue cannot take: right for the read
//! path, which offers again the next time it fetches. A warm that skipped would not warm, so
//! `offer_wait` waits instead: for room in the writer's queue, and for budget tokens at the
//! bucket's rate (or takes none, when the operator says so). `evict` drops entries and logs
//! their tombstones, waiting for queue room, so an eviction also holds across a restart.

use super::budget::{self, HEADROOM};
use super::stats::inc;
use super::writer::Msg;
use super::{SsdCache, SsdKey, QUEUE_CLUSTERS};
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// What `offer_wait` did with an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Queued for writing.
    Queued,
    /// Stored or queued already with this version: not written again.
    Present,
}

/// Why `offer_wait` could not admit an entry. Each displays as one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmitError {
    /// The tier does not take this kind (`ssd.cache_data` / `ssd.cache_meta` off).
    KindDisabled,
    /// Larger than a cluster.
    TooLarge,
    /// The device is too full (`ssd.min_free_pct`) even with the cache emptied.
    DeviceFull,
    /// The budget can never pay for it: `ssd.write_rate` is 0 or `ssd.write_burst` is smaller
    /// than one entry.
    NoBudget,
    /// The tier was shut down.
    Closed,
}

impl std::fmt::Display for AdmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AdmitError::KindDisabled => "the SSD tier does not admit this kind of entry (ssd.cache_data or ssd.cache_meta is off)",
            AdmitError::TooLarge => "the entry is larger than an SSD cluster (ssd.cluster_size)",
            AdmitError::DeviceFull => "the SSD tier's device is full (ssd.min_free_pct): admission is paused",
            AdmitError::NoBudget => "the SSD write budget can never pay for it (ssd.write_rate is 0 or ssd.write_burst is too small); warm without budget to override",
            AdmitError::Closed => "the SSD tier is shut down",
        })
    }
}

impl std::error::Error for AdmitError {}

/// Longest single sleep while waiting: the state (rate, full device) may change meanwhile.
const MAX_NAP: Duration = Duration::from_millis(100);

impl SsdCache {
    /// Admits the entry, waiting as long as it takes for room in the writer's queue and, if
    /// `budget`, for write-budget tokens at the bucket's rate. Without `budget` no tokens are
    /// taken and the bucket is not charged for the entry's bytes (`admitted_unbudgeted_bytes`).
    pub fn offer_wait(
        &self,
        key: SsdKey,
        version: u64,
        data: Bytes,
        budget: bool,
    ) -> Result<Admit, AdmitError> {
        let sh = &self.sh;
        let c = &sh.ctr;
        if !sh.admits(key.kind) {
            return Err(AdmitError::KindDisabled);
        }
        if data.len() > sh.max_entry as usize {
            return Err(AdmitError::TooLarge);
        }
        let len = data.len() as u64;
        let charge = budget::charge(len as u32);
        let limit = QUEUE_CLUSTERS * sh.cfg.cluster_size;
        loop {
            if sh.full.load(Relaxed) {
                return Err(AdmitError::DeviceFull);
            }
            if sh.index.contains(&key, version) || sh.pending.contains(&key, version) {
                inc(&c.duplicates);
                return Ok(Admit::Present);
            }
            // Queue room first, so no tokens are held while waiting for it.
            if sh.queued_bytes.fetch_add(len, Relaxed) + len > limit {
                sh.queued_bytes.fetch_sub(len, Relaxed);
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            if budget {
                if let Err(eta) = sh.budget.take_or_eta(charge, HEADROOM) {
                    sh.queued_bytes.fetch_sub(len, Relaxed);
                    let Some(eta) = eta else {
                        return Err(AdmitError::NoBudget);
                    };
                    std::thread::sleep(eta.clamp(Duration::from_millis(1), MAX_NAP));
                    continue;
                }
            }
            if !sh.pending.claim(key, version) {
                sh.queued_bytes.fetch_sub(len, Relaxed);
                if budget {
                    sh.budget.refund(charge);
                }
                inc(&c.duplicates);
                return Ok(Admit::Present);
            }
            let msg = Msg::Put {
                key,
                version,
                data,
                charge,
                budgeted: budget,
            };
            // Blocking: the writer drains the queue whatever happens.
            if self.tx.send(msg).is_err() {
                sh.pending.release(&key, version);
                sh.queued_bytes.fetch_sub(len, Relaxed);
                if budget {
                    sh.budget.refund(charge);
                }
                return Err(AdmitError::Closed);
            }
            inc(&c.admitted);
            c.admitted_bytes.fetch_add(len, Relaxed);
            if !budget {
                c.admitted_unbudgeted_bytes.fetch_add(len, Relaxed);
            }
            return Ok(Admit::Queued);
        }
    }

    /// Drops the entries of `keys` (whatever their version; also those admitted but still
    /// queued) and logs a tombstone for each one that was stored, so they stay gone after a
    /// restart. Returns (entries, bytes) dropped.
    pub fn evict(&self, keys: impl IntoIterator<Item = SsdKey>) -> (u64, u64) {
        // Entries still queued would land after the eviction: write them first.
        self.flush();
        let sh = &self.sh;
        let (mut n, mut bytes) = (0, 0);
        for key in keys {
            let Some(loc) = sh.index.lookup(&key, false) else {
                continue;
            };
            if sh.index.remove_if_is(&key, &loc) {
                n += 1;
                bytes += loc.len as u64;
                inc(&sh.ctr.evicted);
                // Blocking, unlike `remove`: an eviction the operator asked for must hold.
                let _ = self.tx.send(Msg::Remove(key));
            }
        }
        (n, bytes)
    }

    /// The tier's cap in bytes (`ssd.max_size`, bounded by `ssd.max_fill_pct` of the device).
    pub fn cap_bytes(&self) -> u64 {
        self.sh.cap
    }
}
