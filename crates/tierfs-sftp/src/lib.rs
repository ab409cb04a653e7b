//! A directory on an sftp server as a tierfs backing store:
//! `tierfs mount sftp://[USER@]HOST[:PORT]/PATH MNT`.
//!
//! The connection is the system's OpenSSH (`ssh -s HOST sftp`, spawned by the store), so the
//! user's ~/.ssh/config, keys, agent and known_hosts apply as for `ssh`. The sftp protocol
//! (v3 and OpenSSH's extensions) is `openssh-sftp-client-lowlevel`; it is async, so
//! [`SftpStore`] owns a small tokio runtime and every [`tierfs_store::Store`] call blocks on
//! it, the rest of tierfs staying synchronous. Requests of every thread share the one
//! connection, many in flight at once (docs/sftp.md).

mod attrs;
mod config;
mod conn;
mod ctx;
mod dir;
mod errors;
mod handle;
mod io;
mod ns;
mod stats;
mod store;

pub use config::{SftpConfig, SftpUrl, DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT};
pub use handle::SftpHandle;
pub use stats::{SftpStats, SftpStatsSnapshot};
pub use store::{SftpNode, SftpStore};
