//! Rebuilding the index at `open`: the checkpoint, then the summaries of every cluster written
//! after the position it covers.
//!
//! A cluster whose header or summary does not check out (torn by a crash, damaged) ends the
//! scan of its segment: the tail from there is cut off, and the writer never appends to an
//! old segment anyway (it always starts a new one), so nothing is ever written after garbage.

use super::aligned::{AlignedBuf, PAGE};
use super::checkpoint::{self, Pos};
use super::error::io_err;
use super::index::Entry;
use super::layout::{for_each_record, parse_header, summary_ok, FLAG_TOMBSTONE};
use super::segment::{self, Segment};
use super::types::MAX_CLUSTER;
use super::{io, Shared, SsdError};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// A segment as the writer tracks it.
pub(crate) struct SegInfo {
    pub seg: Arc<Segment>,
    /// Bytes of valid clusters (the file's length).
    pub len: u64,
}

pub(crate) struct Recovered {
    pub segs: BTreeMap<u64, SegInfo>,
    pub next_seq: u64,
    pub entries: u64,
    /// The checkpoint describes the directory exactly (nothing newer, nothing cut off): no
    /// need to write another one until something changes.
    pub clean: bool,
    /// What the rebuild found on the way (`tierfs fsck` reports it).
    pub found: Findings,
}

/// Whether recovery repairs what it finds (`open`) or only reports it (`tierfs fsck`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Repair,
    Check,
}

/// The state of the checkpoint as recovery found it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CheckpointState {
    /// None there (a tier that never wrote one, e.g. killed within its first interval).
    #[default]
    Missing,
    /// Loaded: the position it covers and its entries.
    Loaded { seq: u64, off: u64, entries: u64 },
    /// There, but not usable (why): the index is rebuilt from the segment summaries.
    Unusable(String),
}

/// A segment whose scan stopped before its end: a torn or damaged cluster.
#[derive(Clone, Debug)]
pub struct TornTail {
    pub path: PathBuf,
    /// Where the valid clusters end.
    pub at: u64,
    /// The file's length (the bytes from `at` on are dropped).
    pub len: u64,
    pub why: &'static str,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Findings {
    pub checkpoint: CheckpointState,
    pub torn: Vec<TornTail>,
    /// Clusters read from segment summaries (those after the checkpoint's position).
    pub scanned_clusters: u64,
    /// Checkpoint entries whose segment is gone or too short (reclaimed or cut after it).
    pub cp_dropped: u64,
    pub empty_segments: Vec<PathBuf>,
    /// Segment files that could not be opened (skipped), and why.
    pub unopenable: Vec<(PathBuf, String)>,
    /// A `checkpoint.tmp` (a checkpoint being written when the process died).
    pub tmp_leftover: bool,
}

/// How much of a cluster the scan reads at once: the header and, usually, the whole summary.
const SCAN_CHUNK: usize = 32 << 10;

/// Rebuilds the index from the checkpoint and the summaries after it. With `Mode::Repair`
/// torn tails are cut off and leftovers removed; with `Mode::Check` nothing on disk changes
/// (the index is what the next `open` would rebuild).
pub(crate) fn recover(sh: &Shared, mode: Mode) -> Result<Recovered, SsdError> {
    let dir = &sh.dir;
    let mut found = Findings::default();
    let mut segs = open_segments(sh, mode, &mut found)?;
    let mut clean = true;
    let pos = match checkpoint::load(dir, &sh.uuid, sh.seed) {
        Ok(Some((pos, entries))) => {
            let n = entries.len() as u64;
            let kept = load_checkpoint(sh, &segs, entries);
            found.cp_dropped = n - kept;
            found.checkpoint = CheckpointState::Loaded {
                seq: pos.seq,
                off: pos.off,
                entries: n,
            };
            pos
        }
        Ok(None) => {
            clean = false;
            Pos::default()
        }
        Err(why) => {
            tracing::warn!(
                "SSD cache: checkpoint in {} unusable ({why}); rebuilding from segment summaries",
                dir.display()
            );
            found.checkpoint = CheckpointState::Unusable(why);
            clean = false;
            Pos::default()
        }
    };
    for (&seq, info) in segs.range_mut(pos.seq..) {
        let start = if seq == pos.seq { pos.off } else { 0 };
        if start >= info.len {
            continue;
        }
        clean = false;
        let (end, why, clusters) = scan_segment(sh, info, start);
        found.scanned_clusters += clusters;
        if end < info.len {
            found.torn.push(TornTail {
                path: info.seg.path.clone(),
                at: end,
                len: info.len,
                why: why.unwrap_or("?"),
            });
            if mode == Mode::Check {
                continue;
            }
            tracing::warn!(
                "SSD cache: {} ends in a damaged or torn cluster at byte {end} ({}); dropping the {} bytes after it",
                info.seg.path.display(),
                why.unwrap_or("?"),
                info.len - end
            );
            if let Err(e) = info.seg.file.set_len(end) {
                tracing::warn!(
                    "SSD cache: cannot truncate {}: {e}",
                    info.seg.path.display()
                );
            }
            info.len = end;
        }
    }
    let next_seq = segs
        .last_key_value()
        .map_or(1, |(s, _)| s + 1)
        .max(pos.seq + 1);
    Ok(Recovered {
        segs,
        next_seq,
        entries: sh.index.len(),
        clean,
        found,
    })
}

