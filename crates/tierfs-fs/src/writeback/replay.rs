//! Start of write-back: the journal is opened and what it holds that is not known to be on
//! the backing store is written there (and synced) before the mount serves anything.

use super::{stats::WbCounters, WbConfig, Writeback};
use crate::data::Objects;
use crate::shared::{Node, St};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tierfs_cache::journal::{Journal, JournalConfig, PendingWrite};
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
        if let Some((file, off, why)) = &replay.torn_tail {
            tracing::warn!(
                "write-back journal: torn tail in {} at {off} ({why}): records after it were never acknowledged as durable",
                file.display()
            );
        }
        let c = WbCounters::default();
        if !replay.pending.is_empty() {
            eprintln!(
                "tierfs: replaying {} writes ({:.1} MiB) from the write-back journal...",
                replay.pending.len(),
                replay.pending_bytes as f64 / 1048576.0
            );
            replay_pending(&sh.store, &journal, &replay.pending, dir, &c)?;
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
        });
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
    cfg: WbConfig,
    dir: &Path,
    reset: bool,
) -> std::result::Result<(), String> {
    let (journal, replay) = open_journal(dir, store.store_id(), journal_config(&cfg), reset)?;
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
) -> std::result::Result<(), String> {
    let mut by_file: BTreeMap<(u64, u64), Vec<&PendingWrite>> = BTreeMap::new();
    for p in pending {
        by_file.entry((p.file.dev, p.file.ino)).or_default().push(p);
    }
    for ((dev, ino), writes) in by_file {
        let path = &writes[writes.len() - 1].file.path;
        let shown = String::from_utf8_lossy(path).into_owned();
        // With inode identities the path must still hold that inode (journals of tierfs
        // before identities had the device number in `dev`: not compared). With path
        // identities the path is the file.
        let by_inode = store.identity_kind() == tierfs_store::Identity::Inode;
        let found = open_by_path(store, path).and_then(|(node, attr)| {
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
        .and_then(|node| store.open(&node, libc::O_WRONLY));
        let mut upto = 0;
        match target {
            Ok(h) => {
                for w in &writes {
                    let data = journal
                        .read_pending(w)
                        .map_err(|e| format!("write-back journal: {e}"))?;
                    store.write(&h, w.offset, &data).map_err(|e| {
                        format!("replaying the write-back journal into {shown}: {e}")
                    })?;
                    c.replayed_writes.fetch_add(1, Relaxed);
                    c.replayed_bytes.fetch_add(data.len() as u64, Relaxed);
                    upto = upto.max(w.seq);
                }
                store.fsync(&h, false).map_err(|e| {
                    format!("replaying the write-back journal into {shown}: fsync: {e}")
                })?;
            }
            Err(e) => {
                let lost = dir.join("lost");
                tierfs_cache::private::dir_all(&lost)
                    .map_err(|e| format!("{}: {e}", lost.display()))?;
                let f = lost.join(format!("{dev:x}-{ino}"));
                tracing::error!(
                        "write-back replay: {shown} ({e}): {} pending writes saved to {} at their offsets",
                        writes.len(),
                        f.display()
                    );
                let out = tierfs_cache::private::options()
                    .create(true)
                    .write(true)
                    .truncate(false)
                    .open(&f)
                    .map_err(|e| format!("{}: {e}", f.display()))?;
                for w in &writes {
                    use std::os::unix::fs::FileExt;
                    let data = journal
                        .read_pending(w)
                        .map_err(|e| format!("write-back journal: {e}"))?;
                    out.write_all_at(&data, w.offset)
                        .map_err(|e| format!("{}: {e}", f.display()))?;
                    upto = upto.max(w.seq);
                }
                out.sync_all()
                    .map_err(|e| format!("{}: {e}", f.display()))?;
                c.replay_lost_files.fetch_add(1, Relaxed);
            }
        }
        journal
            .done(dev, ino, upto)
            .map_err(|e| format!("write-back journal: {e}"))?;
    }
    journal
        .sync_all()
        .map_err(|e| format!("write-back journal: {e}"))?;
    Ok(())
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
    let (dir, _) = open_by_path(store, parent).ok()?;
    let entry = store
        .readdir(&dir)
        .ok()?
        .into_iter()
        .find(|e| e.ino == ino && e.kind != Some(tierfs_store::FileKind::Dir))?;
    let (node, attr) = store.lookup(&dir, &entry.name).ok()?;
    (attr.ino == ino && attr.kind == tierfs_store::FileKind::File).then_some((node, entry.name))
}

/// Resolves a backing path from the root, one component at a time (never following
/// symlinks: the store's lookup does not).
fn open_by_path<S: Store>(
    store: &St<S>,
    path: &[u8],
) -> tierfs_store::Result<(Node<S>, tierfs_store::Attr)> {
    let (mut node, mut attr) = store.root()?;
    for comp in path.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        let (n, a) = store.lookup(&node, OsStr::from_bytes(comp))?;
        node = n;
        attr = a;
    }
    Ok((node, attr))
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
        replay_journal(&store, cfg, &jdir, false).unwrap();
        let got = std::fs::read(back.join("w3/target1")).unwrap();
        assert_eq!(&got[..4096], &[7u8; 4096][..]);
        assert_eq!(&got[4096..], &[8u8; 4096][..]);
        assert!(!jdir.join("lost").exists(), "a false lost-data alarm");
    }
}
