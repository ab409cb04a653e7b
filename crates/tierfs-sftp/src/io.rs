//! Open files and their data: a read of any length is split into READs of the server's
//! largest, all sent at once and put back together without copying; a write likewise, and it
//! returns once every WRITE is acknowledged (a write-through write is the store's when
//! write(2) returns). A handle whose connection died is opened again on the new one by its
//! path (a read-only one only if the file still has the size and mtime it was opened at:
//! else ESTALE, never bytes of another version).

use crate::attrs::{attr, perms};
use crate::conn::Conn;
use crate::ctx::child;
use crate::errors::Status;
use crate::handle::{options, writable, Open, SftpHandle, POST_OP};
use crate::store::{SftpNode, SftpStore};
use bytes::{Bytes, BytesMut};
use openssh_sftp_client_lowlevel::{
    CreateFlags, Data, Extensions, FileAttrs, HandleOwned, OpenFileRequest,
};
use parking_lot::Mutex;
use std::borrow::Cow;
use std::ffi::OsStr;
use std::io::IoSlice;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tierfs_store::{Attr, Errno, FileKind, Owner, Result};

/// The most one copy-data request copies (64 MiB: under a second on any disk).
const COPY_MAX: u64 = 64 << 20;

/// A chunk of a read: the buffer it was read into, or what went wrong.
type Piece = Option<std::result::Result<BytesMut, Status>>;

impl SftpStore {
    /// open(2) of an existing file: the OPEN, sent with an LSTAT (a read-only handle keeps
    /// the version it opened) or, for O_TRUNC, a SETSTAT of size 0 (sftp's TRUNC comes only
    /// with CREAT); one round trip either way, the server doing them in order.
    pub(crate) fn do_open(&self, node: &SftpNode, flags: i32) -> Result<SftpHandle> {
        let c = self.ctx.conn()?;
        let p = &*node.path;
        let trunc = flags & libc::O_TRUNC != 0 && writable(flags);
        let open = |we: &mut crate::conn::WriteEnd, id| {
            Ok(we
                .send_open_file_request(id, options(flags).open(p.into()))?
                .wait())
        };
        let (h, post) = self.ctx.run(async {
            if trunc {
                let mut zero = FileAttrs::new();
                zero.set_size(0);
                let (h, t) = c
                    .pair(open, |we, id| {
                        Ok(we.send_setstat_request(id, p.into(), zero)?.wait())
                    })
                    .await;
                (h, t.map(|()| None))
            } else {
                let (h, a) = c
                    .pair(open, |we, id| {
                        Ok(we.send_lstat_request(id, p.into())?.wait())
                    })
                    .await;
                (h, a.map(|a| Some(attr(&a, p))))
            }
        })?;
        let h = h.map_err(|e| match e {
            // open(2) of a directory for writing.
            Status::Failure if writable(flags) && node.kind == Some(FileKind::Dir) => Errno::EISDIR,
            e => e.errno(),
        })?;
        let open = Open {
            conn: c,
            h: Arc::new(h),
        };
        let post = post.map_err(Status::errno)?;
        Ok(SftpHandle {
            path: node.path.clone(),
            flags,
            version: post
                .filter(|_| !writable(flags))
                .map(|a| (a.size, a.mtime.sec)),
            open: Mutex::new(open),
            post: Mutex::new(post.map(|a| (a, Instant::now()))),
        })
    }

