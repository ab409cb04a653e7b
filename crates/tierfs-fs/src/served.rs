//! Never two versions in one read stream (`meta.cto=off`).
//!
//! Without close-to-open, a file's data is trusted for `meta.ttl` and the kernel keeps its
//! cached pages across opens (with FUSE no-open it is never told about opens at all). So a
//! file rewritten behind our back can be found changed in the middle of a reader's stream:
//! the first blocks came from the kernel's page cache or the RAM tier (old version, trusted
//! within `meta.ttl`), the next one misses every tier and the store has only the new version.
//! Serving it would hand the reader a mix of two versions (the issue-12 trial: one `cat` of
//! an 8 MiB file, 30 blocks old and 98 new). A cache may serve stale data within its
//! documented window; it may never serve corrupt data.
//!
//! So each file records which version's data the kernel (and, through it, readers) may hold:
//! the version of the data it was last given. A read that would hand out another version
//! while the kernel may still hold the old one fails with ESTALE (the version the reader was
//! reading is gone from the store), and the kernel is told to drop its pages of the file.
//! Reads stay refused until it has, and then for [`REFUSE_WINDOW`] more, except a read at
//! offset 0, which starts a new stream: the kernel ignores a failed read-ahead and reads the
//! page again synchronously, and that read must fail too, or the reader would get new data
//! after old after all. A read entirely beyond the old version's end (a file that grew,
//! `tail -f`) is served: it cannot mix with what came before.
//!
//! Nothing is held any more, and the record is cleared, when the kernel drops the pages
//! itself: at an open without FOPEN_KEEP_CACHE, when a lookup or getattr reply shows it a new
//! mtime or size (FUSE_AUTO_INVAL_DATA), or when it forgets the inode. Our own changes
//! (truncate, writes) carry the record over to the new generation.
//!
//! With close-to-open (the default) every open revalidates, so a change made before the open
//! is never mixed with older data, and a change during a read is a concurrent write, which a
//! local filesystem would show the reader too.

use crate::version::Version;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Release};
use std::time::{Duration, Instant};

/// How long after a refusal reads at other offsets than 0 are still refused. The kernel
/// ignores a failed read-ahead and reads the page again synchronously right away: that read
/// must fail too, so the application sees the error instead of new data after old. A read at
/// offset 0 once the kernel has dropped its pages starts a new stream and is served at once.
const REFUSE_WINDOW: Duration = Duration::from_millis(500);

/// A page drop still not done after this long is logged (once): every read of the file is
/// refused until it is, so a user seeing ESTALE for seconds learns why.
const SLOW_DROP: Duration = Duration::from_secs(1);

enum State {
    /// The kernel holds nothing of the file.
    Nothing,
    /// The kernel may hold data of generation `gen`, a version `size` bytes long last
    /// modified at `mtime_ns`.
    Holds { gen: u64, size: u64, mtime_ns: i64 },
    /// A read was refused; the kernel is being told to drop its pages (`warned`: that it
    /// is slow to was logged).
    Dropping { since: Instant, warned: bool },
    /// The kernel dropped its pages after a refusal at `since`.
    Refusing { since: Instant },
}

/// What the kernel may hold of one file.
pub struct Served {
    state: Mutex<State>,
    /// The generation of `State::Holds`, else 0: the inline read path's lock-free check.
    gen: AtomicU64,
}

impl Default for Served {
    fn default() -> Served {
        Served {
            state: Mutex::new(State::Nothing),
            gen: AtomicU64::new(0),
        }
    }
}

/// What [`Served::admit`] decided about handing out data of a version.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Serve it.
    Yes,
    /// Serve it (it lies beyond the old version's end), and have the kernel drop its pages
    /// of the old version.
    YesDropOld,
    /// Fail the read with ESTALE; with `drop`, have the kernel drop its pages (then call
    /// [`Served::dropped`]).
    Refuse { drop: bool },
}

impl Served {
    /// The lock-free check of the inline read path: the kernel holds nothing but `gen`.
    pub fn is(&self, gen: u64) -> bool {
        self.gen.load(Acquire) == gen
    }

    fn hold(&self, st: &mut State, v: &Version) {
        *st = State::Holds {
            gen: v.gen,
            size: v.fp.size,
            mtime_ns: v.fp.mtime_ns,
        };
        self.gen.store(v.gen, Release);
    }

    fn set(&self, st: &mut State, new: State) {
        *st = new;
        self.gen.store(0, Release);
    }

    /// May data of version `v`, read at `offset`, be handed to the kernel?
    pub fn admit(&self, v: &Version, offset: u64) -> Admit {
        let mut st = self.state.lock();
        match *st {
            State::Holds { gen, .. } if gen == v.gen => Admit::Yes,
            State::Nothing => {
                self.hold(&mut st, v);
                Admit::Yes
            }
            State::Dropping {
                since,
                ref mut warned,
            } => {
                slow_drop(since, warned);
                Admit::Refuse { drop: false }
            }
            State::Refusing { since } if offset == 0 || since.elapsed() >= REFUSE_WINDOW => {
                self.hold(&mut st, v);
                Admit::Yes
            }
            State::Refusing { .. } => Admit::Refuse { drop: false },
            // Only the ctime moved (a chmod, a link or unlink of another name, ours or not):
            // the same bytes.
            State::Holds { size, mtime_ns, .. }
                if size == v.fp.size && mtime_ns == v.fp.mtime_ns =>
            {
                self.hold(&mut st, v);
                Admit::Yes
            }
            State::Holds { size, .. } if offset >= size => {
                self.hold(&mut st, v);
                Admit::YesDropOld
            }
            State::Holds { .. } => {
                let since = Instant::now();
                self.set(
                    &mut st,
                    State::Dropping {
                        since,
                        warned: false,
                    },
                );
                Admit::Refuse { drop: true }
            }
        }
    }

