//! A deferred link (see `ns`): a file write-back made, whose create the namespace flusher
//! has not taken yet, hard-linked to a free name in its directory. This is how git stores
//! every object (`tmp_obj_XXXXXX` written, `link`ed to its hash, the temporary name unlinked)
//! and how it finalizes packs; each such link used to wait for every name deferred before
//! it, the file's data and its sync (`git add` of 100 files over sshfs: 0.65x sshfs alone).
//!
//! The queued create is rewritten to make the new name, as a deferred rename does
//! (`ns_rename`), and the old name stays the object's *alias*: answered by the provisional
//! table, and linked to the object on the store after its create (`Job::Linked`). If the
//! alias is unlinked before the flusher takes that job, as git does at once, the job is
//! withdrawn: the store sees one create of the final name and its data, nothing else.
//!
//! Journaled for replay like a rename: an empty DATA record under the new path if the file
//! has dirty data (replay names a file's writes by the path of its last record), then the
//! LINK record, which replay applies as a rename of the pending create followed by a link of
//! the old name (`replay_link`); an unlink of the alias is an UNALIAS record, which tells
//! replay not to make that link.
//!
//! Kept narrow: one alias per object, in the same directory, of a regular file; anything
//! else (a link to another directory, of an object of the store, a rename or unlink of the
//! new name while the alias is queued) is done on the store after the deferred operations
//! before it, as before.

use super::applying::{transient, Applying};
use super::ns_queue::{untaken_create, Job};
use super::ns_record::NsOp;
use super::Writeback;
use crate::inode::Inode;
use crate::meta::ident;
use crate::namespace::{is_provisional, ProvLookup};
use crate::shared::St;
use parking_lot::Mutex;
use std::ffi::OsStr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::journal::Record;
use tierfs_store::{Attr, Errno, FileKind, Result, Store, TimeSpec};

impl<S: Store> Writeback<S> {
    /// Links provisional file `inode` as `newname` in directory `newp` without the store
    /// (see the module comment): its attributes then. None: not such a link (it is done on
    /// the store, after [`Writeback::drain_ns`]). Err(EEXIST): `newname` is a provisional
    /// object.
    pub(crate) fn link_deferred(
        &self,
        inode: &Arc<Inode<St<S>>>,
        newp: &Arc<Inode<St<S>>>,
        newname: &OsStr,
    ) -> Result<Option<Attr>> {
        let id = inode.id();
        if !self.defers_namespace() || !is_provisional(id) || inode.kind != FileKind::File {
            return Ok(None);
        }
        match self.ns.prov.lookup(newp.id(), newname) {
            ProvLookup::Found(..) => return Err(Errno(libc::EEXIST)),
            ProvLookup::Absent => {}
            // The store holds the name until a queued move or removal is applied.
            ProvLookup::Hidden => return Ok(None),
            ProvLookup::NotHere => {
                if is_provisional(newp.id()) || !self.ns.name_free(newp, newname) {
                    return Ok(None);
                }
            }
        }
        if newname.len() > libc::NAME_MAX as usize
            || self.ns.prov.alias(id).is_some()
            || self.ns.prov.failure(id).is_some()
        {
            return Ok(None);
        }
        let Some((parent, name)) = inode.origin.lock().clone() else {
            return Ok(None);
        };
        if parent.id() != newp.id() {
            return Ok(None);
        }
        let (Some(from), Some(to)) = (
            self.backing_path(inode),
            self.backing_path_in(newp, newname),
        ) else {
            return Ok(None);
        };
        let mut q = self.nsq.q.lock();
        // Its create must still be queued and never taken: once the flusher has it, the
        // store may have the object under the old name.
        let Some(create) = untaken_create(&q, id) else {
            return Ok(None);
        };
        // Writers of the file wait, as for a deferred rename (`ns_rename`).
        let st = inode.file.clone();
        let _w = st.as_ref().map(|st| st.rw.write());
        let mut dirty = st.as_ref().map(|st| st.dirty.lock());
        let op = NsOp::Link {
            from: from.clone(),
            to: to.clone(),
            prov: id.1,
        };
        let Some(seq) = self.journal_renaming(st.as_deref(), dirty.as_deref_mut(), &from, &to, &op)
        else {
            return Ok(None);
        };
        if let Job::Create { name: n, .. } = &mut q[create] {
            *n = newname.to_owned();
        }
        inode.moved_to(newp.clone(), newname);
        drop(dirty);
        drop(_w);
        let now = TimeSpec::now();
        let attr = self.ns.prov.link(id, newname, now);
        self.ns.made_name(newp.id(), newname);
        self.dir_changed(newp.id(), |a| {
            a.mtime = now;
            a.ctime = now;
        });
        self.enqueue(
            q,
            Job::Linked {
                seq,
                inode: inode.clone(),
                parent: newp.clone(),
                alias: name,
                tried: false,
                at: Instant::now(),
            },
        );
        self.c.ns_linked.fetch_add(1, Relaxed);
        // (None only if the object left the table, which it cannot while its create is
        // queued: the link is journaled and applied all the same.)
        Ok(attr)
    }

