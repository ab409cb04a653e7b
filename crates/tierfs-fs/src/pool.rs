//! A fixed pool of threads for blocking work (backing-store I/O). Slow-store calls block for
//! milliseconds; running them here keeps FUSE worker threads free to serve cache hits, and the
//! number of threads bounds how many requests the slow store sees at once.

use crossbeam_channel::{unbounded, Sender};

type Job = Box<dyn FnOnce() + Send + 'static>;

pub struct Pool {
    tx: Sender<Job>,
}

impl Pool {
    pub fn new(name: &str, threads: usize) -> Pool {
        let (tx, rx) = unbounded::<Job>();
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
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
                })
                .expect("spawn pool thread");
        }
        Pool { tx }
    }

    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        // The receivers live as long as the threads, which never exit while `tx` is alive.
        let _ = self.tx.send(Box::new(job));
    }
}
