//! End-to-end behaviour of real mounts: coherence with changes made behind tierfs's back,
//! atomicity of concurrent I/O, symlinks that point outside BACKING, errors of the backing store,
//! and the counters of `tierfs stats`.
//!
//! A note on timing that several tests depend on: tierfs does not cache blocks of a file whose
//! ctime is younger than `tierfs_fs::RACY_WINDOW` (1 s), because a write(2) moves mtime/ctime
//! when it *starts*, so a fetch that overlaps a write behind our back could otherwise be cached
//! as a mix of versions forever (see `racy` in crates/tierfs-fs/src/file_state.rs). Tests that
//! want blocks to be cached first let the file age past that window (`settle`).

mod common;
use common::*;
use std::alloc::Layout;
use std::fs::File;
use std::io::{Read, Write};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(90);

/// Waits until files written so far are old enough for tierfs to cache their blocks.
fn settle() {
    std::thread::sleep(tierfs_fs::RACY_WINDOW + Duration::from_millis(150));
}

/// A page-aligned buffer, as O_DIRECT wants.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

unsafe impl Send for Aligned {}

impl Aligned {
    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len.div_ceil(4096).max(1) * 4096, 4096).unwrap()
    }
    fn new(len: usize) -> Aligned {
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        assert!(!ptr.is_null());
        Aligned { ptr, len }
    }
}

impl Deref for Aligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.len)) }
    }
}

fn open_direct(p: &Path, write: bool) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .unwrap_or_else(|e| panic!("open {} O_DIRECT: {e}", p.display()))
}

/// Reads up to `max` bytes from offset 0 of an O_DIRECT file.
fn read_direct(f: &File, max: usize) -> Vec<u8> {
    let mut buf = Aligned::new(max.div_ceil(4096) * 4096);
    let mut got = 0;
    while got < max {
        let n = f.read_at(&mut buf[got..], got as u64).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    buf[..got.min(max)].to_vec()
}

/// open + read(2) to EOF + close, without a stat (so the kernel's cached size is what counts).
fn raw_read(p: &Path) -> Vec<u8> {
    let mut f = File::open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// The distinct byte values in `b`, sorted.
fn values(b: &[u8]) -> Vec<u8> {
    let mut seen = [false; 256];
    for &x in b {
        seen[x as usize] = true;
    }
    (0..=255u8).filter(|&v| seen[v as usize]).collect()
}

fn uniform(b: &[u8]) -> Option<u8> {
    let v = values(b);
    (v.len() == 1).then(|| v[0])
}

fn stat_u64(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("no {path:?} in stats {v}"))
}

// ---------------------------------------------------------------------------------------------
// 1a. Coherence with changes made behind tierfs's back
// ---------------------------------------------------------------------------------------------

/// Close-to-open: whatever another client does to the backing file, the next open through
/// the mount sees it, even though the kernel and tierfs trust metadata for an hour.
/// Covers in-place overwrite (same size), growth, shrinking, replacement by rename (a new
/// inode under the old name) and deletion.
///
/// Two bugs this found, both fixed: (1) after growth/shrink the kernel kept the size it had
/// cached for attr_ttl (1h) and clipped reads to it; tierfs now invalidates the kernel's
/// attributes at an open that finds the file changed (`OpenReply::attrs_stale`). (2) After a
/// rename over the name the kernel kept its 1h-old dentry and opened the replaced inode; tierfs
/// now answers such an open (backing nlink 0) with ESTALE, which makes the VFS look the path up
/// again (`Fs::open`).
#[test]
fn close_to_open_sees_backing_changes_with_long_ttl() {
    let m = BinMount::new(&["ram.max=64M", "ram.block_size=4K", "meta.ttl=1h"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let size = 3 * 4096 + 100;
    std::fs::write(backing.join("f"), vec![b'a'; size]).unwrap();
    settle();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let (mf, bf) = (mnt.join("f"), backing.join("f"));
        let check = |want: &[u8], what: &str| {
            let got = raw_read(&mf);
            assert!(
                got == want,
                "{what}: read {} bytes of values {:?}, want {} bytes of {:?}",
                got.len(),
                values(&got),
                want.len(),
                values(want)
            );
            // The size the kernel reports through the open file agrees too.
            let len = File::open(&mf).unwrap().metadata().unwrap().len();
            assert_eq!(len, want.len() as u64, "{what}: size through the mount");
        };
        // Warm every cache: tierfs's RAM tier, the kernel's page cache, attributes and names.
        check(&vec![b'a'; size], "initial");
        check(&vec![b'a'; size], "initial, cached");
        assert!(std::fs::metadata(&mf).unwrap().is_file());

        // In place, same size: only mtime/ctime say it changed.
        let w = std::fs::OpenOptions::new().write(true).open(&bf).unwrap();
        w.write_all_at(&vec![b'b'; size], 0).unwrap();
        check(&vec![b'b'; size], "overwritten in place");

        // Grown: the kernel's cached size (1h) must not clip the read.
        w.write_all_at(&vec![b'c'; 2 * size], 0).unwrap();
        check(&vec![b'c'; 2 * size], "grown in place");

        // Shrunk.
        w.set_len(100).unwrap();
        w.write_all_at(&[b'd'; 100], 0).unwrap();
        check(&[b'd'; 100], "shrunk in place");
        drop(w);

        // Replaced by rename, as editors, rsync and package managers do.
        std::fs::write(backing.join(".f.tmp"), vec![b'e'; size + 7]).unwrap();
        std::fs::rename(backing.join(".f.tmp"), &bf).unwrap();
        check(&vec![b'e'; size + 7], "replaced by rename");

        // Replaced by rename again, then opened with O_TRUNC through the mount: the file now
        // under the name is truncated and written, never the replaced one, which a reader of
        // the old version still holds open.
        let old = File::open(&bf).unwrap();
        std::fs::write(backing.join(".f.tmp"), vec![b'g'; size]).unwrap();
        std::fs::rename(backing.join(".f.tmp"), &bf).unwrap();
        let mut t = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&mf)
            .unwrap();
        std::io::Write::write_all(&mut t, b"truncated").unwrap();
        drop(t);
        assert_eq!(std::fs::read(&bf).unwrap(), b"truncated");
        let mut kept = Vec::new();
        (&old).read_to_end(&mut kept).unwrap();
        assert_eq!(
            kept,
            vec![b'e'; size + 7],
            "the replaced file was truncated"
        );
        check(b"truncated", "truncated through the mount");

        // Deleted: the next open fails as it would on the backing store.
        std::fs::remove_file(&bf).unwrap();
        let e = File::open(&mf).expect_err("open of a file deleted behind our back");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    });
    let st = m.stats();
    assert!(stat_u64(&st, &["version_changes"]) >= 3, "{st}");
}

/// A reader that keeps the file open sees a change made behind tierfs's back once meta.ttl
/// has passed (no reopen). The kernel's attribute TTL follows meta.ttl; when it runs out, the
/// next read makes the kernel ask tierfs for attributes (FUSE_AUTO_INVAL_DATA), tierfs asks the
/// backing store, and the new mtime/size make the kernel drop its pages and tierfs switch to a
/// new generation of blocks. Checked for buffered reads (page cache in play) and O_DIRECT
/// reads (tierfs's own RAM tier in play).
#[test]
fn kept_open_reader_sees_backing_change_after_ttl() {
    let m = BinMount::new(&["ram.max=64M", "ram.block_size=4K", "meta.ttl=200ms"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let size = 4 * 4096 + 10;
    std::fs::write(backing.join("f"), vec![1u8; size]).unwrap();
    settle();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let ttl_passed = || std::thread::sleep(Duration::from_millis(450));
        let buffered = File::open(mnt.join("f")).unwrap();
        let direct = open_direct(&mnt.join("f"), false);
        let read_buffered = |max: usize| {
            let mut b = vec![0u8; max];
            let mut got = 0;
            loop {
                let n = buffered.read_at(&mut b[got..], got as u64).unwrap();
                if n == 0 {
                    break;
                }
                got += n;
            }
            b.truncate(got);
            b
        };
        for _ in 0..2 {
            assert_eq!(read_buffered(2 * size), vec![1u8; size]);
            assert_eq!(read_direct(&direct, 2 * size), vec![1u8; size]);
        }

        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(backing.join("f"))
            .unwrap();
        w.write_all_at(&vec![2u8; size], 0).unwrap();
        ttl_passed();
        assert_eq!(
            read_buffered(2 * size),
            vec![2u8; size],
            "buffered, same size"
        );
        assert_eq!(
            read_direct(&direct, 2 * size),
            vec![2u8; size],
            "O_DIRECT, same size"
        );

        w.write_all_at(&vec![3u8; size + 5000], 0).unwrap();
        ttl_passed();
        assert_eq!(
            read_buffered(4 * size),
            vec![3u8; size + 5000],
            "buffered, grown"
        );
        assert_eq!(
            read_direct(&direct, 4 * size),
            vec![3u8; size + 5000],
            "O_DIRECT, grown"
        );
    });
}

/// "Never a mix of versions", rename variant: the writer replaces the backing file by writing a
/// complete new version k (every byte = k) to a temporary name and renaming it over the old one.
/// Each backing inode is written once, before it gets the name, and never modified after: a
/// reader of the backing store itself always sees exactly one version, and so must every reader
/// through the mount, whatever the caches hold. Every whole-file read must be uniform, of
/// the full size, and of a version no older than the last rename before the open.
///
/// The writer alternates bursts (a version every 10 ms) with holds longer than the racy window,
/// so versions do get cached in RAM and by the kernel, and then replaced while cached.
#[test]
fn never_a_mix_of_versions_rename() {
    const SIZE: usize = 256 << 10; // 64 blocks of 4 KiB
    let m = BinMount::new(&["ram.max=64M", "ram.block_size=4K", "meta.ttl=100ms"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::write(backing.join("f"), vec![0u8; SIZE]).unwrap();
    let hits_before = stat_u64(&m.stats(), &["ram", "hits"]);
    let last = with_timeout(LIMIT, vec![mnt.clone()], move || {
        let completed = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (completed, stop, backing) = (completed.clone(), stop.clone(), backing.clone());
            std::thread::spawn(move || {
                let mut k = 0u64;
                for cycle in 0..3 {
                    for _ in 0..10 {
                        k += 1;
                        let tmp = backing.join(format!(".f.{k}"));
                        std::fs::write(&tmp, vec![k as u8; SIZE]).unwrap();
                        std::fs::rename(&tmp, backing.join("f")).unwrap();
                        completed.store(k, SeqCst);
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let hold = if cycle < 2 { 1400 } else { 300 };
                    std::thread::sleep(Duration::from_millis(hold));
                }
                stop.store(true, SeqCst);
                k
            })
        };
        let reader = |what: &'static str, read: fn(&Path) -> Vec<u8>| {
            let (completed, stop, mnt) = (completed.clone(), stop.clone(), mnt.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(SeqCst) {
                    let c0 = completed.load(SeqCst);
                    let data = read(&mnt.join("f"));
                    let c1 = completed.load(SeqCst);
                    check_whole_version(what, &data, c0, c1);
                    n += 1;
                }
                n
            })
        };
        let a = reader("buffered open-read-close", raw_read);
        let b = reader("O_DIRECT open-read-close", |p| {
            read_direct(&open_direct(p, false), 2 * SIZE)
        });
        // A reader that keeps its file open: the renamed-over inode stays readable and must
        // stay one version (any version: an open file is not re-pointed by a rename).
        let c = {
            let (stop, mnt) = (stop.clone(), mnt.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(SeqCst) {
                    let f = File::open(mnt.join("f")).unwrap();
                    for _ in 0..10 {
                        let mut buf = vec![0u8; SIZE];
                        f.read_exact_at(&mut buf, 0).unwrap();
                        assert!(
                            uniform(&buf).is_some(),
                            "kept-open reader saw a mix of versions {:?}",
                            values(&buf)
                        );
                        n += 1;
                    }
                }
                n
            })
        };
        let last = writer.join().unwrap();
        let (na, nb, nc) = (a.join().unwrap(), b.join().unwrap(), c.join().unwrap());
        eprintln!("rename variant: {last} versions; whole-file reads: {na} buffered, {nb} O_DIRECT, {nc} kept-open");
        assert!(
            na > 10 && nb > 10 && nc > 10,
            "too few reads: {na} {nb} {nc}"
        );
        assert_eq!(raw_read(&mnt.join("f")), vec![last as u8; SIZE]);
        last
    });
    let st = m.stats();
    assert!(last >= 30, "{last}");
    assert!(
        stat_u64(&st, &["ram", "hits"]) > hits_before,
        "the RAM tier never served a block, so the test did not exercise it: {st}"
    );
}

