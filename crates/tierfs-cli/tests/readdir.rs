//! Listings of big directories through READDIRPLUS: every entry shown once with its own
//! attributes, whatever the page boundaries, and the kernel's lookup references balanced
//! (each entry added to a page is one reference; each looked up but not sent is given back).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
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

/// `getdents64` into `dir` with a buffer of `size` bytes until the end: the names, in order.
fn getdents_all(dir: &std::path::Path, size: usize) -> Vec<String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dir).unwrap();
    let mut buf = vec![0u8; size];
    let mut names = Vec::new();
    loop {
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                f.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        assert!(n >= 0, "getdents64: {}", std::io::Error::last_os_error());
        if n == 0 {
            return names;
        }
        let mut at = 0usize;
        while at < n as usize {
            // struct linux_dirent64: ino u64, off i64, reclen u16, type u8, name.
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            let name = &buf[at + 19..at + reclen];
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            let name = String::from_utf8(name[..end].to_vec()).unwrap();
            if name != "." && name != ".." {
                names.push(name);
            }
            at += reclen;
        }
    }
}

/// A big reply buffer: plain READDIR (no metadata cache, so the kernel asks with attributes
/// only for the first page) of 20,000 entries with a 2 MiB `getdents` buffer (pages as long as
/// the kernel's request allows, `fuse` max_pages) gets every entry exactly once.
#[test]
fn short_pages_lose_and_repeat_nothing() {
    const MANY: usize = 20_000;
    let m = BinMount::new(&["meta.ttl=0"]);
    let dir = m.backing.join("many");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..MANY {
        std::fs::File::create(dir.join(format!("{i}"))).unwrap();
    }
    let mnt = m.mnt.clone();
    let names = with_timeout(LIMIT, vec![mnt.clone()], move || {
        getdents_all(&mnt.join("many"), 2 << 20)
    });
    assert_eq!(names.len(), MANY);
    let set: std::collections::HashSet<&String> = names.iter().collect();
    assert_eq!(set.len(), MANY, "an entry shown twice");
    assert!((0..MANY).all(|i| set.contains(&i.to_string())));
}

/// Runs `cmd args` under the test timeout; its standard output.
fn output_of(mnt: &std::path::Path, cmd: &'static str, args: Vec<std::ffi::OsString>) -> String {
    with_timeout(LIMIT, vec![mnt.to_path_buf()], move || {
        let out = std::process::Command::new(cmd)
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd} {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    })
}

/// A store listed for names first (`store.names_first`: `auto` where a stat costs a
/// request): a `find -name`, which needs names and types, costs the store a listing per
/// directory and a stat per subdirectory, not one per file. The first stat of a file brings
/// its directory's files in one fan-out (`du`: one per directory, not one per file). What the
/// kernel was given without attributes agrees with what it is told when it asks: inode
/// numbers, types and sizes, after the listings expired and were taken again too.
#[test]
fn a_walk_by_name_stats_subdirectories_only() {
    const DIRS: usize = 12;
    const PER: usize = 40;
    // (`auto` lists a local disk with the attributes: its stats take microseconds. Names
    // first needs path identities.)
    let m = BinMount::new(&["store.names_first=on", "store.identity=path"]);
    let tree = m.backing.join("tree");
    for d in 0..DIRS {
        let dir = tree.join(format!("d{d}"));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for f in 0..PER {
            std::fs::write(dir.join(format!("f{f}.txt")), vec![b'x'; d * PER + f]).unwrap();
        }
        std::os::unix::fs::symlink("f0.txt", dir.join("link")).unwrap();
    }
    let subdirs = (2 * DIRS + 1) as u64; // tree, d*, d*/sub
    let mtree = m.mnt.join("tree");

    // `find -name`: the store lookups it cost.
    let find_name = || {
        let s0 = m.stats();
        let found = output_of(
            &m.mnt,
            "find",
            vec![mtree.clone().into(), "-name".into(), "f7.txt".into()],
        );
        assert_eq!(found.lines().count(), DIRS, "{found}");
        n(&m.stats(), "backing.lookup") - n(&s0, "backing.lookup")
    };
    let lookups = find_name();
    // Each subdirectory: its attributes, and its node when it is listed (an open by name).
    assert!(
        lookups <= 2 * subdirs + 2,
        "find -name over {DIRS} directories of {PER} files: {lookups} store lookups (at most \
         two for each of the {subdirs} directories expected, none for the files)"
    );

    // Again once the listings and the directories' attributes expired (meta.ttl is 1 s):
    // each directory's first READDIRPLUS page is still the short one, the directory's own
    // attributes fetched for it (else the page that follows would stat every entry).
    std::thread::sleep(Duration::from_millis(1_200));
    drop_caches();
    let lookups = find_name();
    assert!(
        lookups <= 2 * subdirs + 2,
        "find -name again after meta.ttl: {lookups} store lookups (at most two for each of \
         the {subdirs} directories expected, none for the files)"
    );

    // du needs every entry's attributes: one fan-out per directory's files.
    let s1 = m.stats();
    let du = |root: &std::path::Path| {
        let args = vec!["-s".into(), "-b".into(), root.as_os_str().to_owned()];
        output_of(&m.mnt, "du", args)
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(du(&mtree), du(&tree), "du through tierfs and on the store");
    let s2 = m.stats();
    let fanouts = n(&s2, "meta_entry_stats") - n(&s1, "meta_entry_stats");
    assert!(
        fanouts <= (DIRS + 2) as u64,
        "du of {DIRS} directories: {fanouts} fan-outs for entries' attributes"
    );
    let lookups = n(&s2, "backing.lookup") - n(&s1, "backing.lookup");
    let entries = (DIRS * (PER + 1)) as u64;
    assert!(
        lookups >= entries && lookups <= entries + subdirs + 2,
        "du: {lookups} entries stat'ed on the store, for {entries} files and links"
    );

    // After the listings expired (meta.ttl is 1 s) and the kernel forgot the names: listed
    // again without attributes, each entry's inode number in getdents is the one stat
    // gives, with the store's type and size.
    for round in 0..2 {
        std::thread::sleep(Duration::from_millis(1_200));
        drop_caches();
        let mtree = mtree.clone();
        let tree = tree.clone();
        with_timeout(LIMIT, vec![m.mnt.clone()], move || {
            for d in 0..DIRS {
                let dir = mtree.join(format!("d{d}"));
                let mut seen = 0;
                for e in std::fs::read_dir(&dir).unwrap() {
                    let e = e.unwrap();
                    let md = e.path().symlink_metadata().unwrap();
                    let back = tree
                        .join(format!("d{d}"))
                        .join(e.file_name())
                        .symlink_metadata()
                        .unwrap();
                    let name = e.path();
                    assert_eq!(
                        e.ino(),
                        md.ino(),
                        "round {round}: {name:?}: d_ino and st_ino"
                    );
                    assert_eq!(e.file_type().unwrap(), md.file_type(), "{name:?}");
                    assert_eq!(md.file_type(), back.file_type(), "{name:?}");
                    if md.is_file() {
                        assert_eq!(md.len(), back.len(), "{name:?}");
                        assert_eq!(md.mode(), back.mode(), "{name:?}");
                    }
                    seen += 1;
                }
                assert_eq!(seen, PER + 2);
            }
        });
    }
}
