//! Requests that may wait for the store (a read of data no tier holds, an open) stay
//! killable while it hangs. Once the kernel has handed a request to us, its caller waits
//! for our answer and nothing else: fuser answers FUSE_INTERRUPT with ENOSYS, so the kernel
//! stops sending interrupts, and a caller killed with SIGKILL sits in D state until the
//! store answers (a `cat` of a file of a frozen sshfs stayed there for ten minutes).
//!
//! So the adapter registers such a request here with a way to answer it. A watchdog looks
//! at the callers of those waiting for more than [`GRACE`]: one with SIGKILL pending
//! (`/proc/<tid>/status`, SigPnd or ShdPnd) is answered EINTR at once and its process can
//! exit. The worker's own answer, when the store returns, goes nowhere (an open's file
//! handle is released).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A request is looked at once it has waited this long (the store is merely slow before).
const GRACE: Duration = Duration::from_millis(500);
/// How often the watchdog looks.
const EVERY: Duration = Duration::from_millis(200);
/// SIGKILL's bit in the pending masks of /proc/<tid>/status.
const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);

type Answer = Box<dyn FnOnce() + Send>;

#[derive(Default)]
pub(crate) struct Waiting {
    next: AtomicU64,
    map: Mutex<HashMap<u64, (u32, Instant, Answer)>>,
    watchdog: OnceLock<()>,
}

/// One answer for a request, given by whoever comes first: the worker or the watchdog.
pub(crate) struct Slot<R>(Arc<Mutex<Option<R>>>);

impl<R> Clone for Slot<R> {
    fn clone(&self) -> Self {
        Slot(self.0.clone())
    }
}

impl<R> Slot<R> {
    pub(crate) fn new(reply: R) -> Slot<R> {
        Slot(Arc::new(Mutex::new(Some(reply))))
    }

    /// The reply, if nobody answered yet.
    pub(crate) fn take(&self) -> Option<R> {
        self.0.lock().ok()?.take()
    }
}

impl Waiting {
    /// Registers a request of caller thread `tid`; `killed` answers it (EINTR). Returns the
    /// id to give [`Waiting::done`] once the worker answered.
    pub(crate) fn add(self: &Arc<Self>, tid: u32, killed: Answer) -> u64 {
        self.watchdog.get_or_init(|| {
            let me = Arc::downgrade(self);
            let _ = std::thread::Builder::new()
                .name("tierfs-killable".into())
                .spawn(move || loop {
                    std::thread::sleep(EVERY);
                    let Some(w) = me.upgrade() else { return };
                    w.answer_killed();
                });
        });
        let id = self.next.fetch_add(1, Relaxed);
        if let Ok(mut m) = self.map.lock() {
            m.insert(id, (tid, Instant::now(), killed));
        }
        id
    }

    pub(crate) fn done(&self, id: u64) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(&id);
        }
    }

    /// Registers the request of caller thread `tid` whose answer is `reply`: `killed`
    /// answers it if the caller is killed first. The worker takes the reply from the slot
    /// (None: already answered) after dropping the guard, which unregisters the request,
    /// also when the job panics (the watchdog then lets go of its copy of the reply, and
    /// the reply's drop answers EIO).
    pub(crate) fn register<R: Send + 'static>(
        self: &Arc<Self>,
        tid: u32,
        reply: R,
        killed: impl FnOnce(R) + Send + 'static,
    ) -> (Slot<R>, DoneGuard) {
        let slot = Slot::new(reply);
        let mine = slot.clone();
        let id = self.add(
            tid,
            Box::new(move || {
                if let Some(r) = mine.take() {
                    killed(r)
                }
            }),
        );
        (slot, DoneGuard(self.clone(), id))
    }

    fn answer_killed(&self) {
        let killed: Vec<Answer> = {
            let Ok(mut m) = self.map.lock() else { return };
            let ids: Vec<u64> = m
                .iter()
                .filter(|(_, (tid, at, _))| at.elapsed() >= GRACE && sigkill_pending(*tid))
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| m.remove(id).map(|(_, _, a)| a))
                .collect()
        };
        for a in killed {
            a();
        }
    }
}

/// Whether thread `tid` has SIGKILL pending: it was killed while waiting for us.
fn sigkill_pending(tid: u32) -> bool {
    if tid == 0 {
        // The kernel's own request (no caller to kill).
        return false;
    }
    let s = match std::fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(s) => s,
        // Gone altogether: nobody waits for the answer either.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
        // Not ours to read (/proc with hidepid, ProtectProc): nothing known, nobody killed.
        Err(_) => return false,
    };
    s.lines().any(|l| {
        let mask = l
            .strip_prefix("SigPnd:")
            .or_else(|| l.strip_prefix("ShdPnd:"));
        mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & SIGKILL_BIT != 0)
    })
}

pub(crate) struct DoneGuard(Arc<Waiting>, u64);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.0.done(self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_thread_has_no_sigkill_pending() {
        assert!(!sigkill_pending(std::process::id()));
        assert!(sigkill_pending(u32::MAX - 1), "no such thread");
    }
}
