//! Opening the SSD tier: the directory's lock, its superblock (a directory of another
//! on-disk format is wiped and rebuilt, never misread), the index rebuilt from the last
//! checkpoint and the summaries written after it, a new session begun, and the writer thread
//! started. Apart from `mod.rs`, which keeps what an open tier does.

use super::error::io_err;
use super::writer::Writer;
use super::{has_tier_files, io, recover, session, superblock, wipe};
use super::{SessionState, Shared, SsdCache, SsdConfig, SsdError, SsdIdentity};
use super::{LOCK_FILE, QUEUE_LEN};
use crossbeam_channel::bounded;
use parking_lot::Mutex;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

impl SsdCache {
    /// Opens or creates the tier in `dir` (created if missing). `reset` wipes and recreates it.
    /// Rebuilds the index (checkpoint + segment summaries newer than it) before returning.
    pub fn open(
        dir: &Path,
        ident: &SsdIdentity,
        cfg: SsdConfig,
        reset: bool,
    ) -> Result<Arc<SsdCache>, SsdError> {
        Self::open_inner(dir, ident, cfg, reset, true)
    }

    /// `open`, with O_DIRECT off from the start if `direct` is false (tests of the buffered
    /// path, which filesystems that refuse O_DIRECT take).
    pub(crate) fn open_inner(
        dir: &Path,
        ident: &SsdIdentity,
        cfg: SsdConfig,
        reset: bool,
        direct: bool,
    ) -> Result<Arc<SsdCache>, SsdError> {
        let t0 = Instant::now();
        cfg.validate()?;
        crate::private::dir_all(dir).map_err(io_err("create", dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = io::lock_file(&lock_path)
            .map_err(io_err("lock", &lock_path))?
            .ok_or_else(|| SsdError::Busy {
                dir: dir.to_path_buf(),
            })?;
        if reset {
            wipe(dir)?;
        }
        let (total, _) = io::device_space(dir).map_err(io_err("statvfs", dir))?;
        let auto = (total as u128 * cfg.max_fill_pct as u128 / 100) as u64;
        let cap = if cfg.max_size == 0 {
            auto
        } else {
            cfg.max_size.min(auto)
        };
        let mut cfg = cfg;
        cfg.segment_size = cfg.segment_size_for(cap)?;
        // Another on-disk format (an older tierfs wrote it): a cache, so rebuilt, never
        // misread and never refused (the mount says so in its log: `rebuilt_from_format`).
        let mut rebuilt_from = None;
        let loaded = match superblock::load(dir, ident) {
            Err(SsdError::WrongFormat { found, .. }) => {
                wipe(dir)?;
                rebuilt_from = Some(found);
                None
            }
            r => r?,
        };
        let sb = match loaded {
            Some(sb) => {
                if sb.segment_size != cfg.segment_size {
                    // Segments are self-delimiting; the recorded size is the one in force.
                    let sb = superblock::Superblock {
                        segment_size: cfg.segment_size,
                        ..sb
                    };
                    superblock::store(dir, ident, &sb)?;
                    sb
                } else {
                    sb
                }
            }
            None => {
                if has_tier_files(dir)? {
                    return Err(SsdError::Damaged {
                        dir: dir.to_path_buf(),
                        what: "segment files but no superblock".into(),
                    });
                }
                let sb = superblock::Superblock {
                    uuid: io::random_uuid(),
                    segment_size: cfg.segment_size,
                };
                superblock::store(dir, ident, &sb)?;
                sb
            }
        };
        let sh = Arc::new(Shared::new(dir, cfg, sb.uuid, cap, direct));
        sh.windows.start_prefetch();
        let rec = recover::recover(&sh, recover::Mode::Repair)?;
        sh.fill
            .store(rec.segs.values().map(|s| s.len).sum(), Relaxed);
        sh.segments.store(rec.segs.len() as u64, Relaxed);
        sh.ctr.rebuilt_entries.store(rec.entries, Relaxed);
        sh.ctr
            .rebuild_ms
            .store(t0.elapsed().as_millis() as u64, Relaxed);
        // Before anything is served: a crash from here on leaves "open" (see `session`).
        // A log cut short or a checkpoint lost may have taken tombstones with it: records
        // the last session dropped could be back, so its epoch is not kept.
        let intact = rec.found.torn.is_empty()
            && rec.found.unopenable.is_empty()
            && !matches!(rec.found.checkpoint, recover::CheckpointState::Unusable(_));
        let last = session::load(dir).map(|s| session::Session {
            clean: s.clean && intact,
            ..s
        });
        let (epoch, distrusted) = session::begin(dir, last)?;
        let (tx, rx) = bounded(QUEUE_LEN);
        let w = Writer::new(sh.clone(), rx, rec)
            .ok_or_else(|| SsdError::Config("cannot allocate the cluster buffers".into()))?;
        let handle = std::thread::Builder::new()
            .name("tierfs-ssd-writer".into())
            .spawn(move || w.run())
            .map_err(io_err("start the writer thread for", dir))?;
        Ok(Arc::new(SsdCache {
            sh,
            tx,
            writer: Mutex::new(Some(handle)),
            rebuilt_from,
            epoch,
            last_clean: last.is_some_and(|s| s.clean),
            session: Mutex::new(SessionState {
                distrusted,
                ..Default::default()
            }),
            _lock: lock,
        }))
    }
}
