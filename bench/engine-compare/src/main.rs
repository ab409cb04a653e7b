//! engine-compare: measure foyer's HybridCache (block engine on a directory) as a
//! candidate SSD-tier engine for tierfs.
//!
//! Subcommands (all take `--dir DIR`, which is wiped first unless noted):
//!   throughput   insert 2 GiB of 64 KiB values, random disk-hit gets (64 KiB @1,4 tasks),
//!                then 4 KiB values (random gets @1,16,32), plain-thread block_on cost
//!   unpaced      insert 2 GiB of 64 KiB values as fast as insert() returns (no back-pressure)
//!                and count what reached the disk
//!   recovery     insert 1,000,000 entries of 512 B..4 KiB, close, reopen (timed), verify
//!   crash        spawn `crash-child`, SIGKILL it mid-insert, reopen (timed), verify
//!   corrupt      insert, close, flip bytes in foyer's data files, reopen, read everything back
//!   crash-child  (internal) inserts 1,000,000 entries, prints progress, never closes

use std::{
    io::{BufRead, BufReader, Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use foyer::{
    BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder, HybridCachePolicy,
    PsyncIoEngineConfig, RecoverMode,
};
use rand::{rngs::SmallRng, Rng, SeedableRng};

type Cache = HybridCache<u64, Vec<u8>>;

/// Back-pressure window: bytes handed to insert() but not yet written to the device.
/// Must stay below the flusher buffer (buffer_pool_size / flushers), or foyer drops entries.
const WINDOW: usize = 16 * MIB;
const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
const GIB: usize = 1024 * MIB;

#[derive(Clone)]
struct Opts {
    dir: PathBuf,
    disk: usize,
    mem: usize,
    direct: bool,
    queue_threshold: usize,
    buffer_pool: usize,
    seconds: f64,
}

fn parse() -> (String, Opts) {
    let args: Vec<String> = std::env::args().collect();
    let cmd = args.get(1).cloned().unwrap_or_default();
    let mut o = Opts {
        dir: PathBuf::from("/var/tmp/foyer-bench/x"),
        disk: 8 * GIB,
        mem: 64 * MIB,
        direct: true,
        queue_threshold: 256 * MIB,
        buffer_pool: 64 * MIB,
        seconds: 10.0,
    };
    let mut i = 2;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--dir" => o.dir = PathBuf::from(v),
            "--disk-gib" => o.disk = v.parse::<usize>().unwrap() * GIB,
            "--mem-mib" => o.mem = v.parse::<usize>().unwrap() * MIB,
            "--buffered" => {
                o.direct = false;
                i += 1;
                continue;
            }
            "--queue-mib" => o.queue_threshold = v.parse::<usize>().unwrap() * MIB,
            "--buffer-mib" => o.buffer_pool = v.parse::<usize>().unwrap() * MIB,
            "--seconds" => o.seconds = v.parse().unwrap(),
            x => panic!("unknown arg {x}"),
        }
        i += 2;
    }
    (cmd, o)
}

/// Deterministic value for a key: length and content derive from the key only.
fn value_for(key: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let mut x = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    v
}

fn small_len(key: u64) -> usize {
    // 512 B ..= 4 KiB, deterministic per key
    let h = key.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 32;
    512 + (h as usize % (4 * KIB - 512 + 1))
}

/// Bytes one entry occupies in foyer's flush buffer and on disk: every entry is aligned up to 4 KiB
/// (foyer-storage src/engine/block/buffer.rs `aligned = bits::align_up(PAGE, len)`).
fn disk_footprint(value_len: usize) -> u64 {
    let len = 40 + 8 + 8 + value_len;
    (len.div_ceil(4096) * 4096) as u64
}

async fn open(o: &Opts, recover: RecoverMode) -> Result<Cache> {
    let device = FsDeviceBuilder::new(&o.dir)
        .with_capacity(o.disk)
        .with_direct(o.direct)
        .build()?;
    let cache = HybridCacheBuilder::new()
        .with_name("engine-compare")
        .with_policy(HybridCachePolicy::WriteOnInsertion)
        .memory(o.mem)
        .with_weighter(|_k: &u64, v: &Vec<u8>| v.len() + 8)
        .storage()
        .with_io_engine_config(PsyncIoEngineConfig::new())
        .with_engine_config(
            BlockEngineConfig::new(device)
                .with_buffer_pool_size(o.buffer_pool)
                .with_submit_queue_size_threshold(o.queue_threshold),
        )
        .with_recover_mode(recover)
        .build()
        .await?;
    Ok(cache)
}

