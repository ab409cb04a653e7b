//! sftp v3 attributes as tierfs's: size, owner, mode and whole-second times are what the
//! protocol carries. It has no inode number, link count, ctime or sub-second times: the
//! inode number is a hash of the path (tierfs numbers inodes itself; identity is by path),
//! the link count 1 (as sshfs shows), ctime = mtime (as sshfs shows), and the version of a
//! file is its size and mtime.

use openssh_sftp_client_lowlevel::{FileAttrs, Permissions, UnixTimeStamp};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use tierfs_store::{Attr, FileKind, TimeSpec};

/// A stable number for a path (never 0: some tools take inode 0 for "no file").
pub(crate) fn path_ino(p: &Path) -> u64 {
    xxhash_rust::xxh3::xxh3_64(p.as_os_str().as_bytes()).max(1)
}

fn secs(t: UnixTimeStamp) -> TimeSpec {
    TimeSpec {
        sec: t.into_raw() as i64,
        nsec: 0,
    }
}

/// The attributes of the object at `path` as the server gave them.
pub(crate) fn attr(a: &FileAttrs, path: &Path) -> Attr {
    let mode = a.get_filetype().map_or(libc::S_IFREG, |t| t as u32)
        | a.get_permissions().map_or(0o644, |p| p.bits());
    let (uid, gid) = a.get_id().unwrap_or((0, 0));
    let (atime, mtime) = a
        .get_time()
        .map_or((TimeSpec::default(), TimeSpec::default()), |(a, m)| {
            (secs(a), secs(m))
        });
    let size = a.get_size().unwrap_or(0);
    Attr {
        dev: 0,
        ino: path_ino(path),
        kind: FileKind::from_mode(mode),
        perm: (mode & 0o7777) as u16,
        nlink: 1,
        uid,
        gid,
        rdev: 0,
        size,
        blocks: size.div_ceil(512),
        blksize: 4096,
        atime,
        mtime,
        ctime: mtime,
    }
}

/// A mode for a request (type bits dropped: the server keeps the object's own).
pub(crate) fn perms(mode: u32) -> FileAttrs {
    let mut a = FileAttrs::new();
    a.set_permissions(Permissions::from_bits_truncate(mode & 0o7777));
    a
}

/// A time for SETSTAT, whole seconds (sftp v3 carries no more); before 1970 or after 2106
/// cannot be said: None.
pub(crate) fn stamp(t: TimeSpec) -> Option<UnixTimeStamp> {
    u32::try_from(t.sec).ok().and_then(UnixTimeStamp::from_raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_of_a_file() {
        let mut a = FileAttrs::new();
        a.set_size(1000);
        a.set_id(7, 8);
        a.set_permissions(Permissions::from_bits_truncate(0o4755));
        a.set_time(
            UnixTimeStamp::from_raw(5).unwrap(),
            UnixTimeStamp::from_raw(9).unwrap(),
        );
        let p = Path::new("/x/y");
        let at = attr(&a, p);
        assert_eq!((at.size, at.uid, at.gid, at.perm), (1000, 7, 8, 0o4755));
        assert_eq!((at.mtime.sec, at.ctime.sec, at.atime.sec), (9, 9, 5));
        assert_eq!(at.kind, FileKind::File);
        assert_eq!(at.blocks, 2);
        assert_eq!(at.ino, path_ino(p));
        assert_ne!(path_ino(p), path_ino(Path::new("/x/z")));
        assert_eq!(stamp(TimeSpec { sec: -1, nsec: 0 }), None);
    }
}
