use std::time::Duration;

/// Tunables of the filesystem core. Defaults, units and reasons are in docs/tunables.md.
#[derive(Clone, Debug)]
pub struct FsConfig {
    /// Size of a cached block, bytes (`ram.block_size`).
    pub block_size: u64,
    /// Byte cap of the RAM tier (`ram.max`).
    pub ram_max: u64,
    /// How long attributes and a file's fingerprint are trusted before asking the backing
    /// store again (`meta.ttl`).
    pub meta_ttl: Duration,
    /// Largest sequential read-ahead window, bytes (`readahead.max`); 0 disables read-ahead.
    pub readahead_max: u64,
    /// Largest single read from the backing store, bytes (`readahead.chunk`).
    pub fetch_chunk: u64,
    /// Threads that run read-ahead fetches (`readahead.threads`).
    pub readahead_threads: usize,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            block_size: 64 * 1024,
            ram_max: 1 << 30,
            meta_ttl: Duration::from_secs(1),
            readahead_max: 16 << 20,
            fetch_chunk: 4 << 20,
            readahead_threads: 4,
        }
    }
}
