//! File data of the FUSE adapter: OPEN (close-to-open, setuid/setgid dropped on O_TRUNC,
//! answered on the fuser thread when the cache vouches), READ (RAM-tier hits answered on the
//! fuser thread), WRITE (write-back appends acknowledged inline) and FLUSH. Apart from the
//! `Filesystem` impl (`adapter_ops`), which hands these requests here.

use crate::adapter::{errno, keep_cache_flag, Adapter};
use fuser::{
    Errno, FileHandle, INodeNo, OpenFlags, ReplyData, ReplyEmpty, ReplyOpen, ReplyWrite, Request,
    WriteFlags,
};
use tierfs_fs::Store;

impl<S: Store> Adapter<S> {
    pub(crate) fn open_file(
        &self,
        req: &Request,
        ino: INodeNo,
        flags: OpenFlags,
        reply: ReplyOpen,
    ) {
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

    pub(crate) fn read_file(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
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

    pub(crate) fn write_file(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
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

    pub(crate) fn flush_file(&self, ino: INodeNo, fh: FileHandle, reply: ReplyEmpty) {
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
}
