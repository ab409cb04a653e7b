//! The session record: whether what the last session wrote is still current beyond what
//! checksums and versions can tell.
//!
//! Every entry is stored under an object's identity and a version derived from its
//! attributes, which is enough for file data. A directory listing also holds its entries'
//! attributes, and those change (a chmod, a write) without the directory's version moving.
//! The filesystem drops such a record at each change of its own (`SsdCache::remove`), but a
//! crash can lose the drops still in the writer's queue, and a drop that finds the queue full
//! is not logged at all. So each session has an epoch, which the filesystem writes into the
//! records that need it: the last session's epoch again when that session ended cleanly with
//! every drop logged (`SsdCache::close_session`), a new one otherwise. The file says "open"
//! from before anything is served until the clean close, so a crash at any moment leaves
//! "open", and the next session takes a new epoch.
//!
//! File `session`, one line of text: `tierfs-session 1 <epoch, 16 hex digits> open|clean`.
//! Anything else (missing, damaged, another format) counts as an unclean end.

use super::error::io_err;
use super::{io, SsdError};
use std::fs;
use std::io::Write;
use std::path::Path;

pub(crate) const FILE: &str = "session";
const TMP: &str = "session.tmp";
const TAG: &str = "tierfs-session 1";

/// What a session's file says: its epoch, and whether it ended cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub epoch: u64,
    pub clean: bool,
}

pub(crate) fn is_file(name: &str) -> bool {
    name == FILE || name == TMP
}

fn parse(text: &str) -> Option<Session> {
    let rest = text
        .strip_suffix('\n')?
        .strip_prefix(TAG)?
        .strip_prefix(' ')?;
    let (epoch, state) = rest.split_once(' ')?;
    if epoch.len() != 16 {
        return None;
    }
    let epoch = u64::from_str_radix(epoch, 16).ok()?;
    let clean = match state {
        "clean" => true,
        "open" => false,
        _ => return None,
    };
    Some(Session { epoch, clean })
}

/// The last session's record; None if there is none or it cannot be read.
pub(crate) fn load(dir: &Path) -> Option<Session> {
    parse(&fs::read_to_string(dir.join(FILE)).ok()?)
}

/// The epoch of the session that starts now: the last one's if it ended cleanly, else a new
/// one (the next number; a random one when there is no record to count from).
pub(crate) fn next_epoch(last: Option<Session>) -> u64 {
    match last {
        Some(s) if s.clean => s.epoch,
        Some(s) => s.epoch.wrapping_add(1),
        None => u64::from_le_bytes(io::random_uuid()[..8].try_into().unwrap()),
    }
}

/// Starts a session after `last`: its epoch, written as "open" before the tier is used.
/// If that cannot be written (a full cache device), the record is removed instead, so a
/// crash cannot leave an earlier "clean" standing, and the session takes a random epoch and
/// is distrusted (`true`): it will not end clean. Err only if neither can be done.
pub(crate) fn begin(dir: &Path, last: Option<Session>) -> Result<(u64, bool), SsdError> {
    let epoch = next_epoch(last);
    let Err(e) = store(
        dir,
        Session {
            epoch,
            clean: false,
        },
    ) else {
        return Ok((epoch, false));
    };
    let path = dir.join(FILE);
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(r) if r.kind() == std::io::ErrorKind::NotFound => {}
        Err(r) => return Err(io_err("remove", &path)(r)),
    }
    let _ = fs::remove_file(dir.join(TMP));
    tracing::warn!(
        "SSD tier: {e}: listings kept in the SSD tier are not trusted after the next mount"
    );
    Ok((next_epoch(None), true))
}

/// Replaces the record durably (written, synced, renamed, directory synced).
pub(crate) fn store(dir: &Path, s: Session) -> Result<(), SsdError> {
    let tmp = dir.join(TMP);
    let line = format!(
        "{TAG} {:016x} {}\n",
        s.epoch,
        if s.clean { "clean" } else { "open" }
    );
    let mut f = crate::private::new_file(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(line.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(io_err("write", &tmp))?;
    let path = dir.join(FILE);
    fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
    io::sync_dir(dir).map_err(io_err("fsync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_end_keeps_the_epoch_and_anything_else_takes_a_new_one() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load(d.path()), None);
        let first = next_epoch(load(d.path()));
        store(
            d.path(),
            Session {
                epoch: first,
                clean: false,
            },
        )
        .unwrap();
        // A crash: "open" stays.
        let second = next_epoch(load(d.path()));
        assert_ne!(second, first);
        store(
            d.path(),
            Session {
                epoch: second,
                clean: true,
            },
        )
        .unwrap();
        assert_eq!(next_epoch(load(d.path())), second);
        // Damaged: a new epoch, not a misread one.
        fs::write(d.path().join(FILE), "tierfs-session 1 00zz clean\n").unwrap();
        assert_eq!(load(d.path()), None);
        fs::write(
            d.path().join(FILE),
            "tierfs-session 2 0000000000000001 clean\n",
        )
        .unwrap();
        assert_eq!(load(d.path()), None);
        assert_ne!(next_epoch(load(d.path())), second);
    }
}
