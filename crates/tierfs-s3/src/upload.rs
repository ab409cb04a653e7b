//! Getting staged contents into the bucket, and objects into staging files.
//!
//! An upload is conditional on the version the contents were made from (If-Match on its
//! ETag, or If-None-Match: * for a new object): if another writer replaced or removed the
//! object meanwhile, ours does not overwrite it. It fails with ESTALE and our contents are
//! kept in the lost directory, with a log line naming the object. Small objects go in one
//! PUT; larger ones in parts uploaded several at a time, the completion carrying the same
//! condition.

use crate::attrs::{key_ino, object_attr};
use crate::ctx::{Client, Ctx, UploadConfig};
use crate::staging::{now, Base, Staging};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::Method;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt};
use std::io::Write;
use std::os::unix::fs::FileExt;
use tierfs_store::{Errno, Result};

const ESTALE: Errno = Errno(libc::ESTALE);

impl Ctx {
    /// Uploads the staging's contents if they changed since the last upload; after it the
    /// staging shows the object's new attributes (and its ETag is the base of what follows).
    pub(crate) fn upload(&self, s: &Staging) -> Result<()> {
        let _one = s.uploading.lock();
        // The parts uploaded ahead (see `ahead`), those in flight waited for.
        let ahead = self.take_ahead(s);
        let abort = |id: &Option<String>| {
            if let Some(id) = id {
                self.abort_ahead(&s.rel, id);
            }
        };
        let (base, size, changes, part_changes) = {
            let g = s.st.lock();
            if !g.dirty || g.unlinked {
                tracing::debug!(
                    "S3 upload of {} skipped: dirty {}, unlinked {}",
                    s.rel,
                    g.dirty,
                    g.unlinked
                );
                drop(g);
                abort(&ahead.id);
                return Ok(());
            }
            (g.base.clone(), g.size, g.changes, g.part_changes.clone())
        };
        let cond = match &base {
            Base::Absent => ("if-none-match", "*".to_string()),
            Base::Etag(e) => ("if-match", e.clone()),
            Base::Conflict(why) => {
                abort(&ahead.id);
                return Err(self.keep_lost(s, why));
            }
        };
        let key = self.full_key(&s.rel);
        let c = match self.client() {
            Ok(c) => c,
            Err(e) => {
                abort(&ahead.id);
                return Err(e);
            }
        };
        let up = *self.upload.lock();
        // Parts uploaded ahead count where they are of this part size and nothing touched
        // them since they were read.
        let reuse = match ahead.id {
            Some(id) if size > up.part_size && up.part_size == s.part_size => {
                let done = ahead
                    .done
                    .into_iter()
                    .filter(|(k, (_, n))| part_changes.get(*k as usize) == Some(n))
                    .map(|(k, (etag, _))| (k, etag))
                    .collect();
                Some((id, done))
            }
            id => {
                abort(&id);
                None
            }
        };
        let r = c.rt.block_on(async {
            if size <= up.part_size {
                put_whole(c, &key, s, size, (cond.0, &cond.1)).await
            } else {
                put_parts(c, &key, s, size, (cond.0, &cond.1), up, reuse).await
            }
        });
        // No answer to a conditional upload: the server may have refused it (412) and closed
        // the connection while the body was still being sent (versitygw does, now and then),
        // so the refusal never reached us. The object's ETag tells: another one than our base
        // means it was replaced (if ours had landed, what it holds is ours, kept in the lost
        // directory too: nothing is lost either way); our base means ours did not land.
        tracing::debug!(
            "S3 upload {key}: {size} bytes, {}: {}: {r:?}",
            cond.0,
            cond.1
        );
        let r = match r {
            Err(e) if e == Errno::ENOTCONN && cond.0 == "if-match" => {
                let head = self.key(&s.rel).and_then(|k| self.run(c.s3.head(&k)));
                match head {
                    Ok(m) if m.e_tag.as_deref().map(unquote) != Some(unquote(&cond.1)) => {
                        Err(ESTALE)
                    }
                    Err(h) if h == Errno::ENOENT => Err(h),
                    _ => Err(e),
                }
            }
            r => r,
        };
        let etag = match r {
            Ok(e) => e,
            // Replaced (412) or removed (404) by someone else since we read it.
            Err(e) if e == ESTALE || e == Errno::ENOENT => {
                let why = "the object was changed or removed in the bucket by another writer \
                           after tierfs read it";
                s.st.lock().base = Base::Conflict(why.into());
                return Err(self.keep_lost(s, why));
            }
            Err(e) => return Err(e),
        };
        // Last-Modified is only in a HEAD (a PUT answers with the ETag alone).
        let head = self.key(&s.rel).and_then(|k| self.run(c.s3.head(&k)));
        let mut g = s.st.lock();
        // The ETag as a HEAD spells it: what read handles carry and send back in If-Match.
        let mut seen = etag.clone();
        let mut remote = match head {
            Ok(m) if m.e_tag.as_deref().map(unquote) == Some(unquote(&etag)) => {
                seen = m.e_tag.clone().unwrap_or(seen);
                object_attr(&m, self.owner)
            }
            // Replaced again at once by someone else: ours was uploaded, theirs is newer;
            // our version's attributes as well as we know them.
            _ => {
                let mut a = g.remote;
                a.size = size;
                a.mtime = now();
                a.ctime = a.mtime;
                a.ctime.nsec = crate::attrs::etag_nanos(Some(&etag));
                a
            }
        };
        remote.ino = key_ino(&s.rel);
        if let Base::Etag(from) = &base {
            // Handles still at `from` follow to ours (see `lineage`).
            self.ours.record(&s.rel, unquote(from), &seen, remote);
        }
        g.remote = remote;
        g.base = Base::Etag(etag);
        if g.changes == changes {
            g.dirty = false;
        }
        Ok(())
    }

