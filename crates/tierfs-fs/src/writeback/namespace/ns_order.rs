//! Which operations of a namespace group may go to the store at the same time (see `ns`).
//!
//! On a latency-bound store every operation is a round trip (sshfs at 4 ms: 1,024 creates
//! one after another took 3.9 s, and the namespace flusher was the whole of an untar's time
//! until on the store). The journal's order is one the application made, but most of it is
//! not a dependency: two files made in one directory do not depend on each other. What does
//! depend, and is kept in order:
//!
//! - every operation on an object comes after the earlier ones on it (its create first, then
//!   its setattrs in order);
//! - a create comes after every earlier operation on its directory (the directory's create,
//!   and a setattr of it: a create moves the directory's times, so tar's `utimens` on a
//!   directory made before a create in it must stay before);
//! - a setattr of a directory comes after every earlier create in it (tar sets a directory's
//!   times once it is done with it: the names made in it must not move them again).
//!
//! - an unlink or rmdir of an object of the store (`ns_remove`) is ordered like a create in
//!   its directory (an rmdir also after every earlier operation in the directory it
//!   removes), and a later operation that makes the same name (a create, a file saved anew
//!   under the name it had) comes after it: operations that make or remove one name in one
//!   directory share a *name key*, and keep their order;
//!
//! - a move of a name on the store (`ns_move`, rare: a lock file renamed into place) is a
//!   barrier: it comes after everything before it and before everything after it (a create
//!   of the name it frees must find it free);
//!
//! - a replace (`ns_replace`: `rsync` renames every file it updates over the old one) is
//!   ordered like a create in its directory under both its names' keys: after its object's
//!   create and whatever made or removed either name before it, before whatever makes or
//!   removes either after it. (As a barrier, `rsync -a` of 200 files over sshfs took 9.8 s
//!   after it returned until on the store: one rename after another.)
//!
//! Each operation gets a *level*: one more than the highest level of what it depends on. The
//! flusher applies a level at a time, the operations of one level in parallel, so the store
//! never holds an object without its directory, even halfway through a group.

use crate::identity::Ident;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// An operation of the group as ordering sees it: the object it is about, and for a create,
/// the directory it is made in.
pub(crate) struct OrderIn {
    pub id: Ident,
    pub parent: Option<Ident>,
    /// The name it makes or removes (a hash of directory and name; operations with equal
    /// keys keep their order, so a collision only orders more).
    pub name: Option<u64>,
    /// A second name it makes or removes (a replace: the one it leaves and the one it takes).
    pub also: Option<u64>,
    /// Ordered against every other operation of the group.
    pub barrier: bool,
}

/// The name key of `name` in directory `dir` (see [`OrderIn::name`]).
pub(crate) fn name_key(dir: Ident, name: &std::ffi::OsStr) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    dir.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

/// The level of each operation (see the module comment): those of one level are independent
/// of each other, and each depends only on operations of lower levels.
pub(crate) fn levels(ops: &[OrderIn]) -> Vec<u32> {
    // The level of the last operation on an object, and the highest level of a create in a
    // directory.
    let mut last: FxHashMap<Ident, u32> = FxHashMap::default();
    let mut created_in: FxHashMap<Ident, u32> = FxHashMap::default();
    let mut named: FxHashMap<u64, u32> = FxHashMap::default();
    let mut out = Vec::with_capacity(ops.len());
    // The lowest level an operation may have (one past the last barrier), and the highest
    // level given so far.
    let (mut floor, mut top) = (0u32, None::<u32>);
    for op in ops {
        let after = |l: Option<&u32>| l.map_or(0, |l| l + 1);
        if op.barrier {
            let level = after(top.as_ref()).max(floor);
            floor = level + 1;
            top = Some(level);
            last.insert(op.id, level);
            out.push(level);
            continue;
        }
        let mut level = after(last.get(&op.id)).max(floor);
        for k in op.name.iter().chain(&op.also) {
            level = level.max(after(named.get(k)));
        }
        // After every earlier operation in it, if it is a directory (a setattr of it, its
        // removal; for a new object there is none).
        level = level.max(after(created_in.get(&op.id)));
        if let Some(p) = op.parent {
            level = level.max(after(last.get(&p)));
            let c = created_in.entry(p).or_insert(level);
            *c = (*c).max(level);
        }
        last.insert(op.id, level);
        for k in op.name.iter().chain(&op.also) {
            named.insert(*k, level);
        }
        top = top.max(Some(level));
        out.push(level);
    }
    out
}

