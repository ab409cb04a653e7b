//! Opening files (close-to-open: the fingerprint is checked at every open unless
//! `meta.cto=off` lets the metadata cache answer), the backing handle opened on first need,
//! and the operations on an open file that are not reads or writes.

use super::{Objects, OpenFile};
use crate::file_state::Observed;
use crate::inode::Inode;
use crate::namespace::{is_provisional, Entry, Requester};
use crate::shared::{Handle, St};
use crate::stats::FsStats;
use std::ffi::OsStr;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::Arc;
use std::time::Instant;
use tierfs_store::{Attr, Errno, Result, SetAttr, Store, SUID_SGID};

#[derive(Clone, Copy, Debug)]
pub struct OpenReply {
    pub fh: u64,
    /// The file is unchanged since it was last opened: the kernel may keep its page cache.
    pub keep_cache: bool,
    /// The file changed since the kernel was last given its attributes: the kernel must drop
    /// them (it trusts them for attr_ttl, which follows meta.ttl and may be an hour), or it
    /// would clip reads at a stale size and break close-to-open coherence.
    pub attrs_stale: bool,
    /// close(2) has nothing to do or report for this open (a file created by it in
    /// write-back, `writeback.close=async`): the kernel may skip the FLUSH request.
    pub no_flush: bool,
}

/// Close-to-open checks averaged before the log says what they cost ([`COST_NOTED_US`]).
const COST_SAMPLE: u64 = 64;
/// An average check at least this long (microseconds) is worth a line in the log: a store
/// request, not a local filesystem's answer.
const COST_NOTED_US: u64 = 2_000;

/// An open that neither writes nor truncates: the file's contents cannot change through it.
pub(crate) fn read_only(flags: i32) -> bool {
    flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_TRUNC == 0
}

impl<S: Store> Objects<S> {
    /// An open answered without I/O (`meta.cto=off`, read-only, attributes fresh), for the
    /// FUSE thread itself; None when it needs the backing store. Trusting the metadata cache,
    /// the backing file is opened only when a read misses every tier.
    pub fn open_fast(&self, ino: u64, flags: i32) -> Option<OpenReply> {
        let i = self.ns.inodes.get(ino)?;
        let st = i.file.clone()?;
        // While the store is gone, a read-only open is answered from what is cached whatever
        // `meta.cto` says: the store could not answer it.
        let gone = self.sh.store.inner().health.gone();
        if !read_only(flags)
            || (self.sh.cfg.meta_cto && !gone)
            || st.expired(|fp, at| self.ns.meta.version_expired(fp, at))
        {
            return None;
        }
        FsStats::add(&self.sh.stats.lazy_opens, 1);
        FsStats::add(&self.sh.stats.opens, 1);
        let keep_cache = st.opened_trusted();
        let fh = self.add_open_file(i, None, flags).ok()?;
        Some(OpenReply {
            fh,
            keep_cache,
            attrs_stale: false,
            no_flush: false,
        })
    }

    /// An open while the store is gone (see `health`), for write-back, whose writes need no
    /// backing handle (flushers open their own once the store is back): answered from what
    /// is cached. Not for O_TRUNC, which must reach the store first.
    pub fn open_while_gone(&self, ino: u64, flags: i32) -> Result<OpenReply> {
        let i = self.ns.inode(ino)?;
        let st = i.file.clone().ok_or(Errno::EISDIR)?;
        if flags & libc::O_TRUNC != 0 || !self.sh.store.inner().health.gone() {
            return Err(Errno::ENOTCONN);
        }
        FsStats::add(&self.sh.stats.lazy_opens, 1);
        FsStats::add(&self.sh.stats.opens, 1);
        let keep_cache = st.opened_trusted();
        let fh = self.add_open_file(i, None, flags)?;
        Ok(OpenReply {
            fh,
            keep_cache,
            attrs_stale: false,
            no_flush: false,
        })
    }

