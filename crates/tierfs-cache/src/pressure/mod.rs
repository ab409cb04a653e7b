//! The memory-pressure monitor: sets the RAM tier's target between `ram.min` and `ram.max`
//! from what the host says, so that tierfs and memory-hungry programs share one machine
//! (seed 004, FreeBSD's dynamic buffer cache: buffer memory allocated when I/O wants it and
//! reclaimed when programs do; ZFS's ARC and its `arc_sys_free` for the free floor).
//!
//! Signals, read every `interval` (100 ms) on one thread:
//! - the host's MemAvailable against `ram.free_floor`;
//! - the daemon's memory cgroup (v1 or v2, every level up to the root): its limit minus the
//!   usage that is not reclaimable file cache, against a floor of its own;
//! - PSI (the cgroup's `memory.pressure`, else /proc/pressure/memory): the share of time tasks
//!   stalled on memory, with a poll trigger that wakes the thread early where permitted.
//!
//! The decision is in [`policy`]. After a shrink the evicted blocks go back to the allocator
//! and, with glibc, `malloc_trim` gives the pages back to the kernel, so RSS really falls.

mod cgroup;
mod host;
mod policy;
mod psi;

pub use host::{one_malloc_arena, self_rss};

use crate::RamCache;
use parking_lot::Mutex;
use policy::{Change, Policy, Reason, Sample};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tunables of the monitor (docs/tunables.md, `ram.*`).
#[derive(Clone, Debug)]
pub struct PressureConfig {
    /// The target never goes below this (`ram.min`).
    pub min: u64,
    /// Nor above this (`ram.max`).
    pub max: u64,
    /// MemAvailable the monitor keeps free on the host (`ram.free_floor`).
    pub free_floor: u64,
    /// No growth for this long after a shrink (`ram.grow_delay`).
    pub grow_delay: Duration,
    /// PSI stall share, percent, that counts as pressure (`ram.psi_pct`); 0 ignores PSI.
    pub psi_pct: u8,
    /// How often the signals are read.
    pub interval: Duration,
}

impl Default for PressureConfig {
    fn default() -> Self {
        PressureConfig {
            min: 64 << 20,
            max: 1 << 30,
            free_floor: 512 << 20,
            grow_delay: Duration::from_secs(5),
            psi_pct: 10,
            interval: Duration::from_millis(100),
        }
    }
}

/// The `pressure` section of `tierfs stats`.
#[derive(Default, Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PressureStats {
    /// False with `ram.pressure=off`: the tier is fixed at `ram.max`.
    pub enabled: bool,
    /// The signals in use: `mem_available`, `cgroup-v1` / `cgroup-v2`, `psi` or
    /// `psi-trigger` (PSI with a poll trigger).
    pub signals: String,
    /// The RAM tier's cap now, and what it holds (FreeBSD's `bufspace` for the tier).
    pub target: u64,
    pub size: u64,
    pub min: u64,
    pub max: u64,
    pub free_floor: u64,
    /// Times the monitor lowered / raised the target, and by how much in all.
    pub shrink_events: u64,
    pub grow_events: u64,
    pub shrunk_bytes: u64,
    pub grown_bytes: u64,
    /// What caused the last change: mem_available, cgroup, psi, grow, limits.
    pub last_change: String,
    /// Milliseconds before the target may grow again (`ram.grow_delay` after a shrink).
    pub grow_wait_ms: u64,
    pub mem_total: u64,
    pub mem_available: u64,
    /// The daemon's memory cgroup directory, and the tightest limit above it (0: none).
    pub cgroup: String,
    pub cgroup_limit: u64,
    pub cgroup_usage: u64,
    /// Reclaimable file cache charged to that cgroup.
    pub cgroup_file: u64,
    /// What more that cgroup may take: limit - (usage - file).
    pub cgroup_room: u64,
    /// The PSI file read, the stall share in the last interval, and trigger wake-ups.
    pub psi_source: String,
    pub psi_stall_pct: f64,
    pub psi_events: u64,
    /// malloc_trim calls after shrinks (memory handed back to the kernel) and their time.
    pub trims: u64,
    pub trim_us: u64,
    /// Resident set size of the daemon.
    pub rss: u64,
    /// Data memory tierfs holds: the RAM tier plus `wired` (FreeBSD `bufspace`).
    pub bufspace: u64,
    /// The part of it that cannot be dropped now: in-flight backing reads, blocks queued for
    /// the SSD tier, dirty write-back data (FreeBSD `bufwiredspace`). Filled in by the
    /// filesystem core, which knows these.
    pub wired: u64,
    /// `wired` by kind: backing-read buffers in flight, the SSD admission queue, dirty data.
    pub wired_fetch: u64,
    pub wired_ssd_queue: u64,
    pub wired_dirty: u64,
}

