//! Folding a group's setattrs into the create before them (see `ns`): tar makes a file with
//! mode 0600, writes it, sets its mtime, chowns it and chmods it. Applied one by one that is
//! four store calls (each with an fstat) where the create alone, made with the final mode,
//! does the same. What may be folded, and why it changes nothing the store ends up with:
//!
//! - a mode change into the create's mode, unless it has setuid or setgid bits (a later chown
//!   clears those, and a directory's setgid bit decides the group of what is made in it);
//! - a chown to the owner the object already has, when its mode has no setuid or setgid bit
//!   (such a chown changes nothing then; with those bits it would clear them);
//! - an mtime-only change of a file with dirty data: the data flush sets the file's mtime to
//!   the application's after writing (`Dirty::mtime_ns`, set by this very setattr), and a
//!   write after it would have moved it anyway.
//!
//! Once one change of an object cannot be folded, none after it is (their order with it
//! matters); times never depend on the others.

use crate::identity::Ident;
use rustc_hash::FxHashMap;
use tierfs_store::{FileKind, SetAttr, SUID_SGID};

/// A job of the group as folding sees it.
pub(crate) enum FoldIn {
    Create {
        id: Ident,
        kind: FileKind,
        mode: u32,
        /// The owner the object gets (as predicted for the provisional object).
        owner: (u32, u32),
    },
    SetAttr {
        id: Ident,
        set: SetAttr,
        /// The file has dirty data (its flush sets its mtime).
        dirty: bool,
    },
    /// Nothing to fold (a withdrawn create).
    Skip,
}

/// What to do with each job of the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FoldOut {
    /// A create, made with this mode.
    Create {
        mode: u32,
    },
    /// A setattr: what is left of it to apply (None: nothing).
    SetAttr(Option<SetAttr>),
    Skip,
}

struct Open {
    kind: FileKind,
    mode: u32,
    owner: (u32, u32),
    folding: bool,
    create_at: usize,
}

