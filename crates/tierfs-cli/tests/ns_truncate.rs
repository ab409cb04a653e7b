//! Namespace write-back of truncates to zero of new files (`writeback/namespace/ns_truncate.rs`): an
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
            // Truncated by its open, written, then cut to its length through that descriptor:
            // the store's file, opened for it later, is not truncated again (the model test
            // found the byte lost).
            std::fs::write(d.join("h"), b"first").unwrap();
            let mut f = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(d.join("h"))
                .unwrap();
            f.write_all(b"\x01").unwrap();
            f.set_len(1).unwrap();
            drop(f);
            assert_eq!(std::fs::read(d.join("h")).unwrap(), b"\x01");
            File::open(&d).unwrap().sync_all().unwrap();
            for f in ["a", "b", "c", "e"] {
                File::open(d.join(f)).unwrap().sync_all().unwrap();
            }
            let bd = backing.join("out/gen");
            assert_eq!(std::fs::read(bd.join("a")).unwrap(), b"short");
            assert_eq!(std::fs::read(bd.join("b")).unwrap(), b"xyz");
            assert_eq!(std::fs::read(bd.join("c")).unwrap(), b"");
            assert_eq!(std::fs::read(bd.join("e")).unwrap(), b"abc");
            File::open(d.join("h")).unwrap().sync_all().unwrap();
            assert_eq!(std::fs::read(bd.join("h")).unwrap(), b"\x01");
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
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
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
        lost_files(&m.cache),
        Vec::<std::path::PathBuf>::new(),
        "nothing went to journal/lost"
    );
}

/// With the default `meta.ttl` (1 s) a directory's listing expires, and write-back used to
/// defer a create only where a fresh listing said the name was free: every create after the
/// first second waited for all deferred operations and went to the store. The kernel's lookup
/// just before the create asked the store, whose "no such name" says as much
/// (`namespace/absent.rs`): the creates are deferred, and a name someone else made meanwhile
/// is still found (it is not created over).
#[test]
fn a_create_the_store_just_said_is_free_is_deferred_after_the_listing_expired() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::create_dir(backing.join("out")).unwrap();
    std::fs::write(backing.join("out/old"), b"old").unwrap();
    m.mount(&[
        "writeback.mode=back",
        "writeback.namespace_delay=1h",
        "writeback.namespace_quiet=1h",
    ]);
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, backing) = (mnt.clone(), backing.clone());
        move || {
            let out = mnt.join("out");
            assert_eq!(sorted_names(&out), ["old"]);
            std::thread::sleep(Duration::from_millis(1500));
            // Made behind our back: found, never created over.
            std::fs::write(backing.join("out/theirs"), b"theirs").unwrap();
            let w0 = stat_of(&mnt, "writeback.namespace.waits");
            for k in 0..5 {
                std::fs::write(out.join(format!("new{k}")), format!("new {k}")).unwrap();
            }
            assert_eq!(std::fs::read(out.join("theirs")).unwrap(), b"theirs");
            assert_eq!(
                stat_of(&mnt, "writeback.namespace.waits"),
                w0,
                "a create waited"
            );
            assert!(
                !backing.join("out/new0").exists(),
                "the store has nothing until the flusher comes"
            );
            File::open(&out).unwrap().sync_all().unwrap();
            for k in 0..5 {
                assert_eq!(
                    std::fs::read(out.join(format!("new{k}"))).unwrap(),
                    format!("new {k}").as_bytes()
                );
                File::open(out.join(format!("new{k}")))
                    .unwrap()
                    .sync_all()
                    .unwrap();
                assert_eq!(
                    std::fs::read(backing.join(format!("out/new{k}"))).unwrap(),
                    format!("new {k}").as_bytes()
                );
            }
            assert_eq!(
                std::fs::read(backing.join("out/theirs")).unwrap(),
                b"theirs"
            );
        }
    });
}

/// `p` still holds the `len` bytes of 'o' it was made with (said in a line, not the bytes).
fn untouched(p: &std::path::Path, len: usize) {
    let got = std::fs::read(p).unwrap();
    assert!(
        got.len() == len && got.iter().all(|c| *c == b'o'),
        "{p:?} is not the store's old contents: {} bytes, starting {:?}",
        got.len(),
        String::from_utf8_lossy(&got[..got.len().min(40)])
    );
}

