//! tierfs's own sftp store (`tierfs mount sftp://USER@HOST:PORT/PATH`) against a real sshd on
//! this machine (`common::sshd`; OpenSSH's sftp-server), through the `tierfs` binary with
//! default options (only `sftp.ssh_config`, so ssh uses the test's key and not root's
//! ~/.ssh): real programs write and read, in write-through and write-back; the errnos of
//! what fails are those a local directory gives (or, where sftp cannot, the documented ones);
//! the connection dies and comes back; bad URLs are one line; fstab.

mod common;
use common::git::{check_clone, source_repo};
use common::sshd::Sshd;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(300);

use common::run_in as run;

/// `tierfs mount <url> m.mnt` with the test's ssh_config and `opts`.
fn mount(sshd: &Sshd, m: &BinMount, rel: &str, opts: &[&str]) {
    let cfg = format!("sftp.ssh_config={}", sshd.ssh_config().display());
    let all: Vec<&str> = [&[cfg.as_str()][..], opts].concat();
    m.mount_source(sshd.url(rel).as_ref(), &all, &[]);
}

/// The ssh processes talking to this sshd (the store's connection): found by the ssh_config
/// path on their command line.
fn ssh_clients(sshd: &Sshd) -> Vec<i32> {
    let cfg = sshd.ssh_config().to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().is_some_and(|a| a == "ssh") && args.contains(&cfg) {
            pids.push(pid);
        }
    }
    pids
}

fn kill_ssh_clients(sshd: &Sshd) {
    let pids = ssh_clients(sshd);
    assert!(!pids.is_empty(), "no ssh process of the store");
    for p in pids {
        // SAFETY: a plain signal to a process this test's mount started.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// A tree of files of many sizes (empty, small, several READs long) and a symlink.
fn make_tree(root: &Path) {
    for (i, len) in [0usize, 1, 4095, 70_000, 600_000, 3 << 20]
        .iter()
        .enumerate()
    {
        let d = root.join(format!("d{}", i % 3));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), seeded_bytes(i as u64, *len)).unwrap();
    }
    std::os::unix::fs::symlink("d0/f0", root.join("link")).unwrap();
}

fn diff(a: &Path, b: &Path) {
    let out = Command::new("diff")
        .arg("-r")
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(out.status.success(), "diff -r {a:?} {b:?}: {out:?}");
}

/// Real programs on the mount, then the same on the server once unmounted.
fn programs(mnt: &Path, src: &Path, repo: &str, mode: &str) {
    // Byte-exact write and read back (several WRITEs and READs in flight each way).
    let big = seeded_bytes(7, (5 << 20) + 123);
    std::fs::write(mnt.join("big"), &big).unwrap();
    assert!(
        std::fs::read(mnt.join("big")).unwrap() == big,
        "{mode}: big"
    );
    // cp -r, tar -c and tar -x.
    run(mnt, "cp", &["-r", src.to_str().unwrap(), "copy"]);
    diff(src, &mnt.join("copy"));
    let tarball = mnt.join("t.tar");
    run(
        mnt,
        "tar",
        &["-cf", tarball.to_str().unwrap(), "-C", "copy", "."],
    );
    std::fs::create_dir(mnt.join("untar")).unwrap();
    run(mnt, "tar", &["-xf", "t.tar", "-C", "untar"]);
    diff(src, &mnt.join("untar"));
    // rename, hard link, symlink.
    std::fs::rename(mnt.join("untar/d1"), mnt.join("moved")).unwrap();
    std::fs::hard_link(mnt.join("big"), mnt.join("big2")).unwrap();
    std::os::unix::fs::symlink("big", mnt.join("sym")).unwrap();
    assert_eq!(
        std::fs::read_link(mnt.join("sym")).unwrap(),
        Path::new("big")
    );
    assert!(std::fs::read(mnt.join("sym")).unwrap() == big);
    // chmod, chown, touch, truncate.
    std::fs::set_permissions(mnt.join("big2"), std::fs::Permissions::from_mode(0o640)).unwrap();
    run(mnt, "chown", &["1234:2345", "moved"]);
    run(mnt, "touch", &["-m", "-d", "2001-02-03 04:05:06", "big2"]);
    let m = std::fs::metadata(mnt.join("big2")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o640, 981173106), "{mode}");
    let m = std::fs::metadata(mnt.join("moved")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 2345), "{mode}");
    run(mnt, "truncate", &["-s", "1000", "big"]);
    assert_eq!(
        std::fs::metadata(mnt.join("big")).unwrap().len(),
        1000,
        "{mode}"
    );
    // append, mkdir, rmdir.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("big"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"tail").unwrap();
    drop(f);
    std::fs::create_dir(mnt.join("empty")).unwrap();
    std::fs::create_dir(mnt.join("gone")).unwrap();
    std::fs::remove_dir(mnt.join("gone")).unwrap();
    // git clone --no-local (temporary packs linked to their names, renames, fsyncs).
    run(mnt, "git", &["clone", "-q", "--no-local", repo, "clone"]);
    check_clone(&mnt.join("clone"));
}

