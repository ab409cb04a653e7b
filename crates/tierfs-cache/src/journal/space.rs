//! Which segments are live, what each holds, and when one may be deleted.
//!
//! A segment may go when every DATA record in it is covered by a durable DONE or DROP of its
//! file. Segments go strictly oldest first: a DONE lives in a segment newer than the data it
//! covers, so deleting in order never loses a DONE while data it covers still exists.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// (dev, ino) of a backing file.
pub(crate) type Key = (u64, u64);

#[derive(Debug, Default)]
pub(crate) struct SegInfo {
    /// Bytes the file takes (its preallocated size).
    pub size: u64,
    /// Seq of its first record.
    pub first_seq: u64,
    /// For each file with DATA in the segment, the highest such seq.
    pub files: FxHashMap<Key, u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Space {
    pub segs: BTreeMap<u64, SegInfo>,
    /// Sum of `size` over `segs`.
    pub used: u64,
    /// Per file, the highest `upto_seq` of a durable DONE/DROP. Only files with DATA in a live
    /// segment are kept: a mark for a file with no live data covers nothing that remains.
    pub done_upto: FxHashMap<Key, u64>,
}

impl Space {
    pub fn add_seg(&mut self, seg: u64, size: u64, first_seq: u64) {
        self.used += size;
        self.segs.insert(
            seg,
            SegInfo {
                size,
                first_seq,
                files: FxHashMap::default(),
            },
        );
    }

    /// Records a durable DONE/DROP.
    pub fn mark(&mut self, key: Key, upto: u64) {
        if !self.segs.values().any(|s| s.files.contains_key(&key)) {
            return;
        }
        let e = self.done_upto.entry(key).or_insert(0);
        *e = (*e).max(upto);
    }

    pub fn covered(&self, key: &Key, seq: u64) -> bool {
        self.done_upto.get(key).is_some_and(|&d| d >= seq)
    }

    /// The oldest segments below `limit` whose data is all covered, oldest first, stopping at
    /// the first that is not.
    pub fn freeable(&self, limit: u64) -> Vec<u64> {
        self.segs
            .iter()
            .take_while(|(&seg, info)| {
                seg < limit && info.files.iter().all(|(k, &max)| self.covered(k, max))
            })
            .map(|(&seg, _)| seg)
            .collect()
    }

    /// Forgets a deleted segment, and the marks of files that have no data left.
    pub fn remove_seg(&mut self, seg: u64) {
        let Some(info) = self.segs.remove(&seg) else {
            return;
        };
        self.used -= info.size;
        for k in info.files.keys() {
            if !self.segs.values().any(|s| s.files.contains_key(k)) {
                self.done_upto.remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_first_and_pruning() {
        let mut s = Space::default();
        for seg in 1..=3 {
            s.add_seg(seg, 10, seg * 100);
        }
        s.segs.get_mut(&1).unwrap().files.insert((1, 1), 5);
        s.segs.get_mut(&2).unwrap().files.insert((2, 2), 150);
        s.segs.get_mut(&3).unwrap().files.insert((1, 1), 300);
        assert_eq!(s.used, 30);
        // Segment 2 is covered but 1 is not: nothing may go.
        s.mark((2, 2), 200);
        assert!(s.freeable(4).is_empty());
        s.mark((1, 1), 10);
        assert_eq!(s.freeable(4), vec![1, 2]);
        assert_eq!(
            s.freeable(2),
            vec![1],
            "not at or past the writer's segment"
        );
        s.remove_seg(1);
        s.remove_seg(2);
        assert_eq!(s.used, 10);
        assert!(!s.done_upto.contains_key(&(2, 2)), "no data left for it");
        assert_eq!(s.done_upto.get(&(1, 1)), Some(&10), "still has data in 3");
        s.mark((9, 9), 1);
        assert!(!s.done_upto.contains_key(&(9, 9)), "no data at all");
    }
}
