//! The write budget: a token bucket in bytes (swapcache's accrate/maxburst).
//!
//! `offer` takes an estimate of what the entry will cost on disk; the writer settles the
//! difference when the cluster is written (summary, padding: refund if the estimate was high,
//! a charge if it was low). Offers must leave `HEADROOM` tokens, enough for one cluster's
//! unestimated summary and padding, so the settlement does not overdraw the bucket in practice:
//! bytes written stay within depth + rate * t.

use super::aligned::PAGE;
use super::layout::{rec_size, round_up, HDR, SMALL_ALIGN};
use parking_lot::Mutex;
use std::time::Instant;

/// Tokens an offer must leave in the bucket: one cluster's header, summary padding and data
/// tail padding, which no entry's estimate includes.
pub(crate) const HEADROOM: u64 = (HDR + 2 * PAGE) as u64;

/// What admitting an entry of `len` bytes is expected to cost on disk: its data, the worst
/// alignment gap before it, its record.
pub(crate) fn charge(len: u32) -> u64 {
    let (len, page) = (len as u64, PAGE as u64);
    let data = if len >= page {
        round_up(len, page) + page - SMALL_ALIGN
    } else {
        round_up(len, SMALL_ALIGN)
    };
    data + rec_size(len as u32) as u64
}

struct Bucket {
    /// May go below zero when the writer settles a low estimate.
    tokens: i128,
    rate: u64,
    depth: u64,
    last: Instant,
    /// Sub-token remainder of the last refill (rate * ns not yet a whole byte).
    frac: u128,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let ns = now.saturating_duration_since(self.last).as_nanos();
        self.last = now;
        let total = self.rate as u128 * ns + self.frac;
        self.frac = total % 1_000_000_000;
        let add = (total / 1_000_000_000).min(u64::MAX as u128) as i128;
        self.tokens = (self.tokens + add).min(self.depth as i128);
        if self.tokens == self.depth as i128 {
            self.frac = 0;
        }
    }
}

pub(crate) struct Budget {
    b: Mutex<Bucket>,
}

impl Budget {
    /// A full bucket.
    pub fn new(rate: u64, depth: u64) -> Budget {
        Budget {
            b: Mutex::new(Bucket {
                tokens: depth as i128,
                rate,
                depth,
                last: Instant::now(),
                frac: 0,
            }),
        }
    }

    /// Takes `n` tokens if `n + headroom` are there.
    pub fn try_take(&self, n: u64, headroom: u64) -> bool {
        let mut b = self.b.lock();
        b.refill(Instant::now());
        if b.tokens >= n as i128 + headroom as i128 {
            b.tokens -= n as i128;
            return true;
        }
        false
    }

    /// [`Budget::try_take`], or how long until `n + headroom` tokens could be there at the
    /// current rate (None: never, the rate is 0 or the bucket is too shallow to hold them).
    pub fn take_or_eta(&self, n: u64, headroom: u64) -> Result<(), Option<std::time::Duration>> {
        let mut b = self.b.lock();
        b.refill(Instant::now());
        let need = n as i128 + headroom as i128;
        if b.tokens >= need {
            b.tokens -= n as i128;
            return Ok(());
        }
        if b.rate == 0 || need > b.depth as i128 {
            return Err(None);
        }
        let ns = (need - b.tokens) as u128 * 1_000_000_000 / b.rate as u128;
        Err(Some(std::time::Duration::from_nanos(
            ns.min(u64::MAX as u128) as u64,
        )))
    }

    /// Settles a cluster: `delta` > 0 is charged even if it overdraws, < 0 is refunded.
    pub fn settle(&self, delta: i128) {
        let mut b = self.b.lock();
        b.refill(Instant::now());
        b.tokens = (b.tokens - delta).min(b.depth as i128);
    }

    /// Gives tokens back (an offer that could not be queued).
    pub fn refund(&self, n: u64) {
        self.settle(-(n as i128));
    }

    pub fn set_rate(&self, rate: u64) {
        let mut b = self.b.lock();
        b.refill(Instant::now());
        b.rate = rate;
    }

    pub fn set_depth(&self, depth: u64) {
        let mut b = self.b.lock();
        b.refill(Instant::now());
        b.depth = depth;
        b.tokens = b.tokens.min(depth as i128);
    }

    /// (rate, depth, tokens now, floored at 0).
    pub fn state(&self) -> (u64, u64, u64) {
        let mut b = self.b.lock();
        b.refill(Instant::now());
        (b.rate, b.depth, b.tokens.clamp(0, u64::MAX as i128) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refills_at_rate_and_caps_at_depth() {
        let b = Budget::new(1 << 20, 1 << 20);
        assert!(b.try_take(1 << 20, 0));
        assert!(!b.try_take(1 << 19, 0));
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert!(b.try_take(1 << 19, 0));
        b.set_depth(1000);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(b.state().2, 1000);
        b.settle(3000);
        assert_eq!(b.state().2, 0);
        assert!(!b.try_take(1, 0));
    }

    #[test]
    fn eta_says_when_tokens_come_back() {
        let b = Budget::new(1 << 20, 1 << 20);
        assert_eq!(b.take_or_eta(1 << 20, 0), Ok(()));
        let eta = b.take_or_eta(1 << 19, 0).unwrap_err().unwrap();
        assert!(eta > std::time::Duration::from_millis(400), "{eta:?}");
        assert!(eta <= std::time::Duration::from_millis(500), "{eta:?}");
        assert_eq!(
            b.take_or_eta(2 << 20, 0),
            Err(None),
            "deeper than the bucket"
        );
        b.set_rate(0);
        assert_eq!(b.take_or_eta(1 << 20, 0), Err(None), "no refill at rate 0");
    }

    #[test]
    fn charge_covers_data_and_record() {
        assert!(charge(100) >= 512 + 52);
        assert!(charge(4096) >= 4096 + 52);
        assert!(charge(65536) >= 65536 + 3584);
    }
}
