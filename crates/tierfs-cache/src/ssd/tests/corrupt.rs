use super::*;
use std::os::unix::fs::FileExt;

#[test]
fn flipped_data_is_never_served() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    fill(&c, 0..20, 3000);
    for i in [2u64, 9, 17] {
        let (seg, off, len) = where_is(&c, &key(i));
        flip(&seg, off + len as u64 / 2);
    }
    for i in 0..20 {
        match c.get(&key(i), 1) {
            Some(b) => assert_eq!(b, data(i, 1, 3000)),
            None => assert!([2, 9, 17].contains(&i), "intact entry {i} lost"),
        }
    }
    let st = c.stats();
    assert_eq!(st.checksum_errors, 3);
    assert_eq!(st.entries, 17, "damaged entries dropped");
    assert!(c.get(&key(2), 1).is_none());
    assert_eq!(
        c.stats().checksum_errors,
        3,
        "counted once: the entry is gone"
    );
}

#[test]
fn misdirected_data_is_caught_by_the_seeded_crc() {
    let d = tmpdir();
    let c = open(d.path(), cfg());
    fill(&c, 0..2, 8192);
    // Entry 1's bytes in entry 0's place: right length, valid data, wrong entry.
    let (s0, o0, _) = where_is(&c, &key(0));
    let (s1, o1, _) = where_is(&c, &key(1));
    let mut b = vec![0u8; 8192];
    fs::File::open(&s1)
        .unwrap()
        .read_exact_at(&mut b, o1)
        .unwrap();
    let f = fs::OpenOptions::new().write(true).open(&s0).unwrap();
    f.write_all_at(&b, o0).unwrap();
    f.sync_all().unwrap();
    assert!(c.get(&key(0), 1).is_none());
    assert_eq!(c.stats().checksum_errors, 1);
    assert_eq!(c.get(&key(1), 1).unwrap(), data(1, 1, 8192));
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn size_of(i: u64) -> usize {
    [300usize, 2000, 4096, 9000, 30000][(i % 5) as usize]
}

/// Random damage anywhere in the tier's files: open never panics, and nothing it serves is
/// wrong.
#[test]
fn random_damage_never_yields_wrong_data() {
    let src = tmpdir();
    {
        let c = open(src.path(), cfg());
        for i in 0..120 {
            assert!(c.offer(key(i), 1, data(i, 1, size_of(i))));
            if i % 40 == 39 {
                c.flush();
            }
        }
        c.flush();
    }
    let files: Vec<_> = fs::read_dir(src.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n != LOCK_FILE)
        .collect();
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let (mut opened, mut served) = (0, 0);
    for round in 0..30 {
        let d = tmpdir();
        for n in &files {
            fs::copy(src.path().join(n), d.path().join(n)).unwrap();
        }
        // Without the checkpoint half the time, so the summary parser sees the damage too.
        if round % 2 == 0 {
            let _ = fs::remove_file(d.path().join(checkpoint::FILE));
        }
        for _ in 0..1 + round % 8 {
            let n = &files[(rng.next() % files.len() as u64) as usize];
            if n == superblock::FILE {
                continue; // refused with a message: damaged_or_foreign_superblock_is_refused
            }
            let p = d.path().join(n);
            let Ok(m) = fs::metadata(&p) else { continue };
            if m.len() == 0 {
                continue;
            }
            // Mostly summaries and headers (the first pages of clusters), sometimes anywhere.
            let at = if rng.next().is_multiple_of(2) {
                (rng.next() % (m.len() / 65536 + 1)) * 65536 + rng.next() % 600
            } else {
                rng.next() % m.len()
            };
            if at < m.len() {
                flip(&p, at);
            }
        }
        let c = SsdCache::open(d.path(), &ident(), cfg(), false)
            .unwrap_or_else(|e| panic!("round {round}: open after damage: {e}"));
        opened += 1;
        for i in 0..120 {
            let want = data(i, 1, size_of(i));
            if let Some(b) = c.get(&key(i), 1) {
                assert_eq!(b, want, "round {round}: wrong data for entry {i}");
                served += 1;
            }
            if let Some(b) = c.read_range(&key(i), 1, 100, 5000) {
                let end = want.len().min(5100);
                assert_eq!(b, want.slice(100.min(end)..end));
            }
        }
        // It keeps working after the damage.
        fill(&c, 500..505, 5000);
        assert_eq!(c.get(&key(502), 1).unwrap(), data(502, 1, 5000));
    }
    assert!(
        opened == 30 && served > 2000,
        "opened {opened}, served {served}"
    );
}
