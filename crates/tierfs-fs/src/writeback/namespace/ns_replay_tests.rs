//! Tests of `ns_replay` (a file of their own: the module stays under the size limit).

use super::*;
use crate::counted::CountedStore;
use crate::identity::IdStore;
use std::path::Path;
use tierfs_cache::journal::{JournalConfig, Record};
use tierfs_store::{IdentityChoice, PosixStore};

fn symlink_record(seq: u64, parent: &str, name: &str, target: &str) -> PendingNs {
    let op = NsOp::Create {
        parent: parent.as_bytes().to_vec(),
        name: name.as_bytes().to_vec(),
        kind: FileKind::Symlink,
        mode: 0o777,
        owner: None,
        target: target.as_bytes().to_vec(),
        rdev: 0,
    };
    PendingNs {
        seq,
        payload: op.encode(),
    }
}

/// A store over directory `back` with identities `id`, as the daemon opens it, and a journal
/// in `jdir` for it.
pub(crate) fn store_and_journal(
    back: &Path,
    jdir: &Path,
    id: IdentityChoice,
) -> (IdStore<CountedStore<PosixStore>>, Journal) {
    let store = IdStore::new(CountedStore::new(PosixStore::open_with(back, id).unwrap())).unwrap();
    let (journal, _) =
        Journal::open(jdir, store.store_id(), JournalConfig::default(), false).unwrap();
    (store, journal)
}

pub(crate) fn record(seq: u64, op: NsOp) -> PendingNs {
    PendingNs {
        seq,
        payload: op.encode(),
    }
}

/// Appends `pending` to the journal as the daemon did (their seqs are the journal's).
pub(crate) fn append_all(journal: &Journal, pending: &[PendingNs]) {
    for p in pending {
        let seq = journal
            .append(Record::Ns {
                payload: &p.payload,
            })
            .unwrap();
        assert_eq!(seq, p.seq);
    }
}

