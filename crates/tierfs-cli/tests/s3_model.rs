//! Reference-model test over the S3 store: random sequences of the operations an S3 mount
//! supports run step by step against `tierfs mount s3://...` (a real server, versitygw) and
//! against a plain local directory. Every result must be the same (the value or the raw
//! errno); after each sequence, with every descriptor closed, three trees must be equal: the
//! reference, the mount, and the bucket itself (the server's directory): names, types, sizes
//! and contents.
//!
//! The reference follows S3's documented semantics (docs/s3.md) where they differ from a
//! local filesystem, and only there:
//! - renaming a directory is EXDEV (`mv` then copies): the reference does not rename it;
//! - a name being unlinked or renamed has its descriptors closed first, on both sides (data
//!   read or written through a descriptor of a name that no longer exists is a stated gap).
//!
//! Not generated: modes, owners, times, links, symlinks, xattrs, SEEK_DATA/HOLE (S3 keeps none
//! of them). The seed is printed; `TIERFS_MODEL_SEED=<n>` replays a run and
//! `TIERFS_MODEL_CASES=<n>` sets the number of sequences. A failure is shrunk to a minimal
//! sequence, printed with each step's result.

mod common;
#[path = "../../tierfs-s3/tests/server/mod.rs"]
mod server;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use server::{S3Server, ACCESS, SECRET};
use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DIRS: [&str; 3] = ["", "d1", "d2"];
const NAMES: [&str; 5] = ["a", "b", "c", "d1", "d2"];
const SLOTS: usize = 3;
const O_FLAGS: [(&str, i32); 6] = [
    ("RDWR", libc::O_RDWR),
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

#[derive(Clone, Debug)]
enum Op {
    Create {
        p: P,
        excl: bool,
    },
    Mkdir {
        p: P,
    },
    Open {
        slot: usize,
        p: P,
        flags: usize,
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
    ReadPath {
        p: P,
        off: u64,
        len: usize,
    },
    Truncate {
        p: P,
        size: u64,
    },
    Rename {
        from: P,
        to: P,
        noreplace: bool,
    },
    Unlink {
        p: P,
    },
    Rmdir {
        p: P,
    },
    Readdir {
        p: P,
    },
    Stat {
        p: P,
    },
}

#[derive(Clone, PartialEq, Eq)]
enum V {
    Unit,
    N(i64),
    Data(Vec<u8>),
    /// Type and size.
    Stat(u32, u64),
    Names(Vec<String>),
}

impl fmt::Debug for V {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            V::Unit => write!(f, "ok"),
            V::N(n) => write!(f, "{n}"),
            V::Data(d) if d.len() <= 16 => write!(f, "{d:?}"),
            V::Data(d) => write!(
                f,
                "{} bytes, sum {}",
                d.len(),
                d.iter().map(|&b| b as u64).sum::<u64>()
            ),
            V::Stat(k, s) => write!(
                f,
                "{} size {s}",
                if *k == libc::S_IFDIR { "dir" } else { "file" }
            ),
            V::Names(n) => write!(f, "{n:?}"),
        }
    }
}

type Out = Result<V, i32>;

/// Deterministic, position-dependent, never-zero bytes.
fn data(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((off + i + seed as u64 * 7) % 251) as u8 + 1)
        .collect()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn cvt(r: i64) -> Result<i64, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn open_raw(path: &Path, flags: i32) -> Result<OwnedFd, i32> {
    let fd =
        cvt(unsafe { libc::open(cpath(path).as_ptr(), flags | libc::O_CLOEXEC, 0o644) } as i64)?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pread_full(fd: i32, off: u64, len: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = cvt(unsafe {
            libc::pread(
                fd,
                buf[got..].as_mut_ptr().cast(),
                len - got,
                (off + got as u64) as i64,
            )
        } as i64)?;
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    buf.truncate(got);
    Ok(buf)
}

fn stat_of(path: &Path) -> Result<V, i32> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::lstat(cpath(path).as_ptr(), &mut st) } as i64)?;
    let kind = st.st_mode & libc::S_IFMT;
    // A directory's size is the filesystem's business.
    let size = if kind == libc::S_IFDIR {
        0
    } else {
        st.st_size as u64
    };
    Ok(V::Stat(kind, size))
}

struct Side {
    root: PathBuf,
    reference: bool,
    fds: Vec<Option<(OwnedFd, String)>>,
}

impl Side {
    fn path(&self, p: P) -> PathBuf {
        self.root.join(p.rel())
    }

    fn fd(&self, slot: usize) -> Result<i32, i32> {
        self.fds[slot]
            .as_ref()
            .map(|f| f.0.as_raw_fd())
            .ok_or(libc::EBADF)
    }

