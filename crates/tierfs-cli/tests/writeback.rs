//! Acceptance tests of issue 4 (write-back), points 1-3 of "What it must show", through real
//! mounts of the `tierfs` binary:
//!
//! 1. `kill -9` of the daemon never loses a byte that an fsync acknowledged;
//! 2. a full backing store fails `write(2)` with ENOSPC (not a later fsync or close), keeps
//!    what was acknowledged, and the mount stays usable once space is freed;
//! 3. the atomic-update sequence (write a temporary file, fsync it, rename it over the name,
//!    fsync the directory) survives `kill -9`: after replay the directory shows a state the
//!    application could have observed.
//!
//! Every test runs once per mode in [`MODES`]: "through" (the default, no extra option) and
//! "back" (`-o writeback.mode=back`). In write-through mode a `kill -9`
//! loses nothing (every write is in the backing store's page cache when it is acknowledged),
//! so there these tests check the verifiers against the strongest case; in write-back mode
//! acknowledged data lives in the SSD journal until the flushers write it, and the remount
//! after the kill replays it (../shared/ARCHITECTURE.md, "The write path").
//!
//! After a crash the tree is checked twice: through the remounted filesystem (what replay
//! serves) and, after a clean unmount (which drains the journal), directly in BACKING; the two
//! must also be identical.
//!
//! The writers are threads of this process working through the mount. `kill -9` kills the
//! daemon, not them: their pending system calls fail (ENOTCONN) and they stop. A writer error
//! before the kill fails the test. Each test prints a seed (`TIERFS_WB_SEED=<seed>` replays a
//! run) and a summary; run with `--nocapture` to see them.
//!
//! `TIERFS_WB_INJECT_LOSS=1` makes each test destroy acknowledged data in BACKING behind the
//! daemon's back at the point where a broken daemon would lose it (after the kill, or after
//! the unmount): every test must then fail. That is how the tests were shown able to fail
//! against a daemon that loses nothing; `verifiers_reject_lost_data` checks the same
//! of the verifiers alone, without a mount.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The write modes every test runs in. "through" passes no option; any other mode X passes
/// `-o writeback.mode=X`.
const MODES: &[&str] = &["through", "back"];

/// Temporary data lives on a real disk (the SSD tier wants O_DIRECT; /tmp may be a tmpfs).
const TMP: &str = "/var/tmp";
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

/// The mount options of `mode`. A small RAM tier: these tests write, they do not need one.
fn mode_opts(mode: &str) -> Vec<String> {
    let mut o = vec!["ram.max=64M".to_string()];
    if mode != "through" {
        o.push(format!("writeback.mode={mode}"));
    }
    o
}

fn mount(m: &BinMount, opts: &[String]) {
    let v: Vec<&str> = opts.iter().map(String::as_str).collect();
    m.mount(&v);
}

/// The seed of a test: `TIERFS_WB_SEED` if set (to replay a failure), else fresh; printed.
fn test_seed(test: &str) -> u64 {
    let seed = match std::env::var("TIERFS_WB_SEED") {
        Ok(s) => {
            let s = s.trim_start_matches("0x");
            u64::from_str_radix(s, 16).expect("TIERFS_WB_SEED: hex")
        }
        Err(_) => {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            mix(t ^ ((std::process::id() as u64) << 32) ^ mix(test.len() as u64))
        }
    };
    println!("{test}: seed {seed:#018x} (replay: TIERFS_WB_SEED={seed:x})");
    seed
}

/// Whether the test should destroy acknowledged data itself (see the module comment).
fn inject_loss() -> bool {
    std::env::var_os("TIERFS_WB_INJECT_LOSS").is_some()
}

/// A random moment for the kill: 20-400 ms into the writes.
fn kill_delay(r: &mut Rng) -> Duration {
    Duration::from_millis(r.range(20, 401))
}

/// `fsync` of a directory (what makes a create or rename in it durable).
fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Names and contents of the regular files in `dir` (absent directory: empty).
fn read_tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut t = BTreeMap::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return t,
        Err(e) => panic!("read_dir {}: {e}", dir.display()),
    };
    for ent in rd {
        let ent = ent.unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()));
        let name = ent.file_name().into_string().expect("utf-8 name");
        let data = std::fs::read(ent.path())
            .unwrap_or_else(|e| panic!("read {}: {e}", ent.path().display()));
        t.insert(name, data);
    }
    t
}

/// Describes the first difference of two trees, for a failure message.
fn tree_diff(a: &BTreeMap<String, Vec<u8>>, b: &BTreeMap<String, Vec<u8>>) -> String {
    for (k, v) in a {
        match b.get(k) {
            None => return format!("{k} only in the first"),
            Some(w) if w != v => {
                let at = v.iter().zip(w).position(|(x, y)| x != y);
                return format!(
                    "{k}: lengths {} / {}, first difference at {at:?}",
                    v.len(),
                    w.len()
                );
            }
            _ => {}
        }
    }
    match b.keys().find(|k| !a.contains_key(*k)) {
        Some(k) => format!("{k} only in the second"),
        None => "identical".into(),
    }
}

/// Outcome of a writer thread: what it did, and an error that was not caused by the kill.
#[derive(Default)]
struct WriterStats {
    writes: u64,
    bytes: u64,
    acks: u64,
    error_before_kill: Option<String>,
}

/// Runs `step` until the kill flag is set or a step fails. An error seen with the flag set is
/// the kill's doing (the flag is set before the signal is sent); one seen without it is a bug.
fn run_writer(
    killed: &AtomicBool,
    stats: &mut WriterStats,
    mut step: impl FnMut(&mut WriterStats) -> Result<(), String>,
) {
    while !killed.load(SeqCst) {
        if let Err(e) = step(stats) {
            if !killed.load(SeqCst) {
                stats.error_before_kill = Some(e);
            }
            return;
        }
    }
}

/// A writer thread's body: (dir, model, seed, pool, kill flag) -> (model, stats).
type Writer<M> = fn(PathBuf, M, u64, Arc<Vec<u8>>, Arc<AtomicBool>) -> (M, WriterStats);

/// One crash round: mounts, runs `writer` (dir, model, seed, pool, kill flag) on a thread in
/// `sub` of the mount, `kill -9`s the daemon after a random delay and returns what the writer
/// acknowledged. A writer error before the kill, or a mount that survives it, fails the test.
#[allow(clippy::too_many_arguments)]
fn write_until_killed<M: Send + 'static>(
    m: &BinMount,
    opts: &[String],
    sub: &str,
    model: M,
    r: &mut Rng,
    pool: &Arc<Vec<u8>>,
    what: &str,
    writer: Writer<M>,
) -> (M, WriterStats) {
    mount(m, opts);
    let killed = Arc::new(AtomicBool::new(false));
    let handle = {
        let (dir, pool, killed) = (m.mnt.join(sub), pool.clone(), killed.clone());
        let wseed = r.next();
        std::thread::spawn(move || writer(dir, model, wseed, pool, killed))
    };
    std::thread::sleep(kill_delay(r));
    killed.store(true, SeqCst);
    m.kill_daemon();
    let (model, st) = handle.join().expect("writer panicked");
    if let Some(e) = &st.error_before_kill {
        panic!("{what}: the writer failed before the kill: {e}");
    }
    assert!(!is_mounted(&m.mnt), "{what}: mounted after kill -9");
    (model, st)
}

fn ctx<T>(what: &str, r: io::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// 1. kill -9 keeps every fsynced byte
// ---------------------------------------------------------------------------------------------

/// Files the crash writer works on, each within `SPAN` (+ one write).
const CRASH_FILES: usize = 4;
const SPAN: u64 = 4 * MIB as u64;
const MAX_WRITE: usize = 256 * KIB;

/// A write issued since the file's last acknowledgement.
#[derive(Clone)]
struct Pending {
    off: usize,
    data: Vec<u8>,
}

/// What the application knows about one file.
#[derive(Default, Clone)]
struct FileModel {
    /// The contents if every write issued landed (the writer is the only one writing).
    cur: Vec<u8>,
    /// The contents when the last fsync/fdatasync returned Ok: what must survive.
    acked: Vec<u8>,
    /// The name is durable: created before this round, or an fsync of the file and then of
    /// its directory returned Ok after it was created (POSIX wants both for a new file).
    acked_exists: bool,
    /// Writes issued since `acked`, oldest first: each may or may not have landed, in part.
    pending: Vec<Pending>,
}

impl FileModel {
    /// A file as found in BACKING after a clean unmount: all of it durable.
    fn durable(contents: Option<Vec<u8>>) -> FileModel {
        match contents {
            None => FileModel::default(),
            Some(c) => FileModel {
                cur: c.clone(),
                acked: c,
                acked_exists: true,
                pending: Vec::new(),
            },
        }
    }

    /// Records a write as issued (before it is issued: one the kill interrupts may have
    /// landed).
    fn issue(&mut self, off: usize, data: Vec<u8>) {
        let end = off + data.len();
        if self.cur.len() < end {
            self.cur.resize(end, 0);
        }
        self.cur[off..end].copy_from_slice(&data);
        self.pending.push(Pending { off, data });
    }

    /// An fsync returned Ok: everything issued before it is acknowledged.
    fn ack(&mut self) {
        self.acked = self.cur.clone();
        self.acked_exists = true;
        self.pending.clear();
    }
}

/// Checks what a crash left of one file (`None`: the name is absent) against the model.
/// Returns the number of bytes that had to match the acknowledged contents or a later write.
///
/// The rules: the name exists if it was acknowledged. The length is at least the acknowledged
/// length and at most the end of the furthest write issued since (later writes may have
/// landed in part, so any length in between is possible). Each byte below the acknowledged
/// length equals the acknowledged byte, or the byte of one of the writes issued since the
/// acknowledgement that cover it; each byte past it is 0 (a hole that a later extending write
/// left) or the byte of a write covering it. In particular a byte that no later write covers
/// must be exactly the acknowledged byte.
fn check_file(name: &str, f: &FileModel, got: Option<&[u8]>) -> Result<u64, String> {
    let Some(g) = got else {
        return if f.acked_exists {
            Err(format!("{name}: missing, but it was acknowledged"))
        } else {
            Ok(0)
        };
    };
    let alen = f.acked.len();
    let max_end = f
        .pending
        .iter()
        .map(|w| w.off + w.data.len())
        .fold(alen, usize::max);
    if g.len() < alen || g.len() > max_end {
        return Err(format!(
            "{name}: length {} outside {alen}..={max_end} (acknowledged length ..= furthest \
             later write)",
            g.len()
        ));
    }
    // Between consecutive cuts, the set of writes covering a byte is the same: compare whole
    // slices (memcmp) and go byte by byte only where a later write landed torn.
    let mut cuts = vec![0, alen, g.len()];
    for w in &f.pending {
        cuts.extend([w.off, w.off + w.data.len()]);
    }
    cuts.retain(|&c| c <= g.len());
    cuts.sort_unstable();
    cuts.dedup();
    let zeros = vec![0u8; MAX_WRITE.max(1 << 16)];
    for win in cuts.windows(2) {
        let (a, b) = (win[0], win[1]);
        let seg = &g[a..b];
        // `alen` is a cut, so a segment is entirely below or entirely past it.
        let base_at = |p: usize| if p < alen { f.acked[p] } else { 0 };
        let base_eq = if a < alen {
            seg == &f.acked[a..b]
        } else {
            seg.chunks(zeros.len()).all(|c| c == &zeros[..c.len()])
        };
        if base_eq {
            continue;
        }
        let covering: Vec<&[u8]> = f
            .pending
            .iter()
            .filter(|w| w.off <= a && w.off + w.data.len() >= b)
            .map(|w| &w.data[a - w.off..b - w.off])
            .collect();
        if covering.contains(&seg) {
            continue;
        }
        for (i, &byte) in seg.iter().enumerate() {
            let p = a + i;
            if byte != base_at(p) && !covering.iter().any(|c| c[i] == byte) {
                return Err(format!(
                    "{name}: byte {p} is {byte:#04x}; allowed: {:#04x} ({}) or one of {} later \
                     write(s) covering it; file length {}, acknowledged length {alen}",
                    base_at(p),
                    if p < alen { "acknowledged" } else { "hole" },
                    covering.len(),
                    g.len(),
                ));
            }
        }
    }
    Ok(alen as u64)
}

fn crash_name(i: usize) -> String {
    format!("f{i}")
}

/// The crash writer: random writes to `CRASH_FILES` files in `dir`, fsync or fdatasync every
/// few writes, the model updated as it goes. Returns the model when the kill stops it.
fn crash_writer(
    dir: PathBuf,
    mut files: Vec<FileModel>,
    seed: u64,
    pool: Arc<Vec<u8>>,
    killed: Arc<AtomicBool>,
) -> (Vec<FileModel>, WriterStats) {
    let mut r = Rng::new(seed);
    let mut fds: Vec<Option<File>> = (0..CRASH_FILES).map(|_| None).collect();
    let mut since_ack = [0u32; CRASH_FILES];
    let mut stats = WriterStats::default();
    run_writer(&killed, &mut stats, |stats| {
        let i = r.below(CRASH_FILES);
        if fds[i].is_none() {
            let path = dir.join(crash_name(i));
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path);
            fds[i] = Some(ctx("open", opened)?);
        }
        let fd = fds[i].as_ref().unwrap();
        let f = &mut files[i];
        // Log-uniform lengths: as many 1-byte writes as 128 KiB ones.
        let bits = r.range(0, 19);
        let len = (1 + r.range(0, 1 << bits) as usize).min(MAX_WRITE);
        let cur = f.cur.len() as u64;
        let mut off = match r.range(0, 10) {
            0..=6 => r.range(0, SPAN),
            7 | 8 => cur,                            // append
            _ => cur + r.range(1, 256 * KIB as u64), // extend, leaving a hole
        };
        if off > SPAN {
            off = r.range(0, SPAN);
        }
        let src = r.below(pool.len() - len);
        f.issue(off as usize, pool[src..src + len].to_vec());
        ctx(
            "pwrite",
            write_all_at(fd, &f.pending.last().unwrap().data, off),
        )?;
        stats.writes += 1;
        stats.bytes += len as u64;
        since_ack[i] += 1;
        if r.range(0, 3) == 0 || since_ack[i] >= 8 {
            if r.range(0, 2) == 0 {
                ctx("fdatasync", fd.sync_data())?;
            } else {
                ctx("fsync", fd.sync_all())?;
            }
            if !f.acked_exists {
                ctx("fsync(dir)", fsync_dir(&dir))?;
            }
            f.ack();
            since_ack[i] = 0;
            stats.acks += 1;
        }
        // Now and then a close (flush + release) and a fresh open.
        if r.range(0, 32) == 0 {
            fds[i] = None;
        }
        Ok(())
    });
    (files, stats)
}

