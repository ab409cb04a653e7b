//! Bad input to `tierfs`: each case must end, within a timeout, with a non-zero exit and
//! exactly one line on stderr that starts with "tierfs:" and names the culprit, and must leave
//! nothing mounted.

mod common;
use common::*;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A scratch layout: `b` (a valid BACKING), `m` (a valid mount point), `c` (cache dir root),
/// `file` (a regular file).
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        for d in ["b", "m"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("file"), b"not a directory").unwrap();
        Scratch { dir }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

fn tierfs<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let start = Instant::now();
    let out = Command::new("timeout")
        .args(["-k", "5", "20"])
        .arg(tierfs_bin())
        .args(args)
        .output()
        .expect("run tierfs");
    assert!(
        !matches!(out.status.code(), Some(124) | Some(137))
            && start.elapsed() < Duration::from_secs(20),
        "tierfs did not finish in time: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Asserts the failure shape and returns the one line.
fn one_line_error(out: &Output, culprit: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status 0; stderr: {stderr}");
    let text = stderr.trim();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "want exactly one line on stderr, got:\n{stderr}"
    );
    assert!(lines[0].starts_with("tierfs:"), "{stderr}");
    assert!(
        lines[0].contains(culprit),
        "stderr does not name {culprit:?}: {stderr}"
    );
    lines[0].to_string()
}

/// Nothing at all is mounted at `mnt` (not tierfs, not a dead FUSE mount).
fn nothing_mounted(mnt: &Path) {
    let canon = mnt.canonicalize().unwrap_or_else(|_| mnt.to_path_buf());
    let m = tierfs_fuse::find_mount(&canon).unwrap();
    assert!(m.is_none(), "left mounted at {}: {m:?}", canon.display());
}

fn mount_args(s: &Scratch, backing: &Path, mnt: &Path, extra: &[&str]) -> Vec<PathBuf> {
    let mut a = mount_args_cache(backing, mnt, &s.p("c"));
    a.extend(extra.iter().map(PathBuf::from));
    a
}

/// `tierfs mount BACKING MNT --cache-dir CACHE`.
fn mount_args_cache(backing: &Path, mnt: &Path, cache: &Path) -> Vec<PathBuf> {
    vec![
        "mount".into(),
        backing.into(),
        mnt.into(),
        "--cache-dir".into(),
        cache.into(),
    ]
}

#[test]
fn missing_backing() {
    let s = Scratch::new();
    let missing = s.p("no-such-backing");
    let out = tierfs(mount_args(&s, &missing, &s.p("m"), &[]));
    let line = one_line_error(&out, &missing.display().to_string());
    assert!(line.contains("No such file or directory"), "{line}");
    nothing_mounted(&s.p("m"));
}

#[test]
fn backing_is_a_file() {
    let s = Scratch::new();
    let out = tierfs(mount_args(&s, &s.p("file"), &s.p("m"), &[]));
    let line = one_line_error(&out, &s.p("file").display().to_string());
    assert!(line.contains("Not a directory"), "{line}");
    nothing_mounted(&s.p("m"));
}

/// An option of another kind of store is refused, not ignored: `-o s3.endpoint=...` with a
/// directory (a forgotten `s3://`) mounted the directory and dropped the endpoint.
#[test]
fn options_of_another_store_kind_are_refused() {
    let s = Scratch::new();
    for (args, key) in [
        (["-o", "s3.endpoint=http://127.0.0.1:9"], "s3.endpoint"),
        (["-o", "sftp.timeout=5s"], "sftp.timeout"),
        (["--endpoint", "http://x:9"], "s3.endpoint"),
    ] {
        let out = tierfs(mount_args(&s, &s.p("b"), &s.p("m"), &args));
        let line = one_line_error(&out, key);
        assert!(line.contains("a directory"), "{line}");
        nothing_mounted(&s.p("m"));
    }
}

