//! Tests of the journal: replay, space, torn tails and damage, identity, capacity, group commit.

use super::*;
use std::collections::HashMap;
use tempfile::TempDir;

#[path = "tests_damage.rs"]
mod damage;
#[path = "tests_space.rs"]
mod space;

fn cfg() -> JournalConfig {
    JournalConfig {
        segment_size: 4 * MIB,
        max_size: 16 * MIB,
        max_buffer: 4 * MIB,
        // Long: the tests decide when records become durable.
        sync_interval: Duration::from_secs(60),
    }
}

fn file(n: u64) -> FileRef {
    FileRef {
        dev: 77,
        ino: n,
        path: format!("dir/file-{n}").into_bytes(),
    }
}

/// Deterministic bytes, different for every (tag, i).
fn bytes(tag: u64, len: usize) -> Vec<u8> {
    let mut x = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small deterministic random generator for cut points.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn open(dir: &Path, c: JournalConfig) -> (Journal, Replay) {
    Journal::open(dir, "store-a", c, false).expect("open")
}

/// The journal's segments, without the spare the writer creates ahead of time (an all-zero
/// file after the last one).
fn segs(dir: &Path) -> Vec<u64> {
    let mut v = replay::list_segments(dir).unwrap();
    if let Some(&last) = v.last() {
        let b = fs::read(dir.join(seg_name(last))).unwrap_or_default();
        if b.iter().all(|&x| x == 0) {
            v.pop();
        }
    }
    v
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What a test appended: seq -> (file, offset, data).
type Written = BTreeMap<u64, (FileRef, u64, Vec<u8>)>;

fn check_replay(j: &Journal, rp: &Replay, expect: &Written) {
    let got: Vec<u64> = rp.pending.iter().map(|p| p.seq).collect();
    let want: Vec<u64> = expect.keys().copied().collect();
    assert_eq!(got, want, "pending seqs");
    for p in &rp.pending {
        let (f, off, data) = &expect[&p.seq];
        assert_eq!((&p.file, p.offset, p.len as usize), (f, *off, data.len()));
        assert_eq!(&j.read_pending(p).unwrap(), data, "bytes of seq {}", p.seq);
    }
}

#[test]
fn append_sync_reopen_replays_exactly_the_not_done() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("journal");
    let mut all = Written::new();
    {
        let (j, rp) = open(&dir, cfg());
        assert!(rp.pending.is_empty());
        for i in 0..120u64 {
            let f = file(i % 4);
            let data = bytes(i, 1 + (i as usize * 7919) % 100_000);
            // Half of them handed over as shared buffers (written from where they are when
            // large, copied when small): replay must not tell the two apart.
            let seq = if i % 2 == 0 {
                j.append_data(&f, i * 4096, &data).unwrap()
            } else {
                let shared = bytes::Bytes::from(data.clone());
                j.append_data_shared(&f, i * 4096, &shared).unwrap()
            };
            all.insert(seq, (f, i * 4096, data));
        }
        // File 1 fully done, file 2 done half way, file 3 dropped entirely, file 0 untouched.
        let last = |ino: u64| *all.iter().rev().find(|(_, v)| v.0.ino == ino).unwrap().0;
        let mid2 = *all.iter().filter(|(_, v)| v.0.ino == 2).nth(10).unwrap().0;
        j.done(77, 1, last(1)).unwrap();
        j.done(77, 2, mid2).unwrap();
        j.drop_file(77, 3, last(3)).unwrap();
        j.sync_all().unwrap();
        assert!(segs(&dir).len() >= 2, "the test spans segments");
        all.retain(|&s, v| !(v.0.ino == 1 || v.0.ino == 3 || (v.0.ino == 2 && s <= mid2)));
    }
    let (j, rp) = open(&dir, cfg());
    check_replay(&j, &rp, &all);
    assert_eq!(
        rp.pending_bytes,
        all.values().map(|v| v.2.len() as u64).sum::<u64>()
    );
    assert_eq!(j.stats().replayed_records, all.len() as u64);
    assert!(rp.torn_tail.is_none());

    // The caller writes them back and records DONE: every old segment goes.
    let before = segs(&dir);
    for ino in [0, 2] {
        let upto = rp
            .pending
            .iter()
            .filter(|p| p.file.ino == ino)
            .map(|p| p.seq)
            .max()
            .unwrap();
        j.done(77, ino, upto).unwrap();
    }
    j.sync_all().unwrap();
    wait_until("old segments freed", || {
        segs(&dir) == vec![before.last().unwrap() + 1]
    });
    drop(j);
    let (j, rp) = open(&dir, cfg());
    assert!(rp.pending.is_empty(), "{:?}", rp.pending);
    // Seqs never go back across opens.
    let s = j.append_data(&file(9), 0, b"x").unwrap();
    assert!(s > *all.keys().last().unwrap());
}

#[test]
fn done_frees_segments_oldest_first() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().to_path_buf();
    let (j, _) = open(&dir, cfg());
    let data = bytes(1, 512 * 1024);
    // File A in segment 1 only; file B in segments 1..=3.
    let a = j.append_data(&file(1), 0, &data).unwrap();
    let mut b = 0;
    for i in 0..20 {
        b = j.append_data(&file(2), i * 512 * 1024, &data).unwrap();
    }
    j.sync_all().unwrap();
    assert_eq!(segs(&dir), vec![1, 2, 3]);
    let used = j.used_bytes();
    assert_eq!(used, 3 * 4 * MIB);

    // B is done, but segment 1 still holds A: nothing may go (oldest first).
    j.done(77, 2, b).unwrap();
    j.sync_all().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(segs(&dir), vec![1, 2, 3]);
    assert_eq!(j.used_bytes(), used);

    // A done: segments 1 and 2 go; 3 is the one being written.
    j.done(77, 1, a).unwrap();
    j.sync_all().unwrap();
    wait_until("segments 1, 2 freed", || segs(&dir) == vec![3]);
    wait_until("used_bytes", || j.used_bytes() == 4 * MIB);
    assert_eq!(j.stats().segments_freed, 2);

    // Covered while still the writer's segment: freed once the writer moves past it.
    let c = j.append_data(&file(3), 0, b"c").unwrap();
    j.done(77, 2, c).unwrap();
    j.done(77, 3, c).unwrap();
    j.sync_all().unwrap();
    assert_eq!(segs(&dir), vec![3]);
    // 3 MiB cannot fit in segment 3 (2.5 MiB used): it alone goes into segment 4.
    j.append_data(&file(4), 0, &bytes(4, 3 << 20)).unwrap();
    j.sync_all().unwrap();
    wait_until("segment 3 freed after rollover", || segs(&dir) == vec![4]);
    let d = j.appended_seq();
    j.done(77, 4, d).unwrap();
    j.sync_all().unwrap();
    drop(j);
    let (_, rp) = open(&dir, cfg());
    assert!(rp.pending.is_empty());
}

