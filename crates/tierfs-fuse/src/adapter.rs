use crate::attr::{file_attr, kind, timespec};
use crate::plus::fill_plus_page;
use fuser::{
    CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};
use tierfs_fs::{AtomicDuration, Fs, Pool, Requester, SetAttr, Store, TimeUpdate};

/// How long the kernel caches attributes (`fuse.attr_ttl`) and names (`fuse.entry_ttl`)
/// without asking; `tierfs ctl set` changes them for every reply from then on.
#[derive(Debug)]
pub struct KernelTtls {
    pub attr: AtomicDuration,
    pub entry: AtomicDuration,
}

impl KernelTtls {
    pub fn new(attr: Duration, entry: Duration) -> KernelTtls {
        KernelTtls {
            attr: AtomicDuration::new(attr),
            entry: AtomicDuration::new(entry),
        }
    }
}

pub struct Adapter<S: Store> {
    pub fs: Arc<Fs<S>>,
    pub pool: Pool,
    /// How long the kernel may trust what we tell it; may change at run time.
    pub ttls: Arc<KernelTtls>,
    /// Set once the session exists: tells the kernel to drop attributes it must not trust.
    pub notifier: Arc<OnceLock<Notifier>>,
    /// `fuse.direct_write_only`: see [`Adapter::open_flags`].
    pub direct_write_only: bool,
    /// Requests that may wait for the store, answered EINTR if their caller is killed.
    pub(crate) waiting: Arc<crate::killable::Waiting>,
}

fn errno(e: tierfs_fs::Errno) -> Errno {
    Errno::from_i32(e.0)
}

fn requester(req: &Request) -> Requester {
    Requester {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn time_update(t: Option<TimeOrNow>) -> Option<TimeUpdate> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeUpdate::Now,
        TimeOrNow::SpecificTime(st) => TimeUpdate::Set(timespec(st)),
    })
}

/// The kernel caches a directory's entries in its page cache (FOPEN_CACHE_DIR), and keeps
/// them across opens while tierfs says the names are unchanged: a second `ls` or `find`
/// of a directory then costs no READDIR at all.
fn dir_flags(d: &tierfs_fs::DirOpen) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if d.cache {
        f |= FopenFlags::FOPEN_CACHE_DIR;
    }
    if d.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    f
}

/// `flag` where `on`, else none.
fn flag_if(on: bool, flag: FopenFlags) -> FopenFlags {
    if on {
        flag
    } else {
        FopenFlags::empty()
    }
}

fn keep_cache_flag(keep_cache: bool) -> FopenFlags {
    flag_if(keep_cache, FopenFlags::FOPEN_KEEP_CACHE)
}

/// Replies with xattr data, or its size when the caller asked for the size (size 0).
fn reply_xattr(reply: ReplyXattr, size: u32, data: tierfs_fs::Result<Vec<u8>>) {
    match data {
        Err(e) => reply.error(errno(e)),
        Ok(d) if size == 0 => reply.size(d.len() as u32),
        Ok(d) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(d) => reply.data(&d),
    }
}

