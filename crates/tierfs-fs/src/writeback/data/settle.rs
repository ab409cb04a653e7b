//! The flusher's store calls that set or read a flushed file's attributes, made without the
//! file's lock (see `settle_after`).

use tierfs_store::{Attr, Result};

/// A store call of the flusher that returns `st`'s attributes (setting its times, or asking
/// for them), made as a change of our own but without the file's lock, then `settle` with its
/// answer under the lock. Not under the lock: a store that hangs in the call (a frozen NFS or
/// FUSE server; setattr and fstat have no deadline) would hold up every reader of the file,
/// cached data and all, and every writer, whose writes the journal would otherwise absorb.
/// Write-back's own writes do not touch the store, so the answer still describes what the
/// flusher left; if another change of ours to the backing file (a write-through, a truncate)
/// began or ended meanwhile, the answer may predate it and is dropped: the next check of the
/// file asks the store.
pub(super) fn settle_after(
    st: &crate::file_state::FileState,
    call: impl FnOnce() -> Result<Attr>,
    settle: impl FnOnce(&Attr),
) {
    let own = st.own_change();
    let began = crate::file_state::own_changes();
    let answer = call();
    let _w = st.rw.write();
    if let Ok(a) = answer {
        if !st.changed_by_us_since(began) {
            settle(&a);
        }
    }
    drop(own);
}
