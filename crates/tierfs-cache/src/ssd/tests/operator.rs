//! The operator's tools: `offer_wait` (warm), `evict`, and fsck's check and repair.

use super::*;

#[test]
fn offer_wait_waits_for_budget_instead_of_dropping() {
    let d = tmpdir();
    // 256 KiB of burst, 1 MiB/s: 2 MiB of entries take about 1.75 s.
    let c = open(
        d.path(),
        SsdConfig {
            write_rate: 1 << 20,
            write_burst: 256 << 10,
            ..cfg()
        },
    );
    let t = std::time::Instant::now();
    for i in 0..32 {
        assert_eq!(
            c.offer_wait(key(i), 1, data(i, 1, 65536), true),
            Ok(Admit::Queued)
        );
    }
    c.flush();
    let el = t.elapsed();
    let st = c.stats();
    assert_eq!(st.entries, 32, "every entry admitted: {st:?}");
    assert_eq!(st.dropped_budget, 0);
    assert!(
        el >= Duration::from_millis(1500),
        "too fast for the budget: {el:?}"
    );
    let limit = (256 << 10) + (el.as_secs_f64() * (1 << 20) as f64) as u64 + (72 << 10);
    assert!(st.written_bytes <= limit, "{} > {limit}", st.written_bytes);
    // Already there: not written again.
    assert_eq!(
        c.offer_wait(key(3), 1, data(3, 1, 65536), true),
        Ok(Admit::Present)
    );
    for i in 0..32 {
        assert_eq!(c.get(&key(i), 1).unwrap(), data(i, 1, 65536));
    }
}

#[test]
fn offer_wait_without_budget_is_fast_and_not_charged() {
    let d = tmpdir();
    let c = open(
        d.path(),
        SsdConfig {
            write_rate: 1 << 10,
            write_burst: 128 << 10,
            ..cfg()
        },
    );
    let t = std::time::Instant::now();
    for i in 0..64 {
        assert_eq!(
            c.offer_wait(key(i), 1, data(i, 1, 65536), false),
            Ok(Admit::Queued)
        );
    }
    c.flush();
    assert!(t.elapsed() < Duration::from_secs(5));
    let st = c.stats();
    assert_eq!(st.entries, 64);
    assert_eq!(st.admitted_unbudgeted_bytes, 64 * 65536);
    assert!(st.written_bytes > 4 << 20);
    // The bucket paid nothing for them: a budgeted offer still gets through at once.
    assert!(st.cur_burst >= 64 << 10, "bucket drained: {st:?}");
    assert!(c.offer(key(100), 1, data(100, 1, 4096)));
    // A budget that can never pay: an error, not a hang.
    c.set_write_rate(0);
    c.set_write_burst(1024);
    assert_eq!(
        c.offer_wait(key(101), 1, data(101, 1, 65536), true),
        Err(AdmitError::NoBudget)
    );
}

#[test]
fn evict_survives_a_restart() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..40, 20000);
        let (n, bytes) = c.evict((0..10).map(key));
        assert_eq!((n, bytes), (10, 200000));
        assert_eq!(c.evict((0..10).map(key)), (0, 0), "already gone");
        assert!(c.get(&key(3), 1).is_none());
        assert_eq!(c.stats().evicted, 10);
        // No clean shutdown: the tombstones must come back from the log, not a checkpoint.
        c.flush();
        std::mem::forget(c);
    }
    // The forgotten cache still holds the lock: take the directory over by copy.
    let d2 = tmpdir();
    for e in fs::read_dir(d.path()).unwrap().flatten() {
        if e.file_name() != "lock" {
            fs::copy(e.path(), d2.path().join(e.file_name())).unwrap();
        }
    }
    let c = open(d2.path(), cfg());
    for i in 0..40 {
        assert_eq!(c.get(&key(i), 1).is_some(), i >= 10, "entry {i}");
    }
}

