//! Damage inside the journal (issue 13 item 1): a bad stretch followed by valid records is
//! skipped, every valid record after it is still replayed, and the files the damage may
//! concern are handed back as `lost` instead of being replayed (never rolled back).

use super::*;

/// One record as it lies in a segment file.
#[derive(Clone, Debug)]
struct At {
    seg: u64,
    off: u64,
    len: u64,
    seq: u64,
    /// The file of a DATA record, with its offset and data length.
    data: Option<(FileRef, u64, u64)>,
}

/// Every record of every segment, in order, read independently of the scan.
fn records(dir: &Path) -> Vec<At> {
    let mut v = Vec::new();
    for seg in segs(dir) {
        let b = fs::read(dir.join(seg_name(seg))).unwrap();
        let mut off = 0usize;
        while let HeaderCheck::Ok(h) = format::parse_header(&b[off..]) {
            let end = off + HDR + h.len as usize;
            let data = match format::decode(h.kind, &b[off + HDR..end]).unwrap() {
                Decoded::Data {
                    dev,
                    ino,
                    offset,
                    path,
                    data,
                } => Some((
                    FileRef {
                        dev,
                        ino,
                        path: path.to_vec(),
                    },
                    offset,
                    data.len() as u64,
                )),
                _ => None,
            };
            v.push(At {
                seg,
                off: off as u64,
                len: (end - off) as u64,
                seq: h.seq,
                data,
            });
            off = end;
        }
    }
    v
}

/// 60 writes of 100-200 KiB to files 1, 2, 3 in turn over several segments; file 3 is done
/// up to its 10th write. Returns what is pending.
fn build(dir: &Path) -> Written {
    let (j, _) = open(dir, cfg());
    let mut all = Written::new();
    let mut rng = Rng(99);
    let mut third = 0;
    for i in 0..60u64 {
        let f = file(1 + i % 3);
        let d = bytes(500 + i, 100_000 + rng.next(100_000) as usize);
        let s = j.append_data(&f, i << 18, &d).unwrap();
        all.insert(s, (f, i << 18, d));
        if i % 3 == 2 {
            third += 1;
            if third == 10 {
                j.done(77, 3, s).unwrap();
                all.retain(|&q, v| !(v.0.ino == 3 && q <= s));
            }
        }
    }
    j.sync_all().unwrap();
    drop(j);
    assert!(segs(dir).len() >= 3, "the test spans segments");
    all
}

fn copy(orig: &Path, to: &Path) -> PathBuf {
    let d = to.to_path_buf();
    fs::create_dir_all(&d).unwrap();
    for e in fs::read_dir(orig).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    d
}

fn poke(dir: &Path, seg: u64, off: u64, bytes: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .open(dir.join(seg_name(seg)))
        .unwrap();
    io::write_all_at(&f, bytes, off).unwrap();
}

/// Splits the expected pending writes into (replayed, lost) by the inode numbers lost.
fn split(all: &Written, lost: &[u64]) -> (Written, Written) {
    all.iter()
        .map(|(s, v)| (*s, v.clone()))
        .partition(|(_, v)| !lost.contains(&v.0.ino))
}

fn check_lost(j: &Journal, rp: &Replay, expect: &Written) {
    let got: Vec<u64> = rp.lost.iter().map(|p| p.seq).collect();
    assert_eq!(got, expect.keys().copied().collect::<Vec<_>>(), "lost seqs");
    for p in &rp.lost {
        assert_eq!(&j.read_pending(p).unwrap(), &expect[&p.seq].2);
    }
}

/// The record in the middle of the journal that is a DATA of `ino`, not the first or last.
fn middle_record_of(recs: &[At], ino: u64) -> At {
    let of: Vec<&At> = recs
        .iter()
        .filter(|r| r.data.as_ref().is_some_and(|d| d.0.ino == ino))
        .collect();
    of[of.len() / 2].clone()
}