    /// `Fs::open` on behalf of caller thread `pid` (0: unknown), for an open that began at
    /// `began` (its request's arrival). Close-to-open in at most one store request
    /// (`namespace::checks`): a read-only open takes as its check the answer to its own
    /// lookup or permission check, or a check of the file issued after it began, or makes
    /// one (the lookup that resolves an inode learnt from the cache, else a revalidation).
    pub fn open_by(&self, ino: u64, flags: i32, pid: u32, began: Instant) -> Result<OpenReply> {
        if let Some(o) = self.open_fast(ino, flags) {
            return Ok(o);
        }
        FsStats::add(&self.sh.stats.opens, 1);
        let i = self.ns.inode(ino)?;
        let st = i.file.clone().ok_or(Errno::EISDIR)?;
        let estale = |e: Errno| {
            if e == Errno::ESTALE {
                // The name holds another object now; the kernel retries (see
                // `check_not_replaced`), and that retry's lookup must ask the store.
                self.ns.arm_estale_retry(pid);
            }
            e
        };
        if read_only(flags)
            && !st.unverified()
            && !st.has_dirty.load(Relaxed)
            && (self.has_cached_data(&st) || self.start_from_shared(&st))
        {
            if let Some(a) = self.ns.checks.recent(pid, i.id()) {
                FsStats::add(&self.sh.stats.cto_shared, 1);
                return self.open_checked(i, st, a.attr, flags, pid, a.asked);
            }
            let (r, shared) = self.ns.checks.check(i.id(), began, || {
                let asked = Instant::now();
                let (node, looked) = self.ns.node_checked(&i)?;
                if looked.is_some() {
                    return Ok(looked);
                }
                Ok(match self.sh.store.revalidate(&node) {
                    Some(attr) => Some(crate::namespace::Answer { attr: attr?, asked }),
                    None => None,
                })
            });
            if shared {
                FsStats::add(&self.sh.stats.cto_shared, 1);
            } else {
                self.checked_for(began);
            }
            if let Some(a) = r.map_err(estale)? {
                return self.open_checked(i, st, a.attr, flags, pid, a.asked);
            }
        }
        // Before any attribute is fetched (see `FileState::own_change`).
        let fetched = Instant::now();
        if read_only(flags) && !st.unverified() {
            // A file read for the first time, by its name: its open is its check.
            if let Some(r) = self.ns.open_by_name(&i, flags) {
                let (handle, attr) = r.map_err(estale)?;
                let attr = {
                    let mut a = attr;
                    (a.dev, a.ino) = st.id();
                    a
                };
                self.ns.meta.put_attr(&attr, fetched);
                self.ns.check_not_replaced(attr.nlink, pid)?;
                return self.finish_open(i, st, attr, Some(handle), flags, fetched);
            }
        }
        let node = self.ns.node(&i).map_err(estale)?;
        let handle = if flags & libc::O_TRUNC != 0 {
            // (Write-back: the dispatcher flushed the dirty data first, or its flush would
            // land after the truncate.)
            // Never truncate a replaced file that others may still be reading.
            self.ns
                .check_not_replaced(self.sh.store.getattr(&node)?.nlink, pid)?;
            let _w = st.rw.write();
            let h = self.sh.store.open(&node, flags)?;
            st.changed_direct.store(true, Relaxed);
            st.invalidate(None);
            h
        } else {
            self.sh.store.open(&node, flags)?
        };
        // After the truncate above, our own change: the attributes below must show it.
        let fetched = if flags & libc::O_TRUNC != 0 {
            Instant::now()
        } else {
            fetched
        };
        let attr = if st.unverified() {
            // Our own writes left a provisional fingerprint: attributes fetched under the
            // lock settle it, so the open below compares real fingerprints.
            let _r = st.rw.read();
            let asked = Instant::now();
            let a = self.sh.fstat_as(&st, &handle)?;
            st.settle_fetched(&a, asked);
            a
        } else {
            self.sh.fstat_as(&st, &handle)?
        };
        self.ns.meta.put_attr(&attr, fetched);
        if flags & libc::O_TRUNC == 0 {
            // (O_TRUNC checked before truncating.)
            self.ns.check_not_replaced(attr.nlink, pid)?;
        }
        self.finish_open(i, st, attr, Some(handle), flags, fetched)
    }

    /// Whether the caches hold the start of `st`'s current version (its first block in RAM
    /// or in the SSD tier), or it is empty: then a read-only open checks the file and opens
    /// it on the store only if a read misses them. Else the file is opened at once, its
    /// attributes taken as it is opened being the open's check: a file read for the first
    /// time costs the store its open, not a check and then an open (over sftp, a cold small
    /// file took three round trips: the check, the open, the read).
    pub(crate) fn has_cached_data(&self, st: &crate::file_state::FileState) -> bool {
        let v = st.version();
        if v.fp.size == 0
            || self
                .sh
                .cache
                .contains(&tierfs_cache::BlockKey { gen: v.gen, idx: 0 })
        {
            return true;
        }
        let (dev, ino) = st.id();
        let key = tierfs_cache::SsdKey {
            kind: tierfs_cache::KIND_DATA,
            dev,
            ino,
            idx: 0,
        };
        self.sh
            .ssd
            .as_ref()
            .is_some_and(|ssd| ssd.contains(&key, crate::meta_codec::version_of(&v.fp)))
    }

