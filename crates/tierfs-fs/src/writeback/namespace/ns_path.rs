//! Backing paths as the journal's records name them (relative to the backing root, `/`
//! between components): joined, split into directory and name, compared, and resolved on the
//! store (replay and the namespace flusher both do).

use crate::shared::{Node, St};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use tierfs_store::Store;

/// `parent`/`name` (`name` alone in the root).
pub(super) fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = parent.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Whether `path` is `r` or lies under it.
pub(super) fn under(path: &[u8], r: &[u8]) -> bool {
    path == r || (path.len() > r.len() && path.starts_with(r) && path[r.len()] == b'/')
}

/// The directory and the name of `path` (the root: empty).
pub(super) fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[][..], path),
    }
}

/// Resolves a backing path from the root, one component at a time (never following
/// symlinks: the store's lookup does not).
pub(crate) fn open_by_path<S: Store>(
    store: &St<S>,
    path: &[u8],
) -> tierfs_store::Result<(Node<S>, tierfs_store::Attr)> {
    let (mut node, mut attr) = store.root()?;
    for comp in path.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        let (n, a) = store.lookup(&node, OsStr::from_bytes(comp))?;
        node = n;
        attr = a;
    }
    Ok((node, attr))
}
