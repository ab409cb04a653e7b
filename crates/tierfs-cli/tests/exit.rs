//! A daemon always exits (issue 13 item 6): within 10 s of its mount going away or of
//! SIGTERM, even while calls into its store hang, keeping write-back data in the journal.
//! The one thing no process can do is leave a FUSE request its (stopped) server has already
//! read: then the daemon must have let go of its descriptors within the 10 s, and be gone the
//! moment the store answers.
//!
//! The hung store is real: a second tierfs mount whose daemon is stopped with SIGSTOP, so
//! every call into it waits, as calls into an sshfs or NFS mount do when the server is gone.

mod common;
use common::*;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(10);

/// tierfs (write-back) over `store_mnt`, with its cache dir beside it.
fn over(store_mnt: &Path) -> BinMount {
    let mut m = BinMount::unmounted_in(Path::new("/tmp"));
    m.backing = store_mnt.to_path_buf();
    m.mount(&["writeback.mode=back"]);
    m
}

/// The store hangs, a reader waits in it, a writer has data only in the journal; then the
/// mount goes away (`leave`, given the mountpoint and the daemon's pid): the daemon is gone
/// within 10 s, its log says the data stays in the journal, and a mount once the store is
/// back writes that data to it.
fn exits_while_the_store_hangs(leave: impl FnOnce(&Path, i32) + Send + 'static) {
    let store = BinMount::new(&[]);
    std::fs::write(store.backing.join("f"), vec![1u8; 1 << 20]).unwrap();
    std::fs::write(store.backing.join("g"), vec![2u8; 1 << 20]).unwrap();
    let m = over(&store.mnt);
    let pid = m.daemon_pid().expect("daemon");
    let store_pid = store.daemon_pid().expect("store daemon");
    let mnt = m.mnt.clone();
    let took = with_timeout(
        Duration::from_secs(60),
        vec![m.mnt.clone(), store.mnt.clone()],
        move || {
            let mut w = std::fs::OpenOptions::new()
                .write(true)
                .open(mnt.join("f"))
                .unwrap();
            // The first write reserves store space (a statfs of the store) for later ones;
            // its flush is over before the store stops (see the module comment).
            w.write_all(&[9u8; 4096]).unwrap();
            w.sync_all().unwrap();
            std::thread::sleep(Duration::from_millis(500));
            let stopped = Stopped::stop(store_pid);
            // Absorbed by the journal without the store.
            w.write_all(&[9u8; (64 << 10) - 4096]).unwrap();
            // A reader of data nobody has cached: waits in the hung store.
            let g = mnt.join("g");
            let reader = std::thread::spawn(move || std::fs::read(g).map(|d| d.len()));
            std::thread::sleep(Duration::from_millis(300));
            let t0 = Instant::now();
            leave(&mnt, pid);
            let exited = wait_exit(pid, LIMIT);
            assert!(
                exited || only_waits_on_the_store(pid),
                "daemon {pid} still running {:?} after its mount went away: {}",
                t0.elapsed(),
                tasks(pid)
            );
            let took = t0.elapsed();
            drop(w);
            drop(stopped);
            if !exited {
                // Everything was let go within the limit, and what held the process was the
                // kernel's wait for a request the stopped store had already taken: answered
                // now, the daemon must be gone at once, not retry or wait for anything else.
                assert!(
                    wait_exit(pid, Duration::from_secs(3)),
                    "daemon {pid} still running 3 s after its store came back: {}",
                    tasks(pid)
                );
                eprintln!(
                    "daemon let go within {took:?}; its last thread left once the store answered"
                );
            }
            // The reader got an error once the daemon was gone (not a hang).
            let r = reader.join().unwrap();
            assert!(r.is_err(), "read through a dead mount: {r:?}");
            took
        },
    );
    let log = std::fs::read_to_string(m.cache.join("tierfs.log")).unwrap();
    // The store is back: the next mount writes the journal's data to it.
    m.mount(&["writeback.mode=back"]);
    m.unmount_and_wait();
    let f = std::fs::read(store.backing.join("f")).unwrap();
    assert_eq!(
        &f[..64 << 10],
        &[9u8; 64 << 10][..],
        "the journal's write was lost; the log of the early exit: {log}"
    );
    assert!(f[64 << 10..].iter().all(|&b| b == 1));
    assert!(
        log.contains("exiting now") && log.contains("stay in the journal"),
        "the log does not say what was left: {log}"
    );
    eprintln!("daemon exited {took:?} after the mount went away");
}

#[test]
fn exits_within_10s_of_a_lazy_unmount_while_its_store_hangs() {
    exits_while_the_store_hangs(|mnt, _| {
        let st = std::process::Command::new("fusermount3")
            .arg("-uz")
            .arg(mnt)
            .status()
            .unwrap();
        assert!(st.success());
    });
}

#[test]
fn exits_within_10s_of_sigterm_while_its_store_hangs() {
    exits_while_the_store_hangs(|_, pid| {
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    });
}

/// What the kernel allows when a request was already taken by the stopped store (its reader
/// woke just before SIGSTOP): such a wait cannot be ended by any signal (fuse's
/// `request_wait_answer` waits uninterruptibly once the server has read the request), so the
/// process cannot finish exiting until the store answers. Allowed only if it has let go of
/// everything else: no descriptor left (so neither the mount nor the cache dir's lock), every
/// thread gone or waiting in that request; the caller then checks it ends as soon as the store
/// answers.
fn only_waits_on_the_store(pid: i32) -> bool {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let waiting = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .all(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X']));
            zombie
                || std::fs::read_to_string(e.path().join("wchan"))
                    .is_ok_and(|w| w.contains("request_wait_answer"))
        });
    fds == 0 && waiting
}

/// The daemon's threads: name, state and where each waits in the kernel (for a failure).
fn tasks(pid: i32) -> String {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = e.path();
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .map_or("?", |(_, r)| r.trim_start().get(..1).unwrap_or("?"));
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let wchan = std::fs::read_to_string(p.join("wchan")).unwrap_or_default();
        let stack = std::fs::read_to_string(p.join("stack")).unwrap_or_default();
        let top: Vec<&str> = stack.lines().take(4).collect();
        out.push(format!(
            "{} {state} {wchan} [{}]",
            comm.trim(),
            top.join(" < ")
        ));
    }
    out.join("; ")
}
