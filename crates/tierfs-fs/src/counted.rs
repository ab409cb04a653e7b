//! Counts every call that reaches the backing store, so `tierfs stats` can show how much work
//! the slow store was spared.

use crate::deadline::Deadline;
use crate::health::StoreHealth;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tierfs_store::{Attr, DirEntry, Owner, Result, SetAttr, StatFs, Store};

#[derive(Default)]
pub struct BackingCounters {
    lookup: AtomicU64,
    getattr: AtomicU64,
    readdir: AtomicU64,
    open: AtomicU64,
    read: AtomicU64,
    read_bytes: AtomicU64,
    write: AtomicU64,
    write_bytes: AtomicU64,
    create: AtomicU64,
    /// copy_file_range calls done by the store, and the bytes they copied (no data to us).
    copy: AtomicU64,
    copied_bytes: AtomicU64,
    other: AtomicU64,
    errors: AtomicU64,
}

/// Backing-store operation counts (see `tierfs stats`).
#[derive(Default, Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct BackingStats {
    pub lookup: u64,
    pub getattr: u64,
    pub readdir: u64,
    pub open: u64,
    pub read: u64,
    pub read_bytes: u64,
    pub write: u64,
    pub write_bytes: u64,
    pub create: u64,
    #[serde(default)]
    pub copy: u64,
    #[serde(default)]
    pub copied_bytes: u64,
    pub other: u64,
    pub errors: u64,
    /// 1 while the store answers ENOTCONN (gone; what is cached is served).
    #[serde(default)]
    pub gone: u64,
    /// 1 while the store is taken for hung (a call past `store.timeout`; what is cached is
    /// served), and the calls given up at their deadline.
    #[serde(default)]
    pub hung: u64,
    #[serde(default)]
    pub timeouts: u64,
    /// Calls that failed with ENOTCONN, and times a store answered at BACKING again.
    #[serde(default)]
    pub notconn: u64,
    #[serde(default)]
    pub reconnects: u64,
}

impl BackingCounters {
    pub fn snapshot(&self) -> BackingStats {
        BackingStats {
            lookup: self.lookup.load(Relaxed),
            getattr: self.getattr.load(Relaxed),
            readdir: self.readdir.load(Relaxed),
            open: self.open.load(Relaxed),
            read: self.read.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            write: self.write.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            create: self.create.load(Relaxed),
            copy: self.copy.load(Relaxed),
            copied_bytes: self.copied_bytes.load(Relaxed),
            other: self.other.load(Relaxed),
            errors: self.errors.load(Relaxed),
            ..BackingStats::default()
        }
    }
}

pub struct CountedStore<S> {
    inner: Arc<S>,
    pub counters: Arc<BackingCounters>,
    /// Whether the store answers (every call's error goes through here).
    pub health: Arc<StoreHealth>,
    /// The deadline of the calls a cache can answer for (see `deadline`).
    deadline: Deadline,
}

impl<S: Store> CountedStore<S> {
    /// The counters, with the store's health.
    pub fn snapshot(&self) -> BackingStats {
        BackingStats {
            gone: self.health.gone() as u64,
            hung: self.health.hung() as u64,
            timeouts: self.health.timeouts.load(Relaxed),
            notconn: self.health.notconn.load(Relaxed),
            reconnects: self.health.reconnects.load(Relaxed),
            ..self.counters.snapshot()
        }
    }

    pub fn new(inner: S) -> Self {
        CountedStore {
            inner: Arc::new(inner),
            counters: Arc::default(),
            health: Arc::default(),
            deadline: Deadline::new(),
        }
    }
    /// Whether calls that a cache can answer for run within a deadline (a store that can
    /// hang, `store.timeout` not 0).
    pub fn has_deadline(&self) -> bool {
        self.deadline.limit().is_some()
    }

    /// `store.timeout` on a store that can hang (`Store::may_hang`); zero: none.
    pub fn set_timeout(&self, limit: std::time::Duration) {
        if self.inner.may_hang() {
            self.deadline.set_limit(limit);
        }
    }

