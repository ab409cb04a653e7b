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
    unsafe { libc::umask(0) };
    let m = BinMount::new(&["writeback.mode=back", "ssd.write_rate=1G", "ram.max=16M"]);
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
