//! Reference-model test: random operation sequences run, step by step, against a tierfs mount
//! and against a plain directory on the same local filesystem (the reference). Every
//! operation's result must be identical on both sides (the value, or the raw errno), and the
//! trees must be identical after each sequence and at random points within it: names, file
//! types, sizes, permission bits, link counts, owners, contents, symlink targets, xattrs, and
//! which names are hard links of one file (equal st_ino within each tree).
//!
//! Owners: the test runs as root, so uid/gid only say something after a Chown, and for what is
//! created in the setgid directory of another group that every sequence starts with.
//! Not compared: timestamps (they differ legitimately), st_ino values and st_blocks. Directory
//! sizes *are* compared: tierfs reports the backing directory's, and the backing and reference
//! directories live on the same filesystem with the same history.
//!
//! Inherent difference, left out of the comparison: lseek on a *directory* descriptor (see
//! `Op::Seek`); the kernel's FUSE code answers it, not tierfs.
//!
//! The generator is proptest's, seeded explicitly: the seed is printed, and
//! `TIERFS_MODEL_SEED=<n>` replays a run (every mount configuration derives its own seed from
//! it). A failure is shrunk to a minimal sequence, which is printed with each step's result.
//! `TIERFS_MODEL_CASES=<n>` overrides the number of sequences per configuration.
//!
//! One mount serves many sequences: each runs in its own directory (`s<N>`) of both trees, which
//! is removed afterwards. Names come from a small pool (5 names in the sequence root and in two
//! subdirectories), so operations collide often and take their error paths.
//!
//! The tierfs RAM cache (updated in place by writes) is only reached when the kernel's page
//! cache misses, so the mount side reads some files with O_DIRECT (which FUSE sends to the
//! daemon, bypassing the page cache; the reference reads the same bytes normally) and sometimes
//! drops the page cache with POSIX_FADV_DONTNEED first. The tree comparison reads every file
//! of the mount both ways.

mod common;
use common::*;

use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DIRS: [&str; 3] = ["", "d1", "d2"];
const NAMES: [&str; 5] = ["a", "b", "c", "d1", "d2"];
const SLOTS: usize = 4;
const XATTRS: [&str; 3] = ["user.x", "user.y", "user.long.attribute.name"];
/// Relative targets only, and none with `..`: the link must resolve to the same place in both
/// trees (the sequence root's parent differs between them).
const TARGETS: [&str; 8] = ["a", "b", "d1", "d1/a", "d2/b", "missing", "a/x", "c"];

const O_FLAGS: [(&str, i32); 9] = [
    ("RDWR", libc::O_RDWR),
    ("RDWR|APPEND", libc::O_RDWR | libc::O_APPEND),
    ("RDONLY", libc::O_RDONLY),
    ("WRONLY|TRUNC", libc::O_WRONLY | libc::O_TRUNC),
    ("RDWR|CREAT", libc::O_RDWR | libc::O_CREAT),
    (
        "RDWR|CREAT|EXCL",
        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
    ),
    (
        "WRONLY|APPEND|CREAT",
        libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT,
    ),
    ("RDWR|TRUNC", libc::O_RDWR | libc::O_TRUNC),
    ("RDONLY|TRUNC", libc::O_RDONLY | libc::O_TRUNC),
];

const WHENCES: [(&str, i32); 5] = [
    ("SET", libc::SEEK_SET),
    ("CUR", libc::SEEK_CUR),
    ("END", libc::SEEK_END),
    ("DATA", libc::SEEK_DATA),
    ("HOLE", libc::SEEK_HOLE),
];

const RENAME_FLAGS: [(&str, u32); 3] = [
    ("0", 0),
    ("NOREPLACE", libc::RENAME_NOREPLACE),
    ("EXCHANGE", libc::RENAME_EXCHANGE),
];

const XATTR_FLAGS: [(&str, i32); 3] = [
    ("0", 0),
    ("CREATE", libc::XATTR_CREATE),
    ("REPLACE", libc::XATTR_REPLACE),
];

/// A path of the pool: `DIRS[.0]/NAMES[.1]`.
#[derive(Clone, Copy, PartialEq, Eq)]
struct P(u8, u8);

impl P {
    fn rel(self) -> String {
        let (d, n) = (DIRS[self.0 as usize], NAMES[self.1 as usize]);
        if d.is_empty() {
            n.to_string()
        } else {
            format!("{d}/{n}")
        }
    }
}

impl fmt::Debug for P {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.rel())
    }
}

/// An index into one of the flag tables above, printed by name.
#[derive(Clone, Copy)]
struct Flag<const T: u8>(usize);

impl<const T: u8> Flag<T> {
    fn table() -> &'static [(&'static str, i64)] {
        // Tables as i64 so one type serves all; built once.
        use std::sync::OnceLock;
        static TABLES: OnceLock<Vec<Vec<(&'static str, i64)>>> = OnceLock::new();
        let t = TABLES.get_or_init(|| {
            vec![
                O_FLAGS.iter().map(|&(n, v)| (n, v as i64)).collect(),
                WHENCES.iter().map(|&(n, v)| (n, v as i64)).collect(),
                RENAME_FLAGS.iter().map(|&(n, v)| (n, v as i64)).collect(),
                XATTR_FLAGS.iter().map(|&(n, v)| (n, v as i64)).collect(),
            ]
        });
        &t[T as usize]
    }
    fn value(self) -> i64 {
        Self::table()[self.0].1
    }
    fn any() -> impl Strategy<Value = Self> {
        (0..Self::table().len()).prop_map(Flag)
    }
    fn named(name: &str) -> Self {
        Flag(
            Self::table()
                .iter()
                .position(|t| t.0 == name)
                .expect("flag name"),
        )
    }
}

impl<const T: u8> fmt::Debug for Flag<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Self::table()[self.0].0)
    }
}

type OFlag = Flag<0>;
type Whence = Flag<1>;
type RFlag = Flag<2>;
type XFlag = Flag<3>;

/// A mode, printed in octal.
#[derive(Clone, Copy)]
struct Mode(u32);

