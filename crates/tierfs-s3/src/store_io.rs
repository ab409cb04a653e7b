//! Open objects of [`S3Store`]: a read-only handle reads the version (ETag) it was opened
//! at, a writable one the key's staging, uploaded whole at fsync and close (see
//! [`crate::staging`] and [`crate::upload`]); truncates and seeks. Apart from the
//! [`tierfs_store::Store`] impl (`store_calls`), which hands these calls here.

use crate::attrs::key_ino;
use crate::staging::{Base, Staging};
use crate::store::{S3Handle, S3Node, S3Store};
use crate::stream::{Stream, SPAN};
use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStore};
use std::sync::Arc;
use tierfs_store::{Attr, Errno, FileKind, Fingerprint, Result};

impl S3Store {
    /// fsync (`take`: it reports an earlier conflict once) and close: the object is durable
    /// in the bucket when this returns (uploaded if staged).
    pub(crate) fn publish(&self, h: &S3Handle, take: bool) -> Result<()> {
        match &h.staging {
            Some(s) => self.ctx.upload_reported(s, take),
            None => {
                tracing::debug!("S3 fsync of {}: a read handle, nothing staged", h.rel);
                Ok(())
            }
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
        let part = self.upload.lock().part_size;
        let s = Arc::new(Staging::new(&dir, rel.clone(), base, attr, part)?);
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
            stream: Default::default(),
            ctx: self.ctx.clone(),
        }
    }

    /// Opens `rel` for writing: its staging (truncated for O_TRUNC).
    pub(crate) fn open_write(
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

    /// Opens an object: for writing, its staging; for reading, the version the bucket holds
    /// now (or our writes not uploaded yet).
    pub(crate) fn open_object(
        &self,
        node: &S3Node,
        flags: i32,
        base: Option<Fingerprint>,
    ) -> Result<S3Handle> {
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

    /// The HTTP body itself: no zeroed buffer, no copy.
    pub(crate) fn read_handle(
        &self,
        h: &S3Handle,
        offset: u64,
        len: usize,
    ) -> Result<bytes::Bytes> {
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
                h.stream.read_to(end);
                return Ok(b.clone());
            }
        }
        let at = offset;
        let offset = offset + first.as_ref().map_or(0, |b| b.len() as u64);
        let key = self.key(&h.rel)?;
        let _in = h.stream.enter();
        let streamed = self.streamed(h, &key, etag.as_ref(), at, offset, end, size)?;
        let mut bytes = match streamed {
            Some(b) => b,
            None => {
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(offset..end)),
                    // The version the handle was opened at, or ESTALE (Precondition).
                    if_match: etag,
                    ..Default::default()
                };
                let c = self.client()?;
                self.run(async { c.s3.get_opts(&key, opts).await?.bytes().await })?
            }
        };
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
        h.stream.read_to(at + bytes.len() as u64);
        Ok(bytes)
    }

    /// Bytes `offset..end` of version `etag` from the handle's stream (see `stream`): the one
    /// standing at `offset`, or a new one if the read (asked at `at`, before the open's
    /// first bytes were taken off) continues the handle's last, not its first (a file read at
    /// its start only, as `file` or `head` do, gets no stream), and the object goes on past
    /// it. None where a ranged GET must serve the read; a stream that could not be started
    /// (after the client's retries) is the read's error: a ranged GET would wait as long again.
    #[allow(clippy::too_many_arguments)]
    fn streamed(
        &self,
        h: &S3Handle,
        key: &object_store::path::Path,
        etag: Option<&String>,
        at: u64,
        offset: u64,
        end: u64,
        size: u64,
    ) -> Result<Option<bytes::Bytes>> {
        let Some(mut cur) = h.stream.try_lock() else {
            return Ok(None);
        };
        let stands_here = cur
            .as_ref()
            .is_some_and(|s| s.pos == offset && s.end >= end && s.etag.as_ref() == etag);
        if !stands_here {
            if !h.stream.serial() {
                // Reads in parallel would take turns ending each other's stream.
                *cur = None;
                return Ok(None);
            }
            if at == 0 || !h.stream.continues(at) || end >= size {
                return Ok(None);
            }
            let to = size.min(offset + SPAN).max(end);
            let opts = GetOptions {
                range: Some(GetRange::Bounded(offset..to)),
                // (As a ranged GET: the handle's version, or none where the server gave none.)
                if_match: etag.cloned(),
                ..Default::default()
            };
            let c = self.client()?;
            let body = self.run(async { Ok(c.s3.get_opts(key, opts).await?.into_stream()) })?;
            tracing::debug!("S3 {}: a stream of {offset}..{to}", h.rel);
            *cur = Some(Stream::new(etag.cloned(), offset, to, body));
        }
        let Some(s) = cur.as_mut() else {
            return Ok(None);
        };
        let rt = &self.client()?.rt;
        // A body that fails or ends early (a connection reset mid-way) leaves the read to a
        // ranged GET.
        let got = s.take((end - offset) as usize, |b| rt.block_on(b.next()));
        if got.is_none() || s.pos >= s.end {
            *cur = None;
        }
        Ok(got)
    }

    pub(crate) fn write_handle(&self, h: &S3Handle, offset: u64, data: &[u8]) -> Result<u64> {
        let s = h
            .staging
            .as_ref()
            .filter(|_| h.writable)
            .ok_or(Errno::EBADF)?;
        self.load(s)?;
        let at = if h.append { s.st.lock().size } else { offset };
        s.write_at(at, data)?;
        // A large object's parts go up while it is still written (see `ahead`).
        self.ctx.upload_ahead(s, at, at + data.len() as u64);
        Ok(at)
    }

    pub(crate) fn stat_handle(&self, h: &S3Handle) -> Result<Attr> {
        let (staged, followed) = self.current(h);
        let mut a = match (staged, followed) {
            (Some(s), _) => s.attr(),
            (None, Some((a, _))) => a,
            (None, None) => h.attr,
        };
        a.ino = h.attr.ino;
        Ok(a)
    }

    /// A truncate (setattr of a size), through handle `h` or by name.
    pub(crate) fn truncate(&self, node: &S3Node, h: Option<&S3Handle>, size: u64) -> Result<Attr> {
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

    pub(crate) fn seek(&self, h: &S3Handle, offset: i64, whence: i32) -> Result<i64> {
        let size = self.stat_handle(h)?.size as i64;
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
}
