//! How much of the deferred namespace work an unlink or rename done on the store waits for
//! (see `ns`). The store must see operations in an order the application could have seen
//! them in: everything deferred before them, in general (`drain_ns`). But an unlink or a
//! rename of a file the store already has, to a name that holds no new object, touches
//! nothing the queued operations make: those create other names, in other directories or
//! beside it. Such a rename waits only for what is queued on its directories themselves
//! (their mkdir, their setattrs) and on the objects it names (a deferred chmod or touch,
//! `ns_chattr`), so that the store gets them in order. (It used to wait for everything
//! whenever any deferred setattr was pending anywhere: in a build, which touches and chmods
//! as it goes, that was most of the time.) `git` renames
//! `index.lock` (made, flushed and published a moment before) to `index` once its checkout
//! has queued a create per file: before this it waited for every one of them (4.4 s of a
//! 6.2 s clone over sshfs). A link of a file of the store to a free name waits the same
//! way (`Fs::drain_ns_for_link`): `cargo` links every artifact into the target directory.
//!
//! A crash in between loses nothing: the store has the unlink or rename, and replay makes
//! the queued operations, which are about other names (each a record of its own, idempotent).
//! For that their records are made durable first (`sync_deferred`): a record not yet written
//! when the daemon dies would leave the store with the later operation and not the earlier
//! ones, a state the application never saw (the crash test found it).

use super::ns_queue::Job;
use super::Writeback;
use crate::identity::Ident;
use crate::inode::Inode;
use crate::meta::{ident, NameLookup};
use crate::namespace::{is_provisional, ProvLookup};
use crate::shared::St;
use std::ffi::OsStr;
use std::sync::Arc;
use tierfs_store::{Errno, FileKind, Store};

/// What a name of a directory of the store holds, as far as [`Writeback::settled_upto`]
/// needs to know.
enum Held {
    /// A file or symlink of the store, of this identity.
    Object(Ident),
    /// Nothing.
    Free,
    /// Not known without asking the store, and not asked (a new name, see
    /// [`Writeback::settled_upto`]).
    Unasked,
    /// Something the narrow wait does not cover (a directory, an object write-back made, a
    /// name a queued move leaves, an error): wait for everything.
    Other,
}

impl<S: Store> Writeback<S> {
    /// The seq up to which deferred operations must be applied before `p/name` is unlinked
    /// (`to` None) or renamed to `to` on the store, when fewer than all of them will do (see
    /// the module comment); None: [`Writeback::drain_ns`]. `exchange`: `to` moves too
    /// (`RENAME_EXCHANGE`), so what it holds is asked of the store: a directory exchanged
    /// into another changes both link counts, which a directory's shadow must not miss
    /// (the model test found a shadow showing 2 links for 3).
    pub(crate) fn settled_upto(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        to: Option<(&Arc<Inode<St<S>>>, &OsStr)>,
        exchange: bool,
    ) -> Option<u64> {
        let Held::Object(object) = self.held(p, name, true) else {
            return None;
        };
        // The new name is not asked of the store (the kernel's lookup just did, and a link
        // or rename to it answers as the store does): whatever the store holds there, no
        // queued operation makes it, or the provisional table would know it. Only a deferred
        // setattr of that object could be queued, and such an object has one name, which
        // its inode knows (`ns_chattr` defers no setattr of a file with two).
        let target = match to.map(|(np, nn)| (np, nn, self.held(np, nn, exchange))) {
            Some((_, _, Held::Other)) => return None,
            Some((_, _, Held::Object(id))) => Some(id),
            Some((np, nn, Held::Unasked)) => self.chattr_pending_at(np, nn),
            Some((_, _, Held::Free)) | None => None,
        };
        // What is queued on the directories (their mkdir, their setattrs) and on the objects
        // named (a deferred chmod or touch of either, `ns_chattr`) goes first.
        let ids = [
            Some(p.id()),
            to.map(|(np, _)| np.id()),
            Some(object),
            target,
        ];
        let named = |id| ids.contains(&Some(id));
        let mut upto = 0;
        for j in self.nsq.q.lock().iter() {
            if named(j.inode().id()) {
                upto = upto.max(j.seq());
            }
        }
        let f = self.nsq.in_flight_ids.lock();
        if f.1.iter().any(|id| named(*id)) {
            upto = upto.max(f.0);
        }
        Some(upto)
    }

    /// The object of the store under `p/name` with a deferred setattr queued, if any.
    fn chattr_pending_at(&self, p: &Arc<Inode<St<S>>>, name: &OsStr) -> Option<Ident> {
        if !self.any_chattr_pending() {
            return None;
        }
        let here = |i: &Inode<St<S>>| {
            i.origin
                .lock()
                .as_ref()
                .is_some_and(|(ip, n)| ip.id() == p.id() && n == name)
        };
        let queued = self
            .nsq
            .q
            .lock()
            .iter()
            .filter(|j| matches!(j, Job::SetAttr { of_store: true, .. }))
            .map(|j| j.inode())
            .find(|i| here(i))
            .map(|i| i.id());
        // Or one being applied (whatever its kind: the in-flight set keeps identities only).
        queued.or_else(|| {
            let f = self.nsq.in_flight_ids.lock();
            f.1.iter()
                .copied()
                .find(|id| self.ns.inodes.by_ident(*id).is_some_and(|i| here(&i)))
        })
    }

    /// What `p/name` holds; `ask`: ask the store if the metadata cache does not know (else
    /// [`Held::Unasked`]).
    fn held(&self, p: &Arc<Inode<St<S>>>, name: &OsStr, ask: bool) -> Held {
        if is_provisional(p.id())
            || !matches!(self.ns.prov.lookup(p.id(), name), ProvLookup::NotHere)
        {
            return Held::Other;
        }
        let kind = |k: FileKind, id: Ident| match k {
            FileKind::Dir => Held::Other,
            _ => Held::Object(id),
        };
        match self.ns.meta.lookup(p.id(), name) {
            NameLookup::Found(c) => kind(c.kind, c.id),
            NameLookup::Absent => Held::Free,
            NameLookup::Unknown if !ask => Held::Unasked,
            NameLookup::Unknown => match self.ns.node(p).map(|n| self.sh.store.lookup(&n, name)) {
                Ok(Ok((_, a))) => kind(a.kind, ident(&a)),
                Ok(Err(e)) if e == Errno::ENOENT => Held::Free,
                _ => Held::Other,
            },
        }
    }

    /// Every namespace record appended so far durable in the journal (see the module
    /// comment).
    pub(crate) fn sync_deferred(&self) -> tierfs_store::Result<()> {
        let seq = self.nsq.appended.load(std::sync::atomic::Ordering::Acquire);
        if seq == 0 {
            return Ok(());
        }
        self.journal.sync(seq).map_err(|e| {
            tracing::error!("write-back journal: {e}");
            Errno::EIO
        })
    }
}
