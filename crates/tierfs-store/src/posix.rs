//! [`PosixStore`]: a backing store over any mounted directory (local disk, NFS, SMB).
//!
//! Confinement: every object is reached from the root by `openat(parent_fd, name,
//! O_PATH | O_NOFOLLOW)` with a single path component, so nothing in the backing tree (a symlink
//! to `/etc`, a `..`) can lead tierfs outside BACKING. Symlinks are returned as symlinks and
//! never followed. Operations that Linux does not offer on `O_PATH` descriptors use the
//! descriptor's own `/proc/self/fd/N` entry, which names exactly that inode.
//!
//! Here: opening BACKING, its identity, reconnecting, lookups and listings, and the
//! [`Store`] impl, which hands the rest to the modules below it: `posix_names` (objects
//! made, linked, removed, renamed), `posix_attr` (setattr, readlink, xattrs), `posix_io`
//! (open files' data); all of them stand on `posix_sys`.

use crate::identity::{decide, mount_of};
use crate::posix_sys::*;
use crate::stat_fanout::StatFanout;
use crate::{posix_attr, posix_io, posix_names};
use crate::{
    Attr, DirEntry, Errno, Identity, IdentityChoice, Owner, Result, SetAttr, StatFs, Store,
};
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

pub struct PosixStore {
    id: String,
    /// BACKING, canonical: where the root is opened again when the store came back
    /// (`reconnect`).
    path: std::path::PathBuf,
    /// Replaced by `reconnect` (a FUSE store mounted again at the same path).
    root: parking_lot::RwLock<PosixNode>,
    /// The filesystem type of BACKING's mount at open: a reconnect takes only a root of the
    /// same type (after `fusermount -u` of a dead store, BACKING is the empty directory it was
    /// mounted on until the store is mounted again).
    fstype: String,
    identity: Identity,
    /// Why `identity` is what it is, for the log.
    identity_why: String,
    /// One by one or many at a time, for a listing's stats (`store.stat_concurrency`).
    stat_fanout: StatFanout,
    /// `store.names_first`, decided at mount ([`PosixStore::set_names_first`]).
    names_first: std::sync::atomic::AtomicBool,
    /// The largest file BACKING's filesystem takes (`max_size`).
    max_file: u64,
}

impl PosixStore {
    /// The store's directory (canonical).
    pub fn root_dir(&self) -> &std::path::Path {
        &self.path
    }

