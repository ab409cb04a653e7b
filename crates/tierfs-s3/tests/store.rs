//! S3Store against a real S3 server (versitygw, scripts/s3-server): the namespace a bucket's
//! keys imply, ranged reads, versions by ETag, errors.

mod server;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};
use server::{S3Server, ACCESS, SECRET};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use tierfs_s3::{Credentials, S3Config, S3Store};
use tierfs_store::{Errno, FileKind, Store};

fn config(s: &S3Server, bucket: &str, prefix: &str, secret: &str) -> S3Config {
    S3Config {
        bucket: bucket.into(),
        prefix: prefix.into(),
        endpoint: Some(s.endpoint.clone()),
        region: "us-east-1".into(),
        credentials: Credentials {
            access_key_id: ACCESS.into(),
            secret_access_key: secret.into(),
            session_token: None,
            source: "test".into(),
        },
    }
}

/// Puts objects through the S3 API (another client, as another host would).
struct Putter {
    rt: tokio::runtime::Runtime,
    s3: object_store::aws::AmazonS3,
}

impl Putter {
    fn new(s: &S3Server, bucket: &str) -> Putter {
        let s3 = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_endpoint(&s.endpoint)
            .with_allow_http(true)
            .with_access_key_id(ACCESS)
            .with_secret_access_key(SECRET)
            .build()
            .unwrap();
        Putter {
            rt: tokio::runtime::Runtime::new().unwrap(),
            s3,
        }
    }

    fn get(&self, key: &str) -> Vec<u8> {
        self.rt
            .block_on(async {
                self.s3
                    .get(&Key::parse(key).unwrap())
                    .await
                    .unwrap()
                    .bytes()
                    .await
            })
            .unwrap()
            .to_vec()
    }

    fn put(&self, key: &str, data: &[u8]) {
        let p = PutPayload::from(data.to_vec());
        self.rt
            .block_on(self.s3.put(&Key::parse(key).unwrap(), p))
            .unwrap();
    }
}

fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn names(store: &S3Store, node: &tierfs_s3::S3Node) -> BTreeMap<String, (FileKind, u64)> {
    store
        .readdir_plus(node)
        .unwrap()
        .into_iter()
        .map(|(e, a)| {
            let a = a.expect("a listing gives every entry's attributes");
            (e.name.into_string().unwrap(), (a.kind, a.size))
        })
        .collect()
}