    /// Counts a close-to-open check this open asked the store for, which took from `began`
    /// (the open's arrival: queueing for an I/O thread is part of its cost) to now; once,
    /// when the first 64 averaged 2 ms or more, says in the log what that costs and how to
    /// avoid it.
    fn checked_for(&self, began: Instant) {
        let s = &self.sh.stats;
        let us = began.elapsed().as_micros() as u64;
        let n = s.cto_checks.fetch_add(1, Relaxed) + 1;
        let total = s.cto_check_us.fetch_add(us, Relaxed) + us;
        if n == COST_SAMPLE && total / n >= COST_NOTED_US {
            tracing::info!(
                "close-to-open: each open asks the store whether the file changed, {:.1} ms on average over the first {n} opens; for a tree that only this mount changes, or where a read may lag a change elsewhere by `meta.ttl`, -o meta.cto=off,meta.ttl=5m serves opens from the cache (docs/tunables.md)",
                total as f64 / n as f64 / 1000.0
            );
        }
    }

    /// A read-only open checked by the store's fresh attributes alone
    /// ([`Store::revalidate`]): the same close-to-open check as an open, and the backing file
    /// opened only when a read misses the caches (`Objects::handle`). On sshfs and NFS this
    /// saves the store's open round trip for every file served from the caches (`grep -r`
    /// after a remount). An error the store gives only at open (a server-side permission
    /// check the attributes do not show) comes at that first read instead.
    fn open_checked(
        &self,
        i: Arc<Inode<St<S>>>,
        st: Arc<crate::file_state::FileState>,
        attr: Attr,
        flags: i32,
        pid: u32,
        fetched: Instant,
    ) -> Result<OpenReply> {
        if attr.kind != tierfs_store::FileKind::File {
            return Err(Errno::ESTALE);
        }
        let mut attr = attr;
        (attr.dev, attr.ino) = st.id();
        // Stamped with when it was asked for: a flush of ours that landed meanwhile put
        // newer attributes there, and they stay (see `FileState::own_change`).
        self.ns.meta.put_attr(&attr, fetched);
        self.ns.check_not_replaced(attr.nlink, pid)?;
        FsStats::add(&self.sh.stats.checked_opens, 1);
        self.finish_open(i, st, attr, None, flags, fetched)
    }

