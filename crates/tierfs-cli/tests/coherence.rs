//! Close-to-open with default options on the POSIX stores (a local directory; sshfs, a real
//! network filesystem client): every open sees a change made on the store before it, in
//! rounds of changes faster than the attribute cache's trust runs out, and a warm open of a
//! cached file costs at most one store request (`common::cto`). The S3 store's run of the
//! same check is in `s3.rs`.

mod common;
use common::cto::every_open_sees_the_change;
use common::sshfs::Sshfs;
use common::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(180);

/// At most this many store requests per warm open (close-to-open needs one).
const PER_OPEN: f64 = 1.1;

#[test]
fn every_open_sees_a_change_made_on_a_local_store_in_one_request() {
    let m = BinMount::new(&[]);
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        std::fs::create_dir(backing.join("d")).unwrap();
        let write = |name: &str, data: &[u8]| std::fs::write(backing.join(name), data).unwrap();
        let per_open = every_open_sees_the_change(&mnt, "d", 50, 5, &write);
        assert!(
            per_open <= PER_OPEN,
            "{per_open} store requests per warm open"
        );
    });
}

/// The same over sshfs, changed through the sshfs mount itself: a second client of the same
/// server (sshfs keeps what it was told for 20 s, so a change made on the server's disk
/// behind sshfs would not even reach sshfs's own readers at once).
#[test]
fn every_open_sees_a_change_made_through_sshfs_in_one_request() {
    let store = Sshfs::start();
    let m = BinMount::unmounted_in(Path::new("/var/tmp"));
    m.mount_source(store.mnt.as_os_str(), &[], &[]);
    let (mnt, sshfs) = (m.mnt.clone(), store.mnt.clone());
    with_timeout(LIMIT, vec![mnt.clone()], move || {
        std::fs::create_dir(sshfs.join("d")).unwrap();
        let write = |name: &str, data: &[u8]| std::fs::write(sshfs.join(name), data).unwrap();
        let per_open = every_open_sees_the_change(&mnt, "d", 30, 4, &write);
        assert!(
            per_open <= PER_OPEN,
            "{per_open} store requests per warm open"
        );
    });
    drop(m);
    drop(store);
}
