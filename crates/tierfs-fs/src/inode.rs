//! The inode table: kernel inode numbers <-> backing objects.
//!
//! A backing object's identity is (device, inode). The kernel inode number is the backing
//! inode number when the object lives on the root's device (stable across remounts and equal
//! to what readdir reports), 1 for the root, and a synthetic number for objects on other
//! devices. Hard links therefore map to one kernel inode, and renames keep it.

use crate::file_state::FileState;
use dashmap::DashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tierfs_store::{Attr, FileKind, Store};

const SYNTHETIC_BASE: u64 = 1 << 60;

pub struct Inode<S: Store> {
    pub ino: u64,
    /// Backing identity (device, inode).
    pub id: (u64, u64),
    /// The backing node (an open descriptor for PosixStore), when held. An inode learned
    /// from a cached listing has none until an operation has to reach the backing store
    /// (see `Fs::node`); a file's node may be let go again (see [`InodeTable::hold_node`]).
    node: parking_lot::Mutex<Option<S::Node>>,
    /// Where to resolve it from: parent directory and the latest name it was found by.
    pub(crate) origin: parking_lot::Mutex<Option<(Arc<Inode<S>>, OsString)>>,
    /// The node is held for good: the name it was found by went away (unlink, rename over),
    /// so it could not be resolved again.
    pinned: std::sync::atomic::AtomicBool,
    pub kind: FileKind,
    /// Kernel lookup count (FUSE forget protocol).
    lookups: AtomicU64,
    /// Cache state; regular files only.
    pub file: Option<Arc<FileState>>,
}

/// Milliseconds since first use (never 0), for cheap relative timestamps.
pub(crate) fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

impl<S: Store> Inode<S> {
    pub fn node(&self) -> Option<S::Node> {
        self.node.lock().clone()
    }

    /// Holds `node` for good (see `pinned`).
    pub(crate) fn pin_node(&self, node: S::Node) {
        let mut n = self.node.lock();
        if n.is_none() {
            *n = Some(node);
        }
        self.pinned.store(true, Relaxed);
    }

    /// The object now lives under `parent` as `name` (our own rename).
    pub(crate) fn moved_to(&self, parent: Arc<Inode<S>>, name: &std::ffi::OsStr) {
        *self.origin.lock() = Some((parent, name.to_owned()));
    }

    /// Lets go of the node unless it is pinned or there is no name to resolve it by.
    fn release_node(&self) {
        if !self.pinned.load(Relaxed) && self.origin.lock().is_some() {
            *self.node.lock() = None;
        }
    }
}

pub struct InodeTable<S: Store> {
    root_dev: u64,
    root_ino: u64,
    inodes: DashMap<u64, Arc<Inode<S>>>,
    synthetic: DashMap<(u64, u64), u64>,
    next_synthetic: AtomicU64,
    /// File states by backing identity; outlive kernel inodes (swapcache's lesson).
    files: DashMap<(u64, u64), Arc<FileState>>,
    max_files: usize,
    /// Inodes other than directories that hold their node, oldest first: at most
    /// [`FILE_NODES`], so a `grep -r` over a million files does not hold a million
    /// descriptors (directories keep theirs: there are far fewer of them).
    file_nodes: parking_lot::Mutex<std::collections::VecDeque<std::sync::Weak<Inode<S>>>>,
}

/// How many non-directory inodes may hold their node at once.
const FILE_NODES: usize = 4096;

impl<S: Store> InodeTable<S> {
    pub fn new(root: S::Node, root_attr: &Attr, max_files: usize) -> Self {
        let t = InodeTable {
            root_dev: root_attr.dev,
            root_ino: root_attr.ino,
            inodes: DashMap::new(),
            synthetic: DashMap::new(),
            next_synthetic: AtomicU64::new(SYNTHETIC_BASE),
            files: DashMap::new(),
            max_files,
            file_nodes: Default::default(),
        };
        t.inodes.insert(
            crate::ROOT_INO,
            Arc::new(Inode {
                ino: crate::ROOT_INO,
                id: (root_attr.dev, root_attr.ino),
                node: parking_lot::Mutex::new(Some(root)),
                origin: parking_lot::Mutex::new(None),
                pinned: std::sync::atomic::AtomicBool::new(true),
                kind: FileKind::Dir,
                lookups: AtomicU64::new(1),
                file: None,
            }),
        );
        t
    }

    pub fn kernel_ino(&self, attr: &Attr) -> u64 {
        self.kernel_ino_of(attr.dev, attr.ino)
    }

    /// Kernel inode number of a listing entry, which names no device: the root's is assumed.
    pub fn kernel_ino_of_entry(&self, backing_ino: u64) -> u64 {
        self.kernel_ino_of(self.root_dev, backing_ino)
    }

    pub fn kernel_ino_of_ident(&self, id: (u64, u64)) -> u64 {
        self.kernel_ino_of(id.0, id.1)
    }

