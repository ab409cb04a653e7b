//! What the appenders, the writer thread and the readers share: the batch waiting for the
//! writer, the segment being filled, space accounting (`Shared`, `State`).

use super::*;

/// Where the next record goes.
#[derive(Debug)]
pub(crate) struct Tail {
    pub(crate) seg: u64,
    pub(crate) off: u64,
    /// Whether `seg` has been started (has a `SegInfo`); after open it has not.
    pub(crate) open: bool,
    pub(crate) seed: u32,
}

/// Records placed in one segment, contiguous, waiting for the writer.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) seg: u64,
    pub(crate) off: u64,
    /// Bytes the run covers: `buf` plus the `shared` payloads.
    pub(crate) len: u64,
    /// Headers, payload prefixes, small payloads and SEALs.
    pub(crate) buf: Vec<u8>,
    /// Large DATA payloads, referred to rather than copied. The writer completes their
    /// headers' CRCs and writes `buf` and them interleaved with one pwritev.
    pub(crate) shared: Vec<SharedPayload>,
    /// Highest seq in `buf`.
    pub(crate) last_seq: u64,
    /// Caller records in `buf` (SEALs not counted).
    pub(crate) records: u64,
}

/// A DATA payload a run refers to (see `format::SHARE_MIN`).
#[derive(Debug)]
pub(crate) struct SharedPayload {
    /// Where in the run's `buf` the payload goes (the bytes before it precede it).
    pub(crate) pos: usize,
    /// Where its record's header starts in `buf`.
    pub(crate) hdr: usize,
    /// Its record's CRC over seed, header and prefix; the writer appends the data's.
    pub(crate) partial_crc: u32,
    pub(crate) data: bytes::Bytes,
}

pub(crate) struct State {
    pub(crate) next_seq: u64,
    pub(crate) tail: Tail,
    /// The batch being filled: what the writer takes next.
    pub(crate) runs: Vec<Run>,
    pub(crate) queued: u64,
    /// An append woke the writer for the batch being filled (see `append_inner`).
    pub(crate) woken: bool,
    /// Emptied batch buffers, kept for reuse (a 16 MiB allocation per batch costs page faults).
    pub(crate) spare: Vec<Vec<u8>>,
    pub(crate) space: Space,
    /// DONE/DROP records appended but not yet durable: (seq, file, upto). They count for
    /// freeing space only once durable, or a crash could leave data neither on the backing
    /// store nor in the journal.
    pub(crate) marks: VecDeque<(u64, Key, u64)>,
    pub(crate) written_seq: u64,
    pub(crate) durable_seq: u64,
    /// The segment the writer writes to; every segment below it is sealed and durable.
    pub(crate) writer_seg: u64,
    /// The highest seq a `sync` caller waits for.
    pub(crate) sync_want: u64,
    pub(crate) space_waiters: usize,
    /// The next segment file, created ahead of time (preallocated, its entry durable) by the
    /// writer: a roll goes only there, so a full cache device is found before any record is
    /// placed in a segment that cannot be made (`NoSpace` at append, never a failed journal).
    pub(crate) ready: Option<u64>,
    /// An append waits for `ready`: the writer tries to create it now.
    pub(crate) want_ready: bool,
    /// Failed attempts to create the next segment since open (each answers the appends that
    /// waited for it).
    pub(crate) create_failures: u64,
    /// Why the last attempt failed, while it has not succeeded since.
    pub(crate) no_space: Option<String>,
    /// The log said writes are refused for lack of room (and will say when it is back).
    pub(crate) no_space_said: bool,
    /// When the writer tries again by itself after a failed attempt.
    pub(crate) retry_at: Option<Instant>,
    pub(crate) failed: Option<String>,
    pub(crate) shutdown: bool,
    pub(crate) writer_done: bool,
    pub(crate) c: Counters,
}

impl State {
    pub(crate) fn usable(&self) -> Result<(), JournalError> {
        if let Some(m) = &self.failed {
            return Err(JournalError::Failed(m.clone()));
        }
        if self.shutdown {
            return Err(JournalError::Closed);
        }
        Ok(())
    }

