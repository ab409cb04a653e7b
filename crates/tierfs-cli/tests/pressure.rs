//! The memory-pressure monitor against real memory pressure (issue 5), through real mounts of
//! the `tierfs` binary:
//! - a hog: with a hot RAM tier of GiBs, a second process allocates nearly all the memory the
//!   host has available; the daemon's RSS falls to near `ram.min` within 2 s of the hog
//!   having its memory, nothing is OOM-killed, and once the hog exits the target grows back and
//!   the tier refills;
//! - a memory cgroup: the daemon, moved into a cgroup with a limit well below `ram.max`, reads
//!   twice its limit and stays within it (no OOM kill in the cgroup, the RAM tier used).
//!
//! Both print their timeline (run with `--nocapture`). With `TIERFS_PRESSURE_OUT=DIR` each
//! also writes it as JSON (`DIR/hog.json`, `DIR/cgroup.json`) for `bench/pressure`, which
//! plots it. `TIERFS_PRESSURE_HOT=BYTES` changes the hot set (default 3 GiB, less on a small
//! host). The tests take one lock: they must not press on each other.
//!
//! Data lives under /var/tmp (a real disk); files age past `RACY_WINDOW` before they are read
//! (younger blocks are not cached). Reads through the mount use O_DIRECT so that they reach
//! tierfs rather than the kernel's page cache of the mount.

mod common;
use common::hog::{self, Hog};
use common::memory::{meminfo, mib, num, oom_kills, proc_status, socket_stats};
use common::*;
use serde_json::{json, Value};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const TMP: &str = "/var/tmp";
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const FILE: u64 = 256 * MIB;
const CHUNK: usize = 1 << 20;
const PAGE: usize = 4096;
const RAM_MIN: u64 = 64 * MIB;
const FLOOR: u64 = GIB;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Data: every 4 KiB page starts with a stamp of (file, offset), so a read can be checked
// without keeping GiBs of expected data.
// ---------------------------------------------------------------------------------------------

fn stamp(file: usize, off: u64) -> u64 {
    mix(((file as u64) << 40) ^ off)
}

fn make_files(dir: &Path, count: usize) -> Vec<PathBuf> {
    let mut buf = vec![0xa5u8; CHUNK];
    (0..count)
        .map(|i| {
            let p = dir.join(format!("hot{i:03}"));
            let f = std::fs::File::create(&p).unwrap();
            let mut off = 0;
            while off < FILE {
                for pg in (0..CHUNK).step_by(PAGE) {
                    buf[pg..pg + 8].copy_from_slice(&stamp(i, off + pg as u64).to_le_bytes());
                }
                f.write_all_at(&buf, off).unwrap();
                off += CHUNK as u64;
            }
            p
        })
        .collect()
}

/// Reads every file through the mount with O_DIRECT and checks every page's stamp.
fn read_all(mnt: &Path, files: &[PathBuf]) {
    let mut raw = vec![0u8; CHUNK + PAGE];
    let a = raw.as_ptr().align_offset(PAGE);
    let buf = &mut raw[a..a + CHUNK];
    for (i, p) in files.iter().enumerate() {
        let path = mnt.join(p.file_name().unwrap());
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let mut off = 0u64;
        while off < FILE {
            let n = f.read_at(buf, off).unwrap();
            assert_eq!(n, CHUNK, "short read of {} at {off}", path.display());
            for pg in (0..n).step_by(PAGE) {
                let got = u64::from_le_bytes(buf[pg..pg + 8].try_into().unwrap());
                assert_eq!(
                    got,
                    stamp(i, off + pg as u64),
                    "{} at {off}",
                    path.display()
                );
            }
            off += n as u64;
        }
    }
}

fn settle() {
    std::thread::sleep(tierfs_fs::RACY_WINDOW + Duration::from_millis(150));
}

// ---------------------------------------------------------------------------------------------
// Timeline: sampled every 100 ms while a scenario runs
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct Row {
    t: f64,
    rss: u64,
    target: u64,
    size: u64,
    shrinks: u64,
    grows: u64,
    avail: u64,
    hog: u64,
    cg_usage: u64,
    psi: f64,
}

struct Sampler {
    stop: Arc<AtomicBool>,
    rows: Arc<Mutex<Vec<Row>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    t0: Instant,
}