    /// S3's rule: descriptors of a name are closed before it is unlinked or renamed over.
    fn close_named(&mut self, names: &[P]) {
        for f in &mut self.fds {
            if f.as_ref()
                .is_some_and(|(_, n)| names.iter().any(|p| p.rel() == *n))
            {
                *f = None;
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Out {
        Ok(match *op {
            Op::Create { p, excl } => {
                let excl = if excl { libc::O_EXCL } else { 0 };
                open_raw(&self.path(p), libc::O_CREAT | libc::O_WRONLY | excl)?;
                V::Unit
            }
            Op::Mkdir { p } => {
                cvt(unsafe { libc::mkdir(cpath(&self.path(p)).as_ptr(), 0o755) } as i64)?;
                V::Unit
            }
            Op::Open { slot, p, flags } => {
                self.fds[slot] = None;
                self.fds[slot] = Some((open_raw(&self.path(p), O_FLAGS[flags].1)?, p.rel()));
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
            Op::Fstat { slot } => {
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                cvt(unsafe { libc::fstat(self.fd(slot)?, &mut st) } as i64)?;
                V::Stat(st.st_mode & libc::S_IFMT, st.st_size as u64)
            }
            Op::Ftruncate { slot, size } => {
                cvt(unsafe { libc::ftruncate(self.fd(slot)?, size as i64) } as i64)?;
                V::Unit
            }
            Op::Fsync { slot } => {
                cvt(unsafe { libc::fsync(self.fd(slot)?) } as i64)?;
                V::Unit
            }
            Op::WritePath { p, off, len, seed } => {
                let f = open_raw(&self.path(p), libc::O_WRONLY)?;
                let d = data(seed, off, len);
                V::N(cvt(
                    unsafe { libc::pwrite(f.as_raw_fd(), d.as_ptr().cast(), len, off as i64) }
                        as i64,
                )?)
            }
            Op::AppendPath { p, len, seed } => {
                let f = open_raw(&self.path(p), libc::O_WRONLY | libc::O_APPEND)?;
                let d = data(seed, 0, len);
                V::N(cvt(
                    unsafe { libc::write(f.as_raw_fd(), d.as_ptr().cast(), len) } as i64,
                )?)
            }
            Op::TruncOpen { p, len, seed } => {
                let f = open_raw(&self.path(p), libc::O_WRONLY | libc::O_TRUNC)?;
                let d = data(seed, 0, len);
                V::N(cvt(
                    unsafe { libc::write(f.as_raw_fd(), d.as_ptr().cast(), len) } as i64,
                )?)
            }
            Op::ReadPath { p, off, len } => {
                let f = open_raw(&self.path(p), libc::O_RDONLY)?;
                V::Data(pread_full(f.as_raw_fd(), off, len)?)
            }
            Op::Truncate { p, size } => {
                cvt(unsafe { libc::truncate(cpath(&self.path(p)).as_ptr(), size as i64) } as i64)?;
                V::Unit
            }
            Op::Rename {
                from,
                to,
                noreplace,
            } => {
                self.close_named(&[from, to]);
                let (a, b) = (self.path(from), self.path(to));
                if self.reference && a.is_dir() && !a.is_symlink() {
                    // S3: a directory is not renamed (EXDEV; `mv` copies it), once the
                    // kernel's own checks pass (they come first, as on any filesystem).
                    let parent = b.parent().unwrap();
                    let (fr, tr) = (from.rel(), to.rel());
                    return Err(if !parent.exists() {
                        libc::ENOENT
                    } else if !parent.is_dir() {
                        libc::ENOTDIR
                    } else if noreplace && b.symlink_metadata().is_ok() {
                        libc::EEXIST
                    } else if fr == tr {
                        return Ok(V::Unit);
                    } else if tr.starts_with(&format!("{fr}/")) {
                        libc::EINVAL
                    } else if fr.starts_with(&format!("{tr}/")) {
                        libc::ENOTEMPTY
                    } else if b.exists() && !b.is_dir() {
                        libc::ENOTDIR
                    } else {
                        libc::EXDEV
                    });
                }
                let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
                cvt(unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        cpath(&a).as_ptr(),
                        libc::AT_FDCWD,
                        cpath(&b).as_ptr(),
                        flags,
                    )
                } as i64)?;
                V::Unit
            }
            Op::Unlink { p } => {
                self.close_named(&[p]);
                cvt(unsafe { libc::unlink(cpath(&self.path(p)).as_ptr()) } as i64)?;
                V::Unit
            }
            Op::Rmdir { p } => {
                cvt(unsafe { libc::rmdir(cpath(&self.path(p)).as_ptr()) } as i64)?;
                V::Unit
            }
            Op::Readdir { p } => {
                let mut names = Vec::new();
                for e in
                    std::fs::read_dir(self.path(p)).map_err(|e| e.raw_os_error().unwrap_or(-1))?
                {
                    let e = e.map_err(|e| e.raw_os_error().unwrap_or(-1))?;
                    let dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
                    names.push(format!(
                        "{}{}",
                        e.file_name().to_string_lossy(),
                        if dir { "/" } else { "" }
                    ));
                }
                names.sort();
                V::Names(names)
            }
            Op::Stat { p } => stat_of(&self.path(p))?,
        })
    }
}

/// A tree as compared: path -> (is a directory, contents of a file).
fn tree(root: &Path) -> Result<BTreeMap<String, Option<Vec<u8>>>, String> {
    fn walk(
        root: &Path,
        dir: &Path,
        out: &mut BTreeMap<String, Option<Vec<u8>>>,
    ) -> Result<(), String> {
        let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in rd {
            let e = e.map_err(|e| e.to_string())?;
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                out.insert(rel, None);
                walk(root, &p, out)?;
            } else {
                let d = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                out.insert(rel, Some(d));
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out)?;
    Ok(out)
}

fn describe(t: &BTreeMap<String, Option<Vec<u8>>>) -> String {
    t.iter()
        .map(|(k, v)| match v {
            None => format!("{k}/"),
            Some(d) => format!("{k} ({} bytes)", d.len()),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn compare(what: &str, a: &Path, b: &Path) -> Result<(), String> {
    let (ta, tb) = (tree(a)?, tree(b)?);
    if ta != tb {
        let diff: Vec<_> = ta
            .keys()
            .chain(tb.keys())
            .filter(|k| ta.get(*k) != tb.get(*k))
            .cloned()
            .collect();
        return Err(format!(
            "{what} differ at {diff:?}\n  reference: {}\n  other:     {}",
            describe(&ta),
            describe(&tb)
        ));
    }
    Ok(())
}

fn op_strategy() -> BoxedStrategy<Op> {
    let p = || (0..DIRS.len() as u8, 0..NAMES.len() as u8).prop_map(|(d, n)| P(d, n));
    let slot = || 0..SLOTS;
    let off = || prop_oneof![3 => 0..64u64, 4 => 0..20_000u64, 1 => 65_530..65_542u64];
    let len = || prop_oneof![3 => 0..16usize, 4 => 1..5000usize, 1 => 1..70_000usize];
    let seed = any::<u8>;
    prop_oneof![
        6 => (p(), any::<bool>()).prop_map(|(p, excl)| Op::Create { p, excl }),
        3 => p().prop_map(|p| Op::Mkdir { p }),
        6 => (slot(), p(), 0..O_FLAGS.len()).prop_map(|(slot, p, flags)| Op::Open { slot, p, flags }),
        3 => slot().prop_map(|slot| Op::Close { slot }),
        6 => (slot(), off(), len(), seed()).prop_map(|(slot, off, len, seed)| Op::PWrite { slot, off, len, seed }),
        2 => (slot(), len(), seed()).prop_map(|(slot, len, seed)| Op::Write { slot, len, seed }),
        5 => (slot(), off(), len()).prop_map(|(slot, off, len)| Op::PRead { slot, off, len }),
        2 => slot().prop_map(|slot| Op::Fstat { slot }),
        2 => (slot(), off()).prop_map(|(slot, size)| Op::Ftruncate { slot, size }),
        2 => slot().prop_map(|slot| Op::Fsync { slot }),
        4 => (p(), off(), len(), seed()).prop_map(|(p, off, len, seed)| Op::WritePath { p, off, len, seed }),
        2 => (p(), len(), seed()).prop_map(|(p, len, seed)| Op::AppendPath { p, len, seed }),
        2 => (p(), len(), seed()).prop_map(|(p, len, seed)| Op::TruncOpen { p, len, seed }),
        4 => (p(), off(), len()).prop_map(|(p, off, len)| Op::ReadPath { p, off, len }),
        2 => (p(), off()).prop_map(|(p, size)| Op::Truncate { p, size }),
        3 => (p(), p(), any::<bool>()).prop_map(|(from, to, noreplace)| Op::Rename { from, to, noreplace }),
        3 => p().prop_map(|p| Op::Unlink { p }),
        2 => p().prop_map(|p| Op::Rmdir { p }),
        2 => p().prop_map(|p| Op::Readdir { p }),
        3 => p().prop_map(|p| Op::Stat { p }),
    ]
    .boxed()
}

struct Env {
    reference: PathBuf,
    mnt: PathBuf,
    bucket: PathBuf,
}

fn run_case(env: &Env, ops: &[Op], n: u64) -> Result<(), String> {
    let name = format!("s{n}");
    let side = |root: PathBuf, reference| Side {
        root,
        reference,
        fds: (0..SLOTS).map(|_| None).collect(),
    };
    let mut r = side(env.reference.join(&name), true);
    let mut m = side(env.mnt.join(&name), false);
    for s in [&r, &m] {
        std::fs::create_dir(&s.root).map_err(|e| format!("mkdir {}: {e}", s.root.display()))?;
    }
    let mut log = Vec::new();
    let mut res = Ok(());
    for (i, op) in ops.iter().enumerate() {
        let (a, b) = (r.apply(op), m.apply(op));
        log.push(format!("{i:3}: {op:?} -> {a:?}"));
        if a != b {
            res = Err(format!(
                "step {i}: {op:?}\n  reference: {a:?}\n  tierfs:    {b:?}"
            ));
            break;
        }
    }
    // Every descriptor closed (close uploads): the bucket must hold the tree too.
    r.fds.iter_mut().for_each(|f| *f = None);
    m.fds.iter_mut().for_each(|f| *f = None);
    if res.is_ok() {
        res = compare("reference and mount", &r.root, &m.root);
    }
    if res.is_ok() {
        // In write-back, an fsync of each file puts it in the bucket.
        for (rel, d) in tree(&m.root)? {
            if d.is_some() {
                let f =
                    std::fs::File::open(m.root.join(&rel)).map_err(|e| format!("{rel}: {e}"))?;
                f.sync_all().map_err(|e| format!("fsync {rel}: {e}"))?;
            }
        }
        res = compare("reference and bucket", &r.root, &env.bucket.join(&name));
    }
    let _ = std::fs::remove_dir_all(&r.root);
    let cleanup = std::fs::remove_dir_all(&m.root);
    res.map_err(|e| {
        format!(
            "{e}\n  steps (reference results):\n    {}",
            log.join("\n    ")
        )
    })?;
    cleanup.map_err(|e| format!("tierfs: removing the sequence's tree: {e}"))
}

fn model(label: &str, opts: &[&str], cases: u32) {
    let cases = std::env::var("TIERFS_MODEL_CASES")
        .ok()
        .map(|s| s.parse().expect("TIERFS_MODEL_CASES must be a number"))
        .unwrap_or(cases);
    let base: u64 = std::env::var("TIERFS_MODEL_SEED")
        .ok()
        .map(|s| s.parse().expect("TIERFS_MODEL_SEED must be a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("s3-model[{label}]: seed {base}: replay with TIERFS_MODEL_SEED={base}");
    let server = S3Server::start(&["data"]);
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let endpoint = format!("s3.endpoint={}", server.endpoint);
    let mut all = vec![endpoint.as_str()];
    all.extend_from_slice(opts);
    m.mount_source(
        OsStr::new("s3://data/pre"),
        &all,
        &[
            ("AWS_ACCESS_KEY_ID", ACCESS),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ],
    );
    let refdir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(server.dir.path().join("data/pre")).unwrap();
    let env = Env {
        reference: refdir.path().to_path_buf(),
        mnt: m.mnt.clone(),
        bucket: server.dir.path().join("data/pre"),
    };
    let label = label.to_string();
    with_timeout(Duration::from_secs(600), vec![m.mnt.clone()], move || {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&base.to_le_bytes());
        seed[8..8 + label.len().min(24)].copy_from_slice(&label.as_bytes()[..label.len().min(24)]);
        let mut cfg = Config::with_cases(cases);
        cfg.failure_persistence = None;
        cfg.max_shrink_time = 120_000;
        let mut runner =
            TestRunner::new_with_rng(cfg, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
        let n = std::cell::Cell::new(0u64);
        let ops = std::cell::Cell::new(0u64);
        let result = runner.run(&prop::collection::vec(op_strategy(), 1..=40), |case| {
            let i = n.get();
            n.set(i + 1);
            ops.set(ops.get() + case.len() as u64);
            run_case(&env, &case, i).map_err(TestCaseError::fail)
        });
        match result {
            Ok(()) => println!(
                "s3-model[{label}]: {} sequences, {} operations, no difference from the model",
                n.get(),
                ops.get()
            ),
            Err(TestError::Fail(why, minimal)) => panic!(
                "s3-model[{label}]: tierfs differs from the model (seed {base}; replay with \
                 TIERFS_MODEL_SEED={base}).\nMinimal sequence ({} ops):\n  {}\n{why}",
                minimal.len(),
                minimal
                    .iter()
                    .enumerate()
                    .map(|(i, op)| format!("{i:3}: {op:?}"))
                    .collect::<Vec<_>>()
                    .join("\n  ")
            ),
            Err(e) => panic!("s3-model[{label}]: {e} (seed {base})"),
        }
    });
    m.unmount_and_wait();
}

#[test]
fn s3_model_write_through() {
    model("through", &["ram.block_size=4K", "ram.max=8M"], 150);
}

#[test]
fn s3_model_write_back() {
    model(
        "back",
        &["ram.block_size=4K", "ram.max=8M", "writeback.mode=back"],
        100,
    );
}