impl fmt::Debug for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0o{:o}", self.0)
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// open(O_CREAT|O_WRONLY[|O_EXCL]) and close.
    Create {
        p: P,
        mode: Mode,
        excl: bool,
    },
    Mkdir {
        p: P,
        mode: Mode,
    },
    /// Opens into a slot kept across operations (closing what the slot held). `direct`: the
    /// mount side opens regular files with O_DIRECT.
    Open {
        slot: usize,
        p: P,
        flags: OFlag,
        direct: bool,
    },
    Close {
        slot: usize,
    },
    PWrite {
        slot: usize,
        off: u64,
        len: usize,
        seed: u8,
    },
    /// write(2) at the descriptor's position (the end, for O_APPEND).
    Write {
        slot: usize,
        len: usize,
        seed: u8,
    },
    PRead {
        slot: usize,
        off: u64,
        len: usize,
    },
    /// read(2) at the descriptor's position.
    Read {
        slot: usize,
        len: usize,
    },
    Seek {
        slot: usize,
        off: i64,
        whence: Whence,
    },
    Fstat {
        slot: usize,
    },
    Ftruncate {
        slot: usize,
        size: u64,
    },
    Fsync {
        slot: usize,
    },
    /// open(O_WRONLY), pwrite, close.
    WritePath {
        p: P,
        off: u64,
        len: usize,
        seed: u8,
    },
    /// open(O_WRONLY|O_APPEND), write, close.
    AppendPath {
        p: P,
        len: usize,
        seed: u8,
    },
    /// open(O_WRONLY|O_TRUNC), write, close.
    TruncOpen {
        p: P,
        len: usize,
        seed: u8,
    },
    /// open(O_RDONLY), pread, close; `direct` as for Open.
    ReadPath {
        p: P,
        off: u64,
        len: usize,
        direct: bool,
    },
    /// open(O_RDONLY), posix_fadvise(DONTNEED), close: the next buffered read of the mount
    /// goes to the daemon.
    DropCache {
        p: P,
    },
    Truncate {
        p: P,
        size: u64,
    },
    Rename {
        from: P,
        to: P,
        flags: RFlag,
    },
    Unlink {
        p: P,
    },
    Rmdir {
        p: P,
    },
    Link {
        from: P,
        to: P,
    },
    /// link(from, to), write through `to`, read through `from`, stat both.
    LinkWriteRead {
        from: P,
        to: P,
        off: u64,
        len: usize,
        seed: u8,
        direct: bool,
    },
    Symlink {
        target: &'static str,
        p: P,
    },
    Readlink {
        p: P,
    },
    Stat {
        p: P,
        follow: bool,
    },
    Chmod {
        p: P,
        mode: Mode,
    },
    /// chown/lchown; `u32::MAX` leaves that id alone.
    Chown {
        p: P,
        uid: u32,
        gid: u32,
        follow: bool,
    },
    SetXattr {
        p: P,
        name: usize,
        len: usize,
        seed: u8,
        flags: XFlag,
        follow: bool,
    },
    /// `small`: a 1-byte buffer (ERANGE unless the value is that short).
    GetXattr {
        p: P,
        name: usize,
        small: bool,
        follow: bool,
    },
    ListXattr {
        p: P,
        follow: bool,
    },
    RemoveXattr {
        p: P,
        name: usize,
        follow: bool,
    },
    Readdir {
        p: P,
    },
    /// Compare the whole trees now.
    Check,
    /// Write-back only (in one sequence in four; a Check elsewhere): every descriptor closed
    /// on both sides; once the journal has every
    /// acknowledged operation in its file, `kill -9` of the daemon, a remount on the same
    /// cache directory (the journal replayed: namespace records, then data), and the whole
    /// trees compared. Nothing acknowledged may be lost or changed by the crash.
    CrashReplay,
}

/// Deterministic, position-dependent, never-zero bytes (zeros are what holes read as; a period
/// of 251 is prime to every block size, so misplaced blocks show).
fn data(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (((off + i) * 7 + seed as u64 * 13) % 251 + 1) as u8)
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Errno(i32);

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "errno {} ({})",
            self.0,
            std::io::Error::from_raw_os_error(self.0)
        )
    }
}

fn last_errno() -> Errno {
    Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(-1))
}

fn cvt(r: impl Into<i64>) -> Result<i64, Errno> {
    let r = r.into();
    if r < 0 {
        Err(last_errno())
    } else {
        Ok(r)
    }
}

/// What `stat` says, minus what is not compared.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Sum {
    kind: u32,
    perm: u32,
    nlink: u64,
    size: u64,
    /// Root's on both sides unless a Chown changed it (and then what a new object in a setgid
    /// directory inherits).
    uid: u32,
    gid: u32,
}

impl fmt::Debug for Sum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = match self.kind {
            libc::S_IFREG => "file",
            libc::S_IFDIR => "dir",
            libc::S_IFLNK => "symlink",
            _ => "other",
        };
        write!(
            f,
            "{k} perm=0o{:o} nlink={} size={} owner={}:{}",
            self.perm, self.nlink, self.size, self.uid, self.gid
        )
    }
}

impl Sum {
    fn of(st: &libc::stat) -> Sum {
        Sum {
            kind: st.st_mode & libc::S_IFMT,
            perm: st.st_mode & 0o7777,
            nlink: st.st_nlink,
            size: st.st_size as u64,
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
enum V {
    Unit,
    N(i64),
    Data(Vec<u8>),
    Stat(Sum),
    Names(Vec<String>),
    Multi(Vec<Out>),
}

type Out = Result<V, Errno>;

/// Short form of a byte string: length and a checksum, or the bytes when short.
fn bytes_desc(d: &[u8]) -> String {
    if d.len() <= 24 {
        format!("{d:?}")
    } else {
        let sum = d
            .iter()
            .fold(0u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3));
        format!("<{} bytes, fnv {sum:016x}>", d.len())
    }
}

impl fmt::Debug for V {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            V::Unit => write!(f, "ok"),
            V::N(n) => write!(f, "{n}"),
            V::Data(d) => write!(f, "{}", bytes_desc(d)),
            V::Stat(s) => write!(f, "{s:?}"),
            V::Names(n) => write!(f, "{n:?}"),
            V::Multi(m) => f.debug_list().entries(m).finish(),
        }
    }
}

/// Where two byte strings first differ, for a failure message.
fn first_diff(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "first difference at byte {i}: reference {:?}, tierfs {:?}",
            &a[i..(i + 16).min(a.len())],
            &b[i..(i + 16).min(b.len())]
        ),
        None => format!("lengths differ: reference {}, tierfs {}", a.len(), b.len()),
    }
}

