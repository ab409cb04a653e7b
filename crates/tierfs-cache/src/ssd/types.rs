//! The public value types of the SSD tier: keys, configuration, the identity a directory is
//! bound to.

use super::SsdError;
use std::time::Duration;

/// A block of file data (`idx` = block index).
pub const KIND_DATA: u8 = 0;
/// Attributes of an inode (`idx` unused, 0 by convention).
pub const KIND_ATTR: u8 = 1;
/// A directory listing (or one chunk of it: `idx`).
pub const KIND_DIR: u8 = 2;
/// A symlink target.
pub const KIND_LINK: u8 = 3;

/// What an entry is about: a backing object (`dev`, `ino`, which survive a restart, unlike
/// kernel inode numbers or `gen`) and which piece of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SsdKey {
    pub kind: u8,
    pub dev: u64,
    pub ino: u64,
    pub idx: u64,
}

impl SsdKey {
    /// A fast, well-mixed hash for shard selection.
    pub(crate) fn mix(&self) -> u64 {
        let mut h = self.ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.dev;
        h ^= self
            .idx
            .wrapping_add(0x632B_E59B_D9B4_E019)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^= (self.kind as u64).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^ (h >> 31)
    }
}

#[derive(Clone, Debug)]
pub struct SsdConfig {
    /// Bytes; 0 = auto (`max_fill_pct` of the device).
    pub max_size: u64,
    /// The cap is min(`max_size`, this share of the device size) (swapcache's maxswappct).
    pub max_fill_pct: u8,
    /// The cache never pushes the device's free space below this share of its size.
    pub min_free_pct: u8,
    /// Sustained write budget, bytes/s (swapcache's accrate).
    pub write_rate: u64,
    /// Token bucket depth, bytes (swapcache's maxburst). The bucket starts full.
    pub write_burst: u64,
    pub segment_size: u64,
    /// Entry bytes per write (swapcache's minburst: no dribbles of tiny writes). The cluster's
    /// summary page(s) come on top, so 16 entries of 64 KiB fill a 1 MiB cluster exactly.
    pub cluster_size: u64,
    /// A partial cluster is written after this long.
    pub flush_interval: Duration,
    pub checkpoint_interval: Duration,
    /// Admit `KIND_DATA` entries.
    pub cache_data: bool,
    /// Admit the other kinds.
    pub cache_meta: bool,
}

impl Default for SsdConfig {
    fn default() -> SsdConfig {
        SsdConfig {
            max_size: 0,
            max_fill_pct: 75,
            min_free_pct: 10,
            write_rate: 100 << 20,
            write_burst: 8 << 30,
            segment_size: 256 << 20,
            cluster_size: 1 << 20,
            flush_interval: Duration::from_secs(2),
            checkpoint_interval: Duration::from_secs(60),
            cache_data: true,
            cache_meta: true,
        }
    }
}

/// The largest `cluster_size`. A cluster (summary + data) is at most twice that, and its
/// lengths and offsets are stored as u32.
pub(crate) const MAX_CLUSTER: u64 = 1 << 30;

impl SsdConfig {
    pub(crate) fn validate(&self) -> Result<(), SsdError> {
        let bad = |m: String| Err(SsdError::Config(m));
        if self.cluster_size < 4096 || !self.cluster_size.is_multiple_of(4096) {
            return bad(format!(
                "cluster size {} must be a multiple of 4096",
                self.cluster_size
            ));
        }
        if self.cluster_size > MAX_CLUSTER {
            return bad(format!(
                "cluster size {} is larger than 1 GiB",
                self.cluster_size
            ));
        }
        if self.segment_size < 2 * self.cluster_size || !self.segment_size.is_multiple_of(4096) {
            return bad(format!(
                "segment size {} must be a multiple of 4096 and at least twice the cluster size {}",
                self.segment_size, self.cluster_size
            ));
        }
        if self.max_fill_pct == 0 || self.max_fill_pct > 100 {
            return bad(format!(
                "max fill {}% must be between 1 and 100",
                self.max_fill_pct
            ));
        }
        if self.min_free_pct >= 100 {
            return bad(format!("min free {}% must be below 100", self.min_free_pct));
        }
        if self.flush_interval.is_zero() || self.checkpoint_interval.is_zero() {
            return bad("flush and checkpoint intervals must not be zero".into());
        }
        Ok(())
    }
}

/// What a cache directory is bound to. Entries are keyed by (dev, ino, idx) of one backing
/// store, in blocks of one size; a directory filled for another store or block size would
/// serve wrong data, so `open` refuses it.
#[derive(Clone, Debug)]
pub struct SsdIdentity {
    pub store_id: String,
    pub block_size: u32,
}
