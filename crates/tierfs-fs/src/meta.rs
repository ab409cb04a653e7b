//! The metadata cache: attributes by backing identity and directory listings, each trusted for
//! a while after it was last validated against the backing store: the longer an object has
//! not changed, the longer (see [`MetaCache::trust`]), within `meta.ttl_min` and `meta.ttl`.
//!
//! Why beyond the kernel's own dentry/attribute caches: the kernel forgets under memory
//! pressure, on `drop_caches` and on remount, and then every `stat` of a million-file tree
//! would go to the slow store one file at a time. Here a listing is fetched with attributes in
//! one pass (`Store::readdir_plus`), so one call revalidates a whole directory, and the
//! listings are persisted through the SSD tier to survive a restart.
//!
//! Names map to identities (device, inode), attributes hang off identities: hard links share
//! one attribute record and our own operations patch both maps in place rather than dropping
//! whole listings (an untar into one directory must not relist it per file).

use crate::fast_map::DashMap;
use crate::tune::AtomicDuration;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_store::{Attr, FileKind};

pub use crate::identity::Ident;
pub use listings::{Listing, NameLookup};

mod listings;
mod trust;
mod xattrs;

pub fn ident(a: &Attr) -> Ident {
    (a.dev, a.ino)
}

#[derive(Clone, Copy, Debug)]
pub struct Child {
    pub id: Ident,
    pub kind: FileKind,
}

/// An object's attributes as the store gave them, validated at `at` and trusted for `trust`
/// from then.
#[derive(Clone, Copy)]
struct AttrRec {
    attr: Attr,
    at: Instant,
    trust: Duration,
}

impl AttrRec {
    fn left(&self) -> Duration {
        self.trust.saturating_sub(self.at.elapsed())
    }
}

pub struct MetaCache {
    attrs: DashMap<Ident, AttrRec>,
    /// Objects one of our own operations changed (a name made or removed in a directory,
    /// a write), and when: attributes the store was asked for before that are older than
    /// the change and are not kept, even when they arrive after it (a getattr in flight
    /// while a create lands, a refresh started before the next create).
    changed: DashMap<Ident, Instant>,
    dirs: DashMap<Ident, Listing>,
    links: DashMap<Ident, (OsString, Attr)>,
    /// Objects the store said have no `security.capability` attribute, and when. The kernel
    /// asks for it before every write to a file (to clear file capabilities, as for setuid):
    /// one store round trip per write on a network store.
    no_caps: DashMap<Ident, (Instant, i32)>,
    /// Extended attributes objects lack, as the store said (ENODATA), with the ctime each
    /// object had then: valid while its attributes are trusted and show that ctime (a change
    /// of an extended attribute moves it). `ls -l` asks for every file's ACL
    /// (`system.posix_acl_access`): over a network store, a round trip per file per listing.
    /// The empty name stands for an empty list (a listxattr that listed nothing: `cp -a`,
    /// `rsync -X` and `tar --xattrs` list every file's).
    no_xattrs: DashMap<Ident, (tierfs_store::TimeSpec, Vec<OsString>)>,
    /// What the store answers for an object without `security.capability` (ENODATA, or
    /// ENOTSUP for a store without xattrs), once it has answered it: 0 before.
    caps_absent: std::sync::atomic::AtomicI32,
    /// `meta.ttl`, the longest anything is trusted; changes at run time (`tierfs ctl set`).
    ttl: AtomicDuration,
    /// `meta.ttl_min`, what a record of an object that just changed is trusted for; None:
    /// the same as `meta.ttl` (every record trusted alike).
    ttl_min: parking_lot::RwLock<Option<Duration>>,
    /// Bound on attribute records plus listing entries (`meta.max_entries`); changes at run
    /// time.
    max_entries: AtomicUsize,
    /// Path identities: attributes of a file with several names are not trusted (see
    /// [`MetaCache::distrusts`]).
    path_identity: bool,
    /// Set while the backing store is gone (`health`): every record answers, whatever its
    /// age, since the store cannot.
    stale_ok: Arc<AtomicBool>,
    /// The store's directory attributes follow the names in them (`Store::dirs_track_names`).
    dirs_track_names: bool,
}