/// What the server holds after `programs`.
fn check_served(served: &Path, src: &Path, mode: &str) {
    let mut want = seeded_bytes(7, 1000);
    want.extend_from_slice(b"tail");
    assert!(std::fs::read(served.join("big")).unwrap() == want, "{mode}");
    assert!(
        std::fs::read(served.join("big2")).unwrap() == want,
        "{mode}: a hard link"
    );
    let m = std::fs::metadata(served.join("big2")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.nlink()), (0o640, 2), "{mode}");
    assert_eq!(
        std::fs::read_link(served.join("sym")).unwrap(),
        Path::new("big")
    );
    diff(src, &served.join("copy"));
    assert!(served.join("moved/f1").exists() && !served.join("untar/d1").exists());
    assert!(served.join("empty").is_dir() && !served.join("gone").exists());
    check_clone(&served.join("clone"));
}

/// Write-through and write-back, default options: cp -r, tar, rename, link, symlink, chmod,
/// chown, touch, truncate, append, mkdir/rmdir and `git clone --no-local` through the
/// mount, everything as it should be through the mount and then on the server.
#[test]
fn programs_work_over_the_sftp_store_in_both_write_modes() {
    let sshd = Sshd::start();
    let src = tempfile::tempdir().unwrap();
    make_tree(src.path());
    let repo = source_repo();
    for mode in ["through", "back"] {
        let served = sshd.served.join(mode);
        std::fs::create_dir(&served).unwrap();
        let m = BinMount::unmounted_in(Path::new("/var/tmp"));
        let opt = format!("writeback.mode={mode}");
        mount(&sshd, &m, mode, &[&opt]);
        let mnt = m.mnt.clone();
        let (s, r) = (
            src.path().to_path_buf(),
            repo.path().to_str().unwrap().to_string(),
        );
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            programs(&mnt, &s, &r, mode);
            let st = stats_of(&mnt);
            assert!(n(&st, "sftp.requests") > 100, "{st}");
            assert_eq!(n(&st, "sftp.in_flight"), 0, "{st}");
        });
        m.unmount_and_wait();
        check_served(&served, src.path(), mode);
    }
}

/// One operation on a path relative to a root, for the errno comparison.
type Op = fn(&Path) -> std::io::Result<()>;

