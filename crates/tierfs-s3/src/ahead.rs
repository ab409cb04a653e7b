//! Uploads ahead: the parts of a large object go to the bucket while the object is still
//! being written, so that its fsync or close uploads only what is left. Without this a
//! 2 GiB `dd ... conv=fsync` filled the staging file (2.6-4.9 s here) and only then uploaded
//! it (9.5-15 s): the two one after the other, where a plain multipart upload overlaps its
//! reading with its sending.
//!
//! A part is uploaded ahead once a writer going forward in order has written past its end,
//! into a multipart upload made (by a task: no write waits on the network) for the staging at
//! the first such part, up to `s3.upload_parallel` parts in flight per file and [`MOUNT_MAX`]
//! for the mount, each part read from the staging file off the runtime's threads. A random
//! writer uploads nothing ahead (it would send parts it rewrites). What makes this safe:
//! - the object changes only at the completion, which is conditional on the staging's base
//!   as an upload at fsync is (If-Match / If-None-Match), and is made only by
//!   [`Ctx::upload`]; parts are invisible until then;
//! - a part is used at the completion only if no change touched its bytes since it was read
//!   from the staging file (`State::part_changes`, counted under the lock writes take, and
//!   read before the part's bytes): a part rewritten, truncated or grown into afterwards is
//!   uploaded again at fsync, from the staging as it is then;
//! - the upload at fsync waits for the parts in flight first, and one whose upload failed is
//!   simply uploaded again (never two uploads of one part number in flight: the later to
//!   land would be kept); an object that ends up small enough for one PUT, an unlinked one,
//!   one in conflict, a failed completion, or a last close that uploads nothing aborts the
//!   multipart upload.
//!
//! Left: a daemon killed between a part and the completion leaves the parts in the bucket
//! until its lifecycle rule (AbortIncompleteMultipartUpload) removes them, as any client's
//! interrupted multipart upload does; the write-back journal still holds the data.

use crate::ctx::Ctx;
use crate::staging::{Ahead, Base, Staging};
use http::Method;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_store::{Errno, Result};

/// The longest an abort of a multipart upload is waited for.
const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The key of the task making the multipart upload in [`Ahead::busy`].
const MAKING: u64 = u64::MAX;

/// Parts uploaded ahead at once for the whole mount, beyond each file's `s3.upload_parallel`:
/// each holds a part in memory (8 MiB by default), and many large files written at once
/// must not multiply that.
pub(crate) const MOUNT_MAX: usize = 16;

/// What the upload at fsync takes over from the parts uploaded ahead.
pub(crate) struct Taken {
    pub id: Option<String>,
    pub done: HashMap<u64, (String, u64)>,
}

/// One of the mount's [`MOUNT_MAX`] parts in flight, given back when its task ends or is
/// aborted.
struct Slot(Arc<Ctx>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.ahead_inflight.fetch_sub(1, Relaxed);
    }
}

impl Ctx {
    /// After a write of `from..to`: uploads the staging's parts that lie wholly below `to`
    /// and are not uploaded yet, as far as `s3.upload_parallel` and [`MOUNT_MAX`] allow, if
    /// the writer goes forward in order. Never waits for the network (the multipart upload
    /// itself is made by a task, which starts the parts then); does nothing while an upload
    /// at fsync runs.
    pub(crate) fn upload_ahead(self: &Arc<Self>, s: &Arc<Staging>, from: u64, to: u64) {
        let up = *self.upload.lock();
        let ps = s.part_size;
        // Parts below the last byte written: the writer has moved past them.
        let full = to.saturating_sub(1) / ps;
        {
            let mut a = s.ahead.lock();
            let in_order = a.last_end == from;
            a.last_end = to;
            if !in_order
                || a.failed
                || a.busy.contains_key(&MAKING)
                || up.part_size != ps
                || full == 0
                || a.next >= full
            {
                return;
            }
        }
        // Exclusive with the upload at fsync (and with other writers' calls).
        let Some(_one) = s.uploading.try_lock() else {
            return;
        };
        {
            let g = s.st.lock();
            if !g.dirty || g.unlinked || !g.loaded || matches!(g.base, Base::Conflict(_)) {
                return;
            }
        }
        let Ok(c) = self.client() else { return };
        let key = self.full_key(&s.rel);
        let mut a = s.ahead.lock();
        if a.id.is_none() {
            let (ctx, st, key) = (self.clone(), s.clone(), key.clone());
            let task = c.rt.spawn(async move {
                let made = async {
                    let c = ctx.client()?;
                    let a = c
                        .raw
                        .send(Method::POST, &key, "uploads=", &[], bytes::Bytes::new())
                        .await?;
                    a.check("CreateMultipartUpload")?;
                    a.xml("UploadId").ok_or(Errno::EIO)
                }
                .await;
                let mut a = st.ahead.lock();
                a.busy.remove(&MAKING);
                match made {
                    // The writes so far may all have ended while it was made.
                    Ok(id) => {
                        a.id = Some(id);
                        ctx.start_parts(&st, &mut a);
                    }
                    Err(e) => {
                        tracing::debug!("S3 {}: no upload ahead ({e:?})", st.rel);
                        a.failed = true;
                    }
                }
            });
            a.busy.insert(MAKING, task);
            return;
        }
        self.start_parts(s, &mut a);
    }

