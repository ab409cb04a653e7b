//! The control plane: a unix socket (mode 0600) in the cache directory, and a registry that
//! maps a mount (by its device number) to its socket, so `tierfs stats MOUNTPOINT` finds it.
//!
//! Protocol: the client sends one command line (`stats`), the daemon answers one JSON line.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const SOCKET_NAME: &str = "control.sock";

/// Where running mounts are registered: /run/tierfs as root, else the user's runtime dir.
pub fn runtime_dir() -> PathBuf {
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/run/tierfs");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("tierfs"),
        _ => PathBuf::from(format!("/tmp/tierfs-{}", unsafe { libc::geteuid() })),
    }
}

fn registry_entry(dev: &str) -> PathBuf {
    runtime_dir().join("mounts").join(dev.replace(':', "_"))
}

/// Records that the mount with device `dev` is served through `socket`.
pub fn register(dev: &str, socket: &Path) -> Result<PathBuf> {
    let entry = registry_entry(dev);
    let dir = entry.parent().expect("has parent");
    std::fs::create_dir_all(dir).with_context(|| format!("runtime dir {}", dir.display()))?;
    std::fs::set_permissions(runtime_dir(), std::fs::Permissions::from_mode(0o700)).ok();
    std::fs::write(&entry, socket.as_os_str().as_encoded_bytes())
        .with_context(|| format!("registry {}", entry.display()))?;
    Ok(entry)
}

/// Finds the control socket of the tierfs mount at `mountpoint`.
pub fn socket_for_mount(mountpoint: &Path) -> Result<PathBuf> {
    let canon = mountpoint
        .canonicalize()
        .with_context(|| format!("mountpoint {}", mountpoint.display()))?;
    let Some(m) = tierfs_fuse::find_mount(&canon)? else {
        bail!("{} is not a mount point", canon.display());
    };
    if m.fstype != "fuse.tierfs" {
        bail!(
            "{} is not a tierfs mount (it is {})",
            canon.display(),
            m.fstype
        );
    }
    let entry = registry_entry(&m.dev);
    let sock = std::fs::read(&entry).with_context(|| {
        format!(
            "{} is a tierfs mount but its control socket is not registered in {}",
            canon.display(),
            entry.display()
        )
    })?;
    Ok(PathBuf::from(String::from_utf8_lossy(&sock).into_owned()))
}

/// Sends one command, returns the daemon's answer.
pub fn request(socket: &Path, cmd: &str) -> Result<String> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("control socket {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    writeln!(s, "{cmd}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    if line.is_empty() {
        bail!("the daemon closed the control socket without answering");
    }
    Ok(line)
}

/// Serves the control socket on a thread. `handle` maps a command to a JSON answer.
pub fn serve(socket: &Path, handle: impl Fn(&str) -> String + Send + 'static) -> Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)
        .with_context(|| format!("control socket {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    std::thread::Builder::new()
        .name("tierfs-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut line = String::new();
                if BufReader::new(&conn).read_line(&mut line).is_ok() {
                    let answer = handle(line.trim());
                    let _ = writeln!(conn, "{answer}");
                }
            }
        })?;
    Ok(())
}

/// [`request`] for a command that may take long (`tierfs warm` of a large file waits for the
/// SSD write budget): no timeout on the answer. A daemon that dies closes the socket, which
/// ends the wait with an error.
pub fn request_patient(socket: &Path, cmd: &str) -> Result<String> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("control socket {}", socket.display()))?;
    writeln!(s, "{cmd}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    if line.is_empty() {
        bail!("the daemon closed the control socket without answering");
    }
    Ok(line)
}