/// One whole-file read of the rename variant: full size, one version, and a version that was
/// the file's between the open (`c0` renamed in before it) and the end of the read (`c1`
/// renamed in before it, and `c1 + 1` possibly renamed in but not yet counted).
fn check_whole_version(what: &str, data: &[u8], c0: u64, c1: u64) {
    let v = values(data);
    assert_eq!(data.len(), 256 << 10, "{what}: size");
    assert_eq!(
        v.len(),
        1,
        "{what}: one read of the whole file mixed versions {v:?} (version {c0} was renamed in \
         before the open)"
    );
    assert!(
        (c0..=c1 + 1).contains(&(v[0] as u64)),
        "{what}: read version {} but version {c0} was renamed in before the open (and {c1} \
         before the read ended)",
        v[0]
    );
}

/// "Never a mix of versions", in-place variant: the writer overwrites the whole file in place
/// with one pwrite of version k (every byte = k).
///
/// What is guaranteed here is less than for the rename variant, for the backing store
/// itself: Linux does not make a buffered read atomic with respect to a concurrent write
/// (ext4 copies page by page without excluding readers), so a reader of the backing directory
/// itself can see a mix of k-1 and k while write k is in progress (this test counts such direct
/// reads and typically finds some). A cache cannot promise more than its source. It must not
/// promise less either, so through the mount we assert exactly what a direct reader gets:
///
/// - every byte read is of a version between the last one completed before the open and the
///   last one started before the read ended (no older data from a cache, no invented data);
/// - a read during which no write was in progress (a quiet read) is uniform and of the last
///   completed version;
/// - after the writer stops, the file reads as the last version.
///
/// The second point is what caught a real bug: write(2) moves mtime/ctime when it starts, so a
/// fetch overlapping a write saw the same fingerprint before and after and cached the torn mix;
/// every later open, long after the write finished, was served that mix. Fixed by not caching
/// blocks of a file whose ctime is within RACY_WINDOW (see `racy` in file_state.rs).
#[test]
fn in_place_overwrites_mix_no_more_than_the_backing_store_does() {
    // Big enough that one pwrite takes several milliseconds, so reads often overlap one.
    const SIZE: usize = 8 << 20; // 128 blocks of 64 KiB
    const BLOCK: usize = 64 << 10;
    let m = BinMount::new(&["ram.max=64M", "ram.block_size=64K", "meta.ttl=1h"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::write(backing.join("f"), vec![0u8; SIZE]).unwrap();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let started = Arc::new(AtomicU64::new(0));
        let completed = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (started, completed, stop) = (started.clone(), completed.clone(), stop.clone());
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(backing.join("f"))
                .unwrap();
            std::thread::spawn(move || {
                let mut k = 0u64;
                // Bursts of writes, each followed by a quiet hold: short holds probe the
                // moments right after a write, long ones (past the racy window) let the version
                // be cached before the next burst replaces it.
                for hold in [1200, 250, 250, 1200, 250, 250] {
                    for _ in 0..8 {
                        k += 1;
                        started.store(k, SeqCst);
                        f.write_all_at(&vec![k as u8; SIZE], 0).unwrap();
                        completed.store(k, SeqCst);
                        std::thread::sleep(Duration::from_millis(3));
                    }
                    std::thread::sleep(Duration::from_millis(hold));
                }
                stop.store(true, SeqCst);
                k
            })
        };
        let reader = |what: &'static str, path: PathBuf, len: usize, read: fn(&Path) -> Vec<u8>| {
            let (started, completed, stop) = (started.clone(), completed.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut n, mut quiet, mut mixed) = (0u64, 0u64, 0u64);
                while !stop.load(SeqCst) {
                    // completed then started: equal means no write was in progress at the
                    // second load, which is before the open.
                    let c0 = completed.load(SeqCst);
                    let s0 = started.load(SeqCst);
                    let data = read(&path);
                    let s1 = started.load(SeqCst);
                    assert_eq!(data.len(), len, "{what}: size");
                    let v = values(&data);
                    n += 1;
                    if v.len() > 1 {
                        mixed += 1;
                    }
                    assert!(
                        v.iter().all(|&x| (c0..=s1).contains(&(x as u64))),
                        "{what}: read versions {v:?}, but version {c0} was complete before the \
                         open and version {s1} the last started before the read ended"
                    );
                    if c0 == s0 && s1 == s0 {
                        quiet += 1;
                        assert_eq!(
                            v,
                            vec![c0 as u8],
                            "{what}: no write ran during this read, yet it did not return \
                             exactly the last complete version {c0}"
                        );
                    }
                }
                (n, quiet, mixed)
            })
        };
        let mf = mnt.join("f");
        let a = reader("mount, buffered", mf.clone(), SIZE, raw_read);
        let b = reader("mount, O_DIRECT", mf.clone(), SIZE, |p| {
            read_direct(&open_direct(p, false), SIZE)
        });
        // Whole-file reads through FUSE are slow next to one pwrite; this reader samples only
        // the first and the last block (written first and last by each pwrite), so its
        // fetches overlap writes far more often.
        let e = reader(
            "mount, O_DIRECT, first+last block",
            mf.clone(),
            2 * BLOCK,
            |p| {
                let f = open_direct(p, false);
                let mut buf = Aligned::new(2 * BLOCK);
                f.read_exact_at(&mut buf[..BLOCK], 0).unwrap();
                f.read_exact_at(&mut buf[BLOCK..], (SIZE - BLOCK) as u64)
                    .unwrap();
                buf.to_vec()
            },
        );
        let d = reader("backing store itself", backing.join("f"), SIZE, raw_read);
        let last = writer.join().unwrap();
        let (a, b, e, d) = (
            a.join().unwrap(),
            b.join().unwrap(),
            e.join().unwrap(),
            d.join().unwrap(),
        );
        eprintln!(
            "in-place variant: {last} versions; (reads, quiet, mixed): mount buffered {a:?}, \
             mount O_DIRECT {b:?}, mount first+last block {e:?}, backing directly {d:?}"
        );
        assert!(
            e.1 > 50 && a.1 > 0 && b.1 > 0,
            "too few quiet reads to show anything: {a:?} {b:?} {e:?}"
        );
        assert_eq!(raw_read(&mf), vec![last as u8; SIZE]);
        assert_eq!(
            read_direct(&open_direct(&mf, false), SIZE),
            vec![last as u8; SIZE]
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 1b. Concurrent writers and readers of one file see whole writes
// ---------------------------------------------------------------------------------------------

const RECORDS: usize = 16;
const THREADS: usize = 8;

/// Value a thread writes to a record: says which record and which thread, so a read can tell
/// a byte that belongs to another record (misplaced data) from a mix of two writers.
fn record_value(record: usize, thread: usize) -> u8 {
    (1 + record * THREADS + thread) as u8
}

/// 8 threads, each both writing whole records and reading whole records of one file, for
/// `run` time. Returns (reads, writes, reads that were not uniform).
fn hammer_records(path: &Path, record: usize, direct: bool, run: Duration) -> (u64, u64, u64) {
    let deadline = Instant::now() + run;
    let threads: Vec<_> = (0..THREADS)
        .map(|tid| {
            let path = path.to_path_buf();
            std::thread::spawn(move || {
                let f = if direct {
                    open_direct(&path, true)
                } else {
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&path)
                        .unwrap()
                };
                let mut buf = Aligned::new(record);
                let mut rng =
                    0x9e3779b97f4a7c15u64 ^ (tid as u64 + 1).wrapping_mul(0xbf58476d1ce4e5b9);
                let (mut reads, mut writes, mut torn) = (0u64, 0u64, 0u64);
                while Instant::now() < deadline {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let r = (rng % RECORDS as u64) as usize;
                    let off = (r * record) as u64;
                    if rng & (1 << 40) != 0 {
                        buf.fill(record_value(r, tid));
                        f.write_all_at(&buf, off).unwrap();
                        writes += 1;
                    } else {
                        f.read_exact_at(&mut buf, off).unwrap();
                        reads += 1;
                        let v = values(&buf);
                        // Guaranteed in both modes: every byte is the initial 0 or was written
                        // to this very record by some thread.
                        for &x in &v {
                            assert!(
                                x == 0 || (x as usize - 1) / THREADS == r,
                                "record {r}: byte {x} belongs to record {}",
                                (x as usize - 1) / THREADS
                            );
                        }
                        if v.len() > 1 {
                            torn += 1;
                            assert!(
                                !direct,
                                "O_DIRECT read of record {r} mixed writes: values {v:?}"
                            );
                        }
                    }
                }
                (reads, writes, torn)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
}

/// After the hammering: every record holds exactly one writer's whole write, and the mount
/// and the backing store agree byte for byte.
fn check_records_final(mnt_file: &Path, backing_file: &Path, record: usize) {
    let via_mount = read_direct(&open_direct(mnt_file, false), RECORDS * record);
    let direct = std::fs::read(backing_file).unwrap();
    assert_eq!(via_mount.len(), RECORDS * record);
    assert!(via_mount == direct, "mount and backing store differ");
    for r in 0..RECORDS {
        let rec = &via_mount[r * record..(r + 1) * record];
        let v =
            uniform(rec).unwrap_or_else(|| panic!("record {r} ends as a mix: {:?}", values(rec)));
        assert!(
            v == 0 || (v as usize - 1) / THREADS == r,
            "record {r} holds {v}"
        );
    }
}

/// O_DIRECT: each pread/pwrite of a 64 KiB record is exactly one FUSE request (the kernel
/// neither splits it nor passes it through its page cache), and tierfs serves a write under
/// the file's exclusive lock and a read under its shared lock, so every record read is one
/// whole write, never a mix — a guarantee stronger than ext4 gives buffered readers. The cache
/// blocks (16 KiB) are smaller than a record, so a record spans several blocks.
#[test]
fn concurrent_writers_and_readers_see_whole_records_odirect() {
    const RECORD: usize = 64 << 10;
    let m = BinMount::new(&["ram.max=64M", "ram.block_size=16K"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::write(backing.join("f"), vec![0u8; RECORDS * RECORD]).unwrap();
    settle();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let (reads, writes, torn) =
            hammer_records(&mnt.join("f"), RECORD, true, Duration::from_secs(3));
        eprintln!("O_DIRECT records: {reads} reads, {writes} writes, {torn} torn");
        assert!(
            reads > 100 && writes > 100,
            "{reads} reads, {writes} writes"
        );
        check_records_final(&mnt.join("f"), &backing.join("f"), RECORD);
    });
    let st = m.stats();
    assert!(stat_u64(&st, &["ram", "hits"]) > 0, "{st}");
}

/// Buffered: the kernel copies between the page cache and the caller page by page, without
/// excluding a concurrent writer (the same is true of ext4), so a buffered read is not
/// guaranteed to be one whole write even for one 4 KiB page; torn reads are counted, not
/// failed. What is guaranteed, and asserted: no byte ever comes from another record or from
/// nowhere, writes are serialized (the kernel holds the inode lock while it sends a buffered
/// FUSE write), so each record ends as one whole write, and the mount and the backing store
/// agree at the end.
#[test]
fn concurrent_writers_and_readers_buffered_keep_records_whole() {
    const RECORD: usize = 4096;
    let m = BinMount::new(&["ram.max=64M", "ram.block_size=4K"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::write(backing.join("f"), vec![0u8; RECORDS * RECORD]).unwrap();
    settle();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let (reads, writes, torn) =
            hammer_records(&mnt.join("f"), RECORD, false, Duration::from_secs(2));
        eprintln!("buffered 4K records: {reads} reads, {writes} writes, {torn} torn");
        assert!(
            reads > 100 && writes > 100,
            "{reads} reads, {writes} writes"
        );
        check_records_final(&mnt.join("f"), &backing.join("f"), RECORD);
    });
}

// ---------------------------------------------------------------------------------------------
// 1c. Symlinks pointing outside BACKING
// ---------------------------------------------------------------------------------------------

/// Symlinks in BACKING that point outside it are shown as symlinks with their target text,
/// and tierfs never follows them. Layout (all under one temporary directory T):
///
///   T/b/backing            BACKING, with esc -> ../outside, sub/deep -> ../../outside,
///                          etc -> /etc, abs -> T/b/outside, dangling -> ../../nowhere/x
///   T/b/outside/canary     what esc names when resolved *inside the backing tree*
///   T/m/mnt                the mount point
///   T/m/outside/mnt-side   what esc names when resolved *through the mount*
///
/// The kernel, not tierfs, resolves a symlink met during a path walk, in the caller's
/// namespace, exactly as for a local filesystem: `mnt/esc` is `mnt/../outside` = T/m/outside.
/// If tierfs followed links itself, esc would appear as a directory holding `canary`.
#[test]
fn symlinks_out_of_backing_are_shown_not_followed() {
    let m = BinMount::new_at("b/backing", "m/mnt", &["ram.max=64M"]);
    let t = m.dir.path().to_path_buf();
    let (b_out, m_out) = (t.join("b/outside"), t.join("m/outside"));
    std::fs::create_dir(&b_out).unwrap();
    std::fs::write(b_out.join("canary"), b"backing side").unwrap();
    std::fs::create_dir(&m_out).unwrap();
    std::fs::write(m_out.join("mnt-side"), b"mount side").unwrap();
    let links: Vec<(&str, PathBuf)> = vec![
        ("esc", "../outside".into()),
        ("sub/deep", "../../outside".into()),
        ("etc", "/etc".into()),
        ("abs", b_out.clone()),
        ("dangling", "../../nowhere/x".into()),
    ];
    std::fs::create_dir(m.backing.join("sub")).unwrap();
    for (name, target) in &links {
        std::os::unix::fs::symlink(target, m.backing.join(name)).unwrap();
    }
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        // Listing and lstat: symlinks, with the exact target text.
        let mut names: Vec<(String, bool)> = std::fs::read_dir(&mnt)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.file_type().unwrap().is_symlink(),
                )
            })
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("abs", true),
                ("dangling", true),
                ("esc", true),
                ("etc", true),
                ("sub", false)
            ]
            .map(|(n, l)| (n.to_string(), l))
        );
        for (name, target) in &links {
            let p = mnt.join(name);
            let md = std::fs::symlink_metadata(&p).unwrap();
            assert!(
                md.file_type().is_symlink(),
                "{name} is not shown as a symlink"
            );
            assert_eq!(&std::fs::read_link(&p).unwrap(), target, "{name}");
        }

        // Walking through esc lands on the mount side, as on any filesystem.
        let listed: Vec<String> = std::fs::read_dir(mnt.join("esc"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(listed, ["mnt-side"]);
        assert_eq!(
            std::fs::canonicalize(mnt.join("sub/deep")).unwrap(),
            m_out.canonicalize().unwrap()
        );

        // Creating under esc/ and sub/deep/ creates on the mount side; tierfs creates nothing
        // next to BACKING.
        std::fs::write(mnt.join("esc/newfile"), b"x").unwrap();
        std::fs::create_dir(mnt.join("sub/deep/newdir")).unwrap();
        assert!(m_out.join("newfile").is_file() && m_out.join("newdir").is_dir());
        let mut b_listing: Vec<_> = std::fs::read_dir(&b_out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        b_listing.sort();
        assert_eq!(b_listing, ["canary"], "tierfs wrote next to BACKING");

        // Operations on the link itself act on the backing link, not on its target.
        let b_out_before = std::fs::metadata(&b_out).unwrap();
        let m_out_before = std::fs::metadata(&m_out).unwrap();
        let times = [
            libc::timespec {
                tv_sec: 1_000_000_000,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: 1_000_000_000,
                tv_nsec: 0,
            },
        ];
        let c = std::ffi::CString::new(mnt.join("esc").as_os_str().as_encoded_bytes()).unwrap();
        let r = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        assert_eq!(r, 0, "utimensat: {}", std::io::Error::last_os_error());
        assert_eq!(
            std::fs::symlink_metadata(backing.join("esc"))
                .unwrap()
                .mtime(),
            1_000_000_000
        );
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::lchown(mnt.join("abs"), Some(4321), Some(4321)).unwrap();
            assert_eq!(
                std::fs::symlink_metadata(backing.join("abs"))
                    .unwrap()
                    .uid(),
                4321
            );
        }
        for (dir, before) in [(&b_out, &b_out_before), (&m_out, &m_out_before)] {
            let now = std::fs::metadata(dir).unwrap();
            assert_eq!(
                (now.mtime(), now.mtime_nsec(), now.uid()),
                (before.mtime(), before.mtime_nsec(), before.uid()),
                "{} changed",
                dir.display()
            );
        }

        // The kernel never asks tierfs to look a name up *in* a symlink: an O_PATH handle of
        // the link itself is not a directory. (tierfs's store refuses the same at its level:
        // single-component openat with O_NOFOLLOW; unit-tested in tierfs-store.)
        let c = std::ffi::CString::new(mnt.join("etc").as_os_str().as_encoded_bytes()).unwrap();
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        let r = unsafe { libc::openat(fd, c"passwd".as_ptr(), libc::O_RDONLY) };
        let e = std::io::Error::last_os_error();
        unsafe { libc::close(fd) };
        assert_eq!((r, e.raw_os_error()), (-1, Some(libc::ENOTDIR)));

        // Rename and unlink act on the link.
        std::fs::rename(mnt.join("etc"), mnt.join("etc2")).unwrap();
        assert_eq!(
            std::fs::read_link(backing.join("etc2")).unwrap(),
            Path::new("/etc")
        );
        std::fs::remove_file(mnt.join("esc")).unwrap();
        assert!(std::fs::symlink_metadata(backing.join("esc")).is_err());
        assert!(b_out.join("canary").is_file() && m_out.join("mnt-side").is_file());
        assert!(Path::new("/etc").is_dir());

        // A symlink made through the mount is stored as text, never resolved.
        std::os::unix::fs::symlink("../../../../etc/shadow", mnt.join("made")).unwrap();
        assert_eq!(
            std::fs::read_link(backing.join("made")).unwrap(),
            Path::new("../../../../etc/shadow")
        );
        assert!(std::fs::symlink_metadata(mnt.join("made"))
            .unwrap()
            .file_type()
            .is_symlink());
    });
    // The daemon is healthy and `tierfs stats` works with such links in the tree.
    let st = m.stats();
    assert!(stat_u64(&st, &["inodes"]) >= 1, "{st}");
}

