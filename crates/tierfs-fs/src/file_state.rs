//! Per-backing-file cache state: which version of the contents the cached blocks belong to.

use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Instant;
use tierfs_store::{Attr, Fingerprint};

pub use crate::version::{racy, unverified, Version};

static NEXT_GEN: AtomicU64 = AtomicU64::new(1);

/// Our own changes to backing files, all files together (see [`own_changes`]).
static OWN_CHANGES: AtomicU64 = AtomicU64::new(0);

/// The count of our own changes to any backing file so far. Take it before a request whose
/// answer covers files the caller has no state of yet (a listing, a lookup), and ask
/// [`FileState::changed_by_us_since`] of each file in the answer (a request about one
/// known file takes the instant instead, see [`FileState::own_change`]).
pub fn own_changes() -> u64 {
    OWN_CHANGES.load(std::sync::atomic::Ordering::Acquire)
}

fn next_gen() -> u64 {
    NEXT_GEN.fetch_add(1, Relaxed)
}

struct Inner {
    v: Version,
    checked: Instant,
    /// Fingerprint at the last open: an open that finds it unchanged may keep the kernel's
    /// page cache (FOPEN_KEEP_CACHE); any change since makes the kernel drop it.
    opened: Option<Fingerprint>,
    /// Changes of our own to the backing file under way (see [`FileState::own_change`]).
    in_progress: u32,
    /// [`own_changes`] once the last of them began or was recorded.
    own_global: u64,
    /// When the last of them ended or was recorded (not `checked`: that says when the store
    /// was last asked, and a writer must still ask it once per `meta.ttl`).
    own_done: Instant,
}

impl Inner {
    fn own_change(&mut self) {
        self.own_global = OWN_CHANGES.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        self.own_done = Instant::now();
    }
}

/// A change of our own to the backing file under way (see [`FileState::own_change`]).
pub struct OwnChange<'a>(&'a FileState);

impl Drop for OwnChange<'_> {
    fn drop(&mut self) {
        let mut i = self.0.inner.lock();
        i.in_progress -= 1;
        i.own_change();
    }
}

/// `FileState::opens` of a file a deferred unlink dropped: it cannot be opened any more.
pub(crate) const DROPPED: u32 = 1 << 31;

/// One per backing file (by identity), shared by every kernel inode and handle of it, and
/// kept after the kernel forgets the file so its cached blocks stay reachable.
pub struct FileState {
    /// The file's identity: keys its SSD entries. Changes when a rename through tierfs
    /// gives a file identified by its path a new one (`InodeTable::rekey`).
    id: Mutex<crate::identity::Ident>,
    /// The identity it had when the state was made: keys its write-back journal records,
    /// which must match each other across a rename.
    pub journal_key: crate::identity::Ident,
    /// Readers take it shared, writers exclusive, for one request each: a read never sees half
    /// of a write, and a fetch never inserts blocks older than a write that finished first.
    pub rw: RwLock<()>,
    inner: Mutex<Inner>,
    /// Write-back: data written and not yet on the backing store (None when clean).
    pub dirty: Mutex<Option<crate::dirty::Dirty>>,
    /// `dirty` is Some: lets reads and attributes skip its lock when clean.
    pub has_dirty: AtomicBool,
    /// The backing file was changed on the store directly (a write-through write, a
    /// truncate, fallocate, copy_file_range), not through the write-back journal: an fsync
    /// in write-back must sync the store's file too (see `Objects::fsync`).
    pub changed_direct: AtomicBool,
    /// Bumped whenever flushed bytes leave `dirty` (see `Fs::read_over_dirty`).
    pub flush_gen: AtomicU64,
    /// A flusher holds the file (one at a time per file).
    pub flushing: AtomicBool,
    /// A failed flush is retried no earlier than this (`now_ms`), after `backoff_ms`.
    pub retry_at_ms: AtomicU64,
    pub backoff_ms: AtomicU64,
    /// Created by us in write-back mode: its directory is synced before the journal lets
    /// go of its data.
    pub created: AtomicBool,
    /// The seq of the last DONE recorded for the file's flushed data: fsync waits for it to
    /// be durable (a replay would otherwise write older records over what it acknowledged).
    pub done_seq: AtomicU64,
    /// An error of a flush that settled the file anyway (its data kept in the lost
    /// directory), for the application's next fsync or close.
    pub pending_error: Mutex<Option<tierfs_store::Errno>>,
    /// Held across each setattr of the backing file's times that can race another: an
    /// application's (utimensat, `cp -p`) and the flusher's mtime after a flush, which is sent
    /// without `rw` (`settle.rs: settle_after`). The flusher reads the time it sends under it,
    /// so the application's, noted first, is either sent by it or lands after it.
    pub times: Mutex<()>,
    /// Which version's data the kernel and readers may hold (`meta.cto=off`).
    pub served: crate::served::Served,
    /// Handles the kernel holds open (OPEN or CREATE answered, RELEASE not yet; none are
    /// counted under FUSE no-open): an unlink of a file with none may drop its data.
    pub opens: AtomicU32,
}

