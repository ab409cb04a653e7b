//! Provisional objects: names created in write-back mode (`writeback.namespace=back`) that the
//! store does not have yet. Write-back journals the create and acknowledges it; the
//! namespace flusher makes the object on the store later, in journal order
//! (docs/writeback/namespace.md, "Namespace write-back").
//!
//! Until then the object is known only here: its attributes (kept up to date by deferred
//! setattrs), its name, and for a directory the names created in it, which are all
//! provisional too (every operation that could bring an object of the store under a
//! provisional directory, a rename or a link, first waits for the namespace flusher). So a
//! lookup in a provisional directory is answered here, a miss included, with no store
//! request: that is what makes an untar fast. The metadata cache holds only what the store
//! said; nothing provisional goes there.
//!
//! An operation that needs the object on the store (a read of data not written here, a
//! listing, a rename) waits in [`Provisional::wait`] until the namespace flusher has made it
//! ([`Provisional::materialized`]): the inode then has the store's identity and node.
//!
//! A regular file may have a second name in its directory, its *alias*, left by a deferred
//! link (`writeback::ns_link`) until the store has it or the application unlinks it.
//!
//! Each provisional object has one `Inode` (kept here): the kernel may forget it and look it
//! up again, and the namespace flusher must give the store's identity to the very inode the
//! kernel and the write-back path hold.

use crate::identity::Ident;
use crate::inode::Inode;
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tierfs_store::{Attr, Errno, Result, Store, TimeSpec};

/// The device part of a provisional identity: `(PROV_DEV, seq of its CREATE record)`. Not a
/// path identity (top bit clear) and not an inode identity (`0`): no store object has it.
pub const PROV_DEV: u64 = 0x7FFF_FFFF_FFFF_FFFE;

pub fn is_provisional(id: Ident) -> bool {
    id.0 == PROV_DEV
}

struct Obj<T: Store> {
    inode: Arc<Inode<T>>,
    attr: Attr,
    /// Where it is: the parent's identity (provisional or not) and its name.
    parent: Ident,
    name: OsString,
    /// A directory's names, all provisional.
    children: Vec<OsString>,
    /// A symlink's target (readlink answers it here).
    target: Option<OsString>,
    /// A file's second name in the same directory, left by a deferred link (`link`): the
    /// store gets it after the object, which its create makes under `name`.
    alias: Option<OsString>,
}

struct Inner<T: Store> {
    objs: FxHashMap<Ident, Obj<T>>,
    names: FxHashMap<(Ident, OsString), Ident>,
    /// Objects the store refused to make (a conflict): whatever waits for them fails.
    failed: FxHashMap<Ident, Errno>,
    /// Names the store still holds but the application no longer sees: a provisional object
    /// made on the store and renamed since, by a move the namespace flusher has not applied
    /// yet (`writeback::ns_move`), or an object of the store unlinked by a removal not applied
    /// yet (`writeback::ns_remove`). Counted: a name may be left by several queued moves.
    hidden: FxHashMap<(Ident, OsString), u32>,
    /// The store fails the namespace flusher's attempts (the last error): see
    /// [`Provisional::wait`].
    stalled: Option<Errno>,
}

/// How long a wait for an object to be made on the store lasts while the store fails to
/// make it before it returns the store's error: a network blip or a store restarting is
/// waited out, a store that keeps failing is reported within seconds instead of hanging the
/// caller (an unmount gives up 8 s after the drain's last progress, by the same reasoning).
pub const STALL_PATIENCE: Duration = Duration::from_secs(5);

pub struct Provisional<T: Store> {
    inner: Mutex<Inner<T>>,
    changed: Condvar,
    /// `objs.len() + hidden.len()`, read without the lock: [`Provisional::is_empty`].
    count: AtomicUsize,
    /// `failed` is not empty, read without the lock (the data flushers ask of every dirty
    /// file whether it failed).
    any_failed: AtomicBool,
    /// Threads in [`Provisional::wait`]: the namespace flusher stops gathering for them.
    waiters: AtomicUsize,
    stop: AtomicBool,
}

