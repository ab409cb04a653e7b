//! Files and directories of the cache dir, created private to the daemon's user whatever the
//! process umask. The daemon runs with umask 0 (the kernel has already applied the caller's
//! umask to every mode it sends for the backing store, which must not be applied twice), so
//! anything created without an explicit mode would be world-readable: cached data of a 0600
//! file, the journal's pending writes, the control socket's registry.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every directory tierfs creates in the cache dir.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file tierfs creates in the cache dir.
pub const FILE_MODE: u32 = 0o600;

/// `OpenOptions` that create with [`FILE_MODE`] and never follow a symlink in the last
/// component (one planted in the cache dir could point anywhere the root daemon may write).
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE).custom_flags(libc::O_NOFOLLOW);
    o
}

/// Entries of the cache dir tierfs uses; each must be what tierfs made (see [`trusted`]).
const ENTRIES: &[&str] = &[
    "lock",
    "tierfs.log",
    "control.sock",
    "ssd",
    "journal",
    "journal/lost",
];

/// Refuses a cache dir another user could read or redirect what the (root) daemon writes
/// there through, as OpenSSH's StrictModes does for `authorized_keys`:
/// - every directory on its real path is owned by root or us and writable by no one else
///   (group-writable for root's group or ours is fine), unless it is sticky (`/tmp`: others
///   cannot move or replace what is ours in it);
/// - the cache dir itself and every entry tierfs uses in it ([`ENTRIES`]) are owned by us
///   and are no symlinks (a symlinked `ssd/` once had root write 0666 files into `/etc`).
///
/// `dir` exists. The error is one line naming the culprit.
pub fn trusted(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let me = unsafe { libc::geteuid() };
    let my_gid = unsafe { libc::getegid() };
    let real = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut at = std::path::PathBuf::from("/");
    let mut parts: Vec<_> = real.components().skip(1).collect();
    let last = parts.pop();
    for c in parts {
        at.push(c);
        let m = std::fs::symlink_metadata(&at).map_err(|e| format!("{}: {e}", at.display()))?;
        let sticky = m.mode() & libc::S_ISVTX != 0;
        if m.uid() != 0 && m.uid() != me {
            return Err(format!(
                "{} is owned by uid {}, who could replace the cache dir inside it: use a cache dir whose parents belong to root or uid {me}",
                at.display(),
                m.uid()
            ));
        }
        // Group-writable is fine for our own group and root's (umask 002 with a group per
        // user makes 0775 directories); another group's members, or everyone, are not.
        let group_ok = m.gid() == 0 || m.gid() == my_gid;
        let others_write = m.mode() & 0o002 != 0 || (m.mode() & 0o020 != 0 && !group_ok);
        if others_write && !sticky {
            return Err(format!(
                "{} is writable by other users, who could replace the cache dir inside it: use another cache dir",
                at.display()
            ));
        }
    }
    if last.is_none() {
        return Err("the root directory cannot be a cache dir".into());
    }
    let own = |p: &Path| -> Result<(), String> {
        let m = match std::fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("{}: {e}", p.display())),
        };
        if m.file_type().is_symlink() {
            return Err(format!(
                "{} is a symlink: refusing to follow it out of the cache dir",
                p.display()
            ));
        }
        if m.uid() != me {
            return Err(format!(
                "{} is owned by uid {}, not by the mounting user (uid {me}): refusing a cache dir another user controls",
                p.display(),
                m.uid()
            ));
        }
        Ok(())
    };
    own(&real)?;
    for e in ENTRIES {
        own(&real.join(e))?;
    }
    Ok(())
}

/// Creates `dir` and its missing parents with [`DIR_MODE`], then tightens `dir` itself and
/// the files directly in it (made by an older tierfs, under umask 0) to the private modes.
pub fn dir_all(dir: &Path) -> io::Result<()> {
    create(dir)?;
    tighten(dir)
}

/// Creates `dir` and its missing parents with [`DIR_MODE`]; what exists is left alone.
pub fn create(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// `dir` to [`DIR_MODE`] and the regular files directly in it to at most [`FILE_MODE`].
pub fn tighten(dir: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.permissions().mode() & 0o7777 != DIR_MODE {
        std::fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))?;
    }
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let Ok(m) = e.metadata() else { continue };
        let mode = m.permissions().mode() & 0o7777;
        if m.file_type().is_file() && mode & !FILE_MODE != 0 {
            std::fs::set_permissions(e.path(), Permissions::from_mode(mode & FILE_MODE))?;
        }
    }
    Ok(())
}

/// `path` created or truncated, open for writing, with [`FILE_MODE`] (see [`options`]).
pub fn new_file(path: &Path) -> io::Result<std::fs::File> {
    options().write(true).create(true).truncate(true).open(path)
}

/// Writes `bytes` to a new or truncated file with [`FILE_MODE`].
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    new_file(path)?.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_whatever_the_umask() {
        let old = unsafe { libc::umask(0) };
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        dir_all(&d).unwrap();
        write(&d.join("f"), b"x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&t.path().join("a")), DIR_MODE);
        assert_eq!(mode(&d), DIR_MODE);
        assert_eq!(mode(&d.join("f")), FILE_MODE);
        // An older cache dir made under umask 0 is tightened.
        std::fs::set_permissions(&d, Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(d.join("f"), Permissions::from_mode(0o666)).unwrap();
        dir_all(&d).unwrap();
        assert_eq!(mode(&d), DIR_MODE);
        assert_eq!(mode(&d.join("f")), FILE_MODE);
        unsafe { libc::umask(old) };
    }

    #[test]
    fn untrusted_cache_dirs_are_refused() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        // (Another test of this binary may have the umask at 0 right now.)
        std::fs::set_permissions(t.path(), Permissions::from_mode(0o700)).unwrap();
        let d = t.path().join("cache");
        dir_all(&d).unwrap();
        trusted(&d).unwrap();
        // A symlinked entry.
        symlink("/etc", d.join("ssd")).unwrap();
        let e = trusted(&d).unwrap_err();
        assert!(e.contains("ssd is a symlink"), "{e}");
        std::fs::remove_file(d.join("ssd")).unwrap();
        // A parent others may write to (not sticky).
        std::fs::set_permissions(t.path(), Permissions::from_mode(0o777)).unwrap();
        let e = trusted(&d).unwrap_err();
        assert!(e.contains("writable by other users"), "{e}");
        // Group-writable by root's group (umask 002): fine.
        std::fs::set_permissions(t.path(), Permissions::from_mode(0o775)).unwrap();
        if unsafe { libc::geteuid() } == 0 {
            trusted(&d).unwrap();
        }
        // Sticky, like /tmp: fine.
        std::fs::set_permissions(t.path(), Permissions::from_mode(0o1777)).unwrap();
        trusted(&d).unwrap();
        if unsafe { libc::geteuid() } == 0 {
            // Another user's cache dir.
            std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
            let e = trusted(&d).unwrap_err();
            assert!(e.contains("owned by uid 65534"), "{e}");
        }
    }
}
