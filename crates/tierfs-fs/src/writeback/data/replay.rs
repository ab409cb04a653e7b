//! Start of write-back: the journal is opened and what it holds that is not known to be on
//! the backing store is written there (and synced) before the mount serves anything.

use super::replay_lost::{save_lost, write_report, write_text};
use super::{stats::WbCounters, WbConfig, Writeback};
use crate::data::Objects;
use crate::shared::{Node, St};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::journal::{Damage, Journal, JournalConfig, PendingWrite, Replay};
use tierfs_store::{Errno, Store};

impl<S: Store> Writeback<S> {
    /// Write-back for a mount: opens the journal in `dir`, replays it, starts the flushers.
    /// Errors are one line for the user.
    pub(crate) fn start(
        data: Arc<Objects<S>>,
        cfg: WbConfig,
        dir: &Path,
        reset: bool,
    ) -> std::result::Result<Arc<Writeback<S>>, String> {
        let (sh, ns) = (data.sh.clone(), data.ns.clone());
        let jcfg = journal_config(&cfg);
        let t = Instant::now();
        let (journal, replay) = open_journal(dir, sh.store.store_id(), jcfg, reset)?;
        if let Some(ssd) = sh.ssd.clone() {
            // Acknowledged writes come before cached copies of the store's data: on a full
            // cache device the SSD tier gives back room for the journal's next segment.
            journal.set_space_hook(Arc::new(move |bytes| ssd.yield_space(bytes)));
        }
        let c = WbCounters::default();
        settle_damage(&journal, &replay, dir, &c)?;
        let replayed = super::ns_replay::replay_ns(&sh.store, &journal, &replay.pending_ns, &c)?;
        if !replay.pending.is_empty() {
            eprintln!(
                "tierfs: replaying {} writes ({:.1} MiB) from the write-back journal...",
                replay.pending.len(),
                replay.pending_bytes as f64 / 1048576.0
            );
            replay_pending(&sh.store, &journal, &replay.pending, dir, &c, &replayed)?;
        }
        c.replay_ms.store(t.elapsed().as_millis() as u64, Relaxed);
        let flushers = cfg.flushers.max(1);
        let wb = Arc::new(Writeback {
            sh,
            ns,
            data,
            live: super::config::WbLive::new(&cfg),
            // 1 MiB never promised: room for the store's own metadata (extent and indirect
            // blocks) that allocating the reserved blocks may need.
            reserve: super::reserve::Reservations::new(cfg.reserve_chunk, 1 << 20),
            // Inodes a store's own metadata (a journal, lost+found) may need meanwhile.
            inodes: super::reserve::InodeReservations::new(64),
            cfg,
            journal,
            c,
            files: Default::default(),
            cursor: Default::default(),
            wake: Default::default(),
            wake_lock: Default::default(),
            stop: AtomicBool::new(false),
            threads: Default::default(),
            rate: Mutex::new((Instant::now(), 0, 0)),
            held: Mutex::new(Default::default()),
            nsq: super::ns_queue::NsQueue::new(),
            made_kinds: Default::default(),
            kept_times: Default::default(),
            dir: dir.to_path_buf(),
        });
        wb.spawn_ns_flusher()
            .map_err(|e| format!("starting the namespace flusher thread: {e}"))?;
        {
            let _g = wb.live.resize.lock();
            for _ in 0..flushers {
                wb.spawn_flusher()
                    .map_err(|e| format!("starting flusher threads: {e}"))?;
            }
        }
        Ok(wb)
    }
}

/// A write-through mount over a cache dir that holds a write-back journal: its pending
/// writes go to the backing store first; the journal is then closed, not used.
pub(crate) fn replay_journal<S: Store>(
    store: &St<S>,
    ssd: Option<Arc<tierfs_cache::SsdCache>>,
    cfg: WbConfig,
    dir: &Path,
    reset: bool,
) -> std::result::Result<(), String> {
    let (journal, replay) = open_journal(dir, store.store_id(), journal_config(&cfg), reset)?;
    if let Some(ssd) = ssd {
        // Its DONE records may need a segment on a full cache device (see `Writeback::start`).
        journal.set_space_hook(Arc::new(move |bytes| ssd.yield_space(bytes)));
    }
    settle_damage(&journal, &replay, dir, &WbCounters::default())?;
    let ns =
        super::ns_replay::replay_ns(store, &journal, &replay.pending_ns, &WbCounters::default())?;
    if !replay.pending.is_empty() {
        eprintln!(
            "tierfs: replaying {} writes ({:.1} MiB) from the write-back journal...",
            replay.pending.len(),
            replay.pending_bytes as f64 / 1048576.0
        );
        replay_pending(
            store,
            &journal,
            &replay.pending,
            dir,
            &WbCounters::default(),
            &ns,
        )?;
    }
    journal.shutdown();
    Ok(())
}

