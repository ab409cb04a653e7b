//! How the mount's process becomes its daemon: the fork whose parent waits for the daemon's
//! word on a pipe (and exits with it, like mount(8)), logging (stderr in the foreground,
//! else `tierfs.log` in the cache dir), stdio to /dev/null once mounted, and the open-files
//! limit raised.

use anyhow::{bail, Result};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::Arc;

/// Forks. The parent waits for the child's word on a pipe and exits with it; the child returns
/// the pipe's write end and carries on as the daemon.
pub(crate) fn detach() -> Result<File> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let (r, w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    match unsafe { libc::fork() } {
        -1 => bail!("fork: {}", std::io::Error::last_os_error()),
        0 => {
            drop(r);
            unsafe { libc::setsid() };
            Ok(w)
        }
        _ => {
            drop(w);
            let mut msg = String::new();
            let mut r = r;
            let _ = r.read_to_string(&mut msg);
            if msg == "ok" {
                std::process::exit(0);
            }
            let msg = if msg.is_empty() {
                "the daemon exited before the mount was ready".into()
            } else {
                msg
            };
            eprintln!("tierfs: {msg}");
            std::process::exit(1);
        }
    }
}

pub(crate) fn redirect_stdio_to_null() {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    if let Ok(null) = null {
        for fd in 0..3 {
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

pub(crate) fn init_logging(cache_dir: &Path, foreground: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIERFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if foreground {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Colours only for a terminal: not into a file or a pipe.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    } else if let Ok(f) = tierfs_cache::private::options()
        .create(true)
        .append(true)
        .open(cache_dir.join("tierfs.log"))
    {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(Arc::new(f))
            .try_init();
    }
}

pub(crate) fn raise_fd_limit() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
}
