//! The write-back journal: a durable, checksummed log of acknowledged writes whose data is not
//! yet on the backing store. Layout and rules: docs/writeback.md, "Journal format".
//!
//! - `append` copies a record into an in-memory batch and returns its seq; it blocks only when
//!   `max_buffer` bytes are already waiting for the writer (backpressure), and returns `Full`
//!   at once when the journal is at capacity (the caller waits for flushers).
//! - One writer thread drains the whole batch with one positioned write per segment touched and
//!   fdatasyncs when a caller waits in `sync` (or every `sync_interval`): group commit, one
//!   fdatasync for everyone waiting at the time. The first record of a batch wakes it, and it
//!   waits up to `LINGER` (2 ms) for more unless someone waits: one wake-up per batch, not
//!   per record.
//! - Flushers record DONE (or DROP) once the backing store has the data durably; a segment is
//!   deleted, oldest first, once every DATA record in it is covered by a durable DONE/DROP.
//! - `open` replays: it checks every record and hands back the writes that are still pending.

mod damage;
mod error;
mod format;
mod inspect;
mod io;
mod record;
mod replay;
mod space;
mod stats;
mod superblock;
mod writer;

#[cfg(test)]
mod tests;

pub use damage::Damage;
pub use error::JournalError;
pub use format::{FileRef, Record, MAX_NS, MAX_PATH, NS_KEY};
pub use inspect::{JournalReport, JournalState};
pub use replay::{PendingNs, PendingWrite, Replay};
pub use stats::JournalStats;

use error::io_err;
use format::{Decoded, HeaderCheck, Prepared, DATA_FIXED, HDR, SEAL_LEN};
use parking_lot::{Condvar, Mutex, MutexGuard};
use replay::seg_name;
use space::{Key, Space};
use stats::Counters;
use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Settings of the journal.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    /// Size of a segment file (preallocated). Space is reclaimed a segment at a time.
    pub segment_size: u64,
    /// Capacity: the most bytes of segment files holding DATA. A DATA append beyond it returns
    /// `Full`; DONE and DROP may take one more segment (they are what frees space).
    pub max_size: u64,
    /// Bytes of appended records waiting for the writer beyond which `append` blocks.
    pub max_buffer: u64,
    /// The writer fdatasyncs at least this often while records are unsynced, so DONEs free
    /// space and a crash loses a bounded amount even when no one calls `sync`.
    pub sync_interval: Duration,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            // 64 MiB: a segment holds 64 full 1 MiB writes, so the rollover fdatasync and the
            // creation of the next file are rare; small enough to free space steadily.
            segment_size: 64 * MIB,
            // 1 GiB of dirty data not yet on the backing store: 16 segments.
            max_size: 1024 * MIB,
            // 16 MiB: a few hundred ms of a slow disk, large enough not to stall bursts.
            max_buffer: 16 * MIB,
            sync_interval: Duration::from_secs(1),
        }
    }
}

impl JournalConfig {
    pub fn validate(&self) -> Result<(), JournalError> {
        let bad = |m: String| Err(JournalError::Config(m));
        if self.segment_size < 4 * MIB {
            return bad(format!(
                "segment_size {} is below 4 MiB (a segment must hold the largest record, 1 MiB and a header, several times)",
                self.segment_size
            ));
        }
        if self.segment_size > 1 << 40 {
            return bad(format!("segment_size {} is above 1 TiB", self.segment_size));
        }
        if self.max_size < 2 * self.segment_size {
            return bad(format!(
                "max_size {} is below two segments ({}): the journal could never move on from a full segment",
                self.max_size,
                2 * self.segment_size
            ));
        }
        if self.max_buffer < 64 * 1024 {
            return bad(format!("max_buffer {} is below 64 KiB", self.max_buffer));
        }
        if self.sync_interval.is_zero() {
            return bad("sync_interval is zero".into());
        }
        Ok(())
    }
}

/// Where the next record goes.
#[derive(Debug)]
struct Tail {
    seg: u64,
    off: u64,
    /// Whether `seg` has been started (has a `SegInfo`); after open it has not.
    open: bool,
    seed: u32,
}

