//! The checkpoint: a snapshot of the index and the log position it covers, so `open` does not
//! scan every summary. Written to a temp file, fsynced, renamed over the old one.
//!
//! ```text
//! header 64 B: 0 magic "TIERFSCP" | 8 format u32 | 12 0 u32 | 16 uuid [16]
//!              32 covered segment u64 | 40 covered offset u64 | 48..64 zero
//! record:      0 kind u8 | 1 flags u8 (bit 0: hit) | 2 0 u16 | 4 len u32 | 8 dev u64
//!              16 ino u64 | 24 idx u64 | 32 version u64 | 40 segment u64 | 48 offset u64
//!              56 page CRCs (u32 each)
//! trailer 16 B: entries u64 | CRC32C u32 (of everything before it, store seed) | "CPND"
//! ```

use super::error::io_err;
use super::index::Index;
use super::layout::{get_u32, get_u64, npages, put_u32, put_u64, FORMAT};
use super::{io, SsdError, SsdKey};
use std::fs;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

pub(crate) const FILE: &str = "checkpoint";
pub(crate) const TMP: &str = "checkpoint.tmp";
const MAGIC: &[u8; 8] = b"TIERFSCP";
const END: &[u8; 4] = b"CPND";
const HDR: usize = 64;
const REC: usize = 56;
const TRAILER: usize = 16;

/// The log position a checkpoint covers: every cluster in segments before `seq`, and in
/// segment `seq` before `off`, is reflected in it. Scanning resumes there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pos {
    pub seq: u64,
    pub off: u64,
}

pub(crate) struct CpEntry {
    pub key: SsdKey,
    pub version: u64,
    pub seg: u64,
    pub off: u64,
    pub len: u32,
    pub hit: bool,
    pub crcs: Arc<[u32]>,
}

/// Writes the checkpoint of `index` at `pos`. The caller has made every segment write before
/// `pos` durable. Returns the number of entries.
pub(crate) fn write(
    dir: &Path,
    uuid: &[u8; 16],
    seed: u32,
    pos: Pos,
    index: &Index,
) -> Result<u64, SsdError> {
    let tmp = dir.join(TMP);
    let path = dir.join(FILE);
    let file = crate::private::new_file(&tmp).map_err(io_err("create", &tmp))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut crc = seed;
    let mut n = 0u64;
    let mut hdr = [0u8; HDR];
    hdr[..8].copy_from_slice(MAGIC);
    put_u32(&mut hdr, 8, FORMAT);
    hdr[16..32].copy_from_slice(uuid);
    put_u64(&mut hdr, 32, pos.seq);
    put_u64(&mut hdr, 40, pos.off);
    crc = crc32c::crc32c_append(crc, &hdr);
    w.write_all(&hdr).map_err(io_err("write", &tmp))?;
    // One shard at a time: encode under its read lock, write after releasing it.
    let mut chunk = Vec::new();
    let mut result = Ok(());
    index.for_each_shard(|shard| {
        chunk.clear();
        for (k, e) in shard.iter() {
            let at = chunk.len();
            chunk.resize(at + REC + 4 * e.crcs.len(), 0);
            let r = &mut chunk[at..];
            r[0] = k.kind;
            r[1] = e.hit.load(Relaxed) as u8;
            put_u32(r, 4, e.len);
            put_u64(r, 8, k.dev);
            put_u64(r, 16, k.ino);
            put_u64(r, 24, k.idx);
            put_u64(r, 32, e.version);
            put_u64(r, 40, e.seg.seq);
            put_u64(r, 48, e.off);
            for (i, c) in e.crcs.iter().enumerate() {
                put_u32(r, REC + 4 * i, *c);
            }
            n += 1;
        }
        if result.is_ok() {
            crc = crc32c::crc32c_append(crc, &chunk);
            result = w.write_all(&chunk);
        }
    });
    result.map_err(io_err("write", &tmp))?;
    let count = n.to_le_bytes();
    crc = crc32c::crc32c_append(crc, &count);
    let mut trailer = [0u8; TRAILER];
    trailer[..8].copy_from_slice(&count);
    put_u32(&mut trailer, 8, crc);
    trailer[12..].copy_from_slice(END);
    w.write_all(&trailer).map_err(io_err("write", &tmp))?;
    let file = w
        .into_inner()
        .map_err(|e| io_err("write", &tmp)(e.into_error()))?;
    file.sync_all().map_err(io_err("fsync", &tmp))?;
    drop(file);
    fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
    io::sync_dir(dir).map_err(io_err("fsync", dir))?;
    Ok(n)
}

/// Reads and checks the checkpoint. `Ok(None)` if there is none; `Err(why)` if it is unusable
/// (the caller then scans every summary).
pub(crate) fn load(
    dir: &Path,
    uuid: &[u8; 16],
    seed: u32,
) -> Result<Option<(Pos, Vec<CpEntry>)>, String> {
    let path = dir.join(FILE);
    let b = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if b.len() < HDR + TRAILER || &b[..8] != MAGIC || &b[b.len() - 4..] != END {
        return Err("not a complete checkpoint".into());
    }
    if get_u32(&b, 8) != Some(FORMAT) {
        return Err("other format version".into());
    }
    if &b[16..32] != uuid {
        return Err("written for another generation of the store".into());
    }
    let crc_at = b.len() - 8;
    if crc32c::crc32c_append(seed, &b[..crc_at]) != get_u32(&b, crc_at).unwrap_or(0) {
        return Err("checksum mismatch".into());
    }
    let pos = Pos {
        seq: get_u64(&b, 32).unwrap_or(0),
        off: get_u64(&b, 40).unwrap_or(0),
    };
    let n = get_u64(&b, b.len() - TRAILER).unwrap_or(0);
    let body = &b[HDR..b.len() - TRAILER];
    let mut out = Vec::with_capacity((n as usize).min(body.len() / REC));
    let mut at = 0;
    const BAD: &str = "record overrun";
    while at < body.len() {
        let r = body.get(at..at + REC).ok_or(BAD)?;
        let len = get_u32(r, 4).ok_or(BAD)?;
        let np = npages(len);
        let c = body.get(at + REC..at + REC + 4 * np).ok_or(BAD)?;
        out.push(CpEntry {
            key: SsdKey {
                kind: r[0],
                dev: get_u64(r, 8).ok_or(BAD)?,
                ino: get_u64(r, 16).ok_or(BAD)?,
                idx: get_u64(r, 24).ok_or(BAD)?,
            },
            version: get_u64(r, 32).ok_or(BAD)?,
            seg: get_u64(r, 40).ok_or(BAD)?,
            off: get_u64(r, 48).ok_or(BAD)?,
            len,
            hit: r[1] & 1 != 0,
            crcs: c
                .chunks_exact(4)
                .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                .collect(),
        });
        at += REC + 4 * np;
    }
    if out.len() as u64 != n {
        return Err("entry count mismatch".into());
    }
    Ok(Some((pos, out)))
}
