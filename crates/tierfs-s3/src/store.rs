//! [`S3Store`]: the [`Store`] of a bucket: listings, reads by version (ETag), and writes
//! staged locally and uploaded whole at fsync and close (see [`crate::staging`] and
//! [`crate::upload`]).

use crate::attrs::{dir_attr, key_ino, object_attr};
use crate::config::S3Config;
use crate::ctx::{Client, Ctx, UploadConfig, PART_MIN};
use crate::errors::errno;
use crate::staging::{Base, Staging};
use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use tierfs_store::{
    Attr, DirEntry, Errno, FileKind, Fingerprint, Identity, Owner, Result, SetAttr, StatFs, Store,
};

/// The longest key S3 takes, as NAME_MAX of statfs.
const KEY_MAX: u32 = 1024;

/// A file or directory of the bucket: its path relative to the mounted prefix ("" = root).
#[derive(Clone, Debug)]
pub struct S3Node {
    rel: Arc<str>,
    kind: FileKind,
}

/// An open object. Read-only: the version (ETag) it was opened at, which every read asks for
/// (If-Match), so a handle never returns bytes of two versions. Writable: the staging it
/// shares with every other handle of the key.
pub struct S3Handle {
    rel: Arc<str>,
    attr: Attr,
    etag: Option<String>,
    staging: Option<Arc<Staging>>,
    append: bool,
    /// Opened for writing (a read-only handle may hold a staging too, to read it).
    writable: bool,
    /// Where our own uploads stood when it was opened (see `lineage`).
    since: u64,
    /// The object's first bytes, fetched by the open (see `first`).
    first: Option<bytes::Bytes>,
    ctx: Arc<Ctx>,
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
        drop(s);
        let mut reg = self.ctx.staged.lock();
        if reg.get(&self.rel).is_some_and(|w| w.strong_count() == 0) {
            reg.remove(&self.rel);
        }
    }
}

pub struct S3Store {
    ctx: Arc<Ctx>,
}

impl std::ops::Deref for S3Store {
    type Target = Ctx;
    fn deref(&self) -> &Ctx {
        &self.ctx
    }
}

impl S3Store {
    /// fsync (`take`: it reports an earlier conflict once) and close: the object is durable
    /// in the bucket when this returns (uploaded if staged).
    fn publish(&self, h: &S3Handle, take: bool) -> Result<()> {
        match &h.staging {
            Some(s) => self.ctx.upload_reported(s, take),
            None => {
                tracing::debug!("S3 fsync of {}: a read handle, nothing staged", h.rel);
                Ok(())
            }
        }
    }

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

