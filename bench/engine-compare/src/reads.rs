//! Random gets over the keys a command inserted, from many tokio tasks at once, with their
//! latencies, and the RESULT line that reports them with foyer's disk reads.

use std::time::{Duration, Instant};

use rand::{rngs::SmallRng, Rng, SeedableRng};

use crate::cache::{value_for, Cache, KIB};


#[derive(Default)]
pub(crate) struct ReadStats {
    pub(crate) ops: u64,
    pub(crate) hits: u64,
    pub(crate) wrong: u64,
    pub(crate) miss: u64,
    pub(crate) err: u64,
    pub(crate) secs: f64,
    pub(crate) lat_us: Vec<u32>,
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
pub(crate) async fn random_gets(cache: &Cache, nkeys: u64, len_of: fn(u64) -> usize, conc: usize, secs: f64, verify: bool) -> ReadStats {
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

pub(crate) fn len64k(_: u64) -> usize {
    64 * KIB
}
pub(crate) fn len4k(_: u64) -> usize {
    4 * KIB
}

pub(crate) fn report_reads(name: &str, cache: &Cache, before_ios: usize, before_bytes: usize, mut s: ReadStats, value_len: usize) {
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
