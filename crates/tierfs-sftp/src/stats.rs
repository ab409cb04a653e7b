//! The store's own counters, for `tierfs stats` (`sftp.*`): what the core's store counters
//! cannot see from outside a call, i.e. how many protocol requests are on the wire at once.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default, Debug)]
pub struct SftpStats {
    /// Requests sent and not answered yet (a gauge).
    pub in_flight: AtomicU64,
    /// Requests sent, in all.
    pub requests: AtomicU64,
    /// Requests that got no answer within `sftp.timeout` (each dropped its connection).
    pub timeouts: AtomicU64,
    /// Connections made after the first (a dead ssh replaced).
    pub reconnects: AtomicU64,
}

/// A copy of [`SftpStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SftpStatsSnapshot {
    pub in_flight: u64,
    pub requests: u64,
    pub timeouts: u64,
    pub reconnects: u64,
}

impl SftpStats {
    pub fn snapshot(&self) -> SftpStatsSnapshot {
        SftpStatsSnapshot {
            in_flight: self.in_flight.load(Relaxed),
            requests: self.requests.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
        }
    }
}

/// Counts one request in flight for as long as it lives.
pub(crate) struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    pub(crate) fn new(s: &'a SftpStats) -> Self {
        s.requests.fetch_add(1, Relaxed);
        s.in_flight.fetch_add(1, Relaxed);
        InFlight(&s.in_flight)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}
