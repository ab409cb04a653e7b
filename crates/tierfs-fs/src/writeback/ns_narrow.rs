//! How much of the deferred namespace work an unlink or rename done on the store waits for
//! (see `ns`). The store must see operations in an order the application could have seen
//! them in: everything deferred before them, in general (`drain_ns`). But an unlink or a
//! rename of a file the store already has, to a name that holds no new object, touches
//! nothing the queued operations make: those create other names, in other directories or
//! beside it. Such a rename waits only for what is queued on its directories themselves
//! (their mkdir, their setattrs), so that the store gets them in order. `git` renames
//! `index.lock` (made, flushed and published a moment before) to `index` once its checkout
//! has queued a create per file: before this it waited for every one of them (4.4 s of a
//! 6.2 s clone over sshfs).
//!
//! A crash in between loses nothing: the store has the unlink or rename, and replay makes
//! the queued operations, which are about other names (each a record of its own, idempotent).
//! For that their records are made durable first (`sync_deferred`): a record not yet written
//! when the daemon dies would leave the store with the later operation and not the earlier
//! ones, a state the application never saw (the crash test found it).

use super::Writeback;
use crate::inode::Inode;
use crate::meta::NameLookup;
use crate::namespace::{is_provisional, ProvLookup};
use crate::shared::St;
use std::ffi::OsStr;
use std::sync::Arc;
use tierfs_store::{Errno, FileKind, Store};

/// What a name of a directory of the store holds, as far as [`Writeback::settled_upto`]
/// needs to know.
enum Held {
    /// A file or symlink of the store.
    Object,
    /// Nothing.
    Free,
    /// Something the narrow wait does not cover (a directory, an object write-back made, a
    /// name a queued move leaves, an error): wait for everything.
    Other,
}

impl<S: Store> Writeback<S> {
    /// The seq up to which deferred operations must be applied before `p/name` is unlinked
    /// (`to` None) or renamed to `to` on the store, when fewer than all of them will do (see
    /// the module comment); None: [`Writeback::drain_ns`].
    pub(crate) fn settled_upto(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        to: Option<(&Arc<Inode<St<S>>>, &OsStr)>,
    ) -> Option<u64> {
        // A deferred setattr of one of the objects named must reach the store before: they
        // are not among the directories' operations (`ns_chattr`).
        if self.any_chattr_pending() || !matches!(self.held(p, name), Held::Object) {
            return None;
        }
        if let Some((np, nn)) = to {
            if matches!(self.held(np, nn), Held::Other) {
                return None;
            }
        }
        let dirs = [Some(p.id()), to.map(|(np, _)| np.id())];
        let on_dirs = |id| dirs.contains(&Some(id));
        let mut upto = 0;
        for j in self.nsq.q.lock().iter() {
            if on_dirs(j.inode().id()) {
                upto = upto.max(j.seq());
            }
        }
        let f = self.nsq.in_flight_ids.lock();
        if f.1.iter().any(|id| on_dirs(*id)) {
            upto = upto.max(f.0);
        }
        Some(upto)
    }

    fn held(&self, p: &Arc<Inode<St<S>>>, name: &OsStr) -> Held {
        if is_provisional(p.id())
            || !matches!(self.ns.prov.lookup(p.id(), name), ProvLookup::NotHere)
        {
            return Held::Other;
        }
        let kind = |k: FileKind| match k {
            FileKind::Dir => Held::Other,
            _ => Held::Object,
        };
        match self.ns.meta.lookup(p.id(), name) {
            NameLookup::Found(c) => kind(c.kind),
            NameLookup::Absent => Held::Free,
            NameLookup::Unknown => match self.ns.node(p).map(|n| self.sh.store.lookup(&n, name)) {
                Ok(Ok((_, a))) => kind(a.kind),
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