#[test]
fn fsck_reports_bad_entries_and_repair_drops_them() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..60, 10000);
        for i in [5u64, 33] {
            let (seg, off, len) = where_is(&c, &key(i));
            flip(&seg, off + len as u64 / 3);
        }
        c.shutdown();
    }
    let r = fsck::check(d.path()).expect("check");
    assert_eq!(r.superblock, fsck::SuperblockState::Ok);
    assert_eq!(r.entries, 60);
    assert_eq!(r.entry_bytes, 600000);
    assert_eq!(r.bad_entries.len(), 2, "{r:?}");
    let mut bad: Vec<u64> = r
        .bad_entries
        .iter()
        .map(|b| b.key.idx + 16 * (b.key.ino - 1000))
        .collect();
    bad.sort();
    assert_eq!(bad, vec![5, 33]);
    assert!(r.torn.is_empty());
    assert!(matches!(
        r.checkpoint,
        fsck::CheckpointState::Loaded { entries: 60, .. }
    ));
    assert_eq!(r.problems().len(), 2);

    let done = fsck::repair(&r).expect("repair");
    assert_eq!(done.bad_entries_dropped, 2);
    let r2 = fsck::check(d.path()).expect("check again");
    assert!(r2.problems().is_empty(), "{:?}", r2.problems());
    assert_eq!(r2.entries, 58);
    let c = open(d.path(), cfg());
    for i in 0..60 {
        match c.get(&key(i), 1) {
            Some(b) => assert_eq!(b, data(i, 1, 10000)),
            None => assert!(i == 5 || i == 33, "entry {i} lost"),
        }
    }
    assert_eq!(c.stats().checksum_errors, 0);
}

#[test]
fn fsck_reports_torn_tails_and_bad_checkpoints_and_changes_nothing() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..30, 10000);
        c.shutdown();
    }
    let segs = segments(d.path());
    let last = segs.last().unwrap();
    let len = fs::metadata(last).unwrap().len();
    // A torn cluster: garbage appended after the last one.
    {
        use std::io::Write;
        let mut f = fs::OpenOptions::new().append(true).open(last).unwrap();
        f.write_all(&[0xAB; 8192]).unwrap();
    }
    flip(&d.path().join("checkpoint"), 100);
    let before: Vec<_> = fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| (e.file_name(), e.metadata().unwrap().len()))
        .collect();
    let r = fsck::check(d.path()).expect("check");
    assert!(
        matches!(r.checkpoint, fsck::CheckpointState::Unusable(_)),
        "{r:?}"
    );
    assert_eq!(r.torn.len(), 1);
    assert_eq!((r.torn[0].at, r.torn[0].len), (len, len + 8192));
    assert_eq!(r.entries, 30);
    assert!(r.bad_entries.is_empty());
    assert_eq!(r.problems().len(), 2);
    let after: Vec<_> = fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| (e.file_name(), e.metadata().unwrap().len()))
        .collect();
    assert_eq!(before, after, "the check changed the directory");

    // Locked by a running cache: refused.
    {
        let _c = open(d.path(), cfg());
        assert!(matches!(fsck::check(d.path()), Err(SsdError::Busy { .. })));
    }
    // (The open above repaired it already; damage it again for the repair.)
    let r = fsck::check(d.path()).expect("check");
    assert!(r.problems().is_empty(), "{:?}", r.problems());
    flip(&d.path().join("checkpoint"), 100);
    let r = fsck::check(d.path()).expect("check");
    assert_eq!(r.problems().len(), 1);
    let done = fsck::repair(&r).expect("repair");
    assert!(done.checkpoint_written);
    let r = fsck::check(d.path()).expect("check");
    assert!(r.problems().is_empty(), "{:?}", r.problems());
    assert!(matches!(
        r.checkpoint,
        fsck::CheckpointState::Loaded { entries: 30, .. }
    ));
}

#[test]
fn fsck_of_a_damaged_superblock_wipes_on_repair() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..5, 1000);
        c.shutdown();
    }
    flip(&d.path().join("superblock"), 60);
    let r = fsck::check(d.path()).expect("check");
    assert!(
        matches!(r.superblock, fsck::SuperblockState::Damaged(_)),
        "{r:?}"
    );
    assert_eq!(r.problems().len(), 1);
    assert!(fsck::repair(&r).expect("repair").wiped);
    assert!(segments(d.path()).is_empty());
    let r = fsck::check(d.path()).expect("check");
    assert_eq!(r.superblock, fsck::SuperblockState::Absent);
    assert!(r.problems().is_empty());
}