// ---------------------------------------------------------------------------------------------
// 1d. Errors of the backing store reach the application
// ---------------------------------------------------------------------------------------------

fn errno_of(r: std::io::Result<impl Sized>) -> Option<i32> {
    match r {
        Ok(_) => None,
        Err(e) => Some(e.raw_os_error().unwrap_or(-1)),
    }
}

/// EIO and ENOSPC from the backing store arrive as exactly those errnos, from the call that
/// caused them (write-through: write(2) itself fails, not a later close), nothing panics, and
/// after the store heals the same operations work on the same mount. While the store fails
/// reads, blocks already in the RAM tier are still served (the point of a cache).
#[test]
fn backing_store_errors_reach_the_application() {
    use tierfs_store::OpClass;
    const SIZE: usize = 256 << 10;
    let cfg = tierfs_fs::FsConfig {
        ram_max: 64 << 20,
        block_size: 64 << 10,
        ..Default::default()
    };
    let m = FaultMount::new(cfg, |b| {
        std::fs::write(b.join("hot"), vec![b'h'; SIZE]).unwrap();
        std::fs::write(b.join("cold"), vec![b'c'; SIZE]).unwrap();
    });
    settle();
    let (mnt, backing, faults) = (m.mnt.clone(), m.backing.clone(), m.faults.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        // O_DIRECT keeps the kernel's page cache out: every read below reaches tierfs.
        assert_eq!(
            read_direct(&open_direct(&mnt.join("hot"), false), SIZE),
            vec![b'h'; SIZE]
        );

        faults.fail(OpClass::Read, Some(libc::EIO));
        faults.fail(OpClass::Write, Some(libc::ENOSPC));

        // Reads of data not in RAM fail with EIO, buffered or not.
        assert_eq!(errno_of(std::fs::read(mnt.join("cold"))), Some(libc::EIO));
        let f = open_direct(&mnt.join("cold"), false);
        let mut buf = Aligned::new(4096);
        assert_eq!(errno_of(f.read_at(&mut buf, 0)), Some(libc::EIO));
        drop(f);

        // The cached file is still served, without a single read of the store.
        let reads_before = faults.calls(OpClass::Read);
        assert_eq!(
            read_direct(&open_direct(&mnt.join("hot"), false), SIZE),
            vec![b'h'; SIZE],
            "cached blocks not served while the store fails reads"
        );
        assert_eq!(faults.calls(OpClass::Read), reads_before);

        // ENOSPC: write(2) itself (write-through), create, mkdir, truncate.
        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("hot"))
            .unwrap();
        assert_eq!(errno_of(w.write_at(b"XYZ", 0)), Some(libc::ENOSPC));
        assert_eq!(errno_of(w.set_len(1)), Some(libc::ENOSPC));
        drop(w);
        assert_eq!(errno_of(File::create(mnt.join("new"))), Some(libc::ENOSPC));
        assert_eq!(
            errno_of(std::fs::create_dir(mnt.join("newdir"))),
            Some(libc::ENOSPC)
        );
        assert!(!backing.join("new").exists() && !backing.join("newdir").exists());

        // EIO on metadata too (the kernel's attribute and entry TTLs are zero here).
        faults.fail(OpClass::Meta, Some(libc::EIO));
        assert_eq!(
            errno_of(std::fs::metadata(mnt.join("cold"))),
            Some(libc::EIO)
        );

        // Healed: everything works again on the same mount and daemon.
        faults.fail(OpClass::Meta, None);
        faults.fail(OpClass::Read, None);
        faults.fail(OpClass::Write, None);
        assert_eq!(std::fs::read(mnt.join("cold")).unwrap(), vec![b'c'; SIZE]);
        // The failed write changed nothing.
        assert_eq!(std::fs::read(mnt.join("hot")).unwrap(), vec![b'h'; SIZE]);
        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("hot"))
            .unwrap();
        w.write_all_at(b"XYZ", 0).unwrap();
        drop(w);
        std::fs::write(mnt.join("new"), b"fresh").unwrap();
        std::fs::create_dir(mnt.join("newdir")).unwrap();
        assert_eq!(&std::fs::read(backing.join("hot")).unwrap()[..4], b"XYZh");
        assert_eq!(std::fs::read(backing.join("new")).unwrap(), b"fresh");
        assert!(backing.join("newdir").is_dir());
        let mut want = vec![b'h'; SIZE];
        want[..3].copy_from_slice(b"XYZ");
        assert_eq!(
            read_direct(&open_direct(&mnt.join("hot"), false), SIZE),
            want
        );
        assert!(is_mounted(&mnt));
    });
}

// ---------------------------------------------------------------------------------------------
// 1e. Stats
// ---------------------------------------------------------------------------------------------

