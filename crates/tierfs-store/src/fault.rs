//! [`FaultStore`]: wraps a store and injects latency, errors (EIO, ENOSPC, ...) and hangs,
//! switchable at run time, so tests can show how failures of the slow store reach applications.

use crate::{Attr, DirEntry, Errno, Identity, Owner, Result, SetAttr, StatFs, Store};
use parking_lot::{Condvar, Mutex};
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which operations a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// Reading file data.
    Read = 0,
    /// Anything that writes data or allocates space: write, create, truncate, fallocate,
    /// mkdir, mknod, symlink, link, setxattr.
    Write = 1,
    /// Everything else: lookup, getattr, readdir, open, rename, unlink, ...
    Meta = 2,
}

/// Live fault settings shared between a test and the store.
#[derive(Default)]
pub struct FaultConfig {
    latency_us: AtomicU64,
    /// Latency added per entry of a listing with attributes, and per name of `stat_names`
    /// (see [`FaultConfig::set_entry_latency`]).
    entry_latency_us: AtomicU64,
    /// Latency added to one class of operations only (see [`FaultConfig::set_class_latency`]).
    class_latency_us: [AtomicU64; 3],
    errno: [AtomicI32; 3],
    hung: Mutex<bool>,
    unhung: Condvar,
    /// Number of calls that reached the inner store, per class.
    calls: [AtomicU64; 3],
    /// Behave like a FUSE or SMB-noserverino store (see [`FaultConfig::set_renumber`]).
    renumber: std::sync::atomic::AtomicBool,
    /// Calls in their added latency now, and the most there were at once, per class.
    waiting: [AtomicU64; 3],
    most_waiting: [AtomicU64; 3],
    /// Calls of the class still to succeed before it fails with `fail_in_errno` (0: off).
    fail_in: [AtomicU64; 3],
    fail_in_errno: [AtomicI32; 3],
}

impl FaultConfig {
    pub fn new() -> Arc<FaultConfig> {
        Arc::new(FaultConfig::default())
    }
    /// Adds this much latency to every operation.
    pub fn set_latency(&self, d: Duration) {
        self.latency_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }
    /// Adds this much latency per entry of a listing with attributes, and per name whose
    /// attributes are asked for: a store where each entry's attributes are a request of their
    /// own (a network filesystem whose client's cache expired), so that listing a large
    /// directory takes longer than what it returns is trusted for.
    pub fn set_entry_latency(&self, d: Duration) {
        self.entry_latency_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }
    fn entries_wait(&self, n: usize) {
        let lat = self.entry_latency_us.load(Ordering::Relaxed);
        if lat > 0 && n > 0 {
            std::thread::sleep(Duration::from_micros(lat * n as u64));
        }
    }
    /// Adds this much latency to the operations of `class` alone (the larger of this and
    /// [`FaultConfig::set_latency`] applies): a store slow to make objects whose lookups
    /// still answer at once.
    pub fn set_class_latency(&self, class: OpClass, d: Duration) {
        self.class_latency_us[class as usize].store(d.as_micros() as u64, Ordering::Relaxed);
    }
    /// Makes every operation of `class` fail with `errno` (`None` heals it).
    pub fn fail(&self, class: OpClass, errno: Option<i32>) {
        self.errno[class as usize].store(errno.unwrap_or(0), Ordering::Relaxed);
    }
    /// Lets the next `calls` operations of `class` succeed, then makes every one after them
    /// fail with `errno` (as [`FaultConfig::fail`]; `fail(class, None)` heals it): a store
    /// that fails in the middle of a batch of requests.
    pub fn fail_after(&self, class: OpClass, calls: u64, errno: i32) {
        let c = class as usize;
        self.fail_in_errno[c].store(errno, Ordering::Relaxed);
        self.fail_in[c].store(calls + 1, Ordering::Relaxed);
    }
    /// While hung, every operation blocks (like a dead NFS server).
    pub fn set_hung(&self, hung: bool) {
        *self.hung.lock() = hung;
        if !hung {
            self.unhung.notify_all();
        }
    }
    /// Makes stores created from now on behave like sshfs, rclone mount or SMB with
    /// `noserverino`: every attribute and listing entry they return carries a fresh inode
    /// number, each store has a device number of its own (a remount gets another), and they
    /// say their identity is by path.
    pub fn set_renumber(&self, on: bool) {
        self.renumber.store(on, Ordering::Relaxed);
    }

    pub fn calls(&self, class: OpClass) -> u64 {
        self.calls[class as usize].load(Ordering::Relaxed)
    }

