//! Changing write-back tunables on a running mount (`tierfs ctl set`): the dirty limits and
//! the fsync and close modes are read at every use; the flusher pool grows by spawning and
//! shrinks by retiring threads as they come back for work.

use super::{CloseMode, FsyncMode, Writeback};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_store::Store;

impl<S: Store> Writeback<S> {
    /// Whether the calling flusher should exit because there are more than wanted. Called
    /// between flush groups, never in the middle of one.
    pub(crate) fn retire_flusher(&self) -> bool {
        let l = &self.live;
        if l.running.load(Relaxed) <= l.flushers.load(Relaxed) {
            return false;
        }
        let _g = l.resize.lock();
        let r = l.running.load(Relaxed);
        if r > l.flushers.load(Relaxed) {
            l.running.store(r - 1, Relaxed);
            return true;
        }
        false
    }
}

impl<S: Store> Writeback<S> {
    /// Starts one more flusher thread. The caller holds `live.resize`.
    pub(crate) fn spawn_flusher(self: &Arc<Self>) -> std::io::Result<()> {
        self.live.running.fetch_add(1, Relaxed);
        let n = self.live.started.fetch_add(1, Relaxed);
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name(format!("tierfs-flush{n}"))
            .spawn(move || Writeback::flusher_loop(weak));
        match spawned {
            Ok(h) => {
                let mut threads = self.threads.lock();
                // Retired threads have exited: their handles need no join.
                threads.retain(|h| !h.is_finished());
                threads.push(h);
                Ok(())
            }
            Err(e) => {
                self.live.running.fetch_sub(1, Relaxed);
                Err(e)
            }
        }
    }

    /// `writeback.flushers`: more threads start now; extra ones exit once their current
    /// flush group is done (within a flush group, or 200 ms if idle).
    pub fn set_flushers(self: &Arc<Self>, n: usize) -> Result<(), String> {
        let n = n.max(1);
        let _g = self.live.resize.lock();
        self.live.flushers.store(n, Relaxed);
        while self.live.running.load(Relaxed) < n {
            self.spawn_flusher()
                .map_err(|e| format!("starting a flusher thread: {e}"))?;
        }
        self.notify();
        Ok(())
    }

    /// `writeback.dirty_soft` and `writeback.dirty_hard` (soft below hard): writers are
    /// throttled by the new limits from their next write; a writer waiting at the hard limit
    /// rechecks within 50 ms.
    pub fn set_dirty_limits(&self, soft: u64, hard: u64) -> Result<(), String> {
        if soft >= hard {
            return Err(format!(
                "writeback.dirty_soft ({soft}) must be below writeback.dirty_hard ({hard})"
            ));
        }
        self.live.set_limits(soft, hard);
        self.notify();
        Ok(())
    }

    /// `writeback.fsync`, for every fsync from now on.
    pub fn set_fsync_mode(&self, m: FsyncMode) -> Result<(), String> {
        self.live.set_fsync(m);
        Ok(())
    }

    /// `writeback.close`, for every close from now on.
    pub fn set_close_mode(&self, m: CloseMode) -> Result<(), String> {
        self.live.set_close(m);
        Ok(())
    }
}