    /// create(2): OPEN with CREAT|EXCL and an LSTAT of the new file, sent together. Without
    /// O_EXCL the name may have been made meanwhile (by another host: the kernel asks for a
    /// create only of a name it found missing): then it is opened as asked (CREAT, TRUNC for
    /// O_TRUNC), one more round trip, only then. So a new file is known to be new, and gets
    /// the owner and mode asked for (`fix_new`); one that was there keeps its own.
    pub(crate) fn do_create(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        mode: u32,
        flags: i32,
        owner: Owner,
    ) -> Result<(SftpNode, Attr, SftpHandle)> {
        let p = child(&parent.path, name)?;
        let c = self.ctx.conn()?;
        let excl = flags & libc::O_EXCL != 0;
        let make = |how| -> Result<(HandleOwned, FileAttrs)> {
            let req: OpenFileRequest<'_> = options(flags).create((&*p).into(), how, perms(mode));
            let (h, a) = self.ctx.run(c.pair(
                |we, id| Ok(we.send_open_file_request(id, req)?.wait()),
                |we, id| Ok(we.send_lstat_request(id, (&*p).into())?.wait()),
            ))?;
            match (h, a) {
                (Ok(h), Ok(a)) => Ok((h, a)),
                (Ok(_), Err(e)) => Err(e.errno()),
                (Err(Status::Failure), Ok(a)) => Err(match attr(&a, &p).kind {
                    FileKind::Dir if !excl => Errno::EISDIR,
                    _ => Errno(libc::EEXIST),
                }),
                (Err(Status::Failure), Err(_)) => Err(self.ctx.run(self.failure(&c))?),
                (Err(e), _) => Err(e.errno()),
            }
        };
        let (h, a, new) = match make(CreateFlags::Excl) {
            Ok((h, a)) => (h, a, true),
            Err(e) if e == Errno(libc::EEXIST) && !excl => {
                let how = if flags & libc::O_TRUNC != 0 {
                    CreateFlags::Trunc
                } else {
                    CreateFlags::None
                };
                let (h, a) = make(how)?;
                (h, a, false)
            }
            Err(e) => return Err(e),
        };
        let open = Open {
            conn: c,
            h: Arc::new(h),
        };
        let a = attr(&a, &p);
        let a = if new {
            self.fix_new(&p, a, mode, owner)?
        } else {
            a
        };
        let node = SftpNode::new(p, Some(FileKind::File));
        let handle = SftpHandle {
            path: node.path.clone(),
            flags,
            version: (!writable(flags)).then_some((a.size, a.mtime.sec)),
            open: Mutex::new(open),
            post: Mutex::new(Some((a, Instant::now()))),
        };
        Ok((node, a, handle))
    }

    fn do_fstat_on(&self, c: &Conn, h: &HandleOwned, p: &Path) -> Result<Attr> {
        let a = self
            .ctx
            .run(c.call(|we, id| Ok(we.send_fstat_request(id, Cow::Borrowed(&**h))?.wait())))?
            .map_err(Status::errno)?;
        Ok(attr(&a, p))
    }

    pub(crate) fn do_fstat(&self, handle: &SftpHandle) -> Result<Attr> {
        if let Some((a, at)) = handle.post.lock().take() {
            if at.elapsed() < POST_OP {
                return Ok(a);
            }
        }
        let (c, h) = handle.on(&self.ctx)?;
        self.do_fstat_on(&c, &h, &handle.path)
    }

