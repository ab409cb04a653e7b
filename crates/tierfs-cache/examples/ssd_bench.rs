//! Microbenchmark of the SSD tier. Run: `cargo run --release -p tierfs-cache --example ssd_bench`
//! Options: `--dir DIR` (default /var/tmp/ssd-bench, deleted at the end), `--admit-mib N`
//! (data written in (a), default 2048), `--entries N` (rebuild test, default 1000000),
//! `--secs S` (per read measurement, default 2).
//!
//! (a) admission: 64 KiB entries offered as fast as the writer takes them (budget unlimited),
//!     until flushed to disk.
//! (b) get() of whole 64 KiB entries and read_range() of random 4 KiB pages of them, with
//!     1/4/16/32 threads; every read is O_DIRECT and CRC-verified.
//! (c) open() of a tier holding N small entries (512 B - 4 KiB): from the checkpoint, and
//!     from segment summaries alone. The files' page cache is dropped before each open.

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tierfs_cache::{SsdCache, SsdConfig, SsdIdentity, SsdKey, KIND_DATA};

struct Args {
    dir: PathBuf,
    admit_mib: u64,
    entries: u64,
    secs: f64,
}

fn args() -> Args {
    let mut a = Args {
        dir: PathBuf::from("/var/tmp/ssd-bench"),
        admit_mib: 2048,
        entries: 1_000_000,
        secs: 2.0,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    for w in v.chunks(2) {
        let val = w.get(1).map(String::as_str).unwrap_or("");
        match w[0].as_str() {
            "--dir" => a.dir = PathBuf::from(val),
            "--admit-mib" => a.admit_mib = val.parse().expect("--admit-mib N"),
            "--entries" => a.entries = val.parse().expect("--entries N"),
            "--secs" => a.secs = val.parse().expect("--secs S"),
            o => panic!("unknown option {o}"),
        }
    }
    a
}

fn key(i: u64) -> SsdKey {
    SsdKey {
        kind: KIND_DATA,
        dev: 1,
        ino: i / 64,
        idx: i % 64,
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn random_bytes(len: usize, seed: u64) -> Bytes {
    let mut r = Rng(seed | 1);
    (0..len.div_ceil(8))
        .flat_map(|_| r.next().to_le_bytes())
        .take(len)
        .collect::<Vec<u8>>()
        .into()
}

fn ident() -> SsdIdentity {
    SsdIdentity {
        store_id: "bench".into(),
        block_size: 65536,
    }
}

fn unlimited() -> SsdConfig {
    SsdConfig {
        write_rate: u64::MAX,
        write_burst: u64::MAX,
        max_size: 40 << 30,
        ..SsdConfig::default()
    }
}

/// Offers until admitted (the queue is full while the writer is busy).
fn offer(c: &SsdCache, k: SsdKey, d: Bytes) {
    while !c.offer(k, 1, d.clone()) {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Drops the page cache of the tier's files, so an open reads them from the disk.
fn drop_page_cache(dir: &Path) {
    use std::os::unix::io::AsRawFd;
    for e in std::fs::read_dir(dir).expect("list").flatten() {
        if let Ok(f) = std::fs::File::open(e.path()) {
            let _ = f.sync_all();
            // SAFETY: plain syscall on a valid fd.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

fn parallel(threads: usize, secs: f64, op: impl Fn(&mut Rng) -> u64 + Sync) -> (f64, f64) {
    let stop = AtomicBool::new(false);
    let (ops, bytes) = (AtomicU64::new(0), AtomicU64::new(0));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, ops, bytes, op) = (&stop, &ops, &bytes, &op);
            s.spawn(move || {
                let mut r = Rng(0x9E37_79B9 + t as u64 * 7919);
                let (mut n, mut b) = (0, 0);
                while !stop.load(Relaxed) {
                    b += op(&mut r);
                    n += 1;
                }
                ops.fetch_add(n, Relaxed);
                bytes.fetch_add(b, Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Relaxed);
    });
    let dt = t0.elapsed().as_secs_f64();
    (
        ops.load(Relaxed) as f64 / dt,
        bytes.load(Relaxed) as f64 / dt,
    )
}

fn main() {
    let a = args();
    let _ = std::fs::remove_dir_all(&a.dir);
    std::fs::create_dir_all(&a.dir).expect("create bench dir");

    // (a) admission of 64 KiB entries.
    let dir_a = a.dir.join("admit");
    let c = SsdCache::open(&dir_a, &ident(), unlimited(), true).expect("open");
    let pool: Vec<Bytes> = (0..32).map(|i| random_bytes(64 << 10, i + 1)).collect();
    let n = a.admit_mib * 16;
    let t0 = Instant::now();
    for i in 0..n {
        offer(&c, key(i), pool[(i % 32) as usize].clone());
    }
    c.flush();
    let dt = t0.elapsed().as_secs_f64();
    let st = c.stats();
    println!("## SSD tier microbenchmark ({})\n", a.dir.display());
    println!("| test | result |\n|---|---|");
    println!(
        "| (a) admission, 64 KiB entries, {} MiB | {:.2} GB/s end to end ({} entries, {} clusters, {:.2} s) |",
        a.admit_mib,
        (n << 16) as f64 / dt / 1e9,
        st.admitted,
        st.clusters_written,
        dt
    );

    // (b) reads.
    for threads in [1, 4, 16, 32] {
        let (ops, bytes) = parallel(threads, a.secs, |r| {
            let i = r.next() % n;
            c.get(&key(i), 1).map_or(0, |b| b.len() as u64)
        });
        println!(
            "| (b) get() 64 KiB, {threads} threads | {ops:.0} ops/s, {:.2} GB/s |",
            bytes / 1e9
        );
    }
    for threads in [1, 4, 16, 32] {
        let (ops, _) = parallel(threads, a.secs, |r| {
            let i = r.next() % n;
            let p = (r.next() % 16) as u32;
            c.read_range(&key(i), 1, p * 4096, 4096)
                .map_or(0, |b| b.len() as u64)
        });
        println!("| (b) read_range() 4 KiB random, {threads} threads | {ops:.0} IOPS |");
    }
    let st = c.stats();
    assert_eq!(st.checksum_errors, 0);
    assert_eq!(st.misses, 0, "every read should hit");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir_a);

    // (c) rebuild of many small entries.
    let dir_c = a.dir.join("rebuild");
    let c = SsdCache::open(&dir_c, &ident(), unlimited(), true).expect("open");
    let blob = random_bytes(1 << 20, 77);
    let sizes = [512usize, 1024, 2048, 3000, 4096];
    let size = |i: u64| sizes[(i % sizes.len() as u64) as usize];
    let t0 = Instant::now();
    for i in 0..a.entries {
        let off = (i * 4099 % (1 << 19)) as usize;
        offer(&c, key(i), blob.slice(off..off + size(i)));
    }
    c.flush();
    let fill_dt = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    c.shutdown();
    let cp_dt = t0.elapsed().as_secs_f64();
    let st = c.stats();
    drop(c);
    println!(
        "| (c) filled {} entries (512 B-4 KiB), {:.2} GB of segments | {:.1} s; checkpoint write {:.2} s |",
        st.entries,
        st.fill_bytes as f64 / 1e9,
        fill_dt,
        cp_dt
    );
    for (label, remove_cp) in [("checkpoint", false), ("summaries only", true)] {
        if remove_cp {
            std::fs::remove_file(dir_c.join("checkpoint")).expect("remove checkpoint");
        }
        drop_page_cache(&dir_c);
        let t0 = Instant::now();
        let c = SsdCache::open(&dir_c, &ident(), unlimited(), false).expect("reopen");
        let wall = t0.elapsed().as_secs_f64();
        let st = c.stats();
        let mut r = Rng(5);
        for _ in 0..1000 {
            let i = r.next() % a.entries;
            let off = (i * 4099 % (1 << 19)) as usize;
            assert_eq!(
                c.get(&key(i), 1).expect("rebuilt"),
                blob.slice(off..off + size(i))
            );
        }
        println!(
            "| (c) rebuild from {label} | {} entries in {} ms (open() wall {:.2} s) |",
            st.rebuilt_entries, st.rebuild_ms, wall
        );
        drop(c);
    }
    let _ = std::fs::remove_dir_all(&a.dir);
}
