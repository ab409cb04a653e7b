//! Namespace operations and setattr. Each is the operation and an LSTAT of its result sent
//! together (one round trip). sftp's FAILURE stands for every errno it has no code for
//! (EEXIST, ENOTEMPTY, EISDIR, ENOSPC, EROFS, ...): where an operation fails so, the names
//! involved are looked at (one more round trip, on the error path only) to say which, as
//! sshfs does.

use crate::attrs::{attr, perms, stamp};
use crate::conn::Conn;
use crate::ctx::child;
use crate::errors::Status;
use crate::handle::SftpHandle;
use crate::store::{SftpNode, SftpStore};
use openssh_sftp_client_lowlevel::{Extensions, FileAttrs, FileType};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use tierfs_store::{Attr, Errno, FileKind, Owner, Result, SetAttr, TimeSpec, TimeUpdate};

impl SftpStore {
    /// What a FAILURE most likely was where the name's existence does not tell: a read-only
    /// or full filesystem (statvfs@openssh.com says), else EIO.
    pub(crate) async fn failure(&self, c: &Conn) -> Errno {
        if !c.has(Extensions::STATVFS) {
            return Errno::EIO;
        }
        let root = &*self.ctx.root;
        match c
            .call(|we, id| Ok(we.send_statvfs_request(id, root.into())?.wait()))
            .await
        {
            Ok(v) if v.flag & libc::ST_RDONLY != 0 => Errno(libc::EROFS),
            Ok(v) if v.bavail == 0 || v.favail == 0 => Errno::ENOSPC,
            _ => Errno::EIO,
        }
    }

    /// The kind of what `p` names now, None if nothing (or it cannot be asked).
    async fn kind_at(c: &Conn, p: &Path) -> Option<FileKind> {
        c.call(|we, id| Ok(we.send_lstat_request(id, p.into())?.wait()))
            .await
            .ok()
            .map(|a| attr(&a, p).kind)
    }

    /// Something was made at `p` by `op`: its attributes from the LSTAT sent with it; a
    /// FAILURE where something now is: EEXIST.
    fn made<F>(
        &self,
        p: &Path,
        op: impl FnOnce(
            &mut crate::conn::WriteEnd,
            crate::conn::Id,
        ) -> std::result::Result<F, openssh_sftp_client_lowlevel::Error>,
    ) -> Result<Attr>
    where
        F: std::future::Future<
            Output = std::result::Result<
                (crate::conn::Id, ()),
                openssh_sftp_client_lowlevel::Error,
            >,
        >,
    {
        let c = self.ctx.conn()?;
        self.ctx.run(async {
            let (r, a) = c
                .pair(op, |we, id| Ok(we.send_lstat_request(id, p.into())?.wait()))
                .await;
            match (r, a) {
                (Ok(()), Ok(a)) => Ok(attr(&a, p)),
                (Ok(()), Err(e)) => Err(e.errno()),
                (Err(Status::Failure), Ok(_)) => Err(Errno(libc::EEXIST)),
                (Err(Status::Failure), Err(_)) => Err(self.failure(&c).await),
                (Err(e), _) => Err(e.errno()),
            }
        })?
    }

    pub(crate) fn do_mkdir(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        mode: u32,
        owner: Owner,
    ) -> Result<(SftpNode, Attr)> {
        let p = child(&parent.path, name)?;
        let a = self.made(&p, |we, id| {
            Ok(we.send_mkdir_request(id, (&*p).into(), perms(mode))?.wait())
        })?;
        let a = self.fix_new(&p, a, mode, owner)?;
        Ok((SftpNode::new(p, Some(FileKind::Dir)), a))
    }

    /// What was just made at `p` (attributes `a`) gets what the caller asked for, where the
    /// server made it otherwise (one more round trip each, only then): the caller as owner
    /// (`owner`, as a local filesystem does; the numbers are the server's, as shown), unless
    /// the login may not chown (then it stays the login's, and this is not tried again); and
    /// the mode asked for, which sftp-server's umask (sshd's, usually 022) may have cut and a
    /// chown clears setuid/setgid bits of.
    pub(crate) fn fix_new(&self, p: &Path, mut a: Attr, mode: u32, owner: Owner) -> Result<Attr> {
        let c = self.ctx.conn()?;
        if let Some((uid, mut gid)) = owner.filter(|_| !self.ctx.chown_refused.load(Relaxed)) {
            if (a.uid, a.gid) != (uid, gid) && a.gid != gid {
                // In a setgid directory a new object takes the directory's group (the server
                // gave it already), not the creator's.
                let parent = p.parent().unwrap_or(p);
                if self.lstat(parent)?.perm as u32 & libc::S_ISGID != 0 {
                    gid = a.gid;
                }
            }
            if (a.uid, a.gid) != (uid, gid) {
                let mut fa = FileAttrs::new();
                fa.set_id(uid, gid);
                let (r, b) = self.ctx.run(c.pair(
                    |we, id| Ok(we.send_setstat_request(id, p.into(), fa)?.wait()),
                    |we, id| Ok(we.send_lstat_request(id, p.into())?.wait()),
                ))?;
                match r {
                    Ok(()) => a = attr(&b.map_err(Status::errno)?, p),
                    Err(Status::PermDenied) => {
                        self.ctx.chown_refused.store(true, Relaxed);
                        tracing::info!(
                            "sftp: the login may not chown: new files and directories stay the login's on the server"
                        );
                    }
                    Err(e) => return Err(e.errno()),
                }
            }
        }
        if a.perm as u32 == mode & 0o7777 {
            return Ok(a);
        }
        let (r, b) = self.ctx.run(c.pair(
            |we, id| Ok(we.send_setstat_request(id, p.into(), perms(mode))?.wait()),
            |we, id| Ok(we.send_lstat_request(id, p.into())?.wait()),
        ))?;
        r.map_err(Status::errno)?;
        Ok(attr(&b.map_err(Status::errno)?, p))
    }

