//! Listing-order prefetch. `grep -r`, `md5sum *`, `cat dir/*`, a build reading its sources:
//! programs that walk a tree open the files of a directory one after another, in the order
//! the directory lists them. On a store where an open and a read are a round trip each
//! (sshfs, NFS, SMB), a cold walk pays both for every file, one file at a time, and the link
//! sits idle in between. Read-ahead within a file cannot help a file of a few KiB.
//!
//! So: once two files of one directory have been opened one right after the other in
//! listing order (with FUSE no-open, where no OPEN reaches us: read from offset 0), the next
//! `prefetch.files` regular files of the listing that are at most `prefetch.max_file` bytes
//! and not cached yet are loaded in the background, several at a time, through the ordinary
//! open and read path (close-to-open check, fingerprint check after the read, RAM tier, SSD
//! admission): the walk then finds them in RAM. With a shared tier, a file's chunk of the
//! listed version is taken from the tier first, with no request to the origin. Not from a
//! store whose open is a GET of the file's start (S3): there the walk's open is one request
//! anyway, and a load ahead would ask for the same file twice. Several
//! readers may walk one directory at once (`xargs -P8 -n25 cat`, a data loader's workers),
//! each in order: each is followed, and no file is sent twice. A reader that jumps starts
//! over; what was loaded stays as any cached data.

use super::Objects;
use crate::identity::Ident;
use crate::meta::Child;
use crate::stats::FsStats;
use std::ffi::OsString;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_store::{FileKind, Store};

/// Directories whose walks are followed at once; the least recently used is forgotten.
const WALKS_MAX: usize = 64;

/// One directory being walked: its listing as of the walk's first open, where its readers
/// are, and which files were sent for loading.
pub(crate) struct Walk {
    names: Vec<(OsString, Child)>,
    pos: rustc_hash::FxHashMap<OsString, usize>,
    /// The listing positions the walk's readers opened last, most recent last: several
    /// readers walk one directory at once (`xargs -P`, a data loader's workers), each in
    /// order, their opens interleaved.
    lasts: Vec<usize>,
    /// Positions sent for loading (or opened), a bit each: never sent twice in one walk.
    sent: Vec<u64>,
    used: u64,
}

/// Readers of one directory followed at once (see [`Walk::lasts`]).
const READERS_MAX: usize = 16;

impl Walk {
    fn mark(&mut self, k: usize) -> bool {
        let (w, b) = (k / 64, 1u64 << (k % 64));
        let new = self.sent[w] & b == 0;
        self.sent[w] |= b;
        new
    }
}

#[derive(Default)]
pub(crate) struct Walks {
    dirs: parking_lot::Mutex<rustc_hash::FxHashMap<Ident, Walk>>,
    clock: std::sync::atomic::AtomicU64,
    /// Files loaded ahead whose inode the kernel did not know (a directory listed for names
    /// first gives the kernel its names by plain READDIR, without an inode here): a
    /// lookup reference of ours keeps the inode, and its node, until the walk opens the file
    /// (the kernel has looked it up by then and holds its own), or until [`HOLD_MAX`] went
    /// by. Letting go at once cost the walk's open a store lookup for the node again.
    held: parking_lot::Mutex<rustc_hash::FxHashMap<u64, std::time::Instant>>,
}

/// How long a file loaded ahead keeps its inode for the walk's open (see [`Walks::held`]).
const HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(10);

