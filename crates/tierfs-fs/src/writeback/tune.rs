//! Changing write-back tunables on a running mount (`tierfs ctl set`): the dirty limits and
//! the fsync and close modes are read at every use; the flusher pool grows by spawning and
//! shrinks by retiring threads as they come back for work.

use super::{CloseMode, FsyncMode, Writeback};
use crate::fs::Fs;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_store::Store;

const NO_WRITEBACK: &str = "write-back is off on this mount (writeback.mode=through)";

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

impl<S: Store> Fs<S> {
    /// Starts one more flusher thread. The caller holds `live.resize`.
    pub(crate) fn spawn_flusher(self: &Arc<Self>, wb: &Writeback<S>) -> std::io::Result<()> {
        wb.live.running.fetch_add(1, Relaxed);
        let n = wb.live.started.fetch_add(1, Relaxed);
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name(format!("tierfs-flush{n}"))
            .spawn(move || Fs::flusher_loop(weak));
        match spawned {
            Ok(h) => {
                let mut threads = wb.threads.lock();
                // Retired threads have exited: their handles need no join.
                threads.retain(|h| !h.is_finished());
                threads.push(h);
                Ok(())
            }
            Err(e) => {
                wb.live.running.fetch_sub(1, Relaxed);
                Err(e)
            }
        }
    }

    /// `writeback.flushers`: more threads start now; extra ones exit once their current
    /// flush group is done (within a flush group, or 200 ms if idle).
    pub fn set_flushers(self: &Arc<Self>, n: usize) -> Result<(), String> {
        let wb = self.wb().ok_or(NO_WRITEBACK)?;
        let n = n.max(1);
        let _g = wb.live.resize.lock();
        wb.live.flushers.store(n, Relaxed);
        while wb.live.running.load(Relaxed) < n {
            self.spawn_flusher(wb)
                .map_err(|e| format!("starting a flusher thread: {e}"))?;
        }
        wb.notify();
        Ok(())
    }

    /// `writeback.dirty_soft` and `writeback.dirty_hard` (soft below hard): writers are
    /// throttled by the new limits from their next write; a writer waiting at the hard limit
    /// rechecks within 50 ms.
    pub fn set_dirty_limits(&self, soft: u64, hard: u64) -> Result<(), String> {
        let wb = self.wb().ok_or(NO_WRITEBACK)?;
        if soft >= hard {
            return Err(format!(
                "writeback.dirty_soft ({soft}) must be below writeback.dirty_hard ({hard})"
            ));
        }
        wb.live.set_limits(soft, hard);
        wb.notify();
        Ok(())
    }

    /// `writeback.fsync`, for every fsync from now on.
    pub fn set_fsync_mode(&self, m: FsyncMode) -> Result<(), String> {
        self.wb().ok_or(NO_WRITEBACK)?.live.set_fsync(m);
        Ok(())
    }

    /// `writeback.close`, for every close from now on.
    pub fn set_close_mode(&self, m: CloseMode) -> Result<(), String> {
        self.wb().ok_or(NO_WRITEBACK)?.live.set_close(m);
        Ok(())
    }
}
