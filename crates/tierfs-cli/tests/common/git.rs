//! A small git repository to clone onto a mount (`git clone --no-local`: temporary packs
//! linked to their final names, renames, fsyncs), and the check that a clone is whole.

use super::{run_in as run, seeded_bytes};
use std::path::Path;

/// A repository of three commits of three files each, in a temporary directory.
pub fn source_repo() -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    let src = repo.path();
    run(src, "git", &["init", "-q", "-b", "main"]);
    for k in 0..3u64 {
        std::fs::create_dir_all(src.join("dir")).unwrap();
        std::fs::write(src.join(format!("f{k}")), seeded_bytes(k, 40_000)).unwrap();
        std::fs::write(src.join(format!("dir/g{k}")), seeded_bytes(k + 10, 3_000)).unwrap();
        run(src, "git", &["add", "."]);
        let m = format!("commit {k}");
        let id = ["-c", "user.name=t", "-c", "user.email=t@t"];
        run(src, "git", &[&id[..], &["commit", "-q", "-m", &m]].concat());
    }
    repo
}

/// The clone is whole: `git fsck` and `git status` clean, every file as committed.
pub fn check_clone(clone: &Path) {
    run(clone, "git", &["fsck", "--no-progress", "--strict"]);
    let out = std::process::Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(clone)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "git status in {}: {}{}",
        clone.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for k in 0..3u64 {
        assert_eq!(
            std::fs::read(clone.join(format!("f{k}"))).unwrap(),
            seeded_bytes(k, 40_000)
        );
    }
}