#[test]
fn a_bucket_reads_as_a_tree_and_versions_follow_the_etag() {
    let server = S3Server::start(&["data"]);
    let put = Putter::new(&server, "data");
    let big = bytes(1, 3 << 20);
    put.put("pre/a.txt", b"hello\n");
    put.put("pre/d/big.bin", &big);
    put.put("pre/d/e/deep", b"deep");
    put.put("pre/d/e/other", b"");
    put.put("outside", b"not under the prefix");
    let store = S3Store::open(config(&server, "data", "pre", SECRET)).unwrap();

    let (root, rattr) = store.root().unwrap();
    assert_eq!(rattr.kind, FileKind::Dir);
    let top = names(&store, &root);
    assert_eq!(
        top,
        BTreeMap::from([
            ("a.txt".into(), (FileKind::File, 6)),
            ("d".into(), (FileKind::Dir, 4096))
        ])
    );
    let (d, da) = store.lookup(&root, OsStr::new("d")).unwrap();
    assert_eq!(da.kind, FileKind::Dir);
    assert_eq!(
        names(&store, &d),
        BTreeMap::from([
            ("big.bin".into(), (FileKind::File, big.len() as u64)),
            ("e".into(), (FileKind::Dir, 4096))
        ])
    );
    assert_eq!(
        store.lookup(&root, OsStr::new("nothing")).unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(
        store.lookup(&root, OsStr::new("outside")).unwrap_err(),
        Errno::ENOENT
    );

    // Ranged reads, short at the end only.
    let (f, fa) = store.lookup(&d, OsStr::new("big.bin")).unwrap();
    assert_eq!(fa.size, big.len() as u64);
    let h = store.open(&f, libc::O_RDONLY).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for off in [0usize, 12345, (3 << 20) - 100] {
        let n = store.read(&h, off as u64, &mut buf).unwrap();
        assert_eq!(n, (big.len() - off).min(buf.len()));
        assert!(buf[..n] == big[off..off + n], "bytes at {off}");
    }
    assert_eq!(store.read(&h, big.len() as u64, &mut buf).unwrap(), 0);

    // Overwritten behind our back with the same size: a new fingerprint (ETag), and the
    // handle opened at the old version reads nothing of the new one: the first MiB its
    // open fetched is the old version's, past it ESTALE.
    let v2 = bytes(2, big.len());
    put.put("pre/d/big.bin", &v2);
    let fa2 = store.getattr(&f).unwrap();
    assert_eq!(fa2.size, fa.size);
    assert_ne!(fa2.fingerprint(), fa.fingerprint());
    let n = store.read(&h, 0, &mut buf[..4096]).unwrap();
    assert!(buf[..n] == big[..n], "the version the handle opened");
    assert_eq!(
        store.read(&h, 2 << 20, &mut buf).unwrap_err(),
        Errno::ESTALE
    );
    let h2 = store.open(&f, libc::O_RDONLY).unwrap();
    let n = store.read(&h2, 0, &mut buf).unwrap();
    assert!(buf[..n] == v2[..n]);

    // Writes are staged, seen by every handle of the key, and in the bucket at fsync.
    let local = tempfile::tempdir().unwrap();
    store
        .set_local_dirs(local.path().join("staging"), local.path().join("lost"))
        .unwrap();
    let w = store.open(&f, libc::O_WRONLY).unwrap();
    store.write(&w, 10, b"hello").unwrap();
    let r = store.open(&f, libc::O_RDONLY).unwrap();
    let n = store.read(&r, 0, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    assert_eq!(&buf[10..15], b"hello");
    assert_eq!(put.get("pre/d/big.bin"), v2, "uploaded before fsync");
    store.fsync(&w, false).unwrap();
    let mut v3 = v2.clone();
    v3[10..15].copy_from_slice(b"hello");
    assert_eq!(put.get("pre/d/big.bin"), v3);

    // Replaced behind our back while we wrote: the upload is refused (ESTALE), the other
    // writer's object stays, ours is kept in the lost directory.
    store.write(&w, 20, b"ours").unwrap();
    put.put("pre/d/big.bin", &v2);
    assert_eq!(store.fsync(&w, false).unwrap_err(), Errno(libc::ESTALE));
    assert_eq!(put.get("pre/d/big.bin"), v2);
    let kept: Vec<_> = std::fs::read_dir(local.path().join("lost"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().ends_with(".txt"))
        .collect();
    assert_eq!(kept.len(), 1);
    let mut ours = v3;
    ours[20..24].copy_from_slice(b"ours");
    assert!(std::fs::read(&kept[0]).unwrap() == ours);

    // mkdir makes a `dir/` marker; rmdir of a non-empty directory is ENOTEMPTY.
    let (e, _) = store
        .mkdir(&root, OsStr::new("empty"), 0o755, None)
        .unwrap();
    assert!(names(&store, &root).contains_key("empty"));
    assert!(names(&store, &e).is_empty());
    assert_eq!(
        store.rmdir(&root, OsStr::new("d")).unwrap_err(),
        Errno(libc::ENOTEMPTY)
    );
    store.rmdir(&root, OsStr::new("empty")).unwrap();
    assert!(!names(&store, &root).contains_key("empty"));
}

#[test]
fn wrong_credentials_or_bucket_are_one_clear_error() {
    let server = S3Server::start(&["data"]);
    let e = S3Store::open(config(&server, "data", "", "wrong"))
        .err()
        .unwrap();
    assert!(
        e.contains("s3://data") && e.contains("refused the credentials"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    let e = S3Store::open(config(&server, "nobucket", "", SECRET))
        .err()
        .unwrap();
    assert!(e.contains("no such bucket"), "{e}");
}

/// The store over `pre/` of `server` with its local directories, its root and `pre/f`.
fn store_with_f(
    server: &S3Server,
) -> (
    S3Store,
    tempfile::TempDir,
    tierfs_s3::S3Node,
    tierfs_s3::S3Node,
) {
    let store = S3Store::open(config(server, "data", "pre", SECRET)).unwrap();
    let local = tempfile::tempdir().unwrap();
    store
        .set_local_dirs(local.path().join("staging"), local.path().join("lost"))
        .unwrap();
    let (root, _) = store.root().unwrap();
    let (f, _) = store.lookup(&root, OsStr::new("f")).unwrap();
    (store, local, root, f)
}

/// Up to 64 KiB read through `h` from offset 0.
fn read_all(store: &S3Store, h: &tierfs_s3::S3Handle) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; 1 << 16];
    store.read(h, 0, &mut buf).map(|n| buf[..n].to_vec())
}

/// A read handle is pinned to its version (If-Match), but a version our own upload made of
/// it is followed, as a local descriptor sees writes made through another: its attributes
/// and reads show our writes, never the object from before them (tierfs took that for a
/// change behind its back and served zeros where a write-back flush had just put data).
/// A version someone else made is never followed.
#[test]
fn a_read_handle_follows_our_own_uploads_and_no_one_elses() {
    let server = S3Server::start(&["data"]);
    let put = Putter::new(&server, "data");
    let old = bytes(3, 5000);
    put.put("pre/f", &old);
    let (store, _local, _root, f) = store_with_f(&server);
    let all = |h: &tierfs_s3::S3Handle| read_all(&store, h);

    // Opened before our writes; they are uploaded and their staging is gone.
    let r = store.open(&f, libc::O_RDONLY).unwrap();
    let w = store.open(&f, libc::O_WRONLY).unwrap();
    store.write(&w, 9000, b"fresh").unwrap();
    store.fsync(&w, false).unwrap();
    drop(w);
    let mut want = old.clone();
    want.resize(9000, 0);
    want.extend_from_slice(b"fresh");
    assert_eq!(store.fstat(&r).unwrap().size, 9005);
    assert!(all(&r).unwrap() == want, "the handle shows our upload");

    // Opened while our writes were staged, read after they were uploaded.
    let w = store.open(&f, libc::O_WRONLY).unwrap();
    store.write(&w, 9005, b"more").unwrap();
    let r2 = store.open(&f, libc::O_RDONLY).unwrap();
    store.fsync(&w, false).unwrap();
    drop(w);
    want.extend_from_slice(b"more");
    for h in [&r, &r2] {
        assert_eq!(store.fstat(h).unwrap().size, want.len() as u64);
        assert!(all(h).unwrap() == want);
    }
    assert_eq!(put.get("pre/f"), want);

    // Replaced by another writer: a handle reads its own version or nothing (ESTALE), never
    // theirs; new writes are made on theirs, not on the version a reader still holds.
    put.put("pre/f", b"theirs");
    assert!(all(&r2).unwrap() == want, "r2 holds our version");
    let r_new = store.open(&f, libc::O_RDONLY).unwrap();
    assert_eq!(all(&r_new).unwrap(), b"theirs", "not the staging r2 holds");
    assert_eq!(store.fstat(&r_new).unwrap().size, 6);
    let w = store.open(&f, libc::O_WRONLY).unwrap();
    store.write(&w, 6, b"+ours").unwrap();
    store.fsync(&w, false).unwrap();
    drop(w);
    assert_eq!(put.get("pre/f"), b"theirs+ours");
    drop(r2);
    assert_eq!(all(&r).unwrap_err(), Errno::ESTALE);
    let r3 = store.open(&f, libc::O_RDONLY).unwrap();
    assert_eq!(all(&r3).unwrap(), b"theirs+ours");
}

/// What a staging held by a reader must not do: take the writes of a name made again after
/// an unlink (they were never uploaded), or make a handle follow one of our old uploads
/// because someone else put back the bytes it had replaced (ETags are content hashes).
#[test]
fn a_reader_keeps_no_old_name_or_old_version_alive() {
    let server = S3Server::start(&["data"]);
    let put = Putter::new(&server, "data");
    put.put("pre/f", b"aaa");
    let (store, _local, root, f) = store_with_f(&server);
    let all = |h: &tierfs_s3::S3Handle| read_all(&store, h);

    // Unlinked while a reader holds its staged writes, then made again: the new writes
    // reach the bucket.
    let w = store.open(&f, libc::O_WRONLY).unwrap();
    store.write(&w, 0, b"old").unwrap();
    let r = store.open(&f, libc::O_RDONLY).unwrap();
    assert_eq!(store.write(&r, 0, b"x").unwrap_err(), Errno::EBADF);
    drop(w);
    store.unlink(&root, OsStr::new("f")).unwrap();
    let (f, _, w) = store
        .create(&root, OsStr::new("f"), 0o644, libc::O_WRONLY, None)
        .unwrap();
    store.write(&w, 0, b"new").unwrap();
    store.fsync(&w, false).unwrap();
    drop(w);
    assert_eq!(put.get("pre/f"), b"new");
    drop(r);

    // Ours replaced "new" with "bbb"; someone else puts "new" back (the same ETag as before
    // our upload): a handle opened on theirs reads theirs.
    let w = store.open(&f, libc::O_WRONLY).unwrap();
    store.write(&w, 0, b"bbb").unwrap();
    store.fsync(&w, false).unwrap();
    drop(w);
    put.put("pre/f", b"new");
    let r = store.open(&f, libc::O_RDONLY).unwrap();
    assert_eq!(all(&r).unwrap(), b"new");
    assert_eq!(store.fstat(&r).unwrap().size, 3);
}

/// Waits until the server's access log holds everything it answered before this call (a GET
/// of a sentinel object, once logged, comes after them).
fn log_settled(server: &S3Server, put: &Putter) {
    put.put("pre/.sentinel", b"s");
    let n = server.requests("s3_GetObject", "pre/.sentinel");
    put.get("pre/.sentinel");
    let t = std::time::Instant::now();
    while server.requests("s3_GetObject", "pre/.sentinel") <= n {
        assert!(
            t.elapsed().as_secs() < 10,
            "the access log did not show the sentinel"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A handle read in order takes its reads from one GET of the rest of the object (see
/// `stream`), not a GET per read: the open's GET (the first MiB), a ranged GET for the rest
/// of the first read (a file read at its start only gets no stream), one stream from the
/// second read on, and a ranged GET for a read elsewhere, which does not end the stream.
/// Every byte is the object's.
/// Replaced by another writer mid-stream, a handle reads its own version or ESTALE, never
/// bytes of the new one.
#[test]
fn a_handle_read_in_order_streams_one_get() {
    let server = S3Server::start(&["data"]);
    let put = Putter::new(&server, "data");
    let size = (20 << 20) + 12_345;
    let data = bytes(7, size);
    put.put("pre/f", &data);
    let (store, _local, _root, f) = store_with_f(&server);
    let step = 4 << 20;

    let h = store.open(&f, libc::O_RDONLY).unwrap();
    let mut got = Vec::new();
    while got.len() < size {
        if got.len() == 8 << 20 {
            let b = store.read_bytes(&h, 2 << 20, 4096).unwrap();
            assert!(
                b[..] == data[2 << 20..(2 << 20) + 4096],
                "the read elsewhere"
            );
        }
        let b = store.read_bytes(&h, got.len() as u64, step).unwrap();
        assert!(!b.is_empty(), "short at {}", got.len());
        got.extend_from_slice(&b);
    }
    assert!(got == data, "the bytes read in order are the object's");
    log_settled(&server, &put);
    assert_eq!(
        server.requests("s3_GetObject", "pre/f"),
        4,
        "the open's GET, the first read's, one stream, the read elsewhere"
    );
    drop(h);

    let h = store.open(&f, libc::O_RDONLY).unwrap();
    let first = store.read_bytes(&h, 0, step).unwrap();
    assert!(first[..] == data[..step]);
    let new = bytes(8, size);
    put.put("pre/f", &new);
    let mut at = step;
    while at < size {
        match store.read_bytes(&h, at as u64, step) {
            Ok(b) => {
                assert!(
                    b[..] == data[at..at + b.len()],
                    "bytes not of the handle's version at {at}"
                );
                at += b.len();
            }
            Err(e) => {
                assert_eq!(e, Errno::ESTALE);
                break;
            }
        }
    }
}

/// Waits until the server has answered at least `n` UploadPart requests for `key`; their
/// count then.
fn parts_up(server: &S3Server, key: &str, n: usize) -> usize {
    let t = std::time::Instant::now();
    loop {
        let got = server.requests("s3_UploadPart", key);
        if got >= n || t.elapsed().as_secs() >= 20 {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `f` opened with O_TRUNC and `data` written through it in order, 1 MiB at a time.
fn write_anew(store: &S3Store, f: &tierfs_s3::S3Node, data: &[u8]) -> tierfs_s3::S3Handle {
    let w = store.open(f, libc::O_WRONLY | libc::O_TRUNC).unwrap();
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        store.write(&w, (i << 20) as u64, piece).unwrap();
    }
    w
}

/// A large object's parts go to the bucket while it is still written (see `ahead`): once the
/// writer is past a part, not at fsync. A part rewritten after it went up is uploaded again;
/// one a truncate cut is not used; a file that ends small enough for one PUT aborts the
/// multipart upload, and so does unlinking a file whose parts went up. The bucket holds
/// exactly what was written each time.
#[test]
fn a_large_object_s_parts_go_up_while_it_is_written() {
    let server = S3Server::start(&["data"]);
    let put = Putter::new(&server, "data");
    put.put("pre/f", b"old");
    let (store, _local, root, f) = store_with_f(&server);
    let mib = 1 << 20;
    store.set_upload(5 * mib as u64, 4);

    // 23 MiB and a bit, in 1 MiB writes: parts 0-3 (0-20 MiB) lie wholly below the last
    // byte written and go up before the fsync.
    let mut want = bytes(9, 23 * mib + 777);
    let w = write_anew(&store, &f, &want);
    assert_eq!(
        parts_up(&server, "pre/f", 4),
        4,
        "parts 0-3 up before the fsync"
    );
    // Part 0 again, after it went up.
    store.write(&w, 100, b"REWRITTEN").unwrap();
    want[100..109].copy_from_slice(b"REWRITTEN");
    store.fsync(&w, false).unwrap();
    assert!(put.get("pre/f") == want, "the object is what was written");
    log_settled(&server, &put);
    assert_eq!(
        server.requests("s3_UploadPart", "pre/f"),
        6,
        "4 ahead, then part 0 (rewritten) and part 4 (the last) at fsync"
    );
    drop(w);

    // Grown past two parts, then cut to 3 MiB: one PUT, the multipart upload aborted.
    let big = bytes(10, 12 * mib);
    let w = write_anew(&store, &f, &big);
    assert_eq!(parts_up(&server, "pre/f", 8), 8, "parts 0-1 up");
    let set = tierfs_store::SetAttr {
        size: Some(3 * mib as u64),
        ..Default::default()
    };
    store.setattr(&f, Some(&w), &set).unwrap();
    store.fsync(&w, false).unwrap();
    assert!(
        put.get("pre/f") == big[..3 * mib],
        "the object is the cut one"
    );
    log_settled(&server, &put);
    assert_eq!(
        server.requests("s3_AbortMultipartUpload", "pre/f"),
        1,
        "the parts of the longer file are not kept"
    );
    drop(w);

    // Written past two parts, then unlinked before any fsync: its parts are not kept.
    let w = write_anew(&store, &f, &big);
    assert_eq!(parts_up(&server, "pre/f", 10), 10, "parts 0-1 up");
    store.unlink(&root, OsStr::new("f")).unwrap();
    drop(w);
    let t = std::time::Instant::now();
    while server.requests("s3_AbortMultipartUpload", "pre/f") < 2 {
        assert!(
            t.elapsed().as_secs() < 20,
            "the unlinked file's parts were kept"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
