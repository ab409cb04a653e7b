//! The entry points of write-back of namespace operations (see `ns`): a create, mkdir or
//! setattr made provisional and journaled, and the waits for the namespace flusher (before an
//! operation that is not deferred, an fsync, unmount).

use super::attr_shadow::AttrShadow;
use super::ns_queue::{Job, NewObject};
use super::ns_record::{is_special, NsOp};
use super::Writeback;
use crate::file_state::DROPPED;
use crate::identity::Ident;
use crate::inode::Inode;
use crate::namespace::{is_provisional, ProvLookup, Requester};
use crate::shared::St;
use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{
    Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_cache::journal::Record;
use tierfs_store::{Attr, Errno, FileKind, Result, SetAttr, Store};

/// The directory and reserved bytes of the create of `id` if it is queued and the flusher
/// never took it (once taken, even if put back, it may be on the store), and no move of the
/// object is queued after it (a replace: see `untaken_create`).
fn untried_create<S: Store>(q: &VecDeque<Job<S>>, id: Ident) -> Option<(Arc<Inode<St<S>>>, u64)> {
    if super::ns_queue::moves_queued(q, id) {
        return None;
    }
    q.iter().find_map(|j| match j {
        Job::Create {
            inode,
            parent,
            reserved,
            tried: false,
            ..
        } if inode.id() == id => Some((parent.clone(), *reserved)),
        _ => None,
    })
}

/// Takes `inode`'s queued create for withdrawal (an unlink, or a rename over it), or None:
/// the create must still be queued and never taken by the flusher (once taken, it may be on
/// the store), and from here on no open gets the file (an open that comes now fails, as
/// after the unlink; one that came before keeps it). Returns the create's directory and
/// reserved bytes. [`give_back`] if the withdrawal's record is not journaled.
pub(super) fn claim_withdrawal<S: Store>(
    q: &VecDeque<Job<S>>,
    inode: &Arc<Inode<St<S>>>,
) -> Option<(Arc<Inode<St<S>>>, u64)> {
    let claimed = untried_create(q, inode.id())?;
    let closed = inode.file.as_ref().is_none_or(|st| {
        st.opens
            .compare_exchange(0, DROPPED, AcqRel, Acquire)
            .is_ok()
    });
    closed.then_some(claimed)
}

/// Undoes [`claim_withdrawal`]'s hold on opens.
pub(super) fn give_back<S: Store>(inode: &Inode<St<S>>) {
    if let Some(st) = &inode.file {
        st.opens.store(0, Release);
    }
}

impl<S: Store> Writeback<S> {
    /// Whether namespace operations are deferred: `writeback.namespace=back`, on a store
    /// that is not an object store (an S3 object is made by its upload, at close).
    pub(crate) fn defers_namespace(&self) -> bool {
        self.cfg.namespace_back && !self.sh.store.publishes_at_sync()
    }

    /// A create (`kind` File), mkdir (`kind` Dir), symlink (`kind` Symlink, to `target`) or
    /// mknod of a special file (of device number `rdev`) made provisional, or None: it cannot be
    /// deferred (the cache cannot tell that the name is free, or the journal refused the
    /// record) and must be done on the store, after [`Writeback::drain_ns`].
    /// Err(EEXIST): the name is a provisional object already and `excl` was asked.
    /// `io`: the store may be asked for the directory's attributes (else None when they are
    /// not cached: the caller is the dispatching thread, see `Fs::create_fast`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_deferred(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        excl: bool,
        req: Requester,
        io: bool,
        target: Option<&OsStr>,
        rdev: u64,
    ) -> Result<Option<NewObject<S>>> {
        if !self.defers_namespace() || p.kind != FileKind::Dir {
            return Ok(None);
        }
        if name.len() > libc::NAME_MAX as usize {
            return Err(Errno(libc::ENAMETOOLONG));
        }
        match self.ns.prov.lookup(p.id(), name) {
            ProvLookup::Found(..) if excl || kind != FileKind::File => {
                return Err(Errno(libc::EEXIST))
            }
            // An existing provisional file opened by a create without O_EXCL: done on the
            // store once it is there.
            ProvLookup::Found(..) => return Ok(None),
            // (Hidden: the store holds the name until a queued move is applied, before this
            // create.)
            ProvLookup::Absent | ProvLookup::Hidden => {}
            ProvLookup::NotHere => {
                // A directory of the store: a fresh listing without the name, or the store's
                // own answer to the kernel's lookup just before (`namespace::absent`), says
                // it is free.
                if is_provisional(p.id()) || !self.ns.name_free(p, name) {
                    return Ok(None);
                }
            }
        }
        let Some(parent_path) = self.backing_path(p) else {
            return Ok(None);
        };
        // What the store will make of owner and mode: a directory with the setgid bit gives
        // its group to what is made in it, and the bit to a directory made in it.
        let pattr = match self.deferred_dir_attr(p.id()) {
            Some(a) => a,
            None if io => self.ns.store_attr(p)?,
            None => match self.ns.meta.attr(p.id()) {
                Some((a, _)) => a,
                None => return Ok(None),
            },
        };
        let mut owner_new = self.ns.new_owner(req);
        let mut mode = mode;
        if pattr.perm as u32 & libc::S_ISGID != 0 {
            owner_new.1 = pattr.gid;
            if kind == FileKind::Dir {
                mode |= libc::S_ISGID;
            }
        }
        // Room on the store, as for data (`reserve`): an inode, and a directory's (or a long
        // symlink's) first block.
        // Without it the create is done on the store, whose errno (ENOSPC, EDQUOT) the call
        // then returns.
        let stat = || self.backing_inodes();
        let stat: &dyn Fn() -> Result<(u64, u64)> = &stat;
        if !self.inodes.reserve(io.then_some(stat)) {
            return Ok(None);
        }
        let reserved = match kind {
            FileKind::Dir | FileKind::Symlink if io => {
                self.reserve.reserve(0, 1, || self.backing_free()).ok()
            }
            FileKind::Dir | FileKind::Symlink => self.reserve.try_reserve(0, 1),
            _ => Some(0),
        };
        let Some(reserved) = reserved else {
            self.inodes.release();
            return Ok(None);
        };
        let unreserve = || {
            self.inodes.release();
            self.reserve.release(reserved);
        };
        let owner = self.ns.owner(req);
        let op = NsOp::Create {
            parent: parent_path,
            name: name.as_bytes().to_vec(),
            kind,
            mode,
            owner,
            target: target.map(|t| t.as_bytes().to_vec()).unwrap_or_default(),
            rdev,
        };
        let payload = op.encode();
        // Appended and queued under one lock: the queue is in seq order, so a DONE up to a
        // seq never covers a record not yet queued.
        let q = self.nsq.q.lock();
        let seq = match self.journal.append(Record::Ns { payload: &payload }) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(
                    "write-back: namespace record not journaled ({e}): done on the store"
                );
                unreserve();
                return Ok(None);
            }
        };
        let (inode, entry) = self
            .ns
            .add_provisional(p, name, kind, mode, owner_new, seq, target, rdev)
            .inspect_err(|_| unreserve())?;
        // The directory as the application now sees it: one more link for a directory made
        // in it, its times moved.
        let now = tierfs_store::TimeSpec::now();
        let bump = |a: &mut Attr| {
            if kind == FileKind::Dir {
                a.nlink += 1;
            }
            a.mtime = now;
            a.ctime = now;
        };
        self.shadow_dir(p.id(), pattr, bump);
        self.ns.prov.update_attr(p.id(), bump);
        self.enqueue(
            q,
            Job::Create {
                seq,
                inode: inode.clone(),
                parent: p.clone(),
                name: name.to_owned(),
                kind,
                mode,
                owner,
                target: target.map(OsStr::to_owned),
                rdev,
                new_owner: owner_new,
                reserved,
                tried: false,
                at: Instant::now(),
            },
        );
        Ok(Some((inode, entry)))
    }

    /// A setattr of a provisional object, deferred (its attributes as the application now
    /// sees them), or None: not provisional, or a size change (done on the store).
    pub(crate) fn setattr_deferred(
        &self,
        i: &Arc<Inode<St<S>>>,
        set: &SetAttr,
    ) -> Result<Option<Attr>> {
        let id = i.id();
        if !is_provisional(id) || set.size.is_some() {
            return Ok(None);
        }
        let Some(path) = self.backing_path(i) else {
            return Ok(None);
        };
        let now = tierfs_store::TimeSpec::now();
        let op = NsOp::setattr(path, set, now);
        let Some(resolved) = op.set_attr() else {
            return Ok(None);
        };
        let payload = op.encode();
        // Under the queue's lock: the flusher publishes an object only when no job of it is
        // queued, so the attributes set here are the ones the object shows until then.
        let q = self.nsq.q.lock();
        let mut change = AttrShadow::new(now);
        change.add(&resolved, now);
        let apply = |a: &mut Attr| change.over(a);
        if self.ns.prov.attr(id).is_none() {
            return Ok(None);
        }
        let seq = match self.journal.append(Record::Ns { payload: &payload }) {
            Ok(s) => s,
            Err(_) => return Ok(None),
        };
        let Some(attr) = self.ns.prov.update_attr(id, apply) else {
            // Published meanwhile (not while we hold the queue's lock, so not expected); the
            // record is applied all the same.
            drop(q);
            return Ok(None);
        };
        self.enqueue(
            q,
            Job::SetAttr {
                seq,
                inode: i.clone(),
                set: resolved,
                of_store: false,
                at: Instant::now(),
            },
        );
        Ok(Some(attr))
    }

    /// An unlink of a file or symlink that write-back made and whose create the namespace
    /// flusher has not taken yet (a build's temporary file, configure's `conftest.c`): the
    /// create is withdrawn and the data dropped, and the store sees neither. Journaled as an
    /// UNLINK record, so that a replay after a crash, which applies the create, removes the
    /// object again and drops its data records. None: not such an unlink (it is done on the
    /// store, after [`Writeback::drain_ns`]): the object is not provisional, or may be on
    /// the store already, or is open, or `no_open` (the kernel sends no OPEN, so whether it is
    /// open cannot be known: an open file outlives its unlink, data and all).
    pub(crate) fn unlink_deferred(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        no_open: bool,
    ) -> Option<()> {
        let (inode, attr) = self.deferred_object(p, name)?;
        // One of two names (`ns_link`): the other is applied first.
        if self.ns.prov.alias(inode.id()).is_some() {
            return None;
        }
        match (&inode.file, attr.kind) {
            (Some(st), FileKind::File) if !no_open && st.opens.load(Acquire) == 0 => {}
            (None, k) if k == FileKind::Symlink || is_special(k) => {}
            _ => return None,
        }
        let path = self.backing_path(&inode)?;
        let mut q = self.nsq.q.lock();
        let (parent, reserved) = claim_withdrawal(&q, &inode)?;
        let op = NsOp::Unlink {
            path,
            kind: attr.kind,
            prov: inode.id().1,
        };
        let Ok(seq) = self.journal.append(Record::Ns {
            payload: &op.encode(),
        }) else {
            give_back(&inode);
            return None;
        };
        self.withdraw(&mut q, &inode);
        // The directory as the application now sees it: its times moved.
        let now = tierfs_store::TimeSpec::now();
        self.withdrawn(q, seq, inode, parent, reserved, |a| {
            a.mtime = now;
            a.ctime = now;
        });
        Some(())
    }

    /// The provisional object `name` of directory `p` and its attributes, when namespace
    /// operations are deferred: where every deferred unlink, rmdir and unalias starts.
    pub(super) fn deferred_object(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
    ) -> Option<(Arc<Inode<St<S>>>, Attr)> {
        if !self.defers_namespace() {
            return None;
        }
        match self.ns.prov.lookup(p.id(), name) {
            ProvLookup::Found(inode, attr) => Some((inode, attr)),
            _ => None,
        }
    }

    /// After the record that withdraws `inode`'s create (see [`claim_withdrawal`]): the
    /// create and its setattrs leave the queue (a move's job stays: the directory it left
    /// counts the create until that job is applied), its data is dropped, while the data
    /// flushers still leave it alone (it waits for its create), then its name goes, and
    /// whatever waits for the object fails: it never reaches the store.
    pub(super) fn withdraw(&self, q: &mut VecDeque<Job<S>>, inode: &Arc<Inode<St<S>>>) {
        let id = inode.id();
        q.retain(|j| j.inode().id() != id || matches!(j, Job::Renamed { from: Some(_), .. }));
        self.drop_dirty(inode);
        self.ns.prov.refused(id, Errno::ENOENT);
    }

    /// The directory attributes the application is shown while deferred operations are
    /// on their way: a provisional directory's own, or the shadow of a directory of the
    /// store with deferred names in it. None: neither (ask the metadata cache or the store).
    pub(super) fn deferred_dir_attr(&self, dir: Ident) -> Option<Attr> {
        self.ns
            .prov
            .attr(dir)
            .or_else(|| self.nsq.dirs.lock().get(&dir).map(|(_, a)| *a))
    }

    /// Queues the DROP job of a create withdrawn by an unlink or rmdir (record `seq`), and
    /// shows its directory changed by `change` meanwhile (in the shadow of a directory of
    /// the store, or in a provisional one's attributes).
    fn withdrawn(
        &self,
        q: parking_lot::MutexGuard<'_, std::collections::VecDeque<Job<S>>>,
        seq: u64,
        inode: Arc<Inode<St<S>>>,
        parent: Arc<Inode<St<S>>>,
        reserved: u64,
        change: impl Fn(&mut Attr),
    ) {
        self.dir_changed(parent.id(), change);
        self.c.ns_dropped.fetch_add(1, Relaxed);
        self.enqueue(
            q,
            Job::Drop {
                seq,
                inode,
                parent,
                reserved,
                at: Instant::now(),
            },
        );
    }

    /// One more deferred operation in directory `dir` of the store, which changes it as
    /// `change` says: its shadow (based on `base`, the attributes the application saw before)
    /// shows the change until the operation is applied (`ns::apply_group` counts it down).
    pub(super) fn shadow_dir(&self, dir: Ident, base: Attr, change: impl FnOnce(&mut Attr)) {
        let mut dirs = self.nsq.dirs.lock();
        let e = dirs.entry(dir).or_insert((0, base));
        e.0 += 1;
        change(&mut e.1);
        self.nsq.dirs_shadowed.store(true, Relaxed);
    }

    /// Directory `dir` as the application sees it, changed by a deferred operation: in its
    /// shadow (a directory of the store with deferred names in it) and, for a provisional
    /// one, in its attributes.
    pub(super) fn dir_changed(&self, dir: Ident, change: impl Fn(&mut Attr)) {
        if let Some((_, a)) = self.nsq.dirs.lock().get_mut(&dir) {
            change(a);
        }
        self.ns.prov.update_attr(dir, change);
    }

    /// An rmdir of an empty directory write-back made and whose mkdir the namespace flusher
    /// has not taken yet (`rm -rf` of a tree made just before: its files' unlinks were
    /// deferred the same way): the mkdir is withdrawn like the create of an unlinked file
    /// (see [`Writeback::unlink_deferred`]), journaled as an UNLINK of kind directory. None:
    /// done on the store (which answers ENOTEMPTY and the like).
    pub(crate) fn rmdir_deferred(&self, p: &Arc<Inode<St<S>>>, name: &OsStr) -> Option<()> {
        let (inode, attr) = self.deferred_object(p, name)?;
        let id = inode.id();
        if attr.kind != FileKind::Dir || self.ns.prov.is_empty_dir(id) != Some(true) {
            return None;
        }
        let path = self.backing_path(&inode)?;
        let mut q = self.nsq.q.lock();
        let (parent, reserved) = claim_withdrawal(&q, &inode)?;
        // Nothing made in it may still be on its way (its names are all gone, so none is).
        if q.iter()
            .any(|j| matches!(j, Job::Create { parent: d, .. } if d.id() == id))
        {
            return None;
        }
        let op = NsOp::Unlink {
            path,
            kind: FileKind::Dir,
            prov: id.1,
        };
        let seq = self
            .journal
            .append(Record::Ns {
                payload: &op.encode(),
            })
            .ok()?;
        self.withdraw(&mut q, &inode);
        // Its directory as the application now sees it: one link fewer, times moved.
        let now = tierfs_store::TimeSpec::now();
        self.withdrawn(q, seq, inode, parent, reserved, |a| {
            a.nlink = a.nlink.saturating_sub(1).max(2);
            a.mtime = now;
            a.ctime = now;
        });
        Some(())
    }

    /// Drops a file's dirty data without writing it anywhere (it was unlinked before it
    /// reached the store) and records it done in the journal.
    pub(super) fn drop_dirty(&self, i: &Arc<Inode<St<S>>>) {
        let Some(st) = &i.file else { return };
        // Dropping cannot fail.
        let _ = self.take_dirty_runs(st, |_| Ok(()));
        let upto = st.dirty.lock().as_ref().map(|d| d.done_upto());
        if let Some(upto) = upto {
            let (dev, ino) = st.journal_key;
            if let Err(e) = self.journal.done(dev, ino, upto) {
                tracing::error!("write-back journal: {e}");
            }
        }
        self.settle_clean(i);
    }

    /// Directory `dir` changed by an operation done on the store (not deferred: a rename,
    /// an unlink, a link) while deferred names in it are on their way: its shadow shows the
    /// operation's times, as the store's own attributes will once the shadow is dropped
    /// (else an `ls -l` saw the directory unchanged by the rename until then).
    pub(crate) fn dir_touched(&self, dir: Ident) {
        let now = tierfs_store::TimeSpec::now();
        if let Some((_, a)) = self.nsq.dirs.lock().get_mut(&dir) {
            a.mtime = now;
            a.ctime = now;
        }
    }

    /// How many directory shadows were dropped so far: a reader that saw this move while it
    /// read a directory's attributes reads them again (`Fs::shown_stable`).
    pub(crate) fn unshadowed(&self) -> u64 {
        self.nsq.unshadowed.load(Acquire)
    }

    /// Whether a deferred create in directory `dir` is still queued.
    pub(crate) fn creates_queued_in(&self, dir: Ident) -> bool {
        self.nsq.dirs.lock().contains_key(&dir)
    }

    /// A directory's link count and times as the application sees them while creates in
    /// it are on their way to the store.
    pub(crate) fn shadow_dir_attr(&self, dir: Ident, attr: &mut Attr) {
        if !self.nsq.dirs_shadowed.load(Relaxed) {
            return;
        }
        if let Some((_, a)) = self.nsq.dirs.lock().get(&dir) {
            attr.nlink = a.nlink;
            attr.mtime = a.mtime;
            attr.ctime = a.ctime;
        }
    }

    /// [`Writeback::drain_ns`] until it is done or has made no progress for `limit` (unmount
    /// with a store that does not answer; a slow one that answers is waited for: a fixed
    /// limit left a thousand creates over sshfs, 10 s of work, to the next mount).
    pub(crate) fn drain_ns_for(&self, limit: Duration) -> bool {
        let target = self.nsq.appended.load(Acquire);
        let mut deadline = Instant::now() + limit;
        let mut seen = self.progress();
        self.nsq.urgent.fetch_max(target, AcqRel);
        let mut g = self.nsq.applied.lock();
        while *g < target {
            let now = self.progress();
            if now != seen {
                seen = now;
                deadline = Instant::now() + limit;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.nsq.wake.notify_one();
            self.nsq
                .applied_cv
                .wait_for(&mut g, Duration::from_millis(100));
        }
        true
    }

    /// A count that moves whenever write-back gets something onto the store: operations
    /// applied, bytes flushed, files synced (the exit watch waits while it moves).
    pub(crate) fn progress(&self) -> u64 {
        [
            &self.c.ns_applied,
            &self.c.ns_conflicts,
            &self.c.flushed_bytes,
            &self.c.flush_syncs,
        ]
        .iter()
        .map(|c| c.load(Relaxed))
        .fold(0u64, u64::wrapping_add)
    }

    /// Deferred operations not yet applied, and the age of the oldest, ms.
    pub(crate) fn ns_pending(&self) -> (u64, u64) {
        let q = self.nsq.q.lock();
        let f = *self.nsq.in_flight.lock();
        let oldest = f.1.or_else(|| q.front().map(|j| j.at()));
        (
            (q.len() + f.0) as u64,
            oldest.map(|t| t.elapsed().as_millis() as u64).unwrap_or(0),
        )
    }

    /// Median and 99th percentile of the last 256 group times, ms.
    pub(crate) fn ns_group_ms(&self) -> (u64, u64) {
        let mut v: Vec<u64> = self.nsq.group_ms.lock().iter().copied().collect();
        if v.is_empty() {
            return (0, 0);
        }
        v.sort_unstable();
        (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
    }
}
