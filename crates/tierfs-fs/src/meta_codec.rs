//! The byte layout of metadata records persisted through the SSD tier (directory listings,
//! symlink targets). The SSD tier checksums every entry and stores it under the object's
//! identity and a version derived from its attributes, so a record of a directory that has
//! changed since is never read back. Documented in docs/ssd-tier.md ("Metadata records").
//!
//! Listing record, little-endian:
//!   u8 format (2) | u64 validated (ns since the epoch) | u64 session epoch | u32 count |
//!   count x { u16 name length | name bytes | attr (ATTR_LEN bytes) }
//! Attr: u64 dev | u64 ino | u8 kind | u16 perm | u32 nlink | u32 uid | u32 gid | u64 rdev |
//!   u64 size | u64 blocks | u32 blksize | 3 x (i64 sec, u32 nsec) for atime, mtime, ctime.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tierfs_store::{Attr, FileKind, Fingerprint, TimeSpec};

/// 2: the session epoch (`SsdCache::session_epoch`) was added; a record of format 1 reads as
/// a miss.
const FORMAT: u8 = 2;

/// A version number of an object's contents for the SSD tier: changes whenever the
/// fingerprint (size, mtime, ctime) does.
pub fn version_of(fp: &Fingerprint) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in [fp.size as u128, fp.mtime_ns as u128, fp.ctime_ns as u128] {
        for b in v.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The version a directory's listing record is stored under: the directory's version
/// ([`version_of`]) and the SSD tier's session epoch, so a record of another session is a miss
/// and a listing of this one replaces it even when the directory is unchanged (the SSD tier
/// keeps an entry it already has under the same version). See `namespace::persisted`.
pub fn listing_version(fp: &Fingerprint, epoch: u64) -> u64 {
    version_of(fp) ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
}

fn kind_code(k: FileKind) -> u8 {
    match k {
        FileKind::File => 0,
        FileKind::Dir => 1,
        FileKind::Symlink => 2,
        FileKind::Fifo => 3,
        FileKind::Socket => 4,
        FileKind::CharDev => 5,
        FileKind::BlockDev => 6,
    }
}

fn kind_from(c: u8) -> Option<FileKind> {
    Some(match c {
        0 => FileKind::File,
        1 => FileKind::Dir,
        2 => FileKind::Symlink,
        3 => FileKind::Fifo,
        4 => FileKind::Socket,
        5 => FileKind::CharDev,
        6 => FileKind::BlockDev,
        _ => return None,
    })
}

fn put_time(out: &mut Vec<u8>, t: &TimeSpec) {
    out.extend_from_slice(&t.sec.to_le_bytes());
    out.extend_from_slice(&t.nsec.to_le_bytes());
}

fn put_attr(out: &mut Vec<u8>, a: &Attr) {
    out.extend_from_slice(&a.dev.to_le_bytes());
    out.extend_from_slice(&a.ino.to_le_bytes());
    out.push(kind_code(a.kind));
    out.extend_from_slice(&a.perm.to_le_bytes());
    out.extend_from_slice(&a.nlink.to_le_bytes());
    out.extend_from_slice(&a.uid.to_le_bytes());
    out.extend_from_slice(&a.gid.to_le_bytes());
    out.extend_from_slice(&a.rdev.to_le_bytes());
    out.extend_from_slice(&a.size.to_le_bytes());
    out.extend_from_slice(&a.blocks.to_le_bytes());
    out.extend_from_slice(&a.blksize.to_le_bytes());
    put_time(out, &a.atime);
    put_time(out, &a.mtime);
    put_time(out, &a.ctime);
}

/// A cursor that fails (None) instead of panicking on a short record.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn time(&mut self) -> Option<TimeSpec> {
        let sec = self.u64()? as i64;
        let nsec = self.u32()?;
        Some(TimeSpec { sec, nsec })
    }
    fn attr(&mut self) -> Option<Attr> {
        Some(Attr {
            dev: self.u64()?,
            ino: self.u64()?,
            kind: kind_from(self.u8()?)?,
            perm: self.u16()?,
            nlink: self.u32()?,
            uid: self.u32()?,
            gid: self.u32()?,
            rdev: self.u64()?,
            size: self.u64()?,
            blocks: self.u64()?,
            blksize: self.u32()?,
            atime: self.time()?,
            mtime: self.time()?,
            ctime: self.time()?,
        })
    }
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The wall-clock time of an `Instant` (for persisting when something was validated).
pub fn instant_to_wall(at: Instant) -> u64 {
    wall_ns().saturating_sub(at.elapsed().as_nanos() as u64)
}

/// The `Instant` of a persisted wall-clock time; a time in the future counts as now.
pub fn wall_to_instant(ns: u64) -> Instant {
    let age = Duration::from_nanos(wall_ns().saturating_sub(ns));
    Instant::now().checked_sub(age).unwrap_or_else(Instant::now)
}

/// A decoded listing record.
pub struct ListingRecord {
    pub entries: Vec<(OsString, Attr)>,
    pub validated: Instant,
    /// The SSD tier's session epoch when it was written.
    pub epoch: u64,
}

pub fn encode_listing(
    entries: &[(OsString, Attr)],
    validated: Instant,
    epoch: u64,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(24 + entries.len() * 128);
    out.push(FORMAT);
    out.extend_from_slice(&instant_to_wall(validated).to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (name, a) in entries {
        let n = name.as_bytes();
        out.extend_from_slice(&u16::try_from(n.len()).ok()?.to_le_bytes());
        out.extend_from_slice(n);
        put_attr(&mut out, a);
    }
    Some(out)
}

pub fn decode_listing(b: &[u8]) -> Option<ListingRecord> {
    let mut r = Reader(b);
    if r.u8()? != FORMAT {
        return None;
    }
    let validated = wall_to_instant(r.u64()?);
    let epoch = r.u64()?;
    let n = r.u32()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let len = r.u16()? as usize;
        let name = OsString::from_vec(r.take(len)?.to_vec());
        out.push((name, r.attr()?));
    }
    r.0.is_empty().then_some(ListingRecord {
        entries: out,
        validated,
        epoch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_round_trip_and_short_input() {
        let a = Attr {
            dev: 1,
            ino: 2,
            kind: FileKind::Symlink,
            perm: 0o4755,
            nlink: 3,
            uid: 4,
            gid: 5,
            rdev: 6,
            size: 7,
            blocks: 8,
            blksize: 4096,
            atime: TimeSpec { sec: -1, nsec: 9 },
            mtime: TimeSpec { sec: 10, nsec: 11 },
            ctime: TimeSpec { sec: 12, nsec: 13 },
        };
        let entries = vec![("x".into(), a), ("é".into(), a)];
        let at = Instant::now();
        let b = encode_listing(&entries, at, 0xfeed).unwrap();
        let back = decode_listing(&b).unwrap();
        assert_eq!(back.entries, entries);
        assert_eq!(back.epoch, 0xfeed);
        assert!(back.validated <= Instant::now());
        for cut in 0..b.len() {
            assert!(decode_listing(&b[..cut]).is_none());
        }
        // A record of the format before the epoch is a miss, not misread.
        let mut old = b.clone();
        old[0] = 1;
        assert!(decode_listing(&old).is_none());
    }
}