/// 100 rounds per mode over one BACKING and cache dir: mount, let the crash writer run for a
/// random 20-400 ms, `kill -9` the daemon, remount (replay), check every file through the
/// mount, unmount cleanly, check BACKING directly and that it shows what the mount showed.
/// The files carry over from round to round (replay over existing contents).
#[test]
fn crash_kill9_keeps_every_fsynced_byte() {
    const ROUNDS: usize = 100;
    let seed = test_seed("crash_kill9_keeps_every_fsynced_byte");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    // A watchdog for a hang, not a speed check: write-back's 100 rounds take about 290 s
    // alone on a 2-CPU machine (each round mounts, replays, verifies and drains), and more
    // under the whole suite.
    let limit = Duration::from_secs(450 * MODES.len() as u64);
    with_timeout(limit, vec![mnt.clone()], move || {
        let pool = Arc::new(seeded_bytes(seed, 2 * MIB));
        for (mi, mode) in MODES.iter().enumerate() {
            let t0 = Instant::now();
            let opts = mode_opts(mode);
            let sub = format!("crash-{mode}");
            std::fs::create_dir(m.backing.join(&sub)).unwrap();
            let mut r = Rng::new(seed ^ mix(mi as u64 + 1));
            let mut files = vec![FileModel::default(); CRASH_FILES];
            let (mut writes, mut acks, mut verified, mut written) = (0u64, 0u64, 0u64, 0u64);
            for round in 0..ROUNDS {
                let what = format!("{mode} round {round}");
                let (model, st) = write_until_killed(
                    &m,
                    &opts,
                    &sub,
                    files.clone(),
                    &mut r,
                    &pool,
                    &what,
                    crash_writer,
                );
                (writes, acks, written) = (writes + st.writes, acks + st.acks, written + st.bytes);
                if inject_loss() {
                    // The smallest loss a broken replay could cause: one acknowledged byte that
                    // no later write covers, changed.
                    let spot = model.iter().enumerate().find_map(|(i, f)| {
                        (0..f.acked.len()).find_map(|p| {
                            let covered = f
                                .pending
                                .iter()
                                .any(|w| (w.off..w.off + w.data.len()).contains(&p));
                            (!covered).then_some((i, p))
                        })
                    });
                    if let Some((i, p)) = spot {
                        let path = m.backing.join(&sub).join(crash_name(i));
                        let f = File::options().write(true).open(path).unwrap();
                        f.write_at(&[!model[i].acked[p]], p as u64).unwrap();
                    }
                }

                // Replay at mount; what the mount serves, then what BACKING holds once the
                // journal is drained.
                mount(&m, &opts);
                let seen: Vec<Option<Vec<u8>>> = (0..CRASH_FILES)
                    .map(|i| read_opt(&m.mnt.join(&sub).join(crash_name(i))))
                    .collect();
                m.unmount_and_wait();
                for (i, f) in model.iter().enumerate() {
                    let name = crash_name(i);
                    let got = read_opt(&m.backing.join(&sub).join(&name));
                    let v = check_file(&name, f, seen[i].as_deref()).unwrap_or_else(|e| {
                        panic!("{mode} round {round}, through the mount after replay: {e}")
                    });
                    check_file(&name, f, got.as_deref()).unwrap_or_else(|e| {
                        panic!("{mode} round {round}, in BACKING after unmount: {e}")
                    });
                    assert!(
                        got == seen[i],
                        "{mode} round {round}: {name} in BACKING after the unmount differs from \
                         what the mount served"
                    );
                    verified += v;
                    files[i] = FileModel::durable(got);
                }
            }
            println!(
                "crash_kill9 [{mode}]: {ROUNDS} rounds, {writes} writes ({} MiB), {acks} fsyncs \
                 acknowledged, {} MiB of acknowledged bytes verified (twice), {:.1} s",
                written >> 20,
                verified >> 20,
                t0.elapsed().as_secs_f64()
            );
            assert!(
                acks >= ROUNDS as u64,
                "{mode}: too few fsyncs acknowledged: {acks}"
            );
        }
    });
}

fn read_opt(p: &Path) -> Option<Vec<u8>> {
    match std::fs::read(p) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => panic!("read {}: {e}", p.display()),
    }
}

// ---------------------------------------------------------------------------------------------
// 2. ENOSPC at write, and the mount stays usable
// ---------------------------------------------------------------------------------------------

/// File `i` of the ENOSPC test: its bytes at `off..off+len`, drawn from the pool.
fn fill_bytes(pool: &[u8], i: usize, off: usize, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut at = (mix(i as u64) as usize + off) % pool.len();
    while v.len() < len {
        let n = (len - v.len()).min(pool.len() - at);
        v.extend_from_slice(&pool[at..at + n]);
        at = 0;
    }
    v
}

/// BACKING is a 64 MiB tmpfs. Per mode: write 3 MiB files (256 KiB writes, fsync after each
/// file) until a write fails; the error is ENOSPC or EDQUOT and comes from `write`, not from
/// an fsync (write-back reserves backing space before it acknowledges a write: "failure =
/// ENOSPC now"); at least half of the store was usable; an fsync of the partly written file
/// then succeeds (what `write` acknowledged had its space). Every acknowledged byte reads
/// back exact. Then two files are deleted, and writing works again (within 15 s: write-back
/// may have to apply the deletions to BACKING before space comes back). After a clean
/// unmount BACKING holds exactly the acknowledged files.
#[test]
fn enospc_at_write_and_mount_stays_usable() {
    // Not a divisor of the store size: the failing write lands inside a file, after a
    // possibly short write.
    const FILE: usize = 3 * MIB + 12345;
    const WRITE: usize = 256 * KIB;
    let seed = test_seed("enospc_at_write_and_mount_stays_usable");
    let tmpfs = TmpfsMount::new(Path::new(TMP), "64m");
    let mut m = BinMount::unmounted_in(Path::new(TMP));
    m.backing = tmpfs.path.clone();
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(120), vec![mnt.clone()], move || {
        let pool = seeded_bytes(seed, 3 * MIB + 4321);
        for mode in MODES {
            let t0 = Instant::now();
            mount(&m, &mode_opts(mode));
            let dir = m.mnt.clone();
            // name -> acknowledged length (contents: fill_bytes(i, 0, len)).
            let mut acked: BTreeMap<usize, usize> = BTreeMap::new();
            let mut failed: Option<(usize, usize, io::Error)> = None;
            'files: for i in 0..1000 {
                let f = File::create(dir.join(format!("n{i}")))
                    .unwrap_or_else(|e| panic!("{mode}: create n{i}: {e}"));
                let mut off = 0;
                while off < FILE {
                    let data = fill_bytes(&pool, i, off, WRITE.min(FILE - off));
                    match f.write_at(&data, off as u64) {
                        Ok(0) => panic!("{mode}: n{i}: write returned 0"),
                        // A short write: the store is (nearly) full; the next one says why.
                        Ok(n) => off += n,
                        Err(e) => {
                            failed = Some((i, off, e));
                            break;
                        }
                    }
                }
                if failed.is_none() {
                    f.sync_all().unwrap_or_else(|e| {
                        panic!("{mode}: fsync of n{i} (not write) failed: {e}")
                    });
                    acked.insert(i, off);
                    continue;
                }
                // What write acknowledged had its space: the fsync must keep it.
                f.sync_all()
                    .unwrap_or_else(|e| panic!("{mode}: fsync of n{i} after ENOSPC: {e}"));
                acked.insert(i, off);
                break 'files;
            }
            let (fi, at, err) = failed.unwrap_or_else(|| panic!("{mode}: no write ever failed"));
            assert!(
                matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)),
                "{mode}: write to n{fi} at {at} failed with {err}, not ENOSPC/EDQUOT"
            );
            let total: usize = acked.values().sum();
            assert!(
                total >= 32 * MIB,
                "{mode}: ENOSPC after only {} KiB of a 64 MiB store",
                total >> 10
            );
            // The failed write may have landed in part (it was never acknowledged, like a
            // torn write in the crash test): n{fi} may hold up to all of it past its
            // acknowledged length, but nothing else. (Today's write-through does leave part of
            // it: PosixStore::write loops over short pwrites and reports the ENOSPC of the
            // next one for the whole request, where a local filesystem would return the
            // short count.)
            let torn_max = at + WRITE.min(FILE - at);
            let verify = |root: &Path, acked: &BTreeMap<usize, usize>, when: &str| {
                for (&i, &len) in acked {
                    let got = std::fs::read(root.join(format!("n{i}")))
                        .unwrap_or_else(|e| panic!("{mode} {when}: read n{i}: {e}"));
                    let max = if i == fi { torn_max } else { len };
                    assert!(
                        (len..=max).contains(&got.len())
                            && got == fill_bytes(&pool, i, 0, got.len()),
                        "{mode} {when}: n{i} is not what was acknowledged ({} bytes, want \
                         {len}..={max} bytes of its contents)",
                        got.len()
                    );
                }
            };
            verify(&dir, &acked, "through the mount after ENOSPC");
            let landed = std::fs::metadata(dir.join(format!("n{fi}"))).unwrap().len() as usize - at;

            // Free space; the mount must take writes again.
            for i in [0, 1] {
                std::fs::remove_file(dir.join(format!("n{i}"))).unwrap();
                acked.remove(&i);
            }
            fsync_dir(&dir).unwrap();
            let t_free = Instant::now();
            let mut retries = 0;
            let again = 1000;
            let len = 2 * MIB;
            loop {
                let r = (|| {
                    let f = File::create(dir.join(format!("n{again}")))?;
                    write_all_at(&f, &fill_bytes(&pool, again, 0, len), 0)?;
                    f.sync_all()
                })();
                match r {
                    Ok(()) => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::ENOSPC)
                            && t_free.elapsed() < Duration::from_secs(15) =>
                    {
                        retries += 1;
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    Err(e) => panic!("{mode}: write after freeing 8 MiB: {e}"),
                }
            }
            acked.insert(again, len);
            verify(&dir, &acked, "through the mount after freeing space");
            m.unmount_and_wait();
            if inject_loss() {
                let (&i, &len) = acked.iter().next().unwrap();
                File::options()
                    .write(true)
                    .open(m.backing.join(format!("n{i}")))
                    .unwrap()
                    .set_len(len as u64 - 1)
                    .unwrap();
            }
            verify(&m.backing, &acked, "in BACKING after unmount");
            let mut names: Vec<String> = read_tree(&m.backing).into_keys().collect();
            names.sort();
            let mut want: Vec<String> = acked.keys().map(|i| format!("n{i}")).collect();
            want.sort();
            assert_eq!(names, want, "{mode}: the names in BACKING after unmount");
            println!(
                "enospc [{mode}]: write to n{fi} at {} KiB failed with {err} ({landed} bytes of it \
                 landed) after {} MiB acknowledged; writes resumed {} ms after deleting 8 MiB ({retries} ENOSPC retries); \
                 {:.1} s",
                at >> 10,
                total >> 20,
                t_free.elapsed().as_millis(),
                t0.elapsed().as_secs_f64()
            );
            for n in names {
                std::fs::remove_file(m.backing.join(n)).unwrap();
            }
        }
    });
    drop(tmpfs);
}

