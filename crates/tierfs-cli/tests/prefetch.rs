//! Listing-order prefetch (crates/tierfs-fs/src/data/siblings.rs): a program that opens the
//! files of a directory in the order it lists them finds the next ones already loaded, and
//! what was loaded ahead is still checked at open (a file changed behind our back after it
//! was loaded is read in its new version, whole).

mod common;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
const FILES: u64 = 40;
const LEN: usize = 24 << 10;

fn fill(backing: &Path) {
    std::fs::create_dir(backing.join("d")).unwrap();
    for i in 0..FILES {
        std::fs::write(backing.join(format!("d/f{i:02}")), seeded_bytes(i, LEN)).unwrap();
    }
    std::fs::write(backing.join("d/big"), seeded_bytes(99, 3 << 20)).unwrap();
}

/// The directory's names in the order the mount lists them.
fn listed(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

fn wait_for(m: &FaultMount, key: &str, at_least: u64) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let st = m.stats();
        if n(&st, key) >= at_least || t.elapsed() > Duration::from_secs(20) {
            return st;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_walk_in_listing_order_finds_the_next_files_loaded_and_still_checked() {
    walk(true);
}

/// With `meta.cto=off` (FUSE no-open: no OPEN reaches tierfs) the walk shows in the first read
/// of each file.
#[test]
fn a_walk_without_open_requests_is_followed_too() {
    walk(false);
}

fn walk(cto: bool) {
    let m = FaultMount::with(
        FaultOpts::new(tierfs_fs::FsConfig {
            ram_max: 256 << 20,
            prefetch_files: 8,
            meta_cto: cto,
            ..Default::default()
        }),
        fill,
    );
    std::thread::sleep(tierfs_fs::RACY_WINDOW + Duration::from_millis(200));
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let d = m.mnt.join("d");
        let names: Vec<String> = listed(&d).into_iter().filter(|n| n != "big").collect();
        assert_eq!(names.len(), FILES as usize);
        let content = |name: &str| seeded_bytes(name[1..].parse::<u64>().unwrap(), LEN);
        // One file opened alone is no walk: nothing is loaded ahead.
        assert_eq!(
            std::fs::read(d.join(&names[10])).unwrap(),
            content(&names[10])
        );
        // Two in listing order are: the next 8 are loaded.
        for name in &names[0..2] {
            assert_eq!(std::fs::read(d.join(name)).unwrap(), content(name));
        }
        let st = wait_for(&m, "prefetched_files", 8);
        assert!(n(&st, "prefetched_files") >= 8, "{st}");
        // Exactly those 8 were decided: the lone file's 8 followers (names 11 to 18, none
        // cached) would have been queued too, long before the pair's 8 were loaded.
        assert_eq!(n(&st, "prefetch_queued"), 8, "{st}");
        let ram_before = n(&st, "read_ram_only");
        // One of them changes behind our back (same size, new mtime) before the walk gets
        // there: the open sees it, and the read is of the new version (close-to-open; without
        // it, a change is seen within meta.ttl, as documented).
        let changed = if cto { names[5].clone() } else { String::new() };
        if cto {
            let p = m.backing.join("d").join(&changed);
            std::fs::write(&p, seeded_bytes(1000, LEN)).unwrap();
            let t = std::fs::metadata(&p).unwrap().modified().unwrap() + Duration::from_secs(5);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        for name in &names[2..FILES as usize] {
            let want = if *name == changed {
                seeded_bytes(1000, LEN)
            } else {
                content(name)
            };
            assert!(
                std::fs::read(d.join(name)).unwrap() == want,
                "{name}: wrong contents"
            );
        }
        let st = m.stats();
        // The walk kept going ahead, and found the files in RAM (`read_ram_only` counts the
        // application's reads answered from RAM alone; the loads ahead are misses). Under
        // load the walk may overtake the loads now and then: half is the floor.
        assert!(n(&st, "prefetched_files") >= FILES - 4, "{st}");
        let from_ram = n(&st, "read_ram_only") - ram_before;
        assert!(
            from_ram >= (FILES - 2) / 2,
            "{from_ram} of {} files walked came from RAM: {st}",
            FILES - 2
        );
        // A file over prefetch.max_file (1 MiB by default) is never loaded ahead: `big`
        // (3 MiB, somewhere in the listing) was not read.
        assert!(n(&st, "backing.read_bytes") < 2 << 20, "{st}");
    });
}
