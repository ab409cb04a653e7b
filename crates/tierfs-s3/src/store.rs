//! [`S3Store`]: the [`Store`] of a bucket (reads, listings, versions by ETag).
//!
//! This step serves the bucket read-only: every call that would change it answers EROFS (the
//! mount says so in the log). Writes (whole-object uploads at flush, If-Match against the ETag
//! read) come next; docs/s3.md keeps the list.

use crate::attrs::{dir_attr, key_ino, object_attr};
use crate::config::S3Config;
use crate::errors::errno;
use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Duration;
use tierfs_store::{
    Attr, DirEntry, Errno, FileKind, Identity, Owner, Result, SetAttr, StatFs, Store, TimeSpec,
};

/// How long one request may take, and how long retries of a failing one may go on, before the
/// application gets EIO: a vanished server must not hang a FUSE request for minutes
/// (object_store's own default retries for 3 minutes).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const RETRY_TIMEOUT: Duration = Duration::from_secs(20);
const MAX_RETRIES: usize = 3;
/// The longest key S3 takes, as NAME_MAX of statfs.
const KEY_MAX: u32 = 1024;

/// A file or directory of the bucket: its path relative to the mounted prefix ("" = root).
#[derive(Clone, Debug)]
pub struct S3Node {
    rel: Arc<str>,
    kind: FileKind,
}

/// An open object: the version (ETag) it was opened at; every read asks for that version
/// (If-Match), so a handle never returns bytes of two versions.
pub struct S3Handle {
    rel: Arc<str>,
    attr: Attr,
    etag: Option<String>,
}

pub struct S3Store {
    /// The runtime and client, made at first use: `tierfs mount` checks the bucket before it
    /// detaches (fork), and a runtime's threads do not survive a fork.
    client: std::sync::OnceLock<Client>,
    cfg: S3Config,
    id: String,
    owner: (u32, u32),
    born: TimeSpec,
}

struct Client {
    rt: tokio::runtime::Runtime,
    s3: AmazonS3,
}

impl Client {
    fn new(cfg: &S3Config) -> std::result::Result<Client, String> {
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&cfg.bucket)
            .with_region(&cfg.region)
            .with_access_key_id(&cfg.credentials.access_key_id)
            .with_secret_access_key(&cfg.credentials.secret_access_key)
            .with_retry(RetryConfig {
                max_retries: MAX_RETRIES,
                retry_timeout: RETRY_TIMEOUT,
                ..Default::default()
            })
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_allow_http(true),
            );
        if let Some(t) = &cfg.credentials.session_token {
            b = b.with_token(t);
        }
        if let Some(e) = &cfg.endpoint {
            // Path-style addressing (http://host/bucket/key): what S3-compatible servers
            // take; AWS takes it too.
            b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
        }
        let s3 = b.build().map_err(|e| format!("s3://{}: {e}", cfg.bucket))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tierfs-s3")
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        Ok(Client { rt, s3 })
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
            client: std::sync::OnceLock::new(),
            id: store_id(&cfg),
            owner: unsafe { (libc::getuid(), libc::getgid()) },
            born: now(),
            cfg,
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

    fn client(&self) -> Result<&Client> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        // Made once already by open() with the same configuration: this fails only if the
        // OS refuses threads.
        let c = Client::new(&self.cfg).map_err(|e| {
            tracing::error!("S3 client: {e}");
            Errno::EIO
        })?;
        let _ = self.client.set(c);
        self.client.get().ok_or(Errno::EIO)
    }

    /// The object key of `rel`.
    fn key(&self, rel: &str) -> Result<Key> {
        let full = match (self.cfg.prefix.is_empty(), rel.is_empty()) {
            (true, _) => rel.to_string(),
            (false, true) => self.cfg.prefix.clone(),
            (false, false) => format!("{}/{rel}", self.cfg.prefix),
        };
        Key::parse(full).map_err(|_| Errno::ENOENT)
    }

    /// The listing prefix of directory `rel` (None: the whole bucket).
    fn dir_key(&self, rel: &str) -> Option<Key> {
        let k = self.key(rel).ok()?;
        (!k.as_ref().is_empty()).then_some(k)
    }

    fn run<T>(&self, f: impl std::future::Future<Output = object_store::Result<T>>) -> Result<T> {
        self.client()?.rt.block_on(f).map_err(|e| {
            let n = errno(&e);
            if n == Errno::EIO {
                tracing::warn!("s3://{}: {e}", self.cfg.bucket);
            }
            n
        })
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
}