    /// An unlink of the alias a deferred link left (`name` in `p`) before the flusher took
    /// the link: the link is withdrawn, and the store never gets the name. None: not such an
    /// unlink.
    pub(crate) fn unalias_deferred(&self, p: &Arc<Inode<St<S>>>, name: &OsStr) -> Option<()> {
        let (inode, _) = self.deferred_object(p, name)?;
        let id = inode.id();
        if self.ns.prov.alias(id).as_deref() != Some(name) {
            return None;
        }
        let path = self.backing_path_in(p, name)?;
        let mut q = self.nsq.q.lock();
        let k = q.iter().position(
            |j| matches!(j, Job::Linked { inode: i, tried: false, .. } if i.id() == id),
        )?;
        let op = NsOp::Unalias {
            path,
            link: q[k].seq(),
            prov: id.1,
        };
        let seq = self
            .journal
            .append(Record::Ns {
                payload: &op.encode(),
            })
            .ok()?;
        // The link's job has nothing left for the store: the no-op job of a record whose
        // operation was folded away, which still keeps the object unpublished.
        q[k] = Job::Renamed {
            seq: q[k].seq(),
            inode: inode.clone(),
            from: None,
            at: q[k].at(),
        };
        let now = TimeSpec::now();
        self.ns.prov.unalias(id, now);
        self.dir_changed(p.id(), |a| {
            a.mtime = now;
            a.ctime = now;
        });
        self.c.ns_dropped.fetch_add(1, Relaxed);
        self.enqueue(
            q,
            Job::Renamed {
                seq,
                inode,
                from: None,
                at: Instant::now(),
            },
        );
        Some(())
    }

    /// Applies a queued link: `alias` in `parent` linked on the store to the object its
    /// create made (kept unpublished while this was queued). Err: retry later (transient).
    pub(super) fn apply_link(
        &self,
        inode: &Arc<Inode<St<S>>>,
        parent: &Arc<Inode<St<S>>>,
        alias: &OsStr,
        state: &Mutex<Applying<S>>,
    ) -> std::result::Result<(), Errno> {
        let id = inode.id();
        let applied = || {
            self.c.ns_applied.fetch_add(1, Relaxed);
        };
        let gone = |why: String| {
            tracing::warn!("write-back: {alias:?} was not linked on the store: {why}");
            self.c.ns_conflicts.fetch_add(1, Relaxed);
            applied();
        };
        if self.ns.prov.failure(id).is_some() {
            // Never made (refused): its data goes to `lost/`, and no name to link.
            applied();
            return Ok(());
        }
        let made = state
            .lock()
            .made
            .iter()
            .rev()
            .find(|(p, _)| *p == id)
            .map(|(_, m)| (m.node.clone(), m.attr));
        let Some((node, mattr)) = made else {
            gone("it is not among the objects made and not published".into());
            return Ok(());
        };
        let pnode = self.parent_node(parent, state)?;
        let attr = match self.sh.store.link(&node, &pnode, alias) {
            Ok(a) => a,
            Err(e) if transient(e) => return Err(e),
            // Applied before (a retry of the group whose directory sync failed): the name
            // holds our file (the same identity, or, with path identities, a file with
            // another link).
            Err(e) if e == Errno(libc::EEXIST) => match self.sh.store.lookup(&pnode, alias) {
                Ok((_, a)) if holds_our_file(&a, &mattr) => a,
                Err(l) if transient(l) => return Err(l),
                _ => {
                    gone("the name was made on the store by someone else".into());
                    return Ok(());
                }
            },
            Err(e) => {
                gone(e.to_string());
                return Ok(());
            }
        };
        {
            let mut st = state.lock();
            if let Some((_, m)) = st.made.iter_mut().rev().find(|(p, _)| *p == id) {
                if ident(&attr) == ident(&m.attr) {
                    m.attr = attr;
                } else {
                    // With path identities the new name is an object of its own.
                    m.attr.nlink += 1;
                    m.attr.ctime = attr.ctime;
                }
                m.alias = Some((alias.to_owned(), attr));
            }
            st.sync_dir(parent.id(), pnode);
        }
        applied();
        Ok(())
    }
}

/// Whether a name the link found taken (`found`) holds our file (`ours`): the same identity,
/// or, with path identities (each name its own), a file with another link.
fn holds_our_file(found: &Attr, ours: &Attr) -> bool {
    ident(found) == ident(ours) || (found.kind == FileKind::File && found.nlink >= 2)
}

/// Replays a pending LINK whose alias was not withdrawn: `from` linked to `to` (made by the
/// pending CREATE under its last name, or by the flusher before the crash). Ok(None): done,
/// or done before the crash; Ok(Some(why)): not done, and why (the alias is a name the
/// application had, never data: nothing is lost).
pub(super) fn replay_link<S: Store>(
    store: &St<S>,
    from: &[u8],
    to: &[u8],
) -> std::result::Result<Option<&'static str>, Errno> {
    use std::os::unix::ffi::OsStrExt;
    let (dir, alias) = super::ns_path::split(from);
    let tname = super::ns_path::split(to).1;
    let pnode = match super::ns_path::open_by_path(store, dir) {
        Ok((n, _)) => n,
        Err(e) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => {
            return Ok(Some("its directory is gone"))
        }
        Err(e) => return Err(e),
    };
    let (alias, tname) = (OsStr::from_bytes(alias), OsStr::from_bytes(tname));
    let (node, tattr) = match store.lookup(&pnode, tname) {
        Ok(x) => x,
        Err(e) if e == Errno::ENOENT => return Ok(Some("the file it names is gone")),
        Err(e) => return Err(e),
    };
    if tattr.kind != FileKind::File {
        return Ok(Some("the name it links to is not a file"));
    }
    match store.link(&node, &pnode, alias) {
        Ok(_) => Ok(None),
        Err(e) if e == Errno(libc::EEXIST) => match store.lookup(&pnode, alias) {
            Ok((_, a)) if holds_our_file(&a, &tattr) => Ok(None),
            Ok(_) => Ok(Some("the name holds another object")),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}
