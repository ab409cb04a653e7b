//! A version of a file's contents: its fingerprint (size, mtime, ctime from the store) and the
//! generation number that names its cached blocks, and when a version is too young to cache.

use std::time::Duration;
use tierfs_store::Fingerprint;

/// How long after its last change (ctime) a file's contents are "racy": not trusted to match
/// its fingerprint. A write(2) moves mtime/ctime when it *starts* copying, so a fetch that
/// overlaps a write made behind our back sees a fingerprint that never moves again once the
/// write finishes: caching those blocks (or letting the kernel keep its pages) would serve a
/// mix of old and new data for as long as the file stays unchanged. Likewise, stores with
/// coarse timestamps (down to 1 s) give two changes in one tick the same fingerprint. So blocks
/// read while the file is racy are served but not cached (git's "racily clean" rule). The
/// window covers 1 s timestamp granularity and the length of any sane single write.
pub const RACY_WINDOW: Duration = Duration::from_secs(1);

/// Whether a version with this fingerprint is too young to cache (see [`RACY_WINDOW`]).
/// Compares the store's ctime with the local clock: a ctime further in the future than the
/// window is taken as clock skew (an NFS server ahead of us), not as racy.
pub fn racy(fp: &Fingerprint) -> bool {
    if unverified(fp) {
        return true;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    (now - fp.ctime_ns as i128).unsigned_abs() < RACY_WINDOW.as_nanos()
}

/// The ctime of a provisional fingerprint, which a write-through write leaves until the store
/// is next asked (see `FileState::wrote`): no store gives it, so no SSD-tier entry and no
/// fingerprint the kernel was shown can match one.
const UNVERIFIED_CTIME: i64 = i64::MIN;

/// The fingerprint our own write leaves before the store has told us its new times: the size
/// the write made, the old mtime.
pub fn provisional(old: &Fingerprint, size: u64) -> Fingerprint {
    Fingerprint {
        size,
        mtime_ns: old.mtime_ns,
        ctime_ns: UNVERIFIED_CTIME,
    }
}

/// Whether `fp` is [`provisional`]. Such a version is also [`racy`]: not cached in the SSD
/// tier, no read-ahead, the kernel does not keep its pages across an open.
pub fn unverified(fp: &Fingerprint) -> bool {
    fp.ctime_ns == UNVERIFIED_CTIME
}

#[derive(Clone, Copy, Debug)]
pub struct Version {
    pub fp: Fingerprint,
    /// Names the cached blocks of this version (see `tierfs_cache::BlockKey`).
    pub gen: u64,
}
