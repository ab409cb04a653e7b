//! The control plane's transport: a unix socket (mode 0600) in the cache directory, and a
//! registry that maps a mount (by its device number) to its socket, so `tierfs stats
//! MOUNTPOINT` and `tierfs ctl MOUNTPOINT ...` find it. Protocol: docs/control.md.
//!
//! One request per connection: the client sends one line, a JSON array of strings
//! (`["set","ssd.write_rate=50M"]`; a line that is not JSON is split on whitespace, for
//! hand use with socat), the daemon answers one line, a JSON object (`{"error": "..."}` if
//! the request failed). Each connection is served on its own thread, so a slow command
//! never holds up `stats`. Only the mount's owner (the daemon's uid) and root are served:
//! the socket's mode keeps others out, and the peer's credentials (SO_PEERCRED) are checked
//! again on every connection, so a socket made reachable by mistake still refuses them.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

pub const SOCKET_NAME: &str = "control.sock";

/// Connections served at once; more are answered "busy" (a runaway client must not make the
/// daemon spawn threads without bound).
const MAX_CONNECTIONS: usize = 32;
/// Longest request line: commands are short.
const MAX_REQUEST: u64 = 64 << 10;

/// Where running mounts are registered: /run/tierfs as root, else the user's runtime dir.
pub fn runtime_dir() -> PathBuf {
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/run/tierfs");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("tierfs"),
        // Without one (a cron job, a service without a session): under the home directory
        // if it is ours, which no other user can plant first, as one could a name in /tmp
        // (there `check_registry` refuses what someone else made).
        _ => match std::env::var_os("HOME").map(PathBuf::from) {
            Some(h) if is_own_dir(&h) => h.join(".local/state/tierfs"),
            _ => PathBuf::from(format!("/tmp/tierfs-{}", unsafe { libc::geteuid() })),
        },
    }
}

/// A directory of the calling user's (not `/`, not someone else's home inherited by `su`).
fn is_own_dir(d: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    d.is_absolute()
        && d != Path::new("/")
        && std::fs::metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == unsafe { libc::geteuid() })
}

/// The registry's directories must be ours: without `XDG_RUNTIME_DIR` it lives in `/tmp`,
/// where another user could make `/tmp/tierfs-<uid>` first and register their own socket
/// for our mounts (and read what `ctl` sends, or answer `stats` with made-up numbers).
fn check_registry(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = unsafe { libc::geteuid() };
    for d in [dir, &dir.join("mounts")] {
        let m = match std::fs::symlink_metadata(d) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("registry {}", d.display())),
        };
        if !m.file_type().is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
            bail!(
                "registry {} is not a private directory of uid {me} (owner uid {}, mode {:o}): not trusted; remove it",
                d.display(),
                m.uid(),
                m.mode() & 0o7777
            );
        }
    }
    Ok(())
}

fn registry_entry(dev: &str) -> PathBuf {
    runtime_dir().join("mounts").join(dev.replace(':', "_"))
}

/// Records that the mount with device `dev` is served through `socket`.
pub fn register(dev: &str, socket: &Path) -> Result<PathBuf> {
    let entry = registry_entry(dev);
    let dir = entry.parent().expect("has parent");
    check_registry(&runtime_dir())?;
    tierfs_cache::private::dir_all(dir)
        .with_context(|| format!("runtime dir {}", dir.display()))?;
    tierfs_cache::private::tighten(&runtime_dir()).ok();
    tierfs_cache::private::write(&entry, socket.as_os_str().as_encoded_bytes())
        .with_context(|| format!("registry {}", entry.display()))?;
    Ok(entry)
}

