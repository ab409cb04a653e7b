//! A deferred setattr of an object of the store (see `ns`): `chmod -R`, `chown -R`, `touch`
//! of a directory or symlink, tar setting the times of a directory that was already there.
//! Each was a store round trip the application waited for (`chmod -R` of a 2,867-entry
//! tree over the nfs-lan emulator: 14.9 s in write-back, the store alone 15.6 s; 4.0 s since).
//!
//! The change is journaled (CHATTR, op 8: the SETATTR fields and the object's kind and
//! identity), queued as a setattr of the object's inode, and shown at once: its fields lie
//! over what the store or the metadata cache say (`AttrShadow`, by kernel inode) until the
//! namespace flusher has applied it through the object's own node. Replay sets `path`'s
//! attributes only if the name still holds that object.
//!
//! What is not deferred, done on the store as before: a size change but a truncate to zero
//! of a clean regular file (below), a setuid
//! or setgid bit set or held (the store drops them by rules of its own at a chown), an owner
//! change by a daemon that is not root or a change of someone else's object (the store
//! would refuse it later, not now), or any change of a file with dirty data (`Fs::setattr`
//! keeps an mtime with the dirty data, whose flush sets it after writing). While a deferred
//! one is queued, a setattr done on the store waits for it (`Fs::before_setattr`), and so
//! does an unlink or rename done on the store (`ns_narrow`, `ns_remove`).
//!
//! A regular file's times (`touch` of a file of the store, `make` touching a stamp) are
//! deferred too. A write after it must land after it: its data flush ends by setting the
//! application's mtime (the write's), and the deferred `touch` applied after that would put
//! the older one back. So a file with a deferred setattr queued is not flushed
//! (`Writeback::waits_for_namespace`, and `flush_file_now` drains first), and the check for
//! dirty data here and the write's marking it dirty are serialized by the file's `rw` lock:
//! either the setattr sees the dirty data (and is not deferred) or the flusher that picks
//! the file up sees the setattr queued.
//!
//! A truncate to zero of a clean file of the store (`open(O_TRUNC)`, `ftruncate(fd, 0)`: `cp`
//! over an existing file, a shell's `>`, a build rewriting its outputs) is deferred the same
//! way, as a CHATTR with a size (mask bit 5). The file becomes an empty dirty file at once
//! (`stage_truncate`): reads see zeros but for what is written after (the store's bytes
//! are not the file's: `Dirty::truncate_pending`), and its data waits for the truncate like
//! any data after a deferred setattr. The namespace flusher truncates it on the store, drops
//! the old contents' cached blocks and makes the dirty data's base the empty file
//! (`truncate_applied`); a data flush that finds the truncate still pending (the
//! flusher's attempt was refused) truncates first. Replay truncates `path` only if it still
//! holds the same file, before any write after the truncate is replayed (namespace records
//! first; the record names the file's journal key, and replay writes none of its data
//! records older than it: the dirty data of a file truncated so is dropped with no second
//! record to depend on). A truncate
//! the store refuses keeps the data written after it in `lost/` (`truncate_refused`). Not
//! deferred: a file a flusher is writing, with other links (each name may
//! be its own inode under a path identity), on a store that publishes at sync (S3).

pub(super) use super::attr_shadow::AttrShadow;
use super::ns_queue::Job;
use super::ns_record::NsOp;
use super::Writeback;
use crate::dirty::Dirty;
use crate::file_state::FileState;
use crate::inode::Inode;
use crate::namespace::is_provisional;
use crate::shared::St;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::journal::Record;
use tierfs_store::{Attr, FileKind, SetAttr, Store, TimeSpec, SUID_SGID};

