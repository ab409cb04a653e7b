//! Tests of `ns_record`: every record round-trips, and no cut or garbage decodes.

use super::*;

#[test]
fn round_trip_and_garbage() {
    let ops = [
        NsOp::Create {
            parent: b"a/b".to_vec(),
            name: b"c.txt".to_vec(),
            kind: FileKind::File,
            mode: 0o644,
            owner: Some((1000, 100)),
            target: Vec::new(),
            rdev: 0,
        },
        NsOp::Create {
            parent: Vec::new(),
            name: b"d".to_vec(),
            kind: FileKind::Dir,
            mode: 0o755,
            owner: None,
            target: Vec::new(),
            rdev: 0,
        },
        NsOp::Create {
            parent: b"a".to_vec(),
            name: b"link".to_vec(),
            kind: FileKind::Symlink,
            mode: 0o777,
            owner: Some((0, 0)),
            target: b"../b/c.txt".to_vec(),
            rdev: 0,
        },
        NsOp::Create {
            parent: b"dev".to_vec(),
            name: b"null".to_vec(),
            kind: FileKind::CharDev,
            mode: libc::S_IFCHR | 0o666,
            owner: Some((0, 0)),
            target: Vec::new(),
            rdev: libc::makedev(1, 3),
        },
        NsOp::Create {
            parent: b"run".to_vec(),
            name: b"initctl".to_vec(),
            kind: FileKind::Fifo,
            mode: libc::S_IFIFO | 0o600,
            owner: None,
            target: Vec::new(),
            rdev: 0,
        },
        NsOp::SetAttr {
            path: b"a/b/c.txt".to_vec(),
            mode: Some(0o600),
            uid: None,
            gid: Some(5),
            atime: None,
            mtime: Some(TimeSpec {
                sec: -5,
                nsec: 999_999_999,
            }),
            of: None,
            size: None,
        },
        NsOp::SetAttr {
            path: b"src/lib.rs".to_vec(),
            mode: Some(0o640),
            uid: Some(1000),
            gid: None,
            atime: Some(TimeSpec { sec: 7, nsec: 1 }),
            mtime: None,
            of: Some((FileKind::File, (3, u64::MAX))),
            size: None,
        },
        NsOp::SetAttr {
            path: b"out/app.o".to_vec(),
            mode: None,
            uid: None,
            gid: None,
            atime: None,
            mtime: None,
            of: Some((FileKind::File, (3, 77))),
            size: Some((0, (3, 77))),
        },
        NsOp::SetAttr {
            path: Vec::new(),
            mode: Some(0o700),
            uid: None,
            gid: None,
            atime: None,
            mtime: None,
            of: Some((FileKind::Dir, (1 << 63 | 9, 2))),
            size: None,
        },
        NsOp::Unlink {
            path: b"a/conftest.c".to_vec(),
            kind: FileKind::File,
            prov: 1 << 40,
        },
        NsOp::Unlink {
            path: b"a/conftest.dir".to_vec(),
            kind: FileKind::Dir,
            prov: 5,
        },
        NsOp::Rename {
            from: b"a/.f.tmp".to_vec(),
            to: b"a/f".to_vec(),
            prov: 77,
            replaced: None,
        },
        NsOp::Rename {
            from: b"a/.f.tmp".to_vec(),
            to: b"b/f".to_vec(),
            prov: 78,
            replaced: Some(70),
        },
        NsOp::Move {
            from: b".git/index.lock".to_vec(),
            to: b".git/index".to_vec(),
            prov: 79,
            over: None,
        },
        NsOp::Move {
            from: b"www/.index.html.Xq3bZ1".to_vec(),
            to: b"www/index.html".to_vec(),
            prov: 82,
            over: Some((FileKind::File, (1 << 63 | 9, 1234), 4096)),
        },
        NsOp::Move {
            from: b"l.new".to_vec(),
            to: b"l".to_vec(),
            prov: 83,
            over: Some((FileKind::Symlink, (7, 8), 3)),
        },
        NsOp::Remove {
            path: b"target/debug/old.o".to_vec(),
            kind: FileKind::File,
            id: (1 << 63 | 5, u64::MAX),
            size: 1 << 33,
        },
        NsOp::Link {
            from: b".git/objects/1d/tmp_obj_W51Jxw".to_vec(),
            to: b".git/objects/1d/c3918e53e8ab81b57a8b93bb70a7e45f4a6632".to_vec(),
            prov: 80,
        },
        NsOp::Unalias {
            path: b".git/objects/1d/tmp_obj_W51Jxw".to_vec(),
            link: 81,
            prov: 80,
        },
        NsOp::Remove {
            path: b"l".to_vec(),
            kind: FileKind::Symlink,
            id: (7, 8),
            size: 0,
        },
        NsOp::Remove {
            path: b"a/b".to_vec(),
            kind: FileKind::Dir,
            id: (7, 9),
            size: 4096,
        },
    ];
    for op in &ops {
        let b = op.encode();
        assert_eq!(&NsOp::decode(&b).unwrap(), op);
        // Every cut is refused, never a panic.
        for n in 0..b.len() {
            assert!(NsOp::decode(&b[..n]).is_err(), "cut at {n}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(NsOp::decode(&longer).is_err());
    }
    let bad_name = NsOp::Create {
        parent: Vec::new(),
        name: b"x/y".to_vec(),
        kind: FileKind::File,
        mode: 0,
        owner: None,
        target: Vec::new(),
        rdev: 0,
    };
    assert!(NsOp::decode(&bad_name.encode()).is_err());
    let no_target = NsOp::Create {
        parent: Vec::new(),
        name: b"l".to_vec(),
        kind: FileKind::Symlink,
        mode: 0o777,
        owner: None,
        target: Vec::new(),
        rdev: 0,
    };
    assert!(NsOp::decode(&no_target.encode()).is_err());
    for n in 0..64u8 {
        let b: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37) ^ n).collect();
        let _ = NsOp::decode(&b);
    }
}
