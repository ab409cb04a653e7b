//! [`PosixStore`]: a backing store over any mounted directory (local disk, NFS, SMB).
//!
//! Confinement: every object is reached from the root by `openat(parent_fd, name,
//! O_PATH | O_NOFOLLOW)` with a single path component, so nothing in the backing tree (a symlink
//! to `/etc`, a `..`) can lead tierfs outside BACKING. Symlinks are returned as symlinks and
//! never followed. Operations that Linux does not offer on `O_PATH` descriptors use the
//! descriptor's own `/proc/self/fd/N` entry, which names exactly that inode.

use crate::identity::{decide, mount_of};
use crate::stat_fanout::StatFanout;
use crate::{
    Attr, DirEntry, Errno, Identity, IdentityChoice, Owner, Result, SetAttr, StatFs, Store,
    TimeUpdate,
};
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// A backing object: an `O_PATH` descriptor, valid across renames of the object.
#[derive(Clone, Debug)]
pub struct PosixNode(Arc<NodeFd>);

#[derive(Debug)]
struct NodeFd {
    fd: OwnedFd,
    /// Whether the object is a symlink, once an fstat has shown it (0 unknown, 1 no, 2 yes):
    /// an object never changes kind, and setattr needs to know without an fstat of its own
    /// (each is a round trip on NFS).
    symlink: std::sync::atomic::AtomicU8,
}

impl PosixNode {
    fn new(fd: OwnedFd) -> PosixNode {
        PosixNode(Arc::new(NodeFd {
            fd,
            symlink: std::sync::atomic::AtomicU8::new(0),
        }))
    }
    fn fd(&self) -> RawFd {
        self.0.fd.as_raw_fd()
    }
    fn proc_path(&self) -> CString {
        proc_path(self.fd())
    }
    /// fstat of the object; remembers whether it is a symlink.
    fn stat(&self) -> Result<Attr> {
        let a = fstat_fd(self.fd())?;
        let v = if a.kind == crate::FileKind::Symlink {
            2
        } else {
            1
        };
        self.0
            .symlink
            .store(v, std::sync::atomic::Ordering::Relaxed);
        Ok(a)
    }
    fn is_symlink(&self) -> Result<bool> {
        match self.0.symlink.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Ok(self.stat()?.kind == crate::FileKind::Symlink),
            v => Ok(v == 2),
        }
    }
}

/// An open backing file.
#[derive(Debug)]
pub struct PosixHandle {
    file: File,
    append: bool,
}

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
}

