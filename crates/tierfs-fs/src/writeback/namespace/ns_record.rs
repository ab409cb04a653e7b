//! The payload of a journal NS record (journal format 2): one namespace operation, named by
//! backing paths, so replay can apply it with nothing but the store (docs/writeback/journal.md,
//! "Journal format").
//!
//! ```text
//! payload = version u8 (1) | op u8 | op fields
//! CREATE  (op 1) = kind u8 (1 file, 2 directory, 3 symlink, 4 FIFO, 5 socket, 6 character
//!                  device, 7 block device) | mode u32 | has owner u8 | uid u32
//!                  | gid u32 | parent path (u16 length, bytes) | name (u16 length, bytes)
//!                  [| target (u16 length, bytes): kind 3 only] [| rdev u64: kinds 4 to 7]
//! SETATTR (op 2) = path (u16 length, bytes) | mask u8 (1 mode, 2 uid, 4 gid, 8 atime, 16 mtime)
//!                  | mode u32 | uid u32 | gid u32 | atime s i64 | atime ns u32 | mtime s i64
//!                  | mtime ns u32
//! UNLINK  (op 3) = path (u16 length, bytes) | kind u8 (1 file, 2 directory: an rmdir,
//!                  3 symlink) | prov u64 (the seq
//!                  of the CREATE that made it: its data records are dropped at replay)
//! RENAME  (op 4) = from path (u16 length, bytes) | to path (u16 length, bytes) | prov u64 (the
//!                  seq of the CREATE that made it: its data records follow it at replay)
//! RENAME OVER (op 5) = RENAME's fields | replaced u64 (the seq of the CREATE of the object
//!                  the rename replaced: that object is not made at replay, its setattrs are
//!                  not applied and its data records are dropped)
//! MOVE    (op 6) = from path (u16 length, bytes) | to path (u16 length, bytes) | prov u64 (the
//!                  seq of the CREATE that made it): a file or symlink the namespace flusher
//!                  had taken (made, or being made, under `from`) renamed to a free name in
//!                  its directory; replay renames `from` to `to` on the store, in its place
//!                  in the journal order, and its data records follow it
//! REMOVE  (op 7) = path (u16 length, bytes) | kind u8 (1 file, 2 directory: an rmdir,
//!                  3 symlink) | dev u64 | ino u64 | size u64: an unlink or rmdir of an object
//!                  of the store (`ns_remove`); replay removes `path` only if it still holds
//!                  that object (the same kind, size but for a directory, and `(dev, ino)`
//!                  unless that is a path identity)
//! CHATTR  (op 8) = SETATTR's fields | kind u8 (1 file, 2 directory, 3 symlink) | dev u64
//!                  | ino u64: a setattr of an object of the store (`ns_chattr`); replay sets
//!                  `path`'s attributes only if it still holds that object (the same kind, and
//!                  `(dev, ino)` unless that is a path identity)
//! LINK    (op 9) = from path (u16 length, bytes) | to path (u16 length, bytes) | prov u64 (the
//!                  seq of the CREATE that made it): a hard link, in its directory, of a file
//!                  whose create the namespace flusher had not taken (`ns_link`). The create
//!                  makes `to` (as after a RENAME, its data records follow it), and `from`
//!                  is then linked to it on the store, unless an UNALIAS withdraws it
//! UNALIAS (op 10) = path (u16 length, bytes) | link u64 (the seq of the LINK whose `from` it
//!                  is) | prov u64: that name unlinked before the store had it: the LINK
//!                  makes nothing on the store
//! MOVE OVER (op 11) = MOVE's fields | kind u8 (1 file, 3 symlink) | dev u64 | ino u64
//!                  | size u64: a MOVE whose new name held an object of the store, which it
//!                  replaces (`ns_replace`: `rsync`'s and an editor's temporary file renamed
//!                  over the file it updates); replay renames `from` over `to` only if `to`
//!                  still holds that object (as REMOVE checks it) or nothing
//! ```
//! Integers are little-endian; paths are relative to the backing root. Times are the ones
//! the application asked for, resolved when it asked ("now" is recorded as that instant), so
//! a replay sets the same ones. Decoding untrusted bytes never panics. (Kind 3 came later
//! than the rest: a daemon from before it logs such a record as unreadable and skips it, so
//! downgrade only with an empty journal. The same holds for ops 5 to 11, and for kinds 4 to 7,
//! the deferred mknod.)