struct State {
    cfg: PressureConfig,
    policy: Policy,
    sample: Sample,
    signals: String,
    mem_total: u64,
    cgroup: Option<cgroup::Cgroup>,
    reading: Option<cgroup::Reading>,
    psi_source: String,
    shrink_events: u64,
    grow_events: u64,
    shrunk_bytes: u64,
    grown_bytes: u64,
    last_change: Option<Reason>,
    psi_events: u64,
    trims: u64,
    trim_us: u64,
}

struct Shared {
    ram: Arc<RamCache>,
    enabled: bool,
    stop: AtomicBool,
    st: Mutex<State>,
}

/// Owns the monitor thread (stopped when this is dropped).
pub struct PressureMonitor {
    sh: Arc<Shared>,
}

/// How often the cgroup is looked up again (the daemon may be moved into another).
const REDISCOVER: Duration = Duration::from_secs(1);

fn signals_of(s: &Sample, cg: Option<&cgroup::Cgroup>, psi: Option<&psi::Psi>) -> String {
    let mut v = Vec::new();
    if s.mem_available.is_some() {
        v.push("mem_available");
    }
    match cg.map(|c| c.version) {
        Some(1) => v.push("cgroup-v1"),
        Some(_) => v.push("cgroup-v2"),
        None => {}
    }
    match psi {
        Some(p) if p.has_trigger() => v.push("psi-trigger"),
        Some(_) => v.push("psi"),
        None => {}
    }
    v.join(",")
}

fn take_sample(
    ram: &RamCache,
    cg: Option<&cgroup::Cgroup>,
    psi: Option<&mut psi::Psi>,
    psi_event: bool,
) -> (Sample, u64, Option<cgroup::Reading>) {
    let (total, avail) = host::meminfo();
    let mem_total = total.unwrap_or(u64::MAX);
    let reading = cg.and_then(|c| c.read(mem_total));
    let sample = Sample {
        used: ram.used_bytes(),
        mem_available: avail,
        cgroup: reading.as_ref().map(|r| policy::CgroupRoom {
            limit: r.limit,
            room: r.room,
        }),
        psi_some_pct: psi.and_then(|p| p.stall_pct()),
        psi_event,
    };
    (sample, total.unwrap_or(0), reading)
}