impl MetaCache {
    pub fn new(ttl: Duration, max_entries: usize, path_identity: bool) -> MetaCache {
        MetaCache {
            path_identity,
            attrs: DashMap::default(),
            changed: DashMap::default(),
            dirs: DashMap::default(),
            links: DashMap::default(),
            no_caps: DashMap::default(),
            no_xattrs: DashMap::default(),
            caps_absent: std::sync::atomic::AtomicI32::new(0),
            ttl: AtomicDuration::new(ttl),
            ttl_min: parking_lot::RwLock::new(None),
            max_entries: AtomicUsize::new(max_entries),
            stale_ok: Arc::default(),
            dirs_track_names: true,
        }
    }

    /// Whether the store's directory attributes change with the names in them (not S3's:
    /// they stay as cached, since the store's would be the same).
    pub fn set_dirs_track_names(&mut self, yes: bool) {
        self.dirs_track_names = yes;
    }

    /// Records answer whatever their age while `flag` is set (the store is gone).
    pub fn serve_stale_while(&mut self, flag: Arc<AtomicBool>) {
        self.stale_ok = flag;
    }

    pub fn enabled(&self) -> bool {
        !self.ttl().is_zero() && self.max_entries() > 0
    }

    pub fn ttl(&self) -> Duration {
        self.ttl.get()
    }

    /// A new `meta.ttl`: records are judged by it from now on (a shorter one expires records
    /// at once; with 0 nothing more is cached).
    pub fn set_ttl(&self, ttl: Duration) {
        self.ttl.set(ttl);
    }

    fn max_entries(&self) -> usize {
        self.max_entries.load(Relaxed)
    }

    /// A new `meta.max_entries`: the bound is enforced at the next insertion.
    pub fn set_max_entries(&self, n: usize) {
        self.max_entries.store(n, Relaxed);
    }

    fn fresh_for(&self, at: Instant, trust: Duration) -> bool {
        at.elapsed() < trust.min(self.ttl()) || self.stale_ok.load(Relaxed)
    }

    fn rec_fresh(&self, r: &AttrRec) -> bool {
        self.fresh_for(r.at, r.trust)
    }

    /// Attributes still trusted (see [`MetaCache::trust`]), and when they were validated.
    pub fn attr(&self, id: Ident) -> Option<(Attr, Instant)> {
        let a = self.attrs.get(&id)?;
        (self.rec_fresh(&a) && !self.distrusts(&a.attr)).then_some((a.attr, a.at))
    }

    /// [`MetaCache::attr`] with how long they stay trusted: what the kernel may keep them for.
    pub fn attr_left(&self, id: Ident) -> Option<(Attr, Instant, Duration)> {
        let a = self.attrs.get(&id)?;
        if !self.rec_fresh(&a) || self.distrusts(&a.attr) {
            return None;
        }
        let left = match self.stale_ok.load(Relaxed) {
            true => a.left().max(self.ttl_min()),
            false => a.left().min(self.ttl()),
        };
        Some((a.attr, a.at, left))
    }

    /// Attributes once validated whose trust has run out, and when: what a name held by a
    /// trusted listing is answered with to the kernel, with no time to keep them (it asks
    /// for them again, one request, before it uses them: a stat's GETATTR, an open's
    /// permission check), so that revalidating an entry never costs more than that one
    /// request.
    pub fn attr_expired(&self, id: Ident) -> Option<(Attr, Instant)> {
        let a = self.attrs.get(&id)?;
        (!self.distrusts(&a.attr)).then_some((a.attr, a.at))
    }

    /// Attributes still trusted, trusted or not (see [`MetaCache::distrusts`]), and when:
    /// while they are held, asking the store again would tell nothing newer.
    pub fn fresh_attr_untrusted(&self, id: Ident) -> Option<(Attr, Instant)> {
        let a = self.attrs.get(&id)?;
        self.rec_fresh(&a).then_some((a.attr, a.at))
    }

    /// Whether attributes like `a` cannot be trusted once given: with path identities the
    /// names of a hard-linked file are objects of their own, and a link or unlink through
    /// one of them changes the others' link count without a trace here.
    pub fn distrusts(&self, a: &Attr) -> bool {
        self.path_identity && a.kind != FileKind::Dir && a.nlink > 1
    }

    /// Records attributes validated at `at`.
    pub fn put_attr(&self, attr: &Attr, at: Instant) {
        if !self.enabled() {
            return;
        }
        let id = ident(attr);
        if let Some(t) = self.changed.get(&id).map(|t| *t) {
            if at < t {
                return;
            }
            self.changed.remove_if(&id, |_, t| *t <= at);
        }
        self.make_room();
        let rec = AttrRec {
            attr: *attr,
            at,
            trust: self.trust(attr, at),
        };
        let mut e = self.attrs.entry(id).or_insert(rec);
        if e.at <= at {
            *e = rec;
        }
    }

