//! A deferred removal (see `ns`): an unlink of a file or symlink of the store, acknowledged
//! at once and applied to the store in its turn. `rm -rf` of a build tree, `make clean`, a
//! checkout that drops the files of the old branch: each unlink was a store round trip the
//! application waited for (after every deferred operation before it), one at a time, while
//! the namespace flusher applies a group's removals on `writeback.namespace_threads` threads.
//!
//! Only what a removal cannot get wrong is deferred: a file or symlink the metadata cache
//! names in a fresh listing of a directory of the store, with one link (another name would
//! keep the object and its attributes alive), not open and with no dirty data (an open file
//! outlives its unlink; the data of a file must reach the store before its unlink, see
//! docs/writeback/namespace-flusher.md). From then on no open gets the object (as after the
//! unlink), its name is hidden from lookups and listings until the flusher has removed it
//! (`Provisional::hide`), and the inode takes an identity of its own, so that what is made
//! under the name next, or gets the store's inode number once it is free, is another object.
//!
//! The store must still hold that object when the removal comes: the flusher (and replay,
//! which applies the REMOVE record the same way) removes the name only if it holds the same
//! kind and size, and on a store with inode identities the same inode. Anything else was put
//! there by someone else since: it is left as it is, with a log line and a conflict counted,
//! never removed in our name. (On a store with path identities, a replacement of the same
//! kind and size is not told apart: as with an unlink done on the store, which removes what
//! the name holds then.)

use super::applying::{transient, Applying, Removal};
use super::ns_defer::give_back;
use super::ns_queue::Job;
use super::ns_record::NsOp;
use super::Writeback;
use crate::file_state::DROPPED;
use crate::identity::{is_path_id, Ident};
use crate::inode::Inode;
use crate::meta::{ident, Child, NameLookup};
use crate::namespace::{is_provisional, ProvLookup};
use crate::shared::{Node, St};
use parking_lot::Mutex;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::journal::Record;
use tierfs_store::{Attr, Errno, FileKind, Store};

/// Whether `a`, what the store's name holds now, is the object a removal was recorded for
/// (a directory's size changes with what is removed from it).
pub(super) fn same_object(a: &Attr, kind: FileKind, id: Ident, size: u64) -> bool {
    a.kind == kind
        && (a.size == size || kind == FileKind::Dir)
        && (is_path_id(id) || ident(a) == id)
}

/// A file or symlink of the store a name holds: its entry, size and inode
/// (`Writeback::store_file_at`).
pub(super) type StoreFile<S> = (Child, u64, Arc<Inode<St<S>>>);

/// From here on no open gets `inode` (as after an unlink), and it has no data the store
/// lacks (checked after the claim: nothing can write it any more). False: it is open or has
/// dirty data, and nothing was claimed.
pub(super) fn claim_unopened<S: Store>(inode: &Inode<St<S>>) -> bool {
    let Some(st) = &inode.file else { return true };
    if st
        .opens
        .compare_exchange(0, DROPPED, AcqRel, Acquire)
        .is_err()
    {
        return false;
    }
    if st.has_dirty.load(Acquire) {
        give_back(inode);
        return false;
    }
    true
}

