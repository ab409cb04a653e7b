//! Replay of one CREATE record (`ns_replay`): the object made on the store, or, when the name
//! is taken, whether what holds it is the object this create made before the crash (an empty
//! regular file, a directory, a symlink to the same target, a special file of the same kind
//! and device number) or someone else's.

use super::ns_record::is_special;
use crate::shared::{Node, St};
use std::ffi::OsStr;
use tierfs_store::{Errno, FileKind, Owner, Store};

/// Makes `name` in `pnode` as the record says. Ok(true): made, now or before the crash;
/// Ok(false): the name holds someone else's object; Err: the store's error and what was
/// being done.
#[allow(clippy::too_many_arguments)]
pub(super) fn make<S: Store>(
    store: &St<S>,
    pnode: &Node<S>,
    name: &OsStr,
    kind: FileKind,
    mode: u32,
    owner: Owner,
    target: &OsStr,
    rdev: u64,
) -> Result<bool, (Errno, &'static str)> {
    let r = match kind {
        FileKind::Dir => store.mkdir(pnode, name, mode, owner).map(|_| ()),
        FileKind::Symlink => store.symlink(pnode, name, target, owner).map(|_| ()),
        k if is_special(k) => store.mknod(pnode, name, mode, rdev, owner).map(|_| ()),
        _ => store
            .create(
                pnode,
                name,
                mode,
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                owner,
            )
            .map(|_| ()),
    };
    match r {
        Ok(()) => Ok(true),
        Err(e) if e == Errno(libc::EEXIST) => Ok(match store.lookup(pnode, name) {
            Ok((_, a)) if kind == FileKind::Dir => a.kind == FileKind::Dir,
            Ok((node, a)) if kind == FileKind::Symlink => {
                a.kind == FileKind::Symlink
                    && match store.readlink(&node) {
                        Ok(got) => got == target,
                        Err(e) => return Err((e, "reading")),
                    }
            }
            Ok((_, a)) if is_special(kind) => a.kind == kind && a.rdev == rdev,
            Ok((_, a)) => a.kind == FileKind::File && a.size == 0,
            Err(_) => false,
        }),
        Err(e) => Err((e, "creating")),
    }
}
