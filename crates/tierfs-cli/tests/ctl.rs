//! The control plane, through real mounts of the `tierfs` binary: `tierfs ctl get/set` of
//! run-time tunables (a change shows in `tierfs stats` within a second and the SSD tier's
//! admission follows it; unknown keys, bad values and keys fixed at mount are refused with a
//! clear one-line message), the control socket's checks (a non-owner is refused by the peer
//! credential check, a silent client does not hold up `stats`), and the Prometheus endpoint
//! (every number of `tierfs stats`, typed, on loopback unless asked).

mod common;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// `tierfs ctl MNT ARGS...` under a timeout.
fn ctl(mnt: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("20")
        .arg(tierfs_bin())
        .arg("ctl")
        .arg(mnt)
        .args(args)
        .output()
        .expect("run tierfs ctl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A successful `tierfs ctl`: its stdout.
fn ctl_ok(mnt: &Path, args: &[&str]) -> String {
    let o = ctl(mnt, args);
    assert!(
        o.status.success(),
        "tierfs ctl {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout(&o)
}

/// A refused `tierfs ctl`: non-zero exit, nothing on stdout, one line on stderr.
fn ctl_refused(mnt: &Path, args: &[&str]) -> String {
    let o = ctl(mnt, args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "tierfs ctl {args:?}: {err}");
    assert!(o.stdout.is_empty(), "stdout of a refusal: {}", stdout(&o));
    assert_eq!(err.lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("tierfs: "), "{err}");
    err
}

/// The value in force of one tunable (`ctl get --json KEY`).
fn get(mnt: &Path, key: &str) -> String {
    let v: Value = serde_json::from_str(&ctl_ok(mnt, &["get", "--json", key])).unwrap();
    v["tunables"][0]["value"].as_str().unwrap().to_string()
}

fn num(v: &Value, path: &str) -> u64 {
    let mut x = v;
    for p in path.split('.') {
        x = &x[p];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("no {path} in stats {v}"))
}

/// Polls `tierfs stats` until `path` reads `want`; the time it took.
fn until_stats_show(mnt: &Path, path: &str, want: u64, limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        let s = stats_of(mnt);
        if num(&s, path) == want {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < limit,
            "{path} still {} after {limit:?} (want {want})",
            num(&s, path)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn get_and_set_round_trip_and_refusals() {
    let m = BinMount::new(&["ram.max=64M"]);
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(90), vec![mnt.clone()], move || {
        // Every tunable, with its value and whether it is settable (or why not).
        let all = ctl_ok(&mnt, &["get"]);
        let lines: Vec<&str> = all.lines().collect();
        assert!(lines.len() >= 39, "{all}");
        for l in &lines {
            assert!(
                l.ends_with("settable") || l.contains("fixed: requires remount"),
                "{l}"
            );
        }
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("ram.max ") && l.contains("64M")),
            "{all}"
        );
        let v: Value = serde_json::from_str(&ctl_ok(&mnt, &["get", "--json"])).unwrap();
        let list = v["tunables"].as_array().unwrap();
        assert_eq!(list.len(), lines.len());
        let rate = list.iter().find(|t| t["key"] == "ssd.write_rate").unwrap();
        assert_eq!(
            (rate["value"].as_str(), rate["settable"].as_bool()),
            (Some("100M"), Some(true))
        );
        let seg = list
            .iter()
            .find(|t| t["key"] == "ssd.segment_size")
            .unwrap();
        assert_eq!(seg["settable"], false);
        assert!(
            seg["reason"].as_str().unwrap().contains("on-disk layout"),
            "{seg}"
        );

        // A change shows in `tierfs stats` within a second.
        let t = Instant::now();
        let out = ctl_ok(&mnt, &["set", "ssd.write_rate=3M"]);
        assert_eq!(out.trim(), "ssd.write_rate = 3M (was 100M)");
        until_stats_show(&mnt, "ssd.write_rate", 3 * MIB, Duration::from_secs(1));
        let took = t.elapsed();
        println!("ssd.write_rate=3M: in stats {took:?} after `tierfs ctl set` started");
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert_eq!(get(&mnt, "ssd.write_rate"), "3M");
        ctl_ok(&mnt, &["set", "ssd.write_burst=16M", "ram.max=32M"]);
        let s = stats_of(&mnt);
        assert_eq!(num(&s, "ssd.write_burst"), 16 * MIB);
        assert_eq!(num(&s, "ram.cap_bytes"), 32 * MIB);
        // The kernel TTLs follow meta.ttl, as they do at mount.
        ctl_ok(&mnt, &["set", "meta.ttl=5s"]);
        assert_eq!(get(&mnt, "fuse.attr_ttl"), "5s");
        assert_eq!(get(&mnt, "fuse.entry_ttl"), "5s");

        // Refusals: one line naming the culprit, non-zero exit, nothing changed.
        let e = ctl_refused(&mnt, &["set", "ssd.write_rat=1M"]);
        assert!(e.contains("unknown tunable \"ssd.write_rat\""), "{e}");
        let e = ctl_refused(&mnt, &["get", "ram.maks"]);
        assert!(e.contains("unknown tunable \"ram.maks\""), "{e}");
        let e = ctl_refused(&mnt, &["set", "ssd.write_rate=fast"]);
        assert!(
            e.contains("bad value ssd.write_rate=fast: bad size \"fast\""),
            "{e}"
        );
        let e = ctl_refused(&mnt, &["set", "ssd.write_rate=0"]);
        assert!(
            e.contains("ssd.write_rate=0") && e.contains("must be positive"),
            "{e}"
        );
        let e = ctl_refused(&mnt, &["set", "ssd.write_rate"]);
        assert!(e.contains("is not KEY=VALUE"), "{e}");
        // All or nothing: the good assignment before a bad one is not applied.
        let e = ctl_refused(&mnt, &["set", "ssd.write_rate=5M", "ssd.write_burst=lots"]);
        assert!(e.contains("ssd.write_burst=lots"), "{e}");
        assert_eq!(get(&mnt, "ssd.write_rate"), "3M");
        assert_eq!(num(&stats_of(&mnt), "ssd.write_rate"), 3 * MIB);
        let e = ctl_refused(&mnt, &["set", "ssd.segment_size=1G"]);
        assert!(
            e.contains("ssd.segment_size cannot be changed on a running mount: requires remount: segment size is part of the on-disk layout"),
            "{e}"
        );
        // Out of range (issue 13 item 16): the control request died silently, or the value
        // was taken (ram.max=0, a burst no cluster fits in, a saturated number).
        let ram_before = get(&mnt, "ram.max");
        for (bad, why) in [
            ("meta.ttl=18446744073709551615", "too long"),
            ("ram.max=0", "at least 8 blocks"),
            ("ram.max=1K", "at least 8 blocks"),
            ("ssd.write_burst=0", "at least one cluster"),
            ("ssd.write_burst=99999999999999999999", "too large"),
        ] {
            let e = ctl_refused(&mnt, &["set", bad]);
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(
            get(&mnt, "ram.max"),
            ram_before,
            "a refused ram.max was applied"
        );
        let e = ctl_refused(&mnt, &["set", "ram.block_size=128K"]);
        assert!(e.contains("requires remount"), "{e}");
        let e = ctl_refused(&mnt, &["set", "writeback.flushers=2"]);
        assert!(e.contains("write-back is off on this mount"), "{e}");
        assert_eq!(get(&mnt, "ram.block_size"), "64K");
        // The mount still works.
        std::fs::write(mnt.join("f"), b"still here").unwrap();
        assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"still here");
    });
}

/// `meta.ttl` set at run time is what the mount trusts attributes for: with `meta.ttl=1s`,
/// a size changed behind tierfs's back shows 1.3 s later; after `set meta.ttl=1h` (and a
/// listing of the directory), the next change does not (the attributes come from the
/// metadata cache, trusted `meta.ttl_min`, 3 s, for a file that just changed), until the
/// file is opened (close-to-open revalidates).
#[test]
fn meta_ttl_set_at_run_time_is_used() {
    let m = BinMount::new(&["ram.max=16M", "meta.ttl=1s"]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        std::fs::write(backing.join("f"), vec![1u8; 10]).unwrap();
        assert_eq!(size(&mnt.join("f")), 10);
        std::fs::write(backing.join("f"), vec![1u8; 20]).unwrap();
        std::thread::sleep(Duration::from_millis(1300));
        assert_eq!(size(&mnt.join("f")), 20, "meta.ttl=1s: the change is seen");

        ctl_ok(&mnt, &["set", "meta.ttl=1h"]);
        // A listing: names (and their attributes) are then answered from the metadata cache.
        assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 1);
        std::fs::write(backing.join("f"), vec![1u8; 30]).unwrap();
        std::thread::sleep(Duration::from_millis(1300));
        // (From the kernel's copy, which it keeps as long as tierfs still trusts it.)
        assert_eq!(
            size(&mnt.join("f")),
            20,
            "meta.ttl=1h: attributes from the cache"
        );
        drop(std::fs::File::open(mnt.join("f")).unwrap());
        assert_eq!(size(&mnt.join("f")), 30, "an open revalidates (meta.cto)");
    });
}

