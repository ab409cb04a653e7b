//! The in-memory index: SsdKey -> where the entry is and how to verify it.
//!
//! Sharded like the RAM tier: a lookup takes one shard's read lock and sets the entry's hit bit
//! atomically, so concurrent readers never serialize. Only the writer (after a cluster write
//! completed), recovery and removals take write locks.

use super::segment::Segment;
use super::SsdKey;
use parking_lot::{Mutex, RwLock};
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

const SHARDS: usize = 64;

pub(crate) struct Entry {
    pub version: u64,
    pub seg: Arc<Segment>,
    /// Byte offset of the data in the segment file.
    pub off: u64,
    pub len: u32,
    pub crcs: Arc<[u32]>,
    /// Set by hits; reclaim rewrites entries that have it.
    pub hit: AtomicBool,
}

/// A copy of an entry's location, taken under the shard lock and used after it is released.
#[derive(Clone)]
pub(crate) struct Loc {
    pub version: u64,
    pub seg: Arc<Segment>,
    pub off: u64,
    pub len: u32,
    pub crcs: Arc<[u32]>,
}

impl Entry {
    pub fn loc(&self) -> Loc {
        Loc {
            version: self.version,
            seg: self.seg.clone(),
            off: self.off,
            len: self.len,
            crcs: self.crcs.clone(),
        }
    }

    /// Whether this is still the entry `loc` was taken from.
    pub fn is(&self, loc: &Loc) -> bool {
        Arc::ptr_eq(&self.seg, &loc.seg) && self.off == loc.off && self.version == loc.version
    }
}

type Shard = FxHashMap<SsdKey, Entry>;

pub(crate) struct Index {
    shards: Box<[RwLock<Shard>]>,
}

fn shard_of(key: &SsdKey) -> usize {
    (key.mix() % SHARDS as u64) as usize
}

impl Index {
    pub fn new() -> Index {
        Index {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
        }
    }

    /// The entry's location if present; a hit (`mark`) sets its hit bit.
    pub fn lookup(&self, key: &SsdKey, mark: bool) -> Option<Loc> {
        let shard = self.shards[shard_of(key)].read();
        let e = shard.get(key)?;
        if mark {
            e.hit.store(true, Relaxed);
        }
        Some(e.loc())
    }

    pub fn contains(&self, key: &SsdKey, version: u64) -> bool {
        self.shards[shard_of(key)]
            .read()
            .get(key)
            .is_some_and(|e| e.version == version)
    }

    pub fn insert(&self, key: SsdKey, e: Entry) {
        self.shards[shard_of(&key)].write().insert(key, e);
    }

    pub fn remove(&self, key: &SsdKey) -> bool {
        self.shards[shard_of(key)].write().remove(key).is_some()
    }

    /// Removes the entry only if it is still the one `loc` describes (a newer write of the key
    /// must not be dropped for an error found in an older one).
    pub fn remove_if_is(&self, key: &SsdKey, loc: &Loc) -> bool {
        let mut shard = self.shards[shard_of(key)].write();
        if shard.get(key).is_some_and(|e| e.is(loc)) {
            shard.remove(key);
            return true;
        }
        false
    }

    /// Runs `f` on the entry under the shard's write lock.
    pub fn with_entry<R>(&self, key: &SsdKey, f: impl FnOnce(&mut Shard) -> R) -> R {
        f(&mut self.shards[shard_of(key)].write())
    }

    pub fn len(&self) -> u64 {
        self.shards.iter().map(|s| s.read().len() as u64).sum()
    }

    /// Entries and the bytes of their data (what the tier holds that can be served; the
    /// segment files also hold what was evicted or replaced until they are reclaimed).
    pub fn len_and_bytes(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(n, b), s| {
            let s = s.read();
            let bytes: u64 = s.values().map(|e| e.len as u64).sum();
            (n + s.len() as u64, b + bytes)
        })
    }

    /// Calls `f` with each shard in turn, under its read lock.
    pub fn for_each_shard(&self, mut f: impl FnMut(&Shard)) {
        for s in self.shards.iter() {
            f(&s.read());
        }
    }

    /// Inserts a batch (recovery): one write lock per shard touched, not per entry.
    pub fn insert_batch(&self, batch: Vec<(SsdKey, Entry)>) {
        let mut by_shard: Vec<Vec<(SsdKey, Entry)>> = (0..SHARDS).map(|_| Vec::new()).collect();
        for (k, e) in batch {
            by_shard[shard_of(&k)].push((k, e));
        }
        for (s, items) in by_shard.into_iter().enumerate() {
            if items.is_empty() {
                continue;
            }
            let mut shard = self.shards[s].write();
            shard.reserve(items.len());
            for (k, e) in items {
                shard.insert(k, e);
            }
        }
    }
}

/// (key, version) pairs of one shard of [`Pending`].
type PendingShard = Mutex<FxHashSet<(SsdKey, u64)>>;

/// Entries offered and not yet in the index, so an entry offered twice is written once.
pub(crate) struct Pending {
    shards: Box<[PendingShard]>,
}

impl Pending {
    pub fn new() -> Pending {
        Pending {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    /// Claims (key, version); false if it is already queued.
    pub fn claim(&self, key: SsdKey, version: u64) -> bool {
        self.shards[shard_of(&key)].lock().insert((key, version))
    }

    pub fn release(&self, key: &SsdKey, version: u64) {
        self.shards[shard_of(key)].lock().remove(&(*key, version));
    }

    pub fn contains(&self, key: &SsdKey, version: u64) -> bool {
        self.shards[shard_of(key)].lock().contains(&(*key, version))
    }
}
