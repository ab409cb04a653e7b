//! The namespace: kernel inode numbers and the backing objects behind them, names, the
//! metadata cache (attributes, listings, symlink targets in RAM and the SSD tier) and the
//! ESTALE rules. It knows nothing of file data: the data path (`data`) and write-back stand
//! on it, never the other way round.
//!
//! Files: this one (the table, lookups, attributes), `nodes` (an inode's store object and
//! its attributes from the store), `checks` (close-to-open in one request), `listing`
//! (directory listings and handles), `names` (creating and removing names), `rename`,
//! `estale` (replaced files and the kernel's retry), `attrs` (symlinks, xattrs, statfs),
//! `persisted` (which listings in the SSD tier are current).

mod absent;
mod attrs;
mod checks;
mod entry_attrs;
mod estale;
mod listing;
mod names;
mod nodes;
mod persisted;
mod provisional;
mod rename;
mod walk_lists;

pub(crate) use attrs::unkept_xattr;
pub(crate) use checks::Answer;
pub use listing::{DirOpen, DirPage};
pub use provisional::{is_provisional, ProvLookup, Provisional, PROV_DEV, STALL_PATIENCE};

use crate::fast_map::DashMap;
use crate::identity::Ident;
use crate::inode::{Inode, InodeTable};
use crate::meta::{ident, MetaCache, NameLookup};
use crate::shared::{Listed, Node, Shared, St};
use crate::stats::FsStats;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_cache::SingleFlight;
use tierfs_store::{Attr, Errno, FileKind, Owner, Result, Store};

/// A name the kernel now knows: inode number and attributes (with `attr.ino` = that number).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub ino: u64,
    pub attr: Attr,
    /// How long the kernel may keep the attributes (capped by `fuse.attr_ttl` and
    /// `fuse.entry_ttl`): what is left of their trust in the metadata cache, nothing for
    /// attributes whose trust ran out (it asks for them again before using them).
    pub valid: std::time::Duration,
}

/// Who asked, for ownership of new objects.
#[derive(Clone, Copy, Debug)]
pub struct Requester {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Clone, Debug)]
pub struct DirEntryOut {
    pub ino: u64,
    pub name: OsString,
    pub kind: FileKind,
    /// Offset of the entry after this one.
    pub next_offset: u64,
}

pub(crate) struct Namespace<S: Store> {
    pub sh: Arc<Shared<S>>,
    pub inodes: InodeTable<St<S>>,
    pub meta: MetaCache,
    /// Listings in progress, one per directory (see [`Namespace::list_dir`]).
    listings: SingleFlight<Ident, Result<Listed>>,
    /// Fan-outs for the attributes of a listing's entries under way, per directory and
    /// class (subdirectories or not), and listings of names waiting for them to be
    /// persisted (see `entry_attrs`).
    entry_stats: SingleFlight<(Ident, bool), ()>,
    names_listed: DashMap<Ident, entry_attrs::NamesListed>,
    /// Caller threads whose last open was answered ESTALE (file replaced behind our back),
    /// and when (`now_ms`): their next lookups and open are the kernel's retry of that open.
    estale: DashMap<u32, u64>,
    dirs: DashMap<u64, Arc<listing::DirHandle>>,
    next_dir_fh: AtomicU64,
    as_root: bool,
    /// Names created by write-back that the store does not have yet (see `provisional`).
    pub prov: Provisional<St<S>>,
    /// Our changes so far, and the last one to each directory's listing (see `persisted`).
    listing_changes: AtomicU64,
    listing_stamps: DashMap<Ident, persisted::Stamp>,
    /// The directory of the last unlink that had to look its victim up on the store, and
    /// what that led to (see `names::PinLookups`).
    pin_lookups: parking_lot::Mutex<names::PinLookups>,
    /// Names the store said moments ago it does not have (see `absent`).
    absent: absent::Absent,
    /// Store answers that serve as an open's close-to-open check (see `checks`).
    pub(crate) checks: checks::Checks,
    /// The store has no extended attributes at all (see `attrs`).
    pub(crate) no_xattrs: bool,
    /// Directories never listed that a walk looks names up in one by one (see `walk_lists`).
    walks: walk_lists::WalkLists,
}

