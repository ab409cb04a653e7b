//! What every part of the core shares: the store (with identities stamped on its answers),
//! the configuration, the counters, the cache tiers and the kernel's page cache. Beyond
//! accessors, only the bookkeeping of a file's version against the tiers lives here: it is
//! needed alike by the namespace (a rename or chmod moves a ctime), the data path and
//! write-back, and touches nothing but these.

use crate::counted::CountedStore;
use crate::file_state::{FileState, Observed};
use crate::identity::IdStore;
use crate::stats::FsStats;
use crate::FsConfig;
use std::ffi::OsString;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tierfs_cache::{RamCache, SharedCache, SsdCache, SsdKey};
use tierfs_store::{Attr, Result, Store};

/// The store as the core sees it: counted, and with every attribute carrying the object's
/// identity (see `identity`).
pub(crate) type St<S> = IdStore<CountedStore<S>>;
/// A backing node and an open backing file as the core holds them (with their identity).
pub(crate) type Node<S> = <St<S> as Store>::Node;
pub(crate) type Handle<S> = <St<S> as Store>::Handle;
/// A directory's entries with their attributes, as one listing gave them.
pub(crate) type Listed = Arc<Vec<(OsString, crate::meta::Child)>>;

pub(crate) struct Shared<S: Store> {
    pub store: St<S>,
    pub cfg: FsConfig,
    pub stats: FsStats,
    /// The RAM tier; shared with the memory-pressure monitor, which sets its cap.
    pub cache: Arc<RamCache>,
    /// The persistent second-level tier, if the mount has one.
    pub ssd: Option<Arc<SsdCache>>,
    /// The shared tier many hosts read through, if the mount has one (`-o shared=`).
    pub shared_tier: OnceLock<Arc<SharedCache>>,
    /// The kernel's page cache, once the FUSE adapter has set it (see [`crate::served`]).
    kernel: OnceLock<Arc<dyn crate::KernelCache>>,
}

/// The SSD-tier key of an object's metadata record (`KIND_DIR`, `KIND_LINK`).
pub(crate) fn meta_key(kind: u8, a: &Attr) -> SsdKey {
    meta_key_of(kind, (a.dev, a.ino))
}

/// [`meta_key`] of the object with identity `id`.
pub(crate) fn meta_key_of(kind: u8, id: crate::identity::Ident) -> SsdKey {
    SsdKey {
        kind,
        dev: id.0,
        ino: id.1,
        idx: 0,
    }
}

impl<S: Store> Shared<S> {
    pub fn new(store: St<S>, cfg: FsConfig, ssd: Option<Arc<SsdCache>>) -> Shared<S> {
        Shared {
            cache: Arc::new(RamCache::new(cfg.ram_max)),
            stats: FsStats::default(),
            kernel: OnceLock::new(),
            shared_tier: OnceLock::new(),
            store,
            cfg,
            ssd,
        }
    }

    pub fn kernel(&self) -> Option<&Arc<dyn crate::KernelCache>> {
        self.kernel.get()
    }

    /// Records fresh attributes of a regular file whose fetch began at `fetched` (ignored if
    /// a change of our own landed since, see `FileState::own_change`); counts changes made
    /// behind our back.
    pub(crate) fn observe_fetched(&self, state: &FileState, attr: &Attr, fetched: Instant) {
        if let Some(Observed::Changed) = state.observe_fetched(attr, fetched) {
            FsStats::add(&self.stats.version_changes, 1);
        }
    }

    /// [`Shared::observe_fetched`] for attributes the kernel is not shown (found by a read or
    /// write).
    pub(crate) fn observe_data_fetched(&self, state: &FileState, attr: &Attr, fetched: Instant) {
        if let Some(Observed::Changed) = state.observe_data_fetched(attr, fetched) {
            FsStats::add(&self.stats.version_changes, 1);
        }
    }

    /// [`FileState::settle_own_writes`] of attributes fetched under the file's lock, a
    /// version change counted.
    pub(crate) fn settle_own_writes(&self, state: &FileState, attr: &Attr) {
        if let Observed::Changed = state.settle_own_writes(attr) {
            FsStats::add(&self.stats.version_changes, 1);
        }
    }

    /// [`FileState::settle_fetched`], counted.
    pub(crate) fn settle_fetched(&self, state: &FileState, attr: &Attr, fetched: Instant) {
        if let Some(Observed::Changed) = state.settle_fetched(attr, fetched) {
            FsStats::add(&self.stats.version_changes, 1);
        }
    }

    /// Attributes of an open file, under the identity its state has now (a handle keeps the
    /// one it was opened under, which a rename may have changed since).
    pub(crate) fn fstat_as(&self, st: &FileState, h: &Handle<S>) -> Result<Attr> {
        let mut a = self.store.fstat(h)?;
        (a.dev, a.ino) = st.id();
        Ok(a)
    }

    /// Lets the core have the kernel drop cached pages (the FUSE adapter sets it at mount).
    pub fn set_kernel_cache(&self, k: Arc<dyn crate::KernelCache>) {
        let _ = self.kernel.set(k);
    }

    /// Has the kernel drop its pages of `ino` (asynchronously), then records that it holds
    /// nothing of `state` any more.
    pub(crate) fn drop_kernel_pages(&self, ino: u64, state: &Arc<FileState>, clear: bool) {
        let st = state.clone();
        let done: Box<dyn FnOnce() + Send> = Box::new(move || {
            if clear {
                st.served.dropped()
            }
        });
        match self.kernel.get() {
            Some(k) => k.drop_pages(ino, done),
            None => done(),
        }
    }

    /// After one of our own metadata operations moved a file's ctime (rename, chmod, chown,
    /// link): the SSD tier's entries of it carry a version made from the old fingerprint and
    /// would miss after a restart; what the RAM tier holds of it is offered again under the
    /// new one (within the tier's write budget).
    pub(crate) fn reoffer_to_ssd(&self, st: &FileState) {
        let Some(ssd) = &self.ssd else { return };
        // Blocks in RAM were fetched under a fingerprint that was not racy, or written by
        // us: they are this version's data, whatever its ctime.
        let v = st.version();
        let (dev, ino) = st.id();
        let version = crate::meta_codec::version_of(&v.fp);
        for idx in 0..v.fp.size.div_ceil(self.cfg.block_size) {
            if let Some(b) = self.cache.peek(&tierfs_cache::BlockKey { gen: v.gen, idx }) {
                let key = SsdKey {
                    kind: tierfs_cache::KIND_DATA,
                    dev,
                    ino,
                    idx,
                };
                ssd.offer(key, version, b);
            }
        }
    }

    /// [`FileState::observe_own_metadata_change`], and the SSD tier told of the new version
    /// when only the ctime moved (see [`Shared::reoffer_to_ssd`]).
    pub(crate) fn own_metadata_change(&self, st: &FileState, attr: &Attr) -> Observed {
        let before = st.version();
        let r = st.observe_own_metadata_change(attr);
        let after = st.version();
        if after.gen == before.gen && after.fp != before.fp {
            self.reoffer_to_ssd(st);
        }
        r
    }
}
