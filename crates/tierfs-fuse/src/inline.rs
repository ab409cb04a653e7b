//! [`InlineSlot`]: a request that needs the store runs on the FUSE thread that read it,
//! rather than on the I/O pool, when the store cannot hang and no other FUSE thread is
//! running one.
//!
//! The hand-off to the pool costs a thread wake-up per request, as much as the FUSE round
//! trip itself on this VM: over a local directory store (tmpfs), a `chmod` through tierfs
//! took 47 us handed off and 24.4 us here, an untar of 4,519 files 1.86-1.92 s against
//! 1.29-1.37 s. The pool is there so that a store call that waits does not hold a FUSE
//! thread while other requests (cached reads) queue behind it. Hence the two conditions:
//! - the store cannot hang (`Store::may_hang`: a local disk fails rather than hangs), or the
//!   user said to wait for it as for one (`store.timeout=0`: a FUSE store over local disks,
//!   such as mergerfs); a network filesystem, FUSE mount, bucket or sftp server with a
//!   `store.timeout` always goes through the pool;
//! - one FUSE thread at a time: the others keep reading requests and handing them to the
//!   pool, so a slow call here (an HDD seek, an fsync) costs at most one thread's turn.
//!   With `fuse.threads=1` there is no other thread, and no slot.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Default)]
pub(crate) struct InlineSlot {
    taken: AtomicBool,
}

/// This thread's turn to run a job inline; the slot is free again when it is dropped
/// (after the job, panicking or not).
pub(crate) struct Turn<'a>(&'a AtomicBool);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl InlineSlot {
    /// The turn, if no other thread is running a job inline; None: hand the job to the pool.
    pub(crate) fn take(&self) -> Option<Turn<'_>> {
        // `then`, not `then_some`: a `Turn` made and dropped by a thread that did not get
        // the slot would free it under the thread that holds it.
        (!self.taken.swap(true, Ordering::Acquire)).then(|| Turn(&self.taken))
    }
}

impl Turn<'_> {
    /// Runs `job` here. A panicking job is logged, as on the pool; the request's reply,
    /// dropped unanswered, tells the caller EIO.
    pub(crate) fn run(self, job: impl FnOnce()) {
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!("a request panicked on the FUSE thread");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};

    #[test]
    fn one_thread_at_a_time_runs_inline_and_a_panic_frees_the_slot() {
        let slot = Arc::new(InlineSlot::default());
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let s2 = slot.clone();
        let holder = std::thread::spawn(move || {
            let turn = s2.take().expect("the slot is free at first");
            turn.run(|| {
                entered_tx.send(()).unwrap();
                release_rx.recv().unwrap();
            });
        });
        entered.recv().unwrap();
        assert!(
            slot.take().is_none(),
            "no second turn while a job runs inline"
        );
        assert!(
            slot.take().is_none(),
            "a turn refused does not free the slot of the thread that has it"
        );
        release.send(()).unwrap();
        holder.join().unwrap();

        slot.take()
            .expect("free once the job ended")
            .run(|| panic!("job panics"));
        let mut ran = false;
        slot.take()
            .expect("free again after a panic")
            .run(|| ran = true);
        assert!(ran);
    }
}
