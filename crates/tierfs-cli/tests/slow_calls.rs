//! On a store that cannot hang (a local disk), a request that needs the store runs on the
//! FUSE thread that read it, one such thread at a time (tierfs-fuse's `inline`). A slow call
//! there must hold up neither the mount nor the other calls: a cached file is read meanwhile,
//! and slow calls from other threads run beside it on the I/O pool, not behind it.

mod common;
use common::*;
use std::time::{Duration, Instant};
use tierfs_store::OpClass;

const LIMIT: Duration = Duration::from_secs(60);
/// What each mkdir takes at the store.
const SLOW: Duration = Duration::from_secs(2);

#[test]
fn slow_store_calls_run_side_by_side_and_cached_reads_go_on() {
    let m = FaultMount::new(tierfs_fs::FsConfig::default(), |b| {
        std::fs::write(b.join("cached"), b"served meanwhile").unwrap();
        for d in ["d1", "d2", "d3"] {
            std::fs::create_dir(b.join(d)).unwrap();
        }
    });
    let (mnt, faults) = (m.mnt.clone(), m.faults.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(
            std::fs::read(mnt.join("cached")).unwrap(),
            b"served meanwhile"
        );
        faults.set_class_latency(OpClass::Write, SLOW);
        let t = Instant::now();
        // In three directories: the kernel makes names in one directory one at a time.
        let makers: Vec<_> = ["d1", "d2", "d3"]
            .into_iter()
            .map(|d| {
                let p = mnt.join(d).join("new");
                std::thread::spawn(move || std::fs::create_dir(p).unwrap())
            })
            .collect();
        while faults.most_in_flight(OpClass::Write) < 3 {
            assert!(
                t.elapsed() < SLOW,
                "the three mkdirs were never at the store together: {} at once",
                faults.most_in_flight(OpClass::Write)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // While all three wait in the store (one of them on a FUSE thread), the cached file
        // is opened (a store check, not slow) and read.
        let r = Instant::now();
        assert_eq!(
            std::fs::read(mnt.join("cached")).unwrap(),
            b"served meanwhile"
        );
        assert!(
            r.elapsed() < SLOW / 2,
            "a read waited {:?} behind the slow calls",
            r.elapsed()
        );
        for h in makers {
            h.join().unwrap();
        }
        assert!(
            t.elapsed() < SLOW * 2,
            "three {SLOW:?} mkdirs took {:?}: one waited for another",
            t.elapsed()
        );
        faults.set_class_latency(OpClass::Write, Duration::ZERO);
        for d in ["d1", "d2", "d3"] {
            assert!(mnt.join(d).join("new").is_dir());
        }
    });
}
