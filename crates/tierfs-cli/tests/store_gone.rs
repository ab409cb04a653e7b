//! A FUSE backing store that dies and comes back at the same path (issue 13 item 11). The
//! store here is another tierfs mount (a FUSE filesystem like sshfs or bindfs, and one the
//! suite already has): `kill -9` of its daemon leaves its mount answering ENOTCONN; a lazy
//! unmount then leaves the empty directory it was mounted on; a new mount brings it back.

mod common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

const TMP: &str = "/var/tmp";

fn errno_of(r: std::io::Result<Vec<u8>>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
fn a_fuse_store_that_dies_is_served_from_cache_and_found_again() {
    let lower = BinMount::unmounted_in(Path::new(TMP));
    let data: Vec<Vec<u8>> = (0..3u64).map(|i| seeded_bytes(i + 7, 3 << 20)).collect();
    for (i, d) in data.iter().enumerate() {
        std::fs::write(lower.backing.join(format!("f{i}")), d).unwrap();
    }
    std::fs::create_dir(lower.backing.join("d")).unwrap();
    std::fs::write(lower.backing.join("d/a"), b"before").unwrap();
    std::fs::create_dir(lower.backing.join("e")).unwrap();
    // Files changed within the last moment are not cached (their version is racy).
    std::thread::sleep(Duration::from_millis(2100));
    let mut upper = BinMount::unmounted_in(Path::new(TMP));
    upper.backing = lower.mnt.clone();
    let mounts = vec![upper.mnt.clone(), lower.mnt.clone()];
    with_timeout(Duration::from_secs(120), mounts, move || {
        lower.mount(&[]);
        upper.mount(&[]);
        let up = |p: &str| upper.mnt.join(p);
        // Read (cached) f0, f1 and d/a; list d. f2 is never read.
        assert!(std::fs::read(up("f0")).unwrap() == data[0]);
        assert!(std::fs::read(up("f1")).unwrap() == data[1]);
        assert_eq!(std::fs::read(up("d/a")).unwrap(), b"before");
        let names = |dir: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&up("d")), vec!["a"]);
        let root = vec!["d", "e", "f0", "f1", "f2"];
        assert_eq!(names(&upper.mnt), root);

        // The store's daemon dies: its mount answers ENOTCONN.
        let pid = lower.daemon_pid().expect("lower daemon");
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert!(wait_exit(pid, Duration::from_secs(20)));
        let served = |what: &str| {
            assert!(std::fs::read(up("f0")).unwrap() == data[0], "{what}: f0");
            assert!(std::fs::read(up("f1")).unwrap() == data[1], "{what}: f1");
            assert_eq!(std::fs::read(up("d/a")).unwrap(), b"before", "{what}: d/a");
            assert_eq!(names(&up("d")), vec!["a"], "{what}: listing of d");
            assert_eq!(names(&upper.mnt), root, "{what}: listing of the root");
            // Never listed: an error at once; and what is cached stays served (the failed
            // listing took its parent's listing and attributes with it).
            let e = std::fs::read_dir(up("e")).map(|_| ()).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{what}: e: {e}");
            std::thread::sleep(Duration::from_millis(3500));
            assert_eq!(names(&upper.mnt), root, "{what}: the root after e failed");
            // Never read: an error at once, not a hang.
            assert_eq!(
                errno_of(std::fs::read(up("f2"))),
                Some(libc::ENOTCONN),
                "{what}: f2 was never cached"
            );
        };
        served("store dead");
        let st = stats_of(&upper.mnt);
        assert_eq!(n(&st, "backing.gone"), 1);
        assert!(n(&st, "backing.notconn") > 0);
        let log = std::fs::read_to_string(upper.cache.join("tierfs.log")).unwrap();
        assert!(log.contains("backing store gone"), "not logged");

        // Unmounted: BACKING is the empty directory it was mounted on, which is not the store.
        let _ = std::process::Command::new("fusermount3")
            .arg("-uz")
            .arg(&lower.mnt)
            .status();
        std::thread::sleep(Duration::from_millis(2500));
        served("store unmounted");
        assert_eq!(n(&stats_of(&upper.mnt), "backing.reconnects"), 0);

        // Changed meanwhile, then mounted again at the same path: found without a remount.
        std::fs::write(lower.backing.join("d/a"), b"after!").unwrap();
        std::fs::write(lower.backing.join("new"), b"new file").unwrap();
        lower.mount(&[]);
        let t = Instant::now();
        loop {
            match std::fs::read(up("f2")) {
                Ok(d) => {
                    assert!(d == data[2], "f2 after the store came back");
                    break;
                }
                Err(e) if t.elapsed() < Duration::from_secs(15) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("the store never came back: {e}"),
            }
        }
        // Caches checked against it again (meta.ttl is 1 s).
        let t = Instant::now();
        while std::fs::read(up("d/a")).unwrap() != b"after!" {
            assert!(t.elapsed() < Duration::from_secs(10), "stale d/a served");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(std::fs::read(up("new")).unwrap(), b"new file");
        assert!(std::fs::read(up("f0")).unwrap() == data[0]);
        let st = stats_of(&upper.mnt);
        assert_eq!(
            (n(&st, "backing.gone"), n(&st, "backing.reconnects")),
            (0, 1)
        );
        upper.unmount_and_wait();
        lower.unmount_and_wait();
    });
}