    /// Whether a record of `len` bytes can be appended now without returning `Full`.
    pub(crate) fn fits(&self, len: u64, cfg: &JournalConfig) -> bool {
        self.fits_in_tail(len + MARK_ROOM, cfg)
            || self.space.used + cfg.segment_size <= cfg.max_size
    }

    /// Whether `len` bytes (and a SEAL after them) fit in the tail segment. DATA asks with
    /// `MARK_ROOM` added: that much of every segment is for DONE/DROP only.
    pub(crate) fn fits_in_tail(&self, len: u64, cfg: &JournalConfig) -> bool {
        self.tail.open && self.tail.off + len + SEAL_LEN <= cfg.segment_size
    }

    /// The buffer the record at (`seg`, `off`) goes into.
    pub(crate) fn run_for(&mut self, seg: u64, off: u64) -> &mut Run {
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
    pub(crate) fn next_seg(&self) -> u64 {
        if self.tail.open {
            self.tail.seg + 1
        } else {
            self.tail.seg
        }
    }

    /// Closes the tail segment with a SEAL (if it was started) and starts the next one, if
    /// its file is ready; false (nothing changed) if it is not.
    pub(crate) fn roll(&mut self, cfg: &JournalConfig, uuid: &[u8; 16]) -> bool {
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
    pub(crate) dir: PathBuf,
    pub(crate) cfg: JournalConfig,
    pub(crate) uuid: [u8; 16],
    pub(crate) st: Mutex<State>,
    /// Wakes the writer: records queued, a sync asked for, shutdown.
    pub(crate) writer_cv: Condvar,
    /// `durable_seq` moved, or the writer failed or stopped.
    pub(crate) durable_cv: Condvar,
    /// The writer took the batch (backpressure waiters).
    pub(crate) drained_cv: Condvar,
    /// Segments were freed.
    pub(crate) space_cv: Condvar,
    /// Open segment files, for the writer and `read_pending`.
    pub(crate) files: Mutex<BTreeMap<u64, Arc<File>>>,
    /// Asked for room on the cache device when the next segment cannot be created (the SSD
    /// tier gives back space): bytes wanted -> bytes freed.
    pub(crate) space_hook: Mutex<Option<SpaceHook>>,
}

/// See [`Journal::set_space_hook`].
pub type SpaceHook = Arc<dyn Fn(u64) -> u64 + Send + Sync>;

/// The end of every segment that DATA never takes: room for DONE/DROP records (48 bytes each,
/// some 1,300 of them) when the next segment cannot be created (a full cache device). Without
/// it a full tail could record no DONE, so no segment could be freed and the device would stay
/// full.
pub(crate) const MARK_ROOM: u64 = 64 << 10;

/// Bytes queued for the writer at which an append wakes it again (see `append_inner`).
pub(crate) fn wake_bytes(cfg: &JournalConfig) -> u64 {
    (cfg.max_buffer / 4).min(256 << 10)
}

/// How long a woken writer waits for more records before it takes the batch, unless someone
/// waits for a sync: short beside `sync_interval` and beside what a crash may lose anyway
/// (records not synced), long beside an append (a few microseconds).
pub(crate) const LINGER: Duration = Duration::from_millis(2);

/// How long an append waits for the writer to create the next segment file before it gives
/// up with `NoSpace` (normally the file exists long before it is needed).
pub(crate) const NEXT_SEGMENT_WAIT: Duration = Duration::from_secs(5);

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock()
    }

    pub(crate) fn seg_path(&self, seg: u64) -> PathBuf {
        self.dir.join(seg_name(seg))
    }

    /// Deletes the oldest segments whose data is all covered by durable DONE/DROP records, one
    /// at a time with a directory fsync after each: a crash must never leave an older segment
    /// whose covering DONE (in a newer one) is already gone.
    pub(crate) fn free_covered(&self) -> Result<(), JournalError> {
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
