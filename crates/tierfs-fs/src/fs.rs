//! [`Fs`]: the filesystem core's entry points (one per FUSE operation, minus the wire).

use crate::counted::CountedStore;
use crate::file_state::{FileState, Observed};
use crate::identity::{is_path_id, Ident};
use crate::inode::{now_ms, Inode, InodeTable};
use crate::meta::{ident, MetaCache, NameLookup};
use crate::pool::Pool;
use crate::read::{FetchResult, ReadAhead};
use crate::stats::{FsStats, StatsSnapshot};
use crate::FsConfig;
use dashmap::DashMap;
use parking_lot::Mutex;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tierfs_cache::{
    BlockKey, Claim, PressureConfig, PressureMonitor, RamCache, SingleFlight, SsdCache, SsdKey,
    KIND_DIR, KIND_LINK,
};
use tierfs_store::{Attr, Errno, FileKind, Owner, Result, SetAttr, StatFs, Store};

pub(crate) type St<S> = crate::identity::IdStore<CountedStore<S>>;
/// A backing node and an open backing file as the core holds them (with their identity).
pub(crate) type Node<S> = <St<S> as Store>::Node;
pub(crate) type Handle<S> = <St<S> as Store>::Handle;
/// A directory's entries with their attributes, as one listing gave them.
pub(crate) type Listed = Arc<Vec<(OsString, Attr)>>;

/// A name the kernel now knows: inode number and attributes (with `attr.ino` = that number).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub ino: u64,
    pub attr: Attr,
    /// How old the attributes are (served from the metadata cache): the kernel should trust
    /// them that much less.
    pub age: std::time::Duration,
}

/// An opened directory.
#[derive(Clone, Copy, Debug)]
pub struct DirOpen {
    pub fh: u64,
    /// The kernel may cache the directory's entries (FOPEN_CACHE_DIR): listings are
    /// revalidated by `meta.ttl` like everything else.
    pub cache: bool,
    /// It may keep what it cached at the previous opendir: the names are unchanged since
    /// (FOPEN_KEEP_CACHE).
    pub keep_cache: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct OpenReply {
    pub fh: u64,
    /// The file is unchanged since it was last opened: the kernel may keep its page cache.
    pub keep_cache: bool,
    /// The file changed since the kernel was last given its attributes: the kernel must drop
    /// them (it trusts them for attr_ttl, which follows meta.ttl and may be an hour), or it
    /// would clip reads at a stale size and break close-to-open coherence.
    pub attrs_stale: bool,
}

/// Who asked, for ownership of new objects.
#[derive(Clone, Copy, Debug)]
pub struct Requester {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Clone, Debug)]
pub struct DirEntryOut {
    pub ino: u64,
    pub name: OsString,
    pub kind: FileKind,
    /// Offset of the entry after this one.
    pub next_offset: u64,
}

pub(crate) struct OpenFile<S: Store> {
    /// The backing file, opened on first need: an open served from the metadata cache
    /// (`meta.cto=off`) reaches the backing store only if a read misses every tier.
    handle: OnceLock<Handle<S>>,
    flags: i32,
    opening: Mutex<()>,
    /// Keeps the inode (and its backing node) alive while the file is open.
    pub inode: Arc<Inode<St<S>>>,
    pub state: Arc<FileState>,
    pub ra: Mutex<ReadAhead>,
    /// Serializes backing reads of a sequential stream (see `fetch_run`).
    pub seq_fetch: Mutex<()>,
}

impl<S: Store> OpenFile<S> {
    fn new(
        inode: Arc<Inode<St<S>>>,
        handle: Option<Handle<S>>,
        flags: i32,
        state: Arc<FileState>,
    ) -> Self {
        OpenFile {
            handle: match handle {
                Some(h) => OnceLock::from(h),
                None => OnceLock::new(),
            },
            flags,
            opening: Mutex::new(()),
            inode,
            state,
            ra: Mutex::new(ReadAhead::default()),
            seq_fetch: Mutex::new(()),
        }
    }
}

struct DirHandle {
    entries: Vec<DirEntryOut>,
}

pub struct Fs<S: Store> {
    pub(crate) store: St<S>,
    pub(crate) cfg: FsConfig,
    pub(crate) inodes: InodeTable<St<S>>,
    /// Shared with the memory-pressure monitor, which sets its cap.
    pub(crate) cache: Arc<RamCache>,
    /// The memory-pressure monitor (see [`Fs::start_pressure`]).
    pressure: OnceLock<PressureMonitor>,
    pub(crate) flights: SingleFlight<BlockKey, FetchResult>,
    /// Listings in progress, one per directory (see [`Fs::list_dir`]).
    listings: SingleFlight<Ident, Result<Listed>>,
    pub(crate) files: DashMap<u64, Arc<OpenFile<S>>>,
    /// Files the kernel reads and writes without having opened them (FUSE no-open, see
    /// [`Fs::file_for`]): one reader and one writer per inode, keyed (inode, is writer).
    implicit: DashMap<(u64, bool), Arc<OpenFile<S>>>,
    /// Write-back machinery, with `writeback.mode=back` (see [`Fs::start_writeback`]).
    pub(crate) wb: OnceLock<crate::writeback::Writeback<S>>,
    /// Where write-back data is copied on arrival (huge-page regions).
    pub(crate) write_bufs: crate::writebuf::WriteBufs,
    /// Insertion order of `implicit`, to bound it (and the backing descriptors it holds).
    implicit_order: Mutex<std::collections::VecDeque<(u64, bool)>>,
    dirs: DashMap<u64, Arc<DirHandle>>,
    next_fh: AtomicU64,
    pub(crate) stats: FsStats,
    pub(crate) meta: MetaCache,
    /// The persistent second-level tier, if the mount has one.
    pub(crate) ssd: Option<Arc<SsdCache>>,
    pub(crate) ra_pool: Pool,
    /// `readahead.max`, which may change at run time (`tierfs ctl set`).
    pub(crate) readahead_max: AtomicU64,
    /// The depth sequential streams of this store settled on last (see `stream_depth`).
    pub(crate) seq_depth: std::sync::atomic::AtomicU32,
    as_root: bool,
    /// Caller threads whose last open was answered ESTALE (file replaced behind our back),
    /// and when (`now_ms`): their next lookups and open are the kernel's retry of that open.
    estale: DashMap<u32, u64>,
    /// The kernel's page cache, once the FUSE adapter has set it (see [`crate::served`]).
    kernel: OnceLock<Arc<dyn crate::KernelCache>>,
}

/// How long the kernel may take to retry an open answered ESTALE.
const ESTALE_RETRY_MS: u64 = 1000;

/// At most this many implicit files (see [`Fs::file_for`]) are kept; each may hold a backing
/// descriptor, and the kernel may know a million inodes, against a descriptor limit of tens
/// of thousands. The oldest is dropped first; it is rebuilt (and its backing file reopened)
/// on its next use.
const IMPLICIT_MAX: usize = 1024;

impl<S: Store> Fs<S> {
    pub fn new(store: S, cfg: FsConfig) -> Result<Arc<Fs<S>>> {
        Self::with_ssd(store, cfg, None)
    }

