//! Object identity as the cache knows it: [`IdStore`] stamps every attribute the store returns
//! with the identity of its object, so everything above (inode table, metadata cache, RAM and
//! SSD keys, the write-back journal) keys by `(attr.dev, attr.ino)` and never sees the
//! store's own device or inode numbers.
//!
//! An identity is two u64s:
//! - `(0, ino)` for an object of a store whose identity is by inode number, on the same
//!   filesystem as the store's root: the inode number lasts as long as the object, the device
//!   number does not (an NFS client gets a new one at each mount), so it is left out.
//! - `(hi, lo)` with the top bit of `hi` set otherwise: a 128-bit hash of the parent's
//!   identity and the name. For stores that number inodes anew (sshfs, rclone mount, SMB with
//!   `noserverino`, 9p), and for objects on another filesystem mounted inside the store (whose
//!   inode numbers could clash with the root's). The same path gives the same identity after
//!   a remount or a reboot; what a path holds is told apart by its version (fingerprint).
//!
//! Renames done through tierfs are followed (`Fs::rename`): a file takes the identity of its
//! new path, keeping its cached blocks; a directory (or anything swapped by an exchange)
//! keeps its identity, so that everything under it keeps theirs, and its new path is made to
//! lead to it by an alias (its old path, to an identity of its own). Aliases last for the
//! mount: after a remount a renamed directory's contents are new objects to the cache.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use tierfs_store::{Attr, DirEntry, Identity, Owner, Result, SetAttr, StatFs, Store};

/// A backing object's identity (see the module documentation).
pub type Ident = (u64, u64);

/// The identity of the store's root when objects are identified by path.
pub const PATH_ROOT: Ident = (1 << 63, 1);

/// The identity of `name` in the directory of identity `parent`, by path.
pub fn path_id(parent: Ident, name: &OsStr) -> Ident {
    let mut b = Vec::with_capacity(16 + name.len());
    b.extend_from_slice(&parent.0.to_le_bytes());
    b.extend_from_slice(&parent.1.to_le_bytes());
    b.extend_from_slice(name.as_bytes());
    let h = xxhash_rust::xxh3::xxh3_128(&b);
    (((h >> 64) as u64) | (1 << 63), h as u64)
}

/// Whether `id` is a path identity (else an inode number of the root's filesystem).
pub fn is_path_id(id: Ident) -> bool {
    id.0 & (1 << 63) != 0
}

/// A store's node with the identity of its object.
#[derive(Clone, Debug)]
pub struct IdNode<N> {
    inner: N,
    id: Ident,
}

impl<N> IdNode<N> {
    /// The identity of the object the node leads to.
    pub fn id(&self) -> Ident {
        self.id
    }
}

/// A store's open file with the identity of its object.
pub struct IdHandle<H> {
    inner: H,
    id: Ident,
}

impl<H> IdHandle<H> {
    /// The store's own handle (for a call made on the store below, `CountedStore`).
    pub(crate) fn inner(&self) -> &H {
        &self.inner
    }
}

/// The store as the core sees it (see the module documentation).
pub struct IdStore<S> {
    inner: S,
    /// Paths that lead elsewhere than their hash (see the module documentation).
    aliases: dashmap::DashMap<(Ident, OsString), Ident>,
    aliased: std::sync::atomic::AtomicU64,
    identity: Identity,
    /// The root's device in the inner store: objects elsewhere are identified by path.
    root_dev: u64,
    root_id: Ident,
}

fn stamp(mut a: Attr, id: Ident) -> Attr {
    a.dev = id.0;
    a.ino = id.1;
    a
}

