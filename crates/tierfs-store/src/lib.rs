//! The backing-store seam: everything tierfs knows about the slow store goes through [`Store`].
//!
//! A store hands out opaque *nodes* (references to backing objects that stay valid across
//! renames, like an NFS file handle) and *handles* (open files). It knows nothing about caching
//! or FUSE. [`PosixStore`] serves any mounted directory; [`FaultStore`] wraps any store and
//! injects latency, EIO, ENOSPC and hangs for tests.

mod attr;
pub mod call_limit;
mod errno;
mod fault;
mod identity;
mod max_size;
mod posix;
mod posix_attr;
mod posix_io;
mod posix_names;
mod posix_sys;
mod stat_fanout;
mod store_id;

pub use attr::{
    Attr, DirEntry, FileKind, Fingerprint, SetAttr, StatFs, TimeSpec, TimeUpdate, SUID_SGID,
};
/// The buffer type of [`Store::read_bytes`].
pub use bytes::Bytes;
pub use errno::{Errno, Result};
pub use fault::{FaultConfig, FaultStore, OpClass};
pub use identity::{Identity, IdentityChoice};
pub use posix::PosixStore;
pub use posix_sys::{PosixHandle, PosixNode};
pub use stat_fanout::{NamesFirst, StatFanout, STAT_CONCURRENCY};
pub use store_id::readable_id;

use std::ffi::{OsStr, OsString};

/// What [`Store::open_child`] gives: the object's node, the attributes the open found, and
/// the handle.
pub type Opened<N, H> = (N, Attr, H);

/// Owner to give a newly created object: `(uid, gid)`; `None` keeps the store's default.
pub type Owner = Option<(u32, u32)>;

/// The slow store. All calls may block for a long time (NFS, HDD seeks); callers run them on
/// worker threads, never on a latency-critical path.
/// What [`Store::reconnect`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reconnect {
    /// The store's root answers as it is: nothing changed.
    Same,
    /// A new root replaced a dead one: nodes and handles from before are dead.
    New,
}

