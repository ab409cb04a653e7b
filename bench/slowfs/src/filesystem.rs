//! The FUSE requests of slowfs (`fuser::Filesystem`): each does its work on the backing
//! directory (through `backing` where it takes more than a line or two) and replies after the
//! emulated cost of a metadata request or of its data.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Instant, SystemTime};

use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::backing::xattr_reply;
use crate::fs::{check, cstr, cstr_os, errno, last_errno, SlowFs, TTL};

const MAX_WRITE: u32 = 1 << 20;

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
