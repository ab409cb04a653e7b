//! `tierfs stats`: the counters of a running mount, like arcstat / `zpool iostat`: a short
//! human summary by default, every raw counter with `--all` (or `--json`), and a live line
//! per interval with `-i SECONDS`.

use crate::control;
use anyhow::Result;
use indicatif::{HumanBytes, HumanCount};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// How `tierfs stats` prints.
pub struct Mode {
    pub json: bool,
    pub all: bool,
    /// Live: a line of rates every this many seconds.
    pub interval: Option<f64>,
    /// Live: stop after this many lines.
    pub count: Option<u64>,
}

pub fn run(mountpoint: &Path, mode: Mode) -> Result<()> {
    let socket = control::socket_for_mount(mountpoint)?;
    if let Some(secs) = mode.interval {
        return live(&socket, secs, mode.count);
    }
    let mut v = control::request(&socket, &["stats"])?;
    add_ratios(&mut v);
    if mode.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print!("{}", summary(mountpoint, &v));
    if mode.all {
        let mut lines = Vec::new();
        flatten("", &v, &mut lines);
        let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        println!();
        for (k, val) in lines {
            println!("tierfs.{k:<width$}  {val}");
        }
    } else {
        println!("(every counter: tierfs stats --all or --json; live: tierfs stats -i 1)");
    }
    Ok(())
}

/// The number at dotted `path` of a stats answer ("ram.hits"), 0 where absent.
pub(crate) fn n(v: &Value, path: &str) -> u64 {
    path.split('.').fold(v, |v, k| &v[k]).as_u64().unwrap_or(0)
}

fn ratio(hits: u64, misses: u64) -> Option<f64> {
    (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64)
}

/// `ram.hit_ratio` and `ssd.hit_ratio` (hits over hits and misses), in the JSON too.
fn add_ratios(v: &mut Value) {
    for tier in ["ram", "ssd"] {
        let r = ratio(
            n(v, &format!("{tier}.hits")),
            n(v, &format!("{tier}.misses")),
        );
        if let (Some(r), Some(o)) = (r, v.get_mut(tier).and_then(Value::as_object_mut)) {
            o.insert(
                "hit_ratio".into(),
                serde_json::json!((r * 1e4).round() / 1e4),
            );
        }
    }
}

fn pct(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{:.1}%", r * 100.0))
}