/// Writes the journal's pending writes to their files, in order, file by file; syncs
/// each file, then records it done. A file that cannot be found under its path, or whose
/// path now names another file, gets its data saved under `<dir>/lost/` instead (never
/// written into a stranger, never dropped), with an error in the log.
fn replay_pending<S: Store>(
    store: &St<S>,
    journal: &Journal,
    pending: &[PendingWrite],
    dir: &Path,
    c: &WbCounters,
    ns: &super::ns_replay::NsReplayed,
) -> std::result::Result<(), String> {
    let mut by_file: BTreeMap<(u64, u64), Vec<&PendingWrite>> = BTreeMap::new();
    for p in pending {
        by_file.entry((p.file.dev, p.file.ino)).or_default().push(p);
    }
    for ((dev, ino), mut writes) in by_file {
        // Those before a pending truncate of the file are moot (`ns_chattr`): let go of them.
        let all_upto = writes.iter().map(|w| w.seq).max().unwrap_or(0);
        if let Some(t) = ns.truncated.get(&(dev, ino)) {
            writes.retain(|w| w.seq > *t);
            if writes.is_empty() {
                journal
                    .done(dev, ino, all_upto)
                    .map_err(|e| format!("write-back journal: {e}"))?;
                continue;
            }
        }
        // A provisional file made or renamed by a pending namespace record is where that
        // record put it (the path of its last write may be older: `ns_rename`).
        let path = match ns.moved.get(&ino) {
            Some(p) if dev == crate::namespace::PROV_DEV => p,
            _ => &writes[writes.len() - 1].file.path,
        };
        let shown = String::from_utf8_lossy(path).into_owned();
        // With inode identities the path must still hold that inode (journals of tierfs
        // before identities had the device number in `dev`: not compared). With path
        // identities the path is the file.
        // A file created by deferred namespace write-back has a provisional identity: the
        // path is the file (its create was replayed just before).
        let provisional = dev == crate::namespace::PROV_DEV;
        if provisional && ns.dropped.contains(&ino) {
            // Unlinked before it reached the store: its data goes nowhere.
            let upto = writes.iter().map(|w| w.seq).max().unwrap_or(0);
            journal
                .done(dev, ino, upto)
                .map_err(|e| format!("write-back journal: {e}"))?;
            continue;
        }
        let by_inode = store.identity_kind() == tierfs_store::Identity::Inode && !provisional;
        let refused = if provisional {
            ns.refused_prov.contains(&ino)
        } else {
            ns.refused.iter().any(|r| r == path)
        };
        let found = if refused {
            Err(Errno(libc::EEXIST))
        } else {
            super::ns_path::open_by_path(store, path)
        }
        .and_then(|(node, attr)| {
            if by_inode && attr.ino != ino {
                return Err(Errno::ESTALE);
            }
            Ok(node)
        });
        let target = match found {
            // Renamed through tierfs before its writes were flushed (namespace operations are
            // not journaled): in its directory under another name, found by inode number.
            Err(e) if by_inode && (e == Errno::ENOENT || e == Errno::ESTALE) => {
                match renamed_in_dir(store, path, ino) {
                    Some((node, name)) => {
                        tracing::info!(
                            "write-back replay: {shown} is now {:?} in the same directory (same inode): its {} pending writes follow it",
                            name,
                            writes.len()
                        );
                        Ok(node)
                    }
                    None => Err(e),
                }
            }
            r => r,
        }
        .and_then(|node| Ok((store.open(&node, libc::O_WRONLY)?, node)));
        let mut upto = 0;
        match target {
            Ok((h, node)) => {
                let mut refused = None;
                for (k, w) in writes.iter().enumerate() {
                    let data = journal
                        .read_pending(w)
                        .map_err(|e| format!("write-back journal: {e}"))?;
                    let r = if data.is_empty() && w.offset > 0 {
                        super::ns_truncate::replay_grow(store, &node, &h, w.offset)
                    } else {
                        store.write(&h, w.offset, &data).map(|_| ())
                    };
                    match r {
                        Ok(()) => {}
                        // Refused for good (past the store's largest file...): set aside
                        // below, never a mount refused for one file's write.
                        Err(e) if super::applying::refused_for_good(e) => {
                            refused = Some((k, e));
                            break;
                        }
                        Err(e) => {
                            return Err(format!(
                                "replaying the write-back journal into {shown}: {e}"
                            ))
                        }
                    }
                    c.replayed_writes.fetch_add(1, Relaxed);
                    c.replayed_bytes.fetch_add(data.len() as u64, Relaxed);
                    upto = upto.max(w.seq);
                }
                store.fsync(&h, false).map_err(|e| {
                    format!("replaying the write-back journal into {shown}: fsync: {e}")
                })?;
                if let Some((k, e)) = refused {
                    let why = format!(
                        "the store refused it at replay ({e}); the {k} writes before it were applied"
                    );
                    let f = save_lost(journal, dir, &writes[k..], &why, &[])?;
                    tracing::error!(
                        "write-back replay: {shown}: {why}; {} pending writes saved to {} at their offsets",
                        writes.len() - k,
                        f.display()
                    );
                    upto = all_upto;
                    c.replay_lost_files.fetch_add(1, Relaxed);
                }
            }
            Err(e) => {
                let f = save_lost(journal, dir, &writes, &format!("{e} at replay"), &[])?;
                tracing::error!(
                    "write-back replay: {shown} ({e}): {} pending writes saved to {} at their offsets",
                    writes.len(),
                    f.display()
                );
                upto = writes.iter().map(|w| w.seq).max().unwrap_or(0);
                c.replay_lost_files.fetch_add(1, Relaxed);
            }
        }
        journal
            .done(dev, ino, upto.max(all_upto))
            .map_err(|e| format!("write-back journal: {e}"))?;
    }
    journal
        .sync_all()
        .map_err(|e| format!("write-back journal: {e}"))?;
    Ok(())
}