/// Finds the control socket of the tierfs mount at `mountpoint`.
pub fn socket_for_mount(mountpoint: &Path) -> Result<PathBuf> {
    if crate::dead_mount::is_dead(mountpoint) {
        bail!(
            "{}: the tierfs daemon of this mount is gone (killed?); `tierfs unmount {}` detaches the dead mount",
            mountpoint.display(),
            mountpoint.display()
        );
    }
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
    check_registry(&runtime_dir())?;
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

/// Sends one request (a command word and its arguments) and returns the daemon's answer;
/// an `{"error": ...}` answer becomes an error.
pub fn request(socket: &Path, words: &[&str]) -> Result<Value> {
    let (mut s, _) = connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    writeln!(s, "{}", serde_json::to_string(words)?)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    if line.is_empty() {
        bail!("the daemon closed the control socket without answering");
    }
    let v: Value = serde_json::from_str(&line).context("daemon answered with invalid JSON")?;
    if let Some(e) = v.get("error") {
        bail!(
            "{}",
            e.as_str().map_or_else(|| e.to_string(), str::to_string)
        );
    }
    Ok(v)
}

/// Connects to a daemon's control socket; returns the connection and the daemon's pid.
/// Only our own daemon (or root's) may answer: a socket someone else listens on is not.
pub fn connect(socket: &Path) -> Result<(UnixStream, i32)> {
    let s = UnixStream::connect(socket)
        .with_context(|| format!("control socket {}", socket.display()))?;
    let me = unsafe { libc::geteuid() };
    let p = peer(&s).with_context(|| format!("control socket {}", socket.display()))?;
    if p.uid != me && p.uid != 0 {
        bail!(
            "control socket {} is served by uid {}, not by a tierfs daemon of uid {me} or root: not trusted",
            socket.display(),
            p.uid
        );
    }
    Ok((s, p.pid))
}

/// A request line as words: a JSON array of strings, or whitespace-separated words.
pub fn parse_request(line: &str) -> Result<Vec<String>, String> {
    let line = line.trim();
    if line.starts_with('[') {
        return serde_json::from_str::<Vec<String>>(line)
            .map_err(|e| format!("bad request (a JSON array of strings): {e}"));
    }
    Ok(line.split_whitespace().map(str::to_string).collect())
}

/// An error answer.
pub fn error(msg: impl std::fmt::Display) -> Value {
    serde_json::json!({ "error": msg.to_string() })
}

/// The credentials of the process at the other end of a unix socket.
struct Peer {
    pid: i32,
    uid: u32,
}

fn peer(conn: &UnixStream) -> std::io::Result<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Peer {
        pid: cred.pid,
        uid: cred.uid,
    })
}

/// Creates the socket (replacing a stale one), mode 0600. Done before mounting, so a path
/// too long for a unix socket fails the mount instead of leaving it uncontrollable.
pub fn bind(socket: &Path) -> Result<UnixListener> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)
        .with_context(|| format!("control socket {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves the socket on a thread, each connection on a thread of its own. `handle` maps a
/// request's words to the JSON answer.
pub fn serve(
    listener: UnixListener,
    handle: impl Fn(&[String]) -> Value + Send + Sync + 'static,
) -> Result<()> {
    let handle = Arc::new(handle);
    let owner = unsafe { libc::geteuid() };
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("tierfs-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
                match peer(&conn) {
                    Ok(p) if p.uid == owner || p.uid == 0 => {}
                    Ok(p) => {
                        tracing::warn!(
                            "control socket: refused a request from uid {} (pid {}): only the owner of the mount (uid {owner}) or root may use it",
                            p.uid,
                            p.pid
                        );
                        let msg = format!(
                            "permission denied: uid {} is not the owner of this mount (uid {owner}) or root",
                            p.uid
                        );
                        let _ = writeln!(conn, "{}", error(msg));
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!("control socket: no peer credentials ({e}); refused");
                        continue;
                    }
                }
                if active.fetch_add(1, Relaxed) >= MAX_CONNECTIONS {
                    active.fetch_sub(1, Relaxed);
                    let _ = writeln!(conn, "{}", error("busy: too many control requests at once"));
                    continue;
                }
                let (handle, active2) = (handle.clone(), active.clone());
                let spawned = std::thread::Builder::new()
                    .name("tierfs-ctl-req".into())
                    .spawn(move || {
                        serve_one(conn, &*handle);
                        active2.fetch_sub(1, Relaxed);
                    });
                if let Err(e) = spawned {
                    active.fetch_sub(1, Relaxed);
                    tracing::warn!("control socket: no thread for a request: {e}");
                }
            }
        })?;
    Ok(())
}

/// Reads one request line, answers it.
fn serve_one(mut conn: UnixStream, handle: &(dyn Fn(&[String]) -> Value + Send + Sync)) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let read = BufReader::new((&conn).take(MAX_REQUEST)).read_line(&mut line);
    if read.is_err() || line.is_empty() {
        return;
    }
    let answer = match parse_request(&line) {
        Ok(words) if words.is_empty() => error("empty request"),
        Ok(words) => handle(&words),
        Err(e) => error(e),
    };
    let _ = writeln!(conn, "{answer}");
}

/// [`request`] for a command that may take long (`tierfs warm` of a large file waits for the
/// SSD write budget): no timeout on the answer. A daemon that dies closes the socket, which
/// ends the wait with an error.
pub fn request_patient(socket: &Path, cmd: &str) -> Result<String> {
    let (mut s, _) = connect(socket)?;
    writeln!(s, "{cmd}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    if line.is_empty() {
        bail!("the daemon closed the control socket without answering");
    }
    Ok(line)
}
