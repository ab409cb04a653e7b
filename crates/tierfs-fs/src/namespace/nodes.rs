//! Reaching the store's object behind an inode: its node, resolved from its parent and name
//! when the inode was learnt from the metadata cache (the same lookup is the object's fresh
//! attributes, so nothing more is asked), or taken back from a forgotten inode of the same
//! identity; and the store's attributes of it when the cache has none it trusts.

use super::{is_provisional, Answer, Namespace};
use crate::inode::Inode;
use crate::meta::ident;
use crate::shared::{Node, St};
use crate::stats::FsStats;
use std::sync::Arc;
use std::time::Instant;
use tierfs_store::{Attr, Errno, FileKind, Result, Store};

impl<S: Store> Namespace<S> {
    /// The backing node of an inode, resolving it from its parent and name if the inode was
    /// learned from the metadata cache. ESTALE if the name now holds another object: the
    /// kernel then looks the path up again.
    pub(crate) fn node(&self, i: &Arc<Inode<St<S>>>) -> Result<Node<S>> {
        Ok(self.node_checked(i)?.0)
    }

    /// [`Namespace::node`], and the store's answer about the object when resolving it asked
    /// the store (a lookup by name): as fresh as a getattr's, so the caller, a getattr or an
    /// open's close-to-open check, asks nothing more (`checks`).
    pub(crate) fn node_checked(&self, i: &Arc<Inode<St<S>>>) -> Result<(Node<S>, Option<Answer>)> {
        if let Some(n) = i.node() {
            return Ok((n, None));
        }
        let id = i.id();
        if is_provisional(id) {
            // Not on the store yet: the namespace flusher makes it (and gives it its node).
            self.prov.wait(id)?;
            if let Some(n) = i.node() {
                return Ok((n, None));
            }
        }
        let origin = i.origin.lock().clone();
        let Some((parent, name)) = origin else {
            return Ok((i.node().ok_or(Errno::ESTALE)?, None));
        };
        if let Some(node) = self.inodes.take_spare(id) {
            self.inodes.hold_node(i, node.clone());
            return Ok((node, None));
        }
        let pnode = self.node(&parent)?;
        // A store whose nodes are names (S3) makes it without a request: the operation that
        // follows (an open, a getattr) finds out whether the object is still there.
        if let Some(node) = self.sh.store.child_node(&pnode, &name, i.kind) {
            if node.id() == i.id() {
                self.inodes.hold_node(i, node.clone());
                return Ok((node, None));
            }
        }
        let asked = Instant::now();
        let (node, attr) = match self.sh.store.lookup(&pnode, &name) {
            Ok(r) => r,
            Err(e) => {
                // The name is not what the listing says: the listing goes. Not for a store
                // that did not answer (gone, hung, failing): what is cached of the directory
                // is what is served meanwhile (a failed `ls` of a directory never listed
                // took its parent's listing and attributes with it).
                if matches!(e.0, libc::ENOENT | libc::ESTALE | libc::ENOTDIR) {
                    self.meta.drop_listing(parent.id());
                }
                return Err(if e == Errno::ENOENT { Errno::ESTALE } else { e });
            }
        };
        // (Another kind is another object even where identities are paths.)
        if ident(&attr) != i.id() || attr.kind != i.kind {
            self.meta.drop_listing(parent.id());
            return Err(Errno::ESTALE);
        }
        self.meta.put_attr(&attr, asked);
        self.inodes.hold_node(i, node.clone());
        Ok((node, Some(Answer { attr, asked })))
    }

    /// The store's attributes of `i`, recorded. They are stamped with when they were asked
    /// for: if a change of ours landed meanwhile (a flush), what it recorded is newer and
    /// stays, in the metadata cache and in the file's state, and is what the kernel is told
    /// (see `FileState::own_change`).
    /// One store request: the lookup that resolves an inode learnt from the metadata cache
    /// answers with the attributes too.
    pub(super) fn fetch_attr(&self, i: &Arc<Inode<St<S>>>) -> Result<Attr> {
        Ok(self.fetch_answer(i)?.0)
    }

    /// [`Namespace::fetch_attr`], and the store's own answer (before newer changes of ours
    /// were laid over it). Asked as an open's check is (`Store::revalidate`, past the store
    /// client's own attribute cache): the open that may follow takes it as its check
    /// (`checks`), and tierfs's own trust is the only one that delays a change.
    pub(super) fn fetch_answer(&self, i: &Arc<Inode<St<S>>>) -> Result<(Attr, Answer)> {
        let fetched = Instant::now();
        let (node, looked) = self.node_checked(i)?;
        let answer = match looked {
            Some(a) => a,
            None => {
                // (A directory's too: an unchanged mtime renews its listing, and a network
                // client's own cache of it may be a minute old.)
                let attr = match self.sh.store.revalidate(&node) {
                    Some(a) => a?,
                    None => self.sh.store.getattr(&node)?,
                };
                Answer {
                    asked: fetched,
                    attr,
                }
            }
        };
        let newest = self.meta.put_attr_fetched(&answer.attr, answer.asked);
        if let Some(st) = &i.file {
            self.sh.observe_fetched(st, &answer.attr, answer.asked);
        }
        Ok((newest, answer))
    }