// ---------------------------------------------------------------------------------------------
// 3. create, write, rename, fsync(dir) across kill -9
// ---------------------------------------------------------------------------------------------

/// The names the atomic-update writer replaces (each through `<name>.tmp`).
const NAMES: &[&str] = &["a", "b", "c"];

/// One contents a name held or may hold.
#[derive(Clone)]
enum Version {
    /// What BACKING held when the round started (None: absent); durable.
    Initial(Option<Vec<u8>>),
    /// Installed by a rename of this round: contents `version_bytes(id, len)`, fsynced
    /// before the rename or not.
    New { id: u64, len: usize, synced: bool },
}

/// The bytes of version `id`: a header naming it (so a failure says which version a file
/// holds) and pool bytes.
fn version_bytes(pool: &[u8], id: u64, len: usize) -> Vec<u8> {
    let start = mix(id) as usize % (pool.len() - len);
    let mut v = pool[start..start + len].to_vec();
    let head = format!("v{id:016x}\n");
    let n = head.len().min(len);
    v[..n].copy_from_slice(&head.as_bytes()[..n]);
    v
}

/// What the application knows about one name.
#[derive(Clone)]
struct NameModel {
    /// `versions[0]` is the round's initial state; then one per rename issued, in order.
    versions: Vec<Version>,
    /// Index of the last version whose rename an fsync of the directory returned Ok after.
    dir_synced: usize,
    /// `<name>.tmp` may exist: created since the last fsync(dir) that returned Ok (until
    /// then a rename that removed it may not be durable).
    tmp_allowed: bool,
}

impl NameModel {
    fn initial(contents: Option<Vec<u8>>) -> NameModel {
        NameModel {
            versions: vec![Version::Initial(contents)],
            dir_synced: 0,
            tmp_allowed: false,
        }
    }

    /// The oldest version the name may show after a crash: the last one that was fsynced
    /// before its rename and whose rename was followed by a successful fsync(dir).
    fn floor(&self) -> usize {
        (0..=self.dir_synced)
            .rev()
            .find(|&j| match self.versions[j] {
                Version::Initial(_) => true,
                Version::New { synced, .. } => synced,
            })
            .unwrap()
    }
}

/// Checks a directory after a crash against the models of its names.
///
/// The allowed states (there are no docs on write-back crash semantics yet; these are the
/// guarantees ../shared/ARCHITECTURE.md's journal design gives, and what ext4 gives with
/// its default `auto_da_alloc`):
/// - a name shows the complete contents of one of its versions, never a mix, a torn or an
///   empty file (every version is non-empty), nor a version older than `floor()`: one that
///   was fsynced before its rename, renamed, and made durable by fsync(dir) is the oldest
///   state the name can go back to. A version that was not fsynced before its rename may be
///   lost ("allowed to lose data"), but only by the name going back to a complete earlier
///   version: the application never observed anything else under the name, since every
///   write to the temporary file was issued before the rename;
/// - later versions than the floor may show (renames not yet made durable may or may not
///   have landed), absence only if the initial state at or after the floor was absence;
/// - `<name>.tmp` exists only if one was created since the last successful fsync(dir); its
///   contents are not checked (it was never made durable, and may be torn);
/// - no other names.
fn check_dir(
    pool: &[u8],
    models: &[NameModel],
    tree: &BTreeMap<String, Vec<u8>>,
) -> Result<(), String> {
    for name in tree.keys() {
        let ok = NAMES.iter().enumerate().any(|(n, base)| {
            name == base || (models[n].tmp_allowed && *name == format!("{base}.tmp"))
        });
        if !ok {
            return Err(format!("unexpected name {name:?}"));
        }
    }
    for (n, base) in NAMES.iter().enumerate() {
        let nm = &models[n];
        let got = tree.get(*base);
        let floor = nm.floor();
        let matches = nm.versions[floor..].iter().any(|v| match (v, got) {
            (Version::Initial(want), got) => want.as_ref() == got,
            (Version::New { id, len, .. }, Some(g)) => {
                g.len() == *len && *g == version_bytes(pool, *id, *len)
            }
            (Version::New { .. }, None) => false,
        });
        if !matches {
            let what = match got {
                None => "absent".to_string(),
                Some(g) => {
                    let head = String::from_utf8_lossy(&g[..g.len().min(17)]).into_owned();
                    format!("{} bytes starting {head:?}", g.len())
                }
            };
            let allowed: Vec<String> = nm.versions[floor..]
                .iter()
                .map(|v| match v {
                    Version::Initial(None) => "absent".into(),
                    Version::Initial(Some(c)) => format!("initial ({} bytes)", c.len()),
                    Version::New { id, len, synced } => format!(
                        "v{id:016x} ({len} bytes, {})",
                        if *synced { "fsynced" } else { "not fsynced" }
                    ),
                })
                .collect();
            return Err(format!(
                "{base}: {what}; allowed (versions {floor}.. of {}): {allowed:?}",
                nm.versions.len()
            ));
        }
    }
    Ok(())
}

/// The atomic-update writer: pick a name; create `<name>.tmp`, write new contents in 1-4
/// pieces, fsync it (60% of the time), close, rename it over the name, fsync the directory
/// (75% of the time: some renames stay not durable for a while).
fn rename_writer(
    dir: PathBuf,
    mut models: Vec<NameModel>,
    seed: u64,
    pool: Arc<Vec<u8>>,
    killed: Arc<AtomicBool>,
) -> (Vec<NameModel>, WriterStats) {
    let mut r = Rng::new(seed);
    let mut stats = WriterStats::default();
    run_writer(&killed, &mut stats, |stats| {
        let n = r.below(NAMES.len());
        let synced = r.range(0, 5) < 3;
        let id = r.next();
        let len = 1 + r.below(256 * KIB);
        let data = version_bytes(&pool, id, len);
        let tmp = dir.join(format!("{}.tmp", NAMES[n]));
        models[n].tmp_allowed = true;
        let mut f = ctx("create tmp", File::create(&tmp))?;
        let pieces = 1 + r.below(4);
        let mut at = 0;
        for k in 0..pieces {
            let end = if k + 1 == pieces {
                len
            } else {
                at + r.below(len - at + 1)
            };
            ctx("write tmp", f.write_all(&data[at..end]))?;
            stats.writes += 1;
            at = end;
        }
        stats.bytes += len as u64;
        if synced {
            ctx("fsync tmp", f.sync_all())?;
        }
        drop(f);
        // Recorded before the rename is issued: one the kill interrupts may have landed.
        models[n].versions.push(Version::New { id, len, synced });
        ctx("rename", std::fs::rename(&tmp, dir.join(NAMES[n])))?;
        if r.range(0, 4) != 0 {
            ctx("fsync(dir)", fsync_dir(&dir))?;
            for m in models.iter_mut() {
                m.dir_synced = m.versions.len() - 1;
                // The writer is sequential: no temporary file exists at this point.
                m.tmp_allowed = false;
            }
            stats.acks += 1;
        }
        Ok(())
    });
    (models, stats)
}