/// What [`FileState::observe`] found.
pub enum Observed {
    Unchanged,
    Changed,
}

impl FileState {
    /// A state whose attributes were validated at `checked` (maybe long ago, from the
    /// metadata cache).
    pub fn new_at(attr: &Attr, checked: Instant) -> FileState {
        FileState {
            id: Mutex::new((attr.dev, attr.ino)),
            journal_key: (attr.dev, attr.ino),
            rw: RwLock::new(()),
            dirty: Mutex::new(None),
            has_dirty: AtomicBool::new(false),
            changed_direct: AtomicBool::new(false),
            flush_gen: AtomicU64::new(0),
            flushing: AtomicBool::new(false),
            retry_at_ms: AtomicU64::new(0),
            backoff_ms: AtomicU64::new(0),
            created: AtomicBool::new(false),
            done_seq: AtomicU64::new(0),
            pending_error: Mutex::new(None),
            times: Mutex::new(()),
            served: Default::default(),
            opens: AtomicU32::new(0),
            inner: Mutex::new(Inner {
                v: Version {
                    fp: attr.fingerprint(),
                    gen: next_gen(),
                },
                checked,
                opened: None,
                in_progress: 0,
                own_global: 0,
                own_done: checked,
            }),
        }
    }

    pub fn id(&self) -> crate::identity::Ident {
        *self.id.lock()
    }

    pub(crate) fn set_id(&self, id: crate::identity::Ident) {
        *self.id.lock() = id;
    }

    pub fn version(&self) -> Version {
        self.inner.lock().v
    }

    /// Whether the version must be checked against the store again: `expired` says so of
    /// its fingerprint and when it was last checked (`MetaCache::version_expired`).
    pub fn expired(&self, expired: impl Fn(&Fingerprint, Instant) -> bool) -> bool {
        let i = self.inner.lock();
        expired(&i.v.fp, i.checked)
    }

    /// Records fresh attributes from the backing store that go to the kernel (lookup,
    /// getattr, open). A changed fingerprint means the file changed behind our back: a new
    /// generation makes every cached block of it unreachable, and the kernel, seeing a new
    /// mtime or size in the reply, drops its cached pages itself (FUSE_AUTO_INVAL_DATA), so
    /// nothing of the old version is held any more (see [`crate::served`]).
    pub fn observe(&self, attr: &Attr) -> Observed {
        let r = self.observe_data(attr);
        if let Observed::Changed = r {
            self.served.reset();
        }
        r
    }

    /// [`FileState::observe`] for attributes the kernel does not see (a read or write found
    /// them): the kernel may still hold pages of the old version.
    pub fn observe_data(&self, attr: &Attr) -> Observed {
        let mut i = self.inner.lock();
        if i.in_progress > 0 {
            // (See `FileState::own_change`.)
            return Observed::Unchanged;
        }
        self.observe_locked(&mut i, attr)
    }

