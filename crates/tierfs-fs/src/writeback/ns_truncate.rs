//! A deferred truncate to zero (see `ns`) of a file write-back made whose create the
//! namespace flusher has not taken yet: an `open(O_TRUNC)` or `ftruncate(fd, 0)` of a file
//! written moments before (a build step writing its output twice, `std::fs::write` over a
//! new file, a log rotated at once). It used to wait for every deferred operation before it,
//! the file's create on the store and its data's flush, then truncate the store file.
//!
//! Such a file has nothing on the store yet (its create makes it empty), so truncating it is
//! dropping its dirty data: the data is discarded, a DROP record up to its last write tells
//! replay to skip that data (the create is replayed, then only the writes after the DROP),
//! and the file shows size 0 at once. The store gets the create and what was written after
//! the truncate, nothing else.
//!
//! Kept narrow: size 0 only (a shorter or longer size would need a record of its own for
//! replay), of a regular file whose create is still queued and never taken, with one name.
//! Anything else is done on the store after the deferred operations before it, as before.

use super::ns_queue::untaken_create;
use super::Writeback;
use crate::inode::Inode;
use crate::namespace::is_provisional;
use crate::shared::St;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_store::{Attr, FileKind, Store, TimeSpec};

impl<S: Store> Writeback<S> {
    /// Truncates provisional file `inode` to zero bytes without the store (see the module
    /// comment): its attributes then. None: not such a file, or the journal could not take
    /// the DROP (the truncate is then done on the store, after [`Writeback::drain_ns`]).
    pub(crate) fn truncate_deferred(&self, inode: &Arc<Inode<St<S>>>) -> Option<Attr> {
        let id = inode.id();
        if !self.defers_namespace() || !is_provisional(id) || inode.kind != FileKind::File {
            return None;
        }
        let st = inode.file.as_ref()?;
        if self.ns.prov.alias(id).is_some() || self.ns.prov.failure(id).is_some() {
            return None;
        }
        // Under the queue's lock: the flusher cannot take the create meanwhile, and the data
        // flushers leave a file alone until its create is applied, so none of its data is
        // on its way to the store.
        let q = self.nsq.q.lock();
        untaken_create(&q, id)?;
        // Writers of the file wait: a write after the DROP is kept, one before it dropped.
        let _w = st.rw.write();
        let upto = st
            .dirty
            .lock()
            .as_ref()
            .map(|d| d.max_seq)
            .filter(|&s| s > 0);
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
}