    /// Copies the object the staging is based on into it (once, before the first change
    /// that does not replace it whole). An object changed meanwhile is copied as it is now,
    /// and the staging marked in conflict: its upload will not overwrite the other writer.
    pub(crate) fn load(&self, s: &Staging) -> Result<()> {
        s.load(|file, base| {
            let etag = match base {
                Base::Absent => return Ok(0),
                Base::Etag(e) => Some(e.clone()),
                Base::Conflict(_) => None,
            };
            let key = self.key(&s.rel)?;
            let c = self.client()?;
            let fetch = |if_match: Option<String>| {
                c.rt.block_on(async {
                    let opts = GetOptions {
                        if_match,
                        ..Default::default()
                    };
                    let mut stream = c.s3.get_opts(&key, opts).await?.into_stream();
                    let mut at = 0u64;
                    while let Some(chunk) = stream.next().await {
                        let chunk = chunk?;
                        file.write_all_at(&chunk, at).map_err(|e| {
                            object_store::Error::Generic {
                                store: "staging",
                                source: Box::new(e),
                            }
                        })?;
                        at += chunk.len() as u64;
                    }
                    file.set_len(at).map_err(|e| object_store::Error::Generic {
                        store: "staging",
                        source: Box::new(e),
                    })?;
                    Ok(at)
                })
                .map_err(|e| crate::errors::errno(&e))
            };
            match fetch(etag.clone()) {
                Err(e) if etag.is_some() && (e == ESTALE || e == Errno::ENOENT) => {
                    *base = Base::Conflict(
                        "the object was changed or removed in the bucket by another writer \
                         after tierfs read it, before our writes"
                            .into(),
                    );
                    match fetch(None) {
                        Err(Errno::ENOENT) => Ok(0),
                        r => r,
                    }
                }
                r => r,
            }
        })
    }

    /// Keeps the staged contents in the lost directory (synced), with a `.txt` saying which
    /// object and why; the staging counts as uploaded from then on. Returns ESTALE.
    pub(crate) fn keep_lost(&self, s: &Staging, why: &str) -> Errno {
        let key = self.full_key(&s.rel);
        let dir = self.lost_dir.lock().clone();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let slug: String = key
            .chars()
            .rev()
            .take(120)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .map(|c| if c == '/' { '_' } else { c })
            .collect();
        let name = format!("s3-{slug}-{stamp}");
        let path = dir.join(&name);
        let saved = (|| -> std::io::Result<u64> {
            tierfs_store_dir(&dir)?;
            let create = |p: &std::path::Path| {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(p)
            };
            let mut out = create(&path)?;
            let size = s.st.lock().size;
            let mut buf = vec![0u8; 1 << 20];
            let mut at = 0u64;
            while at < size {
                let n = buf.len().min((size - at) as usize);
                s.file.read_exact_at(&mut buf[..n], at)?;
                out.write_all(&buf[..n])?;
                at += n as u64;
            }
            out.sync_all()?;
            let mut t = create(&dir.join(format!("{name}.txt")))?;
            writeln!(
                t,
                "object: s3://{}/{key}\nwhy: {why}\nsize: {size} bytes\nthe contents tierfs \
                 would have uploaded are in the file beside this one",
                self.cfg.bucket
            )?;
            t.sync_all()?;
            Ok(size)
        })();
        match saved {
            Ok(n) => tracing::error!(
                "S3: s3://{}/{key}: {why}; not uploaded: our contents ({n} bytes) are kept in {}",
                self.cfg.bucket,
                path.display()
            ),
            Err(e) => tracing::error!(
                "S3: s3://{}/{key}: {why}; not uploaded, and keeping our contents in {} failed: {e}",
                self.cfg.bucket,
                path.display()
            ),
        }
        {
            let mut g = s.st.lock();
            g.dirty = false;
            g.unreported = Some(ESTALE);
        }
        ESTALE
    }

