//! A tierfs mount whose daemon died (kill -9, the OOM killer, a crash): the kernel keeps the
//! mount, and every access to it answers ENOTCONN ("Transport endpoint is not connected")
//! until it is detached. `tierfs mount` onto it and `tierfs unmount` of it detach it (a lazy
//! unmount), so no one needs to know about `fusermount3 -uz`. Nothing is lost by detaching:
//! what the daemon had not written back is in its cache dir's journal, and the next mount
//! of that cache dir writes it.

use anyhow::{bail, Context, Result};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `path` made absolute without touching it (resolving a dead mount's path fails).
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("mountpoint {}", path.display()))
}

/// Whether `path` is a tierfs mount whose daemon is gone.
pub fn is_dead(path: &Path) -> bool {
    let Ok(abs) = absolute(path) else {
        return false;
    };
    let gone =
        matches!(std::fs::metadata(&abs), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN));
    gone && matches!(tierfs_fuse::find_mount(&abs), Ok(Some(m)) if m.fstype == "fuse.tierfs")
}

/// Detaches the dead mount at `path`: umount2(MNT_DETACH) as root, else `fusermount3 -uz`
/// (which the FUSE package installs set-uid for the user who mounted).
pub fn detach(path: &Path) -> Result<()> {
    let abs = absolute(path)?;
    let c = std::ffi::CString::new(abs.as_os_str().as_bytes())
        .with_context(|| format!("mountpoint {}", abs.display()))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let out = std::process::Command::new("fusermount3")
        .arg("-uz")
        .arg(&abs)
        .output()
        .context("running fusermount3 -uz")?;
    if !out.status.success() {
        bail!(
            "{}: the tierfs daemon of this mount is gone, and detaching it failed: {}",
            abs.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// What `tierfs unmount` and `tierfs mount` print once they detached a dead mount.
pub fn detached_note(path: &Path) -> String {
    format!(
        "tierfs: {}: its tierfs daemon had died (killed?); detached the dead mount. What it had not written to the store is in its cache dir's journal; the next mount of that cache dir writes it",
        path.display()
    )
}