impl<S: Store> Writeback<S> {
    /// An unlink (`dir` false) of `p/name`, a file or symlink of the store, or an rmdir
    /// (`dir` true) of an empty directory of the store, deferred (see the module comment).
    /// None: done on the store, as before.
    pub(crate) fn remove_deferred(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        no_open: bool,
        dir: bool,
    ) -> Option<()> {
        if !self.defers_namespace()
            || no_open
            || p.kind != FileKind::Dir
            || is_provisional(p.id())
            || !matches!(self.ns.prov.lookup(p.id(), name), ProvLookup::NotHere)
        {
            return None;
        }
        let (c, size, inode) = if dir {
            let c = match self.ns.meta.lookup(p.id(), name) {
                NameLookup::Found(c) => c,
                // The rmdir at the top of an `rm -rf`, in a directory nobody listed: one
                // request to the store says what the name holds, where an rmdir on the store
                // would wait for every removal queued in the tree first.
                NameLookup::Unknown => {
                    let (_, a) = self.sh.store.lookup(&self.ns.node(p).ok()?, name).ok()?;
                    Child {
                        id: ident(&a),
                        kind: a.kind,
                    }
                }
                _ => return None,
            };
            // (A directory's attributes change with every name removed from it, and are not
            // needed.)
            if c.kind != FileKind::Dir || !self.empty_as_shown(c.id) || is_provisional(c.id) {
                return None;
            }
            let inode = self.ns.inodes.by_ident(c.id)?;
            if self.chattr_pending(inode.ino) {
                return None;
            }
            (c, 0, inode)
        } else {
            self.store_file_at(p, name, false)?
        };
        // The directory as the application sees it meanwhile: its shadow's base.
        let pattr = self
            .deferred_dir_attr(p.id())
            .or_else(|| self.ns.meta.attr(p.id()).map(|(a, _)| a))?;
        let path = self.backing_path_in(p, name)?;
        if !claim_unopened(&inode) {
            return None;
        }
        let op = NsOp::Remove {
            path,
            kind: c.kind,
            id: c.id,
            size,
        };
        let q = self.nsq.q.lock();
        let Ok(seq) = self.journal.append(Record::Ns {
            payload: &op.encode(),
        }) else {
            give_back(&inode);
            return None;
        };
        self.ns.prov.hide(p.id(), name);
        if !dir {
            // No name leads to the object any more: its identity is free for what comes
            // next. (A directory keeps its own until it is removed: the removals queued in it
            // reach the store through it.)
            self.forget_object(c.id, p, name);
        }
        let now = tierfs_store::TimeSpec::now();
        self.shadow_dir(p.id(), pattr, |a| {
            if dir {
                a.nlink = a.nlink.saturating_sub(1).max(2);
            }
            a.mtime = now;
            a.ctime = now;
        });
        self.c.ns_removed.fetch_add(1, Relaxed);
        self.enqueue(
            q,
            Job::Removed {
                seq,
                inode,
                parent: p.clone(),
                name: name.to_owned(),
                kind: c.kind,
                id: c.id,
                size,
                at: Instant::now(),
            },
        );
        Some(())
    }

    /// The file or symlink of the store `p/name` holds, if an unlink could remove it without
    /// the store (see the module comment): named in a fresh listing of the metadata cache
    /// (or, with `ask`, by the store when no listing is fresh: the caller checks again that
    /// the name holds it when the store gets the change), with one link (another name would
    /// keep the object and its attributes alive), and no deferred setattr (it goes to the
    /// store first, by name: `ns_chattr`). Its entry, size and inode.
    pub(super) fn store_file_at(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        ask: bool,
    ) -> Option<StoreFile<S>> {
        let (c, attr) = match self.ns.meta.lookup(p.id(), name) {
            NameLookup::Found(c) => (c, self.ns.meta.attr(c.id)?.0),
            NameLookup::Unknown if ask => {
                let (_, a) = self.sh.store.lookup(&self.ns.node(p).ok()?, name).ok()?;
                let c = Child {
                    id: ident(&a),
                    kind: a.kind,
                };
                (c, a)
            }
            _ => return None,
        };
        if !matches!(c.kind, FileKind::File | FileKind::Symlink) || is_provisional(c.id) {
            return None;
        }
        if attr.kind != c.kind || attr.nlink != 1 {
            return None;
        }
        let inode = self.ns.inodes.by_ident(c.id)?;
        if self.chattr_pending(inode.ino) {
            return None;
        }
        Some((c, attr.size, inode))
    }

