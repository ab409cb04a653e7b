//! The shared tier's chunk object, format 1: a fixed header that repeats the chunk's whole
//! name, then the data. The name is repeated so that an object found under a key is served
//! only if it is what that key names (a bucket copied between prefixes, a key collision, a
//! server returning the wrong object); the checksums so that a flipped byte anywhere is never
//! served. Little-endian:
//!
//! | offset | bytes | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `TFSC` |
//! | 4 | 2 | format version (1) |
//! | 6 | 2 | header length (80) |
//! | 8 | 8 | origin (hash of the origin's name, `shared.namespace`) |
//! | 16 | 16 | the object's identity (two u64) |
//! | 32 | 24 | its version: size, mtime (ns), ctime (ns) at the origin |
//! | 56 | 8 | chunk index |
//! | 64 | 4 | chunk size (`shared.chunk`) |
//! | 68 | 4 | data length |
//! | 72 | 4 | crc32c of the data |
//! | 76 | 4 | crc32c of bytes 0..76 |
//!
//! A reader that meets another format version treats the object as absent (and it is written
//! again under the new version's keys: the key carries the format too, `v1/`).

use super::ChunkName;
use bytes::{BufMut, Bytes, BytesMut};

const MAGIC: &[u8; 4] = b"TFSC";
pub const FORMAT: u16 = 1;
pub const HEADER_LEN: usize = 80;

/// Why a chunk object was not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// Not a chunk object of this format (too short, other magic or version).
    Format,
    /// A whole, checksummed chunk of another name: not the one asked for.
    OtherName,
    /// A checksum failed: damaged in the store or on the way.
    Checksum,
}

/// The object stored for chunk `name` holding `data`.
pub fn encode(name: &ChunkName, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER_LEN + data.len());
    b.put_slice(MAGIC);
    b.put_u16_le(FORMAT);
    b.put_u16_le(HEADER_LEN as u16);
    put_name(&mut b, name);
    b.put_u32_le(data.len() as u32);
    b.put_u32_le(crc32c::crc32c(data));
    let hcrc = crc32c::crc32c(&b[..76]);
    b.put_u32_le(hcrc);
    b.put_slice(data);
    b.freeze()
}

fn put_name(b: &mut BytesMut, n: &ChunkName) {
    b.put_u64_le(n.origin);
    b.put_u64_le(n.ident.0);
    b.put_u64_le(n.ident.1);
    b.put_u64_le(n.size);
    b.put_i64_le(n.mtime_ns);
    b.put_i64_le(n.ctime_ns);
    b.put_u64_le(n.idx);
    b.put_u32_le(n.chunk_size);
}

/// The data of `obj` if it is a whole, intact chunk object named `name`.
pub fn decode(name: &ChunkName, obj: &Bytes) -> Result<Bytes, Invalid> {
    if obj.len() < HEADER_LEN || &obj[..4] != MAGIC {
        return Err(Invalid::Format);
    }
    let u16_at = |o: usize| u16::from_le_bytes([obj[o], obj[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(obj[o..o + 4].try_into().unwrap());
    if u16_at(4) != FORMAT || u16_at(6) as usize != HEADER_LEN {
        return Err(Invalid::Format);
    }
    if crc32c::crc32c(&obj[..76]) != u32_at(76) {
        return Err(Invalid::Checksum);
    }
    let mut want = BytesMut::with_capacity(60);
    put_name(&mut want, name);
    if obj[8..68] != want[..] {
        return Err(Invalid::OtherName);
    }
    let len = u32_at(68) as usize;
    if obj.len() != HEADER_LEN + len {
        return Err(Invalid::Checksum);
    }
    let data = obj.slice(HEADER_LEN..);
    if crc32c::crc32c(&data) != u32_at(72) {
        return Err(Invalid::Checksum);
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> ChunkName {
        ChunkName {
            origin: 7,
            ident: (1 << 63 | 5, 9),
            size: 10 << 20,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: -3,
            idx: 2,
            chunk_size: 4 << 20,
        }
    }

    #[test]
    fn a_chunk_comes_back_whole() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let obj = encode(&name(), &data);
        assert_eq!(obj.len(), HEADER_LEN + data.len());
        assert_eq!(decode(&name(), &obj).unwrap(), &data[..]);
        let empty = encode(&name(), &[]);
        assert_eq!(decode(&name(), &empty).unwrap().len(), 0);
    }

    #[test]
    fn any_flipped_byte_is_refused() {
        let data = vec![0x5au8; 3000];
        let obj = encode(&name(), &data);
        for at in 0..obj.len() {
            let mut bad = obj.to_vec();
            bad[at] ^= 0x10;
            assert!(
                decode(&name(), &Bytes::from(bad)).is_err(),
                "flipped byte at {at} was served"
            );
        }
    }

    #[test]
    fn a_chunk_of_another_name_or_a_cut_one_is_refused() {
        let obj = encode(&name(), b"hello");
        for other in [
            ChunkName { idx: 3, ..name() },
            ChunkName {
                ctime_ns: -4,
                ..name()
            },
            ChunkName { size: 1, ..name() },
            ChunkName {
                origin: 8,
                ..name()
            },
            ChunkName {
                ident: (5, 9),
                ..name()
            },
            ChunkName {
                chunk_size: 1 << 20,
                ..name()
            },
        ] {
            assert_eq!(decode(&other, &obj), Err(Invalid::OtherName));
        }
        assert!(decode(&name(), &obj.slice(..obj.len() - 1)).is_err());
        assert_eq!(decode(&name(), &obj.slice(..40)), Err(Invalid::Format));
        let mut longer = obj.to_vec();
        longer.push(0);
        assert!(decode(&name(), &Bytes::from(longer)).is_err());
    }
}