impl<S: Store> Adapter<S> {
    /// FOPEN_DIRECT_IO for an OPEN or CREATE with open(2) flags `flags`, or nothing.
    ///
    /// A file opened for writing only (`cp`, `dd of=`, `tar -x`, logs) gets FOPEN_DIRECT_IO:
    /// each write(2) then travels from the application's own pages to us, where the page
    /// cache path would first allocate and fill a page-cache copy that nobody reads back
    /// through this handle. Measured on a 2 GiB `chunk.py` write in write-back mode: the write
    /// phase went from 496 to 1,435 MB/s (212 to 696 MB/s when little host memory is warm),
    /// with the daemon's CPU unchanged. Readers of the same file on other handles stay
    /// coherent: the kernel drops the cached pages a direct write covers, and tierfs serves
    /// the new bytes (docs/writeback/data-path.md, "The write path").
    fn direct_flag(&self, flags: i32) -> FopenFlags {
        if self.direct_write_only && flags & libc::O_ACCMODE == libc::O_WRONLY {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    fn empty(reply: ReplyEmpty, r: tierfs_fs::Result<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Runs `job` on the I/O pool with its own handle on the adapter's state.
    fn spawn(&self, job: impl FnOnce(&Arc<Fs<S>>, Duration, Duration) + Send + 'static) {
        let (fs, at, et) = (self.fs.clone(), self.ttls.attr.get(), self.ttls.entry.get());
        self.pool.spawn(move || job(&fs, at, et));
    }
}

fn created_reply(
    reply: ReplyCreate,
    at: Duration,
    direct: FopenFlags,
    r: tierfs_fs::Result<(tierfs_fs::Entry, tierfs_fs::OpenReply)>,
) {
    match r {
        Ok((e, o)) => reply.created(
            &at.min(e.valid),
            &file_attr(&e.attr),
            Generation(0),
            FileHandle(o.fh),
            keep_cache_flag(o.keep_cache) | direct | flag_if(o.no_flush, FopenFlags::FOPEN_NOFLUSH),
        ),
        Err(e) => reply.error(errno(e)),
    }
}

fn entry_reply(
    reply: ReplyEntry,
    at: Duration,
    et: Duration,
    r: tierfs_fs::Result<tierfs_fs::Entry>,
) {
    match r {
        // The kernel may keep them for what is left of their trust in the metadata cache
        // (none when it ran out: it then asks again before using them).
        Ok(e) => reply.entry_with_ttls(
            &at.min(e.valid),
            &et.min(e.valid),
            &file_attr(&e.attr),
            Generation(0),
        ),
        Err(e) => reply.error(errno(e)),
    }
}

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
        let (name, pid) = (name.to_owned(), req.pid());
        self.spawn(move |fs, at, et| {
            entry_reply(reply, at, et, fs.lookup_by(parent.0, &name, pid))
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
        if self.fs.config().no_open() {
            // FUSE no-open: ENOSYS means success to the kernel, for this open and every
            // later one of this session; reads and writes then name handle 0, which the
            // core maps to the inode's implicit files, and no RELEASE is sent.
            return reply.error(Errno::ENOSYS);
        }
        let direct = self.direct_flag(flags.0);
        // FUSE_HANDLE_KILLPRIV_V2: an O_TRUNC open by a caller without CAP_FSETID (uid 0
        // stands for it) drops setuid/setgid, as a truncation does (see `setattr`).
        let drops_privs = flags.0 & libc::O_TRUNC != 0
            && req.uid() != 0
            && self
                .fs
                .getattr_fast(ino.0)
                .is_none_or(|(a, _)| a.perm_without_privs().is_some());
        if !drops_privs {
            if let Some(o) = self.fs.open_fast(ino.0, flags.0) {
                return reply.opened(FileHandle(o.fh), keep_cache_flag(o.keep_cache) | direct);
            }
        }
        let (notifier, pid, began) = (self.notifier.clone(), req.pid(), std::time::Instant::now());
        let (slot, done) = self.waiting.register(pid, reply, |r| r.error(Errno::EINTR));
        self.spawn(move |fs, _, _| {
            let r = fs.open_at(ino.0, flags.0, pid, began);
            drop(done);
            let Some(reply) = slot.take() else {
                // Its caller was killed and answered: nobody will release this one.
                if let Ok(o) = r {
                    fs.release(o.fh);
                }
                return;
            };
            match r {
                Ok(o) => {
                    if drops_privs {
                        if let Err(e) = fs.kill_suidgid(ino.0, Some(o.fh)) {
                            fs.release(o.fh);
                            return reply.error(errno(e));
                        }
                    }
                    if o.attrs_stale || drops_privs {
                        // Close-to-open: the file changed behind our back (or its mode, just
                        // now), and the kernel would keep its old attributes, and clip reads to
                        // the old size, until attr_ttl runs out.
                        // Offset -1: attributes only; the page cache is dropped by the open
                        // reply itself (no FOPEN_KEEP_CACHE). Sent before the reply, so the
                        // caller's first read already asks for fresh attributes.
                        if let Some(n) = notifier.get() {
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                    }
                    reply.opened(FileHandle(o.fh), keep_cache_flag(o.keep_cache) | direct)
                }
                Err(e) => reply.error(errno(e)),
            }
        });
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
        // RAM-tier hits are answered right here, without a thread hand-off.
        let mut reply = Some(reply);
        if self.fs.read_cached_with(ino.0, fh.0, offset, size, |d| {
            if let Some(r) = reply.take() {
                r.data(d)
            }
        }) {
            return;
        }
        let Some(reply) = reply else { return };
        let (slot, done) = self
            .waiting
            .register(req.pid(), reply, |r| r.error(Errno::EINTR));
        self.spawn(move |fs, _, _| {
            let r = fs.read(ino.0, fh.0, offset, size);
            drop(done);
            let Some(reply) = slot.take() else { return };
            match r {
                Ok(d) => reply.data(&d),
                Err(e) => reply.error(errno(e)),
            }
        });
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
        // The kernel marks every direct write of a caller without CAP_FSETID; only a file
        // whose cached mode has setuid or setgid (or is not cached) needs the slow path.
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            && self
                .fs
                .getattr_fast(ino.0)
                .is_none_or(|(a, _)| a.perm as u32 & (libc::S_ISUID | libc::S_ISGID) != 0);
        if kill {
            // A direct write by a caller without CAP_FSETID: setuid/setgid go first, so this
            // path takes the I/O pool (clearing them may ask the store).
            let data = self.fs.write_buf(data);
            self.spawn(move |fs, _, _| {
                let r = fs
                    .kill_suidgid(ino.0, Some(fh.0))
                    .and_then(|_| fs.write_owned(ino.0, fh.0, offset, data));
                match r {
                    Ok(n) => reply.written(n),
                    Err(e) => reply.error(errno(e)),
                }
            });
            return;
        }
        // Write-back writes that cannot wait are acknowledged right here (journal append and
        // RAM), saving the hand-off to the I/O pool and back on every request.
        let data = match self
            .fs
            .try_write_inline(ino.0, fh.0, offset, self.fs.write_buf(data))
        {
            Ok(r) => {
                return match r {
                    Ok(n) => reply.written(n),
                    Err(e) => reply.error(errno(e)),
                }
            }
            Err(data) => data,
        };
        self.spawn(
            move |fs, _, _| match fs.write_owned(ino.0, fh.0, offset, data) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        if self.fs.wants_close() {
            // Write-back: close reports a flush error not yet reported, and with
            // writeback.close=flush waits for the file's data to reach the backing store.
            // S3: close uploads what was written (and reports whether it was).
            if let Some(r) = self.fs.flush_fast(ino.0) {
                return Self::empty(reply, r);
            }
            return self.spawn(move |fs, _, _| Self::empty(reply, fs.flush(ino.0, fh.0)));
        }
        // Write-through: every write is already in the backing store when it is acknowledged,
        // so close has nothing to flush. ENOSYS tells the kernel to stop sending FLUSH for
        // the rest of the session: one request less per close(2), which is a quarter of the
        // requests a `grep -r` over small files costs.
        reply.error(Errno::ENOSYS);
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
        if let Some(d) = self.fs.opendir_fast(ino.0) {
            return reply.opened(FileHandle(d.fh), dir_flags(&d));
        }
        self.spawn(move |fs, _, _| match fs.opendir(ino.0) {
            Ok(d) => reply.opened(FileHandle(d.fh), dir_flags(&d)),
            Err(e) => reply.error(errno(e)),
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
        let r = self.fs.readdir(fh.0, offset).map(|entries| {
            for e in entries {
                if reply.add(INodeNo(e.ino), e.next_offset, kind(e.kind), &e.name) {
                    break;
                }
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        // From the metadata cache right here when the entries are in it: a `grep -r` or
        // `find` then costs no thread hand-off per directory either.
        let ttl = self.ttls.attr.get().min(self.ttls.entry.get());
        let fs = &self.fs;
        // Listed for names first: the first page holds `.` and `..` only (a short page: the
        // kernel asks again from offset 2, with plain READDIR unless something looked a name
        // up in the directory meanwhile). Names cannot go out in READDIRPLUS without their
        // real attributes (docs/architecture/metadata.md, "Listings for names first").
        if offset == 0 && fs.lists_names_first() {
            if let Ok(mut entries) = fs.readdir(fh.0, 0) {
                entries.truncate(2);
                if let Some((dir_attr, _)) = fs.getattr_fast(ino.0) {
                    let _ = fill_plus_page(fs, reply, entries, dir_attr, ttl, |_| None);
                    return;
                }
                // The directory's own attributes from the store, on a worker: the short
                // page still, or the page below would look up (and so stat) every entry.
                self.spawn(move |fs, _, _| match fs.getattr(ino.0) {
                    Ok(dir_attr) => {
                        let _ = fill_plus_page(fs, reply, entries, dir_attr, ttl, |_| None);
                    }
                    Err(e) => reply.error(errno(e)),
                });
                return;
            }
        }
        let reply = match (fs.readdir(fh.0, offset), fs.getattr_fast(ino.0)) {
            (Ok(entries), Some((dir_attr, _))) => {
                match fill_plus_page(fs, reply, entries, dir_attr, ttl, |name| {
                    fs.lookup_fast(ino.0, name, 0)
                }) {
                    Ok(()) => return,
                    Err(reply) => reply,
                }
            }
            _ => reply,
        };
        self.spawn(move |fs, _, _| {
            let entries = match fs.readdir(fh.0, offset) {
                Ok(e) => e,
                Err(e) => return reply.error(errno(e)),
            };
            let dir_attr = match fs.getattr(ino.0) {
                Ok(a) => a,
                Err(e) => return reply.error(errno(e)),
            };
            // `lookup` always answers here, so the reply is never handed back.
            let _ = fill_plus_page(fs, reply, entries, dir_attr, ttl, |name| {
                Some(fs.lookup(ino.0, name))
            });
        });
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
