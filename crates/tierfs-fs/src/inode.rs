//! The inode table: kernel inode numbers <-> backing objects.
//!
//! A backing object's identity is an [`Ident`] (see `identity.rs`). tierfs owns the kernel
//! inode numbers: 1 for the root; the store's inode number for an object identified by it
//! (stable across remounts and equal to what readdir reports, so hard links map to one kernel
//! inode); for an object identified by its path, a number taken from the path's hash, so the
//! same name gets the same number after a remount. Two live objects never share one: should
//! hashes meet (or an object keep its number across a rename that gave it a new identity),
//! the newcomer takes the next free number, recorded in `assigned` while it lives.

use crate::fast_map::DashMap;
use crate::file_state::FileState;
use crate::identity::Ident;
use std::ffi::OsString;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tierfs_store::{Attr, FileKind, Store};

mod numbers;
mod spare;
use spare::Spare;

const SYNTHETIC_BASE: u64 = 1 << 60;

/// Where an inode is resolved from: its parent directory and a name in it.
pub(crate) type Origin<S> = (Arc<Inode<S>>, OsString);

/// An inode and the name taken from it (see [`Inode::take_name_if_unpinned`]).
pub(crate) type TakenName<S> = (Arc<Inode<S>>, Origin<S>);

pub struct Inode<S: Store> {
    pub ino: u64,
    /// Backing identity; changes only when a rename through tierfs gives an object identified
    /// by its path a new one (see [`InodeTable::rekey`]).
    id: parking_lot::Mutex<Ident>,
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
    pub fn id(&self) -> Ident {
        *self.id.lock()
    }

    pub fn node(&self) -> Option<S::Node> {
        self.node.lock().clone()
    }

    /// Replaces the node (a rename gave the object a new identity, which its node carries).
    pub(crate) fn set_node(&self, node: S::Node) {
        let mut n = self.node.lock();
        if n.is_some() {
            *n = Some(node);
        }
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

    /// Neither a node nor a name to resolve one by: the object is gone from the store (its
    /// unlink through tierfs did not pin it: see `Namespace::resolve_victim`), and what the
    /// store shows under its identity from now on is another object. Not the root.
    fn is_dead(&self) -> bool {
        // (One lock at a time: `take_name_if_unpinned` takes them in the other order.)
        let nameless = self.origin.lock().is_none();
        self.ino != crate::ROOT_INO && nameless && self.node.lock().is_none()
    }

    /// Whether an object of kind `kind` that the store now shows under this inode's identity
    /// `id` is another object. A local filesystem hands a freed inode number to the next
    /// object it creates at once, while the kernel may hold the old inode until its FORGET
    /// arrives: so it is when this one is dead. Another kind is another object too, but for
    /// an inode number held by a node of ours (an open descriptor on the object, so the
    /// number cannot have been handed out again: the attributes are what is stale); with
    /// path identities a name replaced behind our back by an object of another kind.
    fn replaced_by(&self, id: Ident, kind: FileKind) -> bool {
        self.is_dead()
            || (self.kind != kind
                && (crate::identity::is_path_id(id) || self.node.lock().is_none()))
    }

    /// Takes away the name this inode is known by before an unlink or a rename over it that
    /// does not pin its node (see `Namespace::resolve_victim`): once the store has done it,
    /// the store may hand the identity to the next object it creates, which must find this
    /// inode dead (see [`Inode::replaced_by`]) and not merge with it. The name, if it was
    /// `parent`/`name` and no node is held, or None. [`Inode::give_name_back`] if the store
    /// refused.
    pub(crate) fn take_name_if_unpinned(
        &self,
        parent: u64,
        name: &std::ffi::OsStr,
    ) -> Option<Origin<S>> {
        if self.node.lock().is_some() {
            return None;
        }
        let mut o = self.origin.lock();
        if !o
            .as_ref()
            .is_some_and(|(p, n)| p.ino == parent && n == name)
        {
            return None;
        }
        o.take()
    }

    /// Undoes [`Inode::take_name_if_unpinned`] (unless another name was given meanwhile).
    pub(crate) fn give_name_back(&self, taken: Origin<S>) {
        let mut o = self.origin.lock();
        if o.is_none() {
            *o = Some(taken);
        }
    }

    /// Lets go of the node unless it is pinned or there is no name to resolve it by.
    fn release_node(&self) {
        if !self.pinned.load(Relaxed) && self.origin.lock().is_some() {
            *self.node.lock() = None;
        }
    }
}

/// Objects made by this mount whose kernel inode number is kept past publication, at most
/// (32 bytes each: 32 MiB at most; past it, objects made later show the store's number
/// once the kernel forgot them).
const KEPT_MAX: usize = 1 << 20;

pub struct InodeTable<S: Store> {
    root_id: Ident,
    inodes: DashMap<u64, Arc<Inode<S>>>,
    /// Kernel inode numbers of live objects that are not the one their identity prefers
    /// (see the module documentation).
    assigned: DashMap<Ident, u64>,
    /// Kernel inode numbers kept for the mount's life by objects this mount made, past their
    /// publication (`InodeTable::keep_number`), bounded by [`KEPT_MAX`].
    kept: DashMap<Ident, u64>,
    /// Identities handed to objects a rename left without a name (see [`InodeTable::rekey`]).
    orphans: AtomicU64,
    /// File states by backing identity; outlive kernel inodes (swapcache's lesson).
    files: DashMap<Ident, Arc<FileState>>,
    max_files: usize,
    /// Inodes other than directories that hold their node, oldest first: at most
    /// [`FILE_NODES`], so a `grep -r` over a million files does not hold a million
    /// descriptors.
    file_nodes: parking_lot::Mutex<std::collections::VecDeque<std::sync::Weak<Inode<S>>>>,
    /// The same for directories, up to [`DIR_NODES`]: a tree of 25,000 directories held one
    /// descriptor each, and past the descriptor limit every open (even of the mount's root)
    /// failed with EMFILE until a remount. A directory let go is resolved again from its
    /// parent and name (one store lookup) when next needed.
    dir_nodes: parking_lot::Mutex<std::collections::VecDeque<std::sync::Weak<Inode<S>>>>,
    /// [`FILE_NODES`] and [`DIR_NODES`] as the descriptor limit allows ([`node_bound`]).
    max_file_nodes: usize,
    max_dir_nodes: usize,
    /// Nodes of objects the kernel forgot (see [`spare::Spare`]).
    spare: parking_lot::Mutex<Spare<S::Node>>,
}

/// Gives a node another identity (see [`InodeTable::rekey`]).
pub(crate) type Relabel<'a, S> = &'a dyn Fn(&<S as Store>::Node, Ident) -> <S as Store>::Node;

/// How many non-directory inodes may hold their node at once (at most; see [`node_bound`]).
const FILE_NODES: usize = 4096;
/// How many directories may hold their node at once (at most; the root and directories whose
/// name went away keep theirs regardless).
const DIR_NODES: usize = 4096;

/// `max` or, under a low descriptor limit, a quarter of it for each kind of node: the rest is
/// for open files and directories being listed, the SSD tier, the journal and FUSE.
pub(crate) fn node_bound(max: usize) -> usize {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur as usize
    } else {
        1024
    };
    max.min(limit / 4).max(64)
}