    /// The part of an open after the check: the version, the kernel's cache flags, the fh.
    fn finish_open(
        &self,
        i: Arc<Inode<St<S>>>,
        st: Arc<crate::file_state::FileState>,
        attr: Attr,
        handle: Option<Handle<S>>,
        flags: i32,
        fetched: Instant,
    ) -> Result<OpenReply> {
        let before = st.version().gen;
        let opened_before = st.last_opened();
        let keep_cache = st.opened_fetched(&attr, fetched);
        let changed = st.version().gen != before;
        if changed {
            FsStats::add(&self.sh.stats.version_changes, 1);
        }
        // The kernel's attributes came from a lookup/getattr (which observed the state's
        // fingerprint) or from before the previous open; either way they are stale if the
        // fingerprint moved since.
        let attrs_stale = changed || opened_before.is_some_and(|fp| fp != attr.fingerprint());
        let fh = self.add_open_file(i, handle, flags)?;
        Ok(OpenReply {
            fh,
            keep_cache,
            attrs_stale,
            no_flush: false,
        })
    }

    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        req: Requester,
    ) -> Result<(Entry, OpenReply)> {
        let p = self.ns.inode(parent)?;
        let (node, attr, handle) =
            self.sh
                .store
                .create(&self.ns.node(&p)?, name, mode, flags, self.ns.owner(req))?;
        self.ns.meta.add_name(p.id(), name, &attr);
        let entry = self.ns.entry(&p, name, node, attr);
        let inode = self.ns.inode(entry.ino)?;
        if let Some(st) = &inode.file {
            st.invalidate(Some(&attr));
            st.opened(&attr);
        }
        let fh = self.add_open_file(inode, Some(handle), flags)?;
        Ok((
            entry,
            OpenReply {
                fh,
                keep_cache: false,
                attrs_stale: false,
                no_flush: false,
            },
        ))
    }

    pub fn release(&self, fh: u64) {
        if let Some((_, of)) = self.files.remove(&fh) {
            of.state.opens.fetch_sub(1, Release);
        }
    }

    /// fsync of the backing handles of `ino`'s open file `fh` (0: its implicit ones). With
    /// `direct_only` (write-back, which made the journaled writes durable already), only a
    /// file changed directly (`FileState::changed_direct`): on S3 a handle's fsync
    /// uploads the object, which `writeback.fsync=journal` acknowledges without.
    pub fn fsync(&self, ino: u64, fh: u64, datasync: bool, direct_only: bool) -> Result<()> {
        let files = if fh == 0 {
            self.implicit_files(ino)
        } else {
            vec![self.open_file(fh)?]
        };
        for of in files {
            if direct_only && !of.state.changed_direct.load(Relaxed) {
                continue;
            }
            if let Some(h) = of.handle.get() {
                if self.sh.store.publishes_at_sync() {
                    self.published(&of, h, |h| self.sh.store.fsync(h, datasync))?;
                } else {
                    self.sh.store.fsync(h, datasync)?;
                }
            }
            // Never opened in the backing store: nothing of ours to make durable.
        }
        Ok(())
    }

    /// close(2) (FUSE FLUSH) of `ino`'s open file `fh`, on a store that publishes what was
    /// written at close (S3): its writes are uploaded now, and close reports whether they
    /// were. With FUSE no-open (`meta.cto=off`) the kernel opens nothing and names no file
    /// (`fh` 0): `ino`'s implicit files are the ones closed, as fsync takes them.
    pub fn close(&self, ino: u64, fh: u64) -> Result<()> {
        let files = if fh == 0 {
            self.implicit_files(ino)
        } else {
            vec![self.open_file(fh)?]
        };
        for of in files {
            let writable =
                of.flags & libc::O_ACCMODE != libc::O_RDONLY || of.flags & libc::O_TRUNC != 0;
            match of.handle.get() {
                Some(h) if writable && self.sh.store.publishes_at_sync() => {
                    self.published(&of, h, |h| self.sh.store.close(h))?
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Runs `publish` (an fsync or close that uploads the file: a new version of it, made
    /// by us) under the file's exclusive lock, so no write of ours lands half in it; then
    /// takes the new version as the cached blocks' own.
    fn published(
        &self,
        of: &OpenFile<S>,
        h: &Handle<S>,
        publish: impl FnOnce(&Handle<S>) -> Result<()>,
    ) -> Result<()> {
        let _w = of.state.rw.write();
        let v = of.state.version();
        if let Err(e) = publish(h) {
            // Not uploaded (kept in the lost directory on a conflict): what we cached of it
            // is not what the store has.
            of.state.invalidate(None);
            self.ns.meta.drop_attr(of.inode.id());
            return Err(e);
        }
        let a = self.sh.fstat_as(&of.state, h)?;
        of.state.set_after_own_write(v.gen, &a);
        self.ns.meta.put_attr(&a, Instant::now());
        // What the RAM tier holds of it is this version's data (whole blocks: see
        // `patch_blocks_shared`): into the SSD tier under the version the store now shows,
        // which a listing after a remount gives too. Else a file written through the mount
        // was fetched again at its first read after a remount (issue 43).
        self.sh.reoffer_to_ssd(&of.state);
        Ok(())
    }

    /// The open file's backing handle, opened now if the open was served from the metadata
    /// cache. The backing file's fingerprint is recorded as it is opened: if it changed since
    /// the cache validated it, the reader sees the new version from here on.
    pub(crate) fn handle<'a>(&self, of: &'a OpenFile<S>) -> Result<&'a Handle<S>> {
        if let Some(h) = of.handle.get() {
            return Ok(h);
        }
        let _g = of.opening.lock();
        if let Some(h) = of.handle.get() {
            return Ok(h);
        }
        let node = self.ns.node(&of.inode)?;
        let fetched = Instant::now();
        let h = self.sh.store.open(&node, of.flags)?;
        let attr = self.sh.fstat_as(&of.state, &h)?;
        self.ns.meta.put_attr(&attr, fetched);
        self.sh.observe_data_fetched(&of.state, &attr, fetched);
        let _ = of.handle.set(h);
        of.handle.get().ok_or(Errno::EIO)
    }

    pub fn fallocate(&self, of: &OpenFile<S>, mode: i32, offset: u64, len: u64) -> Result<()> {
        let h = self.handle(of)?;
        of.state.changed_direct.store(true, Relaxed);
        let _w = of.state.rw.write();
        let r = self.sh.store.fallocate(h, mode, offset, len);
        let attr = self.sh.fstat_as(&of.state, h).ok();
        self.ns.meta.drop_attr(of.inode.id());
        of.state.invalidate(attr.as_ref());
        r
    }

    pub fn lseek(&self, of: &OpenFile<S>, offset: i64, whence: i32) -> Result<i64> {
        self.sh.store.lseek(self.handle(of)?, offset, whence)
    }

    /// Changes attributes of `i` (through open file `fh` if given). Write-back's part (dirty
    /// data first for a truncate, a time kept with dirty data) is the dispatcher's.
    pub fn setattr(&self, i: &Arc<Inode<St<S>>>, fh: Option<u64>, set: &SetAttr) -> Result<Attr> {
        if let Some(a) = self.chown_changes_nothing(i, set) {
            FsStats::add(&self.sh.stats.unchanged_chowns, 1);
            return Ok(self.ns.with_ino(i, a));
        }
        let i = i.clone();
        let of = match fh {
            Some(fh) => self.files.get(&fh).map(|f| f.clone()),
            None => None,
        };
        let handle = match &of {
            Some(f) => Some(self.handle(f)?),
            None => None,
        };
        let node = self.ns.node(&i)?;
        self.ns.meta.drop_attr(i.id());
        let Some(st) = &i.file else {
            let attr = self.sh.store.setattr(&node, handle, set)?;
            self.ns.meta.put_attr(&attr, Instant::now());
            return Ok(self.ns.with_ino(&i, attr));
        };
        if set.size.is_some() {
            st.changed_direct.store(true, Relaxed);
        }
        // Exclusive: a truncate must not interleave with reads that fill the cache.
        let _w = st.rw.write();
        let old_size = st.version().fp.size;
        // Ended before the result is recorded: recording goes through `observe`, which
        // records nothing while a change is under way (a fetch from before it is refused
        // by its time, see `FileState::own_change`).
        let attr = {
            let _own = st.own_change();
            // Times: in order with the flusher's (see `FileState::times`).
            let _t = (set.atime.is_some() || set.mtime.is_some()).then(|| st.times.lock());
            self.sh.store.setattr(&node, handle, set)
        };
        if let Ok(a) = &attr {
            self.ns.meta.put_attr(a, Instant::now());
        }
        match (&attr, set.size) {
            (Ok(a), None) => {
                if let Observed::Changed = self.sh.own_metadata_change(st, a) {
                    FsStats::add(&self.sh.stats.version_changes, 1);
                }
            }
            (Ok(a), Some(size)) => self.resized(st, old_size, a, size),
            (Err(_), _) => st.invalidate(None),
        }
        Ok(self.ns.with_ino(&i, attr?))
    }

    /// The attributes of `i` when `set` is a chown to the owner and group it already has:
    /// then the store is not asked. tar run as root sets both on every file it makes, most
    /// often to what the file was made with, and each costs a store round trip (two over
    /// sshfs, which reads the attributes again after its SETSTAT): a fifth of a
    /// write-through untar's time over sshfs. Such a chown changes nothing on the store but
    /// the object's ctime, which is then not moved (docs/architecture/data-path.md, "The write
    /// path").
    ///
    /// Only with attributes the store gave less than a second ago (as a rule, its answer to
    /// the setattr just before: tar sets the times, the owner, then the mode), so that an
    /// owner changed elsewhere meanwhile is not taken for the one wanted; and not when the
    /// mode has a set-user-ID or set-group-ID bit, which a chown of a file clears.
    fn chown_changes_nothing(&self, i: &Arc<Inode<St<S>>>, set: &SetAttr) -> Option<Attr> {
        let only_owner = set.mode.is_none()
            && set.size.is_none()
            && set.atime.is_none()
            && set.mtime.is_none()
            && (set.uid.is_some() || set.gid.is_some());
        if !only_owner || is_provisional(i.id()) {
            return None;
        }
        let (a, at) = self.ns.meta.attr(i.id())?;
        let same = set.uid.is_none_or(|u| u == a.uid) && set.gid.is_none_or(|g| g == a.gid);
        let fresh = at.elapsed() < std::time::Duration::from_secs(1);
        (same && fresh && a.perm as u32 & SUID_SGID == 0).then_some(a)
    }
}
