//! A deferred mknod (see `ns`): a FIFO, socket or device node, or a regular file made by
//! mknod(2), in a name the cache can vouch is free, made provisional and acknowledged like a
//! create (`ns_defer`). Untarring a root filesystem (a container image's layers, a chroot, an
//! initramfs) makes `/dev`'s nodes and a few FIFOs; each was a wait for every name deferred
//! before it and a store round trip.
//!
//! A regular file needs nothing the store could refuse that a create would not. A special
//! file does: an sshfs store refuses every one of them (SFTP has no mknod: EPERM), and a
//! daemon that is not root may not make devices. Those errnos belong at the call, not in a
//! conflict at flush time. So a special file of a kind is deferred only once the store has
//! made one of that kind through this mount (`MadeKinds`): the first goes to the store and
//! returns its answer; the next ones are deferred. A store that later refuses one anyway (it
//! changed under us) is a conflict like a refused create: a log line and a counter.

use super::ns_queue::NewObject;
use super::ns_record::is_special;
use super::Writeback;
use crate::inode::Inode;
use crate::namespace::Requester;
use crate::shared::St;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use tierfs_store::{FileKind, Result, Store};

/// The kinds of special file the store has made through this mount (a bit each).
#[derive(Default)]
pub(crate) struct MadeKinds(AtomicU8);

impl MadeKinds {
    fn bit(kind: FileKind) -> u8 {
        match kind {
            FileKind::Fifo => 1,
            FileKind::Socket => 2,
            FileKind::CharDev => 4,
            FileKind::BlockDev => 8,
            _ => 0,
        }
    }

    pub(crate) fn has(&self, kind: FileKind) -> bool {
        let b = Self::bit(kind);
        b != 0 && self.0.load(Relaxed) & b != 0
    }

    pub(crate) fn learn(&self, kind: FileKind) {
        self.0.fetch_or(Self::bit(kind), Relaxed);
    }
}

impl<S: Store> Writeback<S> {
    /// A mknod of `name` in `p` (`mode` with its file type, device `rdev`) made provisional,
    /// or None: done on the store, after the deferred operations (see the module comment).
    pub(crate) fn mknod_deferred(
        &self,
        p: &Arc<Inode<St<S>>>,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        req: Requester,
    ) -> Result<Option<NewObject<S>>> {
        match FileKind::from_mode(mode) {
            FileKind::File => {
                self.create_deferred(p, name, FileKind::File, mode, true, req, true, None, 0)
            }
            k if is_special(k) && self.made_kinds.has(k) => {
                self.create_deferred(p, name, k, mode, true, req, true, None, rdev)
            }
            _ => Ok(None),
        }
    }

    /// The store made a special file of `mode`'s kind (a mknod done on it): the next ones
    /// of that kind may be deferred.
    pub(crate) fn mknod_made(&self, mode: u32) {
        self.made_kinds.learn(FileKind::from_mode(mode));
    }
}
