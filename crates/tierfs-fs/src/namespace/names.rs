//! Names made and removed through tierfs: mknod, mkdir, symlink, link, unlink, rmdir. The
//! metadata cache learns each change at once (no relisting), and with path identities an
//! object whose name went away gets an identity of its own.

use super::{is_provisional, Entry, Namespace, Requester};
use crate::identity::{is_path_id, Ident};
use crate::inode::{Inode, TakenName};
use crate::meta::{ident, NameLookup};
use crate::shared::{Node, St};
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Instant;
use tierfs_store::{FileKind, Result, Store};

impl<S: Store> Namespace<S> {
    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        req: Requester,
    ) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) =
            self.sh
                .store
                .mknod(&self.node(&p)?, name, mode, rdev, self.owner(req))?;
        self.meta.add_name(p.id(), name, &attr);
        Ok(self.entry(&p, name, node, attr))
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, req: Requester) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) = self
            .sh
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
            .sh
            .store
            .symlink(&self.node(&p)?, name, target, self.owner(req))?;
        self.meta.add_name(p.id(), name, &attr);
        self.meta.put_link_target(&attr, target);
        Ok(self.entry(&p, name, node, attr))
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Entry> {
        let i = self.inode(ino)?;
        let np = self.inode(newparent)?;
        let node = self.node(&i)?;
        let npnode = self.node(&np)?;
        let mut attr = self.sh.store.link(&node, &npnode, newname)?;
        // With path identities the new name is an object of its own; the old name's link
        // count moved unseen (and its attributes are not trusted from now on, see
        // `MetaCache::distrusts`). Its node is its own too, looked up under the new name:
        // the old name's refers to what that name holds (on sshfs, a file of its own, whose
        // link count an unlink of the old name takes to 0: `git clone` links each pack to
        // its final name and unlinks the temporary one, and every open of the pack then
        // failed with ESTALE).
        let node = if ident(&attr) != i.id() {
            match self.sh.store.lookup(&npnode, newname) {
                Ok((n, a)) if ident(&a) == ident(&attr) => {
                    attr = a;
                    n
                }
                _ => self.sh.store.relabel(&node, ident(&attr)),
            }
        } else {
            self.sh.store.relabel(&node, ident(&attr))
        };
        if ident(&attr) != i.id() {
            self.meta.drop_attr(i.id());
            if let Some(k) = self.sh.kernel() {
                k.drop_attrs(i.ino);
            }
        } else if let Some(st) = &i.file {
            self.sh.own_metadata_change(st, &attr);
        }
        self.meta.add_name(np.id(), newname, &attr);
        Ok(self.entry(&np, newname, node, attr))
    }

    /// Whether `name` is known to be free in directory `p` of the store: a fresh listing
    /// lacks it, or the store said so within `meta.ttl_min` (see `absent`). Write-back then
    /// defers a create, link or rename to it.
    pub(crate) fn name_free(&self, p: &Arc<Inode<St<S>>>, name: &OsStr) -> bool {
        match self.meta.lookup(p.id(), name) {
            NameLookup::Absent => true,
            NameLookup::Found(_) => false,
            NameLookup::Unknown => {
                self.absent
                    .since(p.id(), name)
                    .is_some_and(|t| t.elapsed() < self.meta.ttl_min())
                    && !self.meta.listing_has(p.id(), name)
            }
        }
    }

    /// `dir/name` exists from now on, made by us or found by a lookup: no longer known to
    /// be absent (see `absent`).
    pub(crate) fn made_name(&self, dir: Ident, name: &OsStr) {
        self.absent.forget(dir, name);
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<()> {
        let p = self.inode(parent)?;
        let pnode = self.node(&p)?;
        let victim = self.resolve_victim(&p, name, true);
        let taken = victim.and_then(|id| self.take_unpinned_name(id, &p, name));
        let r = self.sh.store.unlink(&pnode, name);
        if let (Err(_), Some((i, t))) = (&r, taken) {
            i.give_name_back(t);
        }
        self.after_name_change(&p, name, &r);
        if let Some(id) = victim {
            self.meta.drop_attr(id);
            if r.is_ok() {
                self.unnamed(id, &p, name);
                self.name_gone(id);
            }
        }
        r
    }

    /// Our unlink or rename took `parent/name` from object `id`: if that was the name it is
    /// known by, it has none now (it may still be open). Write-back then writes it through
    /// instead of journaling it under that path, which a crash would replay into whatever
    /// holds the name by then (the file a rename put there). A lookup under another name (a
    /// hard link) gives it that one.
    pub(crate) fn unnamed(&self, id: Ident, parent: &Arc<Inode<St<S>>>, name: &OsStr) {
        let Some(i) = self.inodes.by_ident(id) else {
            return;
        };
        let mut o = i.origin.lock();
        if o.as_ref()
            .is_some_and(|(p, n)| p.ino == parent.ino && n == name)
        {
            *o = None;
        }
    }

    /// Before the store takes `parent/name` from object `id` (unlink, rename over it): if its
    /// inode holds no node, the name goes first (`Inode::take_name_if_unpinned`): the
    /// identity is free on the store the moment it is done. The inode and its name, to give
    /// back if the store refused.
    pub(crate) fn take_unpinned_name(
        &self,
        id: Ident,
        parent: &Arc<Inode<St<S>>>,
        name: &OsStr,
    ) -> Option<TakenName<St<S>>> {
        let i = self.inodes.by_ident(id)?;
        let t = i.take_name_if_unpinned(parent.ino, name)?;
        Some((i, t))
    }

    /// With path identities, an object whose name went away (unlink, rmdir) is no longer
    /// what its identity (its path's) names: it gets one of its own, so that what is created
    /// under that name next (a new file, a link) is another object.
    pub(crate) fn name_gone(&self, id: Ident) {
        if is_path_id(id) {
            let relabel = |n: &Node<S>, id: Ident| self.sh.store.relabel(n, id);
            self.inodes.vacate(id, None, &relabel);
        }
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        let p = self.inode(parent)?;
        let pnode = self.node(&p)?;
        let victim = self.resolve_victim(&p, name, true);
        let r = self.sh.store.rmdir(&pnode, name);
        self.after_name_change(&p, name, &r);
        if let Some(id) = victim {
            self.meta.drop_listing(id);
            self.listing_outdated(id);
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
    pub(crate) fn resolve_victim(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        pin: bool,
    ) -> Option<crate::meta::Ident> {
        let id = self.resolve_victim_now(p, name, pin);
        if let Some(id) = id {
            self.inodes.drop_spare(id);
        }
        id
    }

    fn resolve_victim_now(
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
            if pin && self.may_outlive_its_name(&i) {
                if i.node().is_none() {
                    self.list_for_pins(p);
                }
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
        let (node, attr) = self.sh.store.lookup(&self.node(p).ok()?, name).ok()?;
        if pin {
            if let Some(i) = self.inodes.by_ident(ident(&attr)) {
                i.pin_node(node);
            }
        }
        Some(ident(&attr))
    }

    /// Before an unlink looks its victim up on the store to pin its node (see
    /// [`Namespace::resolve_victim`]): lists directory `p` on the store, if its cached
    /// listing has [`PIN_LIST_MIN`] names or more, once there were a [`PIN_LIST_RATIO`]th as
    /// many such lookups in it (the first, in all but large directories), and again after
    /// as many more, at most once per [`PIN_RELIST`].
    ///
    /// Why: `rm -rf` of a tree whose listings tierfs serves from its cache (`meta.ttl=1h`)
    /// under FUSE no-open pins every file it removes, one store lookup each. A network
    /// store's client answers lookups from what its own last listing of the directory said
    /// (sshfs keeps it 20 s), and nothing listed it: each lookup was a round trip, where
    /// `rm` on the store alone lists the directory once and finds every name in its
    /// client's cache. Over sshfs (4.4 ms round trip) the bench's `rm -rf` of 2,505 files
    /// took 28.5 s through tierfs against 17.4 s. One listing costs what the store alone's
    /// `rm` spends on it.
    fn list_for_pins(&self, p: &Arc<Inode<St<S>>>) {
        if is_provisional(p.id()) {
            return;
        }
        let due = {
            let mut g = self.pin_lookups.lock();
            if g.dir != Some(p.id()) {
                // (Not listed in the cache, or listed by the store a moment ago: `rm`'s
                // readdir had the store list it, which told its client every name.)
                let names = match self.meta.listing_size_age(p.id()) {
                    Some((n, age)) if age >= PIN_LISTED_RECENTLY => n,
                    _ => 0,
                };
                *g = PinLookups {
                    dir: Some(p.id()),
                    names,
                    ..PinLookups::default()
                };
            }
            g.lookups += 1;
            // A listing costs a few round trips (sshfs: open, read to the end, close): worth
            // it where more names than that are to be looked up, and in a large directory
            // once that many lookups have been made (`rm` of a few names of a directory of a
            // million does not list it).
            let due = g.names >= PIN_LIST_MIN
                && g.lookups * PIN_LIST_RATIO >= g.names
                && g.listed.is_none_or(|t| t.elapsed() >= PIN_RELIST);
            if due {
                g.listed = Some(Instant::now());
                g.lookups = 0;
            }
            due
        };
        if due {
            // Names only (one readdir): what fills the store client's cache. A listing with
            // every entry's attributes would cost a stat per name on a store without such a
            // cache (the nfs-lan emulator: `rm -rf` went from 0.79x to 0.74x the store).
            if let Ok(n) = self.node(p) {
                let _ = self.sh.store.readdir(&n);
            }
        }
    }

    /// Whether object `i` may still be used once the name it is known by is gone, and so
    /// needs its node pinned before: it has a node already (pinning costs nothing), is open
    /// (or may be: under FUSE no-open the kernel does not say), has another link, or is not a
    /// regular file (a process may be in a directory; a FIFO, socket or device is opened
    /// without an OPEN reaching us). A regular file that is none of these is never asked for
    /// again (but through an `O_PATH` descriptor, which sends no OPEN either: its `fstat`
    /// after the unlink fails with ESTALE): its unlink costs one store request instead of three (the lookup that resolves
    /// its node is an open and a stat on the store; `rm -rf` through write-through tierfs ran
    /// at 0.69x the store alone over the hdd emulator with them).
    fn may_outlive_its_name(&self, i: &Inode<St<S>>) -> bool {
        if i.node().is_some() || i.kind != FileKind::File || self.sh.cfg.no_open() {
            return true;
        }
        let open = i
            .file
            .as_ref()
            .is_some_and(|st| st.opens.load(std::sync::atomic::Ordering::Acquire) != 0);
        open || self.meta.attr(i.id()).is_none_or(|(a, _)| a.nlink != 1)
    }

    /// After an operation removed `name` from `p` (or failed doing so).
    pub(crate) fn after_name_change(&self, p: &Arc<Inode<St<S>>>, name: &OsStr, r: &Result<()>) {
        match r {
            Ok(()) => {
                self.meta.remove_name(p.id(), name);
            }
            // The name's state is not what we thought: ask again next time.
            Err(_) => self.meta.drop_listing(p.id()),
        }
    }
}

/// How often [`Namespace::list_for_pins`] lists one directory again while unlinks in it go
/// on: sshfs's client keeps what a listing told it for 20 s.
const PIN_RELIST: std::time::Duration = std::time::Duration::from_secs(10);

/// Names in a directory from which [`Namespace::list_for_pins`] lists it rather than look
/// them up one by one.
const PIN_LIST_MIN: usize = 4;

/// A listing the store gave this recently told its client the names already.
const PIN_LISTED_RECENTLY: std::time::Duration = std::time::Duration::from_secs(2);

/// Lookups per name of a directory after which [`Namespace::list_for_pins`] lists it: one in
/// this many.
const PIN_LIST_RATIO: usize = 64;

/// See [`Namespace::list_for_pins`]: the directory, its names in the cached listing, the
/// lookups in it since it was last listed for them, and when that was.
#[derive(Default)]
pub(crate) struct PinLookups {
    dir: Option<Ident>,
    names: usize,
    lookups: usize,
    listed: Option<Instant>,
}
