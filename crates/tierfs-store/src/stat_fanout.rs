//! How the entries of one directory listing are stat'ed: one after another, or many at a
//! time, decided by measuring the store rather than by its name.
//!
//! On a local disk a stat takes microseconds and one thread is fastest. On a network store
//! each stat may be a round trip (an NFS client whose attribute cache has expired, SMB, sshfs
//! after its own cache timed out): 1,000 entries at 5 ms are 5 s one by one, and some 30 round
//! trips' worth of time 32 at a time. But many at a time helps only where the store can answer
//! lookups in one directory concurrently: a FUSE store without `FUSE_PARALLEL_DIROPS` (sshfs
//! is one) has every lookup in a directory serialized by the kernel's per-directory mutex, so
//! 32 threads only queue and spin on it (measured over sshfs: 155-260 ms for a re-listing of
//! 1,000 entries that takes 50-80 ms one by one).
//!
//! So: the first [`PROBE_STATS`] entries go one by one; if they were slow, a *trial* batch
//! goes many at a time, and the rest follow whichever way was at least [`MIN_GAIN`] times
//! faster per entry. The verdict is remembered for the store and measured again every
//! [`RECHECK_EVERY`] slow listings (a store's behaviour may change: a remount, a new server).

use crate::Attr;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Entries of a listing stat'ed one by one before deciding whether the store is slow.
pub const PROBE_STATS: usize = 8;
/// A store that takes longer than this per stat is tried with many at a time.
pub const PARALLEL_STAT_AFTER: Duration = Duration::from_micros(200);
/// The default of `store.stat_concurrency`.
pub const STAT_CONCURRENCY: usize = 32;
/// Many at a time is kept only if it is at least this many times faster per entry than
/// one by one (a store that serializes the lookups shows about 1x).
pub const MIN_GAIN: u32 = 2;
/// Slow listings between two measurements of whether many at a time helps.
pub const RECHECK_EVERY: u32 = 64;
/// Entries per thread in the trial batch.
const TRIAL_PER_THREAD: usize = 4;

const UNKNOWN: u8 = 0;
const HELPS: u8 = 1;
const HURTS: u8 = 2;

/// The fan-out policy of one store, shared by all its listings.
#[derive(Debug)]
pub struct StatFanout {
    concurrency: AtomicUsize,
    parallel_after: Duration,
    verdict: AtomicU8,
    slow_listings: AtomicU32,
}

/// `store.names_first`: whether a directory is listed for names and types first and its
/// entries' attributes fetched when one is asked for (`Store::names_list_cheaper`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NamesFirst {
    /// Decided at mount: when a stat just after a listing of the root costs a round trip
    /// (`PosixStore::set_names_first`).
    #[default]
    Auto,
    On,
    Off,
}

impl std::str::FromStr for NamesFirst {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(NamesFirst::Auto),
            "on" => Ok(NamesFirst::On),
            "off" => Ok(NamesFirst::Off),
            _ => Err(format!(
                "store.names_first: '{s}' is not one of auto, on, off"
            )),
        }
    }
}

impl std::fmt::Display for NamesFirst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NamesFirst::Auto => "auto",
            NamesFirst::On => "on",
            NamesFirst::Off => "off",
        })
    }
}

/// What one call of [`StatFanout::stat_all`] did (for tests and the log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fanned {
    /// One by one: the store answered the probe quickly, or there is nothing left after it.
    Serial,
    /// Slow, and the remembered verdict (or this listing's trial) says many at a time helps.
    Parallel,
    /// Slow, but many at a time did not help (the store serializes lookups).
    SerialAfterTrial,
}

impl Default for StatFanout {
    fn default() -> Self {
        Self::new(STAT_CONCURRENCY, PARALLEL_STAT_AFTER)
    }
}

impl StatFanout {
    pub fn new(concurrency: usize, parallel_after: Duration) -> Self {
        StatFanout {
            concurrency: AtomicUsize::new(concurrency.max(1)),
            parallel_after,
            verdict: AtomicU8::new(UNKNOWN),
            slow_listings: AtomicU32::new(0),
        }
    }

    /// `store.stat_concurrency`: the most stats in flight at once.
    pub fn set_concurrency(&self, n: usize) {
        self.concurrency.store(n.max(1), Relaxed);
    }

