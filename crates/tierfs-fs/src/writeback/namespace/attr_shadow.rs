//! What deferred setattrs of one object change in its attributes (`AttrShadow`): shown over
//! what the store or the metadata cache say until they are on the store (`ns_chattr`), kept
//! by the namespace queue (`ns_queue`).

use tierfs_store::{Attr, SetAttr, TimeSpec, TimeUpdate};

/// The fields deferred setattrs of one object set, shown over its attributes until they are
/// on the store (and, applied once, what a deferred setattr of a new object changes in it:
/// `Writeback::setattr_deferred`).
#[derive(Clone, Copy, Debug)]
pub(super) struct AttrShadow {
    perm: Option<u16>,
    uid: Option<u32>,
    gid: Option<u32>,
    atime: Option<TimeSpec>,
    mtime: Option<TimeSpec>,
    ctime: TimeSpec,
}

impl AttrShadow {
    pub(super) fn new(now: TimeSpec) -> AttrShadow {
        AttrShadow {
            perm: None,
            uid: None,
            gid: None,
            atime: None,
            mtime: None,
            ctime: now,
        }
    }

    /// One more setattr (its times resolved) made at `now`.
    pub(super) fn add(&mut self, set: &SetAttr, now: TimeSpec) {
        let t = |u: &Option<TimeUpdate>| match u {
            Some(TimeUpdate::Set(t)) => Some(*t),
            Some(TimeUpdate::Now) => Some(now),
            None => None,
        };
        self.perm = set.mode.map(|m| (m & 0o7777) as u16).or(self.perm);
        self.uid = set.uid.or(self.uid);
        self.gid = set.gid.or(self.gid);
        self.atime = t(&set.atime).or(self.atime);
        self.mtime = t(&set.mtime).or(self.mtime);
        self.ctime = now;
    }

    pub(super) fn over(&self, a: &mut Attr) {
        if let Some(p) = self.perm {
            a.perm = p;
        }
        if let Some(u) = self.uid {
            a.uid = u;
        }
        if let Some(g) = self.gid {
            a.gid = g;
        }
        if let Some(t) = self.atime {
            a.atime = t;
        }
        if let Some(t) = self.mtime {
            a.mtime = t;
        }
        a.ctime = self.ctime;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_store::FileKind;

    #[test]
    fn later_setattrs_win_and_fields_not_set_are_left() {
        let t = |sec| TimeSpec { sec, nsec: 0 };
        let mut s = AttrShadow::new(t(1));
        s.add(
            &SetAttr {
                mode: Some(0o100_600),
                atime: Some(TimeUpdate::Set(t(5))),
                ..Default::default()
            },
            t(2),
        );
        s.add(
            &SetAttr {
                mode: Some(0o640),
                uid: Some(7),
                mtime: Some(TimeUpdate::Now),
                ..Default::default()
            },
            t(3),
        );
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_mode = libc::S_IFREG | 0o644;
        st.st_uid = 1;
        st.st_gid = 2;
        st.st_mtime = 100;
        let mut a = Attr::from_stat(&st);
        s.over(&mut a);
        assert_eq!(a.perm, 0o640);
        assert_eq!((a.uid, a.gid), (7, 2), "the gid was not set");
        assert_eq!(a.atime, t(5), "set by the first, kept by the second");
        assert_eq!(a.mtime, t(3), "\"now\" is when it was asked");
        assert_eq!(a.ctime, t(3));
        assert_eq!(a.kind, FileKind::File);
    }
}