    /// The live inode of a backing identity, if the kernel knows one.
    pub fn by_ident(&self, id: (u64, u64)) -> Option<Arc<Inode<S>>> {
        let ino = if id.0 == self.root_dev {
            self.kernel_ino_of(id.0, id.1)
        } else {
            *self.synthetic.get(&id)?
        };
        self.get(ino)
    }

    fn kernel_ino_of(&self, dev: u64, ino: u64) -> u64 {
        if dev == self.root_dev {
            if ino == self.root_ino {
                return crate::ROOT_INO;
            }
            if ino != crate::ROOT_INO && ino < SYNTHETIC_BASE {
                return ino;
            }
        }
        *self
            .synthetic
            .entry((dev, ino))
            .or_insert_with(|| self.next_synthetic.fetch_add(1, Relaxed))
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Inode<S>>> {
        self.inodes.get(&ino).map(|i| i.clone())
    }

    pub fn len(&self) -> usize {
        self.inodes.len()
    }

    /// The cache state of a backing file, if one is kept.
    pub fn file_state_of(&self, id: (u64, u64)) -> Option<Arc<FileState>> {
        self.files.get(&id).map(|f| f.clone())
    }

    pub fn file_states(&self) -> usize {
        self.files.len()
    }

    fn file_state(&self, attr: &Attr, validated: Instant) -> Arc<FileState> {
        let key = (attr.dev, attr.ino);
        if let Some(f) = self.files.get(&key) {
            let f = f.clone();
            f.observe_at(attr, validated);
            return f;
        }
        if self.files.len() >= self.max_files {
            // Forget the states no live inode uses; their blocks age out of the cache.
            self.files.retain(|_, f| Arc::strong_count(f) > 1);
        }
        self.files
            .entry(key)
            .or_insert_with(|| Arc::new(FileState::new_at(attr, validated)))
            .clone()
    }

    /// Records that the kernel learned of `node`, found under `parent` as `name` (lookup,
    /// create, ...): adds one lookup.
    pub fn remember(
        &self,
        parent: Arc<Inode<S>>,
        name: &std::ffi::OsStr,
        node: S::Node,
        attr: &Attr,
    ) -> Arc<Inode<S>> {
        let inode = self.remember_with(None, Some((parent, name.to_owned())), attr, Instant::now());
        self.hold_node(&inode, node);
        inode
    }

    /// Gives `inode` its node. A directory keeps it; other objects keep theirs while they are
    /// among the last [`FILE_NODES`] resolved, then resolve again from their name when needed.
    pub(crate) fn hold_node(&self, inode: &Arc<Inode<S>>, node: S::Node) {
        {
            let mut n = inode.node.lock();
            if n.is_some() {
                return;
            }
            *n = Some(node);
        }
        if inode.kind == FileKind::Dir {
            return;
        }
        let old = {
            let mut q = self.file_nodes.lock();
            q.push_back(Arc::downgrade(inode));
            if q.len() > FILE_NODES {
                q.pop_front()
            } else {
                None
            }
        };
        if let Some(i) = old.and_then(|w| w.upgrade()) {
            i.release_node();
        }
    }

    /// Like [`InodeTable::remember`] for a name learned from the metadata cache: the node is
    /// resolved from `parent` and `name` when first needed. `validated` is when `attr` was
    /// last checked against the backing store.
    pub fn remember_lazy(
        &self,
        parent: Arc<Inode<S>>,
        name: &std::ffi::OsStr,
        attr: &Attr,
        validated: Instant,
    ) -> Arc<Inode<S>> {
        self.remember_with(None, Some((parent, name.to_owned())), attr, validated)
    }

    fn remember_with(
        &self,
        node: Option<S::Node>,
        origin: Option<(Arc<Inode<S>>, OsString)>,
        attr: &Attr,
        validated: Instant,
    ) -> Arc<Inode<S>> {
        let ino = self.kernel_ino(attr);
        let file = (attr.kind == FileKind::File).then(|| self.file_state(attr, validated));
        let mut node = node;
        let origin_again = origin.clone();
        let entry = self.inodes.entry(ino).or_insert_with(|| {
            Arc::new(Inode {
                ino,
                id: (attr.dev, attr.ino),
                node: parking_lot::Mutex::new(node.take()),
                origin: parking_lot::Mutex::new(origin),
                pinned: std::sync::atomic::AtomicBool::new(false),
                kind: attr.kind,
                lookups: AtomicU64::new(0),
                file,
            })
        });
        if let Some(o) = origin_again {
            // The latest name it was found by is the one most likely to still hold it.
            *entry.origin.lock() = Some(o);
        }
        entry.lookups.fetch_add(1, Relaxed);
        entry.clone()
    }

    /// FUSE forget: drops `n` lookups; the inode leaves the table at zero.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == crate::ROOT_INO {
            return;
        }
        self.inodes.remove_if(&ino, |_, i| {
            let prev = i.lookups.fetch_sub(n.min(i.lookups.load(Relaxed)), Relaxed);
            prev <= n
        });
    }
}