fn out_diff(a: &Out, b: &Out) -> String {
    match (a, b) {
        (Ok(V::Data(x)), Ok(V::Data(y))) => first_diff(x, y),
        (Ok(V::Multi(x)), Ok(V::Multi(y))) => x
            .iter()
            .zip(y)
            .enumerate()
            .filter(|(_, (p, q))| p != q)
            .map(|(i, (p, q))| format!("part {i}: {}", out_diff(p, q)))
            .collect::<Vec<_>>()
            .join("; "),
        _ => String::new(),
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
}

fn open_raw(path: &Path, flags: i32, mode: u32) -> Result<OwnedFd, Errno> {
    let fd = cvt(unsafe {
        libc::open(
            cpath(path).as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reads `len` bytes at `off` (fewer only at end of file), looping over short reads.
fn pread_full(fd: i32, off: u64, len: usize) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = cvt(unsafe {
            libc::pread(
                fd,
                buf[done..].as_mut_ptr().cast(),
                len - done,
                (off + done as u64) as i64,
            ) as i64
        })? as usize;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

fn read_full(fd: i32, len: usize) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = cvt(unsafe { libc::read(fd, buf[done..].as_mut_ptr().cast(), len - done) } as i64)?
            as usize;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

fn stat_path(path: &Path, follow: bool) -> Result<libc::stat, Errno> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let c = cpath(path);
    cvt(unsafe {
        if follow {
            libc::stat(c.as_ptr(), &mut st)
        } else {
            libc::lstat(c.as_ptr(), &mut st)
        }
    })?;
    Ok(st)
}

fn xattr_list(path: &Path, follow: bool) -> Result<Vec<String>, Errno> {
    let c = cpath(path);
    let list = |buf: *mut libc::c_char, size: usize| unsafe {
        if follow {
            libc::listxattr(c.as_ptr(), buf, size)
        } else {
            libc::llistxattr(c.as_ptr(), buf, size)
        }
    };
    let n = cvt(list(std::ptr::null_mut(), 0) as i64)? as usize;
    let mut buf = vec![0u8; n];
    let n = cvt(list(buf.as_mut_ptr().cast(), n) as i64)? as usize;
    buf.truncate(n);
    let mut names: Vec<String> = buf
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    // The order of a listing is not specified.
    names.sort();
    Ok(names)
}

fn xattr_get(path: &Path, name: &str, follow: bool, small: bool) -> Result<Vec<u8>, Errno> {
    let (c, n) = (cpath(path), CString::new(name).unwrap());
    let get = |buf: *mut libc::c_void, size: usize| unsafe {
        if follow {
            libc::getxattr(c.as_ptr(), n.as_ptr(), buf, size)
        } else {
            libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf, size)
        }
    };
    let size = if small {
        1
    } else {
        cvt(get(std::ptr::null_mut(), 0) as i64)? as usize
    };
    let mut buf = vec![0u8; size];
    let got = cvt(get(buf.as_mut_ptr().cast(), size) as i64)? as usize;
    buf.truncate(got);
    Ok(buf)
}

/// One side of the comparison: a sequence's root directory and the descriptors kept open.
struct Side {
    root: PathBuf,
    mount: bool,
    fds: Vec<Option<OwnedFd>>,
    /// Whether hard links are one inode on the mount (not with path identities: there each
    /// name is an object of its own, see docs/architecture/identity.md); else not compared.
    links_share_ino: bool,
}

impl Side {
    fn new(root: PathBuf, mount: bool, links_share_ino: bool) -> Side {
        Side {
            root,
            mount,
            fds: (0..SLOTS).map(|_| None).collect(),
            links_share_ino,
        }
    }

    fn path(&self, p: P) -> PathBuf {
        self.root.join(p.rel())
    }

    /// O_DIRECT for the mount side when asked and `path` is a regular file. (Neither ext4 nor
    /// FUSE accepts O_DIRECT on a directory; the reference reads without it, and the point is
    /// only to bypass the mount's page cache.)
    fn direct(&self, path: &Path, direct: bool) -> i32 {
        let regular =
            || stat_path(path, true).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
        if self.mount && direct && regular() {
            libc::O_DIRECT
        } else {
            0
        }
    }

    fn fd(&self, slot: usize) -> Result<i32, Errno> {
        self.fds[slot]
            .as_ref()
            .map(|f| f.as_raw_fd())
            .ok_or(Errno(libc::EBADF))
    }

    fn apply(&mut self, op: &Op) -> Out {
        Ok(match *op {
            Op::Create { p, mode, excl } => {
                let excl = if excl { libc::O_EXCL } else { 0 };
                open_raw(&self.path(p), libc::O_CREAT | libc::O_WRONLY | excl, mode.0)?;
                V::Unit
            }
            Op::Mkdir { p, mode } => {
                cvt(unsafe { libc::mkdir(cpath(&self.path(p)).as_ptr(), mode.0) })?;
                V::Unit
            }
            Op::Open {
                slot,
                p,
                flags,
                direct,
            } => {
                self.fds[slot] = None;
                let path = self.path(p);
                let flags = flags.value() as i32 | self.direct(&path, direct);
                self.fds[slot] = Some(open_raw(&path, flags, 0o644)?);
                V::Unit
            }
            Op::Close { slot } => {
                self.fd(slot)?;
                self.fds[slot] = None;
                V::Unit
            }
            Op::PWrite {
                slot,
                off,
                len,
                seed,
            } => {
                let d = data(seed, off, len);
                V::N(cvt(
                    unsafe { libc::pwrite(self.fd(slot)?, d.as_ptr().cast(), len, off as i64) }
                        as i64,
                )?)
            }
            Op::Write { slot, len, seed } => {
                let d = data(seed, 0, len);
                V::N(cvt(
                    unsafe { libc::write(self.fd(slot)?, d.as_ptr().cast(), len) } as i64,
                )?)
            }
            Op::PRead { slot, off, len } => V::Data(pread_full(self.fd(slot)?, off, len)?),
            Op::Read { slot, len } => V::Data(read_full(self.fd(slot)?, len)?),
            Op::Seek { slot, off, whence } => {
                let fd = self.fd(slot)?;
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                cvt(unsafe { libc::fstat(fd, &mut st) })?;
                // Inherent, not compared: on a directory, lseek is answered by the kernel's FUSE
                // code (generic_file_llseek over the directory's size; the daemon never sees
                // it), while ext4 has its own rules (EINVAL for SEEK_END on an htree
                // directory). Directory offsets are opaque cookies anyway; only a rewind
                // means the same everywhere.
                let (off, whence) = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    (0, libc::SEEK_SET)
                } else {
                    (off, whence.value() as i32)
                };
                V::N(cvt(unsafe { libc::lseek(fd, off, whence) })?)
            }
            Op::Fstat { slot } => {
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                cvt(unsafe { libc::fstat(self.fd(slot)?, &mut st) })?;
                V::Stat(Sum::of(&st))
            }
            Op::Ftruncate { slot, size } => {
                cvt(unsafe { libc::ftruncate(self.fd(slot)?, size as i64) })?;
                V::Unit
            }
            Op::Fsync { slot } => {
                cvt(unsafe { libc::fsync(self.fd(slot)?) })?;
                V::Unit
            }
            Op::WritePath { p, off, len, seed } => {
                let f = open_raw(&self.path(p), libc::O_WRONLY, 0)?;
                let d = data(seed, off, len);
                V::N(cvt(
                    unsafe { libc::pwrite(f.as_raw_fd(), d.as_ptr().cast(), len, off as i64) }
                        as i64,
                )?)
            }
            Op::AppendPath { p, len, seed } => {
                let f = open_raw(&self.path(p), libc::O_WRONLY | libc::O_APPEND, 0)?;
                let d = data(seed, 0, len);
                V::N(cvt(
                    unsafe { libc::write(f.as_raw_fd(), d.as_ptr().cast(), len) } as i64,
                )?)
            }
            Op::TruncOpen { p, len, seed } => {
                let f = open_raw(&self.path(p), libc::O_WRONLY | libc::O_TRUNC, 0)?;
                let d = data(seed, 0, len);
                V::N(cvt(
                    unsafe { libc::write(f.as_raw_fd(), d.as_ptr().cast(), len) } as i64,
                )?)
            }
            Op::ReadPath {
                p,
                off,
                len,
                direct,
            } => {
                let path = self.path(p);
                let f = open_raw(&path, libc::O_RDONLY | self.direct(&path, direct), 0)?;
                V::Data(pread_full(f.as_raw_fd(), off, len)?)
            }
            Op::DropCache { p } => {
                let f = open_raw(&self.path(p), libc::O_RDONLY, 0)?;
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                V::Unit
            }
            Op::Truncate { p, size } => {
                cvt(unsafe { libc::truncate(cpath(&self.path(p)).as_ptr(), size as i64) })?;
                V::Unit
            }
            Op::Rename { from, to, flags } => {
                let (a, b) = (cpath(&self.path(from)), cpath(&self.path(to)));
                cvt(unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        flags.value() as u32,
                    )
                })?;
                V::Unit
            }
            Op::Unlink { p } => {
                cvt(unsafe { libc::unlink(cpath(&self.path(p)).as_ptr()) })?;
                V::Unit
            }
            Op::Rmdir { p } => {
                cvt(unsafe { libc::rmdir(cpath(&self.path(p)).as_ptr()) })?;
                V::Unit
            }
            Op::Link { from, to } => {
                self.link(from, to)?;
                V::Unit
            }
            Op::LinkWriteRead {
                from,
                to,
                off,
                len,
                seed,
                direct,
            } => {
                let linked = self.link(from, to).map(|_| V::Unit);
                let wrote = self.apply(&Op::WritePath {
                    p: to,
                    off,
                    len,
                    seed,
                });
                let read = self.apply(&Op::ReadPath {
                    p: from,
                    off,
                    len,
                    direct,
                });
                let s1 = self.apply(&Op::Stat {
                    p: from,
                    follow: false,
                });
                let s2 = self.apply(&Op::Stat {
                    p: to,
                    follow: false,
                });
                let same = match (
                    stat_path(&self.path(from), false),
                    stat_path(&self.path(to), false),
                ) {
                    (Ok(_), Ok(_)) if !self.links_share_ino => Ok(V::N(-1)),
                    (Ok(a), Ok(b)) => Ok(V::N((a.st_ino == b.st_ino) as i64)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
                V::Multi(vec![linked, wrote, read, s1, s2, same])
            }
            Op::Symlink { target, p } => {
                let t = CString::new(target).unwrap();
                cvt(unsafe { libc::symlink(t.as_ptr(), cpath(&self.path(p)).as_ptr()) })?;
                V::Unit
            }
            Op::Readlink { p } => V::Data(
                std::fs::read_link(self.path(p))
                    .map_err(io_errno)?
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            ),
            Op::Stat { p, follow } => V::Stat(Sum::of(&stat_path(&self.path(p), follow)?)),
            Op::Chmod { p, mode } => {
                cvt(unsafe { libc::chmod(cpath(&self.path(p)).as_ptr(), mode.0) })?;
                V::Unit
            }
            Op::Chown {
                p,
                uid,
                gid,
                follow,
            } => {
                let c = cpath(&self.path(p));
                cvt(unsafe {
                    if follow {
                        libc::chown(c.as_ptr(), uid, gid)
                    } else {
                        libc::lchown(c.as_ptr(), uid, gid)
                    }
                })?;
                V::Unit
            }
            Op::SetXattr {
                p,
                name,
                len,
                seed,
                flags,
                follow,
            } => {
                let (c, n) = (cpath(&self.path(p)), CString::new(XATTRS[name]).unwrap());
                let v = data(seed, 0, len);
                let (vp, fl) = (v.as_ptr().cast(), flags.value() as i32);
                cvt(unsafe {
                    if follow {
                        libc::setxattr(c.as_ptr(), n.as_ptr(), vp, len, fl)
                    } else {
                        libc::lsetxattr(c.as_ptr(), n.as_ptr(), vp, len, fl)
                    }
                })?;
                V::Unit
            }
            Op::GetXattr {
                p,
                name,
                small,
                follow,
            } => V::Data(xattr_get(&self.path(p), XATTRS[name], follow, small)?),
            Op::ListXattr { p, follow } => V::Names(xattr_list(&self.path(p), follow)?),
            Op::RemoveXattr { p, name, follow } => {
                let (c, n) = (cpath(&self.path(p)), CString::new(XATTRS[name]).unwrap());
                cvt(unsafe {
                    if follow {
                        libc::removexattr(c.as_ptr(), n.as_ptr())
                    } else {
                        libc::lremovexattr(c.as_ptr(), n.as_ptr())
                    }
                })?;
                V::Unit
            }
            Op::Readdir { p } => {
                let mut names = Vec::new();
                for e in std::fs::read_dir(self.path(p)).map_err(io_errno)? {
                    let e = e.map_err(io_errno)?;
                    let t = e.file_type().map_err(io_errno)?;
                    let k = if t.is_dir() {
                        "/"
                    } else if t.is_symlink() {
                        "@"
                    } else if t.is_file() {
                        ""
                    } else {
                        "?"
                    };
                    names.push(format!("{}{k}", e.file_name().to_string_lossy()));
                }
                names.sort();
                V::Names(names)
            }
            Op::Check | Op::CrashReplay => {
                unreachable!("compares both sides; not applied to one")
            }
        })
    }

    fn link(&self, from: P, to: P) -> Result<i64, Errno> {
        let (a, b) = (cpath(&self.path(from)), cpath(&self.path(to)));
        cvt(unsafe { libc::linkat(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), 0) })
    }
}

/// One object of a tree, as compared.
#[derive(PartialEq, Eq)]
struct Node {
    sum: Sum,
    data: Option<Vec<u8>>,
    target: Option<Vec<u8>>,
    xattrs: Vec<(String, Vec<u8>)>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.sum)?;
        if let Some(d) = &self.data {
            write!(f, " data={}", bytes_desc(d))?;
        }
        if let Some(t) = &self.target {
            write!(f, " -> {:?}", String::from_utf8_lossy(t))?;
        }
        if !self.xattrs.is_empty() {
            let x: Vec<_> = self
                .xattrs
                .iter()
                .map(|(n, v)| format!("{n}={}", bytes_desc(v)))
                .collect();
            write!(f, " xattrs={x:?}")?;
        }
        Ok(())
    }
}

