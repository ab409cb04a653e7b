//! Operations on one object's metadata that are not names: symlink targets (cached in RAM and
//! the SSD tier), extended attributes, statfs and fsyncdir.

use super::Namespace;
use crate::inode::Inode;
use crate::shared::{meta_key, St};
use crate::stats::FsStats;
use std::ffi::{OsStr, OsString};
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
        if name.as_encoded_bytes() != b"security.capability" {
            return None;
        }
        let i = self.inodes.get(ino)?;
        self.meta.no_caps(i.id()).map(Errno)
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        if let Some(e) = self.caps_cached(ino, name) {
            return Err(e);
        }
        let caps = name.as_encoded_bytes() == b"security.capability";
        let r = self.sh.store.getxattr(&self.node(&i)?, name);
        match r {
            Err(e) if caps && (e == Errno::ENODATA || e == Errno::ENOTSUP) => {
                self.meta.put_no_caps(i.id(), e.0)
            }
            _ => {}
        }
        r
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        self.sh.store.listxattr(&self.node(&i)?)
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        let i = self.inode(ino)?;
        self.sh
            .store
            .setxattr(&self.node(&i)?, name, value, flags)?;
        self.after_xattr_change(&i);
        Ok(())
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<()> {
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
