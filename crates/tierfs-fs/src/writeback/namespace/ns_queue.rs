//! The queue between the namespace operations that write-back defers (`ns_defer`) and the
//! namespace flusher (`ns`), and when the flusher takes a group from it (`gather_wait`).

use super::ns_fold::FoldIn;
use super::Writeback;
use crate::identity::Ident;
use crate::inode::Inode;
use crate::namespace::Entry;
use crate::shared::St;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::ffi::OsString;
use std::sync::atomic::{
    AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_store::{Attr, Errno, FileKind, Result, SetAttr, Store};

/// Most records one group applies before its directories are synced and a DONE recorded.
pub(super) const GROUP_MAX: usize = 1024;

/// Queued operations at which the flusher stops gathering (bounds what a crash replays and
/// what the provisional table holds).
const GATHER_MAX: usize = 64 * GROUP_MAX;

/// How often a gathering flusher looks whether someone waits for a provisional object
/// (`Provisional::wait` cannot wake it: the namespace does not know write-back).
const GATHER_POLL: Duration = Duration::from_millis(10);

/// What a deferred rename replaces on the store (`ns_replace`): the file or symlink its new
/// name held, as the store gave it (kind, identity, size), which must still be there when
/// the rename is applied.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Victim {
    pub kind: FileKind,
    pub id: Ident,
    pub size: u64,
}

/// A deferred create's object: its inode and the entry the kernel is given.
pub(crate) type NewObject<S> = (Arc<Inode<St<S>>>, Entry);

/// One deferred operation, in journal order.
pub(crate) enum Job<S: Store> {
    Create {
        seq: u64,
        inode: Arc<Inode<St<S>>>,
        parent: Arc<Inode<St<S>>>,
        name: OsString,
        kind: FileKind,
        mode: u32,
        owner: Option<(u32, u32)>,
        /// A symlink's target.
        target: Option<OsString>,
        /// A special file's device number (a deferred mknod; 0 for the other kinds).
        rdev: u64,
        /// The owner the object gets (as its provisional attributes say).
        new_owner: (u32, u32),
        /// Store bytes reserved for it (a directory's first block), given back once applied.
        reserved: u64,
        /// Taken by the flusher once and put back (a failure in its group): it may be on the
        /// store already, so an unlink or rename of it is not deferred.
        tried: bool,
        at: Instant,
    },
    SetAttr {
        seq: u64,
        inode: Arc<Inode<St<S>>>,
        set: SetAttr,
        /// Of an object of the store (`ns_chattr`): its shadow goes once applied.
        of_store: bool,
        at: Instant,
    },
    /// A create withdrawn before the flusher took it: the object was unlinked
    /// (`Writeback::unlink_deferred`). Nothing goes to the store; applied, it settles what
    /// the create held (its directory's shadow, its reservations) and moves the DONE over
    /// both records.
    Drop {
        seq: u64,
        inode: Arc<Inode<St<S>>>,
        parent: Arc<Inode<St<S>>>,
        reserved: u64,
        at: Instant,
    },
    /// A rename whose create is still queued (`Writeback::rename_deferred`): the create now
    /// makes the new name, so nothing is left for the store. Applied, it moves the DONE over
    /// the record; queued, it keeps the object unpublished. (Also the job of an UNALIAS
    /// record, and what the job of the LINK it withdraws becomes, `Writeback::unalias_deferred`:
    /// nothing for the store either.)
    Renamed {
        seq: u64,
        inode: Arc<Inode<St<S>>>,
        /// The directory it left, when it moved to another: it counted the create as
        /// queued in it until now.
        from: Option<Arc<Inode<St<S>>>>,
        at: Instant,
    },
    /// A rename of an object whose create the flusher had taken (`Writeback::move_deferred`),
    /// or over a file of the store (`Writeback::replace_deferred`, `over`): `from` to `to` in
    /// directory `parent`, on the store, in its turn. Queued, it keeps the object
    /// unpublished (its name in the store's listing hidden until applied).
    Moved {
        seq: u64,
        inode: Arc<Inode<St<S>>>,
        parent: Arc<Inode<St<S>>>,
        from: OsString,
        to: OsString,
        over: Option<Victim>,
        at: Instant,
    },
    /// A deferred link (`Writeback::link_deferred`): the create before it makes the object
    /// under its new name, and this links `alias`, the name it had, to it in `parent` on the
    /// store. Queued, it keeps the object unpublished (the alias is answered by the
    /// provisional table).
    Linked {
        seq: u64,
        inode: Arc<Inode<St<S>>>,
        parent: Arc<Inode<St<S>>>,
        alias: OsString,
        /// Taken by the flusher once and put back: it may be on the store.
        tried: bool,
        at: Instant,
    },
    /// An unlink of a file or symlink of the store (`Writeback::remove_deferred`): `name` in
    /// `parent` removed on the store in its turn, if it still holds the object (`kind`, `id`,
    /// `size`). `inode` is the object's, under an identity of its own since (nothing reaches
    /// it by name). Queued, the name is hidden from lookups and listings.
    Removed {
        seq: u64,
        inode: Arc<Inode<St<S>>>,
        parent: Arc<Inode<St<S>>>,
        name: OsString,
        kind: FileKind,
        id: Ident,
        size: u64,
        at: Instant,
    },
}

