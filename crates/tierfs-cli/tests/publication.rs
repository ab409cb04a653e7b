//! An object made through a write-back mount keeps the inode number the kernel first saw,
//! and the times it showed, for the mount's life (issue 43): after write-back made it on the store (a new identity,
//! the store's), after the kernel forgot it (drop_caches) and looked it up again, after a
//! rename and through a hard link. In both coherence modes. (pjdfstest's rename/00.t,
//! 09.t and 10.t compared numbers across a rename and saw them change.)

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

/// atime, mtime, ctime (seconds and nanoseconds) of `p` itself.
fn times(p: &Path) -> [(i64, i64); 3] {
    let m = std::fs::symlink_metadata(p).unwrap();
    [
        (m.atime(), m.atime_nsec()),
        (m.mtime(), m.mtime_nsec()),
        (m.ctime(), m.ctime_nsec()),
    ]
}

fn numbers_hold(opts: &[&str]) {
    let m = BinMount::new(opts);
    let mnt = m.mnt.clone();
    let what = format!("{opts:?}");
    with_timeout(Duration::from_secs(120), vec![mnt.clone()], move || {
        std::fs::write(mnt.join("f"), b"x").unwrap();
        std::fs::create_dir(mnt.join("d")).unwrap();
        std::os::unix::fs::symlink("f", mnt.join("s")).unwrap();
        let before: Vec<u64> = ["f", "d", "s"].iter().map(|n| ino(&mnt.join(n))).collect();
        let t0: Vec<_> = ["f", "d", "s"]
            .iter()
            .map(|n| times(&mnt.join(n)))
            .collect();
        // A file whose mtime the application set after writing it (`cp -p`): its ctime is
        // still when it changed, never the mtime it was given.
        let old = mnt.join("old");
        std::fs::write(&old, b"archived").unwrap();
        let long_ago = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let o = std::fs::OpenOptions::new().write(true).open(&old).unwrap();
        o.set_modified(long_ago).unwrap();
        // On the store (fsync of the directory waits for its deferred names, of a file for
        // its data too), then forgotten by the kernel and looked up again.
        std::fs::File::open(mnt.join("f"))
            .unwrap()
            .sync_all()
            .unwrap();
        o.sync_all().unwrap();
        drop(o);
        std::fs::File::open(&mnt).unwrap().sync_all().unwrap();
        drop_caches();
        let after: Vec<u64> = ["f", "d", "s"].iter().map(|n| ino(&mnt.join(n))).collect();
        assert_eq!(before, after, "{what}: numbers changed at publication");
        let t1: Vec<_> = ["f", "d", "s"]
            .iter()
            .map(|n| times(&mnt.join(n)))
            .collect();
        assert_eq!(t0, t1, "{what}: times moved at publication (f, d, s)");
        let m = std::fs::metadata(&old).unwrap();
        assert_eq!(m.mtime(), 1_000_000_000, "{what}: the mtime set");
        assert!(
            m.ctime() > 1_700_000_000,
            "{what}: ctime {} is the mtime set",
            m.ctime()
        );
        std::fs::rename(mnt.join("f"), mnt.join("g")).unwrap();
        std::fs::rename(mnt.join("d"), mnt.join("e")).unwrap();
        std::fs::hard_link(mnt.join("g"), mnt.join("h")).unwrap();
        drop_caches();
        assert_eq!(ino(&mnt.join("g")), before[0], "{what}: renamed file");
        assert_eq!(ino(&mnt.join("h")), before[0], "{what}: its hard link");
        assert_eq!(ino(&mnt.join("e")), before[1], "{what}: renamed directory");
        assert_eq!(ino(&mnt.join("s")), before[2], "{what}: symlink");
    });
    m.unmount_and_wait();
}

#[test]
fn new_objects_keep_their_inode_numbers_and_times_across_publication() {
    numbers_hold(&["writeback.mode=back"]);
    numbers_hold(&["writeback.mode=back", "meta.cto=off", "meta.ttl=1h"]);
}
