//! Whether the backing store answers. A FUSE store (sshfs, bindfs, rclone) whose daemon died
//! answers ENOTCONN to every call, on every descriptor opened through it, until it is
//! unmounted; a new one may then be mounted at the same path. While it is gone, tierfs serves
//! what it has cached (clean data in the tiers, attributes and listings in the metadata cache,
//! whatever their age) and says so in the log; a prober opens BACKING again every second, and
//! once a store answers there, every node held from before is let go (resolved again from the
//! new root by name) and the caches are checked against the store as usual.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the prober tries to reach a gone store again.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// What the prober calls on the store (its `reconnect`).
pub(crate) type Probe = Box<dyn Fn() -> tierfs_store::Result<tierfs_store::Reconnect> + Send>;

#[derive(Default)]
pub struct StoreHealth {
    /// Set while the store answers ENOTCONN: the metadata cache and the data tiers answer
    /// regardless of age (see `MetaCache::serve_stale_while`).
    gone: Arc<AtomicBool>,
    since: Mutex<Option<Instant>>,
    /// Calls that failed with ENOTCONN.
    pub notconn: AtomicU64,
    /// Set while the store is taken for hung (a call past `store.timeout`): calls that a
    /// cache answers for are not sent to it (see `deadline`).
    hung: AtomicBool,
    /// Calls given up at their deadline.
    pub timeouts: AtomicU64,
    /// Times a store was found again at BACKING after it had gone.
    pub reconnects: AtomicU64,
    /// Called (once per reconnect) when a new store answers: lets go of every node from before.
    on_back: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl StoreHealth {
    /// The flag that is set while the store is gone.
    pub(crate) fn gone_flag(&self) -> Arc<AtomicBool> {
        self.gone.clone()
    }

    pub fn gone(&self) -> bool {
        self.gone.load(Relaxed)
    }

    pub fn hung(&self) -> bool {
        self.hung.load(Relaxed)
    }

    /// A call a cache can answer for did not return within `limit`: the store is taken
    /// for hung, and served from the caches as when it is gone, until the prober's call
    /// returns (it waits in the store as long as the store hangs).
    pub(crate) fn timed_out(self: &Arc<Self>, limit: Duration, probe: impl FnOnce() -> Probe) {
        self.timeouts.fetch_add(1, Relaxed);
        if self.gone.swap(true, Relaxed) {
            return;
        }
        self.hung.store(true, Relaxed);
        *self.since.lock() = Some(Instant::now());
        tracing::error!(
            "backing store not answering within {:.1} s (store.timeout): serving cached data until it answers; reads of data not cached wait for it",
            limit.as_secs_f64()
        );
        self.start_prober(probe());
    }

    pub(crate) fn set_on_back(&self, f: Box<dyn Fn() + Send + Sync>) {
        *self.on_back.lock() = Some(f);
    }

    /// A store call failed with `e`. The first ENOTCONN marks the store gone and starts the
    /// prober (`probe` is how it reaches the store).
    pub(crate) fn saw(self: &Arc<Self>, e: tierfs_store::Errno, probe: impl FnOnce() -> Probe) {
        if e != tierfs_store::Errno::ENOTCONN {
            return;
        }
        self.notconn.fetch_add(1, Relaxed);
        if self.gone.load(Relaxed) {
            return;
        }
        // One dead descriptor (a file open across an earlier outage, a dead mount nested
        // below BACKING) is not a dead store: only a root that does not answer is.
        let probe = probe();
        match probe() {
            Ok(tierfs_store::Reconnect::Same) => return,
            Ok(tierfs_store::Reconnect::New) => {
                if let Some(f) = self.on_back.lock().as_ref() {
                    f();
                }
                self.reconnects.fetch_add(1, Relaxed);
                tracing::warn!("backing store replaced at BACKING: found again at once");
                return;
            }
            Err(_) => {}
        }
        if self.gone.swap(true, Relaxed) {
            return;
        }
        *self.since.lock() = Some(Instant::now());
        tracing::error!(
            "backing store gone (ENOTCONN: the filesystem at BACKING stopped answering, e.g. its FUSE daemon died): serving what is cached; BACKING is opened again every {} s until a store answers there",
            PROBE_EVERY.as_secs()
        );
        self.start_prober(probe);
    }

    /// Reaches for the store every [`PROBE_EVERY`] until it answers (a call to a hung
    /// store returns when it does), then lets the caches check against it again.
    fn start_prober(self: &Arc<Self>, probe: Probe) {
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("tierfs-probe".into())
            .spawn(move || loop {
                std::thread::sleep(PROBE_EVERY);
                let Some(h) = me.upgrade() else { return };
                match probe() {
                    Ok(tierfs_store::Reconnect::New) => {
                        if let Some(f) = h.on_back.lock().as_ref() {
                            f();
                        }
                        h.reconnects.fetch_add(1, Relaxed);
                        h.back("a store answers at BACKING again");
                        return;
                    }
                    // The root answers as it is (the ENOTCONN came from below it).
                    Ok(tierfs_store::Reconnect::Same) => {
                        h.back("BACKING answers");
                        return;
                    }
                    Err(_) => {}
                }
            });
        if let Err(err) = spawned {
            tracing::error!("cannot start the backing store prober: {err}");
        }
    }

    fn back(&self, what: &str) {
        let since = self.since.lock().take();
        self.hung.store(false, Relaxed);
        self.gone.store(false, Relaxed);
        tracing::warn!(
            "backing store back after {:.1} s ({what}): caches are checked against it again",
            since.map_or(0.0, |t| t.elapsed().as_secs_f64())
        );
    }
}
