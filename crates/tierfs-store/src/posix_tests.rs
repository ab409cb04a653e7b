use super::*;

#[test]
fn symlink_is_not_followed_out_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/etc", dir.path().join("escape")).unwrap();
    let store = PosixStore::open(dir.path()).unwrap();
    let (root, _) = store.root().unwrap();
    let (node, attr) = store.lookup(&root, OsStr::new("escape")).unwrap();
    assert_eq!(attr.kind, crate::FileKind::Symlink);
    assert_eq!(store.readlink(&node).unwrap(), OsString::from("/etc"));
    // Resolving a name through the symlink is refused: it is not a directory to us.
    assert_eq!(
        store.lookup(&node, OsStr::new("passwd")).unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(store.open(&node, libc::O_RDONLY).unwrap_err(), Errno::ELOOP);
    assert!(store.readdir(&node).is_err());
}

/// Run in a child process (the descriptor limit is the whole process's): with room for
/// exactly one more descriptor, each create makes its object and then cannot open the
/// object's node (EMFILE). Then nothing may be left at the name, or the retry finds EEXIST.
#[test]
fn a_create_that_fails_halfway_leaves_nothing() {
    const CHILD: &str = "TIERFS_EMFILE_CHILD";
    if let Some(dir) = std::env::var_os(CHILD) {
        let store = PosixStore::open(std::path::Path::new(&dir)).unwrap();
        let (root, _) = store.root().unwrap();
        let mut was = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut was) }, 0);
        let lim = libc::rlimit {
            rlim_cur: 256.min(was.rlim_cur),
            rlim_max: was.rlim_max,
        };
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
        // Every descriptor taken, then as many given back as the step before the node
        // needs: one for create (its open file), none for the others.
        let mut fill = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            fill.push(f);
        }
        fill.pop();
        let f = libc::O_WRONLY | libc::O_EXCL;
        let mut made = vec![store.create(&root, OsStr::new("f"), 0o644, f, None).err()];
        fill.push(std::fs::File::open("/dev/null").unwrap());
        made.extend([
            store.mkdir(&root, OsStr::new("d"), 0o755, None).err(),
            store
                .symlink(&root, OsStr::new("s"), OsStr::new("t"), None)
                .err(),
            store
                .mknod(&root, OsStr::new("n"), libc::S_IFIFO | 0o644, 0, None)
                .err(),
        ]);
        drop(fill);
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &was) }, 0);
        assert_eq!(made, [Some(Errno(libc::EMFILE)); 4]);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "posix::tests::a_create_that_fails_halfway_leaves_nothing",
        ])
        .env(CHILD, dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

#[test]
fn dot_dot_and_slashes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = PosixStore::open(dir.path()).unwrap();
    let (root, _) = store.root().unwrap();
    for bad in ["..", ".", "a/b", "../etc", ""] {
        assert_eq!(
            store.lookup(&root, OsStr::new(bad)).unwrap_err(),
            Errno::EINVAL,
            "{bad}"
        );
    }
}

#[test]
fn node_survives_rename() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), b"hello").unwrap();
    let store = PosixStore::open(dir.path()).unwrap();
    let (root, _) = store.root().unwrap();
    let (node, a1) = store.lookup(&root, OsStr::new("a")).unwrap();
    store
        .rename(&root, OsStr::new("a"), &root, OsStr::new("b"), 0)
        .unwrap();
    let h = store.open(&node, libc::O_RDONLY).unwrap();
    let mut buf = [0u8; 5];
    assert_eq!(store.read(&h, 0, &mut buf).unwrap(), 5);
    assert_eq!(&buf, b"hello");
    assert_eq!(store.getattr(&node).unwrap().ino, a1.ino);
}

/// The many-at-a-time path of a listing's stats gives what the one-by-one path gives.
#[test]
fn parallel_listing_stats_match_serial_ones() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..300 {
        std::fs::write(dir.path().join(format!("f{i}")), vec![0u8; i]).unwrap();
    }
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let serial = PosixStore::open(dir.path()).unwrap();
    let mut parallel = PosixStore::open(dir.path()).unwrap();
    parallel.stat_fanout = StatFanout::new(crate::STAT_CONCURRENCY, std::time::Duration::ZERO);
    let list = |s: &PosixStore| {
        let (root, _) = s.root().unwrap();
        let mut v: Vec<_> = s
            .readdir_plus(&root)
            .unwrap()
            .into_iter()
            .map(|(e, a)| (e.name, e.kind, a.map(|a| (a.ino, a.size, a.kind))))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let (a, b) = (list(&serial), list(&parallel));
    assert_eq!(a.len(), 301);
    assert!(a.iter().all(|(_, _, attr)| attr.is_some()));
    assert_eq!(a, b);
}

#[test]
fn store_id_is_stable_and_readable() {
    let id = store_id_for(Path::new("/mnt/nfs/data"));
    assert!(id.starts_with("mnt-nfs-data-"), "{id}");
    assert_eq!(id, store_id_for(Path::new("/mnt/nfs/data")));
    assert_ne!(id, store_id_for(Path::new("/mnt/nfs/dat")));
}