/// Appends records of assorted sizes, some DONE, into (at least) two segments; returns what
/// is pending after them, with each record's end offset in the last segment.
fn build_for_tearing(dir: &Path) -> (Written, Vec<(u64, u64)>, u64) {
    let (j, _) = open(dir, cfg());
    let mut all = Written::new();
    // Fill segment 1 so the tearing happens in segment 2, which is then "last".
    for i in 0..9u64 {
        let d = bytes(1000 + i, 500 * 1024);
        let s = j.append_data(&file(1), i << 20, &d).unwrap();
        all.insert(s, (file(1), i << 20, d));
    }
    j.sync_all().unwrap();
    let seg = *segs(dir).last().unwrap();
    assert_eq!(seg, 2);
    let mut ends = Vec::new();
    let mut rng = Rng(42);
    for i in 0..60u64 {
        let f = file(2 + i % 3);
        let d = bytes(i, 1 + rng.next(20_000) as usize);
        let s = j.append_data(&f, i * 100, &d).unwrap();
        all.insert(s, (f, i * 100, d));
        if i % 10 == 9 {
            let upto = s - 3;
            j.done(77, 3, upto).unwrap();
            all.retain(|&q, v| !(v.0.ino == 3 && q <= upto));
        }
    }
    j.sync_all().unwrap();
    drop(j);
    // Where each record of segment 2 ends, from the file itself.
    let b = fs::read(dir.join(seg_name(seg))).unwrap();
    let mut off = 0usize;
    while let HeaderCheck::Ok(h) = format::parse_header(&b[off..]) {
        off += HDR + h.len as usize;
        ends.push((h.seq, off as u64));
    }
    (all, ends, seg)
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn torn_tail_replays_a_prefix_and_never_a_corrupt_record() {
    let tmp = TempDir::new().unwrap();
    let orig = tmp.path().join("orig");
    let (all, ends, seg) = build_for_tearing(&orig);
    let active = ends.last().unwrap().1;
    assert_eq!(
        model(&orig, seg, active).keys().collect::<Vec<_>>(),
        all.keys().collect::<Vec<_>>()
    );
    let mut rng = Rng(7);
    let mut cuts: Vec<(u64, bool)> = (0..24).map(|_| (rng.next(active + 100), false)).collect();
    cuts.extend((0..24).map(|_| (rng.next(active + 100), true)));
    // Exactly at record boundaries and one byte either side.
    for &(_, e) in ends.iter().step_by(7) {
        cuts.extend([(e - 1, false), (e, false), (e + 1, false), (e, true)]);
    }
    for (n, &(cut, garbage)) in cuts.iter().enumerate() {
        let dir = tmp.path().join(format!("t{n}"));
        copy_dir(&orig, &dir);
        let path = dir.join(seg_name(seg));
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        if garbage {
            // Garbage where the next record would be (a torn write of random bytes).
            let g = bytes(cut + 1, 1 + rng.next(3000) as usize);
            io::write_all_at(&f, &g, cut).unwrap();
            io::write_all_at(
                &f,
                &vec![0u8; (active - cut.min(active)) as usize],
                cut + g.len() as u64,
            )
            .unwrap();
        } else {
            f.set_len(cut).unwrap();
        }
        drop(f);
        let (j, rp) = open(&dir, cfg());
        check_replay(&j, &rp, &model(&orig, seg, cut));
        let at_boundary = cut == 0 || ends.iter().any(|&(_, e)| e == cut);
        if garbage {
            assert!(rp.torn_tail.is_some(), "garbage at {cut} not seen");
        } else if at_boundary {
            assert!(rp.torn_tail.is_none(), "clean cut at {cut} taken for torn");
        }
        // Appending after a torn tail, then reopening, treats the old segment as sealed.
        let s = j.append_data(&file(50), 0, b"after").unwrap();
        j.sync_all().unwrap();
        drop(j);
        let (j, rp) = open(&dir, cfg());
        assert!(rp.torn_tail.is_none());
        assert_eq!(rp.pending.last().map(|p| p.seq), Some(s));
        assert_eq!(
            j.read_pending(rp.pending.last().unwrap()).unwrap(),
            b"after"
        );
        drop(j);
        fs::remove_dir_all(&dir).unwrap();
    }
}

/// What must be pending when the last segment `last` of the journal in `orig` is cut at
/// `cut`: an independent reading of the original bytes (every record of the earlier segments,
/// those of `last` that end at or before the cut; DONE/DROP marks applied).
fn model(orig: &Path, last: u64, cut: u64) -> Written {
    let mut data = Written::new();
    let mut marks: HashMap<(u64, u64), u64> = HashMap::new();
    for seg in 1..=last {
        let b = fs::read(orig.join(seg_name(seg))).unwrap();
        let mut off = 0usize;
        while let HeaderCheck::Ok(h) = format::parse_header(&b[off..]) {
            let end = off + HDR + h.len as usize;
            if seg == last && end as u64 > cut {
                break;
            }
            match format::decode(h.kind, &b[off + HDR..end]).unwrap() {
                Decoded::Data {
                    dev,
                    ino,
                    offset,
                    path,
                    data: d,
                } => {
                    let f = FileRef {
                        dev,
                        ino,
                        path: path.to_vec(),
                    };
                    data.insert(h.seq, (f, offset, d.to_vec()));
                }
                Decoded::Done { dev, ino, upto } | Decoded::Drop { dev, ino, upto } => {
                    let e = marks.entry((dev, ino)).or_insert(0);
                    *e = (*e).max(upto);
                }
                Decoded::Seal { .. } => break,
                Decoded::Ns { .. } => {}
            }
            off = end;
        }
    }
    data.retain(|s, v| marks.get(&(v.0.dev, v.0.ino)).is_none_or(|&m| *s > m));
    data
}

#[test]
fn wrong_store_format_and_damaged_superblock_are_refused() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().to_path_buf();
    {
        let (j, _) = open(&dir, cfg());
        j.append_data(&file(1), 0, b"pending").unwrap();
    }
    match Journal::open(&dir, "store-b", cfg(), false) {
        Err(e @ JournalError::WrongStore { .. }) => {
            let m = e.to_string();
            assert!(m.contains("store-a") && m.contains("store-b"), "{m}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("another store's journal accepted"),
    }
    let sb = dir.join(superblock::FILE);
    let good = fs::read(&sb).unwrap();
    let mut b = good.clone();
    b[8] = 9;
    fs::write(&sb, &b).unwrap();
    assert!(matches!(
        Journal::open(&dir, "store-a", cfg(), false),
        Err(JournalError::WrongFormat { found: 9, .. })
    ));
    let mut b = good.clone();
    b[60] ^= 1;
    fs::write(&sb, &b).unwrap();
    assert!(matches!(
        Journal::open(&dir, "store-a", cfg(), false),
        Err(JournalError::Damaged { .. })
    ));
    fs::remove_file(&sb).unwrap();
    assert!(matches!(
        Journal::open(&dir, "store-a", cfg(), false),
        Err(JournalError::Damaged { .. })
    ));
    // A reset starts afresh for the new store.
    let (_, rp) = Journal::open(&dir, "store-b", cfg(), true).unwrap();
    assert!(rp.pending.is_empty());
}

#[test]
fn full_then_wait_for_space_wakes_when_done_frees_a_segment() {
    let tmp = TempDir::new().unwrap();
    let c = JournalConfig {
        max_size: 8 * MIB,
        ..cfg()
    };
    let (j, _) = Journal::open(tmp.path(), "store-a", c, false).unwrap();
    let data = bytes(3, 512 * 1024);
    let mut last = 0;
    let err = loop {
        match j.append_data(&file(1), 0, &data) {
            Ok(s) => last = s,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, JournalError::Full { used, cap } if used == 8 * MIB && cap == 8 * MIB),
        "{err}"
    );
    assert!(!j.wait_for_space(data.len() as u64, Duration::from_millis(100)));
    let j = Arc::new(j);
    let j2 = Arc::clone(&j);
    let len = data.len() as u64;
    let waiter = std::thread::spawn(move || {
        let t = Instant::now();
        (j2.wait_for_space(len, Duration::from_secs(20)), t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    // The DONE fits although DATA does not, and needs no `sync`: the waiter makes the writer
    // sync it (sync_interval is 60 s here).
    j.done(77, 1, last).unwrap();
    let (ok, took) = waiter.join().unwrap();
    assert!(ok && took < Duration::from_secs(10), "{ok} {took:?}");
    j.append_data(&file(1), 0, &data).unwrap();
    let st = j.stats();
    assert!(st.segments_freed >= 1 && st.full_errors == 1, "{st:?}");
}

#[test]
fn group_commit_one_fdatasync_serves_many_syncs() {
    let tmp = TempDir::new().unwrap();
    let c = JournalConfig {
        max_size: 64 * MIB,
        ..cfg()
    };
    let (j, _) = Journal::open(tmp.path(), "store-a", c.clone(), false).unwrap();
    let j = Arc::new(j);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let j = Arc::clone(&j);
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..150u64 {
                    let off = i * 4096;
                    let d = bytes((t << 32) | i, 4096);
                    let s = j.append_data(&file(100 + t), off, &d).unwrap();
                    j.sync(s).unwrap();
                    assert!(j.durable_seq() >= s);
                    mine.push(s);
                }
                mine
            })
        })
        .collect();
    let mut total = 0;
    for t in threads {
        total += t.join().unwrap().len();
    }
    let st = j.stats();
    println!(
        "group commit: {} sync calls waited, {} fdatasyncs, at most {} records per fdatasync ({} writes)",
        st.sync_calls, st.syncs, st.group_commit_max_batch, st.group_commit_max_writes
    );
    assert!(st.syncs < st.sync_calls, "{st:?}");
    assert!(st.group_commit_max_batch > 1, "{st:?}");
    drop(j);
    let (j, rp) = Journal::open(tmp.path(), "store-a", c, false).unwrap();
    assert_eq!(rp.pending.len(), total);
    for p in rp.pending.iter().step_by(37) {
        let t = p.file.ino - 100;
        assert_eq!(
            j.read_pending(p).unwrap(),
            bytes((t << 32) | (p.offset / 4096), 4096)
        );
    }
}

#[test]
fn argument_and_lifecycle_errors() {
    let tmp = TempDir::new().unwrap();
    let (j, _) = open(tmp.path(), cfg());
    let big = vec![0u8; 4 * MIB as usize];
    assert!(matches!(
        j.append_data(&file(1), 0, &big),
        Err(JournalError::TooLarge { .. })
    ));
    assert!(matches!(j.done(77, 1, 5), Err(JournalError::Config(_))));
    let s = j.append_data(&file(1), 0, &[1; 1 << 20]).unwrap();
    j.shutdown();
    j.sync(s).unwrap();
    assert!(matches!(
        j.append_data(&file(1), 0, b"x"),
        Err(JournalError::Closed)
    ));
    for bad in [
        JournalConfig {
            segment_size: MIB,
            ..cfg()
        },
        JournalConfig {
            max_size: 4 * MIB,
            ..cfg()
        },
    ] {
        assert!(matches!(
            Journal::open(tmp.path(), "store-a", bad, false),
            Err(JournalError::Config(_))
        ));
    }
}

/// Throughput on this machine: 1 GiB of 512 KiB records, a `sync` every 64 MiB (and a DONE, so
/// the journal stays within its capacity). Prints; asserts nothing about time.
#[test]
fn throughput_1gib_in_512k_records() {
    let tmp = TempDir::new().unwrap();
    let (j, _) = Journal::open(tmp.path(), "store-a", JournalConfig::default(), false).unwrap();
    let rec = 512 * 1024;
    let data = bytes(5, rec);
    let f = file(1);
    let per_sync = (64 * MIB) as usize / rec;
    let n = (1 << 30) / rec;
    let t = Instant::now();
    let mut sync_time = Duration::ZERO;
    for i in 0..n {
        let s = j.append_data(&f, (i * rec) as u64, &data).unwrap();
        if (i + 1) % per_sync == 0 {
            let ts = Instant::now();
            j.sync(s).unwrap();
            sync_time += ts.elapsed();
            j.done(f.dev, f.ino, s).unwrap();
        }
    }
    j.sync_all().unwrap();
    let secs = t.elapsed().as_secs_f64();
    let st = j.stats();
    println!(
        "journal throughput: 1 GiB in 512 KiB records, sync every 64 MiB: {:.2} s, {:.0} MiB/s \
         ({:.2} s waiting in sync); {} fdatasyncs, at most {} records and {} writes per fdatasync, {} segments freed",
        secs,
        1024.0 / secs,
        sync_time.as_secs_f64(),
        st.syncs,
        st.group_commit_max_batch,
        st.group_commit_max_writes,
        st.segments_freed
    );
    assert_eq!(st.records_appended as usize, n + n / per_sync);
}

#[test]
fn inspect_reports_pending_and_torn_tails_without_changing_anything() {
    let d = TempDir::new().unwrap();
    let dir = d.path();
    assert_eq!(Journal::inspect(dir).unwrap().state, JournalState::Absent);
    {
        let (j, _) = open(dir, cfg());
        let a = j.append_data(&file(1), 0, &bytes(1, 5000)).unwrap();
        j.append_data(&file(2), 100, &bytes(2, 3000)).unwrap();
        j.done(77, 1, a).unwrap();
        j.sync_all().unwrap();
        j.shutdown();
    }
    let r = Journal::inspect(dir).unwrap();
    assert_eq!(r.state, JournalState::Ok);
    assert_eq!(r.store_id.as_deref(), Some("store-a"));
    assert_eq!(r.pending.len(), 1, "file 1 is done, file 2 pending: {r:?}");
    assert_eq!(r.pending[0].file, file(2));
    assert_eq!(r.pending_bytes, 3000);
    assert!(r.torn_tail.is_none());

    // Garbage right after the last record of the (unsealed) last segment: a torn tail.
    let last = dir.join(replay::seg_name(*segs(dir).last().unwrap()));
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
        f.write_all_at(&[0xEE; 100], r.bytes).unwrap();
    }
    let snapshot = || -> Vec<_> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
            .collect();
        v.sort();
        v
    };
    let before = snapshot();
    let r = Journal::inspect(dir).unwrap();
    assert!(r.torn_tail.is_some(), "{r:?}");
    assert_eq!(r.pending.len(), 1);
    assert!(before == snapshot(), "inspect changed the journal");
    // Sealing it (fsck --repair) keeps the pending write for the next open.
    Journal::seal_torn_tail(dir, "store-a").unwrap();
    let r = Journal::inspect(dir).unwrap();
    assert!(r.torn_tail.is_none(), "{r:?}");
    assert_eq!(r.pending.len(), 1, "the pending write survives the repair");
    let (j, rp) = open(dir, cfg());
    assert_eq!(j.read_pending(&rp.pending[0]).unwrap(), bytes(2, 3000));
}

