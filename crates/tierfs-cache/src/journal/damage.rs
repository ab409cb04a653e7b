//! Damage inside the journal: a record that fails its checks with valid records after it.
//!
//! A crash tears only the end of the journal, so a bad record followed by valid ones is damage
//! (a bad sector, a flipped bit, a zeroed block), and the records after it are acknowledged
//! writes like any other: the scan finds the next valid record (`resync`) and goes on. What the
//! damaged bytes held is lost; `judge` decides which files that may concern, so that replay
//! never applies a file's older writes when a newer one of the same file may be in the hole
//! (the flushers may already have put that newer one on the store: replaying the older ones
//! would roll the file back). Such files are left as the store has them and their readable
//! pending writes are handed back as `lost` (the caller saves them aside and says so).

use super::error::io_err;
use super::format::{self, get_u16, get_u64, HeaderCheck, DATA_FIXED, HDR, KIND_DATA};
use super::pending::PendingWrite;
use super::space::Key;
use super::{io, FileRef, JournalError};
use rustc_hash::{FxHashMap, FxHashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A stretch of a segment that holds no valid record, with valid records after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The segment file (for a missing segment, the name it would have).
    pub path: PathBuf,
    pub offset: u64,
    /// Bytes skipped (to the next valid record, or to the end of the segment).
    pub len: u64,
    pub why: &'static str,
    /// The records lost have seqs after this one...
    pub after_seq: u64,
    /// ...and before this one (the first valid record found after the damage).
    pub before_seq: u64,
    /// The file the damaged record belonged to, when its own bytes say so and another valid
    /// record of the journal confirms that file (identity and path): then only that file is
    /// concerned. `None`: unknown, every file with an older pending write is.
    pub file: Option<FileRef>,
    /// The damaged write's (offset, length) in that file, when its header was readable.
    pub range: Option<(u64, Option<u64>)>,
    /// Nothing was lost: a SEAL, a write whose file a later DONE covers, a DONE/DROP of a file
    /// with nothing pending before it.
    pub harmless: bool,
    pub(crate) hint: Option<Hint>,
}

/// What the damaged record's own (unverified) bytes claim it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hint {
    Data {
        file: FileRef,
        offset: u64,
        /// Its data length, if the header's length led exactly to the next valid record.
        len: Option<u64>,
        /// The header was intact and its length led exactly to the next valid record: the
        /// stretch is this one record. Otherwise the claim is read from where a DATA record's
        /// identity would be (one flipped byte leaves either its (dev, ino) or its path whole),
        /// and the stretch may hold more records.
        exact: bool,
    },
    Mark(Key),
    Seal,
}

impl Damage {
    pub(crate) fn new(path: &Path, offset: u64, why: &'static str, after_seq: u64) -> Damage {
        Damage {
            path: path.to_path_buf(),
            offset,
            len: 0,
            why,
            after_seq,
            before_seq: u64::MAX,
            file: None,
            range: None,
            harmless: false,
            hint: None,
        }
    }
}

/// How much of a segment is searched per read when looking for the next record.
const WINDOW: usize = 4 << 20;

/// The offset of the first valid record of the segment at or after `from`, whose seq is above
/// `last_seq`. A valid record is one whose CRC, seeded by the journal and segment, matches: data
/// that merely contains the magic bytes never passes.
pub(crate) fn resync(
    file: &File,
    path: &Path,
    from: u64,
    size: u64,
    seed: u32,
    last_seq: u64,
) -> Result<Option<u64>, JournalError> {
    let magic = format::MAGIC.to_le_bytes();
    let finder = memchr::memmem::Finder::new(&magic);
    let mut buf = vec![0u8; WINDOW];
    let mut base = from;
    while base < size {
        let want = (size - base).min(WINDOW as u64) as usize;
        let n = io::read_at_most(file, &mut buf[..want], base).map_err(io_err("read", path))?;
        if n < magic.len() {
            return Ok(None);
        }
        for at in finder.find_iter(&buf[..n]) {
            let off = base + at as u64;
            if valid_at(file, path, off, size, seed, last_seq)? {
                return Ok(Some(off));
            }
        }
        // Overlap by the magic's length less one, so a magic across two windows is seen.
        base += (n - (magic.len() - 1)) as u64;
    }
    Ok(None)
}

fn valid_at(
    file: &File,
    path: &Path,
    off: u64,
    size: u64,
    seed: u32,
    last_seq: u64,
) -> Result<bool, JournalError> {
    let mut payload = Vec::new();
    Ok(super::record::read_record(file, path, off, size, seed, last_seq, &mut payload)?.is_ok())
}

