//! The monitor's decision, free of I/O so it can be tested on made-up samples.
//!
//! Each signal (the host's MemAvailable, the tightest cgroup's room) gives an amount of memory
//! that is free for the taking and a floor that must stay free. Three bands follow:
//! - below the floor (deficit): shrink now, by the deficit plus a step, within one tick;
//! - between the floor and twice the floor (low band): hold; shrink a step if PSI also says
//!   tasks are stalling on memory;
//! - above twice the floor (plenty): after `grow_delay` without a shrink, grow the target by a
//!   step, but never beyond what would bring the memory back into the low band if filled.

use super::PressureConfig;
use std::time::{Duration, Instant};

/// One reading of the host, taken by the monitor thread.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sample {
    /// Bytes the RAM tier holds now.
    pub used: u64,
    /// The host's MemAvailable, if known.
    pub mem_available: Option<u64>,
    /// The tightest memory cgroup above the daemon, if any has a limit.
    pub cgroup: Option<CgroupRoom>,
    /// Share of the last interval (percent) in which some task stalled on memory (PSI).
    pub psi_some_pct: Option<f64>,
    /// A PSI poll trigger fired since the last sample.
    pub psi_event: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CgroupRoom {
    /// `memory.max` / `memory.high` (v2) or `memory.limit_in_bytes` (v1), bytes.
    pub limit: u64,
    /// What more the cgroup may take: limit minus usage that is not reclaimable file cache.
    pub room: u64,
}

/// Why the target last changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// MemAvailable below `ram.free_floor`.
    Free,
    /// The cgroup's room below its floor.
    Cgroup,
    /// PSI stall while memory is in the low band.
    Psi,
    /// Memory is plentiful again.
    Grow,
    /// `ram.min` / `ram.max` changed.
    Limits,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Free => "mem_available",
            Reason::Cgroup => "cgroup",
            Reason::Psi => "psi",
            Reason::Grow => "grow",
            Reason::Limits => "limits",
        }
    }
}

/// The floor a cgroup keeps free: `ram.free_floor`, but at most an eighth of its limit (a
/// floor meant for a 24 GiB host must not pin a 1 GiB cgroup at `ram.min`).
pub(crate) fn cgroup_floor(cfg: &PressureConfig, limit: u64) -> u64 {
    cfg.free_floor.min(limit / 8)
}

/// Memory below the floor (positive: a deficit) and the allowance above twice the floor
/// (positive: room to grow into), over all signals; None without any signal.
pub(crate) fn bands(cfg: &PressureConfig, s: &Sample) -> Option<(i64, i64, Reason)> {
    let mut worst: Option<(i64, i64, Reason)> = None;
    let mut take = |free: u64, floor: u64, why: Reason| {
        let deficit = floor as i64 - free as i64;
        let allowance = free as i64 - 2 * floor as i64;
        worst = Some(match worst {
            Some((d, a, w)) if d >= deficit => (d, a.min(allowance), w),
            Some((_, a, _)) => (deficit, a.min(allowance), why),
            None => (deficit, allowance, why),
        });
    };
    if let Some(avail) = s.mem_available {
        take(avail, cfg.free_floor, Reason::Free);
    }
    if let Some(cg) = s.cgroup {
        take(cg.room, cgroup_floor(cfg, cg.limit), Reason::Cgroup);
    }
    worst
}

/// The smallest growth step.
const GROW_MIN: u64 = 16 << 20;

/// What one tick decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Hold,
    Shrink(Reason),
    Grow,
    /// The cap came down to what fits, above what the tier holds: nothing is evicted, and
    /// growth is not delayed. Keeps the target meaningful (what the tier may fill) while
    /// memory is taken by others before it runs short.
    Fit,
}

pub(crate) struct Policy {
    pub target: u64,
    pub last_shrink: Option<Instant>,
}

impl Policy {
    /// The starting target: what fits now (all of `ram.max` if nothing is known).
    pub fn new(cfg: &PressureConfig, s: &Sample) -> Policy {
        let target = match bands(cfg, s) {
            Some((_, allowance, _)) => (s.used as i64 + allowance).max(0) as u64,
            None => cfg.max,
        };
        Policy {
            target: target.clamp(cfg.min, cfg.max.max(cfg.min)),
            last_shrink: None,
        }
    }

    /// Size of one growth step: a sixteenth of the range, so an idle host gets the whole
    /// tier back in under two seconds of ticks once `grow_delay` has passed.
    fn grow_step(cfg: &PressureConfig) -> u64 {
        ((cfg.max.saturating_sub(cfg.min)) / 16).max(GROW_MIN)
    }

