//! Flushers (sorted, coalesced, in flush groups, synced before anything is marked clean),
//! ordering of namespace operations after the data they concern (the drain at unmount:
//! `shutdown`; fsync and close: `sync`).

use super::Writeback;
use crate::inode::{now_ms, Inode};
use crate::shared::St;
use std::ffi::OsStr;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tierfs_store::{Errno, FileKind, Result, SetAttr, Store, TimeSpec, TimeUpdate};

/// A flusher that has caught up with a file written less than this long ago leaves it
/// unsynced and comes back: a file being streamed is synced once per flush group, not after
/// every catch-up (each sync of a large file costs the store a full flush).
const SYNC_IDLE: Duration = Duration::from_millis(200);

/// How a flush of one file ended.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flushed {
    /// Written, synced, recorded in the journal (or nothing to do).
    Synced,
    /// Written up to what there was, not synced yet: the file is still being written.
    Deferred,
    Failed,
}

impl<S: Store> Writeback<S> {
    /// One flusher thread: takes the next dirty file in (device, inode) order after the
    /// last one taken (an elevator over the files) and flushes one group of it.
    pub(crate) fn flusher_loop(wb: Weak<Writeback<S>>) {
        loop {
            let Some(wb) = wb.upgrade() else { return };
            if wb.retire_flusher() {
                return;
            }
            // The space credit's periodic renewal, here so no writer waits for it.
            wb.reserve.refresh(|| wb.backing_free());
            match wb.pick_dirty() {
                Some(i) => {
                    let r = wb.flush_group(&i, wb.cfg.group);
                    let how = match r {
                        Ok(true) => Flushed::Synced,
                        Ok(false) => Flushed::Deferred,
                        Err(_) => Flushed::Failed,
                    };
                    wb.unclaim(&i, how);
                }
                None => {
                    if wb.stop.load(Acquire) {
                        return;
                    }
                    let mut g = wb.wake_lock.lock();
                    if wb.files.lock().is_empty() || !wb.any_ready() {
                        wb.wake.wait_for(&mut g, Duration::from_millis(200));
                    }
                }
            }
        }
    }

    pub(crate) fn any_ready(&self) -> bool {
        let now = now_ms();
        self.files.lock().values().any(|i| {
            !self.waits_for_namespace(i)
                && i.file.as_ref().is_some_and(|st| {
                    !st.flushing.load(Acquire) && st.retry_at_ms.load(Relaxed) <= now
                })
        })
    }

    /// A file whose data waits for the namespace flusher: its create is deferred and not on
    /// the store yet (a file the store refused is not waiting: its data goes to `lost/`), or
    /// a deferred setattr of it is queued, whose mtime would undo the one its data flush
    /// sets (`ns_chattr`).
    pub(super) fn waits_for_namespace(&self, i: &Inode<St<S>>) -> bool {
        let id = i.id();
        (crate::namespace::is_provisional(id) && self.ns.prov.failure(id).is_none())
            || self.chattr_pending(i.ino)
    }

    /// Claims the next dirty file for flushing (none is flushed by two threads at once).
    pub(crate) fn pick_dirty(&self) -> Option<Arc<Inode<St<S>>>> {
        let now = now_ms();
        let files = self.files.lock();
        let mut cursor = self.cursor.lock();
        let start = *cursor;
        let ordered = files.range(start..).chain(files.range(..start));
        for (k, i) in ordered {
            let Some(st) = &i.file else { continue };
            if st.retry_at_ms.load(Relaxed) > now || self.waits_for_namespace(i) {
                continue;
            }
            if st
                .flushing
                .compare_exchange(false, true, AcqRel, Acquire)
                .is_ok()
            {
                if self.waits_for_namespace(i) {
                    // A truncate was deferred between the check and the claim (it held the
                    // file meanwhile, `ns_chattr`): its data waits for it.
                    st.flushing.store(false, Release);
                    continue;
                }
                *cursor = (k.0, k.1.wrapping_add(1));
                return Some(i.clone());
            }
        }
        None
    }