/// Says what journal damage cost, and sets aside the pending writes of the files it may
/// concern (they are not replayed: a newer write of the same file may have been in the hole
/// and on the store already, and replaying the older ones would roll the file back). Each such
/// file is left as the store has it; its readable writes go to `<dir>/lost/`, with a `.txt`
/// beside them naming the file and the ranges lost; then the journal lets go of them.
fn settle_damage(
    journal: &Journal,
    replay: &Replay,
    dir: &Path,
    c: &WbCounters,
) -> std::result::Result<(), String> {
    if let Some((file, off, why)) = &replay.torn_tail {
        tracing::warn!(
            "write-back journal: torn tail in {} at {off} ({why}): records after it were never acknowledged as durable",
            file.display()
        );
    }
    let mut by_file: BTreeMap<(u64, u64), Vec<&PendingWrite>> = BTreeMap::new();
    for p in &replay.lost {
        by_file.entry((p.file.dev, p.file.ino)).or_default().push(p);
    }
    let mut named = std::collections::BTreeSet::new();
    for d in replay.harmful_damage() {
        c.replay_damage.fetch_add(1, Relaxed);
        let what = match (&d.file, d.range) {
            (Some(f), Some((off, len))) => format!(
                "a write of {} at offset {off}{} is lost",
                String::from_utf8_lossy(&f.path),
                len.map(|l| format!(", {l} bytes")).unwrap_or_default()
            ),
            (Some(f), None) => format!(
                "a DONE/DROP record of {} is lost",
                String::from_utf8_lossy(&f.path)
            ),
            (None, _) => "what it held is unknown; every file with an older pending write is left as the store has it".into(),
        };
        tracing::error!(
            "write-back journal: damaged at byte {} of {} ({}, {} bytes): {what}",
            d.offset,
            d.path.display(),
            d.why,
            d.len
        );
        eprintln!(
            "tierfs: write-back journal damaged at byte {} of {}: {what}",
            d.offset,
            d.path.display()
        );
        match &d.file {
            Some(f) if !by_file.contains_key(&(f.dev, f.ino)) && named.insert((f.dev, f.ino)) => {
                // Nothing readable pending for it: the report alone says what is gone.
                let ranges = damaged_ranges(replay, f.dev, f.ino);
                write_report(dir, f.dev, f.ino, &f.path, "journal damage", &[], &ranges)?;
                c.replay_lost_files.fetch_add(1, Relaxed);
                // Reported once: the next open finds the hole covered.
                journal
                    .drop_file(f.dev, f.ino, damaged_upto(replay, f.dev, f.ino))
                    .map_err(|e| format!("write-back journal: {e}"))?;
            }
            None => {
                let name = format!(
                    "damage-{}-{}",
                    d.path.file_name().unwrap_or_default().to_string_lossy(),
                    d.offset
                );
                if dir.join("lost").join(&name).exists() {
                    // Reported by an earlier mount: the hole stays until its segment is freed.
                    continue;
                }
                write_text(dir, &name, &format!(
                    "journal damage at byte {} of {} ({}, {} bytes, seqs {}..{}): the records there are unreadable; every file with an older pending write was left as the store has it\n",
                    d.offset, d.path.display(), d.why, d.len, d.after_seq + 1, d.before_seq
                ))?;
            }
            _ => {}
        }
    }
    for ((dev, ino), writes) in by_file {
        let shown = String::from_utf8_lossy(&writes[writes.len() - 1].file.path).into_owned();
        let ranges = damaged_ranges(replay, dev, ino);
        let f = save_lost(journal, dir, &writes, "journal damage", &ranges)?;
        tracing::error!(
            "write-back replay: {shown}: left as the store has it (journal damage may hide a newer write of it); its {} pending writes ({} bytes) saved to {}",
            writes.len(),
            writes.iter().map(|w| w.len as u64).sum::<u64>(),
            f.display()
        );
        c.replay_lost_writes.fetch_add(writes.len() as u64, Relaxed);
        c.replay_lost_files.fetch_add(1, Relaxed);
        let upto = writes
            .iter()
            .map(|w| w.seq)
            .max()
            .unwrap_or(0)
            .max(damaged_upto(replay, dev, ino));
        journal
            .drop_file(dev, ino, upto)
            .map_err(|e| format!("write-back journal: {e}"))?;
    }
    if !replay.lost.is_empty() || replay.harmful_damage().next().is_some() {
        journal
            .sync_all()
            .map_err(|e| format!("write-back journal: {e}"))?;
    }
    Ok(())
}

