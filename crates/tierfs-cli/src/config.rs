//! Tunables: defaults, parsing from a TOML file and from `-o key=value`, validation.
//! Every key is documented in docs/tunables.md with its default, unit and reason.

use anyhow::{bail, Context, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use tierfs_fs::{CloseMode, FsConfig, FsyncMode, PressureConfig, SsdConfig, WbConfig, WbMode};
use tierfs_fuse::FuseConfig;

#[derive(Clone, Debug)]
pub struct Config {
    /// `store.identity`: how the store's objects are identified (docs/architecture.md).
    pub store_identity: tierfs_store::IdentityChoice,
    /// `store.stat_concurrency`: entries of a listing stat'ed at once on a slow store.
    pub store_stat_concurrency: usize,
    /// `store.names_first`: directories listed for names first (docs/tunables.md).
    pub store_names_first: tierfs_store::NamesFirst,
    pub fs: FsConfig,
    pub fuse: FuseConfig,
    pub ssd: SsdConfig,
    /// `ssd.enable`: the SSD tier is on unless switched off.
    pub ssd_enable: bool,
    pub wb: WbConfig,
    /// The memory-pressure monitor (`ram.min`, `ram.free_floor`, ...); its `max` is
    /// `fs.ram_max`, see [`Config::pressure_config`].
    pub pressure: PressureConfig,
    /// `ram.pressure`: the monitor sizes the RAM tier unless switched off.
    pub pressure_enable: bool,
    /// Whether ram.min was given (else it follows ram.max down when that is smaller).
    ram_min_set: bool,
    /// `metrics_addr`: where the Prometheus endpoint listens; off by default.
    pub metrics_addr: Option<SocketAddr>,
    /// `s3.endpoint`: the S3-compatible server of an `s3://` store; None = AWS (or
    /// AWS_ENDPOINT_URL).
    pub s3_endpoint: Option<String>,
    /// `s3.region`; None = AWS_REGION, ~/.aws/config, else us-east-1.
    pub s3_region: Option<String>,
    /// `s3.part_size` and `s3.upload_parallel`: how objects are uploaded.
    pub s3_upload: tierfs_s3::UploadConfig,
    /// Whether dirty_soft / journal_size were given (else they follow dirty_hard).
    wb_soft_set: bool,
    wb_journal_set: bool,
    /// Whether writeback.dirty_hard was given (else it follows memory and the cache device).
    wb_hard_set: bool,
    /// Whether writeback.journal_segment was given (else it fits the cache device).
    wb_seg_set: bool,
    attr_ttl_set: bool,
    entry_ttl_set: bool,
}

/// Generic mount options that mount(8) and /etc/fstab pass along; accepted and, where they
/// mean something to a FUSE mount, applied.
const KERNEL_FLAGS: &[&str] = &[
    "nosuid", "suid", "nodev", "dev", "noexec", "exec", "noatime", "atime", "sync", "async",
    "dirsync",
];
const IGNORED: &[&str] = &[
    "defaults",
    "rw",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "nodiratime",
    "diratime",
    "default_permissions",
    "loop",
    "bg",
    "fg",
];

fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|k| k.parse::<u64>().ok())
                })
        })
        .map(|kb| kb * 1024)
        .unwrap_or(4 << 30)
}

impl Default for Config {
    fn default() -> Self {
        let fs = FsConfig {
            // A quarter of RAM: room for the page cache and for the programs that use the data.
            ram_max: total_memory() / 4,
            ..FsConfig::default()
        };
        let fuse = FuseConfig {
            attr_ttl: fs.meta_ttl,
            entry_ttl: fs.meta_ttl,
            ..FuseConfig::default()
        };
        // Dirty data is RAM: an eighth of it, at most 4 GiB, bounds what write-back holds.
        let hard = (total_memory() / 8).clamp(256 << 20, 4 << 30);
        let wb = WbConfig {
            dirty_hard: hard,
            dirty_soft: hard / 4 * 3,
            journal_size: 2 * hard,
            ..WbConfig::default()
        };
        let pressure = PressureConfig {
            max: fs.ram_max,
            // Like ZFS's arc_sys_free, but larger: MemAvailable is read every 100 ms, and a
            // program can fault in several hundred MB in that time.
            free_floor: (total_memory() / 32).clamp(256 << 20, 2 << 30),
            ..PressureConfig::default()
        };
        Config {
            store_identity: Default::default(),
            store_stat_concurrency: tierfs_store::STAT_CONCURRENCY,
            store_names_first: Default::default(),
            fs,
            fuse,
            ssd: SsdConfig::default(),
            ssd_enable: true,
            wb,
            pressure,
            pressure_enable: true,
            ram_min_set: false,
            metrics_addr: None,
            s3_endpoint: None,
            s3_region: None,
            s3_upload: tierfs_s3::UploadConfig::default(),
            wb_soft_set: false,
            wb_journal_set: false,
            wb_hard_set: false,
            wb_seg_set: false,
            attr_ttl_set: false,
            entry_ttl_set: false,
        }
    }
}

