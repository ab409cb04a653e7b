//! A full cache device (issue 13 item 10): the journal refuses what needs a segment it cannot
//! create with `NoSpace` (ENOSPC at write(2) above it), never fails for good, leaves no partial
//! segment behind, asks its space hook for room, takes data again once there is room, and
//! opens on a full device.

use super::*;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A tmpfs of `size` mounted on a fresh directory; unmounted (lazily) on drop.
struct Small {
    _dir: TempDir,
    path: PathBuf,
}

impl Small {
    fn new(size: &str) -> Option<Small> {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (mounts a tmpfs)");
            return None;
        }
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("fs");
        fs::create_dir(&path).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -t tmpfs");
        Some(Small { _dir: dir, path })
    }
}

impl Drop for Small {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Fills the filesystem of `dir` with one file; returns it.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = File::create(&p).unwrap();
    let chunk = vec![1u8; 1 << 20];
    loop {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    let small = vec![1u8; 4096];
    while f.write_all(&small).is_ok() {}
    let _ = f.sync_all();
    p
}

fn small_cfg() -> JournalConfig {
    JournalConfig {
        segment_size: 4 * MIB,
        max_size: 32 * MIB,
        max_buffer: 4 * MIB,
        sync_interval: Duration::from_millis(50),
    }
}

#[test]
fn a_full_device_gives_no_space_then_the_journal_resumes() {
    let Some(small) = Small::new("48m") else {
        return;
    };
    let dir = small.path.join("journal");
    let (j, _) = Journal::open(&dir, "store-a", small_cfg(), false).unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    {
        let asked = asked.clone();
        j.set_space_hook(Arc::new(move |b| {
            asked.fetch_add(b, Ordering::Relaxed);
            0
        }));
    }
    // The first record, then the device fills up (the spare segment is already made).
    let d = bytes(1, 512 * 1024);
    let first = j.append_data(&file(1), 0, &d).unwrap();
    j.sync(first).unwrap();
    wait_until("the next segment made ahead", || {
        replay::list_segments(&dir).unwrap().len() == 2
    });
    let filler = fill(&small.path);

    // The current segment and the spare fill up; then NoSpace, not a failed journal.
    let mut written = vec![(first, 0u64)];
    let err = loop {
        let off = written.len() as u64 * (512 << 10);
        match j.append_data(&file(1), off, &d) {
            Ok(s) => written.push((s, off)),
            Err(e) => break e,
        }
        assert!(written.len() < 64, "the device never filled");
    };
    assert!(matches!(err, JournalError::NoSpace { .. }), "{err}");
    assert!(
        written.len() >= 8,
        "only {} records before NoSpace",
        written.len()
    );
    assert!(
        asked.load(Ordering::Relaxed) > 0,
        "the space hook was not asked"
    );
    j.sync_all().unwrap();
    // Again: still NoSpace (a fresh attempt), still no partial segment left.
    let again = j.append_data(&file(1), 1 << 30, &d);
    assert!(
        matches!(again, Err(JournalError::NoSpace { .. })),
        "{again:?}"
    );
    let segs_now = replay::list_segments(&dir).unwrap();
    for s in &segs_now {
        let len = fs::metadata(dir.join(seg_name(*s))).unwrap().len();
        assert_eq!(
            len,
            4 * MIB,
            "segment {s}: a partial preallocation left behind"
        );
    }
    assert!(j.stats().no_space == 1 && j.stats().no_space_errors >= 2);

    // Room again: the journal takes data without a reopen.
    fs::remove_file(&filler).unwrap();
    let s = j.append_data(&file(2), 0, b"after").unwrap();
    j.sync(s).unwrap();
    // The writer notices by itself (it retries every few seconds).
    let t = Instant::now();
    while j.stats().no_space != 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "room never noticed");
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..12u64 {
        j.append_data(&file(3), i << 19, &d).unwrap();
    }
    drop(j);

    // Full again, then reopened: everything acknowledged is there.
    let filler = fill(&small.path);
    let (j, rp) = Journal::open(&dir, "store-a", small_cfg(), false).unwrap();
    assert_eq!(rp.pending.len(), written.len() + 1 + 12);
    assert!(rp.damage.is_empty() && rp.torn_tail.is_none(), "{rp:?}");
    let after = rp.pending.iter().find(|p| p.file.ino == 2).unwrap();
    assert_eq!(j.read_pending(after).unwrap(), b"after");
    drop(j);
    fs::remove_file(filler).unwrap();
}