#[test]
fn missing_mountpoint() {
    let s = Scratch::new();
    let missing = s.p("no-such-mnt");
    let out = tierfs(mount_args(&s, &s.p("b"), &missing, &[]));
    one_line_error(&out, &missing.display().to_string());
    assert!(!missing.exists());
}

#[test]
fn mountpoint_is_a_file() {
    let s = Scratch::new();
    let out = tierfs(mount_args(&s, &s.p("b"), &s.p("file"), &[]));
    one_line_error(&out, &s.p("file").display().to_string());
    nothing_mounted(&s.p("file"));
}

/// A mountpoint inside its own backing directory: the store would show the mount inside itself
/// and a lookup there would wait on the threads serving it (issue 13: every I/O thread
/// deadlocked, not even kill -9 ended it). Refused before anything is mounted.
#[test]
fn mountpoint_inside_the_backing_directory() {
    let s = Scratch::new();
    let inner = s.p("b/mnt");
    std::fs::create_dir(&inner).unwrap();
    let out = tierfs(mount_args(&s, &s.p("b"), &inner, &[]));
    let line = one_line_error(&out, &inner.display().to_string());
    assert!(line.contains("inside the backing directory"), "{line}");
    nothing_mounted(&inner);
}

/// The same directory as backing and mountpoint is a mount over itself, which works: the store
/// is opened before the mount covers it.
#[test]
fn mountpoint_over_the_backing_directory_is_accepted() {
    let s = Scratch::new();
    std::fs::write(s.p("b/f"), b"under").unwrap();
    let b = s.p("b");
    let out = with_timeout(Duration::from_secs(60), vec![b.clone()], {
        let (b, c) = (b.clone(), s.p("c"));
        move || {
            let out = tierfs(mount_args_cache(&b, &b, &c));
            let read = std::fs::read(b.join("f"));
            let _ = Command::new("fusermount3").arg("-uz").arg(&b).status();
            (out, read)
        }
    });
    assert!(
        out.0.status.success(),
        "{}",
        String::from_utf8_lossy(&out.0.stderr)
    );
    assert_eq!(out.1.unwrap(), b"under");
}

/// A cache dir inside the mountpoint: the cache would live in the filesystem it caches (issue
/// 13: the mount never came up). Refused, and nothing is created there.
#[test]
fn cache_dir_inside_the_mountpoint() {
    let s = Scratch::new();
    let cache = s.p("m/cache");
    let out = tierfs(mount_args_cache(&s.p("b"), &s.p("m"), &cache));
    let line = one_line_error(&out, &cache.display().to_string());
    assert!(line.contains("inside the mountpoint"), "{line}");
    assert!(!cache.exists());
    nothing_mounted(&s.p("m"));
}

/// A cache dir inside the backing directory would be shown, and warmed, as part of the store.
#[test]
fn cache_dir_inside_the_backing_directory() {
    let s = Scratch::new();
    let cache = s.p("b/.cache/tierfs");
    let out = tierfs(mount_args_cache(&s.p("b"), &s.p("m"), &cache));
    let line = one_line_error(&out, &cache.display().to_string());
    assert!(line.contains("inside the backing directory"), "{line}");
    assert!(!s.p("b/.cache").exists());
    nothing_mounted(&s.p("m"));
}

/// A second tierfs on a mount point that already has one: refused, and the first mount keeps
/// serving.
#[test]
fn busy_mountpoint() {
    let first = BinMount::new(&["ram.max=16M"]);
    std::fs::write(first.backing.join("f"), b"first").unwrap();
    let s = Scratch::new();
    let mnt = first.mnt.clone();
    let out = with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        let out = tierfs(mount_args(&s, &s.p("b"), &mnt, &[]));
        assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"first");
        out
    });
    let line = one_line_error(&out, &first.mnt.display().to_string());
    assert!(line.contains("busy"), "{line}");
    // Still exactly one mount there, the first one.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let at = format!(" {} ", first.mnt.display());
    assert_eq!(
        mounts.lines().filter(|l| l.contains(&at)).count(),
        1,
        "{mounts}"
    );
    first.unmount();
    nothing_mounted(&first.mnt);
}