    pub fn step(&mut self, cfg: &PressureConfig, s: &Sample, now: Instant) -> Change {
        let (min, max) = (cfg.min, cfg.max.max(cfg.min));
        if !(min..=max).contains(&self.target) {
            // `ram.min` / `ram.max` changed at run time.
            return self.set(self.target.clamp(min, max), now, Reason::Limits);
        }
        let Some((deficit, allowance, why)) = bands(cfg, s) else {
            // No signal at all: a fixed cap, as without the monitor.
            return self.set(max, now, Reason::Limits);
        };
        let psi_high = cfg.psi_pct > 0
            && (s.psi_event || s.psi_some_pct.is_some_and(|p| p >= cfg.psi_pct as f64));
        // Shrinking works on what the tier holds, not on the cap: lowering an unfilled cap
        // frees nothing.
        let base = self.target.min(s.used);
        if deficit > 0 {
            // The deficit, plus a sixteenth so that a growing consumer is not chased in many
            // tiny steps.
            let want = base.saturating_sub(deficit as u64 + base / 16).max(min);
            return self.set(want, now, why);
        }
        // What the tier may hold without taking memory into the low band (or, in it, no more
        // than it holds).
        let fits = s.used.saturating_add(allowance.max(0) as u64).max(min);
        if allowance < 0 && psi_high {
            let want = base.saturating_sub(base / 8).max(min);
            return self.set(want, now, Reason::Psi);
        }
        if self.target > fits {
            self.target = fits;
            return Change::Fit;
        }
        if allowance < 0 {
            return Change::Hold;
        }
        let quiet = self
            .last_shrink
            .is_none_or(|t| now.duration_since(t) >= cfg.grow_delay);
        if !quiet || psi_high || self.target >= max {
            return Change::Hold;
        }
        let want = self
            .target
            .saturating_add(Self::grow_step(cfg))
            .min(fits)
            .min(max);
        // Not in dribbles: the room above the floor moves by a few MiB from tick to tick.
        if want >= self.target + GROW_MIN || (want == max && want > self.target) {
            self.target = want;
            return Change::Grow;
        }
        Change::Hold
    }

    fn set(&mut self, want: u64, now: Instant, why: Reason) -> Change {
        use std::cmp::Ordering::*;
        match want.cmp(&self.target) {
            Equal => Change::Hold,
            Less => {
                self.target = want;
                self.last_shrink = Some(now);
                Change::Shrink(why)
            }
            Greater => {
                self.target = want;
                Change::Grow
            }
        }
    }