/// What the damaged record at `off` claims to be, read from its own bytes; `next` is where the
/// next valid record starts (None: the end of the segment).
pub(crate) fn hint(
    file: &File,
    path: &Path,
    off: u64,
    next: Option<u64>,
) -> Result<Option<Hint>, JournalError> {
    let mut hdr = [0u8; HDR];
    if io::read_at_most(file, &mut hdr, off).map_err(io_err("read", path))? < HDR {
        return Ok(None);
    }
    let stretch_end = match next {
        Some(n) => n,
        None => size_of(file, path)?,
    };
    // The claim covers the whole stretch only if the record's length leads exactly to the next
    // valid record (or to nothing but zeros up to the end of the segment): otherwise the
    // stretch may hold other records, whose owners are unknown.
    let exact = match format::parse_header(&hdr) {
        HeaderCheck::Ok(h) => {
            let end = off + HDR as u64 + h.len as u64;
            let checked = match next {
                Some(n) => n == end,
                None => end <= stretch_end && zeros_from(file, path, end)?,
            };
            checked.then_some(h)
        }
        _ => None,
    };
    match exact.map(|h| (h.kind, h.len as usize)) {
        Some((format::KIND_DONE | format::KIND_DROP, format::MARK_LEN)) => {
            let mut p = [0u8; 16];
            let n =
                io::read_at_most(file, &mut p, off + HDR as u64).map_err(io_err("read", path))?;
            match (n, get_u64(&p, 0), get_u64(&p, 8)) {
                (16, Some(dev), Some(ino)) => Ok(Some(Hint::Mark((dev, ino)))),
                _ => Ok(None),
            }
        }
        // A SEAL's length is its own (no DATA or mark record is this short): a damaged SEAL
        // held no write.
        Some((format::KIND_SEAL, format::SEAL_PAYLOAD)) => Ok(Some(Hint::Seal)),
        // A namespace operation: whose files it concerns is not told by its header. Unknown,
        // so every file with an older pending write is treated as at risk.
        Some((format::KIND_NS, _)) => Ok(None),
        Some((KIND_DATA, len)) if len >= DATA_FIXED => data_claim(file, path, off, Some(len)),
        // Header damaged: what a DATA record would say where its identity goes.
        _ => {
            let claim = data_claim(file, path, off, None)?;
            Ok(claim.filter(|_| stretch_end > off + (HDR + DATA_FIXED) as u64))
        }
    }
}

/// The identity part of a DATA record at `off` (`len`: its payload length, when the header is
/// intact and exact).
fn data_claim(
    file: &File,
    path: &Path,
    off: u64,
    len: Option<usize>,
) -> Result<Option<Hint>, JournalError> {
    let mut p = vec![0u8; len.unwrap_or(usize::MAX).min(DATA_FIXED + format::MAX_PATH)];
    let n = io::read_at_most(file, &mut p, off + HDR as u64).map_err(io_err("read", path))?;
    let p = &p[..n];
    let (Some(dev), Some(ino), Some(offset), Some(plen)) =
        (get_u64(p, 0), get_u64(p, 8), get_u64(p, 16), get_u16(p, 24))
    else {
        return Ok(None);
    };
    let plen = plen as usize;
    let Some(fpath) = p.get(DATA_FIXED..DATA_FIXED + plen) else {
        return Ok(None);
    };
    let data_len = len
        .filter(|&l| l >= DATA_FIXED + plen)
        .map(|l| (l - DATA_FIXED - plen) as u64);
    Ok(Some(Hint::Data {
        file: FileRef {
            dev,
            ino,
            path: fpath.to_vec(),
        },
        offset,
        len: data_len,
        exact: len.is_some(),
    }))
}