/// A cache dir that cannot be created: its parent is a regular file. (Root bypasses
/// permission bits, so chmod 000 would not make a directory unwritable in CI.)
#[test]
fn cache_dir_under_a_regular_file() {
    let s = Scratch::new();
    let cache = s.p("file/cache");
    let out = tierfs([
        OsStr::new("mount"),
        s.p("b").as_os_str(),
        s.p("m").as_os_str(),
        OsStr::new("--cache-dir"),
        cache.as_os_str(),
    ]);
    let line = one_line_error(&out, &cache.display().to_string());
    assert!(line.contains("Not a directory"), "{line}");
    nothing_mounted(&s.p("m"));
}

/// A cache dir that is a regular file, and one that is an existing directory of someone's
/// own files: refused, and the directory neither chmod'ed nor written into.
#[test]
fn cache_dir_that_is_not_ours() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new();
    let out = tierfs(mount_args_cache(&s.p("b"), &s.p("m"), &s.p("file")));
    let line = one_line_error(&out, &s.p("file").display().to_string());
    assert!(line.contains("is a file"), "{line}");
    let theirs = s.p("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("notes.txt"), b"mine").unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tierfs(mount_args_cache(&s.p("b"), &s.p("m"), &theirs));
    let line = one_line_error(&out, &theirs.display().to_string());
    assert!(line.contains("no tierfs cache dir"), "{line}");
    let mode = std::fs::metadata(&theirs).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755, "the directory was chmod'ed");
    assert_eq!(sorted_names(&theirs), vec!["notes.txt".to_string()]);
    nothing_mounted(&s.p("m"));
}

/// A tmpfs mounted for the test, detached (lazily) when dropped.
struct TmpfsMount(PathBuf);

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cache dir on a read-only filesystem: both a cache dir that would have to be created
/// there, and one that exists but cannot be written (the lock file cannot be created).
/// Needs root to mount a tmpfs.
#[test]
fn cache_dir_on_read_only_filesystem() {
    if unsafe { libc::geteuid() } != 0 {
        skip(Skip::NotRoot, "mounting a read-only tmpfs needs root");
        return;
    }
    let s = Scratch::new();
    let ro = s.p("ro");
    std::fs::create_dir(&ro).unwrap();
    sh(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1M", "tmpfs"])
        .arg(&ro));
    let _guard = TmpfsMount(ro.clone());
    std::fs::create_dir(ro.join("existing")).unwrap();
    sh(Command::new("mount").args(["-o", "remount,ro"]).arg(&ro));
    assert!(
        std::fs::create_dir(ro.join("probe")).is_err(),
        "tmpfs is not read-only"
    );

    for cache in [ro.join("new"), ro.join("existing")] {
        let out = tierfs([
            OsStr::new("mount"),
            s.p("b").as_os_str(),
            s.p("m").as_os_str(),
            OsStr::new("--cache-dir"),
            cache.as_os_str(),
        ]);
        let line = one_line_error(&out, &cache.display().to_string());
        assert!(line.contains("Read-only file system"), "{line}");
        nothing_mounted(&s.p("m"));
    }
}

/// A cache dir whose control socket path is too long for a unix socket: this failure comes
/// after the daemon has forked, so it checks that the error still reaches the user as one line
/// (it used to print two: the daemon's and the parent's "the daemon exited before the mount
/// was ready") and that no dead mount is left behind (the socket used to be bound after the
/// mount was made, and its failure left the mount point disconnected).
#[test]
fn cache_dir_too_long_for_control_socket() {
    let s = Scratch::new();
    let cache = s.p(&"x".repeat(120));
    let out = tierfs([
        OsStr::new("mount"),
        s.p("b").as_os_str(),
        s.p("m").as_os_str(),
        OsStr::new("--cache-dir"),
        cache.as_os_str(),
    ]);
    let line = one_line_error(&out, "control.sock");
    assert!(line.contains("control socket"), "{line}");
    nothing_mounted(&s.p("m"));
}