    /// Gives a claimed file back; a failed flush waits (exponential backoff) before the
    /// next try, so a vanished directory or a failing disk is not hammered.
    pub(crate) fn unclaim(&self, i: &Inode<St<S>>, how: Flushed) {
        if let Some(st) = &i.file {
            match how {
                Flushed::Failed => {
                    let b = st.backoff_ms.load(Relaxed);
                    let b = (b * 2).clamp(100, self.cfg.retry_max.as_millis() as u64);
                    st.backoff_ms.store(b, Relaxed);
                    st.retry_at_ms.store(now_ms() + b, Relaxed);
                }
                Flushed::Deferred => {
                    st.retry_at_ms
                        .store(now_ms() + SYNC_IDLE.as_millis() as u64 / 2, Relaxed);
                }
                Flushed::Synced => {
                    st.backoff_ms.store(0, Relaxed);
                    st.retry_at_ms.store(0, Relaxed);
                }
            }
            st.flushing.store(false, Release);
        }
        self.notify();
    }

    /// Flushes up to `budget` bytes of one claimed file (u64::MAX: all of it), sorted by
    /// offset and coalesced into writes of up to `writeback.chunk`; then syncs the file (and
    /// its directory if we created it) and records in the journal what is now durable.
    /// Ok(false): caught up with a file still being written, left unsynced (see `SYNC_IDLE`).
    pub(crate) fn flush_group(&self, i: &Arc<Inode<St<S>>>, budget: u64) -> Result<bool> {
        let r = match self.flush_group_inner(i, budget) {
            Err(e) if super::applying::refused_for_good(e) => {
                self.c.flush_errors.fetch_add(1, Relaxed);
                return self.data_refused(i, e);
            }
            r => r,
        };
        if let Err(e) = r {
            if let Some(st) = &i.file {
                if let Some(d) = st.dirty.lock().as_mut() {
                    tracing::warn!(
                        "write-back: flushing {} failed: {e}; kept in the journal, will retry",
                        String::from_utf8_lossy(&d.path)
                    );
                    d.error = Some(e);
                }
            }
            // Counted once the error is there to report: whoever sees the count move (a
            // test, a monitor) finds the error at the next fsync or close.
            self.c.flush_errors.fetch_add(1, Relaxed);
        }
        r
    }

