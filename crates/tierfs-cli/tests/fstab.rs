//! /etc/fstab-style mounting: the calling conventions of mount.fuse3 and of mount(8)'s
//! helpers, and mount(8) itself. Root only (mount(8) and the default cache dir
//! /var/cache/tierfs need it); each test prints a message and passes when not root.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use tierfs_store::Store;

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// A backing dir with one file, a mount point, and a bin dir holding `tierfs` and
/// `mount.fuse.tierfs`, both symlinks to the binary under test.
struct Setup {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    bin: PathBuf,
    /// The default cache dir the mount will use (no --cache-dir in these conventions).
    cache: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let (backing, mnt, bin) = (
            dir.path().join("backing"),
            dir.path().join("mnt"),
            dir.path().join("bin"),
        );
        for d in [&backing, &mnt, &bin] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(backing.join("hello"), b"hello from fstab\n").unwrap();
        for name in ["tierfs", "mount.fuse.tierfs"] {
            std::os::unix::fs::symlink(tierfs_bin(), bin.join(name)).unwrap();
        }
        let id = tierfs_store::PosixStore::open(&backing)
            .unwrap()
            .store_id()
            .to_string();
        Setup {
            cache: Path::new("/var/cache/tierfs").join(id),
            _dir: dir,
            backing,
            mnt,
            bin,
        }
    }

    /// The mount is a working tierfs mount with the options given (ram.max=64M), then goes
    /// away with umount(8).
    fn check_and_umount(&self, want_flags: &[&str]) {
        let mnt = self.mnt.clone();
        let line = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .find(|l| l.contains(&format!(" {} ", mnt.display())))
            .unwrap_or_else(|| panic!("{} is not mounted", mnt.display()))
            .to_string();
        assert!(line.contains(" - fuse.tierfs "), "{line}");
        for f in want_flags {
            assert!(
                line.split(' ').nth(5).unwrap().split(',').any(|x| x == *f),
                "mount flag {f} missing: {line}"
            );
        }
        with_timeout(Duration::from_secs(60), vec![mnt.clone()], move || {
            assert_eq!(
                std::fs::read(mnt.join("hello")).unwrap(),
                b"hello from fstab\n"
            );
        });
        let out = Command::new("timeout")
            .args(["20", tierfs_bin(), "stats", "--json"])
            .arg(&self.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(st["ram"]["cap_bytes"].as_u64(), Some(64 << 20), "{st}");
        let out = run(Command::new("umount").arg(&self.mnt));
        assert!(
            out.status.success(),
            "umount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!is_mounted(&self.mnt));
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.cache);
    }
}

fn run(cmd: &mut Command) -> Output {
    let mut full = Command::new("timeout");
    full.arg("30").arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => full.env(k, v),
            None => full.env_remove(k),
        };
    }
    full.output().expect("run")
}

fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// mount.fuse3 runs `TYPE BACKING MOUNTPOINT -o OPTS` (TYPE = tierfs): the binary must take
/// it as `tierfs mount`, accept the generic options mount(8) adds and apply the tunables.
#[test]
fn mount_fuse3_convention() {
    if !is_root() {
        skip(Skip::NotRoot, "fstab-style mounting needs root");
        return;
    }
    let s = Setup::new();
    let out = run(Command::new(s.bin.join("tierfs"))
        .arg(&s.backing)
        .arg(&s.mnt)
        .args(["-o", "rw,nosuid,nodev,ram.max=64M"]));
    assert_ok(&out, "tierfs BACKING MNT -o ...");
    s.check_and_umount(&["nosuid", "nodev"]);
}

/// mount(8) runs `/sbin/mount.fuse.tierfs BACKING MOUNTPOINT [-sfnv] [-o OPTS]`: the binary
/// called by that name must drop the helper flags and mount.
#[test]
fn mount_helper_convention() {
    if !is_root() {
        skip(Skip::NotRoot, "fstab-style mounting needs root");
        return;
    }
    let s = Setup::new();
    let out = run(Command::new(s.bin.join("mount.fuse.tierfs"))
        .arg(&s.backing)
        .arg(&s.mnt)
        .args(["-n", "-v", "-s", "-o", "rw,ram.max=64M"]));
    assert_ok(&out, "mount.fuse.tierfs BACKING MNT -n -v -s -o ...");
    s.check_and_umount(&[]);

    // The cache dir and a config file from the options field, as an fstab line gives them
    // (issue 13 item 17): two lines for one store no longer collide in the default dir.
    let own_cache = s.mnt.parent().unwrap().join("own-cache");
    let conf = s.mnt.parent().unwrap().join("tierfs.toml");
    std::fs::write(&conf, "[ram]\nmax = \"64M\"\n").unwrap();
    let out = run(Command::new(s.bin.join("mount.fuse.tierfs"))
        .arg(&s.backing)
        .arg(&s.mnt)
        .args(["-o"])
        .arg(format!(
            "rw,cache_dir={},config={}",
            own_cache.display(),
            conf.display()
        )));
    assert_ok(&out, "mount.fuse.tierfs -o cache_dir=...,config=...");
    assert!(
        own_cache.join("control.sock").exists(),
        "cache_dir= not used"
    );
    s.check_and_umount(&[]);

    // -f (fake) mounts nothing and succeeds, as mount(8) expects.
    let out = run(Command::new(s.bin.join("mount.fuse.tierfs"))
        .arg(&s.backing)
        .arg(&s.mnt)
        .args(["-f", "-o", "rw"]));
    assert_ok(&out, "mount.fuse.tierfs -f");
    assert!(!is_mounted(&s.mnt));
}