/// The summary: one line per part, sizes in KiB/MiB/GiB.
fn summary(mountpoint: &Path, v: &Value) -> String {
    let mut s = String::new();
    let store = v["store_id"].as_str().unwrap_or("?");
    s += &format!("tierfs on {} (store {store})\n", mountpoint.display());
    s += &format!(
        "  reads     {} in {} requests; RAM hits {} of blocks asked, SSD hits {} of RAM misses\n",
        HumanBytes(n(v, "read_bytes")),
        HumanCount(n(v, "read_requests")),
        pct(ratio(n(v, "ram.hits"), n(v, "ram.misses"))),
        pct(ratio(n(v, "ssd.hits"), n(v, "ssd.misses"))),
    );
    s += &format!(
        "  RAM tier  {} held, cap {}; {} evicted\n",
        HumanBytes(n(v, "ram.bytes")),
        HumanBytes(n(v, "ram.cap_bytes")),
        HumanBytes(n(v, "ram.evicted_bytes")),
    );
    if v["ssd"].is_object() {
        s += &format!(
            "  SSD tier  {} held in {} entries ({} of segment files), cap {}; {} written, {} read\n",
            HumanBytes(n(v, "ssd.live_bytes")),
            HumanCount(n(v, "ssd.entries")),
            HumanBytes(n(v, "ssd.fill_bytes")),
            HumanBytes(n(v, "ssd.cap_bytes")),
            HumanBytes(n(v, "ssd.written_bytes")),
            HumanBytes(n(v, "ssd.hit_bytes")),
        );
    } else {
        s += "  SSD tier  off\n";
    }
    s += &format!(
        "  store     {} read in {} reads, {} written; {} lookups, {} getattrs, {} listings, {} opens; {} errors\n",
        HumanBytes(n(v, "backing.read_bytes")),
        HumanCount(n(v, "backing.read")),
        HumanBytes(n(v, "backing.write_bytes")),
        HumanCount(n(v, "backing.lookup")),
        HumanCount(n(v, "backing.getattr")),
        HumanCount(n(v, "backing.readdir")),
        HumanCount(n(v, "backing.open")),
        HumanCount(n(v, "backing.errors")),
    );
    let checks = n(v, "cto_checks");
    s += &format!(
        "  opens     {}: {} checked by a store request of their own ({}), {} by one asked for \
         them by another request, {} from the cache{}\n",
        HumanCount(n(v, "opens")),
        HumanCount(checks),
        match checks {
            0 => "-".to_string(),
            c => format!(
                "{:.2} ms each",
                n(v, "cto_check_us") as f64 / c as f64 / 1000.0
            ),
        },
        HumanCount(n(v, "cto_shared")),
        HumanCount(n(v, "lazy_opens")),
        match n(v, "store_check_us") {
            0 => String::new(),
            us => format!("; a check took {:.2} ms at mount", us as f64 / 1000.0),
        },
    );
    if v["sftp"].is_object() {
        s += &format!(
            "  sftp      {} requests in flight, {} in all; {} timed out, {} reconnects\n",
            HumanCount(n(v, "sftp.in_flight")),
            HumanCount(n(v, "sftp.requests")),
            HumanCount(n(v, "sftp.timeouts")),
            HumanCount(n(v, "sftp.reconnects")),
        );
    }
    s += &format!(
        "  metadata  {} attributes and {} directories cached, {} answered from the cache\n",
        HumanCount(n(v, "meta_attrs")),
        HumanCount(n(v, "meta_dirs")),
        HumanCount(n(v, "meta_hits")),
    );
    if v["writeback"].is_object() {
        s += &format!(
            "  write-back {} dirty in {} files (oldest {:.1} s), {} written back\n",
            HumanBytes(n(v, "writeback.dirty_bytes")),
            HumanCount(n(v, "writeback.dirty_files")),
            n(v, "writeback.oldest_dirty_ms") as f64 / 1000.0,
            HumanBytes(n(v, "writeback.written_bytes")),
        );
        if n(v, "writeback.namespace.deferred") > 0 {
            s += &format!(
                "  namespace {} operations deferred, {} pending (oldest {:.1} s), {} groups \
                 applied (median {} ms, p99 {} ms), {} waits for them ({:.1} s), {} unlinked \
                 before the store had them, {} unlinks of the store's deferred, {} renames \
                 over the store's files, {} links and {} truncates deferred\n",
                HumanCount(n(v, "writeback.namespace.deferred")),
                HumanCount(n(v, "writeback.namespace.pending")),
                n(v, "writeback.namespace.oldest_ms") as f64 / 1000.0,
                HumanCount(n(v, "writeback.namespace.groups")),
                n(v, "writeback.namespace.group_ms_median"),
                n(v, "writeback.namespace.group_ms_p99"),
                HumanCount(n(v, "writeback.namespace.waits")),
                n(v, "writeback.namespace.wait_ms") as f64 / 1000.0,
                HumanCount(n(v, "writeback.namespace.dropped")),
                HumanCount(n(v, "writeback.namespace.removed")),
                HumanCount(n(v, "writeback.namespace.replaced")),
                HumanCount(n(v, "writeback.namespace.linked")),
                HumanCount(n(v, "writeback.namespace.truncated")),
            );
        }
        let refused = n(v, "writeback.namespace.conflicts");
        if refused > 0 {
            s += &format!(
                "  CONFLICTS {refused} deferred create(s) or setattr(s) refused by the store (a name \
                 made by someone else first, a directory removed): the data kept under \
                 <cache dir>/journal/lost/ (see the log)\n"
            );
        }
        let lost = n(v, "writeback.replay_lost_files");
        if lost > 0 || n(v, "writeback.replay_damage") > 0 {
            s += &format!(
                "  LOST      at mount: {} damaged journal stretch(es), {} file(s) left as the store \
                 had them, {} pending writes saved under <cache dir>/journal/lost/ (see the log)\n",
                n(v, "writeback.replay_damage"),
                lost,
                n(v, "writeback.replay_lost_writes"),
            );
        }
        let conflicts = n(v, "writeback.flush_conflicts");
        if conflicts > 0 {
            s += &format!(
                "  CONFLICTS {conflicts} flush(es) found the object changed by another writer: \
                 ours kept under <cache dir>/journal/lost/ (see the log)\n"
            );
        }
    } else {
        s += &format!(
            "  writes    {} in {} requests (write-through)\n",
            HumanBytes(n(v, "write_bytes")),
            HumanCount(n(v, "write_requests")),
        );
    }
    s
}

