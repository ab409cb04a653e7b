//! The `tierfs` command.

mod any_store;
mod cache_cmd;
mod commands;
mod config;
mod config_keys;
mod config_sftp;
mod config_shared;
mod config_units;
mod control;
mod ctl_cmd;
mod daemonize;
mod dead_mount;
mod exit_watch;
mod fsck_cmd;
mod metrics;
mod mount_checks;
mod mount_cmd;
mod progress;
mod runtime;
mod shared_open;
mod stats_cmd;
mod store_open;
mod unmount_cmd;
mod warm_cmd;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "tierfs",
    version,
    about = "A tiered caching filesystem: a slow or remote store, served fast from RAM and a local SSD."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount BACKING (any directory: local, NFS, SMB, sshfs; or s3://BUCKET[/PREFIX]; or
    /// sftp://[USER@]HOST[:PORT]/PATH, through the system's ssh) at MOUNTPOINT through the
    /// cache.
    Mount {
        backing: PathBuf,
        mountpoint: PathBuf,
        /// Cache directory [default: /var/cache/tierfs/<store id> as root, else
        /// $XDG_CACHE_HOME/tierfs/<store id>]
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// TOML file of tunables (see docs/tunables.md)
        #[arg(long)]
        config: Option<PathBuf>,
        /// Tunables and mount options, comma-separated: -o ram.max=4G,meta.ttl=5s,allow_other
        #[arg(short = 'o', value_name = "OPTS")]
        options: Vec<String>,
        /// Stay in the foreground (log to stderr)
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Wipe the SSD tier in the cache directory and start it afresh (needed when the
        /// directory belongs to another store or is damaged beyond repair)
        #[arg(long)]
        reset_cache: bool,
        /// Serve Prometheus metrics at http://ADDR/metrics: PORT or :PORT listens on
        /// 127.0.0.1, IP:PORT as given (same as -o metrics_addr=ADDR; off by default)
        #[arg(long, value_name = "ADDR")]
        metrics_addr: Option<String>,
        /// The S3-compatible server of an s3:// store, http(s)://HOST[:PORT] (same as
        /// -o s3.endpoint=URL; default: AWS, or AWS_ENDPOINT_URL)
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// The region of an s3:// store (same as -o s3.region=; default: AWS_REGION,
        /// ~/.aws/config, else us-east-1)
        #[arg(long)]
        region: Option<String>,
    },
    /// Write every dirty byte to the store (with progress), then unmount and wait for the
    /// daemon to exit. (`umount` returns before write-back has drained.) A mount whose
    /// daemon died is detached.
    Unmount { mountpoint: PathBuf },
    /// Print the counters of a running mount.
    Stats {
        mountpoint: PathBuf,
        /// Every counter as JSON (hit ratios included)
        #[arg(long)]
        json: bool,
        /// Every counter after the summary, one per line
        #[arg(long)]
        all: bool,
        /// Live: a line of rates every SECONDS (like `zpool iostat 1`), until interrupted
        #[arg(short = 'i', long = "interval", value_name = "SECONDS")]
        interval: Option<f64>,
        /// Live: stop after COUNT lines
        #[arg(
            short = 'c',
            long = "count",
            value_name = "COUNT",
            requires = "interval"
        )]
        count: Option<u64>,
    },
    /// Pre-load files (and the files of directories, recursively) into the SSD tier of the
    /// tierfs mount they are on.
    Warm {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Write to the SSD tier as fast as it goes, ignoring its write budget
        /// (ssd.write_rate, ssd.write_burst)
        #[arg(long)]
        no_budget: bool,
        /// Files warmed at once
        #[arg(short = 'j', long, default_value_t = 4)]
        jobs: usize,
    },
    /// Drop files (and directories, recursively) from the RAM and SSD tiers of their mount.
    Evict {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Check a cache directory offline (its SSD tier and write-back journal); exit 0 if clean,
    /// 1 if problems were found, 2 if it could not be checked.
    Fsck {
        cache_dir: PathBuf,
        /// Repair what can be repaired, so the next mount starts cleanly (a journal with
        /// pending writes is never deleted)
        #[arg(long)]
        repair: bool,
    },
    /// Read or change the tunables of a running mount.
    Ctl {
        mountpoint: PathBuf,
        #[command(subcommand)]
        op: CtlOp,
    },
}

