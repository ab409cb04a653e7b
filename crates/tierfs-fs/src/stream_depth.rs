//! How many backing reads one sequential stream keeps in flight.
//!
//! On one disk head, two reads of one stream in flight interleave and cost a seek each: the
//! stream goes best one ordered read at a time. On a network store (sshfs, NFS over a WAN,
//! later S3) one read at a time leaves the link idle for a round trip between reads, and
//! the store delivers at its own speed only with several in flight (issue 12: sshfs at 4 ms
//! round trip, 38 MB/s one at a time against 73 MB/s for fio at queue depth 16). Which kind a
//! store is cannot be read off its latency and bandwidth (an HDD's seek is longer than an
//! sshfs round trip), so it is measured: a stream starts at the depth the store settled on
//! last (1 at first), and once it has moved a window of data it tries twice the depth for
//! another window; it keeps doubling while that brings at least [`GAIN`] more throughput, up
//! to `readahead.depth`, and settles on the best. Only windows in which the store was the
//! bottleneck count: one in which the stream ran dry (waiting for the application) is
//! thrown away.
//!
//! A trial costs a disk head seeks for as long as it runs (over the hdd emulator, a 1 GiB
//! cold `md5sum` paid 37 seeks of 8 ms for one 8-chunk trial at depth 2: 0.95x the store
//! alone), so it is kept short where it loses: a deeper level at less than half the speed of the one
//! before it after a quarter of its window is given up at once; and once a trial lost, the
//! store's next [`QUIET_STREAMS`] streams start settled at its depth, without one
//! ([`StoreDepth`]). A store where depth pays is not slowed: its trials keep running.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Instant;

/// The throughput gain a doubled depth must bring to be kept. Small: on a link a deeper
/// level that brings little costs nothing, while one kept too shallow costs what it would
/// have brought (over sshfs depth 4 measured 1.23x depth 2 in a 32 MiB window, and with 1.2
/// here a noisy window settled streams at depth 2, 0.85x the store, one run in three); on a
/// disk head a deeper level loses by far more than this (its seeks).
const GAIN: f64 = 1.05;

/// How much slower than the level before it a trial must be after a quarter window to be
/// given up then.
const EARLY_LOSS: f64 = 2.0;

/// Streams that start without a trial after one lost (the store's kind does not change
/// often; it may, when the store's own caches warm up or its link changes).
pub(crate) const QUIET_STREAMS: u32 = 32;

/// What the streams of one store settled on: the depth the next one starts at, and for how
/// many more streams that depth is taken as it is (a deeper one lost a trial lately).
#[derive(Debug)]
pub(crate) struct StoreDepth {
    level: AtomicU32,
    quiet: AtomicU32,
}

impl Default for StoreDepth {
    fn default() -> Self {
        StoreDepth {
            level: AtomicU32::new(1),
            quiet: AtomicU32::new(0),
        }
    }
}

impl StoreDepth {
    /// The probe of a new stream (`max`: `readahead.depth`).
    pub fn probe(&self, max: u32) -> DepthProbe {
        let level = self.level.load(Relaxed);
        let quiet = self
            .quiet
            .fetch_update(Relaxed, Relaxed, |q| q.checked_sub(1))
            .is_ok();
        let mut p = DepthProbe::new(level, max);
        p.settled |= quiet;
        p
    }

    /// A stream's probe settled on `v`.
    pub fn settled(&self, v: Verdict) {
        self.level.store(v.level, Relaxed);
        if v.deeper_lost {
            self.quiet.store(QUIET_STREAMS, Relaxed);
        }
    }
}

/// How a probe settled: on `level`, and whether because a deeper level lost its trial (rather
/// than because `readahead.depth` was reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub level: u32,
    pub deeper_lost: bool,
}

/// Chunks of data per measurement window.
pub(crate) const WINDOW_CHUNKS: u64 = 8;

