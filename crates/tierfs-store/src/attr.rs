use std::ffi::OsString;

/// The set-user-ID and set-group-ID bits of a mode.
pub const SUID_SGID: u32 = libc::S_ISUID | libc::S_ISGID;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => FileKind::File,
        }
    }

    pub fn from_dirent_type(t: u8) -> Option<FileKind> {
        Some(match t {
            libc::DT_REG => FileKind::File,
            libc::DT_DIR => FileKind::Dir,
            libc::DT_LNK => FileKind::Symlink,
            libc::DT_FIFO => FileKind::Fifo,
            libc::DT_SOCK => FileKind::Socket,
            libc::DT_CHR => FileKind::CharDev,
            libc::DT_BLK => FileKind::BlockDev,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TimeSpec {
    pub sec: i64,
    pub nsec: u32,
}

impl TimeSpec {
    /// The wall clock now (the epoch if the clock is before it).
    pub fn now() -> TimeSpec {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        TimeSpec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }

    pub fn as_nanos(&self) -> i128 {
        self.sec as i128 * 1_000_000_000 + self.nsec as i128
    }
}

/// Attributes of a backing object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Backing device and inode: the object's identity in the store.
    pub dev: u64,
    pub ino: u64,
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (no file-type bits).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u32,
    pub atime: TimeSpec,
    pub mtime: TimeSpec,
    pub ctime: TimeSpec,
}

impl Attr {
    pub fn from_stat(st: &libc::stat) -> Attr {
        Attr {
            dev: st.st_dev,
            ino: st.st_ino,
            kind: FileKind::from_mode(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            blksize: st.st_blksize as u32,
            atime: TimeSpec {
                sec: st.st_atime,
                nsec: st.st_atime_nsec as u32,
            },
            mtime: TimeSpec {
                sec: st.st_mtime,
                nsec: st.st_mtime_nsec as u32,
            },
            ctime: TimeSpec {
                sec: st.st_ctime,
                nsec: st.st_ctime_nsec as u32,
            },
        }
    }

    /// The permission bits left after a change that drops setuid and setgid (a chown; a
    /// write or truncation by a caller without CAP_FSETID): setuid goes, setgid goes if
    /// group-execute is set (without it, setgid marks mandatory locking and stays), as
    /// Linux's `should_remove_suid` does. None: nothing to drop (no such bit, or a
    /// directory, which keeps them).
    pub fn perm_without_privs(&self) -> Option<u32> {
        if self.kind == FileKind::Dir {
            return None;
        }
        let perm = self.perm as u32;
        let mut kill = perm & libc::S_ISUID;
        if perm & libc::S_ISGID != 0 && perm & libc::S_IXGRP != 0 {
            kill |= libc::S_ISGID;
        }
        (kill != 0).then_some(perm & 0o7777 & !kill)
    }

    /// The version of the file's contents as far as the store can tell cheaply.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint {
            size: self.size,
            mtime_ns: self.mtime.as_nanos() as i64,
            ctime_ns: self.ctime.as_nanos() as i64,
        }
    }
}

/// A cheap-to-check version of a file's contents (POSIX: size, mtime, ctime; S3: ETag).
/// Any change to the data changes at least one field (ctime moves on every write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Fingerprint {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUpdate {
    Now,
    Set(TimeSpec),
}

/// Changes requested by setattr; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeUpdate>,
    pub mtime: Option<TimeUpdate>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: OsString,
    /// Device and inode number, as far as the listing says (a store's listing names no
    /// device: 0).
    pub dev: u64,
    pub ino: u64,
    /// `None` when the store's listing does not say (DT_UNKNOWN).
    pub kind: Option<FileKind>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}
