//! The shared tier (`-o shared=s3://BUCKET/PREFIX`) on a real distributed object store: a
//! SeaweedFS cluster on loopback (one master, three volume servers keeping two copies of
//! everything, a filer and its S3 gateway; `scripts/seaweedfs`). Three mounts with three cache
//! dirs stand for three hosts over one origin directory.
//!
//! What must hold: what one host read from the origin, the others read from the tier (the
//! origin is read once for the fleet, also when uploads fall behind the reads); a chunk damaged in the tier, or one of a version the
//! origin no longer has, is never served; a volume server killed mid-read, or the whole
//! cluster stopped, costs speed only, never a wrong byte or an error.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(180);
const BUCKET: &str = "tierfs-shared";
const ACCESS: &str = "tierfs";
const SECRET: &str = "tierfs-secret";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/seaweedfs")
}

/// A SeaweedFS cluster for one test, stopped when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    port: u16,
}

impl Cluster {
    fn start() -> Cluster {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let out = Command::new("flock")
                .arg(std::env::temp_dir().join("tierfs-seaweedfs-install.lock"))
                .arg(script())
                .arg("--install")
                .output()
                .expect("run scripts/seaweedfs --install");
            assert!(
                out.status.success(),
                "scripts/seaweedfs --install: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        });
        let dir = tempfile::tempdir().unwrap();
        // Its ports follow this one (scripts/seaweedfs): take a free one with room above it,
        // and several tests may start clusters at once: a lock while one starts.
        let _lock = std::fs::File::create(std::env::temp_dir().join("tierfs-seaweedfs-ports.lock"))
            .unwrap();
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&_lock), libc::LOCK_EX) };
        let port = free_port_range(20);
        let out = Command::new("timeout")
            .arg("600")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .arg(port.to_string())
            .env("SEAWEEDFS_BUCKETS", BUCKET)
            .output()
            .unwrap();
        let c = Cluster { dir, port };
        assert!(
            out.status.success(),
            "scripts/seaweedfs start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn kill_volume(&self, n: u32) {
        let st = Command::new(script())
            .arg("kill-volume")
            .arg(self.dir.path())
            .arg(n.to_string())
            .status()
            .unwrap();
        assert!(st.success(), "kill-volume {n}");
    }

    fn stop(&self) {
        let _ = Command::new("timeout")
            .arg("60")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }

    /// The bucket as a client of our own sees it (to damage what the tier holds).
    fn bucket(&self) -> tierfs_s3::ObjectBucket {
        let cfg = tierfs_s3::S3Config {
            bucket: BUCKET.into(),
            prefix: String::new(),
            endpoint: Some(self.endpoint()),
            region: "us-east-1".into(),
            credentials: tierfs_s3::Credentials {
                access_key_id: ACCESS.into(),
                secret_access_key: SECRET.into(),
                session_token: None,
                source: "test".into(),
            },
        };
        tierfs_s3::ObjectBucket::new(cfg, Duration::from_secs(10))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The cluster the tests that do not harm it share (a start takes ~16 s: SeaweedFS's filer
/// waits 10 s before it registers), each under its own prefix. Stopped when the test binary
/// exits (the harness ends with `exit`, which runs `atexit` handlers; statics are not dropped).
fn shared_cluster() -> &'static Cluster {
    static CLUSTER: std::sync::OnceLock<Cluster> = std::sync::OnceLock::new();
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    extern "C" fn stop_at_exit() {
        if let Some(dir) = DIR.get() {
            let _ = Command::new("timeout")
                .arg("60")
                .arg(script())
                .arg("stop")
                .arg(dir)
                .status();
        }
    }
    CLUSTER.get_or_init(|| {
        let c = Cluster::start();
        let _ = DIR.set(c.dir.path().to_path_buf());
        unsafe { libc::atexit(stop_at_exit) };
        c
    })
}

/// A port with the `n` above it free too (checked by binding each), below the kernel's
/// ephemeral range (32768 and up here): a port picked from that range can be taken by any
/// outgoing connection of another test between this check and the server's bind.
fn free_port_range(n: u16) -> u16 {
    let mut r = Rng::new(std::process::id() as u64 ^ now_ns());
    for _ in 0..500 {
        let base = 20000 + 20 * r.below(600) as u16;
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no free range of {n} ports");
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The origin: files of several sizes (a chunk is 4 MiB: files of one, two and three chunks,
/// with a last chunk part full, and small files of one chunk each), written over a second
/// ago so that no version is racy.
fn fill_origin(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for (i, len) in [(0u64, 9 << 20), (1, (4 << 20) + 12_345), (2, 4 << 20)] {
        files.push((format!("big{i}"), seeded_bytes(i + 1, len as usize)));
    }
    for i in 0..24u64 {
        let len = 1 + (i * 7919 % 70_000) as usize;
        files.push((format!("small/s{i}"), seeded_bytes(100 + i, len)));
    }
    std::fs::create_dir_all(dir.join("small")).unwrap();
    for (name, data) in &files {
        std::fs::write(dir.join(name), data).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    files
}

fn dataset_bytes(files: &[(String, Vec<u8>)]) -> u64 {
    files.iter().map(|(_, d)| d.len() as u64).sum()
}

/// A host: a mount of `origin` with its own cache dir, the tier at `prefix` of the cluster.
fn host(origin: &Path, cluster: &Cluster, prefix: &str, extra: &[&str]) -> BinMount {
    let mut m = BinMount::unmounted_in(&std::env::temp_dir());
    m.backing = origin.to_path_buf();
    let shared = format!("shared=s3://{BUCKET}/{prefix}");
    let endpoint = format!("shared.endpoint={}", cluster.endpoint());
    let mut opts = vec![shared.as_str(), endpoint.as_str()];
    opts.extend_from_slice(extra);
    m.mount_source(
        origin.as_os_str(),
        &opts,
        &[
            ("AWS_ACCESS_KEY_ID", ACCESS),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ],
    );
    m
}

/// Reads every file through `m` and compares it with what the origin was given.
fn read_all(m: &BinMount, files: &[(String, Vec<u8>)]) {
    let mnt = m.mnt.clone();
    let files = files.to_vec();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        for (name, want) in &files {
            let got = std::fs::read(mnt.join(name)).unwrap();
            assert!(
                got == *want,
                "{name}: {} bytes, not what the origin holds",
                got.len()
            );
        }
    });
}

/// Waits until the host's uploads to the tier are done (the queue empty).
fn uploads_done(m: &BinMount) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let st = m.stats();
        if n(&st, "shared.queued_bytes") == 0 && n(&st, "shared.later") == 0 {
            return st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "uploads still queued: {st}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_fleet_reads_the_origin_once_and_the_other_hosts_read_the_tier() {
    let cluster = shared_cluster();
    let origin = tempfile::tempdir().unwrap();
    let files = fill_origin(origin.path());
    let total = dataset_bytes(&files);

    let h1 = host(origin.path(), cluster, "fleet", &[]);
    read_all(&h1, &files);
    let s1 = uploads_done(&h1);
    let chunks = n(&s1, "shared.puts");
    assert_eq!(n(&s1, "shared.hits"), 0, "{s1}");
    assert_eq!(
        n(&s1, "shared.put_bytes"),
        total,
        "host 1 uploads all it read: {s1}"
    );
    assert_eq!(chunks, 3 + 2 + 1 + 24, "one object per chunk: {s1}");
    // What the Prometheus endpoint types as gauges is there (tests/ctl.rs checks the rest).
    for g in tierfs_fs::GAUGES
        .iter()
        .filter_map(|g| g.strip_prefix("shared."))
    {
        assert!(
            s1["shared"][g].is_u64(),
            "GAUGES names shared.{g}, not in stats: {s1}"
        );
    }

    for i in 2..=3 {
        let h = host(origin.path(), cluster, "fleet", &[]);
        read_all(&h, &files);
        let s = h.stats();
        assert_eq!(
            n(&s, "backing.read_bytes"),
            0,
            "host {i} read the origin: {s}"
        );
        // An open is a check of the origin, not an open of the file there (over S3 that
        // would GET the object's first MiB, which the tier-served reads never use).
        assert_eq!(
            n(&s, "backing.open"),
            0,
            "host {i} opened files at the origin: {s}"
        );
        assert!(
            n(&s, "backing.getattr") + n(&s, "backing.lookup") <= 2 * files.len() as u64 + 4,
            "host {i}: more than a check per open: {s}"
        );
        assert_eq!(n(&s, "shared.hits"), chunks, "host {i}: {s}");
        assert_eq!(n(&s, "shared.hit_bytes"), total, "host {i}: {s}");
        assert_eq!(
            (n(&s, "shared.corrupt"), n(&s, "shared.errors")),
            (0, 0),
            "{s}"
        );
        h.unmount_and_wait();
    }
    let origin_reads = n(&h1.stats(), "backing.read_bytes");
    assert_eq!(
        origin_reads, total,
        "the fleet read the dataset once from the origin"
    );
    h1.unmount_and_wait();
}

#[test]
fn chunks_the_upload_queue_cannot_take_go_up_late_from_the_ssd_tier() {
    let cluster = shared_cluster();
    let origin = tempfile::tempdir().unwrap();
    let files = fill_origin(origin.path());
    // Room for one chunk in the queue, uploads slower than the reader: most chunks wait
    // by name and are read back from host 1's SSD tier when the uploads catch up.
    let slow = ["shared.queue=4M", "shared.write_rate=16M"];
    let h1 = host(origin.path(), cluster, "late", &slow);
    read_all(&h1, &files);
    let s1 = uploads_done(&h1);
    assert!(n(&s1, "shared.late_puts") > 0, "nothing went up late: {s1}");
    assert_eq!(n(&s1, "shared.put_dropped"), 0, "{s1}");
    assert_eq!(n(&s1, "shared.puts"), 30, "{s1}");
    h1.unmount_and_wait();

    let h2 = host(origin.path(), cluster, "late", &[]);
    read_all(&h2, &files);
    let s = h2.stats();
    assert_eq!(
        n(&s, "backing.read_bytes"),
        0,
        "host 2 read the origin: {s}"
    );
    assert_eq!(n(&s, "shared.hits"), 30, "{s}");
    h2.unmount_and_wait();
}

#[test]
fn a_damaged_chunk_is_never_served_and_is_replaced() {
    let cluster = shared_cluster();
    let origin = tempfile::tempdir().unwrap();
    let files = fill_origin(origin.path());
    let h1 = host(origin.path(), cluster, "damage", &[]);
    read_all(&h1, &files);
    uploads_done(&h1);
    h1.unmount_and_wait();

    // One byte flipped in the data of every chunk object, and one object cut short.
    let bucket = cluster.bucket();
    let keys = bucket.list_keys("damage").unwrap();
    assert_eq!(keys.len(), 30, "{keys:?}");
    for (i, k) in keys.iter().enumerate() {
        let obj = bucket
            .get_many(std::slice::from_ref(k))
            .remove(0)
            .unwrap()
            .unwrap();
        let mut bad = obj.to_vec();
        if i == 0 {
            bad.truncate(bad.len() - 1);
        } else {
            let at = 80 + (i * 7919) % (bad.len() - 80);
            bad[at] ^= 0x20;
        }
        bucket.put(k, bad.into()).unwrap();
    }

    let h2 = host(origin.path(), cluster, "damage", &[]);
    read_all(&h2, &files);
    let s = uploads_done(&h2);
    assert_eq!(n(&s, "shared.hits"), 0, "a damaged chunk was served: {s}");
    assert_eq!(n(&s, "shared.corrupt"), 30, "{s}");
    assert_eq!(n(&s, "backing.read_bytes"), dataset_bytes(&files), "{s}");
    assert_eq!(
        n(&s, "shared.puts"),
        30,
        "good chunks replace the damaged: {s}"
    );
    h2.unmount_and_wait();

    let h3 = host(origin.path(), cluster, "damage", &[]);
    read_all(&h3, &files);
    let s = h3.stats();
    assert_eq!(
        (n(&s, "shared.hits"), n(&s, "backing.read_bytes")),
        (30, 0),
        "{s}"
    );
    h3.unmount_and_wait();
}

#[test]
fn a_file_rewritten_at_the_origin_between_two_hosts_is_read_new() {
    let cluster = shared_cluster();
    let origin = tempfile::tempdir().unwrap();
    let mut files = fill_origin(origin.path());
    let h1 = host(origin.path(), cluster, "versions", &[]);
    read_all(&h1, &files);
    uploads_done(&h1);
    h1.unmount_and_wait();

    // Rewritten in place, same size, mtime set back to what it was: only the ctime (and
    // the bytes) tell the versions apart.
    let f = origin.path().join("big1");
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    let new = seeded_bytes(999, files[1].1.len());
    std::fs::write(&f, &new).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    files[1].1 = new;
    std::thread::sleep(Duration::from_millis(1500));

    let h2 = host(origin.path(), cluster, "versions", &[]);
    read_all(&h2, &files);
    let s = h2.stats();
    // Every other file from the tier; big1's two chunks from the origin.
    assert_eq!(n(&s, "shared.hits"), 30 - 2, "{s}");
    assert_eq!(n(&s, "backing.read_bytes"), files[1].1.len() as u64, "{s}");
    h2.unmount_and_wait();
}

#[test]
fn a_volume_server_killed_mid_read_and_the_cluster_stopped_cost_speed_only() {
    let cluster = Cluster::start();
    let origin = tempfile::tempdir().unwrap();
    let files = fill_origin(origin.path());
    let h1 = host(origin.path(), &cluster, "faults", &[]);
    read_all(&h1, &files);
    uploads_done(&h1);
    h1.unmount_and_wait();

    // Host 2 reads while one of the three volume servers dies: every chunk has a second copy.
    let h2 = host(origin.path(), &cluster, "faults", &[]);
    let reader = {
        let (mnt, files) = (h2.mnt.clone(), files.clone());
        std::thread::spawn(move || {
            for (name, want) in &files {
                let got = std::fs::read(mnt.join(name)).unwrap();
                assert!(got == *want, "{name} read wrong while a volume server died");
            }
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    cluster.kill_volume(2);
    with_timeout(LIMIT, vec![h2.mnt.clone()], move || reader.join().unwrap());
    let s = h2.stats();
    assert_eq!(n(&s, "shared.corrupt"), 0, "{s}");
    h2.unmount_and_wait();

    // The whole cluster away: host 3 reads everything from the origin, no error to anyone.
    cluster.stop();
    let h3 = host(origin.path(), &cluster, "faults", &["shared.timeout=1s"]);
    let t = Instant::now();
    read_all(&h3, &files);
    let s = h3.stats();
    assert_eq!(n(&s, "backing.read_bytes"), dataset_bytes(&files), "{s}");
    assert_eq!(n(&s, "shared.down"), 1, "{s}");
    assert!(n(&s, "shared.episodes") >= 1, "{s}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "reading with the tier away took {:?}",
        t.elapsed()
    );
    let log = std::fs::read_to_string(h3.cache.join("tierfs.log")).unwrap();
    assert_eq!(
        log.matches("failing (").count(),
        1,
        "one log line for the episode: {log}"
    );
    h3.unmount_and_wait();
}

#[test]
fn a_bucket_that_does_not_exist_fails_the_mount_with_one_line() {
    let cluster = shared_cluster();
    let origin = tempfile::tempdir().unwrap();
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let endpoint = format!("shared.endpoint={}", cluster.endpoint());
    let out = mount_command(
        origin.path().as_os_str(),
        &m.mnt,
        &m.cache,
        &["shared=s3://no-such-bucket/x", &endpoint],
    )
    .env("AWS_ACCESS_KEY_ID", ACCESS)
    .env("AWS_SECRET_ACCESS_KEY", SECRET)
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted on a missing bucket");
    assert!(err.contains("no-such-bucket"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!is_mounted(&m.mnt));
}