/// 30 rounds per mode over one BACKING and cache dir: mount, run the atomic-update writer for
/// a random 20-400 ms, `kill -9` the daemon, remount (replay), check the directory through
/// the mount against `check_dir`'s rules, unmount cleanly, check BACKING the same way and that
/// it equals what the mount showed. Leftover temporary files are removed between rounds.
#[test]
fn ordering_create_write_rename_fsyncdir_survives_crash() {
    const ROUNDS: usize = 30;
    let seed = test_seed("ordering_create_write_rename_fsyncdir_survives_crash");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    let limit = Duration::from_secs(120 * MODES.len() as u64);
    with_timeout(limit, vec![mnt.clone()], move || {
        let pool = Arc::new(seeded_bytes(seed, 2 * MIB));
        for (mi, mode) in MODES.iter().enumerate() {
            let t0 = Instant::now();
            let opts = mode_opts(mode);
            let sub = format!("rename-{mode}");
            let bdir = m.backing.join(&sub);
            std::fs::create_dir(&bdir).unwrap();
            let mut r = Rng::new(seed ^ mix(mi as u64 + 101));
            let mut models: Vec<NameModel> =
                NAMES.iter().map(|_| NameModel::initial(None)).collect();
            let (mut renames, mut dsyncs, mut checked_new) = (0u64, 0u64, 0u64);
            for round in 0..ROUNDS {
                let what = format!("{mode} round {round}");
                let (model, st) = write_until_killed(
                    &m,
                    &opts,
                    &sub,
                    models.clone(),
                    &mut r,
                    &pool,
                    &what,
                    rename_writer,
                );
                renames += model
                    .iter()
                    .map(|nm| nm.versions.len() as u64 - 1)
                    .sum::<u64>();
                dsyncs += st.acks;
                if inject_loss() {
                    // A daemon that lost the journal: the last durable version of a name
                    // rolled back to an older one (or to nothing).
                    if let Some(n) = (0..NAMES.len()).find(|&n| model[n].floor() > 0) {
                        let p = bdir.join(NAMES[n]);
                        match model[n].versions[model[n].floor() - 1].clone() {
                            Version::Initial(None) => std::fs::remove_file(p).unwrap(),
                            Version::Initial(Some(c)) => std::fs::write(p, c).unwrap(),
                            Version::New { id, len, .. } => {
                                std::fs::write(p, version_bytes(&pool, id, len)).unwrap()
                            }
                        }
                    }
                }

                mount(&m, &opts);
                let seen = read_tree(&m.mnt.join(&sub));
                m.unmount_and_wait();
                let got = read_tree(&bdir);
                check_dir(&pool, &model, &seen).unwrap_or_else(|e| {
                    panic!("{mode} round {round}, through the mount after replay: {e}")
                });
                check_dir(&pool, &model, &got).unwrap_or_else(|e| {
                    panic!("{mode} round {round}, in BACKING after unmount: {e}")
                });
                assert!(
                    seen == got,
                    "{mode} round {round}: BACKING after the unmount differs from what the mount \
                     served: {}",
                    tree_diff(&seen, &got)
                );
                checked_new += model
                    .iter()
                    .filter(|nm| matches!(nm.versions[nm.floor()], Version::New { .. }))
                    .count() as u64;
                // The next round starts from what is durable now.
                for (n, name) in NAMES.iter().enumerate() {
                    let tmp = bdir.join(format!("{name}.tmp"));
                    if tmp.exists() {
                        std::fs::remove_file(tmp).unwrap();
                    }
                    models[n] = NameModel::initial(got.get(*name).cloned());
                }
            }
            println!(
                "ordering [{mode}]: {ROUNDS} rounds, {renames} renames, {dsyncs} fsync(dir) \
                 acknowledged, {checked_new} names held to a version fsynced in their round; \
                 {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            assert!(
                checked_new > 0,
                "{mode}: no round made a new version durable before the kill"
            );
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The verifiers can fail
// ---------------------------------------------------------------------------------------------

/// The checks above reject lost, torn and rolled-back data (no mount: the verifiers alone).
#[test]
fn verifiers_reject_lost_data() {
    // check_file
    let mut f = FileModel::default();
    f.issue(0, vec![1, 2, 3, 4, 5, 6]);
    f.ack();
    f.issue(2, vec![9, 9]);
    f.issue(8, vec![7]); // extends with a hole at 6..8
    let ok: &[&[u8]] = &[
        &[1, 2, 3, 4, 5, 6],
        &[1, 2, 9, 9, 5, 6],
        &[1, 2, 9, 4, 5, 6], // the later write landed torn
        &[1, 2, 9, 9, 5, 6, 0, 0, 7],
        &[1, 2, 3, 4, 5, 6, 0],
    ];
    for g in ok {
        assert!(check_file("t", &f, Some(g)).is_ok(), "{g:?} rejected");
    }
    let bad: &[&[u8]] = &[
        &[1, 2, 3, 4, 5],                // acknowledged tail lost
        &[1, 2, 3, 4, 5, 0],             // acknowledged byte zeroed
        &[1, 2, 9, 9, 5, 6, 0, 0, 7, 0], // longer than any write explains
        &[1, 2, 9, 9, 5, 6, 1, 0, 7],    // hole not zero
        &[],                             // empty
    ];
    for g in bad {
        assert!(check_file("t", &f, Some(g)).is_err(), "{g:?} accepted");
    }
    assert!(check_file("t", &f, None).is_err(), "missing file accepted");
    assert!(check_file("t", &FileModel::default(), None).is_ok());

    // check_dir
    let pool = seeded_bytes(7, 64 * KIB);
    let v = |id: u64, synced: bool| Version::New {
        id,
        len: 1000,
        synced,
    };
    let mut nm = NameModel::initial(Some(b"old".to_vec()));
    nm.versions.extend([v(1, true), v(2, false), v(3, true)]);
    nm.dir_synced = 2; // v3's rename not durable: floor is v1
    let mut models = vec![NameModel::initial(None); NAMES.len()];
    models[0] = nm;
    let tree = |a: Option<Vec<u8>>, extra: &[&str]| {
        let mut t: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        if let Some(a) = a {
            t.insert("a".into(), a);
        }
        for e in extra {
            t.insert(e.to_string(), vec![1]);
        }
        t
    };
    for id in [1, 2, 3] {
        let t = tree(Some(version_bytes(&pool, id, 1000)), &[]);
        assert!(check_dir(&pool, &models, &t).is_ok(), "v{id} rejected");
    }
    let mut mixed = version_bytes(&pool, 1, 1000);
    mixed[500..].copy_from_slice(&version_bytes(&pool, 2, 1000)[500..]);
    let bad = [
        tree(Some(b"old".to_vec()), &[]), // rolled back past the floor
        tree(None, &[]),                  // lost
        tree(Some(Vec::new()), &[]),      // empty
        tree(Some(mixed), &[]),           // a mix of two versions
        tree(Some(version_bytes(&pool, 1, 999)), &[]), // torn
        tree(Some(version_bytes(&pool, 1, 1000)), &["a.tmp"]), // tmp after fsync(dir)
        tree(Some(version_bytes(&pool, 1, 1000)), &["zz"]), // a stray name
    ];
    for (k, t) in bad.iter().enumerate() {
        assert!(
            check_dir(&pool, &models, t).is_err(),
            "bad state {k} accepted"
        );
    }
    models[0].tmp_allowed = true;
    let t = tree(Some(version_bytes(&pool, 1, 1000)), &["a.tmp"]);
    assert!(
        check_dir(&pool, &models, &t).is_ok(),
        "allowed tmp rejected"
    );
}

/// A journal left by a crash holds acknowledged writes: the next mount writes them into the
/// store before serving anything, in either write mode, and `--reset-cache` (meant for a
/// damaged SSD tier) replays a readable journal instead of wiping it. The journal is written
/// here with the journal's own API, so the pending writes are certain to be pending.
#[test]
fn journal_replayed_at_mount_in_both_modes_even_with_reset_cache() {
    use std::os::unix::fs::MetadataExt;
    use tierfs_cache::journal::{FileRef, Journal, JournalConfig};
    for (mode, reset) in [
        ("through", false),
        ("back", false),
        ("through", true),
        ("back", true),
    ] {
        let m = BinMount::new(&[]);
        let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
        std::fs::create_dir(backing.join("d")).unwrap();
        std::fs::write(backing.join("d/f"), vec![b'o'; 10_000]).unwrap();
        let store_id = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
            let mnt = mnt.clone();
            move || stats_of(&mnt)["store_id"].as_str().unwrap().to_string()
        });
        m.unmount_and_wait();
        let md = std::fs::metadata(backing.join("d/f")).unwrap();
        let file = FileRef {
            dev: md.dev(),
            ino: md.ino(),
            path: b"d/f".to_vec(),
        };
        // The daemon's own segment size (writeback.journal_segment's default).
        let cfg = JournalConfig::default();
        let (j, replay) = Journal::open(&m.cache.join("journal"), &store_id, cfg, false).unwrap();
        assert!(replay.pending.is_empty());
        j.append_data(&file, 100, b"first").unwrap();
        let seq = j.append_data(&file, 12_000, b"beyond the end").unwrap();
        j.sync(seq).unwrap();
        j.shutdown();
        drop(j);

        let mut opts = mode_opts(mode);
        if reset {
            // BinMount::mount has no flag argument: mount by hand with --reset-cache.
            let mut cmd = std::process::Command::new("timeout");
            cmd.arg("30")
                .arg(tierfs_bin())
                .arg("mount")
                .arg(&backing)
                .arg(&mnt)
                .arg("--cache-dir")
                .arg(&m.cache)
                .arg("--reset-cache");
            for o in opts.drain(..) {
                cmd.arg("-o").arg(o);
            }
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            mount(&m, &opts);
        }
        let mut want = vec![b'o'; 10_000];
        want[100..105].copy_from_slice(b"first");
        want.resize(12_000, 0);
        want.extend_from_slice(b"beyond the end");
        // In the store before the mount served anything, and through the mount.
        assert_eq!(
            std::fs::read(backing.join("d/f")).unwrap(),
            want,
            "{mode} reset={reset}"
        );
        let through = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
            let mnt = mnt.clone();
            move || std::fs::read(mnt.join("d/f")).unwrap()
        });
        assert_eq!(through, want, "{mode} reset={reset}");
        m.unmount_and_wait();
        // Replayed once: a second mount finds nothing pending.
        let (_, replay) = Journal::open(
            &m.cache.join("journal"),
            &store_id,
            JournalConfig::default(),
            false,
        )
        .unwrap();
        assert!(
            replay.pending.is_empty(),
            "{mode} reset={reset}: replayed twice?"
        );
    }
}

/// SIGTERM drains: files written (never fsynced) in write-back mode are in the backing store,
/// and nothing is left pending in the journal, once the daemon has exited after SIGTERM. The
/// files are written just before the signal, so they are still registered as dirty (flushers
/// sync a file only once it has been quiet for 200 ms): the drain is what writes them back.
#[test]
fn sigterm_drains_dirty_data_to_the_store() {
    use tierfs_cache::journal::{Journal, JournalConfig};
    let m = BinMount::new(&["writeback.mode=back"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let files: Vec<Vec<u8>> = (0..200).map(|k| seeded_bytes(100 + k, 64 << 10)).collect();
    let (dirty_files, store_id) = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, files) = (mnt.clone(), files.clone());
        move || {
            for (k, d) in files.iter().enumerate() {
                std::fs::write(mnt.join(format!("f{k}")), d).unwrap();
            }
            let st = stats_of(&mnt);
            (
                st["writeback"]["dirty_files"].as_u64().unwrap(),
                st["store_id"].as_str().unwrap().to_string(),
            )
        }
    });
    assert!(dirty_files > 0, "nothing left for the drain to do");
    let pid = m.daemon_pid().expect("daemon");
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(
        wait_exit(pid, Duration::from_secs(60)),
        "daemon {pid} still running 60 s after SIGTERM"
    );
    assert!(!is_mounted(&mnt), "still mounted after SIGTERM");
    for (k, d) in files.iter().enumerate() {
        assert_eq!(
            &std::fs::read(backing.join(format!("f{k}"))).unwrap(),
            d,
            "f{k}"
        );
    }
    let (_, replay) = Journal::open(
        &m.cache.join("journal"),
        &store_id,
        JournalConfig::default(),
        false,
    )
    .unwrap();
    assert!(
        replay.pending.is_empty(),
        "{} writes still pending in the journal after the drain",
        replay.pending.len()
    );
    println!("SIGTERM with {dirty_files} dirty files: all written back and marked done");
}

