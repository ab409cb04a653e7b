//! Operator requests on one object, by its path from the mount's root: `warm` pre-loads a
//! file's blocks into the SSD tier, `evict` drops an object from every tier (`tierfs warm`,
//! `tierfs evict`, which walk trees and send one request per object).
//!
//! Warm reads the backing file itself, in large chunks, and admits each block the SSD tier
//! lacks in this version, waiting for the write budget rather than skipping (or taking none,
//! when the operator says so): afterwards the file is served from the SSD tier. It leaves the
//! RAM tier alone (a warm of a large tree must not evict the working set). The version rules of
//! the read path apply: blocks are admitted under the fingerprint they were read under, only
//! if it still holds after the read, and never for a file changed less than `RACY_WINDOW` ago.

use super::Objects;
use crate::meta::ident;
use crate::meta_codec::version_of;
use crate::shared::{meta_key, Node};
use crate::stats::FsStats;
use crate::version::{racy, RACY_WINDOW};
use bytes::Bytes;
use std::path::{Component, Path};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use tierfs_cache::{Admit, AdmitError, BlockKey, SsdKey, KIND_DATA, KIND_DIR, KIND_LINK};
use tierfs_store::{Attr, Errno, FileKind, Store};

/// Bytes read from the backing store at once by a warm.
const WARM_CHUNK: u64 = 8 << 20;

/// What a warm of one file did.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct WarmReport {
    pub size: u64,
    /// Blocks queued for the SSD tier, and their bytes.
    pub admitted_blocks: u64,
    pub admitted_bytes: u64,
    /// Blocks the SSD tier held already in this version.
    pub present_blocks: u64,
    pub present_bytes: u64,
    /// Time spent waiting for the file to stop being racy.
    pub racy_wait_ms: u64,
}

/// Why a warm of one file failed.
#[derive(Debug)]
pub enum WarmError {
    /// The mount has no SSD tier.
    NoSsd,
    /// The SSD tier refused (device full, no budget, data not admitted, shut down): every
    /// other file would fail the same way.
    Admit(AdmitError),
    Errno(Errno),
    NotAFile(FileKind),
    /// Write-back data of the file is not on the backing store yet.
    Dirty,
    /// The file changed while it was read.
    Changed,
}

impl WarmError {
    /// Whether the error is about the mount rather than this one file: warming more files is
    /// pointless.
    pub fn fatal(&self) -> bool {
        matches!(self, WarmError::NoSsd | WarmError::Admit(_))
    }
}

impl std::fmt::Display for WarmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WarmError::NoSsd => f.write_str("this mount has no SSD tier (ssd.enable=off)"),
            WarmError::Admit(e) => write!(f, "{e}"),
            WarmError::Errno(e) => write!(f, "{e}"),
            WarmError::NotAFile(k) => write!(f, "not a regular file ({k:?})"),
            WarmError::Dirty => f.write_str(
                "it has write-back data not yet on the backing store; warm it after the flush",
            ),
            WarmError::Changed => f.write_str("it changed while it was read; warm it again"),
        }
    }
}

impl From<Errno> for WarmError {
    fn from(e: Errno) -> Self {
        WarmError::Errno(e)
    }
}

/// What an eviction of one object dropped.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct EvictReport {
    pub ram_blocks: u64,
    pub ssd_entries: u64,
    pub ssd_bytes: u64,
}

impl<S: Store> Objects<S> {
    /// The backing object at `rel`, a path from the mount's root ("" or "." is the root). Its
    /// components must be plain names (no `..`); symlinks are not followed.
    pub(crate) fn resolve_rel(&self, rel: &Path) -> Result<(Node<S>, Attr), Errno> {
        let (mut node, mut attr) = self.sh.store.root()?;
        for c in rel.components() {
            match c {
                Component::Normal(name) => (node, attr) = self.sh.store.lookup(&node, name)?,
                Component::CurDir | Component::RootDir => {}
                Component::ParentDir | Component::Prefix(_) => return Err(Errno::EINVAL),
            }
        }
        Ok((node, attr))
    }

    /// Pre-loads the regular file at `rel` into the SSD tier (see the module doc). With
    /// `budget`, admission waits for the SSD write budget; without, it takes none.
    pub fn warm_file(&self, rel: &Path, budget: bool) -> Result<WarmReport, WarmError> {
        let r = self.warm_inner(rel, budget);
        let c = &self.sh.stats.warm;
        match &r {
            Ok(w) => {
                FsStats::add(&c.files, 1);
                FsStats::add(&c.admitted_bytes, w.admitted_bytes);
                FsStats::add(&c.present_bytes, w.present_bytes);
            }
            Err(_) => FsStats::add(&c.failed, 1),
        }
        r
    }