impl Sampler {
    /// Samples the daemon `pid` (stats from `cache`), the hog whose pid is in `hog`, and
    /// the cgroup usage file `cg_usage`, if given.
    fn start(
        pid: i32,
        cache: PathBuf,
        hog: Arc<Mutex<Option<i32>>>,
        cg_usage: Option<PathBuf>,
    ) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let rows = Arc::new(Mutex::new(Vec::new()));
        let t0 = Instant::now();
        let (s, r) = (stop.clone(), rows.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(SeqCst) {
                let next = Instant::now() + Duration::from_millis(100);
                let st = socket_stats(&cache).unwrap_or(Value::Null);
                let p = &st["pressure"];
                let row = Row {
                    t: t0.elapsed().as_secs_f64(),
                    rss: proc_status(pid, "VmRSS").unwrap_or(0),
                    target: p["target"].as_u64().unwrap_or(0),
                    size: p["size"].as_u64().unwrap_or(0),
                    shrinks: p["shrink_events"].as_u64().unwrap_or(0),
                    grows: p["grow_events"].as_u64().unwrap_or(0),
                    avail: meminfo("MemAvailable"),
                    hog: hog
                        .lock()
                        .unwrap()
                        .and_then(|h| proc_status(h, "VmRSS"))
                        .unwrap_or(0),
                    cg_usage: cg_usage
                        .as_ref()
                        .and_then(|f| std::fs::read_to_string(f).ok())
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0),
                    psi: p["psi_stall_pct"].as_f64().unwrap_or(0.0),
                };
                r.lock().unwrap().push(row);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        Sampler {
            stop,
            rows,
            thread: Some(thread),
            t0,
        }
    }

    fn finish(mut self) -> Vec<Row> {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        std::mem::take(&mut *self.rows.lock().unwrap())
    }
}

fn print_timeline(title: &str, rows: &[Row], marks: &[(&str, f64)]) {
    println!("{title}: timeline (MiB; every 0.5 s and at every target change)");
    println!(
        "{:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7} {:>7} {:>6}  event",
        "t s", "rss", "target", "size", "hog", "avail", "cg_use", "shrinks", "grows", "psi%"
    );
    let mut last_t = f64::MIN;
    let mut last_target = u64::MAX;
    let mut pending: Vec<&(&str, f64)> = marks.iter().collect();
    pending.sort_by(|a, b| a.1.total_cmp(&b.1));
    for r in rows {
        let mut ev = Vec::new();
        while pending.first().is_some_and(|m| m.1 <= r.t) {
            ev.push(pending.remove(0).0);
        }
        if r.t - last_t < 0.5 && r.target == last_target && ev.is_empty() {
            continue;
        }
        last_t = r.t;
        last_target = r.target;
        println!(
            "{:>6.1} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>9.0} {:>8.0} {:>7} {:>7} {:>6.1}  {}",
            r.t,
            mib(r.rss),
            mib(r.target),
            mib(r.size),
            mib(r.hog),
            mib(r.avail),
            mib(r.cg_usage),
            r.shrinks,
            r.grows,
            r.psi,
            ev.join(", ")
        );
    }
}

fn write_json(name: &str, v: Value) {
    if let Some(dir) = std::env::var_os("TIERFS_PRESSURE_OUT") {
        let p = Path::new(&dir).join(name);
        std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        println!("timeline written to {}", p.display());
    }
}

