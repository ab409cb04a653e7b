//! The dispatcher's part in write-back of namespace operations (`writeback::ns`,
//! `writeback.namespace=back`): which operations are acknowledged before the store has them
//! (create, mkdir, symlink, and attribute changes of objects made that way), what a provisional object
//! answers without the store (open, xattrs), and the wait before every other namespace
//! operation until the deferred ones before it are on the store, so the store always sees
//! them in the order the application made them.

use super::Fs;
use crate::data::OpenReply;
use crate::inode::Inode;
use crate::namespace::{is_provisional, Entry, Requester};
use crate::shared::St;
use std::ffi::OsStr;
use std::sync::atomic::Ordering::Acquire;
use std::sync::Arc;
use tierfs_store::{Attr, Errno, FileKind, Result, SetAttr, Store};

impl<S: Store> Fs<S> {
    /// Write-back: every namespace operation deferred so far is on the store (or refused).
    /// Before an operation that is not deferred (rename, unlink, a create the cache cannot
    /// vouch for), a listing, fsync.
    #[track_caller]
    pub(super) fn drain_ns(&self) -> Result<()> {
        match self.wb() {
            Some(wb) => wb.drain_ns(),
            None => Ok(()),
        }
    }

    /// Before an unlink of `parent/name` (`to` None) or its rename to `to` done on the
    /// store: the deferred operations it depends on are on the store (`ns_narrow`: fewer
    /// than all of them when both names are files of the store, else [`Fs::drain_ns`]).
    /// `exchange`: a `RENAME_EXCHANGE`, which moves what `to` holds as well.
    #[track_caller]
    pub(super) fn drain_ns_for(
        &self,
        parent: u64,
        name: &OsStr,
        to: Option<(u64, &OsStr)>,
        exchange: bool,
    ) -> Result<()> {
        let Some(wb) = self.wb() else { return Ok(()) };
        let upto = || {
            let p = self.ns.inode(parent).ok()?;
            match to {
                None => wb.settled_upto(&p, name, None, false),
                Some((np, nn)) => {
                    wb.settled_upto(&p, name, Some((&self.ns.inode(np).ok()?, nn)), exchange)
                }
            }
        };
        Self::drain_ns_upto(wb, upto())
    }

    /// The narrow wait `ns_narrow` found (`Some(seq)`: the operations up to `seq`, with every
    /// record appended so far made durable), else the wait for everything.
    #[track_caller]
    fn drain_ns_upto(wb: &crate::writeback::Writeback<S>, upto: Option<u64>) -> Result<()> {
        match upto {
            Some(seq) => {
                wb.drain_ns_to(seq)?;
                wb.sync_deferred()
            }
            None => wb.drain_ns(),
        }
    }