/// Whether `[from, to)` of the segment holds a whole 4 KiB page (at a page-aligned offset) of
/// zeros: a page that was never written. Application data of zeros inside a journal record
/// is also zeros, so this is asked only of a stretch that already failed its checks.
pub(crate) fn has_unwritten_page(
    file: &File,
    path: &Path,
    from: u64,
    to: u64,
) -> Result<bool, JournalError> {
    const PAGE: u64 = 4096;
    let mut at = from.div_ceil(PAGE) * PAGE;
    let mut buf = vec![0u8; WINDOW];
    while at + PAGE <= to {
        let want = ((to - at) / PAGE * PAGE).min(WINDOW as u64) as usize;
        let n = io::read_at_most(file, &mut buf[..want], at).map_err(io_err("read", path))?;
        if buf[..n]
            .chunks_exact(PAGE as usize)
            .any(|p| p.iter().all(|&b| b == 0))
        {
            return Ok(true);
        }
        if n < want {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(false)
}

fn size_of(file: &File, path: &Path) -> Result<u64, JournalError> {
    Ok(file.metadata().map_err(io_err("stat", path))?.len())
}

/// Whether everything from `from` to the end of the file is zero.
pub(crate) fn zeros_from(file: &File, path: &Path, from: u64) -> Result<bool, JournalError> {
    let mut buf = vec![0u8; WINDOW];
    let mut at = from;
    loop {
        let n = io::read_at_most(file, &mut buf, at).map_err(io_err("read", path))?;
        if n == 0 {
            return Ok(true);
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
}

/// Decides what each damage concerns (filling `file`, `range`, `harmless`) and returns the
/// files whose pending writes must not be replayed. `data` is every DATA record the scan read
/// (covered or not): a claimed identity is believed only if a valid record of the journal has
/// the same (dev, ino, path), which a random corruption of those bytes does not produce.
pub(crate) fn judge(
    damage: &mut [Damage],
    data: &[PendingWrite],
    marks: &FxHashMap<Key, u64>,
) -> FxHashSet<Key> {
    let covered = |k: &Key, seq: u64| marks.get(k).is_some_and(|&m| m >= seq);
    let mut known: FxHashMap<Key, FxHashSet<&[u8]>> = FxHashMap::default();
    for d in data {
        known
            .entry((d.file.dev, d.file.ino))
            .or_default()
            .insert(&d.file.path);
    }
    // Per file, the oldest seq of a write still pending.
    let mut oldest: FxHashMap<Key, u64> = FxHashMap::default();
    for d in data {
        let k = (d.file.dev, d.file.ino);
        if !covered(&k, d.seq) {
            let e = oldest.entry(k).or_insert(u64::MAX);
            *e = (*e).min(d.seq);
        }
    }
    let pending_before = |k: &Key, seq: u64| oldest.get(k).is_some_and(|&o| o < seq);
    let unknown = |before: u64| -> Vec<Key> {
        oldest
            .keys()
            .filter(|k| pending_before(k, before))
            .copied()
            .collect()
    };
    let mut at_risk = FxHashSet::default();
    for d in damage.iter_mut() {
        // The damaged record's seq is below `before_seq`: a file whose writes up to there are
        // all on the store (a DONE after the damage covers them) cannot be rolled back.
        let last_lost = d.before_seq.saturating_sub(1);
        match d.hint.clone() {
            Some(Hint::Seal) => d.harmless = true,
            Some(Hint::Data {
                file,
                offset,
                len,
                exact,
            }) => {
                let verified = exact
                    && known
                        .get(&(file.dev, file.ino))
                        .is_some_and(|p| p.contains(&file.path[..]));
                // Otherwise one half of what it claims may still name a file of the journal:
                // a single bad byte leaves its (dev, ino) or its path whole.
                let owner = if verified {
                    Some(file.clone())
                } else {
                    data.iter()
                        .find(|p| (p.file.dev, p.file.ino) == (file.dev, file.ino))
                        .or_else(|| data.iter().find(|p| p.file.path == file.path))
                        .map(|p| p.file.clone())
                };
                let Some(owner) = owner else {
                    at_risk.extend(unknown(d.before_seq));
                    continue;
                };
                let k = (owner.dev, owner.ino);
                d.range = Some((offset, len));
                d.file = Some(owner);
                if verified {
                    // Harmless if a DONE after the hole covers it; otherwise the write is lost,
                    // and the file's other pending writes are not replayed.
                    d.harmless = covered(&k, last_lost);
                } else {
                    // The stretch may hold other records too.
                    at_risk.extend(unknown(d.before_seq));
                }
                if !d.harmless && oldest.contains_key(&k) {
                    at_risk.insert(k);
                }
            }
            Some(Hint::Mark(k)) if known.contains_key(&k) => {
                d.file = data
                    .iter()
                    .rev()
                    .find(|p| (p.file.dev, p.file.ino) == k)
                    .map(|p| p.file.clone());
                d.harmless = !pending_before(&k, d.before_seq);
                if !d.harmless {
                    at_risk.insert(k);
                }
            }
            // Unknown owner: any file with a write pending from before the hole may have had a
            // newer one in it.
            _ => at_risk.extend(unknown(d.before_seq)),
        }
    }
    at_risk
}
