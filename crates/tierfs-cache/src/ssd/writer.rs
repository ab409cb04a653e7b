//! The one writer thread: packs admitted entries into clusters, writes each cluster with one
//! O_DIRECT write at the end of the current segment, then publishes its entries in the index.
//! It also starts segments (reclaiming the oldest when over the cap), and writes checkpoints.

use super::aligned::{AlignedBuf, PAGE};
use super::budget::{charge, HEADROOM};
use super::checkpoint::{self, Pos};
use super::index::{Entry, Loc};
use super::layout::{
    align_for, compute_crcs, put_record, rec_size, round_up, seal_header, ClusterHeader,
    FLAG_TOMBSTONE, HDR, REC_FIXED,
};
use super::read::{read_verified, ReadFail};
use super::recover::{Recovered, SegInfo};
use super::segment::{self, Segment};
use super::stats::inc;
use super::{io, Shared, SsdError, SsdKey};
use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) enum Msg {
    Put {
        key: SsdKey,
        version: u64,
        data: Bytes,
        /// The estimated cost (`budget::charge`).
        charge: u64,
        /// The charge was taken from the write budget (false: `offer_wait` without budget,
        /// whose bytes the bucket never pays for).
        budgeted: bool,
    },
    Remove(SsdKey),
    Flush(Sender<()>),
    Checkpoint(Sender<Result<(), SsdError>>),
    /// Answers whether the index is durable: the final checkpoint written (or not needed).
    Shutdown(Sender<bool>),
    /// Give back up to this many bytes of the device (the journal needs room): drop the oldest
    /// segments, hot entries included; answers the bytes freed.
    Yield(u64, Sender<u64>),
}

enum Kind {
    Put,
    /// A hit entry rewritten from a reclaimed segment; it replaces the entry at `Loc` only if
    /// the index still holds that one.
    Reinsert(Loc),
    Tombstone,
}

struct Item {
    key: SsdKey,
    version: u64,
    len: u32,
    data_off: u32,
    charge: u64,
    budgeted: bool,
    crcs: Arc<[u32]>,
    kind: Kind,
}

pub(crate) struct Writer {
    sh: Arc<Shared>,
    rx: Receiver<Msg>,
    /// The open cluster: header + records, and the data area, written with one pwritev.
    /// Each buffer is `cluster_size` bytes.
    sum: AlignedBuf,
    data: AlignedBuf,
    items: Vec<Item>,
    records_len: usize,
    data_end: u64,
    opened: Option<Instant>,
    segs: BTreeMap<u64, SegInfo>,
    cur: Option<Arc<Segment>>,
    cur_off: u64,
    next_seq: u64,
    /// Segments written since the last checkpoint: synced before the next one.
    dirty: Vec<Arc<Segment>>,
    reinserts: VecDeque<(SsdKey, Loc)>,
    last_cp: Instant,
    last_full_check: Instant,
    changed: bool,
    scratch: Vec<u32>,
}

impl Writer {
    /// None if the cluster buffers cannot be allocated.
    pub fn new(sh: Arc<Shared>, rx: Receiver<Msg>, rec: Recovered) -> Option<Writer> {
        let cs = sh.cfg.cluster_size as usize;
        Some(Writer {
            sum: AlignedBuf::new(cs)?,
            data: AlignedBuf::new(cs)?,
            sh,
            rx,
            items: Vec::new(),
            records_len: 0,
            data_end: 0,
            opened: None,
            segs: rec.segs,
            cur: None,
            cur_off: 0,
            next_seq: rec.next_seq,
            changed: !rec.clean,
            dirty: Vec::new(),
            reinserts: VecDeque::new(),
            last_cp: Instant::now(),
            last_full_check: Instant::now(),
            scratch: Vec::new(),
        })
    }

    pub fn run(mut self) {
        loop {
            self.drain_reinserts();
            let timeout = self
                .next_deadline()
                .saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(timeout) {
                Ok(msg) => {
                    if self.handle(msg) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.finish();
                    return;
                }
            }
            self.tick();
        }
    }

