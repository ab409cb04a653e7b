//! The operations of [`Fs`] on opened directories: opendir, the pages of readdir and
//! READDIRPLUS, releasedir.

use super::Fs;
use crate::namespace::{DirEntryOut, DirOpen, Entry};
use tierfs_store::{Result, Store};

/// An entry of a READDIRPLUS page.
pub struct PlusEntry {
    pub entry: Entry,
    /// Whether the kernel's lookup reference is counted (an entry that does not fit in the
    /// page gives it back with `forget`); not for an entry without attributes (see
    /// `namespace::entry_attrs`).
    pub counted: bool,
}

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
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<Vec<DirEntryOut>> {
        self.ns.readdir(fh, offset)
    }

    pub fn releasedir(&self, fh: u64) {
        self.ns.releasedir(fh)
    }

    /// The entry READDIRPLUS gives for `e`, an entry of directory `parent`'s handle: from
    /// the metadata cache; else, for a name listed for names first whose object the kernel
    /// does not hold, one with no attributes to trust (the kernel asks for them when it
    /// uses the name); else, with `may_block`, looked up (which asks the store for the
    /// attributes of all such entries of the directory at once). None: it needs I/O and
    /// `may_block` is false.
    pub fn plus_entry(
        &self,
        parent: u64,
        e: &DirEntryOut,
        may_block: bool,
    ) -> Option<Result<PlusEntry>> {
        let counted = |entry| PlusEntry {
            entry,
            counted: true,
        };
        if let Some(r) = self.lookup_fast(parent, &e.name, 0) {
            return Some(r.map(counted));
        }
        if let Some(entry) = self.ns.unstated_entry(e) {
            return Some(Ok(PlusEntry {
                entry,
                counted: false,
            }));
        }
        may_block.then(|| self.lookup(parent, &e.name).map(counted))
    }
}