    /// `fstat` of the handle `owner` holds, within the deadline (see `deadline`): the call may
    /// outlive the caller's wait, on a worker, so it takes the handle's owner along. For the
    /// checks a cache can answer for while the store hangs (a reader's fingerprint check of
    /// a file it has open); ENOTCONN once the store is taken for hung.
    pub fn fstat_owned<O: Send + Sync + 'static>(
        &self,
        owner: Arc<O>,
        handle: fn(&O) -> Option<&S::Handle>,
    ) -> Result<Attr> {
        if self.inner.fstat_is_local() {
            let h = handle(&owner).ok_or(tierfs_store::Errno::EIO)?;
            return self.inner.fstat(h);
        }
        self.bounded(&self.counters.getattr, move |s| {
            s.fstat(handle(&owner).ok_or(tierfs_store::Errno::EIO)?)
        })
    }

    /// `call` on the inner store within the deadline (see `deadline`), counted in `c`. A
    /// store taken for hung is not asked (ENOTCONN at once: the caller serves what is
    /// cached, as for a store that is gone); a call past the deadline makes it so.
    fn bounded<T: Send + 'static>(
        &self,
        c: &AtomicU64,
        call: impl FnOnce(&S) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let Some(limit) = self.deadline.limit() else {
            return self.count(c, call(&self.inner));
        };
        if self.health.hung() {
            return Err(tierfs_store::Errno::ENOTCONN);
        }
        if self.inner.keeps_call_limit() {
            // On this thread: the store drops the request at the deadline itself.
            return match tierfs_store::call_limit::within(limit, || call(&self.inner)) {
                (Err(e), true) if e.0 == libc::ETIMEDOUT => self.timed_out(c, limit),
                (r, _) => self.count(c, r),
            };
        }
        let inner = self.inner.clone();
        match self.deadline.run(move || call(&inner)) {
            Some(r) => self.count(c, r),
            None => self.timed_out(c, limit),
        }
    }

    /// A call given up at its deadline: the store is taken for hung (cached answers served,
    /// ENOTCONN for the rest) until a probe of it returns.
    fn timed_out<T>(&self, c: &AtomicU64, limit: std::time::Duration) -> Result<T> {
        c.fetch_add(1, Relaxed);
        self.health.timed_out(limit, || {
            let s = self.inner.clone();
            Box::new(move || s.probe().map(|_| tierfs_store::Reconnect::Same))
        });
        Err(tierfs_store::Errno::ENOTCONN)
    }

    fn count<T>(&self, c: &AtomicU64, r: Result<T>) -> Result<T> {
        c.fetch_add(1, Relaxed);
        if let Err(e) = &r {
            if !is_answer(*e) {
                self.counters.errors.fetch_add(1, Relaxed);
            }
            self.health.saw(*e, || {
                let s = self.inner.clone();
                Box::new(move || s.reconnect())
            });
        }
        r
    }
}

/// An errno that is the store's answer about the tree (no such name, not empty, no such
/// attribute, not permitted, not supported), not a failure of the store: not counted in
/// `backing.errors` (a clean `ls` of missing names made "50 errors").
fn is_answer(e: tierfs_store::Errno) -> bool {
    matches!(
        e.0,
        libc::ENOENT
            | libc::EEXIST
            | libc::ENOTEMPTY
            | libc::ENOTDIR
            | libc::EISDIR
            | libc::ENODATA
            | libc::ERANGE
            | libc::EACCES
            | libc::EPERM
            | libc::ENAMETOOLONG
            | libc::EINVAL
            | libc::ENOSYS
            | libc::EOPNOTSUPP
            | libc::EXDEV
            | libc::ELOOP
            | libc::ESTALE
            | libc::ENOTTY
    )
}

impl<S: Store> Store for CountedStore<S> {
    type Node = S::Node;
    type Handle = S::Handle;