#[test]
fn a_flipped_data_byte_costs_one_file_and_every_later_record_is_replayed() {
    let tmp = TempDir::new().unwrap();
    let orig = tmp.path().join("orig");
    let all = build(&orig);
    let recs = records(&orig);
    let r = middle_record_of(&recs, 2);
    let dir = copy(&orig, &tmp.path().join("t"));
    // A byte of its data, well past the header and path.
    let at = r.off + r.len - 1000;
    let mut b = [0u8; 1];
    let f = File::open(dir.join(seg_name(r.seg))).unwrap();
    io::read_at_most(&f, &mut b, at).unwrap();
    poke(&dir, r.seg, at, &[b[0] ^ 0x40]);

    let (j, rp) = open(&dir, cfg());
    assert_eq!(rp.damage.len(), 1, "{:?}", rp.damage);
    let d = &rp.damage[0];
    assert!(!d.harmless);
    assert_eq!((d.offset, d.len), (r.off, r.len));
    let (fref, foff, flen) = r.data.clone().unwrap();
    assert_eq!(d.file.as_ref(), Some(&fref));
    assert_eq!(d.range, Some((foff, Some(flen))));
    assert!(d.after_seq < r.seq && r.seq < d.before_seq);
    assert!(rp.torn_tail.is_none());
    // File 2 is left alone (its writes set aside, none lost silently); 1 and 3 replay whole,
    // records after the damage included.
    let mut rest = all.clone();
    rest.remove(&r.seq);
    let (replayed, lost) = split(&rest, &[2]);
    check_replay(&j, &rp, &replayed);
    check_lost(&j, &rp, &lost);
    assert!(
        replayed.keys().any(|&s| s > r.seq),
        "records after the damage"
    );

    // The caller sets file 2 aside and drops it past the hole: the next open reports nothing.
    let upto = (*lost.keys().max().unwrap()).max(d.before_seq - 1);
    j.drop_file(77, 2, upto).unwrap();
    j.sync_all().unwrap();
    drop(j);
    let (j, rp) = open(&dir, cfg());
    assert!(
        rp.lost.is_empty() && rp.harmful_damage().next().is_none(),
        "{:?}",
        rp.damage
    );
    check_replay(&j, &rp, &replayed);
}

#[test]
fn damage_whose_owner_is_unknown_sets_aside_every_file_with_older_writes() {
    let tmp = TempDir::new().unwrap();
    let orig = tmp.path().join("orig");
    let all = build(&orig);
    let recs = records(&orig);
    let r = middle_record_of(&recs, 1);
    // Its magic gone: nothing says whose it was.
    let dir = copy(&orig, &tmp.path().join("magic"));
    poke(&dir, r.seg, r.off, b"XXXX");
    let (j, rp) = open(&dir, cfg());
    assert_eq!(rp.damage.len(), 1);
    // Its identity, where a DATA record keeps it, still names file 1 (reported by name); but
    // the header is no proof the stretch is one record, so every file with an older pending
    // write is set aside too.
    assert_eq!(rp.damage[0].file.as_ref().map(|f| f.ino), Some(1));
    assert!(!rp.damage[0].harmless);
    let mut rest = all.clone();
    rest.remove(&r.seq);
    // Every file with a write pending from before it (3's pending writes all come after).
    let mut older: Vec<u64> = rest
        .iter()
        .filter(|(&s, _)| s < r.seq)
        .map(|(_, v)| v.0.ino)
        .collect();
    older.sort_unstable();
    older.dedup();
    assert_eq!(older, vec![1, 2]);
    let (replayed, lost) = split(&rest, &older);
    check_replay(&j, &rp, &replayed);
    check_lost(&j, &rp, &lost);
    drop(j);

    // A zeroed 8 KiB block across a record boundary (a bad sector read back as zeros) in a
    // segment that is not the last: two records hit, damage.
    let last_seg = *segs(&orig).last().unwrap();
    let z = recs
        .iter()
        .filter(|x| x.seg < last_seg && x.off > 0)
        .nth(3)
        .unwrap()
        .clone();
    let dir = copy(&orig, &tmp.path().join("zeros"));
    poke(&dir, z.seg, z.off - 4096, &[0u8; 8192]);
    let (_, rp) = open(&dir, cfg());
    assert!(
        !rp.damage.is_empty(),
        "zeros inside a sealed segment are damage"
    );
    assert!(rp.pending.iter().all(|p| p.seq != z.seq));
    assert!(
        rp.pending.iter().any(|p| p.seq > z.seq),
        "later records replayed"
    );
    assert!(rp.torn_tail.is_none());

    // The same in the last segment: pages a power loss left unwritten before later ones (the
    // last batch reached the disk out of order): a torn tail, the records after it ignored,
    // nothing set aside.
    let t = recs
        .iter()
        .filter(|x| x.seg == last_seg && x.off > 0)
        .nth(2)
        .unwrap()
        .clone();
    let dir = copy(&orig, &tmp.path().join("tear"));
    poke(&dir, t.seg, t.off.div_ceil(4096) * 4096, &[0u8; 8192]);
    let (_, rp) = open(&dir, cfg());
    assert!(rp.damage.is_empty(), "{:?}", rp.damage);
    assert!(rp.lost.is_empty());
    assert!(rp.torn_tail.is_some());
    assert!(rp.pending.iter().all(|p| p.seq <= t.seq));
}

