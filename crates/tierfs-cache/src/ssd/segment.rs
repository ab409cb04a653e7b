//! A segment: one file of the log (`seg-<16 hex digits of its sequence number>`).
//!
//! Index entries hold an `Arc<Segment>`, so reclaim can unlink the file while a read of it
//! is still running: the open descriptor keeps the data until the last reader is done.

use super::SsdKey;
use parking_lot::Mutex;
use std::fs::File;
use std::path::PathBuf;

pub(crate) struct Segment {
    pub seq: u64,
    pub path: PathBuf,
    pub file: File,
    /// Keys of entries written into this segment, so reclaim finds them without a scan or a
    /// sweep of the whole index. Entries since replaced or removed are skipped then.
    pub keys: Mutex<Vec<SsdKey>>,
}

impl Segment {
    pub fn new(seq: u64, path: PathBuf, file: File) -> Segment {
        Segment {
            seq,
            path,
            file,
            keys: Mutex::new(Vec::new()),
        }
    }
}

pub(crate) fn file_name(seq: u64) -> String {
    format!("seg-{seq:016x}")
}

/// The sequence number of a segment file name, or None for any other file.
pub(crate) fn parse_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("seg-")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}
