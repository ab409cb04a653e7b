//! Acceptance tests of the SSD tier, through real mounts of the `tierfs` binary: a restart is
//! served from the SSD tier, corrupt segments are never served, `kill -9` during admission
//! loses nothing that was indexed and never yields wrong data, the write budget holds, and the
//! fill cap holds while a hot set survives a cold scan.
//!
//! Data: every file is random, made of 4 KiB pages copied from a random pool at positions
//! drawn from the file's key (derived from a per-test seed, printed), so the expected bytes of
//! any range can be produced again: every read through a mount is compared byte for byte with
//! what was written to BACKING.
//!
//! Temporary data lives under /var/tmp (a real disk: O_DIRECT works and statvfs describes a
//! device; /tmp may be a tmpfs). Files age past `tierfs_fs::RACY_WINDOW` before they are read:
//! younger blocks are served but not cached, so they would not be admitted to the SSD tier.
//! Reads that must reach tierfs while the mount lives on use O_DIRECT: tierfs lets the kernel
//! keep a file's pages across opens (FOPEN_KEEP_CACHE), which would hide the SSD tier.
//!
//! Each test prints what it measured: run with `--nocapture` to see the numbers.

mod common;
use common::*;
use serde_json::Value;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TMP: &str = "/var/tmp";
/// Every mount here keeps only 1% of the device free (`ssd.min_free_pct`, 10% by default): the
/// test machine's disk may have less than 10% free, which would pause admission and leave
/// these tests nothing to test. The guard itself is checked against this 1%.
const MIN_FREE_PCT: u64 = 1;

/// Mounts `m` with `opts` plus the free-space setting above.
fn mount(m: &BinMount, opts: &[&str]) {
    let guard = format!("ssd.min_free_pct={MIN_FREE_PCT}");
    let mut all: Vec<&str> = opts.to_vec();
    all.push(&guard);
    m.mount(&all);
}

const MIB: u64 = 1 << 20;
/// tierfs's default block size (`ram.block_size`): the unit of admission to the SSD tier.
const BS: u64 = 64 << 10;
const PAGE: usize = 4096;
const POOL_LEN: usize = 16 << 20;
/// Reads through the mount and writes to BACKING go in pieces of this size.
const CHUNK: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Data sets
// ---------------------------------------------------------------------------------------------

/// A fresh seed for a test, printed so that a failure can be replayed.
fn test_seed(test: &str) -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let seed = mix(t ^ ((std::process::id() as u64) << 32) ^ mix(test.len() as u64));
    println!("{test}: seed {seed:#018x}");
    seed
}

/// Random bytes (from a seed drawn once per process) that file pages are copied from.
fn pool() -> &'static [u8] {
    static POOL: OnceLock<Vec<u8>> = OnceLock::new();
    POOL.get_or_init(|| {
        let mut r = Rng::new(test_seed("pool"));
        let mut v = Vec::with_capacity(POOL_LEN + PAGE);
        while v.len() < POOL_LEN + PAGE {
            v.extend_from_slice(&r.next().to_le_bytes());
        }
        v
    })
}

/// A file of a data set: its name in BACKING, its size, and the key its bytes derive from.
#[derive(Clone, Debug)]
struct Spec {
    name: String,
    size: u64,
    key: u64,
}

impl Spec {
    /// Page `p` of the file in full (the file's last page is cut at `size`).
    fn page(&self, p: u64) -> &'static [u8] {
        let at = mix(self.key ^ p.wrapping_mul(0xD6E8_FEB8_6659_FD93)) % POOL_LEN as u64;
        &pool()[at as usize..at as usize + PAGE]
    }

    /// Calls `f(offset in piece, expected bytes)` for the pieces of `off .. off + len`,
    /// page by page.
    fn pieces(&self, off: u64, len: usize, mut f: impl FnMut(usize, &[u8])) {
        let mut done = 0;
        while done < len {
            let pos = off + done as u64;
            let (p, in_page) = (pos / PAGE as u64, (pos % PAGE as u64) as usize);
            let take = (PAGE - in_page).min(len - done);
            f(done, &self.page(p)[in_page..in_page + take]);
            done += take;
        }
    }

    /// Panics unless `got` is the file's content at `off`.
    fn check(&self, off: u64, got: &[u8]) {
        assert!(
            off + got.len() as u64 <= self.size,
            "{}: read {} bytes at {off}, past the end ({} bytes)",
            self.name,
            got.len(),
            self.size
        );
        self.pieces(off, got.len(), |at, want| {
            let piece = &got[at..at + want.len()];
            if piece != want {
                let i = (0..want.len()).find(|&i| piece[i] != want[i]).unwrap();
                let pos = off + (at + i) as u64;
                panic!(
                    "{}: WRONG DATA at byte {pos} (block {}, page {}): read {:#04x}, expected {:#04x}",
                    self.name,
                    pos / BS,
                    pos / PAGE as u64,
                    piece[i],
                    want[i]
                );
            }
        });
    }
}

