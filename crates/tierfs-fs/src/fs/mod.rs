//! [`Fs`]: the filesystem core's entry points, one per FUSE operation (minus the wire). A
//! thin dispatcher over the parts below it, which never import it:
//!
//! - `namespace`: kernel inode numbers, names, the metadata cache, the ESTALE rules;
//! - `data`: open files, the read path, read-ahead, write-through, warm/evict;
//! - `writeback`: dirty data over both, when `writeback.mode=back`.
//!
//! What the dispatcher adds is the order between them: write-back's dirty data is flushed
//! before a namespace operation or a truncate that must follow it, reads of a file with
//! dirty data go through write-back's overlay, and attributes shown to the kernel include
//! dirty data (size, mtime). `admin` holds the rest of the API: stats, tunables, memory
//! pressure, starting and stopping write-back; `attr_ops` setattr (truncates, the dropping of
//! setuid/setgid); `data_ops` the reads and writes; `dir_ops`
//! opened directories and their pages; `name_ops` the
//! operations that make, remove and rename names; `deferred`
//! write-back of namespace operations (which are acknowledged before the store has them, and
//! the wait before the others).

mod admin;
mod attr_ops;
mod data_ops;
mod deferred;
mod dir_ops;
mod name_ops;
mod xattr_ops;

use crate::counted::CountedStore;
use crate::data::{Objects, OpenReply};
use crate::identity::IdStore;
use crate::namespace::{Entry, Namespace, Requester};
use crate::shared::Shared;
use crate::writeback::Writeback;
use crate::FsConfig;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::Ordering::Release;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tierfs_cache::{PressureMonitor, RamCache, SsdCache};
use tierfs_store::{Attr, Errno, FileKind, Result, SetAttr, StatFs, Store};

pub struct Fs<S: Store> {
    sh: Arc<Shared<S>>,
    ns: Arc<Namespace<S>>,
    data: Arc<Objects<S>>,
    /// Write-back, with `writeback.mode=back` (see [`Fs::start_writeback`]).
    wb: OnceLock<Arc<Writeback<S>>>,
    /// Where write-back data is copied on arrival (huge-page regions).
    write_bufs: crate::writebuf::WriteBufs,
    /// The memory-pressure monitor (see [`Fs::start_pressure`]).
    pressure: OnceLock<PressureMonitor>,
}

impl<S: Store> Fs<S> {
    pub fn new(store: S, cfg: FsConfig) -> Result<Arc<Fs<S>>> {
        Self::with_ssd(store, cfg, None)
    }

    /// A filesystem with an SSD tier below the RAM tier.
    pub fn with_ssd(store: S, cfg: FsConfig, ssd: Option<Arc<SsdCache>>) -> Result<Arc<Fs<S>>> {
        let store = IdStore::new(CountedStore::new(store))?;
        store.inner().set_timeout(cfg.store_timeout);
        let (root, root_attr) = store.root()?;
        if root_attr.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let sh = Arc::new(Shared::new(store, cfg, ssd));
        let ns = Arc::new(Namespace::new(sh.clone(), root, &root_attr));
        {
            let ns = Arc::downgrade(&ns);
            sh.store.inner().health.set_on_back(Box::new(move || {
                if let Some(ns) = ns.upgrade() {
                    ns.reset_nodes();
                }
            }));
        }
        if sh.cfg.meta_cto {
            ns.probe_check_cost();
        }
        let data = Arc::new(Objects::new(sh.clone(), ns.clone()));
        Ok(Arc::new(Fs {
            sh,
            ns,
            data,
            wb: OnceLock::new(),
            write_bufs: Default::default(),
            pressure: OnceLock::new(),
        }))
    }

    pub fn ssd(&self) -> Option<&Arc<SsdCache>> {
        self.sh.ssd.as_ref()
    }

    /// Puts the shared tier between the SSD tier and the store (before any read).
    /// Chunks its upload queue cannot take are read back from the SSD tier, if there is one.
    pub fn set_shared_tier(&self, tier: Arc<tierfs_cache::SharedCache>) {
        if let Some(ssd) = &self.sh.ssd {
            tier.set_source(Arc::new(crate::data::SsdChunks {
                ssd: ssd.clone(),
                block_size: self.sh.cfg.block_size,
            }));
        }
        let _ = self.sh.shared_tier.set(tier);
    }