use tierfs_store::{FileKind, SetAttr, TimeSpec, TimeUpdate};

const VERSION: u8 = 1;
const OP_CREATE: u8 = 1;
const OP_SETATTR: u8 = 2;
const OP_UNLINK: u8 = 3;
const OP_RENAME: u8 = 4;
const OP_RENAME_OVER: u8 = 5;
pub(super) const OP_MOVE: u8 = 6;
const OP_REMOVE: u8 = 7;
const OP_CHATTR: u8 = 8;
const OP_LINK: u8 = 9;
const OP_UNALIAS: u8 = 10;
pub(super) const OP_MOVE_OVER: u8 = 11;

/// What a MOVE OVER's new name held: its kind, identity as the store gave it (a path
/// identity is not checked) and size.
pub(crate) type Replaced = (FileKind, (u64, u64), u64);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NsOp {
    /// A regular file, a directory, a symlink or a special file (a mknod) made in `parent`
    /// as `name`.
    Create {
        parent: Vec<u8>,
        name: Vec<u8>,
        kind: FileKind,
        mode: u32,
        /// Set on the store when the daemon runs as root.
        owner: Option<(u32, u32)>,
        /// A symlink's target (empty for the other kinds).
        target: Vec<u8>,
        /// A device's number (`st_rdev`), as mknod(2) takes it (0 for the other kinds).
        rdev: u64,
    },
    SetAttr {
        path: Vec<u8>,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<TimeSpec>,
        mtime: Option<TimeSpec>,
        /// Of an object of the store (op 8, `ns_chattr`): its kind and identity as the store
        /// gave it, checked at replay; None: of an object write-back made (op 2).
        of: Option<(FileKind, (u64, u64))>,
        /// A truncate of a file of the store (op 8 only: `ns_chattr`, to 0), mask bit 5: the
        /// size and the file's journal key, after the identity. Replay writes none of that
        /// key's data records older than this one (the truncate made them moot).
        size: Option<(u64, (u64, u64))>,
    },
    /// A file or symlink made by the CREATE of seq `prov`, removed before it reached the
    /// store (`Writeback::unlink_deferred`).
    Unlink {
        path: Vec<u8>,
        kind: FileKind,
        prov: u64,
    },
    /// A file or symlink made by the CREATE of seq `prov`, renamed before it reached the
    /// store (`Writeback::rename_deferred`).
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
        prov: u64,
        /// The seq of the CREATE of the object it replaced, one write-back made and withdrew
        /// (op 5); None: the new name was free (op 4).
        replaced: Option<u64>,
    },
    /// A file or symlink made by the CREATE of seq `prov`, renamed in its directory to a
    /// free name after the namespace flusher had taken its create (`Writeback::move_deferred`),
    /// or over a file or symlink of the store (`Writeback::replace_deferred`): applied on the
    /// store in journal order.
    Move {
        from: Vec<u8>,
        to: Vec<u8>,
        prov: u64,
        /// What `to` held (op 11). None: `to` was free (op 6).
        over: Option<Replaced>,
    },
    /// A file or symlink of the store unlinked (`Writeback::remove_deferred`): removed on
    /// the store in journal order, if `path` still holds it.
    Remove {
        path: Vec<u8>,
        kind: FileKind,
        /// Its identity as the store gave it (`(dev, ino)`; a path identity is not checked).
        id: (u64, u64),
        size: u64,
    },
    /// A file made by the CREATE of seq `prov`, whose create the flusher had not taken,
    /// hard-linked as `to` in its directory (`Writeback::link_deferred`): the create makes
    /// `to`, and `from` (the name it had) is linked to it after.
    Link {
        from: Vec<u8>,
        to: Vec<u8>,
        prov: u64,
    },
    /// The name `path` a LINK (of seq `link`) left to the file of CREATE `prov`, unlinked
    /// before the link was applied (`Writeback::unalias_deferred`): never made.
    Unalias { path: Vec<u8>, link: u64, prov: u64 },
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_time(out: &mut Vec<u8>, t: Option<TimeSpec>) {
    let t = t.unwrap_or_default();
    out.extend_from_slice(&t.sec.to_le_bytes());
    out.extend_from_slice(&t.nsec.to_le_bytes());
}