fn wipe(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    Ok(())
}

fn du(dir: &Path) -> u64 {
    let mut t = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        use std::os::unix::fs::MetadataExt;
        t += e.metadata().unwrap().blocks() * 512;
    }
    t
}

/// Insert with back-pressure: never let more than `window` bytes be queued but not yet
/// written to the device (foyer silently drops entries when its submit queue overflows).
async fn insert_paced(cache: &Cache, keys: impl Iterator<Item = u64>, len_of: impl Fn(u64) -> usize, window: usize) -> (u64, u64) {
    let stats = cache.statistics().clone();
    let base = stats.disk_write_bytes() as u64;
    let mut submitted = 0u64;
    let mut n = 0u64;
    for k in keys {
        let len = len_of(k);
        cache.insert(k, value_for(k, len));
        submitted += disk_footprint(len);
        n += 1;
        while submitted > (stats.disk_write_bytes() as u64 - base) + window as u64 {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    (n, submitted)
}

#[derive(Default)]
struct ReadStats {
    ops: u64,
    hits: u64,
    wrong: u64,
    miss: u64,
    err: u64,
    secs: f64,
    lat_us: Vec<u32>,
}

impl ReadStats {
    fn pct(&mut self, p: f64) -> f64 {
        if self.lat_us.is_empty() {
            return 0.0;
        }
        self.lat_us.sort_unstable();
        let i = ((self.lat_us.len() as f64 - 1.0) * p).round() as usize;
        self.lat_us[i] as f64
    }
}

/// `conc` tokio tasks doing random gets over keys [0, nkeys) for `secs` seconds.
async fn random_gets(cache: &Cache, nkeys: u64, len_of: fn(u64) -> usize, conc: usize, secs: f64, verify: bool) -> ReadStats {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut handles = vec![];
    for t in 0..conc {
        let cache = cache.clone();
        handles.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(t as u64 * 7919 + 1);
            let mut s = ReadStats::default();
            while Instant::now() < deadline {
                let k = rng.gen_range(0..nkeys);
                let t0 = Instant::now();
                let r = cache.get(&k).await;
                s.lat_us.push(t0.elapsed().as_micros() as u32);
                s.ops += 1;
                match r {
                    Ok(Some(e)) => {
                        if verify && *e.value() != value_for(k, len_of(k)) {
                            s.wrong += 1;
                        } else {
                            s.hits += 1;
                        }
                    }
                    Ok(None) => s.miss += 1,
                    Err(_) => s.err += 1,
                }
            }
            s
        }));
    }
    let mut tot = ReadStats::default();
    for h in handles {
        let s = h.await.unwrap();
        tot.ops += s.ops;
        tot.hits += s.hits;
        tot.wrong += s.wrong;
        tot.miss += s.miss;
        tot.err += s.err;
        tot.lat_us.extend(s.lat_us);
    }
    tot.secs = start.elapsed().as_secs_f64();
    tot
}

fn len64k(_: u64) -> usize {
    64 * KIB
}
fn len4k(_: u64) -> usize {
    4 * KIB
}

fn report_reads(name: &str, cache: &Cache, before_ios: usize, before_bytes: usize, mut s: ReadStats, value_len: usize) {
    let st = cache.statistics();
    let dios = st.disk_read_ios() - before_ios;
    let dbytes = st.disk_read_bytes() - before_bytes;
    let (p50, p99) = (s.pct(0.5), s.pct(0.99));
    println!(
        "RESULT {name}: ops={} secs={:.2} ops/s={:.0} MB/s(values)={:.1} hits={} miss={} wrong={} err={} disk_read_ios={} ({:.1}% of ops) disk_read_MB/s={:.1} p50_us={:.0} p99_us={:.0}",
        s.ops,
        s.secs,
        s.ops as f64 / s.secs,
        (s.hits as f64 * value_len as f64) / s.secs / 1e6,
        s.hits,
        s.miss,
        s.wrong,
        s.err,
        dios,
        100.0 * dios as f64 / s.ops.max(1) as f64,
        dbytes as f64 / s.secs / 1e6,
        p50,
        p99,
    );
}