/// Write-back tunables change on a running write-back mount: the dirty limits show in
/// stats, may move past each other in one request (checked together), and the flusher pool
/// grows and shrinks (`writeback.flushers` in stats counts running threads).
#[test]
fn writeback_tunables_at_run_time() {
    let m = BinMount::new(&["writeback.mode=back", "writeback.dirty_hard=64M"]);
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(90), vec![mnt.clone()], move || {
        let s = stats_of(&mnt);
        assert_eq!(num(&s, "writeback.dirty_hard"), 64 * MIB);
        assert_eq!(num(&s, "writeback.flushers"), 4);
        // Raising both at once: soft above the old hard is fine because hard moves too.
        ctl_ok(
            &mnt,
            &[
                "set",
                "writeback.dirty_soft=96M",
                "writeback.dirty_hard=128M",
            ],
        );
        let s = stats_of(&mnt);
        assert_eq!(
            (
                num(&s, "writeback.dirty_soft"),
                num(&s, "writeback.dirty_hard")
            ),
            (96 * MIB, 128 * MIB)
        );
        let e = ctl_refused(&mnt, &["set", "writeback.dirty_soft=256M"]);
        assert!(e.contains("must be below writeback.dirty_hard"), "{e}");
        // The journal's size stays what it was at mount (it is not settable).
        let journal = get(&mnt, "writeback.journal_size");
        ctl_ok(
            &mnt,
            &["set", "writeback.flushers=1", "writeback.close=flush"],
        );
        assert_eq!(get(&mnt, "writeback.journal_size"), journal);
        // Extra flushers retire between flush groups (idle ones within 200 ms).
        until_stats_show(&mnt, "writeback.flushers", 1, Duration::from_secs(2));
        ctl_ok(&mnt, &["set", "writeback.flushers=6"]);
        until_stats_show(&mnt, "writeback.flushers", 6, Duration::from_secs(1));
        // Data still flows: a write, closed with close=flush, is on the backing store.
        std::fs::write(mnt.join("w"), vec![7u8; 3 << 20]).unwrap();
        assert_eq!(
            std::fs::read(m.backing.join("w")).unwrap(),
            vec![7u8; 3 << 20]
        );
    });
}