/// Write-back goes on absorbing writes to files it knows while the store is gone (within the
/// space the store granted before), and writes them to the store once it is back.
#[test]
fn write_back_absorbs_writes_while_the_store_is_gone() {
    let lower = BinMount::unmounted_in(Path::new(TMP));
    let orig = seeded_bytes(99, 1 << 20);
    std::fs::write(lower.backing.join("f"), &orig).unwrap();
    std::fs::write(lower.backing.join("log"), b"line 1\n").unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    let mut upper = BinMount::unmounted_in(Path::new(TMP));
    upper.backing = lower.mnt.clone();
    let mounts = vec![upper.mnt.clone(), lower.mnt.clone()];
    with_timeout(Duration::from_secs(120), mounts, move || {
        lower.mount(&[]);
        upper.mount(&["writeback.mode=back"]);
        let up = |p: &str| upper.mnt.join(p);
        assert!(std::fs::read(up("f")).unwrap() == orig);
        // A first write: write-back has the store's free space in hand.
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(up("log"))
            .unwrap();
        std::io::Write::write_all(&mut log, b"line 2\n").unwrap();
        drop(log);
        // On the store, and old enough to be cached (a file changed within the last moment
        // is not), then read: what is cached of it when the store goes.
        let t = Instant::now();
        while std::fs::read(lower.backing.join("log")).unwrap() != b"line 1\nline 2\n" {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "line 2 never flushed"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(2100));
        assert_eq!(std::fs::read(up("log")).unwrap(), b"line 1\nline 2\n");

        let pid = lower.daemon_pid().expect("lower daemon");
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert!(wait_exit(pid, Duration::from_secs(20)));
        let _ = std::process::Command::new("fusermount3")
            .arg("-uz")
            .arg(&lower.mnt)
            .status();

        // Absorbed while the store is gone.
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(up("log"))
            .unwrap();
        std::io::Write::write_all(&mut log, b"line 3\n").unwrap();
        drop(log);
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(up("f"))
                .unwrap();
            f.write_all_at(&[0xAB; 65536], 4096).unwrap();
        }
        let mut want = orig.clone();
        want[4096..4096 + 65536].fill(0xAB);
        assert!(
            std::fs::read(up("f")).unwrap() == want,
            "served with the new writes"
        );
        assert_eq!(
            std::fs::read(up("log")).unwrap(),
            b"line 1\nline 2\nline 3\n"
        );

        // Back: the writes reach the store.
        lower.mount(&[]);
        let t = Instant::now();
        loop {
            let f = std::fs::read(lower.backing.join("f")).unwrap();
            let l = std::fs::read(lower.backing.join("log")).unwrap();
            if f == want && l == b"line 1\nline 2\nline 3\n" {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "never written to the store"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        upper.unmount_and_wait();
        lower.unmount_and_wait();
    });
}
