//! Object data: open files, the read path over the RAM and SSD tiers (single-flight fetches,
//! read-ahead whose depth follows the store), write-through, and warming and evicting
//! objects. It stands on the namespace (an open file belongs to an inode) and knows nothing
//! of write-back, which stands on it.
//!
//! Files: this one (open files), `open` (open, create, the backing handle, fsync, setattr),
//! `read` (the read path), `fetch` (loading blocks from the SSD tier and the store),
//! `readahead`, `write` (write-through), `warm` (`tierfs warm` / `evict`).

mod fetch;
mod open;
mod read;
mod readahead;
mod seq_gate;
mod shared_tier;
pub(crate) use shared_tier::SsdChunks;
mod siblings;
mod warm;
mod write;

pub(crate) use open::read_only;
pub use open::OpenReply;
pub(crate) use readahead::ReadAhead;
pub use warm::{EvictReport, WarmError, WarmReport};

use crate::fast_map::DashMap;
use crate::file_state::FileState;
use crate::inode::Inode;
use crate::namespace::Namespace;
use crate::pool::Pool;
use crate::shared::{Handle, Shared, St};
use crate::stats::FsStats;
use bytes::Bytes;
use parking_lot::Mutex;
use seq_gate::SeqGate;
use std::sync::atomic::{AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use tierfs_cache::{BlockKey, SingleFlight};
use tierfs_store::{Errno, Result, Store};

#[derive(Clone, Debug)]
pub(crate) enum FetchError {
    Errno(Errno),
    /// The backing file changed while the fetch ran.
    Stale,
}

pub(crate) type FetchResult = std::result::Result<Bytes, FetchError>;

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
    /// Serializes backing reads of a sequential stream, lowest offset first (see `fetch_run`).
    pub seq_fetch: SeqGate,
}

impl<S: Store> OpenFile<S> {
    pub(crate) fn new(
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
            seq_fetch: SeqGate::default(),
        }
    }
}

pub(crate) struct Objects<S: Store> {
    pub sh: Arc<Shared<S>>,
    pub ns: Arc<Namespace<S>>,
    pub files: DashMap<u64, Arc<OpenFile<S>>>,
    /// Files the kernel reads and writes without having opened them (FUSE no-open, see
    /// [`Objects::file_for`]): one reader and one writer per inode, keyed (inode, is writer).
    implicit: DashMap<(u64, bool), Arc<OpenFile<S>>>,
    /// Insertion order of `implicit`, to bound it (and the backing descriptors it holds).
    implicit_order: Mutex<std::collections::VecDeque<(u64, bool)>>,
    next_fh: AtomicU64,
    pub flights: SingleFlight<BlockKey, FetchResult>,
    /// Chunks of the shared tier being loaded, by version (`gen`): one load per chunk, its
    /// data handed to every reader that needs a block of it (see `shared_tier`).
    pub chunk_flights: SingleFlight<(u64, tierfs_cache::ChunkName), FetchResult>,
    pub ra_pool: Pool,
    /// `readahead.max`, which may change at run time (`tierfs ctl set`).
    pub readahead_max: AtomicU64,
    /// The depth sequential streams of this store settled on last (see `stream_depth`).
    pub seq_depth: crate::stream_depth::StoreDepth,
    /// Directories being walked in listing order, and the threads that load the files
    /// ahead of a walk (`siblings`; `prefetch.files`, `prefetch.max_file`).
    walks: siblings::Walks,
    prefetch_pool: Pool,
    pub prefetch_files: std::sync::atomic::AtomicUsize,
    pub prefetch_max_file: AtomicU64,
}

/// At most this many implicit files (see [`Objects::file_for`]) are kept; each may hold a
/// backing descriptor, and the kernel may know a million inodes, against a descriptor limit
/// of tens of thousands. The oldest is dropped first; it is rebuilt (and its backing file
/// reopened) on its next use.
const IMPLICIT_MAX: usize = 1024;

/// Files of a directory walk loaded at once (see `siblings`): enough to keep a link with a
/// few ms of round trip busy, few enough not to crowd the application's own requests.
const PREFETCH_THREADS: usize = 8;

impl<S: Store> Objects<S> {
    pub fn new(sh: Arc<Shared<S>>, ns: Arc<Namespace<S>>) -> Objects<S> {
        Objects {
            files: DashMap::default(),
            implicit: DashMap::default(),
            implicit_order: Mutex::new(Default::default()),
            next_fh: AtomicU64::new(1),
            flights: SingleFlight::new(Err(FetchError::Errno(Errno::EIO))),
            chunk_flights: SingleFlight::new(Err(FetchError::Errno(Errno::EIO))),
            ra_pool: Pool::new("tierfs-ra", sh.cfg.readahead_threads),
            readahead_max: AtomicU64::new(sh.cfg.readahead_max),
            seq_depth: Default::default(),
            walks: Default::default(),
            prefetch_pool: Pool::new("tierfs-pf", PREFETCH_THREADS),
            prefetch_files: std::sync::atomic::AtomicUsize::new(sh.cfg.prefetch_files),
            prefetch_max_file: AtomicU64::new(sh.cfg.prefetch_max_file),
            sh,
            ns,
        }
    }

    /// The kernel forgot inode `ino`: its implicit files go.
    pub fn forgotten(&self, ino: u64) {
        self.implicit.remove(&(ino, false));
        self.implicit.remove(&(ino, true));
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
        let i = self.ns.inode(ino)?;
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
        FsStats::add(&self.sh.stats.implicit_files, 1);
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

    /// The implicit files of `ino` that exist (see [`Objects::file_for`]).
    /// The attributes of inode `ino` from a backing handle it has open, if any: the only way
    /// left to the object once its name is gone on a store that reaches objects by path.
    pub(crate) fn fstat_open(&self, ino: u64) -> Option<tierfs_store::Attr> {
        let of = self
            .files
            .iter()
            .map(|f| f.value().clone())
            .chain(self.implicit_files(ino))
            .find(|f| f.inode.ino == ino && f.handle.get().is_some())?;
        let mut a = self.sh.fstat_as(&of.state, of.handle.get()?).ok()?;
        a.ino = ino;
        Some(a)
    }

    pub(crate) fn implicit_files(&self, ino: u64) -> Vec<Arc<OpenFile<S>>> {
        [false, true]
            .iter()
            .filter_map(|w| self.implicit.get(&(ino, *w)).map(|f| f.clone()))
            .collect()
    }

    pub(crate) fn add_open_file(
        &self,
        inode: Arc<Inode<St<S>>>,
        handle: Option<Handle<S>>,
        flags: i32,
    ) -> Result<u64> {
        let state = inode.file.clone().ok_or(Errno::EINVAL)?;
        // Counted before it can be used; none once a deferred unlink dropped the file.
        state
            .opens
            .fetch_update(AcqRel, Acquire, |n| {
                (n & crate::file_state::DROPPED == 0).then_some(n + 1)
            })
            .map_err(|_| Errno::ENOENT)?;
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.files
            .insert(fh, Arc::new(OpenFile::new(inode, handle, flags, state)));
        Ok(fh)
    }
}