/// Deterministic file contents: byte `i` of file `seed`.
fn content(seed: u64, off: u64, len: usize) -> Vec<u8> {
    (off..off + len as u64)
        .map(|i| (mix(seed ^ (i / 8)) >> ((i % 8) * 8)) as u8)
        .collect()
}

/// Reads the file through the mount in 1 MiB reads (at most `pace` bytes/s) and checks it.
fn read_file(path: &Path, seed: u64, size: u64, pace: Option<f64>) {
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let t = Instant::now();
    let mut off = 0;
    while off < size {
        let n = f.read_at(&mut buf, off).unwrap();
        assert!(n > 0, "EOF at {off}");
        assert!(buf[..n] == content(seed, off, n)[..], "wrong data at {off}");
        off += n as u64;
        if let Some(p) = pace {
            let due = Duration::from_secs_f64(off as f64 / p);
            if let Some(ahead) = due.checked_sub(t.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    }
}

/// The SSD tier's admission follows a write budget set at run time: after `set
/// ssd.write_burst=2M ssd.write_rate=1M`, reading 32 MiB writes at most burst + rate x T
/// (+ one cluster of slack, as in tests/ssd.rs) to the tier and drops the rest for lack of
/// budget; after raising it again, a second 32 MiB file is admitted nearly whole.
#[test]
fn admission_follows_a_write_rate_set_at_run_time() {
    const SIZE: u64 = 32 * MIB;
    const SLACK: u64 = MIB + 4096;
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(120), vec![mnt.clone()], move || {
        for (name, seed) in [("a", 1u64), ("b", 2)] {
            let f = std::fs::File::create(m.backing.join(name)).unwrap();
            for off in (0..SIZE).step_by(MIB as usize) {
                f.write_all_at(&content(seed, off, MIB as usize), off)
                    .unwrap();
            }
        }
        // Younger files are served but not cached (tierfs_fs::RACY_WINDOW).
        std::thread::sleep(tierfs_fs::RACY_WINDOW + Duration::from_millis(150));
        // The machine's disk may be nearly full (other work): the device guard
        // (ssd.min_free_pct) would then refuse everything, which is not what is tested here.
        m.mount(&["ram.max=16M", "ssd.min_free_pct=0", "ssd.max_size=1G"]);
        let before = stats_of(&mnt);
        let t0 = Instant::now();
        ctl_ok(&mnt, &["set", "ssd.write_rate=1M", "ssd.write_burst=2M"]);
        let (rate, burst) = (MIB, 2 * MIB);
        read_file(&mnt.join("a"), 1, SIZE, None);
        // A partial cluster is written after ssd.flush_interval (2 s).
        std::thread::sleep(Duration::from_millis(2500));
        let s = stats_of(&mnt);
        let t = t0.elapsed().as_secs_f64();
        let written = num(&s, "ssd.written_bytes") - num(&before, "ssd.written_bytes");
        let limit = burst + (rate as f64 * t) as u64 + SLACK;
        let dropped = num(&s, "ssd.dropped_budget") - num(&before, "ssd.dropped_budget");
        println!(
            "low budget: written {written} in {t:.2} s (limit {limit}), dropped_budget {dropped}, admitted {}",
            num(&s, "ssd.admitted_bytes") - num(&before, "ssd.admitted_bytes")
        );
        assert!(written <= limit, "{written} > {limit}: {s}");
        assert!(
            dropped >= 100,
            "32 MiB with a 2 MiB budget: {dropped} drops: {s}"
        );
        assert!(written >= MIB, "the budget was not used: {s}");

        ctl_ok(&mnt, &["set", "ssd.write_rate=200M", "ssd.write_burst=64M"]);
        let mid = stats_of(&mnt);
        read_file(&mnt.join("b"), 2, SIZE, Some(64.0 * MIB as f64));
        std::thread::sleep(Duration::from_millis(200));
        let end = stats_of(&mnt);
        let admitted = num(&end, "ssd.admitted_bytes") - num(&mid, "ssd.admitted_bytes");
        let dropped = num(&end, "ssd.dropped_budget") - num(&mid, "ssd.dropped_budget");
        println!("raised budget: admitted {admitted} of {SIZE}, dropped_budget {dropped}");
        assert!(admitted >= SIZE * 3 / 4, "admitted {admitted}: {end}");
        m.unmount_and_wait();
    });
}

/// A request to the control socket from uid 65534 (not the owner, not root). The socket is
/// 0600 in a 0700 directory, so such a process cannot even connect: that is the first layer,
/// checked first. The second layer is the daemon's SO_PEERCRED check on every connection; to
/// reach it the test opens the first one (mode 0666 and traversable directories, as a
/// mistake would), and the client gets the daemon's refusal, which it can only get after the
/// daemon accepted the connection, so the refusal is the peer-credential check's. The
/// refusal is logged, and the owner (root) is still served.
#[test]
fn non_owner_is_refused_by_peer_credentials() {
    let m = BinMount::new(&["ram.max=16M"]);
    let mnt = m.mnt.clone();
    let sock = m.cache.join("control.sock");
    let top = m.dir.path().to_path_buf();
    let cache = m.cache.clone();
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "control socket mode");
        match as_nobody(&sock, b"[\"get\"]\n") {
            Err(e) => assert_eq!(e, libc::EACCES, "connect as uid 65534"),
            Ok(a) => panic!("uid 65534 connected through a 0600 socket: {a}"),
        }

        for d in [&top, &cache] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
        for req in [
            &b"[\"get\"]\n"[..],
            b"stats\n",
            b"[\"set\",\"ram.max=1M\"]\n",
        ] {
            let answer = as_nobody(&sock, req).expect("connect once the socket is open");
            let v: Value = serde_json::from_str(&answer).expect("a JSON answer");
            assert_eq!(
                v["error"],
                "permission denied: uid 65534 is not the owner of this mount (uid 0) or root",
                "{answer}"
            );
        }
        assert_ne!(get(&mnt, "ram.max"), "1M", "a refused set was applied");
        let log = std::fs::read_to_string(cache.join("tierfs.log")).unwrap();
        assert!(
            log.contains("control socket: refused a request from uid 65534"),
            "no refusal in the log: {log}"
        );
        assert_eq!(get(&mnt, "ram.max"), "16M");
    });
}

