//! [`SftpStore`]: the [`Store`] of a directory on an sftp server. Nodes are paths (identity by
//! path), so a node of a listed name costs no request; each call is one request, or several
//! sent together and answered in one round trip (an operation and the LSTAT that gives its
//! result). The namespace operations are in `ns`, the data path in `io`, listings in `dir`.

use crate::config::SftpConfig;
use crate::conn::Conn;
use crate::ctx::{child, Ctx};
use crate::errors::Status;
use crate::handle::SftpHandle;
use crate::stats::SftpStats;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tierfs_store::{
    Attr, DirEntry, Errno, FileKind, Identity, Owner, Reconnect, Result, SetAttr, StatFs, Store,
};

/// A file, directory or symlink of the server: its absolute path there, and its kind where
/// the call that made the node knew it (`setattr` must not follow a symlink).
#[derive(Clone, Debug)]
pub struct SftpNode {
    pub(crate) path: Arc<Path>,
    pub(crate) kind: Option<FileKind>,
}

impl SftpNode {
    pub(crate) fn new(path: PathBuf, kind: Option<FileKind>) -> SftpNode {
        SftpNode {
            path: path.into(),
            kind,
        }
    }
}

pub struct SftpStore {
    pub(crate) ctx: Arc<Ctx>,
}

impl SftpStore {
    /// Connects (a connection of its own, closed before returning: the caller may fork) and
    /// checks that the path is a directory, so a bad host, key or path is one clear line at
    /// mount time.
    pub fn open(cfg: SftpConfig) -> std::result::Result<SftpStore, String> {
        let url = cfg.url.display();
        let rt = crate::ctx::runtime()?;
        let root = rt.block_on(async {
            let c = Conn::start(&cfg, Arc::default()).await?;
            let path: &Path = if cfg.url.path.is_empty() {
                Path::new(".")
            } else {
                Path::new(&cfg.url.path)
            };
            let gone = |e: Status| match e.errno() {
                Errno::ENOENT => format!("{url}: no such directory"),
                e => format!("{url}: {e}"),
            };
            let real = c
                .call(|we, id| Ok(we.send_realpath_request(id, path.into())?.wait()))
                .await
                .map_err(gone)?;
            let a = c
                .call(|we, id| Ok(we.send_stat_request(id, (&*real).into())?.wait()))
                .await
                .map_err(gone)?;
            if crate::attrs::attr(&a, &real).kind != FileKind::Dir {
                return Err(format!("{url}: not a directory"));
            }
            c.close();
            Ok(PathBuf::from(real))
        })?;
        drop(rt);
        Ok(SftpStore {
            ctx: Arc::new(Ctx::new(cfg, root)),
        })
    }

    pub fn config(&self) -> &SftpConfig {
        &self.ctx.cfg
    }

    /// The directory served, as the server resolved it.
    pub fn root_path(&self) -> &Path {
        &self.ctx.root
    }

    /// Requests in flight and in all, for `tierfs stats`.
    pub fn stats(&self) -> Arc<SftpStats> {
        self.ctx.stats.clone()
    }

    pub(crate) fn lstat(&self, p: &Path) -> Result<Attr> {
        let c = self.ctx.conn()?;
        self.ctx.lstat_on(&c, p)
    }

    fn node_of(&self, parent: &SftpNode, name: &OsStr) -> Result<(SftpNode, Attr)> {
        let p = child(&parent.path, name)?;
        let a = self.lstat(&p)?;
        Ok((SftpNode::new(p, Some(a.kind)), a))
    }

    fn do_readlink(&self, node: &SftpNode) -> Result<OsString> {
        let c = self.ctx.conn()?;
        let p = &*node.path;
        let t = self
            .ctx
            .run(c.call(|we, id| Ok(we.send_readlink_request(id, p.into())?.wait())))?
            .map_err(|e| match e {
                // readlink(2) of something else than a symlink.
                Status::Failure | Status::BadMessage => Errno::EINVAL,
                e => e.errno(),
            })?;
        Ok(OsString::from_vec(
            std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str()).to_vec(),
        ))
    }

    /// A write at an offset may be sent again on a new connection (the same bytes land in the
    /// same place); an append may not (it would land twice).
    fn write_again(&self, handle: &SftpHandle, offset: u64, bufs: &[&[u8]]) -> Result<u64> {
        if handle.appends() {
            self.write_at(handle, offset, bufs)
        } else {
            self.ctx.again(|| self.write_at(handle, offset, bufs))
        }
    }
}

impl Store for SftpStore {
    type Node = SftpNode;
    type Handle = SftpHandle;

