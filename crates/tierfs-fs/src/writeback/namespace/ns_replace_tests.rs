//! Replay of MOVE OVER records (`ns_replace`), with their CREATE records.

use super::super::ns_record::NsOp;
use super::super::ns_replay::replay_ns;
use super::super::ns_replay::tests::{append_all, record, store_and_journal};
use super::super::stats::WbCounters;
use std::sync::atomic::Ordering::Relaxed;
use tierfs_store::{FileKind, IdentityChoice};

/// MOVE OVER records (a new file renamed over a file of the store, `ns_replace`) replay in
/// every state a crash can leave, with their CREATE pending (the flusher writes the file's
/// data before the create's group is done) or done: not made yet (made, then renamed over
/// the old file), made with its data under the old name (taken as ours, renamed over), made
/// and renamed (nothing to do: not made again beside it), and never over someone else's
/// file (which stays; ours is refused, its data to `lost/`). Path identities (sshfs):
/// objects are told apart by kind and size.
#[test]
fn replaces_replay_in_every_state_a_crash_leaves_and_never_over_someone_elses() {
    let t = tempfile::tempdir().unwrap();
    let (back, jdir) = (t.path().join("back"), t.path().join("journal"));
    std::fs::create_dir_all(back.join("g")).unwrap();
    let (store, journal) = store_and_journal(&back, &jdir, IdentityChoice::Path);
    let create_file = |name: &str| NsOp::Create {
        parent: b"g".to_vec(),
        name: name.as_bytes().to_vec(),
        kind: FileKind::File,
        mode: 0o644,
        owner: None,
        target: Vec::new(),
        rdev: 0,
    };
    let path_id = (1u64 << 63, 9);
    let over = |from: &str, to: &str, prov, old_size| NsOp::Move {
        from: format!("g/{from}").into_bytes(),
        to: format!("g/{to}").into_bytes(),
        prov,
        over: Some((FileKind::File, path_id, old_size)),
    };
    // a: nothing of ours on the store yet (the old a, 3 bytes).
    std::fs::write(back.join("g/a"), b"old").unwrap();
    // b: ours made under .b.tmp with its data (5 bytes), not renamed.
    std::fs::write(back.join("g/b"), b"old").unwrap();
    std::fs::write(back.join("g/.b.tmp"), b"ours!").unwrap();
    // c: ours renamed over c already (5 bytes, the old one had 3).
    std::fs::write(back.join("g/c"), b"ours!").unwrap();
    // d: someone else's d (6 bytes) replaced the old one (3) since; ours under .d.tmp.
    std::fs::write(back.join("g/d"), b"theirs").unwrap();
    std::fs::write(back.join("g/.d.tmp"), b"ours!").unwrap();
    // e: the create was done before the crash (its CREATE not pending), the rename not.
    std::fs::write(back.join("g/e"), b"old").unwrap();
    std::fs::write(back.join("g/.e.tmp"), b"ours!").unwrap();
    let pending = [
        record(1, create_file(".a.tmp")),
        record(2, over(".a.tmp", "a", 1, 3)),
        record(3, create_file(".b.tmp")),
        record(4, over(".b.tmp", "b", 3, 3)),
        record(5, create_file(".c.tmp")),
        record(6, over(".c.tmp", "c", 5, 3)),
        record(7, create_file(".d.tmp")),
        record(8, over(".d.tmp", "d", 7, 3)),
        record(9, over(".e.tmp", "e", 200, 3)),
    ];
    append_all(&journal, &pending);
    let c = WbCounters::default();
    let r = replay_ns(&store, &journal, &pending, &c).unwrap();
    let read = |p: &str| std::fs::read(back.join(p)).ok();
    for (name, prov) in [("a", 1), ("b", 3), ("c", 5), ("e", 200)] {
        assert!(
            read(&format!("g/.{name}.tmp")).is_none(),
            "{name}: no temporary name left"
        );
        let to = format!("g/{name}");
        assert_eq!(
            r.moved.get(&prov).map(|p| &p[..]),
            Some(to.as_bytes()),
            "{name}"
        );
    }
    // (Their data is replayed after this, over what they hold: the old bytes for a.)
    assert_eq!(read("g/a").unwrap(), b"");
    assert_eq!(read("g/b").unwrap(), b"ours!");
    assert_eq!(read("g/c").unwrap(), b"ours!");
    assert_eq!(read("g/e").unwrap(), b"ours!");
    assert_eq!(read("g/d").unwrap(), b"theirs");
    assert!(read("g/.d.tmp").is_some());
    assert!(r.refused_prov.contains(&7), "its data goes to lost/");
    assert_eq!(c.ns_conflicts.load(Relaxed), 1);
    journal.shutdown();
}