fn rows_json(rows: &[Row]) -> Value {
    rows.iter()
        .map(|r| {
            json!({"t": r.t, "rss": r.rss, "target": r.target, "size": r.size, "hog": r.hog,
                   "avail": r.avail, "cg_usage": r.cg_usage, "shrinks": r.shrinks,
                   "grows": r.grows, "psi": r.psi})
        })
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Instant {
    let deadline = Instant::now() + limit;
    loop {
        if ok() {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// A hog takes the host's memory
// ---------------------------------------------------------------------------------------------

const HOG_TEST: &str = "ram_tier_gives_memory_back_to_a_hog";

/// The hot set: 3 GiB, or a fifth of what is available on a smaller host, in whole files.
fn hot_bytes() -> u64 {
    let want = std::env::var("TIERFS_PRESSURE_HOT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3 * GIB)
        .min(meminfo("MemAvailable") / 5);
    (want / FILE).max(2) * FILE
}

#[test]
fn ram_tier_gives_memory_back_to_a_hog() {
    hog::run_if_child();
    let _serial = serial();
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(360), vec![mnt.clone()], move || {
        let hot = hot_bytes();
        let files = make_files(&m.backing, (hot / FILE) as usize);
        settle();
        let ram_max = hot + GIB;
        let opts = [
            format!("ram.max={ram_max}"),
            format!("ram.min={RAM_MIN}"),
            format!("ram.free_floor={FLOOR}"),
            "ssd.enable=false".to_string(),
        ];
        m.mount(&opts.iter().map(String::as_str).collect::<Vec<_>>());
        let pid = m.daemon_pid().expect("daemon pid");
        let rss0 = proc_status(pid, "VmRSS").unwrap();
        let t = Instant::now();
        read_all(&mnt, &files);
        let st = m.stats();
        println!(
            "hog: read a hot set of {:.0} MiB in {:.1} s; RAM tier {:.0} MiB (target {:.0}), daemon RSS {:.0} MiB (before: {:.0}); signals {}",
            mib(hot),
            t.elapsed().as_secs_f64(),
            mib(num(&st, "ram.bytes")),
            mib(num(&st, "pressure.target")),
            mib(proc_status(pid, "VmRSS").unwrap()),
            mib(rss0),
            st["pressure"]["signals"]
        );
        assert!(
            num(&st, "ram.bytes") >= hot / 100 * 95,
            "the RAM tier did not take the hot set: {st}"
        );

        let oom0 = oom_kills();
        let hog_pid = Arc::new(Mutex::new(None));
        let sampler = Sampler::start(pid, m.cache.clone(), hog_pid.clone(), None);
        let t0 = sampler.t0;
        std::thread::sleep(Duration::from_millis(300));
        // Everything available now, plus what tierfs can give back, minus half the floor:
        // satisfied only if tierfs goes down to ram.min, and then the host still has half
        // the floor. The hog never takes the host below 256 MiB available.
        let avail = meminfo("MemAvailable");
        let target = avail + num(&m.stats(), "ram.bytes") - RAM_MIN - FLOOR / 2;
        let safety = 256 * MIB;
        let t_hog = Instant::now();
        let mut hog = Hog::start(HOG_TEST, target, safety, FLOOR / 2);
        *hog_pid.lock().unwrap() = Some(hog.pid);
        println!(
            "hog: pid {}, to take {:.0} MiB ({:.0} MiB available)",
            hog.pid,
            mib(target),
            mib(avail)
        );
        // How fast a host hands out fresh memory varies (a VM faulting it in from its
        // hypervisor took 250-400 MB/s here): wait while the hog still makes progress.
        let mut progress = (0u64, Instant::now());
        wait_for("the hog's memory", Duration::from_secs(200), || {
            let st = hog.state();
            if st.held > progress.0 {
                progress = (st.held, Instant::now());
            }
            assert!(
                progress.1.elapsed() < Duration::from_secs(30),
                "the hog took no memory for 30 s (holds {:.0} MiB)",
                mib(st.held)
            );
            st.done.is_some()
        });
        let hs = hog.state();
        let t_done = hs.done.unwrap();
        // Hold the pressure a little, then let go.
        std::thread::sleep(Duration::from_millis(2500));
        let during = m.stats();
        let hog_end = hog.state();
        let t_release = Instant::now();
        let status = hog.stop();
        let t_exit = Instant::now();
        *hog_pid.lock().unwrap() = None;
        // The target grows back after ram.grow_delay (5 s), then the tier refills on reads.
        let t_target = wait_for("the target to grow back", Duration::from_secs(30), || {
            socket_stats(&m.cache).is_some_and(|s| num(&s, "pressure.target") >= hot)
        });
        drop_caches();
        read_all(&mnt, &files);
        let t_refilled = Instant::now();
        std::thread::sleep(Duration::from_millis(300));
        let after = m.stats();
        let rows = sampler.finish();
        let oom1 = oom_kills();

        let threshold = rss0 + RAM_MIN + 128 * MIB;
        let s = |i: Instant| i.saturating_duration_since(t0).as_secs_f64();
        let (at_hog, at_done) = (s(t_hog), s(t_done));
        let first_shrink = rows
            .iter()
            .find(|r| r.shrinks > rows[0].shrinks)
            .map(|r| r.t);
        let low = rows
            .iter()
            .find(|r| r.t >= at_hog && r.rss > 0 && r.rss <= threshold)
            .map(|r| r.t);
        let peak_hog = rows.iter().map(|r| r.hog).max().unwrap_or(0);
        let marks = [
            ("hog starts", at_hog),
            ("first shrink", first_shrink.unwrap_or(f64::NAN)),
            ("rss near ram.min", low.unwrap_or(f64::NAN)),
            ("hog has its memory", at_done),
            ("hog told to exit", s(t_release)),
            ("hog gone", s(t_exit)),
            ("target grown back", s(t_target)),
            ("tier refilled", s(t_refilled)),
        ];
        print_timeline("hog", &rows, &marks);
        println!(
            "hog: took {:.0} MiB (peak RSS {:.0} MiB), waited {} ms for memory; while holding took {:.0} MiB more (others freed memory) and handed back {:.0} MiB; exit {status}",
            mib(hs.held),
            mib(peak_hog),
            hs.waited_ms,
            mib(hog_end.topped),
            mib(hog_end.released)
        );
        println!(
            "hog: daemon RSS {:.0} -> near ram.min ({:.0} MiB threshold) at {:.1} s, {:+.1} s from the hog having its memory; shrink events {}, trims {}; OOM kills {} -> {}",
            mib(rows.iter().find(|r| r.t >= at_hog).map_or(0, |r| r.rss)),
            mib(threshold),
            low.unwrap_or(f64::NAN),
            low.unwrap_or(f64::NAN) - at_done,
            num(&during, "pressure.shrink_events"),
            num(&during, "pressure.trims"),
            oom0,
            oom1
        );
        println!(
            "hog: after: target {:.0} MiB, RAM tier {:.0} MiB, daemon RSS {:.0} MiB, grow events {}",
            mib(num(&after, "pressure.target")),
            mib(num(&after, "ram.bytes")),
            mib(proc_status(pid, "VmRSS").unwrap_or(0)),
            num(&after, "pressure.grow_events")
        );
        write_json(
            "hog.json",
            json!({
                "hot": hot, "ram_min": RAM_MIN, "ram_max": ram_max, "free_floor": FLOOR,
                "rss_threshold": threshold, "hog_target": target,
                "signals": during["pressure"]["signals"],
                "marks": marks.iter().map(|(k, v)| json!({"label": k, "t": v})).collect::<Vec<_>>(),
                "hog_waited_ms": hs.waited_ms, "hog_released": hog_end.released,
                "hog_topped": hog_end.topped,
                "oom_kills": oom1 - oom0,
                "rows": rows_json(&rows),
            }),
        );

        assert!(
            !hs.stuck,
            "the hog could not get its memory: tierfs did not give it back"
        );
        assert!(status.success(), "the hog did not exit cleanly: {status}");
        assert_eq!(oom1, oom0, "a process was OOM-killed");
        let low = low.expect("the daemon's RSS never fell near ram.min");
        assert!(
            low <= at_done + 2.0,
            "the daemon's RSS fell near ram.min only {:.1} s after the hog had its memory",
            low - at_done
        );
        assert!(num(&during, "pressure.shrink_events") >= 1);
        // At ram.min, or close: with no deficit left (other processes may free memory
        // meanwhile), the last steps are PSI's eighths.
        assert!(
            num(&during, "pressure.target") <= RAM_MIN + 128 * MIB,
            "target not near ram.min: {during}"
        );
        assert!(num(&after, "pressure.grow_events") >= 1);
        assert!(
            num(&after, "ram.bytes") >= hot / 100 * 95,
            "the RAM tier did not refill: {after}"
        );
        m.unmount_and_wait();
    });
}

// ---------------------------------------------------------------------------------------------
// A memory cgroup with a limit
// ---------------------------------------------------------------------------------------------

#[test]
fn ram_tier_stays_within_a_memory_cgroup() {
    const LIMIT: u64 = 768 * MIB;
    const FILES: usize = 8;
    let _serial = serial();
    let Some(cg) = common::cgroup::TestCgroup::create("tierfs-pressure", LIMIT) else {
        skip(
            Skip::Missing,
            "no memory cgroup can be made here (needs root and a memory controller)",
        );
        return;
    };
    let cg = Arc::new(cg);
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    let cgroup = cg.clone();
    with_timeout(Duration::from_secs(240), vec![mnt.clone()], move || {
        let cg = cgroup;
        let files = make_files(&m.backing, FILES);
        let data = FILES as u64 * FILE;
        settle();
        // ram.max over five times the limit: only the monitor keeps the tier inside it.
        m.mount(&["ram.max=4G", "ssd.enable=false"]);
        let pid = m.daemon_pid().expect("daemon pid");
        let oom0 = oom_kills();
        let before = m.stats();
        cg.add(pid);
        // The monitor looks its cgroup up again every second.
        let dir = cg.dir.display().to_string();
        wait_for(
            "the monitor to see the cgroup",
            Duration::from_secs(5),
            || {
                socket_stats(&m.cache).is_some_and(|s| {
                    s["pressure"]["cgroup"] == dir.as_str()
                        && num(&s, "pressure.cgroup_limit") == LIMIT
                })
            },
        );
        // The backing files' pages were charged to this test's cgroup when it wrote them:
        // dropped (written first: dirty pages are not dropped), the daemon's reads bring them
        // back charged to its own, as in real use.
        unsafe { libc::sync() };
        drop_caches();
        let sampler = Sampler::start(
            pid,
            m.cache.clone(),
            Arc::new(Mutex::new(None)),
            Some(cg.usage_file()),
        );
        let t0 = sampler.t0;
        let t = Instant::now();
        read_all(&mnt, &files);
        let pass1 = t0.elapsed().as_secs_f64();
        read_all(&mnt, &files);
        let pass2 = t0.elapsed().as_secs_f64();
        let took = t.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(300));
        let st = m.stats();
        let rows = sampler.finish();
        let oom1 = oom_kills();
        let max = |f: fn(&Row) -> u64| rows.iter().map(f).max().unwrap_or(0);
        print_timeline(
            "cgroup",
            &rows,
            &[("first pass done", pass1), ("second pass done", pass2)],
        );
        println!(
            "cgroup: v{} {} limit {:.0} MiB: read {:.0} MiB twice in {:.1} s; target {:.0} -> {:.0} MiB (ram.max 4096); peaks: daemon RSS {:.0} MiB, RAM tier {:.0} MiB, cgroup usage {:.0} MiB (kernel peak {:?}); OOM kills in the cgroup {}, host {} -> {}; signals {}",
            cg.version,
            dir,
            mib(LIMIT),
            mib(data),
            took,
            mib(num(&before, "pressure.target")),
            mib(num(&st, "pressure.target")),
            mib(max(|r| r.rss)),
            mib(max(|r| r.size)),
            mib(max(|r| r.cg_usage)),
            cg.peak().map(mib),
            cg.oom_kills(),
            oom0,
            oom1,
            st["pressure"]["signals"]
        );
        write_json(
            "cgroup.json",
            json!({
                "limit": LIMIT, "data": data, "version": cg.version, "ram_max": 4 * GIB,
                "signals": st["pressure"]["signals"],
                "marks": [{"label": "first pass done", "t": pass1},
                          {"label": "second pass done", "t": pass2}],
                "oom_kills": cg.oom_kills(),
                "rows": rows_json(&rows),
            }),
        );

        assert_eq!(cg.oom_kills(), 0, "OOM kill inside the cgroup");
        assert_eq!(oom1, oom0, "a process was OOM-killed");
        assert!(proc_status(pid, "VmRSS").is_some(), "the daemon is gone");
        assert!(is_mounted(&mnt));
        assert!(max(|r| r.rss) <= LIMIT, "daemon RSS above the limit");
        // The monitor keeps an eighth of the limit free (the cgroup's floor).
        assert!(
            max(|r| r.target) <= LIMIT - LIMIT / 8,
            "target above the limit less its floor"
        );
        // Not kept in by being switched off: the tier held a good part of the limit.
        assert!(max(|r| r.size) >= LIMIT / 4, "the RAM tier was hardly used");
        assert_eq!(num(&st, "pressure.cgroup_limit"), LIMIT);
        m.unmount_and_wait();
    });
}
