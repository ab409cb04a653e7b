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
//! ESTALE; nor a version of ours made before the handle was opened (its ETag may be that of
//! bytes someone else put back since). The record is bounded; a forgotten step only brings
//! that ESTALE back.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tierfs_store::Attr;

/// Steps kept per key: a handle more than this many of our uploads behind re-opens (ESTALE).
const STEPS_PER_KEY: usize = 8;
/// Keys kept; past it the half least recently uploaded to are forgotten.
const MAX_KEYS: usize = 8192;

struct Step {
    /// When it was recorded ([`Lineage::now`]): a handle follows only steps after its open.
    seq: u64,
    from: String,
    to: String,
    attr: Attr,
}

#[derive(Default)]
struct Inner {
    steps: HashMap<Arc<str>, Vec<Step>>,
    seq: u64,
}

#[derive(Default)]
pub(crate) struct Lineage {
    inner: Mutex<Inner>,
}

impl Lineage {
    /// The position a handle opened now starts from (taken before its HEAD: an upload that
    /// lands meanwhile is then followed if the HEAD saw the version before it).
    pub fn now(&self) -> u64 {
        self.inner.lock().seq
    }

    /// Our upload replaced version `from` of `rel` with `to`, whose attributes are `attr`.
    /// ETags are compared without their quotes; `to` is kept as given.
    pub fn record(&self, rel: &Arc<str>, from: &str, to: &str, attr: Attr) {
        let mut g = self.inner.lock();
        g.seq += 1;
        let seq = g.seq;
        if g.steps.len() >= MAX_KEYS && !g.steps.contains_key(rel) {
            let mut last: Vec<u64> = g
                .steps
                .values()
                .filter_map(|v| v.last().map(|s| s.seq))
                .collect();
            let (_, median, _) = last.select_nth_unstable(MAX_KEYS / 2);
            let cut = *median;
            g.steps.retain(|_, v| v.last().is_some_and(|s| s.seq > cut));
        }
        let v = g.steps.entry(rel.clone()).or_default();
        if v.len() >= STEPS_PER_KEY {
            v.remove(0);
        }
        v.push(Step {
            seq,
            from: from.trim_matches('"').to_string(),
            to: to.to_string(),
            attr,
        });
    }

    /// The version of `rel` that our own uploads, made after position `since`, made of
    /// version `etag`, if any: its attributes and ETag. (ETags are content hashes: someone
    /// else may put back bytes that one of ours had replaced; their object is not ours to
    /// follow, and a handle opened on it started after that step.)
    pub fn follow(&self, rel: &str, etag: &str, since: u64) -> Option<(Attr, String)> {
        let g = self.inner.lock();
        let v = g.steps.get(rel)?;
        let etag = etag.trim_matches('"');
        // Steps are in upload order: from the first upload after `since` made over the
        // handle's version, along the uploads that followed it.
        let mut j = v.iter().position(|s| s.seq > since && s.from == etag)?;
        while j + 1 < v.len() && v[j + 1].from == v[j].to.trim_matches('"') {
            j += 1;
        }
        let s = &v[j];
        // Back at the handle's own contents (the same bytes uploaded again): nothing to follow.
        (s.to.trim_matches('"') != etag).then(|| (s.attr, s.to.clone()))
    }

    /// `rel` was removed or renamed: a later object of that name is not ours to follow to.
    pub fn forget(&self, rel: &str) {
        self.inner.lock().steps.remove(rel);
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
        let at_open = l.now();
        assert!(l.follow("d/f", "e1", at_open).is_none());
        l.record(&k, "e1", "e2", attr(5000));
        l.record(&k, "\"e2\"", "\"e3\"", attr(9005));
        let (a, e) = l.follow("d/f", "\"e1\"", at_open).unwrap();
        assert_eq!((a.size, e.as_str()), (9005, "\"e3\""));
        assert_eq!(l.follow("d/f", "e2", at_open).unwrap().1, "\"e3\"");
        // The newest version, and versions we did not make, go nowhere.
        assert!(l.follow("d/f", "e3", at_open).is_none());
        assert!(l.follow("d/f", "x", at_open).is_none());
        assert!(l.follow("d/g", "e1", at_open).is_none());
        // Someone else put back the bytes of e1: a handle opened on their object now does
        // not follow our old upload.
        assert!(l.follow("d/f", "e1", l.now()).is_none());
        // The same contents uploaded again (A -> B -> C -> A): the newest, without looping.
        l.record(&k, "e3", "e1", attr(5000));
        assert_eq!(l.follow("d/f", "e2", at_open).unwrap().1, "e1");
        assert!(l.follow("d/f", "e1", at_open).is_none());
        l.forget("d/f");
        assert!(l.follow("d/f", "e1", at_open).is_none());
    }

    #[test]
    fn a_full_record_forgets_the_keys_uploaded_to_longest_ago() {
        let l = Lineage::default();
        let at_open = l.now();
        for i in 0..MAX_KEYS + 10 {
            let k: Arc<str> = format!("k{i}").into();
            l.record(&k, "a", "b", attr(1));
        }
        let n = l.inner.lock().steps.len();
        assert!(n <= MAX_KEYS / 2 + 11, "{n}");
        assert!(l.follow("k0", "a", at_open).is_none());
        assert!(l
            .follow(&format!("k{}", MAX_KEYS + 9), "a", at_open)
            .is_some());
    }
}
