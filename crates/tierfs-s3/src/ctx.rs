//! What every part of the S3 store shares: the configuration, the clients (made after the
//! daemon forks), the registry of staged objects, and the local directories.

use crate::config::S3Config;
use crate::errors::errno;
use crate::lineage::Lineage;
use crate::raw::RawClient;
use crate::staging::{now, Staging};
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path as Key;
use object_store::{ClientOptions, RetryConfig};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use tierfs_store::{Errno, Result, TimeSpec};

/// How long one request may take, and how long retries of a failing one may go on, before the
/// application gets EIO: a vanished server must not hang a FUSE request for minutes
/// (object_store's own default retries for 3 minutes).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const RETRY_TIMEOUT: Duration = Duration::from_secs(20);
const MAX_RETRIES: usize = 3;

/// Upload tunables (`s3.part_size`, `s3.upload_parallel`).
#[derive(Clone, Copy, Debug)]
pub struct UploadConfig {
    /// Objects up to this size go in one PUT; larger ones in parts of this size.
    pub part_size: u64,
    /// Parts of one upload in flight at once.
    pub parallel: usize,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            part_size: 8 << 20,
            parallel: 8,
        }
    }
}

/// S3's smallest part (all but the last).
pub const PART_MIN: u64 = 5 << 20;

pub(crate) struct Client {
    pub rt: tokio::runtime::Runtime,
    pub s3: AmazonS3,
    pub raw: RawClient,
}

/// An object_store client of the bucket `cfg` names, with `options` and `retry`.
pub(crate) fn build_s3(
    cfg: &S3Config,
    options: &ClientOptions,
    retry: RetryConfig,
) -> std::result::Result<AmazonS3, String> {
    let mut b = AmazonS3Builder::new()
        .with_bucket_name(&cfg.bucket)
        .with_region(&cfg.region)
        .with_access_key_id(&cfg.credentials.access_key_id)
        .with_secret_access_key(&cfg.credentials.secret_access_key)
        // If-Match / If-None-Match on PUT (AWS since 2024, versitygw, MinIO, R2, Ceph).
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_retry(retry)
        .with_client_options(options.clone());
    if let Some(t) = &cfg.credentials.session_token {
        b = b.with_token(t);
    }
    if let Some(e) = &cfg.endpoint {
        // Path-style addressing (http://host/bucket/key): what S3-compatible servers
        // take; AWS takes it too.
        b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
    }
    b.build().map_err(|e| format!("s3://{}: {e}", cfg.bucket))
}

/// A small runtime for a client's requests (made after the daemon forks).
pub(crate) fn runtime(name: &str) -> std::result::Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

impl Client {
    pub fn new(cfg: &S3Config) -> std::result::Result<Client, String> {
        let options = ClientOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(Duration::from_secs(5))
            .with_allow_http(true);
        let retry = RetryConfig {
            max_retries: MAX_RETRIES,
            retry_timeout: RETRY_TIMEOUT,
            ..Default::default()
        };
        let s3 = build_s3(cfg, &options, retry)?;
        let raw = RawClient::new(cfg, &options, REQUEST_TIMEOUT)?;
        let rt = runtime("tierfs-s3")?;
        Ok(Client { rt, s3, raw })
    }
}

pub struct Ctx {
    /// The runtime and clients, made at first use: `tierfs mount` checks the bucket before it
    /// detaches (fork), and a runtime's threads do not survive a fork.
    client: OnceLock<Client>,
    pub(crate) cfg: S3Config,
    pub(crate) id: String,
    pub(crate) owner: (u32, u32),
    pub(crate) born: TimeSpec,
    pub(crate) upload: Mutex<UploadConfig>,
    /// Where staging files go (the cache's disk) and where contents that could not be
    /// uploaded are kept (`<cache dir>/journal/lost`).
    pub(crate) staging_dir: Mutex<PathBuf>,
    pub(crate) lost_dir: Mutex<PathBuf>,
    /// The staging of every key with one, while a handle holds it.
    pub(crate) staged: Mutex<HashMap<Arc<str>, Weak<Staging>>>,
    /// Which versions our own uploads replaced, so read handles follow them.
    pub(crate) ours: Lineage,
    /// Parts being uploaded ahead (see `ahead`), for the whole mount.
    pub(crate) ahead_inflight: std::sync::atomic::AtomicUsize,
}

impl Ctx {
    pub(crate) fn new(cfg: S3Config) -> Ctx {
        let tmp = std::env::temp_dir();
        Ctx {
            client: OnceLock::new(),
            id: store_id(&cfg),
            owner: unsafe { (libc::getuid(), libc::getgid()) },
            born: now(),
            upload: Mutex::new(UploadConfig::default()),
            staging_dir: Mutex::new(tmp.clone()),
            lost_dir: Mutex::new(tmp.join("tierfs-lost")),
            staged: Mutex::new(HashMap::new()),
            ours: Lineage::default(),
            ahead_inflight: Default::default(),
            cfg,
        }
    }

    pub(crate) fn client(&self) -> Result<&Client> {
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

    /// The full key of `rel` (relative to the mounted prefix), as S3 spells it.
    pub(crate) fn full_key(&self, rel: &str) -> String {
        match (self.cfg.prefix.is_empty(), rel.is_empty()) {
            (true, _) => rel.to_string(),
            (false, true) => self.cfg.prefix.clone(),
            (false, false) => format!("{}/{rel}", self.cfg.prefix),
        }
    }

    /// The object key of `rel`.
    pub(crate) fn key(&self, rel: &str) -> Result<Key> {
        Key::parse(self.full_key(rel)).map_err(|_| Errno::ENOENT)
    }

    /// The listing prefix of directory `rel` (None: the whole bucket).
    pub(crate) fn dir_key(&self, rel: &str) -> Option<Key> {
        let k = self.key(rel).ok()?;
        (!k.as_ref().is_empty()).then_some(k)
    }

    pub(crate) fn run<T>(
        &self,
        f: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> Result<T> {
        self.block(self.client()?, f)?.map_err(|e| {
            let n = errno(&e);
            if n == Errno::EIO {
                tracing::warn!("s3://{}: {e}", self.cfg.bucket);
            }
            n
        })
    }

    /// `f` on the client's runtime, given up with ETIMEDOUT at the deadline of the call
    /// running on this thread, if its caller set one (`Store::keeps_call_limit`).
    pub(crate) fn block<F: std::future::Future>(&self, c: &Client, f: F) -> Result<F::Output> {
        match tierfs_store::call_limit::deadline() {
            None => Ok(c.rt.block_on(f)),
            Some(at) => {
                c.rt.block_on(async { tokio::time::timeout_at(at.into(), f).await })
                    .map_err(|_| Errno(libc::ETIMEDOUT))
            }
        }
    }

    /// The live staging of `rel`, if a handle holds one.
    pub(crate) fn staging_of(&self, rel: &str) -> Option<Arc<Staging>> {
        self.staged.lock().get(rel).and_then(Weak::upgrade)
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
