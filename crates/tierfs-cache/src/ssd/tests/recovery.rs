use super::*;

fn check_all(c: &SsdCache, range: std::ops::Range<u64>, len: usize) {
    for i in range {
        assert_eq!(
            c.get(&key(i), 1).expect("survived"),
            data(i, 1, len),
            "entry {i}"
        );
    }
}

#[test]
fn restart_from_checkpoint() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..300, 9000);
        c.get(&key(5), 1);
    }
    assert!(d.path().join(checkpoint::FILE).exists());
    let c = open(d.path(), cfg());
    let st = c.stats();
    assert_eq!(st.rebuilt_entries, 300);
    assert!(st.segments >= 2, "rolled over: {}", st.segments);
    check_all(&c, 0..300, 9000);
    // New writes go on after a restart.
    fill(&c, 300..310, 9000);
    check_all(&c, 300..310, 9000);
}

#[test]
fn restart_from_summaries_only() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..300, 9000);
    }
    fs::remove_file(d.path().join(checkpoint::FILE)).unwrap();
    let c = open(d.path(), cfg());
    assert_eq!(c.stats().rebuilt_entries, 300);
    check_all(&c, 0..300, 9000);
}

#[test]
fn restart_from_checkpoint_plus_newer_summaries() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..100, 9000);
        c.checkpoint().unwrap();
        fs::copy(d.path().join(checkpoint::FILE), d.path().join("cp.saved")).unwrap();
        fill(&c, 100..250, 9000);
        // Overwrite some old ones with a new version after the checkpoint.
        for i in 0..10 {
            assert!(c.offer(key(i), 2, data(i, 2, 9000)));
        }
        c.flush();
    }
    fs::rename(d.path().join("cp.saved"), d.path().join(checkpoint::FILE)).unwrap();
    let c = open(d.path(), cfg());
    assert_eq!(c.stats().rebuilt_entries, 250);
    check_all(&c, 10..250, 9000);
    for i in 0..10 {
        assert!(!c.contains(&key(i), 1));
        assert_eq!(c.get(&key(i), 2).unwrap(), data(i, 2, 9000));
    }
}

#[test]
fn corrupt_checkpoint_falls_back_to_a_full_scan() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..50, 3000);
    }
    let cp = d.path().join(checkpoint::FILE);
    flip(&cp, 200);
    let c = open(d.path(), cfg());
    assert_eq!(c.stats().rebuilt_entries, 50);
    check_all(&c, 0..50, 3000);
}

#[test]
fn entries_of_a_vanished_segment_are_dropped() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..300, 9000);
    }
    let first = segments(d.path()).remove(0);
    fs::remove_file(&first).unwrap();
    let c = open(d.path(), cfg());
    let st = c.stats();
    assert!(st.rebuilt_entries < 300 && st.rebuilt_entries > 0);
    for i in 0..300 {
        if let Some(b) = c.get(&key(i), 1) {
            assert_eq!(b, data(i, 1, 9000));
        }
    }
    assert!(c.get(&key(299), 1).is_some());
}

#[test]
fn identity_mismatch_is_refused_and_reset_rebuilds() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..5, 100);
    }
    let other = SsdIdentity {
        store_id: "other-99".into(),
        block_size: 65536,
    };
    let e = SsdCache::open(d.path(), &other, cfg(), false)
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("belongs to store store-1 (this mount is other-99); use --reset-cache"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
    let bs = SsdIdentity {
        block_size: 4096,
        ..ident()
    };
    let e = SsdCache::open(d.path(), &bs, cfg(), false).err().unwrap();
    assert!(matches!(e, SsdError::WrongBlockSize { .. }), "{e}");
    // reset: the directory now belongs to the other store, empty.
    let c = SsdCache::open(d.path(), &other, cfg(), true).expect("reset");
    assert_eq!(c.stats().entries, 0);
    assert!(c.get(&key(1), 1).is_none());
    drop(c);
    assert!(SsdCache::open(d.path(), &ident(), cfg(), false).is_err());
}

