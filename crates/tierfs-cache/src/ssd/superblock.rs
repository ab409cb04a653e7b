//! The superblock: what a cache directory belongs to. One 4 KiB file, replaced atomically.
//!
//! ```text
//! 0 magic "TIERFSSB" | 8 format u32 | 12 block size u32 | 16 segment size u64 | 24 uuid [16]
//! 40 created (unix s) u64 | 48 store id length u16 | 50 store id (UTF-8) | ... | 4092 CRC32C
//! ```

use super::error::io_err;
use super::layout::{get_u32, get_u64, put_u32, put_u64, FORMAT};
use super::{io, SsdError, SsdIdentity};
use std::fs;
use std::io::Write;
use std::path::Path;

pub(crate) const FILE: &str = "superblock";
const MAGIC: &[u8; 8] = b"TIERFSSB";
const LEN: usize = 4096;
const CRC_AT: usize = LEN - 4;
const ID_AT: usize = 50;
pub(crate) const MAX_ID: usize = 1024;

#[derive(Clone, Debug)]
pub(crate) struct Superblock {
    /// Drawn when the directory is initialized; a reset draws a new one, so nothing written
    /// before it can be taken for current data.
    pub uuid: [u8; 16],
    pub segment_size: u64,
}

/// Reads and checks the superblock of `dir` against the identity of the mount. `Ok(None)` if
/// there is none.
pub(crate) fn load(dir: &Path, ident: &SsdIdentity) -> Result<Option<Superblock>, SsdError> {
    let Some((sb, found)) = read(dir)? else {
        return Ok(None);
    };
    if found.store_id != ident.store_id {
        return Err(SsdError::WrongStore {
            dir: dir.to_path_buf(),
            found: found.store_id,
            expected: ident.store_id.clone(),
        });
    }
    if found.block_size != ident.block_size {
        return Err(SsdError::WrongBlockSize {
            dir: dir.to_path_buf(),
            found: found.block_size,
            expected: ident.block_size,
        });
    }
    Ok(Some(sb))
}

/// Reads and checks the superblock of `dir`, whatever store it belongs to (`tierfs fsck`
/// learns the identity from it). `Ok(None)` if there is none.
pub(crate) fn read(dir: &Path) -> Result<Option<(Superblock, SsdIdentity)>, SsdError> {
    let path = dir.join(FILE);
    let b = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    let damaged = |what: String| SsdError::Damaged {
        dir: dir.to_path_buf(),
        what,
    };
    if b.len() != LEN || &b[..8] != MAGIC {
        return Err(damaged("superblock is not a tierfs superblock".into()));
    }
    // The checksum first: a damaged superblock is not taken for another format's.
    if get_u32(&b, CRC_AT) != Some(crc32c::crc32c(&b[..CRC_AT])) {
        return Err(damaged("superblock checksum mismatch".into()));
    }
    let format = get_u32(&b, 8).unwrap_or(0);
    if format != FORMAT {
        return Err(SsdError::WrongFormat {
            dir: dir.to_path_buf(),
            found: format,
            expected: FORMAT,
        });
    }
    let id_len = u16::from_le_bytes([b[48], b[49]]) as usize;
    let Some(id) = b.get(ID_AT..ID_AT + id_len).filter(|_| id_len <= MAX_ID) else {
        return Err(damaged("superblock store id length out of range".into()));
    };
    let ident = SsdIdentity {
        store_id: String::from_utf8_lossy(id).into_owned(),
        block_size: get_u32(&b, 12).unwrap_or(0),
    };
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[24..40]);
    let sb = Superblock {
        uuid,
        segment_size: get_u64(&b, 16).unwrap_or(0),
    };
    Ok(Some((sb, ident)))
}

/// Writes the superblock: temp file, fsync, rename, fsync of the directory.
pub(crate) fn store(dir: &Path, ident: &SsdIdentity, sb: &Superblock) -> Result<(), SsdError> {
    let id = ident.store_id.as_bytes();
    if id.len() > MAX_ID {
        return Err(SsdError::Config(format!(
            "store id is {} bytes; at most {MAX_ID}",
            id.len()
        )));
    }
    let mut b = vec![0u8; LEN];
    b[..8].copy_from_slice(MAGIC);
    put_u32(&mut b, 8, FORMAT);
    put_u32(&mut b, 12, ident.block_size);
    put_u64(&mut b, 16, sb.segment_size);
    b[24..40].copy_from_slice(&sb.uuid);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    put_u64(&mut b, 40, now);
    b[48..50].copy_from_slice(&(id.len() as u16).to_le_bytes());
    b[ID_AT..ID_AT + id.len()].copy_from_slice(id);
    let crc = crc32c::crc32c(&b[..CRC_AT]);
    put_u32(&mut b, CRC_AT, crc);

    let tmp = dir.join("superblock.tmp");
    let path = dir.join(FILE);
    let mut f = crate::private::new_file(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(&b).map_err(io_err("write", &tmp))?;
    f.sync_all().map_err(io_err("fsync", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
    io::sync_dir(dir).map_err(io_err("fsync", dir))
}
