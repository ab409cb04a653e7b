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
    let m = BinMount::new(&["ram.max=16M"]);
    let out = std::process::Command::new("sh")
        .arg("-c")
        // `true` exits at once without reading: stats writes into a closed pipe.
        .arg(format!(
            "timeout 20 {} stats {} | true",
            tierfs_bin(),
            m.mnt.display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success());
}
