//! Directory listings: one listing of a directory at a time from the store (with every
//! entry's attributes), kept in the metadata cache and the SSD tier, and the directory
//! handles readdir pages through.

use super::{is_provisional, DirEntryOut, Namespace};
use crate::inode::Inode;
use crate::meta::ident;
use crate::shared::{meta_key, Listed, St};
use crate::stats::FsStats;
use std::ffi::OsString;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::{Claim, KIND_DIR};
use tierfs_store::{Attr, Errno, FileKind, Result, Store};

/// The fewest entries with stale attributes for which an opendir lists a directory again
/// rather than leaving each to a request of its own (see `Namespace::entries_stale`).
const RELIST_STALE_MIN: usize = 16;

/// An opened directory.
#[derive(Clone, Copy, Debug)]
pub struct DirOpen {
    pub fh: u64,
    /// The kernel may cache the directory's entries (FOPEN_CACHE_DIR): listings are
    /// revalidated by `meta.ttl` like everything else.
    pub cache: bool,
    /// It may keep what it cached at the previous opendir: the names are unchanged since
    /// (FOPEN_KEEP_CACHE).
    pub keep_cache: bool,
}

/// A name a directory handle lists: name, kind, kernel inode number.
pub(crate) type ListedName = (OsString, FileKind, u64);

pub(crate) struct DirHandle {
    entries: Vec<DirEntryOut>,
}

/// A directory handle's entries from an offset on ([`Namespace::readdir`]).
pub struct DirPage {
    handle: Arc<DirHandle>,
    start: usize,
}

impl std::ops::Deref for DirPage {
    type Target = [DirEntryOut];
    fn deref(&self) -> &[DirEntryOut] {
        &self.handle.entries[self.start..]
    }
}

impl<S: Store> Namespace<S> {
    /// Lists a directory with attributes from the backing store and records the result.
    /// One listing of a directory at a time: a lookup or opendir that needs it while it is
    /// being listed waits for that listing instead of starting another (on a slow store a
    /// listing takes seconds, and a `du` or `ls -l` asks for every name in it meanwhile).
    pub(crate) fn list_dir(&self, d: &Arc<Inode<St<S>>>) -> Result<Listed> {
        match self.listings.claim(d.id()) {
            Claim::Leader(g) => {
                let r = self.list_dir_now(d);
                g.complete(r.clone());
                r
            }
            Claim::Follower(w) => w.wait(),
        }
    }

    pub(crate) fn list_dir_now(&self, d: &Arc<Inode<St<S>>>) -> Result<Listed> {
        let node = self.node(d)?;
        // The directory's attributes name the listing's version in the SSD tier: they must
        // be taken *before* the listing, so a change in between gives a version that no
        // later lookup asks for (a miss), never an old listing under a new version.
        // They also let an opendir renew the listing later with one request (`renew`).
        let dir_attr = match self.meta.attr(d.id()) {
            Some((a, _)) => Some(a),
            None if self.ssd_meta() || self.renews_listings() => self.sh.store.getattr(&node).ok(),
            None => None,
        };
        let start = self.listing_start();
        if self.names_first() {
            return self.list_names(d, &node, dir_attr, start);
        }
        let own_before = crate::file_state::own_changes();
        let began = Instant::now();
        let listing = self.sh.store.readdir_plus(&node)?;
        self.walks.listed(d.id(), listing.len(), began.elapsed());
        // Trusted for `meta.ttl` from when it is complete, not from when it was asked for:
        // a listing that takes longer than `meta.ttl` (1,000 entries over a slow link) would
        // otherwise be stale on arrival, and every lookup in the directory would list it
        // again.
        let at = Instant::now();
        let mut out = Vec::with_capacity(listing.len());
        let mut complete = true;
        // (No change of ours at all while it ran, the common case: nothing to look up.)
        let raced = crate::file_state::own_changes() != own_before;
        for (e, attr) in listing {
            match attr {
                // A file a flush of ours changed while the listing ran may be listed as it
                // was before (see `FileState::own_change`): what the flush recorded is newer.
                Some(a) if raced && self.changed_by_us_since(&a, own_before) => {
                    match self.meta.attr(ident(&a)) {
                        Some((now, _)) => out.push((e.name, now)),
                        None => complete = false,
                    }
                }
                Some(a) => out.push((e.name, a)),
                None => complete = false,
            }
        }
        FsStats::add(&self.sh.stats.meta_listings, 1);
        if complete {
            self.meta.put_listing(d.id(), &out, at);
            if let Some(da) = &dir_attr {
                self.meta.listed_at(d.id(), da.fingerprint());
            }
            if let Some(da) = dir_attr.filter(|a| !crate::file_state::racy(&a.fingerprint())) {
                self.persist_if_current(d.id(), start, &out, || {
                    self.persist_listing(&da, &out, at)
                });
            }
        } else {
            // Entries vanished while listing, or the store cannot stat in the same pass:
            // not a listing to answer negative lookups from.
            self.meta.drop_listing(d.id());
            for (_, a) in &out {
                self.meta.put_attr(a, at);
            }
        }
        Ok(Arc::new(
            out.into_iter()
                .map(|(n, a)| {
                    let c = crate::meta::Child {
                        id: ident(&a),
                        kind: a.kind,
                    };
                    (n, c)
                })
                .collect(),
        ))
    }