impl<S: Store> Job<S> {
    pub(super) fn seq(&self) -> u64 {
        match self {
            Job::Create { seq, .. }
            | Job::SetAttr { seq, .. }
            | Job::Drop { seq, .. }
            | Job::Renamed { seq, .. }
            | Job::Moved { seq, .. }
            | Job::Linked { seq, .. }
            | Job::Removed { seq, .. } => *seq,
        }
    }
    pub(super) fn inode(&self) -> &Arc<Inode<St<S>>> {
        match self {
            Job::Create { inode, .. }
            | Job::SetAttr { inode, .. }
            | Job::Drop { inode, .. }
            | Job::Renamed { inode, .. }
            | Job::Moved { inode, .. }
            | Job::Linked { inode, .. }
            | Job::Removed { inode, .. } => inode,
        }
    }
    /// What `ns_fold` needs to know of it.
    pub(super) fn fold_in(&self) -> FoldIn {
        match self {
            Job::Create {
                inode,
                kind,
                mode,
                new_owner,
                ..
            } => FoldIn::Create {
                id: inode.id(),
                kind: *kind,
                mode: *mode,
                owner: *new_owner,
            },
            Job::SetAttr { inode, set, .. } => FoldIn::SetAttr {
                id: inode.id(),
                set: *set,
                dirty: inode
                    .file
                    .as_ref()
                    .is_some_and(|st| st.has_dirty.load(Acquire)),
            },
            Job::Drop { .. }
            | Job::Renamed { .. }
            | Job::Moved { .. }
            | Job::Linked { .. }
            | Job::Removed { .. } => FoldIn::Skip,
        }
    }

    pub(super) fn at(&self) -> Instant {
        match self {
            Job::Create { at, .. }
            | Job::SetAttr { at, .. }
            | Job::Drop { at, .. }
            | Job::Renamed { at, .. }
            | Job::Moved { at, .. }
            | Job::Linked { at, .. }
            | Job::Removed { at, .. } => *at,
        }
    }
}

