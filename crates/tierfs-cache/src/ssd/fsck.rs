//! `tierfs fsck` of the SSD tier: an offline check, and a repair.
//!
//! The check rebuilds the index exactly as `open` would (the same recovery code, in a mode
//! that changes nothing on disk), then reads every entry of it back and verifies its page
//! CRCs: what it reports is what the next mount would index and what it could serve. Entries
//! superseded later in the log (rewritten, tombstoned) are not checked: no mount would read
//! them.
//!
//! The repair opens the tier as a mount does (recovery cuts torn tails off, drops leftovers,
//! ignores an unusable checkpoint), drops the bad entries with tombstones, and shuts down,
//! which writes a fresh checkpoint. A damaged superblock cannot be repaired (it says which
//! store the data belongs to): the tier's files are wiped and the next mount starts it afresh.

use super::error::io_err;
use super::index::Loc;
use super::read::{read_run, ReadFail, MAX_RUN_READ};
use super::recover::{self, Mode};
use super::writer::Msg;
use super::{io, superblock, SsdCache, SsdConfig, SsdError, SsdIdentity, SsdKey};
use super::{Shared, LOCK_FILE};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use super::recover::{CheckpointState, TornTail};

/// The superblock as the check found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuperblockState {
    Ok,
    /// No superblock and no segment: an empty (or never used) tier.
    Absent,
    /// Segment files without a superblock, or a superblock that does not check out: the
    /// mount refuses the directory.
    Damaged(String),
}

/// An entry the next mount would index whose data does not verify.
#[derive(Clone, Debug)]
pub struct BadEntry {
    pub key: SsdKey,
    pub version: u64,
    pub path: PathBuf,
    pub seg: u64,
    /// Byte offset of its data in the segment file.
    pub off: u64,
    pub len: u32,
    pub why: &'static str,
}

/// What [`check`] found.
#[derive(Clone, Debug)]
pub struct SsdReport {
    pub dir: PathBuf,
    pub superblock: SuperblockState,
    /// Store id and block size recorded in the superblock.
    pub identity: Option<SsdIdentity>,
    pub segments: u64,
    /// Bytes of segment files (of valid clusters: torn tails not counted).
    pub segment_bytes: u64,
    /// Entries the next mount would index, and their bytes of data.
    pub entries: u64,
    pub entry_bytes: u64,
    pub bad_entries: Vec<BadEntry>,
    pub checkpoint: CheckpointState,
    /// Clusters after the checkpoint's position (the next mount reads their summaries).
    pub scanned_clusters: u64,
    /// Checkpoint entries whose segment was reclaimed or cut after it (normal).
    pub checkpoint_dropped: u64,
    pub torn: Vec<TornTail>,
    pub empty_segments: u64,
    pub unopenable: Vec<(PathBuf, String)>,
    pub tmp_leftover: bool,
}

impl SsdReport {
    fn empty(dir: &Path, superblock: SuperblockState) -> SsdReport {
        SsdReport {
            dir: dir.to_path_buf(),
            superblock,
            identity: None,
            segments: 0,
            segment_bytes: 0,
            entries: 0,
            entry_bytes: 0,
            bad_entries: Vec::new(),
            checkpoint: CheckpointState::Missing,
            scanned_clusters: 0,
            checkpoint_dropped: 0,
            torn: Vec::new(),
            empty_segments: 0,
            unopenable: Vec::new(),
            tmp_leftover: false,
        }
    }

