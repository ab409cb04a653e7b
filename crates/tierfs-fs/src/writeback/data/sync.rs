//! fsync and close(2) in write-back mode: what each waits for (`writeback.fsync`,
//! `writeback.close`), and the flush errors they report.

use super::Writeback;
use crate::inode::Inode;
use crate::shared::St;
use std::sync::Arc;
use tierfs_store::{Errno, Result, Store};

impl<S: Store> Writeback<S> {
    /// fsync/fdatasync in write-back mode: the file's data durable on the backing store
    /// (`writeback.fsync=backing`) or in the journal (`journal`); then a flush error not yet
    /// reported is reported.
    pub(crate) fn fsync_back(&self, i: &Arc<Inode<St<S>>>) -> Result<()> {
        let Some(st) = &i.file else { return Ok(()) };
        match self.live.fsync() {
            super::FsyncMode::Backing => self.flush_file_now(i)?,
            super::FsyncMode::Journal => {
                let seq = st.dirty.lock().as_ref().map(|d| d.max_seq);
                if let Some(seq) = seq {
                    self.journal.sync(seq).map_err(|e| {
                        tracing::error!("write-back journal: {e}");
                        Errno::EIO
                    })?;
                }
            }
        }
        self.take_flush_error(i, true)
    }

    /// A flush error of this file not yet reported to the application, taken. `fsync`: a
    /// file's data set aside for good (`pending_error`: refused, or a conflict) is reported
    /// by every close and taken by the next fsync only, as the kernel's `errseq` does for a
    /// file's write errors: a close of a duplicate descriptor (a child process of the
    /// application closing it at exec) must not take it from the application's fsync. (An
    /// error of data still dirty is found again by the fsync's own flush.)
    pub(crate) fn take_flush_error(&self, i: &Inode<St<S>>, fsync: bool) -> Result<()> {
        let Some(st) = &i.file else { return Ok(()) };
        let e = st.dirty.lock().as_mut().and_then(|d| d.error.take());
        let pending = || {
            let mut p = st.pending_error.lock();
            if fsync {
                p.take()
            } else {
                *p
            }
        };
        match e.or_else(pending) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// [`Writeback::flush`] when it waits for nothing: None with `writeback.close=flush`.
    pub(crate) fn flush_fast(&self, ino: u64) -> Option<Result<()>> {
        if self.live.close() == super::CloseMode::Flush {
            return None;
        }
        Some(self.flush(ino))
    }

    /// close(2) waits for nothing (`writeback.close=async`, the default).
    pub(crate) fn close_is_async(&self) -> bool {
        self.live.close() == super::CloseMode::Async
    }

    /// close(2) in write-back mode (FUSE FLUSH).
    pub fn flush(&self, ino: u64) -> Result<()> {
        let i = self.ns.inode(ino)?;
        if self.live.close() == super::CloseMode::Flush {
            self.flush_file_now(&i)?;
        }
        match self.take_flush_error(&i, false) {
            // The store is gone for now (see `health`): the data waits in the journal and is
            // written once it is back; close(2) with `writeback.close=async` promises no more.
            Err(Errno::ENOTCONN) if self.live.close() == super::CloseMode::Async => Ok(()),
            r => r,
        }
    }
}
