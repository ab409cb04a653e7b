//! Uploads ahead: the parts of a large object go to the bucket while the object is still
//! being written, so that its fsync or close uploads only what is left. Without this a
//! 2 GiB `dd ... conv=fsync` filled the staging file (2.6-4.9 s here) and only then uploaded
//! it (9.5-15 s): the two one after the other, where a plain multipart upload overlaps its
//! reading with its sending.
//!
//! A part is uploaded ahead once the writer has written past its end (a sequential writer has
//! moved on), into a multipart upload made for the staging at the first such part, up to
//! `s3.upload_parallel` parts in flight; a write never waits for one. What makes this safe:
//! - the object changes only at the completion, which is conditional on the staging's base
//!   as an upload at fsync is (If-Match / If-None-Match), and is made only by
//!   [`Ctx::upload`]; parts are invisible until then;
//! - a part is used at the completion only if no change touched its bytes since it was read
//!   from the staging file (`State::part_changes`, counted under the lock writes take, and
//!   read before the part's bytes): a part rewritten, truncated or grown into afterwards is
//!   uploaded again at fsync, from the staging as it is then;
//! - the upload at fsync waits for the parts in flight first, and one whose upload failed is
//!   simply uploaded again; an object that ends up small enough for one PUT, an unlinked
//!   one, one in conflict, or a failed completion aborts the multipart upload.
//!
//! Left: a daemon killed between a part and the completion leaves the parts in the bucket
//! until its lifecycle rule (AbortIncompleteMultipartUpload) removes them, as any client's
//! interrupted multipart upload does; the write-back journal still holds the data.

use crate::ctx::Ctx;
use crate::staging::{Base, Staging};
use http::Method;
use std::collections::HashMap;
use std::sync::Arc;
use tierfs_store::{Errno, Result};

/// The parts of one staging uploaded ahead.
#[derive(Default)]
pub(crate) struct Ahead {
    /// The multipart upload they went to (None: none made yet).
    pub id: Option<String>,
    /// Part index -> its ETag and the part's change count when it was read.
    pub done: HashMap<u64, (String, u64)>,
    /// Parts being uploaded, and their tasks.
    pub busy: HashMap<u64, tokio::task::JoinHandle<()>>,
    /// The lowest part not considered yet (a writer's later parts are looked at once each).
    pub next: u64,
}

/// What the upload at fsync takes over from the parts uploaded ahead.
pub(crate) struct Taken {
    pub id: Option<String>,
    pub done: HashMap<u64, (String, u64)>,
}

impl Ctx {
    /// After a write that reached `written_to`: uploads the staging's parts that lie wholly
    /// below it and are not uploaded (or changed since), as far as `s3.upload_parallel`
    /// allows. Never waits for an upload; does nothing while one at fsync runs.
    pub(crate) fn upload_ahead(self: &Arc<Self>, s: &Arc<Staging>, written_to: u64) {
        let up = *self.upload.lock();
        let ps = s.part_size;
        // Parts below the last byte written: the writer has moved past them.
        let full = written_to.saturating_sub(1) / ps;
        if up.part_size != ps || full == 0 || s.ahead.lock().next >= full {
            return;
        }
        // Exclusive with the upload at fsync (and with other writers' calls).
        let Some(_one) = s.uploading.try_lock() else {
            return;
        };
        {
            let g = s.st.lock();
            if g.unlinked || !g.loaded || matches!(g.base, Base::Conflict(_)) {
                return;
            }
        }
        let Ok(c) = self.client() else { return };
        let key = self.full_key(&s.rel);
        if s.ahead.lock().id.is_none() {
            let made = c.rt.block_on(async {
                let a = c
                    .raw
                    .send(Method::POST, &key, "uploads=", &[], bytes::Bytes::new())
                    .await?;
                crate::upload::check(&a, "CreateMultipartUpload")?;
                a.xml("UploadId").ok_or(Errno::EIO)
            });
            match made {
                Ok(id) => s.ahead.lock().id = Some(id),
                Err(e) => {
                    tracing::debug!("S3 {}: no upload ahead ({e:?})", s.rel);
                    return;
                }
            }
        }
        let mut a = s.ahead.lock();
        let Some(id) = a.id.clone() else { return };
        while a.next < full && a.busy.len() < up.parallel.max(1) {
            let k = a.next;
            a.next += 1;
            let (ctx, st, key, id2) = (self.clone(), s.clone(), key.clone(), id.clone());
            let task = c.rt.spawn(async move {
                let r = ctx.put_part_ahead(&st, &key, &id2, k).await;
                let mut a = st.ahead.lock();
                a.busy.remove(&k);
                match r {
                    // (Made for an upload that is still the staging's.)
                    Ok(done) if a.id.as_deref() == Some(id2.as_str()) => {
                        a.done.insert(k, done);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!("S3 {}: part {k} ahead: {e:?}", st.rel),
                }
            });
            a.busy.insert(k, task);
        }
    }

    /// Part `k` of the staging, read from its file, uploaded to `id`: its ETag and the
    /// part's change count read before its bytes.
    async fn put_part_ahead(
        &self,
        s: &Staging,
        key: &str,
        id: &str,
        k: u64,
    ) -> Result<(String, u64)> {
        let ps = s.part_size;
        let changes = {
            let g = s.st.lock();
            if (k + 1) * ps > g.size {
                return Err(Errno::EINVAL); // truncated since: uploaded at fsync if needed
            }
            g.part_changes.get(k as usize).copied().unwrap_or(0)
        };
        let body = crate::upload::read_range(s, k * ps, ps)?;
        let qid = crate::raw::encode(id).replace('/', "%2F");
        let q = format!("partNumber={}&uploadId={qid}", k + 1);
        let a = self
            .client()?
            .raw
            .send(Method::PUT, key, &q, &[], body)
            .await?;
        crate::upload::check(&a, "UploadPart")?;
        Ok((crate::upload::etag_of(&a)?, changes))
    }

    /// For the upload at fsync (which holds `uploading`): the parts in flight waited for,
    /// then what was uploaded ahead, taken (the staging starts afresh).
    pub(crate) fn take_ahead(&self, s: &Staging) -> Taken {
        let tasks: Vec<_> = s.ahead.lock().busy.drain().map(|(_, t)| t).collect();
        if !tasks.is_empty() {
            if let Ok(c) = self.client() {
                c.rt.block_on(async {
                    for t in tasks {
                        let _ = t.await;
                    }
                });
            }
        }
        let a = std::mem::take(&mut *s.ahead.lock());
        Taken {
            id: a.id,
            done: a.done,
        }
    }

    /// Aborts multipart upload `id` of `rel` (its parts are not kept, or billed).
    pub(crate) fn abort_ahead(&self, rel: &str, id: &str) {
        let key = self.full_key(rel);
        let q = format!("uploadId={}", crate::raw::encode(id).replace('/', "%2F"));
        if let Ok(c) = self.client() {
            let r = c.rt.block_on(
                c.raw
                    .send(Method::DELETE, &key, &q, &[], bytes::Bytes::new()),
            );
            tracing::debug!("S3 {rel}: upload ahead aborted: {:?}", r.map(|a| a.status));
        }
    }
}
