//! The [`Store`] calls of [`S3Store`]: the namespace (a directory is a prefix, or its `dir/`
//! marker; a rename copies and deletes), listings, and what S3 does not have; open files are
//! handed to `store_io`.

use crate::attrs::{dir_attr, key_ino, object_attr};
use crate::errors::errno;
use crate::store::{S3Handle, S3Node, S3Store};
use futures::StreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use tierfs_store::{
    Attr, DirEntry, Errno, FileKind, Fingerprint, Identity, Owner, Result, SetAttr, StatFs, Store,
};

/// The longest key S3 takes, as NAME_MAX of statfs.
const KEY_MAX: u32 = 1024;

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
        let (head, under) = self.block(c, async {
            let head = c.s3.head(&key);
            let under = async { c.s3.list(Some(&key)).next().await.transpose() };
            futures::join!(head, under)
        })?;
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
        self.truncate(node, h, size)
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
        self.open_object(node, flags, base)
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

    fn read_bytes(&self, h: &S3Handle, offset: u64, len: usize) -> Result<bytes::Bytes> {
        self.read_handle(h, offset, len)
    }

    fn write(&self, h: &S3Handle, offset: u64, data: &[u8]) -> Result<u64> {
        self.write_handle(h, offset, data)
    }

    fn fstat(&self, h: &S3Handle) -> Result<Attr> {
        self.stat_handle(h)
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
        self.seek(h, offset, whence)
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
    /// Its requests are futures: dropped at the deadline (`S3Store::block`).
    fn keeps_call_limit(&self) -> bool {
        true
    }
    /// A listing of the prefix (a request, bounded by its own timeout): a bucket's root has
    /// no check and its statfs is made up, so the default probe answered at once and a
    /// stopped server was "back" after a second: each later open waited `store.timeout`
    /// again.
    fn probe(&self) -> Result<()> {
        self.reconnect().map(|_| ())
    }
    fn listing_carries_attrs(&self) -> bool {
        true
    }
    /// An open is a GET of the object's first MiB (`first.rs`).
    fn open_brings_data(&self) -> bool {
        true
    }
    /// A LIST page: 1,000 keys.
    fn listing_page(&self) -> usize {
        1000
    }
    /// The first page of an undelimited listing of the prefix (its keys at every depth, so
    /// at least as many as the directory's entries): at most `max` keys and no next page.
    /// object_store asks for the next page only once the first is used up, so this is one
    /// LIST where the directory fits and at most two where it does not.
    fn lists_within(&self, node: &S3Node, max: usize) -> Result<bool> {
        use futures::StreamExt;
        if node.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let prefix = self.dir_key(&node.rel);
        let s3 = self.client()?.s3.clone();
        self.run(async move {
            let mut keys = s3.list(prefix.as_ref()).take(max + 1);
            let mut n = 0;
            while let Some(m) = keys.next().await {
                m?;
                n += 1;
            }
            Ok(n <= max)
        })
    }
    /// The handle holds the version it reads (from its open's GET or HEAD, or its staging).
    fn fstat_is_local(&self) -> bool {
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
