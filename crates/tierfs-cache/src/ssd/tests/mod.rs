//! Tests of the SSD tier on real files (ext4 under /var/tmp). Shared helpers here; the tests
//! are grouped by concern.

mod basic;
mod capacity;
mod corrupt;
mod crash;
mod operator;
mod recovery;

use super::*;
use std::time::Duration;

pub(super) fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tierfs-ssd-test")
        .tempdir_in("/var/tmp")
        .expect("tempdir")
}

pub(super) fn ident() -> SsdIdentity {
    SsdIdentity {
        store_id: "store-1".into(),
        block_size: 65536,
    }
}

/// Small segments and clusters so tests exercise rollover and reclaim with little data.
pub(super) fn cfg() -> SsdConfig {
    SsdConfig {
        max_size: 64 << 20,
        write_rate: 1 << 40,
        write_burst: 1 << 40,
        segment_size: 1 << 20,
        cluster_size: 64 << 10,
        flush_interval: Duration::from_millis(50),
        checkpoint_interval: Duration::from_secs(3600),
        ..SsdConfig::default()
    }
}

pub(super) fn key(i: u64) -> SsdKey {
    SsdKey {
        kind: KIND_DATA,
        dev: 7,
        ino: 1000 + i / 16,
        idx: i % 16,
    }
}

/// Deterministic contents for (i, version), so any byte returned can be checked.
pub(super) fn data(i: u64, version: u64, len: usize) -> Bytes {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

pub(super) fn open(dir: &Path, cfg: SsdConfig) -> Arc<SsdCache> {
    SsdCache::open(dir, &ident(), cfg, false).expect("open")
}

/// Offers entries `range` with `len` bytes each (version 1), retrying while the queue is full.
pub(super) fn fill(c: &SsdCache, range: std::ops::Range<u64>, len: usize) {
    for i in range {
        let mut tries = 0;
        while !c.offer(key(i), 1, data(i, 1, len)) {
            tries += 1;
            assert!(tries < 10_000, "offer of {i} never admitted");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    c.flush();
}

/// The segment files of `dir`, oldest first.
pub(super) fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read_dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| segment::parse_name(n).is_some())
        })
        .collect();
    v.sort();
    v
}

/// Flips one byte of a file (buffered write: O_DIRECT reads see it after writeback).
pub(super) fn flip(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open for flip");
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).expect("read for flip");
    b[0] ^= 0x5A;
    f.write_all_at(&b, at).expect("write for flip");
    f.sync_all().expect("sync");
}

/// Where entry `k` is stored: (segment path, byte offset, length).
pub(super) fn where_is(c: &SsdCache, k: &SsdKey) -> (PathBuf, u64, u32) {
    let loc = c.sh.index.lookup(k, false).expect("entry indexed");
    (loc.seg.path.clone(), loc.off, loc.len)
}