/// Opens every segment file; removes empty ones and leftover temp files (`Mode::Repair`).
fn open_segments(
    sh: &Shared,
    mode: Mode,
    found: &mut Findings,
) -> Result<BTreeMap<u64, SegInfo>, SsdError> {
    let dir = &sh.dir;
    let mut seqs = Vec::new();
    for ent in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let ent = ent.map_err(io_err("list", dir))?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(seq) = segment::parse_name(name) {
            seqs.push(seq);
        } else if name == checkpoint::TMP {
            found.tmp_leftover = true;
            if mode == Mode::Repair {
                let _ = fs::remove_file(ent.path());
            }
        }
    }
    seqs.sort_unstable();
    let mut segs = BTreeMap::new();
    for seq in seqs {
        let path = dir.join(segment::file_name(seq));
        let opened = io::open_segment(&path, false, &sh.direct)
            .and_then(|f| f.metadata().map(|m| (f, m.len())));
        let (file, len) = match opened {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("SSD cache: skipping {}: {e}", path.display());
                found.unopenable.push((path, e.to_string()));
                continue;
            }
        };
        if len == 0 {
            if mode == Mode::Repair {
                let _ = fs::remove_file(&path);
            }
            found.empty_segments.push(path);
            continue;
        }
        let seg = Arc::new(Segment::new(seq, path, file));
        segs.insert(seq, SegInfo { seg, len });
    }
    Ok(segs)
}

/// Puts the checkpoint's entries in the index; those whose segment is gone (reclaimed after
/// the checkpoint) or shorter than the entry are dropped. Returns how many it kept.
fn load_checkpoint(
    sh: &Shared,
    segs: &BTreeMap<u64, SegInfo>,
    entries: Vec<checkpoint::CpEntry>,
) -> u64 {
    let by_seq: FxHashMap<u64, (&Arc<Segment>, u64)> =
        segs.iter().map(|(s, i)| (*s, (&i.seg, i.len))).collect();
    let mut keys: FxHashMap<u64, Vec<_>> = FxHashMap::default();
    let mut batch = Vec::with_capacity(entries.len());
    for c in entries {
        let Some(&(seg, seg_len)) = by_seq.get(&c.seg) else {
            continue;
        };
        if c.off.saturating_add(c.len as u64) > seg_len {
            continue;
        }
        keys.entry(c.seg).or_default().push(c.key);
        batch.push((
            c.key,
            Entry {
                version: c.version,
                seg: seg.clone(),
                off: c.off,
                len: c.len,
                crcs: c.crcs,
                hit: AtomicBool::new(c.hit),
            },
        ));
    }
    let kept = batch.len() as u64;
    sh.index.insert_batch(batch);
    for (seq, k) in keys {
        if let Some(info) = segs.get(&seq) {
            info.seg.keys.lock().extend(k);
        }
    }
    kept
}

/// Applies the summaries of the clusters from `start` on, in order. Returns where the valid
/// clusters end, why the scan stopped early if it did, and how many clusters it applied.
fn scan_segment(sh: &Shared, info: &SegInfo, start: u64) -> (u64, Option<&'static str>, u64) {
    let Some(mut buf) = AlignedBuf::new(SCAN_CHUNK) else {
        return (start, Some("out of memory"), 0);
    };
    let mut clusters = 0;
    let seg = &info.seg;
    let mut keys = Vec::new();
    let mut off = start;
    let stop = loop {
        if off >= info.len {
            break None;
        }
        let avail = ((info.len - off) / PAGE as u64 * PAGE as u64).min(SCAN_CHUNK as u64) as usize;
        if avail == 0 {
            break Some("short cluster");
        }
        if seg
            .file
            .read_exact_at(&mut buf.as_mut_slice()[..avail], off)
            .is_err()
        {
            break Some("read error");
        }
        let hdr = match parse_header(
            &buf.as_slice()[..avail],
            &sh.uuid,
            seg.seq,
            off,
            2 * MAX_CLUSTER,
        ) {
            Ok(h) => h,
            Err(why) => break Some(why),
        };
        if off + hdr.cluster_len as u64 > info.len {
            break Some("cluster runs past the end of the file");
        }
        let big;
        let summary: &[u8] = if hdr.summary_len as usize <= avail {
            &buf.as_slice()[..hdr.summary_len as usize]
        } else {
            let Some(mut b) = AlignedBuf::new(hdr.summary_len as usize) else {
                break Some("out of memory");
            };
            let s = &mut b.as_mut_slice()[..hdr.summary_len as usize];
            if seg.file.read_exact_at(s, off).is_err() {
                break Some("read error");
            }
            big = b;
            &big.as_slice()[..hdr.summary_len as usize]
        };
        if !summary_ok(sh.seed, summary, &hdr) {
            break Some("summary checksum mismatch");
        }
        let data_at = off + hdr.summary_len as u64;
        let walked = for_each_record(summary, &hdr, |r| {
            if r.flags & FLAG_TOMBSTONE != 0 {
                sh.index.remove(&r.key);
                return;
            }
            keys.push(r.key);
            sh.index.insert(
                r.key,
                Entry {
                    version: r.version,
                    seg: seg.clone(),
                    off: data_at + r.data_off as u64,
                    len: r.len,
                    crcs: r.crc_iter().collect(),
                    hit: AtomicBool::new(false),
                },
            );
        });
        if let Err(why) = walked {
            break Some(why);
        }
        clusters += 1;
        off += hdr.cluster_len as u64;
    };
    seg.keys.lock().extend(keys);
    (off, stop, clusters)
}
