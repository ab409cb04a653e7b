//! foyer's HybridCache as every command opens it (the options from the command line), the
//! deterministic values written and checked, inserts paced so that foyer drops nothing, and
//! the bench directory's helpers.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Result;
use foyer::{
    BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder, HybridCachePolicy,
    PsyncIoEngineConfig, RecoverMode,
};


pub(crate) type Cache = HybridCache<u64, Vec<u8>>;

/// Back-pressure window: bytes handed to insert() but not yet written to the device.
/// Must stay below the flusher buffer (buffer_pool_size / flushers), or foyer drops entries.
pub(crate) const WINDOW: usize = 16 * MIB;
pub(crate) const KIB: usize = 1024;
pub(crate) const MIB: usize = 1024 * 1024;
pub(crate) const GIB: usize = 1024 * MIB;

#[derive(Clone)]
pub(crate) struct Opts {
    pub(crate) dir: PathBuf,
    pub(crate) disk: usize,
    pub(crate) mem: usize,
    pub(crate) direct: bool,
    pub(crate) queue_threshold: usize,
    pub(crate) buffer_pool: usize,
    pub(crate) seconds: f64,
}

/// Deterministic value for a key: length and content derive from the key only.
pub(crate) fn value_for(key: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let mut x = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    v
}

pub(crate) fn small_len(key: u64) -> usize {
    // 512 B ..= 4 KiB, deterministic per key
    let h = key.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 32;
    512 + (h as usize % (4 * KIB - 512 + 1))
}

/// Bytes one entry occupies in foyer's flush buffer and on disk: every entry is aligned up to 4 KiB
/// (foyer-storage src/engine/block/buffer.rs `aligned = bits::align_up(PAGE, len)`).
pub(crate) fn disk_footprint(value_len: usize) -> u64 {
    let len = 40 + 8 + 8 + value_len;
    (len.div_ceil(4096) * 4096) as u64
}

pub(crate) async fn open(o: &Opts, recover: RecoverMode) -> Result<Cache> {
    let device = FsDeviceBuilder::new(&o.dir)
        .with_capacity(o.disk)
        .with_direct(o.direct)
        .build()?;
    let cache = HybridCacheBuilder::new()
        .with_name("engine-compare")
        .with_policy(HybridCachePolicy::WriteOnInsertion)
        .memory(o.mem)
        .with_weighter(|_k: &u64, v: &Vec<u8>| v.len() + 8)
        .storage()
        .with_io_engine_config(PsyncIoEngineConfig::new())
        .with_engine_config(
            BlockEngineConfig::new(device)
                .with_buffer_pool_size(o.buffer_pool)
                .with_submit_queue_size_threshold(o.queue_threshold),
        )
        .with_recover_mode(recover)
        .build()
        .await?;
    Ok(cache)
}

pub(crate) fn wipe(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    Ok(())
}

pub(crate) fn du(dir: &Path) -> u64 {
    let mut t = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        use std::os::unix::fs::MetadataExt;
        t += e.metadata().unwrap().blocks() * 512;
    }
    t
}

/// Insert with back-pressure: never let more than `window` bytes be queued but not yet
/// written to the device (foyer silently drops entries when its submit queue overflows).
pub(crate) async fn insert_paced(cache: &Cache, keys: impl Iterator<Item = u64>, len_of: impl Fn(u64) -> usize, window: usize) -> (u64, u64) {
    let stats = cache.statistics().clone();
    let base = stats.disk_write_bytes() as u64;
    let mut submitted = 0u64;
    let mut n = 0u64;
    for k in keys {
        let len = len_of(k);
        cache.insert(k, value_for(k, len));
        submitted += disk_footprint(len);
        n += 1;
        while submitted > (stats.disk_write_bytes() as u64 - base) + window as u64 {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    (n, submitted)
}

pub(crate) fn drop_caches() {
    let _ = std::process::Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}
