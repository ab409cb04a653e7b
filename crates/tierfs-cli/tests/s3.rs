//! `tierfs mount s3://BUCKET/PREFIX` over a real S3 server (versitygw, scripts/s3-server):
//! real programs read the tree; after a remount with the page cache dropped, reading it again
//! makes no GET; an object replaced behind tierfs's back is seen whole at the next open.
//! Real programs write a tree (multipart uploads included) and the bucket holds it; two
//! mounts over one bucket see each other's fsynced files, and of two writers of one object
//! one wins and the other's data is kept; a daemon killed during a multipart upload loses
//! nothing fsync acknowledged.

mod common;
#[path = "../../tierfs-s3/tests/server/mod.rs"]
mod server;

use common::*;
use server::{S3Server, ACCESS, SECRET};
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Mounts `s3://data/pre` of `server` on `m` (its BACKING stays unused).
fn mount(m: &BinMount, server: &S3Server) {
    mount_with(m, server, &[]);
}

fn mount_with(m: &BinMount, server: &S3Server, opts: &[&str]) {
    mount_with_env(m, server, opts, &[]);
}

/// [`mount_with`], the daemon given `env` too.
fn mount_with_env(m: &BinMount, server: &S3Server, opts: &[&str], env: &[(&str, &str)]) {
    let endpoint = format!("s3.endpoint={}", server.endpoint);
    let mut all = vec![endpoint.as_str()];
    all.extend_from_slice(opts);
    let mut env_all = vec![
        ("AWS_ACCESS_KEY_ID", ACCESS),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
    ];
    env_all.extend_from_slice(env);
    m.mount_source(OsStr::new("s3://data/pre"), &all, &env_all);
}

/// Puts an object as the server's POSIX backend keeps it: the file under DIR/BUCKET and its
/// ETag (quoted MD5) in the `user.etag` xattr, which is what a PUT through the server leaves.
/// (A file without it gets an ETag the first time the server is asked for one: a new
/// version, fetched again.)
fn put_file(server: &S3Server, key: &str, data: &[u8]) {
    let p = server.dir.path().join("data").join(key);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, data).unwrap();
    let out = Command::new("md5sum").arg(&p).output().unwrap();
    let md5 = String::from_utf8(out.stdout).unwrap();
    let etag = format!("\"{}\"", md5.split_whitespace().next().unwrap());
    let path = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"user.etag".as_ptr(),
            etag.as_ptr().cast(),
            etag.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr user.etag on {}", p.display());
}

