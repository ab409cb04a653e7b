//! After `kill -9` of the daemon its mount stays, dead (every access ENOTCONN): `tierfs
//! stats` says what happened and what to run, `tierfs unmount` detaches it, `tierfs mount`
//! onto it detaches it and mounts, and what the dead daemon had acknowledged with fsync
//! (write-back, in its journal) is on the store after the next mount. No `fusermount3`.

mod common;
use common::*;
use std::process::{Command, Output};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

fn tierfs(args: &[&std::ffi::OsStr]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", "30"])
        .arg(tierfs_bin())
        .args(args)
        .output()
        .expect("run tierfs")
}

/// `kill -9` of the daemon, and nothing else: the mount is left dead.
fn kill_only(m: &BinMount) {
    let pid = m.daemon_pid().expect("no daemon for this mount");
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_exit(pid, Duration::from_secs(20)), "daemon survived");
    let e = std::fs::metadata(&m.mnt).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
}

#[test]
fn a_dead_mount_is_detached_by_tierfs_unmount_and_by_tierfs_mount() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let opts = ["writeback.mode=back", "writeback.fsync=journal"];
    m.mount(&opts);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        let f = std::fs::File::create(mnt.join("kept")).unwrap();
        std::io::Write::write_all(&mut &f, b"acknowledged\n").unwrap();
        f.sync_all().unwrap();
    });
    kill_only(&m);

    let out = tierfs(&["stats".as_ref(), m.mnt.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("tierfs unmount"), "{err}");

    let out = tierfs(&["unmount".as_ref(), m.mnt.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("detached"), "{err}");
    assert!(!is_mounted(&m.mnt), "still mounted");

    // Mounted again (the journal replayed), killed again, and mounted over the dead mount.
    m.mount(&opts);
    kill_only(&m);
    let out = mount_command(m.backing.as_os_str(), &m.mnt, &m.cache, &opts)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("detached"), "{err}");
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("kept")).unwrap(), b"acknowledged\n");
    });
    m.unmount_and_wait();
    assert_eq!(
        std::fs::read(m.backing.join("kept")).unwrap(),
        b"acknowledged\n"
    );
}
