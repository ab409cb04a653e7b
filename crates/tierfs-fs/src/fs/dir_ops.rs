//! The operations of [`Fs`] on opened directories: opendir, the pages of readdir and
//! READDIRPLUS, releasedir.

use super::Fs;
use crate::namespace::{DirOpen, DirPage};
use tierfs_store::{Result, Store};

impl<S: Store> Fs<S> {
    /// Reads the directory once; later readdir calls page through this snapshot, so offsets
    /// stay valid while the directory changes.
    pub fn opendir(&self, ino: u64) -> Result<DirOpen> {
        if self
            .wb()
            .is_some_and(|w| !self.ns.prov.is_empty() || w.any_chattr_pending())
        {
            // Names deferred so far are listed from the provisional table with the store's
            // (every name the store lists is still there, but for the old names of queued
            // moves, which the table hides), instead of waiting for the flusher. Deferred
            // setattrs of the store's objects change no name (`chmod -R` opens each
            // directory right after its chmod): their attributes are laid over the entries.
            return self.cached_if_gone(|| self.ns.opendir_with_provisional(ino));
        }
        self.drain_ns()?;
        self.cached_if_gone(|| self.ns.opendir(ino))
    }

    /// [`Fs::opendir`] when the metadata cache (or an SSD read-around window already in
    /// memory) has the listing: no I/O, for the FUSE thread itself.
    pub fn opendir_fast(&self, ino: u64) -> Option<DirOpen> {
        if !self.ns.prov.is_empty() {
            return None;
        }
        self.ns.opendir_fast(ino)
    }

    /// Entries from `offset` on.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<DirPage> {
        self.ns.readdir(fh, offset)
    }

    pub fn releasedir(&self, fh: u64) {
        self.ns.releasedir(fh)
    }

    /// Whether directories are listed for names first (`namespace::entry_attrs`): the FUSE
    /// adapter then has the kernel ask for their names with plain READDIR.
    pub fn lists_names_first(&self) -> bool {
        self.ns.names_first()
    }
}
