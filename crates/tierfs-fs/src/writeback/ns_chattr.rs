//! A deferred setattr of an object of the store (see `ns`): `chmod -R`, `chown -R`, `touch`
//! of a directory or symlink, tar setting the times of a directory that was already there.
//! Each was a store round trip the application waited for (`chmod -R` of a 2,867-entry
//! tree over the nfs-lan emulator: 14.9 s in write-back, the store alone 15.6 s; 4.0 s since).
//!
//! The change is journaled (CHATTR, op 8: the SETATTR fields and the object's kind and
//! identity), queued as a setattr of the object's inode, and shown at once: its fields lie
//! over what the store or the metadata cache say (`AttrShadow`, by kernel inode) until the
//! namespace flusher has applied it through the object's own node. Replay sets `path`'s
//! attributes only if the name still holds that object.
//!
//! What is not deferred, done on the store as before: a size change (a truncate), a setuid
//! or setgid bit set or held (the store drops them by rules of its own at a chown), an owner
//! change by a daemon that is not root or a change of someone else's object (the store
//! would refuse it later, not now), and an mtime of a regular file (its data flush sets the
//! application's mtime after writing, and the two would race), or any change of a file with
//! dirty data. While a deferred one is queued, a setattr done on the store waits for it
//! (`Fs::before_setattr`), and so does an unlink or rename done on the store (`ns_narrow`,
//! `ns_remove`).

use super::ns_queue::Job;
use super::ns_record::NsOp;
use super::Writeback;
use crate::inode::Inode;
use crate::namespace::is_provisional;
use crate::shared::St;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::journal::Record;
use tierfs_store::{Attr, FileKind, SetAttr, Store, TimeSpec, TimeUpdate, SUID_SGID};

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

impl<S: Store> Writeback<S> {
    /// A setattr of `i`, an object of the store, deferred (see the module comment): its
    /// attributes as the application now sees them. None: done on the store.
    pub(crate) fn chattr_deferred(&self, i: &Arc<Inode<St<S>>>, set: &SetAttr) -> Option<Attr> {
        let id = i.id();
        let nothing = set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
            && set.atime.is_none()
            && set.mtime.is_none();
        if !self.defers_namespace()
            || is_provisional(id)
            || set.size.is_some()
            || nothing
            || !matches!(i.kind, FileKind::File | FileKind::Dir | FileKind::Symlink)
            // (The store refuses it: Linux has no mode of a symlink to set.)
            || (i.kind == FileKind::Symlink && set.mode.is_some())
        {
            return None;
        }
        let (base, _) = self.ns.meta.attr(id)?;
        // SAFETY: no preconditions.
        let euid = unsafe { libc::geteuid() };
        let owner = set.uid.is_some() || set.gid.is_some();
        if base.kind != i.kind
            || (euid != 0 && (owner || base.uid != euid))
            || set.mode.is_some_and(|m| m & SUID_SGID != 0)
            || base.perm as u32 & SUID_SGID != 0
        {
            return None;
        }
        if let Some(st) = &i.file {
            if set.mtime.is_some() || st.has_dirty.load(Acquire) {
                return None;
            }
        }
        let path = self.backing_path(i)?;
        let now = TimeSpec::now();
        let mut op = NsOp::setattr(path, set, now);
        let NsOp::SetAttr { of, .. } = &mut op else {
            return None;
        };
        *of = Some((i.kind, id));
        let resolved = op.set_attr()?;
        let q = self.nsq.q.lock();
        let seq = self
            .journal
            .append(Record::Ns {
                payload: &op.encode(),
            })
            .ok()?;
        let shadow = {
            let mut m = self.nsq.attrs.lock();
            let e = m.entry(i.ino).or_insert((0, AttrShadow::new(now)));
            e.0 += 1;
            e.1.add(&resolved, now);
            self.nsq.attrs_shadowed.store(true, Relaxed);
            e.1
        };
        if i.kind == FileKind::Dir {
            // A directory with creates on their way into it shows its shadow's times
            // (`shadow_dir_attr`, laid over these): tar setting a directory's times once it
            // is done with it must move them there too.
            self.dir_changed(id, |a| shadow.over(a));
        }
        self.enqueue(
            q,
            Job::SetAttr {
                seq,
                inode: i.clone(),
                set: resolved,
                of_store: true,
                at: Instant::now(),
            },
        );
        let mut a = base;
        shadow.over(&mut a);
        Some(a)
    }

    /// A deferred setattr of an object of the store is on the store: once none is left for
    /// it, its shadow goes (what the store answered is in the metadata cache by then).
    pub(super) fn chattr_applied(&self, inode: &Inode<St<S>>) {
        let mut m = self.nsq.attrs.lock();
        if let Some(e) = m.get_mut(&inode.ino) {
            e.0 -= 1;
            if e.0 == 0 {
                m.remove(&inode.ino);
                self.nsq.attrs_unshadowed.fetch_add(1, AcqRel);
            }
        }
        self.nsq.attrs_shadowed.store(!m.is_empty(), Relaxed);
    }

    /// Kernel inode `ino` has a deferred setattr not yet on the store.
    pub(crate) fn chattr_pending(&self, ino: u64) -> bool {
        self.nsq.attrs_shadowed.load(Relaxed) && self.nsq.attrs.lock().contains_key(&ino)
    }

    /// Any object of the store has a deferred setattr not yet on the store.
    pub(crate) fn any_chattr_pending(&self) -> bool {
        self.nsq.attrs_shadowed.load(Relaxed)
    }

    /// `attr` of kernel inode `ino` with its deferred setattrs laid over it.
    pub(super) fn overlay_chattr(&self, ino: u64, attr: &mut Attr) {
        if !self.nsq.attrs_shadowed.load(Relaxed) {
            return;
        }
        if let Some((_, s)) = self.nsq.attrs.lock().get(&ino) {
            s.over(attr);
        }
    }

    /// Shadows of deferred setattrs dropped so far (see `Fs::shown_stable`).
    pub(crate) fn chattrs_unshadowed(&self) -> u64 {
        self.nsq.attrs_unshadowed.load(Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
