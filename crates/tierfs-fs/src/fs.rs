//! [`Fs`]: the filesystem core's entry points (one per FUSE operation, minus the wire).

use crate::counted::CountedStore;
use crate::file_state::{FileState, Observed};
use crate::inode::{now_ms, Inode, InodeTable};
use crate::pool::Pool;
use crate::read::{FetchResult, ReadAhead};
use crate::stats::{FsStats, StatsSnapshot};
use crate::FsConfig;
use dashmap::DashMap;
use parking_lot::Mutex;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tierfs_cache::{BlockKey, RamCache, SingleFlight};
use tierfs_store::{Attr, DirEntry, Errno, FileKind, Owner, Result, SetAttr, StatFs, Store};

pub(crate) type St<S> = CountedStore<S>;

/// A name the kernel now knows: inode number and attributes (with `attr.ino` = that number).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub ino: u64,
    pub attr: Attr,
}

#[derive(Clone, Copy, Debug)]
pub struct OpenReply {
    pub fh: u64,
    /// The file is unchanged since it was last opened: the kernel may keep its page cache.
    pub keep_cache: bool,
    /// The file changed since the kernel was last given its attributes: the kernel must drop
    /// them (it trusts them for attr_ttl, which follows meta.ttl and may be an hour), or it
    /// would clip reads at a stale size and break close-to-open coherence.
    pub attrs_stale: bool,
}

/// Who asked, for ownership of new objects.
#[derive(Clone, Copy, Debug)]
pub struct Requester {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Clone, Debug)]
pub struct DirEntryOut {
    pub ino: u64,
    pub name: OsString,
    pub kind: FileKind,
    /// Offset of the entry after this one.
    pub next_offset: u64,
}

pub(crate) struct OpenFile<S: Store> {
    pub handle: S::Handle,
    /// Keeps the inode (and its backing node) alive while the file is open.
    pub _inode: Arc<Inode<St<S>>>,
    pub state: Arc<FileState>,
    pub ra: Mutex<ReadAhead>,
    /// Serializes backing reads of a sequential stream (see `fetch_run`).
    pub seq_fetch: Mutex<()>,
}

struct DirHandle {
    entries: Vec<DirEntryOut>,
}

pub struct Fs<S: Store> {
    pub(crate) store: St<S>,
    pub(crate) cfg: FsConfig,
    pub(crate) inodes: InodeTable<St<S>>,
    pub(crate) cache: RamCache,
    pub(crate) flights: SingleFlight<BlockKey, FetchResult>,
    pub(crate) files: DashMap<u64, Arc<OpenFile<S>>>,
    dirs: DashMap<u64, Arc<DirHandle>>,
    next_fh: AtomicU64,
    pub(crate) stats: FsStats,
    pub(crate) ra_pool: Pool,
    as_root: bool,
    /// Caller threads whose last open was answered ESTALE (file replaced behind our back),
    /// and when (`now_ms`): their next lookups and open are the kernel's retry of that open.
    estale: DashMap<u32, u64>,
}

/// How long the kernel may take to retry an open answered ESTALE.
const ESTALE_RETRY_MS: u64 = 1000;

impl<S: Store> Fs<S> {
    pub fn new(store: S, cfg: FsConfig) -> Result<Arc<Fs<S>>> {
        let store = CountedStore::new(store);
        let (root, root_attr) = store.root()?;
        if root_attr.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        Ok(Arc::new(Fs {
            inodes: InodeTable::new(root, &root_attr, 1 << 20),
            cache: RamCache::new(cfg.ram_max),
            flights: SingleFlight::new(Err(crate::read::FetchError::Errno(Errno::EIO))),
            files: DashMap::new(),
            dirs: DashMap::new(),
            next_fh: AtomicU64::new(1),
            stats: FsStats::default(),
            ra_pool: Pool::new("tierfs-ra", cfg.readahead_threads),
            as_root: unsafe { libc::geteuid() } == 0,
            estale: DashMap::new(),
            store,
            cfg,
        }))
    }

    pub fn config(&self) -> &FsConfig {
        &self.cfg
    }

    pub fn ram(&self) -> &RamCache {
        &self.cache
    }

    pub(crate) fn inode(&self, ino: u64) -> Result<Arc<Inode<St<S>>>> {
        // ESTALE: the kernel named an inode we no longer know (it cannot, by the forget
        // protocol, unless the daemon restarted under it).
        self.inodes.get(ino).ok_or(Errno::ESTALE)
    }

