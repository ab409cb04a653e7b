//! Changes of attributes (`Fs::setattr`): truncates, chmod, chown, times, and the dropping
//! of setuid/setgid that the kernel leaves to us (FUSE_HANDLE_KILLPRIV_V2).

use super::Fs;
use tierfs_store::{Attr, Errno, Result, SetAttr, Store};

impl<S: Store> Fs<S> {
    /// The permission bits the file keeps once setuid/setgid are dropped
    /// (`Attr::perm_without_privs`), from the cached attributes when they are there (the
    /// common file without these bits costs no store call). None: nothing to drop.
    fn perm_without_privs(&self, ino: u64) -> Result<Option<u32>> {
        let a = match self.getattr_fast(ino) {
            Some((a, _)) => a,
            None => self.getattr(ino)?,
        };
        Ok(a.perm_without_privs())
    }

    /// A write or truncation by a caller without CAP_FSETID (the kernel marks such writes
    /// FUSE_WRITE_KILL_SUIDGID and, with FUSE_HANDLE_KILLPRIV_V2, leaves the clearing to us):
    /// clears setuid, and setgid if group-execute is set, before the change lands.
    pub fn kill_suidgid(&self, ino: u64, fh: Option<u64>) -> Result<()> {
        let Some(perm) = self.perm_without_privs(ino)? else {
            return Ok(());
        };
        let set = SetAttr {
            mode: Some(perm),
            ..Default::default()
        };
        self.setattr(ino, fh, &set).map(|_| ())
    }

    /// [`Fs::setattr`] of a change that drops setuid and setgid (a chown; a truncation by a
    /// caller without CAP_FSETID), which the kernel leaves to us under
    /// FUSE_HANDLE_KILLPRIV_V2 (it used to ask for the attributes first, one GETATTR per
    /// chown, and add the mode itself): the mode change goes with it, in one setattr.
    pub fn setattr_dropping_privs(&self, ino: u64, fh: Option<u64>, set: &SetAttr) -> Result<Attr> {
        let mut set = *set;
        if set.mode.is_none() {
            set.mode = self.perm_without_privs(ino)?;
        }
        self.setattr(ino, fh, &set)
    }

    /// A truncate past the store's largest file: refused at the call, as the store would
    /// (write-back would otherwise acknowledge it and fail at every flush).
    pub(crate) fn past_largest_file(&self, set: &SetAttr) -> bool {
        set.size.is_some_and(|s| s > self.sh.store.max_file_size())
    }

    pub fn setattr(&self, ino: u64, fh: Option<u64>, set: &SetAttr) -> Result<Attr> {
        if self.past_largest_file(set) {
            return Err(Errno(libc::EFBIG));
        }
        if let Some(r) = self.setattr_fast(ino, set) {
            return r;
        }
        let i = self.ns.inode(ino)?;
        if let Some(wb) = self.wb() {
            if set.size.is_some() {
                // The dirty data first, so the truncate applies after it.
                wb.settle_file(&i)?;
            } else if let Some(m) = &set.mtime {
                // A time set on a file with dirty data (tar, cp -p, rsync after writing a
                // file) is kept with the dirty data and applied after its flush, which would
                // otherwise move mtime again; flushing here would cost a sync per file.
                wb.note_dirty_mtime(&i, m);
            }
        }
        self.before_setattr(&i, set)?;
        let a = self.data.setattr(&i, fh, set);
        self.ns.listed_changed(&i);
        let a = a?;
        if let (Some(_), Some(fh)) = (self.wb(), fh) {
            if set.size.is_some() && self.sh.store.publishes_at_sync() {
                // Write-back on a store that publishes at sync (S3): a truncate through a
                // handle is staged in that handle, outside the journal, and write-back's close
                // does not upload (an fsync of another descriptor right after close found
                // the bucket without it). A truncate is synchronous in write-back: publish it.
                self.data.fsync(ino, fh, false, false)?;
            }
        }
        Ok(self.shown(ino, a))
    }
}
