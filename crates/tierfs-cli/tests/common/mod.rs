//! Test harness: real FUSE mounts, always torn down (lazily, even after a panic or a hang),
//! and every test body run under a watchdog so a hung daemon fails the test instead of
//! hanging CI.
#![allow(dead_code)]

pub mod cgroup;
pub mod cto;
pub mod git;
pub mod hog;
pub mod memory;
pub mod sshd;
pub mod sshfs;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_store::{FaultConfig, FaultStore, PosixStore};

pub fn tierfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tierfs")
}

/// Runs `body` on its own thread; if it does not finish within `limit`, the daemons serving
/// `mounts` are killed, the mounts aborted and detached, and the test fails.
///
/// Detaching alone frees nothing: a thread of the test waiting on a request its daemon has
/// read waits uninterruptibly, and so the test binary could never exit (a CI run hung so, on
/// a SIGSTOPped store). Killing the daemons ends every request: their connections close.
pub fn with_timeout<T: Send + 'static>(
    limit: Duration,
    mounts: Vec<PathBuf>,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(limit) {
        Ok(()) => match h.join().expect("joined") {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(_) => {
            for m in &mounts {
                if let Some(pid) = daemon_pid(m) {
                    // SAFETY: a plain signal to the daemon this test mounted.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            for m in &mounts {
                abort_mount(m);
            }
            panic!("test timed out after {limit:?}; daemons killed, mounts aborted: {mounts:?}");
        }
    }
}

/// Aborts the FUSE connection of the mount at `mnt` (unblocking every process waiting on it)
/// and detaches it.
pub fn abort_mount(mnt: &Path) {
    if let Ok(Some(m)) = tierfs_fuse::find_mount(mnt) {
        if let Some(minor) = m.dev.split(':').nth(1) {
            let _ = std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
        }
    }
    let _ = Command::new("fusermount3").arg("-uz").arg(mnt).status();
}

/// How long a daemon stays stopped at most (see [`Stopped`]).
pub const STOP_LIMIT: Duration = Duration::from_secs(60);

/// A daemon stopped with SIGSTOP, as a hung store is. SIGCONT when dropped (even after a
/// panic), and in any case `STOP_LIMIT` after it stopped: a test thread caught in a request
/// that needs the stopped daemon (uninterruptibly, once its own daemon has read it) could
/// never drop this, and nothing else would ever let the daemon go on.
pub struct Stopped {
    pid: i32,
    _watch: mpsc::Sender<()>,
}

impl Stopped {
    pub fn stop(pid: i32) -> Stopped {
        // SAFETY: a plain signal to a daemon this test mounted.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        let (tx, rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            // Disconnected: dropped in time.
            if rx.recv_timeout(STOP_LIMIT) == Err(mpsc::RecvTimeoutError::Timeout) {
                eprintln!("daemon {pid} stopped for {STOP_LIMIT:?}: SIGCONT");
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
        });
        Stopped { pid, _watch: tx }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as in `stop`.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}

pub fn is_mounted(mnt: &Path) -> bool {
    let canon = mnt.canonicalize().unwrap_or_else(|_| mnt.to_path_buf());
    matches!(tierfs_fuse::find_mount(&canon), Ok(Some(m)) if m.fstype == "fuse.tierfs")
}

/// A `tierfs mount` run as a user would run it: the real binary, daemonized.
pub struct BinMount {
    pub dir: tempfile::TempDir,
    pub backing: PathBuf,
    pub mnt: PathBuf,
    pub cache: PathBuf,
}

impl BinMount {
    pub fn new(opts: &[&str]) -> BinMount {
        Self::new_at("backing", "mnt", opts)
    }

    /// Like [`BinMount::new`], but BACKING and MOUNTPOINT are at the given paths relative to
    /// the temporary directory (created, with their parents), e.g. so that `BACKING/..` and
    /// `MOUNTPOINT/..` are different directories.
    pub fn new_at(backing: &str, mnt: &str, opts: &[&str]) -> BinMount {
        let dir = tempfile::tempdir().expect("tempdir");
        let backing = dir.path().join(backing);
        let mnt = dir.path().join(mnt);
        let cache = dir.path().join("cache");
        std::fs::create_dir_all(&backing).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let m = BinMount {
            dir,
            backing,
            mnt,
            cache,
        };
        m.mount(opts);
        m
    }

    /// A BinMount in a temporary directory under `parent` (e.g. /var/tmp, a real disk where
    /// /tmp may be a tmpfs), not mounted yet: fill BACKING, then [`BinMount::mount`]. The
    /// cache directory stays the same across unmounts and remounts.
    pub fn unmounted_in(parent: &Path) -> BinMount {
        let dir = tempfile::Builder::new()
            .prefix("tierfs-test-")
            .tempdir_in(parent)
            .expect("tempdir");
        let backing = dir.path().join("backing");
        let mnt = dir.path().join("mnt");
        let cache = dir.path().join("cache");
        std::fs::create_dir(&backing).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        BinMount {
            dir,
            backing,
            mnt,
            cache,
        }
    }

    pub fn mount(&self, opts: &[&str]) {
        self.mount_source(self.backing.as_os_str(), opts, &[]);
    }

    /// `tierfs mount SOURCE MNT` with this mount's cache dir, `-o` options and extra
    /// environment: SOURCE other than BACKING, such as an `s3://` URL.
    pub fn mount_source(&self, source: &std::ffi::OsStr, opts: &[&str], env: &[(&str, &str)]) {
        let mut cmd = mount_command(source, &self.mnt, &self.cache, opts);
        cmd.envs(env.iter().copied());
        let out = cmd.output().expect("run tierfs mount");
        assert!(
            out.status.success(),
            "tierfs mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            is_mounted(&self.mnt),
            "not mounted after tierfs mount returned"
        );
    }

    /// `fusermount3 -u`, retried for a few seconds while the mount is busy: a file just
    /// closed by another thread of the test can still be held for a moment on a loaded
    /// machine (seen once under the whole suite).
    pub fn unmount(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let out = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .output()
                .unwrap();
            if out.status.success() {
                return;
            }
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            if !err.contains("busy") || std::time::Instant::now() >= deadline {
                panic!("fusermount3 -u failed: {err}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `tierfs unmount MNT` (under `timeout limit_s`), which must succeed: it returns once
    /// every written byte is on the store.
    pub fn tierfs_unmount(&self, limit_s: u32) {
        let out = Command::new("timeout")
            .args([&limit_s.to_string(), tierfs_bin(), "unmount"])
            .arg(&self.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tierfs unmount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `tierfs stats --json`, parsed.
    pub fn stats(&self) -> serde_json::Value {
        stats_of(&self.mnt)
    }

    /// The pid of the daemon serving this mount.
    pub fn daemon_pid(&self) -> Option<i32> {
        daemon_pid(&self.mnt)
    }

    /// A clean unmount that returns only once the daemon has exited, i.e. after its
    /// shutdown work (the SSD tier's flush and checkpoint). `fusermount3 -u` returns as soon
    /// as the kernel has let go, before that.
    pub fn unmount_and_wait(&self) {
        let pid = self.daemon_pid().expect("no daemon for this mount");
        self.unmount();
        assert!(
            wait_exit(pid, Duration::from_secs(60)),
            "daemon {pid} still running 60 s after unmount"
        );
    }

    /// `kill -9` of the daemon (no shutdown work of any kind), then a lazy unmount of the
    /// dead mount, as an administrator would do after a crash.
    pub fn kill_daemon(&self) {
        let pid = self.daemon_pid().expect("no daemon for this mount");
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert!(
            wait_exit(pid, Duration::from_secs(20)),
            "daemon {pid} survived SIGKILL"
        );
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .status();
    }
}

impl Drop for BinMount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The daemon's log goes with the temporary directory: show its end.
            if let Ok(log) = std::fs::read_to_string(self.cache.join("tierfs.log")) {
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                // `TIERFS_TEST_KEEP_LOG=<dir>`: the whole log kept there, for a failure
                // that shows only under load.
                if let Some(dir) = std::env::var_os("TIERFS_TEST_KEEP_LOG") {
                    let to = std::path::Path::new(&dir)
                        .join(format!("tierfs-{}.log", std::process::id()));
                    let _ = std::fs::write(&to, &log);
                    eprintln!("--- the whole log: {}", to.display());
                }
                eprintln!(
                    "--- end of {}:\n{tail}",
                    self.cache.join("tierfs.log").display()
                );
            }
        }
        let pid = self.daemon_pid();
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
        }
        // Let the daemon finish writing into the cache directory before the temporary
        // directory is removed (bounded: a hung daemon must not hang the test).
        if let Some(pid) = pid {
            wait_exit(pid, Duration::from_secs(5));
        }
    }
}

/// `tierfs stats --json MNT`, parsed.
/// `tierfs mount SOURCE MNT --cache-dir CACHE -o ...` under a 30-second `timeout`.
pub fn mount_command(
    source: &std::ffi::OsStr,
    mnt: &Path,
    cache: &Path,
    opts: &[impl AsRef<std::ffi::OsStr>],
) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.arg("30")
        .arg(tierfs_bin())
        .arg("mount")
        .arg(source)
        .arg(mnt)
        .arg("--cache-dir")
        .arg(cache);
    for o in opts {
        cmd.arg("-o").arg(o);
    }
    cmd
}

pub fn stats_of(mnt: &Path) -> serde_json::Value {
    let out = Command::new("timeout")
        .arg("20")
        .arg(tierfs_bin())
        .args(["stats", "--json"])
        .arg(mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tierfs stats: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

/// A counter of `tierfs stats --json`, by dotted path ("ssd.hits", "backing.read_bytes").
pub fn n(v: &serde_json::Value, path: &str) -> u64 {
    let mut x = v;
    for p in path.split('.') {
        x = &x[p];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("no {path} in stats {v}"))
}

/// One counter of the mount at `mnt` (see [`n`]).
pub fn stat_of(mnt: &Path, path: &str) -> u64 {
    n(&stats_of(mnt), path)
}

/// Why a test did not run what its name claims.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Needs root, and the suite runs as another user (`scripts/test` refuses that anyway).
    NotRoot,
    /// Something this machine has that a fresh one would not (an installed
    /// `/sbin/mount.fuse.tierfs` that mount(8) would run instead of the binary under test).
    Installed,
    /// Something a fresh Debian machine as root has (a memory cgroup): `scripts/test` fails.
    Missing,
}

/// A test that returns without checking what it claims says so: on stderr, and in the file
/// `TIERFS_SKIP_LOG` names (`scripts/test` lists those lines after the run: a skip is not a
/// pass, and a `Missing` one fails the suite).
pub fn skip(kind: Skip, reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("?")
        .rsplit("::")
        .next()
        .unwrap_or("?")
        .to_string();
    let kind = match kind {
        Skip::NotRoot => "not-root",
        Skip::Installed => "installed",
        Skip::Missing => "missing",
    };
    eprintln!("skipped ({kind}): {reason}");
    if let Some(log) = std::env::var_os("TIERFS_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
        {
            let _ = writeln!(f, "{kind}\t{test}\t{reason}");
        }
    }
}

/// The files write-back set aside in `CACHE/journal/lost/` (made when the first one is). The
/// journal itself must be there: a check of a path where no journal lives would pass for
/// nothing (empty, because missing).
pub fn lost_files(cache: &Path) -> Vec<PathBuf> {
    let journal = cache.join("journal");
    assert!(
        journal.join("superblock").is_file(),
        "no write-back journal in {}",
        journal.display()
    );
    match std::fs::read_dir(journal.join("lost")) {
        Ok(d) => d.map(|e| e.unwrap().path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{}: {e}", journal.join("lost").display()),
    }
}

/// Waits (up to 30 s, else panics) until the write-back journal's writer thread has written
/// every record appended so far to the journal's file. Before a `kill -9`: the page cache
/// keeps what was written, so replay must find all of it. (A fixed 500 ms sleep was not
/// always enough under a loaded CI machine.)
pub fn wait_journal_written(mnt: &Path) {
    let appended = stat_of(mnt, "writeback.journal.appended_seq");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let written = stat_of(mnt, "writeback.journal.written_seq");
        if written >= appended {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the journal wrote seq {written} of {appended} in 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Write-back whose namespace flusher waits for a drain (fsync, fsync of a directory, an
/// operation done on the store): what the store has before one shows what was deferred.
pub const WB_HELD: &[&str] = &[
    "writeback.mode=back",
    "writeback.namespace_delay=1h",
    "writeback.namespace_quiet=1h",
    "meta.ttl=1h",
];

/// The pid of the daemon serving `mnt`: the `tierfs mount SOURCE MNT ...` process whose
/// MOUNTPOINT argument is `mnt` (its parent, same command line, exits as soon as the mount is
/// up, before `BinMount::mount` returns). Only the MOUNTPOINT position counts: a tierfs
/// stacked on another mount names that mount as its SOURCE, and once pids wrap it may have
/// the lower pid (SIGSTOPping it instead of the store hung a run).
pub fn daemon_pid(mnt: &Path) -> Option<i32> {
    let want = mnt.as_os_str().as_bytes();
    for ent in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = ent.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(ent.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_tierfs = args
            .first()
            .is_some_and(|a| Path::new(std::ffi::OsStr::from_bytes(a)).ends_with("tierfs"));
        if is_tierfs
            && args.get(1) == Some(&&b"mount"[..])
            && mount_positionals(&args[2..]).get(1) == Some(&want)
        {
            return Some(pid);
        }
    }
    None
}

/// SOURCE and MOUNTPOINT of `tierfs mount`'s arguments: what is neither a flag nor the value
/// of one (the flags that take a value are `tierfs mount --help`'s).
fn mount_positionals<'a>(args: &[&'a [u8]]) -> Vec<&'a [u8]> {
    const WITH_VALUE: &[&[u8]] = &[
        b"-o",
        b"--cache-dir",
        b"--config",
        b"--metrics-addr",
        b"--endpoint",
        b"--region",
    ];
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if WITH_VALUE.contains(a) {
            it.next();
        } else if !a.starts_with(b"-") && !a.is_empty() {
            out.push(*a);
        }
    }
    out
}

/// Waits until process `pid` has exited (gone, or a zombie); false on timeout.
pub fn wait_exit(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let gone = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            // The state is the field after the command name, which is in parentheses. A
            // zombie leader may still have threads exiting (holding its files, and so its
            // locks): it is gone once it is the only task left.
            Ok(s) => {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
                    && std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()) <= 1
            }
        };
        if gone {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `echo 3 > /proc/sys/vm/drop_caches` (clean pages only; needs root).
pub fn drop_caches() {
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "3") {
        eprintln!("drop_caches: {e}");
    }
}

/// How a [`FaultMount`] is set up.
#[derive(Clone)]
pub struct FaultOpts {
    pub cfg: tierfs_fs::FsConfig,
    /// Write-back, journal under `<dir>/journal`.
    pub wb: Option<tierfs_fs::WbConfig>,
    /// An SSD tier under `<dir>/cache/ssd` (kept across [`FaultMount::remount`]).
    pub ssd: Option<tierfs_fs::SsdConfig>,
    /// The store renumbers inodes and changes its device number at every mount, as sshfs
    /// does (`FaultConfig::set_renumber`).
    pub renumber: bool,
    /// The kernel's attribute and entry TTLs.
    pub kernel_ttl: Duration,
}

impl FaultOpts {
    pub fn new(cfg: tierfs_fs::FsConfig) -> FaultOpts {
        FaultOpts {
            cfg,
            wb: None,
            ssd: None,
            renumber: false,
            kernel_ttl: Duration::ZERO,
        }
    }
}

/// A mount served in this process over a fault-injecting store, for failure tests.
pub struct FaultMount {
    pub dir: Arc<tempfile::TempDir>,
    pub backing: PathBuf,
    pub mnt: PathBuf,
    pub faults: Arc<FaultConfig>,
    pub fs: Arc<tierfs_fs::Fs<FaultStore<PosixStore>>>,
    opts: FaultOpts,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultMount {
    pub fn new(cfg: tierfs_fs::FsConfig, prepare: impl FnOnce(&Path)) -> FaultMount {
        Self::with_writeback(cfg, None, prepare)
    }

    /// A fault mount in write-back mode when `wb` is given (journal under `<dir>/journal`).
    pub fn with_writeback(
        cfg: tierfs_fs::FsConfig,
        wb: Option<tierfs_fs::WbConfig>,
        prepare: impl FnOnce(&Path),
    ) -> FaultMount {
        Self::with(
            FaultOpts {
                wb,
                ..FaultOpts::new(cfg)
            },
            prepare,
        )
    }

    pub fn with(opts: FaultOpts, prepare: impl FnOnce(&Path)) -> FaultMount {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        std::fs::create_dir(dir.path().join("backing")).unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        prepare(&dir.path().join("backing"));
        let faults = FaultConfig::new();
        faults.set_renumber(opts.renumber);
        Self::start(dir, faults, opts)
    }

    fn start(dir: Arc<tempfile::TempDir>, faults: Arc<FaultConfig>, opts: FaultOpts) -> FaultMount {
        let backing = dir.path().join("backing");
        let mnt = dir.path().join("mnt");
        let store = FaultStore::new(PosixStore::open(&backing).unwrap(), faults.clone());
        let ssd = opts.ssd.clone().map(|c| {
            let ident = tierfs_fs::SsdIdentity {
                store_id: tierfs_store::Store::store_id(&store).to_string(),
                block_size: opts.cfg.block_size as u32,
            };
            tierfs_fs::SsdCache::open(&dir.path().join("cache/ssd"), &ident, c, false)
                .expect("SSD tier")
        });
        let fs = tierfs_fs::Fs::with_ssd(store, opts.cfg.clone(), ssd).expect("fs");
        if let Some(wb) = &opts.wb {
            fs.start_writeback(wb.clone(), &dir.path().join("journal"), false)
                .expect("write-back");
        }
        let fuse_cfg = tierfs_fuse::FuseConfig {
            attr_ttl: opts.kernel_ttl,
            entry_ttl: opts.kernel_ttl,
            ..Default::default()
        };
        let mounted = tierfs_fuse::mount(fs.clone(), &mnt, &fuse_cfg).expect("mount");
        let thread = std::thread::spawn(move || {
            let _ = mounted.run();
        });
        FaultMount {
            dir,
            backing,
            mnt,
            faults,
            fs,
            opts,
            thread: Some(thread),
        }
    }

    /// Unmounts (the SSD tier flushed and checkpointed) and mounts again over a new store on
    /// the same directories: a new device number and new inode numbers when renumbering.
    pub fn remount(mut self) -> FaultMount {
        let (dir, faults, opts) = (self.dir.clone(), self.faults.clone(), self.opts.clone());
        self.stop();
        drop(self);
        Self::start(dir, faults, opts)
    }

    /// `tierfs stats --json` of the in-process daemon.
    pub fn stats(&self) -> serde_json::Value {
        serde_json::to_value(self.fs.stats()).expect("stats JSON")
    }

    /// Unmounts and shuts down as at a clean unmount (write-back drained), keeping the
    /// directories, without mounting again (a new mount would replay the journal).
    #[allow(dead_code)]
    pub fn shut_down(&mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.faults.set_hung(false);
        let Some(t) = self.thread.take() else {
            return;
        };
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .status();
        let _ = t.join();
        self.fs.shutdown_writeback();
        self.fs.close_ssd();
    }
}

impl Drop for FaultMount {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A size-limited tmpfs mounted in a fresh temporary directory under `parent`: a backing
/// store that runs out of space (ENOSPC tests). Lazily unmounted on drop. Keep the guard in
/// the test function, outside the `with_timeout` body: a body that panics or times out then
/// unwinds the test function, which drops the guard after the watchdog has aborted the FUSE
/// mounts on top of it.
pub struct TmpfsMount {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TmpfsMount {
    /// `size` as tmpfs takes it, e.g. "64m".
    pub fn new(parent: &Path, size: &str) -> TmpfsMount {
        let dir = tempfile::Builder::new()
            .prefix("tierfs-tmpfs-")
            .tempdir_in(parent)
            .expect("tempdir");
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0755"))
            .arg("tmpfs")
            .arg(&path)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount -t tmpfs failed (the tests run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        TmpfsMount { dir, path }
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        // Lazy: a dead FUSE mount or a leftover open file must not keep the tmpfs (and its
        // memory) around, nor fail the cleanup.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// splitmix64's finalizer: a well-mixed 64-bit hash.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// splitmix64: deterministic, so a seed replays a run exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
    pub fn below(&mut self, n: usize) -> usize {
        self.range(0, n as u64) as usize
    }
}

/// `len` pseudo-random bytes from `seed`: what the write-back tests copy written data from
/// (a copy is a memcpy: byte-wise generation would make the writers, in an unoptimized test
/// build, too slow to keep the daemon busy).
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed ^ 0x9001);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// pwrite until all of `data` is written at `off`.
pub fn write_all_at(f: &std::fs::File, mut data: &[u8], mut off: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    while !data.is_empty() {
        match f.write_at(data, off)? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => {
                data = &data[n..];
                off += n as u64;
            }
        }
    }
    Ok(())
}

/// Runs `cmd args` in `dir` (git and the like); panics with its stderr if it fails.
pub fn run_in(dir: &Path, cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The names in directory `d`, sorted.
pub fn sorted_names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