/// The queue between the operations and the namespace flusher.
pub(crate) struct NsQueue<S: Store> {
    pub(super) q: Mutex<VecDeque<Job<S>>>,
    /// Wakes the flusher (paired with `q`).
    pub(super) wake: Condvar,
    /// The last NS record appended, and the last one applied (its DONE recorded).
    pub(super) appended: AtomicU64,
    pub(super) applied: Mutex<u64>,
    pub(super) applied_cv: Condvar,
    /// The highest seq someone waits for (a drain): the flusher gathers no longer.
    pub(super) urgent: AtomicU64,
    /// Taken by the flusher and not yet applied: counted as pending, with the oldest's age.
    pub(super) in_flight: Mutex<(usize, Option<Instant>)>,
    /// The last seq of the group taken last, and the objects its operations are on
    /// (`ns_narrow`: whether a rename on the store waits for it).
    pub(super) in_flight_ids: Mutex<(u64, rustc_hash::FxHashSet<Ident>)>,
    /// Per directory, the creates in it deferred and not yet applied, and the directory's
    /// attributes as the application sees them meanwhile (one more link per directory made
    /// in it, its times moved): shown instead of what the store or the metadata cache says
    /// (`shadow_dir_attr`), which does not have them yet.
    pub(super) dirs: Mutex<rustc_hash::FxHashMap<Ident, (usize, Attr)>>,
    /// `dirs` is not empty: read without its lock on every directory getattr.
    pub(super) dirs_shadowed: std::sync::atomic::AtomicBool,
    /// Shadows dropped from `dirs` so far (see `Writeback::unshadowed`).
    pub(super) unshadowed: AtomicU64,
    /// Per kernel inode of an object of the store, its deferred setattrs not yet applied
    /// and the fields they set (`ns_chattr`); `attrs` is not empty; shadows dropped so far.
    pub(super) attrs: Mutex<rustc_hash::FxHashMap<u64, (usize, super::attr_shadow::AttrShadow)>>,
    pub(super) attrs_shadowed: std::sync::atomic::AtomicBool,
    pub(super) attrs_unshadowed: AtomicU64,
    /// Group times, ms, the last 256 (for the median and p99 in stats).
    pub(super) group_ms: Mutex<VecDeque<u64>>,
    /// A drain waits: a flusher in its backoff after a failure tries again at once.
    pub(super) retry_now: std::sync::atomic::AtomicBool,
}