/// Records placed in one segment, contiguous, waiting for the writer.
#[derive(Debug)]
pub(crate) struct Run {
    seg: u64,
    off: u64,
    /// Bytes the run covers: `buf` plus the `shared` payloads.
    len: u64,
    /// Headers, payload prefixes, small payloads and SEALs.
    buf: Vec<u8>,
    /// Large DATA payloads, referred to rather than copied. The writer completes their
    /// headers' CRCs and writes `buf` and them interleaved with one pwritev.
    shared: Vec<SharedPayload>,
    /// Highest seq in `buf`.
    last_seq: u64,
    /// Caller records in `buf` (SEALs not counted).
    records: u64,
}

/// A DATA payload a run refers to (see `format::SHARE_MIN`).
#[derive(Debug)]
pub(crate) struct SharedPayload {
    /// Where in the run's `buf` the payload goes (the bytes before it precede it).
    pos: usize,
    /// Where its record's header starts in `buf`.
    hdr: usize,
    /// Its record's CRC over seed, header and prefix; the writer appends the data's.
    partial_crc: u32,
    data: bytes::Bytes,
}

pub(crate) struct State {
    next_seq: u64,
    tail: Tail,
    /// The batch being filled: what the writer takes next.
    runs: Vec<Run>,
    queued: u64,
    /// An append woke the writer for the batch being filled (see `append_inner`).
    woken: bool,
    /// Emptied batch buffers, kept for reuse (a 16 MiB allocation per batch costs page faults).
    spare: Vec<Vec<u8>>,
    space: Space,
    /// DONE/DROP records appended but not yet durable: (seq, file, upto). They count for
    /// freeing space only once durable, or a crash could leave data neither on the backing
    /// store nor in the journal.
    marks: VecDeque<(u64, Key, u64)>,
    written_seq: u64,
    durable_seq: u64,
    /// The segment the writer writes to; every segment below it is sealed and durable.
    writer_seg: u64,
    /// The highest seq a `sync` caller waits for.
    sync_want: u64,
    space_waiters: usize,
    /// The next segment file, created ahead of time (preallocated, its entry durable) by the
    /// writer: a roll goes only there, so a full cache device is found before any record is
    /// placed in a segment that cannot be made (`NoSpace` at append, never a failed journal).
    ready: Option<u64>,
    /// An append waits for `ready`: the writer tries to create it now.
    want_ready: bool,
    /// Failed attempts to create the next segment since open (each answers the appends that
    /// waited for it).
    create_failures: u64,
    /// Why the last attempt failed, while it has not succeeded since.
    no_space: Option<String>,
    /// The log said writes are refused for lack of room (and will say when it is back).
    no_space_said: bool,
    /// When the writer tries again by itself after a failed attempt.
    retry_at: Option<Instant>,
    failed: Option<String>,
    shutdown: bool,
    writer_done: bool,
    c: Counters,
}

impl State {
    fn usable(&self) -> Result<(), JournalError> {
        if let Some(m) = &self.failed {
            return Err(JournalError::Failed(m.clone()));
        }
        if self.shutdown {
            return Err(JournalError::Closed);
        }
        Ok(())
    }

    /// Whether a record of `len` bytes can be appended now without returning `Full`.
    fn fits(&self, len: u64, cfg: &JournalConfig) -> bool {
        self.fits_in_tail(len + MARK_ROOM, cfg)
            || self.space.used + cfg.segment_size <= cfg.max_size
    }

    /// Whether `len` bytes (and a SEAL after them) fit in the tail segment. DATA asks with
    /// `MARK_ROOM` added: that much of every segment is for DONE/DROP only.
    fn fits_in_tail(&self, len: u64, cfg: &JournalConfig) -> bool {
        self.tail.open && self.tail.off + len + SEAL_LEN <= cfg.segment_size
    }

    /// The buffer the record at (`seg`, `off`) goes into.
    fn run_for(&mut self, seg: u64, off: u64) -> &mut Run {
        let extend = matches!(self.runs.last(), Some(r) if r.seg == seg && r.off + r.len == off);
        if !extend {
            let buf = self.spare.pop().unwrap_or_default();
            self.runs.push(Run {
                seg,
                off,
                len: 0,
                buf,
                shared: Vec::new(),
                last_seq: 0,
                records: 0,
            });
        }
        self.runs.last_mut().expect("a run was just ensured")
    }

