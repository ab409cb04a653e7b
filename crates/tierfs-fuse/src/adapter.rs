//! The adapter's state ([`Adapter`], [`KernelTtls`]) and what every FUSE operation uses to
//! answer: errnos, open flags, entry and create replies, and the hand-off of a request to the
//! I/O pool. The operations themselves are in `adapter_ops` (the `fuser::Filesystem` impl),
//! which hands file data to `adapter_file` and listings to `adapter_dir`; all stand on this.

use crate::attr::{file_attr, timespec};
use fuser::{
    Errno, FileHandle, FopenFlags, Generation, Notifier, ReplyCreate, ReplyEmpty, ReplyEntry,
    ReplyXattr, Request, TimeOrNow,
};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tierfs_fs::{AtomicDuration, Fs, Pool, Requester, Store, TimeUpdate};

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
    /// `fuse.direct_write_only`: see [`Adapter::direct_flag`].
    pub direct_write_only: bool,
    /// Requests that may wait for the store, answered EINTR if their caller is killed.
    pub(crate) waiting: Arc<crate::killable::Waiting>,
    /// Where the store's calls have no deadline (a local disk, or `store.timeout=0`):
    /// requests run on the FUSE thread, one at a time (`inline`); None: every request
    /// needing the store goes to the pool.
    pub(crate) inline: Option<crate::inline::InlineSlot>,
}

pub(crate) fn errno(e: tierfs_fs::Errno) -> Errno {
    Errno::from_i32(e.0)
}

pub(crate) fn requester(req: &Request) -> Requester {
    Requester {
        uid: req.uid(),
        gid: req.gid(),
    }
}

pub(crate) fn time_update(t: Option<TimeOrNow>) -> Option<TimeUpdate> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeUpdate::Now,
        TimeOrNow::SpecificTime(st) => TimeUpdate::Set(timespec(st)),
    })
}

/// The kernel caches a directory's entries in its page cache (FOPEN_CACHE_DIR), and keeps
/// them across opens while tierfs says the names are unchanged: a second `ls` or `find`
/// of a directory then costs no READDIR at all.
pub(crate) fn dir_flags(d: &tierfs_fs::DirOpen) -> FopenFlags {
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

pub(crate) fn keep_cache_flag(keep_cache: bool) -> FopenFlags {
    flag_if(keep_cache, FopenFlags::FOPEN_KEEP_CACHE)
}

/// Replies with xattr data, or its size when the caller asked for the size (size 0).
pub(crate) fn reply_xattr(reply: ReplyXattr, size: u32, data: tierfs_fs::Result<Vec<u8>>) {
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
    pub(crate) fn direct_flag(&self, flags: i32) -> FopenFlags {
        if self.direct_write_only && flags & libc::O_ACCMODE == libc::O_WRONLY {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    pub(crate) fn empty(reply: ReplyEmpty, r: tierfs_fs::Result<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Runs `job` on this FUSE thread when the store's calls have no deadline and no other
    /// FUSE thread runs one (see `inline`), else on the I/O pool with its own handle on the
    /// adapter's state.
    pub(crate) fn spawn(&self, job: impl FnOnce(&Arc<Fs<S>>, Duration, Duration) + Send + 'static) {
        let (at, et) = (self.ttls.attr.get(), self.ttls.entry.get());
        if let Some(turn) = self.inline.as_ref().and_then(|s| s.take()) {
            return turn.run(|| job(&self.fs, at, et));
        }
        let fs = self.fs.clone();
        self.pool.spawn(move || job(&fs, at, et));
    }
}

pub(crate) fn created_reply(
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

pub(crate) fn entry_reply(
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
