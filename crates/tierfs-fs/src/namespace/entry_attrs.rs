//! Listings taken for names first. Where an entry's attributes cost the store a request of
//! their own (`Store::names_list_cheaper`: a filesystem, an `fstatat` per entry, a round trip
//! each over NFS or sshfs), a directory is listed for its names and types alone, and its
//! entries' attributes are asked for when the first one is needed: all entries of that kind
//! (subdirectories, or everything else) at once, many requests in flight.
//!
//! Why: `find -name`, a build's directory walk or `git status` need names and types, and
//! stat subdirectories only. Listing every entry with its attributes made a `find` over the
//! nfs-lan emulator 2.6x slower than the store alone, with default options, at every
//! `meta.ttl` (8,876 store requests against its 4,111). `ls -l`, `du` and `grep -r` ask for
//! one entry, and have the rest of the directory's files in the same fan-out: as fast as
//! before.
//!
//! The kernel gets such a directory's names in plain READDIR pages: READDIRPLUS entries
//! carry real attributes or none are sent (docs/architecture/metadata.md, "Listings for
//! names first"). The FUSE adapter asks for `FUSE_READDIRPLUS_AUTO` on such a mount and
//! answers the first READDIRPLUS page of a directory with `.` and `..` alone; the kernel then
//! asks for the rest with READDIR, until a lookup in the directory makes it ask for
//! READDIRPLUS again (`ls -l`, `du`: their lookups fetch the directory's entries at once).

use super::persisted::ListingStart;
use super::Namespace;
use crate::inode::Inode;
use crate::meta::{ident, Child};
use crate::shared::{Listed, St};
use crate::stats::FsStats;
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::Claim;
use tierfs_store::{Attr, FileKind, Result, Store};

/// At most this many directories listed for names wait for their entries' attributes to be
/// persisted with them (see [`Namespace::persist_if_complete`]); beyond it they are
/// forgotten, and such a listing is only kept in RAM.
const NAMES_LISTED_MAX: usize = 1 << 16;

/// What a listing of names was taken under, for persisting it once its entries' attributes
/// are all in: the count of our changes before it, the directory's attributes before it
/// (its version in the SSD tier) and when it completed.
#[derive(Clone, Copy)]
pub(crate) struct NamesListed {
    start: ListingStart,
    dir_attr: Option<Attr>,
    at: Instant,
}

impl<S: Store> Namespace<S> {
    /// Whether directories are listed for names first (see the module documentation):
    /// decided at mount by the store, and only with path identities (with inode numbers, a
    /// listing's `d_ino` of a directory where another filesystem is mounted names the inode
    /// under it, which may be another object's identity).
    pub fn names_first(&self) -> bool {
        self.meta.enabled()
            && self.sh.store.identity_kind() == tierfs_store::Identity::Path
            && self.sh.store.names_list_cheaper()
    }

    /// `list_dir_now` for names first: the store's names and types, recorded as the
    /// directory's listing; the entries' attributes stay what the metadata cache had.
    pub(super) fn list_names(
        &self,
        d: &Arc<Inode<St<S>>>,
        node: &crate::shared::Node<S>,
        dir_attr: Option<Attr>,
        start: ListingStart,
    ) -> Result<Listed> {
        let entries = self.sh.store.readdir(node)?;
        let at = Instant::now();
        let mut complete = true;
        let out: Vec<(OsString, Child)> = entries
            .into_iter()
            .filter_map(|e| match e.kind {
                Some(kind) => Some((
                    e.name,
                    Child {
                        id: (e.dev, e.ino),
                        kind,
                    },
                )),
                // Its type unknown and gone before the store could stat it.
                None => {
                    complete = false;
                    None
                }
            })
            .collect();
        FsStats::add(&self.sh.stats.meta_listings, 1);
        if complete {
            self.meta.put_names(d.id(), &out, at);
            if let Some(da) = &dir_attr {
                self.meta.listed_at(d.id(), da.fingerprint());
            }
            if self.ssd_meta() {
                if self.names_listed.len() >= NAMES_LISTED_MAX {
                    self.names_listed.clear();
                }
                self.names_listed.insert(
                    d.id(),
                    NamesListed {
                        start,
                        dir_attr,
                        at,
                    },
                );
                // (A relisting within its entries' `meta.ttl` has them all.)
                self.persist_if_complete(d);
            }
        } else {
            self.meta.drop_listing(d.id());
        }
        Ok(Arc::new(out))
    }

