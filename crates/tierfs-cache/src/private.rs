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

/// `OpenOptions` that create with [`FILE_MODE`].
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Creates `dir` and its missing parents with [`DIR_MODE`], then tightens `dir` itself and
/// the files directly in it (made by an older tierfs, under umask 0) to the private modes.
pub fn dir_all(dir: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    tighten(dir)
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

/// Writes `bytes` to a new or truncated file with [`FILE_MODE`].
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?
        .write_all(bytes)
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
}
