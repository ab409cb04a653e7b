//! The few system calls the journal makes beyond `std::fs`: fdatasync, fallocate, positioned
//! reads and writes; the directory fsync and the random uuid are the SSD tier's (`ssd::io`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

/// fdatasync: the data and the metadata needed to read it back (size, extents), not mtime.
pub(crate) fn fdatasync(f: &File) -> io::Result<()> {
    loop {
        // SAFETY: the descriptor is owned by `f` and open.
        if unsafe { libc::fdatasync(f.as_raw_fd()) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Starts writeback of `[off, off + len)` without waiting for it (sync_file_range WRITE), so
/// that the range is clean by the time it is dropped from the page cache (`drop_cached`).
/// Durability still comes from fdatasync alone: this only moves the disk writes earlier.
pub(crate) fn start_writeback(f: &File, off: u64, len: u64) {
    // SAFETY: the descriptor is owned by `f` and open. Advisory: an error changes nothing.
    unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            off as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// Drops the clean cached pages of `[off, off + len)` (len 0: to the end of the file); pages
/// still dirty or under writeback stay. The journal is only read back at replay.
pub(crate) fn drop_cached(f: &File, off: u64, len: u64) {
    // SAFETY: the descriptor is owned by `f` and open. Advisory: an error changes nothing.
    unsafe {
        libc::posix_fadvise(
            f.as_raw_fd(),
            off as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

/// Reserves `len` bytes, so appends do not allocate blocks one at a time and a full device is
/// found when a segment is created rather than in the middle of a batch. Filesystems without
/// fallocate get a plain file that grows as it is written.
pub(crate) fn preallocate(f: &File, len: u64) -> io::Result<()> {
    // SAFETY: the descriptor is owned by `f` and open.
    let r = unsafe { libc::fallocate64(f.as_raw_fd(), 0, 0, len as libc::off64_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(()),
        _ => Err(e),
    }
}

/// One positioned write of the whole buffer (looping only on a short write).
pub(crate) fn write_all_at(f: &File, buf: &[u8], off: u64) -> io::Result<()> {
    f.write_all_at(buf, off)
}

/// Writes the concatenation of `parts` at `off` with as few pwritev calls as the iovec limit
/// allows, continuing after a short write. The journal's DATA payloads are the callers' own
/// buffers, written from where they are instead of being copied into the batch first.
pub(crate) fn write_parts_at(f: &File, parts: &[&[u8]], mut off: u64) -> io::Result<()> {
    const IOV_MAX: usize = 1024;
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    let mut first = 0;
    while first < iov.len() {
        let cnt = (iov.len() - first).min(IOV_MAX);
        // SAFETY: every iovec points into a slice of `parts`, alive for the whole call; the
        // descriptor is owned by `f`.
        let n = unsafe {
            libc::pwritev(
                f.as_raw_fd(),
                iov[first..].as_ptr(),
                cnt as libc::c_int,
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        off += n as u64;
        let mut left = n as usize;
        while left > 0 {
            let v = &mut iov[first];
            if left >= v.iov_len {
                left -= v.iov_len;
                first += 1;
            } else {
                // SAFETY: advancing within the same slice, by less than its length.
                v.iov_base = unsafe { (v.iov_base as *mut u8).add(left) } as *mut libc::c_void;
                v.iov_len -= left;
                left = 0;
            }
        }
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes at `off`; fewer only at end of file.
pub(crate) fn read_at_most(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

// A directory fsync and a random uuid: the SSD tier's.
pub(crate) use crate::ssd::io::{random_uuid, sync_dir};
