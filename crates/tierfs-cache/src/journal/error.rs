//! Errors of the write-back journal. Each displays as one line that says what happened where.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum JournalError {
    /// A system call on a journal file failed.
    Io {
        op: &'static str,
        path: PathBuf,
        err: io::Error,
    },
    /// A file of the journal does not hold what it must: `path` at byte `offset`. For a segment
    /// that is not the last one this means acknowledged writes cannot be replayed.
    Damaged {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// The journal was written for another backing store.
    WrongStore {
        dir: PathBuf,
        found: String,
        expected: String,
    },
    /// The journal was written by another version of the on-disk format.
    WrongFormat {
        dir: PathBuf,
        found: u32,
        expected: u32,
    },
    /// Appending would exceed the capacity: the caller waits for flushers (`wait_for_space`).
    Full { used: u64, cap: u64 },
    /// The cache device has no room for the journal's next segment (`why`: the error of the
    /// last attempt). Nothing is lost or stopped: appends that fit the current segment go on,
    /// and the writer tries again when an append needs the next one.
    NoSpace { dir: PathBuf, why: String },
    /// A record does not fit in one segment.
    TooLarge { len: u64, max: u64 },
    /// A setting or an argument is out of range.
    Config(String),
    /// An earlier write or fdatasync of the journal failed; nothing after it can be trusted to
    /// be durable, so the journal refuses further work.
    Failed(String),
    /// The journal was shut down.
    Closed,
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalError::Io { op, path, err } => {
                write!(f, "cannot {op} journal file {}: {err}", path.display())
            }
            JournalError::Damaged { path, offset, what } => write!(
                f,
                "journal file {} is damaged at byte {offset} ({what}); writes recorded after it cannot be replayed",
                path.display()
            ),
            JournalError::WrongStore {
                dir,
                found,
                expected,
            } => write!(
                f,
                "journal {} belongs to store {found} (this mount is {expected})",
                dir.display()
            ),
            JournalError::WrongFormat {
                dir,
                found,
                expected,
            } => write!(
                f,
                "journal {} has on-disk format {found} (this tierfs reads {expected})",
                dir.display()
            ),
            JournalError::Full { used, cap } => {
                write!(f, "journal full: {used} of {cap} bytes in use")
            }
            JournalError::NoSpace { dir, why } => write!(
                f,
                "no room on the cache device for the next journal segment in {}: {why}",
                dir.display()
            ),
            JournalError::TooLarge { len, max } => {
                write!(f, "journal record of {len} bytes exceeds the {max}-byte limit")
            }
            JournalError::Config(m) => write!(f, "invalid journal setting: {m}"),
            JournalError::Failed(m) => write!(f, "the journal stopped after an I/O error: {m}"),
            JournalError::Closed => write!(f, "the journal is shut down"),
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JournalError::Io { err, .. } => Some(err),
            _ => None,
        }
    }
}

/// Shorthand: `.map_err(io_err("read", &path))`.
pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> JournalError {
    let path = path.to_path_buf();
    move |err| JournalError::Io { op, path, err }
}
