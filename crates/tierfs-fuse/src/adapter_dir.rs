//! Listings through the FUSE adapter: OPENDIR (the kernel keeps a directory's entries in
//! its page cache while the names are unchanged), READDIR, and READDIRPLUS pages filled from
//! the metadata cache on the fuser thread when they can be. Apart from the `Filesystem` impl
//! (`adapter_ops`), which hands these requests here.

use crate::adapter::{dir_flags, errno, Adapter};
use crate::attr::kind;
use crate::plus::fill_plus_page;
use fuser::{FileHandle, INodeNo, ReplyDirectory, ReplyDirectoryPlus, ReplyOpen};
use tierfs_fs::Store;

impl<S: Store> Adapter<S> {
    pub(crate) fn open_dir(&self, ino: INodeNo, reply: ReplyOpen) {
        if let Some(d) = self.fs.opendir_fast(ino.0) {
            return reply.opened(FileHandle(d.fh), dir_flags(&d));
        }
        self.spawn(move |fs, _, _| match fs.opendir(ino.0) {
            Ok(d) => reply.opened(FileHandle(d.fh), dir_flags(&d)),
            Err(e) => reply.error(errno(e)),
        });
    }

    pub(crate) fn list_dir(&self, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let r = self.fs.readdir(fh.0, offset).map(|entries| {
            for e in entries.iter() {
                if reply.add(INodeNo(e.ino), e.next_offset, kind(e.kind), &e.name) {
                    break;
                }
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    pub(crate) fn list_dir_plus(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        // From the metadata cache right here when the entries are in it: a `grep -r` or
        // `find` then costs no thread hand-off per directory either.
        let ttl = self.ttls.attr.get().min(self.ttls.entry.get());
        let fs = &self.fs;
        // Listed for names first: the first page holds `.` and `..` only (a short page: the
        // kernel asks again from offset 2, with plain READDIR unless something looked a name
        // up in the directory meanwhile). Names cannot go out in READDIRPLUS without their
        // real attributes (docs/architecture/metadata.md, "Listings for names first").
        if offset == 0 && fs.lists_names_first() {
            if let Ok(page) = fs.readdir(fh.0, 0) {
                let dots = page.len().min(2);
                if let Some((dir_attr, _)) = fs.getattr_fast(ino.0) {
                    let _ = fill_plus_page(fs, reply, &page[..dots], dir_attr, ttl, |_| None);
                    return;
                }
                // The directory's own attributes from the store, on a worker: the short
                // page still, or the page below would look up (and so stat) every entry.
                self.spawn(move |fs, _, _| match fs.getattr(ino.0) {
                    Ok(dir_attr) => {
                        let _ = fill_plus_page(fs, reply, &page[..dots], dir_attr, ttl, |_| None);
                    }
                    Err(e) => reply.error(errno(e)),
                });
                return;
            }
        }
        let reply = match (fs.readdir(fh.0, offset), fs.getattr_fast(ino.0)) {
            (Ok(entries), Some((dir_attr, _))) => {
                match fill_plus_page(fs, reply, &entries, dir_attr, ttl, |name| {
                    fs.lookup_fast(ino.0, name, 0)
                }) {
                    Ok(()) => return,
                    Err(reply) => reply,
                }
            }
            _ => reply,
        };
        self.spawn(move |fs, _, _| {
            let entries = match fs.readdir(fh.0, offset) {
                Ok(e) => e,
                Err(e) => return reply.error(errno(e)),
            };
            let dir_attr = match fs.getattr(ino.0) {
                Ok(a) => a,
                Err(e) => return reply.error(errno(e)),
            };
            // `lookup` always answers here, so the reply is never handed back.
            let _ = fill_plus_page(fs, reply, &entries, dir_attr, ttl, |name| {
                Some(fs.lookup(ino.0, name))
            });
        });
    }
}
