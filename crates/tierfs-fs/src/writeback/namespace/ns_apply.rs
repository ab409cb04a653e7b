//! Applying one deferred namespace operation to the store (see `ns`, which runs a group of
//! them, several at once): a create, mkdir or symlink made with the setattrs folded into it
//! (`ns_fold`), a setattr, a withdrawn create or a rewritten one (nothing to do); what it
//! made, for `ns` to publish once the group is durable; and a refusal for good (a conflict).

use super::ns_fold::FoldOut;
use super::ns_queue::Job;
use super::ns_record::is_special;
use super::Writeback;
use crate::identity::Ident;
use crate::inode::Inode;
use crate::shared::{Node, St};
use parking_lot::Mutex;
use std::ffi::OsStr;
use std::sync::atomic::{Ordering::Acquire, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tierfs_store::{Errno, FileKind, Result, Store};
/// Create handles the namespace flusher keeps for the data flusher at most (each is an open
/// descriptor; see `apply`).
const HELD_MAX: usize = 256;

use super::applying::{transient, Applying, Made};

impl<S: Store> Writeback<S> {
    /// [`Self::apply`], its failure logged and counted: false if it failed.
    pub(super) fn apply_logged(
        &self,
        job: &Job<S>,
        how: &FoldOut,
        state: &Mutex<Applying<S>>,
    ) -> bool {
        match self.apply(job, how, state) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "write-back: a namespace operation failed ({e}); kept in the journal, will retry"
                );
                self.c.ns_errors.fetch_add(1, Relaxed);
                self.ns_failed(e);
                false
            }
        }
    }

    pub(super) fn parent_node(
        &self,
        parent: &Arc<Inode<St<S>>>,
        state: &Mutex<Applying<S>>,
    ) -> Result<Node<S>> {
        let pid = parent.id();
        let made = state
            .lock()
            .made
            .iter()
            .rev()
            .find(|(id, _)| *id == pid)
            .map(|(_, m)| m.node.clone());
        match made {
            Some(n) => Ok(n),
            None => self.ns.node(parent),
        }
    }

    /// Applies one operation. Err: the store may do it later (it is gone, full, failing;
    /// see `transient`): the group stops there and the rest waits. A refusal for good is
    /// Ok (the object is refused, see `refuse`). Runs beside the other operations of its
    /// level (see `apply_by_level`): `state` is locked only between store requests.
    fn apply(
        &self,
        job: &Job<S>,
        how: &FoldOut,
        state: &Mutex<Applying<S>>,
    ) -> std::result::Result<(), Errno> {
        match job {
            Job::Create {
                inode,
                parent,
                name,
                kind,
                owner,
                target,
                rdev,
                ..
            } => {
                // With the setattrs after it folded in (`ns_fold`).
                let FoldOut::Create { mode } = how else {
                    unreachable!("a create's plan is a create")
                };
                let prov = inode.id();
                // Made (or refused) by an earlier try of this group, whose directory sync
                // failed: its directory is synced again.
                {
                    let mut st = state.lock();
                    let again = st
                        .made
                        .iter()
                        .find(|(id, _)| *id == prov)
                        .map(|(_, m)| (m.parent.id(), m.dir.clone()));
                    if let Some((pid, dir)) = again {
                        st.sync_dir(pid, dir);
                        return Ok(());
                    }
                }
                if self.ns.prov.failure(prov).is_some() {
                    return Ok(());
                }
                let pnode = match self.parent_node(parent, state) {
                    Ok(n) => n,
                    Err(e) if transient(e) => return Err(e),
                    Err(e) => {
                        self.refuse(prov, name, e);
                        return Ok(());
                    }
                };
                let r = match (kind, target) {
                    (FileKind::Dir, _) => self.sh.store.mkdir(&pnode, name, *mode, *owner),
                    (FileKind::Symlink, Some(t)) => self.sh.store.symlink(&pnode, name, t, *owner),
                    (FileKind::Symlink, None) => Err(Errno(libc::EINVAL)),
                    (k, _) if is_special(*k) => {
                        self.sh.store.mknod(&pnode, name, *mode, *rdev, *owner)
                    }
                    _ => self
                        .sh
                        .store
                        .create(
                            &pnode,
                            name,
                            *mode,
                            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                            *owner,
                        )
                        .map(|(node, attr, h)| {
                            // The data flusher writes with the create's handle: one open
                            // less, and one that works after a chmod to read-only. Each is
                            // an open descriptor until that flush: past `HELD_MAX` (a
                            // backlog of creates ahead of the data flushes, 20,000 in the
                            // mixed benchmark, where the daemon ran out of descriptors)
                            // the data flusher opens the file itself, unless only this
                            // handle may write it (made read-only, and we are not root).
                            if let Some(st) = &inode.file {
                                let only_way = !self.ns.as_root() && *mode & 0o200 == 0;
                                let mut held = self.held.lock();
                                if st.has_dirty.load(Acquire) && (only_way || held.len() < HELD_MAX)
                                {
                                    held.insert(st.journal_key, h);
                                }
                            }
                            (node, attr)
                        }),
                };
                tracing::debug!(
                    "namespace flusher: create {name:?} (seq {}) in inode {}: {:?}",
                    job.seq(),
                    parent.ino,
                    r.as_ref().map(|(_, a)| (a.dev, a.ino)).map_err(|e| *e)
                );
                match r {
                    Ok((node, attr)) => {
                        let mut st = state.lock();
                        st.sync_dir(parent.id(), pnode.clone());
                        st.made.push((
                            prov,
                            Made {
                                inode: inode.clone(),
                                parent: parent.clone(),
                                name: name.clone(),
                                node,
                                attr,
                                dir: pnode,
                                alias: None,
                            },
                        ));
                        self.c.ns_applied.fetch_add(1, Relaxed);
                        Ok(())
                    }
                    Err(e) if transient(e) => Err(e),
                    Err(e) => {
                        self.refuse(prov, name, e);
                        Ok(())
                    }
                }
            }
            Job::Drop { inode, .. } => {
                // Never made: nothing for the store to do, nor anything left to wait for it.
                self.ns.prov.forget_failure(inode.id());
                self.c.ns_applied.fetch_add(1, Relaxed);
                Ok(())
            }
            Job::Renamed { .. } => {
                // Made under its new name: nothing for the store to do.
                self.c.ns_applied.fetch_add(1, Relaxed);
                Ok(())
            }
            Job::Moved {
                inode,
                parent,
                from,
                to,
                over,
                ..
            } => self.apply_move(inode, parent, from, to, over.as_ref(), state),
            Job::Linked {
                inode,
                parent,
                alias,
                ..
            } => self.apply_link(inode, parent, alias, state),
            Job::Removed {
                seq,
                inode,
                parent,
                name,
                kind,
                id,
                size,
                ..
            } => self.apply_remove(*seq, inode, parent, name, *kind, *id, *size, state),
            Job::SetAttr { inode, .. } => {
                let FoldOut::SetAttr(rest) = how else {
                    unreachable!("a setattr's plan is a setattr")
                };
                let Some(set) = rest else {
                    // Folded into its create, or done by the data flush (`ns_fold`).
                    self.c.ns_applied.fetch_add(1, Relaxed);
                    return Ok(());
                };
                let id = inode.id();
                let pending = state
                    .lock()
                    .made
                    .iter()
                    .rev()
                    .find(|(p, _)| *p == id)
                    .map(|(_, m)| m.node.clone());
                let r = match pending {
                    Some(node) => self.sh.store.setattr(&node, None, set).map(|a| {
                        let mut st = state.lock();
                        if let Some((_, m)) = st.made.iter_mut().rev().find(|(p, _)| *p == id) {
                            m.attr = a;
                        }
                    }),
                    None => match self.ns.node(inode) {
                        Ok(node) => {
                            // As a setattr done by the application (`data::open`): a data
                            // flush's attributes, asked before this change, do not replace
                            // what it answers.
                            let _w = inode.file.as_ref().map(|st| st.rw.write());
                            let _own = inode.file.as_ref().map(|st| st.own_change());
                            if set.size.is_some() && !self.truncate_still_pending(inode) {
                                // Done by a data flush after this job's attempt was refused
                                // (`ns_chattr`); a later truncate is a job of its own.
                                self.c.ns_applied.fetch_add(1, Relaxed);
                                return Ok(());
                            }
                            self.sh.store.setattr(&node, None, set).map(|a| {
                                self.ns.meta.put_attr(&a, Instant::now());
                                match &inode.file {
                                    Some(st) if set.size.is_some() => self.truncate_applied(st, &a),
                                    Some(st) => st.set_after_own_write(st.version().gen, &a),
                                    None => {}
                                }
                            })
                        }
                        Err(e) => Err(e),
                    },
                };
                match r {
                    Ok(()) => {
                        self.c.ns_applied.fetch_add(1, Relaxed);
                        Ok(())
                    }
                    Err(e) if transient(e) => Err(e),
                    Err(e) => {
                        // The object is gone (refused, or removed behind our back): nothing
                        // to set.
                        tracing::warn!(
                            "write-back: a deferred setattr of {:?} was not applied: {e}",
                            inode.ino
                        );
                        self.c.ns_conflicts.fetch_add(1, Relaxed);
                        if set.size.is_some() {
                            // What was written after the truncate must not land on the old
                            // contents: kept under `lost/` (writers held off meanwhile).
                            let _w = inode.file.as_ref().map(|st| st.rw.write());
                            if self.truncate_still_pending(inode) {
                                if let Err(er) = self.truncate_refused(inode, e) {
                                    tracing::error!("write-back: {er}");
                                }
                            }
                        }
                        Ok(())
                    }
                }
            }
        }
    }

    /// A queued move (`ns_move`): the object the flusher made under `from` (kept
    /// unpublished while the move is queued) is renamed to `to` on the store, and what is
    /// published later is what the new name holds. Err: retry later (transient).
    fn apply_move(
        &self,
        inode: &Arc<Inode<St<S>>>,
        parent: &Arc<Inode<St<S>>>,
        from: &OsStr,
        to: &OsStr,
        over: Option<&super::ns_queue::Victim>,
        state: &Mutex<Applying<S>>,
    ) -> std::result::Result<(), Errno> {
        let id = inode.id();
        let gone = |why: String| {
            tracing::warn!("write-back: {from:?} was not renamed to {to:?} on the store: {why}");
            self.c.ns_conflicts.fetch_add(1, Relaxed);
            self.ns.prov.unhide(parent.id(), from);
            // It stays where the store has it.
            inode.moved_to(parent.clone(), from);
        };
        if self.ns.prov.failure(id).is_some() {
            // Never made (refused): its data goes to `lost/`.
            self.ns.prov.unhide(parent.id(), from);
            self.c.ns_applied.fetch_add(1, Relaxed);
            return Ok(());
        }
        if !state.lock().made.iter().any(|(p, _)| *p == id) {
            gone("it is not among the objects made and not published".into());
            return Ok(());
        }
        let pnode = self.parent_node(parent, state)?;
        let renamed = match over {
            Some(v) => self.replace_on_store(inode, &pnode, from, to, v, state)?,
            None => self.rename_to_free(&pnode, from, to)?,
        };
        if let Err(why) = renamed {
            gone(why);
            return Ok(());
        }
        // The object as the new name has it (with path identities, another identity).
        let (node, attr) = self.sh.store.lookup(&pnode, to)?;
        {
            let mut st = state.lock();
            if let Some((_, m)) = st.made.iter_mut().rev().find(|(p, _)| *p == id) {
                m.name = to.to_owned();
                m.node = node;
                m.attr = attr;
            }
            st.sync_dir(parent.id(), pnode);
        }
        // A listing of the store taken while the old name was there must not bring it back
        // (out of the cached listing before it is shown again).
        self.ns.meta.remove_name(parent.id(), from);
        self.ns.listed_changed(parent);
        self.ns.prov.unhide(parent.id(), from);
        self.c.ns_applied.fetch_add(1, Relaxed);
        Ok(())
    }

    /// A move's rename on the store, to a name that was free when the application renamed:
    /// someone else's object there since is not replaced silently. Ok(Err(why)): not
    /// renamed. Err: retry later (transient).
    fn rename_to_free(
        &self,
        pnode: &Node<S>,
        from: &OsStr,
        to: &OsStr,
    ) -> std::result::Result<std::result::Result<(), String>, Errno> {
        match self
            .sh
            .store
            .rename(pnode, from, pnode, to, libc::RENAME_NOREPLACE)
        {
            Ok(()) => Ok(Ok(())),
            Err(e) if transient(e) => Err(e),
            // Applied before (a retry of the group): the old name is gone, the new one there.
            Err(e) if e == Errno::ENOENT && self.sh.store.lookup(pnode, to).is_ok() => Ok(Ok(())),
            // The store does not know RENAME_NOREPLACE.
            Err(e) if e == Errno::EINVAL => match self.sh.store.lookup(pnode, to) {
                Err(l) if l == Errno::ENOENT => {
                    match self.sh.store.rename(pnode, from, pnode, to, 0) {
                        Ok(()) => Ok(Ok(())),
                        Err(e) if transient(e) => Err(e),
                        Err(e) => Ok(Err(e.to_string())),
                    }
                }
                Err(l) if transient(l) => Err(l),
                _ => Ok(Err(format!("{to:?} was made on the store by someone else"))),
            },
            Err(e) => Ok(Err(e.to_string())),
        }
    }

    /// The store refused to make provisional object `prov` (someone made the name first,
    /// or its directory went away): never put over theirs. Its data goes to the lost
    /// directory when the data flusher comes to it (`flush_refused`).
    fn refuse(&self, prov: Ident, name: &OsStr, e: Errno) {
        tracing::error!(
            "write-back: {:?} could not be created on the store ({e}); its data, if any, is kept under {}/lost/",
            name,
            self.dir.display()
        );
        self.c.ns_conflicts.fetch_add(1, Relaxed);
        self.ns.prov.refused(prov, e);
    }
}
