//! The largest file a POSIX store takes, learnt once at mount, so that write-back answers
//! EFBIG at the write or truncate past it, as the store's own filesystem would, instead of
//! acknowledging it and failing when it is flushed (pjdfstest's `truncate(f,
//! 999999999999999)` on ext4, whose limit is 16 TiB, was acknowledged, then refused for
//! ever by every flush).
//!
//! Asked of the filesystem itself: an unnamed file (O_TMPFILE, gone at close, never seen
//! by anyone) is truncated to sizes bisecting the limit: sparse, so nothing is written. A
//! store without O_TMPFILE (NFS, FUSE mounts such as sshfs) says what it can through
//! `_PC_FILESIZEBITS`; else no limit is assumed and the store's answer at flush stands.

use std::os::fd::RawFd;

/// The largest size a file of the store at directory `dir` may have, and how it was learnt.
pub(crate) fn probe(dir: RawFd) -> (u64, &'static str) {
    match by_truncate(dir) {
        Some(max) => (max, "truncating an unnamed file"),
        None => match by_pathconf(dir) {
            Some(max) => (max, "_PC_FILESIZEBITS"),
            None => (u64::MAX, "unknown (the store answers)"),
        },
    }
}

fn by_truncate(dir: RawFd) -> Option<u64> {
    // Past RLIMIT_FSIZE (`ulimit -f`) a truncate raises SIGXFSZ, whose default kills the
    // process: ignored, it is EFBIG (as it is for the daemon's writes later: a store's file
    // grown past the limit is an error to report, not a reason to die).
    // SAFETY: setting a signal's disposition to SIG_IGN.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // SAFETY: a valid directory descriptor and a NUL-terminated path.
    let fd = unsafe {
        libc::openat(
            dir,
            c".".as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is ours, closed below.
    let fits = |size: u64| unsafe { libc::ftruncate(fd, size as libc::off_t) } == 0;
    let top = i64::MAX as u64;
    let max = if fits(top) {
        Some(top)
    } else if !fits(1 << 20) {
        // Refused even a small size (a quota, a read-only store): it tells nothing.
        None
    } else {
        // fits(lo), !fits(hi)
        let (mut lo, mut hi) = (1u64 << 20, top);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    };
    // SAFETY: as above.
    unsafe {
        libc::ftruncate(fd, 0);
        libc::close(fd);
    }
    max
}

fn by_pathconf(dir: RawFd) -> Option<u64> {
    // SAFETY: a valid descriptor.
    let bits = unsafe { libc::fpathconf(dir, libc::_PC_FILESIZEBITS) };
    (1..64).contains(&bits).then(|| (1u64 << (bits - 1)) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn the_probe_finds_a_limit_the_filesystem_keeps() {
        let d = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(d.path()).unwrap();
        let (max, how) = probe(dir.as_raw_fd());
        assert!(max >= 1 << 40, "{max} by {how}");
        if max < u64::MAX {
            // One byte more is refused, the limit itself taken.
            let f = tempfile::tempfile_in(d.path()).unwrap();
            assert!(f.set_len(max).is_ok(), "{max} by {how}");
            if max < i64::MAX as u64 {
                assert!(f.set_len(max + 1).is_err(), "{max} by {how}");
            }
        }
    }
}
