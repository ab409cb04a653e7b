//! The shared tier of a mount (`-o shared=s3://BUCKET/PREFIX`): the origin's name every host
//! agrees on, the bucket opened and checked, and the tier handed to the filesystem.

use crate::any_store::AnyStore;
use crate::config_shared::SharedTunables;
use anyhow::{bail, Result};
use bytes::Bytes;
use std::path::Path;
use std::sync::Arc;
use tierfs_cache::{SharedCache, SharedConfig, SharedStore};
use tierfs_s3::{ObjectBucket, S3Config};

/// The bucket as the tier's [`SharedStore`].
struct Bucket(ObjectBucket);

impl SharedStore for Bucket {
    fn get_many(&self, keys: &[String]) -> Vec<std::result::Result<Option<Bytes>, String>> {
        self.0.get_many(keys)
    }
    fn put(&self, key: &str, body: Bytes) -> std::result::Result<(), String> {
        self.0.put(key, body)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

/// Filesystems whose contents are the same whichever host mounts them: the origin is named by
/// the server's export, not by where this host mounted it.
const NETWORK_FS: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "ceph",
    "glusterfs",
    "9p",
    "fuse.sshfs",
    "fuse.rclone",
    "fuse.s3fs",
    "fuse.juicefs",
    "lustre",
    "gpfs",
];

/// The origin's name, the same on every host that mounts it (`shared.namespace` overrides):
/// the bucket and its server for S3, the sftp URL, and for a directory the export it lies in
/// when that is a network filesystem (`server:/export` and the path under it), else this
/// host's name and the directory (a local disk is no other host's origin).
pub fn origin_name(store: &AnyStore) -> String {
    match store {
        AnyStore::S3(s) => {
            let c = s.config();
            format!(
                "s3:{}/{}/{}",
                c.endpoint.as_deref().unwrap_or(&c.region),
                c.bucket,
                c.prefix
            )
        }
        AnyStore::Sftp(s) => format!("{}{}", s.config().url.display(), s.root_path().display()),
        AnyStore::Posix(p) => posix_origin(p.root_dir()),
    }
}

fn posix_origin(dir: &Path) -> String {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    // The mount holding `dir`: the longest mount point it lies under.
    let mut best: Option<(&str, &str, &str)> = None;
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mp) = pre.split(' ').nth(4) else {
            continue;
        };
        let mut post = post.split(' ');
        let (Some(fstype), Some(source)) = (post.next(), post.next()) else {
            continue;
        };
        let mp_path = Path::new(mp);
        if dir.starts_with(mp_path) && best.is_none_or(|(m, _, _)| mp.len() >= m.len()) {
            best = Some((mp, fstype, source));
        }
    }
    match best {
        Some((mp, fstype, source)) if NETWORK_FS.contains(&fstype) => {
            let rel = dir.strip_prefix(mp).unwrap_or(dir);
            format!("{fstype}:{source}/{}", rel.display())
        }
        _ => format!("{}:{}", hostname(), dir.display()),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The shared tier of `t` for `store`, None without one. A bucket that answers with a refusal
/// (no such bucket, credentials refused) fails the mount; one that does not answer yet only
/// starts the tier down (the origin is read meanwhile).
pub fn open(store: &AnyStore, t: &SharedTunables) -> Result<Option<Arc<SharedCache>>> {
    let Some(url) = &t.url else {
        return Ok(None);
    };
    let cfg = S3Config::resolve(url, t.endpoint.clone(), t.region.clone())
        .map_err(|e| anyhow::anyhow!("shared tier: {e}"))?;
    let prefix = cfg.prefix.clone();
    let bucket = ObjectBucket::new(cfg, t.timeout);
    let unanswered = bucket.check(&prefix).err();
    if let Some(e) = &unanswered {
        // Answers that will not change by waiting (S3's codes, or object_store's words for
        // them): the mount is refused. Anything else (refused connections, deadlines) may.
        let refused = [
            "nosuchbucket",
            "accessdenied",
            "invalidaccesskeyid",
            "signaturedoesnotmatch",
        ];
        let plain = e.to_lowercase().replace([' ', '_'], "");
        if refused.iter().any(|c| plain.contains(c)) {
            bail!("shared tier {}: {e}", bucket.describe());
        }
        tracing::warn!(
            "shared tier {}: {e}; reading from the origin until it answers",
            bucket.describe()
        );
    }
    let origin = t.namespace.clone().unwrap_or_else(|| origin_name(store));
    tracing::info!(
        "shared tier {} (prefix {prefix:?}), origin named {origin:?}, chunks of {} bytes",
        bucket.describe(),
        t.chunk
    );
    let tier = SharedCache::new(
        Arc::new(Bucket(bucket)),
        SharedConfig {
            prefix,
            origin: tierfs_cache::shared::origin_hash(&origin),
            chunk_size: t.chunk as u32,
            write_rate: t.write_rate,
            queue_bytes: t.queue,
            backoff: t.backoff,
            put_threads: 4,
        },
    );
    if let Some(e) = unanswered {
        tier.mark_failed(&e);
    }
    Ok(Some(tier))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_directory_is_named_by_host_and_path() {
        let d = tempfile::tempdir().unwrap();
        let name = posix_origin(d.path());
        assert!(
            name.ends_with(&format!(":{}", d.path().display())),
            "{name}"
        );
        assert!(name.starts_with(&hostname()), "{name}");
    }
}
