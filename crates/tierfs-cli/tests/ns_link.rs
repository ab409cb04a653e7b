//! Namespace write-back of hard links of new files (`writeback/namespace/ns_link.rs`): git writes each
//! object to a temporary name, links it to its hash and unlinks the temporary name. With the
//! file's create still queued, the link and the unlink return before the store has them, and
//! the store gets one create of the final name.

mod common;

use common::*;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// A link of a new file in its directory, and an unlink of either of its names after, wait
/// for nothing: both names show at once (one inode, two links), the store has none of them
/// until a drain, and then has what the application left: the final name only (git's
/// pattern), or both names as one file. A link to a name that is taken fails with EEXIST,
/// and one to another directory is done on the store, as before. After `kill -9` the replay
/// leaves the same.
#[test]
fn a_link_of_a_new_file_returns_before_the_store_has_it() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::create_dir(backing.join("other")).unwrap();
    m.mount(WB_HELD);
    let (linked, waited) = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, backing) = (mnt.clone(), backing.clone());
        move || {
            let (linked0, waits0) = (
                stat_of(&mnt, "writeback.namespace.linked"),
                stat_of(&mnt, "writeback.namespace.waits"),
            );
            let d = mnt.join("objects/1d");
            std::fs::create_dir_all(&d).unwrap();
            // git: write a temporary name, link it to its hash, unlink the temporary name.
            for k in 0..20 {
                let tmp = d.join(format!("tmp_obj_{k}"));
                std::fs::write(&tmp, format!("object {k}")).unwrap();
                std::fs::hard_link(&tmp, d.join(format!("obj{k}"))).unwrap();
                let (a, b) = (
                    std::fs::metadata(&tmp).unwrap(),
                    std::fs::metadata(d.join(format!("obj{k}"))).unwrap(),
                );
                assert_eq!((a.ino(), a.nlink()), (b.ino(), 2), "one file, two names");
                std::fs::remove_file(&tmp).unwrap();
                assert_eq!(
                    std::fs::metadata(d.join(format!("obj{k}")))
                        .unwrap()
                        .nlink(),
                    1
                );
            }
            // Both names kept, and the first one unlinked instead of the second.
            std::fs::write(d.join("a"), b"kept twice").unwrap();
            std::fs::hard_link(d.join("a"), d.join("b")).unwrap();
            std::fs::write(d.join("c"), b"moved by link").unwrap();
            std::fs::hard_link(d.join("c"), d.join("e")).unwrap();
            // A taken name: EEXIST at the call, nothing changed.
            let err = std::fs::hard_link(d.join("c"), d.join("a")).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
            // Written through the new name: one file. (No O_TRUNC: a truncate of a new file
            // is done on the store.)
            std::io::Write::write_all(
                &mut std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("e"))
                    .unwrap(),
                b"written through e",
            )
            .unwrap();
            assert_eq!(std::fs::read(d.join("c")).unwrap(), b"written through e");
            std::fs::remove_file(d.join("c")).unwrap();
            let linked = stat_of(&mnt, "writeback.namespace.linked") - linked0;
            let waited = stat_of(&mnt, "writeback.namespace.waits") - waits0;
            // (`objects` is made on the store: nothing says the name is free in the root,
            // which was never listed; `1d` is made in a directory known to be empty.)
            assert!(
                !backing.join("objects/1d").exists(),
                "the store has nothing until the flusher comes"
            );
            let want: Vec<String> = ["a", "b", "e"]
                .into_iter()
                .map(String::from)
                .chain((0..20).map(|k| format!("obj{k}")))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            assert_eq!(sorted_names(&d), want);
            // A link to another directory is done on the store (after what was deferred).
            std::fs::hard_link(d.join("a"), mnt.join("other/a")).unwrap();
            assert!(backing.join("objects/1d/a").exists());
            File::open(&d).unwrap().sync_all().unwrap();
            let bd = backing.join("objects/1d");
            assert_eq!(
                sorted_names(&bd),
                want,
                "the store has what the application left"
            );
            for k in 0..20 {
                assert_eq!(
                    std::fs::read(bd.join(format!("obj{k}"))).unwrap(),
                    format!("object {k}").as_bytes()
                );
            }
            let (a, b) = (
                std::fs::metadata(bd.join("a")).unwrap(),
                std::fs::metadata(bd.join("b")).unwrap(),
            );
            assert_eq!(a.ino(), b.ino(), "a and b are one file on the store");
            assert_eq!(a.nlink(), 3, "a, b and other/a");
            assert_eq!(std::fs::read(bd.join("e")).unwrap(), b"written through e");
            assert_eq!(std::fs::metadata(bd.join("e")).unwrap().nlink(), 1);
            // And as the mount shows them now, from the store.
            assert_eq!(sorted_names(&d), want);
            assert_eq!(std::fs::metadata(d.join("b")).unwrap().nlink(), 3);
            (linked, waited)
        }
    });
    assert_eq!(linked, 22, "20 objects, b and e");
    assert_eq!(
        waited, 0,
        "a link or unlink waited for the namespace flusher"
    );

    // Across kill -9: linked and unlinked, killed before the flusher ran.
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            let d = mnt.join("objects/k");
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("tmp"), b"final data").unwrap();
            std::fs::hard_link(d.join("tmp"), d.join("final")).unwrap();
            std::fs::remove_file(d.join("tmp")).unwrap();
            std::fs::write(d.join("x"), b"two names").unwrap();
            std::fs::hard_link(d.join("x"), d.join("y")).unwrap();
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
        }
    });
    assert!(
        !backing.join("objects/k").exists(),
        "nothing on the store yet"
    );
    m.kill_daemon();
    m.mount(&["writeback.mode=back"]);
    let k = backing.join("objects/k");
    assert_eq!(
        sorted_names(&k),
        ["final", "x", "y"],
        "the replay made what was left"
    );
    assert_eq!(std::fs::read(k.join("final")).unwrap(), b"final data");
    assert_eq!(std::fs::read(k.join("y")).unwrap(), b"two names");
    assert_eq!(
        std::fs::metadata(k.join("x")).unwrap().ino(),
        std::fs::metadata(k.join("y")).unwrap().ino()
    );
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || assert_eq!(sorted_names(&mnt.join("objects/k")), ["final", "x", "y"])
    });
    assert_eq!(
        lost_files(&m.cache),
        Vec::<std::path::PathBuf>::new(),
        "nothing went to journal/lost"
    );
}
