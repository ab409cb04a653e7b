//! Which directory listings in the SSD tier are current, so that after a remount a listing
//! brought back from there answers lookups with its attributes (a `grep -r` or `du` after a
//! remount asks the store nothing) and never with attributes from before a change.
//!
//! A listing record is stored under the directory's identity and a version derived from the
//! directory's attributes, which move when a name comes or goes, but not when an entry's own
//! attributes change (a chmod, a write, a create inside a subdirectory). So:
//! - every change of our own to an object drops the record of the directory it is listed in
//!   ([`Namespace::listed_changed`], called by the dispatcher after each operation; the
//!   write-back flusher's changes are covered by the next rule), and for a directory its own
//!   record; a directory removed or renamed loses its record; a listing of a directory
//!   under way while a change to it happened is not persisted;
//! - a listing is not persisted while it may describe the store before a change of ours that
//!   is still on its way there (a file with dirty data, deferred creates);
//! - a hard-linked file is listed in directories we cannot find from it: a record with one
//!   answers readdir only;
//! - the drops of a session are logged by the SSD tier, and a crash may lose some: records
//!   carry the tier's session epoch, which stays the same only across a clean unmount
//!   (`SsdCache::close_session`). A record of another epoch answers readdir only, and the
//!   first lookup in it lists the directory again.
//!
//! Changes behind our back are `meta.ttl`'s business, as for a listing in RAM: a record is
//! trusted from when it was listed, not from when it was brought back.

use super::Namespace;
use crate::identity::Ident;
use crate::inode::Inode;
use crate::shared::meta_key_of;
use crate::shared::St;
use std::ffi::OsString;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use tierfs_cache::KIND_DIR;
use tierfs_store::{Attr, FileKind, Store};

/// What is known of one directory's record: the count of our changes
/// (`Namespace::listing_changes`) when the last change to it came, and whether its record has been dropped since (a second
/// drop is not needed until a listing is persisted again).
#[derive(Clone, Copy)]
pub(crate) struct Stamp {
    changed: u64,
    dropped: bool,
}

/// See [`Namespace::listing_start`].
#[derive(Clone, Copy)]
pub(crate) struct ListingStart {
    changes: u64,
    deferred: bool,
}

impl<S: Store> Namespace<S> {
    /// Our own operation changed `i`: its attributes, or for a directory its names (which
    /// moves its times). The listing record of the directory it is listed in is dropped, and
    /// a directory's own: its version may come back (a store whose ctime is its mtime, such
    /// as sshfs, and `tar` setting the directory's old mtime again).
    pub(crate) fn listed_changed(&self, i: &Inode<St<S>>) {
        if self.sh.ssd.is_none() || !self.meta.enabled() {
            return;
        }
        if i.kind == FileKind::Dir {
            self.listing_outdated(i.id());
        }
        // The root is listed in no directory of ours; an object without an origin has lost
        // its name (unlinked while open): no listing holds it, unless it has another link,
        // and a listing with a hard-linked file is never trusted for its attributes.
        let parent = i.origin.lock().as_ref().map(|(p, _)| p.id());
        if let Some(p) = parent {
            self.listing_outdated(p);
        }
    }

    /// The listing record of `dir` no longer describes it.
    pub(crate) fn listing_outdated(&self, dir: Ident) {
        let Some(ssd) = &self.sh.ssd else { return };
        let now = self.listing_changes.fetch_add(1, AcqRel) + 1;
        let drop = {
            let mut e = self.listing_stamps.entry(dir).or_insert(Stamp {
                changed: 0,
                dropped: false,
            });
            e.changed = now;
            !std::mem::replace(&mut e.dropped, true)
        };
        if drop {
            ssd.remove(&meta_key_of(KIND_DIR, dir));
        }
    }

    /// Taken before a listing is asked of the store, and given to
    /// [`Namespace::persist_if_current`]: the count of our changes so far, and whether
    /// write-back had deferred namespace operations (whose application, later, changes what
    /// the listing shows without a call of [`Namespace::listed_changed`]).
    pub(crate) fn listing_start(&self) -> ListingStart {
        ListingStart {
            changes: self.listing_changes.load(Acquire),
            deferred: !self.prov.is_empty(),
        }
    }

    /// Persists a listing of `dir` asked of the store after [`Namespace::listing_start`] gave
    /// `start` (`offer` hands it to the SSD tier), if no change of ours to the
    /// directory or its entries came since and none is on its way to the store. The offer is
    /// made under the directory's stamp, so a change that comes after it drops it (its
    /// tombstone is queued after the offer), and one that came before stops it.
    pub(crate) fn persist_if_current(
        &self,
        dir: Ident,
        start: ListingStart,
        entries: &[(OsString, Attr)],
        offer: impl FnOnce(),
    ) {
        if start.deferred || !self.prov.is_empty() {
            return; // deferred creates and setattrs: what they change will move
        }
        let before = start.changes;
        let dirty = entries.iter().any(|(_, a)| {
            a.kind == FileKind::File
                && self
                    .inodes
                    .file_state_of(crate::meta::ident(a))
                    .is_some_and(|st| st.has_dirty.load(Acquire))
        });
        if dirty {
            return;
        }
        match self.listing_stamps.entry(dir) {
            dashmap::Entry::Occupied(mut e) => {
                if e.get().changed > before {
                    return;
                }
                offer();
                e.get_mut().dropped = false;
            }
            // (Not inserted: a stamp only for directories we change.)
            dashmap::Entry::Vacant(_v) => offer(),
        }
    }

    /// Whether a listing record read back from the SSD tier may answer lookups with its
    /// attributes (see the module comment); else it answers readdir only.
    pub(crate) fn record_trusted(&self, epoch: u64, entries: &[(OsString, Attr)]) -> bool {
        self.sh
            .ssd
            .as_ref()
            .is_some_and(|ssd| ssd.session_epoch() == epoch)
            && !entries
                .iter()
                .any(|(_, a)| a.kind != FileKind::Dir && a.nlink > 1)
    }
}