impl PressureMonitor {
    /// Starts the monitor over `ram`: the first target is set before this returns.
    pub fn start(ram: Arc<RamCache>, cfg: PressureConfig) -> std::io::Result<PressureMonitor> {
        let cg = cgroup::Cgroup::discover();
        let mut psi = if cfg.psi_pct > 0 {
            psi::Psi::open(cfg.psi_pct)
        } else {
            None
        };
        let (sample, mem_total, reading) = take_sample(&ram, cg.as_ref(), psi.as_mut(), false);
        let policy = Policy::new(&cfg, &sample);
        ram.set_capacity(policy.target);
        let st = State {
            signals: signals_of(&sample, cg.as_ref(), psi.as_ref()),
            psi_source: psi
                .as_ref()
                .map(|p| p.path.display().to_string())
                .unwrap_or_default(),
            cfg,
            policy,
            sample,
            mem_total,
            cgroup: cg,
            reading,
            ..State::empty()
        };
        tracing::info!(
            "memory pressure monitor: signals {}, ram target {} bytes (min {}, max {}), free floor {}",
            st.signals,
            st.policy.target,
            st.cfg.min,
            st.cfg.max,
            st.cfg.free_floor
        );
        let sh = Arc::new(Shared {
            ram,
            enabled: true,
            stop: AtomicBool::new(false),
            st: Mutex::new(st),
        });
        let thread_sh = sh.clone();
        std::thread::Builder::new()
            .name("tierfs-pressure".into())
            .spawn(move || run(&thread_sh, psi))?;
        Ok(PressureMonitor { sh })
    }

    /// No monitor (`ram.pressure=off`): the tier is fixed at `ram.max`, as before the
    /// monitor existed; limits may still be changed at run time.
    pub fn fixed(ram: Arc<RamCache>, cfg: PressureConfig) -> PressureMonitor {
        ram.set_capacity(cfg.max);
        let (total, avail) = host::meminfo();
        let st = State {
            policy: Policy {
                target: cfg.max,
                last_shrink: None,
            },
            sample: Sample {
                mem_available: avail,
                ..Sample::default()
            },
            mem_total: total.unwrap_or(0),
            signals: "off".into(),
            cfg,
            ..State::empty()
        };
        PressureMonitor {
            sh: Arc::new(Shared {
                ram,
                enabled: false,
                stop: AtomicBool::new(true),
                st: Mutex::new(st),
            }),
        }
    }

    /// Changes `ram.min` and/or `ram.max` at run time (for `tierfs ctl set`); the target
    /// is clamped into the new range at once. Returns the range now in force.
    pub fn set_limits(&self, min: Option<u64>, max: Option<u64>) -> Result<(u64, u64), String> {
        let mut st = self.sh.st.lock();
        let (lo, hi) = (min.unwrap_or(st.cfg.min), max.unwrap_or(st.cfg.max));
        if lo > hi {
            return Err(format!("ram.min ({lo}) must not exceed ram.max ({hi})"));
        }
        st.cfg.min = lo;
        st.cfg.max = hi;
        let old = st.policy.target;
        let new = if self.sh.enabled {
            old.clamp(lo, hi)
        } else {
            hi
        };
        st.policy.target = new;
        if new != old {
            // Not a shrink or grow event: those count the monitor's own decisions.
            st.last_change = Some(Reason::Limits);
        }
        // Under the lock: the monitor thread sets the capacity under it too, so the last
        // writer's target is the one in force.
        self.sh.ram.set_capacity(new);
        Ok((lo, hi))
    }

    /// Changes `ram.free_floor` at run time.
    pub fn set_free_floor(&self, bytes: u64) {
        self.sh.st.lock().cfg.free_floor = bytes;
    }

    pub fn config(&self) -> PressureConfig {
        self.sh.st.lock().cfg.clone()
    }

    pub fn stats(&self) -> PressureStats {
        let ram = self.sh.ram.stats();
        let st = self.sh.st.lock();
        let r = st.reading.clone().unwrap_or_default();
        PressureStats {
            enabled: self.sh.enabled,
            signals: st.signals.clone(),
            target: st.policy.target,
            size: ram.bytes,
            min: st.cfg.min,
            max: st.cfg.max,
            free_floor: st.cfg.free_floor,
            shrink_events: st.shrink_events,
            grow_events: st.grow_events,
            shrunk_bytes: st.shrunk_bytes,
            grown_bytes: st.grown_bytes,
            last_change: st.last_change.map_or("", Reason::name).to_string(),
            grow_wait_ms: st.policy.grow_wait(&st.cfg, Instant::now()).as_millis() as u64,
            mem_total: st.mem_total,
            mem_available: st.sample.mem_available.unwrap_or(0),
            cgroup: st
                .cgroup
                .as_ref()
                .map(|c| c.dir.display().to_string())
                .unwrap_or_default(),
            cgroup_limit: r.limit,
            cgroup_usage: r.usage,
            cgroup_file: r.file,
            cgroup_room: r.room,
            psi_source: st.psi_source.clone(),
            psi_stall_pct: st.sample.psi_some_pct.unwrap_or(0.0),
            psi_events: st.psi_events,
            trims: st.trims,
            trim_us: st.trim_us,
            rss: self_rss(),
            bufspace: ram.bytes,
            ..PressureStats::default()
        }
    }
}