/// `tierfs unmount` (issue 13 item 12): returns only once every byte written before it is on
/// the store, the mount is gone and the daemon has exited; `umount` alone returns while the
/// daemon is still writing back.
#[test]
fn tierfs_unmount_waits_for_every_dirty_byte() {
    let m = BinMount::new(&["writeback.mode=back", "ram.max=256M"]);
    let data: Vec<u8> = (0..48 << 20).map(|i| (i % 253) as u8).collect();
    let pid = m.daemon_pid().expect("daemon");
    {
        let (mnt, data) = (m.mnt.clone(), data.clone());
        with_timeout(
            std::time::Duration::from_secs(60),
            vec![mnt.clone()],
            move || {
                for i in 0..4 {
                    std::fs::write(mnt.join(format!("f{i}")), &data).unwrap();
                }
            },
        );
    }
    let out = std::process::Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(tierfs_bin())
        .arg("unmount")
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tierfs unmount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // At once, no waiting: everything is there.
    for i in 0..4 {
        assert!(
            std::fs::read(m.backing.join(format!("f{i}"))).unwrap() == data,
            "f{i} is not on the store when tierfs unmount returned"
        );
    }
    assert!(!is_mounted(&m.mnt), "still mounted");
    assert!(
        wait_exit(pid, std::time::Duration::from_millis(100)),
        "daemon still running"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue 13 item 1: a damaged journal record
// ---------------------------------------------------------------------------------------------

/// The bytes of `path` up to its last non-zero one (a segment is preallocated: zeros follow
/// what was written).
fn written_len(path: &Path) -> u64 {
    let b = std::fs::read(path).unwrap();
    b.iter().rposition(|&x| x != 0).map_or(0, |p| p as u64 + 1)
}

/// The `file:` lines of the reports a replay left under `journal/lost/`.
fn lost_names(jdir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(jdir.join("lost")).into_iter().flatten() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "txt") {
            let t = std::fs::read_to_string(&p).unwrap();
            v.extend(
                t.lines()
                    .filter_map(|l| l.strip_prefix("file: ").map(String::from)),
            );
        }
    }
    v
}

