//! The memory cgroup the daemon runs in, v1 or v2: its limit and how much of it is taken by
//! memory that cannot be reclaimed. Limits are hierarchical, so every level from the daemon's
//! own cgroup up to the hierarchy's root is read and the tightest wins.

use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cgroup {
    pub version: u8,
    /// The daemon's own cgroup directory.
    pub dir: PathBuf,
    /// `dir` and its ancestors up to the hierarchy's mount point.
    levels: Vec<PathBuf>,
}

/// One reading of the tightest level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reading {
    /// The level whose limit binds.
    pub dir: PathBuf,
    pub limit: u64,
    pub usage: u64,
    /// Reclaimable file cache charged to it (active + inactive file pages).
    pub file: u64,
    /// limit - (usage - file): what more it may take.
    pub room: u64,
}

impl Cgroup {
    /// The daemon's memory cgroup, from /proc/self/cgroup and /proc/self/mountinfo; None if
    /// no memory controller is mounted.
    pub fn discover() -> Option<Cgroup> {
        let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        discover_from(&cg, &mi)
    }

    /// Reads every level; None when none has a limit below the host's memory.
    pub fn read(&self, mem_total: u64) -> Option<Reading> {
        self.levels
            .iter()
            .filter_map(|d| read_level(d, self.version, mem_total))
            .min_by_key(|r| r.room)
    }
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// (mount root, mount point) of the first mount accepted by `want(fstype, superopts)`.
fn find_mount(mountinfo: &str, want: impl Fn(&str, &str) -> bool) -> Option<(String, PathBuf)> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        let (fstype, superopts) = (*post.first()?, *post.get(2).unwrap_or(&""));
        if !want(fstype, superopts) {
            return None;
        }
        Some((unescape(pre.get(3)?), PathBuf::from(unescape(pre.get(4)?))))
    })
}

pub(crate) fn discover_from(proc_cgroup: &str, mountinfo: &str) -> Option<Cgroup> {
    // v1 memory controller first: on a hybrid host (v1 controllers, a v2 tree without them
    // at /sys/fs/cgroup/unified) it is the one that limits.
    let v1 = proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        ctrl.split(',').any(|c| c == "memory").then_some(path)
    });
    let (version, path, mount) = match v1 {
        Some(p) => {
            let m = find_mount(mountinfo, |t, o| {
                t == "cgroup" && o.split(',').any(|x| x == "memory")
            })?;
            (1, p, m)
        }
        None => {
            let p = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
            let m = find_mount(mountinfo, |t, _| t == "cgroup2")?;
            (2, p, m)
        }
    };
    let (root, mountpoint) = mount;
    // Inside a cgroup namespace the mount's root is the namespace's root.
    let rel = path.strip_prefix(root.as_str()).unwrap_or(path);
    let mut dir = mountpoint.join(rel.trim_start_matches('/'));
    if !dir.starts_with(&mountpoint) || !dir.is_dir() {
        dir = mountpoint.clone();
    }
    let mut levels = vec![dir.clone()];
    let mut d = dir.as_path();
    while d != mountpoint {
        match d.parent() {
            Some(p) => {
                levels.push(p.to_path_buf());
                d = p;
            }
            None => break,
        }
    }
    Some(Cgroup {
        version,
        dir,
        levels,
    })
}

fn read_u64(p: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    s.trim().parse().ok()
}

/// v2 limits read "max" when unset.
fn read_limit_v2(p: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    match s.trim() {
        "max" => None,
        v => v.parse().ok(),
    }
}

fn stat_field(stat: &str, name: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok())?
    })
}

