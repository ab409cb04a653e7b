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
        let target = open_by_path(store, path).and_then(|(node, attr)| {
            if by_inode && attr.ino != ino {
                return Err(Errno::ESTALE);
            }
            store.open(&node, libc::O_WRONLY)
        });
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
