//! The scan at open: every segment in order, every record checked, and what it leaves pending.
//!
//! A segment ends at a SEAL (written when the next segment was started, and synced before it),
//! or, for the last segment only, at the first slot that is not a valid record: zeros or end of
//! file (a clean end) or a torn/garbled record (a crash mid-write; counted in `torn_tails`).
//! Any segment but the last that does not end in a SEAL is damaged: acknowledged data may be
//! missing, so the scan stops with an error instead of replaying around the hole.

use super::error::io_err;
use super::format::{self, Decoded, HeaderCheck, HDR};
use super::space::{Key, SegInfo};
use super::{io, FileRef, JournalError};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

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

/// What `Journal::open` found.
#[derive(Debug, Default)]
pub struct Replay {
    /// DATA records not covered by a DONE/DROP, in seq order. The caller writes each to the
    /// backing store (`Journal::read_pending` gives the bytes), fsyncs, then calls `done`.
    pub pending: Vec<PendingWrite>,
    /// Sum of `len` over `pending`.
    pub pending_bytes: u64,
    /// Valid records read, of any kind, and their bytes on disk.
    pub records: u64,
    pub bytes: u64,
    pub segments: u64,
    /// The last segment ended in a torn or garbled record: (file, offset of that record, why).
    pub torn_tail: Option<(PathBuf, u64, &'static str)>,
}

/// How a segment's scan ended.
enum End {
    Sealed,
    /// Zeros or end of file: nothing was being written there.
    Clean(u64),
    Torn(u64, &'static str),
}

pub(crate) struct Scanned {
    pub segs: BTreeMap<u64, SegInfo>,
    pub marks: FxHashMap<Key, u64>,
    pub data: Vec<PendingWrite>,
    pub last_seq: u64,
    /// The last segment, if it has no SEAL: where one goes.
    pub unsealed_last: Option<(u64, u64)>,
    pub replay: Replay,
}

pub(crate) fn scan(
    dir: &Path,
    uuid: &[u8; 16],
    files: &BTreeMap<u64, (PathBuf, File)>,
) -> Result<Scanned, JournalError> {
    let mut out = Scanned {
        segs: BTreeMap::new(),
        marks: FxHashMap::default(),
        data: Vec::new(),
        last_seq: 0,
        unsealed_last: None,
        replay: Replay::default(),
    };
    let mut prev: Option<u64> = None;
    for (i, (&seg, (path, file))) in files.iter().enumerate() {
        // Segments are deleted oldest first and created one after another: a hole means a
        // segment was lost, and with it data that later DONEs do not cover.
        if let Some(p) = prev {
            if seg != p + 1 {
                return Err(JournalError::Damaged {
                    path: dir.join(seg_name(p + 1)),
                    offset: 0,
                    what: "segment missing between two others".into(),
                });
            }
        }
        prev = Some(seg);
        let last = i + 1 == files.len();
        let size = file.metadata().map_err(io_err("stat", path))?.len();
        let mut info = SegInfo {
            size,
            first_seq: 0,
            files: FxHashMap::default(),
        };
        let end = scan_segment(seg, file, path, size, uuid, &mut out, &mut info)?;
        out.segs.insert(seg, info);
        match end {
            End::Sealed => {}
            End::Clean(off) | End::Torn(off, _) if last => {
                if let End::Torn(off, why) = end {
                    out.replay.torn_tail = Some((path.clone(), off, why));
                }
                out.unsealed_last = Some((seg, off));
            }
            End::Clean(off) => {
                return Err(JournalError::Damaged {
                    path: path.clone(),
                    offset: off,
                    what: "segment ends without a seal but is not the last".into(),
                })
            }
            End::Torn(off, why) => {
                return Err(JournalError::Damaged {
                    path: path.clone(),
                    offset: off,
                    what: why.into(),
                })
            }
        }
    }
    out.replay.segments = files.len() as u64;
    Ok(out)
}

fn scan_segment(
    seg: u64,
    file: &File,
    path: &Path,
    size: u64,
    uuid: &[u8; 16],
    out: &mut Scanned,
    info: &mut SegInfo,
) -> Result<End, JournalError> {
    let seed = format::seg_seed(uuid, seg);
    let mut hdr = [0u8; HDR];
    let mut payload = Vec::new();
    let mut off = 0u64;
    loop {
        let n = io::read_at_most(file, &mut hdr, off).map_err(io_err("read", path))?;
        if n < HDR {
            return Ok(if hdr[..n].iter().all(|&b| b == 0) {
                End::Clean(off)
            } else {
                End::Torn(off, "short header at end of file")
            });
        }
        let h = match format::parse_header(&hdr) {
            HeaderCheck::Zero => return Ok(End::Clean(off)),
            HeaderCheck::Bad(why) => return Ok(End::Torn(off, why)),
            HeaderCheck::Ok(h) => h,
        };
        let rec_len = HDR as u64 + h.len as u64;
        if off + rec_len > size {
            return Ok(End::Torn(off, "record runs past end of file"));
        }
        payload.resize(h.len as usize, 0);
        let got =
            io::read_at_most(file, &mut payload, off + HDR as u64).map_err(io_err("read", path))?;
        if got != payload.len() {
            return Ok(End::Torn(off, "record runs past end of file"));
        }
        if !format::crc_ok(seed, &hdr, &h, &payload) {
            return Ok(End::Torn(off, "record checksum mismatch"));
        }
        // The seed already rules out records of other segments or generations; an out-of-order
        // seq with a good CRC is not something a crash produces, but it is not replayed either.
        if h.seq <= out.last_seq {
            return Ok(End::Torn(off, "record seq not increasing"));
        }
        let dec = match format::decode(h.kind, &payload) {
            Ok(d) => d,
            Err(why) => return Ok(End::Torn(off, why)),
        };
        if let Decoded::Seal { at } = dec {
            if at != off {
                return Ok(End::Torn(off, "seal at the wrong offset"));
            }
            out.last_seq = h.seq;
            return Ok(End::Sealed);
        }
        if info.first_seq == 0 {
            info.first_seq = h.seq;
        }
        match dec {
            Decoded::Data {
                dev,
                ino,
                offset,
                path,
                data,
            } => {
                info.files.insert((dev, ino), h.seq);
                out.data.push(PendingWrite {
                    seq: h.seq,
                    file: FileRef {
                        dev,
                        ino,
                        path: path.to_vec(),
                    },
                    offset,
                    len: data.len() as u32,
                    loc: Loc { seg, off },
                });
            }
            Decoded::Done { dev, ino, upto } | Decoded::Drop { dev, ino, upto } => {
                let e = out.marks.entry((dev, ino)).or_insert(0);
                *e = (*e).max(upto);
            }
            Decoded::Seal { .. } => {}
        }
        out.last_seq = h.seq;
        out.replay.records += 1;
        out.replay.bytes += rec_len;
        off += rec_len;
    }
}
