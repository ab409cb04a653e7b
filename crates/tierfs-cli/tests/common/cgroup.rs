//! A memory cgroup with a limit for a test, v1 or v2, removed on drop (its processes moved
//! back to the parent first).

use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct TestCgroup {
    pub dir: PathBuf,
    pub version: u8,
    parent: PathBuf,
}

fn mount_of(mountinfo: &str, want: impl Fn(&str, &str) -> bool) -> Option<(String, PathBuf)> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if !want(post.first()?, post.get(2).unwrap_or(&"")) {
            return None;
        }
        Some((pre.get(3)?.to_string(), PathBuf::from(pre.get(4)?)))
    })
}

/// Where a child cgroup with a memory limit can be made: the caller's own v1 memory cgroup
/// (limits nest), or, on v2, the root when it delegates the memory controller (a v2 cgroup
/// with processes cannot delegate controllers to children).
fn parent_dir() -> Option<(u8, PathBuf)> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let v1 = cg.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        ctrl.split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    });
    if let Some(path) = v1 {
        let (root, mnt) = mount_of(&mi, |t, o| {
            t == "cgroup" && o.split(',').any(|x| x == "memory")
        })?;
        let rel = path.strip_prefix(&root).unwrap_or(&path);
        let dir = mnt.join(rel.trim_start_matches('/'));
        return dir.is_dir().then_some((1, dir));
    }
    let (_, mnt) = mount_of(&mi, |t, _| t == "cgroup2")?;
    let ctl = std::fs::read_to_string(mnt.join("cgroup.subtree_control")).ok()?;
    ctl.split_whitespace()
        .any(|c| c == "memory")
        .then_some((2, mnt))
}

impl TestCgroup {
    /// A fresh cgroup limited to `limit` bytes; None where none can be made (no memory
    /// controller, or not root).
    pub fn create(name: &str, limit: u64) -> Option<TestCgroup> {
        let (version, parent) = parent_dir()?;
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let cg = TestCgroup {
            dir,
            version,
            parent,
        };
        let file = if version == 1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        std::fs::write(cg.dir.join(file), limit.to_string()).ok()?;
        Some(cg)
    }

    pub fn add(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }

    /// The file holding the cgroup's memory usage.
    pub fn usage_file(&self) -> PathBuf {
        self.dir.join(if self.version == 1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        })
    }

    /// OOM kills inside the cgroup (v1 `memory.oom_control`, v2 `memory.events`).
    pub fn oom_kills(&self) -> u64 {
        let f = if self.version == 1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        field(&self.dir.join(f), "oom_kill").unwrap_or(0)
    }

    /// Peak usage (v1 `memory.max_usage_in_bytes`, v2 `memory.peak` where the kernel has it).
    pub fn peak(&self) -> Option<u64> {
        let f = if self.version == 1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        };
        std::fs::read_to_string(self.dir.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

fn field(p: &Path, name: &str) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok())?
    })
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(self.parent.join("cgroup.procs"), pid);
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("could not remove cgroup {}", self.dir.display());
    }
}