    /// Lists a directory; with `stat`, also stats every entry through the open directory
    /// (fstatat on its fd: no path walk per entry), many at a time when the store is slow to
    /// answer one (see [`PosixStore::stat_entries`]).
    fn list_dir(&self, node: &PosixNode, stat: bool) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        let dir = DirStream::open(node)?;
        let names = read_names(&dir, usize::MAX)?;
        // Some filesystems (old XFS, some NFS servers) leave d_type unknown; a wrong type
        // would mislead `find` and friends, so ask the inode itself.
        let wanted: Vec<usize> = (0..names.len())
            .filter(|&i| stat || names[i].2.is_none())
            .collect();
        let attrs = self.stat_entries(dir.fd(), &names, &wanted);
        drop(dir);
        Ok(names
            .into_iter()
            .zip(attrs)
            .map(|((name, ino, dtype), attr)| {
                let kind = dtype.or(attr.map(|a| a.kind));
                (
                    DirEntry {
                        name: OsString::from_vec(name.into_bytes()),
                        dev: 0,
                        ino,
                        kind,
                    },
                    if stat { attr } else { None },
                )
            })
            .collect())
    }

    /// `fstatat` of the entries `wanted` of `names` in the directory `dirfd` (None: gone, or
    /// not asked), one by one or many at a time as [`StatFanout`] finds faster for this store.
    fn stat_entries(
        &self,
        dirfd: RawFd,
        names: &[(CString, u64, Option<crate::FileKind>)],
        wanted: &[usize],
    ) -> Vec<Option<Attr>> {
        let stat_one = |i: usize| stat_at(dirfd, &names[i].0).ok();
        self.stat_fanout.stat_all(names.len(), wanted, stat_one).0
    }

    /// `store.stat_concurrency`: how many entries of a listing are stat'ed at once on a
    /// slow store.
    pub fn set_stat_concurrency(&self, n: usize) {
        self.stat_fanout.set_concurrency(n);
    }

    /// Opens BACKING. Fails (with a message fit for the user) if it is missing or not a directory.
    pub fn open(backing: &Path) -> std::io::Result<PosixStore> {
        Self::open_with(backing, IdentityChoice::Auto)
    }

    /// [`PosixStore::open`] with `store.identity`: `Auto` decides from the filesystem type of
    /// BACKING's mount (`identity::decide`).
    pub fn open_with(backing: &Path, choice: IdentityChoice) -> std::io::Result<PosixStore> {
        let canon = backing.canonicalize().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("backing store {}: {e}", backing.display()),
            )
        })?;
        let root = open_root(&canon).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("backing store {}: {e}", backing.display()),
            )
        })?;
        let (fstype, opts) = mount_of(root.fd()).unwrap_or_else(|| ("unknown".into(), "".into()));
        let (identity, identity_why) = match choice {
            IdentityChoice::Auto => decide(&fstype, &opts),
            IdentityChoice::Inode => (Identity::Inode, "store.identity=inode".into()),
            IdentityChoice::Path => (Identity::Path, "store.identity=path".into()),
        };
        let (max_file, _) = crate::max_size::probe(root.fd());
        Ok(PosixStore {
            max_file,
            id: store_id_for(&canon),
            path: canon,
            root: parking_lot::RwLock::new(root),
            fstype,
            identity,
            identity_why,
            stat_fanout: StatFanout::default(),
            names_first: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// `store.names_first`: decides, for the life of the mount, whether directories are
    /// listed for names first (`Store::names_list_cheaper`). `auto` measures: the root is
    /// listed, then up to 8 of its entries are stat'ed one by one, as a listing's probe does
    /// (`StatFanout`); names first if a stat took 200 µs or more (a request to the server,
    /// an inode read on a disk), not where the store's client has the attributes from its
    /// own listing (sshfs, an NFS client's READDIRPLUS) or a local disk's inode cache does.
    /// Returns why, for the log.
    pub fn set_names_first(&self, choice: crate::NamesFirst) -> String {
        let (yes, why) = match choice {
            crate::NamesFirst::On => (true, "store.names_first=on".to_string()),
            crate::NamesFirst::Off => (false, "store.names_first=off".to_string()),
            // (Names first needs path identities: nothing to measure.)
            crate::NamesFirst::Auto if self.identity == Identity::Inode => {
                (false, "identities are inode numbers".to_string())
            }
            crate::NamesFirst::Auto => self.probe_stats(),
        };
        self.names_first
            .store(yes, std::sync::atomic::Ordering::Relaxed);
        why
    }

    fn probe_stats(&self) -> (bool, String) {
        let root = self.root.read().clone();
        // The first few names only: a root of a million entries is not listed at mount.
        let first = DirStream::open(&root)
            .and_then(|dir| read_names(&dir, crate::stat_fanout::PROBE_STATS));
        let Ok(first) = first else {
            return (false, "the root could not be listed".into());
        };
        // A listing without entry types (old XFS, some NFS servers) costs a stat per entry
        // for the type alone: listed with the attributes, each entry is stat'ed once.
        if first.iter().any(|(_, _, kind)| kind.is_none()) {
            return (false, "the store's listings give no entry types".into());
        }
        let names: Vec<CString> = first.into_iter().map(|(n, _, _)| n).collect();
        if names.is_empty() {
            return (false, "nothing in the root to measure".into());
        }
        let t = std::time::Instant::now();
        for n in &names {
            let _ = stat_at(root.fd(), n);
        }
        let per = t.elapsed() / names.len() as u32;
        let slow = per >= crate::stat_fanout::PARALLEL_STAT_AFTER;
        (
            slow,
            format!(
                "a stat after a listing took {per:?} ({} entries of the root; names first from {:?})",
                names.len(),
                crate::stat_fanout::PARALLEL_STAT_AFTER
            ),
        )
    }

    /// Why the store's identity is what it is (filesystem type, or the option), for the log.
    pub fn identity_reason(&self) -> &str {
        &self.identity_why
    }
}

/// A readable, stable identity for a directory store: its path as a slug plus a hash of the
/// full path, e.g. `mnt-nfs-data-5f2c0e1a9d3b7c44`.
pub fn store_id_for(canon: &Path) -> String {
    let s = canon.to_string_lossy();
    crate::readable_id(&s, &s)
}

impl Store for PosixStore {
    fn max_file_size(&self) -> u64 {
        self.max_file
    }
    /// A FUSE mount (sshfs, rclone, bindfs) or a network filesystem: its server can stop
    /// answering. A local disk's filesystem fails rather than hangs.
    fn may_hang(&self) -> bool {
        let t = self.fstype.as_str();
        t.starts_with("fuse")
            || t.starts_with("nfs")
            || matches!(
                t,
                "cifs"
                    | "smb3"
                    | "smbfs"
                    | "9p"
                    | "ceph"
                    | "glusterfs"
                    | "afs"
                    | "lustre"
                    | "unknown"
            )
    }
    type Node = PosixNode;
    type Handle = PosixHandle;

    fn store_id(&self) -> &str {
        &self.id
    }

    fn identity(&self) -> Identity {
        self.identity
    }

    fn root(&self) -> Result<(PosixNode, Attr)> {
        let root = self.root.read().clone();
        let attr = fstat_fd(root.fd())?;
        Ok((root, attr))
    }

    /// The root answers: nothing to do. It does not (ENOTCONN: the FUSE daemon behind it
    /// died): BACKING is opened again by its path, which holds whatever is mounted there now;
    /// if that answers, it becomes the root.
    fn reconnect(&self) -> Result<crate::Reconnect> {
        let cur = self.root.read().clone();
        // statfs, not stat: FUSE answers a stat from attributes the kernel still caches, even
        // on a dead connection; a statfs always asks the daemon.
        match fstatfs_fd(cur.fd()) {
            Err(Errno::ENOTCONN) | Err(Errno::EIO) => {}
            _ => return Ok(crate::Reconnect::Same),
        }
        let root = open_root(&self.path).map_err(Errno::from)?;
        fstatfs_fd(root.fd())?;
        let attr = fstat_fd(root.fd())?;
        if attr.kind != crate::FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let fstype = mount_of(root.fd()).map(|(t, _)| t);
        if fstype.as_deref() != Some(self.fstype.as_str()) || self.fstype == "unknown" {
            // Not the store: what its mount covered. Not back yet.
            return Err(Errno::ENOTCONN);
        }
        *self.root.write() = root;
        Ok(crate::Reconnect::New)
    }

    /// The attributes come from the filesystem's server (`AT_STATX_FORCE_SYNC`), not from
    /// an NFS or FUSE client's attribute cache: tierfs asks only once its own trust in what
    /// it cached ran out, and a lookup's answer is an open's close-to-open check.
    fn lookup(&self, parent: &PosixNode, name: &OsStr) -> Result<(PosixNode, Attr)> {
        let c = component(name)?;
        let node = open_path_at(parent.fd(), &c)?;
        let attr = node.stat_sync()?;
        Ok((node, attr))
    }

    fn getattr(&self, node: &PosixNode) -> Result<Attr> {
        node.stat()
    }

    fn revalidate(&self, node: &PosixNode) -> Option<Result<Attr>> {
        Some(statx_sync_fd(node.fd()))
    }

    fn setattr(
        &self,
        node: &PosixNode,
        handle: Option<&PosixHandle>,
        set: &SetAttr,
    ) -> Result<Attr> {
        posix_attr::setattr(node, handle, set)
    }

    fn readlink(&self, node: &PosixNode) -> Result<OsString> {
        posix_attr::readlink(node)
    }

    fn mknod(
        &self,
        parent: &PosixNode,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<(PosixNode, Attr)> {
        posix_names::mknod(parent, name, mode, rdev, owner)
    }

    fn mkdir(
        &self,
        parent: &PosixNode,
        name: &OsStr,
        mode: u32,
        owner: Owner,
    ) -> Result<(PosixNode, Attr)> {
        posix_names::mkdir(parent, name, mode, owner)
    }

    fn symlink(
        &self,
        parent: &PosixNode,
        name: &OsStr,
        target: &OsStr,
        owner: Owner,
    ) -> Result<(PosixNode, Attr)> {
        posix_names::symlink(parent, name, target, owner)
    }

    fn link(&self, node: &PosixNode, newparent: &PosixNode, newname: &OsStr) -> Result<Attr> {
        posix_names::link(node, newparent, newname)
    }

    fn unlink(&self, parent: &PosixNode, name: &OsStr) -> Result<()> {
        posix_names::unlink(parent, name)
    }

    fn rmdir(&self, parent: &PosixNode, name: &OsStr) -> Result<()> {
        posix_names::rmdir(parent, name)
    }

    fn rename(
        &self,
        parent: &PosixNode,
        name: &OsStr,
        newparent: &PosixNode,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        posix_names::rename(parent, name, newparent, newname, flags)
    }

    fn open(&self, node: &PosixNode, flags: i32) -> Result<PosixHandle> {
        posix_io::open(node, flags)
    }

    /// `openat` of the name with the caller's flags (never following a symlink, and
    /// non-blocking until the fstat has said it is a regular file: a FIFO put there behind
    /// our back would hang the open), then the node from the open file itself.
    fn open_child(
        &self,
        parent: &PosixNode,
        name: &OsStr,
        flags: i32,
    ) -> Option<Result<crate::Opened<PosixNode, PosixHandle>>> {
        Some(open_child_at(parent, name, flags))
    }

    fn create(
        &self,
        parent: &PosixNode,
        name: &OsStr,
        mode: u32,
        flags: i32,
        owner: Owner,
    ) -> Result<(PosixNode, Attr, PosixHandle)> {
        posix_io::create(parent, name, mode, flags, owner)
    }

    fn read(&self, handle: &PosixHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        posix_io::read(handle, offset, buf)
    }

    fn write(&self, handle: &PosixHandle, offset: u64, data: &[u8]) -> Result<u64> {
        posix_io::write(handle, offset, data)
    }

    fn write_vectored(&self, handle: &PosixHandle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        posix_io::write_vectored(handle, offset, bufs)
    }

    fn fstat(&self, handle: &PosixHandle) -> Result<Attr> {
        fstat_fd(handle.file.as_raw_fd())
    }

    fn fsync(&self, handle: &PosixHandle, datasync: bool) -> Result<()> {
        posix_io::fsync(handle, datasync)
    }

    fn fsyncdir(&self, node: &PosixNode, datasync: bool) -> Result<()> {
        posix_io::fsyncdir(node, datasync)
    }

    fn fallocate(&self, handle: &PosixHandle, mode: i32, offset: u64, len: u64) -> Result<()> {
        posix_io::fallocate(handle, mode, offset, len)
    }

    fn copy_range(
        &self,
        from: &PosixHandle,
        off_in: u64,
        to: &PosixHandle,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        posix_io::copy_range(from, off_in, to, off_out, len)
    }

    fn lseek(&self, handle: &PosixHandle, offset: i64, whence: i32) -> Result<i64> {
        posix_io::lseek(handle, offset, whence)
    }

    fn readdir(&self, node: &PosixNode) -> Result<Vec<DirEntry>> {
        Ok(self
            .list_dir(node, false)?
            .into_iter()
            .map(|(e, _)| e)
            .collect())
    }

    fn readdir_plus(&self, node: &PosixNode) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        self.list_dir(node, true)
    }

    fn names_list_cheaper(&self) -> bool {
        self.names_first.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn stat_names(&self, node: &PosixNode, names: &[OsString]) -> Vec<Option<Attr>> {
        // (A name with a NUL or a slash names nothing here.)
        let Some(names) = names
            .iter()
            .map(|n| component(n).ok().map(|c| (c, 0, None)))
            .collect::<Option<Vec<_>>>()
        else {
            return vec![None; names.len()];
        };
        // fstatat takes the node's O_PATH descriptor as it is: no open of the directory
        // (over a FUSE or network store an OPENDIR and a RELEASEDIR).
        let wanted: Vec<usize> = (0..names.len()).collect();
        self.stat_entries(node.fd(), &names, &wanted)
    }

    fn statfs(&self, node: &PosixNode) -> Result<StatFs> {
        let mut st: libc::statfs64 = unsafe { std::mem::zeroed() };
        cvt(unsafe { libc::fstatfs64(node.fd(), &mut st) })?;
        Ok(StatFs {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namelen as u32,
            frsize: st.f_frsize as u32,
        })
    }

    fn getxattr(&self, node: &PosixNode, name: &OsStr) -> Result<Vec<u8>> {
        posix_attr::getxattr(node, name)
    }

    fn getxattr_at(
        &self,
        parent: &PosixNode,
        name: &OsStr,
        xname: &OsStr,
    ) -> Option<Result<Vec<u8>>> {
        posix_attr::getxattr_at(parent, name, xname)
    }

    fn setxattr(&self, node: &PosixNode, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        posix_attr::setxattr(node, name, value, flags)
    }

    fn listxattr(&self, node: &PosixNode) -> Result<Vec<u8>> {
        posix_attr::listxattr(node)
    }

    fn removexattr(&self, node: &PosixNode, name: &OsStr) -> Result<()> {
        posix_attr::removexattr(node, name)
    }
}

#[cfg(test)]
#[path = "posix_tests.rs"]
mod tests;