    /// Asks the store for the attributes of every entry of `p`'s fresh listing that lacks
    /// fresh ones, of one class: subdirectories (`dirs`) or all else. One at a time per
    /// directory and class: a lookup that needs it while it runs waits for it.
    pub(crate) fn stat_entries(&self, p: &Arc<Inode<St<S>>>, dirs: bool) {
        match self.entry_stats.claim((p.id(), dirs)) {
            Claim::Leader(g) => {
                self.stat_entries_now(p, dirs);
                g.complete(());
            }
            Claim::Follower(w) => w.wait(),
        }
    }

    fn stat_entries_now(&self, p: &Arc<Inode<St<S>>>, dirs: bool) {
        let Some(listing) = self.meta.listing(p.id()) else {
            return;
        };
        let wanted: Vec<(OsString, Child)> = listing
            .into_iter()
            .filter(|(_, c)| {
                (c.kind == FileKind::Dir) == dirs && self.meta.fresh_attr_untrusted(c.id).is_none()
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let Ok(node) = self.node(p) else {
            return;
        };
        let names: Vec<OsString> = wanted.iter().map(|(n, _)| n.clone()).collect();
        let own_before = crate::file_state::own_changes();
        let asked = Instant::now();
        let attrs = self.sh.store.stat_names(&node, &names);
        // Trusted for `meta.ttl` from when they are all in, as a listing is (see
        // `list_dir_now`): a fan-out slower than `meta.ttl` would otherwise be stale on
        // arrival, and every lookup in the directory would start another.
        let at = Instant::now();
        let raced = crate::file_state::own_changes() != own_before;
        FsStats::add(&self.sh.stats.meta_entry_stats, 1);
        for ((name, c), a) in wanted.into_iter().zip(attrs) {
            // Gone or failed: a lookup of it asks the store for it alone.
            let Some(a) = a else { continue };
            // A file a flush of ours changed meanwhile may show as it was before.
            if raced && self.changed_by_us_since(&a, own_before) {
                continue;
            }
            if ident(&a) != c.id || a.kind != c.kind {
                self.meta.correct_name(p.id(), &name, &a);
            }
            self.meta.put_attr_asked(&a, asked, at);
        }
        self.persist_if_complete(p);
    }

    /// Persists `d`'s listing of names to the SSD tier once every entry has fresh
    /// attributes (see `persisted`: under the count of our changes taken before the names
    /// were listed, and as old as its oldest part).
    fn persist_if_complete(&self, d: &Arc<Inode<St<S>>>) {
        let Some(listed) = self.names_listed.get(&d.id()).map(|l| *l) else {
            return;
        };
        let Some(da) = listed
            .dir_attr
            .filter(|a| !crate::file_state::racy(&a.fingerprint()))
        else {
            return;
        };
        let Some(names) = self.meta.listing(d.id()) else {
            return;
        };
        let mut oldest = listed.at;
        let mut entries = Vec::with_capacity(names.len());
        for (name, c) in names {
            match self.meta.fresh_attr_untrusted(c.id) {
                Some((a, at)) if a.kind == c.kind => {
                    oldest = oldest.min(at);
                    entries.push((name, a));
                }
                _ => return,
            }
        }
        if self.names_listed.remove(&d.id()).is_none() {
            return; // (persisted by the other class's fan-out meanwhile)
        }
        self.persist_if_current(d.id(), listed.start, &entries, || {
            self.persist_listing(&da, &entries, oldest)
        });
    }
}
