//! `Journal::open`: the scan of what is there (`replay`), the tail made ready for appends,
//! the writer started.

use super::*;

impl Journal {
    /// Opens (or creates) the journal in `dir` for the store `store_id`, replays it and starts
    /// the writer. `reset` deletes whatever journal is there first (its pending writes are
    /// lost: for a journal the caller has given up on).
    ///
    /// Records of the last segment after a torn or garbled one with nothing valid after it are
    /// ignored (a crash mid-write: none of them was acknowledged as durable) and the segment is
    /// sealed there; new records go to a new segment. A bad stretch with valid records after
    /// it is damage: skipped, listed in `Replay::damage`, and the pending writes of the files it
    /// may concern are in `Replay::lost` instead of `pending` (damage.rs).
    pub fn open(
        dir: &Path,
        store_id: &str,
        cfg: JournalConfig,
        reset: bool,
    ) -> Result<(Journal, Replay), JournalError> {
        cfg.validate()?;
        crate::private::dir_all(dir).map_err(io_err("create", dir))?;
        if reset {
            wipe(dir)?;
        }
        let tmp = dir.join(superblock::TMP);
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err("delete", &tmp)(e))
            }
            _ => {}
        }
        let seg_list = replay::list_segments(dir)?;
        let sb = match superblock::load(dir, store_id)? {
            // An older format's records are all read by this version: the superblock says
            // the newer one from now on, so NS records written next are never given to a
            // version that would not know them.
            Some(mut sb) if sb.format < format::FORMAT => {
                sb.format = format::FORMAT;
                superblock::store(dir, store_id, &sb)?;
                sb
            }
            Some(sb) => sb,
            None if !seg_list.is_empty() => {
                return Err(JournalError::Damaged {
                    path: dir.join(superblock::FILE),
                    offset: 0,
                    what: "superblock missing beside segment files".into(),
                })
            }
            None => {
                let sb = superblock::Superblock {
                    uuid: io::random_uuid(),
                    segment_size: cfg.segment_size,
                    format: format::FORMAT,
                };
                superblock::store(dir, store_id, &sb)?;
                sb
            }
        };

        let mut opened = BTreeMap::new();
        for &seg in &seg_list {
            let path = dir.join(seg_name(seg));
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_err("open", &path))?;
            opened.insert(seg, (path, f));
        }
        let sc = replay::scan(dir, &sb.uuid, &opened)?;
        let mut seg_list = seg_list;
        for &seg in &sc.spares {
            // Created ahead of time and never used: removed (the writer makes a new one).
            let (path, _) = opened
                .remove(&seg)
                .expect("a spare is one of the opened files");
            fs::remove_file(&path).map_err(io_err("delete", &path))?;
            io::sync_dir(dir).map_err(io_err("fsync", dir))?;
            seg_list.retain(|&s| s != seg);
        }
        let mut next_seq = sc.last_seq + 1;
        if let Some((seg, off)) = sc.unsealed_last {
            // Seal the last segment where its valid records end, so that once newer segments
            // exist its end is told from damage; the torn bytes after it are never read again.
            let (path, f) = &opened[&seg];
            let mut buf = Vec::new();
            format::encode_seal(&mut buf, format::seg_seed(&sb.uuid, seg), next_seq, off);
            next_seq += 1;
            io::write_all_at(f, &buf, off).map_err(io_err("write", path))?;
            io::fdatasync(f).map_err(io_err("fdatasync", path))?;
        } else if let Some((path, f)) = opened.values().next_back() {
            // What the scan read may have been in the page cache only (the process died, the
            // machine did not); DONEs read here are about to free space, so make them durable.
            io::fdatasync(f).map_err(io_err("fdatasync", path))?;
        }

        let (space, mut rp) = pending_of(sc.segs, sc.marks, sc.data, sc.replay);
        rp.pending_ns = sc
            .ns
            .into_iter()
            .filter(|n| !space.covered(&format::NS_KEY, n.seq))
            .collect();

        let last_seg = seg_list.last().copied().unwrap_or(0);
        let c = Counters {
            torn_tails: rp.torn_tail.is_some() as u64,
            replayed_records: rp.pending.len() as u64,
            replayed_bytes: rp.pending_bytes,
            ..Counters::default()
        };
        let st = State {
            next_seq,
            tail: Tail {
                seg: last_seg + 1,
                off: 0,
                open: false,
                seed: 0,
            },
            runs: Vec::new(),
            queued: 0,
            spare: Vec::new(),
            space,
            marks: VecDeque::new(),
            written_seq: next_seq - 1,
            durable_seq: next_seq - 1,
            // The last existing segment stays until the writer starts a new one, so segment
            // numbers and seqs never go back (nothing is ever written under an old name).
            writer_seg: last_seg,
            sync_want: 0,
            woken: false,
            space_waiters: 0,
            ready: None,
            want_ready: false,
            create_failures: 0,
            no_space: None,
            no_space_said: false,
            retry_at: None,
            failed: None,
            shutdown: false,
            writer_done: false,
            c,
        };
        let files = opened
            .into_iter()
            .map(|(seg, (_, f))| (seg, Arc::new(f)))
            .collect();
        let sh = Arc::new(Shared {
            dir: dir.to_path_buf(),
            cfg,
            uuid: sb.uuid,
            st: Mutex::new(st),
            writer_cv: Condvar::new(),
            durable_cv: Condvar::new(),
            drained_cv: Condvar::new(),
            space_cv: Condvar::new(),
            files: Mutex::new(files),
            space_hook: Mutex::new(None),
        });
        sh.free_covered()?;
        let w = Arc::clone(&sh);
        let handle = std::thread::Builder::new()
            .name("tierfs-journal".into())
            .spawn(move || writer::run(w))
            .map_err(io_err("start writer thread for", dir))?;
        Ok((
            Journal {
                sh,
                writer: Mutex::new(Some(handle)),
            },
            rp,
        ))
    }
}