struct Tree {
    nodes: BTreeMap<String, Node>,
    /// Names grouped by inode: which names are one file.
    links: Vec<Vec<String>>,
}

fn walk(root: &Path, mount: bool) -> Result<Tree, String> {
    let mut nodes = BTreeMap::new();
    let mut by_ino: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut stack = vec![String::new()];
    let err = |what: &str, rel: &str, e: std::io::Error| {
        let side = if mount { "tierfs" } else { "reference" };
        format!("{side}: {what} {rel:?}: {e}")
    };
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(root.join(&dir)).map_err(|e| err("readdir", &dir, e))?;
        for e in entries {
            let e = e.map_err(|e| err("readdir", &dir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let rel = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            let path = root.join(&rel);
            let md = std::fs::symlink_metadata(&path).map_err(|e| err("lstat", &rel, e))?;
            let ft = e.file_type().map_err(|e| err("d_type", &rel, e))?;
            if ft.is_dir() != md.is_dir() || ft.is_symlink() != md.file_type().is_symlink() {
                return Err(format!(
                    "{rel:?}: readdir type {ft:?} disagrees with lstat {:?} (mount: {mount})",
                    md.file_type()
                ));
            }
            let sum = Sum {
                kind: md.mode() & libc::S_IFMT,
                perm: md.mode() & 0o7777,
                nlink: md.nlink(),
                size: md.size(),
                uid: md.uid(),
                gid: md.gid(),
            };
            let mut node = Node {
                sum,
                data: None,
                target: None,
                xattrs: Vec::new(),
            };
            let ftype = md.file_type();
            if ftype.is_file() {
                let d = std::fs::read(&path).map_err(|e| err("read", &rel, e))?;
                if mount {
                    // The same bytes from the daemon, past the kernel's page cache.
                    let f = open_raw(&path, libc::O_RDONLY | libc::O_DIRECT, 0)
                        .map_err(|e| format!("tierfs: open O_DIRECT {rel:?}: {e:?}"))?;
                    let direct = pread_full(f.as_raw_fd(), 0, d.len() + 4096)
                        .map_err(|e| format!("tierfs: O_DIRECT read {rel:?}: {e:?}"))?;
                    if direct != d {
                        return Err(format!(
                            "tierfs: {rel:?} reads differently through the page cache and \
                             with O_DIRECT (from the daemon): {}",
                            first_diff(&d, &direct)
                        ));
                    }
                }
                node.data = Some(d);
            } else if ftype.is_symlink() {
                let t = std::fs::read_link(&path).map_err(|e| err("readlink", &rel, e))?;
                node.target = Some(t.as_os_str().as_bytes().to_vec());
            } else if ftype.is_dir() {
                stack.push(rel.clone());
            } else if ftype.is_fifo() || ftype.is_socket() {
                return Err(format!("unexpected object {rel:?}"));
            }
            let names = xattr_list(&path, false).map_err(|e| format!("llistxattr {rel}: {e:?}"))?;
            for n in names {
                let v = xattr_get(&path, &n, false, false)
                    .map_err(|e| format!("lgetxattr {rel} {n}: {e:?}"))?;
                node.xattrs.push((n, v));
            }
            by_ino.entry(md.ino()).or_default().push(rel.clone());
            nodes.insert(rel, node);
        }
    }
    let mut links: Vec<Vec<String>> = by_ino
        .into_values()
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    links.sort();
    Ok(Tree { nodes, links })
}

fn compare_trees(reference: &Path, mount: &Path, links: bool) -> Result<(), String> {
    let a = walk(reference, false)?;
    let b = walk(mount, true)?;
    let mut diffs = Vec::new();
    for (k, na) in &a.nodes {
        match b.nodes.get(k) {
            None => diffs.push(format!("{k:?}: missing in tierfs (reference: {na:?})")),
            Some(nb) if na != nb => {
                let mut d = format!("{k:?}: reference {na:?}\n      tierfs    {nb:?}");
                if let (Some(x), Some(y)) = (&na.data, &nb.data) {
                    if x != y {
                        d += &format!("\n      {}", first_diff(x, y));
                    }
                }
                diffs.push(d);
            }
            Some(_) => {}
        }
    }
    for (k, nb) in &b.nodes {
        if !a.nodes.contains_key(k) {
            diffs.push(format!("{k:?}: only in tierfs ({nb:?})"));
        }
    }
    if diffs.is_empty() && links && a.links != b.links {
        diffs.push(format!(
            "hard-link identity differs: reference {:?}, tierfs {:?}",
            a.links, b.links
        ));
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(format!("trees differ:\n    {}", diffs.join("\n    ")))
    }
}

struct Env {
    mnt: PathBuf,
    reference: PathBuf,
    links_share_ino: bool,
    /// How to crash and remount the daemon (`Op::CrashReplay`), for write-back mounts.
    crash: Option<Crash>,
}

/// What `Op::CrashReplay` needs to kill the daemon and mount again as it was.
struct Crash {
    mnt: PathBuf,
    backing: PathBuf,
    cache: PathBuf,
    opts: Vec<String>,
    /// RAM hits and RAM-only reads of the daemons crashed so far (the counters start again
    /// with each daemon; the end of the test asks for their sum).
    carried: std::sync::Arc<std::sync::Mutex<(u64, u64)>>,
}

impl Crash {
    /// Returns whether the new daemon replayed anything (namespace records or writes).
    fn crash_and_remount(&self) -> Result<bool, String> {
        // Every acknowledged operation in the journal's file (the page cache survives the
        // daemon): what the crash may not lose. Not waited for: the flushers, so replay has
        // work to do.
        let v = stats_of(&self.mnt);
        let appended = n(&v, "writeback.journal.appended_seq");
        {
            let mut c = self.carried.lock().unwrap();
            c.0 += n(&v, "ram.hits");
            c.1 += n(&v, "read_ram_only");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while n(&stats_of(&self.mnt), "writeback.journal.written_seq") < appended {
            if Instant::now() > deadline {
                return Err(format!(
                    "the journal did not write seq {appended} in 20 s: {}",
                    stats_of(&self.mnt)["writeback"]["journal"]
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let pid = daemon_pid(&self.mnt).ok_or("no daemon to crash")?;
        unsafe { libc::kill(pid, libc::SIGKILL) };
        if !wait_exit(pid, Duration::from_secs(20)) {
            return Err(format!("daemon {pid} survived SIGKILL"));
        }
        let _ = std::process::Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .status();
        let out = mount_command(self.backing.as_os_str(), &self.mnt, &self.cache, &self.opts)
            .output()
            .map_err(|e| format!("run tierfs mount: {e}"))?;
        if !out.status.success() || !is_mounted(&self.mnt) {
            return Err(format!(
                "remount after the crash failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let v = stats_of(&self.mnt);
        Ok(n(&v, "writeback.namespace.replayed") + n(&v, "writeback.replayed_writes") > 0)
    }
}

/// Runs one sequence in directory `s<n>` of both trees; Err describes the first difference.
fn run_case(env: &Env, ops: &[Op], n: u64, tally: &mut Tally) -> Result<(), String> {
    let name = format!("s{n}");
    let mut r = Side::new(env.reference.join(&name), false, env.links_share_ino);
    let mut m = Side::new(env.mnt.join(&name), true, env.links_share_ino);
    // A crash and remount costs a quarter of a second in a debug build: one sequence in four
    // crashes where it draws `CrashReplay` (the others compare the trees there).
    let crash = env.crash.as_ref().filter(|_| n.is_multiple_of(4));
    let res = run_sides(&mut r, &mut m, ops, tally, crash);
    // Close everything, then clean up; a failing cleanup of the mount is a finding too.
    r.fds.clear();
    m.fds.clear();
    let _ = std::fs::remove_dir_all(&r.root);
    let cleanup = std::fs::remove_dir_all(&m.root);
    res?;
    cleanup.map_err(|e| format!("tierfs: removing the sequence's tree: {e}"))?;
    if r.root.exists() != m.root.exists() {
        return Err("sequence root removed on one side only".into());
    }
    Ok(())
}

/// The state every sequence starts from (run, and compared, on both sides like any other step;
/// never shrunk away): both subdirectories (one setgid), files whose contents cross 4K boundaries, a
/// symlink, an xattr, and every descriptor slot open (two of them on one file, so a read
/// through one sees writes through the other).
fn setup_ops() -> Vec<Op> {
    let (a, b, d1, d2) = (P(0, 0), P(0, 1), P(0, 3), P(0, 4));
    let (d1a, d2b, d2c) = (P(1, 0), P(2, 1), P(2, 2));
    let file = |p, mode| Op::Create {
        p,
        mode: Mode(mode),
        excl: true,
    };
    let fill = |p, len, seed| Op::WritePath {
        p,
        off: 0,
        len,
        seed,
    };
    let open = |slot, p, flags, direct| Op::Open {
        slot,
        p,
        flags: OFlag::named(flags),
        direct,
    };
    vec![
        Op::Mkdir {
            p: d1,
            mode: Mode(0o755),
        },
        Op::Mkdir {
            p: d2,
            mode: Mode(0o755),
        },
        // d2: a setgid directory of another group; what is created in it inherits the group.
        Op::Chown {
            p: d2,
            uid: u32::MAX,
            gid: 1000,
            follow: false,
        },
        Op::Chmod {
            p: d2,
            mode: Mode(0o2775),
        },
        file(a, 0o644),
        fill(a, 10_000, 1),
        file(b, 0o600),
        fill(b, 100, 2),
        file(d1a, 0o644),
        fill(d1a, 8192 + 5, 3),
        file(d2c, 0o755),
        Op::Symlink {
            target: "c",
            p: d2b,
        },
        Op::SetXattr {
            p: a,
            name: 0,
            len: 10,
            seed: 4,
            flags: XFlag::named("0"),
            follow: false,
        },
        open(0, a, "RDWR", false),
        open(1, a, "RDONLY", true),
        open(2, b, "RDWR|APPEND", false),
        open(3, d1a, "RDWR", true),
        Op::ReadPath {
            p: a,
            off: 0,
            len: 10_000,
            direct: true,
        },
    ]
}

/// Per operation kind: how many ran, and how many of those failed (same errno both sides).
type Tally = BTreeMap<String, (u64, u64)>;

fn run_sides(
    r: &mut Side,
    m: &mut Side,
    ops: &[Op],
    tally: &mut Tally,
    crash: Option<&Crash>,
) -> Result<(), String> {
    for s in [&*r, &*m] {
        std::fs::create_dir(&s.root).map_err(|e| format!("setup mkdir {:?}: {e}", s.root))?;
    }
    let mut log = Vec::new();
    let fail = |log: &[String], msg: String| {
        format!(
            "{msg}\n  steps so far (reference results):\n    {}",
            log.join("\n    ")
        )
    };
    let setup = setup_ops();
    let steps = setup
        .iter()
        .enumerate()
        .map(|(i, op)| (format!("setup {i}"), op))
        .chain(ops.iter().enumerate().map(|(i, op)| (format!("{i:3}"), op)));
    for (i, op) in steps {
        if let Op::Check = op {
            log.push(format!("{i:3}: Check"));
            compare_trees(&r.root, &m.root, m.links_share_ino)
                .map_err(|e| fail(&log, format!("step {i}: {e}")))?;
            continue;
        }
        if let Op::CrashReplay = op {
            log.push(format!("{i:3}: CrashReplay"));
            r.fds.iter_mut().for_each(|f| *f = None);
            m.fds.iter_mut().for_each(|f| *f = None);
            if let Some(c) = crash {
                let replayed = c
                    .crash_and_remount()
                    .map_err(|e| fail(&log, format!("step {i}: {e}")))?;
                tally.entry("CrashReplay".into()).or_default().0 += 1;
                tally.entry("CrashReplay-with-replay".into()).or_default().0 += replayed as u64;
            }
            compare_trees(&r.root, &m.root, m.links_share_ino)
                .map_err(|e| fail(&log, format!("step {i}, after the crash: {e}")))?;
            continue;
        }
        let a = r.apply(op);
        let b = m.apply(op);
        let kind = format!("{op:?}");
        let kind = kind
            .split([' ', '{'])
            .next()
            .unwrap_or_default()
            .to_string();
        let t = tally.entry(kind).or_default();
        t.0 += 1;
        t.1 += a.is_err() as u64;
        log.push(format!("{i:3}: {op:?} -> {a:?}"));
        if a != b {
            return Err(fail(
                &log,
                format!(
                    "step {i}: {op:?}\n  reference: {a:?}\n  tierfs:    {b:?}\n  {}",
                    out_diff(&a, &b)
                ),
            ));
        }
    }
    // With the descriptors still open (some on unlinked files, keeping their state alive).
    compare_trees(&r.root, &m.root, m.links_share_ino)
        .map_err(|e| fail(&log, format!("at the end: {e}")))
}

/// `links`: whether hard links are made (not over a store identified by path: there the
/// names of a hard-linked file are objects of their own, a change through one seen through
/// the others like a change behind tierfs's back, at the next open or after `meta.ttl`; the
/// gap docs/architecture/identity.md states).
/// `crash`: `Op::CrashReplay` is drawn too.
fn op_strategy(bs: u64, links: bool, crash: bool) -> BoxedStrategy<Op> {
    let p = || (0..DIRS.len() as u8, 0..NAMES.len() as u8).prop_map(|(d, n)| P(d, n));
    let slot = || 0..SLOTS;
    // Offsets: small, anywhere in the first few blocks, and right around 4K-page and cache
    // block boundaries.
    let off = move || {
        prop_oneof![
            3 => 0..64u64,
            4 => 0..20_000u64,
            4 => (0..8i64, -2i64..=2).prop_map(|(k, d)| (k * 4096 + d).max(0) as u64),
            2 => (1..3i64, -2i64..=2).prop_map(move |(k, d)| (k * bs as i64 + d).max(0) as u64),
        ]
    };
    let len = || {
        prop_oneof![
            3 => 0..16usize,
            4 => 1..5000usize,
            2 => 4090..4200usize,
            1 => 1..20_000usize,
        ]
    };
    let seed = || any::<u8>();
    let file_mode = || {
        prop::sample::select(vec![0o644, 0o600, 0o755, 0o666, 0o400, 0o4755, 0o2711]).prop_map(Mode)
    };
    let dir_mode =
        || prop::sample::select(vec![0o755, 0o700, 0o777, 0o2775, 0o1777]).prop_map(Mode);
    let chmod_mode = || {
        prop::sample::select(vec![
            0o644, 0o600, 0o755, 0o000, 0o777, 0o4755, 0o2755, 0o1777, 0o640, 0o444, 0o7777,
        ])
        .prop_map(Mode)
    };
    let ids = || prop::sample::select(vec![u32::MAX, 0, 1000]);
    let w = |n: u32, s: BoxedStrategy<Op>| (n, s);
    let ops = vec![
        w(
            8,
            (p(), file_mode(), any::<bool>())
                .prop_map(|(p, mode, excl)| Op::Create { p, mode, excl })
                .boxed(),
        ),
        w(
            3,
            (p(), dir_mode())
                .prop_map(|(p, mode)| Op::Mkdir { p, mode })
                .boxed(),
        ),
        w(
            5,
            (slot(), p(), OFlag::any(), any::<bool>())
                .prop_map(|(slot, p, flags, direct)| Op::Open {
                    slot,
                    p,
                    flags,
                    direct,
                })
                .boxed(),
        ),
        w(1, slot().prop_map(|slot| Op::Close { slot }).boxed()),
        w(
            10,
            (slot(), off(), len(), seed())
                .prop_map(|(slot, off, len, seed)| Op::PWrite {
                    slot,
                    off,
                    len,
                    seed,
                })
                .boxed(),
        ),
        w(
            4,
            (slot(), len(), seed())
                .prop_map(|(slot, len, seed)| Op::Write { slot, len, seed })
                .boxed(),
        ),
        w(
            10,
            (slot(), off(), len())
                .prop_map(|(slot, off, len)| Op::PRead { slot, off, len })
                .boxed(),
        ),
        w(
            3,
            (slot(), len())
                .prop_map(|(slot, len)| Op::Read { slot, len })
                .boxed(),
        ),
        w(
            2,
            (slot(), -10i64..30_000, Whence::any())
                .prop_map(|(slot, off, whence)| Op::Seek { slot, off, whence })
                .boxed(),
        ),
        w(3, slot().prop_map(|slot| Op::Fstat { slot }).boxed()),
        w(
            3,
            (slot(), off())
                .prop_map(|(slot, size)| Op::Ftruncate { slot, size })
                .boxed(),
        ),
        w(1, slot().prop_map(|slot| Op::Fsync { slot }).boxed()),
        w(
            6,
            (p(), off(), len(), seed())
                .prop_map(|(p, off, len, seed)| Op::WritePath { p, off, len, seed })
                .boxed(),
        ),
        w(
            3,
            (p(), len(), seed())
                .prop_map(|(p, len, seed)| Op::AppendPath { p, len, seed })
                .boxed(),
        ),
        w(
            2,
            (p(), len(), seed())
                .prop_map(|(p, len, seed)| Op::TruncOpen { p, len, seed })
                .boxed(),
        ),
        w(
            10,
            (p(), off(), len(), any::<bool>())
                .prop_map(|(p, off, len, direct)| Op::ReadPath {
                    p,
                    off,
                    len,
                    direct,
                })
                .boxed(),
        ),
        w(2, p().prop_map(|p| Op::DropCache { p }).boxed()),
        w(
            4,
            (p(), off())
                .prop_map(|(p, size)| Op::Truncate { p, size })
                .boxed(),
        ),
        w(
            6,
            (p(), p(), RFlag::any())
                .prop_map(|(from, to, flags)| Op::Rename { from, to, flags })
                .boxed(),
        ),
        w(4, p().prop_map(|p| Op::Unlink { p }).boxed()),
        w(3, p().prop_map(|p| Op::Rmdir { p }).boxed()),
        w(
            if links { 3 } else { 0 },
            (p(), p())
                .prop_map(|(from, to)| Op::Link { from, to })
                .boxed(),
        ),
        w(
            if links { 3 } else { 0 },
            (p(), p(), off(), len(), seed(), any::<bool>())
                .prop_map(|(from, to, off, len, seed, direct)| Op::LinkWriteRead {
                    from,
                    to,
                    off,
                    len,
                    seed,
                    direct,
                })
                .boxed(),
        ),
        w(
            3,
            (prop::sample::select(TARGETS.to_vec()), p())
                .prop_map(|(target, p)| Op::Symlink { target, p })
                .boxed(),
        ),
        w(1, p().prop_map(|p| Op::Readlink { p }).boxed()),
        w(
            4,
            (p(), any::<bool>())
                .prop_map(|(p, follow)| Op::Stat { p, follow })
                .boxed(),
        ),
        w(
            3,
            (p(), chmod_mode())
                .prop_map(|(p, mode)| Op::Chmod { p, mode })
                .boxed(),
        ),
        w(
            2,
            (p(), ids(), ids(), any::<bool>())
                .prop_map(|(p, uid, gid, follow)| Op::Chown {
                    p,
                    uid,
                    gid,
                    follow,
                })
                .boxed(),
        ),
        w(
            3,
            (
                p(),
                0..XATTRS.len(),
                0..40usize,
                seed(),
                XFlag::any(),
                any::<bool>(),
            )
                .prop_map(|(p, name, len, seed, flags, follow)| Op::SetXattr {
                    p,
                    name,
                    len,
                    seed,
                    flags,
                    follow,
                })
                .boxed(),
        ),
        w(
            2,
            (
                p(),
                0..XATTRS.len(),
                prop::bool::weighted(0.2),
                any::<bool>(),
            )
                .prop_map(|(p, name, small, follow)| Op::GetXattr {
                    p,
                    name,
                    small,
                    follow,
                })
                .boxed(),
        ),
        w(
            1,
            (p(), any::<bool>())
                .prop_map(|(p, follow)| Op::ListXattr { p, follow })
                .boxed(),
        ),
        w(
            1,
            (p(), 0..XATTRS.len(), any::<bool>())
                .prop_map(|(p, name, follow)| Op::RemoveXattr { p, name, follow })
                .boxed(),
        ),
        w(2, p().prop_map(|p| Op::Readdir { p }).boxed()),
        w(2, Just(Op::Check).boxed()),
        w(crash as u32, Just(Op::CrashReplay).boxed()),
    ];
    Union::new_weighted(ops.into_iter().filter(|(n, _)| *n > 0).collect()).boxed()
}

/// SplitMix64: expands a u64 seed into the 32 bytes ChaCha wants.
fn seed_bytes(mut x: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    for chunk in out.chunks_mut(8) {
        x = x.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}

fn base_seed() -> u64 {
    match std::env::var("TIERFS_MODEL_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .expect("TIERFS_MODEL_SEED must be an unsigned integer"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
        }
    }
}

/// What a model test runs against.
enum Target<'a> {
    /// The `tierfs` binary with these `-o` options.
    Binary(&'a [&'a str]),
    /// An in-process mount over a FaultStore that renumbers inodes and changes its device
    /// number at every mount (sshfs-like; path identities).
    Renumbering(tierfs_fs::FsConfig),
}

enum Mounted {
    Bin(BinMount),
    Fault(Box<FaultMount>),
}

impl Mounted {
    fn mnt(&self) -> PathBuf {
        match self {
            Mounted::Bin(m) => m.mnt.clone(),
            Mounted::Fault(m) => m.mnt.clone(),
        }
    }
    fn backing(&self) -> PathBuf {
        match self {
            Mounted::Bin(m) => m.backing.clone(),
            Mounted::Fault(m) => m.backing.clone(),
        }
    }
    fn stats(&self) -> serde_json::Value {
        match self {
            Mounted::Bin(m) => m.stats(),
            Mounted::Fault(m) => m.stats(),
        }
    }
}

/// Mounts tierfs with `opts` and runs `cases` random sequences against it and a reference
/// directory.
fn model(label: &str, opts: &[&str], block_size: u64, cases: u32) {
    model_on(label, Target::Binary(opts), block_size, cases)
}

fn model_on(label: &str, target: Target, block_size: u64, cases: u32) {
    // A umask the daemon must not apply a second time (it would turn 0o664 into 0o644).
    unsafe { libc::umask(0o002) };
    let cases = std::env::var("TIERFS_MODEL_CASES")
        .ok()
        .map(|s| s.parse().expect("TIERFS_MODEL_CASES must be a number"))
        .unwrap_or(cases);
    let base = base_seed();
    // Each configuration draws its own sequences from the one printed seed.
    let seed = label
        .bytes()
        .fold(base, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    println!("model[{label}]: seed {base}: replay with TIERFS_MODEL_SEED={base}");

    // Write-back mounts are crashed and remounted now and then (`Op::CrashReplay`).
    let crash_opts = match &target {
        Target::Binary(opts) if opts.contains(&"writeback.mode=back") => {
            Some(opts.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        }
        _ => None,
    };
    let (m, links_share_ino) = match target {
        Target::Binary(opts) => (Mounted::Bin(BinMount::new(opts)), true),
        Target::Renumbering(cfg) => {
            let opts = FaultOpts {
                renumber: true,
                kernel_ttl: cfg.meta_ttl,
                ..FaultOpts::new(cfg)
            };
            (
                Mounted::Fault(Box::new(FaultMount::with(opts, |_| {}))),
                false,
            )
        }
    };
    let refdir = tempfile::tempdir().expect("reference tempdir");
    // The reference must be a plain directory on the filesystem the backing store is on.
    assert_eq!(
        std::fs::metadata(refdir.path()).unwrap().dev(),
        std::fs::metadata(m.backing()).unwrap().dev(),
        "reference and backing directories on different filesystems"
    );
    let carried = std::sync::Arc::new(std::sync::Mutex::new((0u64, 0u64)));
    let crash = match (&m, crash_opts) {
        (Mounted::Bin(b), Some(opts)) => Some(Crash {
            mnt: b.mnt.clone(),
            backing: b.backing.clone(),
            cache: b.cache.clone(),
            opts,
            carried: carried.clone(),
        }),
        _ => None,
    };
    let crashes = crash.is_some();
    let env = Env {
        mnt: m.mnt(),
        reference: refdir.path().to_path_buf(),
        links_share_ino,
        crash,
    };
    let owned_label = label.to_string();
    with_timeout(Duration::from_secs(400), vec![m.mnt()], move || {
        let label = owned_label;
        let start = Instant::now();
        let mut cfg = Config::with_cases(cases);
        cfg.failure_persistence = None;
        cfg.max_shrink_time = 90_000;
        cfg.max_shrink_iters = 4096;
        let mut runner = TestRunner::new_with_rng(
            cfg,
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed)),
        );
        let (seqs, ops) = (Cell::new(0u64), Cell::new(0u64));
        let tally = std::cell::RefCell::new(Tally::new());
        let strategy =
            prop::collection::vec(op_strategy(block_size, links_share_ino, crashes), 1..=60);
        let result = runner.run(&strategy, |case| {
            let n = seqs.get();
            seqs.set(n + 1);
            ops.set(ops.get() + case.len() as u64);
            run_case(&env, &case, n, &mut tally.borrow_mut()).map_err(TestCaseError::fail)
        });
        let took = start.elapsed();
        match result {
            Ok(()) => {
                let t: Vec<String> = tally
                    .borrow()
                    .iter()
                    .map(|(k, (n, e))| format!("{k} {n} ({e} err)"))
                    .collect();
                println!(
                    "model[{label}]: {} sequences, {} operations, no difference ({:.1}s)\n  \
                     {}",
                    seqs.get(),
                    ops.get(),
                    took.as_secs_f64(),
                    t.join(", ")
                );
            }
            Err(TestError::Fail(why, minimal)) => {
                let steps: Vec<String> = minimal
                    .iter()
                    .enumerate()
                    .map(|(i, op)| format!("{i:3}: {op:?}"))
                    .collect();
                panic!(
                    "model[{label}]: tierfs differs from the reference (seed {base}; replay with \
                     TIERFS_MODEL_SEED={base}).\nMinimal sequence ({} ops):\n  {}\n{why}",
                    minimal.len(),
                    steps.join("\n  ")
                );
            }
            Err(e) => panic!("model[{label}]: {e} (seed {base})"),
        }
    });
    // The comparison is only worth something if reads were answered from the RAM tier after
    // the writes that patched it.
    let st = m.stats();
    let (hits0, ram_only0) = *carried.lock().unwrap();
    let (hits, ram_only) = (
        hits0 + n(&st, "ram.hits"),
        ram_only0 + n(&st, "read_ram_only"),
    );
    println!(
        "model[{label}]: tierfs: ram hits {hits}, ram-only reads {ram_only}, fetched blocks {}, \
         writes {} (the last daemon's)",
        st["fetched_blocks"], st["write_requests"]
    );
    assert!(hits > 0, "no RAM-tier hit: {st}");
    assert!(ram_only > 0, "no RAM-only read: {st}");
}

/// Small cache blocks: many block boundaries within the files.
#[test]
fn model_4k_blocks() {
    model("4k", &["ram.block_size=4K", "ram.max=8M"], 4096, 900);
}

/// Nothing trusted: every attribute and every fingerprint is asked for again.
#[test]
fn model_4k_blocks_ttl0() {
    model(
        "4k-ttl0",
        &["ram.block_size=4K", "ram.max=8M", "meta.ttl=0"],
        4096,
        300,
    );
}

/// Without close-to-open (`meta.cto=off`): FUSE no-open, so the kernel opens and closes
/// files without telling us and every read and write names handle 0 (the inode's implicit
/// reader or writer); O_TRUNC arrives as a SETATTR.
#[test]
fn model_no_open() {
    model(
        "no-open",
        &["ram.block_size=4K", "ram.max=8M", "meta.cto=off"],
        4096,
        400,
    );
}

/// Write-back (`writeback.mode=back`): writes acknowledged from RAM and the journal, read
/// back over the dirty data, flushed by the flushers; every namespace operation after the
/// data it concerns.
#[test]
fn model_writeback() {
    model(
        "writeback",
        &["ram.block_size=4K", "ram.max=8M", "writeback.mode=back"],
        4096,
        600,
    );
}

/// Write-back with a tiny dirty limit: writers wait for the flushers all the time.
/// Write-back with `meta.cto=off` but OPEN requests kept (`fuse.no_open=off`): opens answered
/// from the metadata cache, write-only opens given direct I/O (the benchmark suite's
/// write-back contender).
#[test]
fn model_writeback_cto_off_with_opens() {
    model(
        "wb-cto-off-opens",
        &[
            "ram.block_size=4K",
            "ram.max=8M",
            "writeback.mode=back",
            "meta.cto=off",
            "fuse.no_open=off",
        ],
        4096,
        300,
    );
}

#[test]
fn model_writeback_tiny_dirty() {
    model(
        "writeback-tiny",
        &[
            "ram.block_size=8K",
            "ram.max=64K",
            "writeback.mode=back",
            "writeback.dirty_hard=4M",
            "writeback.chunk=8K",
        ],
        8192,
        300,
    );
}

/// Over a store that renumbers inodes at every lookup and changes its device number at every
/// mount (sshfs-like): objects identified by path, tierfs's own inode numbers. Hard links are
/// then separate objects (not compared as one inode; docs/architecture/identity.md).
#[test]
fn model_renumbering_store() {
    model_on(
        "renumbering",
        Target::Renumbering(tierfs_fs::FsConfig {
            block_size: 4096,
            ram_max: 8 << 20,
            ..Default::default()
        }),
        4096,
        500,
    );
}

/// Default (256 KiB) blocks: files mostly within one block, partial last blocks.
#[test]
fn model_default_blocks() {
    model("default", &["ram.max=64M"], 256 * 1024, 500);
}

/// A RAM tier of a few blocks: evictions between a write and the read after it.
#[test]
fn model_tiny_ram() {
    model("tiny-ram", &["ram.block_size=8K", "ram.max=64K"], 8192, 400);
}