fn link_of(p: &Path) -> String {
    std::fs::read_link(p)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// A deferred symlink is made at replay; one the store already has with the same target
/// is ours, made before the crash; one with another target is someone else's: kept, and
/// ours is counted as a conflict, never put over it. An unlink removes what its create
/// made, and only that, and names the file whose data records are dropped.
#[test]
fn symlinks_and_unlinks_replay_idempotently_and_never_touch_someone_elses() {
    let t = tempfile::tempdir().unwrap();
    let (back, jdir) = (t.path().join("back"), t.path().join("journal"));
    std::fs::create_dir_all(back.join("a")).unwrap();
    std::os::unix::fs::symlink("t", back.join("a/mine")).unwrap();
    std::os::unix::fs::symlink("other", back.join("a/theirs")).unwrap();
    let (store, journal) = store_and_journal(&back, &jdir, IdentityChoice::Inode);
    std::fs::write(back.join("a/someone-elses"), b"x").unwrap();
    let create_file = |parent: &str, name: &str| NsOp::Create {
        parent: parent.as_bytes().to_vec(),
        name: name.as_bytes().to_vec(),
        kind: FileKind::File,
        mode: 0o600,
        owner: None,
        target: Vec::new(),
        rdev: 0,
    };
    let mkdir = |parent: &str, name: &str| NsOp::Create {
        parent: parent.as_bytes().to_vec(),
        name: name.as_bytes().to_vec(),
        kind: FileKind::Dir,
        mode: 0o755,
        owner: None,
        target: Vec::new(),
        rdev: 0,
    };
    let chmod = |path: &str, mode: u32| NsOp::SetAttr {
        path: path.as_bytes().to_vec(),
        mode: Some(mode),
        uid: None,
        gid: None,
        atime: None,
        mtime: None,
        of: None,
        size: None,
    };
    let rename = |from: &str, to: &str, prov| NsOp::Rename {
        from: from.as_bytes().to_vec(),
        to: to.as_bytes().to_vec(),
        prov,
        replaced: None,
    };
    let rename_over = |from: &str, to: &str, prov, replaced| NsOp::Rename {
        from: from.as_bytes().to_vec(),
        to: to.as_bytes().to_vec(),
        prov,
        replaced: Some(replaced),
    };
    let unlink = |path: &str, kind, prov| NsOp::Unlink {
        path: path.as_bytes().to_vec(),
        kind,
        prov,
    };
    let pending = [
        symlink_record(1, "a", "new", "../x/y"),
        symlink_record(2, "a", "mine", "t"),
        symlink_record(3, "a", "theirs", "t"),
        // A temporary file made and unlinked before it reached the store, and a symlink.
        record(
            4,
            NsOp::Create {
                parent: b"a".to_vec(),
                name: b"tmp".to_vec(),
                kind: FileKind::File,
                mode: 0o600,
                owner: None,
                target: Vec::new(),
                rdev: 0,
            },
        ),
        record(5, unlink("a/tmp", FileKind::File, 4)),
        symlink_record(6, "a", "gone", "t"),
        record(7, unlink("a/gone", FileKind::Symlink, 6)),
        // Its create is not pending (covered by a DONE, never made): the name holds
        // someone else's file, which stays, even an empty one, or a symlink.
        record(8, unlink("a/someone-elses", FileKind::File, 103)),
        // An atomic save: made as a/.f.tmp, chmodded, renamed to a/f, then again.
        record(9, create_file("a", ".f.tmp")),
        record(10, chmod("a/.f.tmp", 0o640)),
        record(11, rename("a/.f.tmp", "a/f", 9)),
        record(12, rename("a/f", "a/g", 9)),
        // Its create applied before the crash, already under the new name (the create
        // was rewritten): the rename finds nothing to move, the chmod recorded under the
        // old name follows it.
        record(13, chmod("a/.h.tmp", 0o600)),
        record(14, rename("a/.h.tmp", "a/h", 100)),
        record(15, unlink("a/empty-of-someone", FileKind::File, 101)),
        record(16, unlink("a/theirs", FileKind::Symlink, 102)),
        // Saved as a/x (made there before the crash: the create was rewritten), then
        // the old name used again for a directory with a file in it, also made before
        // the crash: all ours, nothing refused.
        record(17, create_file("a", "x.tmp")),
        record(18, rename("a/x.tmp", "a/x", 17)),
        record(
            19,
            NsOp::Create {
                parent: b"a".to_vec(),
                name: b"x.tmp".to_vec(),
                kind: FileKind::Dir,
                mode: 0o755,
                owner: None,
                target: Vec::new(),
                rdev: 0,
            },
        ),
        record(20, create_file("a/x.tmp", "f")),
        // A chmod under the old name, the rename, and the old name made again: the chmod
        // goes to the renamed file, not to the new one.
        record(21, create_file("a", "y.tmp")),
        record(22, chmod("a/y.tmp", 0o640)),
        record(23, rename("a/y.tmp", "a/y", 21)),
        record(24, create_file("a", "y.tmp")),
        // Directories made and removed: an empty one goes; one someone else put a file
        // in stays.
        record(25, mkdir("a", "rd")),
        record(26, unlink("a/rd", FileKind::Dir, 25)),
        record(27, mkdir("a", "rd2")),
        record(28, unlink("a/rd2", FileKind::Dir, 27)),
        // Moved to another directory before it reached the store: made in the last
        // directory its renames give it (one made before it, then one of the store),
        // and its old directory removed.
        record(29, mkdir("a", "src")),
        record(30, mkdir("a", "dst")),
        record(31, create_file("a/src", "o.tmp")),
        record(32, chmod("a/src/o.tmp", 0o604)),
        record(33, rename("a/src/o.tmp", "a/dst/o", 31)),
        record(34, unlink("a/src", FileKind::Dir, 29)),
        record(35, create_file("a/dst", "p")),
        record(36, rename("a/dst/p", "p2", 35)),
        // Saved twice before either reached the store: the second save replaces the first
        // (never made, its chmod not applied to the second), then is moved on.
        record(37, create_file("a", "s")),
        record(38, chmod("a/s", 0o600)),
        record(39, create_file("a", "s.tmp")),
        record(40, chmod("a/s.tmp", 0o604)),
        record(41, rename_over("a/s.tmp", "a/s", 39, 37)),
        record(42, create_file("a", "u.tmp")),
        record(43, rename("a/u.tmp", "a/u", 42)),
        record(44, create_file("a", "v")),
        record(45, rename_over("a/u", "a/v", 42, 44)),
        // Unlinked, and its name taken by a rename, before either reached the store: the
        // unlinked one is never made (made, the renamed file would take it for its own and
        // the unlink's replay remove it), nor does its chmod reach the renamed file.
        record(46, create_file("a", "w")),
        record(47, create_file("a", "w.tmp")),
        record(48, chmod("a/w", 0o600)),
        record(49, unlink("a/w", FileKind::File, 46)),
        record(50, rename("a/w.tmp", "a/w", 47)),
        record(51, chmod("a/w", 0o640)),
    ];
    std::fs::create_dir(back.join("a/rd2")).unwrap();
    std::fs::write(back.join("a/rd2/theirs"), b"t").unwrap();
    std::fs::write(back.join("a/x"), b"").unwrap();
    std::fs::create_dir(back.join("a/x.tmp")).unwrap();
    std::fs::write(back.join("a/x.tmp/f"), b"").unwrap();
    std::fs::write(back.join("a/y"), b"").unwrap();
    std::fs::write(back.join("a/y.tmp"), b"").unwrap();
    std::fs::write(back.join("a/h"), b"").unwrap();
    std::fs::write(back.join("a/empty-of-someone"), b"").unwrap();
    // In the journal as the daemon appended them (their seqs are the ones above).
    append_all(&journal, &pending);
    let c = WbCounters::default();
    let r = replay_ns(&store, &journal, &pending, &c).unwrap();
    assert_eq!(link_of(&back.join("a/new")), "../x/y");
    assert_eq!(link_of(&back.join("a/mine")), "t");
    assert_eq!(link_of(&back.join("a/theirs")), "other");
    assert_eq!(r.refused, vec![b"a/theirs".to_vec()]);
    assert_eq!(c.ns_conflicts.load(Relaxed), 1);
    assert!(std::fs::symlink_metadata(back.join("a/tmp")).is_err());
    assert!(std::fs::symlink_metadata(back.join("a/gone")).is_err());
    assert_eq!(std::fs::read(back.join("a/someone-elses")).unwrap(), b"x");
    let mut dropped: Vec<u64> = r.dropped.iter().copied().collect();
    dropped.sort_unstable();
    assert_eq!(dropped, vec![4, 6, 25, 27, 29, 37, 44, 46, 101, 102, 103]);
    assert!(!back.join("a/rd").exists());
    assert!(back.join("a/rd2/theirs").exists());
    assert!(back.join("a/empty-of-someone").exists());
    assert_eq!(link_of(&back.join("a/theirs")), "other");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(back.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(r.refused_prov.iter().copied().collect::<Vec<_>>(), vec![3]);
    assert!(back.join("a/x").is_file() && back.join("a/x.tmp/f").is_file());
    assert_eq!(mode("a/y"), 0o640);
    assert_eq!(r.moved.get(&17).map(|p| &p[..]), Some(&b"a/x"[..]));
    assert!(!back.join("a/.f.tmp").exists() && !back.join("a/f").exists());
    assert_eq!(mode("a/g"), 0o640);
    assert_eq!(mode("a/h"), 0o600);
    assert_eq!(r.moved.get(&9).map(|p| &p[..]), Some(&b"a/g"[..]));
    assert_eq!(r.moved.get(&100).map(|p| &p[..]), Some(&b"a/h"[..]));
    assert!(!back.join("a/src").exists());
    assert_eq!(mode("a/dst/o"), 0o604);
    assert!(back.join("p2").is_file() && !back.join("a/dst/p").exists());
    assert_eq!(r.moved.get(&31).map(|p| &p[..]), Some(&b"a/dst/o"[..]));
    assert_eq!(r.moved.get(&35).map(|p| &p[..]), Some(&b"p2"[..]));
    assert_eq!(mode("a/s"), 0o604);
    assert!(!back.join("a/s.tmp").exists());
    assert_eq!(r.moved.get(&39).map(|p| &p[..]), Some(&b"a/s"[..]));
    assert!(back.join("a/v").is_file() && !back.join("a/u").exists());
    assert_eq!(r.moved.get(&42).map(|p| &p[..]), Some(&b"a/v"[..]));
    assert!(!r.moved.contains_key(&37) && !r.moved.contains_key(&44));
    assert_eq!(mode("a/w"), 0o640);
    assert_eq!(r.moved.get(&47).map(|p| &p[..]), Some(&b"a/w"[..]));
    journal.shutdown();
}

/// MOVE records (a rename queued for the store after the flusher took the create,
/// `ns_move`) replay in their place in the order: with their CREATE pending (made under the
/// old name, then moved), alone (the store has the old name: moved), applied before the
/// crash (only the new name there, or both when a later CREATE of ours made the old name
/// again: nothing to do), and never into someone else's file (refused: its data goes to
/// `lost/`). The file's data records follow the last name.
#[test]
fn moves_replay_in_order_and_never_into_someone_elses() {
    let t = tempfile::tempdir().unwrap();
    let (back, jdir) = (t.path().join("back"), t.path().join("journal"));
    std::fs::create_dir_all(back.join("g")).unwrap();
    let (store, journal) = store_and_journal(&back, &jdir, IdentityChoice::Inode);
    let create_file = |name: &str| NsOp::Create {
        parent: b"g".to_vec(),
        name: name.as_bytes().to_vec(),
        kind: FileKind::File,
        mode: 0o600,
        owner: None,
        target: Vec::new(),
        rdev: 0,
    };
    let mv = |from: &str, to: &str, prov| NsOp::Move {
        from: format!("g/{from}").into_bytes(),
        to: format!("g/{to}").into_bytes(),
        prov,
        over: None,
    };
    let chmod = |name: &str, mode: u32| NsOp::SetAttr {
        path: format!("g/{name}").into_bytes(),
        mode: Some(mode),
        uid: None,
        gid: None,
        atime: None,
        mtime: None,
        of: None,
        size: None,
    };
    // Made before the crash: b.lock (its CREATE done, its move not); c (moved before the
    // crash, then c.lock made again by a later pending CREATE); d.lock and someone else's d.
    std::fs::write(back.join("g/b.lock"), b"").unwrap();
    std::fs::write(back.join("g/c"), b"moved").unwrap();
    std::fs::write(back.join("g/c.lock"), b"").unwrap();
    std::fs::write(back.join("g/d.lock"), b"").unwrap();
    std::fs::write(back.join("g/d"), b"theirs").unwrap();
    let pending = [
        record(1, create_file("a.lock")),
        record(2, chmod("a.lock", 0o640)),
        record(3, mv("a.lock", "a", 1)),
        record(4, chmod("a", 0o604)),
        record(5, mv("a", "a2", 1)),
        record(6, mv("b.lock", "b", 100)),
        record(7, mv("c.lock", "c", 101)),
        record(8, create_file("c.lock")),
        record(9, mv("d.lock", "d", 102)),
        record(10, mv("e.lock", "e", 103)),
    ];
    append_all(&journal, &pending);
    let c = WbCounters::default();
    let r = replay_ns(&store, &journal, &pending, &c).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(back.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert!(!back.join("g/a.lock").exists() && !back.join("g/a").exists());
    assert_eq!(mode("g/a2"), 0o604);
    assert_eq!(r.moved.get(&1).map(|p| &p[..]), Some(&b"g/a2"[..]));
    assert!(!back.join("g/b.lock").exists() && back.join("g/b").is_file());
    assert_eq!(r.moved.get(&100).map(|p| &p[..]), Some(&b"g/b"[..]));
    // Not moved again over the file it made (the new c.lock is another).
    assert_eq!(std::fs::read(back.join("g/c")).unwrap(), b"moved");
    assert!(back.join("g/c.lock").is_file());
    assert_eq!(r.moved.get(&101).map(|p| &p[..]), Some(&b"g/c"[..]));
    // Theirs is kept as it was; ours (still d.lock) goes to lost/.
    assert_eq!(std::fs::read(back.join("g/d")).unwrap(), b"theirs");
    assert!(back.join("g/d.lock").exists());
    let mut refused: Vec<u64> = r.refused_prov.iter().copied().collect();
    refused.sort_unstable();
    assert_eq!(refused, vec![102, 103]);
    assert!(!r.moved.contains_key(&102) && !r.moved.contains_key(&103));
    assert_eq!(c.ns_conflicts.load(Relaxed), 2);
    journal.shutdown();
}

/// Removals of the store's own objects (REMOVE, `ns_remove`) replay in their place: what
/// the name still holds is removed (a file, an emptied directory), a removal applied before
/// the crash finds nothing, and someone else's object under the name is never removed
/// (compared by kind and size: a store with path identities). A removal followed by a MOVE
/// of ours to the same name, both applied before the crash, leaves our moved file, though
/// it is as empty as the one removed; applied neither, the old one goes and ours moves in.
#[test]
fn removals_replay_once_and_never_remove_someone_elses_or_ours() {
    let t = tempfile::tempdir().unwrap();
    let (back, jdir) = (t.path().join("back"), t.path().join("journal"));
    std::fs::create_dir_all(back.join("g/dir")).unwrap();
    std::fs::create_dir_all(back.join("g/full")).unwrap();
    std::fs::write(back.join("g/full/theirs"), b"x").unwrap();
    std::fs::write(back.join("g/old"), b"old").unwrap();
    std::fs::write(back.join("g/theirs"), b"theirs").unwrap();
    // Applied before the crash: stamp removed, then stamp.tmp (ours, empty) moved there.
    std::fs::write(back.join("g/stamp"), b"").unwrap();
    // Applied neither: the old empty stamp2, and ours still under stamp2.tmp.
    std::fs::write(back.join("g/stamp2"), b"").unwrap();
    std::fs::write(back.join("g/stamp2.tmp"), b"").unwrap();
    let (store, journal) = store_and_journal(&back, &jdir, IdentityChoice::Path);
    let path_id = (1u64 << 63, 7);
    let rm = |name: &str, kind: FileKind, size: u64| NsOp::Remove {
        path: format!("g/{name}").into_bytes(),
        kind,
        id: path_id,
        size,
    };
    let mv = |from: &str, to: &str, prov| NsOp::Move {
        from: format!("g/{from}").into_bytes(),
        to: format!("g/{to}").into_bytes(),
        prov,
        over: None,
    };
    let pending = [
        record(1, rm("gone", FileKind::File, 5)),
        record(2, rm("old", FileKind::File, 3)),
        record(3, rm("theirs", FileKind::File, 3)),
        record(4, rm("stamp", FileKind::File, 0)),
        record(5, mv("stamp.tmp", "stamp", 100)),
        record(6, rm("stamp2", FileKind::File, 0)),
        record(7, mv("stamp2.tmp", "stamp2", 101)),
        record(8, rm("dir", FileKind::Dir, 4096)),
        record(9, rm("full", FileKind::Dir, 4096)),
    ];
    append_all(&journal, &pending);
    let c = WbCounters::default();
    let r = replay_ns(&store, &journal, &pending, &c).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(back.join("g"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["full", "stamp", "stamp2", "theirs"]);
    assert_eq!(std::fs::read(back.join("g/theirs")).unwrap(), b"theirs");
    assert!(back.join("g/full/theirs").exists());
    assert_eq!(r.moved.get(&100).map(|p| &p[..]), Some(&b"g/stamp"[..]));
    assert_eq!(r.moved.get(&101).map(|p| &p[..]), Some(&b"g/stamp2"[..]));
    assert!(r.refused_prov.is_empty());
    assert_eq!(
        c.ns_conflicts.load(Relaxed),
        2,
        "theirs, and the full directory"
    );
    journal.shutdown();
}

#[test]
fn paths() {
    assert_eq!(super::join(b"", b"a"), b"a");
    assert_eq!(super::join(b"a/b", b"c"), b"a/b/c");
    assert!(super::under(b"a/b/c", b"a/b"));
    assert!(super::under(b"a/b", b"a/b"));
    assert!(!super::under(b"a/bc", b"a/b"));
    assert!(!super::under(b"a", b"a/b"));
}

/// Deferred links (`ns_link`): the create makes the new name, the old one is linked to it
/// after, unless an UNALIAS withdrew it (git's temporary object names); a chmod recorded
/// under the old name before the link reaches the file; a link whose create was applied
/// before the crash links to what the flusher made; a replay run twice changes nothing
/// more; a name someone else took is theirs.
#[test]
fn links_replay_under_the_new_name_and_unaliased_names_never_reach_the_store() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let t = tempfile::tempdir().unwrap();
    let (back, jdir) = (t.path().join("back"), t.path().join("journal"));
    std::fs::create_dir_all(back.join("o")).unwrap();
    let (store, journal) = store_and_journal(&back, &jdir, IdentityChoice::Inode);
    let create = |name: &str| NsOp::Create {
        parent: b"o".to_vec(),
        name: name.as_bytes().to_vec(),
        kind: FileKind::File,
        mode: 0o444,
        owner: None,
        target: Vec::new(),
        rdev: 0,
    };
    let link = |from: &str, to: &str, prov| NsOp::Link {
        from: format!("o/{from}").into_bytes(),
        to: format!("o/{to}").into_bytes(),
        prov,
    };
    let unalias = |path: &str, link, prov| NsOp::Unalias {
        path: format!("o/{path}").into_bytes(),
        link,
        prov,
    };
    let pending = [
        // git: tmp_obj written, linked to its hash, the temporary name unlinked.
        record(1, create("tmp_obj_1")),
        record(
            2,
            NsOp::SetAttr {
                path: b"o/tmp_obj_1".to_vec(),
                mode: Some(0o440),
                uid: None,
                gid: None,
                atime: None,
                mtime: None,
                of: None,
                size: None,
            },
        ),
        record(3, link("tmp_obj_1", "aa11", 1)),
        record(4, unalias("tmp_obj_1", 3, 1)),
        // Both names kept.
        record(5, create("x")),
        record(6, link("x", "y", 5)),
        // Its create applied before the crash (as `made`, the name the link gave it).
        record(7, link("m", "made", 100)),
        // The old name taken by someone else before the replay: theirs stays.
        record(8, create("p")),
        record(9, link("p", "q", 8)),
    ];
    std::fs::write(back.join("o/made"), b"").unwrap();
    append_all(&journal, &pending);
    let c = WbCounters::default();
    let r = replay_ns(&store, &journal, &pending, &c).unwrap();
    let names = || {
        let mut v: Vec<String> = std::fs::read_dir(back.join("o"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(), ["aa11", "m", "made", "p", "q", "x", "y"]);
    let md = |p: &str| std::fs::metadata(back.join("o").join(p)).unwrap();
    assert_eq!(md("aa11").permissions().mode() & 0o777, 0o440);
    assert_eq!(md("aa11").nlink(), 1);
    assert_eq!((md("x").ino(), md("x").nlink()), (md("y").ino(), 2));
    assert_eq!(md("m").ino(), md("made").ino());
    assert_eq!(md("p").ino(), md("q").ino());
    assert_eq!(r.moved.get(&1).map(|p| &p[..]), Some(&b"o/aa11"[..]));
    assert_eq!(r.moved.get(&5).map(|p| &p[..]), Some(&b"o/y"[..]));
    assert_eq!(r.moved.get(&100).map(|p| &p[..]), Some(&b"o/made"[..]));
    assert_eq!(c.ns_conflicts.load(Relaxed), 0);
    // Again (a crash during the first replay): the same tree; then a name taken by
    // someone else is left as it is and counted.
    let c = WbCounters::default();
    replay_ns(&store, &journal, &pending, &c).unwrap();
    assert_eq!(names(), ["aa11", "m", "made", "p", "q", "x", "y"]);
    assert_eq!(c.ns_conflicts.load(Relaxed), 0);
    std::fs::remove_file(back.join("o/p")).unwrap();
    std::fs::write(back.join("o/p"), b"theirs").unwrap();
    let c = WbCounters::default();
    replay_ns(&store, &journal, &pending, &c).unwrap();
    assert_eq!(std::fs::read(back.join("o/p")).unwrap(), b"theirs");
    assert_eq!(c.ns_conflicts.load(Relaxed), 1);
}

#[test]
fn a_truncate_of_a_file_of_the_store_replays_only_on_that_file() {
    let t = tempfile::tempdir().unwrap();
    let (back, jdir) = (t.path().join("back"), t.path().join("journal"));
    std::fs::create_dir_all(back.join("g/now_a_dir")).unwrap();
    std::fs::write(back.join("g/out.o"), vec![b'o'; 1000]).unwrap();
    let (store, journal) = store_and_journal(&back, &jdir, IdentityChoice::Path);
    let truncate = |name: &str| NsOp::SetAttr {
        path: format!("g/{name}").into_bytes(),
        mode: None,
        uid: None,
        gid: None,
        atime: None,
        mtime: None,
        of: Some((FileKind::File, (1u64 << 63, 7))),
        size: Some((0, (1u64 << 63, 7))),
    };
    let pending = [
        record(1, truncate("out.o")),
        record(2, truncate("now_a_dir")),
    ];
    append_all(&journal, &pending);
    let c = WbCounters::default();
    replay_ns(&store, &journal, &pending, &c).unwrap();
    assert_eq!(std::fs::read(back.join("g/out.o")).unwrap(), b"");
    assert!(back.join("g/now_a_dir").is_dir());
    assert_eq!(
        c.ns_conflicts.load(Relaxed),
        1,
        "a directory holds that name now"
    );
    journal.shutdown();
}
