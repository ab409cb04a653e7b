//! The daemon's promise to exit: within [`EXIT_LIMIT`] of its mount going away (`umount`,
//! `fusermount3 -uz`) or of SIGINT/SIGTERM, even while calls into the store hang (a network
//! store that stopped answering); or of the last progress of its write-back drain, which
//! is waited for as long as it gets data and names onto the store (a slow store is not a
//! hung one: a thousand deferred creates over sshfs take 10 s, and were left to the next
//! mount). Without it, a daemon whose threads wait on a dead sshfs or
//! NFS server outlives its mount for as long as the store stays away (20 minutes and more
//! were seen), and its shutdown's drain of write-back data never ends.
//!
//! A limit the kernel sets: a thread whose request a FUSE store has already read waits for
//! that store's answer and cannot be killed; the daemon then closes every descriptor (the
//! mount, the cache dir's lock) and lingers as a zombie holding nothing until the store
//! answers (sshfs `-o ServerAliveInterval=15` makes it give up).
//!
//! Leaving early loses nothing: write-back data is in the journal (durable before it was
//! acknowledged) and is written at the next mount; the SSD tier is rebuilt from its log
//! without a checkpoint. The log says which, with the dirty bytes left.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the daemon may take to exit once its mount is gone or it was told to stop: the
/// promise is 10 s, this leaves time for the exit itself.
pub const EXIT_LIMIT: Duration = Duration::from_secs(8);
/// How often the watch looks for the mount in /proc/self/mountinfo (a few KB read).
const POLL: Duration = Duration::from_millis(500);

struct State {
    /// When the countdown started, and why.
    leaving: Option<(Instant, String)>,
}

/// The watch; [`ExitWatch::leaving`] starts the countdown.
#[derive(Clone)]
pub struct ExitWatch {
    state: Arc<(Mutex<State>, Condvar)>,
}

impl ExitWatch {
    /// Starts watching the mount with device `dev` (`major:minor`; None: only signals start
    /// the countdown). `left_behind` says what an early exit leaves for the next mount (it
    /// is called on a thread of its own and given 500 ms: it may touch locks a hung thread
    /// holds).
    /// `progress` is a count that moves while the shutdown gets work done (read every
    /// [`POLL`]; it must not block).
    pub fn start(
        dev: Option<String>,
        left_behind: impl Fn() -> String + Send + Sync + 'static,
        progress: impl Fn() -> u64 + Send + 'static,
    ) -> std::io::Result<ExitWatch> {
        let w = ExitWatch {
            state: Arc::new((Mutex::new(State { leaving: None }), Condvar::new())),
        };
        let me = w.clone();
        let left_behind = Arc::new(left_behind);
        std::thread::Builder::new()
            .name("tierfs-exit-watch".into())
            .spawn(move || me.run(dev, left_behind, progress))?;
        Ok(w)
    }

    /// Starts the countdown (once; later calls keep the first reason).
    pub fn leaving(&self, why: &str) {
        let (m, cv) = &*self.state;
        let mut s = m.lock();
        if s.leaving.is_none() {
            s.leaving = Some((Instant::now(), why.to_string()));
            cv.notify_all();
        }
    }

    fn run(
        &self,
        dev: Option<String>,
        left_behind: Arc<dyn Fn() -> String + Send + Sync>,
        progress: impl Fn() -> u64,
    ) {
        // The last progress seen, and when it moved.
        let mut last: Option<(u64, Instant)> = None;
        loop {
            let started = {
                let (m, cv) = &*self.state;
                let mut s = m.lock();
                cv.wait_for(&mut s, POLL);
                s.leaving.as_ref().map(|(t, why)| (*t, why.clone()))
            };
            match started {
                None => {
                    if let Some(d) = &dev {
                        if !mounted(d) {
                            self.leaving("the mount went away");
                        }
                    }
                }
                Some((t, why))
                    if {
                        let p = progress();
                        if last.is_none_or(|(seen, _)| seen != p) {
                            last = Some((p, Instant::now()));
                        }
                        // From the later of the two: the countdown starts again at each step
                        // of the drain.
                        let moved = last.map_or(t, |(_, at)| at.max(t));
                        moved.elapsed() >= EXIT_LIMIT
                    } =>
                {
                    let what = bounded(left_behind.clone(), Duration::from_millis(500));
                    tracing::error!(
                        "{why} {:.0} s ago and the daemon has not finished, with no progress for {} s (store calls still hanging?): exiting now; {what}",
                        t.elapsed().as_secs_f64(),
                        EXIT_LIMIT.as_secs()
                    );
                    // Every descriptor goes first: the FUSE device (the kernel fails what
                    // still waits on the mount with ENOTCONN), the cache dir's lock (a new
                    // mount may start at once), the journal and SSD segments. A thread
                    // waiting on a request a FUSE store (sshfs) has already taken cannot be
                    // killed: the kernel waits for that store's answer, and the process
                    // lingers as a zombie until then, holding nothing.
                    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
                    std::process::exit(1);
                }
                Some(_) => {}
            }
        }
    }
}

/// Whether a mount with device `dev` is still in this namespace (also under another path: a
/// bind mount or a move keeps it in use).
fn mounted(dev: &str) -> bool {
    match std::fs::read_to_string("/proc/self/mountinfo") {
        // Field 3 is the device, `major:minor`.
        Ok(info) => info.lines().any(|l| l.split(' ').nth(2) == Some(dev)),
        // Cannot tell: keep serving.
        Err(_) => true,
    }
}

/// `f()` on its own thread, or a note that it did not answer within `limit`.
fn bounded(f: Arc<dyn Fn() -> String + Send + Sync>, limit: Duration) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("tierfs-exit-note".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    match spawned {
        Ok(_) => rx.recv_timeout(limit).unwrap_or_else(|_| {
            "(the daemon's state could not be read: locks held by hung calls)".into()
        }),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_that_is_not_mounted_is_not() {
        assert!(!mounted("4095:1048575"));
        // The root filesystem's device is.
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let dev = info.lines().next().unwrap().split(' ').nth(2).unwrap();
        assert!(mounted(dev));
    }
}