    pub(crate) fn do_symlink(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<(SftpNode, Attr)> {
        let p = child(&parent.path, name)?;
        let t = Path::new(target);
        // (The client library sends OpenSSH's order: target first, as sftp-server reads it.)
        let a = self.made(&p, |we, id| {
            Ok(we.send_symlink_request(id, t.into(), (&*p).into())?.wait())
        })?;
        Ok((SftpNode::new(p, Some(FileKind::Symlink)), a))
    }

    pub(crate) fn do_link(
        &self,
        node: &SftpNode,
        newparent: &SftpNode,
        newname: &OsStr,
    ) -> Result<Attr> {
        let p = child(&newparent.path, newname)?;
        let c = self.ctx.conn()?;
        // Without hardlink@openssh.com sftp cannot link: EPERM, what link(2) says on a
        // filesystem without hard links.
        if !c.has(Extensions::HARDLINK) {
            return Err(Errno::EPERM);
        }
        let from = &*node.path;
        self.made(&p, |we, id| {
            Ok(we
                .send_hardlink_request(id, from.into(), (&*p).into())?
                .wait())
        })
    }

    pub(crate) fn do_unlink(&self, parent: &SftpNode, name: &OsStr) -> Result<()> {
        let p = child(&parent.path, name)?;
        let c = self.ctx.conn()?;
        self.ctx.run(async {
            match c
                .call(|we, id| Ok(we.send_remove_request(id, (&*p).into())?.wait()))
                .await
            {
                Ok(()) => Ok(()),
                // unlink(2) of a directory.
                Err(Status::Failure) => match Self::kind_at(&c, &p).await {
                    Some(FileKind::Dir) => Err(Errno::EISDIR),
                    _ => Err(self.failure(&c).await),
                },
                Err(e) => Err(e.errno()),
            }
        })?
    }

    pub(crate) fn do_rmdir(&self, parent: &SftpNode, name: &OsStr) -> Result<()> {
        let p = child(&parent.path, name)?;
        let c = self.ctx.conn()?;
        self.ctx.run(async {
            match c
                .call(|we, id| Ok(we.send_rmdir_request(id, (&*p).into())?.wait()))
                .await
            {
                Ok(()) => Ok(()),
                // ENOTDIR reaches us as NO_SUCH_FILE, ENOTEMPTY as FAILURE.
                Err(e @ (Status::NoSuchFile | Status::Failure)) => {
                    match Self::kind_at(&c, &p).await {
                        Some(FileKind::Dir) if e == Status::Failure => Err(Errno(libc::ENOTEMPTY)),
                        Some(FileKind::Dir) => Err(Errno::ENOENT),
                        Some(_) => Err(Errno::ENOTDIR),
                        None => Err(Errno::ENOENT),
                    }
                }
                Err(e) => Err(e.errno()),
            }
        })?
    }

    /// rename(2) with `renameat2` flags. RENAME_NOREPLACE is sftp's own RENAME, which
    /// OpenSSH's server does as link + unlink for files (atomic: it fails if the new name
    /// exists) and as a check and rename(2) for directories; a plain rename is
    /// posix-rename@openssh.com (rename(2) on the server). RENAME_EXCHANGE cannot be done:
    /// EINVAL, as from a filesystem without it.
    pub(crate) fn do_rename(
        &self,
        parent: &SftpNode,
        name: &OsStr,
        newparent: &SftpNode,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return Err(Errno::EINVAL);
        }
        let from = child(&parent.path, name)?;
        let to = child(&newparent.path, newname)?;
        let c = self.ctx.conn()?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let posix = c.has(Extensions::POSIX_RENAME);
        self.ctx.run(async {
            let r = if noreplace || posix {
                c.call(|we, id| {
                    let (f, t) = ((&*from).into(), (&*to).into());
                    Ok(if noreplace {
                        we.send_rename_request(id, f, t)?.wait()
                    } else {
                        we.send_posix_rename_request(id, f, t)?.wait()
                    })
                })
                .await
            } else {
                // No posix-rename (not OpenSSH): sftp's RENAME refuses an existing new name,
                // so a file there is removed first (not atomic; docs/sftp.md).
                if Self::kind_at(&c, &to)
                    .await
                    .is_some_and(|k| k != FileKind::Dir)
                {
                    let _ = c
                        .call(|we, id| Ok(we.send_remove_request(id, (&*to).into())?.wait()))
                        .await;
                }
                c.call(|we, id| {
                    Ok(we
                        .send_rename_request(id, (&*from).into(), (&*to).into())?
                        .wait())
                })
                .await
            };
            let e = match r {
                Ok(()) => return Ok(()),
                Err(Status::BadMessage) => return Err(Errno::EINVAL),
                Err(e @ (Status::NoSuchFile | Status::Failure)) => e,
                Err(e) => return Err(e.errno()),
            };
            let (src, dst) = (Self::kind_at(&c, &from).await, Self::kind_at(&c, &to).await);
            Err(match (src, dst) {
                (None, _) => Errno::ENOENT,
                (Some(_), Some(_)) if noreplace => Errno(libc::EEXIST),
                (Some(FileKind::Dir), Some(FileKind::Dir)) => Errno(libc::ENOTEMPTY),
                (Some(FileKind::Dir), Some(_)) => Errno::ENOTDIR,
                (Some(_), Some(FileKind::Dir)) => Errno::EISDIR,
                _ if e == Status::NoSuchFile => Errno::ENOENT,
                _ => self.failure(&c).await,
            })
        })?
    }

