//! `tierfs mount BACKING MOUNTPOINT`: checks everything it can before detaching, so bad input
//! gets one clear line on stderr and a non-zero exit; then (unless --foreground) detaches and
//! returns only once the mount is up, like mount(8).
//!
//! Here: the order of it all, and the daemon's life (`serve`: the tiers opened, the mount,
//! the control socket, signals, and what is done at unmount). The checks themselves are in
//! `mount_checks`; the fork, logging and stdio of the daemon in `daemonize`.

use crate::any_store::AnyStore;
use crate::config::Config;
use crate::daemonize::{detach, init_logging, raise_fd_limit, redirect_stdio_to_null};
use crate::mount_checks::{
    check_nesting, config_segment_too_small, default_cache_dir, is_mount_point, prepare_cache_dir,
};
use crate::{commands, control, runtime};
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tierfs_store::Store;

pub struct MountArgs {
    pub backing: PathBuf,
    pub mountpoint: PathBuf,
    pub cache_dir: Option<PathBuf>,
    pub config: Config,
    pub foreground: bool,
    pub reset_cache: bool,
}

pub fn run(mut args: MountArgs) -> Result<()> {
    // Before any thread exists: one malloc arena, so that memory the RAM tier frees is
    // reused and its size bounds the daemon's (see `one_malloc_arena`).
    tierfs_fs::one_malloc_arena();
    // Everything that can be checked is checked before detaching.
    // A URL (s3://, sftp://) names a store that is no local directory.
    let url = args
        .backing
        .to_str()
        .filter(|b| b.starts_with("s3://") || b.starts_with("sftp://"))
        .map(str::to_string);
    let store = crate::store_open::open_store(&args.backing, url.as_deref(), &args.config)?;
    if crate::dead_mount::is_dead(&args.mountpoint) {
        crate::dead_mount::detach(&args.mountpoint)?;
        eprintln!("{}", crate::dead_mount::detached_note(&args.mountpoint));
    }
    let mountpoint = args
        .mountpoint
        .canonicalize()
        .with_context(|| format!("mountpoint {}", args.mountpoint.display()))?;
    if !mountpoint.is_dir() {
        bail!("mountpoint {} is not a directory", mountpoint.display());
    }
    if is_mount_point(&mountpoint)? {
        bail!(
            "mountpoint {} is busy: something is already mounted there",
            mountpoint.display()
        );
    }
    let cache_dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(|| default_cache_dir(store.store_id()));
    // Absolute: the registry records the control socket's path in it, and `tierfs stats` run
    // from another directory must find it (a relative `--cache-dir c` was registered as `c`).
    let cache_dir = std::path::absolute(&cache_dir)
        .with_context(|| format!("cache dir {}", cache_dir.display()))?;
    if url.is_none() {
        check_nesting(&args.backing, &mountpoint, &cache_dir)?;
    }
    let lock = prepare_cache_dir(&cache_dir)?;
    if let AnyStore::S3(s3) = &store {
        // Staged writes on the cache's disk (ENOSPC at write(), not at upload); contents an
        // upload could not place (another writer won) beside write-back's lost data.
        let staging = cache_dir.join("staging");
        s3.set_local_dirs(staging.clone(), cache_dir.join("journal").join("lost"))
            .with_context(|| format!("staging dir {}", staging.display()))?;
        s3.set_upload(
            args.config.s3_upload.part_size,
            args.config.s3_upload.parallel,
        );
    }
    if let Ok((total, _)) = tierfs_cache::device_space(&cache_dir) {
        args.config.fit_writeback_to(total);
    }
    args.config.validate()?;
    if config_segment_too_small(&args.config) {
        bail!(
            "option ssd.segment_size={} must be at least twice ssd.cluster_size={}",
            args.config.ssd.segment_size,
            args.config.ssd.cluster_size
        );
    }
    if std::fs::metadata("/dev/fuse").is_err() {
        bail!("/dev/fuse is missing: load the fuse module (modprobe fuse) or install fuse3");
    }
    let mut config = args.config;
    if config.fuse.fsname == "tierfs" {
        config.fuse.fsname = match (&store, &url) {
            (AnyStore::Sftp(s), _) => s.config().url.display(),
            (_, Some(url)) => url.clone(),
            (_, None) => args.backing.canonicalize()?.to_string_lossy().into_owned(),
        };
    }

    let ready = if args.foreground {
        None
    } else {
        Some(detach()?)
    };
    let result = serve(
        store,
        &mountpoint,
        &cache_dir,
        config,
        args.foreground,
        args.reset_cache,
        ready,
        lock,
    );
    if let Err(e) = &result {
        tracing::error!("{e:#}");
    }
    if !args.foreground {
        // The daemon: an error before the mount was up went to the parent, which printed it
        // as its one line; later ones go to the log (stderr is /dev/null by then). Printing
        // here too would give the user two lines.
        std::process::exit(if result.is_ok() { 0 } else { 1 });
    }
    result
}

