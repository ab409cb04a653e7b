//! The SSD tier: a persistent, log-structured, checksummed second-level cache on a local disk,
//! in the spirit of DragonFly's swapcache. Layout and rules: docs/ssd-tier.md.
//!
//! - `offer` is admission: never blocks; kind switches, a token-bucket write budget and a
//!   bounded queue decide. One writer thread packs entries into clusters (one O_DIRECT write
//!   each) appended to segment files, then publishes them in a sharded in-memory index.
//! - `get`/`read_range` (`get.rs`) take one index shard read lock, read the aligned pages
//!   with O_DIRECT, verify every page CRC (seeded with the entry's key and version) and return
//!   a slice of the read buffer. A mismatch drops the entry; corrupt data is never returned.
//! - Capacity: before a new segment, the oldest is reclaimed; its hit entries are rewritten.
//! - Persistence: a checkpoint of the index plus the summaries written after it; `open`
//!   (`open.rs`) rebuilds from both and survives a crash at any moment.

mod aligned;
mod budget;
mod checkpoint;
mod error;
pub mod fsck;
mod get;
mod index;
pub(crate) mod io;
mod layout;
mod open;
mod read;
mod recover;
mod segment;
mod session;
mod stats;
mod superblock;
mod types;
mod warm;
mod window;
mod writer;
mod writer_loop;
mod writer_pack;
mod writer_segments;

#[cfg(test)]
mod tests;

pub use error::SsdError;
pub use io::device_space;
pub use stats::SsdStats;
pub use types::{SsdConfig, SsdIdentity, SsdKey, KIND_ATTR, KIND_DATA, KIND_DIR, KIND_LINK};
pub use warm::{Admit, AdmitError};

use budget::{Budget, HEADROOM};
use bytes::Bytes;
use crossbeam_channel::{bounded, Sender, TrySendError};
use error::io_err;
use index::{Index, Pending};
use layout::store_seed;
use parking_lot::Mutex;
use stats::{inc, Counters};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use writer::Msg;

/// State shared by the readers, `offer` and the writer thread.
pub(crate) struct Shared {
    pub dir: PathBuf,
    pub cfg: SsdConfig,
    pub uuid: [u8; 16],
    /// Seed of summary and checkpoint CRCs (from the uuid).
    pub seed: u32,
    pub index: Index,
    pub pending: Pending,
    pub budget: Budget,
    pub ctr: Counters,
    /// O_DIRECT works on this filesystem (turned off once if not).
    pub direct: AtomicBool,
    /// Bytes of segment files.
    pub fill: AtomicU64,
    pub cap: u64,
    pub segments: AtomicU64,
    /// No room for a segment even with the cache emptied: admission paused.
    pub full: AtomicBool,
    /// Bytes offered and not yet taken by the writer (bounds the queue's memory).
    pub queued_bytes: AtomicU64,
    /// The largest entry a cluster holds (`cluster_size`).
    pub max_entry: u32,
    /// Admission switches (`cache_data`, `cache_meta`), which may change at run time.
    pub admit_data: AtomicBool,
    pub admit_meta: AtomicBool,
    /// Read-around windows for small entries.
    pub windows: Arc<window::Windows>,
}

impl Shared {
    fn new(dir: &Path, cfg: SsdConfig, uuid: [u8; 16], cap: u64, direct: bool) -> Shared {
        Shared {
            dir: dir.to_path_buf(),
            uuid,
            seed: store_seed(&uuid),
            index: Index::new(),
            pending: Pending::new(),
            budget: Budget::new(cfg.write_rate, cfg.write_burst),
            ctr: Counters::default(),
            direct: AtomicBool::new(direct),
            fill: AtomicU64::new(0),
            cap,
            segments: AtomicU64::new(0),
            full: AtomicBool::new(false),
            queued_bytes: AtomicU64::new(0),
            max_entry: cfg.cluster_size.min(u32::MAX as u64) as u32,
            admit_data: AtomicBool::new(cfg.cache_data),
            admit_meta: AtomicBool::new(cfg.cache_meta),
            windows: Arc::new(window::Windows::default()),
            cfg,
        }
    }

    /// Whether entries of this kind are admitted now (`cache_data`, `cache_meta`).
    pub(crate) fn admits(&self, kind: u8) -> bool {
        if kind == KIND_DATA {
            self.admit_data.load(Relaxed)
        } else {
            self.admit_meta.load(Relaxed)
        }
    }
}

/// Messages the queue holds at most; entries are also bounded in bytes (`QUEUE_CLUSTERS`).
const QUEUE_LEN: usize = 8192;
/// The queue holds at most this many clusters' worth of entry bytes.
const QUEUE_CLUSTERS: u64 = 64;
const LOCK_FILE: &str = "lock";