    /// Before a link of `ino` as `newparent/newname` done on the store: as
    /// [`Fs::drain_ns_for`] a rename of its name there would (`ns_narrow`): a link of a file
    /// of the store to a free name touches nothing the queued operations make. (`cargo`
    /// hard-links each artifact it builds from `deps/` into the target directory: with a
    /// wait for everything, 183 links of a build over sshfs waited 11 s.)
    #[track_caller]
    pub(super) fn drain_ns_for_link(
        &self,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> Result<()> {
        let Some(wb) = self.wb() else { return Ok(()) };
        let upto = || {
            let i = self.ns.inode(ino).ok()?;
            let (p, name) = i.origin.lock().clone()?;
            let np = self.ns.inode(newparent).ok()?;
            wb.settled_upto(&p, &name, Some((&np, newname)), false)
        };
        Self::drain_ns_upto(wb, upto())
    }

    /// A create acknowledged before the store has it, or None (do it on the store, after
    /// [`Fs::drain_ns`]).
    pub(super) fn create_deferred(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        req: Requester,
        io: bool,
    ) -> Result<Option<(Entry, OpenReply)>> {
        let Some(wb) = self.wb() else { return Ok(None) };
        let p = self.ns.inode(parent)?;
        let excl = flags & libc::O_EXCL != 0;
        let Some((inode, e)) =
            wb.create_deferred(&p, name, FileKind::File, mode, excl, req, io, None, 0)?
        else {
            return Ok(None);
        };
        // No backing handle: writes go to the journal, and a read that needs the store
        // waits for the object there (`Namespace::node`). The handle opened on first need
        // (a read once the data is flushed, a seek, a truncate through it) must not
        // truncate the file the flush wrote: `File::create`'s O_TRUNC is for the new file,
        // which was empty.
        let fh = self
            .data
            .add_open_file(inode, None, flags & !libc::O_TRUNC)?;
        // Its close sends no FLUSH: one FUSE request less per created file (an untar's
        // close). All such a close could do is report a flush error found while the file was
        // open, which is rare (its data waits for its create) and stays pending for fsync or
        // the next close of the file (docs/writeback.md). Not where close itself does the
        // work (`writeback.close=flush`, or a store that publishes at close).
        let no_flush = wb.close_is_async() && !self.sh.store.publishes_at_sync();
        Ok(Some((
            e,
            OpenReply {
                fh,
                keep_cache: false,
                attrs_stale: false,
                no_flush,
            },
        )))
    }

    pub(super) fn mkdir_deferred(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        req: Requester,
        io: bool,
    ) -> Result<Option<Entry>> {
        let Some(wb) = self.wb() else { return Ok(None) };
        let p = self.ns.inode(parent)?;
        Ok(wb
            .create_deferred(&p, name, FileKind::Dir, mode, true, req, io, None, 0)?
            .map(|(_, e)| e))
    }

    /// A mknod write-back takes without the store (`Writeback::mknod_deferred`). None: done
    /// on the store.
    pub(super) fn mknod_deferred(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        req: Requester,
    ) -> Result<Option<Entry>> {
        let Some(wb) = self.wb() else { return Ok(None) };
        let p = self.ns.inode(parent)?;
        Ok(wb
            .mknod_deferred(&p, name, mode, rdev, req)?
            .map(|(_, e)| e))
    }

    pub(super) fn symlink_deferred(
        &self,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
        req: Requester,
    ) -> Result<Option<Entry>> {
        let Some(wb) = self.wb() else { return Ok(None) };
        if target.is_empty() || target.len() >= libc::PATH_MAX as usize {
            // The store's errno (ENOENT, ENAMETOOLONG), from the store.
            return Ok(None);
        }
        let p = self.ns.inode(parent)?;
        let mode = 0o777;
        Ok(wb
            .create_deferred(
                &p,
                name,
                FileKind::Symlink,
                mode,
                true,
                req,
                true,
                Some(target),
                0,
            )?
            .map(|(_, e)| e))
    }

    /// A link write-back takes without the store: of a file it made and has not sent yet,
    /// in its directory (`Writeback::link_deferred`). None: done on the store.
    pub(super) fn link_deferred(
        &self,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> Result<Option<Entry>> {
        let Some(wb) = self.wb() else { return Ok(None) };
        let i = self.ns.inode(ino)?;
        let newp = self.ns.inode(newparent)?;
        let Some(attr) = wb.link_deferred(&i, &newp, newname)? else {
            return Ok(None);
        };
        // The kernel learns the inode once more, under the new name.
        self.ns.provisional_entry(&i, attr).map(Some)
    }

    /// An unlink write-back takes without the store: of the second name a deferred link
    /// left (`Writeback::unalias_deferred`), of an object it made and has not sent
    /// yet (`Writeback::unlink_deferred`), or of one of the store, removed there later
    /// (`Writeback::remove_deferred`).
    pub(super) fn unlink_deferred(&self, parent: u64, name: &OsStr) -> bool {
        let Some(wb) = self.wb() else { return false };
        let Ok(p) = self.ns.inode(parent) else {
            return false;
        };
        let no_open = self.config().no_open();
        wb.unalias_deferred(&p, name)
            .or_else(|| wb.unlink_deferred(&p, name, no_open))
            .or_else(|| wb.remove_deferred(&p, name, no_open, false))
            .is_some()
    }

    /// An rmdir write-back takes without the store: of a directory it made and has not sent
    /// yet (`Writeback::rmdir_deferred`), or of an empty one of the store, removed there
    /// later (`Writeback::remove_deferred`).
    pub(super) fn rmdir_deferred(&self, parent: u64, name: &OsStr) -> bool {
        let Some(wb) = self.wb() else { return false };
        let Ok(p) = self.ns.inode(parent) else {
            return false;
        };
        wb.rmdir_deferred(&p, name)
            .or_else(|| wb.remove_deferred(&p, name, self.config().no_open(), true))
            .is_some()
    }

    /// A rename write-back takes without the store (see `Writeback::rename_deferred`).
    pub(super) fn rename_deferred(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> bool {
        let Some(wb) = self.wb() else { return false };
        let (Ok(p), Ok(newp)) = (self.ns.inode(parent), self.ns.inode(newparent)) else {
            return false;
        };
        wb.rename_deferred(&p, name, &newp, newname, flags, self.config().no_open())
            .is_some()
    }

    // The `_fast` entry points answer on the dispatching thread what needs neither a store
    // request nor a wait: a deferred create, mkdir or setattr costs a journal append and a few
    // table updates, less than the hand-off to the I/O pool (an untar does four of them per
    // file: create, fchown, fchmod, utimensat; and a close). None: take the pool.

    /// [`Fs::create`] when deferred without asking the store.
    pub fn create_fast(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        req: Requester,
    ) -> Option<Result<(Entry, OpenReply)>> {
        let r = self.create_deferred(parent, name, mode, flags, req, false);
        self.names_changed(parent);
        r.map(|r| r.map(|(e, o)| (self.shown_entry(e), o)))
            .transpose()
    }

    /// [`Fs::mkdir`] when deferred without asking the store.
    pub fn mkdir_fast(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        req: Requester,
    ) -> Option<Result<Entry>> {
        let r = self.mkdir_deferred(parent, name, mode, req, false);
        self.names_changed(parent);
        r.transpose()
    }

    /// Whether the truncate of an `open(O_TRUNC)` of `ino` can be deferred by write-back
    /// (`writeback::ns_chattr`, which decides: this only tells whether to try).
    pub(super) fn may_defer_truncate(&self, ino: u64) -> bool {
        let (Some(wb), Some(i)) = (self.wb(), self.ns.inodes.get(ino)) else {
            return false;
        };
        wb.defers_namespace()
            && !self.sh.store.publishes_at_sync()
            && !crate::namespace::is_provisional(i.id())
            && i.kind == FileKind::File
            // Not while a flusher writes it (the truncate would wait for it).
            && i.file.as_ref().is_some_and(|st| !st.flushing.load(Acquire))
    }

    /// [`Fs::setattr`] of a provisional object (not a size change but to zero or longer):
    /// deferred
    /// (None: not deferred, see `Writeback::setattr_deferred`).
    pub fn setattr_fast(&self, ino: u64, set: &SetAttr) -> Option<Result<Attr>> {
        if self.past_largest_file(set) {
            return Some(Err(Errno(libc::EFBIG)));
        }
        let wb = self.wb()?;
        let i = self.ns.inodes.get(ino)?;
        let mut set = *set;
        match set.size {
            None => {}
            // `ftruncate(fd, 0)`, or O_TRUNC under FUSE no-open, of a new file
            // (`writeback::ns_truncate`): the rest of the change as any other.
            Some(0) if is_provisional(i.id()) => {
                let a = wb.truncate_deferred(&i)?;
                self.ns.listed_changed(&i);
                set.size = None;
                if set == SetAttr::default() {
                    return Some(Ok(self.shown(ino, self.ns.with_ino(&i, a))));
                }
            }
            // An extending `ftruncate` of a new file (a linker sizing its output:
            // `writeback::ns_truncate`).
            Some(n) if is_provisional(i.id()) => {
                let a = wb.grow_deferred(&i, n)?;
                self.ns.listed_changed(&i);
                set.size = None;
                if set == SetAttr::default() {
                    return Some(Ok(self.shown(ino, self.ns.with_ino(&i, a))));
                }
            }
            // A truncate to zero of a file of the store (`writeback::ns_chattr`).
            Some(0) if i.kind == FileKind::File => {}
            Some(_) => return None,
        }
        let set = &set;
        if !is_provisional(i.id()) {
            // An object of the store (`writeback::ns_chattr`).
            let a = wb.chattr_deferred(&i, set)?;
            self.ns.listed_changed(&i);
            return Some(Ok(self.shown(ino, self.ns.with_ino(&i, a))));
        }
        if let Some(m) = &set.mtime {
            // As `Fs::setattr` does: kept with the dirty data.
            wb.note_dirty_mtime(&i, m);
        }
        let r = wb.setattr_deferred(&i, set);
        self.ns.listed_changed(&i);
        match r {
            Ok(Some(a)) => Some(Ok(self.shown(ino, self.ns.with_ino(&i, a)))),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// close(2) in write-back when it waits for nothing (`writeback.close` is not `flush`):
    /// it reports a flush error not yet reported.
    pub fn flush_fast(&self, ino: u64) -> Option<Result<()>> {
        self.wb()?.flush_fast(ino)
    }

    /// Before an attribute change done on the store (not deferred by [`Fs::setattr_fast`]):
    /// a provisional object (a size change of it) waits to be on the store, a directory
    /// for the names still on their way into it, which would move its times after this, and
    /// an object of the store for its deferred setattrs, which would undo this one.
    pub(super) fn before_setattr(&self, i: &Arc<Inode<St<S>>>, set: &SetAttr) -> Result<()> {
        let Some(wb) = self.wb() else { return Ok(()) };
        if is_provisional(i.id()) && i.kind == FileKind::File && is_truncate(set) {
            // The file's own operations (`writeback::ns_truncate`).
            return wb.settle_for_truncate(i);
        }
        if is_provisional(i.id())
            || (i.kind == FileKind::Dir && wb.creates_queued_in(i.id()))
            || wb.chattr_pending(i.ino)
        {
            wb.drain_ns()?;
        }
        Ok(())
    }

    /// An open of a provisional file: no store request (a read that needs the store waits
    /// for the file there). None for anything else, or an O_TRUNC open that cannot be
    /// deferred (done on the store).
    pub(super) fn open_provisional(&self, ino: u64, flags: i32) -> Result<Option<OpenReply>> {
        if self.wb().is_none() {
            return Ok(None);
        }
        let i = self.ns.inode(ino)?;
        if !is_provisional(i.id()) || self.ns.prov.attr(i.id()).is_none() {
            return Ok(None);
        }
        if flags & libc::O_TRUNC != 0 {
            // Its data dropped if its create is still queued (`writeback::ns_truncate`);
            // else the truncate is done on the store.
            let Some(wb) = self.wb() else { return Ok(None) };
            if wb.truncate_deferred(&i).is_none() {
                wb.settle_for_truncate(&i)?;
                return Ok(None);
            }
            self.ns.listed_changed(&i);
        }
        // Truncated now: the backing handle, opened on first need (after the file's create,
        // perhaps after data flushed there), must not truncate it again.
        let fh = self.data.add_open_file(i, None, flags & !libc::O_TRUNC)?;
        Ok(Some(OpenReply {
            fh,
            keep_cache: false,
            attrs_stale: false,
            no_flush: false,
        }))
    }

    /// Extended attributes of a provisional object: a new object has none (the kernel asks
    /// for `security.capability` before every write). None: ask the store.
    pub(super) fn xattr_provisional(&self, ino: u64) -> Option<Errno> {
        let i = self.ns.inodes.get(ino)?;
        self.ns.prov.attr(i.id()).map(|_| Errno(libc::ENODATA))
    }
}

/// Whether `set` is a truncate: a size, with the times it moves (a mode or owner change with
/// it takes the general path).
fn is_truncate(set: &SetAttr) -> bool {
    set.size.is_some() && set.mode.is_none() && set.uid.is_none() && set.gid.is_none()
}
