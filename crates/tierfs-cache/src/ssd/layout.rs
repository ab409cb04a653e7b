//! The byte layout of a cluster (see docs/ssd-tier.md) and the checksums that guard it.
//!
//! ```text
//! cluster = [header 64 B | records | zero padding to 4 KiB] [entry data, zero padding to 4 KiB]
//! ```
//! Every integer is little-endian. Entries of 4 KiB or more start on a 4 KiB boundary of the
//! data area (which itself starts on one), so a sub-range read is an aligned page read;
//! smaller ones are packed on 512-byte boundaries.

use super::aligned::PAGE;
use super::SsdKey;

/// On-disk format version, in the superblock, every cluster header and the checkpoint.
/// 2: keys name objects by their identity (`(0, inode)` or a path hash), no longer by the
/// backing device and inode numbers. A directory of another format is rebuilt at open.
pub(crate) const FORMAT: u32 = 2;
pub(crate) const CLUSTER_MAGIC: u32 = u32::from_le_bytes(*b"TSCL");
pub(crate) const HDR: usize = 64;
/// Fixed part of a record; the page CRCs follow it.
pub(crate) const REC_FIXED: usize = 48;
/// A record that removes its key (`remove`), with no data and no page CRCs.
pub(crate) const FLAG_TOMBSTONE: u8 = 1;
/// Small entries are packed on this alignment.
pub(crate) const SMALL_ALIGN: u64 = 512;

pub(crate) fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Page CRCs of an entry: one per 4 KiB of data, and one for an entry under 4 KiB (or empty).
pub(crate) fn npages(len: u32) -> usize {
    (len as usize).div_ceil(PAGE).max(1)
}

pub(crate) fn rec_size(len: u32) -> usize {
    REC_FIXED + 4 * npages(len)
}

/// Where an entry of `len` bytes may start in the data area.
pub(crate) fn align_for(len: u32) -> u64 {
    if len as usize >= PAGE {
        PAGE as u64
    } else {
        SMALL_ALIGN
    }
}

/// The seed of an entry's CRCs: the entry's identity. A read that lands on another entry's
/// bytes (a misdirected read, a stale index) fails verification instead of being served.
pub(crate) fn entry_seed(key: &SsdKey, version: u64) -> u32 {
    let mut b = [0u8; 33];
    b[0] = key.kind;
    b[1..9].copy_from_slice(&key.dev.to_le_bytes());
    b[9..17].copy_from_slice(&key.ino.to_le_bytes());
    b[17..25].copy_from_slice(&key.idx.to_le_bytes());
    b[25..33].copy_from_slice(&version.to_le_bytes());
    crc32c::crc32c(&b)
}

/// CRC of page `no` of an entry; the page number is mixed in so swapped pages are caught too.
pub(crate) fn page_crc(seed: u32, no: usize, data: &[u8]) -> u32 {
    crc32c::crc32c_append(seed ^ (no as u32).wrapping_mul(0x9E37_79B1), data)
}

/// The seed of summary and checkpoint CRCs: the store's uuid, so a cluster left by an earlier
/// generation of the directory (before a reset) is not taken for ours.
pub(crate) fn store_seed(uuid: &[u8; 16]) -> u32 {
    crc32c::crc32c(uuid)
}

pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Bounds-checked little-endian reads: decoding untrusted bytes never panics.
pub(crate) fn get_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub(crate) fn get_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The header of a cluster, as decoded and checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClusterHeader {
    /// Bytes of header + records + padding; a multiple of 4 KiB. The data area follows.
    pub summary_len: u32,
    /// Bytes of the whole cluster; a multiple of 4 KiB.
    pub cluster_len: u32,
    pub n_records: u32,
    pub records_len: u32,
}

/// Offsets inside the 64-byte header.
mod h {
    pub const MAGIC: usize = 0;
    pub const FORMAT: usize = 4;
    pub const UUID: usize = 8;
    pub const SEQ: usize = 24;
    pub const OFFSET: usize = 32;
    pub const SUMMARY_LEN: usize = 40;
    pub const CLUSTER_LEN: usize = 44;
    pub const N_RECORDS: usize = 48;
    pub const RECORDS_LEN: usize = 52;
    pub const CRC: usize = 60;
}