    /// Stats `wanted` (indices into a listing of `len` entries) with `stat_one`, and returns
    /// the attributes by index (None: not wanted, or gone).
    pub fn stat_all<F>(
        &self,
        len: usize,
        wanted: &[usize],
        stat_one: F,
    ) -> (Vec<Option<Attr>>, Fanned)
    where
        F: Fn(usize) -> Option<Attr> + Sync,
    {
        let mut out = vec![None; len];
        let probe = wanted.len().min(PROBE_STATS);
        let t = Instant::now();
        for &i in &wanted[..probe] {
            out[i] = stat_one(i);
        }
        let serial_per = t.elapsed() / probe.max(1) as u32;
        let mut rest = &wanted[probe..];
        let threads = self.concurrency.load(Relaxed).min(rest.len().div_ceil(4));
        let slow = probe > 0 && serial_per >= self.parallel_after;
        if !slow || threads <= 1 {
            serial(&mut out, rest, &stat_one);
            return (out, Fanned::Serial);
        }
        let n = self.slow_listings.fetch_add(1, Relaxed);
        let mut verdict = self.verdict.load(Relaxed);
        if verdict == UNKNOWN || n % RECHECK_EVERY == RECHECK_EVERY - 1 {
            let trial = rest.len().min(threads * TRIAL_PER_THREAD);
            let t = Instant::now();
            parallel(&mut out, &rest[..trial], threads, &stat_one);
            let parallel_per = t.elapsed() / trial.max(1) as u32;
            verdict = if parallel_per * MIN_GAIN <= serial_per {
                HELPS
            } else {
                HURTS
            };
            if self.verdict.swap(verdict, Relaxed) != verdict {
                tracing::info!(
                    "listing stats: one at a time {serial_per:?}, {threads} at a time \
                     {parallel_per:?} per entry: {}",
                    if verdict == HELPS {
                        "many at a time from now on"
                    } else {
                        "one at a time from now on (the store serializes lookups in a directory)"
                    }
                );
            }
            rest = &rest[trial..];
        }
        if verdict == HELPS {
            parallel(&mut out, rest, threads, &stat_one);
            (out, Fanned::Parallel)
        } else {
            serial(&mut out, rest, &stat_one);
            (out, Fanned::SerialAfterTrial)
        }
    }
}

fn serial<F: Fn(usize) -> Option<Attr>>(out: &mut [Option<Attr>], which: &[usize], stat_one: &F) {
    for &i in which {
        out[i] = stat_one(i);
    }
}

fn parallel<F>(out: &mut [Option<Attr>], which: &[usize], threads: usize, stat_one: &F)
where
    F: Fn(usize) -> Option<Attr> + Sync,
{
    let next = AtomicUsize::new(0);
    let results = parking_lot::Mutex::new(Vec::with_capacity(which.len()));
    std::thread::scope(|s| {
        for _ in 0..threads.min(which.len()) {
            s.spawn(|| {
                let mut mine = Vec::new();
                loop {
                    let k = next.fetch_add(1, Relaxed);
                    let Some(&i) = which.get(k) else { break };
                    mine.push((i, stat_one(i)));
                }
                results.lock().extend(mine);
            });
        }
    });
    for (i, a) in results.into_inner() {
        out[i] = a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(i: usize) -> Attr {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_mode = libc::S_IFREG | 0o644;
        st.st_ino = i as u64 + 1;
        Attr::from_stat(&st)
    }

    /// A store that takes `delay` per stat; with `serialized`, one stat at a time (a FUSE
    /// store's per-directory lookup mutex).
    fn run(f: &StatFanout, delay: Duration, serialized: bool, n: usize) -> Fanned {
        let lock = parking_lot::Mutex::new(());
        let wanted: Vec<usize> = (0..n).collect();
        let (out, how) = f.stat_all(n, &wanted, |i| {
            let _g = serialized.then(|| lock.lock());
            std::thread::sleep(delay);
            Some(attr(i))
        });
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, a)| a.map(|a| a.ino) == Some(i as u64 + 1)));
        how
    }

    #[test]
    fn fast_stores_are_stated_one_by_one() {
        let f = StatFanout::default();
        assert_eq!(run(&f, Duration::ZERO, false, 300), Fanned::Serial);
    }

    #[test]
    fn a_store_that_answers_concurrently_gets_many_at_a_time() {
        let f = StatFanout::new(16, Duration::from_micros(200));
        assert_eq!(
            run(&f, Duration::from_millis(2), false, 300),
            Fanned::Parallel
        );
        assert_eq!(f.verdict.load(Relaxed), HELPS);
        assert_eq!(
            run(&f, Duration::from_millis(2), false, 300),
            Fanned::Parallel
        );
    }

    #[test]
    fn a_store_that_serializes_lookups_goes_back_to_one_by_one_and_remembers() {
        let f = StatFanout::new(16, Duration::from_micros(200));
        assert_eq!(
            run(&f, Duration::from_millis(1), true, 200),
            Fanned::SerialAfterTrial
        );
        assert_eq!(f.verdict.load(Relaxed), HURTS);
        // Remembered: the next slow listing does not try again (until RECHECK_EVERY).
        let before = f.slow_listings.load(Relaxed);
        assert_eq!(
            run(&f, Duration::from_millis(1), true, 100),
            Fanned::SerialAfterTrial
        );
        assert_eq!(f.slow_listings.load(Relaxed), before + 1);
    }

    #[test]
    fn the_verdict_is_measured_again() {
        let f = StatFanout::new(16, Duration::from_micros(200));
        assert_eq!(
            run(&f, Duration::from_millis(1), true, 100),
            Fanned::SerialAfterTrial
        );
        f.slow_listings.store(RECHECK_EVERY - 1, Relaxed);
        assert_eq!(
            run(&f, Duration::from_millis(2), false, 300),
            Fanned::Parallel
        );
        assert_eq!(f.verdict.load(Relaxed), HELPS);
    }
}