    /// [`Ctx::upload`] for fsync (`take`) and close, which answer the application: also a
    /// conflict an earlier upload met and could not report (see `State::unreported`). As the
    /// kernel's `errseq` does for a file's write errors, fsync reports it once and close
    /// does not use it up: a close of a duplicate descriptor (a child process of the
    /// application closing it at exec) must not take it from the application's fsync, which
    /// was seen to succeed so (`tests/s3.rs`, two writers, under the whole suite).
    pub(crate) fn upload_reported(&self, s: &Staging, take: bool) -> Result<()> {
        let r = self.upload(s);
        let unreported = {
            let mut g = s.st.lock();
            match take {
                true => g.unreported.take(),
                false => g.unreported,
            }
        };
        match (r, unreported) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(e)) => Err(e),
            (Ok(()), None) => Ok(()),
        }
    }

    /// `mkdir`: the zero-byte `dir/` marker (If-None-Match: an existing one is EEXIST).
    pub(crate) fn put_marker(&self, rel: &str) -> Result<()> {
        let c = self.client()?;
        let key = format!("{}/", self.full_key(rel));
        let a = c.rt.block_on(c.raw.send(
            Method::PUT,
            &key,
            "",
            &[("if-none-match", "*")],
            Bytes::new(),
        ))?;
        match a.status.as_u16() {
            200..=299 => Ok(()),
            412 | 409 => Err(Errno(libc::EEXIST)),
            _ => Err(a.errno("mkdir")),
        }
    }

    /// `rmdir`: removes the `dir/` marker (absent is fine: S3's DELETE says 204 either way).
    pub(crate) fn delete_marker(&self, rel: &str) -> Result<()> {
        let c = self.client()?;
        let key = format!("{}/", self.full_key(rel));
        let a =
            c.rt.block_on(c.raw.send(Method::DELETE, &key, "", &[], Bytes::new()))?;
        if a.status.is_success() || a.status.as_u16() == 404 {
            Ok(())
        } else {
            Err(a.errno("rmdir"))
        }
    }
}

fn tierfs_store_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn unquote(e: &str) -> &str {
    e.trim_matches('"')
}

async fn put_whole(
    c: &Client,
    key: &str,
    s: &Staging,
    size: u64,
    cond: (&str, &str),
) -> Result<String> {
    let body = s.read_range(0, size)?;
    let a = c.raw.send(Method::PUT, key, "", &[cond], body).await?;
    a.check("PUT")?;
    a.etag()
}

async fn put_parts(
    c: &Client,
    key: &str,
    s: &Staging,
    size: u64,
    cond: (&str, &str),
    up: UploadConfig,
    ahead: Option<(String, std::collections::HashMap<u64, String>)>,
) -> Result<String> {
    // The multipart upload parts went to ahead, with the parts still good, or a new one.
    let (id, mut done) = match ahead {
        Some((id, done)) => (id, done),
        None => {
            let a = c
                .raw
                .send(Method::POST, key, "uploads=", &[], Bytes::new())
                .await?;
            a.check("CreateMultipartUpload")?;
            (a.xml("UploadId").ok_or(Errno::EIO)?, Default::default())
        }
    };
    let qid = crate::raw::encode(&id).replace('/', "%2F");
    let r = async {
        let n = size.div_ceil(up.part_size);
        let mut parts: Vec<(u64, String)> = futures::stream::iter(0..n)
            .map(|i| {
                let qid = &qid;
                let ahead = done.remove(&i);
                async move {
                    if let Some(etag) = ahead {
                        return Ok::<_, Errno>((i + 1, etag));
                    }
                    let at = i * up.part_size;
                    let body = s.read_range(at, up.part_size.min(size - at))?;
                    let q = format!("partNumber={}&uploadId={qid}", i + 1);
                    let a = c.raw.send(Method::PUT, key, &q, &[], body).await?;
                    a.check("UploadPart")?;
                    Ok::<_, Errno>((i + 1, a.etag()?))
                }
            })
            .buffer_unordered(up.parallel.max(1))
            .try_collect()
            .await?;
        parts.sort();
        let mut xml = String::from("<CompleteMultipartUpload>");
        for (n, e) in &parts {
            xml.push_str(&format!(
                "<Part><PartNumber>{n}</PartNumber><ETag>{}</ETag></Part>",
                e.replace('&', "&amp;").replace('"', "&quot;")
            ));
        }
        xml.push_str("</CompleteMultipartUpload>");
        let q = format!("uploadId={qid}");
        let a = c
            .raw
            .send(Method::POST, key, &q, &[cond], Bytes::from(xml))
            .await?;
        a.check("CompleteMultipartUpload")?;
        a.xml("ETag").ok_or(Errno::EIO)
    }
    .await;
    if r.is_err() {
        // The parts would otherwise be kept (and billed) until a lifecycle rule clears them.
        let q = format!("uploadId={qid}");
        let _ = c.raw.send(Method::DELETE, key, &q, &[], Bytes::new()).await;
    }
    r
}
