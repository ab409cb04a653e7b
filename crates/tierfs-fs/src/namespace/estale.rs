//! Files replaced behind our back: an open of a file that lost its name fails with ESTALE, and
//! the kernel's one retry of it (known by its thread) looks the name up in the store.

use super::Namespace;
use crate::inode::now_ms;
use tierfs_store::{Errno, Result, Store};

/// How long the kernel may take to retry an open answered ESTALE.
const ESTALE_RETRY_MS: u64 = 1000;

impl<S: Store> Namespace<S> {
    /// Caller thread `pid` is answered ESTALE: its next lookups and open are the kernel's
    /// retry. Records of threads that never retried (the name was gone) are dropped once
    /// they are old, so the map stays as small as the number of recent ESTALEs.
    pub(crate) fn arm_estale_retry(&self, pid: u32) {
        if pid == 0 {
            return;
        }
        let now = now_ms();
        if self.estale.len() >= 1024 {
            self.estale
                .retain(|_, t| now.saturating_sub(*t) <= ESTALE_RETRY_MS);
        }
        self.estale.insert(pid, now);
    }

    /// Whether caller thread `pid` had an open answered ESTALE just now, so that its lookups
    /// are the kernel's retry of that open.
    pub(crate) fn retrying_after_estale(&self, pid: u32) -> bool {
        pid != 0
            && self
                .estale
                .get(&pid)
                .is_some_and(|t| now_ms().saturating_sub(*t) <= ESTALE_RETRY_MS)
    }

    /// Close-to-open for names: fails an open of a file that no longer has a name (`nlink`
    /// 0) in the backing store with ESTALE, unless this open is the kernel's retry of one.
    pub(crate) fn check_not_replaced(&self, nlink: u32, pid: u32) -> Result<()> {
        if nlink == 0 {
            // The backing file was deleted or renamed over behind our back, but the kernel
            // still maps the name to it (it trusts names for entry_ttl, maybe an hour).
            // ESTALE makes the VFS walk the path again with LOOKUP_REVAL, which asks us to
            // look the name up afresh (from the store: see `retrying_after_estale`): the open
            // then reaches the file the name holds now (close-to-open for the usual
            // write-temp-and-rename update), or fails ENOENT. The VFS retries only once: if
            // the file that retry found was itself replaced in the meantime (a burst of
            // replacements), open it anyway rather than fail the application; the name held
            // it during this very open(2). The retry is known by its thread alone: when
            // threads look up one name at once the kernel sends one lookup and all of them
            // share its answer, so the retry's lookup may carry another thread's id.
            let is_retry = pid != 0
                && self
                    .estale
                    .remove(&pid)
                    .is_some_and(|(_, t)| now_ms().saturating_sub(t) <= ESTALE_RETRY_MS);
            if !is_retry {
                self.arm_estale_retry(pid);
                return Err(Errno::ESTALE);
            }
        } else if pid != 0 {
            self.estale.remove(&pid);
        }
        Ok(())
    }
}