impl<S: Store> IdStore<S> {
    pub fn new(inner: S) -> Result<IdStore<S>> {
        let (_, root) = inner.root()?;
        let identity = inner.identity();
        let root_id = match identity {
            Identity::Inode => (0, root.ino),
            Identity::Path => PATH_ROOT,
        };
        Ok(IdStore {
            inner,
            aliases: Default::default(),
            aliased: Default::default(),
            identity,
            root_dev: root.dev,
            root_id,
        })
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn identity_kind(&self) -> Identity {
        self.identity
    }

    /// The path identity of `name` in `parent`: its hash, unless a rename made it an alias.
    pub fn derive(&self, parent: Ident, name: &OsStr) -> Ident {
        if !self.aliases.is_empty() {
            if let Some(id) = self.aliases.get(&(parent, name.to_owned())) {
                return *id;
            }
        }
        path_id(parent, name)
    }

    /// From now on `name` in `parent` leads to identity `id` (a renamed directory).
    pub fn alias(&self, parent: Ident, name: &OsStr, id: Ident) {
        self.aliases.insert((parent, name.to_owned()), id);
    }

    /// From now on `name` in `parent` leads to a new identity of its own (the path a
    /// directory was renamed away from: what is created there later is another object).
    pub fn alias_fresh(&self, parent: Ident, name: &OsStr) {
        let n = self
            .aliased
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = path_id(path_id(parent, name), OsStr::new(&format!("\0moved{n}")));
        self.alias(parent, name, id);
    }

    /// The identity of `name` in `parent`, whose inner attributes are `a`.
    fn child(&self, parent: Ident, name: &OsStr, a: &Attr) -> Ident {
        if self.identity == Identity::Inode && a.dev == self.root_dev {
            (0, a.ino)
        } else {
            self.derive(parent, name)
        }
    }

    /// The identity a listing entry of `parent` stands for.
    fn entry_id(&self, parent: Ident, e: &DirEntry) -> Ident {
        match self.identity {
            // A listing names no device: the root's is assumed.
            Identity::Inode => (0, e.ino),
            Identity::Path => self.derive(parent, &e.name),
        }
    }

    /// `node` under another identity: an object that a rename or a link gave a new path,
    /// with path identities.
    pub fn relabel(&self, node: &IdNode<S::Node>, id: Ident) -> IdNode<S::Node> {
        IdNode {
            inner: node.inner.clone(),
            id,
        }
    }

    /// The identity the object at `name` in `parent` has (path identities), or keeps
    /// (inode identities: `current`), after an operation gave it that name.
    pub fn id_at(&self, parent: Ident, name: &OsStr, current: Ident) -> Ident {
        if is_path_id(current) {
            self.derive(parent, name)
        } else {
            current
        }
    }

    fn node(
        &self,
        (inner, a): (S::Node, Attr),
        parent: Ident,
        name: &OsStr,
    ) -> (IdNode<S::Node>, Attr) {
        let id = self.child(parent, name, &a);
        (IdNode { inner, id }, stamp(a, id))
    }
}

impl<S: Store> Store for IdStore<S> {
    type Node = IdNode<S::Node>;
    type Handle = IdHandle<S::Handle>;

