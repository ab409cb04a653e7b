//! The byte layout of journal records (docs/writeback/journal.md, "Journal format") and their
//! checksum.
//!
//! ```text
//! record = header (24 B) | payload
//! header = 0 magic "TJRC" u32 | 4 kind u8 | 5 flags u8 | 6 zero u16 | 8 seq u64
//!          | 16 payload length u32 | 20 CRC32C (seeded, over header bytes 0..20 + payload)
//! ```
//! Every integer is little-endian. Decoding untrusted bytes never panics.

/// On-disk format version, in the superblock. Format 2 added NS records; a format-1 journal
/// (which has none) is read as it is and its superblock rewritten as format 2.
pub(crate) const FORMAT: u32 = 2;
/// The oldest format this version reads.
pub(crate) const FORMAT_MIN: u32 = 1;
pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"TJRC");
pub(crate) const HDR: usize = 24;

pub(crate) const KIND_DATA: u8 = 1;
pub(crate) const KIND_DONE: u8 = 2;
pub(crate) const KIND_DROP: u8 = 3;
/// Closes a segment: nothing follows it, and the next segment may be written. Every segment but
/// the last must end with one, which is how a damaged older segment is told from a torn tail.
pub(crate) const KIND_SEAL: u8 = 4;
/// A namespace operation (create, mkdir, setattr, ...) acknowledged before it reached the store
/// (format 2). The payload is the caller's encoding; the journal keeps NS records in seq order
/// and a DONE of [`NS_KEY`] covers them.
pub(crate) const KIND_NS: u8 = 5;

/// The key DONE records of namespace operations carry: `Done { dev: NS_KEY.0, ino: NS_KEY.1,
/// upto_seq }` says every NS record up to `upto_seq` is applied to the store, durably.
pub const NS_KEY: (u64, u64) = (u64::MAX, 0);
/// Longest NS payload (two paths and a little).
pub const MAX_NS: usize = 2 * MAX_PATH + 256;
/// DATA payload before the path: dev u64, ino u64, offset u64, path length u16.
pub(crate) const DATA_FIXED: usize = 26;
/// DONE and DROP payload: dev u64, ino u64, upto_seq u64.
pub(crate) const MARK_LEN: usize = 24;
/// SEAL payload: its own offset in the segment (u64).
pub(crate) const SEAL_PAYLOAD: usize = 8;
/// Room kept free at the end of every segment so a SEAL always fits after any record.
pub(crate) const SEAL_LEN: u64 = (HDR + SEAL_PAYLOAD) as u64;
/// Longest path a DATA record carries (Linux PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// A backing file as the journal names it: identity (to match DONE records) and the path to
/// reopen it by at replay, when no descriptor survives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileRef {
    pub dev: u64,
    pub ino: u64,
    /// Relative to the backing root, raw bytes.
    pub path: Vec<u8>,
}

/// What a caller appends.
#[derive(Clone, Copy, Debug)]
pub enum Record<'a> {
    /// `data` was written at `offset` of `file` and is not yet on the backing store.
    Data {
        file: &'a FileRef,
        offset: u64,
        data: &'a [u8],
    },
    /// Every DATA of (dev, ino) with seq <= `upto_seq` is on the backing store, durable.
    Done { dev: u64, ino: u64, upto_seq: u64 },
    /// Same effect as `Done`, but the data was discarded (unlink, truncate).
    Drop { dev: u64, ino: u64, upto_seq: u64 },
    /// A namespace operation, encoded by the caller (at most [`MAX_NS`] bytes).
    Ns { payload: &'a [u8] },
}

impl Record<'_> {
    pub(crate) fn kind(&self) -> u8 {
        match self {
            Record::Data { .. } => KIND_DATA,
            Record::Done { .. } => KIND_DONE,
            Record::Drop { .. } => KIND_DROP,
            Record::Ns { .. } => KIND_NS,
        }
    }

    pub(crate) fn payload_len(&self) -> usize {
        match self {
            Record::Data { file, data, .. } => DATA_FIXED + file.path.len() + data.len(),
            Record::Ns { payload } => payload.len(),
            _ => MARK_LEN,
        }
    }

    /// Bytes the record takes in a segment.
    pub fn encoded_len(&self) -> u64 {
        (HDR + self.payload_len()) as u64
    }
}

/// The CRC seed of the records of one segment: the journal's uuid and the segment's number, so a
/// record left by an earlier generation of the journal (before a reset), or a segment file under
/// another name, fails verification instead of being replayed.
pub(crate) fn seg_seed(uuid: &[u8; 16], seg: u64) -> u32 {
    let mut b = [0u8; 24];
    b[..16].copy_from_slice(uuid);
    b[16..].copy_from_slice(&seg.to_le_bytes());
    crc32c::crc32c(&b)
}