    /// Whether the file `attr` describes had one of our own changes recorded after
    /// `file_state::own_changes` gave `count`.
    pub(crate) fn changed_by_us_since(&self, attr: &Attr, count: u64) -> bool {
        attr.kind == tierfs_store::FileKind::File
            && self
                .inodes
                .file_state_of(ident(attr))
                .is_some_and(|st| st.changed_by_us_since(count))
    }

    pub(crate) fn ssd_meta(&self) -> bool {
        self.sh.ssd.is_some() && self.meta.enabled()
    }

    pub(crate) fn persist_listing(&self, dir: &Attr, entries: &[(OsString, Attr)], at: Instant) {
        let Some(ssd) = &self.sh.ssd else { return };
        if let Some(rec) = crate::meta_codec::encode_listing(entries, at, ssd.session_epoch()) {
            let v = crate::meta_codec::listing_version(&dir.fingerprint(), ssd.session_epoch());
            ssd.offer(meta_key(KIND_DIR, dir), v, rec.into());
        }
    }

    /// Brings a directory's listing back from the SSD tier (after a restart, or after the
    /// RAM copy was dropped), if the directory is unchanged since it was stored.
    /// With `no_io`, only from data already in memory (a read-around window).
    pub(crate) fn restore_listing(&self, d: &Arc<Inode<St<S>>>, no_io: bool) -> bool {
        if !self.ssd_meta() {
            return false;
        }
        let (Some(ssd), Some((dattr, dat))) = (&self.sh.ssd, self.meta.attr(d.id())) else {
            return false;
        };
        let v = crate::meta_codec::listing_version(&dattr.fingerprint(), ssd.session_epoch());
        let key = meta_key(KIND_DIR, &dattr);
        let rec = if no_io {
            ssd.get_buffered(&key, v)
        } else {
            ssd.get(&key, v)
        };
        let Some(rec) = rec else {
            return false;
        };
        let Some(rec) = crate::meta_codec::decode_listing(&rec) else {
            return false;
        };
        FsStats::add(&self.sh.stats.meta_ssd_hits, 1);
        if self.record_trusted(rec.epoch, &rec.entries) {
            self.meta.put_listing(d.id(), &rec.entries, rec.validated);
        } else {
            self.meta.put_listing_restored(d.id(), &rec.entries);
        }
        // Its names are the directory's at the version just checked: trusted from then,
        // whatever the age of its entries' attributes (each keeps its own).
        self.meta.listed_at(d.id(), dattr.fingerprint());
        self.meta.renew_listing(d.id(), &dattr.fingerprint(), dat);
        true
    }

    /// Whether a listing whose trust ran out is renewed by asking for its directory's
    /// attributes (one request: unchanged, its names stand) rather than listed again: where
    /// the store's directory times follow their names, and a listing costs more than one
    /// request (each entry's attributes are a request of their own: a filesystem). Where a
    /// listing brings every entry's attributes in a request per page (S3, sftp), listing
    /// again renews the entries too, for about as much.
    pub(crate) fn renews_listings(&self) -> bool {
        self.sh.store.dirs_track_names() && !self.sh.store.listing_carries_attrs()
    }