/// 20 rounds: the crash writer in write-back with `writeback.fsync=journal`, `kill -9`, one
/// byte of the journal flipped at a random offset (every other round inside the record of a
/// write still pending, the bytes that matter; otherwise anywhere in the records written), then
/// a remount (replay) and a clean unmount. Every file is then either whole by the model (every
/// acknowledged byte on the store, nothing older) or named in a `journal/lost/` report and
/// exactly as the store had it before the mount (left alone, never rolled back). The last
/// 300 KiB of the journal are never damaged: damage to its last records cannot be told from a
/// crash mid-write (docs/writeback/journal.md, "What a damaged journal costs").
#[test]
fn journal_damage_never_rolls_a_file_back_and_names_every_loss() {
    const ROUNDS: usize = 20;
    let seed = test_seed("journal_damage_never_rolls_a_file_back_and_names_every_loss");
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(900), vec![mnt], move || {
        let pool = Arc::new(seeded_bytes(seed, 2 * MIB));
        let opts: Vec<String> = [
            "ram.max=64M",
            "writeback.mode=back",
            "writeback.fsync=journal",
            "writeback.flushers=1",
        ]
        .map(String::from)
        .to_vec();
        let sub = "damage";
        std::fs::create_dir(m.backing.join(sub)).unwrap();
        let jdir = m.cache.join("journal");
        let mut r = Rng::new(seed ^ 0xda);
        let mut files = vec![FileModel::default(); CRASH_FILES];
        let (mut harmful, mut set_aside, mut whole) = (0, 0, 0);
        for round in 0..ROUNDS {
            let what = format!("round {round}");
            let (model, _) = write_until_killed(
                &m,
                &opts,
                sub,
                files.clone(),
                &mut r,
                &pool,
                &what,
                crash_writer,
            );
            let before: Vec<Option<Vec<u8>>> = (0..CRASH_FILES)
                .map(|i| read_opt(&m.backing.join(sub).join(crash_name(i))))
                .collect();
            let rep = tierfs_cache::Journal::inspect(&jdir).unwrap();
            // Pending writes whose record is not among the journal's last 300 KiB.
            let last_seg = rep.pending.iter().map(|p| p.record_place().0).max();
            let tail_from = last_seg
                .as_ref()
                .map(|n| written_len(&jdir.join(n)).saturating_sub(300 << 10));
            let inner: Vec<&tierfs_cache::PendingWrite> = rep
                .pending
                .iter()
                .filter(|p| {
                    let (n, off) = p.record_place();
                    Some(&n) != last_seg.as_ref() || Some(off) < tail_from
                })
                .collect();
            let damage_pending = round % 2 == 0 && !inner.is_empty();
            let target = if damage_pending {
                let p = inner[r.below(inner.len())];
                let (name, off) = p.record_place();
                let span = 24 + 26 + p.file.path.len() as u64 + p.len as u64;
                Some((jdir.join(name), off + r.range(0, span)))
            } else {
                let mut segs: Vec<PathBuf> = std::fs::read_dir(&jdir)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .filter(|p| {
                        p.file_name()
                            .unwrap()
                            .to_string_lossy()
                            .starts_with("jseg-")
                    })
                    .collect();
                segs.sort();
                let mut lens: Vec<u64> = segs.iter().map(|p| written_len(p)).collect();
                // The segment made ahead of time for the next roll (all zeros) is not the
                // journal's end: without this its 0 bytes took the 300 KiB below and the real
                // last segment's tail could be flipped (seen once: round 3 of seed
                // d0ff684a9ec39630 flipped a byte of the records of an acknowledged write
                // there, which then read as a crash tear).
                while lens.len() > 1 && lens.last() == Some(&0) {
                    lens.pop();
                    segs.pop();
                }
                // Never the journal's last 300 KiB (its last records: damage there reads as a
                // crash tear, see the doc comment).
                if let Some(l) = lens.last_mut() {
                    *l = l.saturating_sub(300 << 10);
                }
                let total: u64 = lens.iter().sum();
                // Killed before the journal grew past that (a busy machine): nothing damaged.
                (total > 0).then(|| {
                    let mut x = r.range(0, total);
                    let i = lens.iter().position(|&l| {
                        if x < l {
                            return true;
                        }
                        x -= l;
                        false
                    });
                    (segs[i.unwrap()].clone(), x)
                })
            };
            let (seg, at) = target.unwrap_or_default();
            if !seg.as_os_str().is_empty() {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&seg)
                    .unwrap();
                let mut b = [0u8; 1];
                f.read_at(&mut b, at).unwrap();
                f.write_at(&[b[0] ^ 0xff], at).unwrap();
            }
            if damage_pending {
                // A pending write's record damaged: fsck says so, by name, and fails.
                let out = std::process::Command::new(tierfs_bin())
                    .arg("fsck")
                    .arg(&m.cache)
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                assert_eq!(out.status.code(), Some(1), "{what}: fsck: {text}");
                assert!(
                    text.contains("journal: damaged at byte"),
                    "{what}: fsck: {text}"
                );
            }

            mount(&m, &opts);
            let seen: Vec<Option<Vec<u8>>> = (0..CRASH_FILES)
                .map(|i| read_opt(&m.mnt.join(sub).join(crash_name(i))))
                .collect();
            let counted = n(&stats_of(&m.mnt), "writeback.replay_lost_files");
            m.unmount_and_wait();
            let lost = lost_names(&jdir);
            assert_eq!(
                counted,
                lost.len() as u64,
                "{what}: tierfs stats counts the files set aside"
            );
            if !lost.is_empty() {
                harmful += 1;
            }
            for (i, fm) in model.iter().enumerate() {
                let name = crash_name(i);
                let got = read_opt(&m.backing.join(sub).join(&name));
                if lost.contains(&format!("{sub}/{name}")) {
                    assert!(
                        got == before[i],
                        "{what}: {name} was reported lost but changed: a set-aside file must be \
                         left as the store had it (byte {at} of {} flipped)",
                        seg.display()
                    );
                    set_aside += 1;
                } else {
                    check_file(&name, fm, got.as_deref()).unwrap_or_else(|e| {
                        panic!(
                            "{what}, byte {at} of {} flipped, not reported lost: {e}",
                            seg.display()
                        )
                    });
                    assert!(
                        got == seen[i],
                        "{what}: {name}: the store differs from the mount"
                    );
                    whole += 1;
                }
                files[i] = FileModel::durable(got);
            }
            let _ = std::fs::remove_dir_all(jdir.join("lost"));
        }
        println!(
            "journal damage: {ROUNDS} rounds, {harmful} with a loss reported, {set_aside} files \
             set aside (unchanged), {whole} files whole by the model"
        );
        assert!(
            harmful >= 3,
            "too few rounds hit a pending write: {harmful}"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Issue 13 item 10: a full cache device
// ---------------------------------------------------------------------------------------------

/// Fills the filesystem holding `dir` with one file (until ENOSPC); returns its path.
fn fill_device(dir: &Path) -> PathBuf {
    let p = dir.join("filler");
    let mut f = File::create(&p).unwrap();
    let big = vec![7u8; MIB];
    while f.write_all(&big).is_ok() {}
    let small = vec![7u8; 4096];
    while f.write_all(&small).is_ok() {}
    let _ = f.sync_all();
    p
}

/// Writes `data` to `path` through the mount in 1 MiB writes; the first error, if any.
fn write_file(path: &Path, data: &[u8]) -> Result<(), io::Error> {
    let mut f = File::create(path)?;
    for c in data.chunks(MIB) {
        f.write_all(c)?;
    }
    Ok(())
}

/// A write-back mount whose cache device fills up (a tmpfs of 200 MB): the SSD tier gives its
/// room to the journal, a write the journal still cannot take goes through to the store
/// (never ENOSPC while the store has room, never EIO), write-back takes writes again without
/// a remount once there is room, every byte is on the store, and a full cache device mounts
/// again (with and without --reset-cache) and checks clean, with no partial segment left.
#[test]
fn a_full_cache_device_writes_through_and_recovers_without_hand_work() {
    if unsafe { libc::geteuid() } != 0 {
        skip(Skip::NotRoot, "needs root (mounts a tmpfs)");
        return;
    }
    let small = TmpfsMount::new(Path::new(TMP), "200m");
    let mut m = BinMount::unmounted_in(Path::new(TMP));
    m.cache = small.path.join("cache");
    let dev = small.path.clone();
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(300), vec![mnt], move || {
        let opts = ["writeback.mode=back"];
        let pool = seeded_bytes(0xf011, 48 * MIB);
        // Something in the SSD tier for it to give back (written before the mount: a file
        // that changed a moment ago is not cached).
        std::fs::write(m.backing.join("cached"), &pool).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        m.mount(&opts);
        let out = std::process::Command::new(tierfs_bin())
            .arg("warm")
            .arg(m.mnt.join("cached"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "warm: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(n(&stats_of(&m.mnt), "ssd.admitted_bytes") >= 40 * MIB as u64);
        let filler = fill_device(&dev);

        let mut written = Vec::new();
        for i in 0..6 {
            let name = format!("w{i}");
            let data = &pool[i * MIB..i * MIB + 40 * MIB - 8 * MIB];
            write_file(&m.mnt.join(&name), data)
                .unwrap_or_else(|e| panic!("{name}: the store has room, the write failed: {e}"));
            written.push((name, data.to_vec()));
        }
        let st = stats_of(&m.mnt);
        // The SSD tier gives room back when the journal could not grow; a journal that kept
        // up by reusing its own segments behind the flushers never asked (timing: seen in
        // one full-suite run of five here).
        assert!(
            n(&st, "ssd.reclaimed_segments") > 0
                || n(&st, "writeback.journal.create_failures") == 0,
            "the journal could not grow and the SSD tier gave nothing back: {st}"
        );
        // (Whether the journal runs out of room or only waits for the flushers depends on
        // when the SSD tier gives its room back: either way no write fails.)
        let through = n(&st, "writeback.journal_no_space");
        assert_eq!(n(&st, "writeback.enospc"), 0, "{st}");
        println!(
            "full cache device: {} files of 32 MiB written, {through} writes through to the \
             store, {} journal segment creations failed",
            written.len(),
            n(&st, "writeback.journal.create_failures")
        );

        // Room again: write-back takes writes again, no remount.
        std::fs::remove_file(&filler).unwrap();
        let after = &pool[5 * MIB..5 * MIB + 24 * MIB];
        let t = Instant::now();
        loop {
            let before = n(&stats_of(&m.mnt), "writeback.journal_no_space");
            write_file(&m.mnt.join("after"), after).unwrap();
            if n(&stats_of(&m.mnt), "writeback.journal_no_space") == before {
                break;
            }
            assert!(t.elapsed().as_secs() < 30, "write-back never resumed");
            std::thread::sleep(Duration::from_millis(200));
        }
        written.push(("after".into(), after.to_vec()));
        m.unmount_and_wait();
        for (name, data) in &written {
            assert!(
                std::fs::read(m.backing.join(name)).unwrap() == *data,
                "{name} on the store"
            );
        }

        // A full cache device mounts again, serves, and checks clean; --reset-cache too.
        let filler = fill_device(&dev);
        m.mount(&opts);
        assert!(std::fs::read(m.mnt.join("after")).unwrap() == after);
        m.unmount_and_wait();
        let out = std::process::Command::new("timeout")
            .arg("30")
            .arg(tierfs_bin())
            .arg("mount")
            .arg(&m.backing)
            .arg(&m.mnt)
            .arg("--cache-dir")
            .arg(&m.cache)
            .args(["--reset-cache", "-o", "writeback.mode=back"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "--reset-cache on a full cache device: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (name, data) = &written[0];
        assert!(std::fs::read(m.mnt.join(name)).unwrap() == *data);
        m.unmount_and_wait();
        let out = std::process::Command::new(tierfs_bin())
            .arg("fsck")
            .arg(&m.cache)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fsck of a full cache dir: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let jdir = m.cache.join("journal");
        let sizes: Vec<u64> = std::fs::read_dir(&jdir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with("jseg-"))
            .map(|e| e.metadata().unwrap().len())
            .collect();
        assert!(
            sizes.windows(2).all(|w| w[0] == w[1]),
            "a partial journal segment left behind: {sizes:?}"
        );
        std::fs::remove_file(filler).unwrap();
    });
}

/// Namespace write-back: a listing of a directory with deferred names shows them at once and
/// does not wait for the namespace flusher (`ls` or `sync -f DIR` right after an untar);
/// fsync of the directory does, and then the store has them. The namespace flusher is held
/// back (`writeback.namespace_delay` and `namespace_quiet` of an hour), so nothing deferred
/// reaches the store unless something waits for it, and `writeback.namespace.waits` counts
/// the operations that did.
#[test]
fn listings_show_deferred_names_without_waiting_for_the_flusher() {
    let m = BinMount::new(&[
        "writeback.mode=back",
        "writeback.namespace_delay=1h",
        "writeback.namespace_quiet=1h",
    ]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    // A directory the store has (made and published before the deferred names go in).
    std::fs::create_dir(backing.join("old")).unwrap();
    std::fs::write(backing.join("old/on-store"), b"x").unwrap();
    let (root_names, old_names, new_names, waited) =
        with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
            let (mnt, backing) = (mnt.clone(), backing.clone());
            move || {
                let names = |d: &Path| -> Vec<String> {
                    let mut v: Vec<String> = std::fs::read_dir(d)
                        .unwrap()
                        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .collect();
                    v.sort();
                    v
                };
                // Listed once before, so the metadata cache has their store listings and
                // can vouch that the new names are free (what lets a create be deferred).
                assert_eq!(names(&mnt), ["old"]);
                assert_eq!(names(&mnt.join("old")), ["on-store"]);
                std::fs::create_dir(mnt.join("new")).unwrap();
                for k in 0..20 {
                    std::fs::write(mnt.join(format!("new/f{k:02}")), b"data").unwrap();
                    std::fs::write(mnt.join(format!("old/g{k:02}")), b"data").unwrap();
                }
                let waits = || n(&stats_of(&mnt), "writeback.namespace.waits");
                let before = waits();
                let r = names(&mnt);
                let o = names(&mnt.join("old"));
                let nw = names(&mnt.join("new"));
                let waited = waits() - before;
                let early = backing.join("old/g00").exists() || backing.join("new").exists();
                // fsync(dir) waits for every deferred name before it.
                File::open(mnt.join("new")).unwrap().sync_all().unwrap();
                assert!(!early, "the flusher ran though nothing waited for it");
                (r, o, nw, waited)
            }
        });
    let want_new: Vec<String> = (0..20).map(|k| format!("f{k:02}")).collect();
    let mut want_old: Vec<String> = (0..20).map(|k| format!("g{k:02}")).collect();
    want_old.push("on-store".into());
    want_old.sort();
    assert!(root_names.contains(&"new".to_string()), "{root_names:?}");
    assert_eq!(
        new_names, want_new,
        "a provisional directory lists its names"
    );
    assert_eq!(
        old_names, want_old,
        "the store's names and the deferred ones"
    );
    assert_eq!(waited, 0, "the listings waited for the namespace flusher");
    // The drain covers every name deferred before the fsync, in either directory.
    for k in 0..20 {
        for p in [format!("new/f{k:02}"), format!("old/g{k:02}")] {
            assert!(
                backing.join(&p).exists(),
                "{p} not on the store after fsync(new)"
            );
        }
    }
}

/// A writer that goes on creating files in a directory it has just made (mkdir, then file
/// after file with no pause, as the mixed benchmark's writers do): the namespace flusher
/// publishes the directory once enough made objects wait for it, so the files' data reaches
/// the store while the writer is still creating. Before, a directory stayed provisional for
/// as long as creates in it were queued: nothing made in it was flushed, and each made file
/// kept a descriptor until the daemon ran out of them.
#[test]
fn a_directory_still_being_filled_has_its_files_flushed_meanwhile() {
    let m = BinMount::new(&["writeback.mode=back", "writeback.namespace_delay=200ms"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let (made, seen_at) = with_timeout(Duration::from_secs(240), vec![mnt.clone()], move || {
        // Listed once, so the cache can vouch that the new name is free (the mkdir is
        // deferred, as the writer's is in the benchmark).
        assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
        let dir = mnt.join("new");
        std::fs::create_dir(&dir).unwrap();
        let on_store = || {
            std::fs::read_dir(backing.join("new")).is_ok_and(|rd| {
                rd.filter_map(|e| e.ok())
                    .any(|e| e.metadata().is_ok_and(|md| md.len() > 0))
            })
        };
        let t0 = Instant::now();
        let mut i = 0;
        let mut seen_at = None;
        while t0.elapsed() < Duration::from_secs(90) && i < 40_000 {
            for _ in 0..100 {
                std::fs::write(dir.join(format!("f{i:05}")), [b'x'; 4096]).unwrap();
                i += 1;
            }
            if on_store() {
                seen_at = Some(i);
                break;
            }
        }
        (i, seen_at)
    });
    println!("files created: {made}; file data on the store after {seen_at:?}");
    assert!(
        seen_at.is_some(),
        "no file data reached the store while {made} files were created in a new directory"
    );
    m.unmount_and_wait();
}

/// Namespace write-back of symlinks (tar makes one with `symlinkat`, then `lchown` and
/// `utimensat(AT_SYMLINK_NOFOLLOW)` on it): deferred like a create, so an untar does not
/// wait at each symlink for every name deferred before it. Through the mount the link is
/// there at once (readlink, lstat, listing); the store gets it, with its owner and times and
/// its target's untouched, when something waits for it; and it stays right once published
/// and after a remount.
#[test]
fn symlinks_are_deferred_and_reach_the_store_whole() {
    use std::os::unix::fs::MetadataExt;
    let m = BinMount::new(&[
        "writeback.mode=back",
        "writeback.namespace_delay=1h",
        "writeback.namespace_quiet=1h",
    ]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::write(backing.join("target"), b"t").unwrap();
    let lchown_and_time = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let rc = unsafe {
            libc::fchownat(
                libc::AT_FDCWD,
                c.as_ptr(),
                4321,
                765,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        assert_eq!(rc, 0, "lchown {}", p.display());
        let t = [libc::timespec {
            tv_sec: 1_234_567,
            tv_nsec: 0,
        }; 2];
        let rc = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                t.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        assert_eq!(rc, 0, "utimensat {}", p.display());
    };
    let waited = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, backing) = (mnt.clone(), backing.clone());
        move || {
            // Listed once, so the metadata cache can vouch that the new names are free.
            assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 1);
            let waits = || n(&stats_of(&mnt), "writeback.namespace.waits");
            let before = waits();
            std::fs::create_dir(mnt.join("d")).unwrap();
            std::os::unix::fs::symlink("../target", mnt.join("d/l")).unwrap();
            std::os::unix::fs::symlink("target", mnt.join("top")).unwrap();
            lchown_and_time(&mnt.join("d/l"));
            assert_eq!(
                std::fs::read_link(mnt.join("d/l")).unwrap(),
                Path::new("../target")
            );
            let md = std::fs::symlink_metadata(mnt.join("d/l")).unwrap();
            assert!(md.file_type().is_symlink());
            assert_eq!(
                (md.len(), md.uid(), md.gid(), md.mtime()),
                (9, 4321, 765, 1_234_567)
            );
            assert_eq!(std::fs::read(mnt.join("d/l")).unwrap(), b"t", "followed");
            assert_eq!(std::fs::read(mnt.join("top")).unwrap(), b"t");
            let listed: Vec<String> = std::fs::read_dir(mnt.join("d"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(listed, ["l"]);
            let waited = waits() - before;
            assert!(
                !backing.join("d").exists()
                    && std::fs::symlink_metadata(backing.join("top")).is_err(),
                "deferred: not on the store before anything waits for it"
            );
            // fsync(dir) waits for every deferred name before it.
            File::open(mnt.join("d")).unwrap().sync_all().unwrap();
            // Published: answered from what the store made.
            assert_eq!(
                std::fs::read_link(mnt.join("d/l")).unwrap(),
                Path::new("../target")
            );
            assert_eq!(
                std::fs::read_link(mnt.join("top")).unwrap(),
                Path::new("target")
            );
            waited
        }
    });
    assert_eq!(waited, 0, "a symlink waited for the namespace flusher");
    for (p, t) in [("d/l", "../target"), ("top", "target")] {
        assert_eq!(
            std::fs::read_link(backing.join(p)).unwrap(),
            Path::new(t),
            "{p}"
        );
    }
    let md = std::fs::symlink_metadata(backing.join("d/l")).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.mtime()),
        (4321, 765, 1_234_567),
        "the link's own"
    );
    let md = std::fs::metadata(backing.join("target")).unwrap();
    assert_eq!(
        (md.uid(), md.mtime() == 1_234_567),
        (0, false),
        "the target untouched"
    );
    m.unmount_and_wait();
    mount(&m, &["writeback.mode=back".to_string()]);
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            assert_eq!(
                std::fs::read_link(mnt.join("d/l")).unwrap(),
                Path::new("../target")
            );
            assert_eq!(std::fs::read(mnt.join("d/l")).unwrap(), b"t");
        }
    });
}

/// Namespace write-back: a file (or symlink, or an emptied directory) made and removed
/// before the namespace flusher took its create (configure's `conftest.c`, a build's
/// temporaries) never reaches the store: the unlink waits for nothing, and neither the file nor its data is sent. An unlink
/// of a file still open is done on the store as before (the open file outlives it). After
/// `kill -9` the replay makes what the journal holds and removes the unlinked file again,
/// dropping its data: nothing goes to `journal/lost/`.
#[test]
fn a_file_unlinked_before_its_create_is_flushed_never_reaches_the_store() {
    let m = BinMount::new(&[
        "writeback.mode=back",
        "writeback.namespace_delay=1h",
        "writeback.namespace_quiet=1h",
    ]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    // The kernel sends RELEASE after close(2) returns: give it time to arrive, since an
    // unlink of a file the daemon still counts as open is not deferred.
    let released = || std::thread::sleep(Duration::from_millis(300));
    let names = sorted_names;
    let (waited, dropped, listed) = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, backing) = (mnt.clone(), backing.clone());
        move || {
            assert!(names(&mnt).is_empty());
            let stat = |k: &str| n(&stats_of(&mnt), k);
            std::fs::create_dir(mnt.join("d")).unwrap();
            for k in 0..20 {
                std::fs::write(mnt.join(format!("d/conftest{k}.c")), vec![b'c'; 64 << 10]).unwrap();
                std::os::unix::fs::symlink("conftest.c", mnt.join(format!("d/l{k}"))).unwrap();
            }
            std::fs::write(mnt.join("d/keep"), b"kept").unwrap();
            // A tree made and removed (`rm -rf`): its files' unlinks and its rmdir.
            std::fs::create_dir(mnt.join("d/conftest.dir")).unwrap();
            for f in ["a", "b"] {
                std::fs::write(mnt.join("d/conftest.dir").join(f), b"x").unwrap();
            }
            released();
            let (waits, drops) = (
                stat("writeback.namespace.waits"),
                stat("writeback.namespace.dropped"),
            );
            for k in 0..20 {
                std::fs::remove_file(mnt.join(format!("d/conftest{k}.c"))).unwrap();
                std::fs::remove_file(mnt.join(format!("d/l{k}"))).unwrap();
            }
            std::fs::remove_dir_all(mnt.join("d/conftest.dir")).unwrap();
            let waited = stat("writeback.namespace.waits") - waits;
            let dropped = stat("writeback.namespace.dropped") - drops;
            let listed = names(&mnt.join("d"));
            assert!(
                !backing.join("d").exists(),
                "nothing waited, nothing is on the store"
            );
            assert!(
                std::fs::metadata(mnt.join("d/conftest0.c")).is_err(),
                "an unlinked name is gone"
            );
            // Unlinked while open: done on the store (it waits for the names before it),
            // and the open file still reads its data.
            let held = mnt.join("d/held");
            std::fs::write(&held, b"held data").unwrap();
            let f = File::open(&held).unwrap();
            std::fs::remove_file(&held).unwrap();
            let mut got = String::new();
            std::io::Read::read_to_string(&mut &f, &mut got).unwrap();
            assert_eq!(got, "held data");
            drop(f);
            File::open(mnt.join("d")).unwrap().sync_all().unwrap();
            (waited, dropped, listed)
        }
    });
    assert_eq!(waited, 0, "an unlink waited for the namespace flusher");
    assert_eq!(
        dropped, 43,
        "files, symlinks and a directory withdrawn before the store had them"
    );
    assert_eq!(listed, ["keep"]);
    assert_eq!(
        names(&backing.join("d")),
        ["keep"],
        "the store never had the others"
    );

    // The same across kill -9: made, unlinked, killed before the flusher ran.
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            std::fs::create_dir(mnt.join("e")).unwrap();
            std::fs::write(mnt.join("e/t1"), vec![b'1'; 100_000]).unwrap();
            std::fs::write(mnt.join("e/t2"), vec![b'2'; 100_000]).unwrap();
            std::fs::create_dir(mnt.join("e/tmpd")).unwrap();
            std::fs::write(mnt.join("e/tmpd/x"), vec![b'x'; 10_000]).unwrap();
            released();
            std::fs::remove_file(mnt.join("e/t1")).unwrap();
            std::fs::remove_dir_all(mnt.join("e/tmpd")).unwrap();
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
        }
    });
    assert!(!backing.join("e").exists());
    m.kill_daemon();
    mount(&m, &["writeback.mode=back".to_string()]);
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            assert_eq!(names(&mnt.join("e")), ["t2"]);
            assert_eq!(
                std::fs::read(mnt.join("e/t2")).unwrap(),
                vec![b'2'; 100_000]
            );
        }
    });
    m.unmount_and_wait();
    assert_eq!(names(&backing.join("e")), ["t2"], "replay removed t1 again");
    assert_eq!(
        std::fs::read(backing.join("e/t2")).unwrap(),
        vec![b'2'; 100_000]
    );
    assert!(
        lost_names(&m.cache.join("journal")).is_empty(),
        "nothing staged as lost"
    );
}

