//! The write-back journal: a durable, checksummed log of acknowledged writes whose data is not
//! yet on the backing store. Layout and rules: docs/writeback/journal.md, "Journal format".
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

mod config;
mod damage;
mod error;
mod format;
mod inspect;
mod io;
mod open;
mod pending;
mod record;
mod replay;
mod space;
mod state;
mod stats;
mod superblock;
mod writer;

#[cfg(test)]
mod tests;

pub use config::JournalConfig;
pub use damage::Damage;
pub use error::JournalError;
pub use format::{FileRef, Record, MAX_NS, MAX_PATH, NS_KEY};
pub use inspect::{JournalReport, JournalState};
pub use replay::{PendingNs, PendingWrite, Replay};
pub use stats::JournalStats;

#[cfg(test)]
use config::MIB;
use error::io_err;
use format::{Decoded, HeaderCheck, Prepared, DATA_FIXED, HDR, SEAL_LEN};
use parking_lot::{Condvar, Mutex, MutexGuard};
use replay::seg_name;
use space::{Key, Space};
use state::*;
use stats::Counters;
use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The write-back journal of one cache directory. `Send + Sync`; share it by reference or `Arc`.
pub struct Journal {
    sh: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Journal {
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