fn renameat2(root: &Path, a: &str, b: &str, flags: u32) -> std::io::Result<()> {
    let c = |p: &str| std::ffi::CString::new(root.join(p).to_str().unwrap()).unwrap();
    let (a, b) = (c(a), c(b));
    // SAFETY: valid C strings; AT_FDCWD with absolute paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

const OPS: &[(&str, Op)] = &[
    ("mkdir over a dir", |r| std::fs::create_dir(r.join("dir"))),
    ("mkdir over a file", |r| std::fs::create_dir(r.join("file"))),
    ("mkdir under a file", |r| {
        std::fs::create_dir(r.join("file/x"))
    }),
    ("rmdir non-empty", |r| std::fs::remove_dir(r.join("full"))),
    ("rmdir a file", |r| std::fs::remove_dir(r.join("file"))),
    ("rmdir missing", |r| std::fs::remove_dir(r.join("nope"))),
    ("unlink a dir", |r| std::fs::remove_file(r.join("dir"))),
    ("unlink missing", |r| std::fs::remove_file(r.join("nope"))),
    ("create excl over a file", |r| {
        std::fs::File::create_new(r.join("file")).map(|_| ())
    }),
    ("open a dir for writing", |r| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(r.join("dir"))
            .map(|_| ())
    }),
    ("open missing", |r| {
        std::fs::File::open(r.join("nope")).map(|_| ())
    }),
    ("link over a file", |r| {
        std::fs::hard_link(r.join("file"), r.join("other"))
    }),
    ("symlink over a file", |r| {
        std::os::unix::fs::symlink("x", r.join("file"))
    }),
    ("readlink a file", |r| {
        std::fs::read_link(r.join("file")).map(|_| ())
    }),
    ("rename a file over a dir", |r| {
        std::fs::rename(r.join("file"), r.join("dir"))
    }),
    ("rename a dir over a file", |r| {
        std::fs::rename(r.join("dir"), r.join("file"))
    }),
    ("rename a dir over a full one", |r| {
        std::fs::rename(r.join("dir"), r.join("full"))
    }),
    ("rename missing", |r| {
        std::fs::rename(r.join("nope"), r.join("x"))
    }),
    ("rename noreplace over a file", |r| {
        renameat2(r, "other", "file", libc::RENAME_NOREPLACE)
    }),
    ("rename noreplace to a new name", |r| {
        renameat2(r, "other", "other2", libc::RENAME_NOREPLACE)
    }),
    ("rename over a file", |r| {
        std::fs::rename(r.join("other2"), r.join("file"))
    }),
    ("rename a dir into itself", |r| {
        std::fs::rename(r.join("dir"), r.join("dir/sub"))
    }),
];

/// Failing operations answer what a local directory answers: sftp's FAILURE is told apart
/// (EEXIST, ENOTEMPTY, EISDIR, ENOTDIR), NO_SUCH_FILE is ENOENT or ENOTDIR as it should be.
/// Then what sftp cannot do answers its documented errno.
#[test]
fn failing_operations_answer_the_errno_of_a_local_directory() {
    let sshd = Sshd::start();
    let local = tempfile::tempdir().unwrap();
    for root in [&sshd.served, &local.path().to_path_buf()] {
        std::fs::create_dir_all(root.join("dir")).unwrap();
        std::fs::create_dir_all(root.join("full/x")).unwrap();
        std::fs::write(root.join("file"), b"f").unwrap();
        std::fs::write(root.join("other"), b"o").unwrap();
    }
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    mount(&sshd, &m, "", &[]);
    let (mnt, reference) = (m.mnt.clone(), local.path().to_path_buf());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        for (what, op) in OPS {
            let want = errno_of(op(&reference));
            let got = errno_of(op(&mnt));
            assert_eq!(got, want, "{what}: errno over sftp vs a local directory");
        }
        // What sftp cannot do (docs/sftp.md).
        let fifo = std::ffi::CString::new(mnt.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, -1);
        assert_eq!(
            errno_of::<()>(Err(std::io::Error::last_os_error())),
            Some(libc::EPERM)
        );
        let f = std::ffi::CString::new(mnt.join("file").to_str().unwrap()).unwrap();
        // SAFETY: valid C strings and buffer.
        let r =
            unsafe { libc::setxattr(f.as_ptr(), c"user.x".as_ptr(), b"v".as_ptr().cast(), 1, 0) };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOTSUP)
        );
        let e = renameat2(&mnt, "file", "dir", libc::RENAME_EXCHANGE);
        assert_eq!(errno_of(e), Some(libc::EINVAL), "RENAME_EXCHANGE");
        // A file unlinked while open is still there for its descriptor (pjdfstest
        // unlink/14.t): its attributes come from the open handle once the name is gone.
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(mnt.join("gone"))
            .unwrap();
        f.write_all(b"still here").unwrap();
        std::fs::remove_file(mnt.join("gone")).unwrap();
        drop_caches();
        assert_eq!(
            f.metadata().unwrap().len(),
            10,
            "fstat of an unlinked open file"
        );
    });
    m.unmount_and_wait();
}