    /// A filesystem with an SSD tier below the RAM tier.
    pub fn with_ssd(store: S, cfg: FsConfig, ssd: Option<Arc<SsdCache>>) -> Result<Arc<Fs<S>>> {
        let store = crate::identity::IdStore::new(CountedStore::new(store))?;
        let (root, root_attr) = store.root()?;
        if root_attr.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let fs = Arc::new(Fs {
            inodes: InodeTable::new(root, &root_attr, 1 << 20),
            cache: Arc::new(RamCache::new(cfg.ram_max)),
            pressure: OnceLock::new(),
            flights: SingleFlight::new(Err(crate::read::FetchError::Errno(Errno::EIO))),
            listings: SingleFlight::new(Err(Errno::EIO)),
            files: DashMap::new(),
            implicit: DashMap::new(),
            implicit_order: Mutex::new(Default::default()),
            wb: OnceLock::new(),
            write_bufs: Default::default(),
            dirs: DashMap::new(),
            next_fh: AtomicU64::new(1),
            stats: FsStats::default(),
            meta: MetaCache::new(
                cfg.meta_ttl,
                cfg.meta_max_entries,
                store.identity_kind() == tierfs_store::Identity::Path,
            ),
            ssd,
            ra_pool: Pool::new("tierfs-ra", cfg.readahead_threads),
            readahead_max: AtomicU64::new(cfg.readahead_max),
            seq_depth: std::sync::atomic::AtomicU32::new(1),
            as_root: unsafe { libc::geteuid() } == 0,
            estale: DashMap::new(),
            kernel: OnceLock::new(),
            store,
            cfg,
        });
        fs.meta.put_attr(&root_attr, Instant::now());
        Ok(fs)
    }

    pub fn ssd(&self) -> Option<&Arc<SsdCache>> {
        self.ssd.as_ref()
    }

    pub fn config(&self) -> &FsConfig {
        &self.cfg
    }

    /// Whether the metadata cache is in use (`meta.ttl` and `meta.max_entries` above 0).
    pub fn meta_cache_enabled(&self) -> bool {
        self.meta.enabled()
    }

    pub fn ram(&self) -> &RamCache {
        &self.cache
    }

    /// Hands the RAM tier's size to the memory-pressure monitor: with `enabled`, its target
    /// follows the host's memory between `cfg.min` and `cfg.max`; without, it is fixed at
    /// `cfg.max` (either way `ram.min`/`ram.max` can be changed at run time through
    /// [`Fs::pressure`]). Once per mount.
    pub fn start_pressure(&self, cfg: PressureConfig, enabled: bool) -> std::io::Result<()> {
        let mon = if enabled {
            PressureMonitor::start(self.cache.clone(), cfg)?
        } else {
            PressureMonitor::fixed(self.cache.clone(), cfg)
        };
        self.pressure
            .set(mon)
            .map_err(|_| std::io::Error::other("the pressure monitor is already running"))
    }

    /// The memory-pressure monitor, once started: `set_limits` changes `ram.min`/`ram.max`.
    pub fn pressure(&self) -> Option<&PressureMonitor> {
        self.pressure.get()
    }

    pub(crate) fn inode(&self, ino: u64) -> Result<Arc<Inode<St<S>>>> {
        // ESTALE: the kernel named an inode we no longer know (it cannot, by the forget
        // protocol, unless the daemon restarted under it).
        self.inodes.get(ino).ok_or(Errno::ESTALE)
    }

    pub(crate) fn open_file(&self, fh: u64) -> Result<Arc<OpenFile<S>>> {
        self.files.get(&fh).map(|f| f.clone()).ok_or(Errno::EBADF)
    }

    /// The open file a request names: handle `fh`, or, for `fh` 0, the inode's implicit
    /// reader or writer. Handle 0 is what the kernel sends for a file it opened without
    /// asking us (FUSE no-open, answered with ENOSYS, see [`FsConfig::no_open`]): open(2) and
    /// close(2) then cost no round trip, which is two of the three requests a `grep -r` over
    /// small files makes per file. Real handles are numbered from 1.
    pub(crate) fn file_for(&self, ino: u64, fh: u64, write: bool) -> Result<Arc<OpenFile<S>>> {
        if fh != 0 {
            return self.open_file(fh);
        }
        let i = self.inode(ino)?;
        if let Some(f) = self.implicit.get(&(ino, write)) {
            // The same inode object: a forgotten and re-learnt inode has a new state.
            if Arc::ptr_eq(&f.inode, &i) {
                return Ok(f.clone());
            }
        }
        let state = i.file.clone().ok_or(Errno::EISDIR)?;
        // A separate writer: opening the backing file for writing just to read it would fail
        // on a running executable (ETXTBSY) or a read-only backing store.
        let flags = if write {
            libc::O_WRONLY
        } else {
            libc::O_RDONLY
        };
        let of = Arc::new(OpenFile::new(i, None, flags, state));
        FsStats::add(&self.stats.implicit_files, 1);
        self.implicit.insert((ino, write), of.clone());
        let mut order = self.implicit_order.lock();
        order.push_back((ino, write));
        while order.len() > IMPLICIT_MAX {
            if let Some(k) = order.pop_front() {
                // A reader still holding it finishes with it; the next request rebuilds it.
                self.implicit.remove_if(&k, |_, f| !Arc::ptr_eq(f, &of));
            }
        }
        Ok(of)
    }

    /// The implicit files of `ino` that exist (see [`Fs::file_for`]).
    fn implicit_files(&self, ino: u64) -> Vec<Arc<OpenFile<S>>> {
        [false, true]
            .iter()
            .filter_map(|w| self.implicit.get(&(ino, *w)).map(|f| f.clone()))
            .collect()
    }

    fn owner(&self, req: Requester) -> Owner {
        self.as_root.then_some((req.uid, req.gid))
    }

    /// Records a name the kernel learns, found under `parent` as `name` with `node`.
    fn entry(
        &self,
        parent: &Arc<Inode<St<S>>>,
        name: &OsStr,
        node: Node<S>,
        mut attr: Attr,
    ) -> Entry {
        self.meta.put_attr(&attr, Instant::now());
        let inode = self.inodes.remember(parent.clone(), name, node, &attr);
        attr.ino = inode.ino;
        self.overlay_attr(&inode, &mut attr);
        Entry {
            ino: inode.ino,
            age: self.kernel_age(&attr, std::time::Duration::ZERO),
            attr,
        }
    }

    /// How old the kernel should take `attr` to be. With path identities each name of a
    /// hard-linked file is an object of its own, and a link or unlink through one name
    /// changes the others' link count unseen: such attributes are not to be kept at all.
    fn kernel_age(&self, attr: &Attr, age: std::time::Duration) -> std::time::Duration {
        if self.meta.distrusts(attr) {
            std::time::Duration::MAX
        } else {
            age
        }
    }

    pub(crate) fn with_ino(&self, inode: &Inode<St<S>>, mut attr: Attr) -> Attr {
        attr.ino = inode.ino;
        self.overlay_attr(inode, &mut attr);
        attr
    }