    /// The problems found, one line each; empty if the tier is clean. A missing checkpoint,
    /// clusters after it, empty segments and a leftover temp file are normal after a crash
    /// (the next mount deals with them) and are not problems.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let SuperblockState::Damaged(why) = &self.superblock {
            out.push(format!("superblock: {why}"));
        }
        if let CheckpointState::Unusable(why) = &self.checkpoint {
            out.push(format!("checkpoint unusable: {why}"));
        }
        for t in &self.torn {
            out.push(format!(
                "{}: damaged or torn cluster at byte {} ({}); {} bytes after it are lost",
                t.path.display(),
                t.at,
                t.why,
                t.len - t.at
            ));
        }
        for (p, e) in &self.unopenable {
            out.push(format!("{}: cannot open: {e}", p.display()));
        }
        for b in &self.bad_entries {
            out.push(format!(
                "{}: entry at byte {} ({} bytes; kind {}, dev {}, ino {}, block {}): {}",
                b.path.display(),
                b.off,
                b.len,
                b.key.kind,
                b.key.dev,
                b.key.ino,
                b.key.idx,
                b.why
            ));
        }
        out
    }
}

/// Checks the tier in `dir` without changing it. The tier's lock is held meanwhile: a
/// running mount makes this fail with `SsdError::Busy`.
pub fn check(dir: &Path) -> Result<SsdReport, SsdError> {
    let lock_path = dir.join(LOCK_FILE);
    let _lock = io::lock_file(&lock_path)
        .map_err(io_err("lock", &lock_path))?
        .ok_or_else(|| SsdError::Busy {
            dir: dir.to_path_buf(),
        })?;
    let (sb, ident) = match superblock::read(dir) {
        Ok(Some(x)) => x,
        Ok(None) if super::has_tier_files(dir)? => {
            return Ok(SsdReport::empty(
                dir,
                SuperblockState::Damaged("missing beside segment files".into()),
            ))
        }
        Ok(None) => return Ok(SsdReport::empty(dir, SuperblockState::Absent)),
        Err(e @ SsdError::Io { .. }) => return Err(e),
        Err(e) => {
            return Ok(SsdReport::empty(
                dir,
                SuperblockState::Damaged(e.to_string()),
            ))
        }
    };
    let sh = Shared::new(dir, SsdConfig::default(), sb.uuid, u64::MAX, true);
    let rec = recover::recover(&sh, Mode::Check)?;
    let f = rec.found;
    let mut r = SsdReport {
        dir: dir.to_path_buf(),
        superblock: SuperblockState::Ok,
        identity: Some(ident),
        segments: rec.segs.len() as u64,
        segment_bytes: rec
            .segs
            .values()
            .map(|s| {
                // A torn tail is not counted: the next mount cuts it off.
                f.torn
                    .iter()
                    .find(|t| t.path == s.seg.path)
                    .map_or(s.len, |t| t.at)
            })
            .sum(),
        entries: 0,
        entry_bytes: 0,
        bad_entries: Vec::new(),
        checkpoint: f.checkpoint,
        scanned_clusters: f.scanned_clusters,
        checkpoint_dropped: f.cp_dropped,
        torn: f.torn,
        empty_segments: f.empty_segments.len() as u64,
        unopenable: f.unopenable,
        tmp_leftover: f.tmp_leftover,
    };
    let mut all: Vec<(SsdKey, Loc)> = Vec::with_capacity(sh.index.len() as usize);
    sh.index.for_each_shard(|shard| {
        all.extend(shard.iter().map(|(k, e)| (*k, e.loc())));
    });
    r.entries = all.len() as u64;
    r.entry_bytes = all.iter().map(|(_, l)| l.len as u64).sum();
    all.sort_by_key(|(_, l)| (l.seg.seq, l.off));
    verify(&all, &mut r.bad_entries);
    Ok(r)
}

/// Reads back and verifies every entry of `all` (sorted by segment and offset), in reads of
/// up to `MAX_RUN_READ` over entries lying next to each other.
fn verify(all: &[(SsdKey, Loc)], bad: &mut Vec<BadEntry>) {
    let mut start = 0;
    while start < all.len() {
        let first = &all[start].1;
        let mut end = start + 1;
        while end < all.len() {
            let (p, n) = (&all[end - 1].1, &all[end].1);
            if !Arc::ptr_eq(&p.seg, &n.seg)
                || n.off < p.off + p.len as u64
                || n.off + n.len as u64 - first.off > MAX_RUN_READ
            {
                break;
            }
            end += 1;
        }
        let run = &all[start..end];
        for ((key, loc), got) in run.iter().zip(read_run(run)) {
            let why = match got {
                Ok(_) => continue,
                Err(ReadFail::Checksum) => "checksum mismatch",
                Err(_) => "read error",
            };
            bad.push(BadEntry {
                key: *key,
                version: loc.version,
                path: loc.seg.path.clone(),
                seg: loc.seg.seq,
                off: loc.off,
                len: loc.len,
                why,
            });
        }
        start = end;
    }
}