    fn child(parent: &S3Node, name: &OsStr) -> Result<Arc<str>> {
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
    fn overlay(&self, rel: &str, a: Attr) -> Attr {
        match self.staging_of(rel) {
            Some(s) if s.dirty() => {
                let mut b = s.attr();
                b.ino = a.ino;
                b
            }
            _ => a,
        }
    }

    /// The staging of `rel`: the live one, or a new one based on the object as it is now
    /// (`expect`: the version the caller's writes were made on; another one in the bucket is
    /// a conflict).
    fn stage(&self, rel: &Arc<str>, expect: Option<Fingerprint>) -> Result<Arc<Staging>> {
        let live = self.staging_of(rel);
        if let Some(s) = live.as_ref().filter(|s| s.dirty()) {
            tracing::debug!("S3 staging of {rel} written to already: writes join it");
            return Ok(s.clone());
        }
        let mark = live.as_ref().map(|s| s.mark());
        let (attr, etag) = self.head(rel)?;
        // A clean staging (uploaded, or not written yet) may be kept alive by read handles
        // long after: it is the base of new writes only while the bucket still holds its
        // version, else they would be made on an old object and refused at upload.
        if let Some(s) = live.as_ref().filter(|s| s.based_on(etag.as_deref())) {
            tracing::debug!("S3 staging of {rel} still the bucket's version {etag:?}: kept");
            return Ok(s.clone());
        }
        let base = match (expect, etag) {
            (Some(fp), _) if fp != attr.fingerprint() => Base::Conflict(
                "the object was changed in the bucket by another writer before our written \
                 data reached it (kept: our writes applied to the object as the other writer \
                 left it)"
                    .into(),
            ),
            (_, Some(e)) => Base::Etag(e),
            (_, None) => Base::Conflict("the server gave the object no ETag".into()),
        };
        tracing::debug!("S3 new staging of {rel}: {base:?}, {} bytes", attr.size);
        let dir = self.staging_dir.lock().clone();
        let s = Arc::new(Staging::new(&dir, rel.clone(), base, attr)?);
        let mut reg = self.staged.lock();
        if let Some(other) = reg.get(rel).and_then(std::sync::Weak::upgrade) {
            // Made by another open meanwhile; or the one found outdated above, written to or
            // uploaded since the HEAD (which may then show the version before its upload).
            let replaced = live.as_ref().is_some_and(|l| Arc::ptr_eq(l, &other));
            if !replaced || other.dirty() || mark.as_ref() != Some(&other.mark()) {
                return Ok(other);
            }
        }
        reg.insert(rel.clone(), Arc::downgrade(&s));
        Ok(s)
    }

    /// The name `rel` is gone (unlinked, renamed over): writes through a handle still open
    /// on its staging go nowhere, as on any filesystem, and the next object of that name is
    /// staged afresh (a re-create never writes into the old staging, which is never
    /// uploaded).
    fn retire_staging(&self, rel: &str) {
        // (The registry's lock is not held while the staging's is taken.)
        let gone = self.staged.lock().remove(rel);
        if let Some(s) = gone.and_then(|w| w.upgrade()) {
            s.st.lock().unlinked = true;
        }
    }

    /// The version our own uploads made of the one read handle `h` was opened at (see
    /// `lineage`): its attributes and ETag.
    fn followed(&self, h: &S3Handle) -> Option<(Attr, String)> {
        self.ours.follow(&h.rel, h.etag.as_deref()?, h.since)
    }

    /// What handle `h` reads and shows (`read_bytes` and `fstat` alike): a staging (its own;
    /// else the key's, while it holds writes not uploaded yet or is the very version the
    /// handle reads: one a reader holds may be older than the bucket's), and for a handle
    /// without a staging of its own, the version our uploads made of the one it was opened
    /// at.
    fn current(&self, h: &S3Handle) -> (Option<Arc<Staging>>, Option<(Attr, String)>) {
        if let Some(s) = &h.staging {
            return (Some(s.clone()), None);
        }
        let followed = self.followed(h);
        let etag = followed
            .as_ref()
            .map(|(_, e)| e.as_str())
            .or(h.etag.as_deref());
        let shared = self
            .staging_of(&h.rel)
            .filter(|s| s.dirty() || (etag.is_some() && s.based_on(etag)));
        (shared, followed)
    }

    fn file_node(rel: Arc<str>) -> S3Node {
        S3Node {
            rel,
            kind: FileKind::File,
        }
    }

    fn handle(
        &self,
        rel: Arc<str>,
        attr: Attr,
        etag: Option<String>,
        s: Option<Arc<Staging>>,
        flags: i32,
        since: u64,
    ) -> S3Handle {
        S3Handle {
            rel,
            attr,
            etag,
            staging: s,
            append: flags & libc::O_APPEND != 0,
            writable: flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0,
            since,
            first: None,
            ctx: self.ctx.clone(),
        }
    }

    /// Opens `rel` for writing: its staging (truncated for O_TRUNC).
    fn open_write(
        &self,
        rel: &Arc<str>,
        flags: i32,
        expect: Option<Fingerprint>,
    ) -> Result<S3Handle> {
        let s = self.stage(rel, expect)?;
        if flags & libc::O_TRUNC != 0 {
            s.set_len(0)?;
        }
        let mut a = s.attr();
        a.ino = key_ino(rel);
        Ok(self.handle(rel.clone(), a, None, Some(s), flags, self.ours.now()))
    }

    /// The object of a directory entry that is in the way of a new one, if any.
    fn exists(&self, rel: &str) -> Result<bool> {
        match self.head(rel) {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether `rel` is a directory (a `rel/` marker or keys under `rel/`), and whether it
    /// has anything in it besides its marker.
    fn dir_state(&self, rel: &str) -> Result<(bool, bool)> {
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

    fn is_dir(&self, rel: &str) -> Result<bool> {
        Ok(self.dir_state(rel)?.0)
    }
}

const EPERM: Errno = Errno(libc::EPERM);

impl Store for S3Store {
    type Node = S3Node;
    type Handle = S3Handle;

    fn store_id(&self) -> &str {
        &self.id
    }

    fn identity(&self) -> Identity {
        Identity::Path
    }

    /// The server answers (one listing request of the prefix, 5 s at most): the bucket is the
    /// same one, so every node stays valid.
    fn reconnect(&self) -> Result<tierfs_store::Reconnect> {
        let c = self.client()?;
        let prefix = self.dir_key("");
        let r = c.rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), async {
                c.s3.list(prefix.as_ref()).next().await.transpose()
            })
            .await
        });
        match r {
            Ok(Ok(_)) => Ok(tierfs_store::Reconnect::Same),
            Ok(Err(e)) => Err(errno(&e)),
            Err(_) => Err(Errno::ENOTCONN),
        }
    }