async fn cmd_throughput(o: Opts) -> Result<()> {
    // ---- 64 KiB values ----
    let dir64 = o.dir.join("v64k");
    wipe(&dir64)?;
    let o64 = Opts { dir: dir64.clone(), ..o.clone() };
    let cache = open(&o64, RecoverMode::Quiet).await?;
    let n = (2 * GIB / (64 * KIB)) as u64;
    let t0 = Instant::now();
    let (_, submitted) = insert_paced(&cache, 0..n, len64k, WINDOW).await;
    let t_insert = t0.elapsed().as_secs_f64();
    cache.storage().wait().await;
    let t_all = t0.elapsed().as_secs_f64();
    let wb = cache.statistics().disk_write_bytes();
    println!(
        "RESULT insert64k: entries={n} payload_MiB={} insert_loop_s={:.2} until_flushed_s={:.2} payload_MB/s={:.1} disk_write_MB/s={:.1} disk_write_MiB={} disk_write_ios={} submitted_est_MiB={}",
        n * 64 * KIB as u64 / MIB as u64,
        t_insert,
        t_all,
        (n as f64 * 65536.0) / t_all / 1e6,
        wb as f64 / t_all / 1e6,
        wb / MIB,
        cache.statistics().disk_write_ios(),
        submitted / MIB as u64
    );
    println!("INFO files in {}: {} MiB allocated", dir64.display(), du(&dir64) / MIB as u64);
    println!("RESULT insert64k_indexed: {}/{n}", (0..n).filter(|k| cache.storage().may_contains(k)).count());
    for conc in [1usize, 4] {
        let st = cache.statistics();
        let (bi, bb) = (st.disk_read_ios(), st.disk_read_bytes());
        let s = random_gets(&cache, n, len64k, conc, o.seconds, true).await;
        report_reads(&format!("get64k_c{conc}"), &cache, bi, bb, s, 64 * KIB);
    }
    cache.close().await?;
    drop(cache);
    std::fs::remove_dir_all(&dir64)?;

    // ---- 4 KiB values ----
    let dir4 = o.dir.join("v4k");
    wipe(&dir4)?;
    let o4 = Opts { dir: dir4.clone(), ..o.clone() };
    let cache = open(&o4, RecoverMode::Quiet).await?;
    let n = (1 * GIB / (4 * KIB)) as u64;
    let t0 = Instant::now();
    insert_paced(&cache, 0..n, len4k, WINDOW).await;
    cache.storage().wait().await;
    let t_all = t0.elapsed().as_secs_f64();
    println!(
        "RESULT insert4k: entries={n} until_flushed_s={:.2} entries/s={:.0} payload_MB/s={:.1} disk_write_MB/s={:.1}",
        t_all,
        n as f64 / t_all,
        (n as f64 * 4096.0) / t_all / 1e6,
        cache.statistics().disk_write_bytes() as f64 / t_all / 1e6
    );
    println!("RESULT insert4k_indexed: {}/{n}", (0..n).filter(|k| cache.storage().may_contains(k)).count());
    for conc in [1usize, 16, 32] {
        let st = cache.statistics();
        let (bi, bb) = (st.disk_read_ios(), st.disk_read_bytes());
        let s = random_gets(&cache, n, len4k, conc, o.seconds, true).await;
        report_reads(&format!("get4k_c{conc}"), &cache, bi, bb, s, 4 * KIB);
    }

    // ---- plain OS thread calling into foyer (tierfs' fuser callbacks are synchronous) ----
    let handle = tokio::runtime::Handle::current();
    let c2 = cache.clone();
    let secs = o.seconds;
    let st = cache.statistics().clone();
    let (bi, bb) = (st.disk_read_ios(), st.disk_read_bytes());
    let s = tokio::task::spawn_blocking(move || {
        let mut rng = SmallRng::seed_from_u64(99);
        let mut s = ReadStats::default();
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < secs {
            let k = rng.gen_range(0..n);
            let t0 = Instant::now();
            let r = handle.block_on(c2.get(&k));
            s.lat_us.push(t0.elapsed().as_micros() as u32);
            s.ops += 1;
            match r {
                Ok(Some(_)) => s.hits += 1,
                Ok(None) => s.miss += 1,
                Err(_) => s.err += 1,
            }
        }
        s.secs = start.elapsed().as_secs_f64();
        s
    })
    .await?;
    report_reads("get4k_plain_thread_block_on_c1", &cache, bi, bb, s, 4 * KIB);

    // memory-hit cost: same key over and over
    let hot = 7u64;
    let _ = cache.get(&hot).await?;
    let iters = 1_000_000u32;
    let t0 = Instant::now();
    for _ in 0..iters {
        let e = cache.get(&hot).await?;
        std::hint::black_box(e);
    }
    let in_task = t0.elapsed().as_nanos() as f64 / iters as f64;
    let handle = tokio::runtime::Handle::current();
    let c2 = cache.clone();
    let (blk, sync_mem) = tokio::task::spawn_blocking(move || {
        let t0 = Instant::now();
        for _ in 0..iters {
            let e = handle.block_on(c2.get(&hot)).unwrap();
            std::hint::black_box(e);
        }
        let blk = t0.elapsed().as_nanos() as f64 / iters as f64;
        let t0 = Instant::now();
        for _ in 0..iters {
            let e = c2.memory().get(&hot);
            std::hint::black_box(e);
        }
        (blk, t0.elapsed().as_nanos() as f64 / iters as f64)
    })
    .await?;
    println!(
        "RESULT memhit_ns: in_task_await={in_task:.0} plain_thread_block_on={blk:.0} plain_thread_memory().get()={sync_mem:.0}"
    );
    cache.close().await?;
    drop(cache);
    std::fs::remove_dir_all(&dir4)?;
    Ok(())
}