/// Namespace write-back: the way programs save a file (write `x.tmp`, then rename it to `x`)
/// waits for nothing when `x.tmp` is a file write-back made and has not sent to the store
/// yet: its queued create is rewritten to make `x`, and the store never has `x.tmp`. The
/// data and the mode follow the file, through an unmount and through `kill -9` (replay).
#[test]
fn an_atomic_save_of_a_new_file_waits_for_nothing_and_lands_whole() {
    use std::os::unix::fs::PermissionsExt;
    let m = BinMount::new(&[
        "writeback.mode=back",
        "writeback.namespace_delay=1h",
        "writeback.namespace_quiet=1h",
    ]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let data = |k: usize| seeded_bytes(k as u64, 10_000 + 3_000 * k);
    let names = sorted_names;
    let save = |dir: &Path, name: &str, bytes: &[u8]| {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    };
    let want: Vec<String> = (0..20).map(|k| format!("f{k:02}")).collect();
    let waited = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, backing, want) = (mnt.clone(), backing.clone(), want.clone());
        move || {
            assert!(names(&mnt).is_empty());
            let waits = || n(&stats_of(&mnt), "writeback.namespace.waits");
            let before = waits();
            std::fs::create_dir(mnt.join("d")).unwrap();
            for (k, f) in want.iter().enumerate() {
                save(&mnt.join("d"), f, &data(k));
            }
            // In a directory of the store too.
            save(&mnt, "top", &data(99));
            let waited = waits() - before;
            assert!(!backing.join("d").exists() && !backing.join("top").exists());
            assert_eq!(names(&mnt.join("d")), want);
            assert_eq!(std::fs::read(mnt.join("d/f03")).unwrap(), data(3));
            let md = std::fs::metadata(mnt.join("d/f03")).unwrap();
            assert_eq!(md.permissions().mode() & 0o777, 0o640);
            waited
        }
    });
    assert_eq!(waited, 0, "a rename waited for the namespace flusher");
    m.unmount_and_wait();
    assert_eq!(names(&backing.join("d")), want, "no .tmp name on the store");
    for (k, f) in want.iter().enumerate() {
        let p = backing.join("d").join(f);
        assert_eq!(std::fs::read(&p).unwrap(), data(k), "{f}");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }
    assert_eq!(std::fs::read(backing.join("top")).unwrap(), data(99));
    assert!(!backing.join(".top.tmp").exists());

    // The same across kill -9, with a second rename of the same file.
    mount(
        &m,
        &[
            "writeback.mode=back".to_string(),
            "writeback.namespace_delay=1h".to_string(),
            "writeback.namespace_quiet=1h".to_string(),
        ],
    );
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            // Listed, so that the mkdir is deferred too.
            assert_eq!(names(&mnt), ["d", "top"]);
            std::fs::create_dir(mnt.join("e")).unwrap();
            save(&mnt.join("e"), "g", &data(50));
            save(&mnt.join("e"), "h", &data(51));
            std::fs::rename(mnt.join("e/h"), mnt.join("e/h2")).unwrap();
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
        }
    });
    assert!(
        !backing.join("e").exists(),
        "nothing reached the store before the kill"
    );
    m.kill_daemon();
    mount(&m, &["writeback.mode=back".to_string()]);
    m.unmount_and_wait();
    assert_eq!(names(&backing.join("e")), ["g", "h2"]);
    assert_eq!(std::fs::read(backing.join("e/g")).unwrap(), data(50));
    assert_eq!(std::fs::read(backing.join("e/h2")).unwrap(), data(51));
    assert!(
        lost_names(&m.cache.join("journal")).is_empty(),
        "nothing staged as lost"
    );
}

/// Namespace write-back: a file write-back made, not on the store yet, moved to another
/// directory (a build's output moved out of its scratch directory, `mv` of a file just
/// written) waits for nothing when that directory is on the store or was made before the
/// file: the queued create is rewritten to make the file there. A directory made after the
/// file is made on the store first (the rename waits). Through an unmount and `kill -9`.
#[test]
fn a_new_file_moved_to_another_directory_waits_for_nothing_and_lands_whole() {
    use std::os::unix::fs::MetadataExt;
    let opts = [
        "writeback.mode=back",
        "writeback.namespace_delay=1h",
        "writeback.namespace_quiet=1h",
    ];
    let m = BinMount::new(&opts);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let data = |k: usize| seeded_bytes(k as u64, 7_000 + 1_000 * k);
    let names = sorted_names;
    let waited = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            assert!(names(&mnt).is_empty());
            let waits = || n(&stats_of(&mnt), "writeback.namespace.waits");
            let before = waits();
            std::fs::create_dir(mnt.join("out")).unwrap();
            std::fs::create_dir(mnt.join("scratch")).unwrap();
            for k in 0..10 {
                let tmp = mnt.join(format!("scratch/o{k}.tmp"));
                std::fs::write(&tmp, data(k)).unwrap();
                std::fs::rename(&tmp, mnt.join(format!("out/o{k}"))).unwrap();
            }
            // Into a directory of the store (the mount's root), and back.
            std::fs::write(mnt.join("scratch/r"), data(20)).unwrap();
            std::fs::rename(mnt.join("scratch/r"), mnt.join("r")).unwrap();
            std::fs::rename(mnt.join("r"), mnt.join("out/r")).unwrap();
            assert!(names(&mnt.join("scratch")).is_empty());
            std::fs::remove_dir(mnt.join("scratch")).unwrap();
            let waited = waits() - before;
            assert_eq!(names(&mnt), ["out"]);
            let mut want: Vec<String> = (0..10).map(|k| format!("o{k}")).collect();
            want.push("r".into());
            assert_eq!(names(&mnt.join("out")), want);
            assert_eq!(std::fs::read(mnt.join("out/o3")).unwrap(), data(3));
            assert_eq!(std::fs::read(mnt.join("out/r")).unwrap(), data(20));
            assert_eq!(
                std::fs::metadata(mnt.join("out")).unwrap().nlink(),
                2,
                "out has no subdirectory"
            );
            // A directory made after the file: made on the store before the move.
            std::fs::write(mnt.join("out/late.tmp"), data(30)).unwrap();
            std::fs::create_dir(mnt.join("later")).unwrap();
            std::fs::rename(mnt.join("out/late.tmp"), mnt.join("later/late")).unwrap();
            assert_eq!(std::fs::read(mnt.join("later/late")).unwrap(), data(30));
            waited
        }
    });
    assert_eq!(waited, 0, "a rename waited for the namespace flusher");
    m.unmount_and_wait();
    let mut want: Vec<String> = (0..10).map(|k| format!("o{k}")).collect();
    want.push("r".into());
    assert_eq!(names(&backing), ["later", "out"], "no scratch on the store");
    assert_eq!(names(&backing.join("out")), want);
    for k in 0..10 {
        assert_eq!(
            std::fs::read(backing.join(format!("out/o{k}"))).unwrap(),
            data(k),
            "o{k}"
        );
    }
    assert_eq!(std::fs::read(backing.join("out/r")).unwrap(), data(20));
    assert_eq!(std::fs::read(backing.join("later/late")).unwrap(), data(30));

    // Across kill -9: the create's record names the old directory; replay makes the file
    // in the new one.
    m.mount(&opts);
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            // Listed, so that the mkdirs are deferred too, and that `out` is known not
            // to have a `z` (else the move goes to the store).
            assert_eq!(names(&mnt), ["later", "out"]);
            assert_eq!(names(&mnt.join("out")).len(), 11);
            std::fs::create_dir(mnt.join("e")).unwrap();
            std::fs::create_dir(mnt.join("f")).unwrap();
            std::fs::write(mnt.join("e/x"), data(40)).unwrap();
            std::fs::rename(mnt.join("e/x"), mnt.join("f/y")).unwrap();
            std::fs::write(mnt.join("e/z"), data(41)).unwrap();
            std::fs::rename(mnt.join("e/z"), mnt.join("out/z")).unwrap();
            wait_journal_written(&mnt);
        }
    });
    assert!(
        !backing.join("e").exists() && !backing.join("out/z").exists(),
        "nothing reached the store before the kill"
    );
    m.kill_daemon();
    m.mount(&["writeback.mode=back"]);
    m.unmount_and_wait();
    assert!(names(&backing.join("e")).is_empty());
    assert_eq!(names(&backing.join("f")), ["y"]);
    assert_eq!(std::fs::read(backing.join("f/y")).unwrap(), data(40));
    assert_eq!(std::fs::read(backing.join("out/z")).unwrap(), data(41));
    assert!(
        lost_names(&m.cache.join("journal")).is_empty(),
        "nothing staged as lost"
    );
}