fn tree_md5(root: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg("find . -type f | sort | xargs md5sum")
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_bucket_is_read_by_real_programs_and_served_from_the_cache_after_remount() {
    let server = S3Server::start(&["data"]);
    for i in 0..40 {
        let data: Vec<u8> = (0..(i * 7919 % 300_000))
            .map(|b| (b * 31 + i) as u8)
            .collect();
        put_file(&server, &format!("pre/d{}/f{i}.bin", i % 4), &data);
    }
    put_file(&server, "pre/top.txt", b"top\n");
    put_file(&server, "elsewhere.txt", b"not mounted\n");
    let want = tree_md5(&server.dir.path().join("data/pre"));
    // tierfs caches nothing of an object younger than its racy window (1 s; Last-Modified
    // has whole seconds, and the ctime carries up to 1 s of ETag hash).
    std::thread::sleep(Duration::from_millis(2500));
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount(&m, &server);
    let mnt = m.mnt.clone();
    let got = with_timeout(LIMIT, vec![mnt.clone()], move || tree_md5(&mnt));
    assert_eq!(got, want);
    // Let the SSD tier's writer take in what was read, then remount on the same cache dir.
    std::thread::sleep(Duration::from_secs(2));
    m.unmount_and_wait();
    drop_caches();
    mount(&m, &server);
    let before = stats_of(&m.mnt);
    let mnt = m.mnt.clone();
    let again = with_timeout(LIMIT, vec![mnt.clone()], move || tree_md5(&mnt));
    assert_eq!(again, want);
    let after = stats_of(&m.mnt);
    assert_eq!(
        n(&after, "backing.read"),
        n(&before, "backing.read"),
        "GETs after remount: {after}"
    );
    assert!(n(&after, "ssd.hits") > n(&before, "ssd.hits"), "{after}");

    // Replaced behind tierfs's back (another size): the next open sees the new object whole.
    put_file(&server, "pre/d0/f0.bin", &vec![7u8; 123_457]);
    let mnt = m.mnt.clone();
    let data = with_timeout(LIMIT, vec![mnt.clone()], move || {
        std::fs::read(mnt.join("d0/f0.bin")).unwrap()
    });
    assert_eq!(data, vec![7u8; 123_457]);
    m.unmount_and_wait();
}

/// Lets the SSD tier's writer take in what was read or written, remounts `m` on the same
/// cache dir with the page cache dropped, and runs `read` on the mount point (under the
/// timeout). Asserts that it opened no object on the store and made no GET; returns what
/// `read` gave, the counters after it and their deltas over it.
fn after_remount<T: Send + 'static>(
    m: &BinMount,
    server: &S3Server,
    read: impl FnOnce(std::path::PathBuf) -> T + Send + 'static,
) -> (T, serde_json::Value, impl Fn(&str) -> u64) {
    std::thread::sleep(Duration::from_secs(2));
    m.unmount_and_wait();
    drop_caches();
    mount(m, server);
    let before = stats_of(&m.mnt);
    let mnt = m.mnt.clone();
    let got = with_timeout(LIMIT, vec![mnt.clone()], move || read(mnt));
    let after = stats_of(&m.mnt);
    let (b, a) = (before, after.clone());
    let d = move |k: &str| n(&a, k) - n(&b, k);
    assert_eq!(
        d("backing.open"),
        0,
        "objects opened after the remount: {after}"
    );
    assert_eq!(d("backing.read"), 0, "GETs after the remount: {after}");
    (got, after, d)
}

/// Objects a file server put behind the gateway (files in its backing directory, no
/// `user.etag`): versitygw lists them with an empty ETag and HEADs or GETs them with none.
/// One object, one version, whichever request saw it: read once, remounted, read again with
/// the page cache dropped, each open costs one store request (its close-to-open check) and
/// none opens the object again (the empty ETag was once taken for another version than the
/// missing one: every object read before the remount was fetched again after it).
#[test]
fn objects_without_an_etag_are_served_from_the_cache_after_remount_in_one_request_each() {
    let server = S3Server::start(&["data"]);
    const FILES: u64 = 30;
    for i in 0..FILES {
        let p = server.dir.path().join(format!("data/pre/plain/f{i}.txt"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("object {i}\n").repeat(200 + i as usize * 37)).unwrap();
    }
    let want = tree_md5(&server.dir.path().join("data/pre/plain"));
    // (Older than tierfs's racy window: see the test above.)
    std::thread::sleep(Duration::from_millis(2500));
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount(&m, &server);
    let p = m.mnt.join("plain");
    assert_eq!(
        with_timeout(LIMIT, vec![m.mnt.clone()], move || tree_md5(&p)),
        want
    );
    let (again, after, d) = after_remount(&m, &server, |mnt| tree_md5(&mnt.join("plain")));
    assert_eq!(again, want);
    let requests = d("backing.lookup") + d("backing.getattr") + d("backing.open");
    assert!(
        requests <= FILES + 3,
        "{requests} store requests for {FILES} opens after the remount: {after}"
    );
    m.unmount_and_wait();
}

/// Files written through the mount are in the SSD tier under the version the bucket shows
/// after their upload: after a remount with the page cache dropped, reading them back opens
/// no object and GETs nothing (they were fetched again whole: issue 43).
#[test]
fn files_written_through_the_mount_are_read_from_the_cache_after_remount() {
    let server = S3Server::start(&["data"]);
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount(&m, &server);
    let files: Vec<(String, Vec<u8>)> = (0..6u32)
        .map(|i| {
            let len = 1000 + i as usize * 700_000;
            let data = (0..len).map(|b| (b as u32 * 13 + i * 7) as u8).collect();
            (format!("w/f{i}.bin"), data)
        })
        .collect();
    let mnt = m.mnt.clone();
    let written = files.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        std::fs::create_dir_all(mnt.join("w")).unwrap();
        for (name, data) in &written {
            std::fs::write(mnt.join(name), data).unwrap();
        }
    });
    // (The versions age past the racy window meanwhile.)
    let (read, after, d) = after_remount(&m, &server, |mnt| {
        (0..6)
            .map(|i| std::fs::read(mnt.join(format!("w/f{i}.bin"))).unwrap())
            .collect::<Vec<_>>()
    });
    for ((name, want), got) in files.iter().zip(&read) {
        assert!(
            want == got,
            "{name}: {} bytes read back, {} written",
            got.len(),
            want.len()
        );
    }
    assert!(d("ssd.hits") > 0, "{after}");
    m.unmount_and_wait();
}

