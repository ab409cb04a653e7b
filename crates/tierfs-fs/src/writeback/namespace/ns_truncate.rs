//! Deferred truncates (see `ns`) of a file write-back made and has not published yet.
//!
//! **To zero:** an `open(O_TRUNC)` or `ftruncate(fd, 0)` of a file written moments before (a
//! build step writing its output twice, `std::fs::write` over a new file, a log rotated at
//! once). It used to wait for every deferred operation before it, the file's create on the
//! store and its data's flush, then truncate the store file.
//!
//! None of such a file's data is on the store: the data flushers leave a file alone until
//! the namespace flusher publishes it (after its create is applied and no job of it is
//! queued), and it publishes under the queue's lock, which this holds. The store has no
//! object or an empty one, made by the create. So truncating the file is dropping its dirty
//! data: the data is discarded, a DROP record up to its last write tells replay to skip it
//! (the create is replayed if it was not applied, then only the writes after the DROP), and
//! the file shows size 0 at once. The store gets the create and what was written after the
//! truncate, nothing else.
//!
//! **Longer:** an `ftruncate` that extends such a file. A linker (`lld`, `mold`) sizes its
//! new output so, then writes it through mmap: in a `cargo build` over sshfs each waited for
//! the file's create and everything queued before it (20 waits, 2.5 s). The file's dirty
//! state takes the new size (reads see zeros past the data, as they would on the store) and
//! a *grow* (`Dirty::grow`); the journal gets an empty DATA record at the new size, which
//! replay applies by extending the file to it (never shortening it). Its data flush, after
//! the file is published, sets the store file's size first, then writes the data: the holes
//! stay holes (`SEEK_DATA` finds what a local filesystem finds), and the zeros are cached as
//! the flush after a store truncate caches them (`Objects::cache_zeros`).
//!
//! Kept narrow: size 0 or longer (a shorter nonzero size would need a record of its own for
//! replay), of a regular file with one name whose create the store has not refused, and none
//! of whose data a replace wrote ahead (`ns_replace`: then the store has some of it).
//! Any other truncate of a new file is done on the store once the file's own operations are
//! there (`settle_for_truncate`): not after everything deferred before it, which on a slow
//! store was seconds of other files' creates.

use super::write::now_ns;
use super::Writeback;
use crate::dirty::Dirty;
use crate::inode::Inode;
use crate::namespace::is_provisional;
use crate::shared::St;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::Arc;
use tierfs_cache::journal::FileRef;
use tierfs_store::{Attr, FileKind, Result, Store, TimeSpec};

