//! Opening the store BACKING names: an `s3://` or `sftp://` URL, or a directory. Everything
//! that can be checked is checked here, before the daemon detaches, so a bad bucket, host,
//! key or path is one line on stderr and exit status 1.

use crate::any_store::AnyStore;
use crate::config::Config;
use anyhow::Result;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use tierfs_store::PosixStore;

/// Why directories are listed as they are (`store.names_first`), decided when the store is
/// opened, for the log once it is set up.
pub static LISTINGS_WHY: OnceLock<String> = OnceLock::new();

/// The sftp store's own counters (requests in flight), for `tierfs stats`: one store per
/// daemon, set when it is opened.
pub static SFTP_STATS: OnceLock<Arc<tierfs_sftp::SftpStats>> = OnceLock::new();

/// The store of `backing` (`url`: BACKING when it is an s3:// or sftp:// URL).
pub fn open_store(backing: &Path, url: Option<&str>, config: &Config) -> Result<AnyStore> {
    config.refuse_foreign_options(match url {
        Some(u) if u.starts_with("s3://") => "s3",
        Some(_) => "sftp",
        None => "dir",
    })?;
    match url {
        Some(url) if url.starts_with("s3://") => {
            let cfg = tierfs_s3::S3Config::resolve(
                url,
                config.s3_endpoint.clone(),
                config.s3_region.clone(),
            )
            .map_err(|e| anyhow::anyhow!(e))?;
            let s3 = tierfs_s3::S3Store::open(cfg).map_err(|e| anyhow::anyhow!(e))?;
            Ok(AnyStore::S3(Box::new(s3)))
        }
        Some(url) => {
            let cfg = config
                .sftp
                .store_config(url)
                .map_err(|e| anyhow::anyhow!(e))?;
            let s = tierfs_sftp::SftpStore::open(cfg).map_err(|e| anyhow::anyhow!(e))?;
            let _ = SFTP_STATS.set(s.stats());
            Ok(AnyStore::Sftp(Box::new(s)))
        }
        None => {
            let store = PosixStore::open_with(backing, config.store_identity)?;
            store.set_stat_concurrency(config.store_stat_concurrency);
            let why = store.set_names_first(config.store_names_first);
            let _ = LISTINGS_WHY.set(why);
            Ok(AnyStore::Posix(store))
        }
    }
}

/// `stats` answers with the sftp store's counters added under `sftp` (requests in flight and
/// in all, timeouts, reconnects), where the mount's store is one.
pub fn add_store_stats(v: &mut serde_json::Value) {
    if let (Some(s), Some(o)) = (SFTP_STATS.get(), v.as_object_mut()) {
        let s = s.snapshot();
        o.insert(
            "sftp".into(),
            serde_json::json!({
                "in_flight": s.in_flight,
                "requests": s.requests,
                "timeouts": s.timeouts,
                "reconnects": s.reconnects,
            }),
        );
    }
}
