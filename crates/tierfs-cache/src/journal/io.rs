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