    /// Up to `len` bytes at `offset`: READs of the server's largest length, all in flight
    /// together, read into one buffer carved in pieces (put back together without a copy).
    pub(crate) fn read_at(&self, handle: &SftpHandle, offset: u64, len: usize) -> Result<Bytes> {
        let (c, h) = handle.on(&self.ctx)?;
        let rl = c.read_len as usize;
        let n = len.div_ceil(rl);
        let mut rest = BytesMut::with_capacity(len);
        let mut bufs: Vec<Option<BytesMut>> = Vec::with_capacity(n);
        for _ in 0..n {
            let tail = rest.split_off(rl.min(rest.capacity()));
            bufs.push(Some(std::mem::replace(&mut rest, tail)));
        }
        let mut got: Vec<Piece> = (0..n).map(|_| None).collect();
        let size = |i: usize| rl.min(len - i * rl);
        // An FSTAT after the READs, answered after them: the core's version check after a
        // read, in the same round trip (see `SftpHandle::post`).
        let fstat = |we: &mut crate::conn::WriteEnd, id| {
            Ok(we.send_fstat_request(id, Cow::Borrowed(&**h))?.wait())
        };
        // (Taken before the requests go: a concurrent read through the same handle that sent
        // its FSTAT earlier and finishes later must not replace this one's answer.)
        let sent = Instant::now();
        let post = self
            .ctx
            .run(c.pipeline_then(
                n,
                |i, we, id| {
                    let buf = bufs[i].take();
                    let at = offset + (i * rl) as u64;
                    Ok(we
                        .send_read_request(id, Cow::Borrowed(&**h), at, size(i) as u32, buf)?
                        .wait())
                },
                |i, r| {
                    got[i] = Some(r.map(|d| match d {
                        Data::Buffer(b) => b,
                        Data::AllocatedBox(b) => BytesMut::from(&b[..]),
                        Data::Eof => BytesMut::new(),
                    }))
                },
                Some(fstat),
            ))?
            .map_err(Status::errno)?;
        if let Some(Ok(a)) = post {
            let mut p = handle.post.lock();
            if p.as_ref().is_none_or(|(_, at)| *at <= sent) {
                *p = Some((attr(&a, &handle.path), sent));
            }
        }
        let mut out = BytesMut::new();
        for i in 0..n {
            let b = got[i].take().ok_or(Errno::EIO)?.map_err(Status::errno)?;
            let short = b.len() < size(i);
            let at = offset + (i * rl) as u64 + b.len() as u64;
            let want = size(i) - b.len();
            out.unsplit(b);
            if short {
                // EOF, unless a later piece has data: a server that answered short in the
                // middle of the file; the rest of this piece is read one READ at a time.
                let later = got[i + 1..]
                    .iter()
                    .any(|g| matches!(g, Some(Ok(b)) if !b.is_empty()));
                if !later {
                    break;
                }
                self.fill(&c, &h, at, want, &mut out)?;
            }
        }
        Ok(out.freeze())
    }

    /// `want` bytes at `at` appended to `out`, one READ after another (a short answer's gap).
    fn fill(
        &self,
        c: &Conn,
        h: &HandleOwned,
        mut at: u64,
        mut want: usize,
        out: &mut BytesMut,
    ) -> Result<()> {
        while want > 0 {
            let d = self
                .ctx
                .run(c.call(|we, id| {
                    Ok(we
                        .send_read_request(id, Cow::Borrowed(h), at, want as u32, None)?
                        .wait())
                }))?
                .map_err(Status::errno)?;
            let b: &[u8] = match &d {
                Data::Buffer(b) => b,
                Data::AllocatedBox(b) => b,
                Data::Eof => &[],
            };
            if b.is_empty() {
                // The file ended meanwhile: no data after the gap after all.
                return Err(Errno::EIO);
            }
            out.extend_from_slice(b);
            at += b.len() as u64;
            want -= b.len().min(want);
        }
        Ok(())
    }

    /// `bufs` one after another from `offset`, in WRITEs of the server's largest length, all
    /// in flight together; returns once every one is acknowledged, with where the data
    /// landed (for O_APPEND: at the end, where the server put it).
    pub(crate) fn write_at(&self, handle: &SftpHandle, offset: u64, bufs: &[&[u8]]) -> Result<u64> {
        handle.post.lock().take();
        let (c, h) = handle.on(&self.ctx)?;
        let wl = c.write_len as usize;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        // The pieces of each WRITE: slices of `bufs` covering [i*wl, (i+1)*wl).
        let mut chunks: Vec<Vec<IoSlice<'_>>> = vec![Vec::new()];
        let mut room = wl;
        for b in bufs {
            let mut b: &[u8] = b;
            while !b.is_empty() {
                if room == 0 {
                    chunks.push(Vec::new());
                    room = wl;
                }
                let k = room.min(b.len());
                chunks
                    .last_mut()
                    .expect("one at least")
                    .push(IoSlice::new(&b[..k]));
                b = &b[k..];
                room -= k;
            }
        }
        if total == 0 {
            return Ok(offset);
        }
        let mut first_err = None;
        self.ctx
            .run(c.pipeline(
                chunks.len(),
                |i, we, id| {
                    let at = offset + (i * wl) as u64;
                    Ok(we
                        .send_write_request_buffered_vectored(
                            id,
                            Cow::Borrowed(&**h),
                            at,
                            &chunks[i],
                        )?
                        .wait())
                },
                |_, r| {
                    if let Err(e) = r {
                        first_err.get_or_insert(e);
                    }
                },
            ))?
            .map_err(Status::errno)?;
        match first_err {
            None => {}
            Some(Status::Failure) => return Err(self.ctx.run(self.failure(&c))?),
            Some(Status::BadMessage) => return Err(Errno::EBADF),
            Some(e) => return Err(e.errno()),
        }
        if handle.flags & libc::O_APPEND != 0 {
            let a = self.do_fstat_on(&c, &h, &handle.path)?;
            return Ok(a.size.saturating_sub(total as u64));
        }
        Ok(offset)
    }