async fn cmd_unpaced(o: Opts) -> Result<()> {
    wipe(&o.dir)?;
    let o = Opts { queue_threshold: 16 * MIB, buffer_pool: 16 * MIB, ..o }; // foyer's defaults
    let cache = open(&o, RecoverMode::Quiet).await?;
    let n = (2 * GIB / (64 * KIB)) as u64;
    let t0 = Instant::now();
    for k in 0..n {
        cache.insert(k, value_for(k, 64 * KIB));
    }
    let t_loop = t0.elapsed().as_secs_f64();
    cache.storage().wait().await;
    let t_all = t0.elapsed().as_secs_f64();
    let on_disk = (0..n).filter(|k| cache.storage().may_contains(k)).count();
    println!(
        "RESULT unpaced64k (foyer defaults: buffer_pool 16 MiB, submit queue 16 MiB): entries={n} insert_loop_s={t_loop:.2} until_flushed_s={t_all:.2} disk_write_MiB={} entries_on_disk={on_disk} dropped={}",
        cache.statistics().disk_write_bytes() / MIB,
        n as usize - on_disk
    );
    cache.close().await?;
    Ok(())
}

async fn verify_small(cache: &Cache, n: u64, full_sample: u64) -> Result<(u64, u64, u64, u64, u64)> {
    // index presence for all keys; full read+compare for a sample
    let present = (0..n).filter(|k| cache.storage().may_contains(k)).count() as u64;
    let first_missing = (0..n).find(|k| !cache.storage().may_contains(k)).unwrap_or(n);
    let step = (n / full_sample).max(1);
    let keys: Vec<u64> = (0..n).step_by(step as usize).collect();
    let ok = Arc::new(AtomicU64::new(0));
    let wrong = Arc::new(AtomicU64::new(0));
    let miss = Arc::new(AtomicU64::new(0));
    let keys = Arc::new(keys);
    let idx = Arc::new(AtomicU64::new(0));
    let mut hs = vec![];
    for _ in 0..32 {
        let (c, keys, idx, ok, wrong, miss) = (cache.clone(), keys.clone(), idx.clone(), ok.clone(), wrong.clone(), miss.clone());
        hs.push(tokio::spawn(async move {
            loop {
                let i = idx.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= keys.len() {
                    break;
                }
                let k = keys[i];
                match c.get(&k).await {
                    Ok(Some(e)) if *e.value() == value_for(k, small_len(k)) => ok.fetch_add(1, Ordering::Relaxed),
                    Ok(Some(_)) => wrong.fetch_add(1, Ordering::Relaxed),
                    _ => miss.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for h in hs {
        h.await?;
    }
    Ok((present, first_missing, ok.load(Ordering::Relaxed), wrong.load(Ordering::Relaxed), miss.load(Ordering::Relaxed)))
}

const NSMALL: u64 = 1_000_000;

async fn cmd_recovery(o: Opts) -> Result<()> {
    wipe(&o.dir)?;
    let cache = open(&o, RecoverMode::Quiet).await?;
    let t0 = Instant::now();
    let (_, submitted) = insert_paced(&cache, 0..NSMALL, small_len, WINDOW).await;
    cache.storage().wait().await;
    let t_ins = t0.elapsed().as_secs_f64();
    println!(
        "RESULT recovery_insert: entries={NSMALL} secs={t_ins:.2} entries/s={:.0} payload_MiB~={} disk_write_MiB={}",
        NSMALL as f64 / t_ins,
        submitted / MIB as u64,
        cache.statistics().disk_write_bytes() / MIB
    );
    println!(
        "RESULT recovery_indexed_before_close: {}/{NSMALL}",
        (0..NSMALL).filter(|k| cache.storage().may_contains(k)).count()
    );
    let t0 = Instant::now();
    cache.close().await?;
    drop(cache);
    println!("RESULT recovery_close_s={:.3}", t0.elapsed().as_secs_f64());
    println!("INFO allocated on disk: {} MiB", du(&o.dir) / MIB as u64);
    drop_caches();
    let t0 = Instant::now();
    let cache = open(&o, RecoverMode::Quiet).await?;
    let t_open = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let k = 123_456u64;
    let r = cache.get(&k).await?;
    let first_get = t1.elapsed().as_secs_f64();
    println!(
        "RESULT recovery_clean_reopen: build_s={t_open:.3} first_get_ms={:.3} first_get_ok={}",
        first_get * 1e3,
        r.map(|e| *e.value() == value_for(k, small_len(k))).unwrap_or(false)
    );
    let (present, first_missing, ok, wrong, miss) = verify_small(&cache, NSMALL, 100_000).await?;
    println!(
        "RESULT recovery_clean_verify: indexed={present}/{NSMALL} first_missing={first_missing} sample_read ok={ok} wrong={wrong} miss={miss}"
    );
    cache.close().await?;
    // Second reopen with page cache warm, for reference.
    drop(cache);
    let t0 = Instant::now();
    let cache = open(&o, RecoverMode::Quiet).await?;
    println!("RESULT recovery_clean_reopen_again: build_s={:.3}", t0.elapsed().as_secs_f64());
    cache.close().await?;
    Ok(())
}

fn drop_caches() {
    let _ = std::process::Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

async fn cmd_crash_child(o: Opts) -> Result<()> {
    // The directory is prepared by the parent (wiped).
    let cache = open(&o, RecoverMode::Quiet).await?;
    let stats = cache.statistics().clone();
    let base = stats.disk_write_bytes() as u64;
    let mut submitted = 0u64;
    let mut out = std::io::stdout().lock();
    for k in 0..NSMALL {
        let len = small_len(k);
        cache.insert(k, value_for(k, len));
        submitted += disk_footprint(len);
        while submitted > (stats.disk_write_bytes() as u64 - base) + WINDOW as u64 {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        if k % 10_000 == 0 {
            writeln!(out, "inserted {k}")?;
            out.flush()?;
        }
    }
    writeln!(out, "done")?;
    out.flush()?;
    // Never close; the parent kills us before this point anyway.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(())
}

async fn cmd_crash(o: Opts) -> Result<()> {
    wipe(&o.dir)?;
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["crash-child", "--dir", o.dir.to_str().unwrap()])
        .args(if o.direct { vec![] } else { vec!["--buffered"] })
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().unwrap();
    let mut last = 0u64;
    let kill_at = NSMALL / 2;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(v) = line.strip_prefix("inserted ") {
            last = v.parse()?;
            if last >= kill_at {
                break;
            }
        }
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let st = child.wait()?;
    println!("RESULT crash_kill: child killed after insert() returned for keys 0..={last}; status={st:?}");
    drop_caches();
    let t0 = Instant::now();
    let cache = open(&o, RecoverMode::Quiet).await?;
    let t_open = t0.elapsed().as_secs_f64();
    println!("RESULT crash_reopen: build_s={t_open:.3}");
    let upto = last + 1;
    let (present, first_missing, ok, wrong, miss) = verify_small(&cache, upto, upto).await?;
    let beyond = (upto..NSMALL).filter(|k| cache.storage().may_contains(k)).count();
    println!(
        "RESULT crash_verify: acked={upto} indexed={present} first_missing={first_missing} lost={} read_all_acked ok={ok} wrong={wrong} miss={miss} indexed_beyond_ack={beyond}",
        upto - present
    );
    cache.close().await?;
    Ok(())
}

async fn cmd_corrupt(o: Opts) -> Result<()> {
    wipe(&o.dir)?;
    let o = Opts { disk: GIB, ..o };
    let n = 40_000u64; // small entries, ~90 MiB
    let cache = open(&o, RecoverMode::Quiet).await?;
    insert_paced(&cache, 0..n, small_len, WINDOW).await;
    cache.storage().wait().await;
    cache.close().await?;
    drop(cache);

    // Control: clean reopen and full read-back before any corruption.
    {
        let cache = open(&o, RecoverMode::Quiet).await?;
        let (present, first_missing, ok, wrong, miss) = verify_small(&cache, n, n).await?;
        println!("RESULT corrupt_control (no flips): entries={n} indexed={present} first_missing={first_missing} ok={ok} wrong={wrong} miss={miss}");
        cache.close().await?;
    }

    // Flip bytes at random offsets inside the allocated (written) parts of foyer's files.
    let mut files: Vec<(PathBuf, u64)> = vec![];
    for e in std::fs::read_dir(&o.dir)? {
        let e = e?;
        use std::os::unix::fs::MetadataExt;
        let m = e.metadata()?;
        if m.blocks() > 0 {
            println!("INFO file {} size={} allocated={}", e.file_name().to_string_lossy(), m.len(), m.blocks() * 512);
            files.push((e.path(), m.len()));
        }
    }
    let mut rng = SmallRng::seed_from_u64(4242);
    let flips = 400;
    let mut done = 0;
    while done < flips {
        let (p, len) = &files[rng.gen_range(0..files.len())];
        let off = rng.gen_range(0..*len);
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(p)?;
        f.seek(SeekFrom::Start(off))?;
        let mut b = [0u8; 1];
        f.read_exact(&mut b)?;
        if b[0] == 0 {
            continue; // unused (hole / padding); try elsewhere
        }
        b[0] ^= 0x5A;
        f.seek(SeekFrom::Start(off))?;
        f.write_all(&b)?;
        done += 1;
    }
    println!("RESULT corrupt_flips: {flips} single-byte flips at random non-zero offsets in {} data files", files.len());
    drop_caches();
    let t0 = Instant::now();
    let cache = match open(&o, RecoverMode::Quiet).await {
        Ok(c) => c,
        Err(e) => bail!("reopen after corruption failed: {e}"),
    };
    println!("RESULT corrupt_reopen: build_s={:.3}", t0.elapsed().as_secs_f64());
    let (mut ok, mut wrong, mut miss, mut err) = (0, 0, 0, 0);
    let indexed = (0..n).filter(|k| cache.storage().may_contains(k)).count();
    for k in 0..n {
        match cache.get(&k).await {
            Ok(Some(e)) if *e.value() == value_for(k, small_len(k)) => ok += 1,
            Ok(Some(_)) => wrong += 1,
            Ok(None) => miss += 1,
            Err(_) => err += 1,
        }
    }
    println!(
        "RESULT corrupt_readback: entries={n} indexed_after_recovery={indexed} ok={ok} wrong_data={wrong} miss={miss} error={err}"
    );
    cache.close().await?;
    Ok(())
}

fn main() -> Result<()> {
    let (cmd, o) = parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        match cmd.as_str() {
            "throughput" => cmd_throughput(o).await,
            "unpaced" => cmd_unpaced(o).await,
            "recovery" => cmd_recovery(o).await,
            "crash" => cmd_crash(o).await,
            "crash-child" => cmd_crash_child(o).await,
            "corrupt" => cmd_corrupt(o).await,
            _ => bail!("usage: engine-compare throughput|unpaced|recovery|crash|corrupt --dir DIR [--seconds S] [--buffered]"),
        }
    })
    .context(cmd_name())
}

fn cmd_name() -> String {
    std::env::args().nth(1).unwrap_or_default()
}