/// `meta.cto=off` turns FUSE no-open on: the kernel sends no OPEN and names no file in a
/// FLUSH. close(2) of a file read or written must still succeed (it failed with EBADF: `cat`
/// exited 1 on every file), and a file written must be in the bucket once close returned.
#[test]
fn with_close_to_open_off_programs_read_and_write_and_close_succeeds() {
    let server = S3Server::start(&["data"]);
    let want: Vec<u8> = (0..300_000u32).map(|b| (b * 7) as u8).collect();
    put_file(&server, "pre/r/a.bin", &want);
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount_with(&m, &server, &["meta.cto=off"]);
    let mnt = m.mnt.clone();
    let bucket = server.dir.path().join("data/pre");
    let wanted = want.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        for _ in 0..2 {
            let got = sh(&mnt, "cat r/a.bin");
            assert!(got == wanted, "cat read {} bytes", got.len());
        }
        sh(&mnt, "printf hello > w.txt; cp r/a.bin copy.bin");
        // Uploaded by close, before any unmount.
        assert_eq!(std::fs::read(bucket.join("w.txt")).unwrap(), b"hello");
        assert!(std::fs::read(bucket.join("copy.bin")).unwrap() == wanted);
    });
    m.unmount_and_wait();
}

/// A walk that looks names up one by one in a prefix nobody listed (`cat` of names it was
/// given, as `xargs cat` or a data loader does) makes a few HEADs, then one LIST page
/// answers the rest of its lookups; each open is still one close-to-open request.
#[test]
fn a_walk_looking_names_up_in_a_prefix_lists_it_once_instead() {
    const FILES: usize = 40;
    let server = S3Server::start(&["data"]);
    let mut want = Vec::new();
    for i in 0..FILES {
        let data = format!("file {i}\n").repeat(50 + i);
        put_file(&server, &format!("pre/walk/f{i:02}.txt"), data.as_bytes());
        want.extend_from_slice(data.as_bytes());
    }
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount(&m, &server);
    let dir = m.mnt.join("walk");
    let names: Vec<String> = (0..FILES).map(|i| format!("f{i:02}.txt")).collect();
    let script = format!("cat {}", names.join(" "));
    let got = with_timeout(LIMIT, vec![m.mnt.clone()], move || sh(&dir, &script));
    assert!(
        got == want,
        "cat read {} bytes, want {}",
        got.len(),
        want.len()
    );
    let s = stats_of(&m.mnt);
    assert!(
        n(&s, "backing.lookup") <= 6,
        "lookups went on one by one: {s}"
    );
    assert!(n(&s, "backing.readdir") <= 3, "{s}");
    // Each file opened once (its open is its check), not looked up and then opened, and not
    // loaded ahead as well (an S3 open is a GET of the object: a load ahead would be the
    // walk's own request made twice).
    assert!(
        n(&s, "backing.lookup") + n(&s, "backing.getattr") + n(&s, "backing.open")
            <= FILES as u64 + 8,
        "more than one request per open: {s}"
    );
    m.unmount_and_wait();
}

