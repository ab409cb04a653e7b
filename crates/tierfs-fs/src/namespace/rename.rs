//! Rename through tierfs: the metadata cache follows it, and with path identities the moved
//! object takes the identity of its new path (a file keeps its cached blocks, a directory is
//! aliased so everything under it keeps its own).

use super::Namespace;
use crate::identity::{is_path_id, Ident};
use crate::inode::Inode;
use crate::meta::ident;
use crate::shared::{Node, St};
use std::ffi::OsStr;
use std::sync::Arc;
use tierfs_cache::{SsdKey, KIND_DIR, KIND_LINK};
use tierfs_store::{Attr, FileKind, Result, Store};

impl<S: Store> Namespace<S> {
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        // Write-back: a file's data reaches the backing store before its new name does.
        let p = self.inode(parent)?;
        let np = self.inode(newparent)?;
        let (pnode, npnode) = (self.node(&p)?, self.node(&np)?);
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let moved = self.resolve_victim(&p, name, false);
        let victim = self.resolve_victim(&np, newname, !exchange);
        let taken = victim
            .filter(|_| !exchange)
            .and_then(|id| self.take_unpinned_name(id, &np, newname));
        let r = self.sh.store.rename(&pnode, name, &npnode, newname, flags);
        if let (Err(_), Some((i, t))) = (&r, taken) {
            i.give_name_back(t);
        }
        for id in [moved, victim].into_iter().flatten() {
            self.meta.drop_attr(id);
            if self
                .inodes
                .by_ident(id)
                .is_none_or(|i| i.kind == FileKind::Dir)
            {
                // Its record, under an identity that may be a path another directory takes.
                self.listing_outdated(id);
            }
        }
        if r.is_err() {
            self.meta.drop_listing(p.id());
            self.meta.drop_listing(np.id());
            return r;
        }
        self.meta.remove_name(p.id(), name);
        self.meta.remove_name(np.id(), newname);
        self.made_name(np.id(), newname);
        if let Some(v) = victim.filter(|_| !exchange) {
            self.unnamed(v, &np, newname);
        }
        // Path identities: what moved takes the identity of its new path.
        let moved_inode = moved.and_then(|id| self.inodes.by_ident(id));
        let mut rekeyed = false;
        if let Some(id) = moved.filter(|id| is_path_id(*id)) {
            let is_dir = match &moved_inode {
                Some(i) => i.kind == FileKind::Dir,
                None => self
                    .sh
                    .store
                    .lookup(&npnode, newname)
                    .is_ok_and(|(_, a)| a.kind == FileKind::Dir),
            };
            if exchange || is_dir {
                // Keeps its identity (a directory: so does everything under it); its new
                // path leads to it, its old one to a new identity (or, for an exchange, to
                // the other object's).
                self.sh.store.alias(np.id(), newname, id);
                if !exchange {
                    self.sh.store.alias_fresh(p.id(), name);
                }
            } else {
                let new = self.sh.store.derive(np.id(), newname);
                rekeyed = self.follow_rename(id, moved_inode.as_ref(), new);
            }
        }
        if let (true, Some(id)) = (exchange, victim.filter(|id| is_path_id(*id))) {
            self.sh.store.alias(p.id(), name, id);
        }
        // A rename moves the file's ctime; tell its state that the data did not change, so
        // the cached blocks survive the rename.
        match self.sh.store.lookup(&npnode, newname) {
            Ok((node, attr)) => {
                self.meta.add_name(np.id(), newname, &attr);
                if let Some(i) = self.inodes.by_ident(ident(&attr)) {
                    i.moved_to(np.clone(), newname);
                    i.set_node(node.clone());
                    self.inodes.hold_node(&i, node);
                }
                self.note_own_metadata_change(&attr, rekeyed);
            }
            Err(_) => self.meta.drop_listing(np.id()),
        }
        if exchange {
            match self.sh.store.lookup(&pnode, name) {
                Ok((node, attr)) => {
                    self.meta.add_name(p.id(), name, &attr);
                    if let Some(i) = self.inodes.by_ident(ident(&attr)) {
                        i.moved_to(p.clone(), name);
                        i.set_node(node.clone());
                        self.inodes.hold_node(&i, node);
                    }
                    self.note_own_metadata_change(&attr, rekeyed);
                }
                Err(_) => self.meta.drop_listing(p.id()),
            }
        }
        Ok(())
    }

    /// After a rename through tierfs moved the object of identity `old` (the kernel's inode
    /// of it: `inode`) to a path whose identity is `new`: with path identities the two
    /// differ, and the object takes the new one, keeping its kernel inode number and its
    /// cached blocks in RAM (`InodeTable::rekey`). What the SSD tier holds under the old
    /// identity is dropped: that identity is the old path's, and a file created there later
    /// must not find this one's data (its version could match: same size and mtime).
    pub(crate) fn follow_rename(
        &self,
        old: Ident,
        inode: Option<&Arc<Inode<St<S>>>>,
        new: Ident,
    ) -> bool {
        if old == new {
            return false;
        }
        let relabel = |n: &Node<S>, id: Ident| self.sh.store.relabel(n, id);
        let state = match inode {
            Some(i) => {
                self.inodes.rekey(i, new, &relabel);
                i.file.clone()
            }
            None => self.inodes.rekey_state(old, new, &relabel),
        };
        // A directory's listing names its entries by identities made from the old one.
        self.meta.drop_listing(old);
        self.meta.drop_listing(new);
        let Some(ssd) = &self.sh.ssd else { return true };
        let key = |kind, idx| SsdKey {
            kind,
            dev: old.0,
            ino: old.1,
            idx,
        };
        let blocks = state.map_or(0, |st| {
            st.version().fp.size.div_ceil(self.sh.cfg.block_size)
        });
        ssd.evict(
            [key(KIND_DIR, 0), key(KIND_LINK, 0)]
                .into_iter()
                .chain((0..blocks).map(|i| key(tierfs_cache::KIND_DATA, i))),
        );
        true
    }

    /// `rekeyed`: a rename gave the file a new identity, so its SSD entries must be offered
    /// under it even if the fingerprint did not move.
    pub(crate) fn note_own_metadata_change(&self, attr: &Attr, rekeyed: bool) {
        if attr.kind != FileKind::File {
            return;
        }
        if let Some(i) = self.inodes.by_ident(ident(attr)) {
            if let Some(st) = &i.file {
                let before = st.version();
                self.sh.own_metadata_change(st, attr);
                let after = st.version();
                if rekeyed && after.gen == before.gen && after.fp == before.fp {
                    self.sh.reoffer_to_ssd(st);
                }
            }
        }
    }
}
