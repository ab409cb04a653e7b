//! Memory probes for the pressure tests: the host's MemAvailable, a process's RSS, the OOM
//! kill counter, and a daemon's stats read straight from its control socket (cheap enough to
//! sample every 100 ms, unlike running `tierfs stats`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// A `/proc/meminfo` field, bytes.
pub fn meminfo(field: &str) -> u64 {
    let t = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    kb_field(&t, field).unwrap_or(0)
}

fn kb_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(field)?.strip_prefix(':')?;
        Some(v.split_whitespace().next()?.parse::<u64>().ok()? * 1024)
    })
}

/// A `/proc/PID/status` field (VmRSS, RssAnon), bytes; None once the process is gone.
pub fn proc_status(pid: i32, field: &str) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    kb_field(&t, field)
}

/// OOM kills since boot, host-wide (`oom_kill` in /proc/vmstat).
pub fn oom_kills() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// The daemon's stats through the control socket in its cache directory.
pub fn socket_stats(cache_dir: &Path) -> Option<serde_json::Value> {
    let mut s = UnixStream::connect(cache_dir.join("control.sock")).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    writeln!(s, "stats").ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    serde_json::from_str(&line).ok()
}

/// A number in a stats JSON by path ("pressure.target").
pub fn num(v: &serde_json::Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("stats has no number at {path}: {v}"))
}

pub fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}
