//! The calls slowfs makes on the backing directory for the requests that need more than one
//! (setattr by handle or path, getattr of a file unlinked while open, rename with the inode
//! table's paths moved, reads and writes, a directory's listing, xattrs); the answer is
//! replied by the request (`filesystem`) after the emulated cost.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use fuser::{FileAttr, FileHandle, FileType, INodeNo, RenameFlags, ReplyXattr, TimeOrNow};

use crate::fs::{check, cstr, cstr_os, errno, last_errno, DirEnt, SlowFs, R};

impl SlowFs {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn do_setattr(
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

    pub(crate) fn do_getattr(&self, ino: INodeNo, fh: Option<FileHandle>) -> R<FileAttr> {
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

    pub(crate) fn do_rename(
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

    pub(crate) fn do_read(&self, fh: FileHandle, offset: u64, size: u32) -> R<Vec<u8>> {
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

    pub(crate) fn do_write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> R<u32> {
        let f = self.file(fh)?;
        f.write_all_at(data, offset).map_err(errno)?;
        Ok(data.len() as u32)
    }

    pub(crate) fn do_opendir(&self, ino: INodeNo) -> R<u64> {
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

    pub(crate) fn do_xattr_get(
        &self,
        ino: INodeNo,
        name: Option<&OsStr>,
        size: u32,
    ) -> R<XattrOut> {
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

pub(crate) enum XattrOut {
    Size(u32),
    Data(Vec<u8>),
}

pub(crate) fn xattr_reply(r: R<XattrOut>, reply: ReplyXattr) {
    match r {
        Ok(XattrOut::Size(n)) => reply.size(n),
        Ok(XattrOut::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}