impl<S: Store> Namespace<S> {
    pub fn new(sh: Arc<Shared<S>>, root: Node<S>, root_attr: &Attr) -> Namespace<S> {
        let no_xattrs = sh.store.listxattr(&root) == Err(Errno::ENOTSUP);
        let mut meta = MetaCache::new(
            sh.cfg.meta_ttl,
            sh.cfg.meta_max_entries,
            sh.store.identity_kind() == tierfs_store::Identity::Path,
        );
        meta.set_ttl_min(sh.cfg.ttl_min_setting());
        meta.serve_stale_while(sh.store.inner().health.gone_flag());
        meta.set_dirs_track_names(sh.store.dirs_track_names());
        let ns = Namespace {
            inodes: InodeTable::new(root, root_attr, 1 << 20),
            meta,
            listings: SingleFlight::new(Err(Errno::EIO)),
            entry_stats: SingleFlight::new(()),
            names_listed: DashMap::default(),
            estale: DashMap::default(),
            dirs: DashMap::default(),
            next_dir_fh: AtomicU64::new(1),
            // SAFETY: geteuid has no preconditions.
            as_root: unsafe { libc::geteuid() } == 0,
            prov: Provisional::new(),
            listing_changes: AtomicU64::new(0),
            listing_stamps: DashMap::default(),
            pin_lookups: parking_lot::Mutex::new(names::PinLookups::default()),
            absent: absent::Absent::default(),
            checks: checks::Checks::default(),
            no_xattrs,
            walks: walk_lists::WalkLists::default(),
            sh,
        };
        ns.meta.put_attr(root_attr, Instant::now());
        ns
    }

    /// The daemon runs as root: it may write any file whatever its mode.
    pub(crate) fn as_root(&self) -> bool {
        self.as_root
    }

    /// A new store answers at BACKING (see `health`): the root is the new one, and every
    /// other node held from before is let go, to be resolved again by name when needed.
    pub(crate) fn reset_nodes(&self) {
        match self.sh.store.root() {
            Ok((root, _)) => self.inodes.reset_nodes(root),
            Err(e) => tracing::error!("backing store: its new root does not answer: {e}"),
        }
    }

    pub(crate) fn inode(&self, ino: u64) -> Result<Arc<Inode<St<S>>>> {
        // ESTALE: the kernel named an inode we no longer know (it cannot, by the forget
        // protocol, unless the daemon restarted under it).
        self.inodes.get(ino).ok_or(Errno::ESTALE)
    }

    pub(crate) fn owner(&self, req: Requester) -> Owner {
        self.as_root.then_some((req.uid, req.gid))
    }

    /// Records a name the kernel learns, found under `parent` as `name` with `node`.
    pub(crate) fn entry(
        &self,
        parent: &Arc<Inode<St<S>>>,
        name: &OsStr,
        node: Node<S>,
        attr: Attr,
    ) -> Entry {
        self.entry_fetched(parent, name, node, attr, Instant::now())
    }

    /// [`Namespace::entry`] of attributes the store was asked for at `fetched`: if a change
    /// of ours landed since, what it recorded is newer and is what the kernel is told.
    pub(crate) fn entry_fetched(
        &self,
        parent: &Arc<Inode<St<S>>>,
        name: &OsStr,
        node: Node<S>,
        mut attr: Attr,
        fetched: Instant,
    ) -> Entry {
        self.made_name(parent.id(), name);
        let newest = self.meta.put_attr_fetched(&attr, fetched);
        let inode = self
            .inodes
            .remember_at(parent.clone(), name, node, &attr, fetched);
        attr = newest;
        attr.ino = inode.ino;
        Entry {
            ino: inode.ino,
            valid: self.kernel_valid(&attr, self.meta.trust(&attr, fetched)),
            attr,
        }
    }

    /// How long the kernel may keep `attr`, trusted for `left` more here. With path
    /// identities each name of a hard-linked file is an object of its own, and a link or
    /// unlink through one name changes the others' link count unseen: such attributes are
    /// not to be kept at all. Without the metadata cache, `fuse.attr_ttl` decides alone.
    pub(crate) fn kernel_valid(
        &self,
        attr: &Attr,
        left: std::time::Duration,
    ) -> std::time::Duration {
        if self.meta.distrusts(attr) {
            std::time::Duration::ZERO
        } else if !self.meta.enabled() {
            std::time::Duration::MAX
        } else {
            left
        }
    }

    pub(crate) fn with_ino(&self, inode: &Inode<St<S>>, mut attr: Attr) -> Attr {
        attr.ino = inode.ino;
        attr
    }

