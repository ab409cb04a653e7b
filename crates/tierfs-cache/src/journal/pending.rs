//! What a scan leaves pending, and where records lie: the segment files' names, a DATA
//! record's place, the writes and namespace operations not known to be on the store. Below
//! both the scan (`replay`) and the damage it may meet (`damage`).

use super::error::io_err;
use super::{FileRef, JournalError};
use std::path::Path;

pub(crate) const SEG_PREFIX: &str = "jseg-";

pub(crate) fn seg_name(seg: u64) -> String {
    format!("{SEG_PREFIX}{seg:016x}")
}

/// The segment number in a file name, if it is one of ours.
pub(crate) fn parse_seg_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(SEG_PREFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Segment numbers present in `dir`, ascending.
pub(crate) fn list_segments(dir: &Path) -> Result<Vec<u64>, JournalError> {
    let mut segs = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io_err("list", dir))? {
        let e = e.map_err(io_err("list", dir))?;
        if let Some(seg) = e.file_name().to_str().and_then(parse_seg_name) {
            segs.push(seg);
        }
    }
    segs.sort_unstable();
    Ok(segs)
}

/// Where a DATA record lies: enough to read it back and check it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub seg: u64,
    /// Offset of the record header in the segment.
    pub off: u64,
}

/// A write that was acknowledged but is not known to be on the backing store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingWrite {
    pub seq: u64,
    pub file: FileRef,
    pub offset: u64,
    pub len: u32,
    pub(crate) loc: Loc,
}

impl PendingWrite {
    /// Where its record lies: the segment file's name in the journal directory, and the byte
    /// offset of the record's header in it (for tools and tests that inspect the journal).
    pub fn record_place(&self) -> (String, u64) {
        (seg_name(self.loc.seg), self.loc.off)
    }
}

/// A namespace operation acknowledged but not known to be applied to the store (format 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingNs {
    pub seq: u64,
    /// As the caller appended it.
    pub payload: Vec<u8>,
}
