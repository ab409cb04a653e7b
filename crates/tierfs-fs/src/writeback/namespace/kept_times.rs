//! Times that do not move when write-back writes to the store. The mount shows an object's
//! times as the application made them: a new object's as its create was acknowledged, a
//! written file's ctime as its last write. When write-back later makes the object or writes
//! the data, the store stamps its own times, a moment later (ctime cannot be set at all), and
//! a program comparing times across that moment saw the file change by itself (pjdfstest in
//! write-back: ctime and mtime moved by about 0.1 s at publication).
//!
//! So the times shown are kept, per identity, with the store's ctime at that moment: while
//! the store's object still has that ctime (nobody changed it since), the kept times are
//! shown instead of the store's; once it moves, the store's are shown again. For the mount's
//! life only: after a remount the store's times show (they differ by when write-back ran).

use dashmap::DashMap;
use tierfs_store::{Attr, TimeSpec};

type Ident = (u64, u64);

/// Identities with kept times, at most (about 64 bytes each); past it, times of objects
/// written later may move at publication as before.
const MAX: usize = 1 << 20;

#[derive(Clone, Copy)]
struct Kept {
    /// The store's ctime when the times were kept: they hold while it is unchanged.
    store_ctime: TimeSpec,
    ctime: TimeSpec,
    mtime: Option<TimeSpec>,
    atime: Option<TimeSpec>,
}

#[derive(Default)]
pub(crate) struct KeptTimes {
    map: DashMap<Ident, Kept>,
}

impl KeptTimes {
    /// `id`, whose store object has ctime `store_ctime` now, shows `shown`'s ctime (and
    /// mtime and atime with `all`) while it keeps that ctime.
    pub(crate) fn keep(&self, id: Ident, store_ctime: TimeSpec, shown: &Attr, all: bool) {
        if shown.ctime == store_ctime && (!all || shown.mtime == store_ctime) {
            self.map.remove(&id);
            return;
        }
        if self.map.len() >= MAX && !self.map.contains_key(&id) {
            return;
        }
        // A new object's kept atime stays when its data's flush keeps the ctime (the flush
        // sets the store's mtime itself).
        let before = self.map.get(&id).map(|k| *k);
        self.map.insert(
            id,
            Kept {
                store_ctime,
                ctime: shown.ctime,
                mtime: all.then_some(shown.mtime),
                atime: if all {
                    Some(shown.atime)
                } else {
                    before.and_then(|k| k.atime)
                },
            },
        );
    }

    /// `attr` (the store's attributes of `id`) with the kept times, while they hold.
    pub(crate) fn overlay(&self, id: Ident, attr: &mut Attr) {
        if self.map.is_empty() {
            return;
        }
        let Some(k) = self.map.get(&id).map(|k| *k) else {
            return;
        };
        if attr.ctime != k.store_ctime {
            // Changed on the store since (by us or anyone): its own times from now on.
            self.map
                .remove_if(&id, |_, v| v.store_ctime == k.store_ctime);
            return;
        }
        attr.ctime = k.ctime;
        if let Some(m) = k.mtime {
            attr.mtime = m;
        }
        if let Some(a) = k.atime {
            attr.atime = a;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(sec: i64) -> TimeSpec {
        TimeSpec { sec, nsec: 0 }
    }

    fn attr(c: i64, m: i64, a: i64) -> Attr {
        // SAFETY: a zeroed stat is a valid one.
        let mut x = Attr::from_stat(&unsafe { std::mem::zeroed() });
        (x.ctime, x.mtime, x.atime) = (t(c), t(m), t(a));
        x
    }

    #[test]
    fn kept_times_hold_until_the_store_changes() {
        let k = KeptTimes::default();
        let shown = attr(10, 10, 10);
        k.keep((1, 2), t(11), &shown, true);
        let mut a = attr(11, 11, 11);
        k.overlay((1, 2), &mut a);
        assert_eq!((a.ctime, a.mtime, a.atime), (t(10), t(10), t(10)));
        let mut changed = attr(20, 20, 11);
        k.overlay((1, 2), &mut changed);
        assert_eq!((changed.ctime, changed.mtime), (t(20), t(20)));
        // Gone for good: the old ctime no longer brings them back.
        let mut again = attr(11, 11, 11);
        k.overlay((1, 2), &mut again);
        assert_eq!(again.ctime, t(11));
    }
}
