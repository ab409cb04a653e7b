//! The versions our own uploads made: for a key, which ETag replaced which.
//!
//! A read-only handle is pinned to the version it was opened at (every GET carries If-Match),
//! so it never returns bytes of two versions. But when the new version is one we uploaded
//! ourselves (a flush of write-back, a close of another descriptor) over the very version the
//! handle holds, the handle must follow it, as a descriptor of a local file sees the writes
//! made through another: else its reads fail the If-Match, its attributes show the version
//! before our own writes, and tierfs would take that for a change behind its back and serve
//! the older, shorter object (zeros where our writes were).
//!
//! Only chains of our own conditional uploads are recorded (If-Match on the ETag the handle
//! has): a version someone else made is never followed, and a handle reading it still gets
//! ESTALE. The record is bounded; a forgotten step only brings that ESTALE back.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tierfs_store::Attr;

/// Steps kept per key: a handle more than this many of our uploads behind re-opens (ESTALE).
const STEPS_PER_KEY: usize = 8;
/// Keys kept; past it the record starts afresh (see the module comment).
const MAX_KEYS: usize = 8192;

struct Step {
    from: String,
    to: String,
    attr: Attr,
}

#[derive(Default)]
pub(crate) struct Lineage {
    steps: Mutex<HashMap<Arc<str>, Vec<Step>>>,
}

impl Lineage {
    /// Our upload replaced version `from` of `rel` with `to`, whose attributes are `attr`.
    /// ETags are compared without their quotes; `to` is kept as given.
    pub fn record(&self, rel: &Arc<str>, from: &str, to: &str, attr: Attr) {
        let from = from.trim_matches('"');
        // (ETags are content hashes: the same bytes uploaded again make A -> B -> A.)
        let mut g = self.steps.lock();
        if g.len() >= MAX_KEYS && !g.contains_key(rel) {
            g.clear();
        }
        let v = g.entry(rel.clone()).or_default();
        if v.len() >= STEPS_PER_KEY {
            v.remove(0);
        }
        v.push(Step {
            from: from.to_string(),
            to: to.to_string(),
            attr,
        });
    }

    /// The version of `rel` that our own uploads made of version `etag`, if any: its
    /// attributes and ETag.
    pub fn follow(&self, rel: &str, etag: &str) -> Option<(Attr, String)> {
        let g = self.steps.lock();
        let v = g.get(rel)?;
        let etag = etag.trim_matches('"');
        // Steps are in upload order: from the last upload made over the handle's version,
        // along the uploads that followed it.
        let mut j = v.iter().rposition(|s| s.from == etag)?;
        while j + 1 < v.len() && v[j + 1].from == v[j].to.trim_matches('"') {
            j += 1;
        }
        let s = &v[j];
        // Back at the handle's own contents (the same bytes uploaded again): nothing to follow.
        (s.to.trim_matches('"') != etag).then(|| (s.attr, s.to.clone()))
    }

    /// `rel` was removed or renamed: a later object of that name is not ours to follow to.
    pub fn forget(&self, rel: &str) {
        self.steps.lock().remove(rel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_store::{FileKind, TimeSpec};

    fn attr(size: u64) -> Attr {
        Attr {
            dev: 0,
            ino: 1,
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            size,
            blocks: 0,
            blksize: 4096,
            atime: TimeSpec::default(),
            mtime: TimeSpec::default(),
            ctime: TimeSpec::default(),
        }
    }

    #[test]
    fn a_handle_follows_our_uploads_to_the_newest_and_no_other_version() {
        let l = Lineage::default();
        let k: Arc<str> = "d/f".into();
        assert!(l.follow("d/f", "e1").is_none());
        l.record(&k, "e1", "e2", attr(5000));
        l.record(&k, "e2", "e3", attr(9005));
        let (a, e) = l.follow("d/f", "e1").unwrap();
        assert_eq!((a.size, e.as_str()), (9005, "e3"));
        assert_eq!(l.follow("d/f", "e2").unwrap().1, "e3");
        // The newest version, and versions we did not make, go nowhere.
        assert!(l.follow("d/f", "e3").is_none());
        assert!(l.follow("d/f", "x").is_none());
        assert!(l.follow("d/g", "e1").is_none());
        // The same contents uploaded again (A -> B -> C -> A): the newest, without looping.
        l.record(&k, "e3", "e1", attr(5000));
        assert_eq!(l.follow("d/f", "e2").unwrap().1, "e1");
        assert!(l.follow("d/f", "e1").is_none());
        l.forget("d/f");
        assert!(l.follow("d/f", "e1").is_none());
    }
}