    pub(crate) fn open_file(&self, fh: u64) -> Result<Arc<OpenFile<S>>> {
        self.files.get(&fh).map(|f| f.clone()).ok_or(Errno::EBADF)
    }

    fn owner(&self, req: Requester) -> Owner {
        self.as_root.then_some((req.uid, req.gid))
    }

    fn entry(&self, node: S::Node, mut attr: Attr) -> Entry {
        let inode = self.inodes.remember(node, &attr);
        attr.ino = inode.ino;
        Entry {
            ino: inode.ino,
            attr,
        }
    }

    pub(crate) fn with_ino(&self, inode: &Inode<St<S>>, mut attr: Attr) -> Attr {
        attr.ino = inode.ino;
        attr
    }

    /// Records fresh attributes of a regular file; counts changes made behind our back.
    pub(crate) fn observe(&self, state: &FileState, attr: &Attr) {
        if let Observed::Changed = state.observe(attr) {
            FsStats::add(&self.stats.version_changes, 1);
        }
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Entry> {
        self.lookup_by(parent, name, 0)
    }

    /// [`Fs::lookup`] on behalf of caller thread `pid` (0: unknown), see [`Fs::open_by`].
    pub fn lookup_by(&self, parent: u64, name: &OsStr, pid: u32) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) = self.store.lookup(&p.node, name)?;
        let e = self.entry(node, attr);
        if pid != 0 {
            if let Some(i) = self.inodes.get(e.ino) {
                i.note_lookup(pid);
            }
        }
        Ok(e)
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let i = self.inode(ino)?;
        let attr = self.store.getattr(&i.node)?;
        if let Some(st) = &i.file {
            self.observe(st, &attr);
        }
        Ok(self.with_ino(&i, attr))
    }

    pub fn setattr(&self, ino: u64, fh: Option<u64>, set: &SetAttr) -> Result<Attr> {
        let i = self.inode(ino)?;
        let of = match fh {
            Some(fh) => self.files.get(&fh).map(|f| f.clone()),
            None => None,
        };
        let handle = of.as_ref().map(|f| &f.handle);
        let Some(st) = &i.file else {
            return Ok(self.with_ino(&i, self.store.setattr(&i.node, handle, set)?));
        };
        // Exclusive: a truncate must not interleave with reads that fill the cache.
        let _w = st.rw.write();
        let attr = self.store.setattr(&i.node, handle, set);
        match (&attr, set.size) {
            (Ok(a), None) => {
                if let Observed::Changed = st.observe_own_metadata_change(a) {
                    FsStats::add(&self.stats.version_changes, 1);
                }
            }
            (Ok(a), Some(_)) => st.invalidate(Some(a)),
            (Err(_), _) => st.invalidate(None),
        }
        Ok(self.with_ino(&i, attr?))
    }

    pub fn readlink(&self, ino: u64) -> Result<OsString> {
        let i = self.inode(ino)?;
        self.store.readlink(&i.node)
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        req: Requester,
    ) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) = self
            .store
            .mknod(&p.node, name, mode, rdev, self.owner(req))?;
        Ok(self.entry(node, attr))
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, req: Requester) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) = self.store.mkdir(&p.node, name, mode, self.owner(req))?;
        Ok(self.entry(node, attr))
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
        req: Requester,
    ) -> Result<Entry> {
        let p = self.inode(parent)?;
        let (node, attr) = self.store.symlink(&p.node, name, target, self.owner(req))?;
        Ok(self.entry(node, attr))
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Entry> {
        let i = self.inode(ino)?;
        let np = self.inode(newparent)?;
        let attr = self.store.link(&i.node, &np.node, newname)?;
        if let Some(st) = &i.file {
            st.observe_own_metadata_change(&attr);
        }
        Ok(self.entry(i.node.clone(), attr))
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<()> {
        let p = self.inode(parent)?;
        self.store.unlink(&p.node, name)
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        let p = self.inode(parent)?;
        self.store.rmdir(&p.node, name)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let p = self.inode(parent)?;
        let np = self.inode(newparent)?;
        self.store.rename(&p.node, name, &np.node, newname, flags)?;
        // A rename moves the file's ctime; tell its state that the data did not change, so
        // the cached blocks survive the rename.
        if let Ok((_, attr)) = self.store.lookup(&np.node, newname) {
            self.note_own_metadata_change(&attr);
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            if let Ok((_, attr)) = self.store.lookup(&p.node, name) {
                self.note_own_metadata_change(&attr);
            }
        }
        Ok(())
    }

    fn note_own_metadata_change(&self, attr: &Attr) {
        if attr.kind != FileKind::File {
            return;
        }
        if let Some(i) = self.inodes.get(self.inodes.kernel_ino(attr)) {
            if let Some(st) = &i.file {
                st.observe_own_metadata_change(attr);
            }
        }
    }

    fn add_open_file(&self, inode: Arc<Inode<St<S>>>, handle: S::Handle) -> Result<u64> {
        let state = inode.file.clone().ok_or(Errno::EINVAL)?;
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.files.insert(
            fh,
            Arc::new(OpenFile {
                handle,
                _inode: inode,
                state,
                ra: Mutex::new(ReadAhead::default()),
                seq_fetch: Mutex::new(()),
            }),
        );
        Ok(fh)
    }

    /// Opens a file. Close-to-open coherence: the backing file's fingerprint is checked here,
    /// every time; a change drops our cached blocks and the kernel's page cache.
    pub fn open(&self, ino: u64, flags: i32) -> Result<OpenReply> {
        self.open_by(ino, flags, 0)
    }

    /// [`Fs::open`] on behalf of caller thread `pid` (0: unknown).
    pub fn open_by(&self, ino: u64, flags: i32, pid: u32) -> Result<OpenReply> {
        let i = self.inode(ino)?;
        let st = i.file.clone().ok_or(Errno::EISDIR)?;
        let handle = if flags & libc::O_TRUNC != 0 {
            // Never truncate a replaced file that others may still be reading.
            self.check_not_replaced(&i, self.store.getattr(&i.node)?.nlink, pid)?;
            let _w = st.rw.write();
            let h = self.store.open(&i.node, flags)?;
            st.invalidate(None);
            h
        } else {
            self.store.open(&i.node, flags)?
        };
        let attr = self.store.fstat(&handle)?;
        if flags & libc::O_TRUNC == 0 {
            // (O_TRUNC checked before truncating.)
            self.check_not_replaced(&i, attr.nlink, pid)?;
        }
        let before = st.version().gen;
        let opened_before = st.last_opened();
        let keep_cache = st.opened(&attr);
        let changed = st.version().gen != before;
        if changed {
            FsStats::add(&self.stats.version_changes, 1);
        }
        // The kernel's attributes came from a lookup/getattr (which observed the state's
        // fingerprint) or from before the previous open; either way they are stale if the
        // fingerprint moved since.
        let attrs_stale = changed || opened_before.is_some_and(|fp| fp != attr.fingerprint());
        let fh = self.add_open_file(i, handle)?;
        Ok(OpenReply {
            fh,
            keep_cache,
            attrs_stale,
        })
    }

    /// Close-to-open for names: fails an open of a file that no longer has a name (`nlink`
    /// 0) in the backing store with ESTALE, unless this open is the kernel's retry of one.
    fn check_not_replaced(&self, i: &Inode<St<S>>, nlink: u32, pid: u32) -> Result<()> {
        if nlink == 0 {
            // The backing file was deleted or renamed over behind our back, but the kernel
            // still maps the name to it (it trusts names for entry_ttl, maybe an hour).
            // ESTALE makes the VFS walk the path again with LOOKUP_REVAL, which asks us to
            // look the name up afresh: the open then reaches the file the name holds now
            // (close-to-open for the usual write-temp-and-rename update), or fails ENOENT.
            // The VFS retries only once: if the file that retry found was itself replaced
            // in the meantime (a burst of replacements), open it anyway rather than fail the
            // application: the name held it during this very open(2), since this thread's
            // own retry looked it up after our ESTALE.
            let retry_since = self.estale.remove(&pid).map(|(_, t)| t);
            let (looked_up, by) = i.looked_up();
            let is_retry = pid != 0
                && by == pid
                && retry_since.is_some_and(|t| {
                    looked_up >= t && now_ms().saturating_sub(t) <= ESTALE_RETRY_MS
                });
            if !is_retry {
                if pid != 0 {
                    self.estale.insert(pid, now_ms());
                }
                return Err(Errno::ESTALE);
            }
        } else if pid != 0 {
            self.estale.remove(&pid);
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
        let p = self.inode(parent)?;
        let (node, attr, handle) =
            self.store
                .create(&p.node, name, mode, flags, self.owner(req))?;
        let entry = self.entry(node, attr);
        let inode = self.inode(entry.ino)?;
        if let Some(st) = &inode.file {
            st.invalidate(Some(&attr));
            st.opened(&attr);
        }
        let fh = self.add_open_file(inode, handle)?;
        Ok((
            entry,
            OpenReply {
                fh,
                keep_cache: false,
                attrs_stale: false,
            },
        ))
    }

    pub fn release(&self, fh: u64) {
        self.files.remove(&fh);
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        let of = self.open_file(fh)?;
        self.store.fsync(&of.handle, datasync)
    }

    pub fn fallocate(&self, fh: u64, mode: i32, offset: u64, len: u64) -> Result<()> {
        let of = self.open_file(fh)?;
        let _w = of.state.rw.write();
        let r = self.store.fallocate(&of.handle, mode, offset, len);
        let attr = self.store.fstat(&of.handle).ok();
        of.state.invalidate(attr.as_ref());
        r
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        let of = self.open_file(fh)?;
        self.store.lseek(&of.handle, offset, whence)
    }

    /// Reads the directory once; later readdir calls page through this snapshot, so offsets
    /// stay valid while the directory changes.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let i = self.inode(ino)?;
        if i.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let listing = self.store.readdir(&i.node)?;
        let mut entries = Vec::with_capacity(listing.len() + 2);
        entries.push(DirEntryOut {
            ino,
            name: ".".into(),
            kind: FileKind::Dir,
            next_offset: 1,
        });
        entries.push(DirEntryOut {
            ino,
            name: "..".into(),
            kind: FileKind::Dir,
            next_offset: 2,
        });
        for DirEntry {
            name,
            ino: bino,
            kind,
        } in listing
        {
            let kind = kind.unwrap_or(FileKind::File);
            let next_offset = entries.len() as u64 + 1;
            let ino = self.inodes.kernel_ino_of_entry(bino);
            entries.push(DirEntryOut {
                ino,
                name,
                kind,
                next_offset,
            });
        }
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.dirs.insert(fh, Arc::new(DirHandle { entries }));
        Ok(fh)
    }

    /// Entries from `offset` on.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<Vec<DirEntryOut>> {
        let d = self.dirs.get(&fh).map(|d| d.clone()).ok_or(Errno::EBADF)?;
        Ok(d.entries.iter().skip(offset as usize).cloned().collect())
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.remove(&fh);
    }

    pub fn fsyncdir(&self, ino: u64, datasync: bool) -> Result<()> {
        let i = self.inode(ino)?;
        self.store.fsyncdir(&i.node, datasync)
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let r = self.inode(crate::ROOT_INO)?;
        self.store.statfs(&r.node)
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        self.store.getxattr(&i.node, name)
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        self.store.listxattr(&i.node)
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        let i = self.inode(ino)?;
        self.store.setxattr(&i.node, name, value, flags)?;
        self.after_xattr_change(&i);
        Ok(())
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<()> {
        let i = self.inode(ino)?;
        self.store.removexattr(&i.node, name)?;
        self.after_xattr_change(&i);
        Ok(())
    }

    fn after_xattr_change(&self, i: &Inode<St<S>>) {
        if let (Some(st), Ok(attr)) = (&i.file, self.store.getattr(&i.node)) {
            st.observe_own_metadata_change(&attr);
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        StatsSnapshot {
            store_id: self.store.store_id().to_string(),
            block_size: self.cfg.block_size,
            ram: self.cache.stats(),
            backing: self.store.counters.snapshot(),
            read_requests: FsStats::get(&s.read_requests),
            read_bytes: FsStats::get(&s.read_bytes),
            read_ram_only: FsStats::get(&s.read_ram_only),
            write_requests: FsStats::get(&s.write_requests),
            write_bytes: FsStats::get(&s.write_bytes),
            fetched_blocks: FsStats::get(&s.fetched_blocks),
            readahead_blocks: FsStats::get(&s.readahead_blocks),
            singleflight_waits: FsStats::get(&s.singleflight_waits),
            stale_fetches: FsStats::get(&s.stale_fetches),
            version_changes: FsStats::get(&s.version_changes),
            inodes: self.inodes.len() as u64,
            file_states: self.inodes.file_states() as u64,
            open_files: self.files.len() as u64,
            open_dirs: self.dirs.len() as u64,
        }
    }
}