/// Connects to `sock` as uid/gid 65534 in a forked child, sends `req`, returns the answer
/// line, or the errno of connect. The child makes raw system calls only (the parent has
/// threads: nothing that allocates or locks is safe after fork).
fn as_nobody(sock: &Path, req: &[u8]) -> Result<String, i32> {
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let p = sock.as_os_str().as_bytes();
    assert!(p.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(p) {
        *d = *s as libc::c_char;
    }
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        unsafe {
            let out = fds[1];
            let fail = |code: u8| -> ! {
                let msg = [b'E', code];
                libc::write(out, msg.as_ptr().cast(), 2);
                libc::_exit(1)
            };
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                fail(0);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if s < 0 {
                fail(0);
            }
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(s, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                fail(*libc::__errno_location() as u8);
            }
            libc::write(s, req.as_ptr().cast(), req.len());
            let mut buf = [0u8; 4096];
            libc::write(out, b"A".as_ptr().cast(), 1);
            loop {
                let n = libc::read(s, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                libc::write(out, buf.as_ptr().cast(), n as usize);
            }
            libc::_exit(0);
        }
    }
    unsafe { libc::close(fds[1]) };
    let mut r = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let mut got = Vec::new();
    r.read_to_end(&mut got).unwrap();
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, 0) };
    match got.split_first() {
        Some((b'A', rest)) => Ok(String::from_utf8_lossy(rest).into_owned()),
        Some((b'E', [0])) => panic!("the child could not become uid 65534"),
        Some((b'E', [e])) => Err(*e as i32),
        _ => panic!("child said {got:?}"),
    }
}