    pub fn shared_tier(&self) -> Option<&Arc<tierfs_cache::SharedCache>> {
        self.sh.shared_tier.get()
    }

    pub fn config(&self) -> &FsConfig {
        &self.sh.cfg
    }

    /// How long the kernel may keep attributes a change of ours just gave an object: what
    /// the metadata cache trusts an object that just changed for (`meta.ttl_min`).
    pub fn own_change_valid(&self) -> Duration {
        match self.ns.meta.enabled() {
            true => self.ns.meta.ttl_min(),
            false => Duration::MAX,
        }
    }

    /// Whether the metadata cache is in use (`meta.ttl` and `meta.max_entries` above 0).
    pub fn meta_cache_enabled(&self) -> bool {
        self.ns.meta.enabled()
    }

    /// Whether the store's calls are guarded against a store that hangs (`store.timeout` on
    /// a store that can hang rather than fail: a network filesystem, a FUSE mount, a bucket,
    /// an sftp server; not a local disk, nor any store with `store.timeout=0`).
    pub fn store_hang_guarded(&self) -> bool {
        self.sh.store.inner().has_deadline()
    }

    pub fn ram(&self) -> &RamCache {
        &self.sh.cache
    }

    /// Lets the core have the kernel drop cached pages (the FUSE adapter sets it at mount).
    pub fn set_kernel_cache(&self, k: Arc<dyn crate::KernelCache>) {
        self.sh.set_kernel_cache(k);
    }

    fn wb(&self) -> Option<&Arc<Writeback<S>>> {
        self.wb.get()
    }

    /// Attributes as the application sees them: with write-back, size and mtime include
    /// dirty data.
    fn shown(&self, ino: u64, mut attr: Attr) -> Attr {
        if let (Some(wb), Some(i)) = (self.wb(), self.ns.inodes.get(ino)) {
            wb.overlay_attr(&i, &mut attr);
        }
        attr
    }

    fn shown_entry(&self, mut e: Entry) -> Entry {
        e.attr = self.shown(e.ino, e.attr);
        e
    }

    /// Write-back: how many shadows of directories, and of deferred setattrs, were dropped
    /// so far (0 without write-back).
    fn unshadowed(&self) -> (u64, u64) {
        self.wb()
            .map_or((0, 0), |w| (w.unshadowed(), w.chattrs_unshadowed()))
    }

    /// `op`'s attributes as shown (see [`Fs::shown`]), `op` run again if it answered a
    /// directory and a directory's shadow was dropped meanwhile: what `op` read (the metadata
    /// cache, the store) may predate the names that landed, and the shadow that stood for them
    /// is gone. Once the shadow is dropped the metadata cache has the attributes after them,
    /// so the next run answers from it. `fast`: None rather than running `op` again.
    /// `discard` undoes what an answer not given took (a lookup's reference).
    fn shown_stable<T>(
        &self,
        op: impl Fn() -> Option<Result<T>>,
        attr: impl Fn(&mut T) -> (u64, &mut Attr),
        discard: impl Fn(&T),
        fast: bool,
    ) -> Option<Result<T>> {
        let mut tries = 0;
        loop {
            let before = self.unshadowed();
            let mut r = match op()? {
                Ok(r) => r,
                Err(e) => return Some(Err(e)),
            };
            let (ino, a) = attr(&mut r);
            *a = self.shown(ino, *a);
            let dir = a.kind == tierfs_store::FileKind::Dir;
            let now = self.unshadowed();
            if now.1 == before.1 && (!dir || now.0 == before.0) {
                return Some(Ok(r));
            }
            tries += 1;
            if !fast && tries >= 16 {
                // Shadows keep being dropped (an untar's directories landing): the store is
                // asked, after the last drop seen, and its answer is the truth.
                return Some(Ok(r));
            }
            discard(&r);
            if fast {
                return None;
            }
        }
    }

    /// Write-back: `parent/name`'s dirty data reaches the store before a namespace
    /// operation on it.
    fn settle_name(&self, parent: u64, name: &OsStr) -> Result<()> {
        match self.wb() {
            Some(wb) => wb.settle_name(parent, name),
            None => Ok(()),
        }
    }

