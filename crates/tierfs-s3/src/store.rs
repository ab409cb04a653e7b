//! [`S3Store`], the store of a bucket, with the nodes and open handles it hands out: opening
//! the bucket, its local directories and upload settings, and what every call asks of a name
//! (its key under the parent, whether an object or a directory is there, the staging
//! registry). The [`tierfs_store::Store`] calls are in `store_calls` (namespace and listings)
//! and `store_io` (open files: writes staged locally and uploaded whole at fsync and close,
//! reads by version (ETag); see [`crate::staging`] and [`crate::upload`]), both above this.

use crate::config::S3Config;
use crate::ctx::{Client, Ctx, UploadConfig, PART_MIN};
use crate::errors::errno;
use crate::staging::Staging;
use futures::StreamExt;
use object_store::ObjectStore;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use tierfs_store::{Attr, Errno, FileKind, Result};

/// A file or directory of the bucket: its path relative to the mounted prefix ("" = root).
#[derive(Clone, Debug)]
pub struct S3Node {
    pub(crate) rel: Arc<str>,
    pub(crate) kind: FileKind,
}

/// An open object. Read-only: the version (ETag) it was opened at, which every read asks for
/// (If-Match), so a handle never returns bytes of two versions. Writable: the staging it
/// shares with every other handle of the key.
pub struct S3Handle {
    pub(crate) rel: Arc<str>,
    pub(crate) attr: Attr,
    pub(crate) etag: Option<String>,
    pub(crate) staging: Option<Arc<Staging>>,
    pub(crate) append: bool,
    /// Opened for writing (a read-only handle may hold a staging too, to read it).
    pub(crate) writable: bool,
    /// Where our own uploads stood when it was opened (see `lineage`).
    pub(crate) since: u64,
    /// The object's first bytes, fetched by the open (see `first`).
    pub(crate) first: Option<bytes::Bytes>,
    /// A sequential reader's GET (see `stream`).
    pub(crate) stream: crate::stream::Streaming,
    pub(crate) ctx: Arc<Ctx>,
}

impl Drop for S3Handle {
    /// The last handle of a staging uploads what is left (a write through a memory map
    /// arrives after close); then the registry forgets the key. (Left: a clone a reader or
    /// a stat takes for a moment (`staging_of`) may be the last to let go, and uploads
    /// nothing. Only writes made after the writers' close could be left out so: not seen.)
    fn drop(&mut self) {
        let Some(s) = self.staging.take() else { return };
        loop {
            {
                // A handle that is not the last lets go under the registry's lock, so of two
                // handles dropped at once the second sees itself the last (each reading the
                // count unlocked could see the other's, and neither would upload).
                let reg = self.ctx.staged.lock();
                if Arc::strong_count(&s) > 1 {
                    drop(s);
                    drop(reg);
                    return;
                }
            }
            // Still registered while it uploads: an open meanwhile shares it, as before, and
            // if it wrote and let go meanwhile (seeing this one), this one looks again.
            if !s.dirty() || s.st.lock().unlinked {
                break;
            }
            if let Err(e) = self.ctx.upload(&s) {
                tracing::error!(
                    "S3: uploading {} at its last close failed: {e}",
                    self.ctx.full_key(&s.rel)
                );
                break;
            }
        }
        // Nothing more will be uploaded from it: parts sent ahead that no upload took are
        // aborted (an upload that failed, a name unlinked meanwhile).
        self.ctx.forget_ahead(&s);
        drop(s);
        let mut reg = self.ctx.staged.lock();
        if reg.get(&self.rel).is_some_and(|w| w.strong_count() == 0) {
            reg.remove(&self.rel);
        }
    }
}

pub struct S3Store {
    pub(crate) ctx: Arc<Ctx>,
}

impl std::ops::Deref for S3Store {
    type Target = Ctx;
    fn deref(&self) -> &Ctx {
        &self.ctx
    }
}

