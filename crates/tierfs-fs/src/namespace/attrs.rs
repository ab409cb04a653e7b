//! Operations on one object's metadata that are not names: symlink targets (cached in RAM and
//! the SSD tier), extended attributes, statfs and fsyncdir.

use super::Namespace;
use crate::inode::Inode;
use crate::shared::{meta_key, St};
use crate::stats::FsStats;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::KIND_LINK;
use tierfs_store::{Errno, Result, StatFs, Store};

impl<S: Store> Namespace<S> {
    pub fn readlink(&self, ino: u64) -> Result<OsString> {
        let i = self.inode(ino)?;
        if let Some(t) = self.prov.target(i.id()) {
            // Not on the store yet (write-back of namespace operations).
            return Ok(t);
        }
        if let Some((attr, _)) = self.meta.attr(i.id()) {
            if let Some(t) = self.meta.link_target(i.id(), &attr) {
                FsStats::add(&self.sh.stats.meta_hits, 1);
                return Ok(t);
            }
            if let (Some(ssd), true) = (&self.sh.ssd, self.meta.enabled()) {
                let v = crate::meta_codec::version_of(&attr.fingerprint());
                if let Some(t) = ssd.get(&meta_key(KIND_LINK, &attr), v) {
                    use std::os::unix::ffi::OsStringExt;
                    let t = OsString::from_vec(t.to_vec());
                    FsStats::add(&self.sh.stats.meta_ssd_hits, 1);
                    self.meta.put_link_target(&attr, &t);
                    return Ok(t);
                }
            }
        }
        let node = self.node(&i)?;
        // Attributes first, for the same reason as in `list_dir`.
        let attr = self.sh.store.getattr(&node);
        let target = self.sh.store.readlink(&node)?;
        if let Ok(attr) = attr {
            self.meta.put_attr(&attr, Instant::now());
            self.meta.put_link_target(&attr, &target);
            if let (Some(ssd), true) = (&self.sh.ssd, self.meta.enabled()) {
                use std::os::unix::ffi::OsStrExt;
                if !crate::file_state::racy(&attr.fingerprint()) {
                    let v = crate::meta_codec::version_of(&attr.fingerprint());
                    let bytes = bytes::Bytes::copy_from_slice(target.as_bytes());
                    ssd.offer(meta_key(KIND_LINK, &attr), v, bytes);
                }
            }
        }
        Ok(target)
    }

    pub fn fsyncdir(&self, ino: u64, datasync: bool) -> Result<()> {
        let i = self.inode(ino)?;
        self.sh.store.fsyncdir(&self.node(&i)?, datasync)
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let r = self.inode(crate::ROOT_INO)?;
        self.sh.store.statfs(&self.node(&r)?)
    }

    /// `security.capability`, asked by the kernel before every write and chown: the answer
    /// the cache holds within `meta.ttl` (none), like attributes. None for any other name.
    pub(crate) fn caps_cached(&self, ino: u64, name: &OsStr) -> Option<Errno> {
        if self.no_xattrs {
            return Some(Errno(libc::ENOSYS));
        }
        if let Some(e) = unkept_xattr(name) {
            return Some(e);
        }
        if name.as_encoded_bytes() != b"security.capability" {
            return None;
        }
        let i = self.inodes.get(ino)?;
        self.meta.no_caps(i.id()).map(Errno)
    }

    /// ENOSYS for every extended-attribute call on a store without any (sshfs, sftp: its
    /// root answered ENOTSUP at mount): the kernel then answers EOPNOTSUPP itself for the rest
    /// of the mount and asks no more. `ls -l` asks for each file's ACLs (a listxattr), and
    /// each was a store lookup to resolve the file's node, one at a time in a directory over
    /// sshfs: 39 s of a second `ls -l` of 10,000 files.
    fn xattrs(&self) -> Result<()> {
        match self.no_xattrs {
            true => Err(Errno(libc::ENOSYS)),
            false => Ok(()),
        }
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        self.xattrs()?;
        unkept_xattr(name).map_or(Ok(()), Err)?;
        let i = self.inode(ino)?;
        if let Some(e) = self.caps_cached(ino, name) {
            return Err(e);
        }
        if self.meta.xattr_absent(i.id(), name) {
            FsStats::add(&self.sh.stats.meta_hits, 1);
            return Err(Errno::ENODATA);
        }
        let caps = name.as_encoded_bytes() == b"security.capability";
        // Taken before asking: a change of the object meanwhile moves its ctime.
        let before = self.meta.attr(i.id()).map(|(a, _)| a.ctime);
        let r = match self.xattr_by_name(&i, name) {
            Some(r) => r,
            None => self.sh.store.getxattr(&self.node(&i)?, name),
        };
        match r {
            Err(e) if caps && (e == Errno::ENODATA || e == Errno::ENOTSUP) => {
                self.meta.put_no_caps(i.id(), e.0)
            }
            Err(Errno::ENODATA) => {
                if let Some(ctime) = before {
                    self.meta.put_xattr_absent(i.id(), name, ctime);
                }
            }
            _ => {}
        }
        r
    }

