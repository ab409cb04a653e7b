//! Tunables: defaults, parsing from a TOML file and from `-o key=value`, validation.
//! Every key is documented in docs/tunables.md with its default, unit and reason.

pub use crate::config_units::*;
use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::Path;
use tierfs_fs::{FsConfig, PressureConfig, SsdConfig, WbConfig};
use tierfs_fuse::FuseConfig;

#[derive(Clone, Debug)]
pub struct Config {
    /// `store.identity`: how the store's objects are identified (docs/architecture/identity.md).
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
    pub(crate) ram_min_set: bool,
    /// `metrics_addr`: where the Prometheus endpoint listens; off by default.
    pub metrics_addr: Option<SocketAddr>,
    /// `s3.endpoint`: the S3-compatible server of an `s3://` store; None = AWS (or
    /// AWS_ENDPOINT_URL).
    pub s3_endpoint: Option<String>,
    /// `s3.region`; None = AWS_REGION, ~/.aws/config, else us-east-1.
    pub s3_region: Option<String>,
    /// `s3.part_size` and `s3.upload_parallel`: how objects are uploaded.
    pub s3_upload: tierfs_s3::UploadConfig,
    /// `sftp.*`: how an sftp:// store runs ssh (crate::config_sftp).
    pub sftp: crate::config_sftp::SftpTunables,
    /// `shared` and `shared.*`: the shared tier (crate::config_shared).
    pub shared: crate::config_shared::SharedTunables,
    /// Whether dirty_soft / journal_size were given (else they follow dirty_hard).
    pub(crate) wb_soft_set: bool,
    pub(crate) wb_journal_set: bool,
    /// Whether writeback.dirty_hard was given (else it follows memory and the cache device).
    pub(crate) wb_hard_set: bool,
    /// Whether writeback.journal_segment was given (else it fits the cache device).
    pub(crate) wb_seg_set: bool,
    pub(crate) attr_ttl_set: bool,
    pub(crate) entry_ttl_set: bool,
    /// The keys given with `-o` (not by a config file), for [`Config::refuse_foreign_options`].
    pub(crate) option_keys: Vec<String>,
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
            sftp: Default::default(),
            shared: Default::default(),
            wb_soft_set: false,
            wb_journal_set: false,
            wb_hard_set: false,
            wb_seg_set: false,
            attr_ttl_set: false,
            option_keys: Vec::new(),
            entry_ttl_set: false,
        }
    }
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
        "meta.ttl_min",
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
        "sftp.ssh",
        "sftp.ssh_config",
        "sftp.ssh_options",
        "sftp.timeout",
        "sftp.max_in_flight",
        "shared",
        "shared.endpoint",
        "shared.region",
        "shared.namespace",
        "shared.chunk",
        "shared.write_rate",
        "shared.queue",
        "shared.timeout",
        "shared.backoff",
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
        "store.timeout",
    ];

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
        self.shared.validate(self.fs.block_size)?;
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
        // More than the host has is a typo (100T for 100G), not a wish: the RAM tier would
        // never be held back by its cap, only by memory pressure.
        let host = total_memory();
        if host > 0 && self.fs.ram_max > host {
            bail!(
                "ram.max ({}) is more than this host's memory ({})",
                format_size(self.fs.ram_max),
                format_size(host)
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
            Some((k, v)) => {
                self.set(k.trim(), v.trim())?;
                self.option_keys.push(k.trim().to_string());
                Ok(())
            }
            None => {
                bail!("unknown mount option {opt:?} (tunables are key=value, see docs/tunables.md)")
            }
        }
    }

    /// Refuses `-o` options of another kind of store than `kind` ("s3", "sftp", or "dir"),
    /// which would be ignored without a word: `-o s3.endpoint=...` with `data/pre` (a
    /// forgotten `s3://`) mounted a directory. Only `-o`: a config file may hold every kind's
    /// settings for all the mounts that read it.
    pub fn refuse_foreign_options(&self, kind: &str) -> Result<()> {
        for k in &self.option_keys {
            let Some((of, _)) = k
                .split_once('.')
                .filter(|(p, _)| matches!(*p, "s3" | "sftp"))
            else {
                continue;
            };
            if of != kind {
                let store = match kind {
                    "dir" => "a directory",
                    "s3" => "an s3:// bucket",
                    _ => "an sftp:// server",
                };
                bail!("option {k} is for {of}:// stores; this store is {store}");
            }
        }
        Ok(())
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
#[path = "config_tests.rs"]
mod tests;
