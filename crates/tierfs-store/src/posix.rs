//! [`PosixStore`]: a backing store over any mounted directory (local disk, NFS, SMB).
//!
//! Confinement: every object is reached from the root by `openat(parent_fd, name,
//! O_PATH | O_NOFOLLOW)` with a single path component, so nothing in the backing tree (a symlink
//! to `/etc`, a `..`) can lead tierfs outside BACKING. Symlinks are returned as symlinks and
//! never followed. Operations that Linux does not offer on `O_PATH` descriptors use the
//! descriptor's own `/proc/self/fd/N` entry, which names exactly that inode.

use crate::identity::{decide, mount_of};
use crate::posix_sys::*;
use crate::stat_fanout::StatFanout;
use crate::{
    Attr, DirEntry, Errno, Identity, IdentityChoice, Owner, Result, SetAttr, StatFs, Store,
};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
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

    fn readlink(&self, node: &PosixNode) -> Result<OsString> {
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

    fn mknod(
        &self,
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

    fn mkdir(
        &self,
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

    fn symlink(
        &self,
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

    fn link(&self, node: &PosixNode, newparent: &PosixNode, newname: &OsStr) -> Result<Attr> {
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

    fn unlink(&self, parent: &PosixNode, name: &OsStr) -> Result<()> {
        let c = component(name)?;
        cvt(unsafe { libc::unlinkat(parent.fd(), c.as_ptr(), 0) })?;
        Ok(())
    }

    fn rmdir(&self, parent: &PosixNode, name: &OsStr) -> Result<()> {
        let c = component(name)?;
        cvt(unsafe { libc::unlinkat(parent.fd(), c.as_ptr(), libc::AT_REMOVEDIR) })?;
        Ok(())
    }

    fn rename(
        &self,
        parent: &PosixNode,
        name: &OsStr,
        newparent: &PosixNode,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let a = component(name)?;
        let b = component(newname)?;
        cvt(unsafe {
            libc::renameat2(parent.fd(), a.as_ptr(), newparent.fd(), b.as_ptr(), flags)
        })?;
        Ok(())
    }

    fn open(&self, node: &PosixNode, flags: i32) -> Result<PosixHandle> {
        // The cache serves O_DIRECT callers; the backing file is read through normally.
        // O_NOFOLLOW would refuse the /proc magic link; the node is never a symlink here.
        let flags = flags
            & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NOFOLLOW | libc::O_DIRECT);
        let attr = node.stat()?;
        match attr.kind {
            crate::FileKind::File => {}
            crate::FileKind::Dir => return Err(Errno::EISDIR),
            crate::FileKind::Symlink => return Err(Errno::ELOOP),
            _ => return Err(Errno(libc::ENXIO)),
        }
        let fd = cvt(unsafe { libc::open(node.proc_path().as_ptr(), flags | libc::O_CLOEXEC) })?;
        Ok(PosixHandle {
            file: unsafe { File::from_raw_fd(fd) },
            append: flags & libc::O_APPEND != 0,
        })
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
        let c = component(name)?;
        let flags = (flags & !(libc::O_NOCTTY | libc::O_DIRECT))
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_CLOEXEC;
        let fd = cvt(unsafe { libc::openat(parent.fd(), c.as_ptr(), flags, mode) })?;
        let file = unsafe { File::from_raw_fd(fd) };
        let finish = || {
            // The node is taken from the open file itself, so it is the very inode we created.
            let node = PosixNode::of_file(&file)?;
            chown_node(parent, &node, owner)?;
            let attr = node.stat()?;
            Ok((node, attr))
        };
        // Only an exclusive create knows the file is its own to take back.
        let (node, attr) = if flags & libc::O_EXCL != 0 {
            undo_on_error(parent, &c, false, finish)?
        } else {
            finish()?
        };
        Ok((
            node,
            attr,
            PosixHandle {
                file,
                append: flags & libc::O_APPEND != 0,
            },
        ))
    }

    fn read(&self, handle: &PosixHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match handle.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(done)
    }

    fn write(&self, handle: &PosixHandle, offset: u64, data: &[u8]) -> Result<u64> {
        if handle.append {
            // pwrite on an O_APPEND descriptor appends whatever the offset; report where.
            let mut done = 0;
            let mut start = None;
            while done < data.len() {
                let n = cvt(unsafe {
                    libc::write(
                        handle.file.as_raw_fd(),
                        data[done..].as_ptr().cast(),
                        data.len() - done,
                    ) as libc::c_int
                })? as usize;
                if start.is_none() {
                    let end = unsafe { libc::lseek(handle.file.as_raw_fd(), 0, libc::SEEK_CUR) };
                    start = Some(if end >= 0 {
                        end as u64 - n as u64
                    } else {
                        offset
                    });
                }
                done += n;
            }
            return Ok(start.unwrap_or(offset));
        }
        let mut done = 0;
        while done < data.len() {
            match handle.file.write_at(&data[done..], offset + done as u64) {
                Ok(0) => return Err(Errno::EIO),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(offset)
    }

    fn write_vectored(&self, handle: &PosixHandle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        if handle.append {
            let mut at = offset;
            for b in bufs {
                self.write(handle, at, b)?;
                at += b.len() as u64;
            }
            return Ok(());
        }
        // pwritev, resumed after a short write: `skip` bytes of the list are done.
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut skip = 0usize;
        while skip < total {
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(bufs.len().min(1024));
            let mut pos = 0usize;
            for b in bufs {
                let end = pos + b.len();
                if end > skip && iov.len() < 1024 {
                    let from = skip.saturating_sub(pos);
                    iov.push(libc::iovec {
                        iov_base: b[from..].as_ptr() as *mut libc::c_void,
                        iov_len: b.len() - from,
                    });
                }
                pos = end;
            }
            let n = unsafe {
                libc::pwritev(
                    handle.file.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    (offset + skip as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            if n == 0 {
                return Err(Errno::EIO);
            }
            skip += n as usize;
        }
        Ok(())
    }

    fn fstat(&self, handle: &PosixHandle) -> Result<Attr> {
        fstat_fd(handle.file.as_raw_fd())
    }

    fn fsync(&self, handle: &PosixHandle, datasync: bool) -> Result<()> {
        let fd = handle.file.as_raw_fd();
        cvt(unsafe {
            if datasync {
                libc::fdatasync(fd)
            } else {
                libc::fsync(fd)
            }
        })?;
        Ok(())
    }

    fn fsyncdir(&self, node: &PosixNode, datasync: bool) -> Result<()> {
        let fd = open_dir(node)?;
        let f = unsafe { File::from_raw_fd(fd) };
        cvt(unsafe {
            if datasync {
                libc::fdatasync(f.as_raw_fd())
            } else {
                libc::fsync(f.as_raw_fd())
            }
        })?;
        Ok(())
    }

    fn fallocate(&self, handle: &PosixHandle, mode: i32, offset: u64, len: u64) -> Result<()> {
        cvt(unsafe {
            libc::fallocate64(handle.file.as_raw_fd(), mode, offset as i64, len as i64)
        })?;
        Ok(())
    }

    fn copy_range(
        &self,
        from: &PosixHandle,
        off_in: u64,
        to: &PosixHandle,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let (mut i, mut o) = (off_in as i64, off_out as i64);
        let n = unsafe {
            libc::copy_file_range(
                from.file.as_raw_fd(),
                &mut i,
                to.file.as_raw_fd(),
                &mut o,
                len as usize,
                0,
            )
        };
        if n < 0 {
            return Err(match Errno::last() {
                // The backing filesystems cannot copy between these files: say so as "not
                // here", so the kernel copies through reads and writes.
                e if e == Errno(libc::EXDEV) || e == Errno(libc::EOPNOTSUPP) => Errno(libc::ENOSYS),
                e => e,
            });
        }
        Ok(n as u64)
    }

    fn lseek(&self, handle: &PosixHandle, offset: i64, whence: i32) -> Result<i64> {
        let r = unsafe { libc::lseek64(handle.file.as_raw_fd(), offset, whence) };
        if r < 0 {
            return Err(Errno::last());
        }
        Ok(r)
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
        get_xattr(&xattr_path(node)?, name, false)
    }

    /// Through the directory's descriptor and one name component (`lgetxattr` of
    /// `/proc/self/fd/N/NAME`): the name cannot lead out of the store, and a symlink's own
    /// attributes are read, never its target's.
    fn getxattr_at(
        &self,
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

    fn setxattr(&self, node: &PosixNode, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
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

    fn listxattr(&self, node: &PosixNode) -> Result<Vec<u8>> {
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

    fn removexattr(&self, node: &PosixNode, name: &OsStr) -> Result<()> {
        let n = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        let p = xattr_path(node)?;
        cvt(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })?;
        Ok(())
    }
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

#[cfg(test)]
#[path = "posix_tests.rs"]
mod tests;