/// What [`repair`] did.
#[derive(Clone, Debug, Default)]
pub struct Repaired {
    /// The tier's files were removed (damaged superblock): the next mount starts it afresh.
    pub wiped: bool,
    pub bad_entries_dropped: u64,
    pub torn_tails_cut: u64,
    /// A fresh checkpoint was written.
    pub checkpoint_written: bool,
}

/// Repairs what `report` (from [`check`] of the same directory) found, so that the next mount
/// rebuilds cleanly. Holds the tier's lock like a mount.
pub fn repair(report: &SsdReport) -> Result<Repaired, SsdError> {
    let dir = &report.dir;
    let mut done = Repaired::default();
    match (&report.superblock, &report.identity) {
        (SuperblockState::Absent, _) => return Ok(done),
        (SuperblockState::Damaged(_), _) | (_, None) => {
            let lock_path = dir.join(LOCK_FILE);
            let _lock = io::lock_file(&lock_path)
                .map_err(io_err("lock", &lock_path))?
                .ok_or_else(|| SsdError::Busy { dir: dir.clone() })?;
            super::wipe(dir)?;
            done.wiped = true;
            return Ok(done);
        }
        (SuperblockState::Ok, Some(_)) => {}
    }
    let ident = report.identity.clone().expect("checked above");
    let Some((sb, _)) = superblock::read(dir)? else {
        return Err(SsdError::Damaged {
            dir: dir.clone(),
            what: "the superblock vanished during the repair".into(),
        });
    };
    // Settings for the repair's own writes (tombstones, checkpoint): the directory's segment
    // size, clusters small enough for it, and no cap or free-space share of the mount's own:
    // a repair must not reclaim segments (drop good entries) to make room for a few
    // tombstones; only a device without room for one more segment makes it do that.
    let mut cfg = SsdConfig {
        max_size: 0,
        max_fill_pct: 100,
        min_free_pct: 0,
        ..SsdConfig::default()
    };
    if sb.segment_size >= 8192 && sb.segment_size.is_multiple_of(4096) {
        cfg.segment_size = sb.segment_size;
        cfg.cluster_size = cfg.cluster_size.min(sb.segment_size / 2 / 4096 * 4096);
    }
    let cp_before = matches!(report.checkpoint, CheckpointState::Unusable(_));
    let cache = SsdCache::open_inner(dir, &ident, cfg, false, true)?;
    for b in &report.bad_entries {
        if drop_at(&cache, &b.key, b.seg, b.off) {
            done.bad_entries_dropped += 1;
        }
    }
    done.torn_tails_cut = report.torn.len() as u64;
    let before = cache.stats().checkpoints;
    // Dropping damaged entries leaves every other record as current as it was (the open
    // above does not keep the epoch if it cut anything, which may have held tombstones).
    if cache.last_session_clean() {
        cache.close_session();
    } else {
        cache.shutdown();
    }
    done.checkpoint_written = cache.stats().checkpoints > before || cp_before;
    Ok(done)
}

/// Drops the entry of `key` if the index still has it at (`seg`, `off`), with a tombstone.
fn drop_at(cache: &SsdCache, key: &SsdKey, seg: u64, off: u64) -> bool {
    let sh = &cache.sh;
    let Some(loc) = sh.index.lookup(key, false) else {
        return false;
    };
    if loc.seg.seq != seg || loc.off != off || !sh.index.remove_if_is(key, &loc) {
        return false;
    }
    let _ = cache.tx.send(Msg::Remove(*key));
    true
}