impl Drop for PressureMonitor {
    fn drop(&mut self) {
        self.sh.stop.store(true, Relaxed);
    }
}

impl State {
    fn empty() -> State {
        State {
            cfg: PressureConfig::default(),
            policy: Policy {
                target: 0,
                last_shrink: None,
            },
            sample: Sample::default(),
            signals: String::new(),
            mem_total: 0,
            cgroup: None,
            reading: None,
            psi_source: String::new(),
            shrink_events: 0,
            grow_events: 0,
            shrunk_bytes: 0,
            grown_bytes: 0,
            last_change: None,
            psi_events: 0,
            trims: 0,
            trim_us: 0,
        }
    }

    fn note(&mut self, c: Change, old: u64, new: u64) {
        match c {
            Change::Hold | Change::Fit => {}
            Change::Shrink(why) => {
                self.shrink_events += 1;
                self.shrunk_bytes += old.saturating_sub(new);
                self.last_change = Some(why);
            }
            Change::Grow => {
                self.grow_events += 1;
                self.grown_bytes += new.saturating_sub(old);
                self.last_change = Some(Reason::Grow);
            }
        }
    }
}

/// Memory the process may hold beyond the RAM tier's blocks, grown since the last trim,
/// before freed memory is handed back even without a shrink: a tier that churns (evicting
/// and inserting at its cap) frees blocks in one arena and allocates in another, and glibc
/// keeps what was freed, so RSS can grow well past the tier with no shrink to trigger a trim.
fn trim_slack(used: u64) -> u64 {
    (used / 16).max(64 << 20)
}

