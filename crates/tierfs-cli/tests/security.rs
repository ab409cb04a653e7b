//! The daemon runs as root over other users' data: what it keeps in the cache dir and the
//! control registry must be private to it (issue 13, items 7-9).

mod common;
use common::*;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(90);

/// Every entry under `dir` (itself included) whose mode lets anyone but the owner in.
fn open_to_others(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let mode = m.permissions().mode() & 0o7777;
        let ft = m.file_type();
        if (ft.is_dir() || ft.is_file() || ft.is_socket()) && mode & 0o077 != 0 {
            out.push((p.clone(), mode));
        }
        if ft.is_dir() {
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                todo.push(e.path());
            }
        }
    }
    out
}

/// With the most permissive umask a caller can have, the SSD tier's segments, the journal and
/// the registry of control sockets come out 0700 / 0600: cached data of a 0600 file is never
/// readable by another user. (Before: the daemon's umask 0 made them 0777 / 0666.) Backing
/// files still get exactly the mode the application asked for.
#[test]
fn cache_dir_and_registry_are_private_whatever_the_umask() {
    let m = BinMount::unmounted_in(Path::new("/tmp"));
    // `tierfs mount` run with the most permissive umask (only it: the umask is per process).
    let mut cmd = std::process::Command::new("timeout");
    cmd.arg("30")
        .arg(tierfs_bin())
        .arg("mount")
        .arg(&m.backing)
        .arg(&m.mnt)
        .arg("--cache-dir")
        .arg(&m.cache)
        .args(["-o", "writeback.mode=back,ssd.write_rate=1G,ram.max=16M"]);
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mnt, backing, cache) = (m.mnt.clone(), m.backing.clone(), m.cache.clone());
    std::fs::write(backing.join("secret"), vec![7u8; 1 << 20]).unwrap();
    std::fs::set_permissions(
        backing.join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1100)); // past the racy window: cacheable
    {
        let mnt = mnt.clone();
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            assert_eq!(
                std::fs::read(mnt.join("secret")).unwrap(),
                vec![7u8; 1 << 20]
            );
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o640)
                .open(mnt.join("new"))
                .unwrap();
            std::io::Write::write_all(&mut f, b"pending in the journal").unwrap();
            f.sync_all().unwrap();
        });
    }
    // The SSD tier writes in the background: wait until it holds the file.
    let t0 = std::time::Instant::now();
    while n(&m.stats(), "ssd.written_bytes") < 1 << 20 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "SSD tier never written"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mode = std::fs::metadata(backing.join("new"))
        .unwrap()
        .permissions()
        .mode()
        & 0o7777;
    assert_eq!(mode, 0o640, "the backing file's mode is the application's");
    let bad = open_to_others(&cache);
    assert!(bad.is_empty(), "cache dir entries open to others: {bad:?}");
    assert!(cache.join("ssd").is_dir() && cache.join("journal").is_dir());
    let registry = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/run/tierfs")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR")
            .map(|d| PathBuf::from(d).join("tierfs"))
            .unwrap_or_else(|| PathBuf::from(format!("/tmp/tierfs-{}", unsafe { libc::geteuid() })))
    };
    let bad = open_to_others(&registry);
    assert!(bad.is_empty(), "registry entries open to others: {bad:?}");
    m.unmount_and_wait();
}

/// `tierfs mount b m --cache-dir C` in `dir`: (exit status, stderr).
fn mount_with_cache(dir: &Path, cache: &Path) -> (bool, String) {
    let out = std::process::Command::new("timeout")
        .args(["-k", "5", "30"])
        .arg(tierfs_bin())
        .arg("mount")
        .arg(dir.join("b"))
        .arg(dir.join("m"))
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap();
    let _ = std::process::Command::new("fusermount3")
        .arg("-uz")
        .arg(dir.join("m"))
        .status();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// A cache dir another user controls is refused before anything is written in it (issue 13
/// item 8): one owned by another user (who would read what root caches there), one whose
/// `ssd/` is a symlink (root once wrote 0666 segment files into `/etc` that way), one in a
/// directory others may write to.
#[test]
fn a_cache_dir_another_user_controls_is_refused() {
    if unsafe { libc::geteuid() } != 0 {
        skip(Skip::NotRoot, "needs root (chown to another user)");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    for x in ["b", "m", "elsewhere", "open"] {
        std::fs::create_dir(d.join(x)).unwrap();
    }
    let theirs = d.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let linked = d.join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(d.join("elsewhere"), linked.join("ssd")).unwrap();
    std::fs::set_permissions(d.join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
    for (cache, why) in [
        (theirs.clone(), "owned by uid 65534"),
        (linked.clone(), "is a symlink"),
        (d.join("open/cache"), "writable by other users"),
    ] {
        let (ok, err) = mount_with_cache(d, &cache);
        assert!(!ok, "{}: mounted", cache.display());
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(why), "{}: {err}", cache.display());
        assert!(!is_mounted(&d.join("m")));
    }
    let written = |p: &Path| std::fs::read_dir(p).unwrap().count();
    assert_eq!(
        written(&theirs),
        0,
        "something was written in another user's dir"
    );
    assert_eq!(
        written(&d.join("elsewhere")),
        0,
        "the ssd symlink was followed"
    );
    // The same layout with a directory of our own mounts.
    let (ok, err) = mount_with_cache(d, &d.join("ours"));
    assert!(ok, "{err}");
}

/// Without `XDG_RUNTIME_DIR` a user's registry of control sockets is `/tmp/tierfs-<uid>`:
/// one another user made first (here root, against uid 65534), with an entry pointing to a
/// socket of their own, is not trusted, and `tierfs stats` says so instead of printing what
/// that socket answers (issue 13 item 9).
#[test]
fn a_registry_another_user_made_is_not_trusted() {
    if unsafe { libc::geteuid() } != 0 {
        skip(Skip::NotRoot, "needs root (plays the other user)");
        return;
    }
    let m = BinMount::new(&[]);
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let canon = m.mnt.canonicalize().unwrap();
    let dev = tierfs_fuse::mount_device(&canon).unwrap();
    let reg = PathBuf::from("/tmp/tierfs-65534");
    let _ = std::fs::remove_dir_all(&reg);
    std::fs::create_dir_all(reg.join("mounts")).unwrap();
    let evil = m.dir.path().join("impostor.sock");
    let listener = std::os::unix::net::UnixListener::bind(&evil).unwrap();
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            let mut c = c;
            let _ =
                std::io::Write::write_all(&mut c, b"{\"error\":\"answered by the impostor\"}\n");
        }
    });
    std::fs::write(
        reg.join("mounts").join(dev.replace(':', "_")),
        evil.as_os_str().as_encoded_bytes(),
    )
    .unwrap();
    let out = std::process::Command::new("timeout")
        .args([
            "-k",
            "5",
            "20",
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .args(["env", "-u", "XDG_RUNTIME_DIR", tierfs_bin(), "stats"])
        .arg(&canon)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&reg);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stats succeeded: {err}");
    assert!(
        !err.contains("impostor"),
        "the impostor's socket was trusted: {err}"
    );
    assert!(err.contains("not trusted"), "{err}");
}
