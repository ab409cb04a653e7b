//! The write-back write path, reads and attributes over dirty data, and flow control.

use super::Writeback;
use crate::data::OpenFile;
use crate::dirty::Dirty;
use crate::inode::Inode;
use crate::shared::St;
use bytes::Bytes;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_cache::journal::{FileRef, JournalError};
use tierfs_store::{Attr, Errno, Result, Store, TimeSpec};

/// The longest a writer above `dirty_soft` is slowed per write (reached at `dirty_hard`).
const MAX_THROTTLE: Duration = Duration::from_millis(20);

pub(super) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl<S: Store> Writeback<S> {
    /// The backing path of `name` in directory `dir` (see [`Writeback::backing_path`]).
    pub(crate) fn backing_path_in(
        &self,
        dir: &Arc<Inode<St<S>>>,
        name: &std::ffi::OsStr,
    ) -> Option<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        Some(super::ns_path::join(
            &self.backing_path(dir)?,
            name.as_bytes(),
        ))
    }

    /// The backing path of an inode, relative to the backing root, from the names it was
    /// found by; None for an object that has lost its name (unlinked while open).
    pub(crate) fn backing_path(&self, i: &Arc<Inode<St<S>>>) -> Option<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        let mut parts: Vec<std::ffi::OsString> = Vec::new();
        let mut cur = i.clone();
        for _ in 0..4096 {
            if cur.ino == crate::ROOT_INO {
                parts.reverse();
                let mut p = Vec::new();
                for (k, n) in parts.iter().enumerate() {
                    if k > 0 {
                        p.push(b'/');
                    }
                    p.extend_from_slice(n.as_bytes());
                }
                return Some(p);
            }
            let (parent, name) = cur.origin.lock().clone()?;
            parts.push(name);
            cur = parent;
        }
        None
    }

    fn backing_statfs(&self) -> Result<tierfs_store::StatFs> {
        let root = self.ns.inode(crate::ROOT_INO)?;
        self.sh.store.statfs(&self.ns.node(&root)?)
    }

    /// The store's (total, free) inodes.
    pub(crate) fn backing_inodes(&self) -> Result<(u64, u64)> {
        self.backing_statfs().map(|s| (s.files, s.ffree))
    }

    /// Free bytes of the backing store for unprivileged writers (what a write may use), and
    /// its allocation unit.
    pub(crate) fn backing_free(&self) -> Result<(u64, u64)> {
        let s = self.backing_statfs()?;
        let unit = s.frsize.max(1) as u64;
        Ok((s.bavail.saturating_mul(unit), unit))
    }

    /// Slows a writer gradually above `dirty_soft`; at `dirty_hard` it waits for the
    /// flushers (flow control: dirty data and the journal stay bounded).
    pub(crate) fn throttle(&self, len: u64) {
        let (soft, hard) = self.live.limits();
        let level = self.dirty_bytes();
        if level + len > hard && level > 0 {
            self.c.hard_waits.fetch_add(1, Relaxed);
            let t = Instant::now();
            let mut g = self.wake_lock.lock();
            while self.dirty_bytes() + len > hard
                && self.dirty_bytes() > 0
                && !self.stop.load(Acquire)
            {
                self.wake.wait_for(&mut g, Duration::from_millis(50));
            }
            self.c
                .throttle_ms
                .fetch_add(t.elapsed().as_millis() as u64, Relaxed);
        } else if level > soft {
            let frac = (level - soft) as f64 / (hard - soft) as f64;
            let d = MAX_THROTTLE.mul_f64((frac * frac).min(1.0));
            self.c.throttled_writes.fetch_add(1, Relaxed);
            self.c.throttle_ms.fetch_add(d.as_millis() as u64, Relaxed);
            std::thread::sleep(d);
        }
    }

    /// A write in write-back mode: reserved, journaled, kept in RAM; acknowledged without
    /// touching the backing store.
    pub(crate) fn write_back(&self, of: &OpenFile<S>, offset: u64, data: Bytes) -> Result<u32> {
        match self.write_back_with(of, offset, data, false) {
            Ok(r) => r,
            Err(_) => unreachable!("a blocking write-back write never hands its data back"),
        }
    }

    /// [`Writeback::write_back`], or with `inline` only if nothing in it can wait: no throttling
    /// (below `dirty_soft`), reservation credit at hand, room in the journal, a backing name.
    /// Otherwise the data comes back (`Err`) untouched, for a thread that may wait.
    pub(crate) fn write_back_with(
        &self,
        of: &OpenFile<S>,
        offset: u64,
        data: Bytes,
        inline: bool,
    ) -> std::result::Result<Result<u32>, Bytes> {
        let len = data.len() as u64;
        let Some(path) = self.backing_path(&of.inode) else {
            if inline {
                return Err(data);
            }
            // No name to replay it under after a crash (unlinked while open): write through.
            return Ok(self.data.write_through(of, offset, &data));
        };
        let reserved = if inline {
            if self.dirty_bytes() + len > self.live.limits().0 {
                return Err(data);
            }
            match self.reserve.try_reserve(offset, len) {
                Some(n) => n,
                None => return Err(data),
            }
        } else {
            self.throttle(len);
            match self.reserve.reserve(offset, len, || self.backing_free()) {
                Ok(n) => n,
                Err(e) => {
                    self.c.enospc.fetch_add(1, Relaxed);
                    return Ok(Err(e));
                }
            }
        };
        let st = &of.state;
        loop {
            let _w = st.rw.write();
            let mut g = st.dirty.lock();
            let created = g.is_none();
            let d = g.get_or_insert_with(|| {
                let v = st.version();
                // The path as it is now that writers are held off: a deferred rename
                // (`ns_rename`) moves it under this lock.
                let path = self.backing_path(&of.inode).unwrap_or_else(|| path.clone());
                let mut d = Dirty::new(v.fp.size, path);
                d.base = Some(v.fp);
                d
            });
            let file = FileRef {
                dev: st.journal_key.0,
                ino: st.journal_key.1,
                path: d.path.clone(),
            };
            let seq = match self.journal.append_data_shared(&file, offset, &data) {
                Ok(seq) => seq,
                Err(JournalError::Full { .. }) => {
                    // Wait for the flushers with no lock held: they need this file's too.
                    if created {
                        *g = None;
                    }
                    drop(g);
                    drop(_w);
                    self.notify();
                    if inline {
                        self.reserve.release(reserved);
                        return Err(data);
                    }
                    self.c.journal_full_waits.fetch_add(1, Relaxed);
                    self.journal
                        .wait_for_space(len + 4096, Duration::from_millis(100));
                    continue;
                }
                Err(e @ JournalError::NoSpace { .. }) => {
                    // The cache device is full: this write cannot be journaled, so it goes
                    // through to the store (bcache falls back to write-through the same
                    // way), after the file's dirty data, so nothing older lands over it.
                    // Write-back takes writes again once the journal has room (the SSD
                    // tier gives back its space, the journal retries its next segment).
                    if created {
                        *g = None;
                    }
                    drop(g);
                    drop(_w);
                    self.reserve.release(reserved);
                    if inline {
                        return Err(data);
                    }
                    let n = self.c.journal_no_space.fetch_add(1, Relaxed);
                    if n.is_multiple_of(10_000) {
                        tracing::warn!(
                            "write-back journal: the cache device is full ({e}): writes go through to the store until it has room ({} so far)",
                            n + 1
                        );
                    }
                    if let Err(e) = self.flush_file_now(&of.inode) {
                        return Ok(Err(e));
                    }
                    return Ok(self.data.write_through(of, offset, &data));
                }
                Err(e) => {
                    tracing::error!("write-back journal: {e}");
                    if created {
                        *g = None;
                    }
                    self.reserve.release(reserved);
                    return Ok(Err(Errno::EIO));
                }
            };
            let before = d.bytes;
            let was_clean = created;
            d.last_write = Instant::now();
            d.write(offset, data, seq, now_ns());
            d.reserved += reserved;
            let grown = d.bytes - before;
            self.c.dirty_bytes.fetch_add(grown, Relaxed);
            self.c.written_bytes.fetch_add(len, Relaxed);
            if inline {
                self.c.inline_writes.fetch_add(1, Relaxed);
            }
            st.has_dirty.store(true, Release);
            let mut wake = false;
            if was_clean {
                let key = st.journal_key;
                if self.files.lock().insert(key, of.inode.clone()).is_none() {
                    self.c.dirty_files.fetch_add(1, Relaxed);
                }
                // A file already dirty is known to the flushers, and one that waits for the
                // namespace flusher is theirs once that is done (`publish` wakes them, and
                // `chattr_applied`): no wake-up of every flusher per write, each walking the
                // dirty files for nothing.
                wake = !self.waits_for_namespace(&of.inode);
            }
            drop(g);
            if wake {
                self.notify();
            }
            return Ok(Ok(len as u32));
        }
    }

    /// Reads of a file with dirty data: what the tiers hold of the backing file, with the
    /// dirty extents over it, up to the file's size as the application sees it.
    pub(crate) fn read_over_dirty(
        &self,
        of: &Arc<OpenFile<S>>,
        offset: u64,
        size: u32,
    ) -> Result<Bytes> {
        loop {
            let gen = of.state.flush_gen.load(Acquire);
            // A file whose create is deferred has nothing on the store (its data waits for
            // it to be published, see `ns_truncate`): no need to wait for the store, which
            // may be failing. Held off (`rw`) meanwhile, a flusher cannot take dirty bytes
            // between that check and the overlay below.
            let mut held = Some(of.state.rw.read());
            // Truncated, the store not yet (`ns_chattr`): nothing of its bytes is the file's.
            let truncated = of
                .state
                .dirty
                .lock()
                .as_ref()
                .is_some_and(|d| d.truncate_pending);
            let base = if truncated || crate::namespace::is_provisional(of.inode.id()) {
                Bytes::new()
            } else {
                held = None;
                self.data.read(of, offset, size)?
            };
            let g = of.state.dirty.lock();
            // A flush that finished meanwhile may have taken dirty bytes that `base`
            // (read before it wrote them) does not hold yet: read again.
            if of.state.flush_gen.load(Acquire) != gen {
                continue;
            }
            let Some(d) = g.as_ref() else {
                return Ok(base);
            };
            let len = d.size.saturating_sub(offset).min(size as u64) as usize;
            let mut buf = base.to_vec();
            buf.resize(len, 0);
            d.overlay(offset, &mut buf);
            drop(held);
            return Ok(Bytes::from(buf));
        }
    }

    /// The handle a flush of `st` writes through: the one its create left (`held`), else
    /// `node` opened for writing, on the version its writes were made on (`Dirty::base`).
    pub(crate) fn flush_handle(
        &self,
        st: &crate::file_state::FileState,
        node: &crate::shared::Node<S>,
    ) -> Result<<St<S> as Store>::Handle> {
        if let Some(h) = self.held.lock().remove(&st.journal_key) {
            return Ok(h);
        }
        let base = st.dirty.lock().as_ref().and_then(|d| d.base);
        self.sh.store.open_based(node, libc::O_WRONLY, base)
    }

    /// Attributes as the application sees them: size and mtime include dirty data.
    pub(crate) fn overlay_attr(&self, i: &Inode<St<S>>, attr: &mut Attr) {
        self.kept_times.overlay(i.id(), attr);
        self.overlay_chattr(i.ino, attr);
        if i.kind == tierfs_store::FileKind::Dir {
            self.shadow_dir_attr(i.id(), attr);
            return;
        }
        let Some(st) = &i.file else { return };
        if !st.has_dirty.load(Acquire) {
            return;
        }
        if let Some(d) = st.dirty.lock().as_ref() {
            attr.size = d.size;
            attr.blocks = attr.blocks.max(d.size.div_ceil(512));
            let t = TimeSpec {
                sec: d.mtime_ns.div_euclid(1_000_000_000),
                nsec: d.mtime_ns.rem_euclid(1_000_000_000) as u32,
            };
            attr.mtime = t;
            attr.ctime = if d.mtime_set {
                TimeSpec {
                    sec: d.set_at_ns.div_euclid(1_000_000_000),
                    nsec: d.set_at_ns.rem_euclid(1_000_000_000) as u32,
                }
            } else {
                t
            };
        }
    }

    /// `run` of `st`'s dirty data is on the store (or saved aside): its extents leave the
    /// dirty set, its reservation is given back, the dirty count drops.
    pub(crate) fn account_flushed(
        &self,
        st: &crate::file_state::FileState,
        run: &crate::dirty::Run,
    ) {
        if let Some(d) = st.dirty.lock().as_mut() {
            let n = d.flushed(run);
            let rel = n.min(d.reserved);
            d.reserved -= rel;
            self.reserve.release(rel);
            self.c.dirty_bytes.fetch_sub(n, Relaxed);
        }
    }

    /// Takes every dirty run of `st` in offset order, gives each to `each` (which writes it
    /// somewhere, or drops it) and accounts it flushed; stops at the first error of `each`.
    /// For data that does not go to its file (`flush_refused`, `drop_dirty`).
    pub(crate) fn take_dirty_runs(
        &self,
        st: &crate::file_state::FileState,
        mut each: impl FnMut(&crate::dirty::Run) -> Result<()>,
    ) -> Result<()> {
        let mut from = 0;
        loop {
            let run = st
                .dirty
                .lock()
                .as_ref()
                .and_then(|d| d.take_run(from, self.cfg.chunk as usize));
            let Some(run) = run else {
                // All of it taken: a grow not applied (`ns_truncate`) goes with it.
                if let Some(d) = st.dirty.lock().as_mut() {
                    d.grow = None;
                }
                return Ok(());
            };
            each(&run)?;
            self.account_flushed(st, &run);
            from = run.offset + run.len;
        }
    }

    /// An mtime the application set on a file while it has dirty data: the flush applies it
    /// after writing the data (see `flush_group`).
    pub(crate) fn note_dirty_mtime(&self, i: &Inode<St<S>>, m: &tierfs_store::TimeUpdate) {
        let Some(st) = &i.file else { return };
        if let Some(d) = st.dirty.lock().as_mut() {
            d.mtime_ns = match m {
                tierfs_store::TimeUpdate::Now => now_ns(),
                tierfs_store::TimeUpdate::Set(t) => t.sec * 1_000_000_000 + t.nsec as i64,
            };
            d.mtime_set = matches!(m, tierfs_store::TimeUpdate::Set(_));
            d.set_at_ns = now_ns();
        }
    }

    /// Marks a file clean (no dirty data left): it leaves the flushers' list.
    pub(crate) fn settle_clean(&self, i: &Inode<St<S>>) {
        let Some(st) = &i.file else { return };
        let mut g = st.dirty.lock();
        if let Some(d) = g.as_ref() {
            // (A truncate not yet on the store is what the file is: it stays.)
            if !d.is_clean() || d.truncate_pending {
                return;
            }
            self.reserve.release(d.reserved);
            *g = None;
            st.has_dirty.store(false, Release);
            st.flush_gen.fetch_add(1, AcqRel);
            if self.files.lock().remove(&st.journal_key).is_some() {
                self.c.dirty_files.fetch_sub(1, Relaxed);
            }
        }
    }
}