/// Reading a file a second time (with the kernel's page cache out of the way) is served by the
/// RAM tier: `tierfs stats --json` shows RAM hits and no more bytes read from the store.
#[test]
fn stats_show_ram_hits_and_no_backing_reads_on_reread() {
    const SIZE: usize = 1 << 20;
    let m = BinMount::new(&["ram.max=64M", "ram.block_size=64K"]);
    let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(m.backing.join("data"), &data).unwrap();
    settle();
    let mnt = m.mnt.clone();
    let s0 = m.stats();
    {
        let (mnt, data) = (mnt.clone(), data.clone());
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            assert!(raw_read(&mnt.join("data")) == data);
        });
    }
    std::thread::sleep(Duration::from_millis(100)); // let read-ahead settle
    let s1 = m.stats();
    let backing_bytes = stat_u64(&s1, &["backing", "read_bytes"]);
    assert!(
        backing_bytes >= stat_u64(&s0, &["backing", "read_bytes"]) + SIZE as u64,
        "first read did not come from the store: {s1}"
    );
    {
        let (mnt, data) = (mnt.clone(), data.clone());
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            // Second read, O_DIRECT: bypasses the kernel's page cache.
            assert!(read_direct(&open_direct(&mnt.join("data"), false), SIZE) == data);
        });
    }
    let s2 = m.stats();
    assert!(
        stat_u64(&s2, &["ram", "hits"]) > stat_u64(&s1, &["ram", "hits"]),
        "no RAM hits on the second read: {s2}"
    );
    assert!(stat_u64(&s2, &["read_ram_only"]) > stat_u64(&s1, &["read_ram_only"]));
    assert_eq!(
        stat_u64(&s2, &["backing", "read_bytes"]),
        backing_bytes,
        "the second read went to the store: {s2}"
    );
    {
        let (mnt, data) = (mnt.clone(), data.clone());
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            // Third read, buffered, after dropping the file's pages from the page cache.
            let f = File::open(mnt.join("data")).unwrap();
            let r = unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    0,
                    0,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
            assert_eq!(r, 0);
            let mut buf = vec![0u8; SIZE];
            f.read_exact_at(&mut buf, 0).unwrap();
            assert!(buf == data);
        });
    }
    let s3 = m.stats();
    assert_eq!(
        stat_u64(&s3, &["backing", "read_bytes"]),
        backing_bytes,
        "the third read went to the store: {s3}"
    );
    assert!(
        stat_u64(&s3, &["ram", "hit_bytes"]) >= stat_u64(&s1, &["ram", "hit_bytes"]) + SIZE as u64
    );
}

/// Write-back: a file written through a write-only open (direct I/O, so the kernel keeps no
/// page of it) and read back after its flush is served from the RAM tier, not fetched from
/// the store again: a build reads back the objects it wrote. (Flush runs over 1 MiB used to
/// leave nothing cached: over sshfs a `cargo build` fetched 156 MiB of its own output.)
#[test]
fn data_read_back_after_its_flush_comes_from_ram() {
    const SIZE: usize = 8 << 20;
    let m = BinMount::new(&["writeback.mode=back", "ram.max=64M"]);
    let mnt = m.mnt.clone();
    let data: Vec<u8> = (0..SIZE)
        .map(|i| ((i * 131) % 251) as u8 ^ (i >> 16) as u8)
        .collect();
    {
        let (mnt, data) = (mnt.clone(), data.clone());
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            let mut f = File::create(mnt.join("out.o")).unwrap();
            for c in data.chunks(1 << 20) {
                f.write_all(c).unwrap();
            }
            // The flush: the data is on the store when this returns.
            f.sync_all().unwrap();
        });
    }
    assert_eq!(std::fs::read(m.backing.join("out.o")).unwrap(), data);
    let s0 = m.stats();
    drop_caches();
    {
        let (mnt, data) = (mnt.clone(), data.clone());
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            assert!(std::fs::read(mnt.join("out.o")).unwrap() == data);
        });
    }
    let s1 = m.stats();
    assert_eq!(
        stat_u64(&s1, &["backing", "read_bytes"]),
        stat_u64(&s0, &["backing", "read_bytes"]),
        "the read back went to the store: {s1}"
    );
    assert!(
        stat_u64(&s1, &["ram", "hit_bytes"]) >= stat_u64(&s0, &["ram", "hit_bytes"]) + SIZE as u64,
        "{s1}"
    );
}

/// A new file extended by `ftruncate` and then written through `mmap`, as `lld` and `mold`
/// write their output: the kernel reads each page at its first touch, and those reads of
/// zeros are answered without the store (they fetched the whole file's size from it), in
/// both write modes; the store gets the bytes written, and reading them back asks it nothing.
#[test]
fn a_file_extended_then_written_through_mmap_reads_nothing_from_the_store() {
    const SIZE: usize = (4 << 20) + 5000;
    for mode in [None, Some("writeback.mode=back")] {
        let opts: Vec<&str> = mode.into_iter().collect();
        let m = BinMount::new(&opts);
        let mnt = m.mnt.clone();
        let data: Vec<u8> = (0..SIZE)
            .map(|i| (i % 241) as u8 ^ (i >> 12) as u8)
            .collect();
        {
            let (mnt, data) = (mnt.clone(), data.clone());
            with_timeout(LIMIT, vec![mnt.clone()], move || {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(mnt.join("a.out"))
                    .unwrap();
                f.set_len(SIZE as u64).unwrap();
                // SAFETY: a fresh shared mapping of SIZE bytes of an open file, unmapped below.
                unsafe {
                    let p = libc::mmap(
                        std::ptr::null_mut(),
                        SIZE,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        f.as_raw_fd(),
                        0,
                    );
                    assert_ne!(p, libc::MAP_FAILED);
                    std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, SIZE);
                    assert_eq!(libc::msync(p, SIZE, libc::MS_SYNC), 0);
                    assert_eq!(libc::munmap(p, SIZE), 0);
                }
                f.sync_all().unwrap();
            });
        }
        assert_eq!(
            std::fs::read(m.backing.join("a.out")).unwrap(),
            data,
            "{mode:?}"
        );
        drop_caches();
        {
            let (mnt, data) = (mnt.clone(), data.clone());
            with_timeout(LIMIT, vec![mnt.clone()], move || {
                assert!(std::fs::read(mnt.join("a.out")).unwrap() == data);
            });
        }
        let s = m.stats();
        assert_eq!(
            stat_u64(&s, &["backing", "read_bytes"]),
            0,
            "{mode:?}: read from the store: {s}"
        );
    }
}

/// A write by another user through a write-only open (direct I/O, where the kernel leaves the
/// clearing to the filesystem: FUSE_WRITE_KILL_SUIDGID) clears setuid, and setgid with
/// group-execute, as a local filesystem does (pjdfstest chmod/12.t; issue 13 item 13).
#[test]
fn a_non_owner_write_clears_setuid_and_setgid() {
    let m = BinMount::new(&["allow_other"]);
    // Let uid 65534 reach the mount.
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, mode, left) in [
        ("suid", 0o4777, 0o777),
        ("sgid", 0o2777, 0o777),
        ("sgid-noexec", 0o2767, 0o2767), // setgid without group-execute: mandatory locking, kept
    ] {
        std::fs::write(m.backing.join(name), vec![1u8; 8192]).unwrap();
        std::fs::set_permissions(m.backing.join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
        let f = m.mnt.join(name);
        let mnt = m.mnt.clone();
        with_timeout(LIMIT, vec![mnt], move || {
            let out = std::process::Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "dd"])
                .arg("if=/dev/zero")
                .arg(format!("of={}", f.display()))
                .args(["bs=4096", "count=1", "conv=notrunc", "status=none"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: write as uid 65534: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let got = std::fs::metadata(&f).unwrap().permissions().mode() & 0o7777;
            assert_eq!(got, left, "{name}: mode {got:o} after a non-owner write");
        });
        let back = std::fs::metadata(m.backing.join(name)).unwrap();
        assert_eq!(
            back.permissions().mode() & 0o7777,
            left,
            "{name}: on the store"
        );
    }
}

/// setuid and setgid-with-group-execute go on a chown (by root too), a truncation and an
/// O_TRUNC open by a caller without CAP_FSETID, as on a local filesystem, and stay on a
/// directory, on setgid without group-execute, and on a root truncation. tierfs drops them
/// itself (FUSE_HANDLE_KILLPRIV_V2: the kernel no longer asks for the attributes before each
/// chown), in write-through and in write-back, for store files and files made through the
/// mount; the store agrees after the unmount.
#[test]
fn chown_and_truncation_drop_setuid_and_setgid_as_a_local_filesystem_does() {
    for wb in [false, true] {
        let mut opts = vec!["allow_other", "fuse.no_open=off"];
        if wb {
            opts.push("writeback.mode=back");
        }
        let m = BinMount::new(&opts);
        std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&m.backing, std::fs::Permissions::from_mode(0o777)).unwrap();
        for name in [
            "chown",
            "chown-sgid",
            "chown-sgid-noexec",
            "trunc",
            "otrunc",
            "root-trunc",
        ] {
            std::fs::write(m.backing.join(name), vec![1u8; 4096]).unwrap();
        }
        std::fs::create_dir(m.backing.join("dir")).unwrap();
        let mnt = m.mnt.clone();
        let cases = with_timeout(LIMIT, vec![mnt.clone()], move || {
            let mode =
                |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
            let chmod = |p: &std::path::Path, m: u32| {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
            };
            // A file made through the mount (deferred in write-back), chowned as tar does.
            let made = mnt.join("made");
            std::fs::write(&made, b"x").unwrap();
            let mut cases = vec![("made", 0o4755, 0o755), ("chown", 0o4755, 0o755)];
            cases.push(("chown-sgid", 0o2775, 0o775));
            cases.push(("chown-sgid-noexec", 0o2765, 0o2765));
            cases.push(("dir", 0o6775, 0o6775));
            for (name, before, _) in &cases {
                let p = mnt.join(name);
                chmod(&p, *before);
                std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            }
            // A truncation and an O_TRUNC open by the owner (no CAP_FSETID), and one by root.
            for (name, how) in [("trunc", "truncate -s 10"), ("otrunc", "echo y >")] {
                let p = mnt.join(name);
                std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
                chmod(&p, 0o6775);
                let out = std::process::Command::new("setpriv")
                    .args([
                        "--reuid=65534",
                        "--regid=65534",
                        "--clear-groups",
                        "sh",
                        "-c",
                    ])
                    .arg(format!("{how} '{}'", p.display()))
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{name}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                cases.push((name, 0o6775, 0o775));
            }
            chmod(&mnt.join("root-trunc"), 0o6775);
            std::fs::OpenOptions::new()
                .write(true)
                .open(mnt.join("root-trunc"))
                .unwrap()
                .set_len(7)
                .unwrap();
            cases.push(("root-trunc", 0o6775, 0o6775));
            for (name, before, after) in &cases {
                let got = mode(&mnt.join(name));
                assert_eq!(got, *after, "wb={wb} {name}: {before:o} became {got:o}");
            }
            cases
        });
        m.unmount_and_wait();
        for (name, _, after) in cases {
            let got = std::fs::metadata(m.backing.join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777;
            assert_eq!(got, after, "wb={wb} {name}: on the store");
        }
    }
}

/// A chown to the owner and group a file already has (tar as root does one per file) is not
/// sent to the store when the store gave the attributes less than a second ago: the store's
/// ctime does not move. Any other chown reaches the store: to another owner, of a setuid
/// file (the chown clears the bit), and after the store changed the owner behind our back
/// more than a second before, even with an hour of `meta.ttl`.
#[test]
fn a_chown_to_the_owner_a_file_has_is_not_sent_to_the_store() {
    let m = BinMount::new(&["meta.ttl=1h"]);
    for name in ["same", "other", "suid", "behind"] {
        std::fs::write(m.backing.join(name), b"x").unwrap();
    }
    std::fs::set_permissions(m.backing.join("suid"), PermissionsExt::from_mode(0o4755)).unwrap();
    let (mnt, back) = (m.mnt.clone(), m.backing.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let meta = |p: &Path| std::fs::metadata(p).unwrap();
        let ctime = |p: &Path| (meta(p).ctime(), meta(p).ctime_nsec());
        let elided = || n(&stats_of(&mnt), "unchanged_chowns");
        let chown = |name: &str, id: u32| {
            std::os::unix::fs::chown(mnt.join(name), Some(id), Some(id)).unwrap()
        };
        let (me, before) = (meta(&back.join("same")).uid(), ctime(&back.join("same")));
        // Times set through the mount: the attributes come back from the store just now.
        let now = std::time::SystemTime::now();
        File::options()
            .write(true)
            .open(mnt.join("same"))
            .unwrap()
            .set_modified(now)
            .unwrap();
        let set = ctime(&back.join("same"));
        assert_ne!(set, before, "the times reached the store");
        chown("same", me);
        assert_eq!(elided(), 1);
        assert_eq!(
            ctime(&back.join("same")),
            set,
            "a chown that changes nothing"
        );
        // Another owner: on the store.
        chown("other", 65534);
        assert_eq!(meta(&back.join("other")).uid(), 65534);
        // A setuid file: the store clears the bit.
        let _ = meta(&mnt.join("suid"));
        chown("suid", me);
        assert_eq!(meta(&back.join("suid")).mode() & 0o7777, 0o755);
        assert_eq!(meta(&mnt.join("suid")).mode() & 0o7777, 0o755);
        // Changed on the store behind our back: the attributes of an hour's meta.ttl are
        // older than a second, so the chown back reaches the store.
        let _ = meta(&mnt.join("behind"));
        std::os::unix::fs::chown(back.join("behind"), Some(65534), Some(65534)).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        chown("behind", me);
        assert_eq!(meta(&back.join("behind")).uid(), me);
        assert_eq!(elided(), 1, "only the first chown was not sent");
    });
}

