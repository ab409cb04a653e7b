//! Directory listings in the metadata cache: the names of a directory, validated together
//! and trusted as the directory's own attributes are; patched in place by our own namespace
//! operations (an untar into one directory never lists it again), renewed by one request
//! when the directory is unchanged.

use super::{ident, Child, Ident, MetaCache};
use std::ffi::{OsStr, OsString};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use tierfs_store::{Attr, FileKind, Fingerprint};

/// The complete set of names in one directory, as of `validated`.
pub struct Listing {
    pub names: rustc_hash::FxHashMap<OsString, Child>,
    /// The names in the backing store's order (plus names we added since; removed ones are
    /// skipped when listing). Listing in the same order every time matters: the SSD tier
    /// lays small files out in the order they were first read, and reads them back fastest
    /// in that order.
    pub(super) order: Vec<OsString>,
    pub validated: Instant,
    /// How long from `validated` its names are trusted (the directory's [`MetaCache::trust`]).
    pub(super) trust: Duration,
    /// The directory's version on the store when it was listed, while no change of ours or
    /// name learnt since moved it: a directory the store still shows at this version has
    /// these names ([`MetaCache::renew_listing`]).
    pub(super) dir_fp: Option<Fingerprint>,
    /// Brought back from the SSD tier: its names are the directory's as of a version the
    /// store still has, but not to be answered from before one listing has revalidated it
    /// (see [`MetaCache::put_listing_restored`]).
    pub(super) restored: bool,
    /// Names this listing as it stands: a new one whenever a name comes or goes.
    pub(super) version: u64,
    /// The version the kernel was last given at an opendir (it caches directory contents,
    /// FOPEN_CACHE_DIR, and may keep them while they are unchanged).
    pub(super) opened: Option<u64>,
    /// Until when no entry's attributes can have run out (the earliest expiry among them,
    /// as last seen), and under which `meta.ttl`: [`MetaCache::stale_entries`] looks at them
    /// only after it, or once `meta.ttl` was lowered.
    pub(super) entries_until: Option<(Instant, Duration)>,
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
    pub fn lookup(&self, dir: Ident, name: &OsStr) -> NameLookup {
        match self.dirs.get(&dir) {
            Some(l) if !l.restored && self.fresh_for(l.validated, l.trust) => {
                match l.names.get(name) {
                    Some(c) => NameLookup::Found(*c),
                    None => NameLookup::Absent,
                }
            }
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
        if !self.fresh_for(l.validated, l.trust) {
            return None;
        }
        let age = match l.restored {
            true => std::time::Duration::MAX,
            false => l.validated.elapsed(),
        };
        Some((l.names.len(), age))
    }

    /// A fresh listing's names, in the store's order.
    pub fn listing(&self, dir: Ident) -> Option<Vec<(OsString, Child)>> {
        let l = self.dirs.get(&dir)?;
        if !self.fresh_for(l.validated, l.trust) {
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

    /// How many entries of the listing of `dir` (fresh or not) have attributes whose trust
    /// ran out (or none cached), of how many it holds. None: no listing, or one restored
    /// from the SSD tier (relisted at its first lookup anyway). An opendir relists a
    /// directory most of whose entries are stale (`Namespace::listing_of`): each would
    /// otherwise cost a request of its own, one after another, when the walk that opened it
    /// stats it (an `ls -l` of 10,000 entries over sshfs whose attributes ran out: 47 s, the
    /// store alone 0.4 s). Cheap while none can have run out (`entries_until`).
    pub fn stale_entries(&self, dir: Ident) -> Option<(usize, usize)> {
        let ids: Vec<Ident> = {
            let l = self.dirs.get(&dir)?;
            if l.restored {
                return None;
            }
            let ttl = self.ttl();
            if l.entries_until
                .is_some_and(|(t, at_ttl)| ttl >= at_ttl && Instant::now() < t)
            {
                return Some((0, l.names.len()));
            }
            l.names.values().map(|c| c.id).collect()
        };
        // (The ids are copied out first: no guard of `dirs` is held while `attrs` is read.)
        let mut stale = 0;
        let mut soonest = self.ttl();
        for id in &ids {
            match self.attrs.get(id) {
                Some(r) if self.rec_fresh(&r) => soonest = soonest.min(r.left()),
                _ => stale += 1,
            }
        }
        if stale == 0 {
            if let Some(mut l) = self.dirs.get_mut(&dir) {
                l.entries_until = Some((Instant::now() + soonest, self.ttl()));
            }
        }
        Some((stale, ids.len()))
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
        let trust = self.dir_trust(dir, at);
        self.dirs.insert(
            dir,
            Listing {
                names,
                order,
                validated: at,
                trust,
                dir_fp: None,
                restored: false,
                version,
                opened,
                entries_until: None,
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
        let at = Instant::now();
        self.dirs.insert(
            dir,
            Listing {
                names,
                order,
                validated: at,
                trust: self.dir_trust(dir, at),
                dir_fp: None,
                version: next_version(),
                opened: None,
                restored: true,
                entries_until: None,
            },
        );
    }

    /// How long a listing of `dir` validated at `at` is trusted: as its directory's
    /// attributes (whose mtime moves with its names), or `meta.ttl_min` without them.
    fn dir_trust(&self, dir: Ident, at: Instant) -> Duration {
        match self.attrs.get(&dir) {
            Some(r) => self.trust(&r.attr, at),
            None => self.ttl_min(),
        }
    }

    /// The store's attributes of `dir`, asked for at `asked`, show it as it was when its
    /// listing was taken (`same`): its names are trusted again as of then, without listing it
    /// (its entries' attributes keep their own times). A directory's mtime moves whenever a
    /// name in it comes or goes, so this one request stands for the listing, as NFS clients
    /// revalidate their cached directory pages.
    /// Returns whether it was (false: no listing, or one taken at another version).
    pub fn renew_listing(&self, dir: Ident, fp: &Fingerprint, asked: Instant) -> bool {
        let trust = self.dir_trust(dir, asked);
        let Some(mut l) = self.dirs.get_mut(&dir) else {
            return false;
        };
        if l.dir_fp.as_ref() != Some(fp) {
            return false;
        }
        if l.validated < asked {
            l.validated = asked;
            l.trust = trust;
        }
        true
    }

    /// The listing of `dir` just put was taken at the directory's version `fp` (asked for
    /// before the listing: a change in between gives a version nobody asks for later). Not
    /// a version that changed within the last second: a store with one-second times (sshfs)
    /// shows a name made in the same second as the listing under the same version.
    pub fn listed_at(&self, dir: Ident, fp: Fingerprint) {
        if crate::version::racy(&fp) {
            return;
        }
        if let Some(mut l) = self.dirs.get_mut(&dir) {
            l.dir_fp = Some(fp);
        }
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
            l.dir_fp = None;
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
                l.dir_fp = None;
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
                l.dir_fp = None;
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
            l.dir_fp = None;
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
}