    /// Whether directory `id`, as the application sees it, is empty: a fresh listing of it
    /// in the metadata cache has no name that is not being removed, and nothing new is in it.
    fn empty_as_shown(&self, id: Ident) -> bool {
        let Some(listing) = self.ns.meta.listing(id) else {
            return false;
        };
        if !self.ns.prov.children(id).is_empty() {
            return false;
        }
        let hidden = self.ns.prov.hidden_in(id);
        listing.iter().all(|(n, _)| hidden.contains(n))
    }

    /// Object `id` lost its name `p/name`: nothing leads to it any more, and its identity is
    /// free for what is made next.
    pub(super) fn forget_object(&self, id: Ident, p: &Arc<Inode<St<S>>>, name: &OsStr) {
        self.ns.meta.drop_attr(id);
        self.ns.unnamed(id, p, name);
        let relabel = |n: &Node<S>, id: Ident| self.sh.store.relabel(n, id);
        self.ns.inodes.vacate(id, None, &relabel);
    }

    /// Applies a queued removal: `parent/name` unlinked (or, a directory, removed) on the
    /// store if it still holds the object `inode` was (see the module comment). What it
    /// means for the namespace (the name shown again, a removed directory's identity let go)
    /// waits in `state` for the group's DONE ([`Writeback::removals_done`]): until then the
    /// removal may be applied again (a retry of the group, a replay), and must find the name
    /// as it left it, not taken by a rename done on the store meanwhile. Err: retry later
    /// (transient).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply_remove(
        &self,
        seq: u64,
        inode: &Arc<Inode<St<S>>>,
        parent: &Arc<Inode<St<S>>>,
        name: &OsStr,
        kind: FileKind,
        id: Ident,
        size: u64,
        state: &Mutex<Applying<S>>,
    ) -> std::result::Result<(), Errno> {
        let done = |kept: Option<String>| {
            let removed_dir = (kind == FileKind::Dir && kept.is_none()).then(|| inode.clone());
            state.lock().removals.push(Removal {
                seq,
                parent: parent.clone(),
                name: name.to_owned(),
                kept,
                removed_dir,
            });
            self.c.ns_applied.fetch_add(1, Relaxed);
        };
        let pnode = match self.ns.node(parent) {
            Ok(n) => n,
            Err(e) if transient(e) => return Err(e),
            Err(e) => {
                done(Some(format!("its directory is gone ({e})")));
                return Ok(());
            }
        };
        let pid = parent.id();
        let ours_now = state
            .lock()
            .made
            .iter()
            .any(|(_, m)| m.parent.id() == pid && m.name == name);
        match self.sh.store.lookup(&pnode, name) {
            // Removed already: by an earlier try of this group, or by someone else.
            Err(e) if e == Errno::ENOENT => {}
            // Removed by an earlier try of this group, which then made a new object of ours
            // under the name (a create or move after the removal): never that one.
            Ok(_) if ours_now => {}
            Err(e) if transient(e) => return Err(e),
            Err(e) => {
                done(Some(e.to_string()));
                return Ok(());
            }
            Ok((_, a)) if !same_object(&a, kind, id, size) => {
                done(Some("the name holds another object now".into()));
                return Ok(());
            }
            Ok(_) => {
                if kind == FileKind::Dir {
                    // A process may be in it: its node stays (as an rmdir on the store keeps
                    // it, `Namespace::resolve_victim`).
                    if let Ok(n) = self.ns.node(inode) {
                        inode.pin_node(n);
                    }
                }
                let r = match kind {
                    FileKind::Dir => self.sh.store.rmdir(&pnode, name),
                    _ => self.sh.store.unlink(&pnode, name),
                };
                match r {
                    Ok(()) => {}
                    Err(e) if e == Errno::ENOENT => {}
                    Err(e) if transient(e) => return Err(e),
                    Err(e) if e == Errno(libc::ENOTEMPTY) || e == Errno(libc::EEXIST) => {
                        done(Some("someone else made names in it".into()));
                        return Ok(());
                    }
                    Err(e) => {
                        done(Some(e.to_string()));
                        return Ok(());
                    }
                }
            }
        }
        {
            let mut st = state.lock();
            st.sync_dir(parent.id(), pnode);
            if kind == FileKind::Dir {
                // Gone: what was removed from it is as durable as its removal.
                let gone = inode.id();
                st.dirs.retain(|(d, _)| *d != gone);
            }
        }
        done(None);
        Ok(())
    }

    /// After a group's DONE is durable: what its removals applied up to `upto` mean for the
    /// namespace, once each (those after it are applied again with the rest of the group).
    /// The name is shown again: gone from the cached listing, or, where someone else's object
    /// holds it, as the store lists it. A removed directory lets go of its identity (after
    /// the group's shadow counts, which are keyed by it).
    pub(super) fn removals_done(&self, removals: Vec<Removal<S>>, upto: u64) {
        for r in removals.into_iter().filter(|r| r.seq <= upto) {
            let (parent, name) = (&r.parent, r.name.as_os_str());
            match &r.kept {
                Some(why) => {
                    tracing::warn!(
                        "write-back: {name:?} was not removed from the store: {why}; left as it is"
                    );
                    self.c.ns_conflicts.fetch_add(1, Relaxed);
                    self.ns.meta.drop_listing(parent.id());
                }
                None => {
                    // A listing of the store taken while the name was there must not bring
                    // it back. (The directory's own attributes came from its shadow when the
                    // group was applied: not touched again.)
                    self.ns.meta.forget_name(parent.id(), name);
                }
            }
            if let Some(dir) = &r.removed_dir {
                self.ns.meta.drop_listing(dir.id());
                self.forget_object(dir.id(), parent, name);
            }
            self.ns.listed_changed(parent);
            self.ns.prov.unhide(parent.id(), name);
        }
    }
}

