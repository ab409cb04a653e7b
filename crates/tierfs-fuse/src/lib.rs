//! The thin FUSE adapter: turns `fuser` requests into calls on the filesystem core
//! (`tierfs_fs::Fs`) and its answers into replies. Only this crate knows FUSE exists.
//!
//! Threading: fuser's worker threads (`fuse.threads`, each with its own cloned /dev/fuse fd)
//! answer RAM-tier hits inline; anything that may touch the slow store is handed to a pool of
//! `fuse.io_threads` threads, so a slow backing store never stalls cache hits (FUSE-NOTES
//! lesson 2) and the pool size bounds the queue depth the backing store sees.

mod adapter;
mod adapter_dir;
mod adapter_file;
mod adapter_ops;
mod attr;
mod inline;
mod kernel_cache;
mod killable;
mod mount;
mod plus;

pub use adapter::KernelTtls;
pub use mount::{find_mount, mount, mount_device, FuseConfig, MountInfo, Mounted, Unmounter};