    /// Starts uploads of the parts wholly below where the last write ended, as far as
    /// `s3.upload_parallel` and [`MOUNT_MAX`] allow (`a`: the staging's, locked, with its
    /// multipart upload made).
    fn start_parts(self: &Arc<Self>, s: &Arc<Staging>, a: &mut Ahead) {
        let (Some(id), Ok(c)) = (a.id.clone(), self.client()) else {
            return;
        };
        let up = *self.upload.lock();
        let full = a.last_end.saturating_sub(1) / s.part_size;
        let key = self.full_key(&s.rel);
        while a.next < full && a.busy.len() < up.parallel.max(1) {
            if self.ahead_inflight.fetch_add(1, Relaxed) >= MOUNT_MAX {
                self.ahead_inflight.fetch_sub(1, Relaxed);
                break;
            }
            let slot = Slot(self.clone());
            let k = a.next;
            a.next += 1;
            let (ctx, st, key, id2) = (self.clone(), s.clone(), key.clone(), id.clone());
            let task = c.rt.spawn(async move {
                let r = ctx.put_part_ahead(&st, &key, &id2, k).await;
                drop(slot);
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

    /// Part `k` of the staging, read from its file (off the runtime's workers), uploaded to
    /// `id`: its ETag and the part's change count read before its bytes.
    async fn put_part_ahead(
        &self,
        s: &Arc<Staging>,
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
        let st = s.clone();
        let body = tokio::task::spawn_blocking(move || st.read_range(k * ps, ps))
            .await
            .map_err(|_| Errno::EIO)??;
        let qid = crate::raw::encode(id).replace('/', "%2F");
        let q = format!("partNumber={}&uploadId={qid}", k + 1);
        let a = self
            .client()?
            .raw
            .send(Method::PUT, key, &q, &[], body)
            .await?;
        a.check("UploadPart")?;
        Ok((a.etag()?, changes))
    }

    /// For the upload at fsync (which holds `uploading`): the parts in flight waited for,
    /// then what was uploaded ahead, taken (the staging starts afresh).
    pub(crate) fn take_ahead(&self, s: &Staging) -> Taken {
        // Until none is left: the task making the multipart upload starts parts when done.
        // (No two uploads of one part number may be in flight: the later to land is kept.)
        // Waited for at most a request's timeout in all: a server that froze meanwhile must
        // not make the fsync wait for them and then for its own upload; the parts are then
        // given up with their multipart upload, and the fsync's upload starts a new one (so
        // that a part still on its way can never land after the same part sent again).
        let deadline = tokio::time::Instant::now() + crate::ctx::REQUEST_TIMEOUT;
        let mut late = false;
        loop {
            let mut tasks: Vec<_> = s.ahead.lock().busy.drain().map(|(_, t)| t).collect();
            let Some(c) = self.client().ok().filter(|_| !tasks.is_empty()) else {
                break;
            };
            late = c.rt.block_on(async {
                let all = futures::future::join_all(tasks.iter_mut());
                tokio::time::timeout_at(deadline, all).await.is_err()
            });
            if late {
                for t in &tasks {
                    t.abort();
                }
                break;
            }
        }
        let a = std::mem::take(&mut *s.ahead.lock());
        for t in a.busy.values() {
            t.abort();
        }
        if late {
            tracing::warn!(
                "S3 {}: parts uploaded ahead did not finish in {:?}; uploading them again",
                s.rel,
                crate::ctx::REQUEST_TIMEOUT
            );
            if let Some(id) = &a.id {
                self.abort_ahead(&s.rel, id);
            }
            return Taken {
                id: None,
                done: HashMap::new(),
            };
        }
        Taken {
            id: a.id,
            done: a.done,
        }
    }

    /// Aborts multipart upload `id` of `rel` (its parts are not kept, or billed).
    pub(crate) fn abort_ahead(&self, rel: &str, id: &str) {
        if let Ok(c) = self.client() {
            c.rt.block_on(self.abort_request(rel, id));
        }
    }

    /// The abort of multipart upload `id` of `rel`, bounded to [`ABORT_WAIT`]: the server
    /// may be the reason for it (frozen, gone), and an fsync or a close must not wait for it
    /// for long; a lifecycle rule clears what an abort that did not land leaves.
    async fn abort_request(&self, rel: &str, id: &str) {
        let Ok(c) = self.client() else { return };
        let key = self.full_key(rel);
        let q = format!("uploadId={}", crate::raw::encode(id).replace('/', "%2F"));
        let send = c
            .raw
            .send(Method::DELETE, &key, &q, &[], bytes::Bytes::new());
        let r = tokio::time::timeout(ABORT_WAIT, send).await;
        let r = r.map(|a| a.map(|a| a.status));
        tracing::debug!("S3 {rel}: upload ahead aborted: {r:?}");
    }

    /// A staging that will not be uploaded (its name is gone, or its last handle let go):
    /// its parts in flight stopped and its multipart upload aborted, in the background
    /// (this may run on one of the runtime's own threads).
    pub(crate) fn forget_ahead(self: &Arc<Self>, s: &Staging) {
        let a = std::mem::take(&mut *s.ahead.lock());
        for (_, t) in a.busy {
            t.abort();
        }
        let (Some(id), Ok(c)) = (a.id, self.client()) else {
            return;
        };
        let (ctx, rel) = (self.clone(), s.rel.clone());
        c.rt.spawn(async move { ctx.abort_request(&rel, &id).await });
    }
}
