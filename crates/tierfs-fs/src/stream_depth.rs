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

use std::time::Instant;

/// The throughput gain a doubled depth must bring to be kept.
const GAIN: f64 = 1.2;

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
        self.start.get_or_insert_with(Instant::now);
    }

    /// The stream ran dry: the window so far measured the application, not the store.
    pub fn idle(&mut self) {
        self.start = None;
        self.bytes = 0;
    }

    /// `bytes` arrived; `window` is how many make a measurement. Returns the level when the
    /// probe settles (for the store's next streams to start at).
    pub fn completed(&mut self, bytes: u64, window: u64) -> Option<u32> {
        let start = self.start?;
        self.bytes += bytes;
        if self.settled || self.bytes < window {
            return None;
        }
        let tp = self.bytes as f64 / start.elapsed().as_secs_f64().max(1e-6);
        self.start = None;
        self.bytes = 0;
        self.decide(tp)
    }

    fn decide(&mut self, tp: f64) -> Option<u32> {
        match self.last {
            Some((k0, tp0)) if tp < GAIN * tp0 => {
                self.level = k0;
                self.settled = true;
                Some(k0)
            }
            _ if self.level >= self.max => {
                self.settled = true;
                Some(self.level)
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
            if let Some(k) = p.decide(tp(p.level())) {
                return k;
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
}