/// Writes the header into `summary[..64]` and seals it: the CRC covers header bytes 0..60 and
/// the records that follow.
pub(crate) fn seal_header(
    summary: &mut [u8],
    uuid: &[u8; 16],
    seed: u32,
    seq: u64,
    offset: u64,
    hdr: &ClusterHeader,
) {
    summary[..HDR].fill(0);
    put_u32(summary, h::MAGIC, CLUSTER_MAGIC);
    put_u32(summary, h::FORMAT, FORMAT);
    summary[h::UUID..h::UUID + 16].copy_from_slice(uuid);
    put_u64(summary, h::SEQ, seq);
    put_u64(summary, h::OFFSET, offset);
    put_u32(summary, h::SUMMARY_LEN, hdr.summary_len);
    put_u32(summary, h::CLUSTER_LEN, hdr.cluster_len);
    put_u32(summary, h::N_RECORDS, hdr.n_records);
    put_u32(summary, h::RECORDS_LEN, hdr.records_len);
    let crc = summary_crc(seed, summary, hdr.records_len as usize);
    put_u32(summary, h::CRC, crc);
}

fn summary_crc(seed: u32, summary: &[u8], records_len: usize) -> u32 {
    let c = crc32c::crc32c_append(seed, &summary[..h::CRC]);
    crc32c::crc32c_append(c, &summary[HDR..HDR + records_len])
}

/// Decodes and checks the fixed header from the first page of a cluster found at `offset` of
/// segment `seq`. Says why it is not a valid cluster of ours.
pub(crate) fn parse_header(
    page: &[u8],
    uuid: &[u8; 16],
    seq: u64,
    offset: u64,
    max_cluster: u64,
) -> Result<ClusterHeader, &'static str> {
    let g32 = |at| get_u32(page, at).ok_or("short header");
    let g64 = |at| get_u64(page, at).ok_or("short header");
    if g32(h::MAGIC)? != CLUSTER_MAGIC {
        return Err("no cluster magic");
    }
    if g32(h::FORMAT)? != FORMAT {
        return Err("other format version");
    }
    if page.get(h::UUID..h::UUID + 16) != Some(&uuid[..]) {
        return Err("other store generation");
    }
    if g64(h::SEQ)? != seq || g64(h::OFFSET)? != offset {
        return Err("misplaced cluster");
    }
    let hdr = ClusterHeader {
        summary_len: g32(h::SUMMARY_LEN)?,
        cluster_len: g32(h::CLUSTER_LEN)?,
        n_records: g32(h::N_RECORDS)?,
        records_len: g32(h::RECORDS_LEN)?,
    };
    let want_summary = round_up(HDR as u64 + hdr.records_len as u64, PAGE as u64);
    if hdr.summary_len as u64 != want_summary
        || hdr.cluster_len < hdr.summary_len
        || !(hdr.cluster_len as u64).is_multiple_of(PAGE as u64)
        || hdr.cluster_len as u64 > max_cluster
        || (hdr.n_records as usize) * REC_FIXED > hdr.records_len as usize
    {
        return Err("bad lengths");
    }
    Ok(hdr)
}

/// Checks the summary CRC; `summary` holds at least `hdr.summary_len` bytes.
pub(crate) fn summary_ok(seed: u32, summary: &[u8], hdr: &ClusterHeader) -> bool {
    let Some(stored) = get_u32(summary, h::CRC) else {
        return false;
    };
    summary.len() >= HDR + hdr.records_len as usize
        && summary_crc(seed, summary, hdr.records_len as usize) == stored
}

/// One record of a summary, borrowed from the summary bytes.
pub(crate) struct RecordView<'a> {
    pub key: SsdKey,
    pub version: u64,
    pub flags: u8,
    /// Offset of the data in the cluster's data area.
    pub data_off: u32,
    pub len: u32,
    /// The page CRCs, little-endian u32s.
    pub crcs: &'a [u8],
}

