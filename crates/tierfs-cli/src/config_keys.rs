//! The tunables by key: [`Config::get`] shows one as `-o` writes it, [`Config::set`]
//! parses one (`-o key=value`, a TOML file, `tierfs ctl set`). The struct, its defaults and
//! its validation are in `config`.

use crate::config::*;
use anyhow::{bail, Context, Result};
use std::time::Duration;
use tierfs_fs::{CloseMode, FsyncMode, WbMode};

impl Config {
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
            "meta.ttl_min" => fs.meta_ttl_min.map_or("auto".into(), format_duration),
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
            "store.timeout" => format_duration(fs.store_timeout),
            k if k.starts_with("sftp.") => return self.sftp.get(k),
            k if k == "shared" || k.starts_with("shared.") => return self.shared.get(k),
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
                "meta.ttl_min" => {
                    self.fs.meta_ttl_min = match value {
                        "auto" => None,
                        v => Some(parse_duration(v)?),
                    }
                }
                "ssd.enable" => self.ssd_enable = parse_bool(value)?,
                "store.stat_concurrency" => {
                    self.store_stat_concurrency = parse_count(value, 1, 256)?
                }
                "store.timeout" => self.fs.store_timeout = parse_duration(value)?,
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
                k if k.starts_with("sftp.") => self.sftp.set(k, value)?,
                k if k == "shared" || k.starts_with("shared.") => self.shared.set(k, value)?,
                _ => bail!("unknown option"),
            }
            Ok(())
        })();
        r.with_context(|| format!("option {key}={value}"))
    }
}
