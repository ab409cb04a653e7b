//! Extended attributes in the metadata cache: the ones objects lack, as the store said.
//! The kernel asks for `security.capability` before every write and chown, and `ls -l` for
//! every file's ACL: a store round trip each, answered here instead.

use super::{Ident, MetaCache};
use std::ffi::OsStr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

impl MetaCache {
    /// The errno the store gave within `meta.ttl` when asked for `id`'s `security.capability`
    /// (ENODATA: none; ENOTSUP: a store without xattrs, e.g. sshfs).
    pub fn no_caps(&self, id: Ident) -> Option<i32> {
        self.no_caps
            .get(&id)
            .filter(|e| self.fresh_for(e.0, self.ttl_min()))
            .map(|e| e.1)
    }

    pub fn put_no_caps(&self, id: Ident, errno: i32) {
        self.caps_absent.store(errno, Relaxed);
        if self.enabled() {
            if self.no_caps.len() >= self.max_entries() {
                self.no_caps.clear();
            }
            self.no_caps.insert(id, (Instant::now(), errno));
        }
    }

    /// Object `id` was just made by us: it has no `security.capability` (only a setxattr
    /// gives one), so the kernel's question before its first write is answered as the store
    /// answered it for others, without asking (one round trip per file an untar writes).
    pub fn made_without_caps(&self, id: Ident) {
        let e = self.caps_absent.load(Relaxed);
        if e != 0 {
            self.put_no_caps(id, e);
        }
    }

    pub fn drop_no_caps(&self, id: Ident) {
        self.no_caps.remove(&id);
        self.no_xattrs.remove(&id);
    }

    /// Whether the store said `id` has no extended attribute `name`, and nothing moved its
    /// ctime since (see `no_xattrs`).
    pub fn xattr_absent(&self, id: Ident, name: &OsStr) -> bool {
        let Some((a, _)) = self.attr(id) else {
            return false;
        };
        self.no_xattrs
            .get(&id)
            .is_some_and(|e| e.0 == a.ctime && e.1.iter().any(|n| n == name))
    }

    /// Whether the store listed no extended attribute of `id`, and nothing moved its ctime
    /// since: a listxattr answered here (kept as the empty name, which no attribute has).
    /// Not a getxattr of other names: some a filesystem answers are never listed (ext4's
    /// `system.data`, the NFS client's `system.nfs4_acl` on some kernels).
    pub fn lists_no_xattrs(&self, id: Ident) -> bool {
        self.xattr_absent(id, OsStr::new(""))
    }

    /// The store listed no extended attribute of `id` (none the mount keeps), and the
    /// attributes the cache trusts for `id` are those it had then (taken before asking).
    pub fn put_lists_no_xattrs(&self, id: Ident, ctime: tierfs_store::TimeSpec) {
        self.put_xattr_absent(id, OsStr::new(""), ctime);
    }

    /// The store answered ENODATA for `id`'s extended attribute `name`, and the attributes
    /// the cache trusts for `id` are those it had then (taken before asking).
    pub fn put_xattr_absent(&self, id: Ident, name: &OsStr, ctime: tierfs_store::TimeSpec) {
        if !self.enabled() {
            return;
        }
        if self.no_xattrs.len() >= self.max_entries() {
            self.no_xattrs.clear();
        }
        let mut e = self.no_xattrs.entry(id).or_insert((ctime, Vec::new()));
        if e.0 != ctime {
            *e = (ctime, Vec::new());
        }
        if !e.1.iter().any(|n| n == name) && e.1.len() < 16 {
            e.1.push(name.to_owned());
        }
    }
}
