//! A deadline on the store calls that a cache can answer for (a lookup, a getattr, a
//! close-to-open check, the check of an open file's version past `meta.ttl`, a readlink, an
//! xattr, statfs), on stores that can hang rather than
//! fail: a network filesystem or FUSE mount whose server stopped answering (SIGSTOP, a
//! stalled link) leaves every call blocked in the kernel, unkillable, and a cached file's
//! reader blocked behind its open's check. Such a call runs on a worker thread of its own;
//! the caller waits `store.timeout` at most, and on timeout the store is taken for hung
//! (`StoreHealth::timed_out`): cached attributes, listings and data are served, whatever
//! their age, as when the store is gone, until the call (or the prober's) returns.
//!
//! Only these calls: the one that times out leaves its worker blocked in the store, and
//! the worker answers nobody; calls that have no cached answer (reads of data not cached,
//! writes, listings) wait as on a hard NFS mount. A store that cannot hang (a local disk)
//! runs every call inline: the hand-off costs a few microseconds a call.

use crate::pool::Pool;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Workers at most: past them, calls queue (and time out while the store hangs). Each
/// blocked in a hung store is one thread left until it answers.
const MAX_WORKERS: usize = 32;

pub(crate) struct Deadline {
    /// Milliseconds; 0: calls run inline (a store that cannot hang, or `store.timeout=0`).
    limit_ms: AtomicU64,
    /// Started as calls need them (a store that cannot hang starts none).
    workers: Pool,
}

impl Deadline {
    pub(crate) fn new() -> Deadline {
        Deadline {
            limit_ms: AtomicU64::new(0),
            workers: Pool::growing("tierfs-deadline", MAX_WORKERS),
        }
    }

    pub(crate) fn set_limit(&self, limit: Duration) {
        self.limit_ms.store(limit.as_millis() as u64, Relaxed);
    }

    pub(crate) fn limit(&self) -> Option<Duration> {
        match self.limit_ms.load(Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Runs `f` on a worker and waits for it up to the limit: None on timeout (`f` goes
    /// on, its answer dropped). Inline when there is no limit.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let Some(limit) = self.limit() else {
            return Some(f());
        };
        // (std's channel: its receive does not yield the CPU in a loop before it parks.)
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.workers.spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit).ok()
    }
}

impl Default for Deadline {
    fn default() -> Self {
        Deadline::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_past_the_limit_is_given_up_and_others_go_on() {
        let d = Deadline::new();
        assert_eq!(d.run(|| 7), Some(7), "inline without a limit");
        d.set_limit(Duration::from_millis(200));
        assert_eq!(d.run(|| 8), Some(8));
        let (stop_tx, stop_rx) = std::sync::mpsc::sync_channel::<()>(1);
        let t = std::time::Instant::now();
        assert_eq!(
            d.run(move || {
                let _ = stop_rx.recv();
                9
            }),
            None
        );
        assert!(t.elapsed() < Duration::from_secs(2));
        // The stuck worker does not hold the next call.
        assert_eq!(d.run(|| 10), Some(10));
        drop(stop_tx);
    }
}