/// A record with its payload checksum computed, ready to be placed. Built before the journal's
/// lock is taken: the CRC of a 1 MiB payload is the expensive part of an append, and only the
/// 20 header bytes depend on what is decided under the lock (seq, segment).
pub(crate) struct Prepared<'a> {
    pub kind: u8,
    /// The payload before the caller's data (all of it for DONE/DROP).
    prefix: Vec<u8>,
    pub data: &'a [u8],
    /// The caller's buffer holding `data`, when the caller handed one over and it is large:
    /// the batch then refers to it instead of copying it, and the writer thread checksums it
    /// (see `put_head`).
    pub shared: Option<bytes::Bytes>,
    /// CRC of the payload, computed before the lock; None for a shared payload.
    payload_crc: Option<u32>,
}

/// Payloads at least this large and handed over as shared buffers are referred to by the batch
/// instead of copied into it (below it, an iovec costs more than the copy), and checksummed by
/// the writer thread rather than by the caller, who is waiting for its write to return.
pub(crate) const SHARE_MIN: usize = 16 << 10;

pub(crate) fn prepare<'a>(rec: &Record<'a>, shared: Option<bytes::Bytes>) -> Prepared<'a> {
    let mut prefix = Vec::with_capacity(DATA_FIXED + MAX_PATH.min(256));
    let data: &[u8] = match rec {
        Record::Data { file, offset, data } => {
            prefix.extend_from_slice(&file.dev.to_le_bytes());
            prefix.extend_from_slice(&file.ino.to_le_bytes());
            prefix.extend_from_slice(&offset.to_le_bytes());
            prefix.extend_from_slice(&(file.path.len() as u16).to_le_bytes());
            prefix.extend_from_slice(&file.path);
            data
        }
        Record::Done { dev, ino, upto_seq } | Record::Drop { dev, ino, upto_seq } => {
            prefix.extend_from_slice(&dev.to_le_bytes());
            prefix.extend_from_slice(&ino.to_le_bytes());
            prefix.extend_from_slice(&upto_seq.to_le_bytes());
            &[]
        }
        Record::Ns { payload } => payload,
    };
    let shared = shared.filter(|b| b.len() >= SHARE_MIN);
    let payload_crc = match shared {
        Some(_) => None,
        None => Some(crc32c::crc32c_append(crc32c::crc32c(&prefix), data)),
    };
    Prepared {
        kind: rec.kind(),
        prefix,
        data,
        shared,
        payload_crc,
    }
}

/// Appends the prepared record with sequence number `seq` to `out`, for a segment whose seed is
/// `seed`.
#[cfg(test)]
pub(crate) fn put(out: &mut Vec<u8>, seed: u32, seq: u64, p: &Prepared<'_>) {
    let start = out.len();
    let open = put_head(out, seed, seq, p);
    out.extend_from_slice(p.data);
    if let Some(partial) = open {
        finish_crc(out, start, partial, p.data);
    }
}

/// Appends the header and the payload prefix of the prepared record (everything but the
/// caller's data, which the caller places: copied after it, or referred to). With the payload's
/// CRC known, the header is complete. For a shared payload it returns the CRC so far (seed,
/// header, prefix): `finish_crc` completes the header once the data is checksummed.
pub(crate) fn put_head(out: &mut Vec<u8>, seed: u32, seq: u64, p: &Prepared<'_>) -> Option<u32> {
    let len = p.prefix.len() + p.data.len();
    let start = begin(out, p.kind, seq, len);
    let hcrc = crc32c::crc32c_append(seed, &out[start..start + 20]);
    let open = match p.payload_crc {
        Some(pc) => {
            let crc = shift::combine(hcrc, pc, len);
            out[start + 20..start + HDR].copy_from_slice(&crc.to_le_bytes());
            None
        }
        None => Some(crc32c::crc32c_append(hcrc, &p.prefix)),
    };
    out.extend_from_slice(&p.prefix);
    open
}

/// Completes the header at `start` in `out` of a record whose CRC so far is `partial` (see
/// `put_head`) and whose data is `data`.
pub(crate) fn finish_crc(out: &mut [u8], start: usize, partial: u32, data: &[u8]) {
    let crc = crc32c::crc32c_append(partial, data);
    out[start + 20..start + HDR].copy_from_slice(&crc.to_le_bytes());
}

/// `crc32c_combine` without the crate's matrix squaring. The combine of a header CRC with a
/// payload's CRC runs under the journal's lock, once per record; in the crate it squares a
/// 32x32 GF(2) matrix per bit of the length (tens of microseconds for a 512 KiB payload: 7% of
/// the daemon's CPU in a streaming write; an untar, whose every file has another length, spent
/// 13% of the fuser threads' CPU in it). Here, as in zlib since 1.2.12: shifting a CRC by `len`
/// zero bytes multiplies it by x^(8 len) modulo the polynomial, and x^(8 len) is the product of
/// the precomputed x^(2^k) for the bits set in 8 len: one 32-step multiplication per bit.
mod shift {
    /// CRC-32C, reflected.
    const POLY: u32 = 0x82F6_3B78;