pub(crate) fn fold(jobs: &[FoldIn]) -> Vec<FoldOut> {
    let mut out: Vec<FoldOut> = Vec::with_capacity(jobs.len());
    let mut open: FxHashMap<Ident, Open> = FxHashMap::default();
    for (k, j) in jobs.iter().enumerate() {
        match j {
            FoldIn::Create {
                id,
                kind,
                mode,
                owner,
            } => {
                open.insert(
                    *id,
                    Open {
                        kind: *kind,
                        mode: *mode,
                        owner: *owner,
                        folding: true,
                        create_at: k,
                    },
                );
                out.push(FoldOut::Create { mode: *mode });
            }
            FoldIn::SetAttr { id, set, dirty } => {
                let mut rest = *set;
                if let Some(o) = open.get_mut(id) {
                    if let Some(m) = set.mode {
                        let dir_sgid = o.kind == FileKind::Dir && (o.mode | m) & SUID_SGID != 0;
                        if o.folding && m & SUID_SGID == 0 && !dir_sgid {
                            o.mode = (o.mode & !0o7777) | (m & 0o7777);
                            rest.mode = None;
                        } else {
                            o.folding = false;
                        }
                    }
                    if set.uid.is_some() || set.gid.is_some() {
                        let to = (set.uid.unwrap_or(o.owner.0), set.gid.unwrap_or(o.owner.1));
                        if o.folding && to == o.owner && o.mode & SUID_SGID == 0 {
                            rest.uid = None;
                            rest.gid = None;
                        } else {
                            o.folding = false;
                        }
                    }
                    if o.kind == FileKind::File && *dirty && set.atime.is_none() {
                        rest.mtime = None;
                    }
                    if let FoldOut::Create { mode } = &mut out[o.create_at] {
                        *mode = o.mode;
                    }
                }
                let empty = rest.mode.is_none()
                    && rest.uid.is_none()
                    && rest.gid.is_none()
                    && rest.size.is_none()
                    && rest.atime.is_none()
                    && rest.mtime.is_none();
                out.push(FoldOut::SetAttr((!empty).then_some(rest)));
            }
            FoldIn::Skip => out.push(FoldOut::Skip),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierfs_store::{TimeSpec, TimeUpdate};

    const X: Ident = (1, 1);
    const Y: Ident = (1, 2);

    fn set(f: impl FnOnce(&mut SetAttr)) -> SetAttr {
        let mut s = SetAttr::default();
        f(&mut s);
        s
    }

    fn create(id: Ident, kind: FileKind, mode: u32) -> FoldIn {
        FoldIn::Create {
            id,
            kind,
            mode,
            owner: (0, 0),
        }
    }

    fn attr(id: Ident, set: SetAttr, dirty: bool) -> FoldIn {
        FoldIn::SetAttr { id, set, dirty }
    }

    fn mtime() -> Option<TimeUpdate> {
        Some(TimeUpdate::Set(TimeSpec { sec: 5, nsec: 0 }))
    }

    #[test]
    fn tar_file_is_one_create() {
        let jobs = [
            create(X, FileKind::File, 0o600),
            attr(X, set(|s| s.mtime = mtime()), true),
            attr(
                X,
                set(|s| {
                    s.uid = Some(0);
                    s.gid = Some(0)
                }),
                true,
            ),
            attr(X, set(|s| s.mode = Some(0o644)), true),
        ];
        assert_eq!(
            fold(&jobs),
            vec![
                FoldOut::Create { mode: 0o644 },
                FoldOut::SetAttr(None),
                FoldOut::SetAttr(None),
                FoldOut::SetAttr(None),
            ]
        );
    }

    #[test]
    fn what_cannot_be_folded_stays_in_order() {
        // An empty file keeps its mtime change; a real chown stays, and the chmod after it
        // too (chown clears setuid: order matters).
        let jobs = [
            create(X, FileKind::File, 0o600),
            attr(X, set(|s| s.mtime = mtime()), false),
            attr(X, set(|s| s.uid = Some(1000)), false),
            attr(X, set(|s| s.mode = Some(0o644)), false),
        ];
        let out = fold(&jobs);
        assert_eq!(out[0], FoldOut::Create { mode: 0o600 });
        assert_eq!(out[1], FoldOut::SetAttr(Some(set(|s| s.mtime = mtime()))));
        assert_eq!(out[2], FoldOut::SetAttr(Some(set(|s| s.uid = Some(1000)))));
        assert_eq!(
            out[3],
            FoldOut::SetAttr(Some(set(|s| s.mode = Some(0o644))))
        );
    }

    #[test]
    fn setuid_and_setgid_are_never_folded() {
        let jobs = [
            create(X, FileKind::File, 0o600),
            attr(X, set(|s| s.mode = Some(0o4755)), true),
            attr(X, set(|s| s.uid = Some(0)), true),
            create(Y, FileKind::Dir, 0o2755),
            attr(Y, set(|s| s.mode = Some(0o755)), false),
        ];
        let out = fold(&jobs);
        assert_eq!(out[0], FoldOut::Create { mode: 0o600 });
        assert_eq!(
            out[1],
            FoldOut::SetAttr(Some(set(|s| s.mode = Some(0o4755))))
        );
        assert_eq!(out[2], FoldOut::SetAttr(Some(set(|s| s.uid = Some(0)))));
        assert_eq!(out[3], FoldOut::Create { mode: 0o2755 });
        assert_eq!(
            out[4],
            FoldOut::SetAttr(Some(set(|s| s.mode = Some(0o755))))
        );
    }

    #[test]
    fn setattr_of_an_object_made_in_an_earlier_group_is_kept() {
        let jobs = [attr(X, set(|s| s.mode = Some(0o644)), true)];
        assert_eq!(
            fold(&jobs),
            vec![FoldOut::SetAttr(Some(set(|s| s.mode = Some(0o644))))]
        );
    }
}
