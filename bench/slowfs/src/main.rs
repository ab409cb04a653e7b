//! tierfs-slowfs: a FUSE passthrough that makes a local directory behave like slow storage
//! (a single HDD or a LAN NFS server), for benchmarking caches that sit on top of it.
//!
//! Kernel caching is off (direct I/O, zero TTLs), so every access by the client is a FUSE request
//! that pays the emulated cost. See `emu.rs` for the cost model.

mod backing;
mod emu;
mod filesystem;
mod fs;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use fuser::{Config, MountOption, Session, SessionACL};

#[derive(Parser, Debug)]
#[command(
    name = "tierfs-slowfs",
    about = "FUSE passthrough emulating slow storage (HDD / LAN NFS) for benchmarks"
)]
struct Args {
    /// Emulation profile: hdd, nfs-lan or none. Flags below override the profile's values.
    #[arg(long, default_value = "hdd")]
    profile: String,
    /// Round-trip latency added to every request (data and metadata), microseconds.
    #[arg(long)]
    latency_us: Option<u64>,
    /// Extra cost of each metadata request (not a read/write), microseconds.
    #[arg(long)]
    meta_us: Option<u64>,
    /// Penalty of a non-sequential read/write (occupies the device timeline), microseconds.
    #[arg(long)]
    seek_us: Option<u64>,
    /// Bandwidth cap shared by all threads, in MB/s (10^6 bytes/s); 0 = unlimited.
    #[arg(long)]
    bandwidth_mbps: Option<f64>,
    /// A sequential request arriving within this long after the device went idle continues the
    /// stream without a gap (drive track cache), microseconds.
    #[arg(long)]
    stream_gap_us: Option<u64>,
    /// Sequential detection: per-file (offset continues the previous access to the same file) or
    /// head (continues the previous access on the whole device).
    #[arg(long, value_enum)]
    seek_model: Option<emu::SeekModel>,
    /// FUSE worker threads (each with a cloned /dev/fuse fd).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Let other users access the mount (adds allow_other and default_permissions).
    #[arg(long)]
    allow_other: bool,
    /// Directory to expose.
    backing: PathBuf,
    /// Where to mount it.
    mountpoint: PathBuf,
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        // Blocked in this thread before any other thread exists, so every thread inherits the
        // mask and only the signal thread (sigwait) receives them.
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    // SAFETY: set is a valid, initialized signal set; sig is a valid out-pointer.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

fn main() {
    let args = Args::parse();
    let Some(mut p) = emu::Params::profile(&args.profile) else {
        eprintln!(
            "tierfs-slowfs: unknown profile {:?} (want hdd, nfs-lan or none)",
            args.profile
        );
        std::process::exit(2);
    };
    if let Some(v) = args.latency_us {
        p.latency = Duration::from_micros(v);
    }
    if let Some(v) = args.meta_us {
        p.meta = Duration::from_micros(v);
    }
    if let Some(v) = args.seek_us {
        p.seek = Duration::from_micros(v);
    }
    if let Some(v) = args.bandwidth_mbps {
        p.bandwidth = (v * 1e6).max(0.0) as u64;
    }
    if let Some(v) = args.stream_gap_us {
        p.stream_gap = Duration::from_micros(v);
    }
    if let Some(v) = args.seek_model {
        p.seek_model = v;
    }
    let sigset = block_signals();
    // Modes arrive from the kernel already umask-ed; do not apply ours a second time.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };

    let backing = match args.backing.canonicalize() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("tierfs-slowfs: backing {}: {e}", args.backing.display());
            std::process::exit(1);
        }
    };
    eprintln!(
        "tierfs-slowfs: emulation {} threads={} backing={} mountpoint={}",
        p.describe(),
        args.threads,
        backing.display(),
        args.mountpoint.display()
    );

    let stats = Arc::new(emu::Stats::default());
    let emu = emu::Emu::new(p, stats.clone());
    let fs = match fs::SlowFs::new(backing.clone(), emu) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tierfs-slowfs: {e}");
            std::process::exit(1);
        }
    };

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("slowfs:{}", backing.display())),
        MountOption::Subtype("tierfs-slowfs".into()),
    ];
    if args.allow_other {
        config.mount_options.push(MountOption::DefaultPermissions);
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(args.threads.max(1));
    config.clone_fd = true;

    let mut session = match Session::new(fs, &args.mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "tierfs-slowfs: mount {} failed: {e}",
                args.mountpoint.display()
            );
            std::process::exit(1);
        }
    };
    let mut unmounter = session.unmount_callable();
    let mnt = args.mountpoint.clone();
    let sig_stats = stats.clone();
    std::thread::Builder::new()
        .name("slowfs-signals".into())
        .spawn(move || {
            let mut unmounting = false;
            loop {
                let sig = wait_signal(&sigset);
                if sig == libc::SIGUSR1 {
                    // Counters so far, e.g. for a bench script measuring one phase.
                    eprintln!("tierfs-slowfs: stats {}", sig_stats.json());
                    continue;
                }
                if unmounting {
                    // A second signal while requests drain: give up immediately.
                    eprintln!("tierfs-slowfs: second signal {sig}, exiting");
                    std::process::exit(1);
                }
                unmounting = true;
                eprintln!("tierfs-slowfs: signal {sig}, unmounting");
                if let Err(e) = unmounter.unmount() {
                    eprintln!("tierfs-slowfs: unmount failed ({e}); detaching lazily and exiting");
                    if let Ok(c) = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()) {
                        // SAFETY: valid path.
                        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                    }
                    eprintln!("tierfs-slowfs: stats {}", sig_stats.json());
                    std::process::exit(1);
                }
            }
        })
        .expect("spawn signal thread");

    eprintln!("tierfs-slowfs: mounted {}", args.mountpoint.display());
    let res = session.run();
    eprintln!("tierfs-slowfs: stats {}", stats.json());
    if let Err(e) = res {
        eprintln!("tierfs-slowfs: session ended with error: {e}");
        std::process::exit(1);
    }
}