/// NS records (format 2) come back from replay in seq order with their payloads, between the
/// DATA records they were appended among, until a DONE of `NS_KEY` covers them; the segment
/// holding them is kept until then.
#[test]
fn ns_records_replay_until_done() {
    let d = TempDir::new().unwrap();
    let (j, _) = open(d.path(), cfg());
    let a = j
        .append(Record::Ns {
            payload: b"create a",
        })
        .unwrap();
    let f = file(1);
    let w = j.append_data(&f, 0, b"data of a").unwrap();
    let b = j
        .append(Record::Ns {
            payload: b"chmod a",
        })
        .unwrap();
    assert!(a < w && w < b);
    assert!(j.append(Record::Ns { payload: b"" }).is_err(), "empty");
    let big = vec![1u8; MAX_NS + 1];
    assert!(j.append(Record::Ns { payload: &big }).is_err(), "too long");
    j.sync(b).unwrap();
    drop(j);
    let (j, rp) = open(d.path(), cfg());
    let got: Vec<(u64, Vec<u8>)> = rp
        .pending_ns
        .iter()
        .map(|n| (n.seq, n.payload.clone()))
        .collect();
    assert_eq!(
        got,
        vec![(a, b"create a".to_vec()), (b, b"chmod a".to_vec())]
    );
    assert_eq!(rp.pending.len(), 1, "the DATA record between them");
    // Applied up to the first: only the second stays pending.
    j.done(NS_KEY.0, NS_KEY.1, a).unwrap();
    j.sync_all().unwrap();
    drop(j);
    let (j, rp) = open(d.path(), cfg());
    assert_eq!(rp.pending_ns.len(), 1);
    assert_eq!(rp.pending_ns[0].payload, b"chmod a");
    j.done(NS_KEY.0, NS_KEY.1, b).unwrap();
    j.sync_all().unwrap();
    drop(j);
    let (_j, rp) = open(d.path(), cfg());
    assert!(rp.pending_ns.is_empty());
}

