//! Path-based FUSE passthrough with every reply delayed by the slow-store model.
//!
//! Inode numbers are the backing `st_ino` (the backing root is inode 1). A table maps each inode
//! the kernel knows about to the backing path it was last looked up under. Attribute and entry
//! TTLs are zero, so the kernel looks every path component up again on each access, which keeps
//! the table fresh and makes every access cost a request (as on an uncached network store).

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::emu::Emu;

/// No kernel attribute/entry caching: every stat and path walk reaches us.
const TTL: Duration = Duration::ZERO;
/// Inode number used for a backing file whose st_ino is 1 (clashes with the FUSE root).
const INO_ONE_ALIAS: u64 = u64::MAX - 1;
const MAX_WRITE: u32 = 1 << 20;

type R<T> = Result<T, Errno>;

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn last_errno() -> Errno {
    errno(io::Error::last_os_error())
}

fn cstr(p: &Path) -> R<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

fn cstr_os(s: &OsStr) -> R<CString> {
    CString::new(s.as_bytes()).map_err(|_| Errno::EINVAL)
}

fn check(rc: libc::c_int) -> R<()> {
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

fn systime(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

struct Node {
    path: PathBuf,
    nlookup: u64,
}

struct DirEnt {
    ino: u64,
    kind: FileType,
    name: OsString,
}

pub struct SlowFs {
    root: PathBuf,
    root_key: (u64, u64),
    emu: Emu,
    nodes: Mutex<HashMap<u64, Node>>,
    /// fh -> (inode, open backing file).
    files: Mutex<HashMap<u64, (u64, Arc<File>)>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEnt>>>>,
    next_fh: AtomicU64,
    is_root: bool,
}

impl SlowFs {
    pub fn new(root: PathBuf, emu: Emu) -> io::Result<SlowFs> {
        let md = std::fs::metadata(&root)?;
        if !md.is_dir() {
            return Err(io::Error::other("backing path is not a directory"));
        }
        let mut nodes = HashMap::new();
        nodes.insert(
            1,
            Node {
                path: root.clone(),
                nlookup: 1,
            },
        );
        Ok(SlowFs {
            root,
            root_key: (md.dev(), md.ino()),
            emu,
            nodes: Mutex::new(nodes),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            // SAFETY: geteuid has no preconditions.
            is_root: unsafe { libc::geteuid() } == 0,
        })
    }

    fn ino_of(&self, dev: u64, ino: u64) -> u64 {
        if (dev, ino) == self.root_key {
            1
        } else if ino == 1 {
            INO_ONE_ALIAS
        } else {
            ino
        }
    }

    fn attr(&self, md: &Metadata) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.ino_of(md.dev(), md.ino())),
            size: md.size(),
            blocks: md.blocks(),
            atime: systime(md.atime(), md.atime_nsec()),
            mtime: systime(md.mtime(), md.mtime_nsec()),
            ctime: systime(md.ctime(), md.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind_of(md.mode()),
            perm: (md.mode() & 0o7777) as u16,
            nlink: md.nlink() as u32,
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev() as u32,
            blksize: md.blksize() as u32,
            flags: 0,
        }
    }

    fn path(&self, ino: INodeNo) -> R<PathBuf> {
        if ino.0 == 1 {
            return Ok(self.root.clone());
        }
        self.nodes
            .lock()
            .unwrap()
            .get(&ino.0)
            .map(|n| n.path.clone())
            .ok_or(Errno::from_i32(libc::ESTALE))
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> R<PathBuf> {
        if name.as_bytes().contains(&b'/') {
            return Err(Errno::EINVAL);
        }
        Ok(self.path(parent)?.join(name))
    }

    /// stat `path`, record it as the current path of its inode and count one lookup.
    fn remember(&self, path: PathBuf) -> R<FileAttr> {
        let md = std::fs::symlink_metadata(&path).map_err(errno)?;
        let attr = self.attr(&md);
        if attr.ino.0 != 1 {
            let mut nodes = self.nodes.lock().unwrap();
            let n = nodes.entry(attr.ino.0).or_insert(Node {
                path: PathBuf::new(),
                nlookup: 0,
            });
            n.path = path;
            n.nlookup += 1;
        }
        Ok(attr)
    }

    /// Give a newly created object to the requesting user (we usually run as root).
    fn chown_new(&self, req: &Request, path: &Path) {
        if self.is_root && (req.uid() != 0 || req.gid() != 0) {
            if let Ok(c) = cstr(path) {
                // SAFETY: valid NUL-terminated path.
                unsafe { libc::lchown(c.as_ptr(), req.uid(), req.gid()) };
            }
        }
    }

    fn file(&self, fh: FileHandle) -> R<Arc<File>> {
        self.files
            .lock()
            .unwrap()
            .get(&fh.0)
            .map(|(_, f)| f.clone())
            .ok_or(Errno::EBADF)
    }

    fn add_file(&self, ino: u64, f: File) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().unwrap().insert(fh, (ino, Arc::new(f)));
        fh
    }

    /// Any open handle of `ino`: lets getattr/setattr work on files that were unlinked or
    /// renamed over while open (the kernel sends no fh with fstat()).
    fn any_open_file(&self, ino: INodeNo) -> Option<Arc<File>> {
        self.files
            .lock()
            .unwrap()
            .values()
            .find(|(i, _)| *i == ino.0)
            .map(|(_, f)| f.clone())
    }

    /// The backing path of `ino` if it still names that inode.
    fn live_path(&self, ino: INodeNo) -> R<PathBuf> {
        let p = self.path(ino)?;
        let md = std::fs::symlink_metadata(&p).map_err(errno)?;
        if self.ino_of(md.dev(), md.ino()) != ino.0 {
            return Err(Errno::ENOENT);
        }
        Ok(p)
    }

    fn open_backing(path: &Path, flags: i32, mode: u32) -> R<File> {
        let c = cstr(path)?;
        // Never O_DIRECT on the backing file: our buffers are not aligned, and the emulated
        // cost dominates anyway.
        let flags = (flags & !(libc::O_NOCTTY | libc::O_DIRECT)) | libc::O_CLOEXEC;
        // SAFETY: valid path; the fd is owned by the returned File.
        let fd = unsafe { libc::open(c.as_ptr(), flags, mode as libc::c_uint) };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: fd is a freshly opened descriptor we own.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Reply to a metadata request after its emulated cost.
    fn meta<F: FnOnce() + Send + 'static>(&self, t0: Instant, f: F) {
        let d = self.emu.meta_deadline(t0);
        self.emu.reply_at(t0, d, f);
    }

    fn entry_reply(&self, t0: Instant, r: R<FileAttr>, reply: ReplyEntry) {
        self.meta(t0, move || match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        });
    }

    fn empty_reply(&self, t0: Instant, r: R<()>, reply: ReplyEmpty) {
        self.meta(t0, move || match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    fn attr_reply(&self, t0: Instant, r: R<FileAttr>, reply: ReplyAttr) {
        self.meta(t0, move || match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn do_setattr(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> R<FileAttr> {
        let mut file = fh.and_then(|fh| self.file(fh).ok());
        let path = match self.live_path(ino) {
            Ok(p) => p,
            Err(e) => {
                if file.is_none() {
                    file = Some(self.any_open_file(ino).ok_or(e)?);
                }
                PathBuf::new()
            }
        };
        let c = cstr(&path)?;
        if let Some(mode) = mode {
            // SAFETY: valid fd / path.
            let rc = match &file {
                Some(f) => unsafe { libc::fchmod(f.as_raw_fd(), mode & 0o7777) },
                None => unsafe { libc::chmod(c.as_ptr(), mode & 0o7777) },
            };
            check(rc)?;
        }
        if uid.is_some() || gid.is_some() {
            let u = uid.unwrap_or(u32::MAX);
            let g = gid.unwrap_or(u32::MAX);
            // SAFETY: valid fd / path; -1 (u32::MAX) means "unchanged".
            let rc = match &file {
                Some(f) => unsafe { libc::fchown(f.as_raw_fd(), u, g) },
                None => unsafe { libc::lchown(c.as_ptr(), u, g) },
            };
            check(rc)?;
        }
        if let Some(size) = size {
            match &file {
                Some(f) => f.set_len(size).map_err(errno)?,
                // SAFETY: valid path.
                None => check(unsafe { libc::truncate(c.as_ptr(), size as libc::off_t) })?,
            }
        }
        if atime.is_some() || mtime.is_some() {
            let ts = |t: Option<TimeOrNow>| match t {
                None => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                Some(TimeOrNow::Now) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                Some(TimeOrNow::SpecificTime(t)) => {
                    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                    libc::timespec {
                        tv_sec: d.as_secs() as libc::time_t,
                        tv_nsec: d.subsec_nanos() as libc::c_long,
                    }
                }
            };
            let times = [ts(atime), ts(mtime)];
            // SAFETY: valid fd / path and a two-element timespec array.
            let rc = match &file {
                Some(f) => unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) },
                None => unsafe {
                    libc::utimensat(
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        times.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                },
            };
            check(rc)?;
        }
        let md = match &file {
            Some(f) => f.metadata().map_err(errno)?,
            None => std::fs::symlink_metadata(&path).map_err(errno)?,
        };
        Ok(self.attr(&md))
    }

    fn do_getattr(&self, ino: INodeNo, fh: Option<FileHandle>) -> R<FileAttr> {
        if let Some(f) = fh.and_then(|fh| self.file(fh).ok()) {
            return Ok(self.attr(&f.metadata().map_err(errno)?));
        }
        match self.live_path(ino) {
            Ok(p) => Ok(self.attr(&std::fs::symlink_metadata(p).map_err(errno)?)),
            // The path we knew is gone or now names another file (unlinked / renamed over).
            Err(e) => match self.any_open_file(ino) {
                Some(f) => Ok(self.attr(&f.metadata().map_err(errno)?)),
                None => Err(e),
            },
        }
    }

    fn do_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> R<()> {
        let from = self.child(parent, name)?;
        let to = self.child(newparent, newname)?;
        let (cf, ct) = (cstr(&from)?, cstr(&to)?);
        // SAFETY: valid paths.
        check(unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cf.as_ptr(),
                libc::AT_FDCWD,
                ct.as_ptr(),
                flags.bits(),
            )
        })?;
        let exchange = flags.bits() & libc::RENAME_EXCHANGE != 0;
        let mut nodes = self.nodes.lock().unwrap();
        for n in nodes.values_mut() {
            if let Ok(rest) = n.path.strip_prefix(&from) {
                n.path = to.join(rest);
            } else if exchange {
                if let Ok(rest) = n.path.strip_prefix(&to) {
                    n.path = from.join(rest);
                }
            }
        }
        Ok(())
    }

    fn do_read(&self, fh: FileHandle, offset: u64, size: u32) -> R<Vec<u8>> {
        let f = self.file(fh)?;
        let mut buf = vec![0u8; size as usize];
        let mut done = 0usize;
        while done < buf.len() {
            match f.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(errno(e)),
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    fn do_write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> R<u32> {
        let f = self.file(fh)?;
        f.write_all_at(data, offset).map_err(errno)?;
        Ok(data.len() as u32)
    }

    fn do_opendir(&self, ino: INodeNo) -> R<u64> {
        let path = self.path(ino)?;
        let mut ents = vec![
            DirEnt {
                ino: ino.0,
                kind: FileType::Directory,
                name: ".".into(),
            },
            DirEnt {
                ino: 1,
                kind: FileType::Directory,
                name: "..".into(),
            },
        ];
        let md = std::fs::metadata(&path).map_err(errno)?;
        for e in std::fs::read_dir(&path).map_err(errno)? {
            let e = e.map_err(errno)?;
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => FileType::Directory,
                Ok(t) if t.is_symlink() => FileType::Symlink,
                Ok(t) if t.is_file() => FileType::RegularFile,
                Ok(t) => FileType::from_std(t).unwrap_or(FileType::RegularFile),
                Err(_) => FileType::RegularFile,
            };
            ents.push(DirEnt {
                ino: self.ino_of(md.dev(), std::os::unix::fs::DirEntryExt::ino(&e)),
                kind,
                name: e.file_name(),
            });
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().unwrap().insert(fh, Arc::new(ents));
        Ok(fh)
    }

    fn do_xattr_get(&self, ino: INodeNo, name: Option<&OsStr>, size: u32) -> R<XattrOut> {
        let c = cstr(&self.path(ino)?)?;
        let cname = name.map(cstr_os).transpose()?;
        let mut buf = vec![0u8; size as usize];
        let (ptr, len) = if size == 0 {
            (std::ptr::null_mut(), 0)
        } else {
            (buf.as_mut_ptr() as *mut libc::c_void, buf.len())
        };
        // SAFETY: valid path/name; buffer pointer and length match (or null/0 for a size probe).
        let n = unsafe {
            match &cname {
                Some(cn) => libc::lgetxattr(c.as_ptr(), cn.as_ptr(), ptr, len),
                None => libc::llistxattr(c.as_ptr(), ptr as *mut libc::c_char, len),
            }
        };
        if n < 0 {
            return Err(last_errno());
        }
        if size == 0 {
            Ok(XattrOut::Size(n as u32))
        } else {
            buf.truncate(n as usize);
            Ok(XattrOut::Data(buf))
        }
    }
}

enum XattrOut {
    Size(u32),
    Data(Vec<u8>),
}

fn xattr_reply(r: R<XattrOut>, reply: ReplyXattr) {
    match r {
        Ok(XattrOut::Size(n)) => reply.size(n),
        Ok(XattrOut::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

const OPEN_FLAGS: FopenFlags =
    FopenFlags::FOPEN_DIRECT_IO.union(FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);

impl Filesystem for SlowFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        let caps = config.capabilities();
        for want in [
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        ] {
            if caps.contains(want) {
                let _ = config.add_capabilities(want);
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t0 = Instant::now();
        let r = self.child(parent, name).and_then(|p| self.remember(p));
        self.entry_reply(t0, r, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino.0 == 1 {
            return;
        }
        let mut nodes = self.nodes.lock().unwrap();
        if let Some(n) = nodes.get_mut(&ino.0) {
            n.nlookup = n.nlookup.saturating_sub(nlookup);
            if n.nlookup == 0 {
                nodes.remove(&ino.0);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let t0 = Instant::now();
        let r = self.do_getattr(ino, fh);
        self.attr_reply(t0, r, reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let t0 = Instant::now();
        let r = self.do_setattr(ino, mode, uid, gid, size, atime, mtime, fh);
        self.attr_reply(t0, r, reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let t0 = Instant::now();
        let r = self
            .path(ino)
            .and_then(|p| std::fs::read_link(p).map_err(errno));
        self.meta(t0, move || match r {
            Ok(t) => reply.data(t.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let t0 = Instant::now();
        let r = (|| {
            let p = self.child(parent, name)?;
            let c = cstr(&p)?;
            // SAFETY: valid path.
            check(unsafe { libc::mknod(c.as_ptr(), mode, rdev as libc::dev_t) })?;
            self.chown_new(req, &p);
            self.remember(p)
        })();
        self.entry_reply(t0, r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let t0 = Instant::now();
        let r = (|| {
            let p = self.child(parent, name)?;
            let c = cstr(&p)?;
            // SAFETY: valid path.
            check(unsafe { libc::mkdir(c.as_ptr(), mode) })?;
            self.chown_new(req, &p);
            self.remember(p)
        })();
        self.entry_reply(t0, r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t0 = Instant::now();
        let r = self
            .child(parent, name)
            .and_then(|p| std::fs::remove_file(p).map_err(errno));
        self.empty_reply(t0, r, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t0 = Instant::now();
        let r = self
            .child(parent, name)
            .and_then(|p| std::fs::remove_dir(p).map_err(errno));
        self.empty_reply(t0, r, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let t0 = Instant::now();
        let r = (|| {
            let p = self.child(parent, link_name)?;
            std::os::unix::fs::symlink(target, &p).map_err(errno)?;
            self.chown_new(req, &p);
            self.remember(p)
        })();
        self.entry_reply(t0, r, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let t0 = Instant::now();
        let r = self.do_rename(parent, name, newparent, newname, flags);
        self.empty_reply(t0, r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let t0 = Instant::now();
        let r = (|| {
            let from = self.path(ino)?;
            let to = self.child(newparent, newname)?;
            std::fs::hard_link(&from, &to).map_err(errno)?;
            self.remember(to)
        })();
        self.entry_reply(t0, r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let t0 = Instant::now();
        let r = self.path(ino).and_then(|p| {
            let f = Self::open_backing(&p, flags.0 & !(libc::O_CREAT | libc::O_EXCL), 0)?;
            Ok(self.add_file(ino.0, f))
        });
        self.meta(t0, move || match r {
            Ok(fh) => reply.opened(FileHandle(fh), OPEN_FLAGS),
            Err(e) => reply.error(e),
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let t0 = Instant::now();
        match self.do_read(fh, offset, size) {
            Ok(buf) => {
                let d = self
                    .emu
                    .data_deadline(t0, ino.0, offset, buf.len() as u64, false);
                self.emu.reply_at(t0, d, move || reply.data(&buf));
            }
            Err(e) => self.meta(t0, move || reply.error(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let t0 = Instant::now();
        match self.do_write(fh, offset, data) {
            Ok(n) => {
                let d = self.emu.data_deadline(t0, ino.0, offset, n as u64, true);
                self.emu.reply_at(t0, d, move || reply.written(n));
            }
            Err(e) => self.meta(t0, move || reply.error(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let t0 = Instant::now();
        self.empty_reply(t0, Ok(()), reply);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let t0 = Instant::now();
        let r = self
            .files
            .lock()
            .unwrap()
            .remove(&fh.0)
            .map(|_| ())
            .ok_or(Errno::EBADF);
        self.empty_reply(t0, r, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let t0 = Instant::now();
        let r = self.file(fh).and_then(|f| {
            if datasync {
                f.sync_data().map_err(errno)
            } else {
                f.sync_all().map_err(errno)
            }
        });
        self.empty_reply(t0, r, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let t0 = Instant::now();
        let r = self.do_opendir(ino);
        self.meta(t0, move || match r {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let t0 = Instant::now();
        let ents = self.dirs.lock().unwrap().get(&fh.0).cloned();
        match ents {
            None => self.meta(t0, move || reply.error(Errno::EBADF)),
            Some(ents) => {
                for (i, e) in ents.iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(e.ino), i as u64 + 1, e.kind, &e.name) {
                        break;
                    }
                }
                self.meta(t0, move || reply.ok());
            }
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let t0 = Instant::now();
        self.dirs.lock().unwrap().remove(&fh.0);
        self.empty_reply(t0, Ok(()), reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let t0 = Instant::now();
        let r = self
            .path(ino)
            .and_then(|p| File::open(p).and_then(|f| f.sync_all()).map_err(errno));
        self.empty_reply(t0, r, reply);
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let t0 = Instant::now();
        let r = (|| {
            let c = cstr(&self.path(ino).unwrap_or_else(|_| self.root.clone()))?;
            // SAFETY: zeroed statvfs is a valid out-parameter.
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: valid path and out-pointer.
            check(unsafe { libc::statvfs(c.as_ptr(), &mut s) })?;
            Ok(s)
        })();
        self.meta(t0, move || match r {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let t0 = Instant::now();
        let r = (|| {
            let c = cstr(&self.path(ino)?)?;
            let n = cstr_os(name)?;
            // SAFETY: valid path/name and value buffer.
            check(unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    n.as_ptr(),
                    value.as_ptr() as *const libc::c_void,
                    value.len(),
                    flags,
                )
            })
        })();
        self.empty_reply(t0, r, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let t0 = Instant::now();
        let r = self.do_xattr_get(ino, Some(name), size);
        self.meta(t0, move || xattr_reply(r, reply));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let t0 = Instant::now();
        let r = self.do_xattr_get(ino, None, size);
        self.meta(t0, move || xattr_reply(r, reply));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t0 = Instant::now();
        let r = (|| {
            let c = cstr(&self.path(ino)?)?;
            let n = cstr_os(name)?;
            // SAFETY: valid path/name.
            check(unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) })
        })();
        self.empty_reply(t0, r, reply);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let t0 = Instant::now();
        let r = (|| {
            let c = cstr(&self.path(ino)?)?;
            // SAFETY: valid path.
            check(unsafe { libc::access(c.as_ptr(), mask.bits()) })
        })();
        self.empty_reply(t0, r, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let t0 = Instant::now();
        let r = (|| {
            let p = self.child(parent, name)?;
            let f = Self::open_backing(&p, flags | libc::O_CREAT, mode)?;
            self.chown_new(req, &p);
            let attr = self.remember(p)?;
            Ok((attr, self.add_file(attr.ino.0, f)))
        })();
        self.meta(t0, move || match r {
            Ok((a, fh)) => reply.created(&TTL, &a, Generation(0), FileHandle(fh), OPEN_FLAGS),
            Err(e) => reply.error(e),
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let t0 = Instant::now();
        let r = self.file(fh).and_then(|f| {
            // SAFETY: valid fd.
            check(unsafe {
                libc::fallocate(
                    f.as_raw_fd(),
                    mode,
                    offset as libc::off_t,
                    length as libc::off_t,
                )
            })
        });
        self.empty_reply(t0, r, reply);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let t0 = Instant::now();
        let r = self.file(fh).and_then(|f| {
            // SAFETY: valid fd. (Data is read with pread, so moving the fd offset is harmless.)
            let o = unsafe { libc::lseek(f.as_raw_fd(), offset as libc::off_t, whence) };
            if o < 0 {
                Err(last_errno())
            } else {
                Ok(o)
            }
        });
        self.meta(t0, move || match r {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e),
        });
    }
}
