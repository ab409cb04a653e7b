//! The scan at open: every segment in order, every record checked, and what it leaves pending.
//!
//! A segment ends at a SEAL (written when the next segment was started, and synced before it),
//! or, for the last segment only, at the first slot after which no valid record follows: zeros
//! or end of file (a clean end) or a torn/garbled record (a crash mid-write; counted in
//! `torn_tails`). A bad stretch with valid records after it, in any segment, or a segment
//! missing between two others, is damage (damage.rs): the scan records it and goes on, so every
//! valid record is replayed or reported, never silently dropped. Except in the last segment
//! when the stretch holds a page never written (zeros): that is the out-of-order tear a power
//! loss leaves in the last unsynced batch, read as a torn tail.

use super::damage::{self, Damage};
use super::error::io_err;
use super::format::{self, Decoded, HDR};
use super::record::{read_record, Bad};
use super::space::{Key, SegInfo};
use super::{FileRef, JournalError};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

pub(crate) use super::pending::{list_segments, seg_name, Loc};
pub use super::pending::{PendingNs, PendingWrite};

/// What `Journal::open` found.
#[derive(Debug, Default)]
pub struct Replay {
    /// NS records not covered by a DONE of `NS_KEY`, in seq order: the caller applies them
    /// (before `pending`, which may name what they create), then calls `done` on `NS_KEY`.
    pub pending_ns: Vec<PendingNs>,
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
    /// Bad stretches with valid records after them, and what each may have cost.
    pub damage: Vec<Damage>,
    /// Pending writes of files that damage may concern: not to be applied (a newer write of
    /// the same file may be in the hole, and on the store already), but saved aside.
    pub lost: Vec<PendingWrite>,
    pub lost_bytes: u64,
}

impl Replay {
    /// Damage that may have cost an acknowledged write.
    pub fn harmful_damage(&self) -> impl Iterator<Item = &Damage> {
        self.damage.iter().filter(|d| !d.harmless)
    }
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
    pub ns: Vec<PendingNs>,
    pub last_seq: u64,
    /// The last segment, if it has no SEAL: where one goes.
    pub unsealed_last: Option<(u64, u64)>,
    /// The highest-numbered files that hold nothing but zeros: next segments the writer
    /// created ahead of time and never used (a crash can leave two: one rolled into before
    /// its first record was written, and the one made after it). Not segments; `open`
    /// deletes them.
    pub spares: Vec<u64>,
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
        ns: Vec::new(),
        last_seq: 0,
        unsealed_last: None,
        spares: Vec::new(),
        replay: Replay::default(),
    };
    let mut prev: Option<u64> = None;
    let mut n = files.len();
    for (&seg, (path, file)) in files.iter().rev() {
        if !damage::zeros_from(file, path, 0)? {
            break;
        }
        out.spares.push(seg);
        n -= 1;
    }
    for (i, (&seg, (path, file))) in files.iter().take(n).enumerate() {
        // Segments are deleted oldest first and created one after another: a hole means a
        // segment was lost, and with it data that later DONEs do not cover.
        if let Some(p) = prev {
            for missing in p + 1..seg {
                out.replay.damage.push(Damage::new(
                    &dir.join(seg_name(missing)),
                    0,
                    "segment missing between two others",
                    out.last_seq,
                ));
            }
        }
        prev = Some(seg);
        let last = i + 1 == n;
        let size = file.metadata().map_err(io_err("stat", path))?.len();
        let mut info = SegInfo {
            size,
            first_seq: 0,
            files: FxHashMap::default(),
        };
        let end = scan_segment(seg, file, path, size, uuid, last, &mut out, &mut info)?;
        out.segs.insert(seg, info);
        match end {
            End::Sealed => {}
            End::Clean(off) | End::Torn(off, _) if last => {
                if let End::Torn(off, why) = end {
                    out.replay.torn_tail = Some((path.clone(), off, why));
                }
                out.unsealed_last = Some((seg, off));
            }
            // A segment that is not the last ends at its SEAL: what is missing from there on
            // (cut short, its end unreadable) may have held records.
            End::Clean(off) | End::Torn(off, _) => {
                let why = match end {
                    End::Torn(_, why) => why,
                    _ => "segment ends without a seal but is not the last",
                };
                let mut d = Damage::new(path, off, why, out.last_seq);
                d.len = size.saturating_sub(off);
                d.hint = damage::hint(file, path, off, None)?;
                out.replay.damage.push(d);
            }
        }
    }
    out.replay.segments = n as u64;
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn scan_segment(
    seg: u64,
    file: &File,
    path: &Path,
    size: u64,
    uuid: &[u8; 16],
    last: bool,
    out: &mut Scanned,
    info: &mut SegInfo,
) -> Result<End, JournalError> {
    let seed = format::seg_seed(uuid, seg);
    let mut payload = Vec::new();
    let mut off = 0u64;
    loop {
        let h = match read_record(file, path, off, size, seed, out.last_seq, &mut payload)? {
            Ok(h) => h,
            Err(bad) => {
                let why = match bad {
                    Bad::Clean => "zeros where a record should be",
                    Bad::Torn(why) => why,
                };
                // Valid records after it: damage, not the end.
                match damage::resync(file, path, off + 1, size, seed, out.last_seq)? {
                    // In the last segment, a stretch with a page never written (zeros, as
                    // preallocated) before later records is a crash tear, not damage: after a
                    // power loss the pages of the last unsynced batch reach the disk in any
                    // order, and none of them was acknowledged as durable.
                    Some(next) if last && damage::has_unwritten_page(file, path, off, next)? => {
                        return Ok(End::Torn(
                            off,
                            "a write torn by a crash (unwritten pages before later records)",
                        ));
                    }
                    Some(next) => {
                        let mut d = Damage::new(path, off, why, out.last_seq);
                        d.len = next - off;
                        d.hint = damage::hint(file, path, off, Some(next))?;
                        out.replay.damage.push(d);
                        off = next;
                        continue;
                    }
                    None => {
                        return Ok(match bad {
                            Bad::Clean => End::Clean(off),
                            Bad::Torn(why) => End::Torn(off, why),
                        })
                    }
                }
            }
        };
        let rec_len = HDR as u64 + h.len as u64;
        // The first valid record after a damage bounds the seqs it may have held.
        for d in out.replay.damage.iter_mut().rev() {
            if d.before_seq != u64::MAX {
                break;
            }
            d.before_seq = h.seq;
        }
        out.last_seq = h.seq;
        // Checked by `read_record`.
        let Ok(dec) = format::decode(h.kind, &payload) else {
            unreachable!("read_record decodes every record it accepts")
        };
        match dec {
            Decoded::Seal { .. } => return Ok(End::Sealed),
            Decoded::Data {
                dev,
                ino,
                offset,
                path,
                data,
            } => {
                if info.first_seq == 0 {
                    info.first_seq = h.seq;
                }
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
            Decoded::Ns { payload } => {
                if info.first_seq == 0 {
                    info.first_seq = h.seq;
                }
                info.files.insert(format::NS_KEY, h.seq);
                out.ns.push(PendingNs {
                    seq: h.seq,
                    payload: payload.to_vec(),
                });
            }
            Decoded::Done { dev, ino, upto } | Decoded::Drop { dev, ino, upto } => {
                if info.first_seq == 0 {
                    info.first_seq = h.seq;
                }
                let e = out.marks.entry((dev, ino)).or_insert(0);
                *e = (*e).max(upto);
            }
        }
        out.replay.records += 1;
        out.replay.bytes += rec_len;
        off += rec_len;
    }
}
