//! Nodes of objects the kernel forgot, kept for the next inode of the same identity.

use crate::identity::Ident;

/// Nodes of objects the kernel forgot, by identity, at most as many as files may hold: an
/// inode made again for the same identity takes its node back ([`InodeTable::take_spare`])
/// instead of resolving it by name. The kernel forgets every inode at a `drop_caches` and
/// looks the names up again (answered from the metadata cache); resolving each by name then
/// cost a store lookup per file, which a FUSE store without parallel lookups (sshfs, whose
/// own dentries the same `drop_caches` dropped) serves one at a time: 1,000 cached files
/// read by 8 readers took 5.2 s. Checked through the node they held, they went in parallel.
/// The node is what the inode held, so taking it back is as if the inode had stayed.
pub(crate) struct Spare<N> {
    pub(super) nodes: rustc_hash::FxHashMap<Ident, (N, u64)>,
    /// Identities in the order they came, with the number of their entry (an identity put
    /// again has a newer one, and its older place in the queue is skipped).
    order: std::collections::VecDeque<(Ident, u64)>,
    next: u64,
}

impl<N> Default for Spare<N> {
    fn default() -> Self {
        Spare {
            nodes: Default::default(),
            order: Default::default(),
            next: 0,
        }
    }
}

impl<N> Spare<N> {
    pub(super) fn put(&mut self, id: Ident, node: N, max: usize) {
        self.next += 1;
        self.nodes.insert(id, (node, self.next));
        self.order.push_back((id, self.next));
        while self.nodes.len() > max {
            let Some((old, n)) = self.order.pop_front() else {
                break;
            };
            if self.nodes.get(&old).is_some_and(|e| e.1 == n) {
                self.nodes.remove(&old);
            }
        }
        if self.order.len() > 2 * max.max(16) {
            let nodes = &self.nodes;
            self.order
                .retain(|(i, n)| nodes.get(i).is_some_and(|e| e.1 == *n));
        }
    }

    pub(super) fn take(&mut self, id: Ident) -> Option<N> {
        self.nodes.remove(&id).map(|e| e.0)
    }
}