    /// setattr: one SETSTAT (FSETSTAT through a handle) and the LSTAT of the result, sent
    /// together. sftp v3 sets atime and mtime together, in whole seconds; where only one is
    /// given, the other is read first. A symlink's owner and times are left alone (SETSTAT
    /// follows symlinks: it would change the target) and reported as they are.
    pub(crate) fn do_setattr(
        &self,
        node: &SftpNode,
        handle: Option<&SftpHandle>,
        set: &SetAttr,
    ) -> Result<Attr> {
        let p = &*node.path;
        if node.kind == Some(FileKind::Symlink) && handle.is_none() {
            return self.lstat(p);
        }
        let mut fa = FileAttrs::new();
        if let Some(s) = set.size {
            fa.set_size(s);
        }
        if let Some(m) = set.mode {
            fa.set_permissions(perms(m).get_permissions().unwrap_or_default());
        }
        if set.uid.is_some() || set.gid.is_some() {
            // -1: chown(2) leaves that one as it is.
            fa.set_id(set.uid.unwrap_or(u32::MAX), set.gid.unwrap_or(u32::MAX));
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let now = TimeSpec::now();
            let at = |t: TimeUpdate| match t {
                TimeUpdate::Now => now,
                TimeUpdate::Set(t) => t,
            };
            let (a, m) = match (set.atime, set.mtime) {
                (Some(a), Some(m)) => (at(a), at(m)),
                (a, m) => {
                    let cur = self.lstat(p)?;
                    (a.map_or(cur.atime, at), m.map_or(cur.mtime, at))
                }
            };
            fa.set_time(
                stamp(a).ok_or(Errno::EINVAL)?,
                stamp(m).ok_or(Errno(libc::EOVERFLOW))?,
            );
        }
        if let Some(h) = handle {
            h.drop_post();
        }
        let h = handle.map(|h| h.on(&self.ctx)).transpose()?;
        let c = match &h {
            Some((c, _)) => c.clone(),
            None => self.ctx.conn()?,
        };
        let (r, a) = self.ctx.run(c.pair(
            |we, id| {
                Ok(match &h {
                    Some((_, hd)) => we
                        .send_fsetstat_request(id, std::borrow::Cow::Borrowed(&***hd), fa)?
                        .wait(),
                    None => we.send_setstat_request(id, p.into(), fa)?.wait(),
                })
            },
            |we, id| Ok(we.send_lstat_request(id, p.into())?.wait()),
        ))?;
        match r {
            Ok(()) => Ok(attr(&a.map_err(Status::errno)?, p)),
            // Not the owner (chmod, chown, setting times): EPERM; no write permission (a
            // truncate, times set to now): EACCES.
            Err(Status::PermDenied)
                if set.mode.is_some()
                    || set.uid.is_some()
                    || set.gid.is_some()
                    || matches!(set.mtime, Some(TimeUpdate::Set(_))) =>
            {
                Err(Errno::EPERM)
            }
            Err(Status::Failure)
                if a.as_ref()
                    .is_ok_and(|a| a.get_filetype() == Some(FileType::Directory))
                    && set.size.is_some() =>
            {
                Err(Errno::EISDIR)
            }
            Err(Status::Failure) => Err(self.ctx.run(self.failure(&c))?),
            Err(e) => Err(e.errno()),
        }
    }
}