    /// Marks a change of our own to the backing file as under way, until the guard is
    /// dropped: from before the store is asked to make it until the state has recorded what
    /// it left. Attributes fetched without the file's lock (an open, a getattr, a lookup)
    /// may show the file from before such a change; taken for a change behind our back, they
    /// would make a version of the old contents (a flush of an extending write racing an
    /// open: a read of the new bytes returned zeros, the write-back model test about 1 run
    /// in 5 under load). So while one is under way no attributes are recorded, and attributes
    /// are recorded only if their fetch began after the last one ended (the `_fetched`
    /// methods, with the instant taken before asking the store).
    pub fn own_change(&self) -> OwnChange<'_> {
        let mut i = self.inner.lock();
        i.in_progress += 1;
        i.own_change();
        OwnChange(self)
    }

    /// Whether a change of our own to the file began or was recorded after [`own_changes`]
    /// gave `count`: attributes of it fetched since may show it before that change.
    pub fn changed_by_us_since(&self, count: u64) -> bool {
        self.inner.lock().own_global > count
    }

    /// [`FileState::observe`] of attributes whose fetch began at `fetched` (see
    /// [`FileState::own_change`]); `None`: not recorded, the state knows newer.
    pub fn observe_fetched(&self, attr: &Attr, fetched: Instant) -> Option<Observed> {
        let r = self.observe_data_fetched(attr, fetched)?;
        if let Observed::Changed = r {
            self.served.reset();
        }
        Some(r)
    }

    /// [`FileState::observe_data`] with the check of [`FileState::observe_fetched`].
    pub fn observe_data_fetched(&self, attr: &Attr, fetched: Instant) -> Option<Observed> {
        let mut i = self.inner.lock();
        if i.in_progress > 0 || fetched < i.own_done || fetched < i.checked {
            return None;
        }
        let r = self.observe_locked(&mut i, attr);
        i.checked = fetched;
        Some(r)
    }

    fn observe_locked(&self, i: &mut Inner, attr: &Attr) -> Observed {
        let fp = attr.fingerprint();
        if unverified(&i.v.fp) && fp.size == i.v.fp.size {
            // After our own write, attributes that may have been fetched before it landed
            // (the size it left, so nothing says otherwise): only attributes fetched under
            // the file's lock settle the version (`settle_own_writes`).
            return Observed::Unchanged;
        }
        i.checked = Instant::now();
        if fp == i.v.fp {
            return Observed::Unchanged;
        }
        let old = i.v.gen;
        i.v = Version {
            fp,
            gen: next_gen(),
        };
        // While one of our own writes is under way (a write-through writer holds the lock
        // exclusively; a flusher writes without it), the change may be that write's: what
        // the kernel holds is then the application's own data, not an old version.
        if self.flushing.load(std::sync::atomic::Ordering::Acquire) || self.rw.is_locked_exclusive()
        {
            self.served.follow(old, &i.v);
        }
        Observed::Changed
    }

    /// [`FileState::observe`] for attributes validated at `at` (from the metadata cache):
    /// ignored if the state knows something newer.
    pub fn observe_at(&self, attr: &Attr, at: Instant) -> Observed {
        {
            let i = self.inner.lock();
            // (Older than what the state knows, or than a change of ours: see `own_change`.)
            if at < i.checked || at < i.own_done {
                return Observed::Unchanged;
            }
        }
        let r = self.observe(attr);
        // observe() stamped "now"; the attributes are only as fresh as `at`.
        self.inner.lock().checked = at;
        r
    }

    /// After one of our own operations that cannot change the data (chmod, rename, link,
    /// xattrs): a change of ctime alone keeps the cached blocks.
    pub fn observe_own_metadata_change(&self, attr: &Attr) -> Observed {
        let mut i = self.inner.lock();
        let fp = attr.fingerprint();
        // (A provisional fingerprint is settled under the file's lock only.)
        if fp.size == i.v.fp.size && fp.mtime_ns == i.v.fp.mtime_ns && !unverified(&i.v.fp) {
            i.v.fp = fp;
            i.own_change();
            i.checked = Instant::now();
            self.served.follow(i.v.gen, &i.v);
            return Observed::Unchanged;
        }
        drop(i);
        self.observe(attr)
    }

    /// After our own write, whose effect on the cached blocks the caller has applied to `gen`.
    pub fn set_after_own_write(&self, gen: u64, attr: &Attr) {
        let mut i = self.inner.lock();
        i.own_change();
        if i.v.gen == gen {
            i.v.fp = attr.fingerprint();
            i.checked = Instant::now();
            // What the kernel holds of this generation is the application's own data.
            self.served.follow(gen, &i.v);
        }
    }

    /// After our own write-through write, whose effect on the cached blocks of `gen` the
    /// caller has applied, without asking the store for the times it left (a round trip per
    /// write on a network store): the version becomes [`crate::version::provisional`] until
    /// attributes fetched under the file's lock settle it ([`FileState::settle_own_writes`]).
    /// `checked` stays when the store was last asked, so a writer settles at least once per
    /// `meta.ttl`.
    pub fn wrote(&self, gen: u64, new_size: u64) {
        let mut i = self.inner.lock();
        i.own_change();
        if i.v.gen == gen {
            i.v.fp = crate::version::provisional(&i.v.fp, new_size);
            // What the kernel holds of this generation is the application's own data.
            self.served.follow(gen, &i.v);
        }
    }

    /// Whether a read must ask the store first: the fingerprint's trust ran out (see
    /// [`FileState::expired`]), or our own writes left it provisional (one lock for both).
    pub fn needs_check(&self, expired: impl Fn(&Fingerprint, Instant) -> bool) -> bool {
        let i = self.inner.lock();
        unverified(&i.v.fp) || expired(&i.v.fp, i.checked)
    }

    /// Whether our own writes left a provisional fingerprint (see [`FileState::wrote`]).
    pub fn unverified(&self) -> bool {
        unverified(&self.inner.lock().v.fp)
    }

    /// [`FileState::observe_data`] of attributes fetched while the caller held `rw` (shared
    /// or exclusive), so after every write of ours that finished: if they show the size our
    /// writes left, they are our writes' fingerprint (a change by someone else in the same
    /// interval that left the same size is taken for ours, as it would be within one write).
    pub fn settle_own_writes(&self, attr: &Attr) -> Observed {
        let mut i = self.inner.lock();
        let fp = attr.fingerprint();
        if unverified(&i.v.fp) && fp.size == i.v.fp.size {
            i.v.fp = fp;
            i.checked = Instant::now();
            self.served.follow(i.v.gen, &i.v);
            return Observed::Unchanged;
        }
        drop(i);
        self.observe_data(attr)
    }

    /// [`FileState::settle_own_writes`] of attributes a reader fetched (the fetch began at
    /// `fetched`) under the file's shared lock, which a change of ours does not always hold
    /// for its whole length: a flusher sets the mtime it flushed without it
    /// (`writeback/data/settle.rs: settle_after`). Not recorded if such a change was under way
    /// or ended since, as in [`FileState::observe_data_fetched`] (the answer may show the file
    /// half-way through it; the change's own settling records the version): None.
    pub fn settle_fetched(&self, attr: &Attr, fetched: Instant) -> Option<Observed> {
        {
            let i = self.inner.lock();
            if i.in_progress > 0 || fetched < i.own_done {
                return None;
            }
        }
        Some(self.settle_own_writes(attr))
    }

    /// Drops every cached block of the file (truncate, fallocate, a write we cannot follow).
    pub fn invalidate(&self, attr: Option<&Attr>) {
        let mut i = self.inner.lock();
        let old = i.v.gen;
        if let Some(a) = attr {
            i.v.fp = a.fingerprint();
        }
        i.v.gen = next_gen();
        i.own_change();
        i.checked = Instant::now();
        // Our own change: what the kernel holds is what the application made it (the kernel
        // truncates its own pages), not an old version.
        self.served.follow(old, &i.v);
    }

    /// Fingerprint recorded by the last [`FileState::opened`], if any.
    pub fn last_opened(&self) -> Option<Fingerprint> {
        self.inner.lock().opened
    }

    /// Called at open with fresh attributes; returns whether the kernel may keep its cache.
    pub fn opened(&self, attr: &Attr) -> bool {
        self.observe(attr);
        self.opened_trusted()
    }

    /// [`FileState::opened`] of attributes whose fetch began at `fetched`. If they are not
    /// recorded (a change of ours landed meanwhile, see [`FileState::own_change`]), the
    /// state's fingerprint, which that change recorded from the store, is what the open
    /// compares.
    pub fn opened_fetched(&self, attr: &Attr, fetched: Instant) -> bool {
        self.observe_fetched(attr, fetched);
        self.opened_trusted()
    }

    /// Called at an open that trusts the state's fingerprint (still within `meta.ttl`).
    pub fn opened_trusted(&self) -> bool {
        let mut i = self.inner.lock();
        let fp = i.v.fp;
        let keep = i.opened == Some(fp);
        // Pages the kernel reads under a racy fingerprint may be torn: never let it keep them.
        i.opened = (!racy(&fp)).then_some(fp);
        if !keep {
            // Opened without FOPEN_KEEP_CACHE: the kernel drops its pages of the file.
            self.served.reset();
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_store::{FileKind, TimeSpec};

    fn attr(size: u64, mtime: i64, ctime: i64) -> Attr {
        Attr {
            dev: 1,
            ino: 2,
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            size,
            blocks: size.div_ceil(512),
            blksize: 4096,
            atime: TimeSpec::default(),
            mtime: TimeSpec {
                sec: mtime,
                nsec: 0,
            },
            ctime: TimeSpec {
                sec: ctime,
                nsec: 0,
            },
        }
    }

    /// The race of the write-back model test: an open asks the store, a flush of ours lands
    /// and records the file it left, then the open's answer (the file before the flush)
    /// arrives. It must not be taken for a change behind our back.
    #[test]
    fn attributes_from_before_our_own_change_are_not_a_new_version() {
        let st = FileState::new_at(&attr(0, 10, 10), Instant::now());
        let fetched = Instant::now(); // the open asks the store...
        let before = attr(0, 10, 10); // ... and it answers with the file before the flush
        let v = st.version();
        {
            let _own = st.own_change();
            // Under way: nothing is recorded, whenever it was fetched.
            assert!(st
                .observe_fetched(&attr(5, 11, 11), Instant::now())
                .is_none());
            assert!(matches!(st.observe(&attr(5, 11, 11)), Observed::Unchanged));
            st.set_after_own_write(v.gen, &attr(3645, 20, 20));
        }
        assert!(st.observe_fetched(&before, fetched).is_none());
        st.opened_fetched(&before, fetched);
        assert_eq!(st.version().fp.size, 3645);
        assert_eq!(
            st.version().gen,
            v.gen,
            "the flushed version's blocks stay reachable"
        );
        // Fetched after it, the same store answer is a change behind our back.
        assert!(matches!(
            st.observe_fetched(&attr(10, 30, 30), Instant::now()),
            Some(Observed::Changed)
        ));
        assert_eq!(st.version().fp.size, 10);
    }

    /// An own change recorded under another generation (an observation made one meanwhile)
    /// still counts: the global count moves, and a fetch from before it is not recorded.
    #[test]
    fn own_changes_count_even_when_the_generation_moved() {
        let st = FileState::new_at(&attr(0, 10, 10), Instant::now());
        let count = own_changes();
        let fetched = Instant::now();
        st.set_after_own_write(st.version().gen + 1000, &attr(1, 1, 1));
        assert!(st.changed_by_us_since(count));
        st.wrote(st.version().gen + 1000, 7);
        assert!(st.observe_fetched(&attr(0, 10, 10), fetched).is_none());
    }
}