    /// Whether the kernel is dropping its pages of the file: every read is refused until it
    /// is done, so a read may be refused before it fetches anything.
    pub fn dropping(&self) -> bool {
        // Lock-free when the kernel holds a generation (the common case, on the read path):
        // `gen` is 0 in every other state.
        if self.gen.load(Acquire) != 0 {
            return false;
        }
        match *self.state.lock() {
            State::Dropping {
                since,
                ref mut warned,
            } => {
                slow_drop(since, warned);
                true
            }
            _ => false,
        }
    }

    /// The kernel dropped its pages after a [`Admit::Refuse`].
    pub fn dropped(&self) {
        let mut st = self.state.lock();
        if let State::Dropping { since, .. } = *st {
            self.set(&mut st, State::Refusing { since });
        }
    }

    /// The kernel holds nothing of the file any more (it dropped its pages itself).
    pub fn reset(&self) {
        let mut st = self.state.lock();
        if !matches!(*st, State::Dropping { .. }) {
            self.set(&mut st, State::Nothing);
        }
    }

    /// Our own change moved the file from generation `old` to `new`.
    pub fn follow(&self, old: u64, new: &Version) {
        let mut st = self.state.lock();
        if matches!(*st, State::Holds { gen, .. } if gen == old) {
            self.hold(&mut st, new);
        }
    }
}

/// Logs, once per refusal, a page drop the kernel has not finished after [`SLOW_DROP`].
fn slow_drop(since: Instant, warned: &mut bool) {
    if !*warned && since.elapsed() >= SLOW_DROP {
        *warned = true;
        tracing::warn!(
            ms = since.elapsed().as_millis() as u64,
            "the kernel has not yet dropped the pages of a file changed behind our back: \
             its reads are refused with ESTALE until it has"
        );
    }
}

/// The seam to the kernel's page cache (implemented by the FUSE adapter).
pub trait KernelCache: Send + Sync + 'static {
    /// Has the kernel drop every cached page of inode `ino`, then calls `done`. Must not
    /// wait for the kernel on the caller's thread: the caller may be answering a read of
    /// that very inode, whose pages the kernel keeps locked until the reply.
    fn drop_pages(&self, ino: u64, done: Box<dyn FnOnce() + Send>);
    /// Has the kernel drop its cached attributes of inode `ino`, before returning (no page
    /// is touched, so this cannot wait on a read in flight).
    fn drop_attrs(&self, ino: u64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_store::Fingerprint;

    fn v(gen: u64, size: u64) -> Version {
        Version {
            fp: Fingerprint {
                size,
                mtime_ns: gen as i64,
                ..Default::default()
            },
            gen,
        }
    }

    #[test]
    fn a_new_version_is_refused_until_the_kernel_dropped_the_old() {
        let s = Served::default();
        assert_eq!(s.admit(&v(1, 100), 0), Admit::Yes);
        assert!(s.is(1));
        assert_eq!(s.admit(&v(1, 100), 50), Admit::Yes);
        assert_eq!(s.admit(&v(2, 100), 50), Admit::Refuse { drop: true });
        // Until the kernel has dropped its pages, nothing of the new version goes out.
        assert_eq!(s.admit(&v(2, 100), 0), Admit::Refuse { drop: false });
        assert!(!s.is(2));
        s.reset();
        assert_eq!(s.admit(&v(2, 100), 0), Admit::Refuse { drop: false });
        s.dropped();
        // The kernel's synchronous retry of a failed read-ahead is refused too...
        assert_eq!(s.admit(&v(2, 100), 50), Admit::Refuse { drop: false });
        // ... and a new stream from offset 0 is served.
        assert_eq!(s.admit(&v(2, 100), 0), Admit::Yes);
        assert!(s.is(2));
        assert_eq!(s.admit(&v(2, 100), 50), Admit::Yes);
    }

    #[test]
    fn a_ctime_only_change_is_the_same_data() {
        let s = Served::default();
        s.admit(&v(1, 100), 0);
        let mut w = v(2, 100);
        w.fp.mtime_ns = 1;
        w.fp.ctime_ns = 99;
        assert_eq!(s.admit(&w, 50), Admit::Yes);
        assert!(s.is(2));
    }

    #[test]
    fn refusals_end_after_a_while() {
        let s = Served::default();
        s.admit(&v(1, 100), 0);
        assert_eq!(s.admit(&v(2, 100), 50), Admit::Refuse { drop: true });
        s.dropped();
        std::thread::sleep(REFUSE_WINDOW);
        assert_eq!(s.admit(&v(2, 100), 50), Admit::Yes);
    }

    #[test]
    fn reads_beyond_the_old_end_are_served() {
        let s = Served::default();
        assert_eq!(s.admit(&v(1, 100), 0), Admit::Yes);
        assert_eq!(s.admit(&v(2, 200), 100), Admit::YesDropOld);
        assert_eq!(s.admit(&v(2, 200), 0), Admit::Yes);
    }

    #[test]
    fn own_changes_and_kernel_drops_clear_the_record() {
        let s = Served::default();
        s.admit(&v(1, 100), 0);
        s.follow(1, &v(2, 10));
        assert_eq!(s.admit(&v(2, 10), 5), Admit::Yes);
        s.reset();
        assert_eq!(s.admit(&v(3, 10), 5), Admit::Yes);
    }
}