fn read_level(dir: &Path, version: u8, mem_total: u64) -> Option<Reading> {
    let (limit, usage) = if version == 1 {
        let limit = read_u64(&dir.join("memory.limit_in_bytes"))?;
        if limit >= mem_total {
            return None;
        }
        (limit, read_u64(&dir.join("memory.usage_in_bytes"))?)
    } else {
        let max = read_limit_v2(&dir.join("memory.max"));
        let high = read_limit_v2(&dir.join("memory.high"));
        let limit = match (max, high) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        if limit >= mem_total {
            return None;
        }
        (limit, read_u64(&dir.join("memory.current"))?)
    };
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    // v1 with use_hierarchy: the total_ fields include the children.
    let file = match (
        stat_field(&stat, "total_inactive_file"),
        stat_field(&stat, "total_active_file"),
    ) {
        (Some(i), Some(a)) => i + a,
        _ => {
            stat_field(&stat, "inactive_file").unwrap_or(0)
                + stat_field(&stat, "active_file").unwrap_or(0)
        }
    };
    Some(Reading {
        dir: dir.to_path_buf(),
        limit,
        usage,
        file,
        room: limit.saturating_sub(usage.saturating_sub(file)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn mountinfo(v1: &Path, v2: &Path) -> String {
        format!(
            "22 1 0:21 / /proc rw,relatime shared:12 - proc proc rw\n\
             30 25 0:26 / {} rw,relatime - cgroup cgroup rw,cpu\n\
             31 25 0:27 / {} rw,relatime - cgroup cgroup rw,memory\n\
             32 25 0:28 / {} rw,relatime - cgroup2 cgroup2 rw\n",
            v1.join("cpu").display(),
            v1.display(),
            v2.display()
        )
    }

    #[test]
    fn v1_reads_the_tightest_level() {
        let t = tempfile::tempdir().unwrap();
        let (v1, v2) = (t.path().join("memory"), t.path().join("unified"));
        let own = v1.join("a/b");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::create_dir_all(&v2).unwrap();
        let level = |d: &Path, limit: u64, usage: u64, file: u64| {
            std::fs::write(d.join("memory.limit_in_bytes"), format!("{limit}\n")).unwrap();
            std::fs::write(d.join("memory.usage_in_bytes"), format!("{usage}\n")).unwrap();
            std::fs::write(
                d.join("memory.stat"),
                format!("cache 5\ntotal_inactive_file {file}\ntotal_active_file 0\n"),
            )
            .unwrap();
        };
        level(&v1, 9223372036854771712, 10 * G, 0);
        level(&v1.join("a"), 4 * G, 3 * G, G);
        level(&own, G, G, G / 2);
        let cg = discover_from(
            "9:name=systemd:/\n4:memory:/a/b\n0::/\n",
            &mountinfo(&v1, &v2),
        )
        .unwrap();
        assert_eq!((cg.version, cg.dir.clone()), (1, own.clone()));
        // own: 1 G - (1 G - 0.5 G) = 0.5 G; a: 4 G - 2 G = 2 G; the root has no limit.
        let r = cg.read(24 * G).unwrap();
        assert_eq!((r.dir, r.limit, r.room), (own, G, G / 2));
        // A limit at or above the host's memory binds nothing.
        assert!(cg.read(G / 2).is_none());
    }

    #[test]
    fn v2_uses_high_or_max_and_namespaced_paths() {
        let t = tempfile::tempdir().unwrap();
        let v2 = t.path().join("cg2");
        let own = v2.join("svc");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(own.join("memory.max"), "max\n").unwrap();
        std::fs::write(own.join("memory.high"), format!("{}\n", 2 * G)).unwrap();
        std::fs::write(own.join("memory.current"), format!("{}\n", G)).unwrap();
        std::fs::write(
            own.join("memory.stat"),
            "anon 1\ninactive_file 100\nactive_file 28\n",
        )
        .unwrap();
        let mi = format!("32 25 0:28 / {} rw - cgroup2 cgroup2 rw\n", v2.display());
        let cg = discover_from("0::/svc\n", &mi).unwrap();
        assert_eq!((cg.version, cg.dir.clone()), (2, own.clone()));
        let r = cg.read(24 * G).unwrap();
        assert_eq!((r.limit, r.usage, r.file), (2 * G, G, 128));
        assert_eq!(r.room, G + 128);
        // The process's path as seen from outside a namespace whose root is /svc.
        let mi = format!(
            "32 25 0:28 /svc {} rw - cgroup2 cgroup2 rw\n",
            own.display()
        );
        assert_eq!(discover_from("0::/svc\n", &mi).unwrap().dir, own);
        // No memory controller at all.
        assert!(discover_from("0::/\n", "22 1 0:21 / /proc rw - proc proc rw\n").is_none());
        assert_eq!(unescape("/a\\040b"), "/a b");
    }
}
