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
    /// Bytes; 0 = auto: [`AUTO_SEGMENT_MAX`], or less on a small device (see
    /// [`SsdConfig::segment_size_for`]).
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
            segment_size: 0,
            cluster_size: 1 << 20,
            flush_interval: Duration::from_secs(2),
            checkpoint_interval: Duration::from_secs(60),
            cache_data: true,
            cache_meta: true,
        }
    }
}

/// The automatic segment size on a device large enough for it.
pub const AUTO_SEGMENT_MAX: u64 = 256 << 20;
/// The automatic segment size leaves the tier at least this many segments, so that reclaim
/// (a segment at a time, oldest first) never throws away more than an eighth of it.
const AUTO_SEGMENTS: u64 = 8;

/// The largest `cluster_size`. A cluster (summary + data) is at most twice that, and its
/// lengths and offsets are stored as u32.
pub(crate) const MAX_CLUSTER: u64 = 1 << 30;

impl SsdConfig {
    /// The segment size in force for a tier of `cap` bytes: the one configured, or (auto)
    /// the largest power-of-two number of clusters up to [`AUTO_SEGMENT_MAX`] that leaves at
    /// least [`AUTO_SEGMENTS`] segments, and never less than two clusters. A configured size
    /// larger than the cap is an error naming the keys to change.
    pub fn segment_size_for(&self, cap: u64) -> Result<u64, SsdError> {
        if self.segment_size != 0 {
            if cap < self.segment_size {
                return Err(SsdError::Config(format!(
                    "the SSD tier's cap of {} MiB (ssd.max_fill_pct {}% of its filesystem, or ssd.max_size) is smaller than one segment (ssd.segment_size = {} MiB): lower ssd.segment_size or leave it unset (auto)",
                    cap >> 20,
                    self.max_fill_pct,
                    self.segment_size >> 20
                )));
            }
            return Ok(self.segment_size);
        }
        let min = 2 * self.cluster_size;
        if cap < min {
            return Err(SsdError::Config(format!(
                "the SSD tier's cap of {} KiB (ssd.max_fill_pct {}% of its filesystem, or ssd.max_size) is smaller than two clusters (ssd.cluster_size = {} KiB): put the cache dir on a larger filesystem, lower ssd.cluster_size, or turn the tier off (ssd.enable=false)",
                cap >> 10,
                self.max_fill_pct,
                self.cluster_size >> 10
            )));
        }
        let mut seg = AUTO_SEGMENT_MAX.max(min);
        while seg > min && seg * AUTO_SEGMENTS > cap {
            seg /= 2;
        }
        Ok(seg.max(min))
    }

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
        if self.segment_size != 0
            && (self.segment_size < 2 * self.cluster_size
                || !self.segment_size.is_multiple_of(4096))
        {
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
