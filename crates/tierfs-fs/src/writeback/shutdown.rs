//! The drain at unmount (or SIGTERM): deferred namespace operations first, then every dirty
//! byte, with a progress line; what cannot be applied stays in the journal for the next
//! mount. Then the flushers stop and the journal closes.

use super::Writeback;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};
use tierfs_store::Store;

impl<S: Store> Writeback<S> {
    /// Unmount (or SIGTERM): drains every dirty byte to the backing store, with a progress
    /// line, then stops the flushers and closes the journal.
    pub fn shutdown_writeback(&self) {
        // Names first: the files' data needs them on the store.
        let (ns_left, _) = self.ns_pending();
        if ns_left > 0 {
            eprintln!("tierfs: applying {ns_left} namespace operations to the backing store...");
            if !self.drain_ns_for(Duration::from_secs(5)) {
                let (left, _) = self.ns_pending();
                tracing::error!("write-back: {left} namespace operations could not be applied; they stay in the journal and are replayed at the next mount");
                eprintln!("tierfs: {left} namespace operations could not be applied to the backing store; kept in the journal for the next mount");

                // Files not yet made on the store cannot be flushed: they wait no more.
                self.ns.prov.shutdown();
            }
        }
        let bytes = self.dirty_bytes();
        let t = Instant::now();
        if bytes > 0 {
            tracing::info!(
                "write-back: draining {} dirty bytes in {} files to the backing store",
                bytes,
                self.files.lock().len()
            );
            eprintln!(
                "tierfs: flushing {:.1} MiB of written data to the backing store...",
                bytes as f64 / 1048576.0
            );
        }
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            if bytes > 0 {
                // A progress line a second while draining (stderr with --foreground, and
                // the log).
                s.spawn(|| {
                    let mut last = Instant::now();
                    while !done.load(Acquire) {
                        std::thread::sleep(Duration::from_millis(50));
                        if last.elapsed() >= Duration::from_secs(1) && !done.load(Acquire) {
                            last = Instant::now();
                            let left = self.dirty_bytes();
                            let secs = t.elapsed().as_secs_f64().max(0.001);
                            let rate = (bytes.saturating_sub(left)) as f64 / secs / 1048576.0;
                            tracing::info!("write-back drain: {left} bytes left, {rate:.1} MiB/s");
                            eprintln!(
                                "tierfs: flushing: {:.1} MiB left, {rate:.1} MiB/s",
                                left as f64 / 1048576.0
                            );
                        }
                    }
                });
            }
            for attempt in 0..3 {
                match self.flush_all() {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::error!("write-back drain, attempt {}: {e}", attempt + 1);
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
            }
            done.store(true, Release);
        });
        self.c.drained_bytes.fetch_add(bytes, Relaxed);
        let left = self.dirty_bytes();
        if left > 0 {
            tracing::error!("write-back: {left} dirty bytes could not be written back; they stay in the journal and are replayed at the next mount");
            eprintln!("tierfs: {left} bytes could not be written to the backing store; kept in the journal for the next mount");
        } else if bytes > 0 {
            eprintln!("tierfs: flushed in {:.1?}", t.elapsed());
        }
        self.stop.store(true, Release);
        self.ns.prov.shutdown();
        self.notify();
        // Taken out first: no lock is held while the flushers finish.
        let threads = std::mem::take(&mut *self.threads.lock());
        for h in threads {
            let _ = h.join();
        }
        self.journal.shutdown();
    }
}
