//! The writer thread: drains batches, creates segments, fdatasyncs, frees covered segments.
//!
//! Group commit: appends accumulate in `State::runs` while the writer is busy writing or
//! syncing; it then takes all of them at once, writes each run (records of one segment) with
//! one positioned write, and issues one fdatasync that answers every `sync` caller waiting.
//!
//! Rollover barrier: before the first byte goes into segment N+1, segment N (ending in its SEAL)
//! is fdatasynced. So once a newer segment exists, every older one is complete on disk, and a
//! segment that is not the last and lacks its SEAL is damage, not a crash.

use super::error::io_err;
use super::{format, io, JournalError, Run, Shared};
use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

/// Batch buffers kept for reuse.
const SPARE_BUFFERS: usize = 4;

/// Every this many bytes written to a segment, writeback of them is started, and the range
/// started the time before (clean by now, as a rule) is dropped from the page cache.
///
/// Why: the journal is written through the page cache and read only at replay, so its pages
/// are pure cost: a streaming write-back job would otherwise fill as much page cache as it
/// writes (evicting the pages users want), and on a VM whose free memory goes back to the
/// host, every fresh page is slow to touch (FUSE-NOTES lesson 8). Recycled, the journal runs
/// in a few dozen MiB of hot pages; the periodic fdatasync also has less left to write.
const RECYCLE_EVERY: u64 = 16 << 20;

struct Writer {
    sh: Arc<Shared>,
    /// The segment being written and its file.
    cur: Option<(u64, Arc<File>)>,
    unsynced: bool,
    written_seq: u64,
    durable_seq: u64,
    /// Caller records written / made durable, and writes issued since the last fdatasync.
    written_records: u64,
    synced_records: u64,
    writes_since_sync: u64,
    last_sync: Instant,
    /// The segment the writer was in at the last free pass.
    freed_at_seg: u64,
    /// In the current segment: where the bytes not yet handed to writeback start, and the
    /// range handed over last time (dropped from the page cache at the next hand-over).
    recycle_from: u64,
    recycle_prev: (u64, u64),
}

pub(crate) fn run(sh: Arc<Shared>) {
    let seq = sh.lock().durable_seq;
    let mut w = Writer {
        sh,
        cur: None,
        unsynced: false,
        written_seq: seq,
        durable_seq: seq,
        written_records: 0,
        synced_records: 0,
        writes_since_sync: 0,
        last_sync: Instant::now(),
        freed_at_seg: 0,
        recycle_from: 0,
        recycle_prev: (0, 0),
    };
    let res = w.main();
    let mut st = w.sh.lock();
    if let Err(e) = res {
        // Nothing written after a failed write or fdatasync can be trusted to be durable
        // (the kernel may have dropped the dirty pages): refuse all further work.
        tracing::error!("{e}");
        st.failed = Some(e.to_string());
    }
    st.writer_done = true;
    drop(st);
    w.sh.durable_cv.notify_all();
    w.sh.drained_cv.notify_all();
    w.sh.space_cv.notify_all();
}

/// Whether the writer should create the next segment's file now: none is ready, and either
/// nothing failed since the last one was taken (ahead of time), or an append waits for it.
fn ready_needed(st: &super::State) -> bool {
    st.ready.is_none()
        && !st.shutdown
        && (st.want_ready
            || st.no_space.is_none()
            || st.retry_at.is_some_and(|t| Instant::now() >= t))
}

