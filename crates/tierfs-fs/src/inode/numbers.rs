//! Kernel inode numbers (see the module documentation of `inode`): the one an identity
//! prefers, the one a live object was given instead, and the one an object made by this
//! mount keeps for the mount's life.

use super::{InodeTable, KEPT_MAX, SYNTHETIC_BASE};
use crate::identity::Ident;
use tierfs_store::Store;

impl<S: Store> InodeTable<S> {
    /// The kernel inode number of identity `id`: the one its live inode has, else the one it
    /// would get (see the module documentation).
    pub fn kernel_ino_of_ident(&self, id: Ident) -> u64 {
        if id == self.root_id {
            return crate::ROOT_INO;
        }
        if let Some(ino) = self.assigned.get(&id) {
            return *ino;
        }
        if let Some(ino) = self.kept.get(&id) {
            return *ino;
        }
        Self::preferred(id)
    }

    /// An object this mount made, known to the kernel by the number of its provisional
    /// identity, now has the store's identity `id`: it keeps that number for the mount's
    /// life, also once the kernel forgot it and looks it up again (a program compares inode
    /// numbers across a rename or a link: pjdfstest's rename/00.t saw the number change).
    pub(crate) fn keep_number(&self, id: Ident, ino: u64) {
        if Self::preferred(id) != ino && self.kept.len() < KEPT_MAX {
            self.kept.insert(id, ino);
        }
    }

    /// The number an identity asks for: the store's inode number if it has one in range,
    /// else one from its hash, in [2^60, 2^61) (above any inode number a local filesystem
    /// hands out, so the two kinds do not meet).
    pub(super) fn preferred(id: Ident) -> u64 {
        if id.0 == 0 && id.1 > crate::ROOT_INO && id.1 < SYNTHETIC_BASE {
            return id.1;
        }
        let mut h = id.0 ^ id.1.rotate_left(17) ^ 0x9E37_79B9_7F4A_7C15;
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        SYNTHETIC_BASE | ((h ^ (h >> 31)) & (SYNTHETIC_BASE - 1))
    }
}
