//! What becomes of a file whose deferred create, or deferred truncate, the store refused
//! (see `ns`, `ns_chattr`).

use super::Writeback;
use crate::inode::Inode;
use crate::shared::St;
use std::sync::Arc;
use tierfs_store::{Errno, Result, Store};

impl<S: Store> Writeback<S> {
    /// A file whose create the store refused: its dirty data is saved under `lost/` in the
    /// journal directory (never written over the other's file, never dropped), the journal
    /// lets go of it, and the application hears EIO at its next fsync or close.
    pub(crate) fn flush_refused(&self, i: &Arc<Inode<St<S>>>, e: Errno) -> Result<bool> {
        self.save_lost(i, e, "the store refused to create it")
    }

    /// A file of the store whose deferred truncate the store refused (ETXTBSY: a program
    /// runs it; EPERM): the data written after the truncate is saved under `lost/` as for a
    /// refused create, never written over the old contents the store kept (a mix of both),
    /// and the file is again what the store has. The caller holds the file's `rw`.
    pub(crate) fn truncate_refused(&self, i: &Arc<Inode<St<S>>>, e: Errno) -> Result<bool> {
        self.save_lost(i, e, "the store refused to truncate it")
    }

    /// A file whose data the store refused for good (`ns_apply::refused_for_good`: EFBIG
    /// past its largest file): saved under `lost/` as for a refused create, the
    /// journal lets go of it (nothing queued after it waits), the application hears EIO at
    /// its next fsync or close, and the file is again what the store has.
    pub(crate) fn data_refused(&self, i: &Arc<Inode<St<S>>>, e: Errno) -> Result<bool> {
        let r = self.save_lost(i, e, "the store refused its data");
        if let Some(st) = &i.file {
            st.invalidate(None);
            st.flush_gen
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.ns.meta.drop_attr(i.id());
        r
    }

    fn save_lost(&self, i: &Arc<Inode<St<S>>>, e: Errno, why: &str) -> Result<bool> {
        use std::os::unix::fs::FileExt;
        let Some(st) = i.file.clone() else {
            return Ok(true);
        };
        let (dev, ino) = st.journal_key;
        let lost = self.dir.join("lost");
        let io = |what: &str, err: std::io::Error| {
            tracing::error!("write-back: {what} {}: {err}", lost.display());
            Errno::EIO
        };
        tierfs_cache::private::dir_all(&lost).map_err(|er| io("create", er))?;
        let f = lost.join(format!("{dev:x}-{ino}"));
        let out = tierfs_cache::private::options()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&f)
            .map_err(|er| io("open", er))?;
        self.take_dirty_runs(&st, |run| {
            out.write_all_at(&run.pieces.concat(), run.offset)
                .map_err(|er| io("write", er))
        })?;
        out.sync_all().map_err(|er| io("sync", er))?;
        let path = st
            .dirty
            .lock()
            .as_ref()
            .map(|d| String::from_utf8_lossy(&d.path).into_owned())
            .unwrap_or_default();
        let report = format!(
            "file: {path}\nwhy: {why} ({e}) when write-back applied it\nsaved: {}\n",
            f.display()
        );
        std::fs::write(lost.join(format!("{dev:x}-{ino}.txt")), report)
            .map_err(|er| io("write", er))?;
        let upto = st.dirty.lock().as_ref().map(|d| d.done_upto());
        if let Some(upto) = upto {
            self.journal.done(dev, ino, upto).map_err(|er| {
                tracing::error!("write-back journal: {er}");
                Errno::EIO
            })?;
        }
        tracing::error!("write-back: the data of {path} is saved in {}", f.display());
        *st.pending_error.lock() = Some(Errno::EIO);
        let untruncated = st
            .dirty
            .lock()
            .as_mut()
            .is_some_and(|d| std::mem::replace(&mut d.truncate_pending, false));
        if untruncated {
            // The store's bytes are the file's again, read anew.
            st.invalidate(None);
            st.flush_gen
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        self.settle_clean(i);
        Ok(true)
    }
}