    /// Records fresh attributes of a regular file; counts changes made behind our back.
    pub(crate) fn observe(&self, state: &FileState, attr: &Attr) {
        if let Observed::Changed = state.observe(attr) {
            FsStats::add(&self.stats.version_changes, 1);
        }
    }

    /// [`Fs::observe`] for attributes the kernel is not shown (found by a read or write).
    pub(crate) fn observe_data(&self, state: &FileState, attr: &Attr) {
        if let Observed::Changed = state.observe_data(attr) {
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

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Entry> {
        self.lookup_by(parent, name, 0)
    }

    /// [`Fs::lookup`] on behalf of caller thread `pid` (0: unknown), see [`Fs::open_by`].
    pub fn lookup_by(&self, parent: u64, name: &OsStr, pid: u32) -> Result<Entry> {
        let p = self.inode(parent)?;
        // The kernel's retry of an open we answered ESTALE asks the store: the metadata
        // cache may still name the replaced file, and the retry is the last one the VFS makes.
        let cached = if self.retrying_after_estale(pid) {
            None
        } else {
            self.lookup_cached(&p, name)?
        };
        let e = match cached {
            Some(e) => e,
            None => {
                let (node, attr) = self.store.lookup(&self.node(&p)?, name)?;
                // A name the listing lacked (created behind our back): it has it now.
                self.meta.learn_name(p.id(), name, &attr);
                self.entry(&p, name, node, attr)
            }
        };
        Ok(e)
    }

    /// A lookup the metadata cache answers without any I/O, for the FUSE thread itself;
    /// None when it would need the SSD tier or the backing store.
    pub fn lookup_fast(&self, parent: u64, name: &OsStr, pid: u32) -> Option<Result<Entry>> {
        if !self.meta.enabled() || self.retrying_after_estale(pid) {
            return None;
        }
        let p = self.inodes.get(parent)?;
        self.answer_from_listing(&p, name, self.meta.lookup(p.id(), name))
    }

    /// [`Fs::getattr_aged`] when the metadata cache can answer without I/O.
    pub fn getattr_fast(&self, ino: u64) -> Option<(Attr, std::time::Duration)> {
        let i = self.inodes.get(ino)?;
        let (attr, at) = self.meta.attr(i.id())?;
        FsStats::add(&self.stats.meta_hits, 1);
        Some((
            self.with_ino(&i, attr),
            self.kernel_age(&attr, at.elapsed()),
        ))
    }

    /// A lookup answered by the metadata cache: `Ok(None)` when it cannot answer. A stale
    /// listing of a directory listed before is revalidated with one listing, for every name
    /// in it at once (`ls -l`, `find` and `grep -r` then cost one backing call per directory),
    /// when it holds the name asked for. A name it lacks is asked for alone: such lookups
    /// come from programs creating names (`tar -x`, a build, `cp -r` into the directory),
    /// and a relisting would not answer them but cost an `fstatat` per entry each time the
    /// listing expired, which over NFS made an untar into large directories quadratic.
    fn lookup_cached(&self, p: &Arc<Inode<St<S>>>, name: &OsStr) -> Result<Option<Entry>> {
        if !self.meta.enabled() || p.kind != FileKind::Dir {
            return Ok(None);
        }
        let mut found = self.meta.lookup(p.id(), name);
        if matches!(found, NameLookup::Unknown) && !self.meta.has_listing(p.id()) {
            self.restore_listing(p, false);
            found = self.meta.lookup(p.id(), name);
        }
        if matches!(found, NameLookup::Unknown) && self.meta.listing_has(p.id(), name) {
            self.list_dir(p)?;
            found = self.meta.lookup(p.id(), name);
        }
        self.answer_from_listing(p, name, found).transpose()
    }

    /// The entry a cached listing gives for `name`: ENOENT if the fresh listing lacks it,
    /// None if the cache cannot answer (no fresh listing, or no fresh attributes).
    fn answer_from_listing(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        found: NameLookup,
    ) -> Option<Result<Entry>> {
        let child = match found {
            NameLookup::Found(c) => c,
            // Close-to-open covers new names too: a file created behind our back must be
            // found by the next open, so with `meta.cto` a name missing from the listing is
            // asked for (a positive answer is checked again by the open itself).
            NameLookup::Absent if self.cfg.meta_cto => return None,
            NameLookup::Absent => {
                FsStats::add(&self.stats.meta_hits, 1);
                return Some(Err(Errno::ENOENT));
            }
            NameLookup::Unknown => return None,
        };
        let (mut attr, at) = self.meta.attr(child.id)?;
        FsStats::add(&self.stats.meta_hits, 1);
        let inode = self.inodes.remember_lazy(p.clone(), name, &attr, at);
        attr.ino = inode.ino;
        self.overlay_attr(&inode, &mut attr);
        Some(Ok(Entry {
            ino: inode.ino,
            attr,
            age: self.kernel_age(&attr, at.elapsed()),
        }))
    }

    /// Lists a directory with attributes from the backing store and records the result.
    /// One listing of a directory at a time: a lookup or opendir that needs it while it is
    /// being listed waits for that listing instead of starting another (on a slow store a
    /// listing takes seconds, and a `du` or `ls -l` asks for every name in it meanwhile).
    pub(crate) fn list_dir(&self, d: &Arc<Inode<St<S>>>) -> Result<Listed> {
        match self.listings.claim(d.id()) {
            Claim::Leader(g) => {
                let r = self.list_dir_now(d);
                g.complete(r.clone());
                r
            }
            Claim::Follower(w) => w.wait(),
        }
    }

    fn list_dir_now(&self, d: &Arc<Inode<St<S>>>) -> Result<Listed> {
        let node = self.node(d)?;
        // The directory's attributes name the listing's version in the SSD tier: they must
        // be taken *before* the listing, so a change in between gives a version that no
        // later lookup asks for (a miss), never an old listing under a new version.
        let dir_attr = match self.meta.attr(d.id()) {
            Some((a, _)) => Some(a),
            None if self.ssd_meta() => self.store.getattr(&node).ok(),
            None => None,
        };
        let listing = self.store.readdir_plus(&node)?;
        // Trusted for `meta.ttl` from when it is complete, not from when it was asked for:
        // a listing that takes longer than `meta.ttl` (1,000 entries over a slow link) would
        // otherwise be stale on arrival, and every lookup in the directory would list it
        // again.
        let at = Instant::now();
        let mut out = Vec::with_capacity(listing.len());
        let mut complete = true;
        for (e, attr) in listing {
            match attr {
                Some(a) => out.push((e.name, a)),
                None => complete = false,
            }
        }
        FsStats::add(&self.stats.meta_listings, 1);
        if complete {
            self.meta.put_listing(d.id(), &out, at);
            if let Some(da) = dir_attr.filter(|a| !crate::file_state::racy(&a.fingerprint())) {
                self.persist_listing(&da, &out, at);
            }
        } else {
            // Entries vanished while listing, or the store cannot stat in the same pass:
            // not a listing to answer negative lookups from.
            self.meta.drop_listing(d.id());
            for (_, a) in &out {
                self.meta.put_attr(a, at);
            }
        }
        Ok(Arc::new(out))
    }

    fn ssd_meta(&self) -> bool {
        self.ssd.is_some() && self.meta.enabled()
    }

    pub(crate) fn meta_key(kind: u8, a: &Attr) -> SsdKey {
        SsdKey {
            kind,
            dev: a.dev,
            ino: a.ino,
            idx: 0,
        }
    }

    fn persist_listing(&self, dir: &Attr, entries: &[(OsString, Attr)], at: Instant) {
        let Some(ssd) = &self.ssd else { return };
        if let Some(rec) = crate::meta_codec::encode_listing(entries, at) {
            let v = crate::meta_codec::version_of(&dir.fingerprint());
            ssd.offer(Self::meta_key(KIND_DIR, dir), v, rec.into());
        }
    }

    /// Brings a directory's listing back from the SSD tier (after a restart, or after the
    /// RAM copy was dropped), if the directory is unchanged since it was stored.
    /// With `no_io`, only from data already in memory (a read-around window).
    fn restore_listing(&self, d: &Arc<Inode<St<S>>>, no_io: bool) -> bool {
        if !self.ssd_meta() {
            return false;
        }
        let (Some(ssd), Some((dattr, _))) = (&self.ssd, self.meta.attr(d.id())) else {
            return false;
        };
        let v = crate::meta_codec::version_of(&dattr.fingerprint());
        let key = Self::meta_key(KIND_DIR, &dattr);
        let rec = if no_io {
            ssd.get_buffered(&key, v)
        } else {
            ssd.get(&key, v)
        };
        let Some(rec) = rec else {
            return false;
        };
        let Some((entries, validated)) = crate::meta_codec::decode_listing(&rec) else {
            return false;
        };
        FsStats::add(&self.stats.meta_ssd_hits, 1);
        self.meta.put_listing(d.id(), &entries, validated);
        true
    }

    /// The backing node of an inode, resolving it from its parent and name if the inode was
    /// learned from the metadata cache. ESTALE if the name now holds another object: the
    /// kernel then looks the path up again.
    pub(crate) fn node(&self, i: &Arc<Inode<St<S>>>) -> Result<Node<S>> {
        if let Some(n) = i.node() {
            return Ok(n);
        }
        let origin = i.origin.lock().clone();
        let Some((parent, name)) = origin else {
            return i.node().ok_or(Errno::ESTALE);
        };
        let pnode = self.node(&parent)?;
        let (node, attr) = match self.store.lookup(&pnode, &name) {
            Ok(r) => r,
            Err(e) => {
                self.meta.drop_listing(parent.id());
                return Err(if e == Errno::ENOENT { Errno::ESTALE } else { e });
            }
        };
        if ident(&attr) != i.id() {
            self.meta.drop_listing(parent.id());
            return Err(Errno::ESTALE);
        }
        self.meta.put_attr(&attr, Instant::now());
        self.inodes.hold_node(i, node.clone());
        Ok(node)
    }

    pub fn forget(&self, ino: u64, n: u64) {
        let state = self.inodes.get(ino).and_then(|i| i.file.clone());
        self.inodes.forget(ino, n);
        if self.inodes.get(ino).is_none() {
            self.implicit.remove(&(ino, false));
            self.implicit.remove(&(ino, true));
            // The kernel evicted the inode, and its pages with it.
            if let Some(st) = state {
                st.served.reset();
            }
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(self.getattr_aged(ino)?.0)
    }

    /// [`Fs::getattr`] and the age of the answer (see [`Entry::age`]).
    pub fn getattr_aged(&self, ino: u64) -> Result<(Attr, std::time::Duration)> {
        let i = self.inode(ino)?;
        if let Some((attr, at)) = self.meta.attr(i.id()) {
            FsStats::add(&self.stats.meta_hits, 1);
            return Ok((
                self.with_ino(&i, attr),
                self.kernel_age(&attr, at.elapsed()),
            ));
        }
        let attr = self.store.getattr(&self.node(&i)?)?;
        self.meta.put_attr(&attr, Instant::now());
        if let Some(st) = &i.file {
            self.observe(st, &attr);
        }
        let age = self.kernel_age(&attr, std::time::Duration::ZERO);
        Ok((self.with_ino(&i, attr), age))
    }

    pub fn setattr(&self, ino: u64, fh: Option<u64>, set: &SetAttr) -> Result<Attr> {
        let i = self.inode(ino)?;
        if set.size.is_some() {
            // Write-back: the dirty data first, so the truncate applies after it.
            self.settle_file(&i)?;
        } else if let Some(m) = &set.mtime {
            // Write-back: a time set on a file with dirty data (tar, cp -p, rsync after
            // writing a file) is kept with the dirty data and applied after its flush, which
            // would otherwise move mtime again; flushing here would cost a sync per file.
            self.note_dirty_mtime(&i, m);
        }
        let of = match fh {
            Some(fh) => self.files.get(&fh).map(|f| f.clone()),
            None => None,
        };
        let handle = match &of {
            Some(f) => Some(self.handle(f)?),
            None => None,
        };
        let node = self.node(&i)?;
        self.meta.drop_attr(i.id());
        let Some(st) = &i.file else {
            let attr = self.store.setattr(&node, handle, set)?;
            self.meta.put_attr(&attr, Instant::now());
            return Ok(self.with_ino(&i, attr));
        };
        // Exclusive: a truncate must not interleave with reads that fill the cache.
        let _w = st.rw.write();
        let attr = self.store.setattr(&node, handle, set);
        if let Ok(a) = &attr {
            self.meta.put_attr(a, Instant::now());
        }
        match (&attr, set.size) {
            (Ok(a), None) => {
                if let Observed::Changed = self.own_metadata_change(st, a) {
                    FsStats::add(&self.stats.version_changes, 1);
                }
            }
            (Ok(a), Some(_)) => st.invalidate(Some(a)),
            (Err(_), _) => st.invalidate(None),
        }
        Ok(self.with_ino(&i, attr?))
    }

    pub fn readlink(&self, ino: u64) -> Result<OsString> {
        let i = self.inode(ino)?;
        if let Some((attr, _)) = self.meta.attr(i.id()) {
            if let Some(t) = self.meta.link_target(i.id(), &attr) {
                FsStats::add(&self.stats.meta_hits, 1);
                return Ok(t);
            }
            if let (Some(ssd), true) = (&self.ssd, self.meta.enabled()) {
                let v = crate::meta_codec::version_of(&attr.fingerprint());
                if let Some(t) = ssd.get(&Self::meta_key(KIND_LINK, &attr), v) {
                    use std::os::unix::ffi::OsStringExt;
                    let t = OsString::from_vec(t.to_vec());
                    FsStats::add(&self.stats.meta_ssd_hits, 1);
                    self.meta.put_link_target(&attr, &t);
                    return Ok(t);
                }
            }
        }
        let node = self.node(&i)?;
        // Attributes first, for the same reason as in `list_dir`.
        let attr = self.store.getattr(&node);
        let target = self.store.readlink(&node)?;
        if let Ok(attr) = attr {
            self.meta.put_attr(&attr, Instant::now());
            self.meta.put_link_target(&attr, &target);
            if let (Some(ssd), true) = (&self.ssd, self.meta.enabled()) {
                use std::os::unix::ffi::OsStrExt;
                if !crate::file_state::racy(&attr.fingerprint()) {
                    let v = crate::meta_codec::version_of(&attr.fingerprint());
                    let bytes = bytes::Bytes::copy_from_slice(target.as_bytes());
                    ssd.offer(Self::meta_key(KIND_LINK, &attr), v, bytes);
                }
            }
        }
        Ok(target)
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        req: Requester,
    ) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) = self
            .store
            .mknod(&self.node(&p)?, name, mode, rdev, self.owner(req))?;
        self.meta.add_name(p.id(), name, &attr);
        Ok(self.entry(&p, name, node, attr))
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, req: Requester) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) = self
            .store
            .mkdir(&self.node(&p)?, name, mode, self.owner(req))?;
        self.meta.add_name(p.id(), name, &attr);
        // A new directory is empty: its listing is known without asking.
        self.meta.put_listing(ident(&attr), &[], Instant::now());
        Ok(self.entry(&p, name, node, attr))
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
        req: Requester,
    ) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) = self
            .store
            .symlink(&self.node(&p)?, name, target, self.owner(req))?;
        self.meta.add_name(p.id(), name, &attr);
        self.meta.put_link_target(&attr, target);
        Ok(self.entry(&p, name, node, attr))
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Entry> {
        let i = self.inode(ino)?;
        self.settle_file(&i)?;
        let np = self.inode(newparent)?;
        let node = self.node(&i)?;
        let attr = self.store.link(&node, &self.node(&np)?, newname)?;
        // With path identities the new name is an object of its own; the old name's link
        // count moved unseen (and its attributes are not trusted from now on, see
        // `MetaCache::distrusts`).
        let node = self.store.relabel(&node, ident(&attr));
        if ident(&attr) != i.id() {
            self.meta.drop_attr(i.id());
            if let Some(k) = self.kernel.get() {
                k.drop_attrs(i.ino);
            }
        } else if let Some(st) = &i.file {
            self.own_metadata_change(st, &attr);
        }
        self.meta.add_name(np.id(), newname, &attr);
        Ok(self.entry(&np, newname, node, attr))
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<()> {
        self.settle_name(parent, name)?;
        let p = self.inode(parent)?;
        let pnode = self.node(&p)?;
        let victim = self.resolve_victim(&p, name, true);
        let r = self.store.unlink(&pnode, name);
        self.after_name_change(&p, name, &r);
        if let Some(id) = victim {
            self.meta.drop_attr(id);
            if r.is_ok() {
                self.name_gone(id);
            }
        }
        r
    }

    /// With path identities, an object whose name went away (unlink, rmdir) is no longer
    /// what its identity (its path's) names: it gets one of its own, so that what is created
    /// under that name next (a new file, a link) is another object.
    fn name_gone(&self, id: Ident) {
        if is_path_id(id) {
            let relabel = |n: &Node<S>, id: Ident| self.store.relabel(n, id);
            self.inodes.vacate(id, None, &relabel);
        }
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        let p = self.inode(parent)?;
        let pnode = self.node(&p)?;
        let victim = self.resolve_victim(&p, name, true);
        let r = self.store.rmdir(&pnode, name);
        self.after_name_change(&p, name, &r);
        if let Some(id) = victim {
            self.meta.drop_listing(id);
            if r.is_ok() {
                self.name_gone(id);
            }
        }
        r
    }

    /// Before a name goes away: an inode the kernel knows under it but whose node was never
    /// resolved (learned from the metadata cache) resolves now, while the name still leads
    /// to it; open files and later operations on it keep working.
    /// Returns the identity the name holds (its attributes change: link count, ctime).
    /// With `pin`, the inode keeps its node from now on (the name it was found by goes away).
    fn resolve_victim(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        pin: bool,
    ) -> Option<crate::meta::Ident> {
        let known = match self.meta.lookup(p.id(), name) {
            NameLookup::Found(c) => self.inodes.by_ident(c.id).map(|i| (c.id, i)),
            _ => None,
        };
        if let Some((id, i)) = known {
            if pin {
                if let Ok(n) = self.node(&i) {
                    i.pin_node(n);
                }
            }
            return Some(id);
        }
        if !self.meta.enabled() && !pin {
            return None;
        }
        // Not in a listing: ask, or the cached attributes of the object would keep a link
        // count that is no longer true.
        let (node, attr) = self.store.lookup(&self.node(p).ok()?, name).ok()?;
        if pin {
            if let Some(i) = self.inodes.by_ident(ident(&attr)) {
                i.pin_node(node);
            }
        }
        Some(ident(&attr))
    }

    /// After an operation removed `name` from `p` (or failed doing so).
    fn after_name_change(&self, p: &Arc<Inode<St<S>>>, name: &OsStr, r: &Result<()>) {
        match r {
            Ok(()) => {
                self.meta.remove_name(p.id(), name);
            }
            // The name's state is not what we thought: ask again next time.
            Err(_) => self.meta.drop_listing(p.id()),
        }
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        // Write-back: a file's data reaches the backing store before its new name does.
        self.settle_name(parent, name)?;
        self.settle_name(newparent, newname)?;
        let p = self.inode(parent)?;
        let np = self.inode(newparent)?;
        let (pnode, npnode) = (self.node(&p)?, self.node(&np)?);
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let moved = self.resolve_victim(&p, name, false);
        let victim = self.resolve_victim(&np, newname, !exchange);
        let r = self.store.rename(&pnode, name, &npnode, newname, flags);
        for id in [moved, victim].into_iter().flatten() {
            self.meta.drop_attr(id);
        }
        if r.is_err() {
            self.meta.drop_listing(p.id());
            self.meta.drop_listing(np.id());
            return r;
        }
        self.meta.remove_name(p.id(), name);
        self.meta.remove_name(np.id(), newname);
        // Path identities: what moved takes the identity of its new path.
        let moved_inode = moved.and_then(|id| self.inodes.by_ident(id));
        let mut rekeyed = false;
        if let Some(id) = moved.filter(|id| is_path_id(*id)) {
            let is_dir = match &moved_inode {
                Some(i) => i.kind == FileKind::Dir,
                None => self
                    .store
                    .lookup(&npnode, newname)
                    .is_ok_and(|(_, a)| a.kind == FileKind::Dir),
            };
            if exchange || is_dir {
                // Keeps its identity (a directory: so does everything under it); its new
                // path leads to it, its old one to a new identity (or, for an exchange, to
                // the other object's).
                self.store.alias(np.id(), newname, id);
                if !exchange {
                    self.store.alias_fresh(p.id(), name);
                }
            } else {
                let new = self.store.derive(np.id(), newname);
                rekeyed = self.follow_rename(id, moved_inode.as_ref(), new);
            }
        }
        if let (true, Some(id)) = (exchange, victim.filter(|id| is_path_id(*id))) {
            self.store.alias(p.id(), name, id);
        }
        // A rename moves the file's ctime; tell its state that the data did not change, so
        // the cached blocks survive the rename.
        match self.store.lookup(&npnode, newname) {
            Ok((node, attr)) => {
                self.meta.add_name(np.id(), newname, &attr);
                if let Some(i) = self.inodes.by_ident(ident(&attr)) {
                    i.moved_to(np.clone(), newname);
                    i.set_node(node.clone());
                    self.inodes.hold_node(&i, node);
                }
                self.note_own_metadata_change(&attr, rekeyed);
            }
            Err(_) => self.meta.drop_listing(np.id()),
        }
        if exchange {
            match self.store.lookup(&pnode, name) {
                Ok((node, attr)) => {
                    self.meta.add_name(p.id(), name, &attr);
                    if let Some(i) = self.inodes.by_ident(ident(&attr)) {
                        i.moved_to(p.clone(), name);
                        i.set_node(node.clone());
                        self.inodes.hold_node(&i, node);
                    }
                    self.note_own_metadata_change(&attr, rekeyed);
                }
                Err(_) => self.meta.drop_listing(p.id()),
            }
        }
        Ok(())
    }

    /// After a rename through tierfs moved the object of identity `old` (the kernel's inode
    /// of it: `inode`) to a path whose identity is `new`: with path identities the two
    /// differ, and the object takes the new one, keeping its kernel inode number and its
    /// cached blocks in RAM (`InodeTable::rekey`). What the SSD tier holds under the old
    /// identity is dropped: that identity is the old path's, and a file created there later
    /// must not find this one's data (its version could match: same size and mtime).
    fn follow_rename(&self, old: Ident, inode: Option<&Arc<Inode<St<S>>>>, new: Ident) -> bool {
        if old == new {
            return false;
        }
        let relabel = |n: &Node<S>, id: Ident| self.store.relabel(n, id);
        let state = match inode {
            Some(i) => {
                self.inodes.rekey(i, new, &relabel);
                i.file.clone()
            }
            None => self.inodes.rekey_state(old, new, &relabel),
        };
        // A directory's listing names its entries by identities made from the old one.
        self.meta.drop_listing(old);
        self.meta.drop_listing(new);
        let Some(ssd) = &self.ssd else { return true };
        let key = |kind, idx| SsdKey {
            kind,
            dev: old.0,
            ino: old.1,
            idx,
        };
        let blocks = state.map_or(0, |st| st.version().fp.size.div_ceil(self.cfg.block_size));
        ssd.evict(
            [key(KIND_DIR, 0), key(KIND_LINK, 0)]
                .into_iter()
                .chain((0..blocks).map(|i| key(tierfs_cache::KIND_DATA, i))),
        );
        true
    }

    /// After one of our own metadata operations moved a file's ctime (rename, chmod, chown,
    /// link): the SSD tier's entries of it carry a version made from the old fingerprint and
    /// would miss after a restart; what the RAM tier holds of it is offered again under the
    /// new one (within the tier's write budget).
    fn reoffer_to_ssd(&self, st: &FileState) {
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

    /// `rekeyed`: a rename gave the file a new identity, so its SSD entries must be offered
    /// under it even if the fingerprint did not move.
    fn note_own_metadata_change(&self, attr: &Attr, rekeyed: bool) {
        if attr.kind != FileKind::File {
            return;
        }
        if let Some(i) = self.inodes.by_ident(ident(attr)) {
            if let Some(st) = &i.file {
                let before = st.version();
                self.own_metadata_change(st, attr);
                let after = st.version();
                if rekeyed && after.gen == before.gen && after.fp == before.fp {
                    self.reoffer_to_ssd(st);
                }
            }
        }
    }

    /// [`FileState::observe_own_metadata_change`], and the SSD tier told of the new version
    /// when only the ctime moved (see [`Fs::reoffer_to_ssd`]).
    pub(crate) fn own_metadata_change(&self, st: &FileState, attr: &Attr) -> Observed {
        let before = st.version();
        let r = st.observe_own_metadata_change(attr);
        let after = st.version();
        if after.gen == before.gen && after.fp != before.fp {
            self.reoffer_to_ssd(st);
        }
        r
    }

    fn add_open_file(
        &self,
        inode: Arc<Inode<St<S>>>,
        handle: Option<Handle<S>>,
        flags: i32,
    ) -> Result<u64> {
        let state = inode.file.clone().ok_or(Errno::EINVAL)?;
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.files
            .insert(fh, Arc::new(OpenFile::new(inode, handle, flags, state)));
        Ok(fh)
    }

    /// Opens a file. Close-to-open coherence: the backing file's fingerprint is checked here,
    /// every time; a change drops our cached blocks and the kernel's page cache.
    pub fn open(&self, ino: u64, flags: i32) -> Result<OpenReply> {
        self.open_by(ino, flags, 0)
    }

    /// An open answered without I/O (`meta.cto=off`, read-only, attributes fresh), for the
    /// FUSE thread itself; None when it needs the backing store. Trusting the metadata cache,
    /// the backing file is opened only when a read misses every tier.
    pub fn open_fast(&self, ino: u64, flags: i32) -> Option<OpenReply> {
        let i = self.inodes.get(ino)?;
        let st = i.file.clone()?;
        let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_TRUNC == 0;
        if !read_only || self.cfg.meta_cto || st.expired(self.meta.ttl()) {
            return None;
        }
        FsStats::add(&self.stats.lazy_opens, 1);
        FsStats::add(&self.stats.opens, 1);
        let keep_cache = st.opened_trusted();
        let fh = self.add_open_file(i, None, flags).ok()?;
        Some(OpenReply {
            fh,
            keep_cache,
            attrs_stale: false,
        })
    }

    /// [`Fs::open`] on behalf of caller thread `pid` (0: unknown).
    pub fn open_by(&self, ino: u64, flags: i32, pid: u32) -> Result<OpenReply> {
        if let Some(o) = self.open_fast(ino, flags) {
            return Ok(o);
        }
        FsStats::add(&self.stats.opens, 1);
        let i = self.inode(ino)?;
        let st = i.file.clone().ok_or(Errno::EISDIR)?;
        let node = match self.node(&i) {
            Err(Errno::ESTALE) => {
                // The name holds another object now; the kernel retries (see
                // `check_not_replaced`), and that retry's lookup must ask the store.
                self.arm_estale_retry(pid);
                return Err(Errno::ESTALE);
            }
            r => r?,
        };
        let handle = if flags & libc::O_TRUNC != 0 {
            // Write-back: the dirty data first, or its flush would land after the truncate.
            self.settle_file(&i)?;
            // Never truncate a replaced file that others may still be reading.
            self.check_not_replaced(self.store.getattr(&node)?.nlink, pid)?;
            let _w = st.rw.write();
            let h = self.store.open(&node, flags)?;
            st.invalidate(None);
            h
        } else {
            self.store.open(&node, flags)?
        };
        let attr = self.fstat_as(&st, &handle)?;
        self.meta.put_attr(&attr, Instant::now());
        if flags & libc::O_TRUNC == 0 {
            // (O_TRUNC checked before truncating.)
            self.check_not_replaced(attr.nlink, pid)?;
        }
        let before = st.version().gen;
        let opened_before = st.last_opened();
        let keep_cache = st.opened(&attr);
        let changed = st.version().gen != before;
        if changed {
            FsStats::add(&self.stats.version_changes, 1);
        }
        // The kernel's attributes came from a lookup/getattr (which observed the state's
        // fingerprint) or from before the previous open; either way they are stale if the
        // fingerprint moved since.
        let attrs_stale = changed || opened_before.is_some_and(|fp| fp != attr.fingerprint());
        let fh = self.add_open_file(i, Some(handle), flags)?;
        Ok(OpenReply {
            fh,
            keep_cache,
            attrs_stale,
        })
    }

    /// Caller thread `pid` is answered ESTALE: its next lookups and open are the kernel's
    /// retry. Records of threads that never retried (the name was gone) are dropped once
    /// they are old, so the map stays as small as the number of recent ESTALEs.
    fn arm_estale_retry(&self, pid: u32) {
        if pid == 0 {
            return;
        }
        let now = now_ms();
        if self.estale.len() >= 1024 {
            self.estale
                .retain(|_, t| now.saturating_sub(*t) <= ESTALE_RETRY_MS);
        }
        self.estale.insert(pid, now);
    }

    /// Whether caller thread `pid` had an open answered ESTALE just now, so that its lookups
    /// are the kernel's retry of that open.
    fn retrying_after_estale(&self, pid: u32) -> bool {
        pid != 0
            && self
                .estale
                .get(&pid)
                .is_some_and(|t| now_ms().saturating_sub(*t) <= ESTALE_RETRY_MS)
    }

    /// Close-to-open for names: fails an open of a file that no longer has a name (`nlink`
    /// 0) in the backing store with ESTALE, unless this open is the kernel's retry of one.
    fn check_not_replaced(&self, nlink: u32, pid: u32) -> Result<()> {
        if nlink == 0 {
            // The backing file was deleted or renamed over behind our back, but the kernel
            // still maps the name to it (it trusts names for entry_ttl, maybe an hour).
            // ESTALE makes the VFS walk the path again with LOOKUP_REVAL, which asks us to
            // look the name up afresh (from the store: see `retrying_after_estale`): the open
            // then reaches the file the name holds now (close-to-open for the usual
            // write-temp-and-rename update), or fails ENOENT. The VFS retries only once: if
            // the file that retry found was itself replaced in the meantime (a burst of
            // replacements), open it anyway rather than fail the application; the name held
            // it during this very open(2). The retry is known by its thread alone: when
            // threads look up one name at once the kernel sends one lookup and all of them
            // share its answer, so the retry's lookup may carry another thread's id.
            let is_retry = pid != 0
                && self
                    .estale
                    .remove(&pid)
                    .is_some_and(|(_, t)| now_ms().saturating_sub(t) <= ESTALE_RETRY_MS);
            if !is_retry {
                self.arm_estale_retry(pid);
                return Err(Errno::ESTALE);
            }
        } else if pid != 0 {
            self.estale.remove(&pid);
        }
        Ok(())
    }

    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        req: Requester,
    ) -> Result<(Entry, OpenReply)> {
        if flags & libc::O_TRUNC != 0 {
            // An existing file is truncated: its dirty data first (see `open_by`).
            self.settle_name(parent, name)?;
        }
        let p = self.inode(parent)?;
        let (node, attr, handle) =
            self.store
                .create(&self.node(&p)?, name, mode, flags, self.owner(req))?;
        self.meta.add_name(p.id(), name, &attr);
        let entry = self.entry(&p, name, node, attr);
        let inode = self.inode(entry.ino)?;
        if let Some(st) = &inode.file {
            st.invalidate(Some(&attr));
            st.opened(&attr);
            if self.wb().is_some() {
                st.created.store(true, std::sync::atomic::Ordering::Release);
            }
        }
        let fh = self.add_open_file(inode, Some(handle), flags)?;
        Ok((
            entry,
            OpenReply {
                fh,
                keep_cache: false,
                attrs_stale: false,
            },
        ))
    }

    pub fn release(&self, fh: u64) {
        self.files.remove(&fh);
    }

    pub fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        if let Some(wb) = self.wb() {
            self.fsync_back(wb, &self.inode(ino)?)?;
        }
        let files = if fh == 0 {
            self.implicit_files(ino)
        } else {
            vec![self.open_file(fh)?]
        };
        for of in files {
            if let Some(h) = of.handle.get() {
                self.store.fsync(h, datasync)?;
            }
            // Never opened in the backing store: nothing of ours to make durable.
        }
        Ok(())
    }

    /// The open file's backing handle, opened now if the open was served from the metadata
    /// cache. The backing file's fingerprint is recorded as it is opened: if it changed since
    /// the cache validated it, the reader sees the new version from here on.
    pub(crate) fn handle<'a>(&self, of: &'a OpenFile<S>) -> Result<&'a Handle<S>> {
        if let Some(h) = of.handle.get() {
            return Ok(h);
        }
        let _g = of.opening.lock();
        if let Some(h) = of.handle.get() {
            return Ok(h);
        }
        let node = self.node(&of.inode)?;
        let h = self.store.open(&node, of.flags)?;
        let attr = self.fstat_as(&of.state, &h)?;
        self.meta.put_attr(&attr, Instant::now());
        self.observe_data(&of.state, &attr);
        let _ = of.handle.set(h);
        of.handle.get().ok_or(Errno::EIO)
    }

    pub fn fallocate(&self, ino: u64, fh: u64, mode: i32, offset: u64, len: u64) -> Result<()> {
        let of = self.file_for(ino, fh, true)?;
        self.settle_file(&of.inode)?;
        let h = self.handle(&of)?;
        let _w = of.state.rw.write();
        let r = self.store.fallocate(h, mode, offset, len);
        let attr = self.fstat_as(&of.state, h).ok();
        self.meta.drop_attr(of.inode.id());
        of.state.invalidate(attr.as_ref());
        r
    }

    pub fn lseek(&self, ino: u64, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        let of = self.file_for(ino, fh, false)?;
        // SEEK_DATA/SEEK_HOLE ask the backing file where its data is: it must hold it all.
        self.settle_file(&of.inode)?;
        self.store.lseek(self.handle(&of)?, offset, whence)
    }

    /// Reads the directory once; later readdir calls page through this snapshot, so offsets
    /// stay valid while the directory changes.
    pub fn opendir(&self, ino: u64) -> Result<DirOpen> {
        let i = self.inode(ino)?;
        if i.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if !self.meta.has_listing(i.id()) {
            self.restore_listing(&i, false);
        }
        let listing: Vec<(OsString, FileKind, u64)> = match self.cached_listing(&i) {
            Some(l) => l,
            None if self.meta.enabled() => self
                .list_dir(&i)?
                .iter()
                .map(|(name, a)| (name.clone(), a.kind, self.inodes.kernel_ino(a)))
                .collect(),
            None => self
                .store
                .readdir(&self.node(&i)?)?
                .into_iter()
                .map(|e| {
                    let ino = self.inodes.kernel_ino_of_ident((e.dev, e.ino));
                    (e.name, e.kind.unwrap_or(FileKind::File), ino)
                })
                .collect(),
        };
        Ok(self.dir_open(&i, listing))
    }

    /// A directory handle for `listing`, and what the kernel may do with its copy.
    fn dir_open(&self, i: &Inode<St<S>>, listing: Vec<(OsString, FileKind, u64)>) -> DirOpen {
        let fh = self.add_dir_handle(i.ino, listing);
        DirOpen {
            fh,
            cache: self.meta.enabled(),
            keep_cache: self.meta.enabled() && self.meta.opened(i.id()),
        }
    }

    /// [`Fs::opendir`] when the metadata cache (or an SSD read-around window already in
    /// memory) has the listing: no I/O, for the FUSE thread itself.
    pub fn opendir_fast(&self, ino: u64) -> Option<DirOpen> {
        let i = self.inodes.get(ino)?;
        if i.kind != FileKind::Dir {
            return None;
        }
        if !self.meta.has_listing(i.id()) {
            self.restore_listing(&i, true);
        }
        let listing = self.cached_listing(&i)?;
        Some(self.dir_open(&i, listing))
    }

    /// A fresh cached listing as (name, kind, kernel inode).
    fn cached_listing(&self, i: &Inode<St<S>>) -> Option<Vec<(OsString, FileKind, u64)>> {
        let l = self.meta.listing(i.id())?;
        FsStats::add(&self.stats.meta_hits, 1);
        Some(
            l.into_iter()
                .map(|(name, c)| (name, c.kind, self.inodes.kernel_ino_of_ident(c.id)))
                .collect(),
        )
    }

    fn add_dir_handle(&self, ino: u64, listing: Vec<(OsString, FileKind, u64)>) -> u64 {
        let mut entries = Vec::with_capacity(listing.len() + 2);
        entries.push(DirEntryOut {
            ino,
            name: ".".into(),
            kind: FileKind::Dir,
            next_offset: 1,
        });
        entries.push(DirEntryOut {
            ino,
            name: "..".into(),
            kind: FileKind::Dir,
            next_offset: 2,
        });
        for (name, kind, ino) in listing {
            let next_offset = entries.len() as u64 + 1;
            entries.push(DirEntryOut {
                ino,
                name,
                kind,
                next_offset,
            });
        }
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.dirs.insert(fh, Arc::new(DirHandle { entries }));
        fh
    }

    /// Entries from `offset` on.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<Vec<DirEntryOut>> {
        let d = self.dirs.get(&fh).map(|d| d.clone()).ok_or(Errno::EBADF)?;
        Ok(d.entries.iter().skip(offset as usize).cloned().collect())
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.remove(&fh);
    }

    pub fn fsyncdir(&self, ino: u64, datasync: bool) -> Result<()> {
        let i = self.inode(ino)?;
        self.store.fsyncdir(&self.node(&i)?, datasync)
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let r = self.inode(crate::ROOT_INO)?;
        self.store.statfs(&self.node(&r)?)
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        self.store.getxattr(&self.node(&i)?, name)
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        self.store.listxattr(&self.node(&i)?)
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        let i = self.inode(ino)?;
        self.store.setxattr(&self.node(&i)?, name, value, flags)?;
        self.after_xattr_change(&i);
        Ok(())
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<()> {
        let i = self.inode(ino)?;
        self.store.removexattr(&self.node(&i)?, name)?;
        self.after_xattr_change(&i);
        Ok(())
    }

    fn after_xattr_change(&self, i: &Arc<Inode<St<S>>>) {
        self.meta.drop_attr(i.id());
        let Ok(node) = self.node(i) else { return };
        if let (Some(st), Ok(attr)) = (&i.file, self.store.getattr(&node)) {
            self.meta.put_attr(&attr, Instant::now());
            st.observe_own_metadata_change(&attr);
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        let ssd = self.ssd.as_ref().map(|s| s.stats());
        let writeback = self.wb().map(|wb| wb.stats());
        let mut pressure = match self.pressure.get() {
            Some(m) => m.stats(),
            None => tierfs_cache::PressureStats {
                target: self.cache.capacity(),
                size: self.cache.used_bytes(),
                max: self.cache.capacity(),
                signals: "off".into(),
                rss: tierfs_cache::pressure::self_rss(),
                ..Default::default()
            },
        };
        // bufwiredspace: data memory that shrinking the RAM tier cannot free now. A block
        // queued for the SSD tier is usually also in the RAM tier (one allocation, counted
        // twice); the queue is bounded at 64 clusters.
        pressure.wired_fetch = FsStats::get(&s.fetch_inflight_bytes);
        pressure.wired_ssd_queue = ssd.as_ref().map_or(0, |s| s.queued_bytes);
        pressure.wired_dirty = writeback.as_ref().map_or(0, |w| w.dirty_bytes);
        pressure.wired = pressure.wired_fetch + pressure.wired_ssd_queue + pressure.wired_dirty;
        pressure.bufspace = pressure.size + pressure.wired;
        StatsSnapshot {
            store_id: self.store.store_id().to_string(),
            block_size: self.cfg.block_size,
            ram: self.cache.stats(),
            backing: self.store.inner().counters.snapshot(),
            read_requests: FsStats::get(&s.read_requests),
            read_bytes: FsStats::get(&s.read_bytes),
            read_ram_only: FsStats::get(&s.read_ram_only),
            read_inline: FsStats::get(&s.read_inline),
            write_requests: FsStats::get(&s.write_requests),
            write_bytes: FsStats::get(&s.write_bytes),
            fetched_blocks: FsStats::get(&s.fetched_blocks),
            readahead_blocks: FsStats::get(&s.readahead_blocks),
            singleflight_waits: FsStats::get(&s.singleflight_waits),
            stale_fetches: FsStats::get(&s.stale_fetches),
            version_changes: FsStats::get(&s.version_changes),
            version_mix_refusals: FsStats::get(&s.version_mix_refusals),
            meta_hits: FsStats::get(&s.meta_hits),
            meta_ssd_hits: FsStats::get(&s.meta_ssd_hits),
            ssd_blocks: FsStats::get(&s.ssd_blocks),
            ssd_range_reads: FsStats::get(&s.ssd_range_reads),
            ssd,
            meta_listings: FsStats::get(&s.meta_listings),
            lazy_opens: FsStats::get(&s.lazy_opens),
            opens: FsStats::get(&s.opens),
            implicit_files: FsStats::get(&s.implicit_files),
            writeback,
            pressure,
            meta_attrs: self.meta.counts().0,
            meta_dirs: self.meta.counts().1,
            meta_links: self.meta.counts().2,
            inodes: self.inodes.len() as u64,
            file_states: self.inodes.file_states() as u64,
            open_files: self.files.len() as u64,
            open_dirs: self.dirs.len() as u64,
            warm: s.warm.snapshot(),
        }
    }
}