impl<S: Store> Objects<S> {
    /// A file was opened read-only by an application: if this continues a walk of its
    /// directory in listing order, the next files of the listing are loaded ahead.
    pub fn opened_for_walk(self: &Arc<Self>, ino: u64) {
        self.let_go_held(ino);
        let files = self.prefetch_files.load(Relaxed);
        // Where an open is a GET of the file's start (S3), a load ahead from the store is
        // the walk's own request made twice; only a shared tier has something to give.
        let from_store = !self.sh.store.open_brings_data();
        if files == 0 || !(from_store || self.sh.shared_tier.get().is_some()) {
            return;
        }
        let Some(i) = self.ns.inodes.get(ino) else {
            return;
        };
        let Some((parent, name)) = i.origin.lock().clone() else {
            return;
        };
        let dir = parent.id();
        // A directory's first open builds its walk outside the lock (a listing may hold a
        // million names): the lock is for the few lines that move a walk.
        let fresh = if self.walks.dirs.lock().contains_key(&dir) {
            None
        } else {
            // A fresh listing only: a stale one may name files that are gone.
            let Some(names) = self.ns.meta.listing(dir) else {
                return;
            };
            let pos = names
                .iter()
                .enumerate()
                .map(|(k, (n, _))| (n.clone(), k))
                .collect();
            let words = names.len().div_ceil(64);
            Some(Walk {
                names,
                pos,
                lasts: Vec::new(),
                sent: vec![0; words],
                used: 0,
            })
        };
        let todo: Vec<(OsString, Child)> = {
            let mut dirs = self.walks.dirs.lock();
            if let Some(w) = fresh {
                if dirs.len() >= WALKS_MAX {
                    let oldest = dirs.iter().min_by_key(|(_, w)| w.used).map(|(k, _)| *k);
                    if let Some(k) = oldest {
                        dirs.remove(&k);
                    }
                }
                dirs.entry(dir).or_insert(w);
            }
            let Some(w) = dirs.get_mut(&dir) else {
                return;
            };
            w.used = self.walks.clock.fetch_add(1, Relaxed);
            let Some(&at) = w.pos.get(&name) else {
                return;
            };
            if w.lasts.contains(&at) {
                // The same file again (a second open, or a read after a cached one).
                return;
            }
            w.mark(at);
            // A reader going on in order, or a new one (a jump starts a reader).
            let in_order = match w.lasts.iter().position(|&l| at == l + 1) {
                Some(k) => {
                    w.lasts.remove(k);
                    true
                }
                None => false,
            };
            if w.lasts.len() >= READERS_MAX {
                w.lasts.remove(0);
            }
            w.lasts.push(at);
            if !in_order {
                return;
            }
            let to = (at + 1 + files).min(w.names.len());
            let fresh: Vec<usize> = (at + 1..to).filter(|&k| w.mark(k)).collect();
            fresh.into_iter().map(|k| w.names[k].clone()).collect()
        };
        let max = self.prefetch_max_file.load(Relaxed);
        for (name, child) in todo {
            if child.kind != FileKind::File {
                continue;
            }
            let Some((attr, at)) = self.ns.meta.attr(child.id) else {
                continue;
            };
            if attr.size == 0 || attr.size > max {
                continue;
            }
            // Cached in RAM or in the SSD tier: nothing to load ahead. (A load of a file the
            // SSD tier holds cost a close-to-open check of its own, which cannot stand for the
            // walk's, asked before its open began: after a remount, `md5sum *` made two store
            // requests per file.)
            if let Some(st) = self.ns.inodes.file_state_of(child.id) {
                if st.has_dirty.load(Relaxed) || self.has_cached_data(&st) {
                    continue;
                }
            }
            // The inode the walk will open: the kernel's, if READDIRPLUS gave it the entry
            // with attributes; else one held for the load alone (a directory listed for
            // names first, `namespace::entry_attrs`), given back after it.
            let (sib, held) = match self.ns.inodes.by_ident(child.id) {
                Some(sib) => (sib, false),
                None => {
                    let sib = self
                        .ns
                        .inodes
                        .remember_lazy(parent.clone(), &name, &attr, at);
                    (sib, true)
                }
            };
            let (ino, size) = (sib.ino, attr.size);
            // Held from before the load, so that the walk's open, which may come while it
            // runs, lets it go. (Loaded twice: one reference is enough.)
            let now = std::time::Instant::now();
            if held && self.walks.held.lock().insert(ino, now).is_some() && self.ns.forget(ino, 1) {
                self.forgotten(ino);
            }
            let me = self.clone();
            FsStats::add(&self.sh.stats.prefetch_queued, 1);
            self.prefetch_pool.spawn(move || me.load_whole(ino, size));
        }
    }

    /// The walk opened `ino`: the reference a load ahead took on it goes, and so do those
    /// held longer than [`HOLD_MAX`] (files the walk never opened).
    fn let_go_held(&self, ino: u64) {
        let gone: Vec<u64> = {
            let mut held = self.walks.held.lock();
            if held.is_empty() {
                return;
            }
            let mut gone: Vec<u64> = held.remove(&ino).map(|_| ino).into_iter().collect();
            if held.len() > 64 || held.values().any(|t| t.elapsed() > HOLD_MAX) {
                held.retain(|i, t| {
                    let keep = t.elapsed() <= HOLD_MAX;
                    if !keep {
                        gone.push(*i);
                    }
                    keep
                });
            }
            gone
        };
        for i in gone {
            if self.ns.forget(i, 1) {
                self.forgotten(i);
            }
        }
    }

    /// Opens, reads and lets go of file `ino` as a reader would, so its blocks are cached.
    /// With a shared tier, its first chunk, of the version the listing gave, is taken from
    /// there first: no request to the origin at all (the walk's own open checks the version,
    /// and blocks of another version are never served; `start_from_shared`). Else the
    /// origin: a close-to-open check and a read.
    fn load_whole(self: &Arc<Self>, ino: u64, size: u64) {
        if let Some(st) = self.ns.inodes.get(ino).and_then(|i| i.file.clone()) {
            // The walk got here first (a store faster than the loads ahead): its own open
            // reads the file, a load now would only ask the store for it a second time.
            if st.opens.load(Relaxed) > 0 || self.has_cached_data(&st) {
                return;
            }
            if self.sh.shared_tier.get().is_some()
                && !st.unverified()
                && !st.has_dirty.load(Relaxed)
                && self.start_from_shared(&st)
            {
                FsStats::add(&self.sh.stats.prefetched_files, 1);
                return;
            }
        }
        if self.sh.store.open_brings_data() {
            return;
        }
        let Ok(o) = self.open_by(ino, libc::O_RDONLY, 0, std::time::Instant::now()) else {
            return;
        };
        if let Ok(of) = self.open_file(o.fh) {
            if self.read(&of, 0, size as u32).is_ok() {
                FsStats::add(&self.sh.stats.prefetched_files, 1);
            }
        }
        self.release(o.fh);
    }
}