pub struct SsdCache {
    sh: Arc<Shared>,
    tx: Sender<Msg>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The on-disk format of the directory found at open, when it was another one and the
    /// directory was rebuilt.
    rebuilt_from: Option<u32>,
    /// This session's epoch and whether its records may be trusted (see `session`).
    epoch: u64,
    last_clean: bool,
    session: Mutex<SessionState>,
    /// flock on `<dir>/lock`, held for the life of the cache.
    _lock: File,
}

/// Where the session stands (see `session`).
#[derive(Default)]
struct SessionState {
    /// A drop of a record was not logged: some record may be out of date.
    distrusted: bool,
    /// The session file says "clean".
    closed: bool,
    /// What the writer answered at shutdown: the index on disk is the one in memory.
    durable: Option<bool>,
}

impl SsdCache {
    /// The format of the directory found at open, if it was another one (then rebuilt empty).
    pub fn rebuilt_from_format(&self) -> Option<u32> {
        self.rebuilt_from
    }

    /// Non-blocking admission. False if not admitted: kind disabled, larger than a cluster,
    /// write budget exhausted, queue full, device full. True also when the same key and
    /// version is already stored or queued (it is not written again).
    pub fn offer(&self, key: SsdKey, version: u64, data: Bytes) -> bool {
        let sh = &self.sh;
        let c = &sh.ctr;
        if !sh.admits(key.kind) || data.len() > sh.max_entry as usize {
            inc(&c.dropped_other);
            return false;
        }
        if sh.full.load(Relaxed) {
            inc(&c.dropped_full);
            return false;
        }
        if sh.index.contains(&key, version) || sh.pending.contains(&key, version) {
            inc(&c.duplicates);
            return true;
        }
        let len = data.len() as u64;
        let charge = budget::charge(len as u32);
        if !sh.budget.try_take(charge, HEADROOM) {
            inc(&c.dropped_budget);
            return false;
        }
        let limit = QUEUE_CLUSTERS * sh.cfg.cluster_size;
        if sh.queued_bytes.fetch_add(len, Relaxed) + len > limit {
            sh.queued_bytes.fetch_sub(len, Relaxed);
            sh.budget.refund(charge);
            inc(&c.dropped_queue);
            return false;
        }
        if !sh.pending.claim(key, version) {
            sh.queued_bytes.fetch_sub(len, Relaxed);
            sh.budget.refund(charge);
            inc(&c.duplicates);
            return true;
        }
        let msg = Msg::Put {
            key,
            version,
            data,
            charge,
            budgeted: true,
        };
        match self.tx.try_send(msg) {
            Ok(()) => {
                inc(&c.admitted);
                c.admitted_bytes.fetch_add(len, Relaxed);
                true
            }
            Err(e) => {
                sh.pending.release(&key, version);
                sh.queued_bytes.fetch_sub(len, Relaxed);
                sh.budget.refund(charge);
                match e {
                    TrySendError::Full(_) => inc(&c.dropped_queue),
                    TrySendError::Disconnected(_) => inc(&c.dropped_other),
                }
                false
            }
        }
    }

    /// Drops the key (any version) now, and logs a tombstone so a restart does not bring it
    /// back. If the queue is full (or the tier is shut down) the tombstone is skipped and the
    /// session distrusted (`distrust_session`): entries whose version says all are still
    /// right, but a record that depends on drops (a listing's entries) is not after a restart.
    pub fn remove(&self, key: &SsdKey) {
        self.sh.index.remove(key);
        if self.tx.try_send(Msg::Remove(*key)).is_err() {
            self.distrust_session();
        }
    }

    /// This session's epoch (see `session`): records that are current only while every drop
    /// of them is logged carry it, and are trusted only in a session of the same epoch.
    pub fn session_epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the last session ended cleanly (`close_session`), so this one has its epoch.
    pub fn last_session_clean(&self) -> bool {
        self.last_clean
    }

    /// Some record of this session may be out of date: the next session takes a new epoch.
    pub fn distrust_session(&self) {
        let mut s = self.session.lock();
        if s.distrusted {
            return;
        }
        s.distrusted = true;
        if s.closed {
            s.closed = false;
            let r = session::store(
                &self.sh.dir,
                session::Session {
                    epoch: self.epoch,
                    clean: false,
                },
            );
            if let Err(e) = r {
                tracing::warn!("SSD tier: {e}: the next mount may trust stale listings");
            }
        }
    }

