//! A fixed pool of threads for blocking work (backing-store I/O). Slow-store calls block for
//! milliseconds; running them here keeps FUSE worker threads free to serve cache hits, and the
//! number of threads bounds how many requests the slow store sees at once.
//!
//! The queue is a mutex and a condition variable, not a channel: crossbeam's blocking receive
//! spins and calls `sched_yield` several times before it parks, every time a worker runs out
//! of work. With dozens of workers on two CPUs that was 202,780 `sched_yield` calls during an
//! untar of 3,870 files (~50 per file), CPU taken from the application and the store.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Workers waiting for a job: a job is signalled only when one waits.
    idle: usize,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    q: Mutex<Queue>,
    ready: Condvar,
}

pub struct Pool {
    shared: Arc<Shared>,
    name: String,
    /// Threads started, and the most that may be ([`Pool::growing`]).
    threads: std::sync::atomic::AtomicUsize,
    max: usize,
}

impl Pool {
    /// `threads` threads, started now.
    pub fn new(name: &str, threads: usize) -> Pool {
        let pool = Pool::growing(name, threads);
        for _ in 0..pool.max {
            pool.start_thread();
        }
        pool
    }

    /// No thread at first; one is started for a job that finds none idle, up to `max`
    /// (past them jobs queue).
    pub fn growing(name: &str, max: usize) -> Pool {
        Pool {
            shared: Arc::default(),
            name: name.to_string(),
            threads: Default::default(),
            max: max.max(1),
        }
    }

    /// Starts one more thread, if fewer than `max` are.
    fn start_thread(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.threads.load(Relaxed) >= self.max {
            return; // (a full pool's every spawn while it is busy: no write)
        }
        let i = self.threads.fetch_add(1, Relaxed);
        if i >= self.max {
            self.threads.fetch_sub(1, Relaxed);
            return;
        }
        let s = self.shared.clone();
        let started = std::thread::Builder::new()
            .name(format!("{}-{i}", self.name))
            .spawn(move || {
                while let Some(job) = s.next() {
                    // A bug in one job must not take a thread of the pool with it: after
                    // `threads` of them the pool would serve nothing. (A FUSE request whose
                    // job panicked gets EIO when its reply object is dropped.)
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                        tracing::error!(
                            "a job panicked in the {} pool",
                            std::thread::current().name().unwrap_or("?")
                        );
                    }
                }
            });
        if started.is_err() {
            self.threads.fetch_sub(1, Relaxed);
            tracing::error!("{}: cannot start a thread", self.name);
        }
    }

    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        let mut q = self.shared.q.lock().unwrap_or_else(|e| e.into_inner());
        q.jobs.push_back(Box::new(job));
        // Idle workers not yet taken by earlier jobs queued.
        let idle = q.idle >= q.jobs.len();
        let wake = q.idle > 0;
        drop(q);
        if wake {
            self.shared.ready.notify_one();
        }
        if !idle {
            self.start_thread();
        }
    }
}

impl Shared {
    /// The next job, waiting for one; None once the pool is dropped and its queue empty.
    fn next(&self) -> Option<Job> {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = q.jobs.pop_front() {
                return Some(job);
            }
            if q.closed {
                return None;
            }
            q.idle += 1;
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            q.idle -= 1;
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared
            .q
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closed = true;
        self.shared.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};

    #[test]
    fn every_job_runs_a_panicking_one_included_and_the_threads_end_with_the_pool() {
        let pool = Pool::new("test-pool", 3);
        let done = Arc::new(AtomicUsize::new(0));
        for i in 0..1000 {
            let d = done.clone();
            pool.spawn(move || {
                if i == 500 {
                    panic!("one bad job");
                }
                d.fetch_add(1, SeqCst);
            });
        }
        let t = Instant::now();
        while done.load(SeqCst) < 999 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{} ran",
                done.load(SeqCst)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let weak = Arc::downgrade(&pool.shared);
        drop(pool);
        // Each thread holds the queue until it sees the pool closed and returns.
        while weak.strong_count() > 0 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "pool threads still running"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