/// Writes the files of a data set into `dir`: `sizes[i]` bytes for `<prefix><i>`.
fn make_files(dir: &Path, seed: u64, prefix: &str, sizes: &[u64]) -> Vec<Spec> {
    let mut buf = vec![0u8; CHUNK];
    sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let spec = Spec {
                name: format!("{prefix}{i:03}"),
                size,
                key: mix(seed ^ mix(i as u64 + 1)),
            };
            let f = std::fs::File::create(dir.join(&spec.name)).unwrap();
            let mut off = 0;
            while off < size {
                let n = (size - off).min(CHUNK as u64) as usize;
                spec.pieces(off, n, |at, want| {
                    buf[at..at + want.len()].copy_from_slice(want)
                });
                f.write_all_at(&buf[..n], off).unwrap();
                off += n as u64;
            }
            spec
        })
        .collect()
}

fn total_size(files: &[Spec]) -> u64 {
    files.iter().map(|f| f.size).sum()
}

/// Waits until files written so far are old enough for tierfs to cache (and admit) their
/// blocks.
fn settle() {
    std::thread::sleep(tierfs_fs::RACY_WINDOW + Duration::from_millis(150));
}

/// Reads the whole file at `path` (in 1 MiB reads; O_DIRECT if `direct`) and compares every
/// byte with `f`: wrong data panics, an I/O error (or a file cut short) is returned.
fn read_verify(path: &Path, f: &Spec, direct: bool) -> io::Result<u64> {
    read_verify_counted(path, f, direct, &AtomicU64::new(0))
}

/// [`read_verify`], adding the bytes verified so far to `verified` as it goes.
fn read_verify_counted(
    path: &Path,
    f: &Spec,
    direct: bool,
    verified: &AtomicU64,
) -> io::Result<u64> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts.open(path)?;
    let mut raw = vec![0u8; CHUNK + PAGE];
    let a = raw.as_ptr().align_offset(PAGE);
    let buf = &mut raw[a..a + CHUNK];
    let mut off = 0u64;
    loop {
        let n = match file.read_at(buf, off) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        f.check(off, &buf[..n]);
        verified.fetch_add(n as u64, SeqCst);
        off += n as u64;
    }
    if off != f.size {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{}: {off} of {} bytes", f.name, f.size),
        ));
    }
    Ok(off)
}

/// [`read_verify`] of every file, which must succeed.
fn verify_all(mnt: &Path, files: &[Spec], direct: bool) {
    for f in files {
        read_verify(&mnt.join(&f.name), f, direct)
            .unwrap_or_else(|e| panic!("read {} through the mount: {e}", f.name));
    }
}

// ---------------------------------------------------------------------------------------------
// Stats
// ---------------------------------------------------------------------------------------------

/// Offers the SSD tier refused, for whatever reason.
fn dropped(v: &Value) -> u64 {
    ["budget", "queue", "full", "other"]
        .iter()
        .map(|r| n(v, &format!("ssd.dropped_{r}")))
        .sum()
}

/// Waits until the SSD tier's writer has caught up with what was admitted (its queue is
/// empty; at most a partial cluster waits for `ssd.flush_interval`). A reader at full speed
/// outruns the writer, and offers beyond the queue's 64 clusters are dropped
/// (`dropped_queue`): tests that want their data admitted read a file, then wait.
///
/// Until something is reclaimed, every admitted entry becomes an index entry once its cluster
/// is written, so "admitted - entries" is what is still queued. After reclaim that no longer
/// holds: then the writer counts as idle once `written_bytes` has not moved for `quiet`
/// (which also ends the wait if the first rule never holds).
fn wait_writer_idle(mnt: &Path, quiet: Duration) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut last, mut since) = (u64::MAX, Instant::now());
    loop {
        let s = stats_of(mnt);
        let pending = n(&s, "ssd.admitted").saturating_sub(n(&s, "ssd.entries"));
        if n(&s, "ssd.reclaimed_segments") == 0 && pending <= 16 {
            return;
        }
        let written = n(&s, "ssd.written_bytes");
        if written != last {
            (last, since) = (written, Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the SSD writer is still busy after 60 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(40));
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Bytes shown in MiB (one decimal unless a precision is given).
struct Mib(f64);

impl std::fmt::Display for Mib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = f.precision().unwrap_or(1);
        let s = format!("{:.p$}", self.0);
        let w = f.width().unwrap_or(0);
        write!(f, "{s:>w$}")
    }
}

fn mib(b: u64) -> Mib {
    Mib(b as f64 / MIB as f64)
}

fn gib(b: u64) -> Mib {
    Mib(b as f64 / (1u64 << 30) as f64)
}

// ---------------------------------------------------------------------------------------------
// 1. Restart
// ---------------------------------------------------------------------------------------------