    /// Time left before growth is allowed again.
    pub fn grow_wait(&self, cfg: &PressureConfig, now: Instant) -> Duration {
        self.last_shrink
            .map_or(Duration::ZERO, |t| cfg.grow_delay.saturating_sub(now - t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;

    fn cfg() -> PressureConfig {
        PressureConfig {
            min: 64 * M,
            max: 4 * G,
            free_floor: G,
            grow_delay: Duration::from_secs(5),
            psi_pct: 10,
            ..PressureConfig::default()
        }
    }

    fn host(used: u64, avail: u64) -> Sample {
        Sample {
            used,
            mem_available: Some(avail),
            ..Sample::default()
        }
    }

    #[test]
    fn starts_at_what_fits() {
        let c = cfg();
        assert_eq!(Policy::new(&c, &host(0, 20 * G)).target, 4 * G);
        // 3 GiB available, floor 1 GiB: 1 GiB may be filled before the low band.
        assert_eq!(Policy::new(&c, &host(0, 3 * G)).target, G);
        assert_eq!(Policy::new(&c, &host(0, G / 2)).target, 64 * M);
        assert_eq!(Policy::new(&c, &Sample::default()).target, 4 * G);
    }

    #[test]
    fn shrinks_by_the_deficit_at_once_then_waits_before_growing() {
        let c = cfg();
        let t0 = Instant::now();
        let mut p = Policy::new(&c, &host(4 * G, 20 * G));
        assert_eq!(p.target, 4 * G);
        // A hog leaves 512 MiB: 512 MiB below the floor.
        let ch = p.step(&c, &host(4 * G, G / 2), t0);
        assert_eq!(ch, Change::Shrink(Reason::Free));
        assert_eq!(p.target, 4 * G - G / 2 - G / 4);
        // It takes everything it is given: down to ram.min in three steps, never below.
        let mut n = 0;
        while p.step(&c, &host(p.target, 0), t0) != Change::Hold {
            n += 1;
        }
        assert_eq!((p.target, n), (64 * M, 3));
        // The hog exits: no growth within grow_delay...
        let later = t0 + Duration::from_secs(4);
        assert_eq!(p.step(&c, &host(64 * M, 20 * G), later), Change::Hold);
        // ...then steps up to ram.max.
        let mut t = t0 + Duration::from_secs(5);
        let mut steps = 0;
        while p.step(&c, &host(64 * M, 20 * G), t) == Change::Grow {
            t += Duration::from_millis(100);
            steps += 1;
        }
        assert_eq!(p.target, 4 * G);
        assert!((16..=17).contains(&steps), "{steps} steps");
    }

    #[test]
    fn growth_stops_where_filling_would_reach_the_low_band() {
        let c = cfg();
        let t = Instant::now();
        let mut p = Policy::new(&c, &host(0, 20 * G));
        p.target = 100 * M;
        // 2.5 GiB available, floor 1 GiB: the tier may hold 0.5 GiB more than it does.
        for _ in 0..100 {
            p.step(&c, &host(100 * M, 5 * G / 2), t);
        }
        // Up to that, short of it by less than the smallest step.
        let fits = 100 * M + G / 2;
        assert!(
            p.target <= fits && p.target + GROW_MIN > fits,
            "{}",
            p.target
        );
    }

    #[test]
    fn the_cap_comes_down_to_what_fits_without_a_shrink() {
        let c = cfg();
        let t = Instant::now();
        let mut p = Policy::new(&c, &host(0, 20 * G));
        assert_eq!(p.target, 4 * G);
        // Others took memory: 3 GiB left, so the tier (holding 1 GiB) may take 1 GiB more.
        assert_eq!(p.step(&c, &host(G, 3 * G), t), Change::Fit);
        assert_eq!((p.target, p.last_shrink), (2 * G, None));
        // In the low band it may not grow at all.
        assert_eq!(p.step(&c, &host(G, 3 * G / 2), t), Change::Fit);
        assert_eq!(p.target, G);
        assert_eq!(p.step(&c, &host(G, 3 * G / 2), t), Change::Hold);
    }

    #[test]
    fn low_band_holds_unless_psi_stalls() {
        let c = cfg();
        let t = Instant::now();
        let mut p = Policy::new(&c, &host(0, 20 * G));
        let mut s = host(4 * G, 3 * G / 2);
        assert_eq!(p.step(&c, &s, t), Change::Hold);
        s.psi_some_pct = Some(25.0);
        assert_eq!(p.step(&c, &s, t), Change::Shrink(Reason::Psi));
        assert_eq!(p.target, 4 * G - G / 2);
        // Plenty of memory: a stall elsewhere (another cgroup at its limit) is no reason to
        // shrink, but no time to grow either.
        let mut p = Policy::new(&c, &host(G, 20 * G));
        p.target = G;
        let mut s = host(G, 20 * G);
        s.psi_event = true;
        assert_eq!(p.step(&c, &s, t), Change::Hold);
        assert_eq!(p.target, G);
    }

    #[test]
    fn cgroup_room_is_a_signal_with_its_own_floor() {
        let c = cfg();
        let t = Instant::now();
        // A 1 GiB cgroup: its floor is 128 MiB, not the host's 1 GiB.
        let s = Sample {
            used: 0,
            mem_available: Some(20 * G),
            cgroup: Some(CgroupRoom {
                limit: G,
                room: G - 20 * M,
            }),
            ..Sample::default()
        };
        let mut p = Policy::new(&c, &s);
        assert_eq!(p.target, G - 20 * M - 256 * M);
        // Filled, and the daemon's other memory grew by 200 MiB: 72 MiB under the floor.
        let s = Sample {
            used: p.target,
            cgroup: Some(CgroupRoom {
                limit: G,
                room: 56 * M,
            }),
            ..s
        };
        assert_eq!(p.step(&c, &s, t), Change::Shrink(Reason::Cgroup));
        let base = G - 276 * M;
        assert_eq!(p.target, base - 72 * M - base / 16);
    }

    #[test]
    fn limits_changed_at_run_time_are_obeyed() {
        let mut c = cfg();
        let t = Instant::now();
        let mut p = Policy::new(&c, &host(0, 20 * G));
        c.max = G;
        assert_eq!(
            p.step(&c, &host(0, 20 * G), t),
            Change::Shrink(Reason::Limits)
        );
        assert_eq!(p.target, G);
        c.min = 2 * G;
        c.max = 3 * G;
        p.step(&c, &host(0, 0), t);
        assert_eq!(p.target, 2 * G);
    }
}
