//! [`SharedCache`]: reads of chunks from the shared tier, verified, and the background
//! uploads of what the origin gave, paced and bounded so that they never delay a reader.
//!
//! What the upload queue cannot take (its bytes are memory) is not lost for the fleet: its
//! name waits in a list, and the chunk is read back from this host's SSD tier when the
//! uploads catch up ([`ChunkSource`]); only a chunk that tier no longer holds goes unsent.
//!
//! The tier is a help, never a dependency: an error, a deadline passed or a server away makes
//! it "down" for `backoff` (one log line for the episode, `shared.down` 1), during which
//! reads go straight to the origin and nothing is uploaded; the first call after that tries
//! again. A chunk that fails its checksum or names another version is counted and never
//! served: the reader goes to the origin, and the good chunk it reads there replaces it.

use super::{format, ChunkName, SharedStore};
use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct SharedConfig {
    /// Key prefix inside the bucket (no leading `/`).
    pub prefix: String,
    /// [`super::origin_hash`] of the origin's name.
    pub origin: u64,
    /// Bytes of a file one chunk holds (`shared.chunk`): a multiple of the block size.
    pub chunk_size: u32,
    /// Bytes per second the uploads may take, 0 for no limit (`shared.write_rate`).
    pub write_rate: u64,
    /// Bytes of chunks waiting for upload at most; past it a chunk is not uploaded (counted).
    pub queue_bytes: u64,
    /// How long the origin is read alone after the tier failed (`shared.backoff`).
    pub backoff: Duration,
    /// Uploads in flight at once.
    pub put_threads: usize,
}

/// Where a chunk whose upload had to wait is read back from (the SSD tier, through the
/// filesystem that knows its keys): the chunk's data, if every block of it is still there.
pub trait ChunkSource: Send + Sync + 'static {
    fn chunk(&self, name: &ChunkName) -> Option<Bytes>;
}

/// Names of chunks waiting for a late upload at most (80 bytes each).
const LATER_MAX: usize = 1 << 18;

/// How long a late upload waits for its chunk to be whole in the SSD tier.
const LATE_PATIENCE: Duration = Duration::from_secs(30);

/// Counters of the shared tier (`tierfs stats`, Prometheus `tierfs_shared_*`).
#[derive(Default, Debug)]
pub struct SharedStats {
    /// Chunks asked for, and of them found whole and of the version asked.
    pub gets: AtomicU64,
    pub hits: AtomicU64,
    pub hit_bytes: AtomicU64,
    /// Not in the tier (read from the origin, then uploaded).
    pub misses: AtomicU64,
    /// Found but damaged or of another name: never served.
    pub corrupt: AtomicU64,
    /// Requests that failed or passed their deadline.
    pub errors: AtomicU64,
    /// Chunks not asked for because the tier was down.
    pub skipped: AtomicU64,
    /// Uploads done, their bytes, failed, and not made (queue full, or the tier down).
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub put_errors: AtomicU64,
    pub put_dropped: AtomicU64,
    /// 1 while the tier is taken for down.
    pub down: AtomicU64,
    /// Times it went down.
    pub episodes: AtomicU64,
    /// Bytes waiting for upload.
    pub queued_bytes: AtomicU64,
    /// Chunks waiting for a late upload from the SSD tier, and late uploads read back.
    pub later: AtomicU64,
    pub late_puts: AtomicU64,
}

/// [`SharedStats`] at one moment, with where the tier is (see [`SharedCache::snapshot`]).
#[derive(Default, Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SharedSnapshot {
    pub at: String,
    pub chunk_size: u64,
    pub gets: u64,
    pub hits: u64,
    pub hit_bytes: u64,
    pub misses: u64,
    pub corrupt: u64,
    pub errors: u64,
    pub skipped: u64,
    pub puts: u64,
    pub put_bytes: u64,
    pub put_errors: u64,
    pub put_dropped: u64,
    pub down: u64,
    pub episodes: u64,
    pub queued_bytes: u64,
    #[serde(default)]
    pub later: u64,
    #[serde(default)]
    pub late_puts: u64,
}

