//! Close-to-open in at most one store request per open.
//!
//! An open must see the store as it was when the open began: one request issued after that
//! moment (an `fstatat`, a HEAD, an sftp LSTAT). Over a store with a 4 ms round trip, every
//! further request is another 4 ms per file: with default options a warm `cat` of 1,000 small
//! files over sshfs made three (a lookup of the name, a lookup to resolve the inode learnt
//! from the metadata cache, then the check: 0.16x rclone). Now:
//! - resolving an inode's node by a lookup *is* the check (its attributes are as fresh as a
//!   getattr's): `Namespace::node_checked`;
//! - the kernel sends the open's own LOOKUP (or, with `default_permissions`, a GETATTR for the
//!   permission check) just before the OPEN, from the same thread; when that request asked
//!   the store, the OPEN takes its answer as its check ([`Checks::recent`]): they came
//!   together;
//! - opens of one file at once share one check, if it was issued after they began
//!   ([`Checks::check`]); a check issued before an open began is never taken for it.

use crate::fast_map::DashMap;
use crate::identity::Ident;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_store::{Attr, Result};

/// How soon after a thread's lookup or getattr asked the store its OPEN of the same file must
/// arrive for the two to be taken as one open(2): the kernel sends them back to back from
/// the same thread, microseconds apart (a few milliseconds when the CPUs are busy). The cost
/// of the rule: a program's `stat()` followed within this time by its `open()` of the same
/// file gets, as the open's check, the stat's answer, asked at most this long (plus the
/// stat's own round trip) before the open began. A wider window only shares more of those.
pub const TOGETHER: Duration = Duration::from_millis(10);

/// Threads remembered at most (a walk with 8 readers needs 8).
const MAX_THREADS: usize = 4096;

/// A store answer about one file: its attributes, and when the store was asked.
#[derive(Clone, Copy)]
pub(crate) struct Answer {
    pub attr: Attr,
    pub asked: Instant,
}

struct Recent {
    id: Ident,
    answer: Answer,
    /// When the answer reached us (the kernel's next request from the thread comes after).
    at: Instant,
}

struct Flight {
    issued: Instant,
    result: Mutex<Option<Result<Option<Answer>>>>,
    done: Condvar,
}

#[derive(Default)]
pub(crate) struct Checks {
    recent: DashMap<u32, Recent>,
    inflight: DashMap<Ident, Arc<Flight>>,
}

impl Checks {
    /// Thread `pid`'s lookup or getattr just got the store's `answer` about `id`.
    pub fn note(&self, pid: u32, id: Ident, answer: Answer) {
        if pid == 0 {
            return;
        }
        if self.recent.len() >= MAX_THREADS {
            self.recent.retain(|_, r| r.at.elapsed() < TOGETHER);
        }
        self.recent.insert(
            pid,
            Recent {
                id,
                answer,
                at: Instant::now(),
            },
        );
    }

    /// The answer thread `pid`'s own lookup or getattr of `id` got just before its OPEN (see
    /// [`TOGETHER`]); taken once.
    pub fn recent(&self, pid: u32, id: Ident) -> Option<Answer> {
        if pid == 0 {
            return None;
        }
        let (_, r) = self
            .recent
            .remove_if(&pid, |_, r| r.id == id && r.at.elapsed() < TOGETHER)?;
        Some(r.answer)
    }

    /// Runs `ask` (the check of file `id`) for an open that began at `began`, unless a check
    /// of the same file issued at or after `began` is in flight: then its answer is this
    /// open's too. `Ok(None)`: the store has no check cheaper than an open.
    pub fn check(
        &self,
        id: Ident,
        began: Instant,
        ask: impl FnOnce() -> Result<Option<Answer>>,
    ) -> (Result<Option<Answer>>, bool) {
        if let Some(f) = self.inflight.get(&id).map(|f| f.clone()) {
            if f.issued >= began {
                let mut r = f.result.lock();
                while r.is_none() {
                    f.done.wait(&mut r);
                }
                return ((*r).expect("set before notify"), true);
            }
        }
        let f = Arc::new(Flight {
            issued: Instant::now(),
            result: Mutex::new(None),
            done: Condvar::new(),
        });
        self.inflight.insert(id, f.clone());
        // Completed however `ask` ends: a waiter never waits for a check that panicked.
        struct Finish<'a> {
            checks: &'a Checks,
            id: Ident,
            f: Arc<Flight>,
            r: Option<Result<Option<Answer>>>,
        }
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                self.checks
                    .inflight
                    .remove_if(&self.id, |_, g| Arc::ptr_eq(g, &self.f));
                *self.f.result.lock() =
                    Some(self.r.take().unwrap_or(Err(tierfs_store::Errno::EIO)));
                self.f.done.notify_all();
            }
        }
        let mut fin = Finish {
            checks: self,
            id,
            f,
            r: None,
        };
        let r = ask();
        fin.r = Some(r);
        drop(fin);
        (r, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_store::{FileKind, TimeSpec};

    fn attr(size: u64) -> Attr {
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
            blocks: 0,
            blksize: 4096,
            atime: TimeSpec::default(),
            mtime: TimeSpec::default(),
            ctime: TimeSpec::default(),
        }
    }

    #[test]
    fn a_threads_answer_serves_its_next_open_of_that_file_once_and_only_soon() {
        let c = Checks::default();
        let a = Answer {
            attr: attr(5),
            asked: Instant::now(),
        };
        c.note(7, (1, 2), a);
        assert!(c.recent(8, (1, 2)).is_none(), "another thread's");
        assert!(c.recent(7, (1, 3)).is_none(), "another file's");
        assert_eq!(c.recent(7, (1, 2)).map(|a| a.attr.size), Some(5));
        assert!(c.recent(7, (1, 2)).is_none(), "taken once");
        c.note(7, (1, 2), a);
        std::thread::sleep(TOGETHER + Duration::from_millis(5));
        assert!(
            c.recent(7, (1, 2)).is_none(),
            "too late to be the same open"
        );
    }

    #[test]
    fn opens_share_a_check_only_if_it_was_issued_after_they_began() {
        let c = Arc::new(Checks::default());
        let slow = |size: u64, tx: std::sync::mpsc::Sender<()>| {
            move || {
                tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                Ok(Some(Answer {
                    attr: attr(size),
                    asked: Instant::now(),
                }))
            }
        };
        // An open that began after a check in flight was issued asks again.
        let (tx, rx) = std::sync::mpsc::channel();
        let c2 = c.clone();
        let leader = std::thread::spawn(move || c2.check((1, 2), Instant::now(), slow(9, tx)));
        rx.recv().unwrap();
        let began_late = Instant::now();
        let (r, shared) = c.check((1, 2), began_late, || {
            Ok(Some(Answer {
                attr: attr(1),
                asked: Instant::now(),
            }))
        });
        assert!(!shared);
        assert_eq!(r.unwrap().unwrap().attr.size, 1);
        let (r, shared) = leader.join().unwrap();
        assert!(!shared);
        assert_eq!(r.unwrap().unwrap().attr.size, 9);
        // One that began before a check in flight was issued shares it.
        let began_early = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        let c3 = c.clone();
        let leader = std::thread::spawn(move || c3.check((1, 2), Instant::now(), slow(4, tx)));
        rx.recv().unwrap();
        let (r, shared) = c.check((1, 2), began_early, || panic!("must not ask"));
        assert!(shared);
        assert_eq!(r.unwrap().unwrap().attr.size, 4);
        let (r, _) = leader.join().unwrap();
        assert_eq!(r.unwrap().unwrap().attr.size, 4);
    }
}
