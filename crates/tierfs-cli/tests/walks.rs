//! Walks of large directories with default options over a store where every request is a
//! round trip and a listing's per-entry attributes are requests of their own (a network
//! filesystem whose client's cache expired), so that listing 10,000 entries takes longer
//! than what it returns is trusted for (`meta.ttl_min`, 3 s). Before the metadata cache
//! trusted a record by its object's age and revalidated one entry with one request, a lookup
//! in such a listing listed the directory again: `ls -l` of 10,000 entries over sshfs did not
//! finish in 10 minutes (152 listings). What is asserted is what the store is asked, which
//! the store alone would ask at least once per entry: never more than that, at 100, 1,000 and
//! 10,000 entries, cold, again at once, and once the trust ran out, and never a listing more
//! than one per walk.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Store requests that name or check an object (listings counted apart).
fn requests(s: &serde_json::Value) -> u64 {
    ["lookup", "getattr", "open"]
        .iter()
        .map(|k| n(s, &format!("backing.{k}")))
        .sum()
}

fn listings(s: &serde_json::Value) -> u64 {
    n(s, "meta_listings")
}

/// `ls -l` of `dir`: one line per entry plus the total.
fn ls_l(dir: &Path, entries: usize) {
    let out = Command::new("ls").arg("-l").arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.stdout.iter().filter(|&&b| b == b'\n').count(),
        entries + 1
    );
}

/// Reads every file of `dir` (`cat`): each an open with close-to-open.
fn cat_all(dir: &Path, entries: usize) {
    let out = Command::new("sh")
        .arg("-c")
        .arg("ls | xargs -P8 -n16 cat | wc -c")
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(bytes, entries * 100);
}

/// What one step asked of the store: (requests, listings).
fn step(m: &FaultMount, f: impl FnOnce()) -> (u64, u64) {
    let before = m.stats();
    f();
    let after = m.stats();
    let d = |k: &str| n(&after, k) - n(&before, k);
    eprintln!(
        "lookups {} getattrs {} opens {} readdirs {} other {} listings {} renewals {} shared checks {}",
        d("backing.lookup"),
        d("backing.getattr"),
        d("backing.open"),
        d("backing.readdir"),
        d("backing.other"),
        d("meta_listings"),
        d("meta_renewals"),
        d("cto_shared"),
    );
    (
        requests(&after) - requests(&before),
        listings(&after) - listings(&before),
    )
}

#[test]
fn walks_cost_at_most_a_request_per_entry_at_every_size() {
    for count in [100usize, 1_000, 10_000] {
        // Default options: the kernel keeps what it is told for up to `fuse.attr_ttl` (60 s),
        // each answer as long as tierfs still trusts it.
        // The files are seconds old, and so trusted `meta.ttl_min` (3 s); a tree nobody has
        // changed for 5 minutes is trusted 30 s. That is what the test gives them, so that
        // how many requests a walk makes does not hang on how fast this machine runs it;
        // what happens once the trust runs out is the last step's.
        let cfg = tierfs_fs::FsConfig {
            meta_ttl_min: Some(Duration::from_secs(30)),
            ..Default::default()
        };
        let opts = FaultOpts {
            kernel_ttl: Duration::from_secs(60),
            ..FaultOpts::new(cfg)
        };
        let m = FaultMount::with(opts, |b| {
            std::fs::create_dir(b.join("d")).unwrap();
            for k in 0..count {
                std::fs::write(b.join(format!("d/f{k:05}")), [b'x'; 100]).unwrap();
            }
        });
        // 10,000 entries take 5 s to list: longer than a fresh file is trusted for (3 s).
        m.faults.set_latency(Duration::from_micros(200));
        m.faults.set_entry_latency(Duration::from_micros(500));
        let d = m.mnt.join("d");
        let m = std::sync::Arc::new(m);
        let m2 = m.clone();
        with_timeout(Duration::from_secs(300), vec![m.mnt.clone()], move || {
            let m = m2;
            // Past the second after the files were made: nothing read within it is cached,
            // and a listing taken within it cannot be renewed (sshfs has one-second times).
            std::thread::sleep(Duration::from_millis(1100));
            let (req, lists) = step(&m, || ls_l(&d, count));
            // The listing's per-entry stats count as lookups: one each.
            assert!(
                lists <= 1,
                "{count}: cold ls -l listed the directory {lists} times"
            );
            assert!(
                req <= count as u64 + 10,
                "{count}: cold ls -l made {req} requests"
            );
            let (req, lists) = step(&m, || ls_l(&d, count));
            assert_eq!(lists, 0, "{count}: ls -l again listed the directory");
            assert!(req <= 10, "{count}: ls -l again made {req} requests");
            // The first read of each file fetches it (open, read); the second is what
            // close-to-open costs a file served from the caches.
            cat_all(&d, count);
            let (req, lists) = step(&m, || cat_all(&d, count));
            assert_eq!(lists, 0, "{count}: cat of every file listed the directory");
            assert!(
                req <= (count + count / 10 + 10) as u64,
                "{count}: {req} requests for {count} opens (at most one each: close-to-open)"
            );
            // Once the trust ran out (`meta.ttl` lowered to 2 s, which also caps what is
            // trusted from now on, shorter than this walk: the case where entries expire
            // while the walk is on them): the opendir lists the directory again, once, with
            // every entry's attributes (`store.stat_concurrency` at a time), instead of
            // leaving each entry to a request of its own when `ls` stats it, one after
            // another (over sshfs: 47 s for 10,000 entries, the store alone 0.4 s); every
            // entry is asked for at most once.
            m.fs.set_meta_ttl(Duration::from_secs(2));
            std::thread::sleep(Duration::from_millis(2_100));
            let (req, lists) = step(&m, || ls_l(&d, count));
            assert_eq!(
                lists, 1,
                "{count}: ls -l after the trust ran out listed the directory {lists} times"
            );
            // (And the directory itself looked up again each time its 2 s ran out during
            // the walk: a few dozen over 10,000 entries.)
            assert!(
                req <= (count + count / 100 + 10) as u64,
                "{count}: ls -l after the trust ran out made {req} requests"
            );
        });
    }
}