/// Reorders the operations of one level (indices, in journal order) so that consecutive ones
/// are in different directories where they can be (`dir` of each; a round of one from each
/// directory, then the next round), each directory's keeping their order. The threads take
/// them in this order, and a store whose client serializes the operations in one directory
/// (a FUSE store without parallel directory operations, such as sshfs) otherwise had every
/// thread queued on the same directory: `rsync` into 10 directories over sshfs made its
/// files one at a time, 13 ms each.
pub(crate) fn spread_by_dir(level: &mut [usize], dir: impl Fn(usize) -> Option<Ident>) {
    let mut rank: FxHashMap<Option<Ident>, usize> = FxHashMap::default();
    let mut keyed: Vec<(usize, usize, usize)> = level
        .iter()
        .enumerate()
        .map(|(pos, &k)| {
            let r = rank.entry(dir(k)).or_insert(0);
            *r += 1;
            (*r, pos, k)
        })
        .collect();
    keyed.sort_unstable();
    for (slot, (_, _, k)) in level.iter_mut().zip(keyed) {
        *slot = k;
    }
}

/// Runs `f` on every item, on up to `threads` threads (the caller's among them).
pub(crate) fn par_each<T: Sync>(items: &[T], threads: usize, f: impl Fn(&T) + Sync) {
    let threads = threads.min(items.len());
    if threads <= 1 {
        items.iter().for_each(f);
        return;
    }
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(item) = items.get(next.fetch_add(1, Relaxed)) {
            f(item);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            // Out of threads: the ones there (the caller's at least) do the rest.
            if std::thread::Builder::new()
                .name("tierfs-nsapply".into())
                .spawn_scoped(s, work)
                .is_err()
            {
                break;
            }
        }
        work();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn create(id: u64, parent: u64) -> OrderIn {
        OrderIn {
            id: (1, id),
            parent: Some((1, parent)),
            name: Some(id),
            also: None,
            barrier: false,
        }
    }

    fn setattr(id: u64) -> OrderIn {
        OrderIn {
            id: (1, id),
            parent: None,
            name: None,
            also: None,
            barrier: false,
        }
    }

    #[test]
    fn a_move_on_the_store_comes_between_what_is_before_and_after_it() {
        // Files a, b in d; a moved (index.lock -> index); a new a (index.lock again) and
        // a file c, which must find the name free: after the move.
        let mv = OrderIn {
            id: (1, 11),
            parent: Some((1, 10)),
            name: None,
            also: None,
            barrier: true,
        };
        let ops = [
            create(11, 10),
            create(12, 10),
            setattr(12),
            mv,
            create(13, 10),
            create(14, 10),
        ];
        assert_eq!(levels(&ops), vec![0, 0, 1, 2, 3, 3]);
    }

    #[test]
    fn an_untar_runs_a_directory_at_a_time() {
        // mkdir d (in the root, 0); files a, b in d with a chmod each; mkdir d/e; file f in
        // d/e; utimens of d/e, then of d (which waits for the creates in d, not for d/e's
        // utimens: that changes d/e alone).
        let ops = [
            create(10, 0),
            create(11, 10),
            setattr(11),
            create(12, 10),
            setattr(12),
            create(13, 10),
            create(14, 13),
            setattr(13),
            setattr(10),
        ];
        assert_eq!(levels(&ops), vec![0, 1, 2, 1, 2, 1, 2, 3, 2]);
    }

    #[test]
    fn a_setattr_of_a_directory_stays_before_later_creates_in_it() {
        // A directory of the store (not made in the group): its setattr, then a create in it,
        // then another setattr of it.
        let ops = [setattr(5), create(6, 5), create(7, 5), setattr(5)];
        assert_eq!(levels(&ops), vec![0, 1, 1, 2]);
    }

    #[test]
    fn a_name_removed_and_made_again_keeps_its_order_and_others_go_at_once() {
        // `rm -f d/*` of three files of the store (objects 11-13, names 1-3), then a new file
        // under name 2 (object 14) and one under a new name 4 (object 15); then a setattr
        // of d, which comes after every name change in it.
        let name = |id: u64, key: u64| OrderIn {
            name: Some(key),
            ..create(id, 10)
        };
        let ops = [
            name(11, 1),
            name(12, 2),
            name(13, 3),
            name(14, 2),
            name(15, 4),
            setattr(10),
        ];
        assert_eq!(levels(&ops), vec![0, 0, 0, 1, 0, 2]);
        // `rm -rf d` of a store directory d (10) in the root (1): its files, then d itself
        // (object 10, in 1), after them.
        let rmdir = OrderIn {
            name: Some(99),
            ..create(10, 1)
        };
        let ops = [name(11, 1), name(12, 2), rmdir];
        assert_eq!(levels(&ops), vec![0, 0, 1]);
    }

    #[test]
    fn replaces_of_files_go_at_once_after_their_creates_and_in_order_on_their_names() {
        // rsync into d (10): .a.X (11, name 1) and .b.Y (12, name 2) made, each renamed over
        // a file of the store (names 3 and 4); then .a.Z (13) made under name 1 again and
        // renamed over name 3 again (the second update of the same file); a file under name
        // 5 (14) goes at once.
        let replace = |id: u64, from: u64, to: u64| OrderIn {
            name: Some(from),
            also: Some(to),
            ..create(id, 10)
        };
        let name = |id: u64, key: u64| OrderIn {
            name: Some(key),
            ..create(id, 10)
        };
        let ops = [
            name(11, 1),
            name(12, 2),
            replace(11, 1, 3),
            replace(12, 2, 4),
            name(13, 1),
            replace(13, 1, 3),
            name(14, 5),
        ];
        assert_eq!(levels(&ops), vec![0, 0, 1, 1, 2, 3, 0]);
    }

    #[test]
    fn a_level_takes_one_directory_after_another_in_turn() {
        // Three files in directory 1, two in 2, one in 3, in journal order.
        let dirs = [1u64, 1, 1, 2, 2, 3];
        let mut level: Vec<usize> = (0..6).collect();
        spread_by_dir(&mut level, |k| Some((1, dirs[k])));
        assert_eq!(level, vec![0, 3, 5, 1, 4, 2]);
    }

    #[test]
    fn files_in_directories_of_the_store_all_go_at_once() {
        let ops: Vec<OrderIn> = (0..100).map(|k| create(100 + k, k % 3)).collect();
        assert!(levels(&ops).iter().all(|l| *l == 0));
    }

    #[test]
    fn every_dependency_is_on_a_lower_level() {
        // A pseudo-random mix; check the rules directly against the levels.
        let mut ops = Vec::new();
        let mut x: u64 = 7;
        for k in 0..500u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = 1000 + k;
            if x.is_multiple_of(3) && k > 0 {
                ops.push(setattr(1000 + (x >> 20) % k));
            } else {
                let parent = if k > 0 { 1000 + (x >> 24) % k } else { 1 };
                ops.push(create(id, parent));
            }
        }
        let lv = levels(&ops);
        for (j, b) in ops.iter().enumerate() {
            for (i, a) in ops[..j].iter().enumerate() {
                let same = a.id == b.id;
                let into_dir = b.parent == Some(a.id);
                let dir_after_create = b.parent.is_none() && a.parent == Some(b.id);
                if same || into_dir || dir_after_create {
                    assert!(lv[i] < lv[j], "op {j} depends on op {i}");
                }
            }
        }
    }

    #[test]
    fn par_each_visits_every_item_once() {
        let items: Vec<u32> = (0..1000).collect();
        let seen = Mutex::new(Vec::new());
        par_each(&items, 8, |k| seen.lock().unwrap().push(*k));
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, items);
    }
}