    /// Write-back: `ino`'s dirty data reaches the store before an operation that must
    /// follow it (truncate, fallocate, SEEK_DATA).
    fn settle_file(&self, ino: u64) -> Result<()> {
        match self.wb() {
            Some(wb) => wb.settle_file(&self.ns.inode(ino)?),
            None => Ok(()),
        }
    }

    // ---------------------------------------------------------------- names and attributes

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Entry> {
        self.lookup_by(parent, name, 0)
    }

    /// [`Fs::lookup`] on behalf of caller thread `pid` (0: unknown), see [`Fs::open_by`].
    pub fn lookup_by(&self, parent: u64, name: &OsStr, pid: u32) -> Result<Entry> {
        self.shown_stable(
            || Some(self.cached_if_gone(|| self.ns.lookup_by(parent, name, pid))),
            |e| (e.ino, &mut e.attr),
            |e| self.forget(e.ino, 1),
            false,
        )
        .unwrap_or(Err(Errno::EIO))
    }

    /// Runs a read-only operation; if it failed because the store just went away (ENOTCONN,
    /// and the store is now marked gone), runs it once more: the caches now answer whatever
    /// the age of what they hold (see `health`), so what is cached is served.
    fn cached_if_gone<T>(&self, op: impl Fn() -> Result<T>) -> Result<T> {
        match op() {
            Err(Errno::ENOTCONN) if self.sh.store.inner().health.gone() => op(),
            r => r,
        }
    }

    /// A lookup the metadata cache answers without any I/O, for the FUSE thread itself;
    /// None when it would need the SSD tier or the backing store.
    pub fn lookup_fast(&self, parent: u64, name: &OsStr, pid: u32) -> Option<Result<Entry>> {
        self.shown_stable(
            || self.ns.lookup_fast(parent, name, pid),
            |e| (e.ino, &mut e.attr),
            |e| self.forget(e.ino, 1),
            true,
        )
    }

    /// [`Fs::getattr_valid`] when the metadata cache can answer without I/O.
    pub fn getattr_fast(&self, ino: u64) -> Option<(Attr, Duration)> {
        self.shown_stable(
            || self.ns.getattr_fast(ino).map(Ok),
            |r| (ino, &mut r.0),
            |_| {},
            true,
        )?
        .ok()
    }