/// What the table says of a name.
pub enum ProvLookup<T: Store> {
    /// A provisional object.
    Found(Arc<Inode<T>>, Attr),
    /// The parent is provisional and has no such name.
    Absent,
    /// Not known here: ask the metadata cache and the store.
    NotHere,
    /// A name the store still holds and the application left (see `Inner::hidden`): no
    /// such name.
    Hidden,
}

impl<T: Store> Provisional<T> {
    pub fn new() -> Provisional<T> {
        Provisional {
            inner: Mutex::new(Inner {
                objs: FxHashMap::default(),
                names: FxHashMap::default(),
                failed: FxHashMap::default(),
                hidden: FxHashMap::default(),
                stalled: None,
            }),
            changed: Condvar::new(),
            count: AtomicUsize::new(0),
            any_failed: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// No provisional object and no hidden name: lookups and listings need not ask.
    pub fn is_empty(&self) -> bool {
        self.count.load(Relaxed) == 0
    }

    fn recount(&self, g: &Inner<T>) {
        self.count.store(g.objs.len() + g.hidden.len(), Relaxed);
    }

    /// Records a new provisional object `inode` with `attr`, named `name` in `parent` (a
    /// symlink with its `target`).
    pub fn add(
        &self,
        inode: Arc<Inode<T>>,
        attr: Attr,
        parent: Ident,
        name: &OsStr,
        target: Option<&OsStr>,
    ) {
        let mut g = self.inner.lock();
        let id = inode.id();
        if let Some(p) = g.objs.get_mut(&parent) {
            p.children.push(name.to_owned());
        }
        g.names.insert((parent, name.to_owned()), id);
        g.objs.insert(
            id,
            Obj {
                inode,
                attr,
                parent,
                name: name.to_owned(),
                children: Vec::new(),
                target: target.map(OsStr::to_owned),
                alias: None,
            },
        );
        self.recount(&g);
    }

    pub fn lookup(&self, parent: Ident, name: &OsStr) -> ProvLookup<T> {
        if self.is_empty() {
            return ProvLookup::NotHere;
        }
        let g = self.inner.lock();
        // Allocation-free probe would need a borrowed key type; names are short.
        match g.names.get(&(parent, name.to_owned())) {
            Some(id) => match g.objs.get(id) {
                Some(o) => ProvLookup::Found(o.inode.clone(), o.attr),
                None => ProvLookup::NotHere,
            },
            None if g.objs.contains_key(&parent) => ProvLookup::Absent,
            None if g.hidden.contains_key(&(parent, name.to_owned())) => ProvLookup::Hidden,
            None => ProvLookup::NotHere,
        }
    }

    /// `parent/name` is no longer the application's, though the store holds it until a
    /// queued move or removal is applied: lookups answer ENOENT and listings leave it out.
    pub fn hide(&self, parent: Ident, name: &OsStr) {
        let mut g = self.inner.lock();
        *g.hidden.entry((parent, name.to_owned())).or_insert(0) += 1;
        self.recount(&g);
    }

    /// The move or removal that left `parent/name` is applied: the store no longer holds
    /// the name (or, after a conflict, holds someone else's object there).
    pub fn unhide(&self, parent: Ident, name: &OsStr) {
        let mut g = self.inner.lock();
        let key = (parent, name.to_owned());
        if let Some(n) = g.hidden.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                g.hidden.remove(&key);
            }
        }
        self.recount(&g);
    }

