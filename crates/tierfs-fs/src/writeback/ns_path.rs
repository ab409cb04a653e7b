//! Backing paths as the journal's records name them (relative to the backing root, `/`
//! between components): joined, split into directory and name, compared.

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