    pub(crate) fn flush_group_inner(&self, i: &Arc<Inode<St<S>>>, budget: u64) -> Result<bool> {
        let Some(st) = i.file.clone() else {
            return Ok(true);
        };
        if st.dirty.lock().is_none() {
            return Ok(true);
        }
        if let Some(e) = self.ns.prov.failure(i.id()) {
            return self.flush_refused(i, e);
        }
        let node = self.ns.node(i)?;
        let publishes = self.sh.store.publishes_at_sync();
        let h = self.flush_handle(&st, &node)?;
        if st.dirty.lock().as_ref().is_some_and(|d| d.truncate_pending) {
            // Its deferred truncate did not reach the store (`ns_chattr`; the namespace
            // flusher saves the data of a refused one in `lost/`, so this is a defence):
            // done here, before any of the data after it, or the data goes to `lost/`.
            // (A file whose truncate is still queued is never flushed: `pick_dirty` and
            // `flush_file_now` check it once they hold the file.)
            let _w = st.rw.write();
            let _own = st.own_change();
            let set = SetAttr {
                size: Some(0),
                ..Default::default()
            };
            let a = match self.sh.store.setattr(&node, Some(&h), &set) {
                Ok(a) => a,
                Err(e) if !super::applying::transient(e) => return self.truncate_refused(i, e),
                Err(e) => return Err(e),
            };
            self.ns.meta.put_attr(&a, Instant::now());
            self.truncate_applied(&st, &a);
        }
        if st.dirty.lock().as_ref().is_some_and(|d| d.grow.is_some()) {
            self.flush_grow(&st, &node, &h)?;
        }
        // Written before the file was published (`ns_replace`): on the store already, in the
        // version it was published with (blocks and fingerprint left: a truncate since may
        // have made another).
        let ahead = st
            .dirty
            .lock()
            .as_mut()
            .map(|d| std::mem::take(&mut d.ahead))
            .unwrap_or_default();
        for run in &ahead {
            self.account_flushed(&st, run);
            st.flush_gen.fetch_add(1, AcqRel);
        }
        let chunk = self.cfg.chunk as usize;
        let (mut from, mut done) = (0u64, 0u64);
        loop {
            let run = match st
                .dirty
                .lock()
                .as_ref()
                .and_then(|d| d.take_run(from, chunk))
            {
                Some(r) => r,
                None => break,
            };
            let bufs: Vec<&[u8]> = run.pieces.iter().map(|b| &b[..]).collect();
            // Until what the write left is recorded below (see `FileState::own_change`).
            let own = st.own_change();
            self.sh.store.write_vectored(&h, run.offset, &bufs)?;
            self.c.flush_writes.fetch_add(1, Relaxed);
            let len = run.len;
            self.landed(&st, &run);
            drop(own);
            self.c.flushed_bytes.fetch_add(len, Relaxed);
            self.notify();
            from = run.offset + len;
            done += len;
            if done >= budget {
                break;
            }
        }
        // A store that uploads whole objects at sync (S3) syncs a file once it is complete:
        // a sync after each flush group would upload the whole file again each time.
        if budget != u64::MAX && (done < budget || publishes) {
            let busy = st
                .dirty
                .lock()
                .as_ref()
                .is_some_and(|d| d.last_write.elapsed() < SYNC_IDLE);
            if busy {
                if publishes {
                    self.held.lock().insert(st.journal_key, h);
                }
                return Ok(false);
            }
        }
        // The application's mtime, not the flush's.
        let mtime_of = |st: &crate::file_state::FileState| {
            st.dirty.lock().as_ref().map_or((None, None), |d| {
                (Some(d.mtime_ns), d.mtime_set.then_some(d.set_at_ns))
            })
        };
        if mtime_of(&st).0.is_some_and(|n| n > 0) {
            let set_at = std::cell::Cell::new(None);
            super::settle::settle_after(
                &st,
                || {
                    // Read under the lock an application's time change takes for its own
                    // setattr: one made since is sent here, or lands after this one.
                    let _t = st.times.lock();
                    let (mtime, at) = mtime_of(&st);
                    set_at.set(at);
                    // (Gone meanwhile: nothing to set, nothing to settle.)
                    let Some(ns) = mtime.filter(|n| *n > 0) else {
                        return Err(Errno(libc::EAGAIN));
                    };
                    let set = SetAttr {
                        mtime: Some(TimeUpdate::Set(TimeSpec {
                            sec: ns.div_euclid(1_000_000_000),
                            nsec: ns.rem_euclid(1_000_000_000) as u32,
                        })),
                        ..Default::default()
                    };
                    self.sh.store.setattr(&node, Some(&h), &set)
                },
                |a| {
                    self.ns.meta.put_attr(a, Instant::now());
                    // The ctime shown while the data was dirty stays: its last write's, or
                    // that of the utimensat that set an mtime of the application's (`cp -p`).
                    let mut shown = *a;
                    shown.ctime = match set_at.get() {
                        Some(ns) => TimeSpec {
                            sec: ns.div_euclid(1_000_000_000),
                            nsec: ns.rem_euclid(1_000_000_000) as u32,
                        },
                        None => a.mtime,
                    };
                    self.kept_times.keep(st.id(), a.ctime, &shown, false);
                    // Times only, set by us: the cached blocks stay.
                    self.settle_flushed(&st, a);
                },
            );
        }
        if st.unverified() {
            // The runs' provisional fingerprint, settled (no mtime to set, or it failed).
            super::settle::settle_after(
                &st,
                || self.sh.fstat_as(&st, &h),
                |a| {
                    self.ns.meta.put_attr(a, Instant::now());
                    self.settle_flushed(&st, a);
                },
            );
        }
        let mut conflict = None;
        // A store that publishes at sync makes a new version of the object there.
        let own = publishes.then(|| st.own_change());
        match self.sh.store.fsync(&h, false) {
            Ok(()) => {}
            // Another writer changed the object since our writes' version (S3 If-Match): the
            // store kept our contents in the lost directory instead of overwriting theirs.
            // The journal lets go of them; the application hears ESTALE at fsync or close.
            Err(e) if publishes && e == Errno(libc::ESTALE) => {
                self.c.flush_conflicts.fetch_add(1, Relaxed);
                let _w = st.rw.write();
                st.invalidate(None);
                conflict = Some(e);
            }
            Err(e) => return Err(e),
        }
        self.c.flush_syncs.fetch_add(1, Relaxed);
        if publishes && conflict.is_none() {
            // The upload made a new version: ours, so the cached blocks stay valid under it,
            // and the next writes are made on it.
            let _w = st.rw.write();
            let v = st.version();
            if let Ok(a) = self.sh.fstat_as(&st, &h) {
                st.set_after_own_write(v.gen, &a);
                self.ns.meta.put_attr(&a, Instant::now());
                if let Some(d) = st.dirty.lock().as_mut() {
                    d.base = Some(a.fingerprint());
                }
            }
        }
        drop(own);
        if st.created.swap(false, AcqRel) {
            // Its name must be as durable as its data before the journal lets go of it.
            let parent = i.origin.lock().clone();
            if let Some((p, _)) = parent {
                if let Err(e) = self.sh.store.fsyncdir(&self.ns.node(&p)?, false) {
                    st.created.store(true, Release);
                    return Err(e);
                }
            }
        }
        let upto = st.dirty.lock().as_ref().map(|d| d.done_upto());
        if let Some(upto) = upto {
            let done = self
                .journal
                .done(st.journal_key.0, st.journal_key.1, upto)
                .map_err(|e| {
                    tracing::error!("write-back journal: {e}");
                    Errno::EIO
                })?;
            st.done_seq.fetch_max(done, AcqRel);
        }
        if let Some(d) = st.dirty.lock().as_mut() {
            d.error = None;
        }
        if conflict.is_some() {
            *st.pending_error.lock() = conflict;
        }
        self.settle_clean(i);
        Ok(true)
    }

