//! Replay of the journal's namespace records at start, in journal order, before its data
//! records (which may name the files they create). Each is applied so that applying it
//! twice is harmless: a crash may come after the store did it and before its DONE was
//! recorded.
//!
//! - A create finding the name taken by an empty regular file (a mkdir a directory, a
//!   symlink a symlink to the same target, a mknod the same kind and device) takes it for
//!   its own, made before the crash: until the create's DONE is recorded no data of the file
//!   is written (see `ns`), so ours is empty. Anything else there is someone else's: a
//!   conflict. Our file is not made, and its data goes to `lost/` (never written into
//!   theirs, never dropped).
//! - A setattr of a path that is gone is skipped, with a log line.
//! - An unlink removes what its create made in this replay (an empty regular file, or an
//!   object of its kind), and the file's data records are dropped: it was unlinked before it reached
//!   the store. Without its CREATE record (covered by a DONE, and withdrawn: never applied)
//!   whatever the name holds is someone else's and stays.
//! - A create is made under the last name the pending renames of it give it: a deferred
//!   rename rewrote the queued create (`ns_rename`), so the flusher made it there too, and
//!   the name it had may be another object's by now. A rename then has nothing left to do.
//!   A deferred link (`ns_link`) rewrote it the same way; its replay then links the old
//!   name to the new one, unless an UNALIAS says the application unlinked it first.
//!   Setattrs recorded under an earlier name follow it. Data records of the file go to where
//!   the last pending CREATE or RENAME put it.
//! - A store that fails (gone, full) fails the mount, as for data records: nothing is lost,
//!   the next mount tries again.

use super::ns_path::{join, split, under};
use super::ns_record::NsOp;
use super::stats::WbCounters;
use crate::shared::St;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;
use tierfs_cache::journal::{Journal, PendingNs, NS_KEY};
use tierfs_store::{Errno, FileKind, Store};

/// What the replay of the namespace records says of the data records.
#[derive(Debug, Default)]
pub(crate) struct NsReplayed {
    /// The paths of the objects the store refused: their data records go to `lost/`.
    pub refused: Vec<Vec<u8>>,
    /// The same for provisional files, by the seq of their CREATE (a refused path may be
    /// another file's later: names freed by deferred renames and unlinks are used again).
    pub refused_prov: rustc_hash::FxHashSet<u64>,
    /// Provisional files unlinked before they reached the store (by the seq of their
    /// CREATE, their journal key's inode part): their data records are dropped.
    pub dropped: rustc_hash::FxHashSet<u64>,
    /// Where provisional files made or renamed by a pending record are now (by the seq of
    /// their CREATE): their data records go there, whatever path the last of them names.
    pub moved: rustc_hash::FxHashMap<u64, Vec<u8>>,
    /// Files a pending truncate emptied (`ns_chattr`), by journal key: the seq of the last
    /// such record. Their data records before it are not written (the truncate made them moot).
    pub truncated: rustc_hash::FxHashMap<(u64, u64), u64>,
}

/// Where an object named by a record is after the pending renames that follow it.
enum Follow {
    /// Where the record says.
    Same,
    /// Moved there by a deferred rename.
    Moved(Vec<u8>),
    /// Replaced by a rename over its name before it reached the store.
    Replaced,
}