impl<S: Store> Writeback<S> {
    /// A setattr of `i`, an object of the store, deferred (see the module comment): its
    /// attributes as the application now sees them. None: done on the store.
    pub(crate) fn chattr_deferred(&self, i: &Arc<Inode<St<S>>>, set: &SetAttr) -> Option<Attr> {
        let id = i.id();
        let nothing = set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
            && set.atime.is_none()
            && set.mtime.is_none()
            && set.size.is_none();
        // A truncate: to zero, of a regular file, on a store that does not publish whole
        // objects at sync (S3 stages a truncate in a handle: `Fs::publish_truncate`).
        let truncate = set.size.is_some();
        if !self.defers_namespace()
            || is_provisional(id)
            || set.size.is_some_and(|s| s != 0)
            || (truncate && (i.kind != FileKind::File || self.sh.store.publishes_at_sync()))
            || nothing
            || !matches!(i.kind, FileKind::File | FileKind::Dir | FileKind::Symlink)
            // (The store refuses it: Linux has no mode of a symlink to set.)
            || (i.kind == FileKind::Symlink && set.mode.is_some())
        {
            return None;
        }
        let (base, _) = self.ns.meta.attr(id)?;
        // SAFETY: no preconditions.
        let euid = unsafe { libc::geteuid() };
        let owner = set.uid.is_some() || set.gid.is_some();
        if base.kind != i.kind
            || (euid != 0 && (owner || base.uid != euid))
            || set.mode.is_some_and(|m| m & SUID_SGID != 0)
            || base.perm as u32 & SUID_SGID != 0
            // Its other names may be other inodes here (a path identity): all would have to
            // show the truncate, and a write through one would not wait for a touch of another.
            || (i.kind == FileKind::File && base.nlink > 1 && (truncate || set.mtime.is_some()))
        {
            return None;
        }
        let path = self.backing_path(i)?;
        let now = TimeSpec::now();
        let mut op = NsOp::setattr(path.clone(), set, now);
        let NsOp::SetAttr { of, size, .. } = &mut op else {
            return None;
        };
        *of = Some((i.kind, id));
        if let (Some((_, key)), Some(st)) = (size.as_mut(), &i.file) {
            // Replay writes none of the file's data records before it.
            *key = st.journal_key;
        }
        let resolved = op.set_attr()?;
        let q = self.nsq.q.lock();
        // Writers held off until the setattr is queued (see the module comment), taken after
        // the queue as everywhere; never waited for here, on the dispatching thread: a
        // reader may hold it across a fetch.
        let _w = match &i.file {
            Some(st) => {
                let w = st.rw.try_write()?;
                if truncate && st.dirty.lock().as_ref().is_some_and(|d| d.truncate_pending) {
                    // Truncated again before the store has the first (`cp`, then `>`).
                    let only_times = set.mode.is_none() && set.uid.is_none() && set.gid.is_none();
                    if !only_times {
                        return None;
                    }
                    self.truncate_again(st, now)?;
                    let mut a = base;
                    self.overlay_chattr(i.ino, &mut a);
                    (a.size, a.blocks, a.mtime) = (0, 0, now);
                    return Some(a);
                }
                let dirty = st.has_dirty.load(Acquire);
                if dirty && !truncate {
                    return None;
                }
                // A truncate drops what is not on the store yet: taken from the flushers
                // meanwhile (none may hold it). Its record says so to replay by itself.
                let claim = match truncate {
                    true => match st.flushing.compare_exchange(false, true, AcqRel, Acquire) {
                        Ok(_) => Some(Claimed(st)),
                        Err(_) => return None,
                    },
                    false => None,
                };
                Some((w, claim, dirty))
            }
            None => None,
        };
        let seq = self
            .journal
            .append(Record::Ns {
                payload: &op.encode(),
            })
            .ok()?;
        let shadow = {
            let mut m = self.nsq.attrs.lock();
            let e = m.entry(i.ino).or_insert((0, AttrShadow::new(now)));
            e.0 += 1;
            e.1.add(&resolved, now);
            self.nsq.attrs_shadowed.store(true, Relaxed);
            e.1
        };
        if let (true, Some(st)) = (truncate, &i.file) {
            if _w.as_ref().is_some_and(|(_, _, dirty)| *dirty) {
                self.drop_unflushed(st, seq);
            }
            self.stage_truncate(i, st, path, seq, now);
        }
        if i.kind == FileKind::Dir {
            // A directory with creates on their way into it shows its shadow's times
            // (`shadow_dir_attr`, laid over these): tar setting a directory's times once it
            // is done with it must move them there too.
            self.dir_changed(id, |a| shadow.over(a));
        }
        self.enqueue(
            q,
            Job::SetAttr {
                seq,
                inode: i.clone(),
                set: resolved,
                of_store: true,
                at: Instant::now(),
            },
        );
        let mut a = base;
        shadow.over(&mut a);
        if truncate {
            (a.size, a.blocks, a.mtime) = (0, 0, now);
        }
        Some(a)
    }

    /// A truncate to zero of file `i` of the store (clean, or its dirty data just dropped),
    /// journaled at `seq` and about to be queued (the queue and the file's `rw` held): from
    /// now on the file is an empty dirty file, whose bytes do not come from the store
    /// (`Dirty::truncate_pending`, read by `read_over_dirty`) until the namespace flusher has
    /// truncated it there (`truncate_applied`); the data written next waits for that
    /// (`waits_for_namespace`). Replay writes none of the file's data records older than the
    /// truncate's (`NsReplayed::truncated`).
    fn stage_truncate(
        &self,
        i: &Arc<Inode<St<S>>>,
        st: &FileState,
        path: Vec<u8>,
        seq: u64,
        now: TimeSpec,
    ) {
        let mut d = Dirty::new(0, path);
        d.base = Some(st.version().fp);
        d.truncate_pending = true;
        d.max_seq = seq;
        d.mtime_ns = now.sec * 1_000_000_000 + now.nsec as i64;
        let mut g = st.dirty.lock();
        if let Some(old) = g.take() {
            // What the dropped runs had reserved, and a flush error not yet reported.
            self.reserve.release(old.reserved);
            d.error = old.error;
        }
        *g = Some(d);
        drop(g);
        // A read that took the store's bytes before this must not lay them under the data
        // written after it (`read_over_dirty` reads again when this moved).
        st.flush_gen.fetch_add(1, AcqRel);
        st.has_dirty.store(true, Release);
        if self
            .files
            .lock()
            .insert(st.journal_key, i.clone())
            .is_none()
        {
            self.c.dirty_files.fetch_add(1, Relaxed);
        }
        self.c.ns_truncated.fetch_add(1, Relaxed);
    }

