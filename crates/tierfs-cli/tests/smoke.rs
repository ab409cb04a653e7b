mod common;
use common::*;
use std::time::Duration;

#[test]
fn mount_read_write_stats_unmount() {
    let m = BinMount::new(&["ram.max=64M"]);
    std::fs::write(m.backing.join("hello"), b"hello world").unwrap();
    let mnt = m.mnt.clone();
    let backing = m.backing.clone();
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("hello")).unwrap(), b"hello world");
        std::fs::write(mnt.join("new"), b"through tierfs").unwrap();
        assert_eq!(
            std::fs::read(backing.join("new")).unwrap(),
            b"through tierfs"
        );
    });
    let st = m.stats();
    assert!(st["backing"]["read"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(st["write_bytes"].as_u64().unwrap(), 14);
    m.unmount();
    assert!(!is_mounted(&m.mnt));
}

#[test]
fn fault_mount_serves_reads() {
    let m = FaultMount::new(tierfs_fs::FsConfig::default(), |b| {
        std::fs::write(b.join("f"), b"abc").unwrap();
    });
    let mnt = m.mnt.clone();
    with_timeout(Duration::from_secs(30), vec![mnt.clone()], move || {
        assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"abc");
    });
}

#[test]
fn stats_into_a_closed_pipe_does_not_panic() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    let m = BinMount::new(&["ram.max=16M"]);
    // A pipe whose reading end is closed before stats writes: every write gets EPIPE (a
    // `| true` in a shell races with stats' first write, and its status is `true`'s).
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    let out = std::process::Command::new("timeout")
        .args(["20", tierfs_bin(), "stats"])
        .arg(&m.mnt)
        .stdout(std::process::Stdio::from(w))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Like any Unix filter: ended by SIGPIPE (timeout passes the signal on as 128 + 13), or
    // a quiet exit 0; a panic would be 101.
    let sigpipe = out.status.signal() == Some(libc::SIGPIPE)
        || out.status.code() == Some(128 + libc::SIGPIPE);
    assert!(
        sigpipe || out.status.success(),
        "tierfs stats into a closed pipe: {} {stderr}",
        out.status
    );
}
