//! Pressure stall information: the share of time tasks stalled waiting for memory (reclaim,
//! refaults of a thrashing page cache). Read from the daemon's own cgroup v2
//! `memory.pressure` when it has one, else from /proc/pressure/memory (the whole host).
//!
//! The stall share is computed from the `total=` counter between two samples, not from
//! `avg10`, which lags by seconds and would keep the monitor shrinking long after the stall
//! ended. A poll trigger (where the kernel permits one) wakes the monitor as soon as stalls
//! pass the threshold instead of at its next tick.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(crate) struct Psi {
    pub path: PathBuf,
    trigger: Option<File>,
    last: Option<(u64, Instant)>,
}

/// Microseconds of `some` stall since boot (or the cgroup's creation).
pub(crate) fn some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The daemon's own cgroup v2 directory, unless it is the root of the tree (whose pressure is
/// the host's, /proc/pressure/memory).
fn own_v2_dir() -> Option<PathBuf> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    if path == "/" {
        return None;
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mi.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        post.starts_with("cgroup2 ")
            .then(|| pre.split(' ').nth(4).map(PathBuf::from))?
    })?;
    Some(mount.join(path.trim_start_matches('/')))
}

/// Opens `path` and registers a trigger: `pct` percent of stall within a window. The kernel
/// lets unprivileged processes register only windows that are multiples of 2 s, so 1 s is
/// tried first and 2 s next.
fn trigger(path: &Path, pct: u8) -> Option<File> {
    for window_us in [1_000_000u64, 2_000_000] {
        let Ok(mut f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        else {
            return None;
        };
        let stall_us = (window_us * pct.clamp(1, 100) as u64 / 100).max(1);
        if f.write_all(format!("some {stall_us} {window_us}\0").as_bytes())
            .is_ok()
        {
            return Some(f);
        }
    }
    None
}

impl Psi {
    /// PSI for the daemon, with a poll trigger at `pct` percent if permitted; None on kernels
    /// without PSI (before 4.20, or booted with psi=0).
    pub fn open(pct: u8) -> Option<Psi> {
        let path = own_v2_dir()
            .map(|d| d.join("memory.pressure"))
            .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| some_total(&t).is_some()))
            .unwrap_or_else(|| PathBuf::from("/proc/pressure/memory"));
        some_total(&std::fs::read_to_string(&path).ok()?)?;
        let trigger = if pct > 0 { trigger(&path, pct) } else { None };
        Some(Psi {
            path,
            trigger,
            last: None,
        })
    }

    pub fn has_trigger(&self) -> bool {
        self.trigger.is_some()
    }

    /// Sleeps up to `timeout`; true if the trigger fired (stalls passed the threshold).
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let Some(f) = &self.trigger else {
            std::thread::sleep(timeout);
            return false;
        };
        let mut pfd = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis().max(1) as i32) };
        if n > 0 && pfd.revents & libc::POLLERR != 0 {
            // The cgroup went away: no more trigger (the next discovery may open another).
            self.trigger = None;
            std::thread::sleep(timeout);
            return false;
        }
        n > 0 && pfd.revents & libc::POLLPRI != 0
    }

    /// Percent of the time since the previous call in which some task stalled on memory.
    pub fn stall_pct(&mut self) -> Option<f64> {
        let total = some_total(&std::fs::read_to_string(&self.path).ok()?)?;
        let now = Instant::now();
        let prev = self.last.replace((total, now));
        let (t0, i0) = prev?;
        let us = now.duration_since(i0).as_micros() as f64;
        (us > 0.0).then(|| (total.saturating_sub(t0) as f64 / us * 100.0).min(100.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_totals() {
        let t = "some avg10=3.12 avg60=1.22 avg300=0.29 total=19402772\n\
                 full avg10=2.47 avg60=0.95 avg300=0.22 total=13438143\n";
        assert_eq!(some_total(t), Some(19402772));
        assert_eq!(some_total("full avg10=0 total=5\n"), None);
        if let Some(mut p) = Psi::open(10) {
            assert!(p.stall_pct().is_none());
            std::thread::sleep(Duration::from_millis(20));
            let pct = p.stall_pct().unwrap();
            assert!((0.0..=100.0).contains(&pct));
        }
    }
}
