//! The metadata cache: attributes by backing identity and directory listings, each trusted for
//! `meta.ttl` after it was last validated against the backing store.
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

use crate::tune::AtomicDuration;
use dashmap::DashMap;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_store::{Attr, FileKind};

pub use crate::identity::Ident;

pub fn ident(a: &Attr) -> Ident {
    (a.dev, a.ino)
}

#[derive(Clone, Copy, Debug)]
pub struct Child {
    pub id: Ident,
    pub kind: FileKind,
}

/// The complete set of names in one directory, as of `validated`.
pub struct Listing {
    pub names: rustc_hash::FxHashMap<OsString, Child>,
    /// The names in the backing store's order (plus names we added since; removed ones are
    /// skipped when listing). Listing in the same order every time matters: the SSD tier
    /// lays small files out in the order they were first read, and reads them back fastest
    /// in that order.
    order: Vec<OsString>,
    pub validated: Instant,
    /// Brought back from the SSD tier: its names are the directory's as of a version the
    /// store still has, but not to be answered from before one listing has revalidated it
    /// (see [`MetaCache::put_listing_restored`]).
    restored: bool,
    /// Names this listing as it stands: a new one whenever a name comes or goes.
    version: u64,
    /// The version the kernel was last given at an opendir (it caches directory contents,
    /// FOPEN_CACHE_DIR, and may keep them while they are unchanged).
    opened: Option<u64>,
}

static NEXT_LISTING_VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_version() -> u64 {
    NEXT_LISTING_VERSION.fetch_add(1, Relaxed)
}

/// A listing's names (to identity and kind) and their order, from the store's entries.
fn names_of(
    entries: &[(OsString, Attr)],
) -> (rustc_hash::FxHashMap<OsString, Child>, Vec<OsString>) {
    let mut names = rustc_hash::FxHashMap::default();
    names.reserve(entries.len());
    for (name, a) in entries {
        names.insert(
            name.clone(),
            Child {
                id: ident(a),
                kind: a.kind,
            },
        );
    }
    (names, entries.iter().map(|(n, _)| n.clone()).collect())
}

