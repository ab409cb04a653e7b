//! tierfs over a real network filesystem client: sshfs to an sshd on this machine
//! (`common::sshfs`), with `tierfs mount`'s default options (tierfs sees `fuse.sshfs` and takes
//! path identities). What an emulator or FaultStore's renumbering did not show: `git clone`
//! onto such a mount failed with ESTALE at its first pack (fixed in 9186b45), in both write
//! modes.

mod common;
use common::git::{check_clone, source_repo};
use common::sshfs::Sshfs;
use common::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(240);

use common::run_in as run;

/// `git clone --no-local` onto tierfs over sshfs, write-through and write-back (default
/// options otherwise): the clone is whole through the mount, and on the server once tierfs
/// is unmounted. Before 9186b45 each failed at its first pack: git links the temporary pack
/// to its final name and unlinks the temporary one, and the new name's node was the old
/// name's, which sshfs reports with no link left. Also that pattern alone, read back.
#[test]
fn git_clone_onto_tierfs_over_sshfs_is_whole_in_both_write_modes() {
    let mut store = Sshfs::start();
    let repo = source_repo();
    for mode in ["through", "back"] {
        let m = BinMount::unmounted_in(Path::new("/var/tmp"));
        let opt = format!("writeback.mode={mode}");
        m.mount_source(store.mnt.as_os_str(), &[&opt], &[]);
        let mnt = m.mnt.clone();
        let from = repo.path().to_str().unwrap().to_string();
        let name = format!("clone-{mode}");
        let sshfs_mnt = store.mnt.clone();
        with_timeout(LIMIT, vec![mnt.clone()], move || {
            // sshfs makes no FIFO (SFTP has no mknod): through tierfs the call says so, with
            // sshfs's own errno, every time, in both modes (a deferred mknod would have
            // failed at flush instead: `ns_mknod`).
            let alone = mkfifo(&sshfs_mnt.join("fifo-alone")).unwrap_err();
            for _ in 0..2 {
                let e = mkfifo(&mnt.join("fifo")).unwrap_err();
                assert_eq!(e.raw_os_error(), alone.raw_os_error(), "{mode}: {e}");
                assert!(
                    std::fs::symlink_metadata(mnt.join("fifo")).is_err(),
                    "{mode}"
                );
            }
            let data = seeded_bytes(99, 300_000);
            std::fs::write(mnt.join("tmp_pack"), &data).unwrap();
            std::fs::hard_link(mnt.join("tmp_pack"), mnt.join("pack")).unwrap();
            std::fs::remove_file(mnt.join("tmp_pack")).unwrap();
            assert_eq!(std::fs::read(mnt.join("pack")).unwrap(), data, "{mode}");
            std::fs::remove_file(mnt.join("pack")).unwrap();
            run(&mnt, "git", &["clone", "-q", "--no-local", &from, &name]);
            check_clone(&mnt.join(&name));
        });
        m.unmount_and_wait();
        // On the server, as another client sees it (sshfs's caches dropped first).
        store.unmount();
        check_clone(&store.served.join(format!("clone-{mode}")));
        assert!(!store.served.join("pack").exists());
        store.mount();
    }
}

fn mkfifo(p: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o644) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

const FILES: [(&str, usize); 3] = [("a", 3 << 20), ("d/b", 300 << 10), ("d/e/c", 70 << 10)];

fn read_all(mnt: &Path) {
    for (i, (name, len)) in FILES.iter().enumerate() {
        let got = std::fs::read(mnt.join(name)).unwrap();
        assert!(got == seeded_bytes(i as u64, *len), "{name} differs");
    }
}

