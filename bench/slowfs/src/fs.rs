//! Path-based FUSE passthrough with every reply delayed by the slow-store model.
//!
//! Inode numbers are the backing `st_ino` (the backing root is inode 1). A table maps each inode
//! the kernel knows about to the backing path it was last looked up under. Attribute and entry
//! TTLs are zero, so the kernel looks every path component up again on each access, which keeps
//! the table fresh and makes every access cost a request (as on an uncached network store).
//!
//! Here: that table, the open files and listings, and the replies sent after each request's
//! emulated cost. The calls on the backing directory are in `backing`, the FUSE requests
//! (`fuser::Filesystem`) in `filesystem`, both above this.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Generation, INodeNo, ReplyAttr, ReplyEmpty, ReplyEntry,
    Request,
};

use crate::emu::Emu;

/// No kernel attribute/entry caching: every stat and path walk reaches us.
pub(crate) const TTL: Duration = Duration::ZERO;
/// Inode number used for a backing file whose st_ino is 1 (clashes with the FUSE root).
const INO_ONE_ALIAS: u64 = u64::MAX - 1;

pub(crate) type R<T> = Result<T, Errno>;

pub(crate) fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

pub(crate) fn last_errno() -> Errno {
    errno(io::Error::last_os_error())
}

pub(crate) fn cstr(p: &Path) -> R<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

pub(crate) fn cstr_os(s: &OsStr) -> R<CString> {
    CString::new(s.as_bytes()).map_err(|_| Errno::EINVAL)
}

pub(crate) fn check(rc: libc::c_int) -> R<()> {
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

pub(crate) struct Node {
    pub(crate) path: PathBuf,
    pub(crate) nlookup: u64,
}

pub(crate) struct DirEnt {
    pub(crate) ino: u64,
    pub(crate) kind: FileType,
    pub(crate) name: OsString,
}

pub struct SlowFs {
    pub(crate) root: PathBuf,
    root_key: (u64, u64),
    pub(crate) emu: Emu,
    pub(crate) nodes: Mutex<HashMap<u64, Node>>,
    /// fh -> (inode, open backing file).
    pub(crate) files: Mutex<HashMap<u64, (u64, Arc<File>)>>,
    pub(crate) dirs: Mutex<HashMap<u64, Arc<Vec<DirEnt>>>>,
    pub(crate) next_fh: AtomicU64,
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

    pub(crate) fn ino_of(&self, dev: u64, ino: u64) -> u64 {
        if (dev, ino) == self.root_key {
            1
        } else if ino == 1 {
            INO_ONE_ALIAS
        } else {
            ino
        }
    }

    pub(crate) fn attr(&self, md: &Metadata) -> FileAttr {
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

    pub(crate) fn path(&self, ino: INodeNo) -> R<PathBuf> {
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

    pub(crate) fn child(&self, parent: INodeNo, name: &OsStr) -> R<PathBuf> {
        if name.as_bytes().contains(&b'/') {
            return Err(Errno::EINVAL);
        }
        Ok(self.path(parent)?.join(name))
    }

    /// stat `path`, record it as the current path of its inode and count one lookup.
    pub(crate) fn remember(&self, path: PathBuf) -> R<FileAttr> {
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
    pub(crate) fn chown_new(&self, req: &Request, path: &Path) {
        if self.is_root && (req.uid() != 0 || req.gid() != 0) {
            if let Ok(c) = cstr(path) {
                // SAFETY: valid NUL-terminated path.
                unsafe { libc::lchown(c.as_ptr(), req.uid(), req.gid()) };
            }
        }
    }

    pub(crate) fn file(&self, fh: FileHandle) -> R<Arc<File>> {
        self.files
            .lock()
            .unwrap()
            .get(&fh.0)
            .map(|(_, f)| f.clone())
            .ok_or(Errno::EBADF)
    }

    pub(crate) fn add_file(&self, ino: u64, f: File) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().unwrap().insert(fh, (ino, Arc::new(f)));
        fh
    }

    /// Any open handle of `ino`: lets getattr/setattr work on files that were unlinked or
    /// renamed over while open (the kernel sends no fh with fstat()).
    pub(crate) fn any_open_file(&self, ino: INodeNo) -> Option<Arc<File>> {
        self.files
            .lock()
            .unwrap()
            .values()
            .find(|(i, _)| *i == ino.0)
            .map(|(_, f)| f.clone())
    }

    /// The backing path of `ino` if it still names that inode.
    pub(crate) fn live_path(&self, ino: INodeNo) -> R<PathBuf> {
        let p = self.path(ino)?;
        let md = std::fs::symlink_metadata(&p).map_err(errno)?;
        if self.ino_of(md.dev(), md.ino()) != ino.0 {
            return Err(Errno::ENOENT);
        }
        Ok(p)
    }

    pub(crate) fn open_backing(path: &Path, flags: i32, mode: u32) -> R<File> {
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
    pub(crate) fn meta<F: FnOnce() + Send + 'static>(&self, t0: Instant, f: F) {
        let d = self.emu.meta_deadline(t0);
        self.emu.reply_at(t0, d, f);
    }

    pub(crate) fn entry_reply(&self, t0: Instant, r: R<FileAttr>, reply: ReplyEntry) {
        self.meta(t0, move || match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        });
    }

    pub(crate) fn empty_reply(&self, t0: Instant, r: R<()>, reply: ReplyEmpty) {
        self.meta(t0, move || match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    pub(crate) fn attr_reply(&self, t0: Instant, r: R<FileAttr>, reply: ReplyAttr) {
        self.meta(t0, move || match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        });
    }
}
