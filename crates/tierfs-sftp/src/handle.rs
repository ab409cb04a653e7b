//! An open file of the server (`SftpHandle`): its remote handle on the connection it was
//! opened on, opened again on a new connection after an outage; below the store (`store`) and
//! its file I/O (`io`).

use crate::attrs::attr;
use crate::conn::Conn;
use crate::ctx::Ctx;
use crate::errors::Status;
use openssh_sftp_client_lowlevel::{HandleOwned, OpenOptions};
use parking_lot::Mutex;
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_store::{Attr, Errno, Result};

/// A remote handle on the connection it belongs to; closed (without waiting) when dropped.
pub(crate) struct Open {
    pub(crate) conn: Arc<Conn>,
    pub(crate) h: Arc<HandleOwned>,
}

impl Drop for Open {
    fn drop(&mut self) {
        let h = self.h.clone();
        self.conn
            .send_detached(|we, id| Ok(we.send_close_request(id, Cow::Borrowed(&**h))?.wait()));
    }
}

/// An open file of the server.
pub struct SftpHandle {
    pub(crate) path: Arc<Path>,
    pub(crate) flags: i32,
    /// Size and mtime at open, for a read-only handle: what a reopen must find again.
    pub(crate) version: Option<(u64, i64)>,
    pub(crate) open: Mutex<Open>,
    /// Post-operation attributes (as NFSv3 returns them): the file's attributes from an
    /// LSTAT or FSTAT sent right after the handle's OPEN or READs, which the server answered
    /// after doing them. The next `fstat` (the core's fingerprint check after an open and
    /// after a read) is answered from them once, saving a round trip; a write or setattr
    /// through the handle drops them.
    pub(crate) post: Mutex<Option<(Attr, Instant)>>,
}

/// How long post-operation attributes answer an `fstat`: the core asks right after the
/// operation; later, the server is asked.
pub(crate) const POST_OP: Duration = Duration::from_millis(200);

pub(crate) fn options(flags: i32) -> OpenOptions {
    let acc = flags & libc::O_ACCMODE;
    OpenOptions::new()
        .read(acc != libc::O_WRONLY)
        .write(acc != libc::O_RDONLY)
        .append(flags & libc::O_APPEND != 0 && acc != libc::O_RDONLY)
}

pub(crate) fn writable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

impl SftpHandle {
    /// Post-operation attributes no longer hold (a write or setattr through the handle).
    pub(crate) fn drop_post(&self) {
        self.post.lock().take();
    }

    pub(crate) fn appends(&self) -> bool {
        self.flags & libc::O_APPEND != 0
    }

    /// The connection and remote handle to use: this handle's own, or, if its connection
    /// died and a new one is up, the file opened again there.
    pub(crate) fn on(&self, ctx: &Ctx) -> Result<(Arc<Conn>, Arc<HandleOwned>)> {
        {
            let o = self.open.lock();
            if o.conn.alive() {
                return Ok((o.conn.clone(), o.h.clone()));
            }
        }
        let c = ctx.conn()?;
        let p = &*self.path;
        let flags = self.flags & !(libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL);
        let (h, a) = ctx.run(c.pair(
            |we, id| {
                Ok(we
                    .send_open_file_request(id, options(flags).open(p.into()))?
                    .wait())
            },
            |we, id| Ok(we.send_lstat_request(id, p.into())?.wait()),
        ))?;
        let h = Arc::new(h.map_err(Status::errno)?);
        let new = Open {
            conn: c.clone(),
            h: h.clone(),
        };
        if let Some(v) = self.version {
            let a = attr(&a.map_err(Status::errno)?, p);
            if (a.size, a.mtime.sec) != v {
                tracing::info!(
                    "sftp: {} changed while the connection was down: its open handle is stale",
                    p.display()
                );
                return Err(Errno::ESTALE);
            }
        }
        tracing::debug!("sftp: {} opened again on the new connection", p.display());
        *self.open.lock() = new;
        *self.post.lock() = None;
        Ok((c, h))
    }
}