/// Replays a REMOVE record of `path` (see the module comment; `moves_here`: the sources of
/// the pending MOVE records after it to the same name). Ok(Some(why)): left as it is, a
/// conflict; Err: what failed, on which path, with what errno (the replay stops).
pub(super) fn replay_remove<S: Store>(
    store: &St<S>,
    path: &[u8],
    kind: FileKind,
    id: Ident,
    size: u64,
    moves_here: &[&[u8]],
) -> std::result::Result<Option<&'static str>, (&'static str, Vec<u8>, Errno)> {
    let (parent, name) = super::ns_path::split(path);
    let n = OsStr::from_bytes(name);
    let gone = |e: Errno| e == Errno::ENOENT || e == Errno(libc::ENOTDIR);
    let pnode = match super::ns_path::open_by_path(store, parent) {
        Ok((pnode, _)) => pnode,
        Err(e) if gone(e) => return Ok(None),
        Err(e) => return Err(("looking up", parent.to_vec(), e)),
    };
    // A later MOVE to this name whose source is gone from the store was applied, after this
    // removal: what the name holds is ours (on a store with path identities, an empty file
    // of ours could pass for an empty one removed).
    for from in moves_here {
        match super::ns_path::open_by_path(store, from) {
            Err(e) if gone(e) => return Ok(None),
            Err(e) => return Err(("looking up", from.to_vec(), e)),
            Ok(_) => {}
        }
    }
    match store.lookup(&pnode, n) {
        Err(e) if e == Errno::ENOENT => Ok(None),
        Err(e) => Err(("looking up", path.to_vec(), e)),
        Ok((_, a)) if !same_object(&a, kind, id, size) => {
            Ok(Some("the name holds another object than the one unlinked"))
        }
        Ok(_) => {
            let r = match kind {
                FileKind::Dir => store.rmdir(&pnode, n),
                _ => store.unlink(&pnode, n),
            };
            match r {
                Ok(()) => Ok(None),
                Err(e) if e == Errno::ENOENT => Ok(None),
                Err(e) if e == Errno(libc::ENOTEMPTY) || e == Errno(libc::EEXIST) => {
                    Ok(Some("someone else made names in it"))
                }
                Err(e) => Err(("removing", path.to_vec(), e)),
            }
        }
    }
}