/// A file or directory made through the mount by another user belongs to that user on the
/// server (the login may chown: here it is root), with the mode asked for whatever
/// sftp-server's umask; made by root, it is root's.
#[test]
fn new_files_belong_to_their_creator_with_the_mode_asked_for() {
    let sshd = Sshd::start();
    std::fs::create_dir(sshd.served.join("open")).unwrap();
    std::fs::set_permissions(
        sshd.served.join("open"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    mount(&sshd, &m, "", &["allow_other"]);
    let (mnt, served) = (m.mnt.clone(), sshd.served.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let as_nobody = |args: &[&str]| {
            let st = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65533", "--clear-groups", "--"])
                .args(args)
                .status()
                .unwrap();
            assert!(st.success(), "{args:?}");
        };
        let f = mnt.join("open/f");
        as_nobody(&["sh", "-c", &format!("umask 0; echo x > {}", f.display())]);
        as_nobody(&["mkdir", "-m", "0775", mnt.join("open/d").to_str().unwrap()]);
        for (name, mode) in [("f", 0o666), ("d", 0o775)] {
            let m = std::fs::metadata(served.join("open").join(name)).unwrap();
            assert_eq!((m.uid(), m.gid()), (65534, 65533), "{name} on the server");
            assert_eq!(m.mode() & 0o7777, mode, "{name} on the server");
        }
        std::fs::write(mnt.join("open/g"), b"g").unwrap();
        let m = std::fs::metadata(served.join("open/g")).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0));
    });
    m.unmount_and_wait();
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ssh process killed: the next calls go through a new connection at once. The server
/// gone too (sshd not listening): cached files are still served, others answer an errno
/// promptly, and once sshd listens again the store is back within seconds, no remount.
#[test]
fn the_store_survives_its_ssh_dying_and_comes_back_after_an_outage() {
    let mut sshd = Sshd::start();
    let data = seeded_bytes(3, 2 << 20);
    std::fs::write(sshd.served.join("cached"), &data).unwrap();
    std::fs::create_dir(sshd.served.join("sub")).unwrap();
    std::fs::write(sshd.served.join("sub/uncached"), b"u").unwrap();
    std::thread::sleep(tierfs_fs::RACY_WINDOW + Duration::from_millis(200));
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    mount(&sshd, &m, "", &[]);
    let mnt = m.mnt.clone();
    let sshd = with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert!(std::fs::read(mnt.join("cached")).unwrap() == data);
        kill_ssh_clients(&sshd);
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            std::fs::read(mnt.join("cached")).unwrap() == data,
            "after a kill"
        );
        // (In a subdirectory: a directory whose entries changed through tierfs has no cached
        // attributes left to serve while the store is gone.)
        assert_eq!(std::fs::read(mnt.join("sub/uncached")).unwrap(), b"u");
        std::fs::remove_file(mnt.join("sub/uncached")).unwrap();
        std::fs::write(sshd.served.join("later"), b"l").unwrap();
        sshd.stop_listening();
        kill_ssh_clients(&sshd);
        let t = Instant::now();
        assert!(
            std::fs::read(mnt.join("cached")).unwrap() == data,
            "while gone"
        );
        assert!(
            std::fs::read(mnt.join("later")).is_err(),
            "not cached: an errno"
        );
        assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
        assert_eq!(n(&stats_of(&mnt), "backing.gone"), 1);
        sshd.listen();
        wait_for("store back", Duration::from_secs(20), || {
            std::fs::read(mnt.join("later")).is_ok_and(|b| b == b"l")
        });
        let st = stats_of(&mnt);
        assert!(n(&st, "sftp.reconnects") >= 2, "{st}");
        assert_eq!(n(&st, "backing.gone"), 0, "{st}");
        sshd
    });
    m.unmount_and_wait();
    drop(sshd);
}

