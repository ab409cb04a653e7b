//! `tierfs fsck` of the write-back journal: the scan `open` does, read-only, and what it
//! leaves pending. The journal is never rewritten or deleted here: its pending records are
//! acknowledged writes that only the next mount can bring to the backing store.

use super::damage::Damage;
use super::error::io_err;
use super::replay::{self, PendingWrite};
use super::{pending_of, superblock, Journal, JournalConfig, JournalError};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

/// The journal as [`Journal::inspect`] found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalState {
    /// No journal (write-back never used in this cache directory).
    Absent,
    Ok,
    /// The mount would refuse it (why). Pending writes before the damage cannot be listed.
    Damaged(String),
}

#[derive(Clone, Debug)]
pub struct JournalReport {
    pub dir: PathBuf,
    pub state: JournalState,
    pub store_id: Option<String>,
    pub segments: u64,
    /// Valid records of any kind, and their bytes on disk.
    pub records: u64,
    pub bytes: u64,
    /// Acknowledged writes not yet known to be on the backing store: the next mount replays
    /// them.
    pub pending: Vec<PendingWrite>,
    pub pending_bytes: u64,
    /// The last segment ends in a torn record (a crash mid-write; nothing acknowledged is in
    /// it): file, offset, why. The next mount seals it there.
    pub torn_tail: Option<(PathBuf, u64, &'static str)>,
    /// Bad stretches with valid records after them (see `Replay::damage`).
    pub damage: Vec<Damage>,
    /// Pending writes the next mount will not replay but save under `lost/`: damage may hide
    /// a newer write of their file.
    pub lost: Vec<PendingWrite>,
    /// Files (names) already saved under `lost/` by an earlier mount: `<name>.txt` reports.
    pub lost_reports: Vec<PathBuf>,
}

impl Journal {
    /// Scans the journal in `dir` without changing anything.
    pub fn inspect(dir: &Path) -> Result<JournalReport, JournalError> {
        let mut r = JournalReport {
            dir: dir.to_path_buf(),
            state: JournalState::Absent,
            store_id: None,
            segments: 0,
            records: 0,
            bytes: 0,
            pending: Vec::new(),
            pending_bytes: 0,
            torn_tail: None,
            damage: Vec::new(),
            lost: Vec::new(),
            lost_reports: lost_reports(dir),
        };
        let segs = replay::list_segments(dir)?;
        let sb = match superblock::read(dir) {
            Ok(Some((sb, id))) => {
                r.store_id = Some(id);
                sb
            }
            Ok(None) if segs.is_empty() => return Ok(r),
            Ok(None) => {
                r.state = JournalState::Damaged("superblock missing beside segment files".into());
                return Ok(r);
            }
            Err(e @ JournalError::Io { .. }) => return Err(e),
            Err(e) => {
                r.state = JournalState::Damaged(e.to_string());
                return Ok(r);
            }
        };
        let mut opened = BTreeMap::new();
        for seg in segs {
            let path = dir.join(replay::seg_name(seg));
            let f = OpenOptions::new()
                .read(true)
                .open(&path)
                .map_err(io_err("open", &path))?;
            opened.insert(seg, (path, f));
        }
        r.segments = opened.len() as u64;
        let sc = match replay::scan(dir, &sb.uuid, &opened) {
            Ok(sc) => sc,
            Err(e @ JournalError::Damaged { .. }) => {
                r.state = JournalState::Damaged(e.to_string());
                return Ok(r);
            }
            Err(e) => return Err(e),
        };
        let (_, rp) = pending_of(sc.segs, sc.marks, sc.data, sc.replay);
        r.state = JournalState::Ok;
        r.records = rp.records;
        r.bytes = rp.bytes;
        r.pending_bytes = rp.pending_bytes;
        r.pending = rp.pending;
        r.torn_tail = rp.torn_tail;
        r.damage = rp.damage;
        r.lost = rp.lost;
        Ok(r)
    }

    /// Seals a torn last segment where its valid records end, as the next mount would first
    /// thing: opens the journal and closes it. Pending writes stay where they are (the next
    /// mount replays them); only segments whose every write is already on the backing store
    /// may be freed, as at any open.
    pub fn seal_torn_tail(dir: &Path, store_id: &str) -> Result<(), JournalError> {
        let (j, _) = Journal::open(dir, store_id, JournalConfig::default(), false)?;
        j.shutdown();
        Ok(())
    }
}

/// The `.txt` reports under `<dir>/lost/`, sorted.
fn lost_reports(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("lost"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    v.sort();
    v
}