/// A name longer than NAME_MAX (255 bytes; the kernel lets FUSE names up to 1,024 through)
/// is ENAMETOOLONG, as the store says, even where a cached listing could answer ENOENT
/// (`meta.cto=off`; pjdfstest chmod, chown, truncate, link, rmdir, unlink: issue 13 item 14).
#[test]
fn names_longer_than_name_max_are_enametoolong() {
    let m = BinMount::new(&["meta.ttl=1h", "meta.cto=off"]);
    std::fs::create_dir(m.backing.join("d")).unwrap();
    std::fs::write(m.backing.join("d/f"), b"x").unwrap();
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read_dir(mnt.join("d")).unwrap().count(), 1); // listing cached
        let long = mnt.join("d").join("x".repeat(256));
        let perm = std::fs::Permissions::from_mode(0o600);
        for (what, e) in [
            ("stat", errno_of(std::fs::metadata(&long))),
            ("chmod", errno_of(std::fs::set_permissions(&long, perm))),
            ("unlink", errno_of(std::fs::remove_file(&long))),
            ("rmdir", errno_of(std::fs::remove_dir(&long))),
            ("link", errno_of(std::fs::hard_link(mnt.join("d/f"), &long))),
            (
                "truncate",
                errno_of(File::options().write(true).open(&long)),
            ),
        ] {
            assert_eq!(e, Some(libc::ENAMETOOLONG), "{what}");
        }
        // 255 bytes is a name like any other.
        let ok = mnt.join("d").join("y".repeat(255));
        std::fs::write(&ok, b"fits").unwrap();
        assert_eq!(std::fs::read(&ok).unwrap(), b"fits");
    });
}

/// `getxattr`/`setxattr`/`listxattr` of one name through libc: the value, or the errno.
fn xattr(p: &Path, name: &str, set: Option<&[u8]>) -> Result<Vec<u8>, i32> {
    let (c, n) = (cstr(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    let r = unsafe {
        match set {
            Some(v) => {
                libc::lsetxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) as isize
            }
            None => libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()),
        }
    };
    match r {
        r if r < 0 => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
        r => Ok(buf[..r as usize].to_vec()),
    }
}

fn xattr_names(p: &Path) -> Vec<String> {
    let c = cstr(p);
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        r >= 0,
        "llistxattr {p:?}: {}",
        std::io::Error::last_os_error()
    );
    buf[..r as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

fn cstr(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `cp -a`, `rsync -X` and `tar --xattrs` list every file's extended attributes: a store
/// request each (a round trip over NFS). A file the store listed none for is answered from
/// the metadata cache while its ctime stays the same (an xattr change moves it), as the
/// absence of one name already was; a name set through the mount, or on the store once the
/// attributes are asked again, is listed.
#[test]
fn an_empty_xattr_list_is_cached_until_the_ctime_moves() {
    let m = BinMount::new(&["meta.ttl=1s"]);
    let f = m.backing.join("f");
    std::fs::write(&f, b"x").unwrap();
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let mf = mnt.join("f");
        let other = || n(&stats_of(&mnt), "backing.other");
        std::fs::metadata(&mf).unwrap();
        assert!(xattr_names(&mf).is_empty());
        assert_eq!(xattr(&mf, "user.absent", None), Err(libc::ENODATA));
        let asked = other();
        for _ in 0..5 {
            assert!(xattr_names(&mf).is_empty());
            assert_eq!(xattr(&mf, "user.absent", None), Err(libc::ENODATA));
        }
        assert_eq!(other(), asked, "an empty list asked of the store again");
        // Set through the mount: listed at once.
        xattr(&mf, "user.through", Some(b"1")).unwrap();
        assert_eq!(xattr_names(&mf), vec!["user.through".to_string()]);
        let (c, name) = (cstr(&mf), std::ffi::CString::new("user.through").unwrap());
        assert_eq!(unsafe { libc::lremovexattr(c.as_ptr(), name.as_ptr()) }, 0);
        assert!(xattr_names(&mf).is_empty());
        // Set on the store: its ctime moves, and once the attributes are asked again (after
        // `meta.ttl`), the list is asked again too.
        xattr(&f, "user.behind", Some(b"2")).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        std::fs::metadata(&mf).unwrap();
        assert_eq!(xattr_names(&mf), vec!["user.behind".to_string()]);
        assert_eq!(xattr(&mf, "user.behind", None), Ok(b"2".to_vec()));
    });
}

/// POSIX ACLs and SELinux labels are not kept by the mount (ACLs would not be enforced: the
/// kernel checks mode bits alone on it), so their names answer EOPNOTSUPP whatever the store
/// holds, and are not listed; every other extended attribute passes through both ways.
/// `ls -l` asks both names of every file and stops at the first EOPNOTSUPP: with the store's
/// ENODATA passed on, each entry cost two FUSE round trips (10,000 files over a local
/// directory: 0.82-0.96 s warm, the directory alone 0.10-0.12 s).
#[test]
fn acl_and_label_names_are_refused_and_user_xattrs_pass_through() {
    let m = BinMount::new(&[]);
    let f = m.backing.join("f");
    std::fs::write(&f, b"x").unwrap();
    xattr(&f, "user.note", Some(b"kept")).unwrap();
    // Root may set any security.* name on the directory's filesystem (no LSM reads it here).
    let labelled = xattr(
        &f,
        "security.selinux",
        Some(b"system_u:object_r:tmp_t:s0\0"),
    )
    .is_ok();
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let out = std::process::Command::new("ls")
            .arg("-l")
            .arg(&mnt)
            .output()
            .unwrap();
        assert!(out.status.success(), "ls -l: {out:?}");
        let mf = mnt.join("f");
        for name in ["system.posix_acl_access", "security.selinux"] {
            assert_eq!(xattr(&mf, name, None), Err(libc::EOPNOTSUPP), "get {name}");
        }
        assert_eq!(
            xattr(&mnt, "system.posix_acl_default", None),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(xattr(&mf, "user.note", None), Ok(b"kept".to_vec()));
        assert_eq!(xattr(&mf, "user.absent", None), Err(libc::ENODATA));
        assert_eq!(
            xattr(&mf, "security.selinux", Some(b"x")),
            Err(libc::EOPNOTSUPP)
        );
        xattr(&mf, "user.new", Some(b"made")).unwrap();
        let names = xattr_names(&mf);
        assert!(names.contains(&"user.note".to_string()), "{names:?}");
        assert!(names.contains(&"user.new".to_string()), "{names:?}");
        assert!(
            !names.iter().any(|n| n == "security.selinux"),
            "{names:?} (labelled on the store: {labelled})"
        );
    });
    assert_eq!(xattr(&f, "user.new", None), Ok(b"made".to_vec()));
}

/// Write-through asks the store for a file's attributes once per check (`meta.ttl`), not
/// twice per write: on a network store each `fstat` is a round trip (sshfs drops its
/// attributes at every write), which held 1 MiB writes to 0.55x the store's own speed. What
/// the writes left is still served from RAM afterwards (their provisional fingerprint was
/// settled, not taken for a change), and a change behind our back is still seen at the next
/// open.
#[test]
fn write_through_asks_the_store_per_check_not_per_write() {
    const CHUNK: usize = 64 << 10;
    const CHUNKS: usize = 256;
    let m = BinMount::new(&["ram.max=64M", "ram.block_size=64K", "meta.ttl=1h"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let data: Vec<u8> = (0..CHUNK * CHUNKS).map(|i| (i * 13 % 251) as u8).collect();
    let s0 = m.stats();
    {
        let (mnt, data) = (mnt.clone(), data.clone());
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            let mut f = File::create(mnt.join("w")).unwrap();
            for c in data.chunks(CHUNK) {
                f.write_all(c).unwrap();
            }
            f.sync_all().unwrap();
        });
    }
    let s1 = m.stats();
    let d = |a: &serde_json::Value, b: &serde_json::Value, k: &str| {
        stat_u64(b, &["backing", k]) - stat_u64(a, &["backing", k])
    };
    assert!(d(&s0, &s1, "write") >= CHUNKS as u64, "writes: {s1}");
    let getattrs = d(&s0, &s1, "getattr");
    assert!(
        getattrs <= 8,
        "{CHUNKS} writes asked the store for attributes {getattrs} times (expected a few)"
    );
    {
        let (mnt, data) = (mnt.clone(), data.clone());
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            assert!(raw_read(&mnt.join("w")) == data, "read back differs");
        });
    }
    let s2 = m.stats();
    assert_eq!(
        d(&s1, &s2, "read_bytes"),
        0,
        "what the writes left was fetched again instead of served from RAM: {s2}"
    );
    // Behind our back: the same size, other bytes, another mtime.
    let mut other = data.clone();
    other[..CHUNK].fill(0xEE);
    std::fs::write(backing.join("w"), &other).unwrap();
    let later = filetime_plus(&backing.join("w"), 5);
    assert!(later, "could not move the mtime");
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert!(
            raw_read(&mnt.join("w")) == other,
            "a change behind our back after our writes was not seen at the next open"
        );
    });
}