/// Over sshfs with default options: files read once are served from the RAM tier after the
/// kernel forgets them (sshfs then gives them new inode numbers), and from the SSD tier after
/// tierfs and sshfs are both remounted (a new device number too), with no byte read from
/// the store either time.
#[test]
fn files_read_once_over_sshfs_come_from_ram_after_a_forget_and_from_ssd_after_remounts() {
    let mut store = Sshfs::start();
    for (i, (name, len)) in FILES.iter().enumerate() {
        let p = store.served.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, seeded_bytes(i as u64, *len)).unwrap();
    }
    // Older than the racy window (a file changed within it is not cached for long).
    std::thread::sleep(tierfs_fs::RACY_WINDOW + Duration::from_millis(200));
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    m.mount_source(store.mnt.as_os_str(), &[], &[]);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        read_all(&mnt);
        let st = stats_of(&mnt);
        let fetched = n(&st, "backing.read_bytes");
        assert!(fetched >= 3 << 20, "{st}");
        drop_caches();
        std::thread::sleep(Duration::from_millis(300));
        read_all(&mnt);
        let st = stats_of(&mnt);
        assert_eq!(n(&st, "backing.read_bytes"), fetched, "read again: {st}");
        assert!(n(&st, "file_states") <= FILES.len() as u64, "{st}");
    });
    // Unmounted, the daemon writes the SSD tier out; then sshfs comes back as a new mount.
    m.unmount_and_wait();
    store.unmount();
    store.mount();
    m.mount_source(store.mnt.as_os_str(), &[], &[]);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        drop_caches();
        read_all(&mnt);
        let st = stats_of(&mnt);
        assert_eq!(n(&st, "backing.read_bytes"), 0, "after the remounts: {st}");
        assert!(n(&st, "ssd.hits") > 0, "{st}");
    });
    m.unmount_and_wait();
}

/// A walk that looks names up one by one in a directory nobody listed (`git status`'s
/// `lstat` of every tracked file) gets the directory listed once its lookups have cost what
/// the listing would (`namespace/walk_lists.rs`): `stat` of 2,000 files by name, in order,
/// through tierfs over sshfs, lists the directory once and asks the store by name for
/// fewer than 1,500 of them, and every answer is the file's own size. (The rule weighs time:
/// a local sshfs lookup costs 100 us or more, and the listing is estimated at ~95 ms here,
/// so it comes within the first ~950 names; 345 here.)
#[test]
fn a_walk_by_name_in_a_directory_nobody_listed_lists_it_once() {
    const FILES: usize = 2_000;
    let store = Sshfs::start();
    let dir = store.served.join("walk");
    std::fs::create_dir(&dir).unwrap();
    for k in 0..FILES {
        std::fs::write(dir.join(format!("f{k:04}")), vec![b'x'; k % 97]).unwrap();
    }
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    // Listings with attributes, as `store.names_first=auto` picks over sshfs on an idle
    // machine (a stat after a listing answered from sshfs's cache); under the suite's load
    // it can pick names first, where the rule is off (a names listing is cheap, stats come
    // by kind): the run then shows 0 listings.
    m.mount_source(store.mnt.as_os_str(), &["store.names_first=off"], &[]);
    let mnt = m.mnt.clone();
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        // The directory itself is known (looked up), never listed.
        assert!(std::fs::metadata(mnt.join("walk")).unwrap().is_dir());
        let before = stats_of(&mnt);
        for k in 0..FILES {
            let md = std::fs::symlink_metadata(mnt.join(format!("walk/f{k:04}"))).unwrap();
            assert_eq!(md.len(), (k % 97) as u64, "f{k:04}");
        }
        let after = stats_of(&mnt);
        let d = |k: &str| n(&after, k) - n(&before, k);
        let (lookups, listings) = (d("backing.lookup"), d("meta_listings"));
        eprintln!("{lookups} lookups, {listings} listings for {FILES} stats by name");
        assert_eq!(listings, 1, "the directory listed {listings} times");
        // The listing's own stats count as lookups, one per entry: the rest were by name.
        let by_name = lookups.saturating_sub(FILES as u64);
        assert!(
            by_name < 1_500,
            "{by_name} store lookups by name for {FILES} stats ({lookups} in all)"
        );
    });
    m.unmount_and_wait();
}
