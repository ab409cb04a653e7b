//! What every part of the sftp store shares: the configuration, the runtime and the current
//! connection (both made after the daemon forks: `tierfs mount` checks the server with a
//! connection of its own before it detaches, and a runtime's threads do not survive a fork),
//! and making a new connection when the old one died.

use crate::config::SftpConfig;
use crate::conn::Conn;
use crate::errors::Status;
use crate::stats::SftpStats;
use parking_lot::{Mutex, RwLock};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tierfs_store::{Errno, Result};

pub(crate) struct Ctx {
    pub(crate) cfg: SftpConfig,
    pub(crate) id: String,
    /// The directory served, absolute, as the server resolved it at mount.
    pub(crate) root: PathBuf,
    rt: OnceLock<tokio::runtime::Runtime>,
    /// The connection in use; None before the first call (after the fork).
    conn: RwLock<Option<Arc<Conn>>>,
    /// One connection made at a time; when the last attempt failed.
    connecting: Mutex<()>,
    failed_at: Mutex<Option<Instant>>,
    pub(crate) stats: Arc<SftpStats>,
    /// The login may not chown (a SETSTAT of an owner was refused once): new objects keep
    /// the login as owner, and no chown is tried again.
    pub(crate) chown_refused: AtomicBool,
}

/// A runtime for the client: two threads, the writer and reader tasks and ssh's pipes; the
/// callers' own threads wait on it (`block_on`).
pub(crate) fn runtime() -> std::result::Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tierfs-sftp")
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

impl Ctx {
    pub(crate) fn new(cfg: SftpConfig, root: PathBuf) -> Ctx {
        Ctx {
            id: cfg.url.store_id(),
            cfg,
            root,
            rt: OnceLock::new(),
            conn: RwLock::new(None),
            connecting: Mutex::new(()),
            failed_at: Mutex::new(None),
            stats: Arc::default(),
            chown_refused: AtomicBool::new(false),
        }
    }

    fn rt(&self) -> Result<&tokio::runtime::Runtime> {
        if let Some(rt) = self.rt.get() {
            return Ok(rt);
        }
        let rt = runtime().map_err(|e| {
            tracing::error!("sftp store: {e}");
            Errno::EIO
        })?;
        let _ = self.rt.set(rt);
        self.rt.get().ok_or(Errno::EIO)
    }

    /// Runs the client's future on the store's runtime, from a caller's thread.
    pub(crate) fn run<T>(&self, f: impl std::future::Future<Output = T>) -> Result<T> {
        Ok(self.rt()?.block_on(f))
    }

    /// The connection to send on: the live one, or the first one (made at first use). A dead
    /// one is ENOTCONN: the core then marks the store gone and calls `reconnect`.
    pub(crate) fn conn(&self) -> Result<Arc<Conn>> {
        if let Some(c) = self.conn.read().as_ref() {
            return if c.alive() {
                Ok(c.clone())
            } else {
                Err(Errno::ENOTCONN)
            };
        }
        let _one = self.connecting.lock();
        if let Some(c) = self.conn.read().as_ref() {
            return Ok(c.clone());
        }
        let c = self.connect().map_err(|e| {
            tracing::error!("{e}");
            Errno::ENOTCONN
        })?;
        *self.conn.write() = Some(c.clone());
        Ok(c)
    }

    /// The connection now in place, alive or not (a handle compares its own with it).
    pub(crate) fn current(&self) -> Option<Arc<Conn>> {
        self.conn.read().clone()
    }

    fn connect(&self) -> std::result::Result<Arc<Conn>, String> {
        let stats = self.stats.clone();
        let c = self
            .run(Conn::start(&self.cfg, stats))
            .map_err(|e| format!("sftp: {e}"))??;
        tracing::info!(
            "sftp: connected to {} (READs of {} bytes, WRITEs of {}; extensions {:?})",
            self.cfg.url.display(),
            c.read_len,
            c.write_len,
            c.ext
        );
        Ok(Arc::new(c))
    }

    /// `Store::reconnect`: Same while the connection answers (an LSTAT of the root); else a
    /// new ssh, New once it answers. Bounded by ssh's ConnectTimeout and the handshake's
    /// deadline, so the prober's once-a-second loop never hangs.
    pub(crate) fn reconnect(&self) -> Result<tierfs_store::Reconnect> {
        let before = self.current();
        if let Some(c) = before.as_ref().filter(|c| c.alive()) {
            match self.lstat_on(c, &self.root) {
                Ok(_) => return Ok(tierfs_store::Reconnect::Same),
                Err(e) if e != Errno::ENOTCONN => return Err(e),
                Err(_) => {}
            }
        }
        let _one = self.connecting.lock();
        let now = self.current();
        let replaced = match (&before, &now) {
            (Some(b), Some(n)) => !Arc::ptr_eq(b, n),
            (None, Some(_)) => true,
            _ => false,
        };
        if let Some(n) = now.as_ref().filter(|n| replaced && n.alive()) {
            // Another caller reconnected meanwhile.
            let _ = n;
            return Ok(tierfs_store::Reconnect::New);
        }
        let c = self.connect().map_err(|e| {
            tracing::debug!("{e}");
            *self.failed_at.lock() = Some(Instant::now());
            Errno::ENOTCONN
        })?;
        *self.failed_at.lock() = None;
        let a = self.lstat_on(&c, &self.root)?;
        if a.kind != tierfs_store::FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if let Some(old) = self.conn.write().replace(c) {
            old.close();
        }
        self.stats.reconnects.fetch_add(1, Relaxed);
        tracing::warn!("sftp: {} answers again", self.cfg.url.display());
        Ok(tierfs_store::Reconnect::New)
    }

    /// `op`, and once more on a new connection if it failed because the connection died
    /// (ssh killed, a network blip): for operations that may be repeated (reads, stats,
    /// listings, writes at an offset), so a dropped connection the server answers again at
    /// once costs the application nothing. While reconnecting fails (at most one try a
    /// second from here), ENOTCONN: the core then serves what is cached and probes.
    pub(crate) fn again<T>(&self, op: impl Fn() -> Result<T>) -> Result<T> {
        match op() {
            Err(Errno::ENOTCONN) => {
                let recent = self
                    .failed_at
                    .lock()
                    .is_some_and(|t| t.elapsed() < Duration::from_secs(1));
                if recent || self.reconnect().is_err() {
                    return Err(Errno::ENOTCONN);
                }
                op()
            }
            r => r,
        }
    }

    pub(crate) fn lstat_on(&self, c: &Conn, p: &Path) -> Result<tierfs_store::Attr> {
        let a = self
            .run(c.call(|we, id| Ok(we.send_lstat_request(id, p.into())?.wait())))?
            .map_err(Status::errno)?;
        Ok(crate::attrs::attr(&a, p))
    }
}

/// `parent/name` for a name the kernel gave: one component, not `.` or `..` (which the
/// kernel never sends, and which would reach outside the node's path).
pub(crate) fn child(parent: &Path, name: &OsStr) -> Result<PathBuf> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(Errno::ENOENT);
    }
    if b.len() > 255 {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    Ok(parent.join(name))
}