/// Applies the pending namespace records.
pub(crate) fn replay_ns<S: Store>(
    store: &St<S>,
    journal: &Journal,
    pending: &[PendingNs],
    c: &WbCounters,
) -> std::result::Result<NsReplayed, String> {
    let mut refused: Vec<Vec<u8>> = Vec::new();
    let mut dropped: rustc_hash::FxHashSet<u64> = Default::default();
    let mut moved: rustc_hash::FxHashMap<u64, Vec<u8>> = Default::default();
    let mut truncated: rustc_hash::FxHashMap<(u64, u64), u64> = Default::default();
    // Provisional objects this replay made from their CREATE records (by its seq).
    let mut made_now: rustc_hash::FxHashSet<u64> = Default::default();
    let mut dirs: Vec<Vec<u8>> = Vec::new();
    let mut refused_prov: rustc_hash::FxHashSet<u64> = Default::default();
    // What the pending records do to names, in journal order: a deferred rename rewrote the
    // create of what it renamed (`ns_rename`), so the flusher made the object under its
    // last name, and so does this replay; a setattr recorded under an earlier name follows.
    // A rename over an object write-back made (and withdrew) replaces it: that object is
    // not made, and what was recorded for it under the name does not reach the new one.
    enum Naming {
        Renamed {
            from: Vec<u8>,
            to: Vec<u8>,
            prov: u64,
            over: bool,
        },
        /// A create of the name, or (`gone`) an unlink of what held it.
        Other(Vec<u8>, bool),
    }
    let naming: Vec<(u64, Naming)> = pending
        .iter()
        .filter_map(|p| {
            let n = match NsOp::decode(&p.payload).ok()? {
                NsOp::Rename {
                    from,
                    to,
                    prov,
                    replaced,
                } => Naming::Renamed {
                    from,
                    to,
                    prov,
                    over: replaced.is_some(),
                },
                // The create makes the new name (the old one is linked to it after).
                NsOp::Link { from, to, prov } => Naming::Renamed {
                    from,
                    to,
                    prov,
                    over: false,
                },
                NsOp::Unlink { path, .. } | NsOp::Remove { path, .. } => Naming::Other(path, true),
                NsOp::Create { parent, name, .. } => Naming::Other(join(&parent, &name), false),
                // Applied in its place in the order, on names the store has: nothing to
                // follow.
                NsOp::SetAttr { .. } | NsOp::Move { .. } | NsOp::Unalias { .. } => return None,
            };
            Some((p.seq, n))
        })
        .collect();
    // The name the object called `path` after record `seq` has at the end of the pending
    // renames, if they moved it (until an unlink or create of the name it has, which says
    // the object went or the name is another's).
    // Only a path some pending rename moves from, or a rename over or an unlink takes from
    // its object, needs the walk (a replay of an untar has tens of thousands of setattrs
    // and, as a rule, none of these).
    let mut renamed_from: rustc_hash::FxHashSet<&[u8]> = Default::default();
    for (_, n) in &naming {
        match n {
            Naming::Renamed { from, to, over, .. } => {
                renamed_from.insert(from);
                if *over {
                    renamed_from.insert(to);
                }
            }
            Naming::Other(p, true) => {
                renamed_from.insert(p);
            }
            Naming::Other(_, false) => {}
        }
    }
    let renamed_to = |seq: u64, path: &[u8]| -> Follow {
        if !renamed_from.contains(path) {
            return Follow::Same;
        }
        let mut cur = path.to_vec();
        let mut found = false;
        let after = naming.partition_point(|(s, _)| *s <= seq);
        for (_, n) in &naming[after..] {
            match n {
                Naming::Renamed { from, to, .. } if *from == cur => {
                    cur = to.clone();
                    found = true;
                }
                Naming::Renamed { to, over: true, .. } if *to == cur => return Follow::Replaced,
                // Unlinked later: nothing to set (what holds the name after is another's).
                Naming::Other(p, true) if *p == cur => return Follow::Replaced,
                Naming::Other(p, false) if *p == cur => break,
                _ => {}
            }
        }
        if found {
            Follow::Moved(cur)
        } else {
            Follow::Same
        }
    };
    // The creates that a pending rename replaced or a pending unlink removed (withdrawn
    // before the flusher took them): never made, so that nothing made for them takes the
    // name from what holds it later (a file renamed there would find an empty file and take
    // it for its own, which the unlink's replay then removed).
    let replaced: rustc_hash::FxHashSet<u64> = pending
        .iter()
        .filter_map(|p| match NsOp::decode(&p.payload).ok()? {
            NsOp::Rename { replaced, .. } => replaced,
            NsOp::Unlink { prov, .. } => Some(prov),
            _ => None,
        })
        .collect();
    // The last name a provisional object's pending renames give it, by its CREATE's seq.
    let mut last_name: rustc_hash::FxHashMap<u64, Vec<u8>> = Default::default();
    for (_, n) in &naming {
        if let Naming::Renamed { to, prov, .. } = n {
            last_name.insert(*prov, to.clone());
        }
    }
    // The seq of the last pending record that makes each path ours again (a CREATE under
    // the last name its renames give it, a RENAME, a MOVE): see MOVE.
    let mut last_create: rustc_hash::FxHashMap<Vec<u8>, u64> = Default::default();
    if pending.iter().any(|p| {
        let op = p.payload.get(1).copied();
        op == Some(super::ns_record::OP_MOVE) || op == Some(super::ns_record::OP_MOVE_OVER)
    }) {
        for p in pending {
            let path = match NsOp::decode(&p.payload) {
                Ok(NsOp::Create { parent, name, .. }) => last_name
                    .get(&p.seq)
                    .cloned()
                    .unwrap_or_else(|| join(&parent, &name)),
                Ok(NsOp::Rename { to, .. })
                | Ok(NsOp::Move { to, .. })
                | Ok(NsOp::Link { to, .. }) => to,
                _ => continue,
            };
            last_create.insert(path, p.seq);
        }
    }
    // Pending MOVEs (seq, from, to): a REMOVE of a name a later MOVE fills (`rm f; mv
    // f.tmp f`) may have been applied with the MOVE before the crash.
    let moves: Vec<(u64, Vec<u8>, Vec<u8>)> = pending
        .iter()
        .filter_map(|p| match NsOp::decode(&p.payload).ok()? {
            NsOp::Move { from, to, .. } => Some((p.seq, from, to)),
            _ => None,
        })
        .collect();
    let replacing = super::ns_replace::pending_replaces(pending);
    // LINK records whose alias a pending UNALIAS withdrew: never linked on the store.
    let unaliased: rustc_hash::FxHashSet<u64> = pending
        .iter()
        .filter_map(|p| match NsOp::decode(&p.payload).ok()? {
            NsOp::Unalias { link, .. } => Some(link),
            _ => None,
        })
        .collect();
    let Some(last) = pending.last().map(|p| p.seq) else {
        return Ok(NsReplayed::default());
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
            NsOp::Create { .. } if replaced.contains(&p.seq) => {
                // Replaced or removed before it reached the store: never made (its UNLINK
                // drops its data records).
                dropped.insert(p.seq);
            }
            NsOp::Create {
                parent,
                name,
                kind,
                mode,
                owner,
                target,
                rdev,
            } => {
                // Made under the last name its pending renames give it, in the directory
                // they give it, as the flusher made it (that directory's mkdir, if deferred,
                // is an earlier record: `Writeback::rename_deferred`).
                let path = last_name
                    .get(&p.seq)
                    .cloned()
                    .unwrap_or_else(|| join(parent, name));
                let (parent, name) = split(&path);
                let (parent, name) = (&parent.to_vec(), &name.to_vec());
                if refused.iter().any(|r| under(parent, r)) {
                    refused.push(path);
                    refused_prov.insert(p.seq);
                    continue;
                }
                let pnode = match super::ns_path::open_by_path(store, parent) {
                    Ok((n, _)) => n,
                    Err(e) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => {
                        tracing::error!(
                            "write-back replay: {} cannot be created: its directory is gone ({e}); its data is kept under lost/",
                            String::from_utf8_lossy(&path)
                        );
                        c.ns_conflicts.fetch_add(1, Relaxed);
                        refused.push(path);
                        refused_prov.insert(p.seq);
                        continue;
                    }
                    Err(e) => return Err(fail("looking up", parent, e)),
                };
                let n = OsStr::from_bytes(name);
                let t = OsStr::from_bytes(target);
                if let Some((to, v)) = replacing.get(&p.seq) {
                    // Renamed over a file of the store by a pending MOVE OVER, whose flusher
                    // writes the file's data before its create's DONE (`ns_replace`).
                    match super::ns_replace::replay_made(store, &pnode, n, *kind, to, *v) {
                        Ok(Some(at)) => {
                            made_now.insert(p.seq);
                            moved.insert(p.seq, at);
                            continue;
                        }
                        Ok(None) => {}
                        Err(e) => return Err(fail("looking up", &path, e)),
                    }
                }
                match super::ns_replay_make::make(store, &pnode, n, *kind, *mode, *owner, t, *rdev)
                {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::error!(
                            "write-back replay: {} was created on the store by someone else before ours: theirs is kept, ours (its data) goes under lost/",
                            String::from_utf8_lossy(&path)
                        );
                        c.ns_conflicts.fetch_add(1, Relaxed);
                        refused.push(path);
                        refused_prov.insert(p.seq);
                        continue;
                    }
                    Err((e, _)) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => {
                        c.ns_conflicts.fetch_add(1, Relaxed);
                        refused.push(path);
                        refused_prov.insert(p.seq);
                        continue;
                    }
                    Err((e, what)) => return Err(fail(what, &path, e)),
                }
                if !dirs.contains(parent) {
                    dirs.push(parent.clone());
                }
                made_now.insert(p.seq);
                moved.insert(p.seq, path);
            }
            NsOp::SetAttr {
                path: recorded,
                of,
                size,
                ..
            } => {
                if let Some((_, key)) = size {
                    truncated.insert(*key, p.seq);
                }
                let Some(set) = op.set_attr() else { continue };
                // Recorded under a name the object left by a deferred rename: it is under the
                // last one (whatever holds the old name now is another object).
                let path = match renamed_to(p.seq, recorded) {
                    Follow::Moved(to) => to,
                    Follow::Same => recorded.clone(),
                    // Set on an object a rename replaced or an unlink removed: not on what
                    // holds its name now.
                    Follow::Replaced => continue,
                };
                let path = &path;
                // Where it is now was refused (someone else's object is there): not theirs
                // to change.
                if refused.iter().any(|r| under(path, r)) {
                    continue;
                }
                let found = super::ns_path::open_by_path(store, path);
                match found {
                    // Of an object of the store (`ns_chattr`) whose name now holds another:
                    // not ours to change.
                    Ok((_, a))
                        if of.is_some_and(|(kind, id)| {
                            !super::ns_remove::same_object(&a, kind, id, a.size)
                        }) =>
                    {
                        tracing::warn!(
                            "write-back replay: {} holds another object than the one whose \
                             attributes were set; left as it is",
                            String::from_utf8_lossy(path)
                        );
                        c.ns_conflicts.fetch_add(1, Relaxed);
                    }
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
            NsOp::Rename {
                to, prov, replaced, ..
            } => {
                // Nothing to do on the store: its CREATE, if pending, made the object under
                // its last name just now; if not, the flusher did before the crash. What it
                // replaced was never made (above), nor will its data be written.
                if let Some(r) = *replaced {
                    dropped.insert(r);
                    moved.remove(&r);
                }
                if !refused_prov.contains(prov) {
                    moved.insert(*prov, to.clone());
                }
            }
            NsOp::Link { from, to, prov } => {
                if refused_prov.contains(prov) || dropped.contains(prov) {
                    continue;
                }
                // Its data goes to the new name, which its create made (above, or before
                // the crash).
                moved.insert(*prov, to.clone());
                if unaliased.contains(&p.seq) {
                    continue;
                }
                match super::ns_link::replay_link(store, from, to) {
                    Ok(None) => {
                        let dir = split(from).0.to_vec();
                        if !dirs.contains(&dir) {
                            dirs.push(dir);
                        }
                    }
                    Ok(Some(why)) => {
                        tracing::warn!(
                            "write-back replay: {} was not linked to {}: {why}",
                            String::from_utf8_lossy(from),
                            String::from_utf8_lossy(to)
                        );
                        c.ns_conflicts.fetch_add(1, Relaxed);
                    }
                    Err(e) => return Err(fail("linking", from, e)),
                }
            }
            // Its LINK made nothing on the store (`unaliased`).
            NsOp::Unalias { .. } => {}
            NsOp::Move {
                from,
                to,
                prov,
                over,
            } => {
                if refused_prov.contains(prov) || dropped.contains(prov) {
                    continue;
                }
                // The name is used again by a later record of ours (a lock file made anew):
                // if both names are there, the move was applied before the crash.
                let reused = last_create.get(from.as_slice()).is_some_and(|s| *s > p.seq);
                match super::ns_move::replay_move(store, from, to, reused, *over) {
                    Ok(true) => {
                        let dir = split(from).0.to_vec();
                        if !dirs.contains(&dir) {
                            dirs.push(dir);
                        }
                        moved.insert(*prov, to.clone());
                    }
                    Ok(false) => {
                        c.ns_conflicts.fetch_add(1, Relaxed);
                        refused_prov.insert(*prov);
                    }
                    Err(e) => return Err(fail("renaming", from, e)),
                }
            }
            NsOp::Remove {
                path,
                kind,
                id,
                size,
            } => {
                let later = |s: &(u64, Vec<u8>, Vec<u8>)| s.0 > p.seq;
                let moves: Vec<&[u8]> = moves
                    .iter()
                    .filter(|m| later(m) && m.2 == *path)
                    .map(|m| m.1.as_slice())
                    .collect();
                match super::ns_remove::replay_remove(store, path, *kind, *id, *size, &moves) {
                    Ok(None) => {}
                    Ok(Some(why)) => {
                        tracing::warn!(
                            "write-back replay: {} was not removed: {why}; left as it is",
                            String::from_utf8_lossy(path)
                        );
                        c.ns_conflicts.fetch_add(1, Relaxed);
                    }
                    Err((what, at, e)) => return Err(fail(what, &at, e)),
                }
                let parent = split(path).0;
                if !dirs.iter().any(|d| d == parent) {
                    dirs.push(parent.to_vec());
                }
            }
            NsOp::Unlink { path, kind, prov } => {
                dropped.insert(*prov);
                moved.remove(prov);
                if refused.iter().any(|r| under(path, r)) || !made_now.contains(prov) {
                    // Only what this replay made is ours to remove: without its CREATE
                    // record (covered by a DONE), the create was withdrawn, never applied,
                    // and whatever the name holds is someone else's.
                    continue;
                }
                let (parent, name) = split(path);
                let n = OsStr::from_bytes(name);
                let pnode = match super::ns_path::open_by_path(store, parent) {
                    Ok((pnode, _)) => pnode,
                    Err(e) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => continue,
                    Err(e) => return Err(fail("looking up", parent, e)),
                };
                let ours = match store.lookup(&pnode, n) {
                    Ok((_, a)) if *kind != FileKind::File => a.kind == *kind,
                    Ok((_, a)) => a.kind == FileKind::File && a.size == 0,
                    Err(e) if e == Errno::ENOENT => continue,
                    Err(e) => return Err(fail("looking up", path, e)),
                };
                if !ours {
                    tracing::warn!(
                        "write-back replay: {} is not the object we made and unlinked: left as it is",
                        String::from_utf8_lossy(path)
                    );
                    continue;
                }
                let r = match kind {
                    FileKind::Dir => store.rmdir(&pnode, n),
                    _ => store.unlink(&pnode, n),
                };
                match r {
                    Ok(()) => {}
                    Err(e) if e == Errno::ENOENT => {}
                    Err(e) if e == Errno(libc::ENOTEMPTY) || e == Errno(libc::EEXIST) => {
                        tracing::warn!(
                            "write-back replay: {} has names in it that are not ours: left as it is",
                            String::from_utf8_lossy(path)
                        );
                    }
                    Err(e) => return Err(fail("removing", path, e)),
                }
                if !dirs.iter().any(|d| d == parent) {
                    dirs.push(parent.to_vec());
                }
            }
        }
        c.ns_replayed.fetch_add(1, Relaxed);
    }
    for d in &dirs {
        let node = match super::ns_path::open_by_path(store, d) {
            Ok((node, _)) => node,
            // Removed by a later record (an rmdir of a tree made and removed): its parent,
            // synced too, holds what is left of it.
            Err(e) if e == Errno::ENOENT || e == Errno(libc::ENOTDIR) => continue,
            Err(e) => return Err(fail("looking up", d, e)),
        };
        store
            .fsyncdir(&node, false)
            .map_err(|e| fail("syncing", d, e))?;
    }
    journal
        .done(NS_KEY.0, NS_KEY.1, last)
        .and_then(|_| journal.sync_all())
        .map_err(|e| format!("write-back journal: {e}"))?;
    Ok(NsReplayed {
        refused,
        refused_prov,
        dropped,
        moved,
        truncated,
    })
}

#[cfg(test)]
#[path = "ns_replay_tests.rs"]
pub(super) mod tests;