    fn root(&self) -> Result<(S3Node, Attr)> {
        let mut a = dir_attr(self.owner, self.born);
        a.ino = 1;
        Ok((
            S3Node {
                rel: "".into(),
                kind: FileKind::Dir,
            },
            a,
        ))
    }

    fn lookup(&self, parent: &S3Node, name: &OsStr) -> Result<(S3Node, Attr)> {
        let rel = Self::child(parent, name)?;
        let key = self.key(&rel)?;
        // The object and anything under `key/`, both at once: one round trip's worth. A
        // directory hides a file of the same name (as mountpoint-s3 does).
        let c = self.client()?;
        let (head, under) = c.rt.block_on(async {
            let head = c.s3.head(&key);
            let under = async { c.s3.list(Some(&key)).next().await.transpose() };
            futures::join!(head, under)
        });
        match under {
            Ok(Some(_)) => {
                let mut a = dir_attr(self.owner, self.born);
                a.ino = key_ino(&rel);
                return Ok((
                    S3Node {
                        rel,
                        kind: FileKind::Dir,
                    },
                    a,
                ));
            }
            Ok(None) => {}
            Err(e) => return Err(errno(&e)),
        }
        match head {
            Ok(meta) => {
                let mut a = object_attr(&meta, self.owner);
                a.ino = key_ino(&rel);
                let a = self.overlay(&rel, a);
                Ok((
                    S3Node {
                        rel,
                        kind: FileKind::File,
                    },
                    a,
                ))
            }
            Err(e) => Err(errno(&e)),
        }
    }

    fn child_node(&self, parent: &S3Node, name: &OsStr, kind: FileKind) -> Option<S3Node> {
        Some(S3Node {
            rel: Self::child(parent, name).ok()?,
            kind,
        })
    }

    /// A HEAD: an open of an object the caches hold is checked without opening it (the
    /// open's GET, see `first`, is for objects read from the store).
    fn revalidate(&self, node: &S3Node) -> Option<Result<Attr>> {
        (node.kind != FileKind::Dir).then(|| self.getattr(node))
    }

    fn getattr(&self, node: &S3Node) -> Result<Attr> {
        match node.kind {
            FileKind::Dir => {
                let mut a = dir_attr(self.owner, self.born);
                a.ino = if node.rel.is_empty() {
                    1
                } else {
                    key_ino(&node.rel)
                };
                Ok(a)
            }
            _ => {
                if let Some(s) = self.staging_of(&node.rel).filter(|s| s.dirty()) {
                    let mut a = s.attr();
                    a.ino = key_ino(&node.rel);
                    return Ok(a);
                }
                Ok(self.head(&node.rel)?.0)
            }
        }
    }

    /// Only a size (a truncate) changes an object; modes, owners and times are not kept
    /// (docs/s3.md): they are accepted and the attributes stay as the object's.
    fn setattr(&self, node: &S3Node, h: Option<&S3Handle>, set: &SetAttr) -> Result<Attr> {
        let Some(size) = set.size else {
            return self.getattr(node);
        };
        if node.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        let own;
        let s = match h.and_then(|h| h.staging.as_ref()) {
            Some(s) => s,
            None => {
                own = self.stage(&node.rel, None)?;
                &own
            }
        };
        if size > 0 {
            self.load(s)?;
        }
        s.set_len(size)?;
        if h.is_none() {
            // truncate(2) by name: no close will follow.
            self.upload(s)?;
        }
        let mut a = s.attr();
        a.ino = key_ino(&node.rel);
        Ok(a)
    }

    fn readlink(&self, _: &S3Node) -> Result<OsString> {
        Err(Errno::EINVAL)
    }

    fn mknod(&self, _: &S3Node, _: &OsStr, _: u32, _: u64, _: Owner) -> Result<(S3Node, Attr)> {
        Err(EPERM)
    }