/// Namespace write-back: a new file saved again before it reached the store (`git clone`
/// rewrites `config` through `config.lock` several times; an editor saves twice) waits for
/// nothing: the rename over the first version withdraws its create, in the same record, so
/// the store only ever gets the last version. Through an unmount and `kill -9`; an open
/// first version is not replaced that way (the rename goes to the store), and still reads
/// whole.
#[test]
fn a_new_file_saved_again_before_it_reached_the_store_waits_for_nothing() {
    let opts = [
        "writeback.mode=back",
        "writeback.namespace_delay=1h",
        "writeback.namespace_quiet=1h",
    ];
    let m = BinMount::new(&opts);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let data = |k: usize| seeded_bytes(k as u64, 5_000 + 700 * k);
    let save = |p: &Path, bytes: &[u8]| {
        let lock = p.with_extension("lock");
        std::fs::write(&lock, bytes).unwrap();
        std::fs::rename(&lock, p).unwrap();
    };
    let names = sorted_names;
    let waited = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            assert!(names(&mnt).is_empty());
            let waits = || n(&stats_of(&mnt), "writeback.namespace.waits");
            let before = waits();
            std::fs::create_dir(mnt.join("repo")).unwrap();
            for k in 0..6 {
                save(&mnt.join("repo/config"), &data(k));
                assert_eq!(std::fs::read(mnt.join("repo/config")).unwrap(), data(k));
            }
            save(&mnt.join("top"), &data(10));
            save(&mnt.join("top"), &data(11));
            let waited = waits() - before;
            assert_eq!(names(&mnt.join("repo")), ["config"]);
            assert_eq!(names(&mnt), ["repo", "top"]);
            waited
        }
    });
    assert_eq!(waited, 0, "a rename waited for the namespace flusher");
    m.unmount_and_wait();
    assert_eq!(names(&backing.join("repo")), ["config"]);
    assert_eq!(std::fs::read(backing.join("repo/config")).unwrap(), data(5));
    assert_eq!(std::fs::read(backing.join("top")).unwrap(), data(11));

    // Across kill -9, and an open first version.
    m.mount(&opts);
    let kept = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            assert_eq!(names(&mnt), ["repo", "top"]);
            std::fs::create_dir(mnt.join("e")).unwrap();
            save(&mnt.join("e/c"), &data(20));
            save(&mnt.join("e/c"), &data(21));
            save(&mnt.join("e/o"), &data(30));
            let open = File::open(mnt.join("e/o")).unwrap();
            save(&mnt.join("e/o"), &data(31));
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut &open, &mut got).unwrap();
            assert_eq!(
                got,
                data(30),
                "the replaced version, still open, reads whole"
            );
            wait_journal_written(&mnt);
            got.len()
        }
    });
    assert_eq!(kept, data(30).len());
    m.kill_daemon();
    m.mount(&["writeback.mode=back"]);
    m.unmount_and_wait();
    assert_eq!(names(&backing.join("e")), ["c", "o"]);
    assert_eq!(std::fs::read(backing.join("e/c")).unwrap(), data(21));
    assert_eq!(std::fs::read(backing.join("e/o")).unwrap(), data(31));
    assert!(
        lost_names(&m.cache.join("journal")).is_empty(),
        "nothing staged as lost"
    );
}

/// The names in directory `d`, sorted.
fn sorted_names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// mknod(2) of `p` (`mode` with its file type, device `dev`).
fn mknod_at(p: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    if unsafe { libc::mknod(c.as_ptr(), mode, dev) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Namespace write-back of mknod (issue 15; `ns_mknod`): untarring a root filesystem makes
/// `/dev`'s nodes and FIFOs. The first special file of a kind is made on the store, which
/// answers whether it can (sshfs cannot: its errno is the call's, never a conflict at flush);
/// later ones of that kind, and regular files made by mknod, are deferred like a create:
/// seen at once through the mount (kind, device number, listing), on the store with their
/// owner and mode once something waits for them, withdrawn if unlinked first, and made by
/// replay after `kill -9`.
#[test]
fn mknods_are_deferred_once_the_store_makes_their_kind() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let m = BinMount::new(&[
        "writeback.mode=back",
        "writeback.namespace_delay=1h",
        "writeback.namespace_quiet=1h",
    ]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let null = libc::makedev(1, 3);
    let zero = libc::makedev(1, 5);
    let waited = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, backing) = (mnt.clone(), backing.clone());
        move || {
            assert!(sorted_names(&mnt).is_empty());
            // The first of each kind: on the store at once.
            mknod_at(&mnt.join("fifo0"), libc::S_IFIFO | 0o644, 0).unwrap();
            mknod_at(&mnt.join("null0"), libc::S_IFCHR | 0o666, null).unwrap();
            assert!(std::fs::symlink_metadata(backing.join("fifo0"))
                .unwrap()
                .file_type()
                .is_fifo());
            assert_eq!(
                std::fs::symlink_metadata(backing.join("null0"))
                    .unwrap()
                    .rdev(),
                null
            );
            let stat = |k: &str| n(&stats_of(&mnt), k);
            let waits = stat("writeback.namespace.waits");
            std::fs::create_dir(mnt.join("dev")).unwrap();
            mknod_at(&mnt.join("dev/initctl"), libc::S_IFIFO | 0o600, 0).unwrap();
            mknod_at(&mnt.join("dev/null"), libc::S_IFCHR | 0o666, null).unwrap();
            mknod_at(&mnt.join("dev/zero"), libc::S_IFCHR | 0o640, zero).unwrap();
            mknod_at(&mnt.join("dev/reg"), libc::S_IFREG | 0o600, 0).unwrap();
            mknod_at(&mnt.join("dev/gone"), libc::S_IFIFO | 0o600, 0).unwrap();
            let e = mknod_at(&mnt.join("dev/null"), libc::S_IFCHR | 0o666, null).unwrap_err();
            assert_eq!(
                e.raw_os_error(),
                Some(libc::EEXIST),
                "a second mknod of a name"
            );
            std::os::unix::fs::chown(mnt.join("dev/zero"), Some(0), Some(5)).unwrap();
            std::fs::remove_file(mnt.join("dev/gone")).unwrap();
            let md = |p: &str| std::fs::symlink_metadata(mnt.join(p)).unwrap();
            assert!(md("dev/initctl").file_type().is_fifo());
            assert!(md("dev/null").file_type().is_char_device());
            assert_eq!((md("dev/null").rdev(), md("dev/zero").rdev()), (null, zero));
            assert_eq!(md("dev/zero").permissions().mode() & 0o7777, 0o640);
            assert_eq!(md("dev/zero").gid(), 5);
            assert!(md("dev/reg").file_type().is_file());
            assert_eq!(md("dev/reg").len(), 0);
            assert_eq!(
                sorted_names(&mnt.join("dev")),
                ["initctl", "null", "reg", "zero"]
            );
            let waited = stat("writeback.namespace.waits") - waits;
            assert!(
                !backing.join("dev").exists(),
                "deferred: not on the store before anything waits for it"
            );
            // The FIFO works as one (the kernel's, not the daemon's).
            let fifo = mnt.join("dev/initctl");
            let reader = std::thread::spawn(move || std::fs::read(fifo).unwrap());
            std::fs::write(mnt.join("dev/initctl"), b"through the pipe").unwrap();
            assert_eq!(reader.join().unwrap(), b"through the pipe");
            File::open(mnt.join("dev")).unwrap().sync_all().unwrap();
            waited
        }
    });
    assert_eq!(waited, 0, "a mknod waited for the namespace flusher");
    let md = |p: &str| std::fs::symlink_metadata(backing.join(p)).unwrap();
    assert!(md("dev/initctl").file_type().is_fifo());
    assert_eq!(md("dev/initctl").permissions().mode() & 0o7777, 0o600);
    assert!(md("dev/null").file_type().is_char_device());
    assert_eq!((md("dev/null").rdev(), md("dev/zero").rdev()), (null, zero));
    assert_eq!(
        (
            md("dev/zero").permissions().mode() & 0o7777,
            md("dev/zero").gid()
        ),
        (0o640, 5)
    );
    assert!(md("dev/reg").file_type().is_file());
    assert_eq!(
        sorted_names(&backing.join("dev")),
        ["initctl", "null", "reg", "zero"]
    );

    // Across kill -9: deferred, killed before the flusher ran, made by replay.
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            std::fs::create_dir(mnt.join("dev2")).unwrap();
            mknod_at(&mnt.join("dev2/null"), libc::S_IFCHR | 0o666, null).unwrap();
            mknod_at(&mnt.join("dev2/fifo"), libc::S_IFIFO | 0o604, 0).unwrap();
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
        }
    });
    assert!(!backing.join("dev2").exists());
    m.kill_daemon();
    mount(&m, &["writeback.mode=back".to_string()]);
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || assert_eq!(sorted_names(&mnt.join("dev2")), ["fifo", "null"])
    });
    m.unmount_and_wait();
    assert_eq!(md("dev2/null").rdev(), null);
    assert!(md("dev2/null").file_type().is_char_device());
    assert!(md("dev2/fifo").file_type().is_fifo());
    assert_eq!(md("dev2/fifo").permissions().mode() & 0o7777, 0o604);
    assert!(
        lost_names(&m.cache.join("journal")).is_empty(),
        "nothing staged as lost"
    );
}

/// `File::create` (O_CREAT | O_TRUNC) of a new name in write-back: the create is deferred and
/// the descriptor has no store handle until one is needed (a read of flushed data, a seek, a
/// truncate through it). That handle was opened with the create's O_TRUNC, after the flush:
/// the store file lost what was flushed into it (found by an extending truncate's test,
/// `SEEK_HOLE` of an 8 MiB file answering ENXIO).
#[test]
fn a_descriptor_of_a_new_file_used_after_its_flush_does_not_truncate_it() {
    use std::os::unix::fs::FileExt;
    let m = BinMount::new(&["writeback.mode=back"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(mnt.join("out"))
            .unwrap();
        f.write_all_at(b"0123456789", 0).unwrap();
        f.sync_all().unwrap();
        assert_eq!(std::fs::read(backing.join("out")).unwrap(), b"0123456789");
        // Through the same descriptor, now that the file is on the store.
        f.set_len(5).unwrap();
        assert_eq!(std::fs::read(backing.join("out")).unwrap(), b"01234");
        let mut got = [0u8; 5];
        f.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got, b"01234");
    });
    m.unmount_and_wait();
}