impl S3Store {
    /// Connects to the bucket and checks that it answers (one listing request), so a wrong
    /// endpoint, bucket or key is one clear error at mount time.
    pub fn open(cfg: S3Config) -> std::result::Result<S3Store, String> {
        let where_ = cfg
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("AWS {}", cfg.region));
        let store = S3Store {
            ctx: Arc::new(Ctx::new(cfg)),
        };
        // A client of its own for the check, dropped with its runtime and connections
        // before the caller forks.
        let check = Client::new(&store.cfg)?;
        let prefix = store.dir_key("");
        let first = check
            .rt
            .block_on(async { check.s3.list(prefix.as_ref()).next().await.transpose() });
        drop(check);
        if let Err(e) = first {
            return Err(format!(
                "s3://{} at {where_}: {}",
                store.cfg.bucket,
                crate::errors::describe(&e)
            ));
        }
        Ok(store)
    }

    pub fn config(&self) -> &S3Config {
        &self.cfg
    }

    /// Where staging files go (the cache's disk) and where contents that could not be
    /// uploaded are kept; both made if missing.
    pub fn set_local_dirs(&self, staging: PathBuf, lost: PathBuf) -> std::io::Result<()> {
        std::fs::create_dir_all(&staging)?;
        *self.staging_dir.lock() = staging;
        *self.lost_dir.lock() = lost;
        Ok(())
    }

    /// `s3.part_size` (at least S3's 5 MiB) and `s3.upload_parallel`.
    pub fn set_upload(&self, part_size: u64, parallel: usize) {
        *self.upload.lock() = UploadConfig {
            part_size: part_size.max(PART_MIN),
            parallel: parallel.max(1),
        };
    }

    pub(crate) fn child(parent: &S3Node, name: &OsStr) -> Result<Arc<str>> {
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::ENOENT)?;
        if name.is_empty() || name.contains('/') {
            return Err(Errno::ENOENT);
        }
        Ok(if parent.rel.is_empty() {
            name.into()
        } else {
            format!("{}/{name}", parent.rel).into()
        })
    }

    /// `a`, or what our staged writes make of it (shown before they are uploaded).
    pub(crate) fn overlay(&self, rel: &str, a: Attr) -> Attr {
        match self.staging_of(rel) {
            Some(s) if s.dirty() => {
                let mut b = s.attr();
                b.ino = a.ino;
                b
            }
            _ => a,
        }
    }

    /// The name `rel` is gone (unlinked, renamed over): writes through a handle still open
    /// on its staging go nowhere, as on any filesystem, and the next object of that name is
    /// staged afresh (a re-create never writes into the old staging, which is never
    /// uploaded).
    pub(crate) fn retire_staging(&self, rel: &str) {
        // (The registry's lock is not held while the staging's is taken.)
        let gone = self.staged.lock().remove(rel);
        if let Some(s) = gone.and_then(|w| w.upgrade()) {
            s.st.lock().unlinked = true;
            self.ctx.forget_ahead(&s);
        }
    }

    pub(crate) fn file_node(rel: Arc<str>) -> S3Node {
        S3Node {
            rel,
            kind: FileKind::File,
        }
    }

    /// The object of a directory entry that is in the way of a new one, if any.
    pub(crate) fn exists(&self, rel: &str) -> Result<bool> {
        match self.head(rel) {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether `rel` is a directory (a `rel/` marker or keys under `rel/`), and whether it
    /// has anything in it besides its marker.
    pub(crate) fn dir_state(&self, rel: &str) -> Result<(bool, bool)> {
        let key = self.key(rel)?;
        let c = self.client()?;
        let mut list = c.s3.list(Some(&key));
        let state = c.rt.block_on(async {
            let mut is_dir = false;
            while let Some(m) = list.next().await {
                is_dir = true;
                if m?.location != key {
                    return Ok::<_, object_store::Error>((true, true));
                }
            }
            Ok((is_dir, false))
        });
        state.map_err(|e| errno(&e))
    }

    pub(crate) fn is_dir(&self, rel: &str) -> Result<bool> {
        Ok(self.dir_state(rel)?.0)
    }
}
