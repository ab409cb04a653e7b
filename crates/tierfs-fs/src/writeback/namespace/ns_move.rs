//! A deferred move (see `ns`): a file or symlink write-back made, whose create the namespace
//! flusher has already taken (it is being made, or made and not yet published, on the store
//! under its old name), renamed to a free name in its directory. `git` finalizes its lock
//! files so (`index.lock` -> `index` once the checkout is written; `config.lock`, `HEAD.lock`,
//! `packed-refs.new`), as do editors and package tools that write a temporary file first; when
//! the flusher had taken the create, the rename used to wait for every name deferred before
//! it (a checkout's: 4.9 s of a 7.7 s `git clone` over sshfs).
//!
//! It cannot be folded into the create (`ns_rename`): the store has, or is getting, the old
//! name. So it is queued as a rename for the store, applied in its turn (`ns_apply`), and
//! until then the old name, which the store's listing shows, is hidden from lookups and
//! listings (`Provisional::hide`). The object stays unpublished while it is queued, so its
//! identity and node are taken from the new name once it is there. For replay, as in
//! `ns_rename`: an empty DATA record under the new path (if the file has dirty data), then
//! the MOVE record, which replay applies to the store in its place in the journal order.

use super::ns_queue::{Job, Victim};
use super::ns_record::NsOp;
use super::Writeback;
use crate::identity::Ident;
use crate::inode::Inode;
use crate::namespace::is_provisional;
use crate::shared::St;
use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Instant;
use tierfs_store::{Errno, FileKind, Store};

impl<S: Store> Writeback<S> {
    /// Moves provisional `inode` from `name` to the free `newname` of directory `p` (see the
    /// module comment), its create no longer queued untried: `q` is the queue, locked. None:
    /// not done (the rename goes to the store, after [`Writeback::drain_ns`]).
    pub(super) fn move_deferred(
        &self,
        q: parking_lot::MutexGuard<'_, VecDeque<Job<S>>>,
        inode: Arc<Inode<St<S>>>,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        newname: &OsStr,
    ) -> Option<()> {
        let id = inode.id();
        // Still provisional under that name, now that the queue is locked (publish holds
        // it): the flusher may have published the object since the caller looked, and a
        // move queued for a published object would be acknowledged and never applied.
        // Refused by the store: the rename answers as the store does.
        if !self.still_unpublished(p, name, id) {
            return None;
        }
        let from = self.backing_path(&inode)?;
        let to = self.backing_path_in(p, newname)?;
        self.queue_move(q, inode, p, (name, newname), (from, to), None)
    }

    /// `id` is still the provisional object under `name` in `p`, unpublished and not refused
    /// (checked with the queue locked: `publish` holds it).
    pub(super) fn still_unpublished(&self, p: &Arc<Inode<St<S>>>, name: &OsStr, id: Ident) -> bool {
        let still = matches!(self.ns.prov.lookup(p.id(), name),
            crate::namespace::ProvLookup::Found(i, _) if i.id() == id);
        still && is_provisional(id) && self.ns.prov.failure(id).is_none()
    }

    /// What a move and a replace (`ns_replace`) share once they are decided: the file's
    /// writers held off, the MOVE record journaled, the provisional object renamed, its
    /// directory's times moved, the job queued. `over`: the object of the store the new
    /// name held, which no name leads to once the record is in the journal. None: nothing
    /// journaled and nothing changed.
    pub(super) fn queue_move(
        &self,
        q: parking_lot::MutexGuard<'_, VecDeque<Job<S>>>,
        inode: Arc<Inode<St<S>>>,
        p: &Arc<Inode<St<S>>>,
        (name, newname): (&OsStr, &OsStr),
        (from, to): (Vec<u8>, Vec<u8>),
        over: Option<Victim>,
    ) -> Option<()> {
        let id = inode.id();
        // Writers of the file wait, as for a deferred rename (`ns_rename`).
        let st = inode.file.clone();
        let _w = st.as_ref().map(|st| st.rw.write());
        let mut dirty = st.as_ref().map(|st| st.dirty.lock());
        let op = NsOp::Move {
            from: from.clone(),
            to: to.clone(),
            prov: id.1,
            over: over.as_ref().map(|v| (v.kind, v.id, v.size)),
        };
        let seq = self.journal_renaming(st.as_deref(), dirty.as_deref_mut(), &from, &to, &op)?;
        if let Some(v) = &over {
            // What the name held: no name leads to it any more, as after an unlink.
            self.forget_object(v.id, p, newname);
        }
        self.ns.prov.hide(p.id(), name);
        self.ns.prov.rename(id, p.id(), newname);
        self.ns.made_name(p.id(), newname);
        inode.moved_to(p.clone(), newname);
        drop(dirty);
        drop(_w);
        let now = tierfs_store::TimeSpec::now();
        self.dir_changed(p.id(), |a| {
            a.mtime = now;
            a.ctime = now;
        });
        self.ns.prov.update_attr(id, |a| a.ctime = now);
        self.enqueue(
            q,
            Job::Moved {
                seq,
                inode,
                parent: p.clone(),
                from: name.to_owned(),
                to: newname.to_owned(),
                over,
                at: Instant::now(),
            },
        );
        Some(())
    }
}

/// A pending MOVE (`from` to `to`, one directory) on the store: false if neither name
/// holds our object the way the move leaves it (someone else's at `to`, or ours gone): its
/// data then goes to `lost/`, never into theirs. A MOVE OVER (`over`: what `to` held,
/// `ns_replace`) renames over `to` if it still holds that object (or nothing).
pub(super) fn replay_move<S: Store>(
    store: &St<S>,
    from: &[u8],
    to: &[u8],
    reused: bool,
    over: Option<super::ns_record::Replaced>,
) -> std::result::Result<bool, Errno> {
    let (dir, fname) = super::ns_path::split(from);
    let tname = super::ns_path::split(to).1;
    let pnode = match super::ns_path::open_by_path(store, dir) {
        Ok((n, _)) => n,
        Err(e) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => return Ok(false),
        Err(e) => return Err(e),
    };
    let (f, t) = (OsStr::from_bytes(fname), OsStr::from_bytes(tname));
    let holds = |n: &OsStr| match store.lookup(&pnode, n) {
        Ok((_, a)) => Ok((a.kind != FileKind::Dir).then_some(a)),
        Err(e) if e == Errno::ENOENT => Ok(None),
        Err(e) => Err(e),
    };
    let replaced = |a: &tierfs_store::Attr| {
        over.is_some_and(|(kind, id, size)| super::ns_remove::same_object(a, kind, id, size))
    };
    let why = match (holds(f)?, holds(t)?) {
        (Some(_), None) => return store.rename(&pnode, f, &pnode, t, 0).map(|()| true),
        // What the application replaced, still there: replaced now.
        (Some(_), Some(a)) if replaced(&a) => {
            return store.rename(&pnode, f, &pnode, t, 0).map(|()| true)
        }
        // Applied before the crash.
        (None, Some(_)) => return Ok(true),
        (Some(_), Some(_)) if reused => return Ok(true),
        (Some(_), Some(_)) => "the new name holds another file",
        (None, None) => "neither name is there",
    };
    tracing::error!(
        "write-back replay: {} could not be renamed to {}: {why}; its data is kept under lost/",
        String::from_utf8_lossy(from),
        String::from_utf8_lossy(to)
    );
    Ok(false)
}