struct Inner {
    store: Arc<dyn SharedStore>,
    cfg: SharedConfig,
    stats: SharedStats,
    down_until: Mutex<Option<Instant>>,
    /// Chunks the queue could not take, uploaded from `source` once it is empty.
    later: Mutex<std::collections::VecDeque<(ChunkName, Instant)>>,
    source: std::sync::OnceLock<Arc<dyn ChunkSource>>,
    /// Chunks just found missing or damaged, and when (see [`ABSENT_FOR`]).
    absent: Mutex<std::collections::HashMap<ChunkName, Instant>>,
}

/// How long a chunk the tier did not have (or had damaged) is taken as absent without asking
/// again: an open asks for a file's first chunk before deciding whether to open it at the
/// origin (`tierfs_fs`'s `start_from_shared`), and its first read would ask again a moment
/// later. Short: another host may put it meanwhile, and missing it costs one origin read.
const ABSENT_FOR: Duration = Duration::from_secs(5);
/// The most chunks remembered absent (a bound on memory; the oldest go first).
const ABSENT_MAX: usize = 4096;

impl Inner {
    /// Whether `name` was found absent or damaged within [`ABSENT_FOR`].
    fn known_absent(&self, name: &ChunkName) -> bool {
        self.absent
            .lock()
            .get(name)
            .is_some_and(|t| t.elapsed() < ABSENT_FOR)
    }

    fn note_absent(&self, name: ChunkName) {
        let mut a = self.absent.lock();
        if a.len() >= ABSENT_MAX {
            a.retain(|_, t| t.elapsed() < ABSENT_FOR);
            if a.len() >= ABSENT_MAX {
                a.clear();
            }
        }
        a.insert(name, Instant::now());
    }
}

/// The shared tier as the data path uses it (see the module documentation).
pub struct SharedCache {
    inner: Arc<Inner>,
    queue: Sender<(ChunkName, Bytes)>,
}

