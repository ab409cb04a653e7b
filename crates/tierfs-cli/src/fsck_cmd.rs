//! `tierfs fsck CACHE_DIR [--repair]`: checks a cache directory offline (its SSD tier and its
//! write-back journal), reports, and optionally repairs so the next mount starts cleanly.
//!
//! Exit status: 0 clean, 1 problems found (repaired or not: the report says which), 2 the
//! check could not run (not a cache directory, in use by a mount, I/O error).
//!
//! The journal is never deleted or rewritten: its pending records are acknowledged writes that
//! only a mount can bring to the backing store (the next mount replays them). A repair only
//! seals a torn tail, as that mount would first thing.

use anyhow::{bail, Context, Result};
use indicatif::HumanBytes;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use tierfs_cache::ssd::fsck::{self, CheckpointState, SsdReport, SuperblockState};
use tierfs_cache::{Journal, JournalReport, JournalState};

/// Pending journal writes listed by path, at most.
const SHOW_PENDING: usize = 5;

/// ", and N more" after the first [`SHOW_PENDING`] of `total` names, or nothing.
fn and_more(total: usize) -> String {
    if total > SHOW_PENDING {
        format!(", and {} more", total - SHOW_PENDING)
    } else {
        String::new()
    }
}

/// Takes the cache directory's lock, which a mount holds for its whole life.
fn lock(dir: &Path) -> Result<File> {
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cache dir {}", dir.display()))?;
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!(
            "cache dir {} is in use by a running tierfs mount: unmount it first (fsck checks a \
             cache directory offline)",
            dir.display()
        );
    }
    Ok(f)
}

pub fn run(dir: &Path, repair: bool) -> Result<i32> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cache dir {}", dir.display()))?;
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let (ssd_dir, jdir) = (dir.join("ssd"), dir.join("journal"));
    let has_ssd = ssd_dir.join("superblock").exists() || ssd_dir.join("lock").exists();
    let has_journal = jdir.join("superblock").exists();
    if !has_ssd && !has_journal {
        bail!(
            "{} is not a tierfs cache directory (no ssd/superblock, no journal/superblock in it)",
            dir.display()
        );
    }
    let _lock = lock(&dir)?;
    println!("tierfs fsck {}", dir.display());
    let (ssd, journal) = check(&ssd_dir, has_ssd, &jdir, has_journal)?;
    let problems = report(ssd.as_ref(), journal.as_ref());
    if problems == 0 {
        println!("verdict: clean");
        return Ok(0);
    }
    if !repair {
        println!(
            "verdict: {problems} problem(s) found; `tierfs fsck --repair {}` fixes what can be \
             fixed (a mount would also drop damaged data and never serve it)",
            dir.display()
        );
        return Ok(1);
    }
    println!("repairing:");
    if let Some(r) = ssd.as_ref().filter(|r| !r.problems().is_empty()) {
        let done = fsck::repair(r).map_err(|e| anyhow::anyhow!("SSD tier repair: {e}"))?;
        if done.wiped {
            println!("  ssd: superblock unusable: the tier's files were removed; the next mount starts it afresh");
        } else {
            println!(
                "  ssd: {} bad entries dropped, {} torn tails cut off{}",
                done.bad_entries_dropped,
                done.torn_tails_cut,
                if done.checkpoint_written {
                    ", fresh checkpoint written"
                } else {
                    ""
                }
            );
        }
    }
    if let Some(j) = &journal {
        match (&j.state, &j.torn_tail, &j.store_id) {
            (JournalState::Ok, Some(_), Some(id)) => {
                Journal::seal_torn_tail(&jdir, id)
                    .map_err(|e| anyhow::anyhow!("journal repair: {e}"))?;
                println!("  journal: torn tail sealed; pending writes kept for the next mount");
            }
            (JournalState::Damaged(_), _, _) => println!(
                "  journal: damaged, left as is (it may hold acknowledged writes); the next \
                 mount refuses it; --reset-cache on mount discards it with its pending writes"
            ),
            _ => {}
        }
    }
    println!("after repair:");
    let (ssd, journal) = check(&ssd_dir, has_ssd, &jdir, has_journal)?;
    let left = report(ssd.as_ref(), journal.as_ref());
    if left == 0 {
        println!("verdict: {problems} problem(s) found and repaired; now clean");
    } else {
        println!("verdict: {problems} problem(s) found; {left} remain");
    }
    Ok(1)
}

fn check(
    ssd_dir: &Path,
    has_ssd: bool,
    jdir: &Path,
    has_journal: bool,
) -> Result<(Option<SsdReport>, Option<JournalReport>)> {
    let ssd = if has_ssd {
        Some(fsck::check(ssd_dir).map_err(|e| anyhow::anyhow!("SSD tier: {e}"))?)
    } else {
        None
    };
    let journal = if has_journal {
        Some(Journal::inspect(jdir).map_err(|e| anyhow::anyhow!("journal: {e}"))?)
    } else {
        None
    };
    Ok((ssd, journal))
}

