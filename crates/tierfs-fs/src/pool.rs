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
                        job();
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
