//! Space reservation (PxFS fastwrite): a write that will need backing space takes it from a
//! local pool first, so a full backing store fails that write(2) with ENOSPC instead of a
//! flush failing later, when the application has long been told its data is safe.
//!
//! The pool is refilled in chunks against the backing store's free space (statfs) minus
//! what is reserved and not yet flushed. Reservations are conservative: every dirty byte
//! holds space until it is flushed, overwrites of existing data included (on a store that
//! allocates on overwrite, like ZFS or btrfs, that is even needed). Quotas are not read
//! (statfs shows the filesystem, not the user's quota): a quota-limited user gets EDQUOT
//! at flush, kept and retried like any flush error, and reported at fsync/close.

use crate::stats::ReserveStats;
use parking_lot::Mutex;
use std::sync::atomic::{
    AtomicBool,
    Ordering::{AcqRel, Release},
};
use std::time::{Duration, Instant};
use tierfs_store::{Errno, Result};

/// How often the pool re-reads free space even while it has credit: other writers of the
/// backing store consume it too. The re-read is a flusher's ([`Reservations::refresh`]): a
/// write with credit at hand never waits for the store's statfs (a store that hangs would
/// hold it, though the journal can take it).
const RESTAT: Duration = Duration::from_secs(1);

struct Inner {
    /// The store's allocation unit (statfs `f_frsize`), learnt at the first refill.
    block: u64,
    /// Bytes granted from the store's free space and not yet handed to writes.
    credit: u64,
    /// Bytes handed to writes and not yet flushed (the store has not consumed them yet).
    reserved: u64,
    /// Bytes given back so far (a running total): what was flushed while a statfs was asked
    /// may be missing from its answer's free space, and is not granted twice.
    released: u64,
    statted: Option<Instant>,
}

/// Bytes a write of `len` at `offset` may allocate: every store block it touches, whole.
fn blocks(offset: u64, len: u64, block: u64) -> u64 {
    ((offset + len).div_ceil(block) - offset / block) * block
}

impl Inner {
    /// The credit from the store's answer: what it can still take beyond what we promised
    /// (less what was given back since the statfs was asked, `released` then), up to a chunk
    /// (at least `need`).
    fn refill(&mut self, free: u64, block: u64, margin: u64, chunk: u64, need: u64, released: u64) {
        self.block = block.clamp(512, 1 << 20);
        let avail = free
            .saturating_sub(self.reserved)
            .saturating_sub(self.released - released)
            .saturating_sub(margin);
        self.credit = avail.min(chunk.max(need));
        self.statted = Some(Instant::now());
    }

    fn take(&mut self, n: u64) -> u64 {
        self.credit -= n;
        self.reserved += n;
        n
    }
}

pub struct Reservations {
    inner: Mutex<Inner>,
    chunk: u64,
    /// Free space never handed out (in bytes): room for metadata, journals, other users.
    margin: u64,
    /// A refresh is asking the store (one at a time).
    refreshing: AtomicBool,
}

impl Reservations {
    pub fn new(chunk: u64, margin: u64) -> Reservations {
        Reservations {
            inner: Mutex::new(Inner {
                block: 4096,
                credit: 0,
                reserved: 0,
                released: 0,
                statted: None,
            }),
            chunk,
            margin,
            refreshing: AtomicBool::new(false),
        }
    }

