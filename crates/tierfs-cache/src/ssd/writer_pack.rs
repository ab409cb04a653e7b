//! Clusters of the writer thread: entries placed in the open cluster (a hit entry of a
//! reclaimed segment rewritten, if still current), the cluster written with one write and its
//! entries published in the index, the write budget settled; a cluster that could not be
//! written gives back what its entries held.

use super::aligned::PAGE;
use super::budget::{charge, HEADROOM};
use super::index::{Entry, Loc};
use super::layout::{
    align_for, compute_crcs, put_record, rec_size, round_up, seal_header, ClusterHeader,
    FLAG_TOMBSTONE, HDR, REC_FIXED,
};
use super::read::{read_verified, ReadFail};
use super::stats::inc;
use super::writer::{Item, Kind, Writer};
use super::{io, SsdKey};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

impl Writer {
    /// Where an entry of `len` bytes would go in the open cluster, and whether it fits.
    fn place(&self, len: u32, tomb: bool) -> (u64, bool) {
        let (off, rec) = if tomb {
            (self.data_end, REC_FIXED)
        } else {
            (round_up(self.data_end, align_for(len)), rec_size(len))
        };
        // The data area holds up to cluster_size bytes; the summary, as many records as fit
        // in as many bytes (it only grows that far with entries of a few bytes).
        let cs = self.sh.cfg.cluster_size;
        let summary = round_up((HDR + self.records_len + rec) as u64, PAGE as u64);
        (off, summary <= cs && off + len as u64 <= cs)
    }

    /// `charge`: the entry's estimated cost, and whether the budget paid it.
    pub(super) fn add(
        &mut self,
        key: SsdKey,
        version: u64,
        data: &[u8],
        charge: (u64, bool),
        kind: Kind,
    ) {
        let (charge, budgeted) = charge;
        let tomb = matches!(kind, Kind::Tombstone);
        let len = data.len() as u32;
        let mut placed = self.place(len, tomb);
        if !placed.1 && !self.items.is_empty() {
            self.seal();
            placed = self.place(len, tomb);
        }
        let (off, fits) = placed;
        if !fits {
            // Larger than a cluster: offer() refuses these, so this is only a safety net.
            self.drop_item(&key, version, &kind);
            return;
        }
        let crcs: Arc<[u32]> = match &kind {
            Kind::Tombstone => Arc::from(Vec::new()),
            Kind::Reinsert(loc) => loc.crcs.clone(),
            Kind::Put => {
                compute_crcs(&key, version, data, &mut self.scratch);
                Arc::from(&self.scratch[..])
            }
        };
        let d = self.data.as_mut_slice();
        d[self.data_end as usize..off as usize].fill(0);
        d[off as usize..off as usize + data.len()].copy_from_slice(data);
        let flags = if tomb { FLAG_TOMBSTONE } else { 0 };
        self.records_len += put_record(
            self.sum.as_mut_slice(),
            HDR + self.records_len,
            &key,
            version,
            flags,
            off as u32,
            len,
            &crcs,
        );
        self.data_end = off + len as u64;
        self.opened.get_or_insert_with(Instant::now);
        self.items.push(Item {
            key,
            version,
            len,
            data_off: off as u32,
            charge,
            budgeted,
            crcs,
            kind,
        });
        // Full: not even a small entry fits any more.
        if !self.place(1, false).1 {
            self.seal();
        }
    }

    /// Rewrites a hit entry of a reclaimed segment, if it is still current and the budget
    /// allows; otherwise it leaves the index.
    pub(super) fn reinsert(&mut self, key: SsdKey, loc: Loc) {
        let sh = self.sh.clone();
        let current = sh.index.lookup(&key, false).is_some_and(|l| {
            Arc::ptr_eq(&l.seg, &loc.seg) && l.off == loc.off && l.version == loc.version
        });
        if !current {
            return;
        }
        let c = charge(loc.len);
        if !sh.budget.try_take(c, HEADROOM) {
            sh.index.remove_if_is(&key, &loc);
            return;
        }
        match read_verified(&key, &loc, 0, loc.len) {
            Ok(data) => self.add(key, loc.version, &data, (c, true), Kind::Reinsert(loc)),
            Err(f) => {
                inc(if f == ReadFail::Checksum {
                    &sh.ctr.checksum_errors
                } else {
                    &sh.ctr.io_errors
                });
                sh.index.remove_if_is(&key, &loc);
                sh.budget.refund(c);
            }
        }
    }

    /// An item that will not be written: release what it holds.
    fn drop_item(&self, key: &SsdKey, version: u64, kind: &Kind) {
        match kind {
            Kind::Put => self.sh.pending.release(key, version),
            Kind::Reinsert(loc) => {
                self.sh.index.remove_if_is(key, loc);
            }
            Kind::Tombstone => {}
        }
    }