/// A line of rates every `secs` seconds, a header every 20 lines.
fn live(socket: &Path, secs: f64, count: Option<u64>) -> Result<()> {
    if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
        anyhow::bail!("-i {secs}: give seconds from 0.1 to 3600");
    }
    let every = Duration::from_secs_f64(secs.max(0.1));
    let mut prev = control::request(socket, &["stats"])?;
    let mut t_prev = Instant::now();
    let mut lines = 0u64;
    while count.is_none_or(|c| lines < c) {
        std::thread::sleep(every.saturating_sub(t_prev.elapsed()));
        let cur = control::request(socket, &["stats"])?;
        let dt = t_prev.elapsed().as_secs_f64();
        t_prev = Instant::now();
        if lines.is_multiple_of(20) {
            println!(
                "{:>8} {:>10} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
                "time",
                "read/s",
                "ram%",
                "ssd%",
                "store rd/s",
                "store B/s",
                "meta ops/s",
                "write/s",
                "dirty"
            );
        }
        let d = |k: &str| n(&cur, k).saturating_sub(n(&prev, k));
        let rate = |x: u64| x as f64 / dt;
        let meta = ["lookup", "getattr", "readdir", "open"]
            .iter()
            .map(|k| d(&format!("backing.{k}")))
            .sum::<u64>();
        let now = wall_clock();
        println!(
            "{:>8} {:>10} {:>7} {:>7} {:>10.0} {:>10} {:>10.0} {:>10} {:>10}",
            now,
            format!("{}", HumanBytes(rate(d("read_bytes")) as u64)),
            pct(ratio(d("ram.hits"), d("ram.misses"))),
            pct(ratio(d("ssd.hits"), d("ssd.misses"))),
            rate(d("backing.read")),
            format!("{}", HumanBytes(rate(d("backing.read_bytes")) as u64)),
            rate(meta),
            format!("{}", HumanBytes(rate(d("write_bytes")) as u64)),
            format!("{}", HumanBytes(n(&cur, "writeback.dirty_bytes"))),
        );
        prev = cur;
        lines += 1;
    }
    Ok(())
}

/// HH:MM:SS of the local wall clock (libc localtime_r; no date crate for one column).
fn wall_clock() -> String {
    let t = unsafe { libc::time(std::ptr::null_mut()) };
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&t, &mut tm) };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_ratios() {
        let mut v = serde_json::json!({
            "store_id": "s", "read_bytes": 3u64 << 30, "read_requests": 12345,
            "ram": {"hits": 90, "misses": 10, "bytes": 1u64 << 30, "cap_bytes": 2u64 << 30},
            "ssd": {"hits": 5, "misses": 5, "fill_bytes": 4u64 << 30},
            "backing": {"read_bytes": 1u64 << 20, "lookup": 1000},
            "writeback": null,
        });
        add_ratios(&mut v);
        assert_eq!(v["ram"]["hit_ratio"], serde_json::json!(0.9));
        assert_eq!(v["ssd"]["hit_ratio"], serde_json::json!(0.5));
        let s = summary(Path::new("/m"), &v);
        assert!(s.contains("3.00 GiB in 12,345 requests"), "{s}");
        assert!(s.contains("RAM hits 90.0%"), "{s}");
        assert!(s.contains("SSD hits 50.0%"), "{s}");
        assert!(s.contains("1,000 lookups"), "{s}");
        assert!(s.contains("opens     0: 0 checked"), "{s}");
        assert!(s.lines().count() <= 8, "{s}");
    }
}
