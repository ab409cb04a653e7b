//! [`Adapter`]'s `fuser::Filesystem` impl: every FUSE operation, answered on the fuser thread
//! when the core can without the store, else handed to the I/O pool. INIT, the namespace,
//! attributes and xattrs are here; file data goes to `adapter_file`, listings to
//! `adapter_dir`.

use crate::adapter::{
    created_reply, entry_reply, errno, reply_xattr, requester, time_update, Adapter,
};
use crate::attr::file_attr;
use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, Filesystem, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::time::SystemTime;
use tierfs_fs::{SetAttr, Store};

impl<S: Store> Filesystem for Adapter<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each capability is asked for alone: an old kernel lacking one still mounts.
        for cap in [
            // Without it, O_DIRECT reads from applications are serialized (FUSE-NOTES 1).
            InitFlags::FUSE_ASYNC_DIO,
            // The kernel drops a file's pages when getattr shows its mtime or size moved:
            // changes behind our back are not served from the page cache.
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_MAX_PAGES,
            // Setuid/setgid are dropped by us (`setattr`, `open`, `write`): without it the
            // kernel asks for the attributes before every chown, one GETATTR per untarred
            // file.
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ] {
            let _ = config.add_capabilities(cap);
        }
        // READDIRPLUS for every page, not only the first (the kernel's "auto" mode): a
        // listing comes with its entries' attributes from the metadata cache, and a `find`
        // or `ls -l` that stats every entry then costs no LOOKUP each (1,000 entries over
        // sshfs: 90 ms of lookups). Without the metadata cache (`meta.ttl=0`) each entry of a
        // READDIRPLUS page costs a store lookup: there the kernel decides (auto).
        // A mount listed for names first (`namespace::entry_attrs`) has the kernel decide too:
        // READDIRPLUS for a directory's first page (answered with `.` and `..` alone, see
        // `readdirplus`) and after a lookup in it, plain READDIR for the names otherwise.
        if !self.fs.meta_cache_enabled() || self.fs.lists_names_first() {
            let _ = config.add_capabilities(InitFlags::FUSE_READDIRPLUS_AUTO);
        }
        // O_TRUNC in the OPEN request itself. Not with no-open: there is no OPEN to carry
        // it, so the kernel must send the truncation as a SETATTR before the open.
        if !self.fs.config().no_open() {
            let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(128);
        let _ = config.set_congestion_threshold(96);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        // Answered from the metadata cache right here when it can be: a thread hand-off per
        // name costs more than the lookup itself (`grep -r`, `find`).
        if let Some(r) = self.fs.lookup_fast(parent.0, name, req.pid()) {
            return entry_reply(reply, self.ttls.attr.get(), self.ttls.entry.get(), r);
        }
        // Killable while it waits: a lookup may wait for a listing of its directory (a walk
        // in a directory nobody listed, `namespace::walk_lists`; a names-first listing's
        // stats), which is not bounded by `store.timeout` as a single lookup is.
        let (name, pid) = (name.to_owned(), req.pid());
        let (slot, done) = self.waiting.register(pid, reply, |r| r.error(Errno::EINTR));
        self.spawn(move |fs, at, et| {
            let r = fs.lookup_by(parent.0, &name, pid);
            drop(done);
            let Some(reply) = slot.take() else {
                // Its caller was killed and answered: the kernel never learnt this entry.
                if let Ok(e) = &r {
                    fs.forget(e.ino, 1);
                }
                return;
            };
            entry_reply(reply, at, et, r)
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some((a, valid)) = self.fs.getattr_fast(ino.0) {
            return reply.attr(&self.ttls.attr.get().min(valid), &file_attr(&a));
        }
        let pid = req.pid();
        self.spawn(move |fs, at, _| match fs.getattr_valid(ino.0, pid) {
            Ok((a, valid)) => reply.attr(&at.min(valid), &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        });
    }

    fn setattr(
        &self,
        req: &Request,
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
        let mut set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time_update(atime),
            mtime: time_update(mtime),
        };
        // FUSE_HANDLE_KILLPRIV_V2: a chown, or a truncation by a caller without CAP_FSETID
        // (uid 0 stands for the capability), drops setuid/setgid here, from the cached mode.
        // A setattr that changes nothing we are told of is a chown(-1, -1) (the kernel took
        // its kill flags off), which drops them too.
        let nothing = set == SetAttr::default();
        let drops_privs =
            uid.is_some() || gid.is_some() || (size.is_some() && req.uid() != 0) || nothing;
        if drops_privs && mode.is_none() {
            match self.fs.getattr_fast(ino.0) {
                Some((a, _)) => set.mode = a.perm_without_privs(),
                None => {
                    let fh = fh.map(|f| f.0);
                    return self.spawn(move |fs, at, _| {
                        match fs.setattr_dropping_privs(ino.0, fh, &set) {
                            Ok(a) => reply.attr(&at.min(fs.own_change_valid()), &file_attr(&a)),
                            Err(e) => reply.error(errno(e)),
                        }
                    });
                }
            }
        }
        // A deferred setattr (write-back of a new object) right here: see `Fs::create_fast`.
        if let Some(r) = self.fs.setattr_fast(ino.0, &set) {
            return match r {
                Ok(a) => reply.attr(&self.ttls.attr.get(), &file_attr(&a)),
                Err(e) => reply.error(errno(e)),
            };
        }
        self.spawn(
            move |fs, at, _| match fs.setattr(ino.0, fh.map(|f| f.0), &set) {
                Ok(a) => reply.attr(&at.min(fs.own_change_valid()), &file_attr(&a)),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(move |fs, _, _| match fs.readlink(ino.0) {
            Ok(t) => reply.data(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str())),
            Err(e) => reply.error(errno(e)),
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
        let (name, r) = (name.to_owned(), requester(req));
        self.spawn(move |fs, at, et| {
            entry_reply(
                reply,
                at,
                et,
                fs.mknod(parent.0, &name, mode, rdev as u64, r),
            )
        });
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
        let r = requester(req);
        if let Some(e) = self.fs.mkdir_fast(parent.0, name, mode, r) {
            return entry_reply(reply, self.ttls.attr.get(), self.ttls.entry.get(), e);
        }
        let name = name.to_owned();
        self.spawn(move |fs, at, et| {
            entry_reply(reply, at, et, fs.mkdir(parent.0, &name, mode, r))
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.spawn(move |fs, _, _| Self::empty(reply, fs.unlink(parent.0, &name)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.spawn(move |fs, _, _| Self::empty(reply, fs.rmdir(parent.0, &name)));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (name, target, r) = (
            link_name.to_owned(),
            target.as_os_str().to_owned(),
            requester(req),
        );
        self.spawn(move |fs, at, et| {
            entry_reply(reply, at, et, fs.symlink(parent.0, &name, &target, r))
        });
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
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.spawn(move |fs, _, _| {
            Self::empty(
                reply,
                fs.rename(parent.0, &name, newparent.0, &newname, flags.bits()),
            )
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let newname = newname.to_owned();
        self.spawn(move |fs, at, et| {
            entry_reply(reply, at, et, fs.link(ino.0, newparent.0, &newname))
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.open_file(req, ino, flags, reply)
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.read_file(req, ino, fh, offset, size, reply)
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.write_file(ino, fh, offset, data, write_flags, reply)
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.flush_file(ino, fh, reply)
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
        self.fs.release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |fs, _, _| Self::empty(reply, fs.fsync(ino.0, fh.0, datasync)));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.open_dir(ino, reply)
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.list_dir(fh, offset, reply)
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.list_dir_plus(ino, fh, offset, reply)
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |fs, _, _| Self::empty(reply, fs.fsyncdir(ino.0, datasync)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(move |fs, _, _| match fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(e)),
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
        let (name, value) = (name.to_owned(), value.to_vec());
        self.spawn(move |fs, _, _| Self::empty(reply, fs.setxattr(ino.0, &name, &value, flags)));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if let Some(e) = self.fs.getxattr_fast(ino.0, name) {
            return reply.error(errno(e));
        }
        let name = name.to_owned();
        self.spawn(move |fs, _, _| reply_xattr(reply, size, fs.getxattr(ino.0, &name)));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        // `cp -a` and `rsync -X` list every file's: none, as a rule, cached per object.
        if let Some(r) = self.fs.listxattr_fast(ino.0) {
            return reply_xattr(reply, size, r);
        }
        self.spawn(move |fs, _, _| reply_xattr(reply, size, fs.listxattr(ino.0)));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.spawn(move |fs, _, _| Self::empty(reply, fs.removexattr(ino.0, &name)));
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
        let r = requester(req);
        let direct = self.direct_flag(flags);
        // Deferred (write-back of namespace operations) right here: a create then costs a
        // journal append, less than the hand-off to the I/O pool.
        if let Some(res) = self.fs.create_fast(parent.0, name, mode, flags, r) {
            return created_reply(reply, self.ttls.attr.get(), direct, res);
        }
        let name = name.to_owned();
        self.spawn(move |fs, at, _| {
            created_reply(
                reply,
                at,
                direct,
                fs.create(parent.0, &name, mode, flags, r),
            )
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |fs, _, _| {
            Self::empty(reply, fs.fallocate(ino.0, fh.0, mode, offset, length))
        });
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.spawn(
            move |fs, _, _| match fs.lseek(ino.0, fh.0, offset, whence) {
                Ok(o) => reply.offset(o),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    /// The store copies (a reflink or a server-side copy); ENOSYS when it cannot, and the
    /// kernel then copies through READ and WRITE, as it did before tierfs answered this.
    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.spawn(move |fs, _, _| {
            match fs.copy_file_range(
                ino_in.0, fh_in.0, offset_in, ino_out.0, fh_out.0, offset_out, len,
            ) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(e)),
            }
        });
    }
}
