//! READDIRPLUS pages: directory entries with their attributes, so that `ls -l`, `find` or
//! `du` after a listing cost no LOOKUP per entry. Every entry carries the object's real
//! attributes: blank ones with zero timeouts race the kernel's LOOKUP of the same name and
//! can win over its real answer (docs/architecture/metadata.md, "Listings for names first").

use crate::attr::file_attr;
use fuser::{Generation, INodeNo, ReplyDirectoryPlus};
use std::ffi::OsStr;
use std::time::Duration;
use tierfs_fs::{Attr, DirEntryOut, Entry, Fs, Result, Store};

/// Fills `reply` from `entries` (a directory handle's entries from the kernel's offset on),
/// looking each one up with `lookup` only when it is about to be added: the kernel's buffer
/// holds some 200 entries (a 32 KiB `getdents`), and looking up the whole rest of the
/// directory for every page, to give back what did not fit, was O(n^2) lookups and forgets
/// (the `getdents` of 1,000 entries over sshfs: 8-14 ms before, 6-7 ms since).
///
/// The kernel takes a lookup reference on every entry added but `.` and `..`; one looked up
/// but not added (the buffer was full) gives its reference back. An entry whose lookup fails
/// is skipped (gone since opendir). If `lookup` cannot answer without I/O (None): with nothing
/// added yet the reply is handed back (`Err`) for the caller to answer from a thread that may
/// do I/O; otherwise the page ends there (a short page is fine: the kernel asks again from
/// the next offset).
pub(crate) fn fill_plus_page<S: Store>(
    fs: &Fs<S>,
    mut reply: ReplyDirectoryPlus,
    entries: &[DirEntryOut],
    dir_attr: Attr,
    ttl: Duration,
    mut lookup: impl FnMut(&OsStr) -> Option<Result<Entry>>,
) -> std::result::Result<(), ReplyDirectoryPlus> {
    let mut added_any = false;
    for e in entries {
        if e.name == "." || e.name == ".." {
            if add(&mut reply, e, &dir_attr, Duration::ZERO) {
                break;
            }
            added_any = true;
            continue;
        }
        match lookup(&e.name) {
            Some(Ok(entry)) => {
                let t = ttl.min(entry.valid);
                if add(&mut reply, e, &entry.attr, t) {
                    fs.forget(entry.attr.ino, 1);
                    break;
                }
                added_any = true;
            }
            Some(Err(_)) => continue,
            None if !added_any => return Err(reply),
            None => break,
        }
    }
    reply.ok();
    Ok(())
}

/// Adds one entry; true if it did not fit (the buffer is full).
fn add(reply: &mut ReplyDirectoryPlus, e: &DirEntryOut, attr: &Attr, ttl: Duration) -> bool {
    reply.add(
        INodeNo(attr.ino),
        e.next_offset,
        &e.name,
        &ttl,
        &file_attr(attr),
        Generation(0),
    )
}
