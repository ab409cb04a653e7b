//! `tierfs unmount MOUNTPOINT`: every written byte on the store first (with progress), then
//! the unmount, then the daemon's exit. `umount` alone returns as soon as the kernel lets
//! go, while the daemon is still writing back (and FUSE sends no SYNCFS, so `sync -f`
//! returns at once too): scripts that need the data on the store use this.

use crate::control;
use crate::progress::Progress;
use crate::stats_cmd::n;
use anyhow::{bail, Context, Result};
use indicatif::HumanBytes;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the daemon may take to exit once unmounted (it has nothing left to write).
const EXIT_WAIT: Duration = Duration::from_secs(15);

pub fn run(mountpoint: &Path) -> Result<()> {
    if crate::dead_mount::is_dead(mountpoint) {
        crate::dead_mount::detach(mountpoint)?;
        eprintln!("{}", crate::dead_mount::detached_note(mountpoint));
        return Ok(());
    }
    let canon = mountpoint
        .canonicalize()
        .with_context(|| format!("mountpoint {}", mountpoint.display()))?;
    let socket = control::socket_for_mount(&canon)?;
    // The daemon's pid, to wait for its exit (the connection itself is not used).
    let pid = control::connect(&socket)?.1;
    let st = control::request(&socket, &["stats"])?;
    let (bytes0, files0) = (
        n(&st, "writeback.dirty_bytes"),
        n(&st, "writeback.dirty_files"),
    );
    if bytes0 > 0 {
        eprintln!(
            "tierfs: writing {} of {files0} files to the store before unmounting {}",
            HumanBytes(bytes0),
            canon.display()
        );
    }
    let sync = {
        let socket = socket.clone();
        std::thread::spawn(move || control::request_patient(&socket, "[\"sync\"]"))
    };
    let mut progress = (bytes0 > 0).then(|| Progress::new("unmount", files0, bytes0));
    while !sync.is_finished() {
        std::thread::sleep(Duration::from_millis(250));
        if let (Some(p), Ok(st)) = (&mut progress, control::request(&socket, &["stats"])) {
            let (b, f) = (
                n(&st, "writeback.dirty_bytes"),
                n(&st, "writeback.dirty_files"),
            );
            p.set_done(files0.saturating_sub(f), bytes0.saturating_sub(b));
        }
    }
    if let Some(p) = progress {
        p.finish();
    }
    let answer = sync
        .join()
        .map_err(|_| anyhow::anyhow!("the sync request panicked"))??;
    let v: Value = serde_json::from_str(&answer).context("daemon answered with invalid JSON")?;
    if let Some(e) = v.get("error") {
        let left = control::request(&socket, &["stats"])
            .map(|st| n(&st, "writeback.dirty_bytes"))
            .unwrap_or(0);
        bail!(
            "{} not unmounted: {} ({} still to write, kept in the journal)",
            canon.display(),
            e.as_str().unwrap_or("sync failed"),
            HumanBytes(left)
        );
    }
    let root = unsafe { libc::geteuid() } == 0;
    let out = if root {
        std::process::Command::new("umount").arg(&canon).output()
    } else {
        std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&canon)
            .output()
    }
    .context("running umount")?;
    if !out.status.success() {
        bail!(
            "{}: every written byte is on the store, but the unmount failed: {}",
            canon.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < EXIT_WAIT {
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "tierfs: unmounted {}; every byte written before the unmount is on the store",
        canon.display()
    );
    Ok(())
}
