//! Close-to-open, checked the same way on every store kind: a change made on the store (or
//! through a second client of it) before an open is always seen by that open, whatever the
//! metadata cache still trusts for `stat`; and a warm open of a cached file costs at most one
//! store request (`tierfs stats`: lookups + getattrs + opens per file opened).

use super::{drop_caches, n, seeded_bytes, stats_of};
use std::path::Path;

/// Store requests that name, check or open an object.
pub fn requests(s: &serde_json::Value) -> u64 {
    ["lookup", "getattr", "open"]
        .iter()
        .map(|k| n(s, &format!("backing.{k}")))
        .sum()
}

/// The contents `change` gives file `k` in round `round`: a size of its own each round, so
/// that even a store with one-second times shows another version.
pub fn version(k: usize, round: usize) -> Vec<u8> {
    seeded_bytes((round * 1000 + k) as u64, 1000 + 7 * round + k)
}

/// `files` files `f0`.. in `dir` of the mount `mnt`, written by `change(name, data)` (on the
/// store, behind the mount) round after round: each round's reads through the mount, one
/// open each, return what the round wrote, also when the previous round's attributes are
/// still trusted. Then the files are read twice more without a change (past the racy second,
/// so they are cached), the second time after `drop_caches`: what that costs the store per open is returned (close-to-open needs
/// one request per open; the caller bounds it).
pub fn every_open_sees_the_change(
    mnt: &Path,
    dir: &str,
    files: usize,
    rounds: usize,
    change: &dyn Fn(&str, &[u8]),
) -> f64 {
    let name = |k: usize| format!("{dir}/f{k}");
    for round in 0..rounds {
        for k in 0..files {
            change(&name(k), &version(k, round));
        }
        for k in 0..files {
            let got = std::fs::read(mnt.join(name(k))).unwrap();
            assert!(
                got == version(k, round),
                "round {round}: {} read {} bytes of an older version ({} written)",
                name(k),
                got.len(),
                version(k, round).len()
            );
        }
    }
    let last = rounds - 1;
    // Data read within a second of a change is served but not cached (the racy window,
    // docs/architecture/coherence.md "Coherence"): read once more past it, to have it cached.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    for k in 0..files {
        assert_eq!(std::fs::read(mnt.join(name(k))).unwrap(), version(k, last));
    }
    drop_caches();
    let before = requests(&stats_of(mnt));
    for k in 0..files {
        assert_eq!(std::fs::read(mnt.join(name(k))).unwrap(), version(k, last));
    }
    let made = requests(&stats_of(mnt)) - before;
    made as f64 / files as f64
}