/// "4G", "512M", "64k", "1048576" -> bytes (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_lowercase();
            let m: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => bail!("bad size {s:?} (use e.g. 512M, 4G)"),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("bad size {s:?} (use e.g. 512M, 4G)"))?;
    if !n.is_finite() || n < 0.0 {
        bail!("bad size {s:?}");
    }
    let bytes = n * mult as f64;
    if bytes > MAX_SIZE as f64 {
        bail!(
            "size {s:?} is too large (at most {})",
            format_size(MAX_SIZE)
        );
    }
    Ok(bytes as u64)
}

/// The largest size any setting takes (1 PiB): beyond it a value is a typo, and arithmetic on
/// it (a journal twice the dirty limit, a rate times a second) must not overflow.
pub const MAX_SIZE: u64 = 1 << 50;
/// `ram.max` holds at least this many blocks.
pub const RAM_MIN_BLOCKS: u64 = 8;
/// The longest duration any setting takes (a year): beyond it a value is a typo, and adding it
/// to the clock must not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// [`parse_duration`] of a tunable with a smaller bound than [`MAX_DURATION`].
fn parse_duration_upto(s: &str, max: Duration) -> Result<Duration> {
    let d = parse_duration(s)?;
    if d > max {
        bail!("must be at most {}", format_duration(max));
    }
    Ok(d)
}

/// "1s", "500ms", "2m", "1h", "7d", "0", "1.5" (seconds) -> Duration, at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let bad = || anyhow::anyhow!("bad duration {s:?} (use e.g. 500ms, 1s, 5m, 1h, 7d)");
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: f64 = num.trim().parse().map_err(|_| bad())?;
    if !n.is_finite() || n < 0.0 {
        return Err(bad());
    }
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(bad()),
    };
    if secs > MAX_DURATION.as_secs_f64() {
        bail!("duration {s:?} is too long (at most 365d)");
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_bool(s: &str) -> Result<bool> {
    match s.trim() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("bad boolean {s:?} (use true or false)"),
    }
}

fn parse_count(s: &str, min: usize, max: usize) -> Result<usize> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("bad number {s:?}"))?;
    if n < min || n > max {
        bail!("{n} is out of range {min}..={max}");
    }
    Ok(n)
}

/// `auto` (or nothing): None; else the value.
fn auto_or(value: &str) -> Option<String> {
    match value.trim() {
        "" | "auto" => None,
        v => Some(v.to_string()),
    }
}

/// `metrics_addr`: "9100" or ":9100" listen on 127.0.0.1 (metrics are not for the network
/// unless asked); "IP:PORT" or "[IPv6]:PORT" as given; "localhost:PORT"; "off" for none.
pub fn parse_metrics_addr(s: &str) -> Result<Option<SocketAddr>> {
    let t = s.trim();
    if t == "off" || t == "none" {
        return Ok(None);
    }
    let bad = || anyhow::anyhow!("bad address {s:?} (use PORT, :PORT or IP:PORT)");
    let port_only = t.strip_prefix(':').unwrap_or(t);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)));
    }
    if let Some(port) = t.strip_prefix("localhost:") {
        let port = port.parse::<u16>().map_err(|_| bad())?;
        return Ok(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)));
    }
    t.parse::<SocketAddr>().map(Some).map_err(|_| bad())
}

