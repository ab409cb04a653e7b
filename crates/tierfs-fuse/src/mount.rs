use crate::adapter::{Adapter, KernelTtls};
use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tierfs_fs::{Fs, Pool, Store};

/// Tunables of the FUSE adapter (docs/tunables.md).
#[derive(Clone, Debug)]
pub struct FuseConfig {
    /// fuser worker threads, each with its own /dev/fuse fd (`fuse.threads`).
    pub threads: usize,
    /// Threads that run requests which may block on the backing store (`fuse.io_threads`).
    pub io_threads: usize,
    /// How long the kernel trusts attributes (`fuse.attr_ttl`).
    pub attr_ttl: Duration,
    /// How long the kernel trusts names (`fuse.entry_ttl`).
    pub entry_ttl: Duration,
    /// Let other users see the mount (`allow_other`).
    pub allow_other: bool,
    /// Kernel read-ahead of the mount, KiB (`fuse.read_ahead_kb`); 0 leaves the default.
    pub read_ahead_kb: u32,
    /// Opens for writing only get direct I/O, past the page cache (`fuse.direct_write_only`).
    pub direct_write_only: bool,
    pub read_only: bool,
    /// Other kernel mount flags (nosuid, nodev, noexec, noatime, ...).
    pub flags: Vec<String>,
    /// Source shown in /proc/mounts.
    pub fsname: String,
}

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig {
            threads: 2,
            io_threads: 32,
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            allow_other: false,
            read_ahead_kb: 1024,
            direct_write_only: true,
            read_only: false,
            flags: Vec::new(),
            fsname: "tierfs".into(),
        }
    }
}

/// A live mount: serve it with [`Mounted::run`], end it with the unmounter.
pub struct Mounted<S: Store> {
    session: Session<Adapter<S>>,
    pub mountpoint: PathBuf,
    /// We called mount(2) ourselves (as root), so we unmount ourselves too.
    own_mount: bool,
    ttls: Arc<KernelTtls>,
}

/// Unmounts a [`Mounted`] from another thread (a signal handler).
pub enum Unmounter {
    Fuser(SessionUnmounter),
    Own(PathBuf),
}