/// Runs `script` with `sh -e` in `dir`; it must succeed (close(2) errors included, which
/// `cat` and `cp` report). Returns what it wrote to stdout.
fn sh(dir: &Path, script: &str) -> Vec<u8> {
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A source tree to write: small files, an empty one, and two larger than the part size.
fn source_tree(root: &Path) {
    for i in 0..30u64 {
        let p = root.join(format!("src/d{}/f{i}", i % 3));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, seeded_bytes(i, (i * 10_007 % 200_000) as usize)).unwrap();
    }
    std::fs::write(root.join("src/empty"), b"").unwrap();
    std::fs::write(root.join("src/big1"), seeded_bytes(99, 12 << 20)).unwrap();
    std::fs::write(root.join("src/big2"), seeded_bytes(98, (5 << 20) + 17)).unwrap();
}

#[test]
fn real_programs_write_a_tree_into_the_bucket() {
    let server = S3Server::start(&["data"]);
    let src = tempfile::tempdir().unwrap();
    source_tree(src.path());
    let want = tree_md5(&src.path().join("src"));
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    // Parts of 5 MiB, two at a time: big1 goes in three parts, big2 in two.
    mount_with(&m, &server, &["s3.part_size=5M", "s3.upload_parallel=2"]);
    let (mnt, s) = (m.mnt.clone(), src.path().to_path_buf());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        sh(
            &s,
            &format!("tar -C src -cf - . | tar -C {} -xf -", mnt.display()),
        );
    });
    let bucket = server.dir.path().join("data/pre");
    assert_eq!(tree_md5(&bucket), want, "the bucket after tar -x");
    assert_eq!(tree_md5(&m.mnt), want, "the mount after tar -x");

    // The namespace operations, by the usual programs.
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        sh(
            &mnt,
            "mv d0/f0 d1/moved; rm d2/f2; mkdir newdir; mkdir newdir/sub; rmdir newdir/sub; \
             printf abc >> d1/f1; truncate -s 1000 d0/f3; \
             printf XY | dd of=big2 bs=1 seek=5242880 conv=notrunc 2>/dev/null; \
             ! rmdir d1 2>/dev/null; ! mv d0 d9 2>/dev/null || test -d d9",
        );
    });
    let mut f1 = seeded_bytes(1, 10_007);
    f1.extend_from_slice(b"abc");
    let mut f3 = seeded_bytes(3, 30_021);
    f3.truncate(1000);
    let mut big2 = seeded_bytes(98, (5 << 20) + 17);
    big2[5 << 20..(5 << 20) + 2].copy_from_slice(b"XY");
    let d0 = if bucket.join("d9").exists() {
        "d9"
    } else {
        "d0"
    };
    assert_eq!(
        std::fs::read(bucket.join("d1/moved")).unwrap(),
        seeded_bytes(0, 0)
    );
    assert!(!bucket.join(format!("{d0}/f0")).exists());
    assert!(!bucket.join("d2/f2").exists());
    assert!(bucket.join("newdir").is_dir() && !bucket.join("newdir/sub").exists());
    assert_eq!(std::fs::read(bucket.join("d1/f1")).unwrap(), f1);
    assert_eq!(std::fs::read(bucket.join(format!("{d0}/f3"))).unwrap(), f3);
    assert_eq!(std::fs::read(bucket.join("big2")).unwrap(), big2);
    // And tierfs reads back what the bucket has, after a remount.
    let want = tree_md5(&bucket);
    m.unmount_and_wait();
    drop_caches();
    mount(&m, &server);
    let mnt = m.mnt.clone();
    let got = with_timeout(LIMIT, vec![mnt.clone()], move || tree_md5(&mnt));
    assert_eq!(got, want);
    m.unmount_and_wait();
}

fn write_fsync(p: &Path, data: &[u8]) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(p)?;
    f.write_all(data)?;
    f.sync_all()?;
    Ok(f)
}

