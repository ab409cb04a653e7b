//! The durability commands: `recovery` (a clean close and reopen, timed and verified),
//! `crash` (its child, `crash-child`, killed mid-insert; what was acknowledged is read back)
//! and `corrupt` (bytes flipped in foyer's files; nothing wrong may be read back).

use std::{
    io::{BufRead, BufReader, Read, Seek, SeekFrom, Write},
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use foyer::RecoverMode;
use rand::{rngs::SmallRng, Rng, SeedableRng};

use crate::cache::{
    disk_footprint, drop_caches, du, insert_paced, open, small_len, value_for, wipe, Cache, Opts, GIB, MIB,
    WINDOW,
};


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

pub(crate) async fn cmd_recovery(o: Opts) -> Result<()> {
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

pub(crate) async fn cmd_crash_child(o: Opts) -> Result<()> {
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

pub(crate) async fn cmd_crash(o: Opts) -> Result<()> {
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

pub(crate) async fn cmd_corrupt(o: Opts) -> Result<()> {
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