pub trait Store: Send + Sync + 'static {
    /// Reference to a backing object. Cheap to clone; valid while held, across renames.
    type Node: Clone + Send + Sync + 'static;
    /// An open file of the backing store.
    type Handle: Send + Sync + 'static;

    /// A stable, human-readable identity of this store (used to name and stamp caches).
    fn store_id(&self) -> &str;
    /// How this store's objects keep their identity: by inode number (`Attr::ino`, which
    /// then lasts as long as the object) or by path. `Attr::dev` is never part of it: it
    /// changes at every mount of a network or FUSE filesystem.
    fn identity(&self) -> Identity {
        Identity::Path
    }
    /// The root directory of the store.
    fn root(&self) -> Result<(Self::Node, Attr)>;
    /// The store stopped answering (ENOTCONN): try to reach it again from scratch (a FUSE
    /// store mounted anew at the same path). `Reconnect::New`: every node handed out before is
    /// dead and must be resolved again from the new `root()`.
    fn reconnect(&self) -> Result<Reconnect> {
        Ok(Reconnect::Same)
    }
    /// A request the store itself must answer (not its client's attribute cache), to learn
    /// whether a store taken for hung answers again: returns once it does (a hung one: when
    /// it wakes up, or with an error). The default checks the root, else asks statfs. A
    /// store whose root needs no check and whose statfs is made up (S3) must ask something
    /// real, or a stopped server would be "back" at once.
    fn probe(&self) -> Result<()> {
        let (root, _) = self.root()?;
        match self.revalidate(&root) {
            Some(r) => r.map(|_| ()),
            None => self.statfs(&root).map(|_| ()),
        }
    }
    fn lookup(&self, parent: &Self::Node, name: &OsStr) -> Result<(Self::Node, Attr)>;
    /// The node of `name` in `parent`, an object of kind `kind` a listing showed, made
    /// without asking the store; None (the default) where a node needs the store (a file
    /// handle, an inode number). S3 can (a node is its key): a file found by `grep -r` in a
    /// listed directory then costs no lookup request before its open.
    fn child_node(
        &self,
        _parent: &Self::Node,
        _name: &OsStr,
        _kind: FileKind,
    ) -> Option<Self::Node> {
        None
    }
    fn getattr(&self, node: &Self::Node) -> Result<Attr>;
    /// Attributes fresh from the store, for the close-to-open check of a read-only open,
    /// without opening the object: the data then comes from the caches, and the object is
    /// opened only if a read misses them (over sshfs or NFS an open is a round trip of its
    /// own, a revalidation is none or one GETATTR). None (the default): opening costs no more
    /// than asking (S3: the open is the HEAD), so the open itself checks.
    fn revalidate(&self, _node: &Self::Node) -> Option<Result<Attr>> {
        None
    }
    fn setattr(
        &self,
        node: &Self::Node,
        handle: Option<&Self::Handle>,
        set: &SetAttr,
    ) -> Result<Attr>;
    fn readlink(&self, node: &Self::Node) -> Result<OsString>;
    fn mknod(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<(Self::Node, Attr)>;
    fn mkdir(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        owner: Owner,
    ) -> Result<(Self::Node, Attr)>;
    fn symlink(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        target: &OsStr,
        owner: Owner,
    ) -> Result<(Self::Node, Attr)>;
    fn link(&self, node: &Self::Node, newparent: &Self::Node, newname: &OsStr) -> Result<Attr>;
    fn unlink(&self, parent: &Self::Node, name: &OsStr) -> Result<()>;
    fn rmdir(&self, parent: &Self::Node, name: &OsStr) -> Result<()>;
    /// `flags` are Linux `renameat2` flags (RENAME_NOREPLACE, RENAME_EXCHANGE).
    fn rename(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        newparent: &Self::Node,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()>;
    /// Opens an existing file. `flags` are open(2) flags as the application gave them.
    fn open(&self, node: &Self::Node, flags: i32) -> Result<Self::Handle>;
    /// Opens the regular file `name` of directory `parent` without its node (an inode learnt
    /// from a listing has none): the node, the attributes the open found and the handle;
    /// None (the default) where the store wants the node first. On a filesystem resolving
    /// the node is a path walk and a stat of its own before the open's.
    fn open_child(
        &self,
        _parent: &Self::Node,
        _name: &OsStr,
        _flags: i32,
    ) -> Option<Result<Opened<Self::Node, Self::Handle>>> {
        None
    }
    /// Opens a file to write data that was made on version `base` of it (the write-back
    /// flusher: the fingerprint the application's writes were made on). A store that can
    /// tell versions apart at upload (S3, by ETag) refuses to let that data overwrite another
    /// writer's version. Default: [`Store::open`].
    fn open_based(
        &self,
        node: &Self::Node,
        flags: i32,
        _base: Option<Fingerprint>,
    ) -> Result<Self::Handle> {
        self.open(node, flags)
    }
    /// close(2) of a handle (FUSE FLUSH). A store whose objects are replaced whole (S3)
    /// uploads what was written through it here; a filesystem has nothing to do.
    fn close(&self, _handle: &Self::Handle) -> Result<()> {
        Ok(())
    }
    /// Written data reaches the store only at [`Store::fsync`] and [`Store::close`] (S3):
    /// the file's version changes there, not at each write, and a write-back flusher syncs a
    /// file once it is complete rather than after each flush group.
    fn publishes_at_sync(&self) -> bool {
        false
    }
    /// The largest file the store takes, in bytes (u64::MAX: not known, the store answers).
    /// Write-back answers EFBIG past it at the write or truncate, as the store would:
    /// acknowledged, it would only fail at the flush.
    fn max_file_size(&self) -> u64 {
        u64::MAX
    }
    /// The store can hang rather than fail (a server that stops answering: a network
    /// filesystem, a FUSE mount, a bucket or an sftp server): the calls a cache can answer
    /// for get a deadline (`store.timeout`), past which what is cached is served.
    fn may_hang(&self) -> bool {
        false
    }
    /// The store gives up a call itself once [`call_limit::deadline`] has passed, answering
    /// ETIMEDOUT (its requests are futures it can drop): the calls with a deadline then run
    /// on the caller's thread, not on a worker it waits for (see `call_limit`).
    fn keeps_call_limit(&self) -> bool {
        false
    }
    /// A directory's attributes follow the names in it: a create or unlink there moves its
    /// mtime and ctime, a subdirectory its link count. Not on S3, whose directories have
    /// fixed, made-up attributes.
    fn dirs_track_names(&self) -> bool {
        true
    }
    /// Creates (or opens, without O_EXCL) a regular file.
    fn create(
        &self,
        parent: &Self::Node,
        name: &OsStr,
        mode: u32,
        flags: i32,
        owner: Owner,
    ) -> Result<(Self::Node, Attr, Self::Handle)>;
    /// Reads up to `buf.len()` bytes at `offset`; short only at end of file.
    fn read(&self, handle: &Self::Handle, offset: u64, buf: &mut [u8]) -> Result<usize>;
    /// [`Store::read`] into a buffer of the store's own: a store whose answers arrive as
    /// buffers (S3's HTTP bodies) hands them over instead of copying them into a zeroed one
    /// (at 4 MiB per read-ahead fetch, the zeroing and the copy cost a third of a cold
    /// sequential read's CPU on a 2-core machine).
    fn read_bytes(&self, handle: &Self::Handle, offset: u64, len: usize) -> Result<bytes::Bytes> {
        let mut buf = vec![0u8; len];
        let n = self.read(handle, offset, &mut buf)?;
        buf.truncate(n);
        Ok(buf.into())
    }
    /// Writes all of `data` at `offset` (or at the end for an O_APPEND handle); returns the
    /// offset where the data landed.
    fn write(&self, handle: &Self::Handle, offset: u64, data: &[u8]) -> Result<u64>;
    /// Writes `bufs` one after another from `offset` (a positioned gather write: flushing
    /// write-back data from its extents without copying them together). Not for O_APPEND
    /// handles.
    fn write_vectored(&self, handle: &Self::Handle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        let mut at = offset;
        for b in bufs {
            self.write(handle, at, b)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Attributes of an open file (cheap on local disks, may be cached by NFS clients).
    fn fstat(&self, handle: &Self::Handle) -> Result<Attr>;
    fn fsync(&self, handle: &Self::Handle, datasync: bool) -> Result<()>;
    fn fsyncdir(&self, node: &Self::Node, datasync: bool) -> Result<()>;
    fn fallocate(&self, handle: &Self::Handle, mode: i32, offset: u64, len: u64) -> Result<()>;
    /// SEEK_DATA / SEEK_HOLE (and the plain whences).
    fn lseek(&self, handle: &Self::Handle, offset: i64, whence: i32) -> Result<i64>;
    /// Copies up to `len` bytes from `from` at `off_in` to `to` at `off_out` inside the store
    /// (copy_file_range: a reflink or a server-side copy where the store has one, so the data
    /// never crosses to us); the bytes copied (0 at the end of `from`). ENOSYS: the store
    /// cannot, and the caller copies by reading and writing.
    fn copy_range(
        &self,
        _from: &Self::Handle,
        _off_in: u64,
        _to: &Self::Handle,
        _off_out: u64,
        _len: u64,
    ) -> Result<u64> {
        Err(Errno(libc::ENOSYS))
    }
    /// All entries of a directory except `.` and `..`.
    fn readdir(&self, node: &Self::Node) -> Result<Vec<DirEntry>>;
    /// [`Store::readdir`] with each entry's attributes where the store can give them in the
    /// same pass (like NFS READDIRPLUS): one call revalidates a whole directory. `None` for an
    /// entry that vanished between listing and stat, or a store without the capability.
    fn readdir_plus(&self, node: &Self::Node) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        Ok(self.readdir(node)?.into_iter().map(|e| (e, None)).collect())
    }
    /// Whether an entry's attributes cost the store a request of their own, beyond the
    /// listing (a filesystem: an `fstatat` per entry, a round trip each over NFS or sshfs, an
    /// inode read on an HDD), where an S3 LIST gives them in the same pages. Such a store is
    /// listed for names first and its entries are stat'ed when someone asks for one
    /// ([`Store::stat_names`]): `find -name` needs names and types only.
    fn names_list_cheaper(&self) -> bool {
        false
    }
    /// Whether [`Store::readdir_plus`] is one request stream that brings every entry's
    /// attributes with its name (an S3 LIST: 1,000 keys with size, time and ETag per page; an
    /// sftp READDIR: a page of names with their attributes), so that one listing revalidates
    /// the whole directory for about the price of one request. False where each entry's
    /// attributes are a request of their own (a filesystem: an `fstatat` per entry, a round
    /// trip each over NFS or sshfs once their client's cache expired): there an expired entry
    /// is revalidated alone, never by listing its directory again.
    fn listing_carries_attrs(&self) -> bool {
        false
    }
    /// Whether opening a file brings its first bytes with its attributes in the one request
    /// (S3: the open is a GET of the object's start). Loading a small file ahead of a walk
    /// then saves the walk nothing (its open is a request anyway) and asks the store twice.
    fn open_brings_data(&self) -> bool {
        false
    }
    /// Entries one listing request brings, for a store whose directories' sizes say nothing
    /// of how many entries they hold but whose listing comes in pages of entries with their
    /// attributes (S3: 1,000 keys a page). 0: not such a store. A walk looking names up one by
    /// one in a directory never listed takes a listing instead once it is known to fit in one
    /// page ([`Store::lists_within`]; see `tierfs_fs`'s `walk_lists`).
    fn listing_page(&self) -> usize {
        0
    }
    /// Whether listing `node` brings at most `max` entries, asked in one request (S3: one
    /// LIST page of the prefix). Only where [`Store::listing_page`] is not 0.
    fn lists_within(&self, _node: &Self::Node, _max: usize) -> Result<bool> {
        Ok(false)
    }
    /// Whether [`Store::fstat`] is answered from the handle itself, with no request to the
    /// store (an S3 handle holds the version it reads): not counted as a store request then.
    fn fstat_is_local(&self) -> bool {
        false
    }
    /// The attributes of `names` in directory `node` (None: gone, or failed), with many
    /// requests in flight where the store can: what [`Store::readdir_plus`] adds to a
    /// listing, for the entries asked for. The default asks one after another.
    fn stat_names(&self, node: &Self::Node, names: &[OsString]) -> Vec<Option<Attr>> {
        names
            .iter()
            .map(|n| self.lookup(node, n).ok().map(|(_, a)| a))
            .collect()
    }
    fn statfs(&self, node: &Self::Node) -> Result<StatFs>;
    fn getxattr(&self, node: &Self::Node, name: &OsStr) -> Result<Vec<u8>>;
    /// [`Store::getxattr`] of `name` in directory `parent`, without its node: None (the
    /// default) where the store needs the node. `ls -l` asks for every file's ACL, and an
    /// inode learnt from a listing would first need a lookup for its node: two requests per
    /// file where the store alone makes one.
    fn getxattr_at(
        &self,
        _parent: &Self::Node,
        _name: &OsStr,
        _xname: &OsStr,
    ) -> Option<Result<Vec<u8>>> {
        None
    }
    fn setxattr(&self, node: &Self::Node, name: &OsStr, value: &[u8], flags: i32) -> Result<()>;
    /// NUL-separated list of names, as listxattr(2) returns it.
    fn listxattr(&self, node: &Self::Node) -> Result<Vec<u8>>;
    fn removexattr(&self, node: &Self::Node, name: &OsStr) -> Result<()>;
}