#[derive(Subcommand)]
enum CtlOp {
    /// Show tunables (all without KEY): value in force, and whether `set` may change it.
    Get {
        keys: Vec<String>,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Change tunables: KEY=VALUE, values as for -o (e.g. ssd.write_rate=50M meta.ttl=5s).
    Set {
        #[arg(required = true, value_name = "KEY=VALUE")]
        assignments: Vec<String>,
    },
}

/// mount(8) runs `mount.fuse.tierfs BACKING MOUNTPOINT [-sfnv] [-o OPTS]` (and mount.fuse3
/// runs `tierfs BACKING MOUNTPOINT -o OPTS`): both become `tierfs mount ...`.
fn normalize_args(mut args: Vec<OsString>) -> Vec<OsString> {
    let argv0 = args
        .first()
        .map(|a| PathBuf::from(a).file_name().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let helper = argv0.to_string_lossy().starts_with("mount.");
    let known = [
        "mount",
        "unmount",
        "stats",
        "warm",
        "evict",
        "fsck",
        "ctl",
        "help",
        "-h",
        "--help",
        "-V",
        "--version",
    ];
    let first = args.get(1).map(|a| a.to_string_lossy().into_owned());
    let needs_mount =
        helper || matches!(&first, Some(f) if !known.contains(&f.as_str()) && !f.starts_with('-'));
    if !needs_mount {
        return args;
    }
    if let (false, Some(f)) = (helper, &first) {
        // `tierfs BACKING MOUNTPOINT` is a mount; a word that is no path is a mistyped command
        // (`tierfs stat mnt`), not a backing directory to look for.
        if !f.contains('/') && !Path::new(f).exists() {
            let close = known
                .iter()
                .filter(|k| k.chars().next().is_some_and(|c| c.is_ascii_alphabetic()))
                .find(|k| k.starts_with(f.as_str()) || f.starts_with(*k));
            let hint = close.map_or(String::new(), |k| format!(" (did you mean {k:?}?)"));
            eprintln!(
                "tierfs: unknown command {f:?}{hint}; commands: mount, unmount, stats, warm, evict, fsck, ctl (tierfs --help)"
            );
            std::process::exit(2);
        }
    }
    args.insert(1, "mount".into());
    if helper {
        // mount(8)'s helper flags: -s sloppy, -f fake, -n no mtab, -v verbose; -t/-N take a value.
        let mut out = Vec::with_capacity(args.len());
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            match a.to_str() {
                Some("-s") | Some("-n") | Some("-v") => continue,
                Some("-f") => {
                    eprintln!("tierfs: fake mount (-f): nothing to do");
                    std::process::exit(0);
                }
                Some("-t") | Some("-N") => {
                    it.next();
                    continue;
                }
                _ => out.push(a),
            }
        }
        return out;
    }
    args
}

fn main() {
    let cli = Cli::parse_from(normalize_args(std::env::args_os().collect()));
    let result = match cli.cmd {
        Cmd::Mount {
            backing,
            mountpoint,
            cache_dir,
            config: config_file,
            options,
            foreground,
            reset_cache,
            metrics_addr,
            endpoint,
            region,
        } => (|| {
            // `-o cache_dir=DIR` and `-o config=FILE` are `--cache-dir` and `--config` for
            // an fstab line, which has nothing but its options field to give them.
            let mut cache_dir = cache_dir;
            let mut config_file = config_file;
            let mut opts = Vec::new();
            for opt in options.iter().flat_map(|g| g.split(',')) {
                let (slot, value, flag) = if let Some(v) = opt.strip_prefix("cache_dir=") {
                    (&mut cache_dir, v, "--cache-dir")
                } else if let Some(v) = opt.strip_prefix("config=") {
                    (&mut config_file, v, "--config")
                } else {
                    opts.push(opt);
                    continue;
                };
                if value.is_empty() {
                    anyhow::bail!("option {opt:?}: a path is needed");
                }
                if slot.as_deref().is_some_and(|p| p != Path::new(value)) {
                    anyhow::bail!("option {opt:?} contradicts {flag} (or an earlier {opt:?})");
                }
                *slot = Some(PathBuf::from(value));
            }
            let mut config = config::Config::default();
            if let Some(f) = &config_file {
                config.load_file(f)?;
            }
            for opt in opts {
                config.apply_mount_option(opt)?;
            }
            if let Some(a) = &metrics_addr {
                config.set("metrics_addr", a)?;
            }
            if let Some(e) = &endpoint {
                config.set("s3.endpoint", e)?;
                config.option_keys.push("s3.endpoint".into()); // (as `-o`: checked per store)
            }
            if let Some(r) = &region {
                config.set("s3.region", r)?;
                config.option_keys.push("s3.region".into());
            }
            mount_cmd::run(mount_cmd::MountArgs {
                backing,
                mountpoint,
                cache_dir,
                config,
                foreground,
                reset_cache,
            })
        })(),
        Cmd::Unmount { mountpoint } => unmount_cmd::run(&mountpoint),
        Cmd::Stats {
            mountpoint,
            json,
            all,
            interval,
            count,
        } => {
            // `tierfs stats | head` must end quietly like any Unix filter, not panic on EPIPE.
            // (Only here: the daemon must survive a control client that hangs up.)
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            stats_cmd::run(
                &mountpoint,
                stats_cmd::Mode {
                    json,
                    all,
                    interval,
                    count,
                },
            )
        }
        Cmd::Warm {
            paths,
            no_budget,
            jobs,
        } => warm_cmd::warm(&paths, !no_budget, jobs),
        Cmd::Evict { paths } => warm_cmd::evict(&paths),
        Cmd::Fsck { cache_dir, repair } => match fsck_cmd::run(&cache_dir, repair) {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                eprintln!("tierfs: {e:#}");
                std::process::exit(2);
            }
        },
        Cmd::Ctl { mountpoint, op } => {
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            match op {
                CtlOp::Get { keys, json } => ctl_cmd::get(&mountpoint, &keys, json),
                CtlOp::Set { assignments } => ctl_cmd::set(&mountpoint, &assignments),
            }
        }
    };
    if let Err(e) = result {
        eprintln!("tierfs: {e:#}");
        std::process::exit(1);
    }
}