    /// [`MetaCache::put_attr`] of attributes the store was asked for at `at`, returning what
    /// the cache holds for the object afterwards: a newer entry (put by a change of ours that
    /// landed while the store answered, see `FileState::own_change`) wins over them.
    pub fn put_attr_fetched(&self, attr: &Attr, at: Instant) -> Attr {
        self.put_attr(attr, at);
        match self.attrs.get(&ident(attr)) {
            Some(e) if e.at > at && e.attr.kind == attr.kind && !self.distrusts(&e.attr) => e.attr,
            _ => *attr,
        }
    }

    /// [`MetaCache::put_attr`] of attributes the store was asked for at `asked` and trusted
    /// from `at` (a fan-out: from when all were in, so that one slower than `meta.ttl` is not
    /// stale on arrival): refused if one of our own changes to the object came after
    /// `asked` (a rename over it, a chmod), whatever `at` says.
    pub fn put_attr_asked(&self, attr: &Attr, asked: Instant, at: Instant) {
        if self.changed.get(&ident(attr)).is_some_and(|t| *t > asked) {
            return;
        }
        self.put_attr(attr, at);
    }

    /// Forgets `id`'s attributes: one of our own operations changed them just now.
    pub fn drop_attr(&self, id: Ident) {
        // Recorded first: an answer asked for before the change and put between the two
        // steps would otherwise stay.
        self.mark_changed(id);
        self.attrs.remove(&id);
    }

    /// Our own operation added (`nlink` 1 for a subdirectory, else 0) or removed (-1, 0) a
    /// name in directory `dir`: its cached attributes, if fresh, get the change's times
    /// (and link count) and keep their validation time, so the store's own replace them
    /// within `meta.ttl` as usual. Dropping them instead cost a store round trip per created
    /// file: with `default_permissions` the kernel asks for the directory's attributes
    /// before the next lookup in it (an untar over sshfs paid 4.6 ms more per file).
    pub fn touch_dir(&self, dir: Ident, nlink: i32) {
        if !self.dirs_track_names {
            return;
        }
        // Recorded first: an answer asked for before the change and put meanwhile must not
        // replace what is touched below.
        self.mark_changed(dir);
        let now = tierfs_store::TimeSpec::now();
        let kept = match self.attrs.get_mut(&dir) {
            Some(mut e) if self.rec_fresh(&e) && e.attr.kind == FileKind::Dir => {
                e.attr.mtime = now;
                e.attr.ctime = now;
                // (A store that counts no subdirectories shows 1: left so.)
                if e.attr.nlink >= 2 {
                    e.attr.nlink = e.attr.nlink.saturating_add_signed(nlink).max(2);
                }
                true
            }
            _ => false,
        };
        if !kept {
            self.attrs.remove(&dir);
        }
    }

    fn mark_changed(&self, id: Ident) {
        if self.changed.len() >= self.max_entries() {
            // Only fetches in flight need the record: a minute is ample.
            self.changed
                .retain(|_, t| t.elapsed() < Duration::from_secs(60));
            if self.changed.len() >= self.max_entries() / 2 {
                self.changed.clear();
            }
        }
        self.changed.insert(id, Instant::now());
    }

    /// Symlink target, valid while the link's attributes are unchanged.
    pub fn link_target(&self, id: Ident, current: &Attr) -> Option<OsString> {
        let l = self.links.get(&id)?;
        (l.1.ctime == current.ctime && l.1.mtime == current.mtime && l.1.size == current.size)
            .then(|| l.0.clone())
    }

    pub fn put_link_target(&self, attr: &Attr, target: &OsStr) {
        if self.enabled() {
            self.links.insert(ident(attr), (target.to_owned(), *attr));
        }
    }

    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.attrs.len() as u64,
            self.dirs.len() as u64,
            self.links.len() as u64,
        )
    }

    /// Keeps the maps within `max_entries`: expired records go first, then everything (a
    /// crude bound, but it holds, and the SSD tier still has the listings).
    fn make_room(&self) {
        let max = self.max_entries();
        if self.attrs.len() < max {
            return;
        }
        self.attrs.retain(|_, v| self.rec_fresh(v));
        self.dirs
            .retain(|_, l| self.fresh_for(l.validated, l.trust));
        if self.attrs.len() >= max / 2 {
            self.attrs.clear();
            self.dirs.clear();
            self.links.clear();
        }
    }
}

#[cfg(test)]
mod tests;