    /// a * b modulo POLY (reflected bit order: bit 31 is x^0). `a` must not be 0.
    const fn multmodp(a: u32, mut b: u32) -> u32 {
        let mut m = 1u32 << 31;
        let mut p = 0;
        loop {
            if a & m != 0 {
                p ^= b;
                if a & (m - 1) == 0 {
                    return p;
                }
            }
            m >>= 1;
            b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        }
    }

    /// X2N[k] = x^(2^k) modulo POLY.
    const X2N: [u32; 32] = {
        let mut t = [0u32; 32];
        let mut p = 1u32 << 30; // x^1
        t[0] = p;
        let mut k = 1;
        while k < 32 {
            p = multmodp(p, p);
            t[k] = p;
            k += 1;
        }
        t
    };

    /// x^(n 2^k) modulo POLY.
    fn x2nmodp(mut n: u64, mut k: usize) -> u32 {
        let mut p = 1u32 << 31; // x^0
        while n != 0 {
            if n & 1 != 0 {
                p = multmodp(X2N[k & 31], p);
            }
            n >>= 1;
            k += 1;
        }
        p
    }

    /// The CRC of A ++ B from the CRCs `a` of A and `b` of B, `len` the length of B.
    pub(crate) fn combine(a: u32, b: u32, len: usize) -> u32 {
        if len == 0 {
            return a;
        }
        // x2nmodp is never 0 (POLY has an x^0 term), as multmodp asks.
        multmodp(x2nmodp(len as u64, 3), a) ^ b
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn shift_equals_the_crates_combine() {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for len in [0usize, 1, 7, 4096, 524_288, 1 << 20, 1_000_003] {
                for _ in 0..50 {
                    let (a, b) = (next() as u32, next() as u32);
                    let want = crc32c::crc32c_combine(a, b, len);
                    assert_eq!(super::combine(a, b, len), want, "len {len}");
                }
            }
            // And against the definition: the CRC of a concatenation.
            let data: Vec<u8> = (0..70_000u32)
                .map(|i| i.wrapping_mul(2_654_435_761) as u8)
                .collect();
            for cut in [0, 1, 3000, 69_999, 70_000] {
                let (l, r) = data.split_at(cut);
                let whole = crc32c::crc32c(&data);
                for _ in 0..3 {
                    let got = super::combine(crc32c::crc32c(l), crc32c::crc32c(r), r.len());
                    assert_eq!(got, whole, "cut {cut}");
                }
            }
        }
    }
}

/// Appends the encoding of `rec` to `out` (tests; the journal uses `prepare` + `put`).
#[cfg(test)]
pub(crate) fn encode(out: &mut Vec<u8>, seed: u32, seq: u64, rec: &Record<'_>) {
    put(out, seed, seq, &prepare(rec, None));
}

/// Appends a SEAL record placed at `at` in its segment.
pub(crate) fn encode_seal(out: &mut Vec<u8>, seed: u32, seq: u64, at: u64) {
    let start = begin(out, KIND_SEAL, seq, SEAL_PAYLOAD);
    out.extend_from_slice(&at.to_le_bytes());
    seal_crc(out, start, seed);
}

fn begin(out: &mut Vec<u8>, kind: u8, seq: u64, payload_len: usize) -> usize {
    let start = out.len();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&[kind, 0, 0, 0]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    start
}

fn seal_crc(out: &mut [u8], start: usize, seed: u32) {
    let crc = record_crc(seed, &out[start..start + HDR], &out[start + HDR..]);
    out[start + 20..start + HDR].copy_from_slice(&crc.to_le_bytes());
}

fn record_crc(seed: u32, hdr: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c_append(seed, &hdr[..20]), payload)
}

pub(crate) fn get_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

pub(crate) fn get_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub(crate) fn get_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A decoded record header, before its payload is read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Header {
    pub kind: u8,
    pub seq: u64,
    pub len: u32,
    pub crc: u32,
}