#[test]
fn damage_to_a_write_already_done_costs_nothing() {
    let tmp = TempDir::new().unwrap();
    let orig = tmp.path().join("orig");
    let all = build(&orig);
    let recs = records(&orig);
    // File 3's second write: covered by the DONE after its 10th.
    let r = recs
        .iter()
        .filter(|x| x.data.as_ref().is_some_and(|d| d.0.ino == 3))
        .nth(1)
        .unwrap()
        .clone();
    let dir = copy(&orig, &tmp.path().join("t"));
    poke(&dir, r.seg, r.off + r.len - 10, b"!!!");
    let (j, rp) = open(&dir, cfg());
    assert_eq!(rp.damage.len(), 1);
    assert!(rp.damage[0].harmless, "{:?}", rp.damage[0]);
    assert!(rp.lost.is_empty());
    check_replay(&j, &rp, &all);
}

#[test]
fn a_segment_cut_short_missing_or_misnamed_is_damage_not_a_refusal() {
    let tmp = TempDir::new().unwrap();
    let orig = tmp.path().join("orig");
    let all = build(&orig);
    let recs = records(&orig);
    let last_seg = *segs(&orig).last().unwrap();
    let first_of = |seg: u64| recs.iter().find(|r| r.seg == seg).unwrap().seq;

    for case in ["cut", "missing", "misnamed"] {
        let dir = copy(&orig, &tmp.path().join(case));
        match case {
            "cut" => {
                let f = OpenOptions::new()
                    .write(true)
                    .open(dir.join(seg_name(2)))
                    .unwrap();
                f.set_len(MIB).unwrap();
            }
            "missing" => fs::remove_file(dir.join(seg_name(2))).unwrap(),
            _ => fs::copy(dir.join(seg_name(1)), dir.join(seg_name(2)))
                .map(|_| ())
                .unwrap(),
        }
        let (j, rp) = open(&dir, cfg());
        assert!(!rp.damage.is_empty(), "{case}");
        assert!(rp.harmful_damage().next().is_some(), "{case}");
        // Every record of segment 3 on is replayed or set aside, none silently dropped.
        let later: Vec<u64> = all.keys().copied().filter(|&s| s >= first_of(3)).collect();
        for s in later {
            assert!(
                rp.pending.iter().chain(&rp.lost).any(|p| p.seq == s),
                "{case}: seq {s} of a later segment dropped"
            );
        }
        // Nothing of a file with older pending writes is replayed.
        assert!(
            rp.pending.iter().all(|p| p.seq >= first_of(3)),
            "{case}: {:?}",
            rp.pending.iter().map(|p| p.seq).collect::<Vec<_>>()
        );
        assert!(last_seg >= 3);
        drop(j);
    }
}

#[test]
fn garbage_at_the_end_of_the_last_segment_is_still_a_torn_tail() {
    let tmp = TempDir::new().unwrap();
    let orig = tmp.path().join("orig");
    let all = build(&orig);
    let recs = records(&orig);
    let last = recs.last().unwrap().clone();
    let dir = copy(&orig, &tmp.path().join("t"));
    poke(&dir, last.seg, last.off + 100, b"garbage");
    let (j, rp) = open(&dir, cfg());
    assert!(rp.damage.is_empty(), "{:?}", rp.damage);
    assert_eq!(rp.torn_tail.as_ref().map(|t| t.1), Some(last.off));
    let mut expect = all.clone();
    expect.remove(&last.seq);
    check_replay(&j, &rp, &expect);
}

/// A crash right after a roll into the ready segment, before the writer wrote the old
/// segment's SEAL or anything in the new one, and after it made the next one: the old segment
/// unsealed, two all-zero files after it. Both are unused spares, not damage.
#[test]
fn unused_spares_after_an_unsealed_segment_are_not_damage() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("j");
    let all = build(&dir);
    let last = *segs(&dir).last().unwrap();
    // What the writer's spare was, and one more.
    for extra in [last + 1, last + 2] {
        let f = File::create(dir.join(seg_name(extra))).unwrap();
        f.set_len(4 * MIB).unwrap();
    }
    let (j, rp) = open(&dir, cfg());
    assert!(
        rp.damage.is_empty() && rp.lost.is_empty(),
        "{:?}",
        rp.damage
    );
    check_replay(&j, &rp, &all);
}
