//! Namespace write-back of attribute changes of the store's own objects
//! (`writeback/namespace/ns_chattr.rs`): `chmod`, `chown` and times of files, directories and symlinks
//! the store has are acknowledged before the store has them, shown at once, and applied in
//! their turn.

mod common;

use common::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn chmod(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// utimensat(2) of `p` itself (a symlink too): atime and mtime to `sec`.
fn set_times(p: &Path, sec: i64) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let t = libc::timespec {
        tv_sec: sec,
        tv_nsec: 0,
    };
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            [t, t].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {p:?}: {}", std::io::Error::last_os_error());
}

fn mtime(p: &Path) -> i64 {
    std::fs::symlink_metadata(p).unwrap().mtime()
}

/// chmod of 20 files, a directory's mode and times, a symlink's times (and, as root, a
/// chown) return before the store has them, with no wait: stat through the mount shows
/// them at once, the store gets them at fsync of the directory. What is not deferred is
/// done on the store at once: a setuid bit. A regular file's times are deferred, and a write
/// after them is flushed after them (its mtime is the one the store ends with). A name someone
/// else filled behind our back before the flusher came keeps their object's attributes.
/// After `kill -9`, the replay sets what the journal holds, on the objects it was set on.
#[test]
fn a_chmod_of_an_object_of_the_store_returns_before_the_store_has_it() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let d = backing.join("d");
    std::fs::create_dir_all(d.join("s")).unwrap();
    for k in 0..20 {
        std::fs::write(d.join(format!("f{k}")), format!("f{k}")).unwrap();
        chmod(&d.join(format!("f{k}")), 0o644);
    }
    std::os::unix::fs::symlink("f0", d.join("l")).unwrap();
    chmod(&d.join("s"), 0o755);
    let root = unsafe { libc::geteuid() } == 0;
    m.mount(WB_HELD);
    let (deferred, waited) = with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let (mnt, d) = (mnt.clone(), d.clone());
        move || {
            let md = mnt.join("d");
            assert_eq!(std::fs::read_dir(&md).unwrap().count(), 22);
            let (deferred0, waits0) = (
                stat_of(&mnt, "writeback.namespace.deferred"),
                stat_of(&mnt, "writeback.namespace.waits"),
            );
            for k in 0..20 {
                chmod(&md.join(format!("f{k}")), 0o600);
            }
            chmod(&md.join("s"), 0o700);
            set_times(&md.join("s"), 1_000_000_000);
            set_times(&md.join("l"), 1_000_000_001);
            if root {
                std::os::unix::fs::lchown(md.join("f0"), Some(1234), Some(5678)).unwrap();
            }
            // A listing waits for none of them (`chmod -R` lists each directory right after
            // its chmod), and shows them.
            let listed: Vec<u32> = std::fs::read_dir(&md)
                .unwrap()
                .map(|e| e.unwrap())
                .filter(|e| e.file_name() == "f3")
                .map(|e| e.metadata().unwrap().mode() & 0o7777)
                .collect();
            assert_eq!(listed, [0o600]);
            assert_eq!(std::fs::read_dir(md.join("s")).unwrap().count(), 0);
            let deferred = stat_of(&mnt, "writeback.namespace.deferred") - deferred0;
            let waited = stat_of(&mnt, "writeback.namespace.waits") - waits0;
            // Shown at once, not on the store yet.
            assert_eq!(mode(&md.join("f3")), 0o600);
            assert_eq!(mode(&md.join("s")), 0o700);
            assert_eq!(mtime(&md.join("s")), 1_000_000_000);
            assert_eq!(mtime(&md.join("l")), 1_000_000_001);
            assert_eq!(
                mode(&d.join("f3")),
                0o644,
                "the store has it once the flusher comes"
            );
            assert_eq!(mode(&d.join("s")), 0o755);
            if root {
                let meta = std::fs::metadata(md.join("f0")).unwrap();
                assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
                assert_eq!(std::fs::metadata(d.join("f0")).unwrap().uid(), 0);
            }
            // Someone else puts a directory where f5 was, before the flusher comes.
            std::fs::remove_file(d.join("f5")).unwrap();
            std::fs::create_dir(d.join("f5")).unwrap();
            chmod(&d.join("f5"), 0o751);
            let conflicts0 = stat_of(&mnt, "writeback.namespace.conflicts");
            // Not deferred: a setuid bit (after the deferred ones of the file: all of them
            // go to the store first).
            chmod(&md.join("f18"), 0o4755);
            assert_eq!(mode(&d.join("f18")), 0o4755);
            // A regular file's times (`touch`) are deferred; a write after them is flushed
            // after them, or they would undo the mtime its flush sets.
            set_times(&md.join("f16"), 1_000_000_002);
            set_times(&md.join("f19"), 1_000_000_003);
            assert_eq!(mtime(&md.join("f16")), 1_000_000_002);
            assert_ne!(mtime(&d.join("f16")), 1_000_000_002, "not on the store yet");
            assert_eq!(mtime(&md.join("f19")), 1_000_000_003);
            assert_eq!(mode(&md.join("f19")), 0o600, "f19's deferred chmod is kept");
            let before_write = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(md.join("f19"))
                    .unwrap();
                f.write_all(b"F19").unwrap();
            }
            let written = mtime(&md.join("f19"));
            assert!(
                written >= before_write,
                "the write's mtime is shown: {written}"
            );
            // The data flusher would have written it by now (it does not wait for more).
            std::thread::sleep(Duration::from_secs(2));
            assert_eq!(
                std::fs::read(d.join("f19")).unwrap(),
                b"f19",
                "the data of a file waits for its deferred setattrs"
            );
            // Deferred again, and put on the store by fsync of the directory.
            chmod(&md.join("f17"), 0o640);
            assert_eq!(mode(&d.join("f17")), 0o600);
            std::fs::File::open(&md).unwrap().sync_all().unwrap();
            assert_eq!(mode(&d.join("f17")), 0o640, "fsync(dir) applied it");
            assert_eq!(
                mode(&d.join("f18")),
                0o4755,
                "never undone by its older chmod"
            );
            assert_eq!(
                stat_of(&mnt, "writeback.namespace.conflicts") - conflicts0,
                1,
                "f5 was someone else's by then"
            );
            assert_eq!(mode(&d.join("f5")), 0o751, "theirs is left as it is");
            for k in (0..17).filter(|k| *k != 5) {
                assert_eq!(mode(&d.join(format!("f{k}"))), 0o600, "f{k} on the store");
            }
            assert_eq!(mode(&d.join("f19")), 0o600);
            assert_eq!(
                mtime(&d.join("f16")),
                1_000_000_002,
                "f16's times on the store"
            );
            // f19's data, flushed once its setattrs were on the store, and its mtime last.
            let t = std::time::Instant::now();
            while std::fs::read(d.join("f19")).unwrap() != b"F19" {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "f19's data never came"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            std::fs::File::open(md.join("f19"))
                .unwrap()
                .sync_all()
                .unwrap();
            assert_eq!(
                mtime(&d.join("f19")),
                written,
                "the write's mtime, not the touch's"
            );
            assert_eq!(mode(&d.join("s")), 0o700);
            assert_eq!(mtime(&d.join("s")), 1_000_000_000);
            assert_eq!(mtime(&d.join("l")), 1_000_000_001);
            if root {
                let meta = std::fs::metadata(d.join("f0")).unwrap();
                assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
            }
            // Through the mount, after the shadows went: the store's, as the daemon answers
            // (the kernel's cached attributes dropped first, where we may).
            if root {
                std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
            }
            assert_eq!(mode(&md.join("f3")), 0o600);
            assert_eq!(mode(&md.join("f17")), 0o640);
            assert_eq!(mode(&md.join("f18")), 0o4755);
            assert_eq!(mode(&md.join("s")), 0o700);
            assert_eq!(mtime(&md.join("l")), 1_000_000_001);
            assert_eq!(mtime(&md.join("f16")), 1_000_000_002);
            assert_eq!(mtime(&md.join("f19")), written);
            (deferred, waited)
        }
    });
    assert_eq!(
        deferred,
        23 + root as u64,
        "20 chmods of files, a chmod and times of a directory, times of a symlink (a chown)"
    );
    assert_eq!(waited, 0, "a setattr waited for the namespace flusher");

    // Across kill -9: set, killed before the flusher ran; the replay sets them, on the
    // objects they were set on.
    let e = backing.join("e");
    std::fs::create_dir(&e).unwrap();
    for k in 0..5 {
        std::fs::write(e.join(format!("g{k}")), b"g").unwrap();
        chmod(&e.join(format!("g{k}")), 0o644);
    }
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            let me = mnt.join("e");
            assert_eq!(std::fs::read_dir(&me).unwrap().count(), 5);
            for k in 0..5 {
                chmod(&me.join(format!("g{k}")), 0o640);
            }
            set_times(&me.join("g1"), 1_000_000_010);
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
        }
    });
    assert_eq!(mode(&e.join("g0")), 0o644, "nothing set on the store yet");
    assert_ne!(mtime(&e.join("g1")), 1_000_000_010);
    m.kill_daemon();
    std::fs::remove_file(e.join("g4")).unwrap();
    std::fs::create_dir(e.join("g4")).unwrap();
    chmod(&e.join("g4"), 0o711);
    m.mount(&["writeback.mode=back"]);
    for k in 0..4 {
        assert_eq!(mode(&e.join(format!("g{k}"))), 0o640, "g{k} replayed");
    }
    assert_eq!(mtime(&e.join("g1")), 1_000_000_010, "g1's times replayed");
    assert_eq!(
        mode(&e.join("g4")),
        0o711,
        "someone else's g4 is left as it is"
    );
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || assert_eq!(mode(&mnt.join("e/g1")), 0o640)
    });
    assert_eq!(
        lost_files(&m.cache),
        Vec::<std::path::PathBuf>::new(),
        "nothing went to journal/lost"
    );
}