/// Bytes as the parser reads them back: the largest exact unit (64K, 100M, 8G), else bytes.
pub fn format_size(n: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if n != 0 && n.trailing_zeros() >= shift {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// A duration as the parser reads it back: 0, 5m, 1s, 250ms, or seconds with a fraction.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0".into()
    } else if ns.is_multiple_of(3_600_000_000_000) {
        format!("{}h", ns / 3_600_000_000_000)
    } else if ns.is_multiple_of(60_000_000_000) {
        format!("{}m", ns / 60_000_000_000)
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

fn format_bool(b: bool) -> String {
    if b { "on" } else { "off" }.into()
}

impl Config {
    /// Every key [`Config::set`] takes, in the order of docs/tunables.md's tables.
    pub const KEYS: &'static [&'static str] = &[
        "ram.max",
        "ram.min",
        "ram.pressure",
        "ram.free_floor",
        "ram.grow_delay",
        "ram.psi_pct",
        "ram.block_size",
        "meta.ttl",
        "meta.cto",
        "meta.max_entries",
        "fuse.attr_ttl",
        "fuse.entry_ttl",
        "readahead.max",
        "readahead.chunk",
        "readahead.threads",
        "readahead.depth",
        "prefetch.files",
        "prefetch.max_file",
        "fuse.threads",
        "fuse.io_threads",
        "fuse.read_ahead_kb",
        "fuse.direct_write_only",
        "fuse.no_open",
        "allow_other",
        "ro",
        "metrics_addr",
        "s3.endpoint",
        "s3.region",
        "s3.part_size",
        "s3.upload_parallel",
        "ssd.enable",
        "ssd.max_size",
        "ssd.max_fill_pct",
        "ssd.min_free_pct",
        "ssd.write_rate",
        "ssd.write_burst",
        "ssd.segment_size",
        "ssd.cluster_size",
        "ssd.flush_interval",
        "ssd.checkpoint_interval",
        "ssd.cache_data",
        "ssd.cache_meta",
        "writeback.mode",
        "writeback.fsync",
        "writeback.close",
        "writeback.namespace",
        "writeback.namespace_delay",
        "writeback.namespace_quiet",
        "writeback.namespace_threads",
        "writeback.flushers",
        "writeback.dirty_hard",
        "writeback.dirty_soft",
        "writeback.journal_size",
        "writeback.journal_segment",
        "writeback.chunk",
        "writeback.group",
        "writeback.reserve_chunk",
        "store.identity",
        "store.stat_concurrency",
        "store.names_first",
    ];

    /// The value of one tunable, in the form [`Config::set`] takes; None for an unknown key.
    pub fn get(&self, key: &str) -> Option<String> {
        let (fs, ssd, wb, fuse) = (&self.fs, &self.ssd, &self.wb, &self.fuse);
        Some(match key {
            "ram.max" => format_size(fs.ram_max),
            "ram.min" => format_size(self.pressure_config().min),
            "ram.pressure" => format_bool(self.pressure_enable),
            "ram.free_floor" => format_size(self.pressure.free_floor),
            "ram.grow_delay" => format_duration(self.pressure.grow_delay),
            "ram.psi_pct" => self.pressure.psi_pct.to_string(),
            "ram.block_size" => format_size(fs.block_size),
            "meta.ttl" => format_duration(fs.meta_ttl),
            "meta.cto" => format_bool(fs.meta_cto),
            "meta.max_entries" => fs.meta_max_entries.to_string(),
            "fuse.attr_ttl" => format_duration(fuse.attr_ttl),
            "fuse.entry_ttl" => format_duration(fuse.entry_ttl),
            "readahead.max" => format_size(fs.readahead_max),
            "readahead.chunk" => format_size(fs.fetch_chunk),
            "readahead.threads" => fs.readahead_threads.to_string(),
            "readahead.depth" => fs.readahead_depth.to_string(),
            "prefetch.files" => fs.prefetch_files.to_string(),
            "prefetch.max_file" => format_size(fs.prefetch_max_file),
            "fuse.threads" => fuse.threads.to_string(),
            "fuse.io_threads" => fuse.io_threads.to_string(),
            "fuse.read_ahead_kb" => fuse.read_ahead_kb.to_string(),
            "fuse.direct_write_only" => format_bool(fuse.direct_write_only),
            "fuse.no_open" => fs.fuse_no_open.map_or_else(|| "auto".into(), format_bool),
            "allow_other" => format_bool(fuse.allow_other),
            "ro" => format_bool(fuse.read_only),
            "metrics_addr" => self
                .metrics_addr
                .map_or_else(|| "off".into(), |a| a.to_string()),
            "s3.endpoint" => self.s3_endpoint.clone().unwrap_or_else(|| "auto".into()),
            "s3.region" => self.s3_region.clone().unwrap_or_else(|| "auto".into()),
            "s3.part_size" => format_size(self.s3_upload.part_size),
            "s3.upload_parallel" => self.s3_upload.parallel.to_string(),
            "ssd.enable" => format_bool(self.ssd_enable),
            "ssd.max_size" => format_size(ssd.max_size),
            "ssd.max_fill_pct" => ssd.max_fill_pct.to_string(),
            "ssd.min_free_pct" => ssd.min_free_pct.to_string(),
            "ssd.write_rate" => format_size(ssd.write_rate),
            "ssd.write_burst" => format_size(ssd.write_burst),
            "ssd.segment_size" if ssd.segment_size == 0 => "auto".into(),
            "ssd.segment_size" => format_size(ssd.segment_size),
            "ssd.cluster_size" => format_size(ssd.cluster_size),
            "ssd.flush_interval" => format_duration(ssd.flush_interval),
            "ssd.checkpoint_interval" => format_duration(ssd.checkpoint_interval),
            "ssd.cache_data" => format_bool(ssd.cache_data),
            "ssd.cache_meta" => format_bool(ssd.cache_meta),
            "writeback.mode" => match wb.mode {
                WbMode::Through => "through",
                WbMode::Back => "back",
            }
            .into(),
            "writeback.fsync" => match wb.fsync {
                FsyncMode::Backing => "backing",
                FsyncMode::Journal => "journal",
            }
            .into(),
            "writeback.close" => match wb.close {
                CloseMode::Async => "async",
                CloseMode::Flush => "flush",
            }
            .into(),
            "writeback.namespace" => if wb.namespace_back { "back" } else { "sync" }.into(),
            "writeback.namespace_delay" => format_duration(wb.namespace_delay),
            "writeback.namespace_quiet" => format_duration(wb.namespace_quiet),
            "writeback.namespace_threads" => wb.namespace_threads.to_string(),
            "writeback.flushers" => wb.flushers.to_string(),
            "writeback.dirty_hard" => format_size(wb.dirty_hard),
            "writeback.dirty_soft" => format_size(wb.dirty_soft),
            "writeback.journal_size" => format_size(wb.journal_size),
            "writeback.journal_segment" => format_size(wb.journal_segment),
            "writeback.chunk" => format_size(wb.chunk),
            "writeback.group" => format_size(wb.group),
            "writeback.reserve_chunk" => format_size(wb.reserve_chunk),
            "store.identity" => self.store_identity.to_string(),
            "store.stat_concurrency" => self.store_stat_concurrency.to_string(),
            "store.names_first" => self.store_names_first.to_string(),
            _ => return None,
        })
    }

    /// Sets one tunable. Unknown keys are errors: a typo must not be silently ignored.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let r: Result<()> = (|| {
            match key {
                "ram.max" => self.fs.ram_max = parse_size(value)?,
                "ram.min" => {
                    self.pressure.min = parse_size(value)?;
                    self.ram_min_set = true;
                }
                "ram.pressure" => self.pressure_enable = parse_bool(value)?,
                "ram.free_floor" => self.pressure.free_floor = parse_size(value)?,
                "ram.grow_delay" => self.pressure.grow_delay = parse_duration(value)?,
                "ram.psi_pct" => self.pressure.psi_pct = parse_count(value, 0, 100)? as u8,
                "ram.block_size" => {
                    let b = parse_size(value)?;
                    if !b.is_power_of_two() || !(4096..=(16 << 20)).contains(&b) {
                        bail!("must be a power of two from 4K to 16M");
                    }
                    self.fs.block_size = b;
                }
                "meta.ttl" => {
                    self.fs.meta_ttl = parse_duration(value)?;
                    if !self.attr_ttl_set {
                        self.fuse.attr_ttl = self.fs.meta_ttl;
                    }
                    if !self.entry_ttl_set {
                        self.fuse.entry_ttl = self.fs.meta_ttl;
                    }
                }
                "ssd.enable" => self.ssd_enable = parse_bool(value)?,
                "store.stat_concurrency" => {
                    self.store_stat_concurrency = parse_count(value, 1, 256)?
                }
                "store.identity" => {
                    self.store_identity = value.parse().map_err(|e: String| anyhow::anyhow!(e))?
                }
                "store.names_first" => {
                    self.store_names_first =
                        value.parse().map_err(|e: String| anyhow::anyhow!(e))?
                }
                "ssd.max_size" => self.ssd.max_size = parse_size(value)?,
                "ssd.max_fill_pct" => self.ssd.max_fill_pct = parse_count(value, 1, 100)? as u8,
                "ssd.min_free_pct" => self.ssd.min_free_pct = parse_count(value, 0, 99)? as u8,
                "ssd.write_rate" => {
                    self.ssd.write_rate = parse_size(value)?;
                    if self.ssd.write_rate == 0 {
                        bail!("must be positive (ssd.enable=false switches the tier off)");
                    }
                }
                "ssd.write_burst" => self.ssd.write_burst = parse_size(value)?,
                "ssd.segment_size" => {
                    self.ssd.segment_size = match value.trim() {
                        "auto" => 0,
                        v => match parse_size(v)? {
                            0 => bail!("must be a size, or auto"),
                            n => n,
                        },
                    }
                }
                "ssd.cluster_size" => {
                    let c = parse_size(value)?;
                    if !c.is_power_of_two() || !(64 << 10..=64 << 20).contains(&c) {
                        bail!("must be a power of two from 64K to 64M");
                    }
                    self.ssd.cluster_size = c;
                }
                "ssd.flush_interval" => self.ssd.flush_interval = parse_duration(value)?,
                "ssd.checkpoint_interval" => self.ssd.checkpoint_interval = parse_duration(value)?,
                "ssd.cache_data" => self.ssd.cache_data = parse_bool(value)?,
                "ssd.cache_meta" => self.ssd.cache_meta = parse_bool(value)?,
                "meta.cto" => self.fs.meta_cto = parse_bool(value)?,
                "writeback.mode" => {
                    self.wb.mode = match value {
                        "through" => WbMode::Through,
                        "back" => WbMode::Back,
                        _ => bail!("must be through or back"),
                    }
                }
                "writeback.fsync" => {
                    self.wb.fsync = match value {
                        "backing" => FsyncMode::Backing,
                        "journal" => FsyncMode::Journal,
                        _ => bail!("must be backing or journal"),
                    }
                }
                "writeback.close" => {
                    self.wb.close = match value {
                        "async" => CloseMode::Async,
                        "flush" => CloseMode::Flush,
                        _ => bail!("must be async or flush"),
                    }
                }
                "writeback.namespace" => {
                    self.wb.namespace_back = match value {
                        "back" => true,
                        "sync" => false,
                        _ => bail!("must be back or sync"),
                    }
                }
                "writeback.namespace_delay" => {
                    self.wb.namespace_delay = parse_duration_upto(value, Duration::from_secs(3600))?
                }
                "writeback.namespace_quiet" => {
                    self.wb.namespace_quiet = parse_duration_upto(value, Duration::from_secs(3600))?
                }
                "writeback.namespace_threads" => {
                    self.wb.namespace_threads = parse_count(value, 1, 64)?
                }
                "writeback.flushers" => self.wb.flushers = parse_count(value, 1, 64)?,
                "writeback.dirty_hard" => {
                    self.wb.dirty_hard = parse_size(value)?;
                    self.wb_hard_set = true;
                    if self.wb.dirty_hard < 4 << 20 {
                        bail!("must be at least 4M");
                    }
                    if !self.wb_soft_set {
                        self.wb.dirty_soft = self.wb.dirty_hard / 4 * 3;
                    }
                    if !self.wb_journal_set {
                        self.wb.journal_size = (2 * self.wb.dirty_hard).max(256 << 20);
                    }
                }
                "writeback.dirty_soft" => {
                    self.wb.dirty_soft = parse_size(value)?;
                    self.wb_soft_set = true;
                }
                "writeback.journal_size" => {
                    self.wb.journal_size = parse_size(value)?;
                    self.wb_journal_set = true;
                }
                "writeback.journal_segment" => {
                    self.wb.journal_segment = parse_size(value)?;
                    self.wb_seg_set = true;
                    if !(4 << 20..=1 << 30).contains(&self.wb.journal_segment) {
                        bail!("must be from 4M to 1G");
                    }
                }
                "writeback.chunk" => {
                    self.wb.chunk = parse_size(value)?;
                    if !(4096..=(64 << 20)).contains(&self.wb.chunk) {
                        bail!("must be from 4K to 64M");
                    }
                }
                "writeback.group" => {
                    self.wb.group = parse_size(value)?;
                    if self.wb.group == 0 {
                        bail!("must be positive");
                    }
                }
                "writeback.reserve_chunk" => self.wb.reserve_chunk = parse_size(value)?,
                "meta.max_entries" => self.fs.meta_max_entries = parse_count(value, 0, 1 << 32)?,
                "readahead.max" => self.fs.readahead_max = parse_size(value)?,
                "readahead.chunk" => {
                    self.fs.fetch_chunk = parse_size(value)?;
                    if self.fs.fetch_chunk == 0 {
                        bail!("must be at least one block");
                    }
                }
                "readahead.threads" => self.fs.readahead_threads = parse_count(value, 1, 256)?,
                "readahead.depth" => self.fs.readahead_depth = parse_count(value, 1, 64)? as u32,
                "prefetch.files" => self.fs.prefetch_files = parse_count(value, 0, 1024)?,
                "prefetch.max_file" => self.fs.prefetch_max_file = parse_size(value)?,
                "fuse.threads" => self.fuse.threads = parse_count(value, 1, 64)?,
                "fuse.io_threads" => self.fuse.io_threads = parse_count(value, 1, 1024)?,
                "fuse.attr_ttl" => {
                    self.fuse.attr_ttl = parse_duration(value)?;
                    self.attr_ttl_set = true;
                }
                "fuse.entry_ttl" => {
                    self.fuse.entry_ttl = parse_duration(value)?;
                    self.entry_ttl_set = true;
                }
                "fuse.read_ahead_kb" => {
                    self.fuse.read_ahead_kb = parse_count(value, 0, 1 << 20)? as u32
                }
                "fuse.direct_write_only" => self.fuse.direct_write_only = parse_bool(value)?,
                "fuse.no_open" => {
                    self.fs.fuse_no_open = match value.trim() {
                        "auto" => None,
                        v => Some(parse_bool(v)?),
                    }
                }
                "allow_other" => self.fuse.allow_other = parse_bool(value)?,
                "ro" => self.fuse.read_only = parse_bool(value)?,
                "metrics_addr" => self.metrics_addr = parse_metrics_addr(value)?,
                // Checked with the endpoints from the environment and ~/.aws at mount
                // (tierfs_s3::S3Config::resolve).
                "s3.endpoint" => self.s3_endpoint = auto_or(value),
                "s3.region" => self.s3_region = auto_or(value),
                "s3.part_size" => {
                    let n = parse_size(value)?;
                    if !(tierfs_s3::PART_MIN..=(5 << 30)).contains(&n) {
                        bail!("must be from 5M (S3's smallest part) to 5G (its largest)");
                    }
                    self.s3_upload.part_size = n;
                }
                "s3.upload_parallel" => {
                    self.s3_upload.parallel = parse_count(value, 1, 256)? as usize
                }
                _ => bail!("unknown option"),
            }
            Ok(())
        })();
        r.with_context(|| format!("option {key}={value}"))
    }

    /// The monitor's settings: `ram.max` is the RAM tier's cap; `ram.min` follows it down
    /// when it was not given and the cap is below its default.
    pub fn pressure_config(&self) -> PressureConfig {
        let mut p = self.pressure.clone();
        p.max = self.fs.ram_max;
        if !self.ram_min_set {
            p.min = p.min.min(p.max);
        }
        p
    }

    /// Write-back's defaults bounded by the cache dir's filesystem of `device` bytes: the
    /// journal (2x `writeback.dirty_hard`, 6 GiB on a 24 GiB host) takes at most a quarter of
    /// it and the dirty limit half the journal, unless given. Without this a small cache
    /// filesystem could not hold the journal its defaults asked for.
    pub fn fit_writeback_to(&mut self, device: u64) {
        const MIB: u64 = 1 << 20;
        let quarter = device / 4;
        if !self.wb_seg_set {
            // Two segments at least fit in the quarter (4 MiB each at the least).
            self.wb.journal_segment = self
                .wb
                .journal_segment
                .min(quarter / 2 / MIB * MIB)
                .max(4 * MIB);
        }
        let seg = self.wb.journal_segment;
        if !self.wb_journal_set {
            let fit = quarter / seg * seg;
            self.wb.journal_size = self.wb.journal_size.min(fit.max(2 * seg));
        }
        if !self.wb_hard_set {
            self.wb.dirty_hard = self
                .wb
                .dirty_hard
                .min(self.wb.journal_size / 2)
                .max(4 << 20);
            if !self.wb_soft_set {
                self.wb.dirty_soft = self.wb.dirty_hard / 4 * 3;
            }
        }
    }

    /// After [`Config::set`] on a running mount: undoes what it derived for keys fixed at
    /// mount (`writeback.journal_size` follows `writeback.dirty_hard` only when mounting).
    pub fn keep_fixed(&mut self, in_force: &Config) {
        self.wb.journal_size = in_force.wb.journal_size;
        self.wb_journal_set = in_force.wb_journal_set;
    }

    /// Checks what single keys cannot: one line naming the keys at fault.
    pub fn validate(&self) -> Result<()> {
        // The RAM tier must hold a few blocks to serve a read at all (a read-ahead window,
        // blocks being fetched); less is a typo.
        let least = RAM_MIN_BLOCKS * self.fs.block_size;
        if self.fs.ram_max < least {
            bail!(
                "ram.max ({}) must hold at least {RAM_MIN_BLOCKS} blocks of ram.block_size ({}): {} or more",
                format_size(self.fs.ram_max),
                format_size(self.fs.block_size),
                format_size(least)
            );
        }
        if self.ssd.write_burst < self.ssd.cluster_size {
            bail!(
                "ssd.write_burst ({}) must hold at least one cluster (ssd.cluster_size = {})",
                format_size(self.ssd.write_burst),
                format_size(self.ssd.cluster_size)
            );
        }
        let p = self.pressure_config();
        if p.min > p.max {
            bail!("ram.min ({}) must not exceed ram.max ({})", p.min, p.max);
        }
        if self.fs.fuse_no_open == Some(true) && self.fs.meta_cto {
            bail!("fuse.no_open=on needs meta.cto=off: close-to-open checks the store at every open, which no-open would skip");
        }
        let w = &self.wb;
        if w.dirty_soft >= w.dirty_hard {
            bail!(
                "writeback.dirty_soft ({}) must be below writeback.dirty_hard ({})",
                w.dirty_soft,
                w.dirty_hard
            );
        }
        if w.journal_size < 2 * w.journal_segment {
            bail!(
                "writeback.journal_size ({}) must hold at least two segments (writeback.journal_segment = {})",
                w.journal_size,
                w.journal_segment
            );
        }
        Ok(())
    }

    /// Applies one `-o` element: `key=value`, a bare flag, or a generic mount option.
    pub fn apply_mount_option(&mut self, opt: &str) -> Result<()> {
        let opt = opt.trim();
        if opt.is_empty()
            || IGNORED.contains(&opt)
            || opt.starts_with("x-")
            || opt.starts_with("comment=")
        {
            return Ok(());
        }
        match opt {
            "allow_other" => return self.set("allow_other", "true"),
            "ro" => return self.set("ro", "true"),
            _ => {}
        }
        if KERNEL_FLAGS.contains(&opt) {
            self.fuse.flags.push(opt.to_string());
            return Ok(());
        }
        if let Some(name) = opt.strip_prefix("fsname=") {
            self.fuse.fsname = name.to_string();
            return Ok(());
        }
        match opt.split_once('=') {
            Some((k, v)) => self.set(k.trim(), v.trim()),
            None => {
                bail!("unknown mount option {opt:?} (tunables are key=value, see docs/tunables.md)")
            }
        }
    }

    /// Reads a TOML file: tables name the tunable's group, e.g. `[ram] max = "4G"`.
    pub fn load_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("config file {}", path.display()))?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            // toml's message may span lines ("invalid table header\nexpected ..."): the user
            // gets one line, with the line number the error is on.
            let line = e
                .span()
                .map(|sp| format!(" (line {})", text[..sp.start].matches('\n').count() + 1))
                .unwrap_or_default();
            let msg: Vec<&str> = e.message().lines().map(str::trim).collect();
            anyhow::anyhow!("config file {}: {}{line}", path.display(), msg.join(", "))
        })?;
        let mut flat = Vec::new();
        flatten("", &toml::Value::Table(table), &mut flat)
            .with_context(|| format!("config file {}", path.display()))?;
        for (k, v) in flat {
            self.set(&k, &v)
                .with_context(|| format!("config file {}", path.display()))?;
        }
        Ok(())
    }
}

