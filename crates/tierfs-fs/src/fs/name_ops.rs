//! The operations of [`Fs`] that make, remove and rename names. Each waits for the namespace
//! operations write-back deferred before it (`deferred`), and for the dirty data of a file it
//! names, so the store sees them in the application's order; each reports what it changed to
//! the SSD tier's listings (`namespace::persisted`).

use super::Fs;
use crate::namespace::{Entry, Requester};
use std::ffi::OsStr;
use tierfs_store::{Result, Store};

impl<S: Store> Fs<S> {
    /// Our own operation changed `ino` (its attributes, or a directory's names): the SSD-tier
    /// listing that holds it is out of date (see `namespace::persisted`). Called after the
    /// operation, failed or not (a failure may have changed the store halfway).
    pub(super) fn names_changed(&self, ino: u64) {
        if let Some(i) = self.ns.inodes.get(ino) {
            self.ns.listed_changed(&i);
        }
    }

    /// After a name operation the store did (not deferred) in directory `dir`: write-back
    /// shows it in the directory's shadow, if deferred names in it are still on their way.
    fn changed_on_store(&self, dir: u64) {
        if let (Some(wb), Some(i)) = (self.wb(), self.ns.inodes.get(dir)) {
            wb.dir_touched(i.id());
        }
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        req: Requester,
    ) -> Result<Entry> {
        let r = self.mknod_deferred(parent, name, mode, rdev, req);
        self.names_changed(parent);
        if let Some(e) = r? {
            return Ok(e);
        }
        self.not_deferred("mknod", name, None);
        self.drain_ns()?;
        let r = self.ns.mknod(parent, name, mode, rdev, req);
        self.names_changed(parent);
        if let (Ok(_), Some(wb)) = (&r, self.wb()) {
            wb.mknod_made(mode);
        }
        r
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, req: Requester) -> Result<Entry> {
        let r = self.mkdir_deferred(parent, name, mode, req, true);
        self.names_changed(parent);
        if let Some(e) = r? {
            return Ok(e);
        }
        self.drain_ns()?;
        let r = self.ns.mkdir(parent, name, mode, req);
        self.names_changed(parent);
        r
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
        req: Requester,
    ) -> Result<Entry> {
        let r = self.symlink_deferred(parent, name, target, req);
        self.names_changed(parent);
        if let Some(e) = r? {
            return Ok(e);
        }
        self.drain_ns()?;
        let r = self.ns.symlink(parent, name, target, req);
        self.names_changed(parent);
        r
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Entry> {
        if let Some(e) = self.link_deferred(ino, newparent, newname)? {
            self.names_changed(ino);
            self.names_changed(newparent);
            return Ok(self.shown_entry(e));
        }
        self.not_deferred("link", newname, None);
        self.drain_ns_for_link(ino, newparent, newname)?;
        // (Not the file's data first, as a rename of it waits for: the name its journal
        // records carry stays, and an unlink or rename of that name flushes them first.)
        let r = self.ns.link(ino, newparent, newname);
        self.names_changed(ino); // its link count
        self.names_changed(newparent);
        if r.is_ok() {
            self.changed_on_store(newparent);
        }
        Ok(self.shown_entry(r?))
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<()> {
        if self.unlink_deferred(parent, name) {
            self.names_changed(parent);
            return Ok(());
        }
        self.not_deferred("unlink", name, None);
        self.drain_ns_for(parent, name, None, false)?;
        self.settle_name(parent, name)?;
        let r = self.ns.unlink(parent, name);
        self.names_changed(parent);
        if r.is_ok() {
            self.changed_on_store(parent);
        }
        r
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        if self.rmdir_deferred(parent, name) {
            self.names_changed(parent);
            return Ok(());
        }
        self.drain_ns()?;
        let r = self.ns.rmdir(parent, name);
        self.names_changed(parent);
        r
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        if self.rename_deferred(parent, name, newparent, newname, flags) {
            self.names_changed(parent);
            if newparent != parent {
                self.names_changed(newparent);
            }
            return Ok(());
        }
        self.not_deferred("rename", name, Some(newname));
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        self.drain_ns_for(parent, name, Some((newparent, newname)), exchange)?;
        // A file's data reaches the backing store before its new name does.
        self.settle_name(parent, name)?;
        self.settle_name(newparent, newname)?;
        let r = self.ns.rename(parent, name, newparent, newname, flags);
        self.names_changed(parent);
        self.names_changed(newparent);
        if r.is_ok() {
            self.changed_on_store(parent);
            self.changed_on_store(newparent);
        }
        r
    }
}

impl<S: Store> Fs<S> {
    /// Write-back: a namespace operation done on the store, after the deferred ones it
    /// depends on (`TIERFS_LOG=tierfs_fs::ns_wait=debug`, with the waits themselves): which
    /// to defer next. (Nothing in write-through, where nothing is deferred.)
    fn not_deferred(&self, op: &str, name: &OsStr, to: Option<&OsStr>) {
        if self.wb().is_none() {
            return;
        }
        tracing::debug!(
            target: "tierfs_fs::ns_wait",
            op,
            name = %name.to_string_lossy(),
            to = %to.map(|t| t.to_string_lossy()).unwrap_or_default(),
            "not deferred"
        );
    }
}