/// Opens (or creates) the SSD tier in `<cache dir>/ssd`, rebuilding its index before the mount
/// serves anything.
fn open_ssd(
    cache_dir: &Path,
    store_id: &str,
    config: &Config,
    reset: bool,
) -> Result<Option<Arc<tierfs_fs::SsdCache>>> {
    if !config.ssd_enable {
        return Ok(None);
    }
    let ident = tierfs_fs::SsdIdentity {
        store_id: store_id.to_string(),
        block_size: config.fs.block_size as u32,
    };
    let t = std::time::Instant::now();
    let ssd = tierfs_fs::SsdCache::open(&cache_dir.join("ssd"), &ident, config.ssd.clone(), reset)
        .map_err(|e| anyhow::anyhow!("SSD tier: {e}"))?;
    if let Some(old) = ssd.rebuilt_from_format() {
        tracing::warn!(
            "SSD tier {}: on-disk format {old} of an older tierfs, rebuilt empty (its data is \
             fetched from the store again as it is read)",
            cache_dir.join("ssd").display()
        );
    }
    let st = ssd.stats();
    tracing::info!(
        "SSD tier: {} entries in {} segments ({} bytes of {} cap), index rebuilt in {} ms ({:.0?} to open)",
        st.entries,
        st.segments,
        st.fill_bytes,
        st.cap_bytes,
        st.rebuild_ms,
        t.elapsed()
    );
    Ok(Some(ssd))
}

