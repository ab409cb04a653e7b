//! A deferred rename (see `ns`): a file or symlink that write-back made, whose create the
//! namespace flusher has not taken yet, renamed to a free name, in its directory or another.
//! This is how editors, compilers and package tools save a file (`x.tmp` written, then
//! renamed over to `x`; a build's output moved from a scratch directory), and each such
//! rename used to wait for every name deferred before it to reach the store.
//!
//! The queued create is rewritten to make the new name, so the store never has the old one
//! (nothing to hide in its listings meanwhile). In another directory, that directory must be
//! on the store before the create, and before the create's record at replay: it is a
//! directory of the store, or one write-back made whose mkdir comes earlier in the journal.
//! For replay, three things are journaled, in this order, while the file's writers are held
//! off:
//!
//! 1. if the file has dirty data, an empty DATA record under the new path: replay names a
//!    file's writes by the path of its last record, and after the rename's DONE the records
//!    written before it (under the old path) may still be pending;
//! 2. the RENAME record (with the seq of the create), which replay applies to the file its
//!    CREATE record made under the old name, and which names the file's data for replay
//!    while it is pending;
//! 3. a no-op job in the queue, so the DONE moves over the record once the create is applied.
//!
//! A crash between 1 and 2 leaves a journal whose CREATE (still pending: its DONE could only
//! come later) names the old path, which replay then gives the data (`ns_replay`).

use super::ns_defer::{claim_withdrawal, give_back};
use super::ns_queue::{untaken_create, Job};
use super::ns_record::NsOp;
use super::Writeback;
use crate::inode::Inode;
use crate::namespace::{is_provisional, ProvLookup};
use crate::shared::St;
use std::ffi::OsStr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::journal::{FileRef, Record};
use tierfs_store::{FileKind, Store};