#[test]
fn unknown_option_key() {
    let s = Scratch::new();
    let out = tierfs(mount_args(&s, &s.p("b"), &s.p("m"), &["-o", "ram.maxx=1G"]));
    let line = one_line_error(&out, "ram.maxx");
    assert!(line.contains("unknown option"), "{line}");
    nothing_mounted(&s.p("m"));
    assert!(
        !s.p("c").exists(),
        "bad options must be refused before touching the cache dir"
    );
}

#[test]
fn unknown_bare_option() {
    let s = Scratch::new();
    let out = tierfs(mount_args(&s, &s.p("b"), &s.p("m"), &["-o", "rw,bogus"]));
    one_line_error(&out, "bogus");
    nothing_mounted(&s.p("m"));
}

#[test]
fn malformed_option_value() {
    let s = Scratch::new();
    for (opt, culprit) in [
        ("ram.max=lots", "lots"),
        ("meta.ttl=soon", "soon"),
        ("ram.block_size=3000", "ram.block_size"),
        ("fuse.threads=0", "fuse.threads"),
        // Out of range (issue 13 item 16): a panic (exit 101) or a silent saturation before.
        ("meta.ttl=18446744073709551615", "meta.ttl"),
        ("ram.max=99999999999999999999", "ram.max"),
        ("ram.max=0", "ram.max"),
        ("ram.max=1K", "ram.max"),
        ("ssd.write_burst=0", "ssd.write_burst"),
    ] {
        let out = tierfs(mount_args(&s, &s.p("b"), &s.p("m"), &["-o", opt]));
        let line = one_line_error(&out, culprit);
        assert!(line.contains(opt.split('=').next().unwrap()), "{line}");
        nothing_mounted(&s.p("m"));
    }
}

#[test]
fn malformed_config_file() {
    let s = Scratch::new();
    let f = s.p("bad.toml");
    std::fs::write(&f, "[ram]\nmax = \"1G\"\n[meta\nttl = 1\n").unwrap();
    let out = tierfs(mount_args(
        &s,
        &s.p("b"),
        &s.p("m"),
        &["--config", f.to_str().unwrap()],
    ));
    let line = one_line_error(&out, &f.display().to_string());
    assert!(line.contains("line 3"), "{line}");
    nothing_mounted(&s.p("m"));
}

#[test]
fn config_file_with_unknown_key() {
    let s = Scratch::new();
    let f = s.p("unknown.toml");
    std::fs::write(&f, "[ram]\nmax = \"1G\"\nmaxx = \"2G\"\n").unwrap();
    let out = tierfs(mount_args(
        &s,
        &s.p("b"),
        &s.p("m"),
        &["--config", f.to_str().unwrap()],
    ));
    let line = one_line_error(&out, &f.display().to_string());
    assert!(line.contains("ram.maxx"), "{line}");
    nothing_mounted(&s.p("m"));
}

#[test]
fn missing_config_file() {
    let s = Scratch::new();
    let f = s.p("missing.toml");
    let out = tierfs(mount_args(
        &s,
        &s.p("b"),
        &s.p("m"),
        &["--config", f.to_str().unwrap()],
    ));
    one_line_error(&out, &f.display().to_string());
    nothing_mounted(&s.p("m"));
}

#[test]
fn stats_on_a_plain_directory() {
    let s = Scratch::new();
    let out = tierfs([OsStr::new("stats"), s.p("b").as_os_str()]);
    let line = one_line_error(&out, &s.p("b").display().to_string());
    assert!(line.contains("not a mount point"), "{line}");
}

#[test]
fn stats_on_a_missing_path() {
    let s = Scratch::new();
    let out = tierfs([OsStr::new("stats"), s.p("nope").as_os_str()]);
    one_line_error(&out, &s.p("nope").display().to_string());
}

