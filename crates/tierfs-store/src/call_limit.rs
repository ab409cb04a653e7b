//! The deadline of a store call that a cache can answer for (`store.timeout`), handed to a
//! store that keeps it itself.
//!
//! A call to a store that can hang normally runs on a worker thread, and its caller waits for
//! it up to the deadline (tierfs-fs `deadline`): a filesystem call blocked in the kernel
//! cannot be given up. A store whose requests are futures (S3) can drop a request past its
//! deadline instead, and then the call runs on the caller's thread: a warm open over S3 is
//! one HEAD, and the hop to a worker and back was two of its five thread switches.
//! [`crate::Store::keeps_call_limit`] says which; the caller runs the call inside
//! [`within`], the store reads [`deadline`] and answers ETIMEDOUT once it passed.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `f` with a deadline `limit` from now on this thread (nested calls keep the earlier
/// one); returns what `f` returned and whether the deadline passed.
pub fn within<T>(limit: Duration, f: impl FnOnce() -> T) -> (T, bool) {
    let mine = Instant::now() + limit;
    let outer = DEADLINE.with(|d| d.get());
    let at = outer.map_or(mine, |o| o.min(mine));
    DEADLINE.with(|d| d.set(Some(at)));
    // Put back even if `f` panics (the thread may be a pool's).
    struct Restore(Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEADLINE.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(outer);
    let r = f();
    (r, Instant::now() >= at)
}

/// The deadline of the call running on this thread, if its caller set one.
pub fn deadline() -> Option<Instant> {
    DEADLINE.with(|d| d.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_seen_inside_only_and_the_earlier_one_wins() {
        assert_eq!(deadline(), None);
        let ((inner, outer), passed) = within(Duration::from_secs(60), || {
            let outer = deadline().unwrap();
            let (inner, _) = within(Duration::from_secs(3600), || deadline().unwrap());
            (inner, outer)
        });
        assert_eq!(inner, outer, "a nested call keeps the earlier deadline");
        assert!(!passed);
        assert_eq!(deadline(), None, "put back after");
        let (_, passed) = within(Duration::ZERO, || ());
        assert!(passed);
    }
}