#[test]
fn damaged_or_foreign_superblock_is_refused() {
    let d = tmpdir();
    drop(open(d.path(), cfg()));
    let sb = d.path().join(superblock::FILE);
    flip(&sb, 30);
    let e = SsdCache::open(d.path(), &ident(), cfg(), false)
        .err()
        .unwrap();
    assert!(matches!(e, SsdError::Damaged { .. }), "{e}");
    assert!(e.to_string().contains("--reset-cache"));
    flip(&sb, 30);
    // A damaged format field is damage, not another format.
    flip(&sb, 8);
    let e = SsdCache::open(d.path(), &ident(), cfg(), false)
        .err()
        .unwrap();
    assert!(matches!(e, SsdError::Damaged { .. }), "{e}");
    flip(&sb, 8);
    // Segment files without a superblock: not ours to guess about.
    fs::remove_file(&sb).unwrap();
    fs::write(d.path().join(segment::file_name(1)), b"x").unwrap();
    let e = SsdCache::open(d.path(), &ident(), cfg(), false)
        .err()
        .unwrap();
    assert!(matches!(e, SsdError::Damaged { .. }), "{e}");
    let c = SsdCache::open(d.path(), &ident(), cfg(), true).expect("reset");
    fill(&c, 0..3, 100);
}

/// A first open killed while it wrote the superblock leaves `superblock.tmp` alone: the
/// next open creates the tier, it does not call that damage (survives_kill_9 found it).
#[test]
fn a_superblock_cut_short_at_creation_is_no_damage() {
    let d = tmpdir();
    fs::write(d.path().join("superblock.tmp"), b"half a superbl").unwrap();
    let c = SsdCache::open(d.path(), &ident(), cfg(), false).expect("open");
    fill(&c, 0..3, 100);
}

#[test]
fn torn_last_segment_keeps_earlier_entries() {
    for keep_checkpoint in [false, true] {
        let d = tmpdir();
        {
            let c = open(d.path(), cfg());
            // Three clusters of 5 entries each in one segment.
            for r in 0..3 {
                fill(&c, r * 5..r * 5 + 5, 10000);
            }
        }
        if !keep_checkpoint {
            fs::remove_file(d.path().join(checkpoint::FILE)).unwrap();
        }
        let seg = segments(d.path()).pop().unwrap();
        let len = fs::metadata(&seg).unwrap().len();
        // Cut the last cluster in its middle, as a crash during its write would.
        let f = fs::OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(len - 20000).unwrap();
        drop(f);
        let c = open(d.path(), cfg());
        check_all(&c, 0..10, 10000);
        for i in 10..15 {
            match c.get(&key(i), 1) {
                // The checkpoint knows the entries; those still inside the file are intact.
                Some(b) if keep_checkpoint && i < 14 => assert_eq!(b, data(i, 1, 10000)),
                got => assert!(got.is_none(), "torn entry {i} served"),
            }
        }
        // Appends go to a new segment, not after the torn tail.
        fill(&c, 100..105, 10000);
        check_all(&c, 100..105, 10000);
        let (s, _, _) = where_is(&c, &key(100));
        assert_ne!(s, seg);
    }
}

#[test]
fn flipped_summary_drops_that_tail() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        for r in 0..3 {
            fill(&c, r * 5..r * 5 + 5, 10000);
        }
    }
    fs::remove_file(d.path().join(checkpoint::FILE)).unwrap();
    let seg = segments(d.path()).pop().unwrap();
    // The second cluster starts after the first: 4 KiB summary + 5 * 12 KiB data.
    let second = 4096 + 5 * 12288;
    flip(&seg, second + 100);
    let c = open(d.path(), cfg());
    check_all(&c, 0..5, 10000);
    for i in 5..15 {
        assert!(c.get(&key(i), 1).is_none());
    }
    assert_eq!(
        fs::metadata(&seg).unwrap().len(),
        second,
        "torn tail cut off"
    );
    fill(&c, 20..25, 10000);
    check_all(&c, 20..25, 10000);
}

/// A directory written in an older on-disk format (format 1 keyed entries by the backing
/// device and inode numbers) is rebuilt empty at open, and says so; never refused, never read.
#[test]
fn older_format_is_rebuilt() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..5, 100);
    }
    let sb = d.path().join(superblock::FILE);
    let mut b = fs::read(&sb).unwrap();
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&crc.to_le_bytes());
    fs::write(&sb, &b).unwrap();
    let c = SsdCache::open(d.path(), &ident(), cfg(), false).expect("rebuilt, not refused");
    assert_eq!(c.rebuilt_from_format(), Some(1));
    assert_eq!(c.stats().entries, 0);
    for i in 0..5 {
        assert!(c.get(&key(i), 1).is_none());
    }
    drop(c);
    let c = open(d.path(), cfg());
    assert_eq!(c.rebuilt_from_format(), None);
}