    /// The attributes of `i` as the store names them (its identity, not the kernel's inode
    /// number): from the metadata cache, else asked for.
    pub(crate) fn store_attr(&self, i: &Arc<Inode<St<S>>>) -> Result<Attr> {
        match self.meta.attr(i.id()) {
            Some((a, _)) => Ok(a),
            None => self.fetch_attr(i),
        }
    }

    /// `Fs::getattr` on behalf of caller thread `pid` (0: unknown), and how long the kernel
    /// may keep the answer (see [`Entry::valid`]). An answer from the store serves the
    /// thread's open of the file that follows at once (the kernel's permission check before
    /// an open: `checks`).
    pub fn getattr_valid(&self, ino: u64, pid: u32) -> Result<(Attr, std::time::Duration)> {
        let i = self.inode(ino)?;
        if let Some(a) = self.prov.attr(i.id()) {
            return Ok((self.with_ino(&i, a), std::time::Duration::MAX));
        }
        if let Some((attr, _, left)) = self.meta.attr_left(i.id()) {
            FsStats::add(&self.sh.stats.meta_hits, 1);
            return Ok((self.with_ino(&i, attr), self.kernel_valid(&attr, left)));
        }
        let (attr, answer) = self.fetch_answer(&i)?;
        if i.kind == FileKind::File {
            self.checks.note(pid, i.id(), answer);
        }
        let valid = self.kernel_valid(&attr, self.meta.trust(&attr, answer.asked));
        Ok((self.with_ino(&i, attr), valid))
    }

    /// Times the store's close-to-open check (`Store::revalidate`) of the root, three times,
    /// and records the median (`store_check_us`); when it is a couple of milliseconds or
    /// more, says once in the log what close-to-open will cost and how to avoid it. Nothing
    /// on a store whose check is its open (S3): the opens' own average says it later.
    pub(crate) fn probe_check_cost(&self) {
        let Some(root) = self.inodes.get(crate::ROOT_INO).and_then(|r| r.node()) else {
            return;
        };
        let mut times = Vec::with_capacity(3);
        for _ in 0..3 {
            let t = Instant::now();
            match self.sh.store.revalidate(&root) {
                Some(Ok(_)) => times.push(t.elapsed()),
                _ => return,
            }
        }
        times.sort();
        let median = times[1];
        FsStats::add(&self.sh.stats.store_check_us, median.as_micros() as u64);
        if median >= std::time::Duration::from_millis(2) {
            tracing::info!(
                "the store answers a close-to-open check in {:.1} ms: every open of a file asks it once (meta.cto=on, the default); for a tree only this mount changes, or whose readers may lag a change made elsewhere by meta.ttl, -o meta.cto=off,meta.ttl=5m serves opens from the cache (docs/tunables.md)",
                median.as_secs_f64() * 1000.0
            );
        }
    }

    /// Opens `i`, an inode learnt from a listing that holds no node, by its parent and name
    /// (`Store::open_child`): one open, where resolving the node first was a path walk and
    /// a stat of its own. The handle and the attributes the open found; ESTALE if the name
    /// holds another object now. None where the node is at hand or the store wants it.
    pub(crate) fn open_by_name(
        &self,
        i: &Arc<Inode<St<S>>>,
        flags: i32,
    ) -> Option<Result<(crate::shared::Handle<S>, Attr)>> {
        let id = i.id();
        if i.node().is_some() || is_provisional(id) || self.inodes.has_spare(id) {
            return None;
        }
        let (parent, name) = i.origin.lock().clone()?;
        let pnode = parent.node()?;
        let r = self.sh.store.open_child(&pnode, &name, flags)?;
        Some(match r {
            Ok((node, attr, handle)) => {
                // (Another kind is another object even where identities are paths.)
                if ident(&attr) != id || attr.kind != i.kind {
                    self.meta.drop_listing(parent.id());
                    return Some(Err(Errno::ESTALE));
                }
                self.inodes.hold_node(i, node);
                Ok((handle, attr))
            }
            Err(e) if e == Errno::ENOENT => {
                self.meta.drop_listing(parent.id());
                Err(Errno::ESTALE)
            }
            Err(e) => Err(e),
        })
    }
}
