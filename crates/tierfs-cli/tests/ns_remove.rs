//! Namespace write-back of unlinks of the store's own files (`writeback/namespace/ns_remove.rs`): `rm`
//! of files the store has is acknowledged before the store has it, and applied in its turn.

mod common;

use common::*;
use std::fs::File;
use std::time::Duration;

/// An unlink of a file or symlink of the store, and an rmdir of an emptied directory of the
/// store (`rm -rf`), return before the store has them: the name is gone at once for lookups
/// and listings, a file made again under it is a new one, and fsync of the directory puts
/// the removals on the store. What cannot be deferred is done on
/// the store as before: a file with another link, an open file. A name that someone else
/// filled behind our back before the flusher came is never removed in our name. After
/// `kill -9`, the replay removes what the journal says was unlinked.
#[test]
fn an_unlink_of_a_file_of_the_store_returns_before_the_store_has_it() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let d = backing.join("d");
    std::fs::create_dir(&d).unwrap();
    for k in 0..40 {
        std::fs::write(d.join(format!("f{k}")), vec![k as u8; 1000 + k]).unwrap();
    }
    std::os::unix::fs::symlink("f0", d.join("l")).unwrap();
    std::fs::write(d.join("hard"), b"two names").unwrap();
    std::fs::hard_link(d.join("hard"), d.join("hard2")).unwrap();
    std::fs::write(d.join("open"), b"still read").unwrap();
    let t = backing.join("t");
    for sub in ["a/x", "a/y", "b"] {
        std::fs::create_dir_all(t.join(sub)).unwrap();
        for k in 0..5 {
            std::fs::write(t.join(sub).join(format!("g{k}")), b"tree").unwrap();
        }
    }
    m.mount(WB_HELD);
    let (removed, waited) = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, d) = (mnt.clone(), d.clone());
        move || {
            let md = mnt.join("d");
            assert_eq!(sorted_names(&md).len(), 44);
            let (removed0, waits0) = (
                stat_of(&mnt, "writeback.namespace.removed"),
                stat_of(&mnt, "writeback.namespace.waits"),
            );
            for k in 0..40 {
                std::fs::remove_file(md.join(format!("f{k}"))).unwrap();
            }
            std::fs::remove_file(md.join("l")).unwrap();
            let removed = stat_of(&mnt, "writeback.namespace.removed") - removed0;
            let waited = stat_of(&mnt, "writeback.namespace.waits") - waits0;
            assert!(
                d.join("f0").exists(),
                "the store has it until the flusher comes"
            );
            assert!(std::fs::symlink_metadata(md.join("l")).is_err());
            assert_eq!(
                std::fs::metadata(md.join("f3")).unwrap_err().raw_os_error(),
                Some(libc::ENOENT)
            );
            assert_eq!(sorted_names(&md), ["hard", "hard2", "open"]);
            // Made again under a name being removed: a new file.
            std::fs::write(md.join("f1"), b"new f1").unwrap();
            assert_eq!(std::fs::read(md.join("f1")).unwrap(), b"new f1");
            // Not deferred: a file with another name, an open file.
            std::fs::remove_file(md.join("hard")).unwrap();
            assert!(!d.join("hard").exists());
            let f = File::open(md.join("open")).unwrap();
            std::fs::remove_file(md.join("open")).unwrap();
            assert!(!d.join("open").exists());
            let mut got = String::new();
            std::io::Read::read_to_string(&mut &f, &mut got).unwrap();
            assert_eq!(got, "still read");
            drop(f);
            // Someone else makes f2 anew on the store before the flusher removes ours.
            std::fs::write(d.join("f2"), b"theirs").unwrap();
            let conflicts0 = stat_of(&mnt, "writeback.namespace.conflicts");
            File::open(&md).unwrap().sync_all().unwrap();
            assert_eq!(
                stat_of(&mnt, "writeback.namespace.conflicts") - conflicts0,
                1,
                "f2 was someone else's by then"
            );
            assert_eq!(sorted_names(&d), ["f1", "f2", "hard2"]);
            assert_eq!(std::fs::read(d.join("f1")).unwrap(), b"new f1");
            assert_eq!(std::fs::read(d.join("f2")).unwrap(), b"theirs");
            assert_eq!(sorted_names(&md), ["f1", "f2", "hard2"]);
            assert_eq!(std::fs::read(md.join("f2")).unwrap(), b"theirs");
            // `rm -rf` of a tree of the store: 15 files, 5 directories.
            let (removed0, waits0) = (
                stat_of(&mnt, "writeback.namespace.removed"),
                stat_of(&mnt, "writeback.namespace.waits"),
            );
            std::fs::remove_dir_all(mnt.join("t")).unwrap();
            let tree_removed = stat_of(&mnt, "writeback.namespace.removed") - removed0;
            let tree_waited = stat_of(&mnt, "writeback.namespace.waits") - waits0;
            assert!(
                t.join("a/x/g0").exists(),
                "the store has it until the flusher comes"
            );
            assert!(std::fs::symlink_metadata(mnt.join("t")).is_err());
            assert!(!sorted_names(&mnt).contains(&"t".to_string()));
            File::open(&mnt).unwrap().sync_all().unwrap();
            assert!(!t.exists(), "the tree is removed from the store");
            (removed + tree_removed, waited + tree_waited)
        }
    });
    assert_eq!(
        removed,
        41 + 20,
        "40 files and a symlink of the store, then a tree of 15 files and 5 directories"
    );
    assert_eq!(
        waited, 0,
        "an unlink or rmdir waited for the namespace flusher"
    );

    // Across kill -9: unlinked, killed before the flusher ran; the replay removes them.
    let e = backing.join("e");
    std::fs::create_dir(&e).unwrap();
    for k in 0..10 {
        std::fs::write(e.join(format!("x{k}")), format!("x{k}")).unwrap();
    }
    std::fs::create_dir_all(e.join("sub/deeper")).unwrap();
    std::fs::write(e.join("sub/deeper/z"), b"z").unwrap();
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            let me = mnt.join("e");
            assert_eq!(sorted_names(&me).len(), 11);
            for k in 0..5 {
                std::fs::remove_file(me.join(format!("x{k}"))).unwrap();
            }
            std::fs::remove_dir_all(me.join("sub")).unwrap();
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
        }
    });
    assert_eq!(
        sorted_names(&e).len(),
        11,
        "nothing removed on the store yet"
    );
    m.kill_daemon();
    m.mount(&["writeback.mode=back"]);
    let want = ["x5", "x6", "x7", "x8", "x9"];
    assert_eq!(
        sorted_names(&e),
        want,
        "the replay removed the unlinked files"
    );
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || assert_eq!(sorted_names(&mnt.join("e")), want)
    });
    assert_eq!(
        lost_files(&m.cache),
        Vec::<std::path::PathBuf>::new(),
        "nothing went to journal/lost"
    );
}
