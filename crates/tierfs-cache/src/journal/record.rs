//! One journal record at an offset, read and checked: what the scan walks record by record and
//! what `damage::resync` asks of each candidate after a bad stretch (the same checks, so a
//! record resync accepts is one the scan accepts).

use super::error::io_err;
use super::format::{self, Decoded, HeaderCheck, HDR};
use super::{io, JournalError};
use std::fs::File;
use std::path::Path;

/// Why there is no valid record at an offset.
#[derive(Clone, Copy)]
pub(crate) enum Bad {
    /// Zeros or end of file: nothing was written there.
    Clean,
    Torn(&'static str),
}

/// Reads and checks the record at `off` (its payload into `payload`): header, length, CRC,
/// a seq above `last_seq`, a payload this version decodes, a SEAL at its own offset.
pub(crate) fn read_record(
    file: &File,
    path: &Path,
    off: u64,
    size: u64,
    seed: u32,
    last_seq: u64,
    payload: &mut Vec<u8>,
) -> Result<Result<format::Header, Bad>, JournalError> {
    let mut hdr = [0u8; HDR];
    let n = io::read_at_most(file, &mut hdr, off).map_err(io_err("read", path))?;
    if n < HDR {
        return Ok(Err(if hdr[..n].iter().all(|&b| b == 0) {
            Bad::Clean
        } else {
            Bad::Torn("short header at end of file")
        }));
    }
    let h = match format::parse_header(&hdr) {
        HeaderCheck::Zero => return Ok(Err(Bad::Clean)),
        HeaderCheck::Bad(why) => return Ok(Err(Bad::Torn(why))),
        HeaderCheck::Ok(h) => h,
    };
    if off + HDR as u64 + h.len as u64 > size {
        return Ok(Err(Bad::Torn("record runs past end of file")));
    }
    payload.resize(h.len as usize, 0);
    let got = io::read_at_most(file, payload, off + HDR as u64).map_err(io_err("read", path))?;
    if got != payload.len() {
        return Ok(Err(Bad::Torn("record runs past end of file")));
    }
    if !format::crc_ok(seed, &hdr, &h, payload) {
        return Ok(Err(Bad::Torn("record checksum mismatch")));
    }
    // The seed already rules out records of other segments or generations; an out-of-order
    // seq with a good CRC is not something a crash produces, but it is not replayed either.
    if h.seq <= last_seq {
        return Ok(Err(Bad::Torn("record seq not increasing")));
    }
    match format::decode(h.kind, payload) {
        Err(why) => Ok(Err(Bad::Torn(why))),
        Ok(Decoded::Seal { at }) if at != off => Ok(Err(Bad::Torn("seal at the wrong offset"))),
        Ok(_) => Ok(Ok(h)),
    }
}
