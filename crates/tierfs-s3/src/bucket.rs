//! A bucket used as a plain object store, for the shared tier (`-o shared=s3://BUCKET/PREFIX`):
//! GETs of many keys at once and PUTs, each bounded by a short deadline and retried at most
//! once. Its caller falls back to the origin, so a slow answer costs more than a failed one.

use crate::config::S3Config;
use crate::ctx::{build_s3, runtime};
use bytes::Bytes;
use object_store::aws::AmazonS3;
use object_store::path::Path as Key;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use std::sync::OnceLock;
use std::time::Duration;

pub struct ObjectBucket {
    cfg: S3Config,
    timeout: Duration,
    /// Made at first use: `tierfs mount` forks after opening, and a runtime's threads do not
    /// survive a fork.
    client: OnceLock<std::result::Result<(tokio::runtime::Runtime, AmazonS3), String>>,
}

impl ObjectBucket {
    /// The bucket `cfg` names; every request ends within `timeout` (and one retry).
    pub fn new(cfg: S3Config, timeout: Duration) -> ObjectBucket {
        ObjectBucket {
            cfg,
            timeout,
            client: OnceLock::new(),
        }
    }

    fn client(&self) -> std::result::Result<&(tokio::runtime::Runtime, AmazonS3), String> {
        self.client
            .get_or_init(|| {
                let options = ClientOptions::new()
                    .with_timeout(self.timeout)
                    .with_connect_timeout(self.timeout)
                    .with_allow_http(true);
                let retry = RetryConfig {
                    max_retries: 1,
                    retry_timeout: self.timeout,
                    ..Default::default()
                };
                Ok((
                    runtime("tierfs-shared-io")?,
                    build_s3(&self.cfg, &options, retry)?,
                ))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn key(&self, k: &str) -> std::result::Result<Key, String> {
        Key::parse(k).map_err(|e| format!("{k}: {e}"))
    }

    /// The objects of `keys`, fetched concurrently: `Ok(None)` where there is none.
    pub fn get_many(&self, keys: &[String]) -> Vec<std::result::Result<Option<Bytes>, String>> {
        let (rt, s3) = match self.client() {
            Ok(c) => c,
            Err(e) => return keys.iter().map(|_| Err(e.clone())).collect(),
        };
        let limit = self.timeout * 2;
        let tasks: Vec<_> = keys
            .iter()
            .map(|k| {
                let (s3, key) = (s3.clone(), self.key(k));
                rt.spawn(async move {
                    let key = key?;
                    let get = async {
                        match s3.get(&key).await {
                            Ok(r) => r.bytes().await.map(Some),
                            Err(object_store::Error::NotFound { .. }) => Ok(None),
                            Err(e) => Err(e),
                        }
                    };
                    bounded(limit, get).await
                })
            })
            .collect();
        rt.block_on(async {
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(t.await.unwrap_or_else(|e| Err(e.to_string())));
            }
            out
        })
    }

    /// Stores `body` under `key`.
    pub fn put(&self, key: &str, body: Bytes) -> std::result::Result<(), String> {
        let (rt, s3) = self.client()?;
        let key = self.key(key)?;
        let limit = self.timeout * 2 + Duration::from_secs(body.len() as u64 >> 24);
        rt.block_on(async {
            bounded(limit, s3.put(&key, PutPayload::from_bytes(body)))
                .await
                .map(|_| ())
        })
    }

    /// Whether the bucket answers: one listing of at most one key under `prefix`. An error
    /// names what is wrong (no such bucket, refused credentials, nobody listening).
    pub fn check(&self, prefix: &str) -> std::result::Result<(), String> {
        let (rt, s3) = self.client()?;
        let p = (!prefix.is_empty()).then(|| Key::from(prefix));
        let limit = self.timeout * 2;
        rt.block_on(async {
            bounded(limit, s3.list_with_delimiter(p.as_ref()))
                .await
                .map(|_| ())
        })
    }

    /// Every key under `prefix` (for tests and tools; listed page by page).
    pub fn list_keys(&self, prefix: &str) -> std::result::Result<Vec<String>, String> {
        use futures::TryStreamExt;
        let (rt, s3) = self.client()?;
        let p = (!prefix.is_empty()).then(|| Key::from(prefix));
        rt.block_on(async {
            let metas: Vec<_> = s3
                .list(p.as_ref())
                .try_collect()
                .await
                .map_err(|e| crate::errors::describe(&e))?;
            Ok(metas.into_iter().map(|m| m.location.to_string()).collect())
        })
    }

    /// `s3://bucket at endpoint`.
    pub fn describe(&self) -> String {
        match &self.cfg.endpoint {
            Some(e) => format!("s3://{} at {e}", self.cfg.bucket),
            None => format!("s3://{} ({})", self.cfg.bucket, self.cfg.region),
        }
    }
}

/// `f`'s result, or an error if it has not answered within `limit`; errors as one line.
async fn bounded<T>(
    limit: Duration,
    f: impl std::future::Future<Output = object_store::Result<T>>,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| crate::errors::describe(&e)),
        Err(_) => Err(format!("no answer in {limit:?}")),
    }
}
