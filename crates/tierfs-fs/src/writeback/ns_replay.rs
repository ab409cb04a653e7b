//! Replay of the journal's namespace records at start, in journal order, before its data
//! records (which may name the files they create). Each is applied so that applying it
//! twice is harmless: a crash may come after the store did it and before its DONE was
//! recorded.
//!
//! - A create finding the name taken by an empty regular file (or a mkdir finding a
//!   directory) takes it for its own, made before the crash: until the create's DONE is
//!   recorded no data of the file is written (see `ns`), so ours is empty. Anything else
//!   there is someone else's: a conflict. Our file is not made, and its data goes to
//!   `lost/` (never written into theirs, never dropped).
//! - A setattr of a path that is gone is skipped, with a log line.
//! - A store that fails (gone, full) fails the mount, as for data records: nothing is lost,
//!   the next mount tries again.

use super::ns_record::NsOp;
use super::stats::WbCounters;
use crate::shared::St;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;
use tierfs_cache::journal::{Journal, PendingNs, NS_KEY};
use tierfs_store::{Errno, FileKind, Store};

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = parent.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Whether `path` is `r` or lies under it.
fn under(path: &[u8], r: &[u8]) -> bool {
    path == r || (path.len() > r.len() && path.starts_with(r) && path[r.len()] == b'/')
}

/// Applies the pending namespace records; returns the paths of the objects the store refused
/// (their data records go to `lost/`).
pub(crate) fn replay_ns<S: Store>(
    store: &St<S>,
    journal: &Journal,
    pending: &[PendingNs],
    c: &WbCounters,
) -> std::result::Result<Vec<Vec<u8>>, String> {
    let mut refused: Vec<Vec<u8>> = Vec::new();
    let mut dirs: Vec<Vec<u8>> = Vec::new();
    let Some(last) = pending.last().map(|p| p.seq) else {
        return Ok(refused);
    };
    eprintln!(
        "tierfs: replaying {} namespace operations from the write-back journal...",
        pending.len()
    );
    let fail = |what: &str, path: &[u8], e: Errno| {
        format!(
            "replaying the write-back journal: {what} {}: {e}",
            String::from_utf8_lossy(path)
        )
    };
    for p in pending {
        let op = match NsOp::decode(&p.payload) {
            Ok(op) => op,
            Err(why) => {
                tracing::error!(
                    "write-back replay: namespace record {} unreadable: {why}; skipped",
                    p.seq
                );
                continue;
            }
        };
        tracing::debug!("write-back replay: namespace record {}: {op:?}", p.seq);
        match &op {
            NsOp::Create {
                parent,
                name,
                kind,
                mode,
                owner,
            } => {
                let path = join(parent, name);
                if refused.iter().any(|r| under(parent, r)) {
                    refused.push(path);
                    continue;
                }
                let pnode = match super::replay::open_by_path(store, parent) {
                    Ok((n, _)) => n,
                    Err(e) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => {
                        tracing::error!(
                            "write-back replay: {} cannot be created: its directory is gone ({e}); its data is kept under lost/",
                            String::from_utf8_lossy(&path)
                        );
                        c.ns_conflicts.fetch_add(1, Relaxed);
                        refused.push(path);
                        continue;
                    }
                    Err(e) => return Err(fail("looking up", parent, e)),
                };
                let n = OsStr::from_bytes(name);
                let r = match kind {
                    FileKind::Dir => store.mkdir(&pnode, n, *mode, *owner).map(|_| ()),
                    _ => store
                        .create(
                            &pnode,
                            n,
                            *mode,
                            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                            *owner,
                        )
                        .map(|_| ()),
                };
                match r {
                    Ok(()) => {}
                    Err(e) if e == Errno(libc::EEXIST) => {
                        let ours = match store.lookup(&pnode, n) {
                            Ok((_, a)) if *kind == FileKind::Dir => a.kind == FileKind::Dir,
                            Ok((_, a)) => a.kind == FileKind::File && a.size == 0,
                            Err(_) => false,
                        };
                        if !ours {
                            tracing::error!(
                                "write-back replay: {} was created on the store by someone else before ours: theirs is kept, ours (its data) goes under lost/",
                                String::from_utf8_lossy(&path)
                            );
                            c.ns_conflicts.fetch_add(1, Relaxed);
                            refused.push(path);
                            continue;
                        }
                    }
                    Err(e) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => {
                        c.ns_conflicts.fetch_add(1, Relaxed);
                        refused.push(path);
                        continue;
                    }
                    Err(e) => return Err(fail("creating", &path, e)),
                }
                if !dirs.contains(parent) {
                    dirs.push(parent.clone());
                }
            }
            NsOp::SetAttr { path, .. } => {
                if refused.iter().any(|r| under(path, r)) {
                    continue;
                }
                let Some(set) = op.set_attr() else { continue };
                match super::replay::open_by_path(store, path) {
                    Ok((node, _)) => match store.setattr(&node, None, &set) {
                        Ok(_) => {}
                        Err(e) if e == Errno::ENOENT => {}
                        Err(e) => return Err(fail("setting attributes of", path, e)),
                    },
                    Err(e) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => {
                        tracing::warn!(
                            "write-back replay: {} is gone; its attributes were not set",
                            String::from_utf8_lossy(path)
                        );
                    }
                    Err(e) => return Err(fail("looking up", path, e)),
                }
            }
        }
        c.ns_replayed.fetch_add(1, Relaxed);
    }
    for d in &dirs {
        let (node, _) =
            super::replay::open_by_path(store, d).map_err(|e| fail("looking up", d, e))?;
        store
            .fsyncdir(&node, false)
            .map_err(|e| fail("syncing", d, e))?;
    }
    journal
        .done(NS_KEY.0, NS_KEY.1, last)
        .and_then(|_| journal.sync_all())
        .map_err(|e| format!("write-back journal: {e}"))?;
    Ok(refused)
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths() {
        assert_eq!(super::join(b"", b"a"), b"a");
        assert_eq!(super::join(b"a/b", b"c"), b"a/b/c");
        assert!(super::under(b"a/b/c", b"a/b"));
        assert!(super::under(b"a/b", b"a/b"));
        assert!(!super::under(b"a/bc", b"a/b"));
        assert!(!super::under(b"a", b"a/b"));
    }
}
