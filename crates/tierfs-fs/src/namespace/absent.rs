//! Names the store said moments ago it does not have: the evidence that lets write-back
//! defer a create, mkdir, symlink, link or rename to a name of a directory whose listing has
//! expired.
//!
//! Before a create the kernel looks the name up, and with close-to-open (`meta.cto=on`, the
//! default) that lookup asks the store when the cached listing lacks the name or has expired.
//! Write-back defers a create only to a name known to be free, and knew that only from a
//! fresh listing: with `meta.ttl=1s`, a directory listed (or made) more than a second before
//! had every create in it wait for all deferred operations and go to the store. Writing 200
//! files into a directory of the bench's sshfs store and rewriting each took 12 s against
//! sshfs alone's 5.7 s (0.47x), and everything after the first second waited so. The store's
//! own "no such name" a moment before is newer evidence than any listing: within `meta.ttl`
//! of it the name counts as free, as a fresh listing without it would.
//!
//! An entry must never outlive the name's absence as we know it: every name we make (on the
//! store or deferred) and every name a lookup finds is forgotten here (`Namespace::made_name`).
//! A name someone else makes behind our back meanwhile is a conflict, found when the
//! deferred operation is applied, as with a fresh listing (docs/writeback/namespace-flusher.md,
//! Conflicts).

use crate::identity::Ident;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::ffi::{OsStr, OsString};
use std::time::{Duration, Instant};

/// Names kept at most. A kernel lookup is followed by its create within microseconds, so a
/// small table serves; when it is full, entries older than a second go, and if that frees
/// nothing, all (a name then waits for the store as before: slower, never wrong).
const MAX: usize = 4096;

#[derive(Default)]
pub(crate) struct Absent {
    names: Mutex<FxHashMap<(Ident, OsString), Instant>>,
}

impl Absent {
    /// The store answered ENOENT for `dir/name`, asked at `asked`.
    pub fn note(&self, dir: Ident, name: &OsStr, asked: Instant) {
        let mut g = self.names.lock();
        if g.len() >= MAX {
            g.retain(|_, at| at.elapsed() < Duration::from_secs(1));
            if g.len() >= MAX {
                g.clear();
            }
        }
        g.insert((dir, name.to_owned()), asked);
    }

    /// When the store last said it has no `dir/name` (None: not known).
    pub fn since(&self, dir: Ident, name: &OsStr) -> Option<Instant> {
        let g = self.names.lock();
        if g.is_empty() {
            return None;
        }
        g.get(&(dir, name.to_owned())).copied()
    }

    /// `dir/name` exists now (we made it, or a lookup found it).
    pub fn forget(&self, dir: Ident, name: &OsStr) {
        let mut g = self.names.lock();
        if !g.is_empty() {
            g.remove(&(dir, name.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_known_absent_until_made_and_the_table_stays_bounded() {
        let a = Absent::default();
        let t = Instant::now();
        a.note((1, 2), OsStr::new("x"), t);
        assert_eq!(a.since((1, 2), OsStr::new("x")), Some(t));
        assert_eq!(a.since((1, 3), OsStr::new("x")), None);
        a.forget((1, 2), OsStr::new("x"));
        assert_eq!(a.since((1, 2), OsStr::new("x")), None);
        for k in 0..(MAX + 10) {
            a.note((1, 2), OsStr::new(&format!("n{k}")), t);
        }
        assert!(a.names.lock().len() <= MAX);
        // The newest is kept.
        let last = format!("n{}", MAX + 9);
        assert_eq!(a.since((1, 2), OsStr::new(&last)), Some(t));
    }
}
