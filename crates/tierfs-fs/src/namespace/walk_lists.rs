//! A directory nobody has listed, whose names a walk looks up one by one (`git status`'s
//! `lstat` of every tracked file, `xargs cat` of the files `ls` named, a build's includes):
//! each lookup is a store request, one after another, where one listing would have answered
//! them all. Once the store has spent on lookups in such a directory about what listing it
//! is estimated to cost, it is listed (ski rental: never much more than twice the cheaper of
//! the two), and the rest of the walk is answered from the listing.
//!
//! The estimate: a listing's fixed cost is taken as three lookups (open, read, close of the
//! directory over a network: sshfs's OPENDIR, READDIR, CLOSE), plus a cost per entry learnt
//! from the listings taken so far (50 µs before the first), times the entries the directory's
//! size on the store suggests (16 in its first 4 KiB block, one per 24 bytes after: ext4,
//! XFS and NFS directories grow so). Only on network stores whose directories' sizes follow
//! their names (NFS, sshfs and other FUSE mounts, an sftp server); not on a local disk (a
//! lookup costs microseconds, and a listing's entries are each a stat), not on S3 by size (a
//! prefix's size tells nothing; see below), and not where directories are listed for names first (there a
//! listing is cheap and stats come by kind).
//! On S3, whose prefixes have no size, a listing comes in pages of 1,000 keys with their
//! attributes: a directory a walk has made [`PAGED_AFTER`] lookups in is listed if one page
//! holds all of it (asked first, one request: `Store::lists_within`), else never for this walk
//! (a prefix of a million keys is a thousand requests; its lookups stay one request each).
//! Never a directory that has a listing, fresh or not: a stale listing is renewed or
//! relisted by an opendir, and a lookup in it costs one request (the re-listing loop of issue
//! 42 came from lookups relisting).

use crate::identity::Ident;
use dashmap::DashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Directories tracked at once; when full, the table starts over (a walk then pays a few
/// more lookups: slower, never wrong).
const MAX_DIRS: usize = 16_384;
/// Lookups in one directory after which a store listing in pages (S3) lists it, if one page
/// holds it: the probe and the listing cost about two lookups' round trips.
const PAGED_AFTER: u32 = 3;
/// `misses`'s count for a directory found too big to list in one page.
const NEVER: u32 = u32::MAX;
/// What a listing is taken to cost per entry before one was measured.
const DEFAULT_PER_ENTRY: Duration = Duration::from_micros(50);
/// Listings shorter than this do not teach the per-entry cost (their fixed cost dominates).
const LEARN_FROM: usize = 256;

#[derive(Default)]
pub(crate) struct WalkLists {
    /// Per directory: the time store lookups in it took so far, and how many.
    misses: DashMap<Ident, (Duration, u32)>,
    /// A listing's cost per entry, nanoseconds (a moving average); 0: none measured yet.
    per_entry_ns: AtomicU64,
}

impl WalkLists {
    /// A store lookup in `dir`, which has no listing, took `took`.
    pub fn missed(&self, dir: Ident, took: Duration) {
        if self.misses.len() >= MAX_DIRS {
            self.misses.clear();
        }
        let mut e = self.misses.entry(dir).or_insert((Duration::ZERO, 0));
        e.0 += took;
        if e.1 != NEVER {
            e.1 += 1;
        }
    }

    /// Whether `dir`, `size` bytes on the store, is to be listed now: its lookups have cost
    /// what listing it would.
    pub fn due(&self, dir: Ident, size: u64) -> bool {
        let Some((spent, n)) = self.misses.get(&dir).map(|e| *e) else {
            return false;
        };
        if n < 2 || n == NEVER {
            return false;
        }
        let per_entry = match self.per_entry_ns.load(Relaxed) {
            0 => DEFAULT_PER_ENTRY,
            ns => Duration::from_nanos(ns),
        };
        let entries = 16 + size.saturating_sub(4096) / 24;
        let fixed = spent / n * 3;
        spent >= fixed + per_entry.saturating_mul(entries.min(u32::MAX as u64) as u32)
    }

    /// Whether `dir`, on a store listing in pages, has had lookups enough to be probed for a
    /// listing of one page.
    pub fn due_paged(&self, dir: Ident) -> bool {
        self.misses
            .get(&dir)
            .is_some_and(|e| e.1 >= PAGED_AFTER && e.1 != NEVER)
    }

    /// `dir` takes more than one page to list (or could not be probed): its walk goes on by
    /// lookups.
    pub fn too_big(&self, dir: Ident) {
        self.misses.insert(dir, (Duration::ZERO, NEVER));
    }

    /// `dir` was listed: its lookups start over; a long listing teaches the cost per entry.
    pub fn listed(&self, dir: Ident, entries: usize, took: Duration) {
        self.misses.remove(&dir);
        if entries < LEARN_FROM {
            return;
        }
        let ns = (took.as_nanos() / entries as u128).min(u64::MAX as u128) as u64;
        let old = self.per_entry_ns.load(Relaxed);
        let new = if old == 0 { ns } else { (old * 3 + ns) / 4 };
        self.per_entry_ns.store(new.max(1), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_directory_is_listed_after_a_few_slow_lookups() {
        let w = WalkLists::default();
        let d = (1, 2);
        w.missed(d, Duration::from_millis(4));
        assert!(!w.due(d, 4096), "one lookup never lists");
        for _ in 0..3 {
            w.missed(d, Duration::from_millis(4));
        }
        // 16 ms spent; a listing: 12 ms fixed + 16 x 50 us.
        assert!(w.due(d, 4096));
        w.listed(d, 10, Duration::from_millis(12));
        assert!(!w.due(d, 4096), "listed: starts over");
    }

    #[test]
    fn a_paged_store_probes_after_a_few_lookups_and_a_big_prefix_is_left_alone() {
        let w = WalkLists::default();
        let d = (1, 5);
        for _ in 0..PAGED_AFTER - 1 {
            w.missed(d, Duration::from_millis(20));
        }
        assert!(!w.due_paged(d));
        w.missed(d, Duration::from_millis(20));
        assert!(w.due_paged(d));
        // More than a page: never probed again, whatever the walk costs.
        w.too_big(d);
        for _ in 0..1000 {
            w.missed(d, Duration::from_millis(20));
        }
        assert!(!w.due_paged(d) && !w.due(d, 4096));
        // Listed (a page held it): starts over.
        let e = (1, 6);
        for _ in 0..PAGED_AFTER {
            w.missed(e, Duration::from_millis(20));
        }
        w.listed(e, 100, Duration::from_millis(20));
        assert!(!w.due_paged(e));
    }

    #[test]
    fn a_big_directory_or_a_fast_store_waits_longer() {
        let w = WalkLists::default();
        let d = (1, 3);
        for _ in 0..8 {
            w.missed(d, Duration::from_millis(4));
        }
        // 10,000 entries' worth of directory (240 KiB): 0.5 s estimated.
        assert!(!w.due(d, 240 << 10));
        // A local disk: lookups of microseconds add up to a listing only after hundreds.
        let l = (1, 4);
        for _ in 0..100 {
            w.missed(l, Duration::from_micros(3));
        }
        assert!(!w.due(l, 4096));
        // The cost per entry learnt from a long listing.
        w.listed((9, 9), 10_000, Duration::from_millis(100));
        assert_eq!(w.per_entry_ns.load(Relaxed), 10_000);
    }
}
