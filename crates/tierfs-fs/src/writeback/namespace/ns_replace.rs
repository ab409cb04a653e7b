//! A deferred replace (see `ns`): a file or symlink write-back made, renamed in its
//! directory over a file or symlink of the store. This is how `rsync` updates a file (it
//! writes `.name.XXXXXX`, sets its times and mode, and renames it over `name`), and how
//! editors, `dpkg`, `pip` and build tools save one: each such rename used to wait for every
//! operation deferred before it, then for the new file's create, data and sync on the store
//! (`rsync -a` of 200 changed files over real sshfs: 15.1 s, sshfs alone 13.8 s).
//!
//! It is a move (`ns_move`, the same MOVE record with the replaced object in it, op 11) whose
//! new name holds an object an unlink could remove without the store (`ns_remove`'s rules:
//! named in a fresh listing with one link, not open, no dirty data). That object loses its
//! name at once, as after an unlink; the new file takes it. On the store the rename is
//! applied in its turn, *after the new file's data*: the namespace flusher writes the file's
//! dirty data through the object it made under the old name and syncs it, then renames it
//! over the new name, so that whoever else reads the store sees the old file or the new one
//! whole, never an empty or half-written one (what the application relies on when it writes
//! a file aside and renames it into place). The runs it wrote stay dirty until the file is
//! published, so reads of it see them (the store has them under a name the file no longer
//! has), and the data flush after publication drops them without writing them again
//! (`Dirty::ahead`).
//!
//! The rename replaces only what the application replaced: if the name holds another
//! object by then (someone else's), theirs stays, ours is left under its old name on the
//! store, and the log says so (as for a move whose new name someone took). Replay applies
//! the record the same way (`ns_move::replay_move`). Its create comes in an earlier group
//! than the rename (`ns`): replay never finds the new file's data written under a CREATE
//! still pending.

use super::applying::{transient, Applying};
use super::ns_queue::Victim;
use super::ns_record::NsOp;
use super::ns_remove::{claim_unopened, same_object};
use super::Writeback;
use crate::inode::Inode;
use crate::shared::{Node, St};
use parking_lot::Mutex;
use std::ffi::OsStr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_store::{Errno, Store};

impl<S: Store> Writeback<S> {
    /// Renames provisional `inode`, `name` in directory `p`, over `newname`, a file or
    /// symlink of the store in the same directory (see the module comment). None: not done
    /// (the rename goes to the store, after [`Writeback::drain_ns`]). The caller checked the
    /// rename's flags (none), FUSE no-open (off) and that the object has one name.
    pub(super) fn replace_deferred(
        &self,
        inode: Arc<Inode<St<S>>>,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        newname: &OsStr,
    ) -> Option<()> {
        let id = inode.id();
        let (c, size, victim) = self.store_file_at(p, newname, true)?;
        let from = self.backing_path(&inode)?;
        let to = self.backing_path_in(p, newname)?;
        if !claim_unopened(&victim) {
            return None;
        }
        let give_back = || super::ns_defer::give_back(&victim);
        let q = self.nsq.q.lock();
        // Still provisional under that name, now that the queue is locked (publish holds
        // it): a replace queued for a published object would be acknowledged and never
        // applied.
        if !self.still_unpublished(p, name, id) {
            give_back();
            return None;
        }
        let over = Victim {
            kind: c.kind,
            id: c.id,
            size,
        };
        if self
            .queue_move(q, inode, p, (name, newname), (from, to), Some(over))
            .is_none()
        {
            give_back();
            return None;
        }
        self.c.ns_replaced.fetch_add(1, Relaxed);
        Some(())
    }