    /// `getxattr` of an inode learnt from a listing, through its directory and name, where
    /// the store can (`Store::getxattr_at`): one request, not a lookup for its node first.
    fn xattr_by_name(&self, i: &Arc<Inode<St<S>>>, xname: &OsStr) -> Option<Result<Vec<u8>>> {
        if i.node().is_some() || super::is_provisional(i.id()) {
            return None;
        }
        let (parent, name) = i.origin.lock().clone()?;
        let pnode = parent.node()?;
        self.sh.store.getxattr_at(&pnode, &name, xname)
    }

    /// The store's list (`Fs::listxattr` has looked in the cache first: `listxattr_cached`);
    /// an empty one is kept for the object's ctime.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        self.xattrs()?;
        let i = self.inode(ino)?;
        // Taken before asking: a change of the object meanwhile moves its ctime.
        let before = self.meta.attr(i.id()).map(|(a, _)| a.ctime);
        let list = without_unkept(self.sh.store.listxattr(&self.node(&i)?)?);
        if let (true, Some(ctime)) = (list.is_empty(), before) {
            self.meta.put_lists_no_xattrs(i.id(), ctime);
        }
        Ok(list)
    }

    /// `listxattr` when the cache knows the object has none (see `lists_no_xattrs`), for
    /// the FUSE thread; None: ask the store.
    pub(crate) fn listxattr_cached(&self, ino: u64) -> Option<Vec<u8>> {
        let i = self.inodes.get(ino)?;
        self.meta.lists_no_xattrs(i.id()).then(|| {
            FsStats::add(&self.sh.stats.meta_hits, 1);
            Vec::new()
        })
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.xattrs()?;
        unkept_xattr(name).map_or(Ok(()), Err)?;
        let i = self.inode(ino)?;
        self.sh
            .store
            .setxattr(&self.node(&i)?, name, value, flags)?;
        self.after_xattr_change(&i);
        Ok(())
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<()> {
        self.xattrs()?;
        unkept_xattr(name).map_or(Ok(()), Err)?;
        let i = self.inode(ino)?;
        self.sh.store.removexattr(&self.node(&i)?, name)?;
        self.after_xattr_change(&i);
        Ok(())
    }

    pub(crate) fn after_xattr_change(&self, i: &Arc<Inode<St<S>>>) {
        self.meta.drop_attr(i.id());
        self.meta.drop_no_caps(i.id());
        let Ok(node) = self.node(i) else { return };
        if let (Some(st), Ok(attr)) = (&i.file, self.sh.store.getattr(&node)) {
            self.meta.put_attr(&attr, Instant::now());
            st.observe_own_metadata_change(&attr);
        }
    }
}

/// Extended attributes this mount does not keep, whatever the store holds: EOPNOTSUPP, as a
/// filesystem without them answers. POSIX ACLs (`system.posix_acl_*`) are not enforced here
/// (FUSE_POSIX_ACL is not negotiated: the kernel checks the mode bits alone), so passing them
/// through would show a protection that does not hold. `security.selinux` reaches a FUSE
/// filesystem only when no security module labels its files (one that does answers it in
/// the kernel), and then labels are inert. `ls -l` asks both of every file it lists and
/// stops asking for the rest of the filesystem at the first EOPNOTSUPP: with ENODATA from the
/// store it made two FUSE round trips per entry, 0.82-0.96 s for 10,000 files over a local
/// directory that `ls -l` lists in 0.10-0.12 s alone.
pub(crate) fn unkept_xattr(name: &OsStr) -> Option<Errno> {
    match name.as_encoded_bytes() {
        b"system.posix_acl_access" | b"system.posix_acl_default" | b"security.selinux" => {
            Some(Errno(libc::EOPNOTSUPP))
        }
        _ => None,
    }
}

/// A listxattr answer (names, each NUL-terminated) without the names [`unkept_xattr`] refuses.
fn without_unkept(list: Vec<u8>) -> Vec<u8> {
    let kept = |n: &&[u8]| unkept_xattr(OsStr::from_bytes(n)).is_none();
    if list.split(|b| *b == 0).all(|n| n.is_empty() || kept(&n)) {
        return list;
    }
    let mut out = Vec::with_capacity(list.len());
    for n in list
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .filter(kept)
    {
        out.extend_from_slice(n);
        out.push(0);
    }
    out
}