/// A mount point of another filesystem type (the root filesystem).
#[test]
fn stats_on_a_non_tierfs_mount() {
    let out = tierfs(["stats", "/"]);
    let line = one_line_error(&out, "/");
    assert!(line.contains("not a tierfs mount"), "{line}");
}

/// A cache directory made for one store is refused for another, with a line that names the
/// way out; `--reset-cache` then rebuilds it and the mount serves the new store.
#[test]
fn cache_dir_of_another_store() {
    let s = Scratch::new();
    std::fs::create_dir(s.p("b2")).unwrap();
    std::fs::write(s.p("b2").join("f"), b"second store").unwrap();
    let mnt = s.p("m");
    let first = tierfs(mount_args(&s, &s.p("b"), &mnt, &[]));
    assert!(first.status.success(), "{first:?}");
    let unmounted = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    if !unmounted.is_ok_and(|st| st.success()) {
        abort_mount(&mnt);
    }
    let out = tierfs(mount_args(&s, &s.p("b2"), &mnt, &[]));
    let line = one_line_error(&out, "--reset-cache");
    assert!(line.contains("belongs to store"), "{line}");
    nothing_mounted(&mnt);
    let out = tierfs(mount_args(&s, &s.p("b2"), &mnt, &["--reset-cache"]));
    assert!(out.status.success(), "{out:?}");
    let mnt2 = mnt.clone();
    let data = with_timeout(Duration::from_secs(30), vec![mnt.clone()], move || {
        std::fs::read(mnt2.join("f")).unwrap()
    });
    let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).status();
    assert_eq!(data, b"second store");
}

/// A mistyped command is not taken for a mount of a backing directory of that name (issue 13
/// item 17): one line naming it, a suggestion, exit 2.
#[test]
fn unknown_command_is_not_a_mount() {
    let s = Scratch::new();
    let out = tierfs([OsStr::new("stat"), s.p("m").as_os_str()]);
    let line = one_line_error(&out, "\"stat\"");
    assert!(line.contains("unknown command"), "{line}");
    assert!(line.contains("did you mean \"stats\""), "{line}");
    assert_eq!(out.status.code(), Some(2));
    nothing_mounted(&s.p("m"));
}

/// A relative `--cache-dir` is registered as an absolute path (issue 13 item 17): `tierfs
/// stats` and `ctl` find the mount from any directory.
#[test]
fn relative_cache_dir_is_found_from_anywhere() {
    let s = Scratch::new();
    let out = Command::new("timeout")
        .args(["-k", "5", "20"])
        .arg(tierfs_bin())
        .args(["mount", "b", "m", "--cache-dir", "rel-cache"])
        .current_dir(s.p(""))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mnt = s.p("m");
    let cleanup = Unmount(mnt.clone());
    let st = Command::new("timeout")
        .args(["-k", "5", "20"])
        .arg(tierfs_bin())
        .args(["stats", "--json"])
        .arg(&mnt)
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "stats from /: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert!(s.p("rel-cache/control.sock").exists());
    drop(cleanup);
}

/// Lazily unmounts on drop, even after a panic.
struct Unmount(PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-uz").arg(&self.0).status();
    }
}