#[derive(Debug)]
pub(crate) struct DepthProbe {
    level: u32,
    max: u32,
    start: Option<Instant>,
    bytes: u64,
    /// The level tried before the current one and the throughput it gave (bytes/s).
    last: Option<(u32, f64)>,
    settled: bool,
}

impl DepthProbe {
    pub fn new(start: u32, max: u32) -> DepthProbe {
        let max = max.max(1);
        DepthProbe {
            level: start.clamp(1, max),
            max,
            start: None,
            bytes: 0,
            last: None,
            settled: start >= max,
        }
    }

    pub fn level(&self) -> u32 {
        self.level
    }

    /// A backing read of the stream is starting.
    pub fn started(&mut self) {
        self.started_at(Instant::now());
    }

    fn started_at(&mut self, now: Instant) {
        self.start.get_or_insert(now);
    }

    /// The stream ran dry: the window so far measured the application, not the store.
    pub fn idle(&mut self) {
        self.start = None;
        self.bytes = 0;
    }

    /// `bytes` arrived; `window` is how many make a measurement. Returns the verdict when
    /// the probe settles (for the store's next streams to start at).
    pub fn completed(&mut self, bytes: u64, window: u64) -> Option<Verdict> {
        self.completed_at(bytes, window, Instant::now())
    }

    fn completed_at(&mut self, bytes: u64, window: u64, now: Instant) -> Option<Verdict> {
        let start = self.start?;
        self.bytes += bytes;
        if self.settled {
            return None;
        }
        let secs = now.saturating_duration_since(start).as_secs_f64().max(1e-6);
        let tp = || self.bytes as f64 / secs;
        if self.bytes < window {
            // A trial already at less than half the speed of the level before it: a disk
            // head seeking between the stream's reads, and each chunk more costs seeks (see
            // the module comment). (Less clear a loss is measured over the whole window: the
            // first chunks of a deeper level on a link can be slow while it ramps up.)
            // Not before as many chunks as the level has in flight: those arrive about
            // together, and fewer would measure the level at a fraction of its speed.
            let early = (window / 4).max(u64::from(self.level) * window / WINDOW_CHUNKS);
            return match self.last {
                Some((_, tp0)) if self.bytes >= early && tp() < tp0 / EARLY_LOSS => {
                    let tp = tp();
                    self.decide(tp)
                }
                _ => None,
            };
        }
        let tp = tp();
        self.start = None;
        self.bytes = 0;
        self.decide(tp)
    }