impl<S: Store> Writeback<S> {
    /// `inode` as a file whose truncate may be deferred: a regular file write-back made, with
    /// one name, whose create the store has not refused (its identity and state).
    fn unpublished_file<'a>(
        &self,
        inode: &'a Arc<Inode<St<S>>>,
    ) -> Option<(crate::identity::Ident, &'a crate::file_state::FileState)> {
        let id = inode.id();
        if !self.defers_namespace() || !is_provisional(id) || inode.kind != FileKind::File {
            return None;
        }
        if self.ns.prov.alias(id).is_some() || self.ns.prov.failure(id).is_some() {
            return None;
        }
        Some((id, inode.file.as_deref()?))
    }

    /// Truncates provisional file `inode` to zero bytes without the store (see the module
    /// comment): its attributes then. None: not such a file, or the journal could not take
    /// the DROP (the truncate is then done on the store, after [`Writeback::drain_ns`]).
    pub(crate) fn truncate_deferred(&self, inode: &Arc<Inode<St<S>>>) -> Option<Attr> {
        let (id, st) = self.unpublished_file(inode)?;
        // Under the queue's lock the flusher cannot publish it (see the module comment).
        let q = self.nsq.q.lock();
        if !is_provisional(inode.id()) {
            return None;
        }
        // Writers of the file wait: a write after the DROP is kept, one before it dropped.
        let _w = st.rw.write();
        let dirty = st
            .dirty
            .lock()
            .as_ref()
            .map(|d| (d.max_seq, d.written_ahead));
        if dirty.is_some_and(|(_, ahead)| ahead) {
            // Some of its data may be on the store already (`ns_replace`).
            return None;
        }
        let upto = dirty.map(|(s, _)| s).filter(|&s| s > 0);
        if let Some(upto) = upto {
            // The DROP first: if the journal cannot take it, nothing has changed.
            let (dev, ino) = st.journal_key;
            if let Err(e) = self.journal.drop_file(dev, ino, upto) {
                tracing::debug!("write-back journal: {e}: the truncate is done on the store");
                return None;
            }
            // Dropping cannot fail.
            let _ = self.take_dirty_runs(st, |_| Ok(()));
            self.settle_clean(inode);
        }
        let now = TimeSpec::now();
        let attr = self.ns.prov.update_attr(id, |a| {
            a.size = 0;
            a.blocks = 0;
            a.mtime = now;
            a.ctime = now;
        });
        // The create makes the object empty: nothing is queued. (The data written next
        // waits for the create anyway.)
        drop(_w);
        drop(q);
        self.c.ns_truncated.fetch_add(1, Relaxed);
        attr
    }

    /// Extends provisional file `inode` to `size` without the store (see the module
    /// comment): its attributes then. None: not such a file, a shorter size, or the journal
    /// could not take the record (the truncate is then done on the store, after its own
    /// operations: [`Writeback::settle_for_truncate`]). No I/O: called on the dispatching
    /// thread.
    pub(crate) fn grow_deferred(&self, inode: &Arc<Inode<St<S>>>, size: u64) -> Option<Attr> {
        let (id, st) = self.unpublished_file(inode)?;
        let path = self.backing_path(inode)?;
        // Under the queue's lock the flusher cannot publish it (see the module comment).
        let q = self.nsq.q.lock();
        if !is_provisional(inode.id()) {
            return None;
        }
        let shown = self.ns.prov.attr(id)?.size;
        let _w = st.rw.write();
        let mut g = st.dirty.lock();
        let now_size = g.as_ref().map_or(shown, |d| d.size);
        if size < now_size || g.as_ref().is_some_and(|d| d.written_ahead) {
            return None;
        }
        let created = g.is_none();
        let d = g.get_or_insert_with(|| {
            let v = st.version();
            let mut d = Dirty::new(now_size, path);
            d.base = Some(v.fp);
            d
        });
        let file = FileRef {
            dev: st.journal_key.0,
            ino: st.journal_key.1,
            path: d.path.clone(),
        };
        let seq = match self.journal.append_data(&file, size, &[]) {
            Ok(seq) => seq,
            Err(e) => {
                tracing::debug!("write-back journal: {e}: the truncate is done on the store");
                if created {
                    *g = None;
                }
                return None;
            }
        };
        d.size = size;
        d.grow.get_or_insert(seq);
        d.max_seq = d.max_seq.max(seq);
        d.mtime_ns = now_ns();
        d.last_write = std::time::Instant::now();
        st.has_dirty.store(true, Release);
        if created
            && self
                .files
                .lock()
                .insert(st.journal_key, inode.clone())
                .is_none()
        {
            // (No flusher to wake: the file is theirs once it is published.)
            self.c.dirty_files.fetch_add(1, Relaxed);
        }
        drop(g);
        drop(_w);
        let now = TimeSpec::now();
        let attr = self.ns.prov.update_attr(id, |a| {
            a.size = size;
            a.mtime = now;
            a.ctime = now;
        });
        drop(q);
        self.c.ns_truncated.fetch_add(1, Relaxed);
        attr
    }

    /// Before a truncate of provisional file `inode` done on the store (one
    /// [`Writeback::truncate_deferred`] declined): the operations it depends on are there.
    /// Those are the file's own (its create, and what is queued of it after): a truncate
    /// changes nothing another name or directory holds. The rest stays queued, its records
    /// made durable first, so that a crash cannot leave the store with the truncate and
    /// without operations the application made before it (as `ns_narrow` does).
    pub(crate) fn settle_for_truncate(&self, inode: &Arc<Inode<St<S>>>) -> Result<()> {
        let id = inode.id();
        let upto = {
            let q = self.nsq.q.lock();
            q.iter()
                .filter(|j| j.inode().id() == id)
                .map(|j| j.seq())
                .max()
        };
        // None: its create was taken by the flusher (applied with its group).
        self.drain_ns_to(upto.unwrap_or(id.1).max(id.1))?;
        self.sync_deferred()
    }
}

/// Replays a deferred extending truncate (its empty DATA record at `size`): the file open as
/// `h` grows to `size` bytes if it is shorter, and is never cut.
pub(super) fn replay_grow<S: Store>(
    store: &St<S>,
    node: &crate::shared::Node<S>,
    h: &crate::shared::Handle<S>,
    size: u64,
) -> Result<()> {
    if store.fstat(h)?.size < size {
        let set = tierfs_store::SetAttr {
            size: Some(size),
            ..Default::default()
        };
        store.setattr(node, Some(h), &set)?;
    }
    Ok(())
}
