use super::*;

#[test]
fn round_trip_many_sizes() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    let sizes = [
        0usize,
        1,
        100,
        511,
        512,
        513,
        4095,
        4096,
        4097,
        20000,
        65536 - 8192,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        assert!(c.offer(key(i as u64), 1, data(i as u64, 1, n)), "size {n}");
    }
    c.flush();
    for (i, &n) in sizes.iter().enumerate() {
        let k = key(i as u64);
        assert!(c.contains(&k, 1));
        let got = c.get(&k, 1).expect("hit");
        assert_eq!(got, data(i as u64, 1, n), "size {n}");
    }
    let st = c.stats();
    assert_eq!(st.hits, sizes.len() as u64);
    assert_eq!(st.entries, sizes.len() as u64);
    assert_eq!(st.checksum_errors, 0);
    assert!(st.written_bytes > 0 && st.written_bytes.is_multiple_of(4096));
}

#[test]
fn version_mismatch_is_a_miss_and_drops_the_stale_entry() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    c.offer(key(1), 1, data(1, 1, 5000));
    c.flush();
    assert!(c.get(&key(1), 2).is_none());
    assert!(!c.contains(&key(1), 1), "stale entry dropped");
    let st = c.stats();
    assert_eq!((st.hits, st.misses, st.stale_drops), (0, 1, 1));
    // The new version is admitted and served; the old one never again.
    assert!(c.offer(key(1), 2, data(1, 2, 5000)));
    c.flush();
    assert_eq!(c.get(&key(1), 2).unwrap(), data(1, 2, 5000));
    assert!(c.get(&key(1), 1).is_none());
}

#[test]
fn read_range_returns_exact_bytes_and_verifies_only_touched_pages() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    let full = data(3, 1, 40000);
    c.offer(key(3), 1, full.clone());
    c.offer(key(4), 1, data(4, 1, 700));
    c.flush();
    for (off, len) in [
        (0u32, 10u32),
        (4000, 200),
        (4096, 4096),
        (39990, 100),
        (12345, 0),
    ] {
        let got = c.read_range(&key(3), 1, off, len).expect("range");
        let end = ((off + len) as usize).min(full.len());
        assert_eq!(got, full.slice(off as usize..end), "range {off}+{len}");
    }
    assert_eq!(c.read_range(&key(3), 1, 40000, 10).unwrap().len(), 0);
    assert!(c.read_range(&key(3), 1, 40001, 10).is_none());
    assert_eq!(
        c.read_range(&key(4), 1, 100, 50).unwrap(),
        data(4, 1, 700).slice(100..150)
    );
    // Damage page 7 of the entry: ranges elsewhere are still served, a range touching it is not.
    let (seg, off, _) = where_is(&c, &key(3));
    flip(&seg, off + 7 * 4096 + 100);
    let got = c
        .read_range(&key(3), 1, 4096, 8192)
        .expect("pages 1-2 intact");
    assert_eq!(got, full.slice(4096..12288));
    assert_eq!(c.stats().checksum_errors, 0);
    assert!(c.read_range(&key(3), 1, 7 * 4096 + 4000, 200).is_none());
    assert_eq!(c.stats().checksum_errors, 1);
    assert!(!c.contains(&key(3), 1), "damaged entry dropped");
}

#[test]
fn offered_twice_is_written_once() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    assert!(c.offer(key(1), 1, data(1, 1, 8192)));
    assert!(c.offer(key(1), 1, data(1, 1, 8192)), "queued: still true");
    c.flush();
    assert!(c.offer(key(1), 1, data(1, 1, 8192)), "stored: still true");
    c.flush();
    let st = c.stats();
    assert_eq!((st.admitted, st.duplicates), (1, 2));
    assert_eq!(st.clusters_written, 1);
}

#[test]
fn kind_switches_and_size_limit() {
    let d = tmpdir();
    let c = open(
        d.path(),
        SsdConfig {
            cache_data: false,
            ..cfg()
        },
    );
    assert!(!c.offer(key(1), 1, data(1, 1, 100)));
    let attr = SsdKey {
        kind: KIND_ATTR,
        ..key(1)
    };
    assert!(c.offer(attr, 1, data(1, 1, 100)));
    let big = SsdKey {
        kind: KIND_DIR,
        ..key(2)
    };
    assert!(
        !c.offer(big, 1, data(2, 1, (64 << 10) + 1)),
        "larger than a cluster"
    );
    assert!(c.offer(big, 1, data(2, 1, 64 << 10)), "exactly a cluster");
    c.flush();
    assert_eq!(c.get(&attr, 1).unwrap(), data(1, 1, 100));
    assert_eq!(c.get(&big, 1).unwrap(), data(2, 1, 64 << 10));
    assert_eq!(c.stats().dropped_other, 2);
    // Switched at run time (`tierfs ctl set ssd.cache_data=on,ssd.cache_meta=off`).
    c.set_admission(true, false);
    assert!(c.offer(key(3), 1, data(3, 1, 100)), "data admitted once on");
    let attr2 = SsdKey {
        kind: KIND_ATTR,
        ..key(4)
    };
    assert!(!c.offer(attr2, 1, data(4, 1, 100)), "meta refused once off");
    c.flush();
    assert_eq!(c.get(&key(3), 1).unwrap(), data(3, 1, 100));
    assert_eq!(
        c.get(&attr, 1).unwrap(),
        data(1, 1, 100),
        "stored entries stay"
    );
    assert_eq!(c.stats().dropped_other, 3);
}

