//! The `sftp.*` tunables (docs/tunables.md, docs/sftp.md): how ssh is run for an sftp://
//! store, how long a request may take, how many may be in flight. Kept apart from
//! `config.rs`, which dispatches every `sftp.` key here.

use crate::config_units::{format_duration, parse_count, parse_duration};
use anyhow::{bail, Result};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct SftpTunables {
    /// `sftp.ssh`: the ssh program.
    pub ssh: String,
    /// `sftp.ssh_config`: an ssh_config file for `ssh -F` (none: ssh's own defaults).
    pub ssh_config: Option<String>,
    /// `sftp.ssh_options`: `-o` options for ssh, separated by `;` (a mount option's value
    /// cannot hold a comma).
    pub ssh_options: Vec<String>,
    /// `sftp.timeout`: how long a request may wait for its answer.
    pub timeout: Duration,
    /// `sftp.max_in_flight`: requests on the connection at once.
    pub max_in_flight: usize,
}

impl Default for SftpTunables {
    fn default() -> Self {
        SftpTunables {
            ssh: "ssh".into(),
            ssh_config: None,
            ssh_options: Vec::new(),
            timeout: tierfs_sftp::DEFAULT_TIMEOUT,
            max_in_flight: tierfs_sftp::DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

impl SftpTunables {
    pub fn get(&self, key: &str) -> Option<String> {
        Some(match key {
            "sftp.ssh" => self.ssh.clone(),
            "sftp.ssh_config" => self.ssh_config.clone().unwrap_or_else(|| "none".into()),
            "sftp.ssh_options" => self.ssh_options.join(";"),
            "sftp.timeout" => format_duration(self.timeout),
            "sftp.max_in_flight" => self.max_in_flight.to_string(),
            _ => return None,
        })
    }

    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "sftp.ssh" if value.trim().is_empty() => bail!("a program is needed"),
            "sftp.ssh" => self.ssh = value.trim().into(),
            "sftp.ssh_config" => {
                self.ssh_config = match value.trim() {
                    "" | "none" => None,
                    v => Some(v.into()),
                }
            }
            "sftp.ssh_options" => {
                self.ssh_options = value
                    .split(';')
                    .map(str::trim)
                    .filter(|o| !o.is_empty())
                    .map(String::from)
                    .collect();
                if let Some(o) = self.ssh_options.iter().find(|o| !o.contains('=')) {
                    bail!("{o:?} is not an ssh option (Key=Value; several separated by ;)");
                }
            }
            "sftp.timeout" => {
                let d = parse_duration(value)?;
                if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d) {
                    bail!("must be from 1s to 1h");
                }
                self.timeout = d;
            }
            "sftp.max_in_flight" => self.max_in_flight = parse_count(value, 1, 4096)?,
            _ => bail!("unknown option"),
        }
        Ok(())
    }

    /// The store's configuration for `url` with these tunables.
    pub fn store_config(&self, url: &str) -> Result<tierfs_sftp::SftpConfig, String> {
        let mut c = tierfs_sftp::SftpConfig::new(tierfs_sftp::SftpUrl::parse(url)?);
        c.ssh = self.ssh.clone();
        c.ssh_config = self.ssh_config.clone();
        c.ssh_options = self.ssh_options.clone();
        c.timeout = self.timeout;
        c.max_in_flight = self.max_in_flight;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let mut t = SftpTunables::default();
        for (k, v) in [
            ("sftp.ssh", "/usr/bin/ssh"),
            ("sftp.ssh_config", "/etc/tierfs/ssh_config"),
            ("sftp.ssh_options", "IdentityFile=/k;Port=2222"),
            ("sftp.timeout", "10s"),
            ("sftp.max_in_flight", "64"),
        ] {
            t.set(k, v).unwrap();
            assert_eq!(t.get(k).unwrap(), v, "{k}");
        }
        assert!(t.set("sftp.timeout", "0s").is_err());
        assert!(t.set("sftp.ssh_options", "IdentityFile").is_err());
        assert!(t.set("sftp.max_in_flight", "0").is_err());
        let c = t.store_config("sftp://u@h/x").unwrap();
        assert_eq!((c.max_in_flight, c.timeout), (64, Duration::from_secs(10)));
        assert!(t.store_config("sftp://").is_err());
    }
}