/// An `open(O_TRUNC)` or `ftruncate(fd, 0)` of a clean file of the store (`cp` over an
/// existing file, a shell's `>`, a build rewriting its outputs) returns before the store has
/// the truncate, with no wait: the file reads as what was written since (zeros in a hole,
/// never the store's old bytes), its data waits for the truncate, and `fsync` puts both on
/// the store in that order. After `kill -9`, the replay truncates, then writes what came
/// after.
#[test]
fn a_truncate_of_a_file_of_the_store_returns_before_the_store_has_it() {
    use std::os::unix::fs::FileExt;
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let s = backing.join("s");
    std::fs::create_dir(&s).unwrap();
    for (name, len) in [("a", 100_000), ("b", 50_000), ("c", 10_000), ("e", 20_000)] {
        std::fs::write(s.join(name), vec![b'o'; len]).unwrap();
    }
    m.mount(WB_HELD);
    let (truncated, waited) = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, s) = (mnt.clone(), s.clone());
        move || {
            let ms = mnt.join("s");
            // Read once, so that the old contents are in the RAM tier too.
            untouched(&ms.join("a"), 100_000);
            let (t0, w0) = (
                stat_of(&mnt, "writeback.namespace.truncated"),
                stat_of(&mnt, "writeback.namespace.waits"),
            );
            std::fs::write(ms.join("a"), b"a, written first and longer").unwrap();
            // Truncated again before the store has the first truncate: what the first
            // write left goes.
            std::fs::write(ms.join("a"), b"new a").unwrap();
            assert_eq!(std::fs::read(ms.join("a")).unwrap(), b"new a");
            // A hole after the truncate reads as zeros, not as the store's old bytes.
            let f = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(ms.join("b"))
                .unwrap();
            f.write_all_at(b"tail", 1000).unwrap();
            drop(f);
            let mut want_b = vec![0u8; 1000];
            want_b.extend_from_slice(b"tail");
            let got = std::fs::read(ms.join("b")).unwrap();
            assert!(
                got == want_b,
                "b reads {} bytes, {} of them the store's old 'o'",
                got.len(),
                got.iter().filter(|c| **c == b'o').count()
            );
            // ftruncate(fd, 0), nothing written after.
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(ms.join("c"))
                .unwrap();
            f.set_len(0).unwrap();
            assert_eq!(f.metadata().unwrap().len(), 0);
            drop(f);
            assert_eq!(std::fs::read(ms.join("c")).unwrap(), b"");
            let truncated = stat_of(&mnt, "writeback.namespace.truncated") - t0;
            let waited = stat_of(&mnt, "writeback.namespace.waits") - w0;
            // The data flusher would have written a and b by now: they wait for the
            // truncates, which wait for the namespace flusher.
            std::thread::sleep(Duration::from_secs(2));
            untouched(&s.join("a"), 100_000);
            untouched(&s.join("b"), 50_000);
            untouched(&s.join("c"), 10_000);
            for name in ["a", "b", "c"] {
                File::open(ms.join(name)).unwrap().sync_all().unwrap();
            }
            assert_eq!(std::fs::read(s.join("a")).unwrap(), b"new a");
            assert_eq!(std::fs::read(s.join("b")).unwrap(), want_b);
            assert_eq!(std::fs::read(s.join("c")).unwrap(), b"");
            // And through the mount once the kernel's copies are gone, where we may.
            if unsafe { libc::geteuid() } == 0 {
                std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
            }
            assert_eq!(std::fs::read(ms.join("a")).unwrap(), b"new a");
            assert_eq!(std::fs::read(ms.join("b")).unwrap(), want_b);
            // Across kill -9: truncated and written, killed before the flusher came.
            // e has dirty data the store has not seen (it waits for a deferred chmod) when
            // it is truncated: that data goes, never to reach the store, in a replay either.
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(ms.join("e"), std::fs::Permissions::from_mode(0o600))
                    .unwrap();
            }
            OpenOptions::new()
                .append(true)
                .open(ms.join("e"))
                .unwrap()
                .write_all(b"dirty, never on the store")
                .unwrap();
            let t1 = stat_of(&mnt, "writeback.namespace.truncated");
            std::fs::write(ms.join("e"), b"replayed").unwrap();
            assert_eq!(std::fs::read(ms.join("e")).unwrap(), b"replayed");
            assert_eq!(
                stat_of(&mnt, "writeback.namespace.truncated") - t1,
                1,
                "the truncate of a file with dirty data is deferred too"
            );
            wait_journal_written(&mnt);
            (truncated, waited)
        }
    });
    assert_eq!(truncated, 4, "a twice, b and c truncated without the store");
    assert_eq!(waited, 0, "a truncate waited for the namespace flusher");
    untouched(&s.join("e"), 20_000);
    m.kill_daemon();
    m.mount(&["writeback.mode=back"]);
    assert_eq!(
        std::fs::read(s.join("e")).unwrap(),
        b"replayed",
        "the replay truncates, then writes what came after"
    );
    assert_eq!(
        lost_files(&m.cache),
        Vec::<std::path::PathBuf>::new(),
        "nothing went to journal/lost"
    );
}

