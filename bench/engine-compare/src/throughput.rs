//! The throughput commands: `throughput` (paced inserts of 64 KiB and 4 KiB values, random
//! disk-hit gets, the cost of a get from a plain thread and of a memory hit) and `unpaced`
//! (inserts as fast as insert() returns, and what reached the disk).

use std::time::Instant;

use anyhow::Result;
use foyer::RecoverMode;
use rand::{rngs::SmallRng, Rng, SeedableRng};

use crate::cache::{du, insert_paced, open, value_for, wipe, Opts, GIB, KIB, MIB, WINDOW};
use crate::reads::{len4k, len64k, random_gets, report_reads, ReadStats};


pub(crate) async fn cmd_throughput(o: Opts) -> Result<()> {
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

pub(crate) async fn cmd_unpaced(o: Opts) -> Result<()> {
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
