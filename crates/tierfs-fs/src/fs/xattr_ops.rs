//! The operations of [`Fs`] on extended attributes: answered without the store where it can
//! (a store without any, an object not on the store yet, a cached absence), else by the
//! namespace.

use super::Fs;
use crate::namespace::unkept_xattr;
use std::ffi::OsStr;
use tierfs_store::{Errno, Result, Store};

impl<S: Store> Fs<S> {
    /// [`Fs::getxattr`] when it needs no store request: an object not on the store yet has
    /// none, and the kernel's `security.capability` before each write or chown is cached
    /// (`meta.ttl`). None: ask the store.
    pub fn getxattr_fast(&self, ino: u64, name: &OsStr) -> Option<Errno> {
        self.ns
            .caps_cached(ino, name)
            .or_else(|| self.xattr_provisional(ino))
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        if let Some(e) = self.getxattr_fast(ino, name) {
            return Err(e);
        }
        self.ns.getxattr(ino, name)
    }

    /// [`Fs::listxattr`] when it needs no store request: a store without any, an object not
    /// on the store yet, one the store listed none for and whose ctime has not moved since.
    pub fn listxattr_fast(&self, ino: u64) -> Option<Result<Vec<u8>>> {
        if self.ns.no_xattrs {
            return Some(Err(Errno(libc::ENOSYS)));
        }
        if self.xattr_provisional(ino).is_some() {
            return Some(Ok(Vec::new()));
        }
        self.ns.listxattr_cached(ino).map(Ok)
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        if let Some(r) = self.listxattr_fast(ino) {
            return r;
        }
        self.ns.listxattr(ino)
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        if self.ns.no_xattrs {
            return Err(Errno(libc::ENOSYS));
        }
        if let Some(e) = unkept_xattr(name) {
            return Err(e); // before waiting for the journal: nothing to apply
        }
        self.drain_ns()?;
        let r = self.ns.setxattr(ino, name, value, flags);
        self.names_changed(ino); // its ctime
        r
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<()> {
        if self.ns.no_xattrs {
            return Err(Errno(libc::ENOSYS));
        }
        if let Some(e) = unkept_xattr(name) {
            return Err(e); // before waiting for the journal: nothing to apply
        }
        self.drain_ns()?;
        let r = self.ns.removexattr(ino, name);
        self.names_changed(ino);
        r
    }
}