impl SharedCache {
    pub fn new(store: Arc<dyn SharedStore>, cfg: SharedConfig) -> Arc<SharedCache> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let inner = Arc::new(Inner {
            store,
            stats: SharedStats::default(),
            down_until: Mutex::new(None),
            later: Mutex::new(Default::default()),
            source: std::sync::OnceLock::new(),
            absent: Mutex::new(Default::default()),
            cfg,
        });
        let pacer = Arc::new(Mutex::new(Instant::now()));
        for i in 0..inner.cfg.put_threads.max(1) {
            let (inner, rx, pacer) = (inner.clone(), rx.clone(), pacer.clone());
            let _ = std::thread::Builder::new()
                .name(format!("tierfs-shared-{i}"))
                .spawn(move || uploader(&inner, &rx, &pacer));
        }
        Arc::new(SharedCache { inner, queue: tx })
    }

    /// Starts an episode as if a request had failed with `e` (a bucket that did not answer
    /// at mount): reads go to the origin until the back-off is over.
    pub fn mark_failed(&self, e: &str) {
        self.inner.failed(e);
    }

    /// Where late uploads read chunks back from (see [`ChunkSource`]).
    pub fn set_source(&self, source: Arc<dyn ChunkSource>) {
        let _ = self.inner.source.set(source);
    }

    pub fn config(&self) -> &SharedConfig {
        &self.inner.cfg
    }

    pub fn stats(&self) -> &SharedStats {
        &self.inner.stats
    }

    pub fn describe(&self) -> String {
        self.inner.store.describe()
    }

    /// The name of chunk `idx` of the object `ident` in the version given.
    pub fn name(
        &self,
        ident: (u64, u64),
        size: u64,
        mtime_ns: i64,
        ctime_ns: i64,
        idx: u64,
    ) -> ChunkName {
        ChunkName {
            origin: self.inner.cfg.origin,
            ident,
            size,
            mtime_ns,
            ctime_ns,
            idx,
            chunk_size: self.inner.cfg.chunk_size,
        }
    }

    /// The data of each chunk, where the tier holds it whole and intact; None elsewhere (not
    /// there, damaged, the tier down or failing: the caller reads the origin).
    pub fn get_many(&self, names: &[ChunkName]) -> Vec<Option<Bytes>> {
        let st = &self.inner.stats;
        if names.is_empty() {
            return Vec::new();
        }
        if !self.inner.usable() {
            st.skipped.fetch_add(names.len() as u64, Relaxed);
            return vec![None; names.len()];
        }
        // Chunks found absent a moment ago are not asked for again (see `ABSENT_FOR`); they
        // count nowhere now (they were counted when found absent).
        let ask: Vec<usize> = (0..names.len())
            .filter(|&i| !self.inner.known_absent(&names[i]))
            .collect();
        let mut out = vec![None; names.len()];
        if ask.is_empty() {
            return out;
        }
        st.gets.fetch_add(ask.len() as u64, Relaxed);
        let prefix = &self.inner.cfg.prefix;
        let keys: Vec<String> = ask.iter().map(|&i| names[i].key(prefix)).collect();
        let got = self.inner.store.get_many(&keys);
        let mut failed = None;
        for (&i, r) in ask.iter().zip(got) {
            let n = &names[i];
            out[i] = match r {
                Ok(Some(obj)) => {
                    let (s, e) = n.range();
                    match format::decode(n, &obj) {
                        Ok(d) if d.len() as u64 == e - s => {
                            st.hits.fetch_add(1, Relaxed);
                            st.hit_bytes.fetch_add(d.len() as u64, Relaxed);
                            Some(d)
                        }
                        other => {
                            st.corrupt.fetch_add(1, Relaxed);
                            tracing::warn!(
                                "shared tier: {} not served ({:?}); reading the origin",
                                n.key(prefix),
                                other.err().unwrap_or(format::Invalid::Checksum)
                            );
                            self.inner.note_absent(*n);
                            None
                        }
                    }
                }
                Ok(None) => {
                    st.misses.fetch_add(1, Relaxed);
                    self.inner.note_absent(*n);
                    None
                }
                Err(e) => {
                    st.errors.fetch_add(1, Relaxed);
                    failed = Some(e);
                    None
                }
            };
        }
        match failed {
            Some(e) => self.inner.failed(&e),
            None => self.inner.answered(),
        }
        out
    }

    /// Uploads chunk `name` with `data` (what the origin gave for it) in the background, if
    /// the queue has room and the tier is up; never waits.
    pub fn offer(&self, name: ChunkName, data: Bytes) {
        let st = &self.inner.stats;
        self.inner.absent.lock().remove(&name);
        let len = data.len() as u64;
        let queued = st.queued_bytes.load(Relaxed);
        if !self.inner.usable() {
            st.put_dropped.fetch_add(1, Relaxed);
            return;
        }
        if queued + len > self.inner.cfg.queue_bytes {
            self.inner.defer(name);
            return;
        }
        st.queued_bytes.fetch_add(len, Relaxed);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.queue.try_send((name, data))
        {
            st.queued_bytes.fetch_sub(len, Relaxed);
            st.put_dropped.fetch_add(1, Relaxed);
        }
    }

    /// The counters as `tierfs stats` shows them (`shared.*`).
    pub fn snapshot(&self) -> SharedSnapshot {
        let st = &self.inner.stats;
        let g = |c: &AtomicU64| c.load(Relaxed);
        SharedSnapshot {
            at: self.describe(),
            chunk_size: self.inner.cfg.chunk_size as u64,
            gets: g(&st.gets),
            hits: g(&st.hits),
            hit_bytes: g(&st.hit_bytes),
            misses: g(&st.misses),
            corrupt: g(&st.corrupt),
            errors: g(&st.errors),
            skipped: g(&st.skipped),
            puts: g(&st.puts),
            put_bytes: g(&st.put_bytes),
            put_errors: g(&st.put_errors),
            put_dropped: g(&st.put_dropped),
            down: g(&st.down),
            episodes: g(&st.episodes),
            queued_bytes: g(&st.queued_bytes),
            later: g(&st.later),
            late_puts: g(&st.late_puts),
        }
    }

    /// Waits until every upload queued so far is done (or dropped), at most `limit`: for
    /// `tierfs unmount`, so what this host read is there for the next one.
    pub fn drain(&self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let st = &self.inner.stats;
        while st.queued_bytes.load(Relaxed) > 0 || st.later.load(Relaxed) > 0 {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl Inner {
    /// Keeps `name` for a late upload, if there is a source to read it back from and room.
    fn defer(&self, name: ChunkName) {
        let mut later = self.later.lock();
        if self.source.get().is_none() || later.len() >= LATER_MAX {
            self.stats.put_dropped.fetch_add(1, Relaxed);
            return;
        }
        later.push_back((name, Instant::now()));
        self.stats.later.fetch_add(1, Relaxed);
    }

    /// The next late upload: a chunk read back from the source (None: none left to do, or
    /// the one tried is not readable yet). A chunk the source cannot give whole yet (the SSD
    /// tier writes what it admits a moment later) is tried again for [`LATE_PATIENCE`],
    /// then given up (counted as dropped).
    fn take_later(&self) -> Option<(ChunkName, Bytes)> {
        let (name, since) = self.later.lock().pop_front()?;
        match self.source.get().and_then(|s| s.chunk(&name)) {
            // Still counted in `later` until its upload is over (see `uploader`).
            Some(data) => Some((name, data)),
            None if since.elapsed() < LATE_PATIENCE => {
                self.later.lock().push_back((name, since));
                None
            }
            None => {
                self.stats.later.fetch_sub(1, Relaxed);
                self.stats.put_dropped.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Whether to ask the tier now: not while an episode's back-off runs.
    fn usable(&self) -> bool {
        match *self.down_until.lock() {
            Some(t) => Instant::now() >= t,
            None => true,
        }
    }

    /// An error or a deadline: down for `backoff` (one log line an episode). The state and
    /// the deadline change together, under the lock.
    fn failed(&self, e: &str) {
        let mut until = self.down_until.lock();
        *until = Some(Instant::now() + self.cfg.backoff);
        if self.stats.down.swap(1, Relaxed) == 0 {
            self.stats.episodes.fetch_add(1, Relaxed);
            tracing::warn!(
                "shared tier {} failing ({e}): reading from the origin, trying it again every {:?}",
                self.store.describe(),
                self.cfg.backoff
            );
        }
    }

    /// A request that succeeded ends an episode only once its back-off is over: one sent
    /// before the failure and answered after it says nothing of the tier now.
    fn answered(&self) {
        let mut until = self.down_until.lock();
        if matches!(*until, Some(t) if Instant::now() < t) {
            return;
        }
        if self.stats.down.swap(0, Relaxed) == 1 {
            *until = None;
            tracing::info!("shared tier {} answers again", self.store.describe());
        }
    }
}

/// An upload thread: takes queued chunks, paced to `write_rate` across all threads.
fn uploader(inner: &Inner, rx: &Receiver<(ChunkName, Bytes)>, pacer: &Mutex<Instant>) {
    let st = &inner.stats;
    loop {
        // Queued chunks first; with none, a late one read back from the SSD tier.
        let (name, data, queued) = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((n, d)) => (n, d, true),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if !inner.usable() {
                    continue;
                }
                match inner.take_later() {
                    None => continue,
                    Some((n, d)) => (n, d, false),
                }
            }
        };
        let len = data.len() as u64;
        if inner.cfg.write_rate > 0 {
            // Each upload takes its slot of time; a thread waits for its own.
            let at = {
                let mut next = pacer.lock();
                let now = Instant::now();
                let start = (*next).max(now);
                *next = start + Duration::from_secs_f64(len as f64 / inner.cfg.write_rate as f64);
                start
            };
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
        }
        if inner.usable() {
            let obj = format::encode(&name, &data);
            match inner.store.put(&name.key(&inner.cfg.prefix), obj) {
                Ok(()) => {
                    st.puts.fetch_add(1, Relaxed);
                    st.put_bytes.fetch_add(len, Relaxed);
                    if !queued {
                        st.late_puts.fetch_add(1, Relaxed);
                    }
                    inner.answered();
                }
                Err(e) => {
                    st.put_errors.fetch_add(1, Relaxed);
                    inner.failed(&e);
                }
            }
        } else {
            st.put_dropped.fetch_add(1, Relaxed);
        }
        // Counted as waiting until now, so that a drain (unmount, a test) does not see
        // nothing left while an upload is still in flight.
        if queued {
            st.queued_bytes.fetch_sub(len, Relaxed);
        } else {
            st.later.fetch_sub(1, Relaxed);
        }
    }
}