    /// Takes the space a write of `len` bytes at `offset` may allocate: every store block it
    /// touches, whole (a store allocates blocks, not bytes). From the credit at hand, however
    /// old (a flusher renews it, [`Reservations::refresh`]); when that is short, refills from
    /// `free()` (the store's free bytes and block size now), asked with no lock held, so that
    /// flushers giving back what they flushed never wait for the store's answer. Returns the
    /// bytes taken (give them back with [`Reservations::release`]); ENOSPC if the store
    /// cannot hold them.
    pub fn reserve(
        &self,
        offset: u64,
        len: u64,
        free: impl FnOnce() -> Result<(u64, u64)>,
    ) -> Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        let released = {
            let mut i = self.inner.lock();
            let n = blocks(offset, len, i.block);
            if i.credit >= n {
                return Ok(i.take(n));
            }
            i.released
        };
        let (free, block) = free()?;
        let mut i = self.inner.lock();
        let need = blocks(offset, len, block.clamp(512, 1 << 20));
        i.refill(free, block, self.margin, self.chunk, need, released);
        if i.credit < need {
            return Err(Errno::ENOSPC);
        }
        Ok(i.take(need))
    }

    /// Renews the credit from `free()` if it is older than `RESTAT` and writes hold space (a
    /// flusher's periodic work; one caller at a time, the others return at once). A store
    /// that does not answer leaves the credit as it was: what it granted still holds, so
    /// write-back goes on absorbing writes until it is spent.
    pub fn refresh(&self, free: impl FnOnce() -> Result<(u64, u64)>) {
        // Only while writes hold space: an idle mount does not ask the store every second.
        let due = {
            let i = self.inner.lock();
            let stale = i.statted.is_some_and(|t| t.elapsed() >= RESTAT);
            (i.reserved > 0 && stale).then_some(i.released)
        };
        let Some(released) = due else { return };
        if self.refreshing.swap(true, AcqRel) {
            return;
        }
        if let Ok((free, block)) = free() {
            let mut i = self.inner.lock();
            i.refill(free, block, self.margin, self.chunk, 0, released);
        }
        self.refreshing.store(false, Release);
    }

    /// [`Reservations::reserve`] from the credit at hand only: None when it would have to
    /// ask the store for its free space first (credit short), so a caller that must not block
    /// on the store can hand the write to a thread that may.
    pub fn try_reserve(&self, offset: u64, len: u64) -> Option<u64> {
        if len == 0 {
            return Some(0);
        }
        let mut i = self.inner.lock();
        let n = blocks(offset, len, i.block);
        (i.credit >= n).then(|| i.take(n))
    }

    /// `n` reserved bytes were flushed (or dropped): the store holds them now (or never will).
    pub fn release(&self, n: u64) {
        let mut i = self.inner.lock();
        i.reserved = i.reserved.saturating_sub(n);
        i.released += n;
    }

    pub fn stats(&self) -> ReserveStats {
        let i = self.inner.lock();
        ReserveStats {
            credit_bytes: i.credit,
            reserved_bytes: i.reserved,
            reserved_inodes: 0,
        }
    }
}

/// Inodes for deferred creates (write-back of namespace operations): a create or mkdir is
/// acknowledged before the store makes the object, so it is deferred only while the store's
/// free inodes (statfs `f_ffree`, at most `RESTAT` old) exceed those promised to creates not
/// yet applied, by a margin. Otherwise it is done on the store at once, and a store out of
/// inodes or over quota fails that very call, with its own errno (ENOSPC, EDQUOT). A store
/// that reports no inode count (`f_files` 0: btrfs, many network filesystems) limits
/// nothing here; its bytes are reserved like data (`Reservations`).
pub struct InodeReservations {
    inner: Mutex<InodeInner>,
    margin: u64,
}

struct InodeInner {
    /// Free inodes at the last statfs; None: the store does not count them.
    free: Option<u64>,
    /// Promised to deferred creates not yet applied.
    reserved: u64,
    statted: Option<Instant>,
}

impl InodeReservations {
    pub fn new(margin: u64) -> InodeReservations {
        InodeReservations {
            inner: Mutex::new(InodeInner {
                free: None,
                reserved: 0,
                statted: None,
            }),
            margin,
        }
    }

    /// Takes one inode; false when the store may not have it (the create is then done on
    /// the store). `stat` gives the store's (total, free) inodes; None: it may not be asked
    /// now (the dispatching thread) and the count is older than `RESTAT`: false.
    pub fn reserve(&self, stat: Option<&dyn Fn() -> Result<(u64, u64)>>) -> bool {
        let mut i = self.inner.lock();
        if i.statted.is_none_or(|t| t.elapsed() >= RESTAT) {
            let Some(stat) = stat else { return false };
            match stat() {
                Ok((files, ffree)) => {
                    i.free = (files > 0).then_some(ffree);
                    i.statted = Some(Instant::now());
                }
                // Gone (or hung): the count last seen still holds for what it leaves, as the
                // data credit does (`reserve`), so a create in a cached directory is
                // absorbed while the store does not answer.
                Err(Errno::ENOTCONN) if i.statted.is_some() => {}
                // Failing, or never counted: no promise on an unknown count.
                Err(_) => return false,
            }
        }
        match i.free {
            Some(f) if f.saturating_sub(self.margin) <= i.reserved => false,
            _ => {
                i.reserved += 1;
                true
            }
        }
    }