/// Each connection has its own thread: a client that connects and says nothing (the daemon
/// waits up to 5 s for its line) does not hold up `tierfs stats`.
#[test]
fn a_silent_client_does_not_block_stats() {
    let m = BinMount::new(&["ram.max=16M"]);
    let mnt = m.mnt.clone();
    let sock = m.cache.join("control.sock");
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        let silent: Vec<_> = (0..3)
            .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        let s = stats_of(&mnt);
        let took = t.elapsed();
        println!("stats with 3 silent clients connected: {took:?}");
        assert!(s["ram"]["cap_bytes"].as_u64() == Some(16 * MIB));
        assert!(took < Duration::from_secs(2), "{took:?}");
        drop(silent);
    });
}

/// The stats JSON flattened to (dotted path, number).
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, f64)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, v, out);
            }
        }
        Value::Number(n) => out.push((prefix.to_string(), n.as_f64().unwrap())),
        // Flags (pressure.enabled) are exported as 0/1 gauges.
        Value::Bool(b) => out.push((format!("{prefix}?"), f64::from(u8::from(*b)))),
        _ => {}
    }
}

/// One HTTP/1.0 GET of `path` from `addr`: (status line, headers, body).
fn http_get(addr: &str, path: &str) -> (String, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("HTTP response");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_lowercase(), body.to_string())
}