    /// A deferred extending truncate of a new file (`ns_truncate`): the store file gets the
    /// size the application gave it, before the data is written into it (so its holes stay
    /// holes). Its zeros are then cached as after a truncate done on the store, when the file
    /// was empty there, and the runs written next patch them.
    fn flush_grow(
        &self,
        st: &crate::file_state::FileState,
        node: &crate::shared::Node<S>,
        h: &crate::shared::Handle<S>,
    ) -> Result<()> {
        let _w = st.rw.write();
        let Some((seq, size, ahead)) = st
            .dirty
            .lock()
            .as_ref()
            .and_then(|d| Some((d.grow?, d.size, d.written_ahead)))
        else {
            return Ok(());
        };
        let old_size = st.version().fp.size;
        let set = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        let a = {
            let _own = st.own_change();
            self.sh.store.setattr(node, Some(h), &set)?
        };
        self.ns.meta.put_attr(&a, Instant::now());
        if ahead {
            // The store has some of the data already: no zeros to cache.
            st.invalidate(Some(&a));
        } else {
            self.data.resized(st, old_size, &a, size);
        }
        if let Some(d) = st.dirty.lock().as_mut() {
            d.base = Some(a.fingerprint());
            if d.grow == Some(seq) {
                d.grow = None;
            }
        }
        Ok(())
    }

    /// What a run written to the store leaves, under the file's lock, briefly. A fetch that
    /// overlapped the write saw the fingerprint move and was discarded (stale); cached blocks
    /// of this version are patched with what was written, so they stay valid. Blocks a piece
    /// of the run covers whole are cached too, as slices of the piece (no copy: see
    /// `Objects::patch_blocks_shared`), as write-through does: data read back after its
    /// flush is served from RAM, not fetched again. (Runs over 1 MiB used to patch cached
    /// blocks only, for the copy under this lock, on the grounds that a streaming writer's
    /// data is in the kernel's page cache anyway; it is not for a file opened for writing
    /// only, which gets direct I/O, `fuse.direct_write_only`: a build reading back the
    /// objects it wrote fetched them all from the store again, 156 MiB over sshfs for a
    /// `cargo build`.) No fstat per run, as in write-through (`FileState::wrote`): over sshfs
    /// each was a round trip per 4 MiB written, and a 512 MiB write-back job ran at 0.85x the
    /// store's own. The fingerprint stays provisional until the group's end settles it.
    fn landed(&self, st: &crate::file_state::FileState, run: &crate::dirty::Run) {
        let _w = st.rw.write();
        let v = st.version();
        let (mut at, mut size) = (run.offset, v.fp.size);
        for p in &run.pieces {
            let grown = size.max(at + p.len() as u64);
            self.data.patch_blocks_shared(v.gen, size, at, p, grown);
            at += p.len() as u64;
            size = grown;
        }
        st.wrote(v.gen, size);
        self.account_flushed(st, run);
        st.flush_gen.fetch_add(1, AcqRel);
    }

    /// Attributes the store gave, under the file's lock, after this group's writes: they
    /// settle the provisional fingerprint the runs left if they show the size the runs
    /// explain, else someone else changed the file meanwhile and its cached blocks go
    /// (`FileState::settle_own_writes`); without runs, our own time change.
    fn settle_flushed(&self, st: &crate::file_state::FileState, a: &tierfs_store::Attr) {
        if !st.unverified() {
            st.set_after_own_write(st.version().gen, a);
        } else {
            self.sh.settle_own_writes(st, a);
        }
    }

