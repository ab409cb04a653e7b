//! Listings and bulk stats. A READDIR page carries every entry's attributes (OpenSSH's
//! sftp-server LSTATs each entry itself), so a listing is a whole directory revalidated, and
//! several READDIRs of one handle are kept in flight (each answers the next page; a page
//! after the last answers EOF), so 10,000 entries take a few round trips, not a hundred.
//! `stat_names` sends all its LSTATs at once.

use crate::attrs::{attr, path_ino};
use crate::conn::Id;
use crate::ctx::child;
use crate::errors::Status;
use crate::store::{SftpNode, SftpStore};
use openssh_sftp_client_lowlevel::NameEntry;
use std::borrow::Cow;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use tierfs_store::{Attr, DirEntry, Errno, Result, StatFs};

/// READDIRs of one directory in flight at once.
const PAGES_IN_FLIGHT: usize = 4;

impl SftpStore {
    /// Every entry of `node` but `.` and `..`, with its attributes.
    pub(crate) fn list(&self, node: &SftpNode) -> Result<Vec<(DirEntry, Attr)>> {
        let c = self.ctx.conn()?;
        let p = &*node.path;
        let h = self
            .ctx
            .run(c.call(|we, id| Ok(we.send_opendir_request(id, p.into())?.wait())))?
            .map_err(|e| match e {
                // opendir(3) of a file.
                Status::Failure => Errno::ENOTDIR,
                e => e.errno(),
            })?;
        let mut out = Vec::new();
        let r = self.ctx.run(async {
            loop {
                let mut pages: Vec<Box<[NameEntry]>> = Vec::new();
                let mut err = None;
                c.pipeline(
                    PAGES_IN_FLIGHT,
                    |_, we, id: Id| Ok(we.send_readdir_request(id, Cow::Borrowed(&*h))?.wait()),
                    |_, r| match r {
                        Ok(page) => pages.push(page),
                        Err(e) => {
                            err.get_or_insert(e);
                        }
                    },
                )
                .await?;
                if let Some(e) = err {
                    return Err(e);
                }
                // An empty page is the EOF status.
                let done = pages.iter().any(|pg| pg.is_empty());
                for e in pages.iter().flat_map(|pg| pg.iter()) {
                    let name = e.filename.as_os_str();
                    if name == "." || name == ".." || name.as_bytes().contains(&b'/') {
                        continue;
                    }
                    let path = p.join(name);
                    let a = attr(&e.attrs, &path);
                    out.push((
                        DirEntry {
                            name: name.to_os_string(),
                            dev: 0,
                            ino: path_ino(&path),
                            kind: Some(a.kind),
                        },
                        a,
                    ));
                }
                if done {
                    return Ok(());
                }
            }
        });
        c.send_detached(|we, id| Ok(we.send_close_request(id, Cow::Borrowed(&*h))?.wait()));
        r?.map_err(Status::errno)?;
        Ok(out)
    }

    /// The attributes of `names` in `node`, every LSTAT in flight at once (up to
    /// `sftp.max_in_flight`); asked again on a new connection if the connection died under
    /// them (an answer lost so must not read as "gone"). None where a name is not there, or
    /// where the server cannot be reached at all.
    pub(crate) fn do_stat_names(&self, node: &SftpNode, names: &[OsString]) -> Vec<Option<Attr>> {
        self.ctx
            .again(|| self.stat_names_once(node, names))
            .unwrap_or_else(|_| vec![None; names.len()])
    }

    fn stat_names_once(&self, node: &SftpNode, names: &[OsString]) -> Result<Vec<Option<Attr>>> {
        let mut out = vec![None; names.len()];
        let mut lost = false;
        let c = self.ctx.conn()?;
        let paths: Vec<_> = names.iter().map(|n| child(&node.path, n).ok()).collect();
        // A name that cannot be a child is asked as the directory itself and dropped.
        self.ctx
            .run(c.pipeline(
                names.len(),
                |i, we, id| {
                    let p = paths[i].as_deref().unwrap_or(&node.path);
                    Ok(we.send_lstat_request(id, p.into())?.wait())
                },
                |i, r| match (r, &paths[i]) {
                    (Ok(a), Some(p)) => out[i] = Some(attr(&a, p)),
                    (Err(Status::Local(Errno::ENOTCONN)), _) => lost = true,
                    _ => {}
                },
            ))?
            .map_err(Status::errno)?;
        if lost {
            return Err(Errno::ENOTCONN);
        }
        Ok(out)
    }

    /// statvfs@openssh.com of the directory served; a server without it: a large, empty
    /// filesystem (as sshfs shows).
    pub(crate) fn do_statfs(&self) -> Result<StatFs> {
        let c = self.ctx.conn()?;
        if !c.has(openssh_sftp_client_lowlevel::Extensions::STATVFS) {
            return Ok(StatFs {
                blocks: 1 << 30,
                bfree: 1 << 30,
                bavail: 1 << 30,
                files: 1 << 30,
                ffree: 1 << 30,
                bsize: 4096,
                namelen: 255,
                frsize: 4096,
            });
        }
        let root = &*self.ctx.root;
        let v = self
            .ctx
            .run(c.call(|we, id| Ok(we.send_statvfs_request(id, root.into())?.wait())))?
            .map_err(Status::errno)?;
        Ok(StatFs {
            blocks: v.blocks,
            bfree: v.bfree,
            bavail: v.bavail,
            files: v.files,
            ffree: v.ffree,
            bsize: v.bsize as u32,
            namelen: v.namemax.min(255) as u32,
            frsize: v.frsize as u32,
        })
    }
}