/// Two daemons with their own cache dirs over one bucket, in either write mode.
#[test]
fn two_mounts_share_a_bucket_and_two_writers_never_lose_data() {
    for opts in [&[][..], &["writeback.mode=back"][..]] {
        let server = S3Server::start(&["data"]);
        let (a, b) = (
            BinMount::unmounted_in(&std::env::temp_dir()),
            BinMount::unmounted_in(&std::env::temp_dir()),
        );
        // The S3 store's staging and upload lines in the daemons' logs (shown if the test
        // fails): this test once failed under the whole suite with both fsyncs succeeding,
        // and never since (see `S3Store::stage`, `Ctx::upload`).
        let debug = [("TIERFS_LOG", "info,tierfs_s3=debug")];
        mount_with_env(&a, &server, opts, &debug);
        mount_with_env(&b, &server, opts, &debug);
        let (ma, mb) = (a.mnt.clone(), b.mnt.clone());
        let bucket_file = server.dir.path().join("data/pre/shared");
        let (lost_b, conflicts) = with_timeout(LIMIT, vec![ma.clone(), mb.clone()], move || {
            // Written and fsynced through A: B's next open reads it.
            let v1 = seeded_bytes(1, 300_000);
            drop(write_fsync(&ma.join("shared"), &v1).unwrap());
            assert_eq!(std::fs::read(mb.join("shared")).unwrap(), v1, "{opts:?}");
            // Both open the same version and write; A's fsync wins, B's fails.
            use std::os::unix::fs::FileExt;
            let open = |p: &Path| std::fs::OpenOptions::new().write(true).open(p).unwrap();
            let (fa, fb) = (open(&ma.join("shared")), open(&mb.join("shared")));
            fa.write_all_at(b"from A", 0).unwrap();
            fb.write_all_at(b"from B", 100).unwrap();
            fa.sync_all().unwrap();
            // A duplicate of B's descriptor closed first, as a child process spawned meanwhile
            // closes it at exec: its FLUSH uploads and meets the conflict, and must not take
            // the error from B's own fsync (this test failed so, now and then, under the
            // whole suite, whose other tests spawn processes).
            drop(fb.try_clone().unwrap());
            let e = match fb.sync_all() {
                Err(e) => e,
                Ok(()) => {
                    let now = std::fs::read(&bucket_file).unwrap();
                    let log = |m: &Path| {
                        let p = m.parent().unwrap().join("cache/tierfs.log");
                        std::fs::read_to_string(p)
                            .unwrap_or_default()
                            .lines()
                            .filter(|l| l.contains("S3 "))
                            .collect::<Vec<_>>()
                            .join("\n")
                    };
                    panic!(
                        "{opts:?}: both fsyncs succeeded; the bucket has {:?} at 0 and {:?} \
                         at 100\n--- A's S3 lines:\n{}\n--- B's S3 lines:\n{}",
                        String::from_utf8_lossy(&now[..6]),
                        String::from_utf8_lossy(&now[100..106]),
                        log(&ma),
                        log(&mb),
                    )
                }
            };
            assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{opts:?}");
            drop((fa, fb));
            let mut want = v1.clone();
            want[..6].copy_from_slice(b"from A");
            assert_eq!(std::fs::read(ma.join("shared")).unwrap(), want);
            let mut theirs = v1;
            theirs[100..106].copy_from_slice(b"from B");
            (theirs, stats_of(&mb))
        });
        // The bucket holds A's version; B's is in B's lost directory, with its report.
        let mut want = seeded_bytes(1, 300_000);
        want[..6].copy_from_slice(b"from A");
        assert_eq!(
            std::fs::read(server.dir.path().join("data/pre/shared")).unwrap(),
            want
        );
        let lost = b.cache.join("journal/lost");
        let kept: Vec<_> = std::fs::read_dir(&lost)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        let is_report = |p: &&std::path::PathBuf| p.to_string_lossy().ends_with(".txt");
        let data = kept.iter().find(|p| !is_report(p)).expect("lost data");
        // B's writes over the version B's writes were made on, or (B's flusher came after
        // A's upload and found the object changed) over A's version.
        let kept_b = std::fs::read(data).unwrap();
        let mut over_a = lost_b.clone();
        over_a[..6].copy_from_slice(b"from A");
        assert!(
            kept_b == lost_b || kept_b == over_a,
            "{opts:?}: B's kept data"
        );
        let report = std::fs::read_to_string(kept.iter().find(is_report).unwrap()).unwrap();
        assert!(report.contains("s3://data/pre/shared"), "{report}");
        if !opts.is_empty() {
            assert_eq!(n(&conflicts, "writeback.flush_conflicts"), 1, "{conflicts}");
        }
        a.unmount_and_wait();
        b.unmount_and_wait();
    }
}

