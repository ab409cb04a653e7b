//! `tierfs mount s3://BUCKET/PREFIX` over a real S3 server (versitygw, scripts/s3-server):
//! real programs read the tree; after a remount with the page cache dropped, reading it again
//! makes no GET; an object replaced behind tierfs's back is seen whole at the next open.

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
    m.mount_source(
        OsStr::new("s3://data/pre"),
        &[&format!("s3.endpoint={}", server.endpoint)],
        &[
            ("AWS_ACCESS_KEY_ID", ACCESS),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
        ],
    );
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
    // Read-only in this step: a write is EROFS at the call.
    let e = std::fs::write(m.mnt.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    m.unmount_and_wait();
}