impl<S: Store> NsQueue<S> {
    pub(crate) fn new() -> NsQueue<S> {
        NsQueue {
            q: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            appended: AtomicU64::new(0),
            applied: Mutex::new(0),
            applied_cv: Condvar::new(),
            urgent: AtomicU64::new(0),
            in_flight: Mutex::new((0, None)),
            in_flight_ids: Mutex::new((0, Default::default())),
            dirs: Mutex::new(Default::default()),
            dirs_shadowed: std::sync::atomic::AtomicBool::new(false),
            unshadowed: AtomicU64::new(0),
            attrs: Mutex::new(Default::default()),
            attrs_shadowed: std::sync::atomic::AtomicBool::new(false),
            attrs_unshadowed: AtomicU64::new(0),
            group_ms: Mutex::new(VecDeque::new()),
            retry_now: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// Where the create of provisional object `id` is in the queue, if it is still queued and
/// was never taken by the flusher: until then the store has nothing of the object, so an
/// operation on it may rewrite that create (`ns_link`, `ns_rename`). Not once a move of the
/// object is queued after it (a replace, `ns_replace`): the move renames what the create
/// makes, over an object of the store that must go.
pub(super) fn untaken_create<S: Store>(q: &VecDeque<Job<S>>, id: Ident) -> Option<usize> {
    if moves_queued(q, id) {
        return None;
    }
    q.iter()
        .position(|j| matches!(j, Job::Create { inode: i, tried: false, .. } if i.id() == id))
}

/// Whether a move of object `id` on the store is queued (`ns_move`, `ns_replace`).
pub(super) fn moves_queued<S: Store>(q: &VecDeque<Job<S>>, id: Ident) -> bool {
    q.iter()
        .any(|j| matches!(j, Job::Moved { inode, .. } if inode.id() == id))
}

impl<S: Store> Writeback<S> {
    /// Waits until every namespace operation deferred so far is on the store (or refused):
    /// before an operation that is not deferred, an fsync, a listing, unmount.
    #[track_caller]
    pub(crate) fn drain_ns(&self) -> Result<()> {
        self.drain_ns_to(self.nsq.appended.load(Acquire))
    }

    /// [`Writeback::drain_ns`] of the operations up to `target` (see `ns_narrow`). The
    /// store's error if the flusher's attempts still fail once this has waited
    /// `STALL_PATIENCE`, as a wait for one new object does (`Provisional::wait`; they stay
    /// queued and are retried): an fsync or an operation done on the store after them then
    /// fails, as it would in write-through, instead of waiting for as long as the store
    /// fails; a store that fails for a moment is waited for.
    #[track_caller]
    pub(crate) fn drain_ns_to(&self, target: u64) -> Result<()> {
        let mut g = self.nsq.applied.lock();
        if *g >= target {
            return Ok(());
        }
        self.nsq.urgent.fetch_max(target, AcqRel);
        // A flusher waiting out its backoff after a failure tries again now.
        self.nsq.retry_now.store(true, Release);
        let t = Instant::now();
        let mut r = Ok(());
        while *g < target {
            if self.stop.load(Acquire) {
                r = Err(Errno::EIO);
                break;
            }
            if let Some(e) = self
                .ns
                .prov
                .stalled_error()
                .filter(|_| t.elapsed() >= crate::namespace::STALL_PATIENCE)
            {
                r = Err(e);
                break;
            }
            self.nsq.wake.notify_one();
            self.nsq
                .applied_cv
                .wait_for(&mut g, Duration::from_millis(100));
        }
        self.c.ns_waits.fetch_add(1, Relaxed);
        self.c
            .ns_wait_ms
            .fetch_add(t.elapsed().as_millis() as u64, Relaxed);
        // Which operation waited (`TIERFS_LOG=tierfs_fs::ns_wait=debug`): what to defer next.
        tracing::debug!(
            target: "tierfs_fs::ns_wait",
            at = %std::panic::Location::caller(),
            ms = t.elapsed().as_millis() as u64,
            "waited for the deferred namespace operations"
        );
        r
    }

    /// An attempt to apply queued operations failed with `e` (they stay queued): drains and
    /// waits for new objects return it once they have waited long enough.
    pub(super) fn ns_failed(&self, e: Errno) {
        self.ns.prov.stalled(Some(e));
        self.nsq.applied_cv.notify_all();
    }

    /// The namespace flusher's wait after a failed attempt: `backoff`, or less if a drain
    /// asks for a retry (an fsync wants to know now whether the store works again). False:
    /// stop (the mount is going away).
    pub(super) fn ns_backoff(wb: &std::sync::Weak<Self>, backoff: Duration) -> bool {
        let until = Instant::now() + backoff;
        loop {
            let Some(wb) = wb.upgrade() else { return false };
            if wb.stop.load(Acquire) {
                return false;
            }
            let now = Instant::now();
            if now >= until || wb.nsq.retry_now.swap(false, AcqRel) {
                return true;
            }
            // In slices, so that the flusher holds the mount for no longer.
            let mut q = wb.nsq.q.lock();
            wb.nsq
                .wake
                .wait_for(&mut q, (until - now).min(Duration::from_millis(200)));
        }
    }

    /// Queues `job`, whose record the caller appended to the journal while holding `q` (so
    /// the queue stays in journal order), and lets the queue go. Only the first of a burst
    /// wakes the flusher: it lets the rest gather (`gather_wait`).
    pub(super) fn enqueue(&self, mut q: MutexGuard<'_, VecDeque<Job<S>>>, job: Job<S>) {
        self.nsq.appended.store(job.seq(), Relaxed);
        q.push_back(job);
        self.c.ns_deferred.fetch_add(1, Relaxed);
        let first = q.len() == 1;
        drop(q);
        if first {
            self.nsq.wake.notify_one();
        }
    }

    /// How long the flusher lets queued operations gather before it takes a group, None:
    /// take it now. While an untar or a build keeps creating, the flusher and the store it
    /// drives (its CPU, on a small machine) stay out of the application's way, and a group
    /// holds more names per directory sync; as Linux holds dirty pages for
    /// `dirty_expire_centisecs` and rclone uploads after `--vfs-write-back`. Nothing waits
    /// for it that asked not to: a drain (fsync, sync, a rename, unmount) or a wait for a
    /// provisional object ends it at once, and the end of a burst (`writeback.namespace_quiet`
    /// without one) too.
    pub(super) fn gather_wait(&self, q: &VecDeque<Job<S>>) -> Option<Duration> {
        let delay = self.cfg.namespace_delay;
        let (first, last) = (q.front()?, q.back()?);
        if delay.is_zero()
            || q.len() >= GATHER_MAX
            || self.stop.load(Acquire)
            || self.nsq.urgent.load(Acquire) >= first.seq()
            || self.ns.prov.awaited()
        {
            return None;
        }
        let quiet_left = self.cfg.namespace_quiet.checked_sub(last.at().elapsed())?;
        let age_left = delay.checked_sub(first.at().elapsed())?;
        Some(quiet_left.min(age_left).min(GATHER_POLL))
    }
}