/// Moves `p`'s mtime `secs` seconds ahead (touch -d); true on success.
fn filetime_plus(p: &Path, secs: i64) -> bool {
    let m = std::fs::metadata(p).unwrap();
    let t = format!("@{}", m.mtime() + secs);
    std::process::Command::new("touch")
        .arg("-m")
        .arg("-d")
        .arg(t)
        .arg(p)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Names made behind our back while a directory listing is cached: with close-to-open (the
/// default), the next open finds a new file at once, and a name removed behind our back is
/// gone for the next open too, even with an hour of `meta.ttl`.
#[test]
fn new_and_removed_names_are_seen_at_the_next_open() {
    let m = BinMount::new(&["ram.max=16M", "meta.ttl=1h"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::create_dir(backing.join("d")).unwrap();
    std::fs::write(backing.join("d/old"), b"old").unwrap();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        // The listing (with attributes) is now cached for an hour.
        let names: Vec<_> = std::fs::read_dir(mnt.join("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("old")]);
        std::fs::write(backing.join("d/new"), b"new").unwrap();
        assert_eq!(std::fs::read(mnt.join("d/new")).unwrap(), b"new");
        std::fs::remove_file(backing.join("d/old")).unwrap();
        let e = std::fs::read(mnt.join("d/old")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    });
}

/// FUSE no-open (`meta.cto=off`): the kernel opens and closes files without asking us, and
/// every read and write names handle 0. Reads, O_TRUNC (sent as a SETATTR), appends, fsync
/// and a change behind our back (seen once `meta.ttl` has passed) all behave, and the daemon
/// never saw an OPEN.
#[test]
fn no_open_reads_writes_and_truncates_without_open_requests() {
    let m = BinMount::new(&[
        "ram.max=64M",
        "ram.block_size=4K",
        "meta.ttl=200ms",
        "meta.cto=off",
    ]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::write(backing.join("f"), vec![1u8; 10_000]).unwrap();
    std::fs::write(backing.join("g"), b"old contents, longer than the new").unwrap();
    settle();
    let stats = with_timeout(LIMIT, vec![mnt.clone()], move || {
        for _ in 0..50 {
            assert_eq!(std::fs::read(mnt.join("f")).unwrap(), vec![1u8; 10_000]);
        }
        // O_TRUNC without an OPEN to carry it: the kernel sends SETATTR(size 0) first.
        std::fs::write(mnt.join("g"), b"new").unwrap();
        assert_eq!(std::fs::read(mnt.join("g")).unwrap(), b"new");
        assert_eq!(std::fs::read(backing.join("g")).unwrap(), b"new");
        let mut a = std::fs::OpenOptions::new()
            .append(true)
            .open(mnt.join("g"))
            .unwrap();
        a.write_all(b"+appended").unwrap();
        a.sync_all().unwrap();
        drop(a);
        assert_eq!(std::fs::read(mnt.join("g")).unwrap(), b"new+appended");
        assert_eq!(std::fs::read(backing.join("g")).unwrap(), b"new+appended");
        // Changed behind our back: served once the attributes are older than meta.ttl.
        std::thread::sleep(Duration::from_millis(20));
        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(backing.join("f"))
            .unwrap();
        w.write_all_at(&[2u8; 10_000], 0).unwrap();
        drop(w);
        std::thread::sleep(Duration::from_millis(450));
        assert_eq!(std::fs::read(mnt.join("f")).unwrap(), vec![2u8; 10_000]);
        stats_of(&mnt)
    });
    assert_eq!(stat_u64(&stats, &["opens"]), 0, "{stats}");
    assert!(stat_u64(&stats, &["implicit_files"]) >= 2, "{stats}");
}

/// A read-only shared mapping of `len` bytes of a file, to ask mincore(2) which of its pages
/// the kernel caches without reading them. Mapped once, before the writes it watches: a
/// later open could itself drop the file's pages (an OPEN answered without KEEP_CACHE).
struct Residency {
    _f: File,
    addr: *mut libc::c_void,
    len: usize,
}

impl Residency {
    fn map(p: &Path, len: usize) -> Residency {
        let f = File::open(p).unwrap();
        // SAFETY: a fresh shared read-only mapping of an open file, never dereferenced (past
        // EOF it may not be backed); unmapped in Drop.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap {}", p.display());
        Residency { _f: f, addr, len }
    }

    /// Pages of the mapped range in the page cache.
    fn pages(&self) -> usize {
        let mut v = vec![0u8; self.len.div_ceil(4096)];
        // SAFETY: the mapping is ours and `v` has a byte per page of it.
        let r = unsafe { libc::mincore(self.addr, self.len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().filter(|b| **b & 1 != 0).count()
    }
}

impl Drop for Residency {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// `fuse.direct_write_only`: a file opened O_WRONLY is written past the page cache (none of
/// its pages are cached afterwards; with the option off they all are), and a reader that has
/// the file cached on another handle sees the bytes written through it, in either write mode.
#[test]
fn write_only_opens_bypass_the_page_cache_and_readers_stay_coherent() {
    const MIB: usize = 1 << 20;
    for (mode, direct) in [("through", true), ("back", true), ("back", false)] {
        let m = BinMount::new(&[
            "ram.max=256M",
            &format!("writeback.mode={mode}"),
            &format!(
                "fuse.direct_write_only={}",
                if direct { "on" } else { "off" }
            ),
        ]);
        let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
        std::fs::write(backing.join("f"), vec![1u8; 8 * MIB]).unwrap();
        settle();
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            let what = format!("mode={mode} direct_write_only={direct}");
            // A reader caches the whole file in the kernel.
            let r = File::open(mnt.join("f")).unwrap();
            let mut buf = vec![0u8; 8 * MIB];
            let seen = Residency::map(&mnt.join("f"), 8 * MIB);
            r.read_exact_at(&mut buf, 0).unwrap();
            assert_eq!(seen.pages(), 2048, "{what}: the reader's pages are cached");
            // Overwrite the middle through a write-only handle, in 512 KiB writes.
            let w = std::fs::OpenOptions::new()
                .write(true)
                .open(mnt.join("f"))
                .unwrap();
            for k in 0..8 {
                w.write_all_at(&[2u8; MIB / 2], (2 * MIB + k * MIB / 2) as u64)
                    .unwrap();
            }
            // The reader's handle, still open, sees the new bytes and the old around them.
            r.read_exact_at(&mut buf, 0).unwrap();
            let want: Vec<u8> = (0..8 * MIB)
                .map(|i| {
                    if (2 * MIB..6 * MIB).contains(&i) {
                        2
                    } else {
                        1
                    }
                })
                .collect();
            assert!(
                buf == want,
                "{what}: reader saw {}",
                first_diff_at(&buf, &want)
            );
            w.sync_all().unwrap();
            drop(w);
            assert!(
                std::fs::read(mnt.join("f")).unwrap() == want,
                "{what}: reopen"
            );
            assert!(
                std::fs::read(backing.join("f")).unwrap() == want,
                "{what}: store"
            );

            // A new file written by a write-only stream: no page of it cached unless the
            // option is off.
            let mut g = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(mnt.join("g"))
                .unwrap();
            let seen = Residency::map(&mnt.join("g"), 16 * MIB);
            for k in 0..32u8 {
                g.write_all(&[k; MIB / 2]).unwrap();
            }
            g.sync_all().unwrap();
            let cached = seen.pages();
            drop((g, seen));
            if direct {
                assert_eq!(
                    cached, 0,
                    "{what}: pages of a write-only stream were cached"
                );
            } else {
                // Most of them: under load an attribute refresh during the stream (mtime
                // moved) may make the kernel drop the pages written before it.
                assert!(
                    cached > 2048,
                    "{what}: buffered writes should leave pages, {cached} of 4096 cached"
                );
            }
            let got = std::fs::read(mnt.join("g")).unwrap();
            assert_eq!(got.len(), 16 * MIB, "{what}");
            for (k, c) in got.chunks(MIB / 2).enumerate() {
                assert!(c.iter().all(|b| *b == k as u8), "{what}: g chunk {k}");
            }
        });
    }
}

fn first_diff_at(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("byte {i}: {} instead of {}", a[i], b[i]),
        None => format!("length {} instead of {}", a.len(), b.len()),
    }
}

// ---------------------------------------------------------------------------------------------
// 1b. Never a mix of two versions in one read stream (issue 12)
// ---------------------------------------------------------------------------------------------

/// Block `i` of version `v` (1 or 2) of the mixed-version test file: every byte says both.
fn versioned_block(v: u8, i: usize) -> u8 {
    (v - 1) * 100 + 1 + (i % 100) as u8
}

/// The version of each 64 KiB block of `data` (0: not one version, or not a block of either).
fn block_versions(data: &[u8]) -> Vec<u8> {
    data.chunks(64 << 10)
        .enumerate()
        .map(|(i, b)| match uniform(b) {
            Some(x) if x == versioned_block(1, i) => 1,
            Some(x) if x == versioned_block(2, i) => 2,
            _ => 0,
        })
        .collect()
}

/// The issue-12 trial: with a long `meta.ttl`, the first blocks of a file are read (and
/// read ahead), the backing file is rewritten in place behind tierfs's back (same size, new
/// mtime), and then the whole file is read. One read of the file must be one version: all
/// old (stale within `meta.ttl` is documented), all new, or an error (ESTALE: the old
/// version's blocks that the reader would need are gone from the store), never blocks of
/// both. After an error the next read is the new version, whole.
fn no_mix_after_rewrite(opts: &'static [&'static str]) {
    const BLOCKS: usize = 128; // 8 MiB in 64 KiB blocks
    let m = BinMount::new(opts);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let version = |v: u8| -> Vec<u8> {
        (0..BLOCKS)
            .flat_map(|i| std::iter::repeat_n(versioned_block(v, i), 64 << 10))
            .collect()
    };
    std::fs::write(backing.join("J"), version(1)).unwrap();
    settle();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let mf = mnt.join("J");
        for round in 0..3u8 {
            let (old, new) = if round % 2 == 0 { (1, 2) } else { (2, 1) };
            // The kernel keeps every page the previous round read (`meta.ttl=1h`): drop them,
            // as memory pressure would, so that this round's reads reach the daemon too.
            let f = File::open(&mf).unwrap();
            // SAFETY: a valid descriptor; advice only.
            assert_eq!(
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) },
                0
            );
            drop(f);
            // dd if=mnt/J bs=64k count=4: the first blocks, and whatever read-ahead takes.
            // (Under load the kernel may not yet have dropped the pages of the version the
            // previous round replaced: ESTALE until it has, as below.)
            let mut primed = false;
            for _ in 0..20 {
                let mut f = File::open(&mf).unwrap();
                let mut buf = vec![0u8; 64 << 10];
                match (0..4).try_for_each(|_| f.read_exact(&mut buf)) {
                    Ok(()) => {
                        primed = true;
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ESTALE) => {
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    Err(e) => panic!("round {round}: priming read: {e}"),
                }
            }
            assert!(
                primed,
                "round {round}: the priming read stayed ESTALE for 2 s"
            );
            std::thread::sleep(Duration::from_millis(300));
            // dd if=J.new of=back/J conv=notrunc
            let w = std::fs::OpenOptions::new()
                .write(true)
                .open(backing.join("J"))
                .unwrap();
            w.write_all_at(&version(new), 0).unwrap();
            drop(w);
            let mut seen_error = false;
            let mut refused_since: Option<Instant> = None;
            let mut seen_new = false;
            for attempt in 0..400 {
                match std::fs::read(&mf) {
                    Ok(data) => {
                        refused_since = None;
                        let vs = block_versions(&data);
                        assert_eq!(data.len(), BLOCKS << 16, "round {round}: size");
                        let first = vs[0];
                        assert!(
                            first != 0 && vs.iter().all(|&x| x == first),
                            "round {round}, read {attempt}: one read mixed versions: {} blocks \
                             of version {old}, {} of version {new}, {} of neither ({opts:?})",
                            vs.iter().filter(|&&x| x == old).count(),
                            vs.iter().filter(|&&x| x == new).count(),
                            vs.iter().filter(|&&x| x == 0).count(),
                        );
                        if seen_error {
                            assert_eq!(
                                first, new,
                                "round {round}: after the error, the old version"
                            );
                        }
                        if first == new {
                            seen_new = true;
                            break;
                        }
                    }
                    Err(e) => {
                        assert_eq!(
                            e.raw_os_error(),
                            Some(libc::ESTALE),
                            "round {round}: a read failed otherwise than ESTALE: {e}"
                        );
                        // Until the kernel has dropped its pages of the old version (the
                        // daemon tells it right after the first refusal) and 500 ms more,
                        // reads are refused; on a loaded machine (the whole suite on 2 cores)
                        // the kernel's drop may itself take a while (the daemon logs a drop
                        // slower than 1 s).
                        let since = *refused_since.get_or_insert_with(Instant::now);
                        assert!(
                            since.elapsed() < Duration::from_secs(10),
                            "round {round}: ESTALE for {:?} ({attempt} reads)",
                            since.elapsed()
                        );
                        seen_error = true;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            // The kernel held only the first blocks and its read-ahead (1 MiB): the rest had
            // to come from the daemon, which found the new version.
            assert!(
                seen_new,
                "round {round}: the new version was never read ({opts:?})"
            );
            settle();
        }
    });
}

#[test]
fn never_a_mix_after_in_place_rewrite_cto_on() {
    no_mix_after_rewrite(&["meta.ttl=1h"]);
}

#[test]
fn never_a_mix_after_in_place_rewrite_cto_off() {
    no_mix_after_rewrite(&["meta.ttl=1h", "meta.cto=off"]);
}

#[test]
fn never_a_mix_after_in_place_rewrite_cto_off_with_opens() {
    no_mix_after_rewrite(&["meta.ttl=1h", "meta.cto=off", "fuse.no_open=off"]);
}

/// More directories than descriptors (issue 13 item 5): a tree of 3,000 directories under a
/// daemon limited to 1,024 descriptors. Each directory tierfs reached held one, so `find` got
/// EMFILE and afterwards even `ls` of the mount's root failed until a remount. Now held
/// directories are bounded like files: the whole tree is walked and read, and the root still
/// lists.
#[test]
fn more_directories_than_descriptors() {
    const DIRS: usize = 3000;
    let t = tempfile::tempdir().unwrap();
    let (backing, mnt, cache) = (t.path().join("b"), t.path().join("m"), t.path().join("c"));
    std::fs::create_dir(&mnt).unwrap();
    for i in 0..DIRS {
        let d = backing
            .join(format!("d{:02}", i % 50))
            .join(format!("e{i}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), format!("{i}\n")).unwrap();
    }
    let out = std::process::Command::new("timeout")
        .args(["30", "prlimit", "--nofile=1024:1024"])
        .arg(tierfs_bin())
        .arg("mount")
        .arg(&backing)
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(&cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    struct Lazy(PathBuf);
    impl Drop for Lazy {
        fn drop(&mut self) {
            let _ = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.0)
                .status();
        }
    }
    let _u = Lazy(mnt.clone());
    with_timeout(Duration::from_secs(120), vec![mnt.clone()], move || {
        let found = std::process::Command::new("find")
            .arg(&mnt)
            .args(["-type", "f", "-exec", "cat", "{}", "+"])
            .output()
            .unwrap();
        assert!(
            found.status.success(),
            "find: {}",
            String::from_utf8_lossy(&found.stderr)
        );
        let mut seen: Vec<usize> = String::from_utf8_lossy(&found.stdout)
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            (0..DIRS).collect::<Vec<_>>(),
            "not every file was read"
        );
        assert_eq!(
            std::fs::read_dir(&mnt).unwrap().count(),
            50,
            "the root no longer lists"
        );
    });
}

/// copy_file_range through the mount (issue 13 item 15) is done by the store (its own
/// copy_file_range: no byte of the file read through tierfs), in write-through and
/// write-back: the copy holds what the application wrote (write-back's dirty data goes to
/// the store first), and a destination read before the copy is not served from the stale
/// cache after it. In write-back a small file the store's copy would wait for is copied
/// through reads and writes instead.
#[test]
fn copy_file_range_is_done_by_the_store_and_stays_coherent() {
    const SIZE: usize = 4 << 20;
    for mode in ["through", "back"] {
        let m = BinMount::new(&[&format!("writeback.mode={mode}"), "ram.max=64M"]);
        let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
        let src: Vec<u8> = (0..SIZE).map(|i| (i % 241) as u8).collect();
        std::fs::write(backing.join("dst"), vec![0xAAu8; SIZE]).unwrap();
        settle();
        let s0 = m.stats();
        {
            let (mnt, src) = (mnt.clone(), src.clone());
            with_timeout(LIMIT, vec![mnt.clone()], move || {
                // The destination's old contents cached, the source written through the mount.
                assert_eq!(std::fs::read(mnt.join("dst")).unwrap(), vec![0xAAu8; SIZE]);
                std::fs::write(mnt.join("src"), &src).unwrap();
                let fi = File::open(mnt.join("src")).unwrap();
                let fo = std::fs::OpenOptions::new()
                    .write(true)
                    .open(mnt.join("dst"))
                    .unwrap();
                let mut done = 0usize;
                while done < SIZE {
                    let (mut oi, mut oo) = (done as i64, done as i64);
                    let n = unsafe {
                        libc::copy_file_range(
                            std::os::fd::AsRawFd::as_raw_fd(&fi),
                            &mut oi,
                            std::os::fd::AsRawFd::as_raw_fd(&fo),
                            &mut oo,
                            SIZE - done,
                            0,
                        )
                    };
                    assert!(
                        n > 0,
                        "copy_file_range: {}",
                        std::io::Error::last_os_error()
                    );
                    done += n as usize;
                }
                drop((fi, fo));
                assert!(
                    std::fs::read(mnt.join("dst")).unwrap() == src,
                    "{mode}: copy through the mount"
                );
            });
        }
        let s1 = m.stats();
        let d = |k: &str| stat_u64(&s1, &["backing", k]) - stat_u64(&s0, &["backing", k]);
        assert!(d("copy") >= 1, "{mode}: the store did not copy: {s1}");
        assert_eq!(d("copied_bytes"), SIZE as u64, "{mode}: {s1}");
        if mode == "back" {
            // A small file just written (`cp -r` of a source tree): the store's copy would
            // wait for its create, so the kernel copies through reads and writes (EXDEV),
            // which write-back absorbs.
            let mnt = mnt.clone();
            with_timeout(LIMIT, vec![mnt.clone()], move || {
                std::fs::write(mnt.join("small"), b"a small source file").unwrap();
                let fi = File::open(mnt.join("small")).unwrap();
                let fo = File::create(mnt.join("small.copy")).unwrap();
                let n = unsafe {
                    libc::copy_file_range(
                        std::os::fd::AsRawFd::as_raw_fd(&fi),
                        std::ptr::null_mut(),
                        std::os::fd::AsRawFd::as_raw_fd(&fo),
                        std::ptr::null_mut(),
                        1 << 20,
                        0,
                    )
                };
                assert_eq!(
                    n,
                    19,
                    "copy_file_range: {}",
                    std::io::Error::last_os_error()
                );
                drop((fi, fo));
                assert_eq!(
                    std::fs::read(mnt.join("small.copy")).unwrap(),
                    b"a small source file"
                );
            });
            let s2 = m.stats();
            assert_eq!(
                stat_u64(&s2, &["backing", "copy"]),
                stat_u64(&s1, &["backing", "copy"]),
                "a small new file was copied by the store: {s2}"
            );
        }
        m.unmount_and_wait();
        assert!(
            std::fs::read(backing.join("dst")).unwrap() == src,
            "{mode}: on the store"
        );
        if mode == "back" {
            assert_eq!(
                std::fs::read(backing.join("small.copy")).unwrap(),
                b"a small source file"
            );
        }
    }
}

/// Sets `path`'s atime and mtime to `sec` (through the mount: a deferred setattr).
fn set_times(path: &Path, sec: i64) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let t = [libc::timespec {
        tv_sec: sec,
        tv_nsec: 0,
    }; 2];
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), 0) };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

/// Issue 15: on a store where each request is a round trip, the namespace flusher has the
/// independent operations of a group at the store at once (`writeback.namespace_threads`),
/// and still in an order that keeps every dependency: a directory before what is made in
/// it, and a directory's times (tar's `utimens`) after the names made in it, which would
/// move them again. With one thread, one request at a time: the check can fail.
/// Unmount drains a slow store's whole backlog of deferred names, for as long as the store
/// makes progress: it used to give up after 5 s and leave the rest in the journal for the
/// next mount (a thousand creates over sshfs: the store did not have them after unmount).
#[test]
fn unmount_waits_for_a_slow_but_working_store_to_get_every_deferred_name() {
    let wb = tierfs_fs::WbConfig {
        mode: tierfs_fs::WbMode::Back,
        journal_size: 256 << 20,
        namespace_delay: Duration::from_secs(600),
        namespace_quiet: Duration::from_secs(600),
        namespace_threads: 1,
        ..Default::default()
    };
    let mut m = FaultMount::with_writeback(tierfs_fs::FsConfig::default(), Some(wb), |_| {});
    let (mnt, backing, faults) = (m.mnt.clone(), m.backing.clone(), m.faults.clone());
    const FILES: usize = 300;
    let data = |k: usize| format!("file {k}\n").repeat(10);
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
        std::fs::create_dir(mnt.join("d")).unwrap();
        for k in 0..FILES {
            std::fs::write(mnt.join(format!("d/f{k}")), data(k)).unwrap();
        }
    });
    assert!(!backing.join("d").exists(), "all of it deferred");
    // 35 ms a request, the names one at a time: 10 s for the names alone.
    faults.set_latency(Duration::from_millis(35));
    let t = std::time::Instant::now();
    // Unmounted and shut down, not mounted again: a new mount would replay what the
    // journal kept.
    m.shut_down();
    let took = t.elapsed();
    faults.set_latency(Duration::ZERO);
    let on_store = (0..FILES)
        .filter(|k| {
            std::fs::read_to_string(backing.join(format!("d/f{k}"))).is_ok_and(|d| d == data(*k))
        })
        .count();
    assert_eq!(
        on_store, FILES,
        "after an unmount that took {took:?}, the store has {on_store} of the {FILES} files whole"
    );
    assert!(
        took > Duration::from_secs(8),
        "the drain took {took:?}: not slow enough to tell"
    );
}

#[test]
fn namespace_operations_reach_a_slow_store_at_once_and_in_order() {
    use tierfs_store::OpClass;
    for threads in [1usize, 8] {
        let wb = tierfs_fs::WbConfig {
            mode: tierfs_fs::WbMode::Back,
            journal_size: 256 << 20,
            // One group: everything gathers until the fsync below asks for it.
            namespace_delay: Duration::from_secs(600),
            namespace_quiet: Duration::from_secs(600),
            namespace_threads: threads,
            ..Default::default()
        };
        let m = FaultMount::with_writeback(tierfs_fs::FsConfig::default(), Some(wb), |_| {});
        let (mnt, backing, faults) = (m.mnt.clone(), m.backing.clone(), m.faults.clone());
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            // A fresh listing of the root tells that "d" is free: its mkdir is deferred too.
            assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
            let d = mnt.join("d");
            std::fs::create_dir(&d).unwrap();
            for s in 0..2 {
                let sub = d.join(format!("s{s}"));
                std::fs::create_dir(&sub).unwrap();
                for k in 0..16 {
                    let f = sub.join(format!("f{k}"));
                    File::create(&f).unwrap();
                    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
                }
                set_times(&sub, 1_000_000 + s);
            }
            set_times(&d, 2_000_000);
            assert!(
                !backing.join("d").exists(),
                "deferred: nothing is on the store before the flusher takes the group"
            );
            faults.reset_most_in_flight();
            faults.set_latency(Duration::from_millis(20));
            File::open(&d).unwrap().sync_all().unwrap();
            faults.set_latency(Duration::ZERO);
            let most = faults.most_in_flight(OpClass::Write);
            for s in 0..2i64 {
                let sub = backing.join(format!("d/s{s}"));
                for k in 0..16 {
                    let md = std::fs::metadata(sub.join(format!("f{k}"))).unwrap();
                    assert_eq!(md.mode() & 0o7777, 0o640, "s{s}/f{k}");
                }
                assert_eq!(
                    std::fs::metadata(&sub).unwrap().mtime(),
                    1_000_000 + s,
                    "s{s}'s time was set before the names made in it"
                );
            }
            assert_eq!(
                std::fs::metadata(backing.join("d")).unwrap().mtime(),
                2_000_000
            );
            if threads == 1 {
                assert_eq!(most, 1, "one namespace thread, one request at a time");
            } else {
                assert!(
                    most >= 4,
                    "{threads} namespace threads, yet at most {most} creates at the store at once"
                );
            }
            println!("namespace_threads={threads}: at most {most} creates at the store at once");
        });
    }
}