impl Unmounter {
    /// A normal unmount; fails with EBUSY while files are open on the mount.
    pub fn unmount(&mut self) -> io::Result<()> {
        match self {
            Unmounter::Fuser(u) => u.unmount(),
            Unmounter::Own(mp) => {
                let c = CString::new(mp.as_os_str().as_bytes()).map_err(io::Error::other)?;
                if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }
}

impl<S: Store> Mounted<S> {
    pub fn unmounter(&mut self) -> Unmounter {
        if self.own_mount {
            Unmounter::Own(self.mountpoint.clone())
        } else {
            Unmounter::Fuser(self.session.unmount_callable())
        }
    }

    /// The kernel TTLs the mount replies with, to change them while it runs.
    pub fn ttls(&self) -> Arc<KernelTtls> {
        self.ttls.clone()
    }

    /// Serves requests until the filesystem is unmounted.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

/// Mounts `fs` at `mountpoint`. When this returns Ok, the kernel has finished the FUSE
/// handshake and the mount is visible; requests are served once [`Mounted::run`] is called.
pub fn mount<S: Store>(
    fs: Arc<Fs<S>>,
    mountpoint: &Path,
    cfg: &FuseConfig,
) -> io::Result<Mounted<S>> {
    let mut opts = vec![
        MountOption::FSName(cfg.fsname.clone()),
        MountOption::Subtype("tierfs".into()),
        // The kernel checks permissions from the attributes we return, as a local fs would.
        MountOption::DefaultPermissions,
    ];
    opts.push(if cfg.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    for f in &cfg.flags {
        opts.push(match f.as_str() {
            "nosuid" => MountOption::NoSuid,
            "suid" => MountOption::Suid,
            "nodev" => MountOption::NoDev,
            "dev" => MountOption::Dev,
            "noexec" => MountOption::NoExec,
            "exec" => MountOption::Exec,
            "noatime" => MountOption::NoAtime,
            "atime" => MountOption::Atime,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            other => MountOption::CUSTOM(other.to_string()),
        });
    }
    let mut config = Config::default();
    config.mount_options = opts;
    config.acl = if cfg.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(cfg.threads.max(1));
    config.clone_fd = true;
    let notifier = Arc::new(std::sync::OnceLock::new());
    fs.set_kernel_cache(Arc::new(crate::kernel_cache::PageDropper::start(
        notifier.clone(),
    )?));
    let ttls = Arc::new(KernelTtls::new(cfg.attr_ttl, cfg.entry_ttl));
    // Requests run on the FUSE thread that read them where the store cannot hang (or
    // `store.timeout=0` says to wait for it as for a disk) and another FUSE thread stays
    // free to read (see `inline`).
    let inline = (!fs.store_hang_guarded() && cfg.threads >= 2).then(Default::default);
    let adapter = Adapter {
        fs,
        pool: Pool::new("tierfs-io", cfg.io_threads),
        ttls: ttls.clone(),
        notifier: notifier.clone(),
        direct_write_only: cfg.direct_write_only,
        waiting: Default::default(),
        inline,
    };
    let own_mount = unsafe { libc::geteuid() } == 0;
    let session = if own_mount {
        let fd = mount_as_root(mountpoint, cfg)?;
        Session::from_fd(adapter, fd, config.acl, config)?
    } else {
        dev_fuse_open_to_us()?;
        // fusermount3 mounts for unprivileged users (and sets the fuse.tierfs type itself).
        Session::new(adapter, mountpoint, &config)?
    };
    let _ = notifier.set(session.notifier());
    if cfg.read_ahead_kb > 0 {
        if let Err(e) = set_read_ahead(mountpoint, cfg.read_ahead_kb) {
            tracing::info!(
                "could not raise the mount's read-ahead to {} KiB: {e}",
                cfg.read_ahead_kb
            );
        }
    }
    Ok(Mounted {
        session,
        mountpoint: mountpoint.to_path_buf(),
        own_mount,
        ttls,
    })
}

/// fuser opens /dev/fuse itself before it hands the mount to fusermount3, and where the
/// device is not open to this user (mode 0600 on some systems, 0660 with a `fuse` group on
/// others; Debian makes it 0666) its error is a bare "Permission denied" on the mountpoint.
fn dev_fuse_open_to_us() -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    else {
        return Ok(());
    };
    let how = match std::fs::metadata("/dev/fuse") {
        Ok(m) => format!(
            "it is mode {:04o}, owner uid {}, group gid {}",
            m.mode() & 0o7777,
            m.uid(),
            m.gid()
        ),
        Err(_) => "it is missing (modprobe fuse)".into(),
    };
    Err(io::Error::new(
        e.kind(),
        format!(
            "/dev/fuse: {e}: this user may not use FUSE ({how}); mount as root, or have \
             the administrator make /dev/fuse mode 0666 (Debian's default) or add this user \
             to its group"
        ),
    ))
}

/// As root, mount(2) directly with type `fuse.tierfs`, so the mount shows as such in
/// /proc/mounts, `findmnt -t fuse.tierfs` and `umount -t` (fuser's own root path always says
/// plain `fuse`).
fn mount_as_root(mountpoint: &Path, cfg: &FuseConfig) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let fd: OwnedFd = dev.into();
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
        fd.as_raw_fd(),
        unsafe { libc::getuid() },
        unsafe { libc::getgid() }
    );
    if cfg.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags: libc::c_ulong = 0;
    let has = |f: &str| cfg.flags.iter().any(|x| x == f);
    if !has("suid") {
        flags |= libc::MS_NOSUID;
    }
    if !has("dev") {
        flags |= libc::MS_NODEV;
    }
    for (name, bit) in [
        ("noexec", libc::MS_NOEXEC),
        ("noatime", libc::MS_NOATIME),
        ("sync", libc::MS_SYNCHRONOUS),
        ("dirsync", libc::MS_DIRSYNC),
    ] {
        if has(name) {
            flags |= bit;
        }
    }
    if cfg.read_only {
        flags |= libc::MS_RDONLY;
    }
    let c = |s: &str| CString::new(s).map_err(io::Error::other);
    let source = c(&cfg.fsname)?;
    let target = CString::new(mountpoint.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let fstype = c("fuse.tierfs")?;
    let data = c(&data)?;
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The kernel offers FUSE 128 KiB of read-ahead and fuser cannot raise it at INIT; the mount's
/// backing device info can be raised after mounting, which makes buffered sequential reads
/// arrive as 1 MiB requests (FUSE-NOTES lesson 3).
fn set_read_ahead(mountpoint: &Path, kb: u32) -> io::Result<()> {
    // The device number comes from mountinfo: a stat() of the mount would wait for a request
    // that no thread serves yet.
    let dev = mount_device(mountpoint)?;
    std::fs::write(
        format!("/sys/class/bdi/{dev}/read_ahead_kb"),
        kb.to_string(),
    )
}

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug)]
pub struct MountInfo {
    /// `major:minor` of the mount's device.
    pub dev: String,
    pub fstype: String,
    pub source: String,
}

/// The newest mount at `mountpoint` (an absolute, canonical path), from /proc/self/mountinfo.
pub fn find_mount(mountpoint: &Path) -> io::Result<Option<MountInfo>> {
    let want = mountpoint.to_string_lossy();
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() <= 4 || unescape(f[4]) != want {
            return None;
        }
        let sep = f.iter().position(|x| *x == "-")?;
        Some(MountInfo {
            dev: f[2].to_string(),
            fstype: f.get(sep + 1)?.to_string(),
            source: unescape(f.get(sep + 2)?),
        })
    }))
}

/// `major:minor` of the newest mount at `mountpoint`.
pub fn mount_device(mountpoint: &Path) -> io::Result<String> {
    find_mount(mountpoint)?
        .map(|m| m.dev)
        .ok_or_else(|| io::Error::other(format!("{} is not in mountinfo", mountpoint.display())))
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