    /// The most calls of `class` that were in their added latency at once: how many requests
    /// of that kind the store had in flight (counted only while latency is set).
    pub fn most_in_flight(&self, class: OpClass) -> u64 {
        self.most_waiting[class as usize].load(Ordering::Relaxed)
    }

    /// Calls of `class` in their added latency now.
    pub fn in_flight(&self, class: OpClass) -> u64 {
        self.waiting[class as usize].load(Ordering::Relaxed)
    }

    /// Forgets [`FaultConfig::most_in_flight`] so far.
    pub fn reset_most_in_flight(&self) {
        for m in &self.most_waiting {
            m.store(0, Ordering::Relaxed);
        }
    }

    fn enter(&self, class: OpClass) -> Result<()> {
        {
            let mut hung = self.hung.lock();
            while *hung {
                self.unhung.wait(&mut hung);
            }
        }
        let lat = self
            .latency_us
            .load(Ordering::Relaxed)
            .max(self.class_latency_us[class as usize].load(Ordering::Relaxed));
        if lat > 0 {
            let c = class as usize;
            let now = self.waiting[c].fetch_add(1, Ordering::Relaxed) + 1;
            self.most_waiting[c].fetch_max(now, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(lat));
            self.waiting[c].fetch_sub(1, Ordering::Relaxed);
        }
        let c = class as usize;
        let left = self.fail_in[c]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if left == Ok(1) {
            self.errno[c].store(
                self.fail_in_errno[c].load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
        }
        let e = self.errno[c].load(Ordering::Relaxed);
        if e != 0 {
            return Err(Errno(e));
        }
        self.calls[class as usize].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

pub struct FaultStore<S> {
    inner: S,
    faults: Arc<FaultConfig>,
    /// Renumbering (see [`FaultConfig::set_renumber`]): this store's device number, and the
    /// next inode number to hand out.
    renumber: Option<(u64, AtomicU64)>,
}

impl<S: Store> FaultStore<S> {
    pub fn new(inner: S, faults: Arc<FaultConfig>) -> Self {
        let renumber = faults.renumber.load(Ordering::Relaxed).then(|| {
            static STORES: AtomicU64 = AtomicU64::new(1);
            let n = STORES.fetch_add(1, Ordering::Relaxed);
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            // Anonymous device numbers of FUSE mounts look like 0:4x.
            (
                40 + (t ^ n) % 200 + n * 1000,
                AtomicU64::new(t % 1_000_000 + 2),
            )
        });
        FaultStore {
            inner,
            faults,
            renumber,
        }
    }

    fn renum(&self, mut a: Attr) -> Attr {
        if let Some((dev, next)) = &self.renumber {
            a.dev = *dev;
            a.ino = next.fetch_add(1, Ordering::Relaxed);
        }
        a
    }

    fn renum_entry(&self, mut e: DirEntry) -> DirEntry {
        if let Some((_, next)) = &self.renumber {
            e.ino = next.fetch_add(1, Ordering::Relaxed);
        }
        e
    }
}

use OpClass::{Meta, Read, Write};

impl<S: Store> Store for FaultStore<S> {
    type Node = S::Node;
    type Handle = S::Handle;

    fn store_id(&self) -> &str {
        self.inner.store_id()
    }
    fn identity(&self) -> Identity {
        if self.renumber.is_some() {
            Identity::Path
        } else {
            self.inner.identity()
        }
    }
    fn root(&self) -> Result<(S::Node, Attr)> {
        self.faults.enter(Meta)?;
        self.inner.root().map(|(n, a)| (n, self.renum(a)))
    }
    fn reconnect(&self) -> Result<crate::Reconnect> {
        self.inner.reconnect()
    }
    fn lookup(&self, parent: &S::Node, name: &OsStr) -> Result<(S::Node, Attr)> {
        self.faults.enter(Meta)?;
        self.inner
            .lookup(parent, name)
            .map(|(n, a)| (n, self.renum(a)))
    }
    fn getattr(&self, node: &S::Node) -> Result<Attr> {
        self.faults.enter(Meta)?;
        self.inner.getattr(node).map(|a| self.renum(a))
    }
    fn revalidate(&self, node: &S::Node) -> Option<Result<Attr>> {
        let r = self.inner.revalidate(node)?;
        Some(
            self.faults
                .enter(Meta)
                .and_then(|_| r.map(|a| self.renum(a))),
        )
    }
    fn setattr(&self, node: &S::Node, handle: Option<&S::Handle>, set: &SetAttr) -> Result<Attr> {
        self.faults
            .enter(if set.size.is_some() { Write } else { Meta })?;
        self.inner.setattr(node, handle, set).map(|a| self.renum(a))
    }
    fn readlink(&self, node: &S::Node) -> Result<OsString> {
        self.faults.enter(Meta)?;
        self.inner.readlink(node)
    }
    fn mknod(
        &self,
        parent: &S::Node,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<(S::Node, Attr)> {
        self.faults.enter(Write)?;
        self.inner
            .mknod(parent, name, mode, rdev, owner)
            .map(|(n, a)| (n, self.renum(a)))
    }
    fn mkdir(
        &self,
        parent: &S::Node,
        name: &OsStr,
        mode: u32,
        owner: Owner,
    ) -> Result<(S::Node, Attr)> {
        self.faults.enter(Write)?;
        self.inner
            .mkdir(parent, name, mode, owner)
            .map(|(n, a)| (n, self.renum(a)))
    }
    fn symlink(
        &self,
        parent: &S::Node,
        name: &OsStr,
        target: &OsStr,
        owner: Owner,
    ) -> Result<(S::Node, Attr)> {
        self.faults.enter(Write)?;
        self.inner
            .symlink(parent, name, target, owner)
            .map(|(n, a)| (n, self.renum(a)))
    }
    fn link(&self, node: &S::Node, newparent: &S::Node, newname: &OsStr) -> Result<Attr> {
        self.faults.enter(Write)?;
        self.inner
            .link(node, newparent, newname)
            .map(|a| self.renum(a))
    }
    fn unlink(&self, parent: &S::Node, name: &OsStr) -> Result<()> {
        self.faults.enter(Meta)?;
        self.inner.unlink(parent, name)
    }
    fn rmdir(&self, parent: &S::Node, name: &OsStr) -> Result<()> {
        self.faults.enter(Meta)?;
        self.inner.rmdir(parent, name)
    }
    fn rename(
        &self,
        parent: &S::Node,
        name: &OsStr,
        newparent: &S::Node,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.faults.enter(Meta)?;
        self.inner.rename(parent, name, newparent, newname, flags)
    }
    fn child_node(&self, parent: &S::Node, name: &OsStr, kind: crate::FileKind) -> Option<S::Node> {
        self.inner.child_node(parent, name, kind)
    }
    fn open_child(
        &self,
        parent: &S::Node,
        name: &OsStr,
        flags: i32,
    ) -> Option<Result<crate::Opened<S::Node, S::Handle>>> {
        if let Err(e) = self.faults.enter(Meta) {
            return Some(Err(e));
        }
        let r = self.inner.open_child(parent, name, flags)?;
        Some(r.map(|(n, a, h)| (n, self.renum(a), h)))
    }
    fn open(&self, node: &S::Node, flags: i32) -> Result<S::Handle> {
        self.faults.enter(Meta)?;
        self.inner.open(node, flags)
    }
    fn open_based(
        &self,
        node: &S::Node,
        flags: i32,
        base: Option<crate::Fingerprint>,
    ) -> Result<S::Handle> {
        self.faults.enter(Meta)?;
        self.inner.open_based(node, flags, base)
    }
    fn close(&self, handle: &S::Handle) -> Result<()> {
        self.faults.enter(Write)?;
        self.inner.close(handle)
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
    /// Not forwarded: an injected hang blocks the thread, which only a worker can wait out.
    /// (Nor is `probe`: the default asks this store's root check or statfs, through its
    /// faults, so an injected hang keeps the store taken for hung until it ends.)
    fn keeps_call_limit(&self) -> bool {
        false
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
        self.faults.enter(Write)?;
        self.inner
            .create(parent, name, mode, flags, owner)
            .map(|(n, a, h)| (n, self.renum(a), h))
    }
    fn read(&self, handle: &S::Handle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.faults.enter(Read)?;
        self.inner.read(handle, offset, buf)
    }
    fn read_bytes(&self, handle: &S::Handle, offset: u64, len: usize) -> Result<bytes::Bytes> {
        self.faults.enter(Read)?;
        self.inner.read_bytes(handle, offset, len)
    }
    fn write(&self, handle: &S::Handle, offset: u64, data: &[u8]) -> Result<u64> {
        self.faults.enter(Write)?;
        self.inner.write(handle, offset, data)
    }
    fn write_vectored(&self, handle: &S::Handle, offset: u64, bufs: &[&[u8]]) -> Result<()> {
        self.faults.enter(Write)?;
        self.inner.write_vectored(handle, offset, bufs)
    }
    fn fstat(&self, handle: &S::Handle) -> Result<Attr> {
        self.faults.enter(Meta)?;
        self.inner.fstat(handle).map(|a| self.renum(a))
    }
    fn fsync(&self, handle: &S::Handle, datasync: bool) -> Result<()> {
        self.faults.enter(Write)?;
        self.inner.fsync(handle, datasync)
    }
    fn fsyncdir(&self, node: &S::Node, datasync: bool) -> Result<()> {
        self.faults.enter(Write)?;
        self.inner.fsyncdir(node, datasync)
    }
    fn fallocate(&self, handle: &S::Handle, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.faults.enter(Write)?;
        self.inner.fallocate(handle, mode, offset, len)
    }
    fn lseek(&self, handle: &S::Handle, offset: i64, whence: i32) -> Result<i64> {
        self.faults.enter(Meta)?;
        self.inner.lseek(handle, offset, whence)
    }
    fn copy_range(
        &self,
        from: &S::Handle,
        off_in: u64,
        to: &S::Handle,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        self.faults.enter(Write)?;
        self.inner.copy_range(from, off_in, to, off_out, len)
    }
    fn readdir(&self, node: &S::Node) -> Result<Vec<DirEntry>> {
        self.faults.enter(Meta)?;
        self.inner
            .readdir(node)
            .map(|v| v.into_iter().map(|e| self.renum_entry(e)).collect())
    }
    fn readdir_plus(&self, node: &S::Node) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        self.faults.enter(Meta)?;
        let r = self.inner.readdir_plus(node);
        if let Ok(v) = &r {
            self.faults.entries_wait(v.len());
        }
        r.map(|v| {
            v.into_iter()
                .map(|(e, a)| (self.renum_entry(e), a.map(|a| self.renum(a))))
                .collect()
        })
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
        self.faults.enter(Meta)?;
        self.inner.lists_within(node, max)
    }
    fn fstat_is_local(&self) -> bool {
        self.inner.fstat_is_local()
    }
    fn stat_names(&self, node: &S::Node, names: &[OsString]) -> Vec<Option<Attr>> {
        if self.faults.enter(Meta).is_err() {
            return vec![None; names.len()];
        }
        self.faults.entries_wait(names.len());
        self.inner
            .stat_names(node, names)
            .into_iter()
            .map(|a| a.map(|a| self.renum(a)))
            .collect()
    }
    fn statfs(&self, node: &S::Node) -> Result<StatFs> {
        self.faults.enter(Meta)?;
        self.inner.statfs(node)
    }
    fn getxattr(&self, node: &S::Node, name: &OsStr) -> Result<Vec<u8>> {
        self.faults.enter(Meta)?;
        self.inner.getxattr(node, name)
    }
    fn getxattr_at(
        &self,
        parent: &S::Node,
        name: &OsStr,
        xname: &OsStr,
    ) -> Option<Result<Vec<u8>>> {
        if let Err(e) = self.faults.enter(Meta) {
            return Some(Err(e));
        }
        self.inner.getxattr_at(parent, name, xname)
    }
    fn setxattr(&self, node: &S::Node, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.faults.enter(Write)?;
        self.inner.setxattr(node, name, value, flags)
    }
    fn listxattr(&self, node: &S::Node) -> Result<Vec<u8>> {
        self.faults.enter(Meta)?;
        self.inner.listxattr(node)
    }
    fn removexattr(&self, node: &S::Node, name: &OsStr) -> Result<()> {
        self.faults.enter(Meta)?;
        self.inner.removexattr(node, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PosixStore;

    #[test]
    fn injected_errors_reach_the_caller_and_heal() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"data").unwrap();
        let faults = FaultConfig::new();
        let store = FaultStore::new(PosixStore::open(dir.path()).unwrap(), faults.clone());
        let (root, _) = store.root().unwrap();
        let (node, _) = store.lookup(&root, OsStr::new("f")).unwrap();
        let h = store.open(&node, libc::O_RDWR).unwrap();
        faults.fail(Read, Some(libc::EIO));
        faults.fail(Write, Some(libc::ENOSPC));
        let mut buf = [0u8; 4];
        assert_eq!(store.read(&h, 0, &mut buf).unwrap_err(), Errno::EIO);
        assert_eq!(store.write(&h, 0, b"x").unwrap_err(), Errno::ENOSPC);
        faults.fail(Read, None);
        assert_eq!(store.read(&h, 0, &mut buf).unwrap(), 4);
        assert_eq!(&buf, b"data");
    }
}