impl<S: Store> Writeback<S> {
    /// Journals renaming record `op` of a file whose writers the caller holds off (`dirty`
    /// is its dirty state, locked): if it has dirty data, first an empty DATA record under
    /// `to`, as replay names a file's writes by the path of its last record (see the module
    /// comment). None: not journaled, and its data is named by `from` again (the next
    /// write journals it so, if this fails too; the rename done on the store then flushes
    /// the data first).
    pub(super) fn journal_renaming(
        &self,
        st: Option<&crate::file_state::FileState>,
        mut dirty: Option<&mut Option<crate::dirty::Dirty>>,
        from: &[u8],
        to: &[u8],
        op: &NsOp,
    ) -> Option<u64> {
        let marker = |path: &[u8]| -> Option<u64> {
            let st = st?;
            let file = FileRef {
                dev: st.journal_key.0,
                ino: st.journal_key.1,
                path: path.to_vec(),
            };
            self.journal.append_data(&file, 0, &[]).ok()
        };
        if let Some(Some(d)) = dirty.as_deref_mut() {
            let m = marker(to)?;
            d.path = to.to_vec();
            d.max_seq = d.max_seq.max(m);
        }
        match self.journal.append(Record::Ns {
            payload: &op.encode(),
        }) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::debug!("write-back: {op:?} not journaled ({e}): done on the store");
                if let Some(Some(d)) = dirty {
                    if let Some(m) = marker(from) {
                        d.max_seq = d.max_seq.max(m);
                    }
                    d.path = from.to_vec();
                }
                None
            }
        }
    }

    /// Renames provisional object `name` of directory `p` to `newname` in directory `newp`
    /// without the store, or None: not such a rename (it is done on the store, after
    /// [`Writeback::drain_ns`]). Only when `flags` asks at most RENAME_NOREPLACE, and the new
    /// name is free (what a deferred create asks of a name) or holds a file or symlink that
    /// could be unlinked without the store (`unlink_deferred`: not open, its create still
    /// queued, not under FUSE no-open), which the same record then replaces.
    pub(crate) fn rename_deferred(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        newp: &Arc<Inode<St<S>>>,
        newname: &OsStr,
        flags: u32,
        no_open: bool,
    ) -> Option<()> {
        let moves = p.id() != newp.id();
        if !self.defers_namespace()
            || flags & !libc::RENAME_NOREPLACE != 0
            || newname.len() > libc::NAME_MAX as usize
            || (newname == name && !moves)
            || newp.kind != FileKind::Dir
        {
            return None;
        }
        let not = |why: &str| {
            tracing::debug!(
                "write-back: rename of {name:?} to {newname:?} done on the store: {why}"
            );
            None
        };
        let ProvLookup::Found(inode, attr) = self.ns.prov.lookup(p.id(), name) else {
            return not("not a new object");
        };
        if attr.kind == FileKind::Dir {
            return not("a directory");
        }
        if self.ns.prov.alias(inode.id()).is_some() {
            return not("it has two names (a deferred link)");
        }
        let mut hidden_target = false;
        let target = match self.ns.prov.lookup(newp.id(), newname) {
            ProvLookup::Found(t, ta) => {
                if flags & libc::RENAME_NOREPLACE != 0
                    || no_open
                    || ta.kind == FileKind::Dir
                    || t.id() == inode.id()
                    || self.ns.prov.alias(t.id()).is_some()
                {
                    return not("the new name holds a new object that cannot go");
                }
                Some(t)
            }
            ProvLookup::Absent => None,
            // The store has the name until a queued move frees it: free for a move queued
            // after it, not for a create rewritten in place, which may come before it.
            ProvLookup::Hidden => {
                hidden_target = true;
                None
            }
            ProvLookup::NotHere => {
                if is_provisional(newp.id()) || !self.ns.name_free(newp, newname) {
                    // A file of the store there, in the same directory: `rsync`'s update,
                    // an editor's save (`ns_replace`).
                    if !moves && flags == 0 && !no_open {
                        return self.replace_deferred(inode, p, name, newname).or_else(|| {
                            not("the new name holds an object of the store that cannot go")
                        });
                    }
                    return not("the new name is not known to be free");
                }
                None
            }
        };
        // The new directory as the application sees it (its shadow's base if it has none).
        let newp_attr = if moves {
            let cached = || self.ns.meta.attr(newp.id()).map(|(a, _)| a);
            Some(self.deferred_dir_attr(newp.id()).or_else(cached)?)
        } else {
            None
        };
        let id = inode.id();
        let from = self.backing_path(&inode)?;
        let to = self.backing_path_in(newp, newname)?;
        let q = self.nsq.q.lock();
        // Its create must still be queued: once the flusher has it, it may be on the store
        // under the old name, and a rename in its directory to a free name is queued for the
        // store instead (`ns_move`).
        let Some(create) = untaken_create(&q, id) else {
            if moves || target.is_some() {
                return not("its create is taken, and it moves away or over a name");
            }
            return self.move_deferred(q, inode, p, name, newname);
        };
        if hidden_target {
            return not("the new name is one a queued move leaves");
        }
        let mut q = q;
        if let (
            Some(a),
            Job::Create {
                owner, new_owner, ..
            },
        ) = (newp_attr, &q[create])
        {
            // Made in the new directory, the object must get the group it got in the old
            // one: the store gives what it makes in a setgid directory that directory's
            // group, elsewhere the creator's.
            let gid = if a.perm as u32 & libc::S_ISGID != 0 {
                a.gid
            } else {
                // SAFETY: no preconditions.
                owner.map_or_else(|| unsafe { libc::getegid() }, |o| o.1)
            };
            if gid != new_owner.1 {
                return None;
            }
        }
        // A new directory write-back made must be made first: its mkdir earlier in the
        // queue (and the journal), or done. (One made after the file comes after it.)
        if moves
            && (self.ns.prov.failure(newp.id()).is_some()
                || q.iter()
                    .skip(create)
                    .any(|j| matches!(j, Job::Create { inode: d, .. } if d.id() == newp.id())))
        {
            return None;
        }
        // What the new name holds goes as by an unlink (`unlink_deferred`), given back if
        // the rename is not journaled.
        let over = match target {
            Some(t) => {
                let (tparent, treserved) = claim_withdrawal(&q, &t)?;
                Some((t, tparent, treserved))
            }
            None => None,
        };
        let reopen = || {
            if let Some((t, ..)) = &over {
                give_back(t);
            }
        };
        // Writers of the file wait: a write between the records below would be journaled
        // under a path that is not the file's at that point of the journal.
        let st = inode.file.clone();
        let _w = st.as_ref().map(|st| st.rw.write());
        let mut dirty = st.as_ref().map(|st| st.dirty.lock());
        let op = NsOp::Rename {
            from: from.clone(),
            to: to.clone(),
            prov: id.1,
            replaced: over.as_ref().map(|(t, ..)| t.id().1),
        };
        let Some(seq) = self.journal_renaming(st.as_deref(), dirty.as_deref_mut(), &from, &to, &op)
        else {
            reopen();
            return None;
        };
        if let Job::Create {
            name: n, parent, ..
        } = &mut q[create]
        {
            *n = newname.to_owned();
            *parent = newp.clone();
        }
        if let Some(a) = newp_attr {
            // The new directory now has a create queued in it (its shadow shows the
            // application's view until it is applied); the old one keeps its count until
            // the rename's job is applied, after the create.
            let mut dirs = self.nsq.dirs.lock();
            dirs.entry(newp.id()).or_insert((0, a)).0 += 1;
            self.nsq.dirs_shadowed.store(true, Relaxed);
        }
        inode.moved_to(newp.clone(), newname);
        drop(dirty);
        drop(_w);
        if let Some((t, tparent, treserved)) = over {
            // Withdrawn as by an unlink (`unlink_deferred`), under the same record.
            self.withdraw(&mut q, &t);
            self.c.ns_dropped.fetch_add(1, Relaxed);
            q.push_back(Job::Drop {
                seq,
                inode: t,
                parent: tparent,
                reserved: treserved,
                at: Instant::now(),
            });
        }
        self.ns.prov.rename(id, newp.id(), newname);
        self.ns.made_name(newp.id(), newname);
        // The directories and the object as the application now sees them: times moved.
        let now = tierfs_store::TimeSpec::now();
        let touch = |a: &mut tierfs_store::Attr| {
            a.mtime = now;
            a.ctime = now;
        };
        self.dir_changed(p.id(), touch);
        if moves {
            self.dir_changed(newp.id(), touch);
        }
        self.ns.prov.update_attr(id, |a| a.ctime = now);
        self.enqueue(
            q,
            Job::Renamed {
                seq,
                inode,
                from: moves.then(|| p.clone()),
                at: Instant::now(),
            },
        );
        Some(())
    }
}