#[allow(clippy::too_many_arguments)]
fn serve(
    store: AnyStore,
    mountpoint: &Path,
    cache_dir: &Path,
    config: Config,
    foreground: bool,
    reset_cache: bool,
    mut ready: Option<File>,
    _lock: File,
) -> Result<()> {
    init_logging(cache_dir, foreground);
    raise_fd_limit();
    // The kernel has applied the caller's umask to every mode it sends; apply none twice.
    unsafe { libc::umask(0) };
    let report = |ready: &mut Option<File>, msg: &str| {
        if let Some(mut w) = ready.take() {
            let _ = w.write_all(msg.as_bytes());
        }
    };
    let socket = cache_dir.join(control::SOCKET_NAME);
    // Everything that can fail is done before mounting (a failure after it would leave a dead
    // mount behind, e.g. a cache dir path too long for a unix socket) and reported through
    // `ready`, so the parent prints it as its one line.
    if let Some(why) = crate::store_open::LISTINGS_WHY.get() {
        tracing::info!(
            "directory listings: {} ({why})",
            if tierfs_store::Store::names_list_cheaper(&store) {
                "names first, entries stat'ed when one is asked for"
            } else {
                "with every entry's attributes"
            }
        );
    }
    tracing::info!(
        "store identity: by {} ({})",
        match tierfs_store::Store::identity(&store) {
            tierfs_store::Identity::Inode => "inode number",
            tierfs_store::Identity::Path => "path",
        },
        store.identity_reason()
    );
    if let AnyStore::S3(s3) = &store {
        let c = s3.config();
        tracing::info!(
            "S3 store: bucket {} prefix {:?} at {} (region {}), credentials from {}",
            c.bucket,
            c.prefix,
            c.endpoint.as_deref().unwrap_or("AWS"),
            c.region,
            c.credentials.source
        );
    }
    if let AnyStore::Sftp(s) = &store {
        let c = s.config();
        tracing::info!(
            "sftp store: {} (directory {} on the server) through {}{}, requests time out after {:?}, at most {} in flight",
            c.url.display(),
            s.root_path().display(),
            c.ssh,
            c.ssh_config.as_ref().map_or(String::new(), |f| format!(" -F {f}")),
            c.timeout,
            c.max_in_flight
        );
    }
    let setup = (|| -> Result<_> {
        let ssd = open_ssd(cache_dir, store.store_id(), &config, reset_cache)?;
        let shared = crate::shared_open::open(&store, &config.shared)?;
        let fs = tierfs_fs::Fs::with_ssd(store, config.fs.clone(), ssd)
            .map_err(|e| anyhow::anyhow!("backing store: {e}"))?;
        if let Some(tier) = shared {
            fs.set_shared_tier(tier);
        }
        // The RAM tier's size follows the host's memory from here on (ram.min..ram.max).
        fs.start_pressure(config.pressure_config(), config.pressure_enable)
            .context("memory pressure monitor")?;
        // Write-back's journal is replayed before anything is served, in either mode: a
        // write-through mount after a crashed write-back one must not lose its writes.
        let journal = cache_dir.join("journal");
        if config.wb.mode == tierfs_fs::WbMode::Back {
            fs.start_writeback(config.wb.clone(), &journal, reset_cache)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        } else if journal.exists() {
            fs.replay_journal(config.wb.clone(), &journal, reset_cache)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let listener = control::bind(&socket)?;
        let metrics = match config.metrics_addr {
            Some(addr) => Some(crate::metrics::start(addr, fs.clone())?),
            None => None,
        };
        let signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ])?;
        let mounted = tierfs_fuse::mount(fs.clone(), mountpoint, &config.fuse).map_err(|e| {
            let _ = std::fs::remove_file(&socket);
            anyhow::anyhow!("mount {}: {e}", mountpoint.display())
        })?;
        Ok((fs, mounted, signals, listener, metrics))
    })();
    let (fs, mut mounted, mut signals, listener, metrics) = match setup {
        Ok(x) => x,
        Err(e) => {
            report(&mut ready, &format!("{e:#}"));
            return Err(e);
        }
    };
    // The control socket is served once the mount is up: `set` reaches the kernel TTLs too.
    let mut in_force = config.clone();
    in_force.metrics_addr = metrics;
    let daemon = commands::Daemon {
        fs: fs.clone(),
        tunables: runtime::Tunables::new(
            runtime::Mount {
                fs: fs.clone(),
                ttls: mounted.ttls(),
            },
            in_force,
        ),
    };
    if let Err(e) = control::serve(listener, move |words| daemon.handle(words)) {
        // Mounted already: serve without a control socket rather than leave a dead mount.
        tracing::warn!("no control socket: {e:#}");
    }
    if let Some(addr) = metrics {
        tracing::info!("Prometheus metrics at http://{addr}/metrics");
    }
    let dev = tierfs_fuse::mount_device(mountpoint).ok();
    let registry = dev.as_ref().and_then(|dev| {
        control::register(dev, &socket)
            .map_err(|e| tracing::warn!("{e:#}"))
            .ok()
    });
    // Exit within 10 s of the mount going away or a signal, even while the store hangs.
    let watch = {
        let (fs, fs2) = (fs.clone(), fs.clone());
        crate::exit_watch::ExitWatch::start(
            dev,
            move || left_behind(&fs),
            move || fs2.drain_progress(),
        )
        .map_err(|e| tracing::warn!("no exit watch ({e}): a hung store may keep the daemon"))
        .ok()
    };

    // SIGINT/SIGTERM: unmount cleanly; the session loop then ends and we exit 0.
    let mut unmounter = mounted.unmounter();
    let mp = mountpoint.to_path_buf();
    let signal_watch = watch.clone();
    let spawned = std::thread::Builder::new()
        .name("tierfs-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!("signal {sig}: unmounting {}", mp.display());
                if let Some(w) = &signal_watch {
                    w.leaving(&format!("signal {sig}"));
                }
                if let Err(e) = unmounter.unmount() {
                    // Busy (a process has a file open there): detach it lazily so we can exit.
                    tracing::warn!("unmount failed ({e}); detaching lazily");
                    let _ = std::process::Command::new("fusermount3")
                        .arg("-uz")
                        .arg(&mp)
                        .status();
                }
            }
        });
    if let Err(e) = spawned {
        // Mounted already: serve without clean unmount on signals rather than leave it dead.
        tracing::warn!("no signal thread ({e}): SIGTERM will not unmount");
    }

    tracing::info!(
        "mounted {} on {} (cache dir {}, ram.max {} bytes, ram target {} bytes, block {} bytes)",
        fs.stats().store_id,
        mountpoint.display(),
        cache_dir.display(),
        config.fs.ram_max,
        fs.ram().capacity(),
        config.fs.block_size
    );
    report(&mut ready, "ok");
    if !foreground {
        redirect_stdio_to_null();
    }
    let r = mounted.run();
    if let Some(w) = &watch {
        w.leaving("unmounted");
    }
    if let Some(entry) = registry {
        // The kernel reuses a device number as soon as the mount is gone, i.e. before we get
        // here: a new mount may already have registered under the same name. Remove only our
        // own entry.
        if std::fs::read(&entry).is_ok_and(|e| e == socket.as_os_str().as_encoded_bytes()) {
            let _ = std::fs::remove_file(entry);
        }
    }
    let _ = std::fs::remove_file(&socket);
    // Every written byte to the backing store before we exit (and the journal closed).
    fs.shutdown_writeback();
    // Chunks read from the origin and still queued for the shared tier go up (briefly: the
    // next host reads the origin instead if they do not).
    if let Some(t) = fs.shared_tier() {
        if !t.drain(std::time::Duration::from_secs(10)) {
            tracing::info!("shared tier: uploads left undone at unmount");
        }
    }
    // Pending clusters written and the index checkpointed: the next mount starts warm
    // without scanning the log, and trusts this session's listings if nothing was left.
    fs.close_ssd();
    tracing::info!("unmounted {}", mountpoint.display());
    r.context("FUSE session")
}

/// What an early exit leaves for the next mount (see `exit_watch`).
fn left_behind<S: tierfs_store::Store>(fs: &tierfs_fs::Fs<S>) -> String {
    match fs.stats().writeback {
        Some(w) if w.dirty_bytes > 0 => format!(
            "{} bytes of write-back data in {} files stay in the journal and are written to the store at the next mount",
            w.dirty_bytes, w.dirty_files
        ),
        Some(_) => "no write-back data was pending".into(),
        None => "write-through: no data was pending".into(),
    }
}