fn now() -> TimeSpec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    TimeSpec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// `s3-BUCKET-PREFIX-HASH` (a slug of its last 40 characters): the hash covers the endpoint
/// too (two servers may have buckets of the same name).
fn store_id(cfg: &S3Config) -> String {
    tierfs_store::readable_id(
        &format!("s3-{}-{}", cfg.bucket, cfg.prefix),
        &format!("{:?}\0{}\0{}", cfg.endpoint, cfg.bucket, cfg.prefix),
    )
}

const EROFS: Errno = Errno(libc::EROFS);

impl Store for S3Store {
    type Node = S3Node;
    type Handle = S3Handle;

    fn store_id(&self) -> &str {
        &self.id
    }

    fn identity(&self) -> Identity {
        Identity::Path
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

    fn getattr(&self, node: &S3Node) -> Result<Attr> {
        let mut a = match node.kind {
            FileKind::Dir => dir_attr(self.owner, self.born),
            _ => {
                let key = self.key(&node.rel)?;
                object_attr(&self.run(self.client()?.s3.head(&key))?, self.owner)
            }
        };
        a.ino = if node.rel.is_empty() {
            1
        } else {
            key_ino(&node.rel)
        };
        Ok(a)
    }

    fn setattr(&self, _: &S3Node, _: Option<&S3Handle>, _: &SetAttr) -> Result<Attr> {
        Err(EROFS)
    }

    fn readlink(&self, _: &S3Node) -> Result<OsString> {
        Err(Errno::EINVAL)
    }

    fn mknod(&self, _: &S3Node, _: &OsStr, _: u32, _: u64, _: Owner) -> Result<(S3Node, Attr)> {
        Err(EROFS)
    }

    fn mkdir(&self, _: &S3Node, _: &OsStr, _: u32, _: Owner) -> Result<(S3Node, Attr)> {
        Err(EROFS)
    }

    fn symlink(&self, _: &S3Node, _: &OsStr, _: &OsStr, _: Owner) -> Result<(S3Node, Attr)> {
        Err(EROFS)
    }

    fn link(&self, _: &S3Node, _: &S3Node, _: &OsStr) -> Result<Attr> {
        Err(EROFS)
    }

    fn unlink(&self, _: &S3Node, _: &OsStr) -> Result<()> {
        Err(EROFS)
    }

    fn rmdir(&self, _: &S3Node, _: &OsStr) -> Result<()> {
        Err(EROFS)
    }

    fn rename(&self, _: &S3Node, _: &OsStr, _: &S3Node, _: &OsStr, _: u32) -> Result<()> {
        Err(EROFS)
    }

    fn open(&self, node: &S3Node, flags: i32) -> Result<S3Handle> {
        if node.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(EROFS);
        }
        let key = self.key(&node.rel)?;
        let meta = self.run(self.client()?.s3.head(&key))?;
        let mut attr = object_attr(&meta, self.owner);
        attr.ino = key_ino(&node.rel);
        Ok(S3Handle {
            rel: node.rel.clone(),
            attr,
            etag: meta.e_tag,
        })
    }

    fn create(
        &self,
        _: &S3Node,
        _: &OsStr,
        _: u32,
        _: i32,
        _: Owner,
    ) -> Result<(S3Node, Attr, S3Handle)> {
        Err(EROFS)
    }

    fn read(&self, h: &S3Handle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let end = h.attr.size.min(offset.saturating_add(buf.len() as u64));
        if offset >= end {
            return Ok(0);
        }
        let key = self.key(&h.rel)?;
        let opts = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            // The version the handle was opened at, or ESTALE (Precondition).
            if_match: h.etag.clone(),
            ..Default::default()
        };
        let c = self.client()?;
        let bytes = self.run(async { c.s3.get_opts(&key, opts).await?.bytes().await })?;
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        if (n as u64) < end - offset {
            // The object is shorter than the version we opened said: it changed.
            return Err(Errno::ESTALE);
        }
        Ok(n)
    }

    fn write(&self, _: &S3Handle, _: u64, _: &[u8]) -> Result<u64> {
        Err(EROFS)
    }

    fn fstat(&self, h: &S3Handle) -> Result<Attr> {
        Ok(h.attr)
    }

    fn fsync(&self, _: &S3Handle, _: bool) -> Result<()> {
        Ok(())
    }

    fn fsyncdir(&self, _: &S3Node, _: bool) -> Result<()> {
        Ok(())
    }

    fn fallocate(&self, _: &S3Handle, _: i32, _: u64, _: u64) -> Result<()> {
        Err(EROFS)
    }

    fn lseek(&self, h: &S3Handle, offset: i64, whence: i32) -> Result<i64> {
        let size = h.attr.size as i64;
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
            let mut a = object_attr(meta, self.owner);
            a.ino = key_ino(&rel_of(name));
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