    /// The segment the next roll starts.
    fn next_seg(&self) -> u64 {
        if self.tail.open {
            self.tail.seg + 1
        } else {
            self.tail.seg
        }
    }

    /// Closes the tail segment with a SEAL (if it was started) and starts the next one, if
    /// its file is ready; false (nothing changed) if it is not.
    fn roll(&mut self, cfg: &JournalConfig, uuid: &[u8; 16]) -> bool {
        if self.ready != Some(self.next_seg()) {
            return false;
        }
        self.ready = None;
        if self.tail.open {
            let (seg, off, seed, seq) =
                (self.tail.seg, self.tail.off, self.tail.seed, self.next_seq);
            self.next_seq += 1;
            let run = self.run_for(seg, off);
            format::encode_seal(&mut run.buf, seed, seq, off);
            run.len += SEAL_LEN;
            run.last_seq = seq;
            self.queued += SEAL_LEN;
            self.tail.seg += 1;
        }
        let seg = self.tail.seg;
        self.space.add_seg(seg, cfg.segment_size, self.next_seq);
        self.tail = Tail {
            seg,
            off: 0,
            open: true,
            seed: format::seg_seed(uuid, seg),
        };
        true
    }
}

pub(crate) struct Shared {
    dir: PathBuf,
    cfg: JournalConfig,
    uuid: [u8; 16],
    st: Mutex<State>,
    /// Wakes the writer: records queued, a sync asked for, shutdown.
    writer_cv: Condvar,
    /// `durable_seq` moved, or the writer failed or stopped.
    durable_cv: Condvar,
    /// The writer took the batch (backpressure waiters).
    drained_cv: Condvar,
    /// Segments were freed.
    space_cv: Condvar,
    /// Open segment files, for the writer and `read_pending`.
    files: Mutex<BTreeMap<u64, Arc<File>>>,
    /// Asked for room on the cache device when the next segment cannot be created (the SSD
    /// tier gives back space): bytes wanted -> bytes freed.
    space_hook: Mutex<Option<SpaceHook>>,
}

/// See [`Journal::set_space_hook`].
pub type SpaceHook = Arc<dyn Fn(u64) -> u64 + Send + Sync>;

/// The end of every segment that DATA never takes: room for DONE/DROP records (48 bytes each,
/// some 1,300 of them) when the next segment cannot be created (a full cache device). Without
/// it a full tail could record no DONE, so no segment could be freed and the device would stay
/// full.
const MARK_ROOM: u64 = 64 << 10;

/// Bytes queued for the writer at which an append wakes it again (see `append_inner`).
fn wake_bytes(cfg: &JournalConfig) -> u64 {
    (cfg.max_buffer / 4).min(256 << 10)
}

/// How long a woken writer waits for more records before it takes the batch, unless someone
/// waits for a sync: short beside `sync_interval` and beside what a crash may lose anyway
/// (records not synced), long beside an append (a few microseconds).
pub(crate) const LINGER: Duration = Duration::from_millis(2);

/// How long an append waits for the writer to create the next segment file before it gives
/// up with `NoSpace` (normally the file exists long before it is needed).
const NEXT_SEGMENT_WAIT: Duration = Duration::from_secs(5);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock()
    }

    fn seg_path(&self, seg: u64) -> PathBuf {
        self.dir.join(seg_name(seg))
    }

    /// Deletes the oldest segments whose data is all covered by durable DONE/DROP records, one
    /// at a time with a directory fsync after each: a crash must never leave an older segment
    /// whose covering DONE (in a newer one) is already gone.
    fn free_covered(&self) -> Result<(), JournalError> {
        let segs = {
            let st = self.lock();
            st.space.freeable(st.writer_seg)
        };
        for seg in segs {
            self.files.lock().remove(&seg);
            let path = self.seg_path(seg);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("delete", &path)(e)),
            }
            io::sync_dir(&self.dir).map_err(io_err("fsync", &self.dir))?;
            let mut st = self.lock();
            st.space.remove_seg(seg);
            st.c.segments_freed += 1;
            self.space_cv.notify_all();
        }
        Ok(())
    }
}