/// The kind byte of CREATE, UNLINK and REMOVE: 1 file, 2 directory, 3 symlink, 4 FIFO,
/// 5 socket, 6 character device, 7 block device.
fn kind_byte(kind: FileKind) -> u8 {
    match kind {
        FileKind::File => 1,
        FileKind::Dir => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::Socket => 5,
        FileKind::CharDev => 6,
        FileKind::BlockDev => 7,
    }
}

/// Whether a CREATE of `kind` is a mknod of a special file (its record carries `rdev`).
pub(crate) fn is_special(kind: FileKind) -> bool {
    matches!(
        kind,
        FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev
    )
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or("namespace record too short")?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    fn i64(&mut self) -> Result<i64, &'static str> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, &'static str> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().unwrap_or_default()) as usize;
        Ok(self.take(n)?.to_vec())
    }
    /// A kind byte (see [`kind_byte`]).
    fn kind(&mut self) -> Result<FileKind, &'static str> {
        match self.u8()? {
            1 => Ok(FileKind::File),
            2 => Ok(FileKind::Dir),
            3 => Ok(FileKind::Symlink),
            4 => Ok(FileKind::Fifo),
            5 => Ok(FileKind::Socket),
            6 => Ok(FileKind::CharDev),
            7 => Ok(FileKind::BlockDev),
            _ => Err("namespace record: unknown kind"),
        }
    }
    fn time(&mut self) -> Result<TimeSpec, &'static str> {
        let sec = self.i64()?;
        let nsec = self.u32()?;
        if nsec >= 1_000_000_000 {
            return Err("namespace record: nanoseconds out of range");
        }
        Ok(TimeSpec { sec, nsec })
    }
}

impl NsOp {
    /// A SETATTR of `set` (a size only of a store object's CHATTR), its "now" times resolved
    /// to `now`.
    pub(crate) fn setattr(path: Vec<u8>, set: &SetAttr, now: TimeSpec) -> NsOp {
        let t = |u: &Option<TimeUpdate>| match u {
            Some(TimeUpdate::Set(t)) => Some(*t),
            Some(TimeUpdate::Now) => Some(now),
            None => None,
        };
        NsOp::SetAttr {
            path,
            mode: set.mode,
            uid: set.uid,
            gid: set.gid,
            atime: t(&set.atime),
            mtime: t(&set.mtime),
            of: None,
            size: set.size.map(|s| (s, (0, 0))),
        }
    }

