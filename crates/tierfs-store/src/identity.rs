//! How a store's objects keep their identity, and how [`crate::PosixStore`] decides it for the
//! filesystem it is over.
//!
//! Cached data and metadata outlive the kernel's inodes, the daemon and reboots, so they must be
//! keyed by something the store keeps. Local filesystems and NFS keep inode numbers for the
//! life of an object; FUSE filesystems (sshfs, rclone mount, s3fs), SMB with `noserverino`,
//! 9p and FAT hand out new ones whenever the kernel forgets an inode, and every network or
//! FUSE filesystem gets a new anonymous `st_dev` at each mount. So the device number is never
//! part of an identity, and the inode number only where the filesystem is known to keep it;
//! elsewhere an object is its path (see `docs/architecture/identity.md`, "Identity and keys").

use std::ffi::CStr;
use std::os::fd::RawFd;

/// How the objects of a store are identified across time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// By inode number, stable for the life of an object: a rename keeps it, hard links
    /// share it.
    Inode,
    /// By path relative to the store's root: what a name holds is the object; renames done
    /// through tierfs are followed, a rename behind its back is a new object.
    Path,
}

/// `store.identity`: what the user asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdentityChoice {
    /// Decided from the filesystem type.
    #[default]
    Auto,
    Inode,
    Path,
}

impl std::str::FromStr for IdentityChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IdentityChoice::Auto),
            "inode" => Ok(IdentityChoice::Inode),
            "path" => Ok(IdentityChoice::Path),
            _ => Err(format!("{s:?} is not one of auto, inode, path")),
        }
    }
}

impl std::fmt::Display for IdentityChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IdentityChoice::Auto => "auto",
            IdentityChoice::Inode => "inode",
            IdentityChoice::Path => "path",
        })
    }
}

/// Filesystem types whose inode numbers last as long as their objects.
const STABLE_INODES: &[&str] = &[
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "nfs", "nfs4", "tmpfs", "f2fs", "bcachefs",
    "jfs", "reiserfs", "ceph", "gpfs", "lustre", "ocfs2", "gfs2", "nilfs2",
];

/// The decision for a filesystem of type `fstype` mounted with superblock options `opts`,
/// and why, in words for the log.
pub fn decide(fstype: &str, opts: &str) -> (Identity, String) {
    let has = |o: &str| opts.split(',').any(|x| x == o);
    if fstype == "cifs" || fstype == "smb3" {
        return if has("noserverino") {
            (
                Identity::Path,
                format!("{fstype} with noserverino numbers inodes itself"),
            )
        } else {
            (
                Identity::Inode,
                format!("{fstype} passes the server's inode numbers on"),
            )
        };
    }
    if STABLE_INODES.contains(&fstype) {
        return (
            Identity::Inode,
            format!("{fstype} keeps inode numbers for the life of a file"),
        );
    }
    let why = if fstype.starts_with("fuse") {
        format!("{fstype}: FUSE filesystems may number inodes anew whenever the kernel forgets one")
    } else {
        format!("{fstype}: not known to keep inode numbers")
    };
    (Identity::Path, why)
}

/// Filesystem type and superblock options of the mount that holds the open directory `fd`,
/// from /proc/self/mountinfo (matched by device number; the last match is the mount on top).
pub fn mount_of(fd: RawFd) -> Option<(String, String)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let empty: &CStr = c"";
    if unsafe { libc::fstatat(fd, empty.as_ptr(), &mut st, libc::AT_EMPTY_PATH) } != 0 {
        return None;
    }
    let dev = format!("{}:{}", libc::major(st.st_dev), libc::minor(st.st_dev));
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo(&info, &dev)
}

fn parse_mountinfo(info: &str, dev: &str) -> Option<(String, String)> {
    let mut found = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.get(2) != Some(&dev) {
            continue;
        }
        // Optional fields end with "-"; then fstype, source, super options.
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if let (Some(t), Some(o)) = (f.get(sep + 1), f.get(sep + 3)) {
            found = Some((t.to_string(), o.to_string()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        assert_eq!(decide("ext4", "rw").0, Identity::Inode);
        assert_eq!(decide("nfs4", "rw,vers=4.2").0, Identity::Inode);
        assert_eq!(decide("fuse.sshfs", "rw,user_id=0").0, Identity::Path);
        assert_eq!(decide("fuse", "rw").0, Identity::Path);
        assert_eq!(decide("cifs", "rw,serverino").0, Identity::Inode);
        assert_eq!(decide("cifs", "rw,noserverino").0, Identity::Path);
        assert_eq!(decide("9p", "rw").0, Identity::Path);
        assert_eq!(decide("vfat", "rw").0, Identity::Path);
        assert_eq!(decide("something-new", "rw").0, Identity::Path);
    }

    #[test]
    fn mountinfo_lines() {
        let info = "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
                    40 22 0:45 / /mnt/s rw,nosuid - fuse.sshfs u@h:/d rw,user_id=0,group_id=0\n\
                    41 22 0:46 / /mnt/c rw - cifs //h/s rw,vers=3.1.1,noserverino\n";
        assert_eq!(
            parse_mountinfo(info, "0:45"),
            Some(("fuse.sshfs".into(), "rw,user_id=0,group_id=0".into()))
        );
        assert_eq!(parse_mountinfo(info, "0:46").unwrap().0, "cifs");
        assert_eq!(parse_mountinfo(info, "254:1").unwrap().0, "ext4");
        assert_eq!(parse_mountinfo(info, "9:9"), None);
    }

    #[test]
    fn this_machines_root_is_decided() {
        let fd = unsafe { libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY) };
        assert!(fd >= 0);
        let m = mount_of(fd);
        unsafe { libc::close(fd) };
        assert!(m.is_some(), "no mountinfo line for /");
    }
}
