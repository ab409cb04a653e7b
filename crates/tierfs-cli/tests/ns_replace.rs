//! Namespace write-back of renames of new files over files of the store
//! (`writeback/namespace/ns_replace.rs`): `rsync`'s and an editor's save is acknowledged before the
//! store has it, and applied in its turn, the new file's data before the rename.

mod common;

use common::*;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// The flusher held (it applies what waits for it, at an fsync), listings trusted for the
/// default `meta.ttl` only: the directory is never listed, so the rename asks the store what
/// the name holds, as `rsync` has it (it stats each name, it lists nothing).
const HELD: &[&str] = &[
    "writeback.mode=back",
    "writeback.namespace_delay=1h",
    "writeback.namespace_quiet=1h",
];

/// `rsync`'s way: `.name.tmp` made, written, its mode set, renamed over `name`.
fn save(dir: &Path, name: &str, data: &[u8]) {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = File::create_new(&tmp).unwrap();
    f.write_all(data).unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o640))
        .unwrap();
    drop(f);
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// Renames of new files over files of the store return before the store has them: the mount
/// shows the new files under the names at once (and no temporary names), the store keeps
/// the old ones until `fsync(dir)`, then has the new ones, whole, and no temporary name. A
/// reader of the store meanwhile sees the old file or the new one, never an empty or a
/// half-written one (the rename is applied after the data). What the replace cannot be
/// undone by is done on the store: an unlink of the new file, a rename of it elsewhere. A
/// name someone else filled behind our back is never replaced in our name: theirs stays,
/// ours is left under its temporary name. After `kill -9`, the replay does what the journal
/// says.
#[test]
fn a_rename_over_a_file_of_the_store_returns_before_the_store_has_it() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let d = backing.join("d");
    std::fs::create_dir(&d).unwrap();
    for k in 0..20 {
        std::fs::write(d.join(format!("f{k}")), format!("old {k}")).unwrap();
    }
    std::fs::write(d.join("big"), b"old big").unwrap();
    std::fs::write(d.join("g"), b"old g").unwrap();
    m.mount(HELD);
    let new = |k: usize| format!("new contents of f{k}, longer than the old").into_bytes();
    let big: Vec<u8> = (0..32u32 << 20).map(|i| (i % 251) as u8).collect();
    let (replaced, waited, torn) = with_timeout(Duration::from_secs(90), vec![mnt.clone()], {
        let (mnt, d, big) = (mnt.clone(), d.clone(), big.clone());
        move || {
            let md = mnt.join("d");
            let (replaced0, waits0) = (
                stat_of(&mnt, "writeback.namespace.replaced"),
                stat_of(&mnt, "writeback.namespace.waits"),
            );
            for k in 0..20 {
                save(&md, &format!("f{k}"), &new(k));
            }
            let waited = stat_of(&mnt, "writeback.namespace.waits") - waits0;
            for k in 0..20 {
                let name = format!("f{k}");
                assert_eq!(std::fs::read(md.join(&name)).unwrap(), new(k), "{name}");
                assert_eq!(
                    std::fs::read(d.join(&name)).unwrap(),
                    format!("old {k}").as_bytes(),
                    "the store has the old {name} until the flusher comes"
                );
            }
            let mut want: Vec<String> = (0..20).map(|k| format!("f{k}")).collect();
            want.extend(["big".into(), "g".into()]);
            want.sort();
            assert_eq!(sorted_names(&md), want, "no temporary name shown");
            let mode = std::fs::metadata(md.join("f3"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o640);
            // Not deferred, since the replace must stay as it is: an unlink of the new f5
            // and a rename of the new f6 to another directory are done on the store.
            std::fs::create_dir(md.join("e")).unwrap();
            std::fs::remove_file(md.join("f5")).unwrap();
            std::fs::rename(md.join("f6"), md.join("e/g6")).unwrap();
            assert!(!d.join("f5").exists() && !d.join("f6").exists());
            assert_eq!(std::fs::read(d.join("e/g6")).unwrap(), new(6));
            // Someone else rewrites g on the store before the flusher replaces it.
            save(&md, "g", b"ours");
            std::fs::write(d.join("g"), b"theirs, rewritten").unwrap();
            // big saved last (what came before was applied by the unlink and the rename done
            // on the store, which waited for it), and a reader of the store's big while the
            // flusher applies it: the old file or the new one, whole.
            save(&md, "big", &big);
            assert_eq!(std::fs::read(md.join("big")).unwrap(), big);
            assert_eq!(std::fs::read(d.join("big")).unwrap(), b"old big");
            let stop = Arc::new(AtomicBool::new(false));
            let reader = std::thread::spawn({
                let (stop, path, big) = (stop.clone(), d.join("big"), big.clone());
                move || {
                    // Its size, as often as it can be asked (the data goes in 4 MiB runs:
                    // a file renamed before them would show another size for a while),
                    // and its bytes now and then.
                    let mut torn = 0;
                    let mut n = 0u64;
                    while !stop.load(SeqCst) {
                        let size = std::fs::metadata(&path).unwrap().len();
                        if size != 7 && size != big.len() as u64 {
                            torn += 1;
                        }
                        n += 1;
                        if n.is_multiple_of(256) {
                            let got = std::fs::read(&path).unwrap();
                            if got != b"old big" && got != big {
                                torn += 1;
                            }
                        }
                    }
                    torn
                }
            });
            let conflicts0 = stat_of(&mnt, "writeback.namespace.conflicts");
            File::open(&md).unwrap().sync_all().unwrap();
            stop.store(true, SeqCst);
            let torn = reader.join().unwrap();
            assert_eq!(
                stat_of(&mnt, "writeback.namespace.conflicts") - conflicts0,
                1,
                "g was someone else's by then"
            );
            assert_eq!(std::fs::read(d.join("g")).unwrap(), b"theirs, rewritten");
            assert_eq!(std::fs::read(d.join(".g.tmp")).unwrap(), b"ours");
            for k in (0..20).filter(|k| ![5, 6].contains(k)) {
                let name = format!("f{k}");
                assert_eq!(std::fs::read(d.join(&name)).unwrap(), new(k), "{name}");
            }
            assert_eq!(std::fs::read(d.join("big")).unwrap(), big);
            let mut on_store = sorted_names(&d);
            on_store.retain(|n| n.starts_with('.'));
            assert_eq!(
                on_store,
                [".g.tmp"],
                "no temporary name left but the refused one"
            );
            let replaced = stat_of(&mnt, "writeback.namespace.replaced") - replaced0;
            (replaced, waited, torn)
        }
    });
    assert_eq!(
        replaced, 22,
        "20 files, g and big replaced without the store"
    );
    assert_eq!(waited, 0, "a rename waited for the namespace flusher");
    assert_eq!(torn, 0, "a reader of the store saw a half-written big");

    // Across kill -9: saved, killed before the flusher ran; the replay replaces them.
    let r = backing.join("r");
    std::fs::create_dir(&r).unwrap();
    for k in 0..6 {
        std::fs::write(r.join(format!("x{k}")), format!("x{k} old")).unwrap();
    }
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            let mr = mnt.join("r");
            for k in 0..6 {
                save(&mr, &format!("x{k}"), format!("x{k} new").as_bytes());
            }
            // The journal's writer thread writes what was appended, waited for (no fsync:
            // kill -9 keeps the page cache).
            wait_journal_written(&mnt);
        }
    });
    assert_eq!(std::fs::read(r.join("x0")).unwrap(), b"x0 old");
    m.kill_daemon();
    m.mount(&["writeback.mode=back"]);
    let want: Vec<String> = (0..6).map(|k| format!("x{k}")).collect();
    assert_eq!(sorted_names(&r), want, "no temporary name on the store");
    for k in 0..6 {
        assert_eq!(
            std::fs::read(r.join(format!("x{k}"))).unwrap(),
            format!("x{k} new").as_bytes()
        );
    }
    with_timeout(Duration::from_secs(60), vec![mnt.clone()], {
        let mnt = mnt.clone();
        move || {
            assert_eq!(std::fs::read(mnt.join("r/x3")).unwrap(), b"x3 new");
        }
    });
    assert_eq!(
        lost_files(&m.cache),
        Vec::<std::path::PathBuf>::new(),
        "nothing went to journal/lost"
    );
}