/// A journal written in format 1 (no NS records) opens as it is, its pending writes intact,
/// and its superblock says format 2 afterwards.
#[test]
fn format_1_journal_is_read_and_upgraded() {
    let d = TempDir::new().unwrap();
    let (j, _) = open(d.path(), cfg());
    let s = j.append_data(&file(3), 0, b"old").unwrap();
    j.sync(s).unwrap();
    drop(j);
    // Make the superblock say format 1, as an older tierfs wrote it.
    let (mut sb, id) = superblock::read(d.path()).unwrap().unwrap();
    sb.format = 1;
    let path = d.path().join(superblock::FILE);
    superblock::store(d.path(), &id, &sb).unwrap();
    let mut b = fs::read(&path).unwrap();
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&crc.to_le_bytes());
    fs::write(&path, &b).unwrap();
    assert_eq!(superblock::read(d.path()).unwrap().unwrap().0.format, 1);
    let (_j, rp) = open(d.path(), cfg());
    assert_eq!(rp.pending.len(), 1);
    assert_eq!(superblock::read(d.path()).unwrap().unwrap().0.format, 2);
    // A format this version does not know is refused.
    let mut b = fs::read(&path).unwrap();
    b[8..12].copy_from_slice(&3u32.to_le_bytes());
    let crc = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&crc.to_le_bytes());
    fs::write(&path, &b).unwrap();
    drop(_j);
    assert!(matches!(
        Journal::open(d.path(), "store-a", cfg(), false),
        Err(JournalError::WrongFormat { found: 3, .. })
    ));
}
