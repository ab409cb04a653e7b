//! What [`crate::PosixStore`] changes and reads of an object itself: setattr (through the
//! open handle where there is one, else the node's `/proc/self/fd/N` entry, or the symlink's
//! own descriptor), readlink, and extended attributes. Free functions on nodes and handles,
//! apart from the store itself (`posix`), whose `Store` impl hands these calls here.

use crate::posix_sys::*;
use crate::{Attr, Errno, Result, SetAttr};
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

pub(crate) fn setattr(
    node: &PosixNode,
    handle: Option<&PosixHandle>,
    set: &SetAttr,
) -> Result<Attr> {
    // Only chmod and utimens care whether it is a symlink; the kind is known from the
    // lookup as a rule, so no fstat is spent here (tar sets three attributes per file).
    let is_link = if set.mode.is_some() || set.atime.is_some() || set.mtime.is_some() {
        node.is_symlink()?
    } else {
        false
    };
    if let Some(mode) = set.mode {
        if is_link {
            return Err(Errno::ENOTSUP);
        }
        let mode = mode & 0o7777;
        match handle {
            Some(h) => cvt(unsafe { libc::fchmod(h.file.as_raw_fd(), mode) })?,
            None => cvt(unsafe { libc::chmod(node.proc_path().as_ptr(), mode) })?,
        };
    }
    if set.uid.is_some() || set.gid.is_some() {
        fchown_node(
            node,
            set.uid.unwrap_or(u32::MAX),
            set.gid.unwrap_or(u32::MAX),
        )?;
    }
    if let Some(size) = set.size {
        match handle {
            Some(h) => cvt(unsafe { libc::ftruncate(h.file.as_raw_fd(), size as i64) })?,
            None => cvt(unsafe { libc::truncate(node.proc_path().as_ptr(), size as i64) })?,
        };
    }
    if set.atime.is_some() || set.mtime.is_some() {
        let times = [timespec(set.atime), timespec(set.mtime)];
        if is_link {
            let empty = c"";
            cvt(unsafe {
                libc::utimensat(
                    node.fd(),
                    empty.as_ptr(),
                    times.as_ptr(),
                    libc::AT_EMPTY_PATH,
                )
            })?;
        } else if let Some(h) = handle {
            cvt(unsafe { libc::futimens(h.file.as_raw_fd(), times.as_ptr()) })?;
        } else {
            cvt(unsafe {
                libc::utimensat(libc::AT_FDCWD, node.proc_path().as_ptr(), times.as_ptr(), 0)
            })?;
        }
    }
    node.stat()
}

pub(crate) fn readlink(node: &PosixNode) -> Result<OsString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    let empty = c"";
    let n = unsafe {
        libc::readlinkat(
            node.fd(),
            empty.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(Errno::last());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

pub(crate) fn getxattr(node: &PosixNode, name: &OsStr) -> Result<Vec<u8>> {
    get_xattr(&xattr_path(node)?, name, false)
}

/// Through the directory's descriptor and one name component (`lgetxattr` of
/// `/proc/self/fd/N/NAME`): the name cannot lead out of the store, and a symlink's own
/// attributes are read, never its target's.
pub(crate) fn getxattr_at(
    parent: &PosixNode,
    name: &OsStr,
    xname: &OsStr,
) -> Option<Result<Vec<u8>>> {
    let c = match component(name) {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    let mut p = parent.proc_path().into_bytes();
    p.push(b'/');
    p.extend_from_slice(c.as_bytes());
    Some(match CString::new(p) {
        Ok(p) => get_xattr(&p, xname, true),
        Err(_) => Err(Errno::EINVAL),
    })
}

pub(crate) fn setxattr(node: &PosixNode, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
    let n = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    let p = xattr_path(node)?;
    cvt(unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })?;
    Ok(())
}

pub(crate) fn listxattr(node: &PosixNode) -> Result<Vec<u8>> {
    let p = match xattr_path(node) {
        Ok(p) => p,
        Err(_) => return Ok(Vec::new()),
    };
    loop {
        let size = unsafe { libc::listxattr(p.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(Errno::last());
        }
        let mut buf = vec![0u8; size as usize];
        let got = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            let e = Errno::last();
            if e == Errno::ERANGE {
                continue;
            }
            return Err(e);
        }
        buf.truncate(got as usize);
        return Ok(buf);
    }
}

pub(crate) fn removexattr(node: &PosixNode, name: &OsStr) -> Result<()> {
    let n = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    let p = xattr_path(node)?;
    cvt(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })?;
    Ok(())
}

/// Extended attributes are reached through /proc (Linux has no f*xattr on O_PATH descriptors).
/// The /proc link of a symlink node would name the link itself; Linux allows no user xattrs
/// on symlinks anyway, so they are reported as having none.
/// getxattr(2) (lgetxattr with `nofollow`) of `name` on `path`, into a buffer of its size.
fn get_xattr(path: &CString, name: &OsStr, nofollow: bool) -> Result<Vec<u8>> {
    let n = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    let call = |buf: *mut libc::c_void, len: usize| unsafe {
        match nofollow {
            true => libc::lgetxattr(path.as_ptr(), n.as_ptr(), buf, len),
            false => libc::getxattr(path.as_ptr(), n.as_ptr(), buf, len),
        }
    };
    loop {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(Errno::last());
        }
        let mut buf = vec![0u8; size as usize];
        let got = call(buf.as_mut_ptr().cast(), buf.len());
        if got < 0 {
            let e = Errno::last();
            if e == Errno::ERANGE {
                continue; // grew in between
            }
            return Err(e);
        }
        buf.truncate(got as usize);
        return Ok(buf);
    }
}

fn xattr_path(node: &PosixNode) -> Result<CString> {
    // The kind as known from the lookup: the kernel asks for `security.capability` before
    // every write by root, and an fstat for each ask was a store round trip per write.
    if node.is_symlink()? {
        return Err(Errno::ENODATA);
    }
    Ok(node.proc_path())
}
