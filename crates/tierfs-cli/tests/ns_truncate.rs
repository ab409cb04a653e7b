//! Namespace write-back of truncates to zero of new files (`writeback/ns_truncate.rs`): an
//! `open(O_TRUNC)` or `ftruncate(fd, 0)` of a file whose create is still queued drops its
//! data and returns before the store has anything; the store gets the create and what was
//! written after the truncate, and so does a replay after `kill -9`.

mod common;

use common::*;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::time::Duration;

#[test]
fn a_truncate_of_a_new_file_returns_before_the_store_has_it() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::create_dir(backing.join("out")).unwrap();
    m.mount(WB_HELD);
    let (truncated, waited) = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, backing) = (mnt.clone(), backing.clone());
        move || {
            let (t0, w0) = (
                stat_of(&mnt, "writeback.namespace.truncated"),
                stat_of(&mnt, "writeback.namespace.waits"),
            );
            // Listed, so the name is known to be free and the mkdir is deferred too.
            assert_eq!(std::fs::read_dir(mnt.join("out")).unwrap().count(), 0);
            let d = mnt.join("out/gen");
            std::fs::create_dir(&d).unwrap();
            // Written twice, the second time shorter (open O_TRUNC).
            std::fs::write(d.join("a"), vec![b'x'; 100_000]).unwrap();
            std::fs::write(d.join("a"), b"short").unwrap();
            assert_eq!(std::fs::read(d.join("a")).unwrap(), b"short");
            assert_eq!(std::fs::metadata(d.join("a")).unwrap().len(), 5);
            // ftruncate(fd, 0) through an open descriptor, then written again through it.
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(d.join("b"))
                .unwrap();
            f.write_all(b"0123456789").unwrap();
            f.set_len(0).unwrap();
            assert_eq!(f.metadata().unwrap().len(), 0);
            std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).unwrap();
            f.write_all(b"xyz").unwrap();
            drop(f);
            assert_eq!(std::fs::read(d.join("b")).unwrap(), b"xyz");
            // Truncated and left empty.
            std::fs::write(d.join("c"), b"gone").unwrap();
            File::create(d.join("c")).unwrap();
            assert_eq!(std::fs::metadata(d.join("c")).unwrap().len(), 0);
            let truncated = stat_of(&mnt, "writeback.namespace.truncated") - t0;
            let waited = stat_of(&mnt, "writeback.namespace.waits") - w0;
            assert!(
                !backing.join("out/gen").exists(),
                "the store has nothing until the flusher comes"
            );
            // A truncate to another size is done on the store (after what was deferred).
            std::fs::write(d.join("e"), b"abcdef").unwrap();
            OpenOptions::new()
                .write(true)
                .open(d.join("e"))
                .unwrap()
                .set_len(3)
                .unwrap();
            assert_eq!(std::fs::read(backing.join("out/gen/e")).unwrap(), b"abc");
            File::open(&d).unwrap().sync_all().unwrap();
            for f in ["a", "b", "c", "e"] {
                File::open(d.join(f)).unwrap().sync_all().unwrap();
            }
            let bd = backing.join("out/gen");
            assert_eq!(std::fs::read(bd.join("a")).unwrap(), b"short");
            assert_eq!(std::fs::read(bd.join("b")).unwrap(), b"xyz");
            assert_eq!(std::fs::read(bd.join("c")).unwrap(), b"");
            assert_eq!(std::fs::read(bd.join("e")).unwrap(), b"abc");
            (truncated, waited)
        }
    });
    assert_eq!(truncated, 3, "a, b and c");
    assert_eq!(waited, 0, "a truncate waited for the namespace flusher");

    // Across kill -9: written long, truncated, written short, killed before the flusher ran.
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            assert_eq!(std::fs::read_dir(mnt.join("out")).unwrap().count(), 1);
            let d = mnt.join("out/k");
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("t"), b"the first, longer version").unwrap();
            std::fs::write(d.join("t"), b"second").unwrap();
            std::fs::write(d.join("u"), b"emptied").unwrap();
            File::create(d.join("u")).unwrap();
            // The journal's writer thread writes what was appended (no fsync: kill -9 keeps
            // the page cache).
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    assert!(!backing.join("out/k").exists(), "nothing on the store yet");
    m.kill_daemon();
    m.mount(&["writeback.mode=back"]);
    let k = backing.join("out/k");
    assert_eq!(std::fs::read(k.join("t")).unwrap(), b"second");
    assert_eq!(std::fs::read(k.join("u")).unwrap(), b"");
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || assert_eq!(std::fs::read(mnt.join("out/k/t")).unwrap(), b"second")
    });
    assert_eq!(
        std::fs::read_dir(m.cache.join("journal/lost"))
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "nothing went to journal/lost"
    );
}