fn run(sh: &Shared, mut psi: Option<psi::Psi>) {
    let mut discovered = Instant::now();
    // Ticks left on which freed memory is handed back to the kernel: the one of a shrink,
    // and the next, for blocks that replies in flight still held.
    let mut trim_ticks = 0u32;
    let mut last_trim = Instant::now();
    // RSS beyond the tier's blocks just after the last trim.
    let mut overhead = self_rss().saturating_sub(sh.ram.used_bytes());
    while !sh.stop.load(Relaxed) {
        let interval = sh.st.lock().cfg.interval;
        let fired = match psi.as_mut() {
            Some(p) => p.wait(interval),
            None => {
                std::thread::sleep(interval);
                false
            }
        };
        if sh.stop.load(Relaxed) {
            break;
        }
        if discovered.elapsed() >= REDISCOVER {
            discovered = Instant::now();
            let cg = cgroup::Cgroup::discover();
            let mut st = sh.st.lock();
            if cg != st.cgroup {
                tracing::info!(
                    "memory pressure monitor: cgroup now {:?}",
                    cg.as_ref().map(|c| &c.dir)
                );
                st.cgroup = cg;
            }
        }
        let cg = sh.st.lock().cgroup.clone();
        let (sample, mem_total, reading) = take_sample(&sh.ram, cg.as_ref(), psi.as_mut(), fired);
        {
            let mut st = sh.st.lock();
            let st = &mut *st;
            let old = st.policy.target;
            let change = st.policy.step(&st.cfg, &sample, Instant::now());
            st.note(change, old, st.policy.target);
            if fired {
                st.psi_events += 1;
            }
            if let Change::Shrink(why) = change {
                tracing::debug!(
                    "memory pressure ({}): ram target {old} -> {} bytes (holds {}, available {:?}, cgroup room {:?})",
                    why.name(),
                    st.policy.target,
                    sample.used,
                    sample.mem_available,
                    sample.cgroup.map(|c| c.room)
                );
                trim_ticks = 2;
            }
            st.signals = signals_of(&sample, st.cgroup.as_ref(), psi.as_ref());
            st.sample = sample;
            st.mem_total = mem_total;
            st.reading = reading;
            if sh.ram.capacity() != st.policy.target {
                sh.ram.set_capacity(st.policy.target);
            }
        }
        let used = sh.ram.used_bytes();
        let grown = self_rss().saturating_sub(used) > overhead + trim_slack(used)
            && last_trim.elapsed() >= Duration::from_secs(1);
        if trim_ticks > 0 || grown {
            trim_ticks = trim_ticks.saturating_sub(1);
            let t = Instant::now();
            host::release_free_memory();
            last_trim = Instant::now();
            overhead = self_rss().saturating_sub(sh.ram.used_bytes());
            let mut st = sh.st.lock();
            st.trims += 1;
            st.trim_us += t.elapsed().as_micros() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockKey;
    use bytes::Bytes;

    const M: u64 = 1 << 20;

    fn filled(bytes: u64) -> Arc<RamCache> {
        let ram = Arc::new(RamCache::new(bytes));
        for idx in 0..bytes / M {
            let key = BlockKey { gen: 1, idx };
            ram.insert(key, Bytes::from(vec![1u8; M as usize]));
        }
        ram
    }

    #[test]
    fn an_unreachable_floor_drives_the_tier_to_min_on_the_host() {
        let ram = filled(64 * M);
        let cfg = PressureConfig {
            min: 8 * M,
            max: 64 * M,
            // More than any host has free: a permanent deficit.
            free_floor: 1 << 50,
            interval: Duration::from_millis(10),
            ..PressureConfig::default()
        };
        let mon = PressureMonitor::start(ram.clone(), cfg).unwrap();
        let st = mon.stats();
        assert!(st.enabled);
        assert!(st.signals.contains("mem_available"), "{}", st.signals);
        // The first target is set at start: what fits is nothing, so ram.min.
        assert_eq!((st.target, ram.capacity()), (8 * M, 8 * M));
        assert!(ram.used_bytes() <= 8 * M);
        // Limits change at run time and are checked.
        assert!(mon.set_limits(Some(32 * M), Some(16 * M)).is_err());
        assert_eq!(
            mon.set_limits(Some(16 * M), None).unwrap(),
            (16 * M, 64 * M)
        );
        assert_eq!(ram.capacity(), 16 * M);
        // The thread keeps it there and never grows it.
        std::thread::sleep(Duration::from_millis(100));
        let st = mon.stats();
        assert_eq!((st.target, st.min, st.grow_events), (16 * M, 16 * M, 0));
        assert!(st.rss > 0);
    }

    #[test]
    fn plenty_of_memory_leaves_the_tier_at_max_and_off_means_fixed() {
        let ram = filled(16 * M);
        let cfg = PressureConfig {
            min: 4 * M,
            max: 16 * M,
            free_floor: 0,
            ..PressureConfig::default()
        };
        let mon = PressureMonitor::start(ram.clone(), cfg.clone()).unwrap();
        assert_eq!(mon.stats().target, 16 * M);
        assert_eq!(ram.used_bytes(), 16 * M);
        drop(mon);
        let fixed = PressureMonitor::fixed(ram.clone(), cfg);
        let st = fixed.stats();
        assert_eq!(
            (st.enabled, st.signals.as_str(), st.target),
            (false, "off", 16 * M)
        );
        fixed.set_limits(None, Some(8 * M)).unwrap();
        assert_eq!(ram.capacity(), 8 * M);
        assert!(ram.used_bytes() <= 8 * M);
    }
}