    /// The store's side of a queued replace of `to` by `inode`, made under `from` in the
    /// directory `pnode`: its data first, then the rename, only over what the application
    /// replaced (see the module comment). Ok(Err(why)): not renamed (someone else's object
    /// holds the name; ours stays under `from`). Err: retry later (transient).
    pub(super) fn replace_on_store(
        &self,
        inode: &Arc<Inode<St<S>>>,
        pnode: &Node<S>,
        from: &OsStr,
        to: &OsStr,
        victim: &Victim,
        state: &Mutex<Applying<S>>,
    ) -> std::result::Result<std::result::Result<(), String>, Errno> {
        let look = |n: &OsStr| match self.sh.store.lookup(pnode, n) {
            Ok((_, a)) => Ok(Some(a)),
            Err(e) if e == Errno::ENOENT => Ok(None),
            Err(e) => Err(e),
        };
        let soft = |e: Errno| {
            if transient(e) {
                Err(e)
            } else {
                Ok(Err(e.to_string()))
            }
        };
        let (ours, theirs) = match (look(from), look(to)) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(e), _) | (_, Err(e)) => return soft(e),
        };
        match (ours, theirs) {
            // Applied by an earlier try of this group.
            (None, Some(_)) => return Ok(Ok(())),
            (None, None) => return Ok(Err("neither name is there".into())),
            (Some(_), Some(a)) if !same_object(&a, victim.kind, victim.id, victim.size) => {
                return Ok(Err(format!(
                    "{to:?} holds another object than the one the application replaced \
                     (someone else's, left as it is); ours stays under {from:?}"
                )));
            }
            _ => {}
        }
        // Ours whole on the store before the name shows it.
        self.write_ahead(inode, state)?;
        match self.sh.store.rename(pnode, from, pnode, to, 0) {
            Ok(()) => Ok(Ok(())),
            Err(e) => soft(e),
        }
    }

    /// Writes the dirty data of `inode`, made by the namespace flusher and not published yet,
    /// through the object it made, and syncs it; the runs stay dirty (`Dirty::ahead`).
    fn write_ahead(
        &self,
        inode: &Arc<Inode<St<S>>>,
        state: &Mutex<Applying<S>>,
    ) -> std::result::Result<(), Errno> {
        let Some(st) = &inode.file else { return Ok(()) };
        match st.dirty.lock().as_mut() {
            Some(d) => d.written_ahead = true,
            None => return Ok(()),
        }
        let id = inode.id();
        let Some(node) = state
            .lock()
            .made
            .iter()
            .rev()
            .find(|(p, _)| *p == id)
            .map(|(_, m)| m.node.clone())
        else {
            return Ok(());
        };
        let h = self.flush_handle(st, &node)?;
        let chunk = self.cfg.chunk as usize;
        let mut written = Vec::new();
        let mut from = 0u64;
        let r = loop {
            let run = match st
                .dirty
                .lock()
                .as_ref()
                .and_then(|d| d.take_run(from, chunk))
            {
                Some(r) => r,
                None => break self.sh.store.fsync(&h, false),
            };
            let bufs: Vec<&[u8]> = run.pieces.iter().map(|b| &b[..]).collect();
            if let Err(e) = self.sh.store.write_vectored(&h, run.offset, &bufs) {
                break Err(e);
            }
            self.c.flush_writes.fetch_add(1, Relaxed);
            self.c.flushed_bytes.fetch_add(run.len, Relaxed);
            from = run.offset + run.len;
            written.push(run);
        };
        // The handle goes back to the data flusher, which syncs the file again and records
        // its DONE once it is published.
        self.held.lock().insert(st.journal_key, h);
        r?;
        if let Some(d) = st.dirty.lock().as_mut() {
            d.ahead = written;
        }
        Ok(())
    }
}

/// Replay of the CREATE of a file or symlink that a pending MOVE OVER renames over `to` (what
/// it held: `over`), made as `name` in the directory `pnode`: where the flusher had it before
/// the crash, if it had made it. The flusher writes such a file's data before the group that
/// made it is done, so `name` may hold it with data (not the empty file a CREATE's replay
/// takes for its own), or it may be under `to` already, renamed. Some(path): made before, at
/// `name` (the path `from`) or `to`; None: not made, to be created as any other. A regular
/// file at `name` is taken for ours: the application made the name with `O_EXCL` through
/// write-back when the store lacked it, and its data is all in the journal, replayed over it.
pub(super) fn replay_made<S: Store>(
    store: &St<S>,
    pnode: &Node<S>,
    name: &OsStr,
    kind: tierfs_store::FileKind,
    to: &[u8],
    over: super::ns_record::Replaced,
) -> std::result::Result<Option<Vec<u8>>, Errno> {
    use std::os::unix::ffi::OsStrExt;
    let look = |n: &OsStr| match store.lookup(pnode, n) {
        Ok((_, a)) => Ok(Some(a)),
        Err(e) if e == Errno::ENOENT => Ok(None),
        Err(e) => Err(e),
    };
    let tname = OsStr::from_bytes(super::ns_path::split(to).1);
    match look(name)? {
        Some(a) if a.kind == kind && kind == tierfs_store::FileKind::File => {
            let (dir, _) = super::ns_path::split(to);
            Ok(Some(super::ns_path::join(dir, name.as_bytes())))
        }
        Some(_) => Ok(None),
        // Renamed over `to` before the crash, if `to` no longer holds what it replaced.
        None => match look(tname)? {
            Some(a) if a.kind == kind && !same_object(&a, over.0, over.1, over.2) => {
                Ok(Some(to.to_vec()))
            }
            _ => Ok(None),
        },
    }
}

/// The pending MOVE OVERs by the seq of their object's CREATE: the name each renames the
/// object over, and what it held.
pub(super) fn pending_replaces(
    pending: &[tierfs_cache::journal::PendingNs],
) -> rustc_hash::FxHashMap<u64, (Vec<u8>, super::ns_record::Replaced)> {
    pending
        .iter()
        .filter_map(|p| match NsOp::decode(&p.payload).ok()? {
            NsOp::Move {
                to,
                prov,
                over: Some(v),
                ..
            } => Some((prov, (to, v))),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[path = "ns_replace_tests.rs"]
mod tests;