    /// `Fs::lookup` on behalf of caller thread `pid` (0: unknown), see `Fs::open_by`.
    pub fn lookup_by(&self, parent: u64, name: &OsStr, pid: u32) -> Result<Entry> {
        too_long(name)?;
        let p = self.inode(parent)?;
        if let Some(r) = self.lookup_provisional(&p, name) {
            return r;
        }
        // The kernel's retry of an open we answered ESTALE asks the store: the metadata
        // cache may still name the replaced file, and the retry is the last one the VFS makes.
        let cached = if self.retrying_after_estale(pid) {
            None
        } else {
            self.lookup_cached(&p, name)?
        };
        let e = match cached {
            Some(e) => e,
            None => {
                // Stamped with when it was asked for (see `FileState::own_change`).
                let fetched = Instant::now();
                let r = self.sh.store.lookup(&self.node(&p)?, name);
                // Only answers count (a name, or none): a lookup that failed or timed out on
                // a hanging store must not make a listing, which is not bounded, look cheap.
                let answered = matches!(&r, Ok(_) | Err(Errno::ENOENT));
                if answered && self.walks_listed() && !self.meta.has_listing(p.id()) {
                    self.walks.missed(p.id(), fetched.elapsed());
                }
                let (node, attr) = match r {
                    Ok(r) => r,
                    Err(e) => {
                        if e == Errno::ENOENT {
                            self.absent.note(p.id(), name, fetched);
                        }
                        return Err(e);
                    }
                };
                // A name the listing lacked (created behind our back): it has it now.
                self.meta.learn_name(p.id(), name, &attr);
                // The open that may follow from this thread takes it as its check.
                let answer = Answer {
                    attr,
                    asked: fetched,
                };
                self.checks.note(pid, ident(&attr), answer);
                self.entry_fetched(&p, name, node, attr, fetched)
            }
        };
        Ok(e)
    }

    /// A lookup the metadata cache answers without any I/O, for the FUSE thread itself;
    /// None when it would need the SSD tier or the backing store.
    pub fn lookup_fast(&self, parent: u64, name: &OsStr, pid: u32) -> Option<Result<Entry>> {
        if let Err(e) = too_long(name) {
            return Some(Err(e));
        }
        let p = self.inodes.get(parent)?;
        if let Some(r) = self.lookup_provisional(&p, name) {
            return Some(r);
        }
        if !self.meta.enabled() || self.retrying_after_estale(pid) {
            return None;
        }
        self.answer_from_listing(&p, name, self.meta.lookup(p.id(), name))
    }

    /// A lookup the provisional table answers (see `provisional`): None when it cannot.
    fn lookup_provisional(&self, p: &Arc<Inode<St<S>>>, name: &OsStr) -> Option<Result<Entry>> {
        match self.prov.lookup(p.id(), name) {
            ProvLookup::NotHere => None,
            ProvLookup::Absent | ProvLookup::Hidden => Some(Err(Errno::ENOENT)),
            ProvLookup::Found(inode, attr) => Some(self.provisional_entry(&inode, attr)),
        }
    }

    /// The kernel learns provisional object `inode` (one more lookup of it).
    pub(crate) fn provisional_entry(&self, inode: &Arc<Inode<St<S>>>, attr: Attr) -> Result<Entry> {
        if !self.inodes.readmit(inode) {
            // Its inode number was taken by another object while the kernel had forgotten
            // it: not expected within 2^60 numbers, but never two objects under one number.
            tracing::error!("provisional inode {} lost its number", inode.ino);
            return Err(Errno::EIO);
        }
        Ok(Entry {
            ino: inode.ino,
            attr: self.with_ino(inode, attr),
            // Ours alone until the store has it.
            valid: std::time::Duration::MAX,
        })
    }

