//! A store that hangs never hangs cached data (issue 43): with the store's daemon stopped
//! (SIGSTOP: a FUSE store, as an sshfs whose server stalls), `cat` of a cached file and `ls`
//! of a cached directory answer within `store.timeout` plus a little, with default
//! coherence (close-to-open); a read of data not cached waits, and SIGKILL ends it within a
//! second; `tierfs stats` says the store is taken for hung; once the
//! store answers again (SIGCONT), a file made on it meanwhile is seen. `tierfs unmount`
//! while it hangs is in exit.rs.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(90);
/// `store.timeout` of the mount under test.
const TIMEOUT: Duration = Duration::from_secs(2);

/// `prog args` in a child process, under `timeout -s KILL`: its stdout and how long it took.
fn timed(prog: &str, args: &[&Path]) -> (std::process::Output, Duration) {
    let t = Instant::now();
    let out = Command::new("timeout")
        .args(["-s", "KILL", "30", prog])
        .args(args)
        .output()
        .unwrap();
    (out, t.elapsed())
}

/// tierfs over the tierfs mount `store` (a store that can hang: SIGSTOP its daemon) with
/// `store.timeout` and `opts`, once the store's files are older than the racy window (a file
/// changed within the last second is not cached); and the store daemon's pid.
fn over_the_store(store: &BinMount, opts: &[&str]) -> (BinMount, i32) {
    std::thread::sleep(Duration::from_millis(1100));
    let mut m = BinMount::unmounted_in(Path::new("/tmp"));
    m.backing = store.mnt.clone();
    let timeout = format!("store.timeout={}s", TIMEOUT.as_secs());
    let all: Vec<&str> = std::iter::once(timeout.as_str())
        .chain(opts.iter().copied())
        .collect();
    m.mount(&all);
    (m, store.daemon_pid().expect("store daemon"))
}