    /// Renews `d`'s listing whose trust ran out (see [`Namespace::renews_listings`]): one
    /// request for the directory's attributes. False: listed again.
    fn renew(&self, d: &Arc<Inode<St<S>>>) -> bool {
        if !self.renews_listings() || !self.meta.has_listing(d.id()) {
            return false;
        }
        let asked = Instant::now();
        let Ok(a) = self.fetch_attr(d) else {
            return false;
        };
        let renewed =
            a.kind == FileKind::Dir && self.meta.renew_listing(d.id(), &a.fingerprint(), asked);
        if renewed {
            FsStats::add(&self.sh.stats.meta_renewals, 1);
        }
        renewed
    }

    /// Reads the directory once; later readdir calls page through this snapshot, so offsets
    /// stay valid while the directory changes.
    pub fn opendir(&self, ino: u64) -> Result<DirOpen> {
        let i = self.inode(ino)?;
        if i.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let listing = self.listing_of(&i)?;
        Ok(self.dir_open(&i, listing))
    }

    /// [`Namespace::opendir`] of a directory that may hold names write-back deferred
    /// (`writeback::ns`): the store's listing (none for a directory that is provisional
    /// itself) and the provisional names, with no wait for the namespace flusher (`ls` right
    /// after an untar). The provisional names are taken first: a name made before this call
    /// and published since is in the store's listing by then (the flusher makes an object
    /// on the store before it publishes it), so none is missed; a name in both is listed
    /// once, with the provisional inode (the one the published name has too).
    pub fn opendir_with_provisional(&self, ino: u64) -> Result<DirOpen> {
        let i = self.inode(ino)?;
        if i.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let prov = self.prov.children(i.id());
        let mut listing = if is_provisional(i.id()) {
            Vec::new()
        } else {
            self.listing_of(&i)?
        };
        let hidden = self.prov.hidden_in(i.id());
        if !prov.is_empty() || !hidden.is_empty() {
            // A name in both is listed once (below); one a queued move left, not at all.
            let names: rustc_hash::FxHashSet<&OsString> =
                prov.iter().map(|(n, _)| n).chain(hidden.iter()).collect();
            listing.retain(|(n, _, _)| !names.contains(n));
        }
        listing.extend(prov.into_iter().map(|(n, c)| (n, c.kind, c.ino)));
        let fh = self.add_dir_handle(i.ino, listing);
        Ok(DirOpen {
            fh,
            cache: self.meta.enabled(),
            // Its names change without the listing's version moving.
            keep_cache: false,
        })
    }

    /// A directory's names as (name, kind, kernel inode): from the metadata cache (or the
    /// SSD tier), else from the store.
    fn listing_of(&self, i: &Arc<Inode<St<S>>>) -> Result<Vec<ListedName>> {
        if !self.meta.has_listing(i.id()) {
            self.restore_listing(i, false);
        }
        // Most entries stale: listed again below, with every entry's attributes (renewing
        // the names alone would leave a request per entry to the walk).
        // Asked first, bounded by `store.timeout` (a listing is not): a store that froze
        // since gets cached names and attributes served, as a renewal would have.
        let stale = self.entries_stale(i) && self.fetch_attr(i).is_ok();
        let mut cached = self.cached_listing(i).filter(|_| !stale);
        if cached.is_none() && !stale && self.renew(i) {
            cached = self.cached_listing(i);
        }
        let listing: Vec<ListedName> = match cached {
            Some(l) => l,
            None if self.meta.enabled() => self
                .list_dir(i)?
                .iter()
                .map(|(name, c)| {
                    let ino = self.inodes.kernel_ino_of_ident(c.id);
                    (name.clone(), c.kind, ino)
                })
                .collect(),
            None => self
                .sh
                .store
                .readdir(&self.node(i)?)?
                .into_iter()
                .map(|e| {
                    let ino = self.inodes.kernel_ino_of_ident((e.dev, e.ino));
                    (e.name, e.kind.unwrap_or(FileKind::File), ino)
                })
                .collect(),
        };
        Ok(listing)
    }

