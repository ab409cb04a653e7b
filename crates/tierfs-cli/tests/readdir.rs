//! Listings of big directories through READDIRPLUS: every entry shown once with its own
//! attributes, whatever the page boundaries, and the kernel's lookup references balanced
//! (each entry added to a page is one reference; each looked up but not sent is given back).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
const FILES: usize = 2_500;

/// Names of many lengths (pages of 32 KiB getdents hold a varying number of them), sizes
/// that name the file.
fn name(i: usize) -> String {
    format!("f{i:05}-{}", "x".repeat(i % 97))
}

#[test]
fn a_big_listing_shows_every_entry_once_and_gives_back_every_reference() {
    let m = BinMount::new(&[]);
    let dir = m.backing.join("big");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..FILES {
        std::fs::write(dir.join(name(i)), vec![b'a'; i % 300]).unwrap();
    }
    let mnt = m.mnt.clone();
    let list = move |mnt: std::path::PathBuf| {
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            // read_dir is getdents with glibc's 32 KiB buffer; metadata() after it is served
            // from the attributes the READDIRPLUS pages brought.
            let mut seen: BTreeMap<String, (u64, u64)> = BTreeMap::new();
            for e in std::fs::read_dir(mnt.join("big")).unwrap() {
                let e = e.unwrap();
                let md = e.path().symlink_metadata().unwrap();
                let n = e.file_name().into_string().unwrap();
                assert!(
                    seen.insert(n.clone(), (md.size(), md.ino())).is_none(),
                    "{n} twice"
                );
            }
            seen
        })
    };
    let seen = list(mnt.clone());
    assert_eq!(seen.len(), FILES);
    for i in 0..FILES {
        let (size, _) = seen[&name(i)];
        assert_eq!(size, (i % 300) as u64, "{}", name(i));
    }
    let inos: std::collections::HashSet<u64> = seen.values().map(|v| v.1).collect();
    assert_eq!(inos.len(), FILES, "inode numbers shared between entries");

    // Every reference the kernel holds comes back at drop_caches (FORGET): the inode table
    // shrinks to the root (and at most the directory, if its FORGET is still on the way).
    let held = n(&m.stats(), "inodes");
    assert!(
        held >= FILES as u64,
        "inodes {held} after listing {FILES} entries"
    );
    drop_caches();
    let t = Instant::now();
    let left = loop {
        let left = n(&m.stats(), "inodes");
        if left <= 2 || t.elapsed() > Duration::from_secs(20) {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        left <= 2,
        "{left} inodes left after the kernel forgot every entry (leaked references)"
    );
    // And none was given back too early: the same listing again, every entry still answers,
    // with the same inode numbers.
    let again = list(mnt);
    assert_eq!(again, seen);
}