#[test]
fn cached_files_and_listings_are_served_while_the_store_hangs() {
    let store = BinMount::new(&[]);
    std::fs::create_dir(store.backing.join("d")).unwrap();
    std::fs::write(store.backing.join("d/g1"), vec![7u8; 200 << 10]).unwrap();
    std::fs::write(store.backing.join("d/g2"), b"two\n").unwrap();
    let big = std::fs::File::create(store.backing.join("big")).unwrap();
    big.set_len(64 << 20).unwrap();
    let (m, store_pid) = over_the_store(&store, &[]);
    let (mnt, store_mnt) = (m.mnt.clone(), store.mnt.clone());
    with_timeout(LIMIT, vec![m.mnt.clone(), store.mnt.clone()], move || {
        // Cached: read once, listed once.
        assert_eq!(std::fs::read(mnt.join("d/g1")).unwrap().len(), 200 << 10);
        assert_eq!(sorted_names(&mnt.join("d")), ["g1", "g2"]);
        // Known, its start read: the rest is not cached.
        let (out, _) = timed("head", &[Path::new("-c4096"), &mnt.join("big")]);
        assert_eq!(out.stdout.len(), 4096);
        drop_caches();
        let stopped = Stopped::stop(store_pid);

        let (out, took) = timed("cat", &[&mnt.join("d/g1")]);
        assert!(out.status.success(), "cat: {out:?}");
        assert_eq!(out.stdout, vec![7u8; 200 << 10]);
        assert!(took < TIMEOUT + Duration::from_secs(2), "cat took {took:?}");
        let (out, took) = timed("ls", &[&mnt.join("d")]);
        assert!(out.status.success(), "ls: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "g1\ng2\n");
        assert!(took < TIMEOUT + Duration::from_secs(2), "ls took {took:?}");
        // A read of data no tier holds waits for the store, and SIGKILL ends it.
        let mut reader = Command::new("dd")
            .arg(format!("if={}", mnt.join("big").display()))
            .args(["of=/dev/null", "bs=4k", "skip=15000", "count=1"])
            .spawn()
            .unwrap();
        std::thread::sleep(TIMEOUT + Duration::from_millis(1500));
        assert!(
            reader.try_wait().unwrap().is_none(),
            "the read did not wait"
        );
        let killed = Instant::now();
        reader.kill().unwrap();
        while reader.try_wait().unwrap().is_none() {
            assert!(
                killed.elapsed() < Duration::from_secs(2),
                "a reader waiting for the hung store survived SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("reader ended {:?} after SIGKILL", killed.elapsed());
        let st = stats_of(&mnt);
        assert_eq!(n(&st, "backing.hung"), 1, "{st}");
        assert!(n(&st, "backing.timeouts") >= 1, "{st}");

        // The store answers again: made on it meanwhile (through its own mount, which
        // queued the request), the new file is seen once the prober found it back.
        let made = std::thread::spawn(move || std::fs::write(store_mnt.join("d/g3"), b"3\n"));
        drop(stopped);
        made.join().unwrap().unwrap();
        let t = Instant::now();
        while n(&stats_of(&mnt), "backing.hung") == 1 {
            assert!(t.elapsed() < Duration::from_secs(20), "still hung");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(std::fs::read(mnt.join("d/g3")).unwrap(), b"3\n");
    });
    m.unmount_and_wait();
}

/// A file kept open across the store's freeze, read again once its version is older than
/// `meta.ttl`: its cached data is served within `store.timeout`, then at once, instead of the
/// reader waiting in the frozen store. (Here the kernel's attribute check before the read,
/// a getattr with a deadline, finds the store hung first; the read's own check of the
/// version, an `fstat`, has the same deadline, for a read the kernel sends unchecked.)
#[test]
fn an_open_file_is_read_from_the_cache_after_meta_ttl_while_the_store_hangs() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let store = BinMount::new(&[]);
    std::fs::write(store.backing.join("g"), vec![7u8; 200 << 10]).unwrap();
    let (m, store_pid) = over_the_store(&store, &["meta.ttl=1s", "meta.ttl_min=1s"]);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![m.mnt.clone(), store.mnt.clone()], move || {
        let f = std::fs::File::open(mnt.join("g")).unwrap();
        let mut buf = vec![0u8; 200 << 10];
        f.read_exact_at(&mut buf, 0).unwrap();
        // The version read is older than meta.ttl by the next read.
        std::thread::sleep(Duration::from_millis(1500));
        let _stopped = Stopped::stop(store_pid);
        for pass in ["first", "second"] {
            // The kernel's pages dropped: the read reaches tierfs.
            // SAFETY: an advice on a descriptor this test holds.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            let t = Instant::now();
            buf.fill(0);
            f.read_exact_at(&mut buf, 0).unwrap();
            let took = t.elapsed();
            assert!(buf.iter().all(|&b| b == 7), "{pass} read: wrong bytes");
            assert!(
                took < TIMEOUT + Duration::from_secs(2),
                "{pass} read of cached data took {took:?} while the store hangs"
            );
            eprintln!("{pass} read while the store hangs: {took:?}");
        }
    });
}

/// Write-back while the store hangs: writes into a cached file, and a new file in a cached
/// directory, are absorbed by the journal within the deadline (up to the store space and
/// inodes counted before it stopped), read back from the mount, and
/// once the store answers again (SIGCONT) `tierfs unmount` puts every byte on it.
#[test]
fn write_back_absorbs_writes_while_the_store_hangs_and_loses_none() {
    let store = BinMount::new(&[]);
    std::fs::create_dir(store.backing.join("d")).unwrap();
    std::fs::write(store.backing.join("d/g1"), vec![7u8; 64 << 10]).unwrap();
    let (m, store_pid) = over_the_store(&store, &["writeback.mode=back"]);
    let mnt = m.mnt.clone();
    let stopped = with_timeout(LIMIT, vec![m.mnt.clone(), store.mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("d/g1")).unwrap().len(), 64 << 10);
        assert_eq!(sorted_names(&mnt.join("d")), ["g1"]);
        // A first write reserves store space, and a first create counts the store's inodes
        // (statfs), for the next ones: what write-back grants while the store does not answer
        // (`writeback.reserve_chunk`).
        std::fs::write(mnt.join("first"), b"before the store stopped").unwrap();
        let stopped = Stopped::stop(store_pid);
        let of = std::path::PathBuf::from(format!("of={}", mnt.join("d/g1").display()));
        let (out, took) = timed(
            "dd",
            &[
                Path::new("if=/dev/zero"),
                &of,
                Path::new("bs=4096"),
                Path::new("count=4"),
                Path::new("conv=notrunc"),
            ],
        );
        assert!(out.status.success(), "dd into a cached file: {out:?}");
        assert!(took < TIMEOUT + Duration::from_secs(2), "dd took {took:?}");
        // A new name in the cached directory: the listing answers that it is free, and the
        // create is deferred (on the inode count last seen).
        let (out, took) = timed("cp", &[Path::new("/etc/hostname"), &mnt.join("d/new")]);
        assert!(out.status.success(), "cp to a new file: {out:?}");
        assert!(took < TIMEOUT + Duration::from_secs(2), "cp took {took:?}");
        let g1 = std::fs::read(mnt.join("d/g1")).unwrap();
        assert!(g1[..16 << 10].iter().all(|&b| b == 0) && g1[16 << 10..].iter().all(|&b| b == 7));
        stopped
    });
    // The store answers again; the unmount drains everything to it.
    drop(stopped);
    m.tierfs_unmount(120);
    let g1 = std::fs::read(store.backing.join("d/g1")).unwrap();
    assert_eq!(g1.len(), 64 << 10);
    assert!(
        g1[..16 << 10].iter().all(|&b| b == 0) && g1[16 << 10..].iter().all(|&b| b == 7),
        "the write absorbed while the store hung is on the store"
    );
    assert_eq!(
        std::fs::read(store.backing.join("d/new")).unwrap(),
        std::fs::read("/etc/hostname").unwrap()
    );
    assert_eq!(
        std::fs::read(store.backing.join("first")).unwrap(),
        b"before the store stopped"
    );
}