/// Whether a TCP socket listens on 127.0.0.1:`port` and on nothing else (/proc/net/tcp).
fn listens_on_loopback_only(port: u16) -> bool {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let tcp6 = std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
    let listening: Vec<String> = tcp
        .lines()
        .chain(tcp6.lines())
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, p) = f.get(1)?.rsplit_once(':')?;
            (f.get(3) == Some(&"0A") && u16::from_str_radix(p, 16).ok() == Some(port))
                .then(|| addr.to_string())
        })
        .collect();
    listening == ["0100007F"]
}

/// Every number of `tierfs stats` (SSD tier and write-back on, so every section is there) is
/// served at /metrics with the right type, named after its stats path, with a value at least
/// the one stats showed just before; the gauge list names no field that does not exist; the
/// endpoint listens on loopback when given a bare port.
#[test]
fn metrics_serve_every_stats_number_on_loopback() {
    let m = BinMount::new(&["metrics_addr=0", "writeback.mode=back", "ram.max=16M"]);
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        std::fs::write(mnt.join("f"), vec![1u8; 1 << 20]).unwrap();
        assert_eq!(std::fs::read(mnt.join("f")).unwrap().len(), 1 << 20);
        let addr = get(&mnt, "metrics_addr");
        let port: u16 = addr
            .strip_prefix("127.0.0.1:")
            .expect("loopback")
            .parse()
            .unwrap();
        assert!(
            listens_on_loopback_only(port),
            "port {port} not on loopback only"
        );

        let stats = stats_of(&mnt);
        let mut fields = Vec::new();
        flatten("", &stats, &mut fields);
        // `tierfs stats --json` adds the hit ratios from hits and misses (both metrics):
        // Prometheus derives them itself.
        fields.retain(|(p, _)| !p.ends_with(".hit_ratio"));
        assert!(fields.len() > 100, "{} fields", fields.len());
        // The shared tier's gauges exist with a shared tier only: tests/shared_tier.rs.
        for g in tierfs_fs::GAUGES
            .iter()
            .filter(|g| !g.starts_with("shared."))
        {
            assert!(
                fields.iter().any(|(p, _)| p == g),
                "GAUGES names {g}, not in stats"
            );
        }
        let (status, headers, body) = http_get(&addr, "/metrics");
        assert!(status.contains(" 200 "), "{status}");
        assert!(
            headers.contains("content-type: text/plain; version=0.0.4"),
            "{headers}"
        );
        let value = |name: &str| -> Option<f64> {
            body.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        };
        for (path, v) in &fields {
            let (path, flag) = match path.strip_suffix('?') {
                Some(p) => (p, true),
                None => (path.as_str(), false),
            };
            let base = format!("tierfs_{}", path.replace('.', "_"));
            let gauge = flag || tierfs_fs::GAUGES.contains(&path);
            let (name, kind) = if gauge {
                (base, "gauge")
            } else {
                (base + "_total", "counter")
            };
            assert!(
                body.contains(&format!("# TYPE {name} {kind}\n")),
                "no {kind} {name} for stats {path}"
            );
            assert!(
                body.contains(&format!("# HELP {name} ")),
                "no HELP for {name}"
            );
            let got = value(&name).unwrap_or_else(|| panic!("no value line for {name}"));
            if !gauge {
                assert!(got >= *v, "{name} {got} < {v} shown by stats before");
            }
        }
        assert!(value("tierfs_write_bytes_total").unwrap() >= (1 << 20) as f64);
        // Text fields of the stats are labels of one info metric.
        let info = body
            .lines()
            .find(|l| l.starts_with("tierfs_info{"))
            .unwrap_or_else(|| panic!("no tierfs_info line in {body}"));
        let store = format!("store_id=\"{}\"", stats["store_id"].as_str().unwrap());
        assert!(info.ends_with("} 1"), "{info}");
        assert!(info.contains(&store), "{info}");
        assert!(info.contains("writeback_mode=\"back\""), "{info}");
        let types = body.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(
            types,
            fields.len() + 1,
            "one metric per stats number, plus tierfs_info"
        );
        let (status, _, _) = http_get(&addr, "/nope");
        assert!(status.contains(" 404 "), "{status}");
    });
}