/// The damage that costs (dev, ino) something and is known to be its own.
fn damage_of(replay: &Replay, dev: u64, ino: u64) -> impl Iterator<Item = &Damage> {
    replay.harmful_damage().filter(move |d| {
        d.file
            .as_ref()
            .is_some_and(|f| (f.dev, f.ino) == (dev, ino))
    })
}

/// The (offset, length) of the damaged writes known to be of (dev, ino).
fn damaged_ranges(replay: &Replay, dev: u64, ino: u64) -> Vec<(u64, Option<u64>)> {
    damage_of(replay, dev, ino)
        .filter_map(|d| d.range)
        .collect()
}

/// The highest seq a damaged write of (dev, ino) may have had: a DROP up to it covers the hole
/// for that file, so the next open does not report it again.
fn damaged_upto(replay: &Replay, dev: u64, ino: u64) -> u64 {
    damage_of(replay, dev, ino)
        .filter(|d| d.before_seq != u64::MAX)
        .map(|d| d.before_seq - 1)
        .max()
        .unwrap_or(0)
}

/// The file with inode number `ino` in the directory of `path`, under whatever name it has
/// now (a rename in that directory: `target.tmp` -> `target`), and that name.
fn renamed_in_dir<S: Store>(
    store: &St<S>,
    path: &[u8],
    ino: u64,
) -> Option<(Node<S>, std::ffi::OsString)> {
    let parent = match path.iter().rposition(|b| *b == b'/') {
        Some(i) => &path[..i],
        None => &[][..],
    };
    let (dir, _) = super::ns_path::open_by_path(store, parent).ok()?;
    let entry = store
        .readdir(&dir)
        .ok()?
        .into_iter()
        .find(|e| e.ino == ino && e.kind != Some(tierfs_store::FileKind::Dir))?;
    let (node, attr) = store.lookup(&dir, &entry.name).ok()?;
    (attr.ino == ino && attr.kind == tierfs_store::FileKind::File).then_some((node, entry.name))
}

