//! POSIX attributes for S3 objects and the directories their keys imply.
//!
//! The version tierfs checks cached data against is the attributes' fingerprint (size, mtime,
//! ctime). S3 has no ctime, and Last-Modified has whole seconds: an object overwritten with
//! the same size within the same second would keep its fingerprint. So the ctime of an object
//! is its Last-Modified second with a hash of its **ETag** in the nanoseconds: every new ETag
//! is a new version (a 2^-30 chance of two ETags colliding within one second), the SSD tier is
//! keyed by the ETag across restarts, and ctime still moves whenever the content does, as
//! POSIX has it. mtime is Last-Modified itself (whole seconds).

use object_store::ObjectMeta;
use tierfs_store::{Attr, FileKind, TimeSpec};

/// The attributes of the object `meta`, owned by `owner` (uid, gid).
pub fn object_attr(meta: &ObjectMeta, owner: (u32, u32)) -> Attr {
    let sec = meta.last_modified.timestamp();
    let mut a = base(FileKind::File, 0o644, owner);
    a.size = meta.size;
    a.blocks = meta.size.div_ceil(512);
    // Whole seconds: a listing gives Last-Modified in milliseconds, a HEAD in seconds, and
    // one object must have one fingerprint whichever of them saw it.
    a.mtime = TimeSpec { sec, nsec: 0 };
    a.atime = a.mtime;
    a.ctime = TimeSpec {
        sec,
        nsec: etag_nanos(meta.e_tag.as_deref()),
    };
    a
}

/// The attributes of a directory (a key prefix): S3 keeps nothing for it, so its times are
/// those of the mount (`born`), constant while it is mounted.
pub fn dir_attr(owner: (u32, u32), born: TimeSpec) -> Attr {
    let mut a = base(FileKind::Dir, 0o755, owner);
    a.nlink = 2;
    a.size = 4096;
    a.blocks = 8;
    a.atime = born;
    a.mtime = born;
    a.ctime = born;
    a
}

fn base(kind: FileKind, perm: u16, (uid, gid): (u32, u32)) -> Attr {
    Attr {
        dev: 0,
        ino: 0,
        kind,
        perm,
        nlink: 1,
        uid,
        gid,
        rdev: 0,
        size: 0,
        blocks: 0,
        blksize: 1 << 20,
        atime: TimeSpec::default(),
        mtime: TimeSpec::default(),
        ctime: TimeSpec::default(),
    }
}

/// A hash of the ETag below 10^9 (a valid nanosecond count); 0 for none or an empty one.
pub fn etag_nanos(etag: Option<&str>) -> u32 {
    match given(etag) {
        None => 0,
        Some(e) => (xxhash_rust::xxh3::xxh3_64(e.as_bytes()) % 1_000_000_000) as u32,
    }
}

/// An ETag as the server gave it, None for an empty one: versitygw lists an object written
/// to its backing directory by other means with `<ETag></ETag>` and HEADs or GETs it with no
/// ETag header at all. Taken as two versions, every object read before a remount was taken
/// for changed after it (its cached data keyed by the GET's version, the listing giving the
/// other): opened again on the store, a GET each (the bench's small objects after a remount:
/// 2 requests per open instead of 1).
pub fn given(etag: Option<&str>) -> Option<&str> {
    etag.filter(|e| !e.is_empty())
}

/// The ETag of `meta` as a handle keeps it ([`given`]).
pub fn etag_of(meta: &ObjectMeta) -> Option<String> {
    given(meta.e_tag.as_deref()).map(str::to_owned)
}

/// The key's hash as an inode number for the store's own `ino` (tierfs numbers inodes itself
/// on a path-identity store; this only keeps `ino` distinct and non-zero).
pub fn key_ino(key: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key.as_bytes()) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(etag: &str, size: u64) -> ObjectMeta {
        ObjectMeta {
            location: object_store::path::Path::from("a/b"),
            last_modified: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            size,
            e_tag: Some(etag.into()),
            version: None,
        }
    }

    #[test]
    fn a_new_etag_is_a_new_version_even_in_the_same_second() {
        let a = object_attr(&meta("\"1\"", 10), (0, 0));
        let b = object_attr(&meta("\"2\"", 10), (0, 0));
        assert_eq!(a.mtime, b.mtime);
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(
            a.fingerprint(),
            object_attr(&meta("\"1\"", 10), (0, 0)).fingerprint()
        );
        assert!(a.ctime.nsec < 1_000_000_000);
    }

    #[test]
    fn an_empty_etag_is_no_etag() {
        let listed = object_attr(&meta("", 10), (0, 0));
        let mut headed = meta("", 10);
        headed.e_tag = None;
        assert_eq!(
            listed.fingerprint(),
            object_attr(&headed, (0, 0)).fingerprint()
        );
        assert_eq!(listed.ctime.nsec, 0);
    }
}
