//! The `shared` and `shared.*` tunables (docs/tunables.md, docs/shared-tier.md): where the
//! shared tier is, what it names the origin, how large its chunks are and how it is paced.
//! Kept apart from `config.rs`, which dispatches every `shared` key here.

use crate::config_units::{auto_or, format_duration, format_size, parse_duration, parse_size};
use anyhow::{bail, Result};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct SharedTunables {
    /// `shared`: `s3://BUCKET[/PREFIX]` of the tier; None = no shared tier.
    pub url: Option<String>,
    /// `shared.endpoint`, `shared.region`: as `s3.endpoint` and `s3.region`, for the tier.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// `shared.namespace`: the origin's name, the same on every host; None = derived from
    /// the store (see `shared_open::origin_name`).
    pub namespace: Option<String>,
    /// `shared.chunk`: bytes of a file per shared object.
    pub chunk: u64,
    /// `shared.write_rate`: bytes/s of uploads at most (0: no limit).
    pub write_rate: u64,
    /// `shared.queue`: bytes of chunks waiting for upload at most.
    pub queue: u64,
    /// `shared.timeout`: how long one request to the tier may take.
    pub timeout: Duration,
    /// `shared.backoff`: how long the origin is read alone after the tier failed.
    pub backoff: Duration,
}

impl Default for SharedTunables {
    fn default() -> Self {
        SharedTunables {
            url: None,
            endpoint: None,
            region: None,
            namespace: None,
            chunk: 4 << 20,
            write_rate: 100 << 20,
            queue: 64 << 20,
            timeout: Duration::from_secs(2),
            backoff: Duration::from_secs(10),
        }
    }
}

impl SharedTunables {
    pub fn get(&self, key: &str) -> Option<String> {
        let auto = |o: &Option<String>| o.clone().unwrap_or_else(|| "auto".into());
        Some(match key {
            "shared" | "shared.url" => self.url.clone().unwrap_or_else(|| "none".into()),
            "shared.endpoint" => auto(&self.endpoint),
            "shared.region" => auto(&self.region),
            "shared.namespace" => auto(&self.namespace),
            "shared.chunk" => format_size(self.chunk),
            "shared.write_rate" => format_size(self.write_rate),
            "shared.queue" => format_size(self.queue),
            "shared.timeout" => format_duration(self.timeout),
            "shared.backoff" => format_duration(self.backoff),
            _ => return None,
        })
    }

    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            // `shared.url`: the same, as a config file writes it (`[shared]`, `url = ...`: a
            // TOML key cannot be both a value and a table).
            "shared" | "shared.url" => {
                self.url = auto_or(value).filter(|v| v != "none");
                if let Some(u) = &self.url {
                    match tierfs_s3::parse_url(u) {
                        None => bail!("the shared tier is an S3 bucket: s3://BUCKET[/PREFIX]"),
                        Some(Err(e)) => bail!("{e}"),
                        Some(Ok(_)) => {}
                    }
                }
            }
            "shared.endpoint" => self.endpoint = auto_or(value),
            "shared.region" => self.region = auto_or(value),
            "shared.namespace" => self.namespace = auto_or(value),
            "shared.chunk" => {
                let n = parse_size(value)?;
                if !n.is_power_of_two() || !(64 << 10..=64 << 20).contains(&n) {
                    bail!("must be a power of 2 from 64K to 64M");
                }
                self.chunk = n;
            }
            "shared.write_rate" => self.write_rate = parse_size(value)?,
            "shared.queue" => {
                let n = parse_size(value)?;
                if n < self.chunk {
                    bail!("must hold at least one chunk (shared.chunk)");
                }
                self.queue = n;
            }
            "shared.timeout" => {
                let d = parse_duration(value)?;
                if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&d) {
                    bail!("must be from 100ms to 60s");
                }
                self.timeout = d;
            }
            "shared.backoff" => {
                let d = parse_duration(value)?;
                if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d) {
                    bail!("must be from 1s to 1h");
                }
                self.backoff = d;
            }
            _ => bail!("unknown option"),
        }
        Ok(())
    }

    /// The tier's checks against the rest of the configuration.
    pub fn validate(&self, block_size: u64) -> Result<()> {
        if self.url.is_some() && self.chunk < block_size {
            bail!(
                "shared.chunk ({}) must be at least ram.block_size ({})",
                format_size(self.chunk),
                format_size(block_size)
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_bad_values_are_refused() {
        let mut t = SharedTunables::default();
        for (k, v) in [
            ("shared", "s3://fleet-cache/tierfs"),
            ("shared.endpoint", "http://10.0.0.5:8333"),
            ("shared.region", "eu-west-1"),
            ("shared.namespace", "nfs-a:/export/data"),
            ("shared.chunk", "8M"),
            ("shared.write_rate", "50M"),
            ("shared.queue", "128M"),
            ("shared.timeout", "3s"),
            ("shared.backoff", "30s"),
        ] {
            t.set(k, v).unwrap();
            assert_eq!(t.get(k).unwrap(), v, "{k}");
        }
        assert!(t.set("shared", "/srv/cache").is_err());
        assert!(t.set("shared", "s3://A_bad").is_err());
        assert!(t.set("shared.chunk", "3M").is_err());
        assert!(t.set("shared.chunk", "128M").is_err());
        assert!(t.set("shared.queue", "1M").is_err());
        assert!(t.set("shared.timeout", "0s").is_err());
        t.set("shared.url", "s3://other").unwrap();
        assert_eq!(t.get("shared").unwrap(), "s3://other");
        t.set("shared", "none").unwrap();
        assert_eq!(t.get("shared").unwrap(), "none");
        let mut t = SharedTunables::default();
        t.set("shared", "s3://bkt").unwrap();
        t.set("shared.chunk", "64K").unwrap();
        assert!(t.validate(128 << 10).is_err());
        assert!(t.validate(64 << 10).is_ok());
    }
}