    fn store_id(&self) -> &str {
        self.inner.store_id()
    }
    fn identity(&self) -> Identity {
        self.identity
    }
    fn reconnect(&self) -> Result<tierfs_store::Reconnect> {
        self.inner.reconnect()
    }
    fn root(&self) -> Result<(Self::Node, Attr)> {
        let (inner, a) = self.inner.root()?;
        let id = self.root_id;
        Ok((IdNode { inner, id }, stamp(a, id)))
    }
    fn lookup(&self, parent: &Self::Node, name: &OsStr) -> Result<(Self::Node, Attr)> {
        let r = self.inner.lookup(&parent.inner, name)?;
        Ok(self.node(r, parent.id, name))
    }
    /// Only under path identities: an inode identity comes from the store's answer.
    fn child_node(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        kind: tierfs_store::FileKind,
    ) -> Option<Self::Node> {
        if self.identity != Identity::Path {
            return None;
        }
        let inner = self.inner.child_node(&parent.inner, name, kind)?;
        Some(IdNode {
            inner,
            id: self.derive(parent.id, name),
        })
    }
    fn getattr(&self, node: &Self::Node) -> Result<Attr> {
        Ok(stamp(self.inner.getattr(&node.inner)?, node.id))
    }
    fn revalidate(&self, node: &Self::Node) -> Option<Result<Attr>> {
        Some(
            self.inner
                .revalidate(&node.inner)?
                .map(|a| stamp(a, node.id)),
        )
    }
    fn setattr(
        &self,
        node: &Self::Node,
        handle: Option<&Self::Handle>,
        set: &SetAttr,
    ) -> Result<Attr> {
        let a = self
            .inner
            .setattr(&node.inner, handle.map(|h| &h.inner), set)?;
        Ok(stamp(a, node.id))
    }
    fn readlink(&self, node: &Self::Node) -> Result<OsString> {
        self.inner.readlink(&node.inner)
    }
    fn mknod(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<(Self::Node, Attr)> {
        let r = self.inner.mknod(&parent.inner, name, mode, rdev, owner)?;
        Ok(self.node(r, parent.id, name))
    }
    fn mkdir(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        owner: Owner,
    ) -> Result<(Self::Node, Attr)> {
        let r = self.inner.mkdir(&parent.inner, name, mode, owner)?;
        Ok(self.node(r, parent.id, name))
    }
    fn symlink(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        target: &OsStr,
        owner: Owner,
    ) -> Result<(Self::Node, Attr)> {
        let r = self.inner.symlink(&parent.inner, name, target, owner)?;
        Ok(self.node(r, parent.id, name))
    }
    /// The new name's identity: the object's own with inode identities; with path
    /// identities, the new path's (see [`IdStore::relabel`]).
    fn link(&self, node: &Self::Node, newparent: &Self::Node, newname: &OsStr) -> Result<Attr> {
        let a = self.inner.link(&node.inner, &newparent.inner, newname)?;
        Ok(stamp(a, self.id_at(newparent.id, newname, node.id)))
    }
    fn unlink(&self, parent: &Self::Node, name: &OsStr) -> Result<()> {
        self.inner.unlink(&parent.inner, name)
    }
    fn rmdir(&self, parent: &Self::Node, name: &OsStr) -> Result<()> {
        self.inner.rmdir(&parent.inner, name)
    }
    fn rename(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        newparent: &Self::Node,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.inner
            .rename(&parent.inner, name, &newparent.inner, newname, flags)
    }
    fn open_child(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        flags: i32,
    ) -> Option<Result<tierfs_store::Opened<Self::Node, Self::Handle>>> {
        Some(
            self.inner
                .open_child(&parent.inner, name, flags)?
                .map(|(n, a, h)| {
                    let (node, attr) = self.node((n, a), parent.id, name);
                    let id = node.id;
                    (node, attr, IdHandle { inner: h, id })
                }),
        )
    }
    fn open(&self, node: &Self::Node, flags: i32) -> Result<Self::Handle> {
        Ok(IdHandle {
            inner: self.inner.open(&node.inner, flags)?,
            id: node.id,
        })
    }
    fn open_based(
        &self,
        node: &Self::Node,
        flags: i32,
        base: Option<tierfs_store::Fingerprint>,
    ) -> Result<Self::Handle> {
        Ok(IdHandle {
            inner: self.inner.open_based(&node.inner, flags, base)?,
            id: node.id,
        })
    }
    fn close(&self, handle: &Self::Handle) -> Result<()> {
        self.inner.close(&handle.inner)
    }
    fn publishes_at_sync(&self) -> bool {
        self.inner.publishes_at_sync()
    }
    fn max_file_size(&self) -> u64 {
        self.inner.max_file_size()
    }
    fn may_hang(&self) -> bool {
        self.inner.may_hang()
    }
    fn keeps_call_limit(&self) -> bool {
        self.inner.keeps_call_limit()
    }
    fn probe(&self) -> Result<()> {
        self.inner.probe()
    }
    fn dirs_track_names(&self) -> bool {
        self.inner.dirs_track_names()
    }
    fn create(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        flags: i32,
        owner: Owner,
    ) -> Result<(Self::Node, Attr, Self::Handle)> {
        let (n, a, h) = self.inner.create(&parent.inner, name, mode, flags, owner)?;
        let (node, attr) = self.node((n, a), parent.id, name);
        let id = node.id;
        Ok((node, attr, IdHandle { inner: h, id }))
    }
    fn read(&self, handle: &Self::Handle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.inner.read(&handle.inner, offset, buf)
    }
    fn read_bytes(&self, handle: &Self::Handle, offset: u64, len: usize) -> Result<bytes::Bytes> {
        self.inner.read_bytes(&handle.inner, offset, len)
    }
    fn write(&self, handle: &Self::Handle, offset: u64, data: &[u8]) -> Result<u64> {
        self.inner.write(&handle.inner, offset, data)
    }
    fn write_vectored(&self, handle: &Self::Handle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        self.inner.write_vectored(&handle.inner, offset, bufs)
    }
    fn fstat(&self, handle: &Self::Handle) -> Result<Attr> {
        Ok(stamp(self.inner.fstat(&handle.inner)?, handle.id))
    }
    fn fsync(&self, handle: &Self::Handle, datasync: bool) -> Result<()> {
        self.inner.fsync(&handle.inner, datasync)
    }
    fn fsyncdir(&self, node: &Self::Node, datasync: bool) -> Result<()> {
        self.inner.fsyncdir(&node.inner, datasync)
    }
    fn fallocate(&self, handle: &Self::Handle, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.inner.fallocate(&handle.inner, mode, offset, len)
    }
    fn lseek(&self, handle: &Self::Handle, offset: i64, whence: i32) -> Result<i64> {
        self.inner.lseek(&handle.inner, offset, whence)
    }
    fn copy_range(
        &self,
        from: &Self::Handle,
        off_in: u64,
        to: &Self::Handle,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        self.inner
            .copy_range(&from.inner, off_in, &to.inner, off_out, len)
    }
    fn readdir(&self, node: &Self::Node) -> Result<Vec<DirEntry>> {
        let mut v = self.inner.readdir(&node.inner)?;
        for e in &mut v {
            let id = self.entry_id(node.id, e);
            (e.dev, e.ino) = id;
        }
        Ok(v)
    }
    fn readdir_plus(&self, node: &Self::Node) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        let mut v = self.inner.readdir_plus(&node.inner)?;
        for (e, a) in &mut v {
            let id = match a {
                Some(a) => self.child(node.id, &e.name, a),
                None => self.entry_id(node.id, e),
            };
            (e.dev, e.ino) = id;
            if let Some(a) = a {
                *a = stamp(*a, id);
            }
        }
        Ok(v)
    }
    fn names_list_cheaper(&self) -> bool {
        self.inner.names_list_cheaper()
    }
    fn listing_carries_attrs(&self) -> bool {
        self.inner.listing_carries_attrs()
    }
    fn open_brings_data(&self) -> bool {
        self.inner.open_brings_data()
    }
    fn listing_page(&self) -> usize {
        self.inner.listing_page()
    }
    fn lists_within(&self, node: &Self::Node, max: usize) -> Result<bool> {
        self.inner.lists_within(&node.inner, max)
    }
    fn fstat_is_local(&self) -> bool {
        self.inner.fstat_is_local()
    }
    fn stat_names(&self, node: &Self::Node, names: &[OsString]) -> Vec<Option<Attr>> {
        let mut v = self.inner.stat_names(&node.inner, names);
        for (a, name) in v.iter_mut().zip(names) {
            if let Some(a) = a {
                *a = stamp(*a, self.child(node.id, name, a));
            }
        }
        v
    }
    fn statfs(&self, node: &Self::Node) -> Result<StatFs> {
        self.inner.statfs(&node.inner)
    }
    fn getxattr(&self, node: &Self::Node, name: &OsStr) -> Result<Vec<u8>> {
        self.inner.getxattr(&node.inner, name)
    }
    fn getxattr_at(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        xname: &OsStr,
    ) -> Option<Result<Vec<u8>>> {
        self.inner.getxattr_at(&parent.inner, name, xname)
    }
    fn setxattr(&self, node: &Self::Node, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.inner.setxattr(&node.inner, name, value, flags)
    }
    fn listxattr(&self, node: &Self::Node) -> Result<Vec<u8>> {
        self.inner.listxattr(&node.inner)
    }
    fn removexattr(&self, node: &Self::Node, name: &OsStr) -> Result<()> {
        self.inner.removexattr(&node.inner, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_store::{FaultConfig, FaultStore, PosixStore};

    #[test]
    fn path_ids_are_stable_and_distinct() {
        let a = path_id(PATH_ROOT, OsStr::new("a"));
        assert_eq!(a, path_id(PATH_ROOT, OsStr::new("a")));
        assert_ne!(a, path_id(PATH_ROOT, OsStr::new("b")));
        assert_ne!(
            path_id(a, OsStr::new("x")),
            path_id(PATH_ROOT, OsStr::new("x"))
        );
        assert!(is_path_id(a) && !is_path_id((0, 5)));
        // The hash is xxh3-128, whose output is specified: persisted identities must not change
        // with a dependency update.
        assert_eq!(
            path_id((0, 0), OsStr::new("")),
            (0xe518_9a95_99e3_f862, 0x05ea_23ef_06e2_8b2d)
        );
    }

    #[test]
    fn renumbering_store_gets_the_same_identities_every_time() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f"), b"x").unwrap();
        let ids = || {
            let faults = FaultConfig::new();
            faults.set_renumber(true);
            let s = IdStore::new(FaultStore::new(
                PosixStore::open(dir.path()).unwrap(),
                faults,
            ))
            .unwrap();
            let (root, _) = s.root().unwrap();
            let (d, da) = s.lookup(&root, OsStr::new("d")).unwrap();
            let (_, fa) = s.lookup(&d, OsStr::new("f")).unwrap();
            let listed = s.readdir_plus(&d).unwrap();
            assert_eq!((listed[0].0.dev, listed[0].0.ino), (fa.dev, fa.ino));
            assert_eq!(listed[0].1.map(|a| (a.dev, a.ino)), Some((fa.dev, fa.ino)));
            assert_eq!(s.getattr(&d).unwrap().ino, da.ino);
            ((da.dev, da.ino), (fa.dev, fa.ino))
        };
        assert_eq!(ids(), ids());
        assert!(is_path_id(ids().1));
    }

    #[test]
    fn inode_identity_leaves_the_device_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let s = IdStore::new(
            PosixStore::open_with(dir.path(), tierfs_store::IdentityChoice::Inode).unwrap(),
        )
        .unwrap();
        let (root, _) = s.root().unwrap();
        let (_, fa) = s.lookup(&root, OsStr::new("f")).unwrap();
        let real =
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(dir.path().join("f")).unwrap());
        assert_eq!((fa.dev, fa.ino), (0, real));
    }
}