/// kill -9 while a multipart upload is under way (write-back, fsync acknowledged by the
/// journal): after the remount every acknowledged byte is in the bucket.
#[test]
fn a_daemon_killed_during_a_multipart_upload_loses_nothing_acknowledged() {
    let server = S3Server::start(&["data"]);
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let opts = [
        "writeback.mode=back",
        "writeback.fsync=journal",
        "s3.part_size=5M",
        "s3.upload_parallel=1",
    ];
    mount_with(&m, &server, &opts);
    let small = seeded_bytes(5, 1 << 20);
    let v1 = seeded_bytes(6, 160 << 20);
    let bucket = server.dir.path().join("data/pre");
    let mnt = m.mnt.clone();
    let (s2, b2) = (small.clone(), v1.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        drop(write_fsync(&mnt.join("small"), &s2).unwrap());
        drop(write_fsync(&mnt.join("big"), &b2).unwrap());
    });
    // Once the first version is in the bucket, a rewrite of one MiB in its middle, fsynced
    // (acknowledged by the journal at once): the flusher uploads the whole object again,
    // in 32 parts, one at a time, starting once the file has been idle for a moment.
    let t = std::time::Instant::now();
    while std::fs::read(bucket.join("big")).unwrap_or_default() != v1 {
        assert!(
            t.elapsed() < LIMIT,
            "the first version never reached the bucket"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut v2 = v1.clone();
    let patch = seeded_bytes(7, 1 << 20);
    v2[80 << 20..81 << 20].copy_from_slice(&patch);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("big"))
            .unwrap();
        f.write_all_at(&patch, 80 << 20).unwrap();
        f.sync_all().unwrap();
    });
    fn has_parts(d: &Path) -> bool {
        let Ok(rd) = std::fs::read_dir(d) else {
            return false;
        };
        rd.flatten().any(|e| {
            let p = e.path();
            !p.is_dir() || has_parts(&p)
        })
    }
    let parts = server.dir.path().join("data/.sgwtmp/multipart");
    let t = std::time::Instant::now();
    while !has_parts(&parts) {
        assert!(t.elapsed() < LIMIT, "no multipart upload started");
        std::thread::sleep(Duration::from_millis(1));
    }
    m.kill_daemon();
    assert!(
        std::fs::read(bucket.join("big")).unwrap() == v1,
        "the upload finished before the kill: the test proves nothing"
    );
    mount_with(&m, &server, &opts);
    m.unmount_and_wait();
    assert_eq!(std::fs::read(bucket.join("small")).unwrap(), small);
    assert!(
        std::fs::read(bucket.join("big")).unwrap() == v2,
        "big differs"
    );
}