    /// Handles one message; true when the writer must stop.
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Put {
                key,
                version,
                data,
                charge,
                budgeted,
            } => {
                self.sh.queued_bytes.fetch_sub(data.len() as u64, Relaxed);
                self.add(key, version, &data, (charge, budgeted), Kind::Put);
            }
            Msg::Remove(key) => self.add(key, 0, &[], (0, true), Kind::Tombstone),
            Msg::Flush(done) => {
                self.drain_all();
                let _ = done.send(());
            }
            Msg::Checkpoint(done) => {
                self.drain_all();
                let _ = done.send(self.checkpoint());
            }
            Msg::Yield(bytes, done) => {
                let _ = done.send(self.give_back(bytes));
            }
            Msg::Shutdown(done) => {
                let durable = self.finish();
                let _ = done.send(durable);
                return true;
            }
        }
        false
    }

    /// Whether the index on disk (checkpoint and log) is the one in memory.
    fn finish(&mut self) -> bool {
        self.drain_all();
        if !self.changed {
            return true;
        }
        match self.checkpoint() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("SSD cache: checkpoint at shutdown failed: {e}");
                false
            }
        }
    }

    fn next_deadline(&self) -> Instant {
        let cfg = &self.sh.cfg;
        let mut d = self.last_cp + cfg.checkpoint_interval;
        if let Some(t) = self.opened {
            d = d.min(t + cfg.flush_interval);
        }
        if self.sh.full.load(Relaxed) {
            d = d.min(self.last_full_check + cfg.flush_interval);
        }
        d.max(Instant::now() + Duration::from_millis(1))
    }

    /// Time-driven work: write a partial cluster that waited long enough, checkpoint, see
    /// whether space came back after the device filled up.
    fn tick(&mut self) {
        let sh = self.sh.clone();
        let cfg = &sh.cfg;
        if self
            .opened
            .is_some_and(|t| t.elapsed() >= cfg.flush_interval)
        {
            self.seal();
        }
        if self.last_cp.elapsed() >= cfg.checkpoint_interval {
            if self.changed {
                if let Err(e) = self.checkpoint() {
                    tracing::warn!("SSD cache: checkpoint failed: {e}");
                }
            }
            self.last_cp = Instant::now();
        }
        if self.sh.full.load(Relaxed) && self.last_full_check.elapsed() >= cfg.flush_interval {
            self.last_full_check = Instant::now();
            if self.space_ok() {
                self.sh.full.store(false, Relaxed);
                tracing::info!("SSD cache: space available again; admitting");
            }
        }
    }

    /// Writes everything pending, including rewrites that reclaim queues meanwhile.
    fn drain_all(&mut self) {
        loop {
            self.drain_reinserts();
            self.seal();
            if self.reinserts.is_empty() {
                return;
            }
        }
    }

    fn drain_reinserts(&mut self) {
        while let Some((key, loc)) = self.reinserts.pop_front() {
            self.reinsert(key, loc);
        }
    }

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
    fn add(&mut self, key: SsdKey, version: u64, data: &[u8], charge: (u64, bool), kind: Kind) {
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
    fn reinsert(&mut self, key: SsdKey, loc: Loc) {
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
    fn seal(&mut self) {
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

    /// Whether one more segment fits: under the cap, and the device keeps `min_free_pct` free.
    fn space_ok(&self) -> bool {
        let cfg = &self.sh.cfg;
        let seg = cfg.segment_size;
        if self.sh.fill.load(Relaxed) + seg > self.sh.cap {
            return false;
        }
        match io::device_space(&self.sh.dir) {
            Ok((total, free)) => {
                let keep = (total as u128 * cfg.min_free_pct as u128 / 100) as u64;
                free.saturating_sub(seg) >= keep
            }
            // Unknown: the cap alone applies.
            Err(_) => true,
        }
    }

    /// Starts a new segment, reclaiming the oldest ones until it fits. False if it cannot
    /// (the device is full of other files, or an I/O error): admission stops until space
    /// comes back.
    fn roll(&mut self) -> bool {
        self.cur = None;
        while !self.space_ok() {
            if !self.reclaim_oldest() {
                if !self.sh.full.swap(true, Relaxed) {
                    tracing::warn!(
                        "SSD cache: no room for another segment in {} (cap or min free space); admission paused",
                        self.sh.dir.display()
                    );
                }
                self.last_full_check = Instant::now();
                return false;
            }
        }
        self.sh.full.store(false, Relaxed);
        let seq = self.next_seq;
        let path = self.sh.dir.join(segment::file_name(seq));
        let file = match io::open_segment(&path, true, &self.sh.direct) {
            Ok(f) => f,
            Err(e) => {
                inc(&self.sh.ctr.io_errors);
                tracing::warn!("SSD cache: cannot create {}: {e}", path.display());
                return false;
            }
        };
        self.next_seq += 1;
        let seg = Arc::new(Segment::new(seq, path, file));
        self.segs.insert(
            seq,
            SegInfo {
                seg: seg.clone(),
                len: 0,
            },
        );
        self.sh.segments.store(self.segs.len() as u64, Relaxed);
        self.cur = Some(seg);
        self.cur_off = 0;
        true
    }

    /// Drops the oldest segments, never the one being written, until `bytes` are freed; hot
    /// entries are not rewritten (that would take the space back). Returns the bytes freed.
    fn give_back(&mut self, bytes: u64) -> u64 {
        let mut freed = 0;
        while freed < bytes {
            let cur = self.cur.as_ref().map(|c| c.seq);
            let Some((&oldest, info)) = self.segs.first_key_value() else {
                break;
            };
            if Some(oldest) == cur {
                break;
            }
            let len = info.len;
            let before = self.reinserts.len();
            if !self.reclaim_oldest() {
                break;
            }
            // Its hot entries are dropped too, not rewritten: each would keep the unlinked
            // file (and all its blocks) open through the index.
            for (key, loc) in self.reinserts.drain(before..) {
                self.sh.index.remove_if_is(&key, &loc);
            }
            freed += len;
        }
        if freed > 0 {
            tracing::warn!(
                "SSD cache: gave back {freed} bytes of {} to the write-back journal",
                self.sh.dir.display()
            );
        }
        freed
    }

    /// Drops the oldest segment: its hit entries are queued for rewriting (they stay readable
    /// from the unlinked file until then), the others leave the index, the file is unlinked.
    fn reclaim_oldest(&mut self) -> bool {
        let Some((seq, info)) = self.segs.pop_first() else {
            return false;
        };
        let mut keys = std::mem::take(&mut *info.seg.keys.lock());
        // A key written twice into this segment is listed twice: visit it once.
        keys.sort_unstable_by_key(|k| (k.dev, k.ino, k.idx, k.kind));
        keys.dedup();
        for key in keys {
            let hot = self.sh.index.with_entry(&key, |shard| {
                let (here, hit) = match shard.get(&key) {
                    Some(e) => (Arc::ptr_eq(&e.seg, &info.seg), e.hit.load(Relaxed)),
                    None => return None,
                };
                if !here {
                    return None;
                }
                if hit {
                    return shard.get(&key).map(|e| e.loc());
                }
                shard.remove(&key);
                None
            });
            if let Some(loc) = hot {
                self.reinserts.push_back((key, loc));
            }
        }
        // A kept read-around window would hold the unlinked file's space.
        self.sh.windows.forget(&info.seg);
        if let Err(e) = std::fs::remove_file(&info.seg.path) {
            tracing::warn!("SSD cache: cannot remove {}: {e}", info.seg.path.display());
        }
        self.sh.fill.fetch_sub(info.len, Relaxed);
        self.sh.segments.store(self.segs.len() as u64, Relaxed);
        inc(&self.sh.ctr.reclaimed_segments);
        self.dirty.retain(|s| s.seq != seq);
        self.changed = true;
        true
    }

    /// Makes the written segments durable, then snapshots the index with the position it
    /// covers (the end of the last written cluster).
    fn checkpoint(&mut self) -> Result<(), SsdError> {
        for s in &self.dirty {
            s.file
                .sync_data()
                .map_err(super::error::io_err("fsync", &s.path))?;
        }
        self.dirty.clear();
        let pos = match &self.cur {
            Some(s) => Pos {
                seq: s.seq,
                off: self.cur_off,
            },
            None => Pos {
                seq: self.next_seq,
                off: 0,
            },
        };
        let sh = &self.sh;
        checkpoint::write(&sh.dir, &sh.uuid, sh.seed, pos, &sh.index)?;
        inc(&sh.ctr.checkpoints);
        self.last_cp = Instant::now();
        self.changed = false;
        Ok(())
    }
}