    /// The zero-byte `name/` marker.
    fn mkdir(&self, parent: &S3Node, name: &OsStr, _: u32, _: Owner) -> Result<(S3Node, Attr)> {
        let rel = Self::child(parent, name)?;
        if self.exists(&rel)? || self.is_dir(&rel)? {
            return Err(Errno(libc::EEXIST));
        }
        self.put_marker(&rel)?;
        let mut a = dir_attr(self.owner, self.born);
        a.ino = key_ino(&rel);
        Ok((
            S3Node {
                rel,
                kind: FileKind::Dir,
            },
            a,
        ))
    }

    fn symlink(&self, _: &S3Node, _: &OsStr, _: &OsStr, _: Owner) -> Result<(S3Node, Attr)> {
        Err(EPERM)
    }

    fn link(&self, _: &S3Node, _: &S3Node, _: &OsStr) -> Result<Attr> {
        Err(EPERM)
    }

    fn unlink(&self, parent: &S3Node, name: &OsStr) -> Result<()> {
        let rel = Self::child(parent, name)?;
        if !self.exists(&rel)? {
            return Err(if self.is_dir(&rel)? {
                Errno::EISDIR
            } else {
                Errno::ENOENT
            });
        }
        let key = self.key(&rel)?;
        self.run(self.client()?.s3.delete(&key))?;
        self.ours.forget(&rel);
        self.retire_staging(&rel);
        Ok(())
    }

    fn rmdir(&self, parent: &S3Node, name: &OsStr) -> Result<()> {
        let rel = Self::child(parent, name)?;
        match self.dir_state(&rel)? {
            (_, true) => return Err(Errno(libc::ENOTEMPTY)),
            (false, _) if self.exists(&rel)? => return Err(Errno::ENOTDIR),
            (false, _) => return Err(Errno::ENOENT),
            (true, false) => {}
        }
        self.delete_marker(&rel)
    }

    /// A file: copied inside the bucket, then the old key deleted (not atomic: for a moment
    /// both names exist). A directory: EXDEV (`mv` then copies and deletes file by file).
    fn rename(
        &self,
        parent: &S3Node,
        name: &OsStr,
        newparent: &S3Node,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let (from, to) = (Self::child(parent, name)?, Self::child(newparent, newname)?);
        if flags & libc::RENAME_EXCHANGE != 0 {
            return Err(Errno::EINVAL);
        }
        if !self.exists(&from)? {
            return Err(if self.is_dir(&from)? {
                Errno(libc::EXDEV)
            } else {
                Errno::ENOENT
            });
        }
        if from == to {
            return Ok(());
        }
        if self.is_dir(&to)? {
            return Err(Errno::EISDIR);
        }
        if flags & libc::RENAME_NOREPLACE != 0 && self.exists(&to)? {
            return Err(Errno(libc::EEXIST));
        }
        if let Some(s) = self.staging_of(&from) {
            // What is staged under the old name goes with it.
            self.upload(&s)?;
        }
        let c = self.client()?;
        let (kf, kt) = (self.key(&from)?, self.key(&to)?);
        // Neither name's next object is a version of ours to follow to, nor is what is
        // staged under either name (uploaded above for `from`) a base for new writes.
        self.ours.forget(&from);
        self.ours.forget(&to);
        self.staged.lock().remove(&from);
        self.retire_staging(&to);
        self.run(c.s3.copy(&kf, &kt))?;
        self.run(c.s3.delete(&kf))?;
        Ok(())
    }

    fn open(&self, node: &S3Node, flags: i32) -> Result<S3Handle> {
        self.open_based(node, flags, None)
    }