    fn store_id(&self) -> &str {
        self.inner.store_id()
    }
    fn identity(&self) -> tierfs_store::Identity {
        self.inner.identity()
    }
    fn root(&self) -> Result<(S::Node, Attr)> {
        self.count(&self.counters.getattr, self.inner.root())
    }
    fn reconnect(&self) -> Result<tierfs_store::Reconnect> {
        self.inner.reconnect()
    }
    fn lookup(&self, parent: &S::Node, name: &OsStr) -> Result<(S::Node, Attr)> {
        let (parent, name) = (parent.clone(), name.to_owned());
        self.bounded(&self.counters.lookup, move |s| s.lookup(&parent, &name))
    }
    fn getattr(&self, node: &S::Node) -> Result<Attr> {
        let node = node.clone();
        self.bounded(&self.counters.getattr, move |s| s.getattr(&node))
    }
    fn revalidate(&self, node: &S::Node) -> Option<Result<Attr>> {
        if self.deadline.limit().is_none() {
            let r = self.inner.revalidate(node)?;
            return Some(self.count(&self.counters.getattr, r));
        }
        let node = node.clone();
        // (None inside: the store has no cheaper check; asked as Some(Err) would be.)
        let r = self.bounded(&self.counters.getattr, move |s| {
            s.revalidate(&node).transpose()
        });
        match r {
            Ok(Some(a)) => Some(Ok(a)),
            Ok(None) => {
                // Counted as a getattr it was not: take it back.
                self.counters.getattr.fetch_sub(1, Relaxed);
                None
            }
            Err(e) => Some(Err(e)),
        }
    }
    fn setattr(&self, node: &S::Node, handle: Option<&S::Handle>, set: &SetAttr) -> Result<Attr> {
        self.count(&self.counters.other, self.inner.setattr(node, handle, set))
    }
    fn readlink(&self, node: &S::Node) -> Result<OsString> {
        let node = node.clone();
        self.bounded(&self.counters.other, move |s| s.readlink(&node))
    }
    fn mknod(
        &self,
        parent: &S::Node,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<(S::Node, Attr)> {
        self.count(
            &self.counters.create,
            self.inner.mknod(parent, name, mode, rdev, owner),
        )
    }
    fn mkdir(
        &self,
        parent: &S::Node,
        name: &OsStr,
        mode: u32,
        owner: Owner,
    ) -> Result<(S::Node, Attr)> {
        self.count(
            &self.counters.create,
            self.inner.mkdir(parent, name, mode, owner),
        )
    }
    fn symlink(
        &self,
        parent: &S::Node,
        name: &OsStr,
        target: &OsStr,
        owner: Owner,
    ) -> Result<(S::Node, Attr)> {
        self.count(
            &self.counters.create,
            self.inner.symlink(parent, name, target, owner),
        )
    }
    fn link(&self, node: &S::Node, newparent: &S::Node, newname: &OsStr) -> Result<Attr> {
        self.count(
            &self.counters.create,
            self.inner.link(node, newparent, newname),
        )
    }
    fn unlink(&self, parent: &S::Node, name: &OsStr) -> Result<()> {
        self.count(&self.counters.other, self.inner.unlink(parent, name))
    }
    fn rmdir(&self, parent: &S::Node, name: &OsStr) -> Result<()> {
        self.count(&self.counters.other, self.inner.rmdir(parent, name))
    }
    fn rename(
        &self,
        parent: &S::Node,
        name: &OsStr,
        newparent: &S::Node,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.count(
            &self.counters.other,
            self.inner.rename(parent, name, newparent, newname, flags),
        )
    }
    fn open_child(
        &self,
        parent: &S::Node,
        name: &OsStr,
        flags: i32,
    ) -> Option<Result<tierfs_store::Opened<S::Node, S::Handle>>> {
        let r = self.inner.open_child(parent, name, flags)?;
        Some(self.count(&self.counters.open, r))
    }
    fn open(&self, node: &S::Node, flags: i32) -> Result<S::Handle> {
        self.count(&self.counters.open, self.inner.open(node, flags))
    }
    fn child_node(
        &self,
        parent: &S::Node,
        name: &OsStr,
        kind: tierfs_store::FileKind,
    ) -> Option<S::Node> {
        self.inner.child_node(parent, name, kind)
    }
    fn open_based(
        &self,
        node: &S::Node,
        flags: i32,
        base: Option<tierfs_store::Fingerprint>,
    ) -> Result<S::Handle> {
        self.count(
            &self.counters.open,
            self.inner.open_based(node, flags, base),
        )
    }
    fn close(&self, handle: &S::Handle) -> Result<()> {
        self.count(&self.counters.other, self.inner.close(handle))
    }
    fn publishes_at_sync(&self) -> bool {
        self.inner.publishes_at_sync()
    }
    fn max_file_size(&self) -> u64 {
        self.inner.max_file_size()
    }
    fn may_hang(&self) -> bool {
        self.inner.may_hang()
    }
    fn keeps_call_limit(&self) -> bool {
        self.inner.keeps_call_limit()
    }
    fn probe(&self) -> Result<()> {
        self.inner.probe()
    }
    fn dirs_track_names(&self) -> bool {
        self.inner.dirs_track_names()
    }
    fn create(
        &self,
        parent: &S::Node,
        name: &OsStr,
        mode: u32,
        flags: i32,
        owner: Owner,
    ) -> Result<(S::Node, Attr, S::Handle)> {
        self.count(
            &self.counters.create,
            self.inner.create(parent, name, mode, flags, owner),
        )
    }
    fn read(&self, handle: &S::Handle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let r = self.count(&self.counters.read, self.inner.read(handle, offset, buf));
        if let Ok(n) = r {
            self.counters.read_bytes.fetch_add(n as u64, Relaxed);
        }
        r
    }
    fn read_bytes(&self, handle: &S::Handle, offset: u64, len: usize) -> Result<bytes::Bytes> {
        let r = self.count(
            &self.counters.read,
            self.inner.read_bytes(handle, offset, len),
        );
        if let Ok(b) = &r {
            self.counters.read_bytes.fetch_add(b.len() as u64, Relaxed);
        }
        r
    }
    fn write(&self, handle: &S::Handle, offset: u64, data: &[u8]) -> Result<u64> {
        let r = self.count(&self.counters.write, self.inner.write(handle, offset, data));
        if r.is_ok() {
            self.counters
                .write_bytes
                .fetch_add(data.len() as u64, Relaxed);
        }
        r
    }
    fn write_vectored(&self, handle: &S::Handle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        let r = self.count(
            &self.counters.write,
            self.inner.write_vectored(handle, offset, bufs),
        );
        if r.is_ok() {
            let n: usize = bufs.iter().map(|b| b.len()).sum();
            self.counters.write_bytes.fetch_add(n as u64, Relaxed);
        }
        r
    }
    fn fstat(&self, handle: &S::Handle) -> Result<Attr> {
        // (An S3 handle answers itself: two per cold small object were counted as HEADs
        // that were never sent.)
        if self.inner.fstat_is_local() {
            return self.inner.fstat(handle);
        }
        self.count(&self.counters.getattr, self.inner.fstat(handle))
    }
    fn fsync(&self, handle: &S::Handle, datasync: bool) -> Result<()> {
        self.count(&self.counters.other, self.inner.fsync(handle, datasync))
    }
    fn fsyncdir(&self, node: &S::Node, datasync: bool) -> Result<()> {
        self.count(&self.counters.other, self.inner.fsyncdir(node, datasync))
    }
    fn fallocate(&self, handle: &S::Handle, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.count(
            &self.counters.other,
            self.inner.fallocate(handle, mode, offset, len),
        )
    }
    fn copy_range(
        &self,
        from: &S::Handle,
        off_in: u64,
        to: &S::Handle,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let r = self.inner.copy_range(from, off_in, to, off_out, len);
        if let Ok(n) = &r {
            self.counters.copied_bytes.fetch_add(*n, Relaxed);
        }
        self.count(&self.counters.copy, r)
    }
    fn lseek(&self, handle: &S::Handle, offset: i64, whence: i32) -> Result<i64> {
        self.count(
            &self.counters.other,
            self.inner.lseek(handle, offset, whence),
        )
    }
    fn readdir(&self, node: &S::Node) -> Result<Vec<DirEntry>> {
        self.count(&self.counters.readdir, self.inner.readdir(node))
    }
    /// Where an entry's attributes cost a request of their own (a filesystem), each is
    /// counted as a lookup too.
    fn readdir_plus(&self, node: &S::Node) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        let r = self.count(&self.counters.readdir, self.inner.readdir_plus(node));
        if let Ok(v) = &r {
            // Each entry's attributes were a request of their own (an `fstatat`).
            if !self.inner.listing_carries_attrs() {
                let stats = v.iter().filter(|(_, a)| a.is_some()).count();
                self.counters.lookup.fetch_add(stats as u64, Relaxed);
            }
        }
        r
    }
    fn names_list_cheaper(&self) -> bool {
        self.inner.names_list_cheaper()
    }
    fn listing_carries_attrs(&self) -> bool {
        self.inner.listing_carries_attrs()
    }
    fn open_brings_data(&self) -> bool {
        self.inner.open_brings_data()
    }
    fn listing_page(&self) -> usize {
        self.inner.listing_page()
    }
    fn lists_within(&self, node: &S::Node, max: usize) -> Result<bool> {
        self.count(&self.counters.readdir, self.inner.lists_within(node, max))
    }
    fn fstat_is_local(&self) -> bool {
        self.inner.fstat_is_local()
    }
    /// Counted as lookups, one per name: each is one on the store.
    fn stat_names(&self, node: &S::Node, names: &[OsString]) -> Vec<Option<Attr>> {
        self.counters.lookup.fetch_add(names.len() as u64, Relaxed);
        self.inner.stat_names(node, names)
    }
    fn statfs(&self, node: &S::Node) -> Result<StatFs> {
        let node = node.clone();
        self.bounded(&self.counters.other, move |s| s.statfs(&node))
    }
    fn getxattr(&self, node: &S::Node, name: &OsStr) -> Result<Vec<u8>> {
        let (node, name) = (node.clone(), name.to_owned());
        self.bounded(&self.counters.other, move |s| s.getxattr(&node, &name))
    }
    fn getxattr_at(
        &self,
        parent: &S::Node,
        name: &OsStr,
        xname: &OsStr,
    ) -> Option<Result<Vec<u8>>> {
        let r = self.inner.getxattr_at(parent, name, xname)?;
        Some(self.count(&self.counters.other, r))
    }
    fn setxattr(&self, node: &S::Node, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.count(
            &self.counters.other,
            self.inner.setxattr(node, name, value, flags),
        )
    }
    fn listxattr(&self, node: &S::Node) -> Result<Vec<u8>> {
        self.count(&self.counters.other, self.inner.listxattr(node))
    }
    fn removexattr(&self, node: &S::Node, name: &OsStr) -> Result<()> {
        self.count(&self.counters.other, self.inner.removexattr(node, name))
    }
}
