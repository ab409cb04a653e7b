//! The store a mount serves: a mounted directory (PosixStore), an S3 bucket (S3Store) or a
//! directory on an sftp server (SftpStore), as one type, so the daemon, its control socket and its metrics are built once. Each call goes
//! to the store the mount was made with; a node or handle of the other kind cannot arise (a
//! mount has one store), and would be EIO.

use std::ffi::{OsStr, OsString};
use tierfs_s3::{S3Handle, S3Node, S3Store};
use tierfs_sftp::{SftpHandle, SftpNode, SftpStore};
use tierfs_store::{
    Attr, DirEntry, Errno, Identity, Owner, PosixHandle, PosixNode, PosixStore, Reconnect, Result,
    SetAttr, StatFs, Store,
};

pub enum AnyStore {
    Posix(PosixStore),
    S3(Box<S3Store>),
    Sftp(Box<SftpStore>),
}

#[derive(Clone)]
pub enum AnyNode {
    Posix(PosixNode),
    S3(S3Node),
    Sftp(SftpNode),
}

pub enum AnyHandle {
    Posix(PosixHandle),
    S3(S3Handle),
    Sftp(SftpHandle),
}

impl AnyStore {
    /// Why the store's identity is what it is, for the log.
    pub fn identity_reason(&self) -> String {
        match self {
            AnyStore::Posix(s) => s.identity_reason().to_string(),
            AnyStore::S3(_) => "an S3 bucket: objects are known by their keys".into(),
            AnyStore::Sftp(_) => {
                "an sftp server: sftp v3 gives no inode numbers; objects are known by their paths"
                    .into()
            }
        }
    }
}

/// `store.method(node, args...)` on the matching store; a node of the other kind is EIO.
macro_rules! on_node {
    ($self:ident, $node:expr, |$s:ident, $n:ident| $body:expr) => {
        match ($self, $node) {
            (AnyStore::Posix($s), AnyNode::Posix($n)) => $body,
            (AnyStore::S3($s), AnyNode::S3($n)) => $body,
            (AnyStore::Sftp($s), AnyNode::Sftp($n)) => $body,
            _ => Err(Errno::EIO),
        }
    };
}

macro_rules! on_handle {
    ($self:ident, $h:expr, |$s:ident, $n:ident| $body:expr) => {
        match ($self, $h) {
            (AnyStore::Posix($s), AnyHandle::Posix($n)) => $body,
            (AnyStore::S3($s), AnyHandle::S3($n)) => $body,
            (AnyStore::Sftp($s), AnyHandle::Sftp($n)) => $body,
            _ => Err(Errno::EIO),
        }
    };
}

fn posix_node(r: Result<(PosixNode, Attr)>) -> Result<(AnyNode, Attr)> {
    r.map(|(n, a)| (AnyNode::Posix(n), a))
}

fn s3_node(r: Result<(S3Node, Attr)>) -> Result<(AnyNode, Attr)> {
    r.map(|(n, a)| (AnyNode::S3(n), a))
}

fn sftp_node(r: Result<(SftpNode, Attr)>) -> Result<(AnyNode, Attr)> {
    r.map(|(n, a)| (AnyNode::Sftp(n), a))
}

impl Store for AnyStore {
    type Node = AnyNode;
    type Handle = AnyHandle;

