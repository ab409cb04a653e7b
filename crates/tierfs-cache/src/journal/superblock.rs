//! The journal superblock: which store the journal belongs to. One 4 KiB file, replaced
//! atomically.
//!
//! ```text
//! 0 magic "TIERFSJN" | 8 format u32 | 12 zero u32 | 16 uuid [16] | 32 created (unix s) u64
//! 40 segment size u64 | 48 store id length u16 | 50 store id (UTF-8) | ... | 4092 CRC32C
//! ```

use super::error::io_err;
use super::format::{get_u16, get_u32, get_u64, FORMAT, FORMAT_MIN};
use super::{io, JournalError};
use std::fs;
use std::io::Write;
use std::path::Path;

pub(crate) const FILE: &str = "superblock";
pub(crate) const TMP: &str = "superblock.tmp";
const MAGIC: &[u8; 8] = b"TIERFSJN";
const LEN: usize = 4096;
const CRC_AT: usize = LEN - 4;
const ID_AT: usize = 50;
pub(crate) const MAX_ID: usize = 1024;

#[derive(Clone, Debug)]
pub(crate) struct Superblock {
    /// Drawn when the journal is created; seeds every record CRC, so records of an earlier
    /// generation (before a reset) are never replayed.
    pub uuid: [u8; 16],
    /// Informational: segments are self-delimiting, a different configured size is accepted.
    pub segment_size: u64,
    /// The format it was written in (`store` always writes [`FORMAT`]).
    pub format: u32,
}

/// Reads and checks the superblock of `dir` against the store of the mount. `Ok(None)` if
/// there is none.
pub(crate) fn load(dir: &Path, store_id: &str) -> Result<Option<Superblock>, JournalError> {
    let Some((sb, id)) = read(dir)? else {
        return Ok(None);
    };
    if id != store_id {
        return Err(JournalError::WrongStore {
            dir: dir.to_path_buf(),
            found: id,
            expected: store_id.to_string(),
        });
    }
    Ok(Some(sb))
}

/// Reads and checks the superblock of `dir`, whatever store it belongs to; returns it with
/// the store id it records. `Ok(None)` if there is none.
pub(crate) fn read(dir: &Path) -> Result<Option<(Superblock, String)>, JournalError> {
    let path = dir.join(FILE);
    let b = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    let damaged = |what: &str| JournalError::Damaged {
        path: path.clone(),
        offset: 0,
        what: what.into(),
    };
    if b.len() != LEN || &b[..8] != MAGIC {
        return Err(damaged("not a tierfs journal superblock"));
    }
    let format = get_u32(&b, 8).unwrap_or(0);
    if !(FORMAT_MIN..=FORMAT).contains(&format) {
        return Err(JournalError::WrongFormat {
            dir: dir.to_path_buf(),
            found: format,
            expected: FORMAT,
        });
    }
    if get_u32(&b, CRC_AT) != Some(crc32c::crc32c(&b[..CRC_AT])) {
        return Err(damaged("superblock checksum mismatch"));
    }
    let id_len = get_u16(&b, 48).unwrap_or(u16::MAX) as usize;
    let Some(id) = b.get(ID_AT..ID_AT + id_len).filter(|_| id_len <= MAX_ID) else {
        return Err(damaged("store id length out of range"));
    };
    let id = String::from_utf8_lossy(id).into_owned();
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[16..32]);
    let sb = Superblock {
        uuid,
        segment_size: get_u64(&b, 40).unwrap_or(0),
        format,
    };
    Ok(Some((sb, id)))
}

/// Writes the superblock: temp file, fsync, rename, fsync of the directory.
pub(crate) fn store(dir: &Path, store_id: &str, sb: &Superblock) -> Result<(), JournalError> {
    let id = store_id.as_bytes();
    if id.len() > MAX_ID {
        return Err(JournalError::Config(format!(
            "store id is {} bytes; at most {MAX_ID}",
            id.len()
        )));
    }
    let mut b = vec![0u8; LEN];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    b[16..32].copy_from_slice(&sb.uuid);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    b[32..40].copy_from_slice(&now.to_le_bytes());
    b[40..48].copy_from_slice(&sb.segment_size.to_le_bytes());
    b[48..50].copy_from_slice(&(id.len() as u16).to_le_bytes());
    b[ID_AT..ID_AT + id.len()].copy_from_slice(id);
    let crc = crc32c::crc32c(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());

    let tmp = dir.join(TMP);
    let path = dir.join(FILE);
    let mut f = crate::private::new_file(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(&b).map_err(io_err("write", &tmp))?;
    f.sync_all().map_err(io_err("fsync", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
    io::sync_dir(dir).map_err(io_err("fsync", dir))
}
