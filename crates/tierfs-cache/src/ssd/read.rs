//! The read path: read the aligned pages an entry (or a range of it) lies in, verify every
//! page CRC they cover, hand out a slice of the aligned buffer. Nothing unverified leaves here.

use super::aligned::{AlignedBuf, PAGE};
use super::index::Loc;
use super::layout::{entry_seed, page_crc};
use super::SsdKey;
use bytes::Bytes;
use std::os::unix::fs::FileExt;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadFail {
    /// The read failed or came back short.
    Io,
    /// The data does not match its CRC (or the index's CRC list is inconsistent).
    Checksum,
    /// The range starts past the end of the entry.
    Range,
}

/// Reads bytes `offset .. offset + len` of the entry at `loc` (clipped to its end), verifying
/// the CRC units they touch: the 4 KiB pages of an entry of 4 KiB or more, the whole entry
/// if it is smaller.
pub(crate) fn read_verified(
    key: &SsdKey,
    loc: &Loc,
    offset: u32,
    len: u32,
) -> Result<Bytes, ReadFail> {
    let page = PAGE as u64;
    let elen = loc.len as u64;
    let start = offset as u64;
    if start > elen {
        return Err(ReadFail::Range);
    }
    let end = (start + len as u64).min(elen);
    if end == start && elen != 0 {
        return Ok(Bytes::new());
    }
    // CRC units touched, and the entry bytes they cover.
    let (p0, p1) = if elen < page {
        (0, 1)
    } else {
        (start / page, end.div_ceil(page))
    };
    let (u0, u1) = (p0 * page, (p1 * page).min(elen));
    // The aligned file range holding them.
    let a0 = (loc.off + u0) / page * page;
    let a1 = (loc.off + u1).div_ceil(page) * page;
    let n = (a1 - a0) as usize;
    let mut buf = AlignedBuf::new(n).ok_or(ReadFail::Io)?;
    if n > 0 {
        loc.seg
            .file
            .read_exact_at(&mut buf.as_mut_slice()[..n], a0)
            .map_err(|_| ReadFail::Io)?;
    }
    check_pages(key, loc, buf.as_slice(), a0, p0, p1)?;
    let s = (loc.off + start - a0) as usize;
    let e = (loc.off + end - a0) as usize;
    Ok(Bytes::from_owner(buf).slice(s..e))
}

/// Checks the CRC units `p0..p1` of the entry at `loc` against `data`, which holds the
/// segment file from byte `base`.
fn check_pages(
    key: &SsdKey,
    loc: &Loc,
    data: &[u8],
    base: u64,
    p0: u64,
    p1: u64,
) -> Result<(), ReadFail> {
    let page = PAGE as u64;
    let elen = loc.len as u64;
    let seed = entry_seed(key, loc.version);
    for p in p0..p1 {
        let b = (loc.off + p * page - base) as usize;
        let e = b + ((elen - p * page).min(page)) as usize;
        let want = loc.crcs.get(p as usize).ok_or(ReadFail::Checksum)?;
        let got = data.get(b..e).ok_or(ReadFail::Io)?;
        if page_crc(seed, p as usize, got) != *want {
            return Err(ReadFail::Checksum);
        }
    }
    Ok(())
}

/// Largest single read [`read_run`] issues.
pub(crate) const MAX_RUN_READ: u64 = 8 << 20;

/// Verifies the whole entry at `loc` inside `data`, which holds the file from byte `base`.
pub(crate) fn verify_in(
    key: &SsdKey,
    loc: &Loc,
    data: &[u8],
    base: u64,
) -> Result<Bytes, ReadFail> {
    let page = PAGE as u64;
    let elen = loc.len as u64;
    let units = if elen < page { 1 } else { elen.div_ceil(page) };
    check_pages(key, loc, data, base, 0, units)?;
    let s = (loc.off - base) as usize;
    // A copy per entry: the caller caches entries one by one, and a slice would pin the whole
    // run's buffer until every entry of it was evicted.
    Ok(Bytes::copy_from_slice(&data[s..s + elen as usize]))
}

/// Reads whole entries that lie close together in one segment (blocks of a file admitted in
/// order are) with one aligned read, then verifies each. `locs` must be sorted by offset and
/// in one segment, spanning at most [`MAX_RUN_READ`].
pub(crate) fn read_run(items: &[(SsdKey, Loc)]) -> Vec<Result<Bytes, ReadFail>> {
    let page = PAGE as u64;
    let (Some(first), Some(last)) = (items.first(), items.last()) else {
        return Vec::new();
    };
    let a0 = first.1.off / page * page;
    let a1 = (last.1.off + last.1.len as u64).div_ceil(page) * page;
    let n = (a1 - a0) as usize;
    let Some(mut buf) = AlignedBuf::new(n) else {
        return items.iter().map(|_| Err(ReadFail::Io)).collect();
    };
    if n > 0
        && first
            .1
            .seg
            .file
            .read_exact_at(&mut buf.as_mut_slice()[..n], a0)
            .is_err()
    {
        return items.iter().map(|_| Err(ReadFail::Io)).collect();
    }
    let data = &buf.as_slice()[..n];
    items
        .iter()
        .map(|(k, loc)| verify_in(k, loc, data, a0))
        .collect()
}
