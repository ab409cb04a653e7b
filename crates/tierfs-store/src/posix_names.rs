//! The namespace calls of [`crate::PosixStore`] that change a directory: mknod, mkdir,
//! symlink and link (each object made is chowned, and taken back if that fails: see
//! `posix_sys::undo_on_error`), unlink, rmdir and rename, each through the parent's
//! descriptor and a single name component. Free functions on nodes, apart from the store
//! itself (`posix`), whose `Store` impl hands these calls here.

use crate::posix_sys::*;
use crate::{Attr, Errno, Owner, Result};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;

pub(crate) fn mknod(
    parent: &PosixNode,
    name: &OsStr,
    mode: u32,
    rdev: u64,
    owner: Owner,
) -> Result<(PosixNode, Attr)> {
    let c = component(name)?;
    cvt(unsafe { libc::mknodat(parent.fd(), c.as_ptr(), mode, rdev) })?;
    undo_on_error(parent, &c, false, || {
        let node = open_path_at(parent.fd(), &c)?;
        chown_node(parent, &node, owner)?;
        let attr = node.stat()?;
        Ok((node, attr))
    })
}

pub(crate) fn mkdir(
    parent: &PosixNode,
    name: &OsStr,
    mode: u32,
    owner: Owner,
) -> Result<(PosixNode, Attr)> {
    let c = component(name)?;
    cvt(unsafe { libc::mkdirat(parent.fd(), c.as_ptr(), mode) })?;
    undo_on_error(parent, &c, true, || {
        let node = open_path_at(parent.fd(), &c)?;
        chown_node(parent, &node, owner)?;
        let attr = node.stat()?;
        Ok((node, attr))
    })
}

pub(crate) fn symlink(
    parent: &PosixNode,
    name: &OsStr,
    target: &OsStr,
    owner: Owner,
) -> Result<(PosixNode, Attr)> {
    let c = component(name)?;
    // The target is stored as text and never resolved by tierfs.
    let t = CString::new(target.as_bytes()).map_err(|_| Errno::EINVAL)?;
    cvt(unsafe { libc::symlinkat(t.as_ptr(), parent.fd(), c.as_ptr()) })?;
    undo_on_error(parent, &c, false, || {
        let node = open_path_at(parent.fd(), &c)?;
        chown_node(parent, &node, owner)?;
        let attr = node.stat()?;
        Ok((node, attr))
    })
}

pub(crate) fn link(node: &PosixNode, newparent: &PosixNode, newname: &OsStr) -> Result<Attr> {
    let c = component(newname)?;
    let empty = c"";
    let r = unsafe {
        libc::linkat(
            node.fd(),
            empty.as_ptr(),
            newparent.fd(),
            c.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if r < 0 {
        let e = Errno::last();
        // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; without it, link through /proc.
        if e.0 != libc::ENOENT && e.0 != libc::EPERM {
            return Err(e);
        }
        cvt(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                node.proc_path().as_ptr(),
                newparent.fd(),
                c.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })?;
    }
    // The attributes by the new name: a network client answers them from the entry its
    // LINK reply gave it, where an fstat of the old node asks the server again (the link
    // dropped the node's cached attributes): one round trip per loose object of `git
    // add` over sshfs. The old node's fstat only if the name cannot be stat'ed.
    stat_at(newparent.fd(), &c).or_else(|_| node.stat())
}

pub(crate) fn unlink(parent: &PosixNode, name: &OsStr) -> Result<()> {
    let c = component(name)?;
    cvt(unsafe { libc::unlinkat(parent.fd(), c.as_ptr(), 0) })?;
    Ok(())
}

pub(crate) fn rmdir(parent: &PosixNode, name: &OsStr) -> Result<()> {
    let c = component(name)?;
    cvt(unsafe { libc::unlinkat(parent.fd(), c.as_ptr(), libc::AT_REMOVEDIR) })?;
    Ok(())
}

pub(crate) fn rename(
    parent: &PosixNode,
    name: &OsStr,
    newparent: &PosixNode,
    newname: &OsStr,
    flags: u32,
) -> Result<()> {
    let a = component(name)?;
    let b = component(newname)?;
    cvt(unsafe { libc::renameat2(parent.fd(), a.as_ptr(), newparent.fd(), b.as_ptr(), flags) })?;
    Ok(())
}
