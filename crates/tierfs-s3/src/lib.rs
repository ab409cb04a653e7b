//! An S3-compatible bucket as a tierfs backing store: `tierfs mount s3://BUCKET[/PREFIX] MNT`.
//!
//! The protocol (signing, retries, ranged and conditional GETs, delimited listings) is Apache
//! Arrow's `object_store`; it is async, so [`S3Store`] owns a small tokio runtime and every
//! [`tierfs_store::Store`] call blocks on it: the rest of tierfs stays synchronous.
//!
//! The namespace is the usual one of S3 tools: `/` separates directories, a directory exists
//! while some key is under it (or its zero-byte `dir/` marker), and a directory and a file of
//! the same name show the directory. Identity is the key (`Identity::Path`); the version of an
//! object is its ETag, carried in the attributes' ctime (see [`attrs`]). docs/s3.md states what
//! of POSIX is and is not kept.

mod ahead;
mod attrs;
mod bucket;
mod config;
mod ctx;
mod errors;
mod first;
mod lineage;
mod raw;
mod staging;
mod store;
mod store_calls;
mod store_io;
mod stream;
mod upload;

pub use bucket::ObjectBucket;
pub use config::{parse_url, Credentials, S3Config};
pub use ctx::{UploadConfig, PART_MIN};
pub use store::{S3Handle, S3Node, S3Store};