/// What a header slot holds.
pub(crate) enum HeaderCheck {
    /// All zero: never written (preallocated space). The normal end of an unsealed segment.
    Zero,
    Bad(&'static str),
    Ok(Header),
}

pub(crate) fn parse_header(b: &[u8]) -> HeaderCheck {
    let Some(b) = b.get(..HDR) else {
        return HeaderCheck::Bad("short header");
    };
    if b.iter().all(|&x| x == 0) {
        return HeaderCheck::Zero;
    }
    if get_u32(b, 0) != Some(MAGIC) {
        return HeaderCheck::Bad("no record magic");
    }
    let kind = b[4];
    if !(KIND_DATA..=KIND_NS).contains(&kind) {
        return HeaderCheck::Bad("unknown record kind");
    }
    // Flags and the reserved bytes are zero in format 1; anything else is not ours.
    if b[5..8] != [0, 0, 0] {
        return HeaderCheck::Bad("unknown record flags");
    }
    let (Some(seq), Some(len), Some(crc)) = (get_u64(b, 8), get_u32(b, 16), get_u32(b, 20)) else {
        return HeaderCheck::Bad("short header");
    };
    HeaderCheck::Ok(Header {
        kind,
        seq,
        len,
        crc,
    })
}

/// Checks the CRC of a record whose header bytes are `hdr` and payload `payload`.
pub(crate) fn crc_ok(seed: u32, hdr: &[u8], h: &Header, payload: &[u8]) -> bool {
    hdr.len() >= HDR && payload.len() == h.len as usize && record_crc(seed, hdr, payload) == h.crc
}

/// A checked record's payload, borrowed.
#[derive(Debug)]
pub(crate) enum Decoded<'a> {
    Data {
        dev: u64,
        ino: u64,
        offset: u64,
        path: &'a [u8],
        data: &'a [u8],
    },
    Done {
        dev: u64,
        ino: u64,
        upto: u64,
    },
    Drop {
        dev: u64,
        ino: u64,
        upto: u64,
    },
    Seal {
        at: u64,
    },
    Ns {
        payload: &'a [u8],
    },
}

/// Decodes the payload of a record whose CRC matched. Lengths are still checked: a CRC proves we
/// wrote the bytes, not that this version of the code understands them.
pub(crate) fn decode(kind: u8, p: &[u8]) -> Result<Decoded<'_>, &'static str> {
    let u = |at| get_u64(p, at).ok_or("short payload");
    match kind {
        KIND_DATA => {
            let plen = get_u16(p, 24).ok_or("short payload")? as usize;
            let path = p
                .get(DATA_FIXED..DATA_FIXED + plen)
                .ok_or("path beyond payload")?;
            Ok(Decoded::Data {
                dev: u(0)?,
                ino: u(8)?,
                offset: u(16)?,
                path,
                data: &p[DATA_FIXED + plen..],
            })
        }
        KIND_DONE | KIND_DROP if p.len() == MARK_LEN => {
            let (dev, ino, upto) = (u(0)?, u(8)?, u(16)?);
            Ok(if kind == KIND_DONE {
                Decoded::Done { dev, ino, upto }
            } else {
                Decoded::Drop { dev, ino, upto }
            })
        }
        KIND_SEAL if p.len() == SEAL_PAYLOAD => Ok(Decoded::Seal { at: u(0)? }),
        KIND_NS if !p.is_empty() && p.len() <= MAX_NS => Ok(Decoded::Ns { payload: p }),
        _ => Err("payload length does not match its kind"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_crc() {
        let f = FileRef {
            dev: 7,
            ino: 9,
            path: b"a/b".to_vec(),
        };
        let rec = Record::Data {
            file: &f,
            offset: 4096,
            data: b"hello",
        };
        let mut out = Vec::new();
        encode(&mut out, 11, 42, &rec);
        assert_eq!(out.len() as u64, rec.encoded_len());
        let HeaderCheck::Ok(h) = parse_header(&out) else {
            panic!("header")
        };
        assert_eq!(
            (h.kind, h.seq, h.len as usize),
            (KIND_DATA, 42, out.len() - HDR)
        );
        assert!(crc_ok(11, &out, &h, &out[HDR..]));
        let direct = record_crc(11, &out[..HDR], &out[HDR..]);
        assert_eq!(
            get_u32(&out, 20),
            Some(direct),
            "combined CRC equals the direct one"
        );
        assert!(!crc_ok(12, &out, &h, &out[HDR..]), "other segment's seed");
        match decode(h.kind, &out[HDR..]).unwrap() {
            Decoded::Data {
                dev,
                ino,
                offset,
                path,
                data,
            } => assert_eq!(
                (dev, ino, offset, path, data),
                (7, 9, 4096, &b"a/b"[..], &b"hello"[..])
            ),
            d => panic!("{d:?}"),
        }
        // Any flipped bit is caught.
        for i in 0..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x10;
            let ok = match parse_header(&bad) {
                HeaderCheck::Ok(h) => {
                    bad.len() - HDR == h.len as usize && crc_ok(11, &bad, &h, &bad[HDR..])
                }
                _ => false,
            };
            assert!(!ok, "flip at {i} not detected");
        }
    }

    #[test]
    fn garbage_never_panics() {
        for n in 0..64 {
            let b: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
            let _ = parse_header(&b);
            for k in 0..6 {
                let _ = decode(k, &b);
            }
        }
    }
}