    /// Writes the open cluster and publishes its entries.
    pub(super) fn seal(&mut self) {
        if self.items.is_empty() {
            self.opened = None;
            return;
        }
        let summary_len = round_up((HDR + self.records_len) as u64, PAGE as u64) as usize;
        let data_len = round_up(self.data_end, PAGE as u64) as usize;
        let cluster_len = (summary_len + data_len) as u64;
        self.sum.as_mut_slice()[HDR + self.records_len..summary_len].fill(0);
        self.data.as_mut_slice()[self.data_end as usize..data_len].fill(0);

        let room = self.cur.is_some() && self.cur_off + cluster_len <= self.sh.cfg.segment_size;
        if !room && !self.roll() {
            self.fail_items(true);
            return;
        }
        let Some(seg) = self.cur.clone() else {
            self.fail_items(true);
            return;
        };
        let hdr = ClusterHeader {
            summary_len: summary_len as u32,
            cluster_len: cluster_len as u32,
            n_records: self.items.len() as u32,
            records_len: self.records_len as u32,
        };
        let sh = self.sh.clone();
        seal_header(
            self.sum.as_mut_slice(),
            &sh.uuid,
            sh.seed,
            seg.seq,
            self.cur_off,
            &hdr,
        );
        let written = io::write_two_at(
            &seg.file,
            &self.sum.as_slice()[..summary_len],
            &self.data.as_slice()[..data_len],
            self.cur_off,
        );
        if let Err(e) = written {
            inc(&sh.ctr.io_errors);
            tracing::warn!(
                "SSD cache: write to {} failed: {e}; dropping {} entries, starting a new segment",
                seg.path.display(),
                self.items.len()
            );
            // Never append after what may be a partial write.
            let _ = seg.file.set_len(self.cur_off);
            self.cur = None;
            self.fail_items(false);
            return;
        }
        if !sh.direct.load(Relaxed) {
            io::drop_cached(&seg.file, self.cur_off, cluster_len);
        }
        let at = self.cur_off + summary_len as u64;
        self.cur_off += cluster_len;
        if let Some(info) = self.segs.get_mut(&seg.seq) {
            info.len = self.cur_off;
        }
        sh.fill.fetch_add(cluster_len, Relaxed);
        sh.ctr.written_bytes.fetch_add(cluster_len, Relaxed);
        inc(&sh.ctr.clusters_written);
        if self.dirty.last().is_none_or(|s| s.seq != seg.seq) {
            self.dirty.push(seg.clone());
        }
        self.changed = true;
        sh.budget.settle(self.settlement(cluster_len));
        let mut keys = Vec::with_capacity(self.items.len());
        for it in self.items.drain(..) {
            let entry = || Entry {
                version: it.version,
                seg: seg.clone(),
                off: at + it.data_off as u64,
                len: it.len,
                crcs: it.crcs.clone(),
                hit: AtomicBool::new(false),
            };
            match &it.kind {
                Kind::Put => {
                    sh.index.insert(it.key, entry());
                    sh.pending.release(&it.key, it.version);
                    keys.push(it.key);
                }
                Kind::Reinsert(loc) => {
                    let replaced =
                        sh.index
                            .with_entry(&it.key, |shard| match shard.get_mut(&it.key) {
                                Some(e) if e.is(loc) => {
                                    *e = entry();
                                    true
                                }
                                _ => false,
                            });
                    if replaced {
                        inc(&sh.ctr.reinsertions);
                        keys.push(it.key);
                    }
                }
                Kind::Tombstone => {
                    sh.index.remove(&it.key);
                }
            }
        }
        seg.keys.lock().extend(keys);
        self.reset_cluster();
    }

    /// What the budget owes for the cluster just written, beyond what its entries paid: its
    /// real cost minus their estimates. Entries admitted without budget (`offer_wait`) pay
    /// nothing, and their share of the real cost is not charged either.
    fn settlement(&self, cluster_len: u64) -> i128 {
        let all: u64 = self.items.iter().map(|i| i.charge).sum();
        let paid: u64 = self
            .items
            .iter()
            .filter(|i| i.budgeted)
            .map(|i| i.charge)
            .sum();
        if paid == all {
            return cluster_len as i128 - paid as i128;
        }
        if all == 0 {
            return 0;
        }
        let share = cluster_len as u128 * paid as u128 / all as u128;
        share as i128 - paid as i128
    }

    fn reset_cluster(&mut self) {
        self.items.clear();
        self.records_len = 0;
        self.data_end = 0;
        self.opened = None;
    }

    /// The open cluster could not be written. `refund`: nothing reached the disk.
    fn fail_items(&mut self, refund: bool) {
        let items = std::mem::take(&mut self.items);
        let mut charged = 0;
        for it in &items {
            if it.budgeted {
                charged += it.charge;
            }
            if matches!(it.kind, Kind::Tombstone) {
                // Gone from the index in memory but not logged: only a checkpoint (the next,
                // or the one at shutdown) makes the drop durable.
                self.changed = true;
            }
            self.drop_item(&it.key, it.version, &it.kind);
        }
        if refund {
            self.sh.budget.refund(charged);
        }
        self.reset_cluster();
    }
}