    fn decide(&mut self, tp: f64) -> Option<Verdict> {
        match self.last {
            Some((k0, tp0)) if tp < GAIN * tp0 => {
                self.level = k0;
                self.settled = true;
                Some(Verdict {
                    level: k0,
                    deeper_lost: true,
                })
            }
            _ if self.level >= self.max => {
                self.settled = true;
                Some(Verdict {
                    level: self.level,
                    deeper_lost: false,
                })
            }
            _ => {
                self.last = Some((self.level, tp));
                self.level = (self.level * 2).min(self.max);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Throughput as a function of depth, fed to the probe's decisions.
    fn settle(mut p: DepthProbe, tp: impl Fn(u32) -> f64) -> u32 {
        for _ in 0..10 {
            if let Some(v) = p.decide(tp(p.level())) {
                return v.level;
            }
        }
        panic!("never settled: {p:?}");
    }

    #[test]
    fn a_disk_head_stays_at_one() {
        // Parallel reads of one stream cost seeks: no gain.
        assert_eq!(settle(DepthProbe::new(1, 8), |k| 150.0 / k as f64), 1);
        assert_eq!(settle(DepthProbe::new(1, 8), |_| 150.0), 1);
    }

    #[test]
    fn a_latency_bound_link_goes_as_deep_as_it_pays() {
        // 40 MB/s one at a time, up to the link's 110 MB/s.
        let link = |k: u32| (40.0 * k as f64).min(110.0);
        assert_eq!(settle(DepthProbe::new(1, 8), link), 4);
        assert_eq!(settle(DepthProbe::new(1, 2), link), 2);
        assert_eq!(settle(DepthProbe::new(1, 16), |k| 10.0 * k as f64), 16);
    }

    #[test]
    fn windows_measure_only_busy_time() {
        let mut p = DepthProbe::new(1, 4);
        p.completed(100, 10);
        assert_eq!(p.level(), 1, "nothing started: not measured");
        p.started();
        p.completed(5, 10);
        p.idle();
        p.started();
        assert_eq!(p.completed(10, 10), None);
        assert_eq!(p.level(), 2, "a full window moves the probe on");
    }

    #[test]
    fn a_losing_trial_is_given_up_after_a_quarter_window() {
        let ms = std::time::Duration::from_millis;
        let t0 = Instant::now();
        let mut p = DepthProbe::new(1, 4);
        // Depth 1: 100 bytes in 10 ms.
        p.started_at(t0);
        assert_eq!(p.completed_at(100, 100, t0 + ms(10)), None);
        assert_eq!(p.level(), 2, "trying depth 2");
        // Depth 2: a quarter window a little slower goes on; at less than half the speed of
        // depth 1, given up there.
        p.started_at(t0 + ms(10));
        let v = p.completed_at(25, 100, t0 + ms(13));
        assert_eq!(v, None, "a quarter window a little slower goes on");
        let v = p.completed_at(5, 100, t0 + ms(30));
        assert_eq!(
            v,
            Some(Verdict {
                level: 1,
                deeper_lost: true
            })
        );
        assert_eq!(p.level(), 1);
        assert_eq!(p.completed_at(100, 100, t0 + ms(40)), None, "settled");

        // A trial that pays runs its whole window.
        let mut p = DepthProbe::new(1, 2);
        p.started_at(t0);
        p.completed_at(100, 100, t0 + ms(10));
        p.started_at(t0 + ms(10));
        assert_eq!(p.completed_at(50, 100, t0 + ms(12)), None);
        let v = p.completed_at(50, 100, t0 + ms(14));
        assert_eq!(
            v,
            Some(Verdict {
                level: 2,
                deeper_lost: false
            })
        );
    }

    #[test]
    fn a_deep_trial_is_judged_early_only_once_its_first_reads_are_in() {
        let ms = std::time::Duration::from_millis;
        let t0 = Instant::now();
        let w = WINDOW_CHUNKS * 10;
        let mut p = DepthProbe::new(2, 8);
        p.started_at(t0);
        assert_eq!(p.completed_at(w, w, t0 + ms(10)), None);
        assert_eq!(p.level(), 4);
        // Depth 4: its four chunks in flight arrive about together, after 6 ms: judged at
        // two chunks, depth 4 would look less than half as fast as depth 2; at four it is
        // not, and the whole window decides.
        let us = std::time::Duration::from_micros;
        p.started_at(t0 + ms(10));
        assert_eq!(p.completed_at(10, w, t0 + ms(10) + us(6000)), None);
        assert_eq!(p.completed_at(10, w, t0 + ms(10) + us(6050)), None);
        assert_eq!(p.completed_at(10, w, t0 + ms(10) + us(6100)), None);
        assert_eq!(p.completed_at(10, w, t0 + ms(10) + us(6150)), None);
        assert_eq!(p.level(), 4, "still trying depth 4");
    }

    #[test]
    fn after_a_lost_trial_the_stores_next_streams_take_no_trial() {
        let d = StoreDepth::default();
        assert!(!d.probe(4).settled, "no verdict yet: a trial");
        d.settled(Verdict {
            level: 1,
            deeper_lost: true,
        });
        for _ in 0..QUIET_STREAMS {
            let p = d.probe(4);
            assert!(p.settled && p.level() == 1);
        }
        assert!(!d.probe(4).settled, "then a trial again");
        // A store where depth paid: every stream starts there and tries deeper.
        d.settled(Verdict {
            level: 2,
            deeper_lost: false,
        });
        let p = d.probe(4);
        assert!(!p.settled && p.level() == 2);
        assert!(d.probe(2).settled, "at readahead.depth: nothing to try");
    }
}