    /// Makes a provisional object (see `provisional`): `parent/name`, of `kind` (a symlink
    /// to `target`, a device of number `rdev`), identified by the seq of the journal record
    /// that created it, with its owner and mode as the store would give them. The kernel learns it (one lookup).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_provisional(
        &self,
        parent: &Arc<Inode<St<S>>>,
        name: &OsStr,
        kind: FileKind,
        mode: u32,
        owner: (u32, u32),
        seq: u64,
        target: Option<&OsStr>,
        rdev: u64,
    ) -> Result<(Arc<Inode<St<S>>>, Entry)> {
        let t = tierfs_store::TimeSpec::now();
        let dir = kind == FileKind::Dir;
        let size = match (kind, target) {
            (FileKind::Dir, _) => 4096,
            (_, Some(target)) => target.len() as u64,
            _ => 0,
        };
        let attr = Attr {
            dev: PROV_DEV,
            ino: seq,
            kind,
            perm: (mode & 0o7777) as u16,
            nlink: if dir { 2 } else { 1 },
            uid: owner.0,
            gid: owner.1,
            rdev,
            size,
            blocks: 0,
            blksize: 4096,
            atime: t,
            mtime: t,
            ctime: t,
        };
        let inode = self
            .inodes
            .remember_lazy(parent.clone(), name, &attr, Instant::now());
        self.made_name(parent.id(), name);
        self.prov
            .add(inode.clone(), attr, parent.id(), name, target);
        let e = Entry {
            ino: inode.ino,
            attr: self.with_ino(&inode, attr),
            valid: std::time::Duration::MAX,
        };
        Ok((inode, e))
    }

    /// The owner a new object of requester `req` gets on the store: the requester's when
    /// the daemon runs as root (it sets it), else the daemon's own.
    pub(crate) fn new_owner(&self, req: Requester) -> (u32, u32) {
        match self.owner(req) {
            Some(o) => o,
            // SAFETY: no preconditions.
            None => unsafe { (libc::geteuid(), libc::getegid()) },
        }
    }

    /// [`Namespace::getattr_valid`] when the metadata cache can answer without I/O.
    pub fn getattr_fast(&self, ino: u64) -> Option<(Attr, std::time::Duration)> {
        let i = self.inodes.get(ino)?;
        if let Some(a) = self.prov.attr(i.id()) {
            return Some((self.with_ino(&i, a), std::time::Duration::MAX));
        }
        let (attr, _, left) = self.meta.attr_left(i.id())?;
        FsStats::add(&self.sh.stats.meta_hits, 1);
        Some((self.with_ino(&i, attr), self.kernel_valid(&attr, left)))
    }

    /// A lookup answered by the metadata cache: `Ok(None)` when it cannot answer. A name in
    /// a listing whose trust ran out is asked of the store alone, one request, never by
    /// listing its directory again: a walk of a directory slower than the listing's trust
    /// (10,000 entries over sshfs, an `fstatat` each) relisted it for every name it asked,
    /// 152 listings for one `ls -l`. Readdir lists a directory again, and an `opendir`
    /// renews a listing whose directory is unchanged with one request (`listing`). A name
    /// listed for names first without fresh attributes gets them with every other entry of
    /// its class (`entry_attrs`).
    pub(crate) fn lookup_cached(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
    ) -> Result<Option<Entry>> {
        if !self.meta.enabled() || p.kind != FileKind::Dir {
            return Ok(None);
        }
        let mut found = self.meta.lookup(p.id(), name);
        if matches!(found, NameLookup::Unknown) && !self.meta.has_listing(p.id()) {
            self.restore_listing(p, false);
            found = self.meta.lookup(p.id(), name);
        }
        if matches!(found, NameLookup::Unknown)
            && !self.meta.has_listing(p.id())
            && self.walk_due(p)
        {
            // A walk looking names up one by one in a directory nobody listed: one listing
            // answers the rest of it (`walk_lists`). The directory is asked first, bounded
            // by `store.timeout` as a lookup is (a listing is not): a store that froze since
            // is not listed.
            if self.fetch_attr(p).is_ok() && self.walk_fits(p) && self.list_dir(p).is_ok() {
                found = self.meta.lookup(p.id(), name);
            }
        }
        if matches!(found, NameLookup::Unknown) && self.sh.store.inner().health.gone() {
            if let Some(e) = self.answer_while_gone(p, name) {
                return Ok(Some(e));
            }
            // The store cannot answer: a listing of the directory, whatever its age or origin
            // (one restored from the SSD tier is never taken for fresh), that lacks the name
            // answers for it, as a cached listing answers `ls` (else a `stat` of a new name,
            // and so every create, failed with ENOTCONN while the store hung).
            if self.meta.has_listing(p.id()) && !self.meta.listing_has(p.id(), name) {
                return Err(Errno::ENOENT);
            }
        }
        // Listed for names first: its kind of entries' attributes, all at once.
        if let NameLookup::Found(c) = found {
            if self.names_first() && self.meta.fresh_attr_untrusted(c.id).is_none() {
                self.stat_entries(p, c.kind == FileKind::Dir);
            }
        }
        self.answer_from_listing(p, name, found).transpose()
    }

    /// Whether this mount lists directories a walk looks names up in (see `walk_lists`): a
    /// network store (a local disk answers a lookup in microseconds) whose directories'
    /// sizes follow their names (a filesystem, an sftp server) or that lists in pages (S3),
    /// not listed for names first.
    fn walks_listed(&self) -> bool {
        self.meta.enabled()
            && self.sh.store.may_hang()
            && (self.sh.store.dirs_track_names() || self.sh.store.listing_page() > 0)
            && !self.names_first()
    }

    /// Whether `p`, never listed, is to be listed now for the walk looking names up in it.
    fn walk_due(&self, p: &Arc<Inode<St<S>>>) -> bool {
        if !self.walks_listed() || self.sh.store.inner().health.gone() {
            return false;
        }
        if self.sh.store.listing_page() > 0 {
            return self.walks.due_paged(p.id());
        }
        let size = match self.meta.attr_expired(p.id()) {
            Some((a, _)) => a.size,
            None => return false,
        };
        self.walks.due(p.id(), size)
    }

    /// Whether `p`, due for a walk's listing (`walk_due`), fits one listing page on a store
    /// that lists in pages (S3), asked once the directory's own check (bounded by
    /// `store.timeout`) found the store answering; a directory that does not, or cannot be
    /// asked, is left to its lookups. Elsewhere its size decided already.
    fn walk_fits(&self, p: &Arc<Inode<St<S>>>) -> bool {
        let page = self.sh.store.listing_page();
        if page == 0 {
            return true;
        }
        let fits = self
            .node(p)
            .and_then(|n| self.sh.store.lists_within(&n, page));
        if !matches!(fits, Ok(true)) {
            self.walks.too_big(p.id());
        }
        matches!(fits, Ok(true))
    }

    /// While the store is gone, a name looked up before (its directory never listed) is
    /// answered from the attributes cached under its path identity: the store cannot answer.
    /// Inode identities cannot be derived from a name: those lookups fail.
    fn answer_while_gone(&self, p: &Arc<Inode<St<S>>>, name: &OsStr) -> Option<Entry> {
        if self.sh.store.identity_kind() != tierfs_store::Identity::Path {
            return None;
        }
        let id = self.sh.store.derive(p.id(), name);
        let (mut attr, at, left) = self.meta.attr_left(id)?;
        FsStats::add(&self.sh.stats.meta_hits, 1);
        let inode = self.inodes.remember_lazy(p.clone(), name, &attr, at);
        attr.ino = inode.ino;
        Some(Entry {
            ino: inode.ino,
            valid: self.kernel_valid(&attr, left),
            attr,
        })
    }

    /// The entry a cached listing gives for `name`: ENOENT if the fresh listing lacks it,
    /// None if the cache cannot answer (no fresh listing, or no attributes). Attributes whose
    /// trust ran out are given with no time to keep them: the kernel asks for them again
    /// (one request, a GETATTR) before it uses them, and an open checks the file anyway, so
    /// the lookup itself costs none.
    pub(crate) fn answer_from_listing(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        found: NameLookup,
    ) -> Option<Result<Entry>> {
        let child = match found {
            NameLookup::Found(c) => c,
            // Close-to-open covers new names too: a file created behind our back must be
            // found by the next open, so with `meta.cto` a name missing from the listing is
            // asked for (a positive answer is checked again by the open itself). Not while
            // the store is gone or hangs: the listing answers, as it answers `ls`.
            NameLookup::Absent if self.sh.cfg.meta_cto && !self.sh.store.inner().health.gone() => {
                return None
            }
            NameLookup::Absent => {
                FsStats::add(&self.sh.stats.meta_hits, 1);
                return Some(Err(Errno::ENOENT));
            }
            NameLookup::Unknown => return None,
        };
        let (mut attr, at, left) = match self.meta.attr_left(child.id) {
            Some(r) => r,
            None => {
                let (a, at) = self.meta.attr_expired(child.id)?;
                (a, at, Duration::ZERO)
            }
        };
        if attr.kind != child.kind {
            return None;
        }
        FsStats::add(&self.sh.stats.meta_hits, 1);
        let inode = self.inodes.remember_lazy(p.clone(), name, &attr, at);
        attr.ino = inode.ino;
        Some(Ok(Entry {
            ino: inode.ino,
            valid: self.kernel_valid(&attr, left),
            attr,
        }))
    }

    /// The kernel forgot `n` lookups of `ino`; true if it forgot the inode (and its pages).
    pub fn forget(&self, ino: u64, n: u64) -> bool {
        let Some(gone) = self.inodes.forget(ino, n) else {
            return false;
        };
        if self.inodes.get(ino).is_some() {
            // Its number went to an inode learnt meanwhile: that one's pages stay.
            return false;
        }
        if let Some(st) = &gone.file {
            st.served.reset();
        }
        true
    }
}

/// ENAMETOOLONG for a name no store can hold (NAME_MAX bytes): a cached listing would answer
/// ENOENT, where the store, asked, says the name is too long (POSIX, pjdfstest).
fn too_long(name: &OsStr) -> Result<()> {
    if name.len() > libc::NAME_MAX as usize {
        return Err(tierfs_store::Errno(libc::ENAMETOOLONG));
    }
    Ok(())
}