/// The write-back journal of one cache directory. `Send + Sync`; share it by reference or `Arc`.
pub struct Journal {
    sh: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Journal {
    /// Opens (or creates) the journal in `dir` for the store `store_id`, replays it and starts
    /// the writer. `reset` deletes whatever journal is there first (its pending writes are
    /// lost: for a journal the caller has given up on).
    ///
    /// Records of the last segment after a torn or garbled one with nothing valid after it are
    /// ignored (a crash mid-write: none of them was acknowledged as durable) and the segment is
    /// sealed there; new records go to a new segment. A bad stretch with valid records after
    /// it is damage: skipped, listed in `Replay::damage`, and the pending writes of the files it
    /// may concern are in `Replay::lost` instead of `pending` (damage.rs).
    pub fn open(
        dir: &Path,
        store_id: &str,
        cfg: JournalConfig,
        reset: bool,
    ) -> Result<(Journal, Replay), JournalError> {
        cfg.validate()?;
        crate::private::dir_all(dir).map_err(io_err("create", dir))?;
        if reset {
            wipe(dir)?;
        }
        let tmp = dir.join(superblock::TMP);
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err("delete", &tmp)(e))
            }
            _ => {}
        }
        let seg_list = replay::list_segments(dir)?;
        let sb = match superblock::load(dir, store_id)? {
            // An older format's records are all read by this version: the superblock says
            // the newer one from now on, so NS records written next are never given to a
            // version that would not know them.
            Some(mut sb) if sb.format < format::FORMAT => {
                sb.format = format::FORMAT;
                superblock::store(dir, store_id, &sb)?;
                sb
            }
            Some(sb) => sb,
            None if !seg_list.is_empty() => {
                return Err(JournalError::Damaged {
                    path: dir.join(superblock::FILE),
                    offset: 0,
                    what: "superblock missing beside segment files".into(),
                })
            }
            None => {
                let sb = superblock::Superblock {
                    uuid: io::random_uuid(),
                    segment_size: cfg.segment_size,
                    format: format::FORMAT,
                };
                superblock::store(dir, store_id, &sb)?;
                sb
            }
        };

        let mut opened = BTreeMap::new();
        for &seg in &seg_list {
            let path = dir.join(seg_name(seg));
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_err("open", &path))?;
            opened.insert(seg, (path, f));
        }
        let sc = replay::scan(dir, &sb.uuid, &opened)?;
        let mut seg_list = seg_list;
        for &seg in &sc.spares {
            // Created ahead of time and never used: removed (the writer makes a new one).
            let (path, _) = opened
                .remove(&seg)
                .expect("a spare is one of the opened files");
            fs::remove_file(&path).map_err(io_err("delete", &path))?;
            io::sync_dir(dir).map_err(io_err("fsync", dir))?;
            seg_list.retain(|&s| s != seg);
        }
        let mut next_seq = sc.last_seq + 1;
        if let Some((seg, off)) = sc.unsealed_last {
            // Seal the last segment where its valid records end, so that once newer segments
            // exist its end is told from damage; the torn bytes after it are never read again.
            let (path, f) = &opened[&seg];
            let mut buf = Vec::new();
            format::encode_seal(&mut buf, format::seg_seed(&sb.uuid, seg), next_seq, off);
            next_seq += 1;
            io::write_all_at(f, &buf, off).map_err(io_err("write", path))?;
            io::fdatasync(f).map_err(io_err("fdatasync", path))?;
        } else if let Some((path, f)) = opened.values().next_back() {
            // What the scan read may have been in the page cache only (the process died, the
            // machine did not); DONEs read here are about to free space, so make them durable.
            io::fdatasync(f).map_err(io_err("fdatasync", path))?;
        }

        let (space, mut rp) = pending_of(sc.segs, sc.marks, sc.data, sc.replay);
        rp.pending_ns = sc
            .ns
            .into_iter()
            .filter(|n| !space.covered(&format::NS_KEY, n.seq))
            .collect();

        let last_seg = seg_list.last().copied().unwrap_or(0);
        let c = Counters {
            torn_tails: rp.torn_tail.is_some() as u64,
            replayed_records: rp.pending.len() as u64,
            replayed_bytes: rp.pending_bytes,
            ..Counters::default()
        };
        let st = State {
            next_seq,
            tail: Tail {
                seg: last_seg + 1,
                off: 0,
                open: false,
                seed: 0,
            },
            runs: Vec::new(),
            queued: 0,
            spare: Vec::new(),
            space,
            marks: VecDeque::new(),
            written_seq: next_seq - 1,
            durable_seq: next_seq - 1,
            // The last existing segment stays until the writer starts a new one, so segment
            // numbers and seqs never go back (nothing is ever written under an old name).
            writer_seg: last_seg,
            sync_want: 0,
            woken: false,
            space_waiters: 0,
            ready: None,
            want_ready: false,
            create_failures: 0,
            no_space: None,
            no_space_said: false,
            retry_at: None,
            failed: None,
            shutdown: false,
            writer_done: false,
            c,
        };
        let files = opened
            .into_iter()
            .map(|(seg, (_, f))| (seg, Arc::new(f)))
            .collect();
        let sh = Arc::new(Shared {
            dir: dir.to_path_buf(),
            cfg,
            uuid: sb.uuid,
            st: Mutex::new(st),
            writer_cv: Condvar::new(),
            durable_cv: Condvar::new(),
            drained_cv: Condvar::new(),
            space_cv: Condvar::new(),
            files: Mutex::new(files),
            space_hook: Mutex::new(None),
        });
        sh.free_covered()?;
        let w = Arc::clone(&sh);
        let handle = std::thread::Builder::new()
            .name("tierfs-journal".into())
            .spawn(move || writer::run(w))
            .map_err(io_err("start writer thread for", dir))?;
        Ok((
            Journal {
                sh,
                writer: Mutex::new(Some(handle)),
            },
            rp,
        ))
    }

    /// Appends a record; returns its seq. The record is durable once `sync(seq)` returns.
    pub fn append(&self, rec: Record<'_>) -> Result<u64, JournalError> {
        self.append_inner(rec, None)
    }

    fn append_inner(
        &self,
        rec: Record<'_>,
        shared: Option<bytes::Bytes>,
    ) -> Result<u64, JournalError> {
        if let Record::Ns { payload } = &rec {
            if payload.is_empty() || payload.len() > MAX_NS {
                return Err(JournalError::Config(format!(
                    "namespace record of {} bytes; 1 to {MAX_NS}",
                    payload.len()
                )));
            }
        }
        if let Record::Data { file, .. } = &rec {
            if file.path.len() > MAX_PATH {
                return Err(JournalError::Config(format!(
                    "path of {} bytes; at most {MAX_PATH}",
                    file.path.len()
                )));
            }
        }
        let cfg = &self.sh.cfg;
        let room = match rec {
            Record::Data { .. } | Record::Ns { .. } => MARK_ROOM,
            _ => 0,
        };
        let max = cfg.segment_size - SEAL_LEN - room;
        let len = rec.encoded_len();
        if len > max {
            return Err(JournalError::TooLarge { len, max });
        }
        let p = format::prepare(&rec, shared);
        let mut st = self.sh.lock();
        st.usable()?;
        while st.queued > 0 && st.queued + len > cfg.max_buffer {
            self.sh.writer_cv.notify_one();
            self.sh.drained_cv.wait(&mut st);
            st.usable()?;
        }
        let mark = match rec {
            Record::Data { .. } | Record::Ns { .. } => None,
            Record::Done { dev, ino, upto_seq } | Record::Drop { dev, ino, upto_seq } => {
                if upto_seq >= st.next_seq {
                    return Err(JournalError::Config(format!(
                        "DONE/DROP up to seq {upto_seq}, but the last seq appended is {}",
                        st.next_seq - 1
                    )));
                }
                Some(((dev, ino), upto_seq))
            }
        };
        let mut tries = None;
        let deadline = Instant::now() + NEXT_SEGMENT_WAIT;
        while !st.fits_in_tail(len + room, cfg) {
            // DONE and DROP may use one segment beyond the cap: they are what frees space, and a
            // journal too full to record them would never empty.
            let cap = match mark {
                None => cfg.max_size,
                Some(_) => cfg.max_size + cfg.segment_size,
            };
            if st.space.used + cfg.segment_size > cap {
                st.c.full_errors += 1;
                return Err(JournalError::Full {
                    used: st.space.used,
                    cap: cfg.max_size,
                });
            }
            if st.roll(cfg, &self.sh.uuid) {
                break;
            }
            // The next segment file is not there: the writer makes it (and asks for room if
            // the device is full). One failed attempt after we asked is the answer.
            let t = *tries.get_or_insert(st.create_failures);
            if st.create_failures > t {
                st.c.no_space_errors += 1;
                return Err(JournalError::NoSpace {
                    dir: self.sh.dir.clone(),
                    why: st.no_space.clone().unwrap_or_default(),
                });
            }
            st.want_ready = true;
            self.sh.writer_cv.notify_one();
            if self.sh.space_cv.wait_until(&mut st, deadline).timed_out()
                && st.ready != Some(st.next_seg())
                && !st.fits_in_tail(len + room, cfg)
            {
                st.c.no_space_errors += 1;
                return Err(JournalError::NoSpace {
                    dir: self.sh.dir.clone(),
                    why: "the next segment file was not created in time".into(),
                });
            }
            st.usable()?;
        }
        let seq = place(&mut st, &p, len);
        match (rec, mark) {
            (Record::Data { file, .. }, _) => {
                let seg = st.tail.seg;
                if let Some(info) = st.space.segs.get_mut(&seg) {
                    info.files.insert((file.dev, file.ino), seq);
                }
            }
            (Record::Ns { .. }, _) => {
                let seg = st.tail.seg;
                if let Some(info) = st.space.segs.get_mut(&seg) {
                    info.files.insert(NS_KEY, seq);
                }
            }
            (_, Some((key, upto))) => st.marks.push_back((seq, key, upto)),
            _ => {}
        }
        // The writer is woken once per batch, not for every record: an untar appends a
        // handful of small records per file, and a wake-up per record cost a context switch
        // each (on two cores, a quarter of the acknowledged untar's time). Once woken, the
        // writer lingers a moment (`LINGER`) so the records appended meanwhile join its
        // batch; a big batch or a DONE wakes it again, and `sync` always does.
        let wake = !std::mem::replace(&mut st.woken, true)
            || st.queued >= wake_bytes(cfg)
            || mark.is_some();
        drop(st);
        if wake {
            self.sh.writer_cv.notify_one();
        }
        Ok(seq)
    }

    /// Appends DATA: `data` was written at `offset` of `file`.
    pub fn append_data(
        &self,
        file: &FileRef,
        offset: u64,
        data: &[u8],
    ) -> Result<u64, JournalError> {
        self.append(Record::Data { file, offset, data })
    }

    /// [`Journal::append_data`] of a buffer the caller keeps (immutable, reference-counted):
    /// the journal writes it from where it is instead of copying it into its batch.
    pub fn append_data_shared(
        &self,
        file: &FileRef,
        offset: u64,
        data: &bytes::Bytes,
    ) -> Result<u64, JournalError> {
        let rec = Record::Data {
            file,
            offset,
            data: &data[..],
        };
        self.append_inner(rec, Some(data.clone()))
    }

    /// Appends DONE: every DATA of (dev, ino) with seq <= `upto_seq` is on the backing store,
    /// durably. Space is freed once this record is durable (`sync`, or within `sync_interval`).
    pub fn done(&self, dev: u64, ino: u64, upto_seq: u64) -> Result<u64, JournalError> {
        self.append(Record::Done { dev, ino, upto_seq })
    }

    /// Appends DROP: the DATA of (dev, ino) up to `upto_seq` was discarded (unlink, truncate).
    pub fn drop_file(&self, dev: u64, ino: u64, upto_seq: u64) -> Result<u64, JournalError> {
        self.append(Record::Drop { dev, ino, upto_seq })
    }

    /// Blocks until every record with seq <= `seq` is durable. Callers waiting at the same time
    /// share one fdatasync.
    pub fn sync(&self, seq: u64) -> Result<(), JournalError> {
        let mut st = self.sh.lock();
        let seq = seq.min(st.next_seq - 1);
        if st.durable_seq >= seq {
            return Ok(());
        }
        if let Some(m) = &st.failed {
            return Err(JournalError::Failed(m.clone()));
        }
        st.c.sync_calls += 1;
        st.sync_want = st.sync_want.max(seq);
        self.sh.writer_cv.notify_one();
        loop {
            if st.durable_seq >= seq {
                return Ok(());
            }
            if let Some(m) = &st.failed {
                return Err(JournalError::Failed(m.clone()));
            }
            if st.writer_done {
                return Err(JournalError::Closed);
            }
            self.sh.durable_cv.wait(&mut st);
        }
    }

    /// Blocks until every record appended so far is durable.
    pub fn sync_all(&self) -> Result<(), JournalError> {
        let seq = self.appended_seq();
        self.sync(seq)
    }

    /// Blocks until a DATA record of `bytes` of data (and any path) can be appended without
    /// `Full`, or `timeout` passes; says which. Wakes when segments are freed; makes the writer
    /// sync pending DONEs at once, so they free space without waiting for `sync_interval`.
    pub fn wait_for_space(&self, bytes: u64, timeout: Duration) -> bool {
        let need = (HDR + DATA_FIXED + MAX_PATH) as u64 + bytes;
        let deadline = Instant::now() + timeout;
        let cfg = &self.sh.cfg;
        let mut st = self.sh.lock();
        st.space_waiters += 1;
        self.sh.writer_cv.notify_one();
        let ok = loop {
            if st.fits(need, cfg) {
                break true;
            }
            if st.failed.is_some() || st.shutdown {
                break false;
            }
            if self.sh.space_cv.wait_until(&mut st, deadline).timed_out() {
                break st.fits(need, cfg);
            }
        };
        st.space_waiters -= 1;
        ok
    }

    /// Sets what the journal calls when the cache device has no room for its next segment:
    /// `hook(bytes)` should free up to that many bytes of the device (the SSD tier drops its
    /// oldest segments) and return how many it freed. Called from the journal's writer thread.
    pub fn set_space_hook(&self, hook: SpaceHook) {
        *self.sh.space_hook.lock() = Some(hook);
    }

    /// Bytes of segment files (whole preallocated segments).
    pub fn used_bytes(&self) -> u64 {
        self.sh.lock().space.used
    }

    /// The last seq handed out (0 if none ever).
    pub fn appended_seq(&self) -> u64 {
        self.sh.lock().next_seq - 1
    }

    /// Every record with seq <= this is durable.
    pub fn durable_seq(&self) -> u64 {
        self.sh.lock().durable_seq
    }

    pub fn stats(&self) -> JournalStats {
        let st = self.sh.lock();
        let c = &st.c;
        JournalStats {
            used_bytes: st.space.used,
            cap_bytes: self.sh.cfg.max_size,
            segments: st.space.segs.len() as u64,
            records_appended: c.records_appended,
            bytes_appended: c.bytes_appended,
            syncs: c.syncs,
            sync_calls: c.sync_calls,
            group_commit_max_batch: c.group_commit_max_batch,
            group_commit_max_writes: c.group_commit_max_writes,
            segments_freed: c.segments_freed,
            full_errors: c.full_errors,
            no_space_errors: c.no_space_errors,
            create_failures: st.create_failures,
            no_space: st.no_space.is_some() as u64,
            torn_tails: c.torn_tails,
            replayed_records: c.replayed_records,
            replayed_bytes: c.replayed_bytes,
            oldest_seq: st.space.segs.values().next().map_or(0, |s| s.first_seq),
            durable_seq: st.durable_seq,
            appended_seq: st.next_seq - 1,
            written_seq: st.written_seq,
        }
    }

    /// The data of a write found by `open`, read back and checked again.
    pub fn read_pending(&self, p: &PendingWrite) -> Result<Vec<u8>, JournalError> {
        let path = self.sh.seg_path(p.loc.seg);
        let damaged = |what: &str| JournalError::Damaged {
            path: path.clone(),
            offset: p.loc.off,
            what: what.into(),
        };
        let f = self
            .sh
            .files
            .lock()
            .get(&p.loc.seg)
            .cloned()
            .ok_or_else(|| damaged("segment already freed (DONE recorded before the read?)"))?;
        let plen = p.file.path.len();
        let mut buf = vec![0u8; HDR + DATA_FIXED + plen + p.len as usize];
        let n = io::read_at_most(&f, &mut buf, p.loc.off).map_err(io_err("read", &path))?;
        if n != buf.len() {
            return Err(damaged("record shorter than at open"));
        }
        let HeaderCheck::Ok(h) = format::parse_header(&buf) else {
            return Err(damaged("record header changed since open"));
        };
        let seed = format::seg_seed(&self.sh.uuid, p.loc.seg);
        if h.seq != p.seq || !format::crc_ok(seed, &buf[..HDR], &h, &buf[HDR..]) {
            return Err(damaged("record checksum mismatch on read-back"));
        }
        match format::decode(h.kind, &buf[HDR..]) {
            Ok(Decoded::Data {
                dev,
                ino,
                offset,
                path: rp,
                data,
            }) if dev == p.file.dev
                && ino == p.file.ino
                && offset == p.offset
                && rp == &p.file.path[..]
                && data.len() == p.len as usize => {}
            _ => return Err(damaged("record differs from the one found at open")),
        }
        buf.drain(..HDR + DATA_FIXED + plen);
        Ok(buf)
    }

    /// Writes and syncs everything appended, then stops the writer. Appends fail afterwards.
    pub fn shutdown(&self) {
        {
            let mut st = self.sh.lock();
            st.shutdown = true;
        }
        self.sh.writer_cv.notify_all();
        self.sh.drained_cv.notify_all();
        self.sh.space_cv.notify_all();
        if let Some(h) = self.writer.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The space the scanned segments take, and the DATA records no DONE/DROP covers.
pub(crate) fn pending_of(
    segs: BTreeMap<u64, space::SegInfo>,
    marks: rustc_hash::FxHashMap<Key, u64>,
    data: Vec<PendingWrite>,
    mut rp: Replay,
) -> (Space, Replay) {
    let mut space = Space {
        used: segs.values().map(|i| i.size).sum(),
        segs,
        ..Space::default()
    };
    let at_risk = damage::judge(&mut rp.damage, &data, &marks);
    for (k, upto) in marks {
        space.mark(k, upto);
    }
    let (lost, pending) = data
        .into_iter()
        .filter(|d| !space.covered(&(d.file.dev, d.file.ino), d.seq))
        .partition(|d| at_risk.contains(&(d.file.dev, d.file.ino)));
    rp.pending = pending;
    rp.lost = lost;
    rp.pending_bytes = rp.pending.iter().map(|p| p.len as u64).sum();
    rp.lost_bytes = rp.lost.iter().map(|p| p.len as u64).sum();
    (space, rp)
}

/// Puts a prepared record at the tail (which has room for it); returns its seq.
fn place(st: &mut State, p: &Prepared<'_>, len: u64) -> u64 {
    let (seg, off, seed, seq) = (st.tail.seg, st.tail.off, st.tail.seed, st.next_seq);
    st.next_seq += 1;
    st.tail.off += len;
    let run = st.run_for(seg, off);
    let hdr = run.buf.len();
    let open = format::put_head(&mut run.buf, seed, seq, p);
    match (&p.shared, open) {
        (Some(b), Some(partial_crc)) => run.shared.push(SharedPayload {
            pos: run.buf.len(),
            hdr,
            partial_crc,
            data: b.clone(),
        }),
        _ => run.buf.extend_from_slice(p.data),
    }
    run.len += len;
    run.last_seq = seq;
    run.records += 1;
    st.queued += len;
    st.c.records_appended += 1;
    st.c.bytes_appended += len;
    seq
}

/// Removes the journal's own files from `dir`. The superblock goes first: a wipe cut short by a
/// crash leaves segments without it, which `open` refuses, rather than a journal that has lost
/// its oldest segments and looks whole.
fn wipe(dir: &Path) -> Result<(), JournalError> {
    for name in [superblock::FILE, superblock::TMP] {
        let p = dir.join(name);
        match fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err("delete", &p)(e))
            }
            _ => {}
        }
    }
    io::sync_dir(dir).map_err(io_err("fsync", dir))?;
    for seg in replay::list_segments(dir)? {
        let p = dir.join(seg_name(seg));
        fs::remove_file(&p).map_err(io_err("delete", &p))?;
    }
    io::sync_dir(dir).map_err(io_err("fsync", dir))
}