/// After a failed attempt, the writer tries again by itself this often (an append that needs
/// the segment does not wait for it): the journal notices room coming back.
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Writer {
    fn main(&mut self) -> Result<(), JournalError> {
        loop {
            let runs = {
                let mut st = self.sh.lock();
                loop {
                    if !st.runs.is_empty() || self.must_sync(&st) || ready_needed(&st) {
                        break;
                    }
                    if st.shutdown {
                        return Ok(());
                    }
                    let wait = self.sh.cfg.sync_interval;
                    self.sh.writer_cv.wait_for(&mut st, wait);
                }
                if st.woken {
                    // Woken by an append: let the ones right behind it join the batch, unless
                    // someone waits (a sync, an append short of room: they wake us again).
                    let until = Instant::now() + super::LINGER;
                    while !self.must_sync(&st)
                        && st.sync_want <= self.written_seq
                        && st.queued < super::wake_bytes(&self.sh.cfg)
                        && st.space_waiters == 0
                        && !st.shutdown
                        && !self.sh.writer_cv.wait_until(&mut st, until).timed_out()
                    {
                    }
                }
                st.woken = false;
                st.queued = 0;
                std::mem::take(&mut st.runs)
            };
            self.sh.drained_cv.notify_all();

            let mut spare = Vec::new();
            for mut run in runs {
                self.write_run(&mut run)?;
                let mut buf = run.buf;
                buf.clear();
                drop(run.shared);
                spare.push(buf);
            }
            let need = {
                let mut st = self.sh.lock();
                st.written_seq = self.written_seq;
                while st.spare.len() < SPARE_BUFFERS {
                    match spare.pop() {
                        Some(b) => st.spare.push(b),
                        None => break,
                    }
                }
                self.must_sync(&st)
            };
            if need {
                self.sync_cur()?;
            }
            if ready_needed(&self.sh.lock()) {
                self.make_ready();
            }
            // Segments become freeable when DONEs become durable, and when the writer moves
            // past a segment whose data was already covered.
            let applied = self.publish();
            let seg = self.cur.as_ref().map_or(0, |c| c.0);
            if applied || seg != self.freed_at_seg {
                self.freed_at_seg = seg;
                self.sh.free_covered()?;
            }
        }
    }

    /// Whether to fdatasync now: something written is not durable, and someone waits for it,
    /// or DONEs are needed to free space for a waiter, or it has been `sync_interval`.
    fn must_sync(&self, st: &super::State) -> bool {
        self.written_seq > self.durable_seq
            && (st.sync_want > self.durable_seq
                || st.shutdown
                || (st.space_waiters > 0 && !st.marks.is_empty())
                || self.last_sync.elapsed() >= self.sh.cfg.sync_interval)
    }

    fn write_run(&mut self, run: &mut Run) -> Result<(), JournalError> {
        if self.cur.as_ref().map(|c| c.0) != Some(run.seg) {
            if self.unsynced {
                self.sync_cur()?;
            }
            // Created ahead of time (`make_ready`): appenders roll only into a ready file.
            let f = self.sh.files.lock().get(&run.seg).cloned().ok_or_else(|| {
                JournalError::Failed(format!(
                    "records placed in segment {}, whose file was never created",
                    run.seg
                ))
            })?;
            self.cur = Some((run.seg, f));
            self.recycle_from = run.off;
            self.recycle_prev = (run.off, 0);
            self.sh.lock().writer_seg = run.seg;
        }
        let (seg, f) = self.cur.as_ref().expect("current segment set above");
        // The callers did not wait for their payloads' checksums: complete the headers.
        for sp in &run.shared {
            format::finish_crc(&mut run.buf, sp.hdr, sp.partial_crc, &sp.data);
        }
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * run.shared.len() + 1);
        let mut at = 0;
        for sp in &run.shared {
            parts.push(&run.buf[at..sp.pos]);
            parts.push(&sp.data);
            at = sp.pos;
        }
        parts.push(&run.buf[at..]);
        io::write_parts_at(f, &parts, run.off).map_err(io_err("write", &self.sh.seg_path(*seg)))?;
        let end = run.off + run.len;
        if end >= self.recycle_from + RECYCLE_EVERY {
            let (prev_off, prev_len) = self.recycle_prev;
            io::drop_cached(f, prev_off, prev_len);
            io::start_writeback(f, self.recycle_from, end - self.recycle_from);
            self.recycle_prev = (self.recycle_from, end - self.recycle_from);
            self.recycle_from = end;
        }
        self.unsynced = true;
        self.written_seq = run.last_seq;
        self.written_records += run.records;
        self.writes_since_sync += 1;
        Ok(())
    }

    /// Creates the next segment's file ahead of the roll that needs it. If the cache device
    /// has no room, asks the space hook (the SSD tier) to give some back and tries once more;
    /// if it still fails, the partial file is removed, the failure recorded (the appends that
    /// waited get `NoSpace`, i.e. ENOSPC at write(2)), and the journal goes on in its current
    /// segment: the next append that needs a new one makes the writer try again.
    fn make_ready(&mut self) {
        let (seg, wanted) = {
            let mut st = self.sh.lock();
            (st.next_seg(), std::mem::take(&mut st.want_ready))
        };
        let mut res = self.create(seg);
        if res.is_err() {
            let hook = self.sh.space_hook.lock().clone();
            if let Some(hook) = hook {
                let freed = hook(2 * self.sh.cfg.segment_size);
                if freed > 0 {
                    tracing::info!(
                        "write-back journal: the SSD tier gave back {freed} bytes for the next segment"
                    );
                    res = self.create(seg);
                }
            }
        }
        let mut st = self.sh.lock();
        match res {
            Ok(()) => {
                st.ready = Some(seg);
                st.no_space = None;
                st.retry_at = None;
                if std::mem::take(&mut st.no_space_said) {
                    tracing::warn!(
                        "write-back journal: room on the cache device again; writes are taken again"
                    );
                }
            }
            Err(e) => {
                st.create_failures += 1;
                // Said once, and only when a write was refused for it: the attempt made ahead
                // of time fails quietly (segments being freed may make room by the next roll).
                if wanted && !st.no_space_said {
                    st.no_space_said = true;
                    tracing::error!(
                        "write-back journal: {e}: writes that need a new segment fail with ENOSPC until the cache device has room (the journal is intact; it retries at each such write)"
                    );
                }
                st.no_space = Some(e.to_string());
                st.retry_at = Some(Instant::now() + RETRY_EVERY);
            }
        }
        drop(st);
        self.sh.space_cv.notify_all();
    }

    /// Creates segment `seg`: preallocated, and its directory entry durable before any record
    /// in it can be reported durable (fdatasync of the file does not cover the entry). On
    /// failure nothing is left behind: a partial preallocation would hold the space it took.
    fn create(&self, seg: u64) -> Result<(), JournalError> {
        let path = self.sh.seg_path(seg);
        // A file under the next number can only be left by an attempt that failed halfway.
        let _ = std::fs::remove_file(&path);
        let made = (|| {
            let f = crate::private::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(io_err("create", &path))?;
            io::preallocate(&f, self.sh.cfg.segment_size).map_err(io_err("fallocate", &path))?;
            f.sync_all().map_err(io_err("fsync", &path))?;
            io::sync_dir(&self.sh.dir).map_err(io_err("fsync", &self.sh.dir))?;
            Ok::<File, JournalError>(f)
        })();
        match made {
            Ok(f) => {
                self.sh.files.lock().insert(seg, Arc::new(f));
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                let _ = io::sync_dir(&self.sh.dir);
                Err(e)
            }
        }
    }

    fn sync_cur(&mut self) -> Result<(), JournalError> {
        if let (Some((seg, f)), true) = (&self.cur, self.unsynced) {
            io::fdatasync(f).map_err(io_err("fdatasync", &self.sh.seg_path(*seg)))?;
            // All of it is clean now.
            io::drop_cached(f, 0, 0);
            self.recycle_prev = (self.recycle_from, 0);
            self.unsynced = false;
            self.durable_seq = self.written_seq;
            self.last_sync = Instant::now();
            let batch = self.written_records - self.synced_records;
            self.synced_records = self.written_records;
            let writes = std::mem::take(&mut self.writes_since_sync);
            let mut st = self.sh.lock();
            st.c.syncs += 1;
            st.c.group_commit_max_batch = st.c.group_commit_max_batch.max(batch);
            st.c.group_commit_max_writes = st.c.group_commit_max_writes.max(writes);
        }
        Ok(())
    }

    /// Publishes `durable_seq`, wakes `sync` callers, and applies the DONE/DROP records that
    /// became durable. Says whether any were applied (segments may be freeable).
    fn publish(&self) -> bool {
        let mut st = self.sh.lock();
        if st.durable_seq == self.durable_seq {
            return false;
        }
        st.durable_seq = self.durable_seq;
        let mut applied = false;
        while let Some(&(seq, key, upto)) = st.marks.front() {
            if seq > self.durable_seq {
                break;
            }
            st.marks.pop_front();
            st.space.mark(key, upto);
            applied = true;
        }
        drop(st);
        self.sh.durable_cv.notify_all();
        applied
    }
}