/// A write-back mount over a FaultStore whose namespace flusher starts at once, with no
/// store lookups of new names (the listing answers them): the store's latency then falls on
/// the flusher alone.
fn eager_ns_mount(prepare: impl FnOnce(&Path)) -> FaultMount {
    let wb = tierfs_fs::WbConfig {
        mode: tierfs_fs::WbMode::Back,
        journal_size: 256 << 20,
        namespace_delay: Duration::ZERO,
        ..Default::default()
    };
    let cfg = tierfs_fs::FsConfig {
        meta_ttl: Duration::from_secs(3600),
        meta_cto: false,
        ..Default::default()
    };
    FaultMount::with_writeback(cfg, Some(wb), prepare)
}

/// A flusher whose setattr of a file's mtime hangs in the store (a frozen sshfs or NFS
/// server: setattr has no deadline) holds up no writer of the file, whose writes the journal
/// takes; once the store answers, every byte reaches it. (A reader's check of the fingerprint
/// the flush left provisional has a deadline on a store that can hang, which this local one
/// cannot: `hung_store.rs`.)
#[test]
fn a_flush_hung_in_the_store_holds_up_no_writer_of_its_file() {
    use tierfs_store::OpClass::{Meta, Write};
    const SLOW: Duration = Duration::from_secs(4);
    let m = eager_ns_mount(|b| std::fs::write(b.join("f"), vec![1u8; 64 << 10]).unwrap());
    let (mnt, backing, faults) = (m.mnt.clone(), m.backing.clone(), m.faults.clone());
    let _unmounted_last = with_timeout(LIMIT, vec![mnt.clone()], move || {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("f"))
            .unwrap();
        // A first write takes space credit for the next ones (a statfs) and is flushed.
        f.write_all_at(&[2u8; 4096], 0).unwrap();
        let settled = |what: &str| {
            let t = Instant::now();
            while m.stats()["writeback"]["dirty_bytes"].as_u64() != Some(0) {
                assert!(t.elapsed() < Duration::from_secs(20), "{what}: not flushed");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        settled("the first write");
        // Every metadata call of the store now takes SLOW: the next flush opens the file
        // (SLOW), its write lands, then its setattr of the mtime waits in the store.
        let written = faults.calls(Write);
        faults.set_class_latency(Meta, SLOW);
        f.write_all_at(&[3u8; 4096], 4096).unwrap();
        let t = Instant::now();
        while faults.calls(Write) == written || faults.in_flight(Meta) == 0 {
            assert!(
                t.elapsed() < 3 * SLOW,
                "the flush never reached its setattr"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Meanwhile the next writes are answered at once (by the journal), the first of
        // them older than the space credit's renewal period (`reserve::RESTAT`).
        std::thread::sleep(Duration::from_millis(1100));
        let t = Instant::now();
        for k in 2..6u64 {
            f.write_all_at(&[4u8; 4096], k * 4096).unwrap();
        }
        let took = t.elapsed();
        assert!(
            faults.in_flight(Meta) > 0,
            "the setattr was over before the writes: nothing shown"
        );
        assert!(
            took < Duration::from_millis(500),
            "writes waited {took:?} for a flush hung in the store"
        );
        faults.set_class_latency(Meta, Duration::ZERO);
        settled("the writes made while the store hung");
        let b = std::fs::read(backing.join("f")).unwrap();
        assert!(
            b[..4096].iter().all(|&x| x == 2)
                && b[4096..8192].iter().all(|&x| x == 3)
                && b[8192..6 * 4096].iter().all(|&x| x == 4)
                && b[6 * 4096..].iter().all(|&x| x == 1),
            "the store has other bytes than were written"
        );
        m
    });
}

/// Issue 15: a file write-back made, renamed in its directory to a free name after the
/// namespace flusher took its create (what `git` does with `index.lock` once a checkout's
/// creates are queued behind it): the rename is queued for the store (`ns_move`) and waits for
/// nothing. Meanwhile the old name, which the store already has, is neither listed nor found;
/// the same name is made anew and moved again (a second lock); at the end the store has the
/// new names with their data and not the lock.
#[test]
fn a_lock_file_renamed_after_the_flusher_took_its_create_waits_for_nothing() {
    let m = eager_ns_mount(|b| {
        std::fs::create_dir(b.join("d")).unwrap();
    });
    let (mnt, backing, faults) = (m.mnt.clone(), m.backing.clone(), m.faults.clone());
    let m = with_timeout(LIMIT, vec![mnt.clone()], move || {
        let d = mnt.join("d");
        let names = || {
            let mut v: Vec<String> = std::fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert!(names().is_empty());
        let waits = |m: &FaultMount| n(&m.stats(), "writeback.namespace.waits");
        let before = waits(&m);
        // Every create takes 500 ms at the store: the flusher is in it while we rename.
        faults.set_class_latency(tierfs_store::OpClass::Write, Duration::from_millis(500));
        for (k, lock, to) in [(1u8, "index.lock", "index"), (2, "index.lock", "config")] {
            faults.reset_most_in_flight();
            std::fs::write(d.join(lock), vec![k; 5000 * k as usize]).unwrap();
            // Its create taken: at the store (the second after the first one's move, which
            // frees the name there).
            let t = Instant::now();
            while faults.most_in_flight(tierfs_store::OpClass::Write) == 0 {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "{lock}: never at the store"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            let t = Instant::now();
            std::fs::rename(d.join(lock), d.join(to)).unwrap();
            assert!(
                t.elapsed() < Duration::from_millis(300),
                "{lock} -> {to}: {:?}",
                t.elapsed()
            );
            // The store may have the lock by now; the application does not see it.
            assert_eq!(
                std::fs::metadata(d.join(lock)).unwrap_err().raw_os_error(),
                Some(libc::ENOENT)
            );
            assert!(!names().contains(&lock.to_string()), "{:?}", names());
            assert_eq!(
                std::fs::read(d.join(to)).unwrap(),
                vec![k; 5000 * k as usize]
            );
        }
        assert_eq!(names(), vec!["config", "index"]);
        assert_eq!(
            waits(&m),
            before,
            "a rename waited for the namespace flusher"
        );
        assert!(n(&m.stats(), "writeback.namespace.deferred") >= 4);
        // Until the store has caught up, the lock, which it has for a while, is never shown.
        let t = Instant::now();
        while backing.join("d/index.lock").exists() || !backing.join("d/config").exists() {
            assert!(
                !names().contains(&"index.lock".to_string()),
                "{:?}",
                names()
            );
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the moves never reached the store"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        faults.set_class_latency(tierfs_store::OpClass::Write, Duration::ZERO);
        // Everything on the store: the new names whole, no lock left.
        File::open(&d).unwrap().sync_all().unwrap();
        for (k, to) in [(1u8, "index"), (2, "config")] {
            File::open(d.join(to)).unwrap().sync_all().unwrap();
            assert_eq!(
                std::fs::read(backing.join("d").join(to)).unwrap(),
                vec![k; 5000 * k as usize]
            );
        }
        assert!(!backing.join("d/index.lock").exists());
        assert_eq!(names(), vec!["config", "index"]);
        m
    });
    let m = m.remount();
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("d/index")).unwrap(), vec![1u8; 5000]);
        assert_eq!(
            std::fs::read(mnt.join("d/config")).unwrap(),
            vec![2u8; 10000]
        );
        assert!(!mnt.join("d/index.lock").exists());
    });
}

/// Issue 15: a link and a rename of files of the store to free names in another directory
/// of the store (what `cargo` and `rustc` do with every artifact: `deps/x.o` linked into the
/// incremental directory, `rmetaXXXX/full.rmeta` renamed to `deps/libx.rmeta`) wait only for
/// what is queued on the objects and directories they name: not for the creates queued
/// before them elsewhere, even while a touch of another file of the store is deferred (that
/// used to make every such rename and every link wait for everything queued), and not for
/// the linked file's data.
#[test]
fn links_and_renames_of_store_files_wait_only_for_what_they_name() {
    use tierfs_store::OpClass;
    const QUEUED: usize = 24;
    let m = eager_ns_mount(|b| {
        for d in ["deps", "inc", "other"] {
            std::fs::create_dir(b.join(d)).unwrap();
        }
        std::fs::write(b.join("deps/a.o"), b"old").unwrap();
        std::fs::write(b.join("deps/full.rmeta"), b"rmeta").unwrap();
        std::fs::write(b.join("deps/x"), b"x").unwrap();
    });
    let (mnt, backing, faults) = (m.mnt.clone(), m.backing.clone(), m.faults.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        // Every create (and link) takes 300 ms at the store: the queued creates keep the
        // namespace flusher busy for seconds.
        faults.set_class_latency(OpClass::Write, Duration::from_millis(300));
        for i in 0..QUEUED {
            std::fs::write(mnt.join(format!("other/f{i}")), [i as u8; 100]).unwrap();
        }
        // A touch of another file of the store, deferred (`ns_chattr`).
        let touch = std::process::Command::new("touch")
            .args(["-d", "2001-02-03 04:05:06"])
            .arg(mnt.join("deps/x"))
            .status()
            .unwrap();
        assert!(touch.success());
        // New data in the file to be linked (written in place: a truncate would be a
        // deferred setattr of it, which the link would wait for): not flushed before the link.
        std::fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("deps/a.o"))
            .unwrap()
            .write_all_at(b"compiled", 0)
            .unwrap();
        std::fs::hard_link(mnt.join("deps/a.o"), mnt.join("inc/a.o")).unwrap();
        std::fs::rename(mnt.join("deps/full.rmeta"), mnt.join("inc/lib.rmeta")).unwrap();
        let on_store = (0..QUEUED)
            .filter(|i| backing.join(format!("other/f{i}")).exists())
            .count();
        assert!(
            on_store < QUEUED,
            "the link and the rename waited for every create queued before them"
        );
        assert!(backing.join("inc/a.o").exists() && backing.join("inc/lib.rmeta").exists());
        assert!(!backing.join("deps/full.rmeta").exists());
        // What the application sees meanwhile, and the store once it has caught up.
        assert_eq!(std::fs::read(mnt.join("inc/a.o")).unwrap(), b"compiled");
        assert_eq!(std::fs::metadata(mnt.join("deps/a.o")).unwrap().nlink(), 2);
        faults.set_class_latency(OpClass::Write, Duration::ZERO);
        for f in ["deps/a.o", "deps/x", "other"] {
            File::open(mnt.join(f)).unwrap().sync_all().unwrap();
        }
        File::open(mnt.join("other/f0")).unwrap();
        let t = Instant::now();
        while (0..QUEUED).any(|i| !backing.join(format!("other/f{i}")).exists()) {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "creates never on the store"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(std::fs::read(backing.join("inc/a.o")).unwrap(), b"compiled");
        assert_eq!(
            std::fs::metadata(backing.join("inc/a.o")).unwrap().ino(),
            std::fs::metadata(backing.join("deps/a.o")).unwrap().ino()
        );
        assert_eq!(
            std::fs::read(backing.join("inc/lib.rmeta")).unwrap(),
            b"rmeta"
        );
        let t = Instant::now();
        while std::fs::metadata(backing.join("deps/x")).unwrap().mtime() != 981173106 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the touch never on the store"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// Issue 15: the store fails (EIO) in the middle of a group the namespace flusher applies
/// several operations of at once. What was applied before the failure is kept, what came
/// after it is applied again once the store is back (a create finds the object it made:
/// never a conflict, never `journal/lost/`), and every name and mode reaches the store.
#[test]
fn a_store_failing_halfway_through_a_parallel_group_loses_nothing() {
    use tierfs_store::OpClass;
    // Modes the test process's umask (022: this daemon runs in it, unlike `tierfs mount`,
    // which runs under umask 0) leaves alone.
    const MODES: [u32; 4] = [0o600, 0o640, 0o700, 0o444];
    let wb = tierfs_fs::WbConfig {
        mode: tierfs_fs::WbMode::Back,
        journal_size: 256 << 20,
        namespace_delay: Duration::from_secs(600),
        namespace_quiet: Duration::from_secs(600),
        namespace_threads: 8,
        retry_max: Duration::from_millis(200),
        ..Default::default()
    };
    let m = FaultMount::with_writeback(tierfs_fs::FsConfig::default(), Some(wb), |_| {});
    let (mnt, backing, faults, fs) = (
        m.mnt.clone(),
        m.backing.clone(),
        m.faults.clone(),
        m.fs.clone(),
    );
    let journal = m.dir.path().join("journal");
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
        let d = mnt.join("d");
        std::fs::create_dir(&d).unwrap();
        for (s, mode) in MODES.iter().enumerate() {
            let sub = d.join(format!("s{s}"));
            std::fs::create_dir(&sub).unwrap();
            for k in 0..16 {
                let f = sub.join(format!("f{k}"));
                File::create(&f).unwrap();
                std::fs::set_permissions(&f, std::fs::Permissions::from_mode(*mode)).unwrap();
            }
        }
        // 25 creates and mkdirs go through, then the store fails them until healed.
        faults.set_latency(Duration::from_millis(2));
        faults.fail_after(OpClass::Write, 25, libc::EIO);
        let healer = {
            let faults = faults.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(600));
                faults.fail(OpClass::Write, None);
            })
        };
        File::open(&d).unwrap().sync_all().unwrap();
        healer.join().unwrap();
        faults.set_latency(Duration::ZERO);
        let ns = fs.stats().writeback.unwrap().namespace;
        assert!(ns.errors > 0, "the store never failed: {ns:?}");
        assert_eq!(ns.conflicts, 0, "{ns:?}");
        for (s, mode) in MODES.iter().enumerate() {
            for k in 0..16 {
                let p = backing.join(format!("d/s{s}/f{k}"));
                let md = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert_eq!(md.mode() & 0o7777, *mode, "{}", p.display());
            }
        }
        assert!(
            !journal.join("lost").exists(),
            "a create taken for a conflict"
        );
        println!(
            "a group failed halfway ({} errors) and was applied whole",
            ns.errors
        );
    });
}