    /// A directory handle for `listing`, and what the kernel may do with its copy.
    pub(crate) fn dir_open(&self, i: &Inode<St<S>>, listing: Vec<ListedName>) -> DirOpen {
        let fh = self.add_dir_handle(i.ino, listing);
        DirOpen {
            fh,
            cache: self.meta.enabled(),
            keep_cache: self.meta.enabled() && self.meta.opened(i.id()),
        }
    }

    /// [`Namespace::opendir`] when the metadata cache (or an SSD read-around window already in
    /// memory) has the listing: no I/O, for the FUSE thread itself.
    pub fn opendir_fast(&self, ino: u64) -> Option<DirOpen> {
        let i = self.inodes.get(ino)?;
        if i.kind != FileKind::Dir {
            return None;
        }
        if !self.meta.has_listing(i.id()) {
            self.restore_listing(&i, true);
        }
        if self.entries_stale(&i) {
            return None; // to be listed again (`listing_of`), on a worker
        }
        let listing = self.cached_listing(&i)?;
        Some(self.dir_open(&i, listing))
    }

    /// Whether the listing of `i` (fresh or not) is to be taken again at this opendir because most of
    /// its entries' attributes ran out (`MetaCache::stale_entries`): one listing with
    /// attributes revalidates them all, `store.stat_concurrency` at a time, where the walk
    /// that opened the directory would stat them one request each, one after another. Once
    /// per opendir, never from a lookup (a listing per name looked up was the re-listing
    /// loop of issue 42). Not for a few stale entries (a request each is as cheap), not
    /// listed for names first (its entries get their attributes by kind, `entry_attrs`),
    /// not while the store is gone.
    fn entries_stale(&self, i: &Inode<St<S>>) -> bool {
        if !self.meta.enabled() || self.names_first() || self.sh.store.inner().health.gone() {
            return false;
        }
        match self.meta.stale_entries(i.id()) {
            Some((stale, all)) => stale >= RELIST_STALE_MIN && stale * 4 >= all,
            None => false,
        }
    }

    /// A fresh cached listing as (name, kind, kernel inode).
    pub(crate) fn cached_listing(&self, i: &Inode<St<S>>) -> Option<Vec<ListedName>> {
        let l = self.meta.listing(i.id())?;
        FsStats::add(&self.sh.stats.meta_hits, 1);
        Some(
            l.into_iter()
                .map(|(name, c)| {
                    let ino = self.inodes.kernel_ino_of_ident(c.id);
                    (name, c.kind, ino)
                })
                .collect(),
        )
    }

    pub(crate) fn add_dir_handle(&self, ino: u64, listing: Vec<ListedName>) -> u64 {
        let mut entries = Vec::with_capacity(listing.len() + 2);
        entries.push(DirEntryOut {
            ino,
            name: ".".into(),
            kind: FileKind::Dir,
            next_offset: 1,
        });
        entries.push(DirEntryOut {
            ino,
            name: "..".into(),
            kind: FileKind::Dir,
            next_offset: 2,
        });
        for (name, kind, ino) in listing {
            let next_offset = entries.len() as u64 + 1;
            entries.push(DirEntryOut {
                ino,
                name,
                kind,
                next_offset,
            });
        }
        let fh = self.next_dir_fh.fetch_add(1, Relaxed);
        self.dirs.insert(fh, Arc::new(DirHandle { entries }));
        fh
    }

    /// Entries from `offset` on, shared with the handle, not copied: a reply takes what it
    /// can hold (about 200 entries with attributes in glibc's 32 KiB `getdents` buffer) and
    /// the kernel asks again from the next offset. (Copying the rest of the directory for
    /// every page was O(n^2) in its size; copying up to 8,192 entries for a reply that holds
    /// 200 was most of a warm `ls -l` of 10,000 entries in the daemon.)
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<DirPage> {
        let handle = self.dirs.get(&fh).map(|d| d.clone()).ok_or(Errno::EBADF)?;
        let start = (offset as usize).min(handle.entries.len());
        Ok(DirPage { handle, start })
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.remove(&fh);
    }

    /// Directory handles open.
    pub fn open_dirs(&self) -> usize {
        self.dirs.len()
    }
}
