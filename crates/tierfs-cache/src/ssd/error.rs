//! Errors of the SSD tier. Each displays as one line that says what to do.

use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug)]
pub enum SsdError {
    /// A system call on a file of the tier failed.
    Io {
        op: &'static str,
        path: PathBuf,
        err: io::Error,
    },
    /// The directory was filled for another backing store.
    WrongStore {
        dir: PathBuf,
        found: String,
        expected: String,
    },
    /// The directory was filled with another block size (block indexes would mean other bytes).
    WrongBlockSize {
        dir: PathBuf,
        found: u32,
        expected: u32,
    },
    /// The directory was written by another version of the on-disk format.
    WrongFormat {
        dir: PathBuf,
        found: u32,
        expected: u32,
    },
    /// The superblock is unreadable, or missing beside segment files.
    Damaged { dir: PathBuf, what: String },
    /// Another process (or another `SsdCache` in this one) uses the directory.
    Busy { dir: PathBuf },
    /// A setting is out of range.
    Config(String),
    /// The cache was shut down.
    Closed,
}

const RESET: &str = "use --reset-cache to rebuild it";

impl fmt::Display for SsdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SsdError::Io { op, path, err } => {
                write!(f, "cannot {op} {}: {err}", path.display())
            }
            SsdError::WrongStore {
                dir,
                found,
                expected,
            } => write!(
                f,
                "cache directory {} belongs to store {found} (this mount is {expected}); {RESET}",
                dir.display()
            ),
            SsdError::WrongBlockSize {
                dir,
                found,
                expected,
            } => write!(
                f,
                "cache directory {} was filled with {found}-byte blocks (this mount uses {expected}); {RESET}",
                dir.display()
            ),
            SsdError::WrongFormat {
                dir,
                found,
                expected,
            } => write!(
                f,
                "cache directory {} has on-disk format {found} (this tierfs reads {expected}); the next mount rebuilds it empty",
                dir.display()
            ),
            SsdError::Damaged { dir, what } => write!(
                f,
                "cache directory {} is damaged ({what}); {RESET}",
                dir.display()
            ),
            SsdError::Busy { dir } => write!(
                f,
                "cache directory {} is in use by another tierfs; give each mount its own",
                dir.display()
            ),
            SsdError::Config(m) => write!(f, "invalid SSD cache setting: {m}"),
            SsdError::Closed => write!(f, "the SSD cache is shut down"),
        }
    }
}

impl std::error::Error for SsdError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SsdError::Io { err, .. } => Some(err),
            _ => None,
        }
    }
}

/// Shorthand: `.map_err(io_err("read", &path))`.
pub(crate) fn io_err(
    op: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(io::Error) -> SsdError {
    let path = path.to_path_buf();
    move |err| SsdError::Io { op, path, err }
}
