//! The data calls of [`crate::PosixStore`], on a [`PosixHandle`]: opening a node and
//! creating a file, positioned reads and writes (an O_APPEND write says where its data
//! landed; `pwritev` is resumed after a short write), fsync, fallocate, copy_file_range and
//! lseek. Free functions on nodes and handles, apart from the store itself (`posix`), whose
//! `Store` impl hands these calls here.

use crate::posix_sys::*;
use crate::{Attr, Errno, Owner, Result};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

pub(crate) fn open(node: &PosixNode, flags: i32) -> Result<PosixHandle> {
    // The cache serves O_DIRECT callers; the backing file is read through normally.
    // O_NOFOLLOW would refuse the /proc magic link; the node is never a symlink here.
    let flags = flags
        & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NOFOLLOW | libc::O_DIRECT);
    let attr = node.stat()?;
    match attr.kind {
        crate::FileKind::File => {}
        crate::FileKind::Dir => return Err(Errno::EISDIR),
        crate::FileKind::Symlink => return Err(Errno::ELOOP),
        _ => return Err(Errno(libc::ENXIO)),
    }
    let fd = cvt(unsafe { libc::open(node.proc_path().as_ptr(), flags | libc::O_CLOEXEC) })?;
    Ok(PosixHandle {
        file: unsafe { File::from_raw_fd(fd) },
        append: flags & libc::O_APPEND != 0,
    })
}

pub(crate) fn create(
    parent: &PosixNode,
    name: &OsStr,
    mode: u32,
    flags: i32,
    owner: Owner,
) -> Result<(PosixNode, Attr, PosixHandle)> {
    let c = component(name)?;
    let flags = (flags & !(libc::O_NOCTTY | libc::O_DIRECT))
        | libc::O_CREAT
        | libc::O_NOFOLLOW
        | libc::O_CLOEXEC;
    let fd = cvt(unsafe { libc::openat(parent.fd(), c.as_ptr(), flags, mode) })?;
    let file = unsafe { File::from_raw_fd(fd) };
    let finish = || {
        // The node is taken from the open file itself, so it is the very inode we created.
        let node = PosixNode::of_file(&file)?;
        chown_node(parent, &node, owner)?;
        let attr = node.stat()?;
        Ok((node, attr))
    };
    // Only an exclusive create knows the file is its own to take back.
    let (node, attr) = if flags & libc::O_EXCL != 0 {
        undo_on_error(parent, &c, false, finish)?
    } else {
        finish()?
    };
    Ok((
        node,
        attr,
        PosixHandle {
            file,
            append: flags & libc::O_APPEND != 0,
        },
    ))
}

pub(crate) fn read(handle: &PosixHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match handle.file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

pub(crate) fn write(handle: &PosixHandle, offset: u64, data: &[u8]) -> Result<u64> {
    if handle.append {
        // pwrite on an O_APPEND descriptor appends whatever the offset; report where.
        let mut done = 0;
        let mut start = None;
        while done < data.len() {
            let n = cvt(unsafe {
                libc::write(
                    handle.file.as_raw_fd(),
                    data[done..].as_ptr().cast(),
                    data.len() - done,
                ) as libc::c_int
            })? as usize;
            if start.is_none() {
                let end = unsafe { libc::lseek(handle.file.as_raw_fd(), 0, libc::SEEK_CUR) };
                start = Some(if end >= 0 {
                    end as u64 - n as u64
                } else {
                    offset
                });
            }
            done += n;
        }
        return Ok(start.unwrap_or(offset));
    }
    let mut done = 0;
    while done < data.len() {
        match handle.file.write_at(&data[done..], offset + done as u64) {
            Ok(0) => return Err(Errno::EIO),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(offset)
}

pub(crate) fn write_vectored(handle: &PosixHandle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
    if handle.append {
        let mut at = offset;
        for b in bufs {
            write(handle, at, b)?;
            at += b.len() as u64;
        }
        return Ok(());
    }
    // pwritev, resumed after a short write: `skip` bytes of the list are done.
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut skip = 0usize;
    while skip < total {
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(bufs.len().min(1024));
        let mut pos = 0usize;
        for b in bufs {
            let end = pos + b.len();
            if end > skip && iov.len() < 1024 {
                let from = skip.saturating_sub(pos);
                iov.push(libc::iovec {
                    iov_base: b[from..].as_ptr() as *mut libc::c_void,
                    iov_len: b.len() - from,
                });
            }
            pos = end;
        }
        let n = unsafe {
            libc::pwritev(
                handle.file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                (offset + skip as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e.into());
        }
        if n == 0 {
            return Err(Errno::EIO);
        }
        skip += n as usize;
    }
    Ok(())
}

pub(crate) fn fsync(handle: &PosixHandle, datasync: bool) -> Result<()> {
    let fd = handle.file.as_raw_fd();
    cvt(unsafe {
        if datasync {
            libc::fdatasync(fd)
        } else {
            libc::fsync(fd)
        }
    })?;
    Ok(())
}

pub(crate) fn fsyncdir(node: &PosixNode, datasync: bool) -> Result<()> {
    let fd = open_dir(node)?;
    let f = unsafe { File::from_raw_fd(fd) };
    cvt(unsafe {
        if datasync {
            libc::fdatasync(f.as_raw_fd())
        } else {
            libc::fsync(f.as_raw_fd())
        }
    })?;
    Ok(())
}

pub(crate) fn fallocate(handle: &PosixHandle, mode: i32, offset: u64, len: u64) -> Result<()> {
    cvt(unsafe { libc::fallocate64(handle.file.as_raw_fd(), mode, offset as i64, len as i64) })?;
    Ok(())
}

pub(crate) fn copy_range(
    from: &PosixHandle,
    off_in: u64,
    to: &PosixHandle,
    off_out: u64,
    len: u64,
) -> Result<u64> {
    let (mut i, mut o) = (off_in as i64, off_out as i64);
    let n = unsafe {
        libc::copy_file_range(
            from.file.as_raw_fd(),
            &mut i,
            to.file.as_raw_fd(),
            &mut o,
            len as usize,
            0,
        )
    };
    if n < 0 {
        return Err(match Errno::last() {
            // The backing filesystems cannot copy between these files: say so as "not
            // here", so the kernel copies through reads and writes.
            e if e == Errno(libc::EXDEV) || e == Errno(libc::EOPNOTSUPP) => Errno(libc::ENOSYS),
            e => e,
        });
    }
    Ok(n as u64)
}

pub(crate) fn lseek(handle: &PosixHandle, offset: i64, whence: i32) -> Result<i64> {
    let r = unsafe { libc::lseek64(handle.file.as_raw_fd(), offset, whence) };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(r)
}