    /// `shutdown`, then the session ended cleanly: unless it was distrusted, the next session
    /// keeps its epoch. Call only when nothing is left that would change the store (write-back
    /// drained): a replay at the next mount changes what the records describe.
    pub fn close_session(&self) {
        self.shutdown();
        let mut s = self.session.lock();
        if s.distrusted || s.closed || s.durable != Some(true) {
            return;
        }
        let r = session::store(
            &self.sh.dir,
            session::Session {
                epoch: self.epoch,
                clean: true,
            },
        );
        match r {
            Ok(()) => s.closed = true,
            Err(e) => tracing::warn!("SSD tier: {e}: the next mount starts a new session"),
        }
    }

    /// Writes any pending partial cluster now and waits until it is in the index.
    pub fn flush(&self) {
        let (tx, rx) = bounded(1);
        if self.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    /// Gives back up to `bytes` of the cache device by dropping the oldest segments (for the
    /// write-back journal, whose acknowledged data must find room). Returns the bytes freed; 0
    /// if the writer does not answer within 10 s.
    pub fn yield_space(&self, bytes: u64) -> u64 {
        let (tx, rx) = bounded(1);
        if self.tx.send(Msg::Yield(bytes, tx)).is_err() {
            return 0;
        }
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or(0)
    }

    /// Writes a checkpoint now (after flushing).
    pub fn checkpoint(&self) -> Result<(), SsdError> {
        let (tx, rx) = bounded(1);
        self.tx
            .send(Msg::Checkpoint(tx))
            .map_err(|_| SsdError::Closed)?;
        rx.recv().map_err(|_| SsdError::Closed)?
    }

    /// Flush, checkpoint, stop the writer. Idempotent; also done on drop. Reads keep working.
    pub fn shutdown(&self) {
        self.sh.windows.stop_prefetch();
        let Some(handle) = self.writer.lock().take() else {
            return;
        };
        let (tx, rx) = bounded(1);
        let durable = self.tx.send(Msg::Shutdown(tx)).is_ok() && rx.recv().unwrap_or(false);
        let _ = handle.join();
        self.session.lock().durable = Some(durable);
    }

    pub fn set_write_rate(&self, bytes_per_s: u64) {
        self.sh.budget.set_rate(bytes_per_s);
    }

    pub fn set_write_burst(&self, bytes: u64) {
        self.sh.budget.set_depth(bytes);
    }

    /// Switches admission of file data (`cache_data`) and of the other kinds (`cache_meta`)
    /// for offers from now on; what is stored stays and is still served.
    pub fn set_admission(&self, data: bool, meta: bool) {
        self.sh.admit_data.store(data, Relaxed);
        self.sh.admit_meta.store(meta, Relaxed);
    }

    pub fn stats(&self) -> SsdStats {
        let sh = &self.sh;
        let (rate, burst, tokens) = sh.budget.state();
        let (entries, live_bytes) = sh.index.len_and_bytes();
        SsdStats {
            write_rate: rate,
            write_burst: burst,
            cur_burst: tokens,
            fill_bytes: sh.fill.load(Relaxed),
            cap_bytes: sh.cap,
            segments: sh.segments.load(Relaxed),
            entries,
            live_bytes,
            device_free_bytes: io::device_space(&sh.dir).map_or(0, |(_, f)| f),
            window_reads: sh.windows.total_reads.load(Relaxed),
            window_hits: sh.windows.total_hits.load(Relaxed),
            queued_bytes: sh.queued_bytes.load(Relaxed),
            ..sh.ctr.snapshot()
        }
    }
}

impl Drop for SsdCache {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn is_tier_file(name: &str) -> bool {
    session::is_file(name)
        || segment::parse_name(name).is_some()
        || name == checkpoint::FILE
        || name == checkpoint::TMP
        || name == superblock::FILE
        || name == "superblock.tmp"
}

/// Whether `dir` holds files the tier writes only once its superblock is in place: a
/// superblock being written when the process died (`superblock.tmp`) is no sign of damage,
/// nothing was cached yet (the first open was killed mid-creation).
fn has_tier_files(dir: &Path) -> Result<bool, SsdError> {
    for ent in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let ent = ent.map_err(io_err("list", dir))?;
        if ent
            .file_name()
            .to_str()
            .is_some_and(|n| is_tier_file(n) && !session::is_file(n) && n != "superblock.tmp")
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Removes the tier's own files (and nothing else: the directory may hold other things).
fn wipe(dir: &Path) -> Result<(), SsdError> {
    for ent in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let ent = ent.map_err(io_err("list", dir))?;
        if ent.file_name().to_str().is_some_and(is_tier_file) {
            let p = ent.path();
            fs::remove_file(&p).map_err(io_err("remove", &p))?;
        }
    }
    io::sync_dir(dir).map_err(io_err("fsync", dir))
}
