//! The shared tier: chunks of the origin's files kept in an object store that many hosts
//! reach (a SeaweedFS, Ceph RGW or MinIO cluster the site runs, S3 Express), asked after the
//! RAM and SSD tiers miss and before the origin (mountpoint-s3's shared cache is the model).
//!
//! A chunk is named by the origin, the object's identity, its **version** at the origin and
//! its index ([`ChunkName`]): a chunk never changes once written, a new version of a file is a
//! new set of keys, so no host ever has to tell another that something is stale. Every object
//! carries its name and checksums ([`format`]); one that fails either is never served.
//! Losing the tier costs speed only: [`SharedCache`] falls back to the origin at the first
//! error or deadline, for a while, and says so once per episode.

pub mod format;
mod tier;

pub use tier::{ChunkSource, SharedCache, SharedConfig, SharedSnapshot, SharedStats};

/// An object store holding chunk objects: the seam between the tier's logic and the wire.
/// Every call is bounded by the store's own deadline and answers, never hangs.
pub trait SharedStore: Send + Sync + 'static {
    /// The objects named `keys`, in order: `Ok(None)` where there is none.
    fn get_many(&self, keys: &[String]) -> Vec<Result<Option<bytes::Bytes>, String>>;
    /// Stores `body` under `key` (replacing any: chunks of one name are equal).
    fn put(&self, key: &str, body: bytes::Bytes) -> Result<(), String>;
    /// Where the tier is, for messages (`s3://bucket/prefix at http://host:port`).
    fn describe(&self) -> String;
}

/// The name of one chunk of one version of one object of one origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkName {
    /// A hash of the origin's name, the same on every host (`shared.namespace`).
    pub origin: u64,
    /// The object's identity at the origin (its inode number, or a hash of its path).
    pub ident: (u64, u64),
    /// Its version: size, mtime and ctime as the origin gives them.
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Byte offset / `chunk_size`.
    pub idx: u64,
    pub chunk_size: u32,
}

impl ChunkName {
    /// The object key, under `prefix`: the format, the origin and the object first, so that
    /// every chunk of one version lies under one prefix (`aws s3 rm --recursive` removes an
    /// origin; a lifecycle rule on `v1/` ages everything out).
    pub fn key(&self, prefix: &str) -> String {
        let sep = if prefix.is_empty() || prefix.ends_with('/') {
            ""
        } else {
            "/"
        };
        format!(
            "{prefix}{sep}v{}/{:016x}/{:016x}{:016x}/{:x}.{:x}.{:x}/{:x}.{:x}",
            format::FORMAT,
            self.origin,
            self.ident.0,
            self.ident.1,
            self.size,
            self.mtime_ns as u64,
            self.ctime_ns as u64,
            self.chunk_size,
            self.idx
        )
    }

    /// The byte range of the file this chunk covers.
    pub fn range(&self) -> (u64, u64) {
        let start = self.idx * self.chunk_size as u64;
        (start, (start + self.chunk_size as u64).min(self.size))
    }
}

/// The 64-bit origin hash of an origin's name (FNV-1a: stable across hosts, versions and
/// architectures, which a std hasher is not).
pub fn origin_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_every_part_and_ranges_end_at_the_file() {
        let n = ChunkName {
            origin: origin_hash("s3://data@http://10.0.0.1:9000"),
            ident: (1, 2),
            size: 9 << 20,
            mtime_ns: 5,
            ctime_ns: -1,
            idx: 2,
            chunk_size: 4 << 20,
        };
        let k = n.key("cache");
        assert!(k.starts_with("cache/v1/"), "{k}");
        assert!(k.ends_with("/900000.5.ffffffffffffffff/400000.2"), "{k}");
        assert_eq!(n.key("cache/"), k);
        assert_eq!(n.range(), (8 << 20, 9 << 20));
        assert_ne!(ChunkName { idx: 1, ..n }.key(""), n.key(""));
        assert_eq!(origin_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
