//! What `tierfs mount` checks of its paths and options before it detaches, so that bad input
//! gets one clear line on stderr: the mountpoint free, no layout in which tierfs would reach
//! its own mount, a cache dir that is tierfs's alone, created, trusted, writable and locked
//! for this mount, and the SSD tier's segment size.

use crate::config::Config;
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Default cache directory: /var/cache/tierfs/<store id> as root, else under
/// $XDG_CACHE_HOME (or ~/.cache).
pub(crate) fn default_cache_dir(store_id: &str) -> PathBuf {
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/cache/tierfs").join(store_id);
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into())).join(".cache")
        }
    };
    base.join("tierfs").join(store_id)
}

pub(crate) fn is_mount_point(path: &Path) -> Result<bool> {
    Ok(tierfs_fuse::find_mount(path)?.is_some())
}

/// `path` made absolute with every symlink resolved, as far as it exists: the rest (a cache
/// dir not created yet) is appended as given.
fn resolved(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut p = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    loop {
        if let Ok(c) = p.canonicalize() {
            return rest.iter().rev().fold(c, |acc: PathBuf, n| acc.join(n));
        }
        match (p.file_name().map(|n| n.to_owned()), p.parent()) {
            (Some(n), Some(parent)) => {
                rest.push(n);
                p = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Refuses layouts in which tierfs would reach its own mount: a mountpoint inside the backing
/// directory (the store would show the mount inside itself, and a lookup there waits on the
/// very threads serving it: every I/O thread deadlocked), a cache dir inside the mountpoint
/// (the cache would live in the filesystem it caches; the mount never came up) or inside the
/// backing directory (the cache would be shown, and warmed, as part of the store). A mountpoint
/// equal to the backing directory is fine: the store is opened before the mount covers it.
pub(crate) fn check_nesting(backing: &Path, mountpoint: &Path, cache_dir: &Path) -> Result<()> {
    let (b, m, c) = (resolved(backing), resolved(mountpoint), resolved(cache_dir));
    if m != b && m.starts_with(&b) {
        bail!(
            "mountpoint {} is inside the backing directory {}: tierfs would serve its own mount; choose a mountpoint outside it",
            m.display(),
            b.display()
        );
    }
    if c.starts_with(&m) {
        bail!(
            "cache dir {} is inside the mountpoint {}: choose a cache dir outside the mount",
            c.display(),
            m.display()
        );
    }
    if c.starts_with(&b) {
        bail!(
            "cache dir {} is inside the backing directory {}: it would be cached as part of the store; choose a cache dir outside it",
            c.display(),
            b.display()
        );
    }
    Ok(())
}

/// Names a tierfs cache dir holds from its first mount on (`lock` at least).
const CACHE_DIR_MARKS: [&str; 4] = ["lock", "ssd", "journal", "tierfs.log"];

/// The cache dir must be tierfs's alone: a regular file, or an existing directory with
/// other things in it and nothing of a cache dir (a typo naming a home or a data tree), is
/// refused before anything is written there or its mode tightened.
fn check_cache_dir_is_ours(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => bail!("cache dir {} is a file, not a directory", dir.display()),
        Ok(_) => {}
        // Missing (made next), or unreachable: creating it says why.
        Err(_) => return Ok(()),
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut other = None;
    for e in entries.flatten() {
        let name = e.file_name();
        if CACHE_DIR_MARKS.iter().any(|m| name == *m) {
            return Ok(());
        }
        other.get_or_insert(name);
    }
    match other {
        None => Ok(()),
        Some(name) => bail!(
            "cache dir {} is not empty and is no tierfs cache dir (it holds {:?}, and no `lock` or `ssd`): give a new or empty directory",
            dir.display(),
            name
        ),
    }
}

/// Creates the cache dir, checks it is writable, and locks it for this mount.
pub(crate) fn prepare_cache_dir(dir: &Path) -> Result<File> {
    check_cache_dir_is_ours(dir)?;
    tierfs_cache::private::create(dir).with_context(|| format!("cache dir {}", dir.display()))?;
    // Before anything is written or tightened there: a cache dir another user controls
    // could redirect what the (root) daemon writes, or read what it caches.
    tierfs_cache::private::trusted(dir)
        .map_err(|e| anyhow::anyhow!("cache dir {}: {e}", dir.display()))?;
    // 0700, and its files 0600 (an older tierfs made its log 0666 under umask 0).
    tierfs_cache::private::tighten(dir).with_context(|| format!("cache dir {}", dir.display()))?;
    let lock_path = dir.join("lock");
    let lock = tierfs_cache::private::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cache dir {}", dir.display()))?;
    // The daemon of a mount just unmounted from here may still be exiting (umount(8) returns
    // before it does): `umount X && mount X` must not fail, so wait a little for its lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if std::time::Instant::now() >= deadline {
            bail!(
                "cache dir {} is in use by another tierfs mount",
                dir.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // flock may succeed on a read-only filesystem: prove we can write.
    let probe = dir.join(".write-probe");
    match tierfs_cache::private::write(&probe, b"x") {
        Ok(()) => {}
        // Writable but full: a mount must still come up (replay its journal, serve what is
        // cached); the SSD tier gives back room and the journal waits for it.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
            tracing::warn!(
                "cache dir {}: the device is full ({e}); the SSD tier will give back room, and write-back writes fail with ENOSPC until there is some",
                dir.display()
            );
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cache dir {} is not writable", dir.display()))
        }
    }
    let _ = std::fs::remove_file(probe);
    Ok(lock)
}

pub(crate) fn config_segment_too_small(c: &Config) -> bool {
    c.ssd.segment_size != 0 && c.ssd.segment_size < 2 * c.ssd.cluster_size
}
