//! Flush errors in write-back mode, in a test binary of its own.
//!
//! Why alone: the test checks that close(2) reports a failure the background flushers met.
//! A FLUSH from *any* close of the open file takes that report, and a process that spawns a
//! child gives the child a copy of every descriptor until its exec closes them, which is a
//! close too. The other write-back tests spawn daemons and kill them all the time, so in one
//! binary with them this test's report was now and then taken by a child's exec.

mod common;
use common::*;
use std::fs::OpenOptions;
use std::io;
use std::time::{Duration, Instant};

/// Errors of the backing store during a flush (EIO here): the data stays dirty and in the
/// journal, the flush is retried with backoff, the error is counted and reported by the next
/// fsync and by close; once the store works again, fsync succeeds and the backing file holds
/// every byte.
#[test]
fn flush_errors_are_kept_retried_and_reported() {
    use tierfs_store::OpClass;
    let wb = tierfs_fs::WbConfig {
        mode: tierfs_fs::WbMode::Back,
        flushers: 2,
        journal_size: 256 << 20,
        ..Default::default()
    };
    let m = FaultMount::with_writeback(tierfs_fs::FsConfig::default(), Some(wb), |_| {});
    let (mnt, backing, faults, fs) = (
        m.mnt.clone(),
        m.backing.clone(),
        m.faults.clone(),
        m.fs.clone(),
    );
    with_timeout(Duration::from_secs(120), vec![mnt.clone()], move || {
        let data = seeded_bytes(7, 3 << 20);
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(mnt.join("f"))
            .unwrap();
        // Its create on the store (write-back may defer it, and creates fail with writes),
        // then opened again: the close of a deferred create's descriptor sends no FLUSH to
        // report errors at (docs/writeback.md), an open of the store's file does.
        f.sync_all().unwrap();
        drop(f);
        let f = OpenOptions::new().write(true).open(mnt.join("f")).unwrap();
        // The store fails every write from here on; the application's writes still succeed.
        faults.fail(OpClass::Write, Some(libc::EIO));
        write_all_at(&f, &data, 0).unwrap();
        let err = f
            .sync_all()
            .expect_err("fsync must report the failed flush");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        let st = fs.stats();
        let w = st.writeback.as_ref().unwrap();
        assert!(w.flush_errors >= 1, "{w:?}");
        assert_eq!(w.dirty_bytes, data.len() as u64, "data kept dirty: {w:?}");
        assert_eq!(std::fs::metadata(backing.join("f")).unwrap().len(), 0);
        // Through the mount the data is all there.
        assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);

        // close(2) reports a failure the background flushers met since the last report.
        let before = fs.stats().writeback.unwrap().flush_errors;
        write_all_at(&f, b"more", data.len() as u64).unwrap();
        let t = Instant::now();
        while fs.stats().writeback.unwrap().flush_errors == before {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "no retry within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
        let rc = unsafe { libc::close(fd) };
        assert_eq!(rc, -1, "close must report the failed flush");
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EIO));

        // The store recovers: the retries (or an fsync) write everything back.
        faults.fail(OpClass::Write, None);
        let f = OpenOptions::new().write(true).open(mnt.join("f")).unwrap();
        f.sync_all().unwrap();
        let mut want = data.clone();
        want.extend_from_slice(b"more");
        assert_eq!(std::fs::read(backing.join("f")).unwrap(), want);
        let w = fs.stats().writeback.unwrap();
        assert_eq!(w.dirty_bytes, 0, "{w:?}");
        println!(
            "flush errors: {} counted, retried with backoff, reported at fsync and close; all {} bytes written back after recovery",
            w.flush_errors,
            want.len()
        );

        // A file whose create was deferred and fails on the store (a create is a write):
        // fsync reports the failure instead of waiting for as long as the store fails, the
        // create stays queued, and once the store works an fsync makes file and data durable.
        let g = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(mnt.join("g"))
            .unwrap();
        faults.fail(OpClass::Write, Some(libc::EIO));
        write_all_at(&g, b"made late", 0).unwrap();
        let t = Instant::now();
        let err = g
            .sync_all()
            .expect_err("fsync must report the failed create");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
        assert!(!backing.join("g").exists());
        assert_eq!(std::fs::read(mnt.join("g")).unwrap(), b"made late");
        faults.fail(OpClass::Write, None);
        g.sync_all().unwrap();
        assert_eq!(std::fs::read(backing.join("g")).unwrap(), b"made late");
    });
}