    /// Flushes all of one file now (fsync, close with `writeback.close=flush`, before a
    /// namespace operation on it), waiting for a flusher that holds it.
    pub(crate) fn flush_file_now(&self, i: &Arc<Inode<St<S>>>) -> Result<()> {
        let Some(st) = &i.file else { return Ok(()) };
        if !st.has_dirty.load(Acquire) {
            return self.done_durable(st);
        }
        loop {
            if self.chattr_pending(i.ino) {
                // Its deferred setattr first (see `waits_for_namespace`); at once the
                // store's error if the namespace flusher is failing already (an unmount over
                // a failing store keeps both in the journal, replayed in order, and does not
                // wait for each).
                if let Some(e) = self.ns.prov.stalled_error() {
                    return Err(e);
                }
                self.drain_ns()?;
            }
            if st
                .flushing
                .compare_exchange(false, true, AcqRel, Acquire)
                .is_ok()
            {
                if self.chattr_pending(i.ino) {
                    // Deferred while this waited for the file (a truncate holds it then).
                    st.flushing.store(false, Release);
                    continue;
                }
                break;
            }
            let mut g = self.wake_lock.lock();
            self.wake.wait_for(&mut g, Duration::from_millis(20));
        }
        let r = self.flush_group(i, u64::MAX);
        let how = if r.is_ok() {
            Flushed::Synced
        } else {
            Flushed::Failed
        };
        self.unclaim(i, how);
        r?;
        self.done_durable(st)
    }

    /// The file's last DONE durable before the caller is told its data is on the store (a
    /// background flush may have written it, and fsync found nothing dirty): lost in a crash
    /// or a power cut while older records of the file are in the journal, a replay would
    /// write them over what fsync acknowledged. (The crash test found it once the journal's
    /// writer lingered 2 ms for more records; the window was always there for a power cut.)
    fn done_durable(&self, st: &crate::file_state::FileState) -> Result<()> {
        let seq = st.done_seq.load(Acquire);
        if seq == 0 {
            return Ok(());
        }
        self.journal.sync(seq).map_err(|e| {
            tracing::error!("write-back journal: {e}");
            Errno::EIO
        })
    }

    /// Flushes every dirty file (a directory rename, unmount).
    pub(crate) fn flush_all(&self) -> Result<()> {
        let files: Vec<_> = self.files.lock().values().cloned().collect();
        let mut first_err = Ok(());
        for i in files {
            if let Err(e) = self.flush_file_now(&i) {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }

    /// Before a namespace operation on `parent/name` (rename, unlink): its data first.
    /// A rename of a file never reaches the backing store before that file's data, and the
    /// journal's paths stay true. A directory moves every dirty file under it: all are
    /// flushed (directory renames are rare; tracking which files lie below is not worth it).
    pub(crate) fn settle_name(&self, parent: u64, name: &OsStr) -> Result<()> {
        if self.files.lock().is_empty() {
            return Ok(());
        }
        let p = self.ns.inode(parent)?;
        let Ok((_, attr)) = self.sh.store.lookup(&self.ns.node(&p)?, name) else {
            return Ok(());
        };
        if attr.kind == FileKind::Dir {
            return self.flush_all();
        }
        // Dirty files are keyed by the identity their journal records carry, which is not the
        // store's when the file was created by deferred namespace write-back (or renamed
        // through tierfs with path identities): matched by the inode's identity then.
        let id = (attr.dev, attr.ino);
        let i = {
            let files = self.files.lock();
            files
                .get(&id)
                .or_else(|| files.values().find(|i| i.id() == id))
                .cloned()
        };
        match i {
            Some(i) => {
                self.flush_file_now(&i)?;
                // The flush's DONE durable before the name changes: a replay of the file's
                // records would look for it under the name they carry.
                self.journal.sync_all().map_err(|e| {
                    tracing::error!("write-back journal: {e}");
                    Errno::EIO
                })
            }
            None => Ok(()),
        }
    }

    /// Before a truncate or fallocate of `i`: its dirty data goes first, so the backing
    /// store applies them in the order the application made them.
    pub(crate) fn settle_file(&self, i: &Arc<Inode<St<S>>>) -> Result<()> {
        self.flush_file_now(i)
    }
}