    fn store_id(&self) -> &str {
        match self {
            AnyStore::Posix(s) => s.store_id(),
            AnyStore::S3(s) => s.store_id(),
            AnyStore::Sftp(s) => s.store_id(),
        }
    }
    fn identity(&self) -> Identity {
        match self {
            AnyStore::Posix(s) => s.identity(),
            AnyStore::S3(s) => s.identity(),
            AnyStore::Sftp(s) => s.identity(),
        }
    }
    fn root(&self) -> Result<(AnyNode, Attr)> {
        match self {
            AnyStore::Posix(s) => posix_node(s.root()),
            AnyStore::S3(s) => s3_node(s.root()),
            AnyStore::Sftp(s) => sftp_node(s.root()),
        }
    }
    fn reconnect(&self) -> Result<Reconnect> {
        match self {
            AnyStore::Posix(s) => s.reconnect(),
            AnyStore::S3(s) => s.reconnect(),
            AnyStore::Sftp(s) => s.reconnect(),
        }
    }
    fn lookup(&self, parent: &AnyNode, name: &OsStr) -> Result<(AnyNode, Attr)> {
        match (self, parent) {
            (AnyStore::Posix(s), AnyNode::Posix(p)) => posix_node(s.lookup(p, name)),
            (AnyStore::S3(s), AnyNode::S3(p)) => s3_node(s.lookup(p, name)),
            (AnyStore::Sftp(s), AnyNode::Sftp(p)) => sftp_node(s.lookup(p, name)),
            _ => Err(Errno::EIO),
        }
    }
    fn getattr(&self, node: &AnyNode) -> Result<Attr> {
        on_node!(self, node, |s, n| s.getattr(n))
    }
    fn revalidate(&self, node: &AnyNode) -> Option<Result<Attr>> {
        match (self, node) {
            (AnyStore::Posix(s), AnyNode::Posix(n)) => s.revalidate(n),
            (AnyStore::S3(s), AnyNode::S3(n)) => s.revalidate(n),
            (AnyStore::Sftp(s), AnyNode::Sftp(n)) => s.revalidate(n),
            _ => Some(Err(Errno::EIO)),
        }
    }
    fn setattr(&self, node: &AnyNode, handle: Option<&AnyHandle>, set: &SetAttr) -> Result<Attr> {
        match (self, node, handle) {
            (AnyStore::Posix(s), AnyNode::Posix(n), None) => s.setattr(n, None, set),
            (AnyStore::Posix(s), AnyNode::Posix(n), Some(AnyHandle::Posix(h))) => {
                s.setattr(n, Some(h), set)
            }
            (AnyStore::S3(s), AnyNode::S3(n), None) => s.setattr(n, None, set),
            (AnyStore::S3(s), AnyNode::S3(n), Some(AnyHandle::S3(h))) => s.setattr(n, Some(h), set),
            (AnyStore::Sftp(s), AnyNode::Sftp(n), None) => s.setattr(n, None, set),
            (AnyStore::Sftp(s), AnyNode::Sftp(n), Some(AnyHandle::Sftp(h))) => {
                s.setattr(n, Some(h), set)
            }
            _ => Err(Errno::EIO),
        }
    }
    fn readlink(&self, node: &AnyNode) -> Result<OsString> {
        on_node!(self, node, |s, n| s.readlink(n))
    }
    fn mknod(
        &self,
        parent: &AnyNode,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<(AnyNode, Attr)> {
        match (self, parent) {
            (AnyStore::Posix(s), AnyNode::Posix(p)) => {
                posix_node(s.mknod(p, name, mode, rdev, owner))
            }
            (AnyStore::S3(s), AnyNode::S3(p)) => s3_node(s.mknod(p, name, mode, rdev, owner)),
            (AnyStore::Sftp(s), AnyNode::Sftp(p)) => sftp_node(s.mknod(p, name, mode, rdev, owner)),
            _ => Err(Errno::EIO),
        }
    }
    fn mkdir(
        &self,
        parent: &AnyNode,
        name: &OsStr,
        mode: u32,
        owner: Owner,
    ) -> Result<(AnyNode, Attr)> {
        match (self, parent) {
            (AnyStore::Posix(s), AnyNode::Posix(p)) => posix_node(s.mkdir(p, name, mode, owner)),
            (AnyStore::S3(s), AnyNode::S3(p)) => s3_node(s.mkdir(p, name, mode, owner)),
            (AnyStore::Sftp(s), AnyNode::Sftp(p)) => sftp_node(s.mkdir(p, name, mode, owner)),
            _ => Err(Errno::EIO),
        }
    }
    fn symlink(
        &self,
        parent: &AnyNode,
        name: &OsStr,
        target: &OsStr,
        owner: Owner,
    ) -> Result<(AnyNode, Attr)> {
        match (self, parent) {
            (AnyStore::Posix(s), AnyNode::Posix(p)) => {
                posix_node(s.symlink(p, name, target, owner))
            }
            (AnyStore::S3(s), AnyNode::S3(p)) => s3_node(s.symlink(p, name, target, owner)),
            (AnyStore::Sftp(s), AnyNode::Sftp(p)) => sftp_node(s.symlink(p, name, target, owner)),
            _ => Err(Errno::EIO),
        }
    }
    fn link(&self, node: &AnyNode, newparent: &AnyNode, newname: &OsStr) -> Result<Attr> {
        match (self, node, newparent) {
            (AnyStore::Posix(s), AnyNode::Posix(n), AnyNode::Posix(p)) => s.link(n, p, newname),
            (AnyStore::S3(s), AnyNode::S3(n), AnyNode::S3(p)) => s.link(n, p, newname),
            (AnyStore::Sftp(s), AnyNode::Sftp(n), AnyNode::Sftp(p)) => s.link(n, p, newname),
            _ => Err(Errno::EIO),
        }
    }
    fn unlink(&self, parent: &AnyNode, name: &OsStr) -> Result<()> {
        on_node!(self, parent, |s, p| s.unlink(p, name))
    }
    fn rmdir(&self, parent: &AnyNode, name: &OsStr) -> Result<()> {
        on_node!(self, parent, |s, p| s.rmdir(p, name))
    }
    fn rename(
        &self,
        parent: &AnyNode,
        name: &OsStr,
        newparent: &AnyNode,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        match (self, parent, newparent) {
            (AnyStore::Posix(s), AnyNode::Posix(p), AnyNode::Posix(q)) => {
                s.rename(p, name, q, newname, flags)
            }
            (AnyStore::S3(s), AnyNode::S3(p), AnyNode::S3(q)) => {
                s.rename(p, name, q, newname, flags)
            }
            (AnyStore::Sftp(s), AnyNode::Sftp(p), AnyNode::Sftp(q)) => {
                s.rename(p, name, q, newname, flags)
            }
            _ => Err(Errno::EIO),
        }
    }
    fn open_child(
        &self,
        parent: &AnyNode,
        name: &OsStr,
        flags: i32,
    ) -> Option<Result<tierfs_store::Opened<AnyNode, AnyHandle>>> {
        match (self, parent) {
            (AnyStore::Posix(s), AnyNode::Posix(p)) => Some(
                s.open_child(p, name, flags)?
                    .map(|(n, a, h)| (AnyNode::Posix(n), a, AnyHandle::Posix(h))),
            ),
            (AnyStore::S3(s), AnyNode::S3(p)) => Some(
                s.open_child(p, name, flags)?
                    .map(|(n, a, h)| (AnyNode::S3(n), a, AnyHandle::S3(h))),
            ),
            (AnyStore::Sftp(s), AnyNode::Sftp(p)) => Some(
                s.open_child(p, name, flags)?
                    .map(|(n, a, h)| (AnyNode::Sftp(n), a, AnyHandle::Sftp(h))),
            ),
            _ => Some(Err(Errno::EIO)),
        }
    }
    fn open(&self, node: &AnyNode, flags: i32) -> Result<AnyHandle> {
        match (self, node) {
            (AnyStore::Posix(s), AnyNode::Posix(n)) => s.open(n, flags).map(AnyHandle::Posix),
            (AnyStore::S3(s), AnyNode::S3(n)) => s.open(n, flags).map(AnyHandle::S3),
            (AnyStore::Sftp(s), AnyNode::Sftp(n)) => s.open(n, flags).map(AnyHandle::Sftp),
            _ => Err(Errno::EIO),
        }
    }
    fn create(
        &self,
        parent: &AnyNode,
        name: &OsStr,
        mode: u32,
        flags: i32,
        owner: Owner,
    ) -> Result<(AnyNode, Attr, AnyHandle)> {
        match (self, parent) {
            (AnyStore::Posix(s), AnyNode::Posix(p)) => s
                .create(p, name, mode, flags, owner)
                .map(|(n, a, h)| (AnyNode::Posix(n), a, AnyHandle::Posix(h))),
            (AnyStore::S3(s), AnyNode::S3(p)) => s
                .create(p, name, mode, flags, owner)
                .map(|(n, a, h)| (AnyNode::S3(n), a, AnyHandle::S3(h))),
            (AnyStore::Sftp(s), AnyNode::Sftp(p)) => s
                .create(p, name, mode, flags, owner)
                .map(|(n, a, h)| (AnyNode::Sftp(n), a, AnyHandle::Sftp(h))),
            _ => Err(Errno::EIO),
        }
    }
    fn read(&self, handle: &AnyHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        on_handle!(self, handle, |s, h| s.read(h, offset, buf))
    }
    fn read_bytes(
        &self,
        handle: &AnyHandle,
        offset: u64,
        len: usize,
    ) -> Result<tierfs_store::Bytes> {
        on_handle!(self, handle, |s, h| s.read_bytes(h, offset, len))
    }
    fn write(&self, handle: &AnyHandle, offset: u64, data: &[u8]) -> Result<u64> {
        on_handle!(self, handle, |s, h| s.write(h, offset, data))
    }
    fn write_vectored(&self, handle: &AnyHandle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        on_handle!(self, handle, |s, h| s.write_vectored(h, offset, bufs))
    }
    fn fstat(&self, handle: &AnyHandle) -> Result<Attr> {
        on_handle!(self, handle, |s, h| s.fstat(h))
    }
    fn fsync(&self, handle: &AnyHandle, datasync: bool) -> Result<()> {
        on_handle!(self, handle, |s, h| s.fsync(h, datasync))
    }
    fn child_node(
        &self,
        parent: &AnyNode,
        name: &OsStr,
        kind: tierfs_store::FileKind,
    ) -> Option<AnyNode> {
        match (self, parent) {
            (AnyStore::S3(s), AnyNode::S3(p)) => s.child_node(p, name, kind).map(AnyNode::S3),
            (AnyStore::Sftp(s), AnyNode::Sftp(p)) => s.child_node(p, name, kind).map(AnyNode::Sftp),
            _ => None,
        }
    }
    fn close(&self, handle: &AnyHandle) -> Result<()> {
        on_handle!(self, handle, |s, h| s.close(h))
    }
    fn publishes_at_sync(&self) -> bool {
        match self {
            AnyStore::Posix(s) => s.publishes_at_sync(),
            AnyStore::S3(s) => s.publishes_at_sync(),
            AnyStore::Sftp(s) => s.publishes_at_sync(),
        }
    }
    fn may_hang(&self) -> bool {
        match self {
            AnyStore::Posix(s) => s.may_hang(),
            AnyStore::S3(s) => s.may_hang(),
            AnyStore::Sftp(s) => s.may_hang(),
        }
    }
    fn keeps_call_limit(&self) -> bool {
        match self {
            AnyStore::Posix(s) => s.keeps_call_limit(),
            AnyStore::S3(s) => s.keeps_call_limit(),
            AnyStore::Sftp(s) => s.keeps_call_limit(),
        }
    }
    fn probe(&self) -> Result<()> {
        match self {
            AnyStore::Posix(s) => s.probe(),
            AnyStore::S3(s) => s.probe(),
            AnyStore::Sftp(s) => s.probe(),
        }
    }
    fn max_file_size(&self) -> u64 {
        match self {
            AnyStore::Posix(s) => s.max_file_size(),
            AnyStore::S3(s) => s.max_file_size(),
            AnyStore::Sftp(s) => s.max_file_size(),
        }
    }
    fn dirs_track_names(&self) -> bool {
        match self {
            AnyStore::Posix(s) => s.dirs_track_names(),
            AnyStore::S3(s) => s.dirs_track_names(),
            AnyStore::Sftp(s) => s.dirs_track_names(),
        }
    }
    fn open_based(
        &self,
        node: &AnyNode,
        flags: i32,
        base: Option<tierfs_store::Fingerprint>,
    ) -> Result<AnyHandle> {
        match (self, node) {
            (AnyStore::Posix(s), AnyNode::Posix(n)) => {
                s.open_based(n, flags, base).map(AnyHandle::Posix)
            }
            (AnyStore::S3(s), AnyNode::S3(n)) => s.open_based(n, flags, base).map(AnyHandle::S3),
            (AnyStore::Sftp(s), AnyNode::Sftp(n)) => {
                s.open_based(n, flags, base).map(AnyHandle::Sftp)
            }
            _ => Err(Errno::EIO),
        }
    }
    fn fsyncdir(&self, node: &AnyNode, datasync: bool) -> Result<()> {
        on_node!(self, node, |s, n| s.fsyncdir(n, datasync))
    }
    fn fallocate(&self, handle: &AnyHandle, mode: i32, offset: u64, len: u64) -> Result<()> {
        on_handle!(self, handle, |s, h| s.fallocate(h, mode, offset, len))
    }
    fn lseek(&self, handle: &AnyHandle, offset: i64, whence: i32) -> Result<i64> {
        on_handle!(self, handle, |s, h| s.lseek(h, offset, whence))
    }
    fn copy_range(
        &self,
        from: &AnyHandle,
        off_in: u64,
        to: &AnyHandle,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        match (self, from, to) {
            (AnyStore::Posix(s), AnyHandle::Posix(f), AnyHandle::Posix(t)) => {
                s.copy_range(f, off_in, t, off_out, len)
            }
            (AnyStore::S3(s), AnyHandle::S3(f), AnyHandle::S3(t)) => {
                s.copy_range(f, off_in, t, off_out, len)
            }
            (AnyStore::Sftp(s), AnyHandle::Sftp(f), AnyHandle::Sftp(t)) => {
                s.copy_range(f, off_in, t, off_out, len)
            }
            _ => Err(Errno::EIO),
        }
    }
    fn readdir(&self, node: &AnyNode) -> Result<Vec<DirEntry>> {
        on_node!(self, node, |s, n| s.readdir(n))
    }
    fn readdir_plus(&self, node: &AnyNode) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        on_node!(self, node, |s, n| s.readdir_plus(n))
    }
    fn names_list_cheaper(&self) -> bool {
        match self {
            AnyStore::Posix(s) => s.names_list_cheaper(),
            AnyStore::S3(s) => s.names_list_cheaper(),
            AnyStore::Sftp(s) => s.names_list_cheaper(),
        }
    }
    fn open_brings_data(&self) -> bool {
        match self {
            AnyStore::Posix(s) => s.open_brings_data(),
            AnyStore::S3(s) => s.open_brings_data(),
            AnyStore::Sftp(s) => s.open_brings_data(),
        }
    }
    fn listing_page(&self) -> usize {
        match self {
            AnyStore::Posix(s) => s.listing_page(),
            AnyStore::S3(s) => s.listing_page(),
            AnyStore::Sftp(s) => s.listing_page(),
        }
    }
    fn lists_within(&self, node: &AnyNode, max: usize) -> Result<bool> {
        on_node!(self, node, |s, n| s.lists_within(n, max))
    }
    fn listing_carries_attrs(&self) -> bool {
        match self {
            AnyStore::Posix(s) => s.listing_carries_attrs(),
            AnyStore::S3(s) => s.listing_carries_attrs(),
            AnyStore::Sftp(s) => s.listing_carries_attrs(),
        }
    }
    fn fstat_is_local(&self) -> bool {
        match self {
            AnyStore::Posix(s) => s.fstat_is_local(),
            AnyStore::S3(s) => s.fstat_is_local(),
            AnyStore::Sftp(s) => s.fstat_is_local(),
        }
    }
    fn stat_names(&self, node: &AnyNode, names: &[OsString]) -> Vec<Option<Attr>> {
        match (self, node) {
            (AnyStore::Posix(s), AnyNode::Posix(n)) => s.stat_names(n, names),
            (AnyStore::S3(s), AnyNode::S3(n)) => s.stat_names(n, names),
            (AnyStore::Sftp(s), AnyNode::Sftp(n)) => s.stat_names(n, names),
            _ => vec![None; names.len()],
        }
    }
    fn statfs(&self, node: &AnyNode) -> Result<StatFs> {
        on_node!(self, node, |s, n| s.statfs(n))
    }
    fn getxattr(&self, node: &AnyNode, name: &OsStr) -> Result<Vec<u8>> {
        on_node!(self, node, |s, n| s.getxattr(n, name))
    }
    fn getxattr_at(
        &self,
        parent: &AnyNode,
        name: &OsStr,
        xname: &OsStr,
    ) -> Option<Result<Vec<u8>>> {
        match (self, parent) {
            (AnyStore::Posix(s), AnyNode::Posix(p)) => s.getxattr_at(p, name, xname),
            (AnyStore::S3(s), AnyNode::S3(p)) => s.getxattr_at(p, name, xname),
            (AnyStore::Sftp(s), AnyNode::Sftp(p)) => s.getxattr_at(p, name, xname),
            _ => Some(Err(Errno::EIO)),
        }
    }
    fn setxattr(&self, node: &AnyNode, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        on_node!(self, node, |s, n| s.setxattr(n, name, value, flags))
    }
    fn listxattr(&self, node: &AnyNode) -> Result<Vec<u8>> {
        on_node!(self, node, |s, n| s.listxattr(n))
    }
    fn removexattr(&self, node: &AnyNode, name: &OsStr) -> Result<()> {
        on_node!(self, node, |s, n| s.removexattr(n, name))
    }
}