/// Prints both reports; returns the number of problems.
fn report(ssd: Option<&SsdReport>, journal: Option<&JournalReport>) -> usize {
    let mut problems = Vec::new();
    match ssd {
        None => println!("ssd: none"),
        Some(r) => {
            match (&r.superblock, &r.identity) {
                (SuperblockState::Ok, Some(id)) => {
                    println!("ssd: store {}, block size {}", id.store_id, id.block_size)
                }
                (SuperblockState::Absent, _) => println!("ssd: empty (no superblock yet)"),
                _ => {}
            }
            println!(
                "ssd: segments {}, bytes {} ({}), entries {}, entry bytes {} ({}), bad entries {}, torn tails {}",
                r.segments,
                r.segment_bytes,
                HumanBytes(r.segment_bytes),
                r.entries,
                r.entry_bytes,
                HumanBytes(r.entry_bytes),
                r.bad_entries.len(),
                r.torn.len()
            );
            match &r.checkpoint {
                CheckpointState::Loaded { seq, off, entries } => println!(
                    "ssd: checkpoint of {entries} entries, covering segment {seq} up to byte {off}; \
                     {} clusters after it (the next mount reads their summaries)",
                    r.scanned_clusters
                ),
                CheckpointState::Missing if r.segments > 0 => println!(
                    "ssd: no checkpoint (the next mount reads every cluster summary: {} clusters)",
                    r.scanned_clusters
                ),
                _ => {}
            }
            if r.empty_segments > 0 || r.tmp_leftover {
                println!(
                    "ssd: {} empty segment files{}: the next mount removes them",
                    r.empty_segments,
                    if r.tmp_leftover {
                        " and a checkpoint.tmp"
                    } else {
                        ""
                    }
                );
            }
            problems.extend(r.problems().into_iter().map(|p| format!("ssd: {p}")));
        }
    }
    match journal {
        None => println!("journal: none"),
        Some(j) => match &j.state {
            JournalState::Absent => println!("journal: none"),
            JournalState::Damaged(why) => problems.push(format!(
                "journal: {why} (the next mount refuses it; fsck never deletes a journal)"
            )),
            JournalState::Ok => {
                println!(
                    "journal: segments {}, records {}, bytes {}, pending writes {} ({})",
                    j.segments,
                    j.records,
                    j.bytes,
                    j.pending.len(),
                    HumanBytes(j.pending_bytes)
                );
                if !j.pending.is_empty() {
                    let mut files: Vec<&[u8]> =
                        j.pending.iter().map(|p| &p.file.path[..]).collect();
                    files.sort_unstable();
                    files.dedup();
                    println!(
                        "journal: {} writes to {} file(s) are not on the backing store yet: the \
                         next mount replays them (never deleted by fsck)",
                        j.pending.len(),
                        files.len()
                    );
                    for f in files.iter().take(SHOW_PENDING) {
                        println!("journal:   {}", String::from_utf8_lossy(f));
                    }
                    if files.len() > SHOW_PENDING {
                        println!(
                            "journal:  {}",
                            and_more(files.len()).trim_start_matches(',')
                        );
                    }
                }
                for d in j.damage.iter().filter(|d| !d.harmless) {
                    let what = match (&d.file, d.range) {
                        (Some(f), Some((off, len))) => format!(
                            "a write of {} at offset {off}{} is lost",
                            String::from_utf8_lossy(&f.path),
                            len.map(|l| format!(", {l} bytes")).unwrap_or_default()
                        ),
                        (Some(f), None) => {
                            format!(
                                "a DONE/DROP of {} is lost",
                                String::from_utf8_lossy(&f.path)
                            )
                        }
                        (None, _) => "what it held is unknown".into(),
                    };
                    problems.push(format!(
                        "journal: damaged at byte {} of {} ({}, {} bytes): {what}",
                        d.offset,
                        d.path.display(),
                        d.why,
                        d.len
                    ));
                }
                if !j.lost.is_empty() {
                    let mut files: Vec<&[u8]> = j.lost.iter().map(|p| &p.file.path[..]).collect();
                    files.sort_unstable();
                    files.dedup();
                    problems.push(format!(
                        "journal: {} pending writes to {} file(s) will not be replayed (damage may hide a newer \
                         write of each): the next mount leaves these files as the store has them \
                         and saves the writes under {}: {}{}",
                        j.lost.len(),
                        files.len(),
                        j.dir.join("lost").display(),
                        files
                            .iter()
                            .take(SHOW_PENDING)
                            .map(|f| String::from_utf8_lossy(f))
                            .collect::<Vec<_>>()
                            .join(", "),
                        and_more(files.len())
                    ));
                }
                if let Some((path, off, why)) = &j.torn_tail {
                    problems.push(format!(
                        "journal: {} ends in a torn record at byte {off} ({why}): a crash \
                         mid-write; nothing acknowledged is lost; the next mount seals it there",
                        path.display()
                    ));
                }
            }
        },
    }
    if let Some(j) = journal {
        // Data a mount set aside (write-back could not apply it, or journal damage hid a
        // newer write): the cache dir is not damaged by it, so it is no problem of the cache
        // (fsck stays clean), but the user must hear of it at every fsck until they dealt
        // with it. Each report says why in its own words.
        for r in j.lost_reports.iter().take(SHOW_PENDING) {
            let text = std::fs::read_to_string(r).unwrap_or_default();
            let field = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(str::to_string)
            };
            println!(
                "kept: {}: {} (report {}; delete it and its data once dealt with)",
                field("file: ").unwrap_or_else(|| "(unknown file)".into()),
                field("why: ").unwrap_or_else(|| "(no reason recorded)".into()),
                r.display()
            );
        }
        if j.lost_reports.len() > SHOW_PENDING {
            println!(
                "kept:{} in {}",
                and_more(j.lost_reports.len()),
                j.dir.join("lost").display()
            );
        }
    }
    for p in &problems {
        println!("problem: {p}");
    }
    problems.len()
}