    pub(crate) fn warm_inner(&self, rel: &Path, budget: bool) -> Result<WarmReport, WarmError> {
        let ssd = self.sh.ssd.as_ref().ok_or(WarmError::NoSsd)?;
        let (node, attr) = self.resolve_rel(rel)?;
        if attr.kind != FileKind::File {
            return Err(WarmError::NotAFile(attr.kind));
        }
        if self
            .ns
            .inodes
            .file_state_of(ident(&attr))
            .is_some_and(|st| st.has_dirty.load(Relaxed))
        {
            return Err(WarmError::Dirty);
        }
        let h = self.sh.store.open(&node, libc::O_RDONLY)?;
        let mut fp = self.sh.store.fstat(&h)?.fingerprint();
        let mut report = WarmReport {
            size: fp.size,
            ..WarmReport::default()
        };
        // Blocks of a file changed within RACY_WINDOW are not cached (see `racy`): wait that
        // out, a few times at most (a file written to all along is not warmed).
        let t = Instant::now();
        for _ in 0..3 {
            if !racy(&fp) {
                break;
            }
            std::thread::sleep(RACY_WINDOW / 4);
            fp = self.sh.store.fstat(&h)?.fingerprint();
        }
        report.racy_wait_ms = t.elapsed().as_millis() as u64;
        if racy(&fp) {
            return Err(WarmError::Changed);
        }
        report.size = fp.size;
        let version = version_of(&fp);
        let bs = self.sh.cfg.block_size;
        let per_chunk = (WARM_CHUNK / bs).max(1);
        let nblocks = fp.size.div_ceil(bs);
        let key = |idx| SsdKey {
            kind: KIND_DATA,
            dev: attr.dev,
            ino: attr.ino,
            idx,
        };
        let len_of = |idx: u64| (fp.size - idx * bs).min(bs);
        let mut first = 0;
        while first < nblocks {
            let end = (first + per_chunk).min(nblocks);
            let missing: Vec<u64> = (first..end)
                .filter(|&i| !ssd.contains(&key(i), version))
                .collect();
            for i in (first..end).filter(|i| !missing.contains(i)) {
                report.present_blocks += 1;
                report.present_bytes += len_of(i);
            }
            first = end;
            let (Some(&a), Some(&b)) = (missing.first(), missing.last()) else {
                continue;
            };
            let start = a * bs;
            let mut buf = vec![0u8; ((b * bs + len_of(b)) - start) as usize];
            let n = self.sh.store.read(&h, start, &mut buf)?;
            // Read first, check after: if the fingerprint still holds, the bytes are of it.
            if n < buf.len() || self.sh.store.fstat(&h)?.fingerprint() != fp {
                return Err(WarmError::Changed);
            }
            let buf = Bytes::from(buf);
            for i in missing {
                let s = (i * bs - start) as usize;
                let block = buf.slice(s..s + len_of(i) as usize);
                match ssd.offer_wait(key(i), version, block, budget) {
                    Ok(Admit::Queued) => {
                        report.admitted_blocks += 1;
                        report.admitted_bytes += len_of(i);
                    }
                    Ok(Admit::Present) => {
                        report.present_blocks += 1;
                        report.present_bytes += len_of(i);
                    }
                    Err(e) => return Err(WarmError::Admit(e)),
                }
            }
        }
        Ok(report)
    }

    /// Drops the object at `rel` from every tier: a file's blocks from the RAM and SSD tiers
    /// (with tombstones, so they stay gone after a restart), a directory's listing or a
    /// symlink's target from the metadata cache and the SSD tier, and its attributes from the
    /// metadata cache. The next read goes to the backing store.
    pub fn evict_path(&self, rel: &Path) -> Result<EvictReport, Errno> {
        let (_, attr) = self.resolve_rel(rel)?;
        let id = ident(&attr);
        let mut r = EvictReport::default();
        let mut keys = Vec::new();
        match attr.kind {
            FileKind::File => {
                let mut size = attr.size;
                if let Some(st) = self.ns.inodes.file_state_of(id) {
                    // Exclusive, like a truncate: no fetch inserts blocks of the old
                    // generation after this, and readers after it start a new one.
                    let _w = st.rw.write();
                    let v = st.version();
                    size = size.max(v.fp.size);
                    for idx in 0..v.fp.size.div_ceil(self.sh.cfg.block_size) {
                        let k = BlockKey { gen: v.gen, idx };
                        if self.sh.cache.contains(&k) {
                            self.sh.cache.remove(&k);
                            r.ram_blocks += 1;
                        }
                    }
                    st.invalidate(None);
                }
                keys.extend(
                    (0..size.div_ceil(self.sh.cfg.block_size)).map(|idx| SsdKey {
                        kind: KIND_DATA,
                        dev: attr.dev,
                        ino: attr.ino,
                        idx,
                    }),
                );
            }
            FileKind::Dir => {
                self.ns.meta.drop_listing(id);
                keys.push(meta_key(KIND_DIR, &attr));
            }
            FileKind::Symlink => keys.push(meta_key(KIND_LINK, &attr)),
            _ => {}
        }
        self.ns.meta.drop_attr(id);
        if let Some(ssd) = &self.sh.ssd {
            (r.ssd_entries, r.ssd_bytes) = ssd.evict(keys);
        }
        let c = &self.sh.stats.warm;
        FsStats::add(&c.evicted, 1);
        FsStats::add(&c.evicted_ssd_bytes, r.ssd_bytes);
        Ok(r)
    }
}
