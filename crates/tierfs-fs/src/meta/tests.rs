//! Unit tests of the metadata cache.

use super::*;
use tierfs_store::{FileKind, TimeSpec};

fn dir(ino: u64, mtime: i64) -> Attr {
    let t = TimeSpec {
        sec: mtime,
        nsec: 0,
    };
    Attr {
        dev: 1,
        ino,
        kind: FileKind::Dir,
        perm: 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 4096,
        blocks: 8,
        blksize: 4096,
        atime: t,
        mtime: t,
        ctime: t,
    }
}

#[test]
fn attributes_asked_for_before_our_change_are_not_kept() {
    let m = MetaCache::new(Duration::from_secs(60), 1000, false);
    let d = dir(5, 100);
    m.put_listing(ident(&d), &[], Instant::now());
    m.put_attr(&d, Instant::now());
    // A getattr goes out, then a create of ours lands in the directory, then the
    // getattr's (older) answer arrives.
    let asked = Instant::now();
    let child = Attr {
        ino: 6,
        kind: FileKind::File,
        ..dir(6, 101)
    };
    m.add_name(ident(&d), OsStr::new("f"), &child);
    let touched = m.attr(ident(&d)).expect("kept, with the create's times").0;
    assert!(touched.mtime.sec > 100 && touched.ctime.sec > 100);
    assert_eq!(touched.nlink, d.nlink, "a file is no link of the directory");
    assert_eq!(m.put_attr_fetched(&d, asked).mtime.sec, 100);
    assert_eq!(
        m.attr(ident(&d)).map(|(a, _)| a.mtime),
        Some(touched.mtime),
        "an answer asked for before our create must not be cached"
    );
    // Asked for after it: kept.
    let newer = dir(5, 101);
    m.put_attr_fetched(&newer, Instant::now());
    assert_eq!(m.attr(ident(&d)).map(|(a, _)| a.mtime.sec), Some(101));
    // And the record of the change is gone with it.
    assert!(m.changed.is_empty());
}

/// A subdirectory made or removed by us moves the directory's link count; the touched
/// attributes expire when the ones they were made from would have.
#[test]
fn our_own_names_move_the_directory_times_and_links_until_the_ttl() {
    let m = MetaCache::new(Duration::from_millis(300), 1000, false);
    let d = dir(5, 100);
    m.put_attr(&d, Instant::now());
    let sub = dir(7, 100);
    m.add_name(ident(&d), OsStr::new("s"), &sub);
    assert_eq!(m.attr(ident(&d)).unwrap().0.nlink, d.nlink + 1);
    m.put_listing(ident(&d), &[(OsString::from("s"), sub)], Instant::now());
    m.remove_name(ident(&d), OsStr::new("s"));
    assert_eq!(m.attr(ident(&d)).unwrap().0.nlink, d.nlink);
    // A name no listing holds may have been a subdirectory: asked for again.
    m.remove_name(ident(&d), OsStr::new("unlisted"));
    assert!(m.attr(ident(&d)).is_none());
    m.put_attr(&d, Instant::now());
    std::thread::sleep(Duration::from_millis(350));
    assert!(m.attr(ident(&d)).is_none(), "asked again after meta.ttl");
    // Not cached: nothing is made up.
    m.add_name(ident(&d), OsStr::new("t"), &sub);
    assert!(m.attr(ident(&d)).is_none());
    // A store whose directories do not follow their names (S3) keeps them as they are.
    let mut s3 = MetaCache::new(Duration::from_secs(60), 1000, true);
    s3.set_dirs_track_names(false);
    s3.put_attr(&d, Instant::now());
    s3.add_name(ident(&d), OsStr::new("s"), &sub);
    assert_eq!(
        s3.attr(ident(&d)).map(|(a, _)| (a.nlink, a.mtime)),
        Some((d.nlink, d.mtime))
    );
}

#[test]
fn change_records_stay_bounded() {
    let m = MetaCache::new(Duration::from_secs(60), 100, false);
    for i in 0..1000 {
        m.drop_attr((1, i));
    }
    assert!(m.changed.len() <= 100, "{}", m.changed.len());
}
