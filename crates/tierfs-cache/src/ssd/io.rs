//! The few system calls the tier needs beyond `std`: O_DIRECT with a buffered fallback,
//! fadvise, statvfs, flock, random bytes.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Opens a segment file read-write, with O_DIRECT if `direct` still holds. A filesystem that
/// refuses O_DIRECT (EINVAL: tmpfs, some FUSE and overlay setups) turns `direct` off for the
/// whole tier, once, with a log line; later writes are then followed by fadvise(DONTNEED) so
/// the cache's own writes do not crowd the page cache.
pub(crate) fn open_segment(path: &Path, create: bool, direct: &AtomicBool) -> io::Result<File> {
    let mut opts = crate::private::options();
    opts.read(true).write(true).create(create);
    if direct.load(Relaxed) {
        match opts
            .clone()
            .custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW)
            .open(path)
        {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if direct.swap(false, Relaxed) {
                    tracing::warn!(
                        "SSD cache: {} does not support O_DIRECT; using buffered I/O with fadvise(DONTNEED)",
                        path.parent().unwrap_or(path).display()
                    );
                }
            }
            r => return r,
        }
    }
    opts.open(path)
}

/// Drops a written range from the page cache (buffered fallback only). Advisory: errors are
/// ignored.
pub(crate) fn drop_cached(file: &File, off: u64, len: u64) {
    // SAFETY: plain syscall on a valid fd.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            off as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

/// (device size, bytes free to unprivileged users) of the filesystem holding `dir`.
pub fn device_space(dir: &Path) -> io::Result<(u64, u64)> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs fills the struct; zeroed is a valid initial value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let f = st.f_frsize as u64;
    Ok((st.f_blocks as u64 * f, st.f_bavail as u64 * f))
}

/// Takes an exclusive flock on `path` (created if missing); None if another holder keeps it.
/// The lock lives as long as the returned file.
///
/// A lock that is still held after `LOCK_SETTLE` counts as busy. Why wait at all: a lock
/// released a moment ago can still be held by a copy of its descriptor in a child that this
/// process is spawning (fork/clone copies the descriptor table; it goes at exec, CLOEXEC or
/// not), so a close-then-reopen in one process can see its own lock for that instant. A
/// mount or fsck that really competes with a running mount waits this long, then is refused.
pub(crate) fn lock_file(path: &Path) -> io::Result<Option<File>> {
    const LOCK_SETTLE: std::time::Duration = std::time::Duration::from_millis(1000);
    let f = crate::private::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let t0 = std::time::Instant::now();
    loop {
        // SAFETY: plain syscall on a valid fd.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(f));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
        if t0.elapsed() >= LOCK_SETTLE {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// 16 random bytes for a store uuid. getrandom(2) should not fail; if it does, time and pid
/// are unique enough for telling two generations of one directory apart.
pub(crate) fn random_uuid() -> [u8; 16] {
    let mut b = [0u8; 16];
    // SAFETY: the buffer is valid for 16 bytes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b[..8].copy_from_slice(&(t as u64).to_le_bytes());
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        let c = crc32c::crc32c(&b[..12]);
        b[12..].copy_from_slice(&c.to_le_bytes());
    }
    b
}

/// fsync of a directory, so a rename or unlink in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `a` then `b` at `off` with one pwritev (a cluster's summary and data area: both
/// page-aligned buffers, so it is one O_DIRECT write). A short write is an error: the caller
/// abandons the segment rather than append after a partial cluster.
pub(crate) fn write_two_at(file: &File, a: &[u8], b: &[u8], off: u64) -> io::Result<()> {
    let iov = [
        libc::iovec {
            iov_base: a.as_ptr() as *mut libc::c_void,
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        },
    ];
    let cnt = if b.is_empty() { 1 } else { 2 };
    loop {
        // SAFETY: both iovecs point into live slices for the duration of the call.
        let n = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), cnt, off as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n as usize != a.len() + b.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
        }
        return Ok(());
    }
}
