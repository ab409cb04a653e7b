//! The journal's settings and their checks.

use super::*;

pub(crate) const MIB: u64 = 1 << 20;

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
