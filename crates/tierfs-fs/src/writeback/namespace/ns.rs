//! Write-back of namespace operations (`writeback.namespace=back`, docs/writeback/namespace.md,
//! "Namespace write-back"): a create, mkdir, symlink or setattr of a new object, and an
//! unlink, rmdir or rename of one not sent yet, is checked locally, appended to the journal as an
//! NS record, applied to the provisional objects (`namespace::provisional`) and
//! acknowledged. One namespace flusher takes the records in journal order, a group at a
//! time, and applies them (`ns_apply`), those that do not depend on each other at once
//! (`ns_order`): each directory that got names in a group is synced once, then one DONE
//! covers the group. Only then are the objects it made published (their inodes take the
//! store's identity and node), so a file's data is never marked done in the journal before
//! the record that created it.
//!
//! Why journal order is enough: the application made the operations in that order, so a
//! directory comes before what is in it, and an operation that is not deferred (most
//! renames and unlinks, a create where the cache cannot tell the name is free) waits for
//! the flusher first (`drain`).

use super::applying::Removal;
use super::applying::{Applying, Made};
use super::ns_fold::FoldOut;
use super::ns_order::OrderIn;
use super::ns_queue::{Job, GROUP_MAX};

/// Objects made on the store and not yet published that the namespace flusher keeps at most
/// before it publishes directories with creates still queued in them (see `publish`): each
/// holds a descriptor, so as many as the inode table keeps nodes of files (4,096, fewer
/// under a low descriptor limit), and more than an untar of a large tree keeps at once.
fn kept_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| crate::inode::node_bound(4096))
}
use super::Writeback;
use crate::identity::Ident;
use crate::inode::Inode;
use crate::meta::ident;
use crate::namespace::is_provisional;
use crate::shared::{Node, St};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tierfs_cache::journal::NS_KEY;
use tierfs_store::{FileKind, Store};

/// What applying a group did: the last seq applied (None: nothing), the operations left for
/// a retry, and what waits for the group's DONE (removals, setattrs of the store's objects).
type GroupApplied<S> = (
    Option<u64>,
    Vec<Job<S>>,
    Vec<Removal<S>>,
    Vec<Arc<Inode<St<S>>>>,
);

impl<S: Store> Writeback<S> {
    pub(crate) fn spawn_ns_flusher(self: &Arc<Self>) -> std::io::Result<()> {
        let w = Arc::downgrade(self);
        let h = std::thread::Builder::new()
            .name("tierfs-nsflush".into())
            .spawn(move || Self::ns_flusher_loop(w))?;
        self.threads.lock().push(h);
        Ok(())
    }