/// A name no directory entry can have (it holds a NUL), for identities of objects that a
/// rename left without a name.
fn orphan_name(n: u64) -> OsString {
    OsString::from(format!("\0orphan{n}"))
}

impl<S: Store> InodeTable<S> {
    pub fn new(root: S::Node, root_attr: &Attr, max_files: usize) -> Self {
        let t = InodeTable {
            root_id: (root_attr.dev, root_attr.ino),
            inodes: DashMap::default(),
            assigned: DashMap::default(),
            kept: DashMap::default(),
            orphans: AtomicU64::new(0),
            files: DashMap::default(),
            max_files,
            file_nodes: Default::default(),
            dir_nodes: Default::default(),
            max_file_nodes: node_bound(FILE_NODES),
            max_dir_nodes: node_bound(DIR_NODES),
            spare: Default::default(),
        };
        t.inodes.insert(
            crate::ROOT_INO,
            Arc::new(Inode {
                ino: crate::ROOT_INO,
                id: parking_lot::Mutex::new((root_attr.dev, root_attr.ino)),
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

    /// After a reconnect (see `health`): the root holds `root`, and every other inode that
    /// can be resolved again by name lets go of its node (it is dead).
    pub(crate) fn reset_nodes(&self, root: S::Node) {
        for e in self.inodes.iter() {
            let i = e.value();
            if i.ino == crate::ROOT_INO {
                *i.node.lock() = Some(root.clone());
            } else if i.origin.lock().is_some() {
                *i.node.lock() = None;
            }
        }
        self.file_nodes.lock().clear();
        self.dir_nodes.lock().clear();
        *self.spare.lock() = Spare::default();
    }

    /// The node a forgotten inode of `id` held (see [`spare::Spare`]), taken.
    pub(crate) fn take_spare(&self, id: Ident) -> Option<S::Node> {
        let mut s = self.spare.lock();
        if s.nodes.is_empty() {
            return None;
        }
        s.take(id)
    }

    /// Whether a forgotten inode of `id` left its node (see [`spare::Spare`]).
    pub(crate) fn has_spare(&self, id: Ident) -> bool {
        let s = self.spare.lock();
        !s.nodes.is_empty() && s.nodes.contains_key(&id)
    }

    /// `id`'s name goes away (our unlink, rmdir, rename over it): no node of it is kept for
    /// an inode to come, which would keep the object (and its space) alive on the store.
    pub(crate) fn drop_spare(&self, id: Ident) {
        self.take_spare(id);
    }

    /// The live inode of a backing identity, if the kernel knows one.
    pub fn by_ident(&self, id: Ident) -> Option<Arc<Inode<S>>> {
        self.get(self.kernel_ino_of_ident(id))
            .filter(|i| i.id() == id)
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Inode<S>>> {
        self.inodes.get(&ino).map(|i| i.clone())
    }

    pub fn len(&self) -> usize {
        self.inodes.len()
    }

    /// The cache state of a backing file, if one is kept.
    pub fn file_state_of(&self, id: Ident) -> Option<Arc<FileState>> {
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
    /// create, ...): adds one lookup. `validated`: when the store was asked for `attr` (a
    /// file state that knows something newer keeps it).
    pub fn remember_at(
        &self,
        parent: Arc<Inode<S>>,
        name: &std::ffi::OsStr,
        node: S::Node,
        attr: &Attr,
        validated: Instant,
    ) -> Arc<Inode<S>> {
        let inode = self.remember_with(None, Some((parent, name.to_owned())), attr, validated);
        // The freshest node: with path identities the name may hold another object than the
        // one the inode's node was opened on (replaced behind our back).
        inode.set_node(node.clone());
        self.hold_node(&inode, node);
        inode
    }

    /// Gives `inode` its node. It keeps it while it is among the last [`FILE_NODES`] files or
    /// [`DIR_NODES`] directories resolved, then resolves it again from its name when needed.
    pub(crate) fn hold_node(&self, inode: &Arc<Inode<S>>, node: S::Node) {
        {
            let mut n = inode.node.lock();
            if n.is_some() {
                return;
            }
            *n = Some(node);
        }
        let (queue, max) = if inode.kind == FileKind::Dir {
            (&self.dir_nodes, self.max_dir_nodes)
        } else {
            (&self.file_nodes, self.max_file_nodes)
        };
        let old = {
            let mut q = queue.lock();
            q.push_back(Arc::downgrade(inode));
            if q.len() > max {
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
        let id = (attr.dev, attr.ino);
        let mut ino = self.kernel_ino_of_ident(id);
        let old = self.get(ino).filter(|i| i.id() == id);
        if let Some(old) = old.filter(|i| i.replaced_by(id, attr.kind)) {
            self.retire(&old, id);
            // (Retiring moved it off `id`, and so off any number `id` was assigned.)
            ino = self.kernel_ino_of_ident(id);
        }
        let file = (attr.kind == FileKind::File).then(|| self.file_state(attr, validated));
        let (mut node, mut origin) = (node, origin);
        let entry = loop {
            let entry = self.inodes.entry(ino).or_insert_with(|| {
                Arc::new(Inode {
                    ino,
                    id: parking_lot::Mutex::new(id),
                    node: parking_lot::Mutex::new(node.take()),
                    // Moved in, not copied (once per entry of a READDIRPLUS page); an
                    // inode already in the table gets it below.
                    origin: parking_lot::Mutex::new(origin.take()),
                    pinned: std::sync::atomic::AtomicBool::new(false),
                    kind: attr.kind,
                    lookups: AtomicU64::new(0),
                    file: file.clone(),
                })
            });
            if entry.id() == id {
                break entry;
            }
            // Another live object has this number: the next free one, for as long as this
            // object lives.
            drop(entry);
            ino = ino.wrapping_add(1).max(SYNTHETIC_BASE);
            self.assigned.insert(id, ino);
        };
        if let Some(o) = origin {
            // The latest name it was found by is the one most likely to still hold it.
            *entry.origin.lock() = Some(o);
        }
        entry.lookups.fetch_add(1, Relaxed);
        entry.clone()
    }

    /// `old` is no longer the object its identity `id` names: the store gave the identity to
    /// another one (see [`Inode::replaced_by`]). Merged, the newcomer was answered as the old
    /// object: a directory made where a file had just been unlinked could not be listed
    /// (ENOTDIR). `old` gets an identity no store object has and no name to be resolved by
    /// (a node it holds stays: a process may be in that directory, or have the file open);
    /// the newcomer gets an inode, and a kernel inode number, of its own. Once: a second
    /// thread that found `old` under `id` too leaves it to the first.
    fn retire(&self, old: &Arc<Inode<S>>, id: Ident) {
        let n = self.orphans.fetch_add(1, Relaxed);
        let orphan = crate::identity::path_id(id, &orphan_name(n));
        {
            let mut cur = old.id.lock();
            if *cur != id {
                return;
            }
            *cur = orphan;
        }
        *old.origin.lock() = None;
        self.rehome(old, id, orphan);
    }

    /// The kernel learns `inode` again (one more lookup), putting it back in the table if it
    /// had forgotten it: for objects with one `Inode` for good (provisional ones, see
    /// `namespace::provisional`). False if its number now belongs to another object.
    pub(crate) fn readmit(&self, inode: &Arc<Inode<S>>) -> bool {
        let e = self
            .inodes
            .entry(inode.ino)
            .or_insert_with(|| inode.clone());
        if !Arc::ptr_eq(&e, inode) {
            return false;
        }
        let id = inode.id();
        if Self::preferred(id) != inode.ino {
            self.assigned.insert(id, inode.ino);
        }
        inode.lookups.fetch_add(1, Relaxed);
        true
    }

    /// FUSE forget: drops `n` lookups; the inode leaves the table at zero, and is returned.
    pub fn forget(&self, ino: u64, n: u64) -> Option<Arc<Inode<S>>> {
        if ino == crate::ROOT_INO {
            return None;
        }
        let (_, gone) = self.inodes.remove_if(&ino, |_, i| {
            let prev = i.lookups.fetch_sub(n.min(i.lookups.load(Relaxed)), Relaxed);
            prev <= n
        })?;
        let id = gone.id();
        self.assigned.remove_if(&id, |_, v| *v == ino);
        // (Not a pinned node: its name went away, and no inode to come will be it.)
        if !gone.pinned.load(Relaxed) && gone.origin.lock().is_some() {
            if let Some(node) = gone.node() {
                let max = match gone.kind {
                    FileKind::Dir => self.max_dir_nodes,
                    _ => self.max_file_nodes,
                };
                self.spare.lock().put(id, node, max);
            }
        }
        Some(gone)
    }

    /// A rename through tierfs gave `inode`, identified by its path, the identity `new`: it
    /// keeps its kernel inode number and its file state (so its cached blocks, which are
    /// keyed by generation, stay valid). A live object that had `new` (the file the rename
    /// replaced, which may still be open) gets an identity no path leads to.
    ///
    /// `relabel` gives a node another identity: an inode's node says whose attributes the
    /// store's answers about it are.
    pub(crate) fn rekey(&self, inode: &Arc<Inode<S>>, new: Ident, relabel: Relabel<'_, S>) {
        let old = inode.id();
        if old == new {
            return;
        }
        self.vacate(new, Some(inode), relabel);
        self.move_ident(inode, old, new, relabel);
    }

    /// [`InodeTable::rekey`] for a file the kernel does not know: its state follows.
    pub(crate) fn rekey_state(
        &self,
        old: Ident,
        new: Ident,
        relabel: Relabel<'_, S>,
    ) -> Option<Arc<FileState>> {
        let (_, st) = self.files.remove(&old)?;
        self.vacate(new, None, relabel);
        st.set_id(new);
        self.files.insert(new, st.clone());
        Some(st)
    }

    /// Frees identity `new` for an object moving there: a live object that has it (the file
    /// a rename replaced, which may still be open) gets an identity no path leads to; a file
    /// state no live inode uses is forgotten.
    pub(crate) fn vacate(
        &self,
        new: Ident,
        mover: Option<&Arc<Inode<S>>>,
        relabel: Relabel<'_, S>,
    ) {
        match self.by_ident(new) {
            Some(v) if !mover.is_some_and(|m| Arc::ptr_eq(&v, m)) => {
                let n = self.orphans.fetch_add(1, Relaxed);
                let orphan = crate::identity::path_id(new, &orphan_name(n));
                self.move_ident(&v, new, orphan, relabel);
            }
            Some(_) => {}
            None => {
                self.files.remove(&new);
            }
        }
    }

    fn move_ident(&self, inode: &Arc<Inode<S>>, old: Ident, new: Ident, relabel: Relabel<'_, S>) {
        *inode.id.lock() = new;
        if let Some(n) = inode.node() {
            inode.set_node(relabel(&n, new));
        }
        self.rehome(inode, old, new);
    }

    /// The tables follow `inode`, whose identity went from `old` to `new`: its kernel inode
    /// number and its file state are found under `new`.
    fn rehome(&self, inode: &Arc<Inode<S>>, old: Ident, new: Ident) {
        self.assigned.remove_if(&old, |_, v| *v == inode.ino);
        if Self::preferred(new) != inode.ino {
            self.assigned.insert(new, inode.ino);
        }
        if let Some(st) = &inode.file {
            self.files.remove_if(&old, |_, f| Arc::ptr_eq(f, st));
            st.set_id(new);
            self.files.insert(new, st.clone());
        }
    }
}