/// The journal's settings from the write-back tunables.
fn journal_config(cfg: &WbConfig) -> JournalConfig {
    JournalConfig {
        segment_size: cfg.journal_segment,
        max_size: cfg.journal_size,
        // Appends wait only when this much is queued for the writer thread: enough to ride
        // through its fdatasyncs (a segment rollover syncs up to a whole segment while the
        // disk is also taking the flushers' writes) without stalling writers.
        max_buffer: (cfg.journal_size / 8).clamp(16 << 20, 256 << 20),
        ..JournalConfig::default()
    }
}

/// Opens the journal. `--reset-cache` never throws away a journal that can be read: its
/// pending writes are acknowledged data, and they are replayed like any other. Only a journal
/// that cannot be opened (damaged, another store's, another format) is wiped when the user
/// asked for a reset, with the loss in the log.
fn open_journal(
    dir: &Path,
    store_id: &str,
    cfg: JournalConfig,
    reset: bool,
) -> std::result::Result<(Journal, tierfs_cache::journal::Replay), String> {
    match Journal::open(dir, store_id, cfg.clone(), false) {
        Ok(r) => Ok(r),
        Err(e) if reset => {
            tracing::error!(
                "write-back journal: {e}; wiped (--reset-cache): its pending writes are lost"
            );
            eprintln!("tierfs: write-back journal: {e}; wiped (--reset-cache)");
            Journal::open(dir, store_id, cfg, true).map_err(|e| format!("write-back journal: {e}"))
        }
        Err(e) => Err(format!(
            "write-back journal: {e} (it may hold acknowledged writes; --reset-cache wipes it)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counted::CountedStore;
    use crate::identity::IdStore;
    use std::os::unix::fs::MetadataExt;
    use tierfs_cache::journal::FileRef;
    use tierfs_store::{IdentityChoice, PosixStore};

    /// Writes journaled under a name the file lost before they were flushed (renamed in its
    /// directory: `w3/target1.tmp` -> `w3/target1`, the pattern of every atomic save) follow
    /// the file at replay, instead of a false "lost data" alarm in `journal/lost/` (issue 13
    /// item 2).
    #[test]
    fn pending_writes_follow_a_rename_in_their_directory() {
        let t = tempfile::tempdir().unwrap();
        let (back, jdir) = (t.path().join("back"), t.path().join("journal"));
        std::fs::create_dir_all(back.join("w3")).unwrap();
        std::fs::write(back.join("w3/target1.tmp"), vec![0u8; 8192]).unwrap();
        let ino = std::fs::metadata(back.join("w3/target1.tmp"))
            .unwrap()
            .ino();
        let store = IdStore::new(CountedStore::new(
            PosixStore::open_with(&back, IdentityChoice::Inode).unwrap(),
        ))
        .unwrap();
        let cfg = WbConfig {
            journal_size: 64 << 20,
            journal_segment: 8 << 20,
            ..WbConfig::default()
        };
        {
            let (j, _) =
                Journal::open(&jdir, store.store_id(), journal_config(&cfg), false).unwrap();
            let f = FileRef {
                dev: 0,
                ino,
                path: b"w3/target1.tmp".to_vec(),
            };
            j.append_data(&f, 0, &[7u8; 4096]).unwrap();
            j.append_data(&f, 4096, &[8u8; 4096]).unwrap();
            j.sync_all().unwrap();
            j.shutdown();
        }
        std::fs::rename(back.join("w3/target1.tmp"), back.join("w3/target1")).unwrap();
        replay_journal(&store, None, cfg, &jdir, false).unwrap();
        let got = std::fs::read(back.join("w3/target1")).unwrap();
        assert_eq!(&got[..4096], &[7u8; 4096][..]);
        assert_eq!(&got[4096..], &[8u8; 4096][..]);
        assert!(!jdir.join("lost").exists(), "a false lost-data alarm");
    }
}