/// 2 GiB read through a mount with a 64 MiB RAM tier go to the SSD tier; after a clean
/// unmount (flush + checkpoint), dropping the kernel's caches and mounting again, reading it
/// all again is served from the SSD tier: the backing store is read only for blocks the first
/// mount did not admit (none, when the reader lets the writer keep up).
///
/// The second mount's RAM tier holds the whole data set, so that each block is loaded exactly
/// once, from the SSD tier or (not admitted) from the backing store. With a small one, blocks
/// read ahead can be evicted before they are used and are loaded twice (a new block enters the
/// RAM tier's CLOCK unreferenced), which would blur that accounting; the RAM tier starts empty
/// after a restart either way.
#[test]
fn restart_serves_from_ssd() {
    const FILES: usize = 64;
    const SIZE: u64 = 32 * MIB;
    const OPTS: &[&str] = &["ram.max=64M"];
    const OPTS2: &[&str] = &["ram.max=3G"];
    let seed = test_seed("restart_serves_from_ssd");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(300), vec![mnt.clone()], move || {
        let t = Instant::now();
        let files = make_files(&m.backing, seed, "f", &[SIZE; FILES]);
        let total = total_size(&files);
        let blocks = total / BS;
        println!(
            "restart: wrote {FILES} files, {} MiB, in {:.1} s",
            mib(total),
            secs(t.elapsed())
        );
        settle();

        mount(&m, OPTS);
        let t = Instant::now();
        for f in &files {
            read_verify(&mnt.join(&f.name), f, false).unwrap();
            wait_writer_idle(&mnt, Duration::from_secs(3));
        }
        let pass1 = t.elapsed();
        let s1 = m.stats();
        m.unmount_and_wait();
        drop_caches();

        mount(&m, OPTS2);
        let s2a = m.stats();
        let t = Instant::now();
        verify_all(&mnt, &files, false);
        let pass2 = t.elapsed();
        let s2 = m.stats();
        m.unmount_and_wait();

        let not_admitted = dropped(&s1);
        let allowed = not_admitted * BS;
        let backing2 = n(&s2, "backing.read_bytes");
        let ssd_blocks = n(&s2, "ssd_blocks");
        // The entries are data blocks only here (no listing was read).
        let missing = blocks.saturating_sub(n(&s1, "ssd.entries"));
        println!(
            "restart: mount 1: read {} MiB in {:.1} s; backing read {} MiB; ssd admitted {} entries \
             ({} MiB), written {} MiB, dropped {not_admitted} (budget {}, queue {}, full {}, other {}), \
             {} entries at unmount",
            mib(total),
            secs(pass1),
            mib(n(&s1, "backing.read_bytes")),
            n(&s1, "ssd.admitted"),
            mib(n(&s1, "ssd.admitted_bytes")),
            mib(n(&s1, "ssd.written_bytes")),
            n(&s1, "ssd.dropped_budget"),
            n(&s1, "ssd.dropped_queue"),
            n(&s1, "ssd.dropped_full"),
            n(&s1, "ssd.dropped_other"),
            n(&s1, "ssd.entries"),
        );
        println!(
            "restart: mount 2: index rebuilt in {} ms ({} entries); read {} MiB in {:.1} s; \
             ssd hits {} ({} MiB), ssd_blocks {ssd_blocks} of {blocks}, ssd_range_reads {}, \
             checksum errors {}; backing reads {} ({backing2} bytes = {} blocks; allowed: \
             {allowed}; blocks not in the SSD tier at unmount: {missing})",
            n(&s2a, "ssd.rebuild_ms"),
            n(&s2a, "ssd.rebuilt_entries"),
            mib(total),
            secs(pass2),
            n(&s2, "ssd.hits"),
            mib(n(&s2, "ssd.hit_bytes")),
            n(&s2, "ssd_range_reads"),
            n(&s2, "ssd.checksum_errors"),
            n(&s2, "backing.read"),
            backing2.div_ceil(BS),
        );
        assert!(
            n(&s2a, "ssd.rebuilt_entries") >= n(&s1, "ssd.entries"),
            "the restart lost index entries: {s2a}"
        );
        assert!(
            n(&s2, "ssd.hits") > 0,
            "no SSD hits after the restart: {s2}"
        );
        assert!(
            backing2 <= allowed,
            "after the restart {backing2} bytes came from the backing store, but only \
             {not_admitted} blocks ({allowed} bytes) were not admitted by the first mount: {s2}"
        );
        assert!(
            ssd_blocks >= blocks - not_admitted,
            "{ssd_blocks} blocks from the SSD tier; {blocks} blocks, {not_admitted} not admitted"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Corruption
// ---------------------------------------------------------------------------------------------

/// With ~256 MiB in the SSD tier and the RAM tier cold, random bytes of the segment files are
/// flipped (200 flips, behind the daemon's back) while every file is read again and again with
/// O_DIRECT: every byte read is right, and the tier counts the checksum errors it caught. The
/// same holds after a restart that loads the index from the checkpoint.
#[test]
fn corrupt_segments_never_served() {
    const FLIPS: usize = 200;
    const OPTS: &[&str] = &["ram.max=16M"];
    let seed = test_seed("corrupt_segments_never_served");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(300), vec![mnt.clone()], move || {
        let mut sizes = vec![32 * MIB; 8];
        sizes[7] -= 777; // a partial last block
        let files = make_files(&m.backing, seed, "c", &sizes);
        let total = total_size(&files);
        settle();

        // Fill: every block admitted.
        mount(&m, OPTS);
        for f in &files {
            read_verify(&mnt.join(&f.name), f, true).unwrap();
            wait_writer_idle(&mnt, Duration::from_secs(3));
        }
        let sf = m.stats();
        m.unmount_and_wait();
        println!(
            "corrupt: filled {} MiB of segments ({} entries, {} dropped offers)",
            mib(n(&sf, "ssd.fill_bytes")),
            n(&sf, "ssd.entries"),
            dropped(&sf)
        );

        // RAM cold; the segments written by the first mount get damaged while being read.
        mount(&m, OPTS);
        let s0 = m.stats();
        let ssd_dir = m.cache.join("ssd");
        let mut segs: Vec<(PathBuf, u64)> = std::fs::read_dir(&ssd_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("seg-"))
            .map(|e| (e.path(), e.metadata().unwrap().len()))
            .filter(|(_, len)| *len > 0)
            .collect();
        segs.sort();
        assert!(
            !segs.is_empty(),
            "no segment files in {}",
            ssd_dir.display()
        );
        let seg_bytes: u64 = segs.iter().map(|s| s.1).sum();
        let done = Arc::new(AtomicBool::new(false));
        let flipper = {
            let (segs, done) = (segs.clone(), done.clone());
            std::thread::spawn(move || {
                let mut r = Rng::new(seed ^ 0xF11B);
                let files: Vec<std::fs::File> = segs
                    .iter()
                    .map(|(p, _)| {
                        std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(p)
                            .unwrap()
                    })
                    .collect();
                let mut hit = vec![0usize; segs.len()];
                for _ in 0..FLIPS {
                    let mut at = r.range(0, seg_bytes);
                    let mut i = 0;
                    while at >= segs[i].1 {
                        at -= segs[i].1;
                        i += 1;
                    }
                    let mut b = [0u8];
                    files[i].read_exact_at(&mut b, at).unwrap();
                    b[0] ^= r.range(1, 256) as u8;
                    files[i].write_all_at(&b, at).unwrap();
                    hit[i] += 1;
                    std::thread::sleep(Duration::from_millis(r.range(4, 14)));
                }
                done.store(true, SeqCst);
                hit
            })
        };
        let t = Instant::now();
        let mut passes = 0;
        loop {
            let last = done.load(SeqCst);
            verify_all(&mnt, &files, true);
            passes += 1;
            if last {
                break; // one whole pass after the last flip
            }
        }
        let hit = flipper.join().unwrap();
        let s1 = m.stats();
        let errors = n(&s1, "ssd.checksum_errors");
        println!(
            "corrupt: {FLIPS} flips in {} of {} segment files ({} MiB); {passes} verified passes \
             of {} MiB in {:.1} s; checksum errors {errors}, io errors {}; ssd hits {}; \
             re-fetched from the backing store {} MiB",
            hit.iter().filter(|&&h| h > 0).count(),
            segs.len(),
            mib(seg_bytes),
            mib(total),
            secs(t.elapsed()),
            n(&s1, "ssd.io_errors"),
            n(&s1, "ssd.hits") - n(&s0, "ssd.hits"),
            mib(n(&s1, "backing.read_bytes") - n(&s0, "backing.read_bytes")),
        );
        assert!(
            errors > 0,
            "{FLIPS} flips in the segments and no checksum error counted: {s1}"
        );

        // A restart: the index comes from the checkpoint of the clean unmount.
        m.unmount_and_wait();
        mount(&m, OPTS);
        verify_all(&mnt, &files, true);
        let s2 = m.stats();
        m.unmount_and_wait();
        println!(
            "corrupt: after a restart: {} entries rebuilt, verified pass: ssd hits {}, checksum \
             errors {}, backing read {} MiB",
            n(&s2, "ssd.rebuilt_entries"),
            n(&s2, "ssd.hits"),
            n(&s2, "ssd.checksum_errors"),
            mib(n(&s2, "backing.read_bytes")),
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 3. Crashes
// ---------------------------------------------------------------------------------------------

/// 20 rounds over one cache directory: mount, check the index rebuild, read back (byte-exact)
/// the files the last round was admitting when it was killed and two older ones, then read
/// new files with three readers (heavy admission) and `kill -9` the daemon after a random
/// 50-500 ms. Every remount succeeds; the rebuild finds at least every entry that was indexed
/// (i.e. written) before the kill; nothing is ever read wrong; at the end every file reads back
/// exact, also after a clean unmount and a restart from the checkpoint.
#[test]
fn kill_9_during_admission_20_times() {
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 3;
    const OPTS: &[&str] = &["ram.max=32M"];
    let seed = test_seed("kill_9_during_admission_20_times");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(240), vec![mnt.clone()], move || {
        let t_all = Instant::now();
        let sizes: Vec<u64> = (0..ROUNDS * PER_ROUND)
            .map(|i| match i % PER_ROUND {
                // Partial last blocks of various lengths.
                2 => 16 * MIB - 12345 - 4097 * (i as u64 / PER_ROUND as u64),
                _ => 16 * MIB,
            })
            .collect();
        let files = make_files(&m.backing, seed, "k", &sizes);
        settle();
        let mut r = Rng::new(seed ^ 0x4B11);
        let mut prev_entries = 0; // indexed when the last round was killed
        let mut backlog_rounds = 0;
        println!(
            "kill9: round  wait_ms  rebuild_ms  rebuilt  ssd_blocks_after  \
             admitted@kill  queued@kill  entries@kill  verified_MiB"
        );
        for round in 0..ROUNDS {
            mount(&m, OPTS);
            let s0 = m.stats();
            let rebuilt = n(&s0, "ssd.rebuilt_entries");
            assert!(
                rebuilt >= prev_entries,
                "round {round}: the rebuild found {rebuilt} entries, but {prev_entries} were \
                 indexed (written) before the kill -9: {s0}"
            );
            // Round 1 re-reads round 0's files before its kill: their blocks are written.
            assert!(
                round < 2 || rebuilt > 0,
                "round {round}: empty index after the rebuild: {s0}"
            );

            // What the last round was admitting when it was killed, and two older files.
            let mut check: Vec<&Spec> = Vec::new();
            if round > 0 {
                check.extend(&files[(round - 1) * PER_ROUND..round * PER_ROUND]);
            }
            if round > 1 {
                for _ in 0..2 {
                    check.push(&files[r.range(0, ((round - 1) * PER_ROUND) as u64) as usize]);
                }
            }
            for f in &check {
                read_verify(&mnt.join(&f.name), f, false)
                    .unwrap_or_else(|e| panic!("round {round}: read {}: {e}", f.name));
            }
            let s1 = m.stats();

            // Heavy admission: this round's files are new to the tier.
            let fresh = &files[round * PER_ROUND..(round + 1) * PER_ROUND];
            let verified = Arc::new(AtomicU64::new(0));
            let readers: Vec<_> = fresh
                .iter()
                .map(|f| {
                    let (path, f, v) = (mnt.join(&f.name), f.clone(), verified.clone());
                    std::thread::spawn(move || read_verify_counted(&path, &f, false, &v))
                })
                .collect();
            let wait = r.range(50, 501);
            std::thread::sleep(Duration::from_millis(wait));
            let sk = m.stats();
            m.kill_daemon();
            for h in readers {
                // Wrong data panics in the reader; I/O errors after the kill are expected.
                if let Err(p) = h.join() {
                    std::panic::resume_unwind(p);
                }
            }
            let read_ok = verified.load(SeqCst);
            assert!(
                !is_mounted(&mnt),
                "round {round}: still mounted after kill -9"
            );
            let entries = n(&sk, "ssd.entries");
            // Admitted by this daemon and not yet in the index: queued or being written.
            let queued = n(&sk, "ssd.admitted").saturating_sub(entries.saturating_sub(rebuilt));
            if queued > 0 {
                backlog_rounds += 1;
            }
            assert_eq!(
                (n(&sk, "ssd.checksum_errors"), n(&sk, "ssd.io_errors")),
                (0, 0),
                "round {round}: the tier saw damage after a kill -9: {sk}"
            );
            println!(
                "kill9: {round:5}  {wait:7}  {:10}  {rebuilt:7}  {:16}  {:13}  {queued:11}  \
                 {entries:12}  {:>12}",
                n(&s0, "ssd.rebuild_ms"),
                n(&s1, "ssd_blocks"),
                n(&sk, "ssd.admitted"),
                mib(read_ok),
            );
            prev_entries = entries;
        }

        // The end: every file, exact; then a clean unmount and a restart from the checkpoint.
        mount(&m, OPTS);
        let s0 = m.stats();
        assert!(
            n(&s0, "ssd.rebuilt_entries") >= prev_entries,
            "the last rebuild lost entries: {s0}"
        );
        verify_all(&mnt, &files, false);
        let s1 = m.stats();
        m.unmount_and_wait();
        mount(&m, OPTS);
        let s2 = m.stats();
        m.unmount_and_wait();
        println!(
            "kill9: after {ROUNDS} kills: rebuild {} ms, {} entries; all {} MiB verified, {} \
             blocks from the SSD tier, {} MiB from the backing store; clean restart: {} entries \
             from the checkpoint in {} ms; total {:.1} s",
            n(&s0, "ssd.rebuild_ms"),
            n(&s0, "ssd.rebuilt_entries"),
            mib(total_size(&files)),
            n(&s1, "ssd_blocks"),
            mib(n(&s1, "backing.read_bytes")),
            n(&s2, "ssd.rebuilt_entries"),
            n(&s2, "ssd.rebuild_ms"),
            secs(t_all.elapsed()),
        );
        assert!(prev_entries > 0, "nothing was ever admitted");
        assert!(
            n(&s0, "ssd.rebuilt_entries") > 0 && n(&s1, "ssd_blocks") > 0,
            "the SSD tier served nothing after the kills: {s1}"
        );
        assert!(
            backlog_rounds > 0,
            "no kill happened while entries were queued for writing"
        );
        assert!(
            n(&s2, "ssd.rebuilt_entries") >= n(&s1, "ssd.entries"),
            "the clean restart lost entries: {s2}"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 4. Write budget
// ---------------------------------------------------------------------------------------------

/// With a write budget of 4 MiB/s and a burst of 8 MiB, reading 200 MiB (paced at 50 MiB/s so
/// the budget is under pressure the whole time) writes at most burst + rate × T bytes to the
/// SSD tier, T being the time since before the mount started (an upper bound on the age of
/// the token bucket, which starts full when the tier opens), and the excess is refused
/// (`dropped_budget`).
///
/// Slack: one cluster (1 MiB) plus its summary page. Offers take an estimate of an entry's
/// cost; the writer charges a cluster's real cost (summary page, padding) when it writes it,
/// so the bucket can end up below zero by at most one cluster's unestimated overhead (offers
/// keep 8 KiB of headroom for exactly that). `written_bytes` counts everything written to
/// the segment files, summaries and padding included.
#[test]
fn write_budget_is_respected() {
    const RATE: u64 = 4 * MIB;
    const BURST: u64 = 8 * MIB;
    const SLACK: u64 = MIB + PAGE as u64;
    const PACE: f64 = 50.0 * MIB as f64; // bytes/s
    let seed = test_seed("write_budget_is_respected");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(120), vec![mnt.clone()], move || {
        let files = make_files(&m.backing, seed, "w", &[50 * MIB; 4]);
        settle();
        let t0 = Instant::now();
        mount(
            &m,
            &["ssd.write_rate=4M", "ssd.write_burst=8M", "ram.max=32M"],
        );
        let t_read = Instant::now();
        let mut read = 0u64;
        let mut buf = vec![0u8; CHUNK];
        for f in &files {
            let file = std::fs::File::open(mnt.join(&f.name)).unwrap();
            let mut off = 0;
            while off < f.size {
                let k = file.read_at(&mut buf, off).unwrap();
                assert!(k > 0, "{}: EOF at {off}", f.name);
                f.check(off, &buf[..k]);
                off += k as u64;
                read += k as u64;
                let due = Duration::from_secs_f64(read as f64 / PACE);
                if let Some(ahead) = due.checked_sub(t_read.elapsed()) {
                    std::thread::sleep(ahead);
                }
            }
        }
        let check = |what: &str| {
            let s = m.stats();
            let t = t0.elapsed();
            let written = n(&s, "ssd.written_bytes");
            let limit = BURST + (RATE as f64 * secs(t)) as u64 + SLACK;
            println!(
                "budget ({what}): burst {BURST}, rate {RATE}/s, T {:.2} s, written {written} \
                 ({:.2} MiB), limit {limit} ({:.2} MiB, margin {:.2} MiB); admitted {} MiB, \
                 dropped_budget {}, clusters {}, cur_burst {}",
                secs(t),
                mib(written),
                mib(limit),
                mib(limit.saturating_sub(written)),
                mib(n(&s, "ssd.admitted_bytes")),
                n(&s, "ssd.dropped_budget"),
                n(&s, "ssd.clusters_written"),
                n(&s, "ssd.cur_burst"),
            );
            assert_eq!(
                (n(&s, "ssd.write_rate"), n(&s, "ssd.write_burst")),
                (RATE, BURST)
            );
            assert!(
                written <= limit,
                "{written} bytes written to the SSD tier in {t:?}: more than burst {BURST} + \
                 rate {RATE}/s x T + slack {SLACK} = {limit}: {s}"
            );
            s
        };
        let s1 = check(&format!("after reading {} MiB", mib(read)));
        assert!(
            n(&s1, "ssd.dropped_budget") > 0,
            "reading 200 MiB never ran out of budget: {s1}"
        );
        assert!(
            n(&s1, "ssd.written_bytes") >= BURST / 2,
            "the budget was not used: {s1}"
        );
        // The partial cluster is written after flush_interval (2 s): still within the budget.
        std::thread::sleep(Duration::from_millis(2500));
        check("2.5 s later");
        m.unmount_and_wait();
    });
}

// ---------------------------------------------------------------------------------------------
// 5. Fill cap, reclaim, hot set
// ---------------------------------------------------------------------------------------------

/// An SSD tier capped at 128 MiB (8 MiB segments) and a working set of 3x that: a hot set of
/// 24 MiB read again after every 32 MiB of a cold scan of the rest (RAM tier 16 MiB: the hot
/// set does not fit, so its reads reach the SSD tier). Sampled all along, the fill never
/// exceeds the cap; segments are reclaimed; the hot set is rewritten when its segments are
/// reclaimed (it was read), so after a restart (RAM cold) at least 80% of its blocks come from
/// the SSD tier. The device guard holds: the cap is within max_fill_pct (75%) of the device and
/// the device keeps min_free_pct (`MIN_FREE_PCT`) free.
///
/// A bug this found, fixed: `SsdCache::get_many` computed the span of a run of adjacent
/// entries before checking that the next entry was in the same segment; once reclaim had
/// rewritten part of a file into a newer segment, the subtraction underflowed (a panic in
/// debug builds) and the reader got EIO.
#[test]
fn fill_cap_and_hot_set_survive_cold_scan() {
    const CAP: u64 = 128 * MIB;
    const OPTS: &[&str] = &[
        "ssd.max_size=128M",
        "ssd.segment_size=8M",
        "ssd.cluster_size=1M",
        "ram.max=16M",
    ];
    let seed = test_seed("fill_cap_and_hot_set_survive_cold_scan");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(240), vec![mnt.clone()], move || {
        let hot = make_files(&m.backing, seed, "hot", &[8 * MIB; 3]);
        let mut cold_sizes = vec![8 * MIB; 45];
        cold_sizes[44] -= 4321;
        let cold = make_files(&m.backing, seed ^ 0xC01D, "cold", &cold_sizes);
        let (hot_bytes, cold_bytes) = (total_size(&hot), total_size(&cold));
        settle();
        mount(&m, OPTS);

        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (mnt, stop) = (mnt.clone(), stop.clone());
            std::thread::spawn(move || {
                let t = Instant::now();
                let mut samples = Vec::new();
                while !stop.load(SeqCst) {
                    let s = stats_of(&mnt);
                    samples.push((t.elapsed(), s));
                    std::thread::sleep(Duration::from_millis(50));
                }
                samples
            })
        };
        let t = Instant::now();
        verify_all(&mnt, &hot, true);
        wait_writer_idle(&mnt, Duration::from_millis(200));
        for chunk in cold.chunks(4) {
            for f in chunk {
                read_verify(&mnt.join(&f.name), f, true).unwrap();
            }
            wait_writer_idle(&mnt, Duration::from_millis(200));
            verify_all(&mnt, &hot, true);
        }
        let scan = t.elapsed();
        stop.store(true, SeqCst);
        let samples = sampler.join().unwrap();
        let se = m.stats();

        println!("fill: t_ms  fill_MiB  cap_MiB  segments  reclaimed  reinsertions");
        let every = (samples.len() / 25).max(1);
        for (i, (t, s)) in samples.iter().enumerate() {
            if i % every == 0 || i + 1 == samples.len() {
                println!(
                    "fill: {:5}  {:>8}  {:>7}  {:8}  {:9}  {:12}",
                    t.as_millis(),
                    mib(n(s, "ssd.fill_bytes")),
                    mib(n(s, "ssd.cap_bytes")),
                    n(s, "ssd.segments"),
                    n(s, "ssd.reclaimed_segments"),
                    n(s, "ssd.reinsertions"),
                );
            }
        }
        let max_fill = samples
            .iter()
            .map(|(_, s)| n(s, "ssd.fill_bytes"))
            .max()
            .unwrap_or(0);
        println!(
            "fill: scan of {} MiB cold + hot passes of {} MiB in {:.1} s; {} samples, max fill \
             {} MiB of {} MiB; reclaimed {} segments, {} reinsertions, dropped offers {}",
            mib(cold_bytes),
            mib(hot_bytes),
            secs(scan),
            samples.len(),
            mib(max_fill),
            mib(n(&se, "ssd.cap_bytes")),
            n(&se, "ssd.reclaimed_segments"),
            n(&se, "ssd.reinsertions"),
            dropped(&se),
        );
        assert!(samples.len() >= 10, "too few samples: {}", samples.len());
        for (t, s) in samples.iter().chain(std::iter::once(&(scan, se.clone()))) {
            assert_eq!(n(s, "ssd.cap_bytes"), CAP, "{s}");
            assert!(
                n(s, "ssd.fill_bytes") <= n(s, "ssd.cap_bytes"),
                "fill above the cap at {t:?}: {s}"
            );
        }
        assert!(
            n(&se, "ssd.reclaimed_segments") > 0,
            "{} MiB through a {} MiB cap and nothing reclaimed: {se}",
            mib(cold_bytes + hot_bytes),
            mib(CAP)
        );
        assert!(
            n(&se, "ssd.reinsertions") > 0,
            "the hot set was never rewritten: {se}"
        );

        // Device guard (statvfs of the cache directory, as the tier computes it).
        let c = std::ffi::CString::new(m.cache.join("ssd").to_str().unwrap()).unwrap();
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
        let device = sv.f_blocks as u64 * sv.f_frsize as u64;
        let (cap, free) = (n(&se, "ssd.cap_bytes"), n(&se, "ssd.device_free_bytes"));
        println!(
            "fill: device {} GiB: cap {:.3} GiB <= 75% = {} GiB; free {} GiB >= {MIN_FREE_PCT}% = {} GiB",
            gib(device),
            gib(cap),
            gib(device * 75 / 100),
            gib(free),
            gib(device * MIN_FREE_PCT / 100),
        );
        assert!(cap <= device * 75 / 100, "cap {cap} over 75% of {device}");
        assert!(
            free >= device * MIN_FREE_PCT / 100,
            "device free {free} below {MIN_FREE_PCT}% of {device}"
        );

        // The hot set, RAM cold: a clean restart.
        m.unmount_and_wait();
        mount(&m, OPTS);
        let sa = m.stats();
        verify_all(&mnt, &hot, true);
        let sb = m.stats();
        m.unmount_and_wait();
        let from_ssd = n(&sb, "ssd_blocks") - n(&sa, "ssd_blocks");
        let from_backing =
            (n(&sb, "backing.read_bytes") - n(&sa, "backing.read_bytes")).div_ceil(BS);
        let ratio = from_ssd as f64 / (from_ssd + from_backing).max(1) as f64;
        println!(
            "fill: hot set after a restart ({} entries, {} MiB filled): {from_ssd} blocks \
             from the SSD tier, {from_backing} from the backing store: hit ratio {ratio:.3}",
            n(&sa, "ssd.entries"),
            mib(n(&sa, "ssd.fill_bytes")),
        );
        for s in [&sa, &sb] {
            assert!(n(s, "ssd.fill_bytes") <= n(s, "ssd.cap_bytes"), "{s}");
        }
        assert!(
            from_ssd + from_backing >= hot_bytes / BS,
            "the hot set was not read through tierfs: {sb}"
        );
        assert!(
            ratio >= 0.8,
            "only {ratio:.3} of the hot set's blocks came from the SSD tier after the cold scan"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 6. Listings after a remount
// ---------------------------------------------------------------------------------------------

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

/// What `stat` shows of every entry under `root` (relative path -> mode, size, nlink, mtime).
fn stat_tree(root: &Path) -> std::collections::BTreeMap<String, (u32, u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let p = rel.join(e.file_name());
            let md = std::fs::symlink_metadata(root.join(&p)).unwrap();
            if md.is_dir() {
                todo.push(p.clone());
            }
            let (mode, size, nlink) = (md.mode(), md.size(), md.nlink());
            out.insert(
                p.to_string_lossy().into_owned(),
                (
                    mode,
                    if md.is_dir() { 0 } else { size },
                    nlink,
                    md.mtime(),
                    md.mtime_nsec(),
                ),
            );
        }
    }
    out
}

/// The read-mostly tuning (`meta.ttl=1h,meta.cto=off`) trusts a directory's listing for an
/// hour from when it was listed, and the SSD tier keeps listings across a remount. After a
/// clean remount, a tree walk (`find` + `stat`) lists from the store again only the
/// directories whose entries changed through tierfs (a chmod, an append, a create inside a
/// subdirectory, a utimes) or hold a hard-linked file, and shows every entry exactly as the
/// store has it; after `kill -9` (drops of records may be lost) it lists every directory it
/// walks again, and still shows the store's attributes.
#[test]
fn listings_after_a_remount_answer_lookups_but_never_from_before_a_change() {
    const OPTS: &[&str] = &["meta.ttl=1h", "meta.cto=off"];
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(240), vec![mnt.clone()], move || {
        let b = &m.backing;
        for d in 0..8 {
            for f in 0..20 {
                std::fs::create_dir_all(b.join(format!("d{d}/sub"))).unwrap();
                std::fs::write(b.join(format!("d{d}/f{f}")), vec![b'x'; 100 + f]).unwrap();
            }
        }
        // A hard link between d6 and d7: either directory's record cannot be kept current
        // when the file changes through the other name.
        std::fs::hard_link(b.join("d6/f1"), b.join("d7/h1")).unwrap();
        settle();
        let walk = |label: &str| {
            // Directories changed less than `RACY_WINDOW` ago are not persisted.
            settle();
            let before = m.stats();
            let seen = stat_tree(&mnt);
            let want = stat_tree(b);
            for (p, w) in &want {
                let got = seen
                    .get(p)
                    .unwrap_or_else(|| panic!("{label}: {p} missing"));
                // Directories' times are the store's business (its mtime moves with a
                // create); files must match in everything.
                if p.contains('f') || p.contains('h') {
                    assert_eq!(
                        got, w,
                        "{label}: {p}: (mode, size, nlink, mtime) through the mount vs the store"
                    );
                }
            }
            assert_eq!(seen.len(), want.len(), "{label}");
            let after = m.stats();
            n(&after, "meta_listings") - n(&before, "meta_listings")
        };

        mount(&m, OPTS);
        let first = walk("first walk");
        assert!(first >= 17, "first walk listed {first} directories");
        // Changes through the mount, one directory each.
        chmod(&mnt.join("d0/f3"), 0o600);
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(mnt.join("d1/f4"))
            .unwrap();
        f.write_all_at(b"more", 0).unwrap();
        drop(f);
        std::fs::write(mnt.join("d2/sub/new"), b"new").unwrap();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let f5 = std::fs::File::options().write(true).open(mnt.join("d3/f5"));
        f5.unwrap().set_modified(t).unwrap();
        chmod(&mnt.join("d6/f1"), 0o640);
        walk("after the changes");
        wait_writer_idle(&mnt, Duration::from_secs(2));
        m.unmount_and_wait();

        let remount = |label: &str| {
            drop_caches();
            mount(&m, OPTS);
            walk(label)
        };
        let listed = remount("after a clean remount");
        // d0, d1, d2 (its subdirectory's times moved), d2/sub (its own names changed), d3,
        // d6 and d7 (the hard link): 7 of 17. Before the session epoch, all 17.
        println!("listings: first walk {first}, after a clean remount {listed}");
        assert!(
            listed <= 7,
            "{listed} directories listed from the store after a clean remount (7 changed)"
        );
        // A change, then a crash: records of that session are not trusted.
        chmod(&mnt.join("d4/f2"), 0o604);
        m.kill_daemon();
        let after_crash = remount("after kill -9");
        // Every directory: a record of another session is a miss.
        assert!(
            after_crash >= 17,
            "{after_crash} directories listed after kill -9: records from before a crash were trusted"
        );
        m.unmount_and_wait();
        let again = remount("after the next clean remount");
        println!("listings: after kill -9 {after_crash}, after the next clean remount {again}");
        assert!(
            again <= 3,
            "{again} directories listed after a clean remount of an unchanged tree"
        );
        m.unmount_and_wait();
    });
}