/// A small cache filesystem (issue 13 item 18): with default options the SSD tier picks
/// segments that fit it and write-back a journal that fits it (256M segments refused any
/// cache filesystem under ~341 MB, and the default journal of 2x the dirty limit, 6 GiB on a
/// 24 GiB host, could not be preallocated); a segment size given explicitly that does not
/// fit is refused with one line naming `ssd.segment_size`.
#[test]
fn a_small_cache_filesystem_gets_sizes_that_fit() {
    if unsafe { libc::geteuid() } != 0 {
        skip(Skip::NotRoot, "needs root (mounts a tmpfs)");
        return;
    }
    let s = Scratch::new();
    let small = common::TmpfsMount::new(s.dir.path(), "200m");
    let cache = small.path.join("cache");
    let out = tierfs(
        mount_args_cache(&s.p("b"), &s.p("m"), &cache)
            .into_iter()
            .chain(["-o".into(), "writeback.mode=back".into()]),
    );
    let _guard = Unmount(s.p("m"));
    assert!(
        out.status.success(),
        "default options on a 200 MB cache filesystem: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let get = |k: &str| {
        let o = tierfs([
            OsStr::new("ctl"),
            s.p("m").as_os_str(),
            OsStr::new("get"),
            OsStr::new(k),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let journal = get("writeback.journal_size");
    assert!(
        journal.split_whitespace().nth(1) == Some("50M"),
        "journal not bounded by the 200 MB device: {journal}"
    );
    std::fs::write(s.p("m/f"), vec![5u8; 4 << 20]).unwrap();
    assert_eq!(std::fs::read(s.p("m/f")).unwrap(), vec![5u8; 4 << 20]);
    drop(_guard);
    std::thread::sleep(Duration::from_millis(500));

    let out = tierfs(
        mount_args_cache(&s.p("b"), &s.p("m"), &small.path.join("cache2"))
            .into_iter()
            .chain(["-o".into(), "ssd.segment_size=256M".into()]),
    );
    let line = one_line_error(&out, "ssd.segment_size");
    assert!(line.contains("smaller than one segment"), "{line}");
    nothing_mounted(&s.p("m"));
}

/// A user who is not root mounts through fusermount3; where /dev/fuse is not open to that
/// user (mode 0600 here; 0660 with a `fuse` group elsewhere) the one line says so, naming
/// /dev/fuse, instead of a bare "Permission denied" on the mount point. Run as uid 65534
/// (nobody), with a copy of the binary and directories it owns. Where /dev/fuse is open to
/// everyone (Debian's 0666), the same user must get a working mount instead.
#[test]
fn a_user_who_may_not_use_dev_fuse_is_told_so() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let s = Scratch::new();
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(s.p("c")).unwrap();
    for d in ["b", "m", "c"] {
        chown(s.p(d), Some(65534), Some(65534)).unwrap();
    }
    let bin = s.p("tierfs");
    std::fs::copy(tierfs_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    // `prog args` as uid 65534, within a timeout.
    let nobody = |prog: &OsStr, args: &[&OsStr]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["timeout", "-k", "5", "20"])
            .arg(prog)
            .args(args)
            .env("HOME", s.dir.path())
            .output()
            .expect("run setpriv")
    };
    let as_nobody = |args: &[&OsStr]| nobody(bin.as_os_str(), args);
    let (b, m, c) = (s.p("b"), s.p("m"), s.p("c"));
    let mount: Vec<&OsStr> = vec![
        OsStr::new("mount"),
        b.as_os_str(),
        m.as_os_str(),
        OsStr::new("--cache-dir"),
        c.as_os_str(),
    ];
    let open_to_others = std::fs::metadata("/dev/fuse")
        .map(|m| m.permissions().mode() & 0o006 == 0o006)
        .unwrap_or(false);
    let out = as_nobody(&mount);
    if open_to_others {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "mount as nobody: {stderr}");
        std::fs::write(s.p("b/f"), b"seen").unwrap();
        // (Only its owner may enter the mount: no allow_other.)
        let f = s.p("m/f");
        let seen = nobody(OsStr::new("cat"), &[f.as_os_str()]);
        let _ = as_nobody(&[OsStr::new("unmount"), m.as_os_str()]);
        let _ = Command::new("fusermount3").arg("-uz").arg(&m).status();
        assert_eq!(
            seen.stdout,
            b"seen",
            "{}",
            String::from_utf8_lossy(&seen.stderr)
        );
    } else {
        let line = one_line_error(&out, "/dev/fuse");
        assert!(line.contains("may not use FUSE"), "{line}");
    }
    nothing_mounted(&s.p("m"));
}
