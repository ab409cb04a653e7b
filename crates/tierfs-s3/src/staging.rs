//! A written object before it is uploaded: a local file holding its whole new contents.
//!
//! S3 replaces objects whole, so a write lands in a staging file (an unnamed file in the
//! staging directory, on the cache's disk: a full disk is ENOSPC at write(), never at
//! upload) and the object is uploaded from it at fsync and close ([`crate::upload`]). A random
//! write to an existing object first copies the object in (read-modify-write), once.
//!
//! Every handle of one key shares one staging (the store's registry), and every read of the
//! key, by any handle, is served from it while it holds what the bucket does not have yet:
//! tierfs sees its own writes before they are uploaded, as on any filesystem.

use crate::attrs::etag_nanos;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use tierfs_store::{Attr, Errno, Result, TimeSpec};

/// What the staged contents were made from, and so the condition of their upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Base {
    /// Nothing: the object must still not exist (If-None-Match: *).
    Absent,
    /// This version (ETag): it must still be the one in the bucket (If-Match).
    Etag(String),
    /// The object changed in the bucket behind our back before our writes reached it: an
    /// upload would overwrite the other writer, so it fails (ESTALE) and the staged contents
    /// are kept in the lost directory instead.
    Conflict(String),
}

pub(crate) struct State {
    pub base: Base,
    /// The file holds the whole object of `base` (copied in, or nothing to copy).
    pub loaded: bool,
    /// Holds changes not uploaded yet.
    pub dirty: bool,
    pub size: u64,
    /// When the staged contents last changed (they are shown with this mtime until uploaded).
    pub mtime: TimeSpec,
    /// Counts changes: an upload that saw `n` leaves the staging clean only if still `n`.
    pub changes: u64,
    /// The object's attributes in the bucket, as of `base`.
    pub remote: Attr,
    /// The name was unlinked: nothing more is uploaded.
    pub unlinked: bool,
    /// A conflict kept our contents in the lost directory during an upload whose caller does
    /// not report it to the application (a setattr: the kernel sends the times of a file it
    /// caches writes for as one, and ignores its answer): the next fsync or close does.
    pub unreported: Option<Errno>,
    /// Per part of [`Staging::part_size`]: how many changes touched it, so that a part
    /// uploaded ahead (see `ahead`) is used only if nothing touched it since it was read.
    pub part_changes: Vec<u64>,
}

impl State {
    /// Counts a change to bytes `from..to` (`to`: None, to the end) of parts of `part` bytes.
    fn touch(&mut self, part: u64, from: u64, to: Option<u64>) {
        let first = (from / part) as usize;
        let last = match to {
            Some(t) => ((t.max(from + 1) - 1) / part) as usize,
            None => (self.size.max(from) / part).max(self.part_changes.len() as u64) as usize,
        };
        if self.part_changes.len() <= last {
            self.part_changes.resize(last + 1, 0);
        }
        let end = match to {
            Some(_) => last + 1,
            None => self.part_changes.len(),
        };
        for c in &mut self.part_changes[first..end] {
            *c += 1;
        }
    }
}

/// The parts of one staging uploaded ahead (see `ahead`, which does the uploading).
#[derive(Default)]
pub(crate) struct Ahead {
    /// The multipart upload they went to (None: none made yet).
    pub id: Option<String>,
    /// Part index -> its ETag and the part's change count when it was read.
    pub done: HashMap<u64, (String, u64)>,
    /// Parts being uploaded (and the making of the multipart upload, under `ahead`'s `MAKING`), and
    /// their tasks.
    pub busy: HashMap<u64, tokio::task::JoinHandle<()>>,
    /// The lowest part not considered yet (a writer's later parts are looked at once each).
    pub next: u64,
    /// Where the last write ended: only a writer going forward in order uploads ahead (a
    /// random writer would send parts it rewrites later).
    pub last_end: u64,
    /// The multipart upload could not be made: no more tries until the next fsync.
    pub failed: bool,
}

pub(crate) struct Staging {
    pub rel: Arc<str>,
    pub file: File,
    pub st: Mutex<State>,
    /// One upload at a time.
    pub uploading: Mutex<()>,
    /// The part size of its multipart uploads (`s3.part_size` when it was made).
    pub part_size: u64,
    /// Parts uploaded while it is still being written (see `ahead`).
    pub ahead: Mutex<Ahead>,
}