impl RecordView<'_> {
    pub fn crc_iter(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.crcs
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// Appends one record at `out[at..]`; returns the bytes written. `out` must have room
/// (`rec_size`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn put_record(
    out: &mut [u8],
    at: usize,
    key: &SsdKey,
    version: u64,
    flags: u8,
    data_off: u32,
    len: u32,
    crcs: &[u32],
) -> usize {
    let r = &mut out[at..at + REC_FIXED + 4 * crcs.len()];
    r[0] = key.kind;
    r[1] = flags;
    r[2] = 0;
    r[3] = 0;
    put_u32(r, 4, len);
    put_u64(r, 8, key.dev);
    put_u64(r, 16, key.ino);
    put_u64(r, 24, key.idx);
    put_u64(r, 32, version);
    put_u32(r, 40, data_off);
    put_u32(r, 44, 0);
    for (i, c) in crcs.iter().enumerate() {
        put_u32(r, REC_FIXED + 4 * i, *c);
    }
    REC_FIXED + 4 * crcs.len()
}

/// Decodes the records of a summary whose CRC matched, checking each against the data area.
/// Calls `f` per record in order, but only once the whole summary is known consistent: an
/// inconsistent record drops the whole cluster (the error says why).
pub(crate) fn for_each_record(
    summary: &[u8],
    hdr: &ClusterHeader,
    mut f: impl FnMut(RecordView<'_>),
) -> Result<(), &'static str> {
    walk_records(summary, hdr, &mut |_| ())?;
    walk_records(summary, hdr, &mut f)
}

fn walk_records(
    summary: &[u8],
    hdr: &ClusterHeader,
    f: &mut dyn FnMut(RecordView<'_>),
) -> Result<(), &'static str> {
    const OVERRUN: &str = "record overrun";
    let data_len = hdr.cluster_len.saturating_sub(hdr.summary_len) as u64;
    let end = HDR + hdr.records_len as usize;
    let recs = summary.get(HDR..end).ok_or("short summary")?;
    let mut at = 0usize;
    for _ in 0..hdr.n_records {
        let fixed = recs.get(at..at + REC_FIXED).ok_or(OVERRUN)?;
        let flags = fixed[1];
        let len = get_u32(fixed, 4).ok_or(OVERRUN)?;
        let data_off = get_u32(fixed, 40).ok_or(OVERRUN)?;
        let n = if flags & FLAG_TOMBSTONE != 0 {
            0
        } else {
            if data_off as u64 + len as u64 > data_len
                || !(data_off as u64).is_multiple_of(align_for(len))
            {
                return Err("record outside its cluster");
            }
            npages(len)
        };
        let crcs = recs
            .get(at + REC_FIXED..at + REC_FIXED + 4 * n)
            .ok_or(OVERRUN)?;
        f(RecordView {
            key: SsdKey {
                kind: fixed[0],
                dev: get_u64(fixed, 8).ok_or(OVERRUN)?,
                ino: get_u64(fixed, 16).ok_or(OVERRUN)?,
                idx: get_u64(fixed, 24).ok_or(OVERRUN)?,
            },
            version: get_u64(fixed, 32).ok_or(OVERRUN)?,
            flags,
            data_off,
            len,
            crcs,
        });
        at += REC_FIXED + 4 * n;
    }
    if at != recs.len() {
        return Err("record lengths disagree");
    }
    Ok(())
}

/// Page CRCs of `data` as stored in a record.
pub(crate) fn compute_crcs(key: &SsdKey, version: u64, data: &[u8], out: &mut Vec<u32>) {
    let seed = entry_seed(key, version);
    out.clear();
    if data.is_empty() {
        out.push(page_crc(seed, 0, data));
        return;
    }
    out.extend(
        data.chunks(PAGE)
            .enumerate()
            .map(|(i, p)| page_crc(seed, i, p)),
    );
}