    fn store_id(&self) -> &str {
        &self.ctx.id
    }
    fn identity(&self) -> Identity {
        Identity::Path
    }
    fn root(&self) -> Result<(SftpNode, Attr)> {
        let a = self.ctx.again(|| self.lstat(&self.ctx.root))?;
        Ok((SftpNode::new(self.ctx.root.clone(), Some(a.kind)), a))
    }
    fn reconnect(&self) -> Result<Reconnect> {
        self.ctx.reconnect()
    }
    fn lookup(&self, parent: &SftpNode, name: &OsStr) -> Result<(SftpNode, Attr)> {
        self.ctx.again(|| self.node_of(parent, name))
    }
    fn child_node(&self, parent: &SftpNode, name: &OsStr, kind: FileKind) -> Option<SftpNode> {
        child(&parent.path, name)
            .ok()
            .map(|p| SftpNode::new(p, Some(kind)))
    }
    fn getattr(&self, node: &SftpNode) -> Result<Attr> {
        self.ctx.again(|| self.lstat(&node.path))
    }
    fn revalidate(&self, node: &SftpNode) -> Option<Result<Attr>> {
        Some(self.ctx.again(|| self.lstat(&node.path)))
    }
    fn setattr(&self, node: &SftpNode, handle: Option<&SftpHandle>, set: &SetAttr) -> Result<Attr> {
        self.do_setattr(node, handle, set)
    }
    fn readlink(&self, node: &SftpNode) -> Result<OsString> {
        self.ctx.again(|| self.do_readlink(node))
    }
    fn mknod(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        mode: u32,
        _rdev: u64,
        owner: Owner,
    ) -> Result<(SftpNode, Attr)> {
        // sftp makes regular files only (as sshfs: EPERM for the rest).
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            return Err(Errno::EPERM);
        }
        let (n, a, _h) =
            self.do_create(parent, name, mode, libc::O_EXCL | libc::O_WRONLY, owner)?;
        Ok((n, a))
    }
    fn mkdir(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        mode: u32,
        owner: Owner,
    ) -> Result<(SftpNode, Attr)> {
        self.do_mkdir(parent, name, mode, owner)
    }
    fn symlink(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        target: &OsStr,
        _owner: Owner,
    ) -> Result<(SftpNode, Attr)> {
        self.do_symlink(parent, name, target)
    }
    fn link(&self, node: &SftpNode, newparent: &SftpNode, newname: &OsStr) -> Result<Attr> {
        self.do_link(node, newparent, newname)
    }
    fn unlink(&self, parent: &SftpNode, name: &OsStr) -> Result<()> {
        self.do_unlink(parent, name)
    }
    fn rmdir(&self, parent: &SftpNode, name: &OsStr) -> Result<()> {
        self.do_rmdir(parent, name)
    }
    fn rename(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        newparent: &SftpNode,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.do_rename(parent, name, newparent, newname, flags)
    }
    fn open(&self, node: &SftpNode, flags: i32) -> Result<SftpHandle> {
        self.do_open(node, flags)
    }
    fn create(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        mode: u32,
        flags: i32,
        owner: Owner,
    ) -> Result<(SftpNode, Attr, SftpHandle)> {
        self.do_create(parent, name, mode, flags, owner)
    }
    fn read(&self, handle: &SftpHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let b = self.ctx.again(|| self.read_at(handle, offset, buf.len()))?;
        buf[..b.len()].copy_from_slice(&b);
        Ok(b.len())
    }
    fn read_bytes(&self, handle: &SftpHandle, offset: u64, len: usize) -> Result<bytes::Bytes> {
        self.ctx.again(|| self.read_at(handle, offset, len))
    }
    fn write(&self, handle: &SftpHandle, offset: u64, data: &[u8]) -> Result<u64> {
        self.write_again(handle, offset, &[data])
    }
    fn write_vectored(&self, handle: &SftpHandle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        self.write_again(handle, offset, bufs).map(|_| ())
    }
    fn fstat(&self, handle: &SftpHandle) -> Result<Attr> {
        self.ctx.again(|| self.do_fstat(handle))
    }
    fn fsync(&self, handle: &SftpHandle, _datasync: bool) -> Result<()> {
        self.do_fsync(handle)
    }
    /// sftp has no fsync of a directory (fsync@openssh.com takes a file handle): the
    /// server's filesystem orders its own metadata. Documented in docs/sftp.md.
    fn fsyncdir(&self, _node: &SftpNode, _datasync: bool) -> Result<()> {
        Ok(())
    }
    /// sftp cannot reserve space or punch holes.
    fn fallocate(&self, _: &SftpHandle, _mode: i32, _offset: u64, _len: u64) -> Result<()> {
        Err(Errno(libc::EOPNOTSUPP))
    }
    fn lseek(&self, handle: &SftpHandle, offset: i64, whence: i32) -> Result<i64> {
        self.do_lseek(handle, offset, whence)
    }
    fn copy_range(
        &self,
        from: &SftpHandle,
        off_in: u64,
        to: &SftpHandle,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        self.do_copy_range(from, off_in, to, off_out, len)
    }
    fn readdir(&self, node: &SftpNode) -> Result<Vec<DirEntry>> {
        let l = self.ctx.again(|| self.list(node))?;
        Ok(l.into_iter().map(|(e, _)| e).collect())
    }
    fn readdir_plus(&self, node: &SftpNode) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        Ok(self
            .ctx
            .again(|| self.list(node))?
            .into_iter()
            .map(|(e, a)| (e, Some(a)))
            .collect())
    }
    fn names_list_cheaper(&self) -> bool {
        false
    }
    /// A READDIR page brings every entry's attributes (sftp-server LSTATs them itself).
    fn may_hang(&self) -> bool {
        true
    }
    fn listing_carries_attrs(&self) -> bool {
        true
    }
    fn stat_names(&self, node: &SftpNode, names: &[OsString]) -> Vec<Option<Attr>> {
        self.do_stat_names(node, names)
    }
    fn statfs(&self, _node: &SftpNode) -> Result<StatFs> {
        self.ctx.again(|| self.do_statfs())
    }
    /// sftp v3 has no extended attributes.
    fn getxattr(&self, _: &SftpNode, _: &OsStr) -> Result<Vec<u8>> {
        Err(Errno::ENOTSUP)
    }
    fn setxattr(&self, _: &SftpNode, _: &OsStr, _: &[u8], _: i32) -> Result<()> {
        Err(Errno::ENOTSUP)
    }
    fn listxattr(&self, _: &SftpNode) -> Result<Vec<u8>> {
        Err(Errno::ENOTSUP)
    }
    fn removexattr(&self, _: &SftpNode, _: &OsStr) -> Result<()> {
        Err(Errno::ENOTSUP)
    }
}