    fn open_based(&self, node: &S3Node, flags: i32, base: Option<Fingerprint>) -> Result<S3Handle> {
        if node.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return self.open_write(&node.rel, flags, base);
        }
        let since = self.ours.now();
        if let Some(s) = self.staging_of(&node.rel).filter(|s| s.dirty()) {
            // Our writes not uploaded yet: the handle reads them, and keeps them reachable
            // (with what is written after) once uploaded, as a local file's descriptor would.
            let mut a = s.attr();
            a.ino = key_ino(&node.rel);
            return Ok(self.handle(node.rel.clone(), a, None, Some(s), flags, since));
        }
        let (attr, etag, first) = self.open_read(&node.rel)?;
        let mut h = self.handle(node.rel.clone(), attr, etag, None, flags, since);
        h.first = first;
        Ok(h)
    }

    /// A new object exists at once (an empty PUT with If-None-Match): other hosts and
    /// listings see the name as soon as the application does.
    fn create(
        &self,
        parent: &S3Node,
        name: &OsStr,
        _: u32,
        flags: i32,
        _: Owner,
    ) -> Result<(S3Node, Attr, S3Handle)> {
        let rel = Self::child(parent, name)?;
        if self.is_dir(&rel)? {
            return Err(if flags & libc::O_EXCL != 0 {
                Errno(libc::EEXIST)
            } else {
                Errno::EISDIR
            });
        }
        let key = self.key(&rel)?;
        let c = self.client()?;
        let put = self.run(c.s3.put_opts(
            &key,
            object_store::PutPayload::default(),
            PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            },
        ));
        tracing::debug!("S3 create {rel}: {:?}", put.as_ref().map(|p| &p.e_tag));
        match put {
            Ok(_) => {}
            Err(Errno(libc::EEXIST)) if flags & libc::O_EXCL == 0 => {}
            Err(e) => return Err(e),
        }
        let h = self.open_write(&rel, flags | libc::O_WRONLY, None)?;
        let a = h.attr;
        Ok((Self::file_node(rel), a, h))
    }

    fn read(&self, h: &S3Handle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let b = self.read_bytes(h, offset, buf.len())?;
        buf[..b.len()].copy_from_slice(&b);
        Ok(b.len())
    }

    /// The HTTP body itself: no zeroed buffer, no copy.
    fn read_bytes(&self, h: &S3Handle, offset: u64, len: usize) -> Result<bytes::Bytes> {
        let (staged, followed) = self.current(h);
        let staged = staged.filter(|s| s.st.lock().loaded);
        if let Some(s) = staged {
            let mut buf = vec![0u8; len];
            let n = s.read_at(offset, &mut buf)?;
            buf.truncate(n);
            return Ok(buf.into());
        }
        let at_open = followed.is_none() && h.staging.is_none();
        let (size, etag) = match &h.staging {
            Some(s) => {
                let g = s.st.lock();
                match &g.base {
                    Base::Etag(e) => (g.remote.size, Some(e.clone())),
                    _ => (g.remote.size, None),
                }
            }
            None => match followed {
                Some((a, e)) => (a.size, Some(e)),
                None => (h.attr.size, h.etag.clone()),
            },
        };
        let end = size.min(offset.saturating_add(len as u64));
        if offset >= end {
            return Ok(bytes::Bytes::new());
        }
        // The start the open fetched, while the handle reads the version it opened.
        let first = match &h.first {
            Some(f) if at_open => crate::first::from_first(f, size, offset, len),
            _ => None,
        };
        if let Some(b) = &first {
            if b.len() as u64 == end - offset {
                return Ok(b.clone());
            }
        }
        let offset = offset + first.as_ref().map_or(0, |b| b.len() as u64);
        let key = self.key(&h.rel)?;
        let opts = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            // The version the handle was opened at, or ESTALE (Precondition).
            if_match: etag,
            ..Default::default()
        };
        let c = self.client()?;
        let mut bytes = self.run(async { c.s3.get_opts(&key, opts).await?.bytes().await })?;
        if (bytes.len() as u64) < end - offset {
            // The object is shorter than the version we opened said: it changed.
            return Err(Errno::ESTALE);
        }
        if let Some(f) = first {
            // (The one read that straddles the fetched start: put together once.)
            let mut all = bytes::BytesMut::with_capacity(f.len() + bytes.len());
            all.extend_from_slice(&f);
            all.extend_from_slice(&bytes);
            bytes = all.freeze();
        }
        bytes.truncate(len);
        Ok(bytes)
    }

    fn write(&self, h: &S3Handle, offset: u64, data: &[u8]) -> Result<u64> {
        let s = h
            .staging
            .as_ref()
            .filter(|_| h.writable)
            .ok_or(Errno::EBADF)?;
        self.load(s)?;
        let at = if h.append { s.st.lock().size } else { offset };
        s.write_at(at, data)?;
        Ok(at)
    }

    fn fstat(&self, h: &S3Handle) -> Result<Attr> {
        let (staged, followed) = self.current(h);
        let mut a = match (staged, followed) {
            (Some(s), _) => s.attr(),
            (None, Some((a, _))) => a,
            (None, None) => h.attr,
        };
        a.ino = h.attr.ino;
        Ok(a)
    }

    /// The object is durable in the bucket when this returns (uploaded if staged).
    fn fsync(&self, h: &S3Handle, _: bool) -> Result<()> {
        self.publish(h, true)
    }

    fn close(&self, h: &S3Handle) -> Result<()> {
        self.publish(h, false)
    }

    /// S3's largest object: 5 TiB.
    fn max_file_size(&self) -> u64 {
        5 << 40
    }
    fn publishes_at_sync(&self) -> bool {
        true
    }

    fn dirs_track_names(&self) -> bool {
        false
    }

    fn fsyncdir(&self, _: &S3Node, _: bool) -> Result<()> {
        Ok(())
    }

    fn fallocate(&self, _: &S3Handle, _: i32, _: u64, _: u64) -> Result<()> {
        Err(Errno(libc::EOPNOTSUPP))
    }

    fn lseek(&self, h: &S3Handle, offset: i64, whence: i32) -> Result<i64> {
        let size = self.fstat(h)?.size as i64;
        match whence {
            // Objects have no holes.
            libc::SEEK_DATA if offset < size => Ok(offset),
            libc::SEEK_HOLE if offset < size => Ok(size),
            libc::SEEK_DATA | libc::SEEK_HOLE => Err(Errno(libc::ENXIO)),
            libc::SEEK_SET => Ok(offset),
            libc::SEEK_END => Ok(size + offset),
            _ => Err(Errno::EINVAL),
        }
    }

    fn readdir(&self, node: &S3Node) -> Result<Vec<DirEntry>> {
        Ok(self
            .readdir_plus(node)?
            .into_iter()
            .map(|(e, _)| e)
            .collect())
    }

    /// A LIST page gives 1,000 keys with their size, time and ETag.
    fn may_hang(&self) -> bool {
        true
    }
    fn listing_carries_attrs(&self) -> bool {
        true
    }

    /// One delimited listing (object_store fetches its pages one after another) gives every
    /// entry with its attributes: a directory costs a request per 1,000 entries, no HEADs.
    fn readdir_plus(&self, node: &S3Node) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        if node.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let prefix = self.dir_key(&node.rel);
        let listed = self.run(self.client()?.s3.list_with_delimiter(prefix.as_ref()))?;
        let rel_of = |name: &str| -> Arc<str> {
            if node.rel.is_empty() {
                name.into()
            } else {
                format!("{}/{name}", node.rel).into()
            }
        };
        let mut out = Vec::with_capacity(listed.objects.len() + listed.common_prefixes.len());
        let mut dirs = std::collections::HashSet::new();
        for p in &listed.common_prefixes {
            let Some(name) = p.filename() else { continue };
            dirs.insert(name.to_string());
            let mut a = dir_attr(self.owner, self.born);
            a.ino = key_ino(&rel_of(name));
            out.push((entry(name, a), Some(a)));
        }
        for meta in &listed.objects {
            let Some(name) = meta.location.filename() else {
                continue;
            };
            // The directory's own `dir/` marker, and files hidden by a directory.
            if Some(&meta.location) == prefix.as_ref() || dirs.contains(name) {
                continue;
            }
            let rel = rel_of(name);
            let mut a = object_attr(meta, self.owner);
            a.ino = key_ino(&rel);
            let a = self.overlay(&rel, a);
            out.push((entry(name, a), Some(a)));
        }
        Ok(out)
    }

    fn statfs(&self, _: &S3Node) -> Result<StatFs> {
        // A bucket has no size: plenty, as other S3 filesystems show.
        const BLOCKS: u64 = 1 << 40;
        Ok(StatFs {
            blocks: BLOCKS,
            bfree: BLOCKS,
            bavail: BLOCKS,
            files: 1 << 40,
            ffree: 1 << 40,
            bsize: 4096,
            namelen: KEY_MAX,
            frsize: 4096,
        })
    }

    fn getxattr(&self, _: &S3Node, _: &OsStr) -> Result<Vec<u8>> {
        Err(Errno::ENOTSUP)
    }

    fn setxattr(&self, _: &S3Node, _: &OsStr, _: &[u8], _: i32) -> Result<()> {
        Err(Errno::ENOTSUP)
    }

    fn listxattr(&self, _: &S3Node) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }

    fn removexattr(&self, _: &S3Node, _: &OsStr) -> Result<()> {
        Err(Errno::ENOTSUP)
    }
}

fn entry(name: &str, a: Attr) -> DirEntry {
    DirEntry {
        name: name.into(),
        dev: 0,
        ino: a.ino,
        kind: Some(a.kind),
    }
}