    /// fsync@openssh.com; a server without it has nothing to ask (documented).
    pub(crate) fn do_fsync(&self, handle: &SftpHandle) -> Result<()> {
        let (c, h) = handle.on(&self.ctx)?;
        if !c.has(Extensions::FSYNC) {
            return Ok(());
        }
        self.ctx
            .run(c.call(|we, id| Ok(we.send_fsync_request(id, Cow::Borrowed(&**h))?.wait())))?
            .map_err(|e| match e {
                Status::Failure => Errno::EIO,
                e => e.errno(),
            })
    }

    /// lseek(2): sftp keeps no file position and knows no holes, so SEEK_DATA and SEEK_HOLE
    /// answer as Linux does for a filesystem without holes (all data, a hole at the end).
    pub(crate) fn do_lseek(&self, handle: &SftpHandle, offset: i64, whence: i32) -> Result<i64> {
        let size = || self.do_fstat(handle).map(|a| a.size as i64);
        let r = match whence {
            libc::SEEK_SET | libc::SEEK_CUR => offset,
            libc::SEEK_END => size()? + offset,
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                let s = size()?;
                if offset < 0 || offset >= s {
                    return Err(Errno(libc::ENXIO));
                }
                if whence == libc::SEEK_DATA {
                    offset
                } else {
                    s
                }
            }
            _ => return Err(Errno::EINVAL),
        };
        if r < 0 {
            return Err(Errno::EINVAL);
        }
        Ok(r)
    }

    /// copy_file_range as copy-data@openssh.com (the server copies; nothing crosses the
    /// link). Without it, or where the server refuses, ENOSYS: the caller reads and writes.
    pub(crate) fn do_copy_range(
        &self,
        from: &SftpHandle,
        off_in: u64,
        to: &SftpHandle,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let (c, hf) = from.on(&self.ctx)?;
        let (c2, ht) = to.on(&self.ctx)?;
        if !Arc::ptr_eq(&c, &c2) || !c.has(Extensions::COPY_DATA) {
            return Err(Errno(libc::ENOSYS));
        }
        let size = self.do_fstat_on(&c, &hf, &from.path)?.size;
        // At most COPY_MAX a call (the caller asks again for the rest): one request must
        // finish well within `sftp.timeout` on the server's disk.
        let n = len.min(size.saturating_sub(off_in)).min(COPY_MAX);
        if n == 0 {
            return Ok(0);
        }
        let r = self.ctx.run(c.call(|we, id| {
            Ok(we
                .send_copy_data_request(
                    id,
                    Cow::Borrowed(&**hf),
                    off_in,
                    n,
                    Cow::Borrowed(&**ht),
                    off_out,
                )?
                .wait())
        }))?;
        match r {
            Ok(()) => Ok(n),
            Err(Status::Local(Errno::ENOTCONN)) => Err(Errno::ENOTCONN),
            Err(_) => Err(Errno(libc::ENOSYS)),
        }
    }
}
