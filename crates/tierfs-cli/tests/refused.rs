//! An operation the store refuses for good never wedges write-back (issue 43): a truncate
//! past the store's largest file answers EFBIG at the call, as the store's own filesystem
//! would; data the store refuses at the flush anyway (EFBIG here, from a fault-injecting
//! store) is set aside in `lost/` with a report, and unlink, directory renames (with their
//! own errors, never the old one), unmount and the next mount all go on.

mod common;
use common::*;
use std::fs::OpenOptions;
use std::path::Path;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
/// pjdfstest's size past the largest file (truncate/12.t).
const HUGE: u64 = 999_999_999_999_999;

/// Whether the filesystem holding `dir` refuses a file of `size` bytes (EFBIG).
fn refuses_size(dir: &Path, size: u64) -> bool {
    let f = tempfile::tempfile_in(dir).unwrap();
    match f.set_len(size) {
        Ok(()) => false,
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
            true
        }
    }
}

/// The namespace goes on around a file: it is unlinked, directories are renamed, and a
/// rename that must fail answers its own errno.
fn namespace_goes_on(mnt: &Path) {
    std::fs::create_dir(mnt.join("d1")).unwrap();
    std::fs::create_dir(mnt.join("full")).unwrap();
    std::fs::write(mnt.join("full/x"), b"x").unwrap();
    std::fs::rename(mnt.join("d1"), mnt.join("d2")).unwrap();
    let e = std::fs::rename(mnt.join("d2"), mnt.join("full")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    std::fs::remove_file(mnt.join("big")).unwrap();
}

/// Over a real filesystem, through the binary: the truncate is answered as the store's
/// filesystem answers it (EFBIG on ext4, whose largest file is 16 TiB); then unlink,
/// renames, `tierfs unmount` and a remount of the same cache dir all work.
#[test]
fn a_truncate_past_the_stores_largest_file_is_refused_at_the_call() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let refuses = refuses_size(&m.backing, HUGE);
    let opts = ["writeback.mode=back", "meta.cto=off", "meta.ttl=1h"];
    m.mount(&opts);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(mnt.join("big"))
            .unwrap();
        match f.set_len(HUGE) {
            Ok(()) => assert!(!refuses, "the store refuses {HUGE} bytes, tierfs took it"),
            Err(e) => {
                assert!(refuses, "the store takes {HUGE} bytes, tierfs refused: {e}");
                assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
                assert_eq!(f.metadata().unwrap().len(), 0);
                // A write there too.
                let e = f.write_at_err(HUGE);
                assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
            }
        }
        f.sync_all().unwrap();
        drop(f);
        namespace_goes_on(&mnt);
    });
    m.tierfs_unmount(60);
    m.mount(&opts);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert!(mnt.join("d2").is_dir());
        assert!(!mnt.join("big").exists());
    });
    m.unmount_and_wait();
    assert!(m.backing.join("d2").is_dir() && !m.backing.join("big").exists());
}

trait WriteAtErr {
    fn write_at_err(&self, at: u64) -> std::io::Error;
}

impl WriteAtErr for std::fs::File {
    fn write_at_err(&self, at: u64) -> std::io::Error {
        use std::os::unix::fs::FileExt;
        self.write_at(b"x", at)
            .expect_err("a write past the largest file")
    }
}

/// Data the store refuses at the flush (the store's limit unknown to tierfs: EFBIG for
/// every write, from the fault store) is set aside in `lost/` with a report naming the
/// file and why; fsync reports EIO once; the file is again what the store has; nothing
/// queued after it waits; and a remount replays nothing of it.
#[test]
fn data_the_store_refuses_at_the_flush_is_set_aside_and_nothing_waits() {
    use tierfs_store::OpClass;
    let wb = tierfs_fs::WbConfig {
        mode: tierfs_fs::WbMode::Back,
        ..Default::default()
    };
    let m = FaultMount::with_writeback(tierfs_fs::FsConfig::default(), Some(wb), |b| {
        std::fs::write(b.join("big"), b"the store's bytes").unwrap();
    });
    let lost = m.dir.path().join("journal/lost");
    let (mnt, backing, faults, fs) = (
        m.mnt.clone(),
        m.backing.clone(),
        m.faults.clone(),
        m.fs.clone(),
    );
    let lost2 = lost.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let f = OpenOptions::new()
            .write(true)
            .open(mnt.join("big"))
            .unwrap();
        faults.fail(OpClass::Write, Some(libc::EFBIG));
        write_all_at(&f, b"refused", 1 << 20).unwrap();
        let t = Instant::now();
        while fs.stats().writeback.unwrap().dirty_bytes > 0 {
            assert!(t.elapsed() < Duration::from_secs(60), "never set aside");
            std::thread::sleep(Duration::from_millis(20));
        }
        faults.fail(OpClass::Write, None);
        // A duplicate descriptor closed first (a child process closing it at exec): its
        // close reports the loss too, and leaves it for the application's fsync.
        drop(f.try_clone().unwrap());
        let e = f.sync_all().expect_err("fsync reports the data set aside");
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(
            std::fs::read(mnt.join("big")).unwrap(),
            b"the store's bytes"
        );
        let reports: Vec<String> = std::fs::read_dir(&lost2)
            .expect("lost/ made")
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "txt"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect();
        assert_eq!(reports.len(), 1, "{reports:?}");
        assert!(
            reports[0].contains("big") && reports[0].contains("refused"),
            "{}",
            reports[0]
        );
        namespace_goes_on(&mnt);
        assert!(!backing.join("big").exists());
    });
    let m = m.remount();
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert!(mnt.join("d2").is_dir());
        assert!(!mnt.join("big").exists());
    });
    assert_eq!(
        m.fs.stats().writeback.unwrap().replayed_writes,
        0,
        "the set-aside data was replayed"
    );
}