/// `--metrics-addr` with a bad address is refused before mounting, in one line.
#[test]
fn bad_metrics_address_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mnt) = (dir.path().join("b"), dir.path().join("m"));
    std::fs::create_dir(&b).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let out = Command::new("timeout")
        .arg("20")
        .arg(tierfs_bin())
        .arg("mount")
        .arg(&b)
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(dir.path().join("c"))
        .args(["--metrics-addr", "somewhere:80"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("metrics_addr=somewhere:80") && err.contains("bad address"),
        "{err}"
    );
    assert!(!is_mounted(&mnt));
}

/// `tierfs stats` (issue 13 item 19): a summary of a few lines with sizes in KiB/MiB/GiB and
/// hit ratios; `--all` adds every counter; `--json` carries the hit ratios too; `-i 0.2 -c 3`
/// prints a header and three lines of rates, like `zpool iostat`.
#[test]
fn stats_summary_all_json_and_live() {
    let m = BinMount::new(&["ram.max=16M"]);
    std::fs::write(m.backing.join("f"), vec![3u8; 1 << 20]).unwrap();
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("f")).unwrap().len(), 1 << 20);
    });
    let run = |args: &[&str]| {
        let out = Command::new("timeout")
            .arg("20")
            .arg(tierfs_bin())
            .arg("stats")
            .args(args)
            .arg(&m.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let s = run(&[]);
    assert!(s.lines().count() <= 10, "not a summary: {s}");
    for part in ["reads", "RAM tier", "SSD tier", "store", "metadata", "MiB"] {
        assert!(s.contains(part), "no {part:?} in {s}");
    }
    let all = run(&["--all"]);
    assert!(all.lines().count() > 60, "--all lacks the counters: {all}");
    assert!(all.contains("tierfs.backing.read_bytes"), "{all}");
    let v: serde_json::Value = serde_json::from_str(&run(&["--json"])).unwrap();
    assert!(v["ram"]["hit_ratio"].is_number(), "{v}");
    let live = run(&["-i", "0.2", "-c", "3"]);
    let lines: Vec<&str> = live.lines().collect();
    assert_eq!(lines.len(), 4, "{live}");
    assert!(
        lines[0].contains("read/s") && lines[0].contains("ram%"),
        "{live}"
    );
}