pub struct MetaCache {
    attrs: DashMap<Ident, (Attr, Instant)>,
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
    /// What the store answers for an object without `security.capability` (ENODATA, or
    /// ENOTSUP for a store without xattrs), once it has answered it: 0 before.
    caps_absent: std::sync::atomic::AtomicI32,
    /// `meta.ttl`; changes at run time (`tierfs ctl set`).
    ttl: AtomicDuration,
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

/// What a cached listing says about a name.
pub enum NameLookup {
    /// The listing is fresh and holds the name.
    Found(Child),
    /// The listing is fresh and does not hold the name.
    Absent,
    /// No fresh listing: ask the backing store.
    Unknown,
}

impl MetaCache {
    pub fn new(ttl: Duration, max_entries: usize, path_identity: bool) -> MetaCache {
        MetaCache {
            path_identity,
            attrs: DashMap::new(),
            changed: DashMap::new(),
            dirs: DashMap::new(),
            links: DashMap::new(),
            no_caps: DashMap::new(),
            caps_absent: std::sync::atomic::AtomicI32::new(0),
            ttl: AtomicDuration::new(ttl),
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

    /// The age past which a file's version is checked against the store: `meta.ttl`, or never
    /// while the store is gone (what is cached is served).
    pub fn check_ttl(&self) -> Duration {
        if self.stale_ok.load(Relaxed) {
            Duration::MAX
        } else {
            self.ttl()
        }
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

    fn fresh(&self, at: Instant) -> bool {
        at.elapsed() < self.ttl() || self.stale_ok.load(Relaxed)
    }

    /// The errno the store gave within `meta.ttl` when asked for `id`'s `security.capability`
    /// (ENODATA: none; ENOTSUP: a store without xattrs, e.g. sshfs).
    pub fn no_caps(&self, id: Ident) -> Option<i32> {
        self.no_caps
            .get(&id)
            .filter(|e| self.fresh(e.0))
            .map(|e| e.1)
    }

    pub fn put_no_caps(&self, id: Ident, errno: i32) {
        self.caps_absent.store(errno, Relaxed);
        if self.enabled() {
            if self.no_caps.len() >= self.max_entries() {
                self.no_caps.clear();
            }
            self.no_caps.insert(id, (Instant::now(), errno));
        }
    }

    /// Object `id` was just made by us: it has no `security.capability` (only a setxattr
    /// gives one), so the kernel's question before its first write is answered as the store
    /// answered it for others, without asking (one round trip per file an untar writes).
    pub fn made_without_caps(&self, id: Ident) {
        let e = self.caps_absent.load(Relaxed);
        if e != 0 {
            self.put_no_caps(id, e);
        }
    }

    pub fn drop_no_caps(&self, id: Ident) {
        self.no_caps.remove(&id);
    }

    /// Attributes validated within `meta.ttl`.
    pub fn attr(&self, id: Ident) -> Option<(Attr, Instant)> {
        let a = self.attrs.get(&id)?;
        (self.fresh(a.1) && !self.distrusts(&a.0)).then_some(*a)
    }

    /// Attributes validated within `meta.ttl`, trusted or not (see [`MetaCache::distrusts`]),
    /// and when: while they are held, asking the store again would tell nothing newer.
    pub fn fresh_attr_untrusted(&self, id: Ident) -> Option<(Attr, Instant)> {
        let a = self.attrs.get(&id)?;
        self.fresh(a.1).then_some(*a)
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
        let mut e = self.attrs.entry(id).or_insert((*attr, at));
        if e.1 <= at {
            *e = (*attr, at);
        }
    }

    /// [`MetaCache::put_attr`] of attributes the store was asked for at `at`, returning what
    /// the cache holds for the object afterwards: a newer entry (put by a change of ours that
    /// landed while the store answered, see `FileState::own_change`) wins over them.
    pub fn put_attr_fetched(&self, attr: &Attr, at: Instant) -> Attr {
        self.put_attr(attr, at);
        match self.attrs.get(&ident(attr)) {
            Some(e) if e.1 > at && e.0.kind == attr.kind && !self.distrusts(&e.0) => e.0,
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
            Some(mut e) if self.fresh(e.1) && e.0.kind == FileKind::Dir => {
                e.0.mtime = now;
                e.0.ctime = now;
                // (A store that counts no subdirectories shows 1: left so.)
                if e.0.nlink >= 2 {
                    e.0.nlink = e.0.nlink.saturating_add_signed(nlink).max(2);
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

    pub fn lookup(&self, dir: Ident, name: &OsStr) -> NameLookup {
        match self.dirs.get(&dir) {
            Some(l) if !l.restored && self.fresh(l.validated) => match l.names.get(name) {
                Some(c) => NameLookup::Found(*c),
                None => NameLookup::Absent,
            },
            _ => NameLookup::Unknown,
        }
    }

    /// Whether a listing of `dir` exists at all (fresh or not): a directory someone listed
    /// before is revalidated with one listing, not a stat per name.
    pub fn has_listing(&self, dir: Ident) -> bool {
        self.dirs.contains_key(&dir)
    }

    /// Whether a listing of `dir` exists (fresh or not) and holds `name`.
    pub fn listing_has(&self, dir: Ident, name: &OsStr) -> bool {
        self.dirs
            .get(&dir)
            .is_some_and(|l| l.names.contains_key(name))
    }

    /// A fresh listing's number of names, and how long ago the store gave it (`Duration::MAX`
    /// for one restored from the SSD tier: the store was not asked).
    pub fn listing_size_age(&self, dir: Ident) -> Option<(usize, std::time::Duration)> {
        let l = self.dirs.get(&dir)?;
        if !self.fresh(l.validated) {
            return None;
        }
        let age = match l.restored {
            true => std::time::Duration::MAX,
            false => l.validated.elapsed(),
        };
        Some((l.names.len(), age))
    }

    /// A fresh listing's names, in no particular order.
    pub fn listing(&self, dir: Ident) -> Option<Vec<(OsString, Child)>> {
        let l = self.dirs.get(&dir)?;
        if !self.fresh(l.validated) {
            return None;
        }
        let mut seen = rustc_hash::FxHashSet::default();
        Some(
            l.order
                .iter()
                .filter_map(|n| {
                    let c = l.names.get(n)?;
                    seen.insert(n).then(|| (n.clone(), *c))
                })
                .collect(),
        )
    }

    /// Replaces the listing of `dir` and the attributes of its entries, all validated at `at`.
    pub fn put_listing(&self, dir: Ident, entries: &[(OsString, Attr)], at: Instant) {
        if !self.enabled() {
            return;
        }
        let (names, order) = names_of(entries);
        for (_, a) in entries {
            self.put_attr(a, at);
        }
        self.put_names_of(dir, names, order, at);
    }

    /// Replaces the listing of `dir` with names validated at `at`, leaving the entries'
    /// attributes as they are (a store listed for names first, `Store::names_list_cheaper`).
    pub fn put_names(&self, dir: Ident, entries: &[(OsString, Child)], at: Instant) {
        if !self.enabled() {
            return;
        }
        let names = entries.iter().cloned().collect();
        let order = entries.iter().map(|(n, _)| n.clone()).collect();
        self.put_names_of(dir, names, order, at);
    }

    fn put_names_of(
        &self,
        dir: Ident,
        names: rustc_hash::FxHashMap<OsString, Child>,
        order: Vec<OsString>,
        at: Instant,
    ) {
        // A relisting that found the same names keeps its version: the kernel's copy of them
        // is still right.
        let (version, opened) = match self.dirs.get(&dir) {
            Some(old) if old.order == order && old.names.len() == names.len() => {
                (old.version, old.opened)
            }
            _ => (next_version(), None),
        };
        self.dirs.insert(
            dir,
            Listing {
                names,
                order,
                validated: at,
                restored: false,
                version,
                opened,
            },
        );
    }

    /// A listing of `dir` brought back from the SSD tier that may hold attributes from before
    /// a change (written before a crash, or holding a hard-linked file: see
    /// `namespace::persisted`). Its names are kept but do not answer lookups, and its
    /// attributes are not taken. A lookup of a name it holds relists the directory once
    /// (which revalidates every entry), instead of asking for each name; a readdir, which
    /// needs only the names, is answered from it.
    pub fn put_listing_restored(&self, dir: Ident, entries: &[(OsString, Attr)]) {
        if !self.enabled() {
            return;
        }
        let (names, order) = names_of(entries);
        self.dirs.insert(
            dir,
            Listing {
                names,
                order,
                validated: Instant::now(),
                version: next_version(),
                opened: None,
                restored: true,
            },
        );
    }

    /// Our own operation added `name` to `dir` (create, mkdir, link, rename target).
    pub fn add_name(&self, dir: Ident, name: &OsStr, attr: &Attr) {
        if let Some(mut l) = self.dirs.get_mut(&dir) {
            let new = l
                .names
                .insert(
                    name.to_owned(),
                    Child {
                        id: ident(attr),
                        kind: attr.kind,
                    },
                )
                .is_none();
            if new {
                l.order.push(name.to_owned());
            }
            l.version = next_version();
        }
        self.put_attr(attr, Instant::now());
        // The directory's own mtime/ctime moved.
        self.touch_dir(dir, i32::from(attr.kind == FileKind::Dir));
    }

    /// A lookup in the backing store found `name` in `dir`: a listing we hold gets it, if it
    /// lacked it (created behind our back since the listing).
    pub fn learn_name(&self, dir: Ident, name: &OsStr, attr: &Attr) {
        if let Some(mut l) = self.dirs.get_mut(&dir) {
            let child = Child {
                id: ident(attr),
                kind: attr.kind,
            };
            if l.names.insert(name.to_owned(), child).is_none() {
                l.order.push(name.to_owned());
                l.version = next_version();
            }
        }
    }

    /// The store says `name` in `dir` is the object `attr` describes, which a listing of
    /// names had as another (replaced since, or a mount point, whose entry names the inode
    /// under it): the listing follows the store.
    pub fn correct_name(&self, dir: Ident, name: &OsStr, attr: &Attr) {
        if let Some(mut l) = self.dirs.get_mut(&dir) {
            if let Some(c) = l.names.get_mut(name) {
                *c = Child {
                    id: ident(attr),
                    kind: attr.kind,
                };
                l.version = next_version();
            }
        }
    }

    /// Our own operation removed `name` from `dir` (unlink, rmdir, rename source).
    pub fn remove_name(&self, dir: Ident, name: &OsStr) -> Option<Child> {
        let removed = self.forget_name(dir, name);
        match &removed {
            Some(c) => self.touch_dir(dir, -i32::from(c.kind == FileKind::Dir)),
            // Not in a listing: whether it was a subdirectory (a link of `dir`) is unknown.
            None => self.drop_attr(dir),
        }
        removed
    }

    /// `name` is gone from `dir`'s listing, by a change of ours whose effect on `dir`'s own
    /// attributes is accounted for elsewhere (a deferred removal: its directory's shadow).
    pub fn forget_name(&self, dir: Ident, name: &OsStr) -> Option<Child> {
        let removed = self.dirs.get_mut(&dir).and_then(|mut l| {
            l.version = next_version();
            l.names.remove(name)
        });
        if let Some(c) = &removed {
            // Its link count and ctime changed.
            self.drop_attr(c.id);
        }
        removed
    }

    /// The kernel is given `dir`'s listing at an opendir: whether it may keep the copy it
    /// cached at the previous one (the names are unchanged since).
    pub fn opened(&self, dir: Ident) -> bool {
        let Some(mut l) = self.dirs.get_mut(&dir) else {
            return false;
        };
        let keep = l.opened == Some(l.version);
        l.opened = Some(l.version);
        keep
    }

    /// Forgets what we know of `dir`'s names (an operation whose effect we cannot follow).
    pub fn drop_listing(&self, dir: Ident) {
        self.dirs.remove(&dir);
        self.drop_attr(dir);
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
        self.attrs.retain(|_, v| self.fresh(v.1));
        self.dirs.retain(|_, l| self.fresh(l.validated));
        if self.attrs.len() >= max / 2 {
            self.attrs.clear();
            self.dirs.clear();
            self.links.clear();
        }
    }
}

#[cfg(test)]
mod tests;
