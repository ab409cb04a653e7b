//! kill -9 at random moments: a child process (this test binary, re-run on one ignored test)
//! writes and checkpoints without pause; the parent kills it and reopens the directory.

use super::*;
use std::process::Command;

const ENV: &str = "TIERFS_SSD_CRASH_DIR";

fn crash_cfg() -> SsdConfig {
    SsdConfig {
        flush_interval: Duration::from_millis(5),
        checkpoint_interval: Duration::from_millis(30),
        max_size: 4 << 20,
        ..cfg()
    }
}

fn len_of(i: u64) -> usize {
    1000 + (i * 7919 % 20000) as usize
}

/// The writer side of `survives_kill_9`; does nothing unless started by it.
#[test]
#[ignore]
fn crash_child() {
    let Some(dir) = std::env::var_os(ENV) else {
        return;
    };
    let c = open(Path::new(&dir), crash_cfg());
    let mut i = 0u64;
    loop {
        // Versions move on, so stale entries exist too; reads mark entries hit (reinsertion).
        let v = 1 + i / 300;
        let k = i % 300;
        c.offer(key(k), v, data(k, v, len_of(k)));
        if i.is_multiple_of(7) {
            c.get(&key((i * 13) % 300), v);
        }
        if i.is_multiple_of(97) {
            c.remove(&key(i % 300));
        }
        i += 1;
        if i.is_multiple_of(50) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn survives_kill_9() {
    let d = tmpdir();
    let exe = std::env::current_exe().unwrap();
    for (round, ms) in [150u64, 420, 60, 900, 333].into_iter().enumerate() {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "ssd::tests::crash::crash_child",
                "--ignored",
                "--nocapture",
            ])
            .env(ENV, d.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn child");
        std::thread::sleep(Duration::from_millis(ms));
        child.kill().expect("kill -9");
        child.wait().unwrap();
        let c = SsdCache::open(d.path(), &ident(), crash_cfg(), false)
            .unwrap_or_else(|e| panic!("round {round}: open after kill -9: {e}"));
        let mut served = 0;
        for k in 0..300 {
            // Ask for the version stored (asking for another would drop it as stale).
            let Some(v) = c.sh.index.lookup(&key(k), false).map(|l| l.version) else {
                continue;
            };
            if let Some(b) = c.get(&key(k), v) {
                assert_eq!(b, data(k, v, len_of(k)), "round {round}: entry {k} v{v}");
                served += 1;
            }
        }
        assert_eq!(c.stats().checksum_errors, 0, "round {round}");
        assert!(served > 0 || round == 0, "round {round}: nothing survived");
    }
}