#[test]
fn remove_is_durable() {
    let d = tmpdir();
    {
        let c = open(d.path(), cfg());
        fill(&c, 0..10, 3000);
        c.checkpoint().unwrap();
        c.remove(&key(3));
        c.remove(&key(4));
        assert!(c.get(&key(3), 1).is_none());
        c.flush();
        // Dropped without a new checkpoint: only the tombstones in the log remember.
        fs::copy(d.path().join(checkpoint::FILE), d.path().join("cp.saved")).unwrap();
    }
    fs::rename(d.path().join("cp.saved"), d.path().join(checkpoint::FILE)).unwrap();
    let c = open(d.path(), cfg());
    assert!(c.get(&key(3), 1).is_none());
    assert!(c.get(&key(4), 1).is_none());
    assert_eq!(c.get(&key(5), 1).unwrap(), data(5, 1, 3000));
}

#[test]
fn readers_run_while_the_writer_writes() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    fill(&c, 0..200, 6000);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|t| {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut hits, mut i) = (0u64, t as u64);
                while !stop.load(Relaxed) {
                    i = (i * 7 + 13) % 600;
                    if let Some(b) = c.get(&key(i), 1) {
                        assert_eq!(b, data(i, 1, 6000), "entry {i}");
                        hits += 1;
                    }
                    if let Some(b) = c.read_range(&key(i), 1, 4000, 1000) {
                        assert_eq!(b, data(i, 1, 6000).slice(4000..5000));
                    }
                }
                hits
            })
        })
        .collect();
    fill(&c, 200..600, 6000);
    stop.store(true, Relaxed);
    let hits: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(hits > 0);
    assert_eq!(c.stats().checksum_errors, 0);
}

#[test]
fn second_open_of_a_directory_is_refused() {
    let d = tmpdir();
    let _c = open(d.path(), cfg());
    let e = SsdCache::open(d.path(), &ident(), cfg(), false)
        .err()
        .unwrap();
    assert!(matches!(e, SsdError::Busy { .. }), "{e}");
    assert!(e.to_string().contains("in use"));
}

#[test]
fn shutdown_is_idempotent_and_reads_go_on() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    fill(&c, 0..5, 1000);
    c.shutdown();
    c.shutdown();
    assert_eq!(c.get(&key(2), 1).unwrap(), data(2, 1, 1000));
    assert!(!c.offer(key(9), 1, data(9, 1, 10)));
    assert!(matches!(c.checkpoint(), Err(SsdError::Closed)));
}

#[test]
fn buffered_io_path() {
    // What a filesystem refusing O_DIRECT (EINVAL) gets: buffered I/O + fadvise(DONTNEED).
    let d = tmpdir();
    let open_buffered = || SsdCache::open_inner(d.path(), &ident(), cfg(), false, false).unwrap();
    {
        let c = open_buffered();
        fill(&c, 0..20, 5000);
        assert_eq!(c.get(&key(3), 1).unwrap(), data(3, 1, 5000));
    }
    let c = open_buffered();
    assert!(!c.sh.direct.load(Relaxed));
    assert_eq!(
        c.read_range(&key(19), 1, 4096, 10).unwrap(),
        data(19, 1, 5000).slice(4096..4106)
    );
}

#[test]
fn works_on_tmpfs() {
    // Older kernels refuse O_DIRECT on tmpfs (the fallback); newer ones take it.
    let Ok(d) = tempfile::Builder::new()
        .prefix("tierfs-ssd-test")
        .tempdir_in("/dev/shm")
    else {
        return;
    };
    let c = open(d.path(), cfg());
    fill(&c, 0..20, 5000);
    assert_eq!(c.get(&key(3), 1).unwrap(), data(3, 1, 5000));
}

#[test]
fn cache_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<SsdCache>();
    check::<Arc<SsdCache>>();
}

/// `get_many` over keys in several segments: a run of adjacent entries ends at a segment
/// boundary. (The span of a run used to be computed before the check that the next entry is
/// in the same segment: an entry at a lower offset of another segment made the subtraction
/// underflow, a panic in debug builds that failed the read-ahead or read calling it.)
#[test]
fn get_many_across_segments() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    let (n, len) = (200, 16 << 10);
    fill(&c, 0..n, len);
    let mut by_seg: std::collections::BTreeMap<PathBuf, Vec<(u64, u64)>> = Default::default();
    for i in 0..n {
        let (seg, off, _) = where_is(&c, &key(i));
        by_seg.entry(seg).or_default().push((off, i));
    }
    assert!(by_seg.len() >= 3, "{} segments", by_seg.len());
    // The first and the last entry of each segment: whichever order the segments are visited
    // in, a run that ends high in one segment is followed by an entry low in another.
    let mut want = Vec::new();
    for v in by_seg.values() {
        want.push(v.iter().min().unwrap().1);
        want.push(v.iter().max().unwrap().1);
    }
    let keys: Vec<SsdKey> = want.iter().map(|&i| key(i)).collect();
    for (&i, got) in want.iter().zip(c.get_many(&keys, 1)) {
        assert_eq!(got.as_deref(), Some(&data(i, 1, len)[..]), "entry {i}");
    }
}