/// chown of the object itself (a symlink too, never its target); u32::MAX keeps a field.
fn fchown_node(node: &PosixNode, uid: u32, gid: u32) -> Result<()> {
    let empty = c"";
    cvt(unsafe {
        libc::fchownat(
            node.fd(),
            empty.as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

fn cvt(ret: libc::c_int) -> Result<libc::c_int> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number")
}

/// One path component, as the kernel sends it. Anything that could walk elsewhere is refused.
fn component(name: &OsStr) -> Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    CString::new(b).map_err(|_| Errno::EINVAL)
}

fn fstat_fd(fd: RawFd) -> Result<Attr> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let empty = c"";
    cvt(unsafe {
        libc::fstatat(
            fd,
            empty.as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(Attr::from_stat(&st))
}

/// Attributes of `name` in directory `dirfd` (not following a symlink).
fn stat_at(dirfd: RawFd, name: &CStr) -> Result<Attr> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatat(dirfd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(Attr::from_stat(&st))
}

/// Attributes of `fd` fresh from the filesystem's server: `AT_STATX_FORCE_SYNC` makes an NFS
/// client revalidate (one GETATTR, what its own close-to-open check at open(2) costs) and a
/// FUSE client ask its daemon; a local filesystem answers as for fstat.
fn statx_sync_fd(fd: RawFd) -> Result<Attr> {
    let mut x: libc::statx = unsafe { std::mem::zeroed() };
    let empty = c"";
    cvt(unsafe {
        libc::statx(
            fd,
            empty.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_BASIC_STATS,
            &mut x,
        )
    })?;
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_dev = libc::makedev(x.stx_dev_major, x.stx_dev_minor);
    st.st_ino = x.stx_ino;
    st.st_mode = x.stx_mode as libc::mode_t;
    st.st_nlink = x.stx_nlink as _;
    st.st_uid = x.stx_uid;
    st.st_gid = x.stx_gid;
    st.st_rdev = libc::makedev(x.stx_rdev_major, x.stx_rdev_minor);
    st.st_size = x.stx_size as _;
    st.st_blocks = x.stx_blocks as _;
    st.st_blksize = x.stx_blksize as _;
    st.st_atime = x.stx_atime.tv_sec;
    st.st_atime_nsec = x.stx_atime.tv_nsec as _;
    st.st_mtime = x.stx_mtime.tv_sec;
    st.st_mtime_nsec = x.stx_mtime.tv_nsec as _;
    st.st_ctime = x.stx_ctime.tv_sec;
    st.st_ctime_nsec = x.stx_ctime.tv_nsec as _;
    Ok(Attr::from_stat(&st))
}

fn open_path_at(dirfd: RawFd, name: &CStr) -> Result<PosixNode> {
    let fd = cvt(unsafe {
        libc::openat(
            dirfd,
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    Ok(PosixNode::new(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Gives a new object in `parent` its creator as owner.
fn chown_node(parent: &PosixNode, node: &PosixNode, owner: Owner) -> Result<()> {
    if let Some((uid, mut gid)) = owner {
        // Created by the daemon's own identity (root mounting for root, a user for
        // themselves): the object already has that owner, or the setgid directory's group,
        // which is what the code below would keep. No fstat, no chown: two round trips less
        // per file on NFS (an untar creates thousands).
        // SAFETY: plain syscalls without arguments.
        if (uid, gid) == unsafe { (libc::geteuid(), libc::getegid()) } {
            return Ok(());
        }
        // chown(2) clears S_ISUID/S_ISGID of a non-directory, even when done by root and even
        // when the owner does not change: a file created with mode 04755 came out 0755 (found by
        // tests/model.rs). So: no chown when the owner is already right, and otherwise the
        // bits the creator asked for (the kernel has already stripped what it must) are put
        // back afterwards.
        let before = node.stat()?;
        // In a setgid directory a new object takes the directory's group, which the backing
        // filesystem has already given it, not the creator's (tests/model.rs caught files in a
        // setgid directory of group 1000 coming out group 0).
        if fstat_fd(parent.fd())?.perm & libc::S_ISGID as u16 != 0 {
            gid = before.gid;
        }
        if (before.uid, before.gid) == (uid, gid) {
            return Ok(());
        }
        fchown_node(node, uid, gid)?;
        if before.kind != crate::FileKind::Symlink && before.perm as u32 & crate::SUID_SGID != 0 {
            cvt(unsafe { libc::chmod(node.proc_path().as_ptr(), before.perm as libc::mode_t) })?;
        }
    }
    Ok(())
}

fn timespec(t: Option<TimeUpdate>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeUpdate::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeUpdate::Set(ts)) => libc::timespec {
            tv_sec: ts.sec,
            tv_nsec: ts.nsec as i64,
        },
    }
}

/// A readable descriptor of the directory `node` (an O_PATH descriptor cannot be listed or
/// synced).
fn open_dir(node: &PosixNode) -> Result<RawFd> {
    let dot = c".";
    cvt(unsafe {
        libc::openat(
            node.fd(),
            dot.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })
}

/// A directory stream of a node, closed when dropped.
struct DirStream(*mut libc::DIR);

impl DirStream {
    fn open(node: &PosixNode) -> Result<DirStream> {
        let fd = open_dir(node)?;
        let dir = unsafe { libc::fdopendir(fd) };
        if dir.is_null() {
            let e = Errno::last();
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(DirStream(dir))
    }

    fn fd(&self) -> RawFd {
        unsafe { libc::dirfd(self.0) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        unsafe { libc::closedir(self.0) };
    }
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
        Ok(PosixStore {
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

/// Up to `limit` entries of an open directory stream (not `.` and `..`): name, inode number
/// and type where the filesystem says.
fn read_names(
    dir: &DirStream,
    limit: usize,
) -> Result<Vec<(CString, u64, Option<crate::FileKind>)>> {
    let mut names = Vec::new();
    while names.len() < limit {
        // readdir signals errors only through errno.
        unsafe { *libc::__errno_location() = 0 };
        let ent = unsafe { libc::readdir64(dir.0) };
        if ent.is_null() {
            let e = unsafe { *libc::__errno_location() };
            return if e != 0 { Err(Errno(e)) } else { Ok(names) };
        }
        let ent = unsafe { &*ent };
        let name = unsafe { CStr::from_ptr(ent.d_name.as_ptr()) };
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        names.push((
            name.to_owned(),
            ent.d_ino,
            crate::FileKind::from_dirent_type(ent.d_type),
        ));
    }
    Ok(names)
}

/// fstatfs of a descriptor (an `O_PATH` one works); only whether it answers matters here.
fn fstatfs_fd(fd: RawFd) -> Result<()> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `st` is a valid out-pointer for one statfs.
    cvt(unsafe { libc::fstatfs(fd, st.as_mut_ptr()) })?;
    Ok(())
}

/// Runs `finish` (the rest of an operation that has just made `parent/c`: its node, owner and
/// attributes); if that fails, removes what was made, so the operation either happened whole
/// or not at all. A retry must not find a half-made object: the write-back flusher retries a
/// create that failed for want of a descriptor (EMFILE), and found EEXIST (its own file)
/// when the first attempt had made the file and failed to open its node.
fn undo_on_error<T>(
    parent: &PosixNode,
    c: &CString,
    dir: bool,
    finish: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let r = finish();
    if r.is_err() {
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: a valid descriptor and NUL-terminated name.
        unsafe { libc::unlinkat(parent.fd(), c.as_ptr(), flags) };
    }
    r
}

/// An `O_PATH` descriptor of the directory at `path`.
fn open_root(path: &Path) -> std::io::Result<PosixNode> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("backing path contains NUL"))?;
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PosixNode::new(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A readable, stable identity for a directory store: its path as a slug plus a hash of the
/// full path, e.g. `mnt-nfs-data-5f2c0e1a9d3b7c44`.
pub fn store_id_for(canon: &Path) -> String {
    let s = canon.to_string_lossy();
    crate::readable_id(&s, &s)
}

impl Store for PosixStore {
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

    fn lookup(&self, parent: &PosixNode, name: &OsStr) -> Result<(PosixNode, Attr)> {
        let c = component(name)?;
        let node = open_path_at(parent.fd(), &c)?;
        let attr = node.stat()?;
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
            let pfd = cvt(unsafe {
                libc::open(
                    proc_path(file.as_raw_fd()).as_ptr(),
                    libc::O_PATH | libc::O_CLOEXEC,
                )
            })?;
            let node = PosixNode::new(unsafe { OwnedFd::from_raw_fd(pfd) });
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
        let n = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        let p = xattr_path(node)?;
        loop {
            let size = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
            if size < 0 {
                return Err(Errno::last());
            }
            let mut buf = vec![0u8; size as usize];
            let got = unsafe {
                libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            };
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
fn xattr_path(node: &PosixNode) -> Result<CString> {
    // The kind as known from the lookup: the kernel asks for `security.capability` before
    // every write by root, and an fstat for each ask was a store round trip per write.
    if node.is_symlink()? {
        return Err(Errno::ENODATA);
    }
    Ok(node.proc_path())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlink_is_not_followed_out_of_the_store() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("escape")).unwrap();
        let store = PosixStore::open(dir.path()).unwrap();
        let (root, _) = store.root().unwrap();
        let (node, attr) = store.lookup(&root, OsStr::new("escape")).unwrap();
        assert_eq!(attr.kind, crate::FileKind::Symlink);
        assert_eq!(store.readlink(&node).unwrap(), OsString::from("/etc"));
        // Resolving a name through the symlink is refused: it is not a directory to us.
        assert_eq!(
            store.lookup(&node, OsStr::new("passwd")).unwrap_err(),
            Errno::ENOTDIR
        );
        assert_eq!(store.open(&node, libc::O_RDONLY).unwrap_err(), Errno::ELOOP);
        assert!(store.readdir(&node).is_err());
    }

    /// Run in a child process (the descriptor limit is the whole process's): with room for
    /// exactly one more descriptor, each create makes its object and then cannot open the
    /// object's node (EMFILE). Then nothing may be left at the name, or the retry finds EEXIST.
    #[test]
    fn a_create_that_fails_halfway_leaves_nothing() {
        const CHILD: &str = "TIERFS_EMFILE_CHILD";
        if let Some(dir) = std::env::var_os(CHILD) {
            let store = PosixStore::open(std::path::Path::new(&dir)).unwrap();
            let (root, _) = store.root().unwrap();
            let mut was = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut was) }, 0);
            let lim = libc::rlimit {
                rlim_cur: 256.min(was.rlim_cur),
                rlim_max: was.rlim_max,
            };
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
            // Every descriptor taken, then as many given back as the step before the node
            // needs: one for create (its open file), none for the others.
            let mut fill = Vec::new();
            while let Ok(f) = std::fs::File::open("/dev/null") {
                fill.push(f);
            }
            fill.pop();
            let f = libc::O_WRONLY | libc::O_EXCL;
            let mut made = vec![store.create(&root, OsStr::new("f"), 0o644, f, None).err()];
            fill.push(std::fs::File::open("/dev/null").unwrap());
            made.extend([
                store.mkdir(&root, OsStr::new("d"), 0o755, None).err(),
                store
                    .symlink(&root, OsStr::new("s"), OsStr::new("t"), None)
                    .err(),
                store
                    .mknod(&root, OsStr::new("n"), libc::S_IFIFO | 0o644, 0, None)
                    .err(),
            ]);
            drop(fill);
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &was) }, 0);
            assert_eq!(made, [Some(Errno(libc::EMFILE)); 4]);
            let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
            assert!(left.is_empty(), "left behind: {left:?}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "posix::tests::a_create_that_fails_halfway_leaves_nothing",
            ])
            .env(CHILD, dir.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    #[test]
    fn dot_dot_and_slashes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = PosixStore::open(dir.path()).unwrap();
        let (root, _) = store.root().unwrap();
        for bad in ["..", ".", "a/b", "../etc", ""] {
            assert_eq!(
                store.lookup(&root, OsStr::new(bad)).unwrap_err(),
                Errno::EINVAL,
                "{bad}"
            );
        }
    }

    #[test]
    fn node_survives_rename() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"hello").unwrap();
        let store = PosixStore::open(dir.path()).unwrap();
        let (root, _) = store.root().unwrap();
        let (node, a1) = store.lookup(&root, OsStr::new("a")).unwrap();
        store
            .rename(&root, OsStr::new("a"), &root, OsStr::new("b"), 0)
            .unwrap();
        let h = store.open(&node, libc::O_RDONLY).unwrap();
        let mut buf = [0u8; 5];
        assert_eq!(store.read(&h, 0, &mut buf).unwrap(), 5);
        assert_eq!(&buf, b"hello");
        assert_eq!(store.getattr(&node).unwrap().ino, a1.ino);
    }

    /// The many-at-a-time path of a listing's stats gives what the one-by-one path gives.
    #[test]
    fn parallel_listing_stats_match_serial_ones() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..300 {
            std::fs::write(dir.path().join(format!("f{i}")), vec![0u8; i]).unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let serial = PosixStore::open(dir.path()).unwrap();
        let mut parallel = PosixStore::open(dir.path()).unwrap();
        parallel.stat_fanout = StatFanout::new(crate::STAT_CONCURRENCY, std::time::Duration::ZERO);
        let list = |s: &PosixStore| {
            let (root, _) = s.root().unwrap();
            let mut v: Vec<_> = s
                .readdir_plus(&root)
                .unwrap()
                .into_iter()
                .map(|(e, a)| (e.name, e.kind, a.map(|a| (a.ino, a.size, a.kind))))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let (a, b) = (list(&serial), list(&parallel));
        assert_eq!(a.len(), 301);
        assert!(a.iter().all(|(_, _, attr)| attr.is_some()));
        assert_eq!(a, b);
    }

    #[test]
    fn store_id_is_stable_and_readable() {
        let id = store_id_for(Path::new("/mnt/nfs/data"));
        assert!(id.starts_with("mnt-nfs-data-"), "{id}");
        assert_eq!(id, store_id_for(Path::new("/mnt/nfs/data")));
        assert_ne!(id, store_id_for(Path::new("/mnt/nfs/dat")));
    }
}