    /// The names of directory `parent` the store holds and the application left (see
    /// [`Provisional::hide`]).
    pub fn hidden_in(&self, parent: Ident) -> Vec<OsString> {
        if self.is_empty() {
            return Vec::new();
        }
        let g = self.inner.lock();
        g.hidden
            .keys()
            .filter(|(p, _)| *p == parent)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// The provisional names in directory `parent` (provisional or not), with their inodes.
    pub fn children(&self, parent: Ident) -> Vec<(OsString, Arc<Inode<T>>)> {
        if self.is_empty() {
            return Vec::new();
        }
        let g = self.inner.lock();
        g.names
            .iter()
            .filter(|((p, _), _)| *p == parent)
            .filter_map(|((_, n), id)| g.objs.get(id).map(|o| (n.clone(), o.inode.clone())))
            .collect()
    }

    /// The attributes of provisional object `id` (None: not, or no longer, provisional).
    pub fn attr(&self, id: Ident) -> Option<Attr> {
        if !is_provisional(id) {
            return None;
        }
        self.inner.lock().objs.get(&id).map(|o| o.attr)
    }

    /// Provisional object `id` is now `new_name` in directory `new_parent` (a deferred
    /// rename).
    pub fn rename(&self, id: Ident, new_parent: Ident, new_name: &OsStr) {
        let mut g = self.inner.lock();
        let Some(o) = g.objs.get_mut(&id) else { return };
        let old_parent = std::mem::replace(&mut o.parent, new_parent);
        let old = std::mem::replace(&mut o.name, new_name.to_owned());
        g.names.remove(&(old_parent, old.clone()));
        g.names.insert((new_parent, new_name.to_owned()), id);
        if let Some(p) = g.objs.get_mut(&old_parent) {
            p.children.retain(|c| *c != old);
        }
        if let Some(p) = g.objs.get_mut(&new_parent) {
            p.children.push(new_name.to_owned());
        }
    }

    /// Provisional file `id` gets the second name `new_name` in its directory (a deferred
    /// link, `writeback::ns_link`): its create will make `new_name`, and the name it had
    /// stays as its alias, linked on the store after it. Its attributes then (None: not
    /// provisional, or it has an alias already).
    pub fn link(&self, id: Ident, new_name: &OsStr, now: TimeSpec) -> Option<Attr> {
        let mut g = self.inner.lock();
        let o = g.objs.get_mut(&id)?;
        if o.alias.is_some() {
            return None;
        }
        let old = std::mem::replace(&mut o.name, new_name.to_owned());
        o.alias = Some(old);
        o.attr.nlink += 1;
        o.attr.ctime = now;
        let (parent, attr) = (o.parent, o.attr);
        g.names.insert((parent, new_name.to_owned()), id);
        if let Some(p) = g.objs.get_mut(&parent) {
            p.children.push(new_name.to_owned());
        }
        Some(attr)
    }

    /// The alias of provisional file `id` (see [`Provisional::link`]), if it has one.
    pub fn alias(&self, id: Ident) -> Option<OsString> {
        if !is_provisional(id) {
            return None;
        }
        self.inner.lock().objs.get(&id)?.alias.clone()
    }

    /// The alias of provisional file `id` is unlinked before the store had it.
    pub fn unalias(&self, id: Ident, now: TimeSpec) {
        let mut g = self.inner.lock();
        let Some(o) = g.objs.get_mut(&id) else { return };
        let Some(alias) = o.alias.take() else { return };
        o.attr.nlink = o.attr.nlink.saturating_sub(1).max(1);
        o.attr.ctime = now;
        let parent = o.parent;
        g.names.remove(&(parent, alias.clone()));
        if let Some(p) = g.objs.get_mut(&parent) {
            p.children.retain(|c| *c != alias);
        }
    }

    /// Whether provisional directory `id` has no names in it (None: not provisional).
    pub fn is_empty_dir(&self, id: Ident) -> Option<bool> {
        self.inner
            .lock()
            .objs
            .get(&id)
            .map(|o| o.children.is_empty())
    }

    /// The target of provisional symlink `id` (None: not a provisional symlink).
    pub fn target(&self, id: Ident) -> Option<OsString> {
        if !is_provisional(id) {
            return None;
        }
        self.inner.lock().objs.get(&id)?.target.clone()
    }

    /// Changes the attributes of provisional object `id` (a deferred setattr); returns them,
    /// or None if it is no longer provisional.
    pub fn update_attr(&self, id: Ident, f: impl FnOnce(&mut Attr)) -> Option<Attr> {
        let mut g = self.inner.lock();
        let o = g.objs.get_mut(&id)?;
        f(&mut o.attr);
        Some(o.attr)
    }

    /// Waits until `id` is on the store (the namespace flusher made it). Err: the store
    /// refused it (a conflict), or the mount is going away.
    pub fn wait(&self, id: Ident) -> Result<()> {
        let mut g = self.inner.lock();
        self.waiters.fetch_add(1, Relaxed);
        let t = std::time::Instant::now();
        let r = loop {
            if let Some(e) = g.failed.get(&id) {
                break Err(*e);
            }
            if let Some(e) = g.stalled.filter(|_| t.elapsed() >= STALL_PATIENCE) {
                break Err(e);
            }
            if !g.objs.contains_key(&id) {
                break Ok(());
            }
            if self.stop.load(Relaxed) {
                break Err(Errno::EIO);
            }
            self.changed.wait_for(&mut g, Duration::from_millis(100));
        };
        self.waiters.fetch_sub(1, Relaxed);
        r
    }

    /// The namespace flusher's last attempt failed with `e` (the store is failing: waits
    /// give up after [`STALL_PATIENCE`]), or None: it applied everything it took.
    pub fn stalled(&self, e: Option<Errno>) {
        let mut g = self.inner.lock();
        if g.stalled != e {
            g.stalled = e;
            drop(g);
            self.changed.notify_all();
        }
    }

    /// The error of the namespace flusher's last attempt, while the store fails (see
    /// [`Provisional::stalled`]).
    pub fn stalled_error(&self) -> Option<Errno> {
        self.inner.lock().stalled
    }

    /// Someone waits for an object to be made on the store.
    pub fn awaited(&self) -> bool {
        self.waiters.load(Relaxed) > 0
    }

    /// The error the store gave for `id`, if it refused to make it.
    pub fn failure(&self, id: Ident) -> Option<Errno> {
        if !is_provisional(id) {
            return None;
        }
        if !self.any_failed.load(Relaxed) {
            return None;
        }
        self.inner.lock().failed.get(&id).copied()
    }

    /// `old` is on the store now, as `new` (its inode already rekeyed): its names are looked
    /// up in the metadata cache and the store from now on, and its children's parent is `new`.
    pub fn materialized(&self, old: Ident, new: Ident) {
        let mut g = self.inner.lock();
        if let Some(o) = g.objs.remove(&old) {
            g.names.remove(&(o.parent, o.name.clone()));
            if let Some(a) = o.alias {
                g.names.remove(&(o.parent, a));
            }
            for c in o.children {
                if let Some(cid) = g.names.remove(&(old, c.clone())) {
                    if let Some(co) = g.objs.get_mut(&cid) {
                        co.parent = new;
                    }
                    g.names.insert((new, c), cid);
                }
            }
            // Names a queued move in it leaves: hidden under its new identity too.
            let moved: Vec<(Ident, OsString)> = g
                .hidden
                .keys()
                .filter(|(p, _)| *p == old)
                .cloned()
                .collect();
            for k in moved {
                if let Some(n) = g.hidden.remove(&k) {
                    *g.hidden.entry((new, k.1)).or_insert(0) += n;
                }
            }
        }
        self.recount(&g);
        drop(g);
        self.changed.notify_all();
    }

    /// The store refused to make `old` (errno `e`): it and its name are gone from the
    /// namespace; whatever waits for it fails with `e`.
    pub fn refused(&self, old: Ident, e: Errno) {
        let mut g = self.inner.lock();
        if let Some(o) = g.objs.remove(&old) {
            g.names.remove(&(o.parent, o.name.clone()));
            if let Some(a) = &o.alias {
                g.names.remove(&(o.parent, a.clone()));
            }
            if let Some(p) = g.objs.get_mut(&o.parent) {
                p.children
                    .retain(|c| *c != o.name && Some(c) != o.alias.as_ref());
            }
        }
        g.failed.insert(old, e);
        self.any_failed.store(true, Relaxed);
        self.recount(&g);
        drop(g);
        self.changed.notify_all();
    }

    /// Forgets that `id` failed (an object whose unlink was deferred, once nothing can
    /// wait for it any more).
    pub fn forget_failure(&self, id: Ident) {
        let mut g = self.inner.lock();
        g.failed.remove(&id);
        self.any_failed.store(!g.failed.is_empty(), Relaxed);
    }

    /// The mount is going away: waiters give up.
    pub fn shutdown(&self) {
        self.stop.store(true, Relaxed);
        self.changed.notify_all();
    }
}

impl<T: Store> Default for Provisional<T> {
    fn default() -> Self {
        Self::new()
    }
}
