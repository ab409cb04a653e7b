//! The system calls under [`crate::PosixStore`]: its node (an `O_PATH` descriptor) and the
//! `*at` calls on one, each with a single path component so that nothing leads outside
//! BACKING (see `posix`), directory streams, and the undo of a half-made object.

use crate::{Attr, Errno, Owner, Result, TimeUpdate};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

/// A backing object: an `O_PATH` descriptor, valid across renames of the object.
#[derive(Clone, Debug)]
pub struct PosixNode(Arc<NodeFd>);

#[derive(Debug)]
pub(crate) struct NodeFd {
    fd: OwnedFd,
    /// Whether the object is a symlink, once an fstat has shown it (0 unknown, 1 no, 2 yes):
    /// an object never changes kind, and setattr needs to know without an fstat of its own
    /// (each is a round trip on NFS).
    symlink: std::sync::atomic::AtomicU8,
}

impl PosixNode {
    pub(crate) fn new(fd: OwnedFd) -> PosixNode {
        PosixNode(Arc::new(NodeFd {
            fd,
            symlink: std::sync::atomic::AtomicU8::new(0),
        }))
    }
    /// The node of an open file: the very inode it has open (not whatever its name leads to
    /// by now), through the file's own `/proc/self/fd` entry.
    pub(crate) fn of_file(file: &File) -> Result<PosixNode> {
        let pfd = cvt(unsafe {
            libc::open(
                proc_path(file.as_raw_fd()).as_ptr(),
                libc::O_PATH | libc::O_CLOEXEC,
            )
        })?;
        Ok(PosixNode::new(unsafe { OwnedFd::from_raw_fd(pfd) }))
    }
    pub(crate) fn fd(&self) -> RawFd {
        self.0.fd.as_raw_fd()
    }
    pub(crate) fn proc_path(&self) -> CString {
        proc_path(self.fd())
    }
    /// fstat of the object; remembers whether it is a symlink.
    pub(crate) fn stat(&self) -> Result<Attr> {
        self.noted(fstat_fd(self.fd())?)
    }
    /// Its attributes fresh from the filesystem's server (see [`statx_sync_fd`]).
    pub(crate) fn stat_sync(&self) -> Result<Attr> {
        self.noted(statx_sync_fd(self.fd())?)
    }
    /// `a`, having noted whether it is a symlink.
    pub(crate) fn noted(&self, a: Attr) -> Result<Attr> {
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
    pub(crate) fn is_symlink(&self) -> Result<bool> {
        match self.0.symlink.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Ok(self.stat()?.kind == crate::FileKind::Symlink),
            v => Ok(v == 2),
        }
    }
}

/// chown of the object itself (a symlink too, never its target); u32::MAX keeps a field.
pub(crate) fn fchown_node(node: &PosixNode, uid: u32, gid: u32) -> Result<()> {
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

pub(crate) fn cvt(ret: libc::c_int) -> Result<libc::c_int> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

pub(crate) fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number")
}

/// One path component, as the kernel sends it. Anything that could walk elsewhere is refused.
pub(crate) fn component(name: &OsStr) -> Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    CString::new(b).map_err(|_| Errno::EINVAL)
}

pub(crate) fn fstat_fd(fd: RawFd) -> Result<Attr> {
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
pub(crate) fn stat_at(dirfd: RawFd, name: &CStr) -> Result<Attr> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatat(dirfd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(Attr::from_stat(&st))
}

/// Attributes of `fd` fresh from the filesystem's server: `AT_STATX_FORCE_SYNC` makes an NFS
/// client revalidate (one GETATTR, what its own close-to-open check at open(2) costs) and a
/// FUSE client ask its daemon; a local filesystem answers as for fstat.
pub(crate) fn statx_sync_fd(fd: RawFd) -> Result<Attr> {
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

pub(crate) fn open_path_at(dirfd: RawFd, name: &CStr) -> Result<PosixNode> {
    let fd = cvt(unsafe {
        libc::openat(
            dirfd,
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    Ok(PosixNode::new(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// See [`PosixStore::open_child`].
pub(crate) fn open_child_at(
    parent: &PosixNode,
    name: &OsStr,
    flags: i32,
) -> Result<(PosixNode, Attr, PosixHandle)> {
    let c = component(name)?;
    let flags =
        flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_DIRECT | libc::O_TRUNC);
    let fd = cvt(unsafe {
        libc::openat(
            parent.fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    })?;
    let file = unsafe { File::from_raw_fd(fd) };
    let attr = fstat_fd(file.as_raw_fd())?;
    match attr.kind {
        crate::FileKind::File => {}
        crate::FileKind::Dir => return Err(Errno::EISDIR),
        _ => return Err(Errno(libc::ENXIO)),
    }
    if flags & libc::O_NONBLOCK == 0 {
        cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_ACCMODE) })?;
    }
    let node = PosixNode::of_file(&file)?;
    let attr = node.noted(attr)?;
    Ok((
        node,
        attr,
        PosixHandle {
            file,
            append: flags & libc::O_APPEND != 0,
        },
    ))
}

/// Gives a new object in `parent` its creator as owner.
pub(crate) fn chown_node(parent: &PosixNode, node: &PosixNode, owner: Owner) -> Result<()> {
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

pub(crate) fn timespec(t: Option<TimeUpdate>) -> libc::timespec {
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
pub(crate) fn open_dir(node: &PosixNode) -> Result<RawFd> {
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
pub(crate) struct DirStream(pub(crate) *mut libc::DIR);

impl DirStream {
    pub(crate) fn open(node: &PosixNode) -> Result<DirStream> {
        let fd = open_dir(node)?;
        let dir = unsafe { libc::fdopendir(fd) };
        if dir.is_null() {
            let e = Errno::last();
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(DirStream(dir))
    }

    pub(crate) fn fd(&self) -> RawFd {
        unsafe { libc::dirfd(self.0) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        unsafe { libc::closedir(self.0) };
    }
}

/// Up to `limit` entries of an open directory stream (not `.` and `..`): name, inode number
/// and type where the filesystem says.
pub(crate) fn read_names(
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
pub(crate) fn fstatfs_fd(fd: RawFd) -> Result<()> {
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
pub(crate) fn undo_on_error<T>(
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
pub(crate) fn open_root(path: &Path) -> std::io::Result<PosixNode> {
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

/// An open backing file.
#[derive(Debug)]
pub struct PosixHandle {
    pub(crate) file: File,
    pub(crate) append: bool,
}