    /// A deferred create was applied (or refused): the store's count has it now.
    pub fn release(&self) {
        let mut i = self.inner.lock();
        i.reserved = i.reserved.saturating_sub(1);
    }

    pub fn reserved(&self) -> u64 {
        self.inner.lock().reserved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inodes_are_promised_up_to_the_free_count_less_the_margin() {
        let r = InodeReservations::new(2);
        let stat = || Ok((100, 5));
        // 5 free, margin 2: three creates deferred, the fourth done on the store.
        assert!(r.reserve(Some(&stat)));
        assert!(r.reserve(None), "within RESTAT the count at hand answers");
        assert!(r.reserve(None));
        assert!(!r.reserve(None));
        r.release();
        assert!(r.reserve(None));
        assert_eq!(r.reserved(), 3);
        // A store without an inode count limits nothing.
        let r = InodeReservations::new(2);
        assert!(
            !r.reserve(None),
            "never stat'ed: the dispatching thread cannot tell"
        );
        let unlimited = || Ok((0, 0));
        for _ in 0..1000 {
            assert!(r.reserve(Some(&unlimited)));
        }
        // Nor does a store that cannot be asked: no promise.
        let r = InodeReservations::new(2);
        let gone = || Err(Errno::ENOTCONN);
        assert!(!r.reserve(Some(&gone)));
    }

    #[test]
    fn grants_until_the_store_is_full_and_again_after_release() {
        let b = 512;
        let r = Reservations::new(10 * b, 5 * b);
        let free = 100 * b;
        // 95 blocks grantable (margin 5), in chunks of 10; a 7-block write that is not
        // aligned touches 8 blocks.
        let mut got = 0;
        while let Ok(n) = r.reserve(100, 7 * b, || Ok((free, b))) {
            assert_eq!(n, 8 * b);
            got += n;
        }
        assert_eq!(got, 88 * b);
        // 7 blocks left: an aligned 7-block write fits where the unaligned one did not.
        assert_eq!(r.reserve(0, 7 * b, || Ok((free, b))), Ok(7 * b));
        assert_eq!(r.reserve(0, 1, || Ok((free, b))), Err(Errno::ENOSPC));
        // Flushed: the store's free space went down by what was written.
        r.release(95 * b);
        assert_eq!(
            r.reserve(100, 7 * b, || Ok((free - 95 * b, b))),
            Err(Errno::ENOSPC)
        );
        r.release(0);
        assert_eq!(r.reserve(0, 1, || Ok((free - 90 * b, b))), Ok(b));
    }

    #[test]
    fn old_credit_is_spent_without_asking_and_a_refresh_renews_it() {
        let b = 512;
        let r = Reservations::new(10 * b, 0);
        assert_eq!(r.reserve(0, b, || Ok((100 * b, b))), Ok(b));
        std::thread::sleep(RESTAT);
        // Older than RESTAT: still spent as it is, the store not asked (it may hang).
        let hung = || -> Result<(u64, u64)> { panic!("a write with credit asked the store") };
        assert_eq!(r.reserve(b, b, hung), Ok(b));
        assert_eq!(r.try_reserve(2 * b, b), Some(b));
        // A store that does not answer leaves the credit as it was.
        r.refresh(|| Err(Errno::ENOTCONN));
        assert_eq!(r.stats().credit_bytes, 7 * b);
        // Renewed: at most a chunk of what the store has beyond what is reserved.
        r.refresh(|| Ok((5 * b, b)));
        assert_eq!(r.stats().credit_bytes, 2 * b);
        // Fresh again: nothing to renew.
        r.refresh(|| panic!("a fresh credit renewed"));
        // Given back while the store was asked (flushed: its free space may not show it
        // yet): not granted again.
        std::thread::sleep(RESTAT);
        r.refresh(|| {
            r.release(2 * b);
            Ok((5 * b, b))
        });
        assert_eq!(r.stats().credit_bytes, 5 * b - b - 2 * b);
        // Nothing held: an idle mount does not ask the store.
        r.release(b);
        std::thread::sleep(RESTAT);
        r.refresh(|| panic!("an idle pool asked the store"));
    }
}