fn flatten(prefix: &str, v: &toml::Value, out: &mut Vec<(String, String)>) -> Result<()> {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out)?;
            }
        }
        toml::Value::String(s) => out.push((prefix.to_string(), s.clone())),
        toml::Value::Integer(i) => out.push((prefix.to_string(), i.to_string())),
        toml::Value::Float(f) => out.push((prefix.to_string(), f.to_string())),
        toml::Value::Boolean(b) => out.push((prefix.to_string(), b.to_string())),
        _ => bail!("{prefix}: unsupported value (use a string, number or boolean)"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert!(parse_duration("18446744073709551615").is_err());
        assert!(parse_duration("366d").is_err());
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("1P").is_err());
        let refused = |k: &str, v: &str| {
            let mut c = Config::default();
            c.set(k, v).and_then(|_| c.validate()).is_err()
        };
        assert!(refused("ram.max", "0"));
        assert!(refused("ram.max", "1K"));
        assert!(refused("ssd.write_burst", "0"));
        assert!(!refused("ram.max", "512K"));
        let mut c = Config::default();
        c.set("ram.block_size", "8K").unwrap();
        c.set("ram.max", "64K").unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn every_key_reads_back_as_it_is_set() {
        let mut c = Config::default();
        for k in Config::KEYS {
            let v = c.get(k).unwrap_or_else(|| panic!("no value for {k}"));
            c.set(k, &v).unwrap_or_else(|e| panic!("{k}={v}: {e:#}"));
            assert_eq!(c.get(k).as_deref(), Some(v.as_str()), "{k}");
        }
        assert_eq!(c.get("ram.maxx"), None);
        assert_eq!(format_size(3 << 19), "1536K");
        assert_eq!(format_size(100 << 20), "100M");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(
            parse_duration(&format_duration(Duration::from_micros(1500))).unwrap(),
            Duration::from_micros(1500)
        );
    }

    /// Config::KEYS, what `set` takes and docs/tunables.md name the same keys.
    #[test]
    fn keys_are_the_documented_ones() {
        let docs = include_str!("../../../docs/tunables.md");
        let documented: Vec<&str> = docs
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .collect();
        let mut a = documented.clone();
        let mut b = Config::KEYS.to_vec();
        a.sort();
        b.sort();
        assert_eq!(a, b, "docs/tunables.md vs Config::KEYS");
        let mut c = Config::default();
        for k in documented {
            let v = c.get(k).unwrap();
            assert!(c.set(k, &v).is_ok(), "set does not take {k}");
        }
    }

    #[test]
    fn metrics_addresses() {
        let local = |p| Some(SocketAddr::from(([127, 0, 0, 1], p)));
        assert_eq!(parse_metrics_addr("9100").unwrap(), local(9100));
        assert_eq!(parse_metrics_addr(":9100").unwrap(), local(9100));
        assert_eq!(parse_metrics_addr("localhost:9100").unwrap(), local(9100));
        assert_eq!(
            parse_metrics_addr("0.0.0.0:9100").unwrap(),
            Some(SocketAddr::from(([0, 0, 0, 0], 9100)))
        );
        assert!(parse_metrics_addr("[::1]:9100").unwrap().is_some());
        assert_eq!(parse_metrics_addr("off").unwrap(), None);
        assert!(parse_metrics_addr("example.com:80").is_err());
        assert!(parse_metrics_addr("99999").is_err());
    }

    #[test]
    fn options_and_files() {
        let mut c = Config::default();
        c.apply_mount_option("ram.max=2G").unwrap();
        c.apply_mount_option("meta.ttl=5s").unwrap();
        c.apply_mount_option("defaults").unwrap();
        c.apply_mount_option("x-systemd.automount").unwrap();
        c.apply_mount_option("nosuid").unwrap();
        assert_eq!(c.fs.ram_max, 2 << 30);
        assert_eq!(c.fuse.attr_ttl, Duration::from_secs(5));
        // ram.min follows a small ram.max down unless given; given above it, it is an error.
        c.apply_mount_option("ram.max=32M").unwrap();
        assert_eq!(c.pressure_config().min, 32 << 20);
        c.validate().unwrap();
        c.apply_mount_option("ram.min=48M").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("ram.min") && e.contains("ram.max"), "{e}");
        c.apply_mount_option("ram.max=2G").unwrap();
        c.apply_mount_option("ram.free_floor=1G").unwrap();
        c.apply_mount_option("ram.grow_delay=2s").unwrap();
        c.apply_mount_option("ram.psi_pct=0").unwrap();
        c.apply_mount_option("ram.pressure=off").unwrap();
        let p = c.pressure_config();
        assert_eq!((p.min, p.max, p.free_floor), (48 << 20, 2 << 30, 1 << 30));
        assert_eq!((p.grow_delay, p.psi_pct), (Duration::from_secs(2), 0));
        assert!(!c.pressure_enable);
        assert!(c.apply_mount_option("ram.psi_pct=101").is_err());
        assert!(c.apply_mount_option("ram.maxx=1G").is_err());
        assert!(c.apply_mount_option("bogus").is_err());
        assert!(c.apply_mount_option("ram.block_size=3000").is_err());

        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.toml");
        std::fs::write(
            &f,
            "[ram]\nmax = \"1G\"\nblock_size = 131072\n[meta]\nttl = \"3s\"\n",
        )
        .unwrap();
        c.load_file(&f).unwrap();
        assert_eq!((c.fs.ram_max, c.fs.block_size), (1 << 30, 131072));
        std::fs::write(&f, "[ram\nmax=").unwrap();
        assert!(c.load_file(&f).is_err());
        std::fs::write(&f, "[ram]\nmaks = 1\n").unwrap();
        let e = format!("{:#}", c.load_file(&f).unwrap_err());
        assert!(e.contains("ram.maks"), "{e}");
    }
}