/// An extending `ftruncate` of a new file (a linker sizing its output before it writes it
/// through mmap) returns before the store has the file: reads see the data and zeros past
/// it, `SEEK_DATA`/`SEEK_HOLE` and the store's file find the holes a local filesystem has
/// (the first try wrote a zero byte at the end, and the model test found data there), a
/// truncate to zero after it leaves the file empty, and a replay after `kill -9` gives the
/// store file its size.
#[test]
fn an_extending_truncate_of_a_new_file_returns_before_the_store_has_it() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    use std::os::unix::io::AsRawFd;
    const SIZE: u64 = (8 << 20) + 1234;
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    std::fs::create_dir(backing.join("out")).unwrap();
    m.mount(WB_HELD);
    let expect = |head: &[u8], tail_at: u64, tail: &[u8]| {
        let mut v = vec![0u8; SIZE as usize];
        v[..head.len()].copy_from_slice(head);
        v[tail_at as usize..tail_at as usize + tail.len()].copy_from_slice(tail);
        v
    };
    let (truncated, waited) = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, backing) = (mnt.clone(), backing.clone());
        move || {
            let (t0, w0) = (
                stat_of(&mnt, "writeback.namespace.truncated"),
                stat_of(&mnt, "writeback.namespace.waits"),
            );
            assert_eq!(std::fs::read_dir(mnt.join("out")).unwrap().count(), 0);
            let f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(mnt.join("out/a.out"))
                .unwrap();
            f.write_all_at(b"ELF header", 0).unwrap();
            f.set_len(SIZE).unwrap();
            f.write_all_at(b"the end", SIZE - 7).unwrap();
            assert_eq!(f.metadata().unwrap().len(), SIZE);
            // Extended and left so, and extended then emptied.
            let g = File::create(mnt.join("out/sparse")).unwrap();
            g.set_len(SIZE).unwrap();
            drop(g);
            let e = File::create(mnt.join("out/emptied")).unwrap();
            e.set_len(SIZE).unwrap();
            e.set_len(0).unwrap();
            drop(e);
            let truncated = stat_of(&mnt, "writeback.namespace.truncated") - t0;
            let waited = stat_of(&mnt, "writeback.namespace.waits") - w0;
            assert!(
                !backing.join("out/a.out").exists(),
                "the store has nothing until the flusher comes"
            );
            let mut got = vec![0u8; SIZE as usize];
            f.read_exact_at(&mut got, 0).unwrap();
            assert!(
                got == expect(b"ELF header", SIZE - 7, b"the end"),
                "read back"
            );
            assert_eq!(
                std::fs::metadata(mnt.join("out/sparse")).unwrap().len(),
                SIZE
            );
            // SEEK_DATA waits for the file on the store, then asks it: the hole is a hole.
            let seek = |fd: i32, whence: i32, at: i64| unsafe { libc::lseek(fd, at, whence) };
            let hole = seek(f.as_raw_fd(), libc::SEEK_HOLE, 0);
            assert!(
                hole > 0 && (hole as u64) < SIZE - 7,
                "SEEK_HOLE {hole}: {}",
                std::io::Error::last_os_error()
            );
            let data = seek(f.as_raw_fd(), libc::SEEK_DATA, 1 << 20);
            assert!(
                data as u64 > 1 << 20 && (data as u64) <= SIZE - 7,
                "SEEK_DATA {data}"
            );
            let b = backing.join("out/a.out");
            assert_eq!(std::fs::metadata(&b).unwrap().len(), SIZE);
            assert!(
                std::fs::metadata(&b).unwrap().blocks() * 512 < 1 << 20,
                "sparse on the store"
            );
            assert!(std::fs::read(&b).unwrap() == expect(b"ELF header", SIZE - 7, b"the end"));
            (truncated, waited)
        }
    });
    assert_eq!(truncated, 4, "a.out, sparse, emptied twice");
    assert_eq!(
        waited, 0,
        "an extending truncate waited for the namespace flusher"
    );
    m.unmount_and_wait();
    assert_eq!(
        std::fs::metadata(backing.join("out/sparse")).unwrap().len(),
        SIZE
    );
    assert_eq!(
        std::fs::metadata(backing.join("out/emptied"))
            .unwrap()
            .len(),
        0
    );

    // Across kill -9: made, written, extended, killed before the flusher ran.
    m.mount(WB_HELD);
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            assert_eq!(std::fs::read_dir(mnt.join("out")).unwrap().count(), 3);
            let f = File::create(mnt.join("out/k")).unwrap();
            f.write_all_at(b"head", 0).unwrap();
            f.set_len(SIZE).unwrap();
            drop(f);
            let g = File::create(mnt.join("out/k2")).unwrap();
            g.set_len(SIZE).unwrap();
            drop(g);
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
        }
    });
    assert!(!backing.join("out/k").exists(), "nothing on the store yet");
    m.kill_daemon();
    m.mount(&["writeback.mode=back"]);
    let k = backing.join("out/k");
    assert!(std::fs::read(&k).unwrap() == expect(b"head", 0, b""));
    assert_eq!(
        std::fs::metadata(backing.join("out/k2")).unwrap().len(),
        SIZE
    );
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || assert_eq!(std::fs::metadata(mnt.join("out/k")).unwrap().len(), SIZE)
    });
    assert_eq!(
        lost_files(&m.cache),
        Vec::<std::path::PathBuf>::new(),
        "nothing went to journal/lost"
    );
}