    pub fn forget(&self, ino: u64, n: u64) {
        if self.ns.forget(ino, n) {
            self.data.forgotten(ino);
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(self.getattr_valid(ino, 0)?.0)
    }

    /// [`Fs::getattr`] and how long the kernel may keep the answer (see [`Entry::valid`]).
    /// `pid`: the caller thread (0: unknown), see [`Fs::open_by`].
    pub fn getattr_valid(&self, ino: u64, pid: u32) -> Result<(Attr, Duration)> {
        self.shown_stable(
            || {
                Some(
                    match self.cached_if_gone(|| self.ns.getattr_valid(ino, pid)) {
                        // Unlinked while open, on a store that names objects by path (sftp,
                        // S3, sshfs): the name is gone, the open file is not.
                        Err(e) if e == Errno::ENOENT || e == Errno::ESTALE => self
                            .data
                            .fstat_open(ino)
                            .map(|a| (a, Duration::ZERO))
                            .ok_or(e),
                        r => r,
                    },
                )
            },
            |r| (ino, &mut r.0),
            |_| {},
            false,
        )
        .unwrap_or(Err(Errno::EIO))
    }

    pub fn readlink(&self, ino: u64) -> Result<OsString> {
        self.ns.readlink(ino)
    }

    // ---------------------------------------------------------------- directories

    pub fn fsyncdir(&self, ino: u64, datasync: bool) -> Result<()> {
        // Its deferred names are on the store (each group syncs its directories).
        self.drain_ns()?;
        self.ns.fsyncdir(ino, datasync)
    }

    pub fn statfs(&self) -> Result<StatFs> {
        self.ns.statfs()
    }

    // ---------------------------------------------------------------- open files

    /// Opens a file. Close-to-open coherence: the backing file's fingerprint is checked here,
    /// every time; a change drops our cached blocks and the kernel's page cache.
    pub fn open(&self, ino: u64, flags: i32) -> Result<OpenReply> {
        self.open_by(ino, flags, 0)
    }

    /// An open answered without I/O (`meta.cto=off`, read-only, attributes fresh), for the
    /// FUSE thread itself; None when it needs the backing store.
    pub fn open_fast(&self, ino: u64, flags: i32) -> Option<OpenReply> {
        let r = self.data.open_fast(ino, flags);
        if r.is_some() {
            self.data.opened_for_walk(ino);
        }
        r
    }

    /// [`Fs::open`] on behalf of caller thread `pid` (0: unknown).
    pub fn open_by(&self, ino: u64, flags: i32, pid: u32) -> Result<OpenReply> {
        self.open_at(ino, flags, pid, std::time::Instant::now())
    }

    /// [`Fs::open_by`] of an open whose request arrived at `began`: a check of the file the
    /// store was asked for after then is this open's close-to-open check too.
    pub fn open_at(
        &self,
        ino: u64,
        flags: i32,
        pid: u32,
        began: std::time::Instant,
    ) -> Result<OpenReply> {
        if let Some(o) = self.open_provisional(ino, flags)? {
            return Ok(o);
        }
        let truncating = flags & libc::O_TRUNC != 0;
        // Write-back defers the truncate of a clean file of the store (`writeback::ns_chattr`):
        // the file is opened as it is, and truncated once the open has succeeded (a failed
        // open truncates nothing).
        // (Not O_RDONLY|O_TRUNC: a read-only open takes the path below that opens nothing.)
        let later =
            truncating && flags & libc::O_ACCMODE != libc::O_RDONLY && self.may_defer_truncate(ino);
        let flags = if later { flags & !libc::O_TRUNC } else { flags };
        if truncating && !later {
            // The dirty data first, or its flush would land after the truncate.
            self.settle_file(ino)?;
        }
        if crate::data::read_only(flags) {
            let r = self.cached_if_gone(|| self.data.open_by(ino, flags, pid, began));
            if r.is_ok() {
                self.data.opened_for_walk(ino);
            }
            return r;
        }
        // A hung store is not asked to open the file for write-back (the call would wait
        // for it): write-back absorbs the writes, as while the store is gone.
        let r = if self.wb().is_some() && self.hangs_for_write_open(ino) {
            Err(Errno::ENOTCONN)
        } else {
            self.data.open_by(ino, flags, pid, began)
        };
        let r = match r {
            // Write-back absorbs writes while the store is gone (within its limits).
            Err(Errno::ENOTCONN) if self.wb().is_some() && self.sh.store.inner().health.gone() => {
                self.data.open_while_gone(ino, flags)
            }
            r => r,
        };
        if flags & libc::O_TRUNC != 0 {
            if let Ok(o) = &r {
                self.publish_truncate(ino, o.fh)?;
            }
        }
        if let (true, Ok(o)) = (later, &r) {
            let set = SetAttr {
                size: Some(0),
                ..Default::default()
            };
            // Deferred; or, if that is refused after all (a race with a write, a second
            // link), done on the store as a truncate through the new descriptor.
            if let Err(e) = self.setattr(ino, Some(o.fh), &set) {
                // The kernel will not release what it was never given.
                self.data.release(o.fh);
                return Err(e);
            }
        }
        if truncating {
            self.names_changed(ino);
        }
        r
    }

    /// Write-back: whether the store is taken for hung before a write open. Where it can
    /// hang, it is first asked within the deadline (a revalidation of the file): the open
    /// itself is not bounded, and a write open into a store that had just stopped waited in
    /// it for good, the writer unkillable (`tests/hung_store.rs`). The cost: one store
    /// request per write open in write-back on such a store.
    fn hangs_for_write_open(&self, ino: u64) -> bool {
        let counted = self.sh.store.inner();
        if counted.health.hung() {
            return true;
        }
        if !counted.has_deadline() {
            return false;
        }
        let Ok(i) = self.ns.inode(ino) else {
            return false;
        };
        if let Ok(node) = self.ns.node(&i) {
            let _ = self.sh.store.revalidate(&node);
        }
        counted.health.hung()
    }

    /// Write-back on a store that publishes at sync (S3): an O_TRUNC open's truncate is
    /// staged in the descriptor's handle, outside the journal. It is uploaded now, as our
    /// own new version, and the data written next is made on that version. Left to the
    /// handle's last close, it would land unannounced before or after the data's flush,
    /// which then took the bucket's version for another writer's and kept its data in
    /// `journal/lost`. (A truncate that changes nothing, the O_TRUNC of a new empty object,
    /// uploads nothing.)
    fn publish_truncate(&self, ino: u64, fh: u64) -> Result<()> {
        if self.wb().is_some() && self.sh.store.publishes_at_sync() {
            if let Err(e) = self.data.fsync(ino, fh, false, false) {
                // The open fails: the kernel will not release what it was never given.
                self.data.release(fh);
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        req: Requester,
    ) -> Result<(Entry, OpenReply)> {
        let r = self.create_deferred(parent, name, mode, flags, req, true);
        self.names_changed(parent);
        if let Some((e, o)) = r? {
            return Ok((self.shown_entry(e), o));
        }
        self.drain_ns()?;
        if flags & libc::O_TRUNC != 0 {
            // An existing file is truncated: its dirty data first (see `open_by`).
            self.settle_name(parent, name)?;
        }
        let r = self.data.create(parent, name, mode, flags, req);
        self.names_changed(parent);
        let (mut e, o) = r?;
        if flags & libc::O_TRUNC != 0 {
            // An existing file truncated by a caller without CAP_FSETID (uid 0 stands for
            // it, as in the adapter's open) loses setuid and setgid, as `Fs::kill_suidgid`.
            let privs = if req.uid != 0 {
                e.attr.perm_without_privs()
            } else {
                None
            };
            let r = self
                .publish_truncate(e.ino, o.fh)
                .and_then(|()| match privs {
                    Some(perm) => {
                        let set = SetAttr {
                            mode: Some(perm),
                            ..Default::default()
                        };
                        self.setattr(e.ino, Some(o.fh), &set).map(|a| e.attr = a)
                    }
                    None => Ok(()),
                });
            if let Err(err) = r {
                // The kernel never gets the entry, so it sends no FORGET for it.
                self.forget(e.ino, 1);
                return Err(err);
            }
            self.names_changed(e.ino); // an existing file truncated
        }
        if let Some(i) = self.ns.inodes.get(e.ino) {
            if flags & libc::O_EXCL != 0 {
                self.ns.meta.made_without_caps(i.id());
            }
            if let (Some(_), Some(st)) = (self.wb(), &i.file) {
                // Its directory is synced before the journal lets go of its data.
                st.created.store(true, Release);
            }
        }
        Ok((self.shown_entry(e), o))
    }

    pub fn release(&self, fh: u64) {
        self.data.release(fh)
    }

    pub fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        let wb = self.wb();
        if let Some(wb) = wb {
            // Its name first: the operations it depends on (its create, its directory's)
            // are on the store and synced before its data is.
            wb.drain_ns()?;
            wb.fsync_back(&self.ns.inode(ino)?)?;
        }
        let r = self.data.fsync(ino, fh, datasync, wb.is_some());
        if self.sh.store.publishes_at_sync() {
            self.names_changed(ino);
        }
        r
    }

    /// close(2) (FUSE FLUSH) of open file `fh`: in write-back mode the file's data per
    /// `writeback.close`, and a flush error not yet reported; in write-through mode, on a
    /// store that publishes at close (S3), the upload of what was written.
    pub fn flush(&self, ino: u64, fh: u64) -> Result<()> {
        match self.wb() {
            Some(wb) => wb.flush(ino),
            None => {
                let r = self.data.close(ino, fh);
                if self.sh.store.publishes_at_sync() {
                    self.names_changed(ino); // the upload makes a new version
                }
                r
            }
        }
    }

    /// close(2) must reach the daemon: write-back, or a store that publishes at close.
    pub fn wants_close(&self) -> bool {
        self.wb().is_some() || self.sh.store.publishes_at_sync()
    }

    pub fn fallocate(&self, ino: u64, fh: u64, mode: i32, offset: u64, len: u64) -> Result<()> {
        let of = self.data.file_for(ino, fh, true)?;
        if let Some(wb) = self.wb() {
            wb.settle_file(&of.inode)?;
        }
        let r = self.data.fallocate(&of, mode, offset, len);
        self.ns.listed_changed(&of.inode);
        r
    }

    pub fn lseek(&self, ino: u64, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        let of = self.data.file_for(ino, fh, false)?;
        if let Some(wb) = self.wb() {
            // SEEK_DATA/SEEK_HOLE ask the backing file where its data is: it must hold it all.
            wb.settle_file(&of.inode)?;
        }
        self.data.lseek(&of, offset, whence)
    }
}