    /// The dirty data of file `st`, truncated to zero by the record of `seq` (held from the
    /// flushers, the queue and its `rw` held): dropped. That record is what tells replay to
    /// skip the data (`NsReplayed::truncated`); a DROP up to it lets the journal free it
    /// sooner, and if the journal cannot take one, the next DONE of the file does.
    fn drop_unflushed(&self, st: &FileState, seq: u64) {
        // Dropping cannot fail.
        let _ = self.take_dirty_runs(st, |_| Ok(()));
        let (dev, ino) = st.journal_key;
        if let Err(e) = self.journal.drop_file(dev, ino, seq) {
            tracing::debug!("write-back journal: {e}: the truncated data is let go later");
        }
    }

    /// A truncate to zero of a file whose staged truncate is not on the store yet (the queue
    /// and the file's `rw` held): what was written since is dropped, as for a new file
    /// (`ns_truncate`), with a DROP record up to its last write so that replay skips it; the
    /// queued truncate does the rest. None: the journal could not take the DROP.
    fn truncate_again(&self, st: &FileState, now: TimeSpec) -> Option<()> {
        let upto = st.dirty.lock().as_ref().map(|d| d.max_seq)?;
        let (dev, ino) = st.journal_key;
        if let Err(e) = self.journal.drop_file(dev, ino, upto) {
            tracing::debug!("write-back journal: {e}: the truncate is done on the store");
            return None;
        }
        // Dropping cannot fail.
        let _ = self.take_dirty_runs(st, |_| Ok(()));
        if let Some(d) = st.dirty.lock().as_mut() {
            d.size = 0;
            d.mtime_ns = now.sec * 1_000_000_000 + now.nsec as i64;
        }
        st.flush_gen.fetch_add(1, AcqRel);
        self.c.ns_truncated.fetch_add(1, Relaxed);
        Some(())
    }

    /// A queued truncate of `inode` is still to be done on the store (its `rw` held): not
    /// done since by a data flush (see `truncate_applied`).
    pub(super) fn truncate_still_pending(&self, inode: &Inode<St<S>>) -> bool {
        inode
            .file
            .as_ref()
            .is_some_and(|st| st.dirty.lock().as_ref().is_some_and(|d| d.truncate_pending))
    }

    /// The namespace flusher truncated file `st` on the store, which answered `a` (its
    /// `rw` held): the cached blocks of the old contents go, and the dirty data written
    /// since is made on the empty file.
    pub(super) fn truncate_applied(&self, st: &FileState, a: &Attr) {
        st.invalidate(Some(a));
        if let Some(d) = st.dirty.lock().as_mut() {
            d.base = Some(a.fingerprint());
            d.truncate_pending = false;
        }
    }

    /// A deferred setattr of an object of the store is on the store: once none is left for
    /// it, its shadow goes (what the store answered is in the metadata cache by then).
    pub(super) fn chattr_applied(&self, inode: &Inode<St<S>>) {
        let mut m = self.nsq.attrs.lock();
        if let Some(e) = m.get_mut(&inode.ino) {
            e.0 -= 1;
            if e.0 == 0 {
                m.remove(&inode.ino);
                self.nsq.attrs_unshadowed.fetch_add(1, AcqRel);
            }
        }
        self.nsq.attrs_shadowed.store(!m.is_empty(), Relaxed);
        drop(m);
        if inode
            .file
            .as_ref()
            .is_some_and(|st| st.has_dirty.load(Acquire))
        {
            // Written since: its data flush waited for this (`waits_for_namespace`).
            self.notify();
        }
    }

    /// Kernel inode `ino` has a deferred setattr not yet on the store.
    pub(crate) fn chattr_pending(&self, ino: u64) -> bool {
        self.nsq.attrs_shadowed.load(Relaxed) && self.nsq.attrs.lock().contains_key(&ino)
    }

    /// Any object of the store has a deferred setattr not yet on the store.
    pub(crate) fn any_chattr_pending(&self) -> bool {
        self.nsq.attrs_shadowed.load(Relaxed)
    }

    /// `attr` of kernel inode `ino` with its deferred setattrs laid over it.
    pub(super) fn overlay_chattr(&self, ino: u64, attr: &mut Attr) {
        if !self.nsq.attrs_shadowed.load(Relaxed) {
            return;
        }
        if let Some((_, s)) = self.nsq.attrs.lock().get(&ino) {
            s.over(attr);
        }
    }

    /// Shadows of deferred setattrs dropped so far (see `Fs::shown_stable`).
    pub(crate) fn chattrs_unshadowed(&self) -> u64 {
        self.nsq.attrs_unshadowed.load(Acquire)
    }
}

/// A file taken from the flushers (`FileState::flushing`) until this is dropped.
struct Claimed<'a>(&'a FileState);

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        self.0.flushing.store(false, Release);
    }
}