    /// The namespace flusher: takes what is queued (up to [`GROUP_MAX`]), applies it in
    /// order, syncs each directory it touched once, records one DONE, publishes.
    fn ns_flusher_loop(weak: Weak<Writeback<S>>) {
        let mut made: Vec<(Ident, Made<S>)> = Vec::new();
        let mut backoff = Duration::ZERO;
        loop {
            let Some(wb) = weak.upgrade() else { return };
            let batch: Vec<Job<S>> = {
                let mut q = wb.nsq.q.lock();
                if q.is_empty() {
                    if wb.stop.load(Acquire) {
                        return;
                    }
                    wb.nsq.wake.wait_for(&mut q, Duration::from_millis(200));
                    continue;
                }
                if let Some(wait) = wb.gather_wait(&q) {
                    wb.nsq.wake.wait_for(&mut q, wait);
                    continue;
                }
                // Jobs of one record (a rename over queues a Drop and a Renamed under one
                // seq) go in one group: split, the DONE of the first would cover the
                // second's record while it is still queued, and a drain would return then.
                let mut n = q.len().min(GROUP_MAX);
                while n < q.len() && q[n].seq() == q[n - 1].seq() {
                    n += 1;
                }
                let b: Vec<Job<S>> = q.drain(..n).collect();
                *wb.nsq.in_flight.lock() = (b.len(), b.first().map(|j| j.at()));
                *wb.nsq.in_flight_ids.lock() = (
                    b.last().map_or(0, |j| j.seq()),
                    b.iter().map(|j| j.inode().id()).collect(),
                );
                b
            };
            let t = Instant::now();
            // The records in the journal before the store gets what they say: the store
            // must never hold a change a replay would not know of (a create made under the
            // name a deferred rename gave it, with the RENAME record lost, would leave the
            // new name empty beside the old one with the data).
            let last = batch.last().map_or(0, |j| j.seq());
            if let Err(e) = wb.journal.sync(last) {
                tracing::error!("write-back journal: {e}");
                wb.ns_failed(tierfs_store::Errno::EIO);
                let mut q = wb.nsq.q.lock();
                for j in batch.into_iter().rev() {
                    q.push_front(j);
                }
                drop(q);
                *wb.nsq.in_flight.lock() = (0, None);
                drop(wb);
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            let (done_upto, rest, removals, chattrs) = wb.apply_group(batch, &mut made);
            if rest.is_empty() {
                wb.ns.prov.stalled(None);
            } else {
                // Put back in front, in order: nothing after a failed operation goes first.
                // A create put back may be on the store already (made after the failure, or
                // before a directory sync that failed).
                let mut q = wb.nsq.q.lock();
                for mut j in rest.into_iter().rev() {
                    if let Job::Create { tried, .. } | Job::Linked { tried, .. } = &mut j {
                        *tried = true;
                    }
                    q.push_front(j);
                }
            }
            *wb.nsq.in_flight.lock() = (0, None);
            if let Some(upto) = done_upto {
                // Durable before anything goes on from it: once an object is published its
                // data may be flushed, and once a drain returns an operation not journaled
                // may change what the group made. A replay of the group's records after
                // either would take the changed objects for someone else's (a create finding
                // a file with data) or roll them back (a setattr).
                let durable = wb
                    .journal
                    .done(NS_KEY.0, NS_KEY.1, upto)
                    .and_then(|d| wb.journal.sync(d));
                if let Err(e) = durable {
                    tracing::error!("write-back journal: {e}");
                }
                // Removed names leave the cached listings before what the group made under
                // them joins it (`rm f; touch f`: the new f is learned by `publish`).
                wb.removals_done(removals, upto);
                // Setattrs of the store's objects stop being shown over it only now: until
                // the DONE is durable a replay may set them again, and a setattr done on the
                // store meanwhile must wait for them (`ns_chattr`).
                for i in &chattrs {
                    wb.chattr_applied(i);
                }
                wb.publish(&mut made);
                *wb.nsq.applied.lock() = upto;
                wb.nsq.applied_cv.notify_all();
                wb.c.ns_groups.fetch_add(1, Relaxed);
                let mut g = wb.nsq.group_ms.lock();
                if g.len() == 256 {
                    g.pop_front();
                }
                g.push_back(t.elapsed().as_millis() as u64);
                backoff = Duration::ZERO;
            } else {
                // Nothing could be applied: the store is gone or failing. Wait, then retry.
                backoff = (backoff * 2).clamp(Duration::from_millis(100), wb.cfg.retry_max);
                drop(wb);
                if !Writeback::ns_backoff(&weak, backoff) {
                    return;
                }
            }
        }
    }

    /// Applies `batch` until an operation fails for a reason that may pass, the operations
    /// that do not depend on each other at the same time (`ns_order`); syncs the directories
    /// that got names. Returns the last seq applied and durable (None if none) and the
    /// operations to try again: from the first one not applied on (in journal order), or all
    /// of them if a directory sync failed (applied again, they find their objects made, see
    /// `apply`); and the removals applied, whose namespace side waits for the DONE
    /// (`Writeback::removals_done`).
    fn apply_group(&self, batch: Vec<Job<S>>, made: &mut Vec<(Ident, Made<S>)>) -> GroupApplied<S> {
        let plan = super::ns_fold::fold(&batch.iter().map(Job::fold_in).collect::<Vec<_>>());
        let threads = self.cfg.namespace_threads.max(1);
        let before = made.len();
        let state = Mutex::new(Applying {
            made: std::mem::take(made),
            dirs: Vec::new(),
            removals: Vec::new(),
        });
        let failed_at = if threads == 1 {
            // In journal order, stopping at the first failure.
            (0..batch.len())
                .find(|&k| !self.apply_logged(&batch[k], &plan[k], &state))
                .unwrap_or(batch.len())
        } else {
            self.apply_by_level(&batch, &plan, &state, threads)
        };
        let Applying {
            made: m,
            dirs,
            removals,
        } = state.into_inner();
        *made = m;
        // Publishing goes in journal order (a directory before what is in it).
        made[before..].sort_by_key(|(prov, _)| prov.1);
        let upto = failed_at.checked_sub(1).map(|k| batch[k].seq());
        // A name is as durable as the directory that holds it.
        let synced = Mutex::new(Ok(()));
        super::ns_order::par_each(&dirs, threads, |(_, d)| {
            if let Err(e) = self.sh.store.fsyncdir(d, false) {
                *synced.lock() = Err(e);
            }
        });
        if let Err(e) = synced.into_inner() {
            tracing::warn!("write-back: syncing a directory failed ({e}); will retry");
            self.c.ns_errors.fetch_add(1, Relaxed);
            self.ns_failed(e);
            return (None, batch, Vec::new(), Vec::new());
        }
        {
            let mut dc = self.nsq.dirs.lock();
            for j in &batch[..failed_at] {
                let parent = match j {
                    Job::Create {
                        parent, reserved, ..
                    }
                    | Job::Drop {
                        parent, reserved, ..
                    } => {
                        // On the store (or refused, or withdrawn): its inode and bytes are
                        // counted there now.
                        self.inodes.release();
                        self.reserve.release(*reserved);
                        parent
                    }
                    // Moved to another directory: the one it left counted its create.
                    Job::Renamed {
                        from: Some(parent), ..
                    } => parent,
                    // Its directory's shadow counted it (`remove_deferred`).
                    Job::Removed { parent, .. } => parent,
                    _ => continue,
                };
                {
                    let pid = parent.id();
                    let Some((n, a)) = dc.get_mut(&pid) else {
                        continue;
                    };
                    *n -= 1;
                    if *n == 0 {
                        let a = *a;
                        if !is_provisional(pid) {
                            // Newer than anything the store was asked before its names
                            // landed: such an answer, arriving late, does not replace it.
                            // Put before the shadow goes, and the drop counted after:
                            // a reader that read older attributes sees the count move and
                            // reads again (`Fs::shown_stable`). Only what the shadow
                            // stands for: the rest may have moved since it was taken (a
                            // deferred chmod of the directory, applied in the meantime).
                            let mut now_a = self.ns.meta.attr(pid).map_or(a, |(c, _)| c);
                            now_a.nlink = a.nlink;
                            now_a.mtime = a.mtime;
                            now_a.ctime = a.ctime;
                            self.ns.meta.put_attr(&now_a, Instant::now());
                        } else if let Some((_, m)) = made.iter_mut().find(|(id, _)| *id == pid) {
                            // Made by this flusher and not published: what its mkdir
                            // answered is older than the names made in it since, and is
                            // what the object shows once published.
                            m.attr.nlink = a.nlink;
                            m.attr.mtime = a.mtime;
                            m.attr.ctime = a.ctime;
                        }
                        dc.remove(&pid);
                        self.nsq.unshadowed.fetch_add(1, AcqRel);
                    }
                }
            }
            self.nsq.dirs_shadowed.store(!dc.is_empty(), Relaxed);
        }
        let chattrs = batch[..failed_at]
            .iter()
            .filter_map(|j| match j {
                Job::SetAttr {
                    inode,
                    of_store: true,
                    ..
                } => Some(inode.clone()),
                _ => None,
            })
            .collect();
        (
            upto,
            batch.into_iter().skip(failed_at).collect(),
            removals,
            chattrs,
        )
    }

    /// Applies the group a level at a time (`ns_order::levels`), each level's operations on
    /// up to `threads` threads; stops after a level in which one failed. Returns the index of
    /// the first operation, in journal order, that was not applied. Those after it that were
    /// are applied again at the retry: a create finds its object in `made`, and the setattrs
    /// of an object are applied again in their order, to the same end.
    fn apply_by_level(
        &self,
        batch: &[Job<S>],
        plan: &[FoldOut],
        state: &Mutex<Applying<S>>,
        threads: usize,
    ) -> usize {
        let order: Vec<OrderIn> = batch
            .iter()
            .map(|j| OrderIn {
                id: j.inode().id(),
                parent: match j {
                    Job::Create { parent, .. }
                    | Job::Moved { parent, .. }
                    | Job::Linked { parent, .. }
                    | Job::Removed { parent, .. } => Some(parent.id()),
                    // After what comes before in its directory (a chmod of the directory
                    // that lets the flusher reach it).
                    Job::SetAttr {
                        inode,
                        of_store: true,
                        ..
                    } => inode.origin.lock().as_ref().map(|(p, _)| p.id()),
                    Job::SetAttr { .. } | Job::Drop { .. } | Job::Renamed { .. } => None,
                },
                name: match j {
                    Job::Create { parent, name, .. }
                    | Job::Removed { parent, name, .. }
                    | Job::Linked {
                        parent,
                        alias: name,
                        ..
                    }
                    | Job::Moved {
                        parent,
                        from: name,
                        over: Some(_),
                        ..
                    } => Some(super::ns_order::name_key(parent.id(), name)),
                    _ => None,
                },
                also: match j {
                    Job::Moved {
                        parent,
                        to,
                        over: Some(_),
                        ..
                    } => Some(super::ns_order::name_key(parent.id(), to)),
                    _ => None,
                },
                barrier: matches!(j, Job::Moved { over: None, .. }),
            })
            .collect();
        let levels = super::ns_order::levels(&order);
        let mut by_level: Vec<Vec<usize>> = Vec::new();
        for (k, l) in levels.iter().enumerate() {
            let l = *l as usize;
            if by_level.len() <= l {
                by_level.resize(l + 1, Vec::new());
            }
            by_level[l].push(k);
        }
        for level in &mut by_level {
            super::ns_order::spread_by_dir(level, |k| order[k].parent);
        }
        let done: Vec<AtomicBool> = batch.iter().map(|_| AtomicBool::new(false)).collect();
        for level in &by_level {
            let failed = AtomicBool::new(false);
            super::ns_order::par_each(level, threads, |&k| {
                if self.apply_logged(&batch[k], &plan[k], state) {
                    done[k].store(true, Relaxed);
                } else {
                    failed.store(true, Relaxed);
                }
            });
            if failed.into_inner() {
                break;
            }
        }
        done.iter()
            .position(|d| !d.load(Relaxed))
            .unwrap_or(batch.len())
    }

    /// Publishes what the flusher made, in journal order: an object takes the store's
    /// identity and node once nothing of it is queued any more, neither an operation on it (a
    /// deferred setattr queued after it keeps it provisional, so the application goes on
    /// seeing its own attributes) nor, for a directory, a create in it (tar sets a
    /// directory's times once it is done with it: that setattr must reach the store after
    /// the names made in it, or they would move the time again), and its directory is
    /// published (a lookup in a provisional directory is answered by the provisional table,
    /// which must hold every name in it).
    ///
    /// A directory is not kept back for the creates in it once more than [`kept_max`] objects
    /// wait: a writer that goes on creating files in a directory it made would keep that
    /// directory, and everything made in it, provisional for as long as it writes (no data
    /// flushed, a descriptor held for each: the mixed benchmark ran the daemon out of them).
    /// Its later setattr then waits for the creates in it (`Fs::before_setattr`).
    fn publish(&self, made: &mut Vec<(Ident, Made<S>)>) {
        let q = self.nsq.q.lock();
        let mut queued: rustc_hash::FxHashSet<Ident> = rustc_hash::FxHashSet::default();
        let mut creating_in: rustc_hash::FxHashSet<Ident> = rustc_hash::FxHashSet::default();
        for j in q.iter() {
            queued.insert(j.inode().id());
            if let Job::Create { parent, .. }
            | Job::Drop { parent, .. }
            | Job::Renamed {
                from: Some(parent), ..
            }
            | Job::Moved { parent, .. } = j
            {
                // (A withdrawn create too, and the directory a queued create was moved out
                // of: its directory's shadow is keyed by the identity the directory has
                // until it is published; and one with a move queued in it, whose old name
                // is hidden under that identity.)
                creating_in.insert(parent.id());
            }
        }
        let crowded = made.len() > kept_max();
        let mut kept: Vec<(Ident, Made<S>)> = Vec::new();
        let mut kept_ids: rustc_hash::FxHashSet<Ident> = rustc_hash::FxHashSet::default();
        let before = made.len();
        for (prov, m) in made.drain(..) {
            let parent_waits = kept_ids.contains(&m.parent.id());
            if queued.contains(&prov) || (creating_in.contains(&prov) && !crowded) || parent_waits {
                kept_ids.insert(prov);
                kept.push((prov, m));
                continue;
            }
            let real = ident(&m.attr);
            // The file's version, and what the metadata cache knows, first, while its
            // identity is still provisional and it has no node: a data flusher takes the file
            // as soon as it has a node, and what its flush records (a newer size and mtime)
            // must not be overwritten by the attributes of the empty file. (A lookup meanwhile
            // is answered by the provisional table, which holds the name until
            // `materialized` below.)
            if let Some(st) = &m.inode.file {
                let _w = st.rw.write();
                st.set_after_own_write(st.version().gen, &m.attr);
            }
            let now = Instant::now();
            if m.attr.kind == FileKind::Dir {
                // Empty on the store but for provisional names, which are found in the
                // provisional table until they are published here too.
                self.ns.meta.put_listing(real, &[], now);
            }
            // The name joins its directory's listing; the directory's own attributes stay:
            // what the metadata cache has of them was put when its last deferred create was
            // applied (see `apply_group`), newer than any answer of the store from before,
            // which forgetting them here would let in.
            self.ns.meta.learn_name(m.parent.id(), &m.name, &m.attr);
            if let Some((alias, a)) = &m.alias {
                // Its second name, linked by a deferred link (`ns_link`).
                self.ns.meta.learn_name(m.parent.id(), alias, a);
            }
            self.ns.meta.put_attr(&m.attr, now);
            if let Some(t) = self.ns.prov.target(prov) {
                self.ns.meta.put_link_target(&m.attr, &t);
            }
            self.ns.meta.made_without_caps(real);
            self.ns.inodes.hold_node(&m.inode, m.node.clone());
            // The times the mount showed stay (the store stamped its own, a moment later).
            if let Some(shown) = self.ns.prov.attr(prov) {
                self.kept_times.keep(real, m.attr.ctime, &shown, true);
            }
            let relabel = |n: &Node<S>, id: Ident| self.sh.store.relabel(n, id);
            self.ns.inodes.rekey(&m.inode, real, &relabel);
            self.ns.inodes.keep_number(real, m.inode.ino);
            self.ns.prov.materialized(prov, real);
        }
        drop(q);
        let published = kept.len() < before;
        *made = kept;
        if published {
            // Their data is the data flushers' now (writes to them did not wake them).
            self.notify();
        }
    }
}
