//! The operator's tools, through the real binary and real mounts: `tierfs warm` (a 50,000-file
//! tree warmed with progress lines, then read with the kernel's caches dropped and the RAM tier
//! cold: every byte from the SSD tier, none from the backing store; the write budget paces a
//! warm unless `--no-budget`), `tierfs evict` (the next reads go to the backing store, also
//! after a restart), and `tierfs fsck` (clean, damaged, repaired, refused).
//!
//! Data lives under /var/tmp (a real disk: O_DIRECT works; /tmp may be a tmpfs). Files age
//! past `tierfs_fs::RACY_WINDOW` before they are warmed, so warm does not wait for them.
//! Mounts pass `ssd.min_free_pct=1`: the test machine's disk may be nearly as full as the
//! default guard (10%), which would pause admission and test nothing.

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TMP: &str = "/var/tmp";
const MIB: u64 = 1 << 20;
/// The default block size: the unit of the SSD tier's data entries.
const BS: u64 = 64 << 10;
const BASE: &str = "ssd.min_free_pct=1";

fn seed(test: &str) -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let s = mix(t ^ mix(test.len() as u64) ^ std::process::id() as u64);
    println!("{test}: seed {s:#018x}");
    s
}

/// Deterministic contents of a file: `len` bytes from `key`.
fn content(key: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(key);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A file of a data set: path relative to BACKING (and the mount), size, key of its bytes.
struct Spec {
    rel: PathBuf,
    size: u64,
    key: u64,
}

/// Writes `dirs` x `per_dir` files of `size(i)` bytes under `root/sub`.
fn make_tree(
    root: &Path,
    sub: &str,
    seed: u64,
    dirs: usize,
    per_dir: usize,
    size: impl Fn(u64) -> u64,
) -> Vec<Spec> {
    let mut out = Vec::with_capacity(dirs * per_dir);
    for d in 0..dirs {
        let dir = Path::new(sub).join(format!("d{d:03}"));
        std::fs::create_dir_all(root.join(&dir)).unwrap();
        for f in 0..per_dir {
            let i = (d * per_dir + f) as u64;
            let key = mix(seed ^ mix(i + 1));
            let s = Spec {
                rel: dir.join(format!("f{f:04}")),
                size: size(key),
                key,
            };
            std::fs::write(root.join(&s.rel), content(key, s.size as usize)).unwrap();
            out.push(s);
        }
    }
    out
}

/// Waits until the files written so far are old enough for tierfs to cache their blocks.
fn settle() {
    std::thread::sleep(tierfs_fs::RACY_WINDOW + Duration::from_millis(150));
}

/// Reads every file through the mount and compares it with what was written.
fn verify_all(mnt: &Path, files: &[Spec]) {
    for f in files {
        let got = std::fs::read(mnt.join(&f.rel))
            .unwrap_or_else(|e| panic!("read {}: {e}", f.rel.display()));
        assert!(
            got == content(f.key, f.size as usize),
            "{}: WRONG DATA through the mount",
            f.rel.display()
        );
    }
}

fn total(files: &[Spec]) -> u64 {
    files.iter().map(|f| f.size).sum()
}

fn blocks(files: &[Spec]) -> u64 {
    files.iter().map(|f| f.size.div_ceil(BS)).sum()
}

/// Runs `tierfs ARGS` (under a timeout), stdin closed, stdout and stderr captured (so not a
/// terminal: progress comes as plain lines).
fn tierfs(args: &[&str], paths: &[&Path]) -> Output {
    let mut c = Command::new("timeout");
    c.arg("300").arg(tierfs_bin()).args(args);
    for p in paths {
        c.arg(p);
    }
    let out = c
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run tierfs");
    println!(
        "$ tierfs {} {:?}: {}\n{}{}",
        args.join(" "),
        paths,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ok(out: &Output) -> (String, String) {
    assert!(out.status.success(), "tierfs failed: {out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ---------------------------------------------------------------------------------------------
// warm
// ---------------------------------------------------------------------------------------------

/// 50,000 small files (500 directories of 100, 200 B to 4 KiB): `tierfs warm MNT` prints
/// progress lines and warms every one; after an unmount, `drop_caches` and a new mount (new
/// daemon: the RAM tier is cold), reading every file is served from the SSD tier with not
/// one data read from the backing store, and every byte is right.
#[test]
fn warm_50k_files_then_cold_reads_come_from_ssd() {
    const DIRS: usize = 500;
    const PER_DIR: usize = 100;
    const FILES: u64 = (DIRS * PER_DIR) as u64;
    let seed = seed("warm_50k_files_then_cold_reads_come_from_ssd");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(900), vec![mnt.clone()], move || {
        let t = Instant::now();
        let files = make_tree(&m.backing, "tree", seed, DIRS, PER_DIR, |k| 200 + k % 3900);
        println!(
            "warm50k: made {FILES} files, {} bytes, in {:.1} s",
            total(&files),
            t.elapsed().as_secs_f64()
        );
        settle();
        m.mount(&[BASE]);
        let t = Instant::now();
        let out = tierfs(&["warm"], &[&mnt.join("tree")]);
        let took = t.elapsed();
        let (stdout, stderr) = ok(&out);
        let progress: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("tierfs warm: ") && l.contains(&format!("/{FILES} files")))
            .collect();
        assert!(
            !progress.is_empty(),
            "no progress lines in {:.1} s: {stderr}",
            took.as_secs_f64()
        );
        assert!(
            progress
                .iter()
                .all(|l| l.contains("ETA") && l.contains("/s")),
            "{progress:?}"
        );
        assert!(
            stdout.contains(&format!("tierfs warm: {FILES} files")),
            "{stdout}"
        );
        let s1 = m.stats();
        assert_eq!(n(&s1, "warm.files"), FILES, "{s1}");
        assert_eq!(n(&s1, "warm.failed"), 0);
        assert_eq!(n(&s1, "warm.admitted_bytes"), total(&files));
        m.unmount_and_wait();
        drop_caches();

        m.mount(&[BASE]);
        let s2a = m.stats();
        let t = Instant::now();
        verify_all(&mnt, &files);
        let read = t.elapsed();
        let s2 = m.stats();
        println!(
            "warm50k: warm {:.1} s ({} progress lines); after remount: index of {} entries \
             rebuilt in {} ms; read {FILES} files in {:.1} s: ssd_blocks {}, ssd hits {}, \
             window reads {}, backing reads {} ({} bytes), ram hits {}",
            took.as_secs_f64(),
            progress.len(),
            n(&s2a, "ssd.rebuilt_entries"),
            n(&s2a, "ssd.rebuild_ms"),
            read.as_secs_f64(),
            n(&s2, "ssd_blocks"),
            n(&s2, "ssd.hits"),
            n(&s2, "ssd.window_reads"),
            n(&s2, "backing.read"),
            n(&s2, "backing.read_bytes"),
            n(&s2, "ram.hits"),
        );
        assert_eq!(n(&s2a, "ram.bytes"), 0, "RAM tier not cold: {s2a}");
        assert_eq!(
            (n(&s2, "backing.read"), n(&s2, "backing.read_bytes")),
            (0, 0),
            "data read from the backing store after warm: {s2}"
        );
        assert!(
            n(&s2, "ssd_blocks") >= FILES,
            "not every file came from the SSD tier: {s2}"
        );
        m.unmount_and_wait();
    });
}

/// A budgeted warm is paced by the SSD write budget (burst 8 MiB, 4 MiB/s): the bytes written
/// to the tier stay within burst + rate x T, yet every block is admitted (it waits, it does not
/// skip). `--no-budget` then writes as fast as it goes, far past the budget, and the bucket is
/// not charged for it.
#[test]
fn warm_respects_the_write_budget_unless_told_not_to() {
    const RATE: u64 = 4 * MIB;
    const BURST: u64 = 8 * MIB;
    // One cluster and its summary page (see ssd.rs, write_budget_is_respected).
    const SLACK: u64 = MIB + 4096;
    let seed = seed("warm_respects_the_write_budget_unless_told_not_to");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(300), vec![mnt.clone()], move || {
        let a = make_tree(&m.backing, "a", seed, 1, 4, |_| 10 * MIB);
        let b = make_tree(&m.backing, "b", seed ^ 1, 1, 4, |_| 10 * MIB);
        settle();
        let t0 = Instant::now();
        m.mount(&[BASE, "ssd.write_rate=4M", "ssd.write_burst=8M"]);
        let check = |what: &str| {
            let s = m.stats();
            let t = t0.elapsed().as_secs_f64();
            let written = n(&s, "ssd.written_bytes");
            let limit = BURST + (RATE as f64 * t) as u64 + SLACK;
            println!(
                "budget ({what}): T {t:.2} s, written {written}, limit {limit}, admitted {}, \
                 dropped_budget {}",
                n(&s, "ssd.admitted_bytes"),
                n(&s, "ssd.dropped_budget")
            );
            assert!(written <= limit, "{what}: {written} > {limit}: {s}");
            s
        };
        let t = Instant::now();
        ok(&tierfs(&["warm"], &[&mnt.join("a")]));
        let took = t.elapsed();
        let s1 = check("after the budgeted warm");
        assert_eq!(n(&s1, "warm.admitted_bytes"), total(&a));
        assert_eq!(n(&s1, "ssd.admitted_unbudgeted_bytes"), 0);
        // 40 MiB with 8 at once and 4 per second: about 8 s.
        let min = Duration::from_secs_f64((total(&a) - BURST) as f64 / RATE as f64 * 0.85);
        assert!(
            took >= min,
            "the warm took {took:?}: not paced (at least {min:?})"
        );
        std::thread::sleep(Duration::from_millis(2500));
        let s2 = check("2.5 s later");
        assert!(
            n(&s2, "ssd.entries") >= blocks(&a),
            "not every block is in the SSD tier: {s2}"
        );

        let w0 = n(&s2, "ssd.written_bytes");
        let t = Instant::now();
        ok(&tierfs(&["warm", "--no-budget"], &[&mnt.join("b")]));
        let took = t.elapsed();
        std::thread::sleep(Duration::from_millis(2500));
        let s3 = m.stats();
        let w = n(&s3, "ssd.written_bytes") - w0;
        println!(
            "budget: --no-budget warm of {} bytes took {took:?}; {w} bytes written; cur_burst {}",
            total(&b),
            n(&s3, "ssd.cur_burst")
        );
        assert_eq!(n(&s3, "ssd.admitted_unbudgeted_bytes"), total(&b));
        assert!(w >= total(&b), "not all written: {s3}");
        assert!(
            w > BURST + (RATE as f64 * took.as_secs_f64()) as u64,
            "--no-budget was paced like a budgeted warm: {w} bytes in {took:?}"
        );
        // Not charged: the bucket refilled as usual meanwhile (it would be 40 MiB in debt).
        assert!(n(&s3, "ssd.cur_burst") >= RATE, "{s3}");
        m.unmount_and_wait();
    });
}

// ---------------------------------------------------------------------------------------------
// evict
// ---------------------------------------------------------------------------------------------

/// After `tierfs evict DIR` the files' next reads go to the backing store (the RAM and SSD
/// tiers and the kernel's page cache dropped them), and after a restart too (the SSD tier
/// logged tombstones).
#[test]
fn evict_sends_reads_back_to_the_backing_store() {
    let seed = seed("evict_sends_reads_back_to_the_backing_store");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(300), vec![mnt.clone()], move || {
        let files = make_tree(&m.backing, "e", seed, 2, 4, |k| 2 * MIB - k % 5000);
        let size = total(&files);
        settle();
        let opts = [BASE, "ssd.flush_interval=200ms"];
        m.mount(&opts);
        ok(&tierfs(&["warm"], &[&mnt.join("e")]));
        verify_all(&mnt, &files);
        let s1 = m.stats();
        assert!(n(&s1, "ram.blocks") > 0);
        let (out, _) = ok(&tierfs(&["evict"], &[&mnt.join("e")]));
        assert!(
            out.contains("tierfs evict: 8 files, 3 directories"),
            "{out}"
        );
        let s2 = m.stats();
        assert!(
            n(&s2, "ssd.evicted") >= blocks(&files),
            "evicted {} of {} blocks: {s2}",
            n(&s2, "ssd.evicted"),
            blocks(&files)
        );
        verify_all(&mnt, &files);
        let s3 = m.stats();
        let from_backing = n(&s3, "backing.read_bytes") - n(&s2, "backing.read_bytes");
        println!(
            "evict: {size} bytes; read after evict: {from_backing} bytes from the backing store"
        );
        assert!(from_backing >= size, "{from_backing} < {size}: {s3}");

        // Those reads admitted the blocks again: evict them, and restart.
        ok(&tierfs(&["evict"], &[&mnt.join("e")]));
        m.unmount_and_wait();
        drop_caches();
        m.mount(&opts);
        verify_all(&mnt, &files);
        let s4 = m.stats();
        assert!(
            n(&s4, "backing.read_bytes") >= size,
            "evicted blocks came back after a restart: {s4}"
        );
        assert_eq!(n(&s4, "ssd_blocks"), 0, "{s4}");
        m.unmount_and_wait();
    });
}

/// Bad input: one line on stderr and a non-zero exit, never a panic.
#[test]
fn warm_and_evict_refuse_paths_off_tierfs() {
    let m = BinMount::new(&[BASE]);
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        for (args, path, want) in [
            (&["warm"][..], m.mnt.join("missing"), "No such file"),
            (&["evict"][..], m.mnt.join("missing"), "No such file"),
            (&["warm"][..], m.backing.clone(), "not on a tierfs mount"),
            (&["evict"][..], PathBuf::from("/"), "not on a tierfs mount"),
        ] {
            let out = tierfs(args, &[&path]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(err.contains(want), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        let out = tierfs(&["warm"], &[]);
        assert_eq!(out.status.code(), Some(2), "clap usage error");
    });
}

// ---------------------------------------------------------------------------------------------
// fsck
// ---------------------------------------------------------------------------------------------

/// Flips one byte in the data area of each of the last `k` clusters of the newest segment;
/// returns how many bytes it flipped.
fn damage_entries(cache: &Path, k: usize) -> usize {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(cache.join("ssd"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("seg-"))
        .collect();
    segs.sort();
    let seg = segs.last().expect("a segment");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(seg)
        .unwrap();
    let size = f.metadata().unwrap().len();
    let mut clusters = Vec::new();
    let mut off = 0;
    while off < size {
        let mut h = [0u8; 64];
        f.read_exact_at(&mut h, off).unwrap();
        let summary = u32::from_le_bytes(h[40..44].try_into().unwrap()) as u64;
        let len = u32::from_le_bytes(h[44..48].try_into().unwrap()) as u64;
        clusters.push(off + summary);
        off += len;
    }
    let picked = &clusters[clusters.len().saturating_sub(k)..];
    for &at in picked {
        let at = at + 1000;
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        b[0] ^= 0x5A;
        f.write_all_at(&b, at).unwrap();
    }
    f.sync_all().unwrap();
    picked.len()
}

/// The number after the first `label` in `out`.
fn count_in(out: &str, label: &str) -> u64 {
    let at = out
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {out}"))
        + label.len();
    out[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label:?} in {out}"))
}

fn fsck(args: &[&str], dir: &Path) -> (Option<i32>, String, String) {
    let mut a = vec!["fsck"];
    a.extend_from_slice(args);
    let out = tierfs(&a, &[dir]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `tierfs fsck`: a clean cache says clean (exit 0); flipped bytes in entries are reported
/// as bad entries (exit 1); `--repair` drops them (exit 1, "now clean"); then fsck says clean
/// and a mount serves every byte right, only the dropped blocks from the backing store. A
/// cache dir in use by a mount is refused (exit 2), and so is a directory that is not one.
#[test]
fn fsck_checks_repairs_and_refuses() {
    let seed = seed("fsck_checks_repairs_and_refuses");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(300), vec![mnt.clone()], move || {
        let files = make_tree(&m.backing, "f", seed, 2, 8, |_| MIB);
        settle();
        m.mount(&[BASE]);
        ok(&tierfs(&["warm", "--no-budget"], &[&mnt.join("f")]));

        let (code, _, err) = fsck(&[], &m.cache);
        assert_eq!(code, Some(2), "a mounted cache dir: {err}");
        assert!(err.contains("in use by a running tierfs mount"), "{err}");
        m.unmount_and_wait();

        let (code, out, _) = fsck(&[], &m.cache);
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains("verdict: clean"), "{out}");
        let entries = count_in(&out, ", entries ");
        assert!(entries >= blocks(&files), "{out}");
        assert!(out.contains("bad entries 0"), "{out}");

        let flipped = damage_entries(&m.cache, 3);
        let (code, out, _) = fsck(&[], &m.cache);
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains(&format!("bad entries {flipped}")), "{out}");
        assert_eq!(
            out.lines()
                .filter(|l| l.contains("checksum mismatch"))
                .count(),
            flipped,
            "{out}"
        );

        let (code, out, _) = fsck(&["--repair"], &m.cache);
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains("now clean"), "{out}");
        let (code, out, _) = fsck(&[], &m.cache);
        assert_eq!(code, Some(0), "{out}");
        assert_eq!(
            count_in(&out, ", entries "),
            entries - flipped as u64,
            "the repair dropped more than the bad entries: {out}"
        );

        drop_caches();
        m.mount(&[BASE]);
        verify_all(&mnt, &files);
        let s = m.stats();
        println!(
            "fsck: after repair: ssd_blocks {}, backing read {} bytes, checksum errors {}",
            n(&s, "ssd_blocks"),
            n(&s, "backing.read_bytes"),
            n(&s, "ssd.checksum_errors")
        );
        assert_eq!(n(&s, "ssd.checksum_errors"), 0, "{s}");
        let from_backing = n(&s, "backing.read_bytes");
        assert!(
            from_backing > 0 && from_backing <= flipped as u64 * BS,
            "only the dropped blocks come from the backing store: {s}"
        );
        m.unmount_and_wait();

        // Not a cache directory; a missing one.
        let (code, _, err) = fsck(&[], &m.backing);
        assert_eq!(code, Some(2));
        assert!(err.contains("not a tierfs cache directory"), "{err}");
        let (code, _, err) = fsck(&[], &m.dir.path().join("nowhere"));
        assert_eq!(code, Some(2));
        assert_eq!(err.lines().count(), 1, "{err}");
    });
}

/// fsck reports a write-back journal's pending writes and says the next mount replays them
/// (clean: exit 0); a torn tail is a problem that `--repair` fixes by sealing it, and the
/// pending writes are still there afterwards.
#[test]
fn fsck_reports_pending_journal_writes_and_never_drops_them() {
    let d = tempfile::Builder::new()
        .prefix("tierfs-test-")
        .tempdir_in(TMP)
        .unwrap();
    let jdir = d.path().join("journal");
    let end = {
        let (j, _) = tierfs_cache::Journal::open(
            &jdir,
            "store-x",
            tierfs_cache::JournalConfig::default(),
            false,
        )
        .unwrap();
        let f = tierfs_cache::FileRef {
            dev: 1,
            ino: 2,
            path: b"some/file.txt".to_vec(),
        };
        j.append_data(&f, 0, &[7u8; 10000]).unwrap();
        j.append_data(&f, 10000, &[8u8; 5000]).unwrap();
        j.sync_all().unwrap();
        j.shutdown();
        tierfs_cache::Journal::inspect(&jdir).unwrap().bytes
    };
    let (code, out, _) = fsck(&[], d.path());
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("pending writes 2"), "{out}");
    assert!(out.contains("next mount replays them"), "{out}");
    assert!(out.contains("some/file.txt"), "{out}");

    let seg = std::fs::read_dir(&jdir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("jseg-")
        })
        .unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.write_all_at(&[0xEE; 64], end).unwrap();
    drop(f);
    let (code, out, _) = fsck(&[], d.path());
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("torn record"), "{out}");
    let (code, out, _) = fsck(&["--repair"], d.path());
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("torn tail sealed") && out.contains("now clean"),
        "{out}"
    );
    let (code, out, _) = fsck(&[], d.path());
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("pending writes 2"),
        "the repair lost pending writes: {out}"
    );
}
