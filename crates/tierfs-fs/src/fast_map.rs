//! The concurrent maps on the paths that answer from memory (the inode table, the metadata
//! cache), hashed with FxHash instead of the standard library's SipHash. Their keys are
//! inode numbers and store identities, not names a remote party picks to collide, and a
//! READDIRPLUS page touches them some ten times per entry (DashMap hashes each key twice:
//! once for the shard, once in it): with SipHash, hashing was ~4% of the daemon's samples
//! during a warm `ls -l` (docs/dependencies.md). Listings' names use FxHash too
//! (`meta::listings`).

pub(crate) type DashMap<K, V> = dashmap::DashMap<K, V, rustc_hash::FxBuildHasher>;