/// A server that stops answering (its ssh stopped with SIGSTOP): a request gets no answer
/// within `sftp.timeout`, the connection is dropped, and the call is answered through a new
/// one; nothing waits for longer than the deadline and a new connection.
#[test]
fn a_hung_connection_is_dropped_after_the_request_deadline() {
    let sshd = Sshd::start();
    std::fs::write(sshd.served.join("a"), b"a").unwrap();
    std::fs::write(sshd.served.join("b"), b"b").unwrap();
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    mount(&sshd, &m, "", &["sftp.timeout=2s"]);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"a");
        let stopped = ssh_clients(&sshd);
        for p in &stopped {
            // SAFETY: a plain signal to a process this test's mount started.
            unsafe { libc::kill(*p, libc::SIGSTOP) };
        }
        let t = Instant::now();
        assert_eq!(std::fs::read(mnt.join("b")).unwrap(), b"b");
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(1500),
            "{took:?}: no deadline waited?"
        );
        assert!(took < Duration::from_secs(15), "{took:?}");
        let st = stats_of(&mnt);
        assert!(n(&st, "sftp.timeouts") >= 1, "{st}");
        assert!(n(&st, "sftp.reconnects") >= 1, "{st}");
        for p in stopped {
            // SAFETY: as above (killed by the store already; a no-op then).
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    });
    m.unmount_and_wait();
}

/// `tierfs mount` of a URL that cannot be served: one line on stderr, exit status 1, no mount.
#[test]
fn unreachable_hosts_and_bad_paths_are_one_line_errors() {
    let sshd = Sshd::start();
    std::fs::write(sshd.served.join("file"), b"f").unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let cfg = format!("sftp.ssh_config={}", sshd.ssh_config().display());
    let cases = [
        (
            format!("sftp://root@127.0.0.1:{port}/x"),
            "Connection refused",
        ),
        (sshd.url("missing"), "no such directory"),
        (sshd.url("file"), "not a directory"),
        ("sftp://:22/x".to_string(), "no host"),
    ];
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    for (url, want) in cases {
        let out = mount_command(url.as_ref(), &m.mnt, &m.cache, &[&cfg])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{url}: {err}");
        assert!(
            err.contains(want) && err.trim().lines().count() == 1,
            "{url}: {err:?}"
        );
        assert!(!is_mounted(&m.mnt), "{url}");
    }
}

/// An fstab line with `sftp://...` as the device, mounted by mount(8) through the
/// mount.fuse.tierfs helper (in a private mount namespace; root only).
#[test]
fn fstab_lines_take_sftp_urls() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(Skip::NotRoot, "mount(8) needs root");
        return;
    }
    if Path::new("/sbin/mount.fuse.tierfs").exists() {
        skip(
            Skip::Installed,
            "/sbin/mount.fuse.tierfs is installed and mount(8) would run it instead",
        );
        return;
    }
    let sshd = Sshd::start();
    std::fs::write(sshd.served.join("hello"), b"hello over sftp\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mnt, bin, cache) = (
        dir.path().join("mnt"),
        dir.path().join("bin"),
        dir.path().join("c"),
    );
    for d in [&mnt, &bin] {
        std::fs::create_dir(d).unwrap();
    }
    for name in ["tierfs", "mount.fuse.tierfs"] {
        std::os::unix::fs::symlink(tierfs_bin(), bin.join(name)).unwrap();
    }
    let fstab = dir.path().join("fstab");
    let line = format!(
        "{} {} fuse.tierfs noauto,_netdev,cache_dir={},sftp.ssh_config={} 0 0\n",
        sshd.url(""),
        mnt.display(),
        cache.display(),
        sshd.ssh_config().display()
    );
    std::fs::write(&fstab, line).unwrap();
    let script = r#"
set -eu
M=$1; BIN=$2; FSTAB=$3
trap 'umount -l "$M" 2>/dev/null || true' EXIT
mount --bind "$BIN" /usr/local/sbin
mount -T "$FSTAB" "$M"
echo "SOURCE $(grep " $M " /proc/self/mountinfo | sed 's/.* - //')"
echo "CONTENT $(cat "$M/hello")"
umount "$M"
"#;
    let out = Command::new("timeout")
        .args(["60", "unshare", "--mount", "--propagation", "private"])
        .args(["sh", "-c", script, "sh"])
        .arg(&mnt)
        .arg(&bin)
        .arg(&fstab)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("SOURCE fuse.tierfs {} ", sshd.url(""))),
        "{stdout}"
    );
    assert!(stdout.contains("CONTENT hello over sftp"), "{stdout}");
}
