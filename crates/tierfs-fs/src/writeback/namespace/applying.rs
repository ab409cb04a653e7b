//! What the namespace flusher's appliers share (`ns_apply`, `ns_link`, `ns_remove`,
//! `ns_replace`, and `ns`, which publishes): what a group made and touched, the removals
//! waiting for its DONE, and which store errors pass and which refuse for good. Below them
//! all, so that none imports another for these.

use crate::identity::Ident;
use crate::inode::Inode;
use crate::shared::{Node, St};
use std::ffi::OsString;
use std::sync::Arc;
use tierfs_store::{Attr, Errno, Store};

/// What a group's operations made and touched, shared by those applied at once.
pub(super) struct Applying<S: Store> {
    pub(super) made: Vec<(Ident, Made<S>)>,
    /// The directories that got names, each synced once before the group's DONE.
    pub(super) dirs: Vec<(Ident, Node<S>)>,
    /// Removals applied, their namespace side waiting for the group's DONE.
    pub(super) removals: Vec<Removal<S>>,
}

impl<S: Store> Applying<S> {
    pub(super) fn sync_dir(&mut self, id: Ident, node: Node<S>) {
        if !self.dirs.iter().any(|(d, _)| *d == id) {
            self.dirs.push((id, node));
        }
    }
}

/// What the namespace flusher made on the store and has not published yet.
pub(super) struct Made<S: Store> {
    pub(super) inode: Arc<Inode<St<S>>>,
    pub(super) parent: Arc<Inode<St<S>>>,
    pub(super) name: OsString,
    pub(super) node: Node<S>,
    pub(super) attr: Attr,
    /// The node of its directory, synced before the group's DONE.
    pub(super) dir: Node<S>,
    /// Its second name, linked by a deferred link (`ns_link`), and what the store says of it.
    pub(super) alias: Option<(OsString, Attr)>,
}

/// Errors after which the store may well succeed later: the operation is retried.
pub(super) fn transient(e: Errno) -> bool {
    [
        libc::EIO,
        libc::ENOTCONN,
        libc::ETIMEDOUT,
        libc::EAGAIN,
        libc::EINTR,
        libc::ENOSPC,
        libc::EDQUOT,
        libc::ENOMEM,
        // Out of descriptors (ours or the system's): the same create succeeds once some are
        // closed. Taken for a refusal, it sent every file made in the meantime to `lost/`
        // (the mixed benchmark in write-back, 46,640 of them).
        libc::EMFILE,
        libc::ENFILE,
        libc::EBUSY,
        libc::ESHUTDOWN,
    ]
    .contains(&e.0)
}

/// Errors by which the store refuses a file's data for good (past its largest file, a
/// size or offset it cannot take): retried, they would hold the file's journal records,
/// and every rename or unlink that must wait for the file's data, for ever. Its data is
/// set aside instead (`Writeback::data_refused`). Not EPERM, EACCES or EINVAL: sshfs turns
/// a full or over-quota server disk (SSH_FX_FAILURE) into EPERM, which passes.
pub(super) fn refused_for_good(e: Errno) -> bool {
    [libc::EFBIG, libc::EOVERFLOW].contains(&e.0)
}

/// A removal applied to the store, its namespace side waiting for the group's DONE (see
/// [`Writeback::apply_remove`]).
pub(super) struct Removal<S: Store> {
    pub(super) seq: u64,
    pub(super) parent: Arc<Inode<St<S>>>,
    pub(super) name: std::ffi::OsString,
    /// Why the name was left as the store has it (someone else's object there), or None:
    /// removed.
    pub(super) kept: Option<String>,
    /// A directory removed: its inode, which lets go of its identity.
    pub(super) removed_dir: Option<Arc<Inode<St<S>>>>,
}
