//! What replay cannot write to the store is saved, never dropped: a file's pending writes
//! under `<journal dir>/lost/<dev>-<ino>` at their offsets, with a `.txt` report beside
//! them (the file, why, what was saved, what journal damage lost), which `tierfs fsck`
//! shows until the user deletes it.

use std::path::Path;
use tierfs_cache::journal::{Journal, PendingWrite};

/// Saves `writes` (one file's) under `<dir>/lost/<dev>-<ino>` at their offsets, synced, with a
/// `.txt` report beside it; returns the data file's path.
pub(super) fn save_lost(
    journal: &Journal,
    dir: &Path,
    writes: &[&PendingWrite],
    why: &str,
    lost_ranges: &[(u64, Option<u64>)],
) -> std::result::Result<std::path::PathBuf, String> {
    let w0 = writes[writes.len() - 1];
    let (dev, ino) = (w0.file.dev, w0.file.ino);
    let lost = dir.join("lost");
    tierfs_cache::private::dir_all(&lost).map_err(|e| format!("{}: {e}", lost.display()))?;
    let f = lost.join(format!("{dev:x}-{ino}"));
    let out = tierfs_cache::private::options()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&f)
        .map_err(|e| format!("{}: {e}", f.display()))?;
    for w in writes {
        use std::os::unix::fs::FileExt;
        let data = journal
            .read_pending(w)
            .map_err(|e| format!("write-back journal: {e}"))?;
        out.write_all_at(&data, w.offset)
            .map_err(|e| format!("{}: {e}", f.display()))?;
    }
    out.sync_all()
        .map_err(|e| format!("{}: {e}", f.display()))?;
    write_report(dir, dev, ino, &w0.file.path, why, writes, lost_ranges)?;
    Ok(f)
}

/// `<dir>/lost/<dev>-<ino>.txt`: which file, why, the writes saved beside it, the ranges lost.
pub(super) fn write_report(
    dir: &Path,
    dev: u64,
    ino: u64,
    path: &[u8],
    why: &str,
    saved: &[&PendingWrite],
    lost_ranges: &[(u64, Option<u64>)],
) -> std::result::Result<(), String> {
    use std::fmt::Write;
    let mut t = String::new();
    let _ = writeln!(t, "file: {}", String::from_utf8_lossy(path));
    let _ = writeln!(
        t,
        "why: {why}; the file was left as the backing store has it"
    );
    for w in saved {
        let _ = writeln!(
            t,
            "saved: offset {} length {} (in {dev:x}-{ino}, same offset)",
            w.offset, w.len
        );
    }
    for (off, len) in lost_ranges {
        match len {
            Some(l) => {
                let _ = writeln!(t, "lost: offset {off} length {l} (journal record damaged)");
            }
            None => {
                let _ = writeln!(
                    t,
                    "lost: offset {off}, length unknown (journal record damaged)"
                );
            }
        }
    }
    write_text(dir, &format!("{dev:x}-{ino}.txt"), &t)
}

pub(super) fn write_text(dir: &Path, name: &str, text: &str) -> std::result::Result<(), String> {
    use std::io::Write;
    let lost = dir.join("lost");
    tierfs_cache::private::dir_all(&lost).map_err(|e| format!("{}: {e}", lost.display()))?;
    let p = lost.join(name);
    let mut f = tierfs_cache::private::options()
        .create(true)
        .append(true)
        .open(&p)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("{}: {e}", p.display()))
}
