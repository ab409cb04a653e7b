use std::time::Duration;

/// Tunables of the filesystem core. Defaults, units and reasons are in docs/tunables.md.
#[derive(Clone, Debug)]
pub struct FsConfig {
    /// Size of a cached block, bytes (`ram.block_size`).
    pub block_size: u64,
    /// Byte cap of the RAM tier (`ram.max`).
    pub ram_max: u64,
    /// The longest attributes, listings and a file's fingerprint are trusted before the
    /// backing store is asked again (`meta.ttl`); how long within it follows how long the
    /// object has gone unchanged (`MetaCache::trust`).
    pub meta_ttl: Duration,
    /// How long a store that can hang (`Store::may_hang`) is waited for on a call a cache
    /// can answer for, before what is cached is served (`store.timeout`; zero: for ever).
    pub store_timeout: Duration,
    /// How long a record of an object that just changed is trusted (`meta.ttl_min`); None:
    /// [`FsConfig::ttl_min`] decides.
    pub meta_ttl_min: Option<Duration>,
    /// Close-to-open: every open asks the backing store whether the file changed
    /// (`meta.cto`). Off: an open within `meta.ttl` of the last check trusts the cache.
    pub meta_cto: bool,
    /// Bound on cached attribute records and listing entries (`meta.max_entries`).
    pub meta_max_entries: usize,
    /// Largest sequential read-ahead window, bytes (`readahead.max`); 0 disables read-ahead.
    pub readahead_max: u64,
    /// Largest single read from the backing store, bytes (`readahead.chunk`).
    pub fetch_chunk: u64,
    /// Threads that run read-ahead fetches (`readahead.threads`).
    pub readahead_threads: usize,
    /// Most backing reads one sequential stream keeps in flight (`readahead.depth`; the
    /// stream measures how many pay, see `stream_depth.rs`).
    pub readahead_depth: u32,
    /// FUSE no-open (`fuse.no_open`): None follows `meta.cto` (on when it is off).
    pub fuse_no_open: Option<bool>,
    /// Files loaded ahead of a walk of a directory in listing order (`prefetch.files`); 0
    /// turns it off.
    pub prefetch_files: usize,
    /// Largest file loaded ahead of a walk, bytes (`prefetch.max_file`).
    pub prefetch_max_file: u64,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            block_size: 64 * 1024,
            ram_max: 1 << 30,
            meta_ttl: Duration::from_secs(60),
            store_timeout: Duration::from_secs(5),
            meta_ttl_min: None,
            meta_cto: true,
            meta_max_entries: 1 << 20,
            readahead_max: 16 << 20,
            fetch_chunk: 4 << 20,
            readahead_threads: 8,
            readahead_depth: 4,
            fuse_no_open: None,
            prefetch_files: 16,
            prefetch_max_file: 1 << 20,
        }
    }
}

/// `meta.ttl_min` with close-to-open: NFS's `acregmin`.
pub const TTL_MIN_CTO: Duration = Duration::from_secs(3);

impl FsConfig {
    /// `meta.ttl_min` in force: as given; else 3 s with close-to-open (every open asks the
    /// store anyway: the trust only serves `stat` and `readdir`), and `meta.ttl` without it,
    /// where the user chose how stale a read may be and every record is trusted that long.
    pub fn ttl_min(&self) -> Duration {
        self.ttl_min_setting()
            .unwrap_or(self.meta_ttl)
            .min(self.meta_ttl)
    }

    /// [`FsConfig::ttl_min`] for the metadata cache: None follows `meta.ttl` (also when
    /// `tierfs ctl` changes it).
    pub fn ttl_min_setting(&self) -> Option<Duration> {
        match (self.meta_ttl_min, self.meta_cto) {
            (Some(m), _) => Some(m),
            (None, true) => Some(TTL_MIN_CTO),
            (None, false) => None,
        }
    }

    /// Whether the kernel is told that opening a file needs no reply (FUSE no-open): then
    /// open(2) and close(2) of a file cost no round trip. Only without close-to-open
    /// (`meta.cto=off`): an open is where close-to-open revalidates. The file's data is then
    /// revalidated by attribute age (`meta.ttl`) like everything else. `fuse.no_open=off`
    /// keeps OPEN requests with `meta.cto=off` (answered from the metadata cache, no store
    /// I/O), so that files opened for writing only can be given direct I/O.
    pub fn no_open(&self) -> bool {
        !self.meta_cto && self.fuse_no_open.unwrap_or(true)
    }
}