    /// The store setattr it makes (times as recorded).
    pub(crate) fn set_attr(&self) -> Option<SetAttr> {
        match self {
            NsOp::SetAttr {
                mode,
                uid,
                gid,
                atime,
                mtime,
                size,
                ..
            } => Some(SetAttr {
                mode: *mode,
                uid: *uid,
                gid: *gid,
                size: size.map(|(s, _)| s),
                atime: atime.map(TimeUpdate::Set),
                mtime: mtime.map(TimeUpdate::Set),
            }),
            _ => None,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        match self {
            NsOp::Create {
                parent,
                name,
                kind,
                mode,
                owner,
                target,
                rdev,
            } => {
                out.push(OP_CREATE);
                out.push(kind_byte(*kind));
                out.extend_from_slice(&mode.to_le_bytes());
                out.push(owner.is_some() as u8);
                let (u, g) = owner.unwrap_or((0, 0));
                out.extend_from_slice(&u.to_le_bytes());
                out.extend_from_slice(&g.to_le_bytes());
                put_bytes(&mut out, parent);
                put_bytes(&mut out, name);
                if *kind == FileKind::Symlink {
                    put_bytes(&mut out, target);
                }
                if is_special(*kind) {
                    out.extend_from_slice(&rdev.to_le_bytes());
                }
            }
            NsOp::SetAttr {
                path,
                mode,
                uid,
                gid,
                atime,
                mtime,
                of,
                size,
            } => {
                out.push(if of.is_some() { OP_CHATTR } else { OP_SETATTR });
                put_bytes(&mut out, path);
                let mask = mode.is_some() as u8
                    | (uid.is_some() as u8) << 1
                    | (gid.is_some() as u8) << 2
                    | (atime.is_some() as u8) << 3
                    | (mtime.is_some() as u8) << 4
                    | (size.is_some() as u8) << 5;
                out.push(mask);
                out.extend_from_slice(&mode.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&uid.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&gid.unwrap_or(0).to_le_bytes());
                put_time(&mut out, *atime);
                put_time(&mut out, *mtime);
                if let Some((kind, id)) = of {
                    out.push(kind_byte(*kind));
                    out.extend_from_slice(&id.0.to_le_bytes());
                    out.extend_from_slice(&id.1.to_le_bytes());
                }
                if let Some((size, key)) = size {
                    out.extend_from_slice(&size.to_le_bytes());
                    out.extend_from_slice(&key.0.to_le_bytes());
                    out.extend_from_slice(&key.1.to_le_bytes());
                }
            }
            NsOp::Unlink { path, kind, prov } => {
                out.push(OP_UNLINK);
                put_bytes(&mut out, path);
                out.push(kind_byte(*kind));
                out.extend_from_slice(&prov.to_le_bytes());
            }
            NsOp::Rename {
                from,
                to,
                prov,
                replaced,
            } => {
                out.push(if replaced.is_some() {
                    OP_RENAME_OVER
                } else {
                    OP_RENAME
                });
                put_bytes(&mut out, from);
                put_bytes(&mut out, to);
                out.extend_from_slice(&prov.to_le_bytes());
                if let Some(r) = replaced {
                    out.extend_from_slice(&r.to_le_bytes());
                }
            }
            NsOp::Link { from, to, prov } => {
                out.push(OP_LINK);
                put_bytes(&mut out, from);
                put_bytes(&mut out, to);
                out.extend_from_slice(&prov.to_le_bytes());
            }
            NsOp::Unalias { path, link, prov } => {
                out.push(OP_UNALIAS);
                put_bytes(&mut out, path);
                out.extend_from_slice(&link.to_le_bytes());
                out.extend_from_slice(&prov.to_le_bytes());
            }
            NsOp::Move {
                from,
                to,
                prov,
                over,
            } => {
                out.push(if over.is_some() {
                    OP_MOVE_OVER
                } else {
                    OP_MOVE
                });
                put_bytes(&mut out, from);
                put_bytes(&mut out, to);
                out.extend_from_slice(&prov.to_le_bytes());
                if let Some((kind, id, size)) = over {
                    out.push(kind_byte(*kind));
                    out.extend_from_slice(&id.0.to_le_bytes());
                    out.extend_from_slice(&id.1.to_le_bytes());
                    out.extend_from_slice(&size.to_le_bytes());
                }
            }
            NsOp::Remove {
                path,
                kind,
                id,
                size,
            } => {
                out.push(OP_REMOVE);
                put_bytes(&mut out, path);
                out.push(kind_byte(*kind));
                out.extend_from_slice(&id.0.to_le_bytes());
                out.extend_from_slice(&id.1.to_le_bytes());
                out.extend_from_slice(&size.to_le_bytes());
            }
        }
        out
    }

    pub(crate) fn decode(b: &[u8]) -> Result<NsOp, &'static str> {
        let mut r = Reader { b, at: 0 };
        if r.u8()? != VERSION {
            return Err("namespace record of an unknown version");
        }
        let op = match r.u8()? {
            OP_CREATE => {
                let kind = r.kind()?;
                let mode = r.u32()?;
                let has_owner = r.u8()? != 0;
                let (u, g) = (r.u32()?, r.u32()?);
                let parent = r.bytes()?;
                let name = r.bytes()?;
                if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
                    return Err("namespace record: not a name");
                }
                let target = match kind {
                    FileKind::Symlink => r.bytes()?,
                    _ => Vec::new(),
                };
                if kind == FileKind::Symlink && (target.is_empty() || target.contains(&0)) {
                    return Err("namespace record: not a symlink target");
                }
                let rdev = if is_special(kind) { r.i64()? as u64 } else { 0 };
                NsOp::Create {
                    parent,
                    name,
                    kind,
                    mode,
                    owner: has_owner.then_some((u, g)),
                    target,
                    rdev,
                }
            }
            op @ (OP_SETATTR | OP_CHATTR) => {
                let path = r.bytes()?;
                let mask = r.u8()?;
                let (mode, uid, gid) = (r.u32()?, r.u32()?, r.u32()?);
                let (atime, mtime) = (r.time()?, r.time()?);
                let on = |bit: u8| mask & (1 << bit) != 0;
                let of = if op == OP_CHATTR {
                    let kind = r.kind()?;
                    Some((kind, (r.i64()? as u64, r.i64()? as u64)))
                } else {
                    None
                };
                if on(5) && of.is_none() {
                    return Err("namespace record: a size of a new object");
                }
                let size = if on(5) {
                    let size = r.i64()? as u64;
                    Some((size, (r.i64()? as u64, r.i64()? as u64)))
                } else {
                    None
                };
                NsOp::SetAttr {
                    path,
                    mode: on(0).then_some(mode),
                    uid: on(1).then_some(uid),
                    gid: on(2).then_some(gid),
                    atime: on(3).then_some(atime),
                    mtime: on(4).then_some(mtime),
                    of,
                    size,
                }
            }
            OP_UNLINK => {
                let path = r.bytes()?;
                let kind = r.kind()?;
                let prov = r.i64()? as u64;
                if path.is_empty() {
                    return Err("namespace record: not a path");
                }
                NsOp::Unlink { path, kind, prov }
            }
            op @ (OP_RENAME | OP_RENAME_OVER) => {
                let (from, to) = (r.bytes()?, r.bytes()?);
                let prov = r.i64()? as u64;
                let replaced = if op == OP_RENAME_OVER {
                    Some(r.i64()? as u64)
                } else {
                    None
                };
                if from.is_empty() || to.is_empty() {
                    return Err("namespace record: not a path");
                }
                NsOp::Rename {
                    from,
                    to,
                    prov,
                    replaced,
                }
            }
            OP_LINK => {
                let (from, to) = (r.bytes()?, r.bytes()?);
                let prov = r.i64()? as u64;
                if from.is_empty() || to.is_empty() || from == to {
                    return Err("namespace record: not a path");
                }
                NsOp::Link { from, to, prov }
            }
            OP_UNALIAS => {
                let path = r.bytes()?;
                let (link, prov) = (r.i64()? as u64, r.i64()? as u64);
                if path.is_empty() {
                    return Err("namespace record: not a path");
                }
                NsOp::Unalias { path, link, prov }
            }
            op @ (OP_MOVE | OP_MOVE_OVER) => {
                let (from, to) = (r.bytes()?, r.bytes()?);
                let prov = r.i64()? as u64;
                let over = if op == OP_MOVE_OVER {
                    let kind = r.kind()?;
                    let id = (r.i64()? as u64, r.i64()? as u64);
                    Some((kind, id, r.i64()? as u64))
                } else {
                    None
                };
                if from.is_empty() || to.is_empty() || from == to {
                    return Err("namespace record: not a path");
                }
                NsOp::Move {
                    from,
                    to,
                    prov,
                    over,
                }
            }
            OP_REMOVE => {
                let path = r.bytes()?;
                let kind = r.kind()?;
                let id = (r.i64()? as u64, r.i64()? as u64);
                let size = r.i64()? as u64;
                if path.is_empty() {
                    return Err("namespace record: not a path");
                }
                NsOp::Remove {
                    path,
                    kind,
                    id,
                    size,
                }
            }
            _ => return Err("namespace record: unknown operation"),
        };
        if r.at != b.len() {
            return Err("namespace record: bytes after its end");
        }
        Ok(op)
    }
}

#[cfg(test)]
#[path = "ns_record_tests.rs"]
mod tests;