impl Staging {
    pub fn new(
        dir: &Path,
        rel: Arc<str>,
        base: Base,
        remote: Attr,
        part_size: u64,
    ) -> Result<Staging> {
        let file = tempfile::tempfile_in(dir).map_err(|e| {
            tracing::error!("S3 staging in {}: {e}", dir.display());
            Errno(e.raw_os_error().unwrap_or(libc::EIO))
        })?;
        Ok(Staging {
            rel,
            file,
            st: Mutex::new(State {
                loaded: remote.size == 0 || base == Base::Absent,
                dirty: false,
                size: remote.size,
                mtime: remote.mtime,
                changes: 0,
                unlinked: false,
                unreported: None,
                part_changes: Vec::new(),
                base,
                remote,
            }),
            uploading: Mutex::new(()),
            part_size: part_size.max(1),
            ahead: Mutex::new(Default::default()),
        })
    }

    /// The attributes to show: the bucket's, or the staged contents' while not uploaded (a
    /// new fingerprint at every change: ctime's nanoseconds count the changes).
    pub fn attr(&self) -> Attr {
        let g = self.st.lock();
        if !g.dirty {
            return g.remote;
        }
        let mut a = g.remote;
        a.size = g.size;
        a.blocks = g.size.div_ceil(512);
        a.mtime = g.mtime;
        a.ctime = TimeSpec {
            sec: g.mtime.sec,
            nsec: etag_nanos(Some(&format!("staged {}", g.changes))),
        };
        a
    }

    pub fn dirty(&self) -> bool {
        self.st.lock().dirty
    }

    /// What changes when the staging is written to or uploaded: its change count and base.
    pub fn mark(&self) -> (u64, Base) {
        let g = self.st.lock();
        (g.changes, g.base.clone())
    }

    /// Whether the object at ETag `etag` (None: none) is the version this staging holds, or
    /// was made from.
    pub fn based_on(&self, etag: Option<&str>) -> bool {
        let unquote = |e: &str| e.trim_matches('"').to_string();
        match (&self.st.lock().base, etag) {
            (Base::Etag(b), Some(e)) => unquote(b) == unquote(e),
            _ => false,
        }
    }

    /// Copies the object in first if needed (`fetch` fills the file with the object of the
    /// base version and returns its length), so a change applies to the whole object.
    pub fn load(&self, fetch: impl FnOnce(&File, &mut Base) -> Result<u64>) -> Result<()> {
        let mut g = self.st.lock();
        if g.loaded {
            return Ok(());
        }
        let n = fetch(&self.file, &mut g.base)?;
        g.size = n;
        g.loaded = true;
        g.touch(self.part_size, 0, None);
        Ok(())
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut g = self.st.lock();
        debug_assert!(g.loaded);
        let written = self.file.write_all_at(data, offset);
        // Counted for the parts even if it failed part-way: some bytes may have changed, and
        // a part uploaded ahead of them must not be used (see `ahead`).
        g.touch(self.part_size, offset, Some(offset + data.len() as u64));
        written.map_err(io_errno)?;
        g.size = g.size.max(offset + data.len() as u64);
        changed(&mut g);
        Ok(())
    }

    pub fn set_len(&self, size: u64) -> Result<()> {
        let mut g = self.st.lock();
        if g.loaded && g.size == size {
            // No change (the O_TRUNC of a new, empty object): nothing to upload. An upload
            // would make a new version (a new Last-Modified) of bytes the bucket has.
            return Ok(());
        }
        self.file.set_len(size).map_err(io_errno)?;
        let from = g.size.min(size);
        g.size = size;
        g.loaded = true;
        g.touch(self.part_size, from, None);
        changed(&mut g);
        Ok(())
    }

    /// Bytes `at..at + len` of the staging file, which must hold them (an upload's body).
    pub fn read_range(&self, at: u64, len: u64) -> Result<bytes::Bytes> {
        let mut buf = vec![0u8; len as usize];
        self.file.read_exact_at(&mut buf, at).map_err(io_errno)?;
        Ok(bytes::Bytes::from(buf))
    }

    /// Reads the staged contents (only meaningful once loaded).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let size = self.st.lock().size;
        let end = size.min(offset.saturating_add(buf.len() as u64));
        if offset >= end {
            return Ok(0);
        }
        let n = (end - offset) as usize;
        self.file
            .read_exact_at(&mut buf[..n], offset)
            .map_err(io_errno)?;
        Ok(n)
    }
}

fn changed(g: &mut State) {
    g.dirty = true;
    g.changes += 1;
    g.mtime = now();
}

pub(crate) fn now() -> TimeSpec {
    TimeSpec::now()
}

pub(crate) fn io_errno(e: std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}
