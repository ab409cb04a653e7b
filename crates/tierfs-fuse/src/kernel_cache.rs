//! [`PageDropper`]: the core's handle on the kernel's page cache (`tierfs_fs::KernelCache`).
//!
//! The core asks for a file's pages to be dropped while it answers a read of that file, whose
//! pages the kernel keeps locked until the reply; the kernel's invalidation waits for those
//! locks. So the notification is sent from a thread of its own, never the caller's.

use fuser::{INodeNo, Notifier};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

type Job = (u64, Box<dyn FnOnce() + Send>);

/// A page drop taking this long is logged: reads of the file are refused until it ends.
const SLOW_DROP: std::time::Duration = std::time::Duration::from_millis(500);

pub struct PageDropper {
    tx: Mutex<mpsc::Sender<Job>>,
    notifier: Arc<OnceLock<Notifier>>,
}

impl PageDropper {
    /// Starts the notifying thread; `notifier` is set once the session exists (until then a
    /// request is answered at once: the kernel holds no pages before the mount is up).
    pub fn start(notifier: Arc<OnceLock<Notifier>>) -> std::io::Result<PageDropper> {
        let (tx, rx) = mpsc::channel::<Job>();
        let n2 = notifier.clone();
        std::thread::Builder::new()
            .name("tierfs-inval".into())
            .spawn(move || {
                for (ino, done) in rx {
                    if let Some(n) = n2.get() {
                        let t0 = std::time::Instant::now();
                        // ENOENT: the kernel does not know the inode (no pages either).
                        let _ = n.inval_inode(INodeNo(ino), 0, 0);
                        // Reads of the file stay refused until this returns (see
                        // `tierfs_fs::served`); it waits for the pages READs in flight hold.
                        let took = t0.elapsed();
                        if took >= SLOW_DROP {
                            tracing::warn!(
                                ino,
                                ms = took.as_millis() as u64,
                                "the kernel took long to drop a file's pages (reads of it were refused meanwhile)"
                            );
                        }
                    }
                    done();
                }
            })?;
        Ok(PageDropper {
            tx: Mutex::new(tx),
            notifier,
        })
    }
}

impl tierfs_fs::KernelCache for PageDropper {
    fn drop_pages(&self, ino: u64, done: Box<dyn FnOnce() + Send>) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(mpsc::SendError((_, done))) = tx.send((ino, done)) {
            done();
        }
    }

    fn drop_attrs(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            // Offset -1: attributes only.
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }
}