/// The real thing: mount(8) with `-t fuse.tierfs`, and with an fstab line. With no
/// /sbin/mount.fuse.tierfs installed, mount(8) runs /sbin/mount.fuse (fuse3), which runs
/// `tierfs` through `/bin/sh -c`. mount(8) scrubs PATH from its helpers' environment
/// (util-linux `sanitize_env`), so `tierfs` has to be in the shell's default PATH, as it is
/// once installed: this test bind-mounts its bin dir over /usr/local/sbin (first in that
/// default PATH) inside a private mount namespace (`unshare --mount`), so the host is not
/// touched, and runs mount(8), the checks and umount(8) in there. The FUSE mount lives in
/// that namespace only.
///
/// The fstab mount follows the umount of the first one at once, with the same (default) cache
/// dir: this used to fail now and then with "cache dir ... is in use" (the old daemon was still
/// exiting) or with `tierfs stats` unable to find the new mount (the old daemon removed the
/// registry entry of the new mount, which had been given the same device number).
#[test]
fn mount_8_and_fstab() {
    if !is_root() {
        skip(Skip::NotRoot, "mount(8) needs root");
        return;
    }
    if Path::new("/sbin/mount.fuse.tierfs").exists() {
        // mount(8) would run the installed helper instead of the binary under test.
        skip(
            Skip::Installed,
            "/sbin/mount.fuse.tierfs is installed and mount(8) would run it instead",
        );
        return;
    }
    let s = Setup::new();
    let fstab = s.bin.parent().unwrap().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# test fstab\n{} {} fuse.tierfs noauto,nofail,_netdev,ram.max=64M,meta.ttl=5s 0 0\n",
            s.backing.display(),
            s.mnt.display()
        ),
    )
    .unwrap();
    let script = r#"
set -eu
B=$1; M=$2; BIN=$3; T=$4; FSTAB=$5
trap 'umount -l "$M" 2>/dev/null || true' EXIT
mount --bind "$BIN" /usr/local/sbin
check() {
    echo "MOUNTINFO $1 $(grep " $M " /proc/self/mountinfo || echo none)"
    echo "CONTENT $1 $(cat "$M/hello")"
    echo "STATS $1 $("$T" stats --json "$M" 2>&1 | tr -d ' \n')"
    umount "$M"
    if grep -q " $M " /proc/self/mountinfo; then echo "UMOUNT $1 still-mounted"; else echo "UMOUNT $1 ok"; fi
}
mount -t fuse.tierfs "$B" "$M" -o ram.max=64M
check dash-t
mount -T "$FSTAB" "$M"
check fstab
"#;
    let out = run(Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(&s.backing)
        .arg(&s.mnt)
        .arg(&s.bin)
        .arg(tierfs_bin())
        .arg(&fstab));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ok(&out, "mount(8) in a private namespace");
    for way in ["dash-t", "fstab"] {
        let field = |key: &str| -> String {
            let prefix = format!("{key} {way} ");
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("no {key} for {way} in:\n{stdout}"))
                .to_string()
        };
        let mi = field("MOUNTINFO");
        assert!(mi.contains(" - fuse.tierfs "), "{way}: {mi}");
        assert!(
            mi.contains(&format!(" {} ", s.backing.display())),
            "{way}: source is not BACKING: {mi}"
        );
        assert_eq!(field("CONTENT"), "hello from fstab", "{way}");
        let st: serde_json::Value = serde_json::from_str(&field("STATS"))
            .unwrap_or_else(|e| panic!("{way}: stats: {e}: {stdout}"));
        assert_eq!(
            st["ram"]["cap_bytes"].as_u64(),
            Some(64 << 20),
            "{way}: {st}"
        );
        assert_eq!(field("UMOUNT"), "ok", "{way}");
    }
    // The namespace's mounts never reached the host.
    assert!(!is_mounted(&s.mnt));
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !host.contains(&format!(" {} ", s.bin.display())),
        "bind mount leaked to the host"
    );
}