/// The server goes away (nothing listens): what is cached is still served, a name never seen
/// is an errno (not a hang), and once the server is back new objects are seen. Then the
/// server hangs (accepts, never answers): the daemon still exits promptly once its mount is
/// gone, a reader waiting in the server gets an error.
#[test]
fn a_vanished_server_is_served_from_the_cache_and_a_hung_one_never_holds_the_daemon() {
    let mut server = S3Server::start(&["data"]);
    put_file(&server, "pre/a.txt", b"hello\n");
    put_file(&server, "pre/d/b.txt", b"bee\n");
    std::thread::sleep(Duration::from_millis(2500));
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount(&m, &server);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("a.txt")).unwrap(), b"hello\n");
        assert_eq!(std::fs::read(mnt.join("d/b.txt")).unwrap(), b"bee\n");
    });

    server.stop();
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let t = std::time::Instant::now();
        assert_eq!(std::fs::read(mnt.join("a.txt")).unwrap(), b"hello\n");
        assert_eq!(std::fs::read(mnt.join("d/b.txt")).unwrap(), b"bee\n");
        let e = std::fs::read(mnt.join("never.txt")).unwrap_err();
        assert!(e.raw_os_error().is_some(), "{e}");
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    });
    let st = stats_of(&m.mnt);
    assert!(n(&st, "backing.notconn") > 0, "{st}");

    server.restart();
    put_file(&server, "pre/c.txt", b"sea\n");
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let t = std::time::Instant::now();
        loop {
            match std::fs::read(mnt.join("c.txt")) {
                Ok(d) => break assert_eq!(d, b"sea\n"),
                Err(e) => {
                    assert!(t.elapsed() < Duration::from_secs(30), "not back: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    });

    server.hang(true);
    let pid = m.daemon_pid().expect("daemon");
    let g = m.mnt.join("d/other.txt");
    let reader = std::thread::spawn(move || std::fs::read(g).map(|d| d.len()));
    std::thread::sleep(Duration::from_millis(500));
    let t0 = std::time::Instant::now();
    let st = Command::new("fusermount3")
        .arg("-uz")
        .arg(&m.mnt)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        wait_exit(pid, Duration::from_secs(10)),
        "daemon {pid} still running {:?} after its mount went away",
        t0.elapsed()
    );
    assert!(reader.join().unwrap().is_err());
    server.hang(false);
}

/// A server that stops answering (SIGSTOP) while the mount is in use: the HEAD that checks a
/// cached file's open is given up at `store.timeout` on the reader's own thread (the S3
/// store drops the request itself, `Store::keeps_call_limit`), the store is taken for hung
/// and the file is served from the cache, at once while the server stays stopped (the probe
/// asks the server: a bucket's statfs is made up); once the server answers again, a change
/// made meanwhile is seen at the next open.
#[test]
fn a_cached_file_is_served_when_the_server_stops_answering_its_check() {
    let server = S3Server::start(&["data"]);
    put_file(&server, "pre/a.txt", b"hello\n");
    std::thread::sleep(Duration::from_millis(1100)); // (a second-old object: not racy)
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount_with(&m, &server, &["store.timeout=2s"]);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("a.txt")).unwrap(), b"hello\n");
    });
    server.hang(true);
    let mnt = m.mnt.clone();
    let took = with_timeout(LIMIT, vec![mnt.clone()], move || {
        let t = std::time::Instant::now();
        assert_eq!(std::fs::read(mnt.join("a.txt")).unwrap(), b"hello\n");
        t.elapsed()
    });
    // Still stopped a few probes later: still taken for hung, and the file is served at
    // once, with no second wait for the server.
    std::thread::sleep(Duration::from_secs(3));
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("a.txt")).unwrap(), b"hello\n");
    });
    let st = stats_of(&m.mnt);
    server.hang(false);
    assert!(took < Duration::from_secs(20), "served after {took:?}");
    assert_eq!(n(&st, "backing.hung"), 1, "{st}");
    assert_eq!(n(&st, "backing.timeouts"), 1, "{st}");
    put_file(&server, "pre/a.txt", b"changed\n");
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let t = std::time::Instant::now();
        loop {
            match std::fs::read(mnt.join("a.txt")) {
                Ok(d) if d == b"changed\n" => break,
                r => {
                    assert!(t.elapsed() < Duration::from_secs(30), "still {r:?}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    });
}

/// Write-back, default options: a file grown by a write past its end, then closed, reads back
/// whole right away, while its flush and upload (and the previous one's) run in the
/// background. The read-only open used to pin the object as it was before the flush, so the
/// read showed zeros where the write was (1 round in 4 before the fix; 25 rounds here, each
/// a new file, with a random wait that lands the reopen at every stage of the upload).
#[test]
fn a_file_grown_in_write_back_reads_back_whole_during_its_upload() {
    let server = S3Server::start(&["data"]);
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount_with(&m, &server, &["writeback.mode=back", "ram.block_size=4K"]);
    let mnt = m.mnt.clone();
    let wrong = with_timeout(LIMIT, vec![mnt.clone()], move || {
        use std::os::unix::fs::FileExt;
        let mut wrong = Vec::new();
        for round in 0..25u64 {
            let p = mnt.join(format!("f{round}"));
            let old = seeded_bytes(round, 5000);
            std::fs::write(&p, &old).unwrap();
            std::thread::sleep(Duration::from_millis((round * 37) % 300));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .unwrap();
            f.write_all_at(b"fresh", 9000).unwrap();
            drop(f);
            let mut want = old;
            want.resize(9000, 0);
            want.extend_from_slice(b"fresh");
            if std::fs::read(&p).unwrap() != want {
                wrong.push(round);
            }
        }
        wrong
    });
    assert!(wrong.is_empty(), "rounds that read back wrong: {wrong:?}");
    m.unmount_and_wait();
    assert_bucket_holds(&server, "f", |round| {
        let mut want = seeded_bytes(round, 5000);
        want.resize(9000, 0);
        want.extend_from_slice(b"fresh");
        want
    });
    assert_lost_empty(&m);
}

/// Objects `pre/{prefix}0` to `pre/{prefix}24` of bucket `data` hold `want(round)`; else
/// the rounds that are wrong, each with its size.
fn assert_bucket_holds(server: &S3Server, prefix: &str, want: impl Fn(u64) -> Vec<u8>) {
    let wrong: Vec<(u64, usize)> = (0..25u64)
        .filter_map(|round| {
            let p = server.dir.path().join(format!("data/pre/{prefix}{round}"));
            let b = std::fs::read(p).unwrap();
            (b != want(round)).then_some((round, b.len()))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "(round, size) of the objects wrong in the bucket after the unmount: {wrong:?}"
    );
}

/// Nothing was taken for another writer's change: `journal/lost` holds no file.
fn assert_lost_empty(m: &BinMount) {
    let lost: Vec<_> = std::fs::read_dir(m.cache.join("journal/lost"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(lost.is_empty(), "kept in journal/lost: {lost:?}");
}

/// Write-back, default options: objects already in the bucket overwritten whole
/// (`open(O_TRUNC)`, write, close, as an editor or `cp` does), each with a random wait, land
/// in the bucket with the new contents and nothing in `journal/lost`. The truncate used to
/// wait in the descriptor's staging and be uploaded when the descriptor went away: a version
/// the data flush did not expect, so it took it for another writer's change and kept the new
/// contents in `journal/lost` (the create of a new file did the same with its empty object).
#[test]
fn files_overwritten_in_write_back_land_whole_and_nothing_is_taken_for_a_conflict() {
    let server = S3Server::start(&["data"]);
    for round in 0..25u64 {
        put_file(
            &server,
            &format!("pre/g{round}"),
            &seeded_bytes(round, 5000),
        );
    }
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    mount_with(&m, &server, &["writeback.mode=back"]);
    let mnt = m.mnt.clone();
    let wrong = with_timeout(LIMIT, vec![mnt.clone()], move || {
        let mut wrong = Vec::new();
        for round in 0..25u64 {
            let p = mnt.join(format!("g{round}"));
            // Read first, as an editor does: the old version is cached.
            assert_eq!(std::fs::read(&p).unwrap().len(), 5000);
            let new = seeded_bytes(round + 100, 3000 + round as usize);
            std::fs::write(&p, &new).unwrap();
            std::thread::sleep(Duration::from_millis((round * 37) % 300));
            if std::fs::read(&p).unwrap() != new {
                wrong.push(round);
            }
        }
        wrong
    });
    assert!(wrong.is_empty(), "rounds that read back wrong: {wrong:?}");
    m.unmount_and_wait();
    assert_bucket_holds(&server, "g", |round| {
        seeded_bytes(round + 100, 3000 + round as usize)
    });
    assert_lost_empty(&m);
}
