//! Tunables on a running mount: `tierfs ctl MOUNTPOINT get [KEY...]` and `set KEY=VALUE...`.
//!
//! A value is parsed and checked by the same code as `-o` ([`Config::set`] on a copy of the
//! configuration in force, then [`Config::validate`]), and then pushed into the mount by the
//! key's entry in [`SETTABLE`]. Making one more key settable is one entry there (plus the
//! atomic it writes, where the mount reads the tunable). Every other key is refused with the
//! reason from [`fixed_reason`].

use crate::any_store::AnyStore;
use crate::config::Config;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::Arc;
use tierfs_fs::Fs;
use tierfs_fuse::KernelTtls;

/// What a settable tunable is pushed into.
pub struct Mount {
    pub fs: Arc<Fs<AnyStore>>,
    pub ttls: Arc<KernelTtls>,
}

/// What must exist on the mount for a key to mean something.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    Nothing,
    Ssd,
    Writeback,
}

/// A tunable `set` may change: `apply` pushes the field(s) of the new configuration into the
/// running mount. It runs only once the whole new configuration is valid.
pub struct Settable {
    pub key: &'static str,
    pub needs: Needs,
    pub apply: fn(&Mount, &Config) -> Result<(), String>,
}

fn ssd(m: &Mount) -> &tierfs_fs::SsdCache {
    m.fs.ssd().expect("checked by Needs::Ssd")
}

fn dirty_limits(m: &Mount, c: &Config) -> Result<(), String> {
    m.fs.set_dirty_limits(c.wb.dirty_soft, c.wb.dirty_hard)
}

fn prefetch(m: &Mount, c: &Config) -> Result<(), String> {
    m.fs.set_prefetch(c.fs.prefetch_files, c.fs.prefetch_max_file);
    Ok(())
}

/// The kernel TTLs follow `meta.ttl` unless they were set themselves (as at mount).
fn ttls(m: &Mount, c: &Config) -> Result<(), String> {
    m.fs.set_meta_ttl(c.fs.meta_ttl);
    m.fs.set_meta_ttl_min(c.fs.ttl_min_setting());
    m.ttls.attr.set(c.fuse.attr_ttl);
    m.ttls.entry.set(c.fuse.entry_ttl);
    Ok(())
}

pub const SETTABLE: &[Settable] = &[
    Settable {
        key: "ram.max",
        needs: Needs::Nothing,
        apply: |m, c| {
            m.fs.set_ram_max(c.fs.ram_max);
            Ok(())
        },
    },
    Settable {
        key: "ram.min",
        needs: Needs::Nothing,
        // The monitor's lower bound; with `ram.pressure=off` there is none to move.
        apply: |m, c| match m.fs.pressure() {
            Some(p) => p
                .set_limits(Some(c.pressure_config().min), None)
                .map(|_| ()),
            None => Ok(()),
        },
    },
    Settable {
        key: "meta.ttl",
        needs: Needs::Nothing,
        apply: ttls,
    },
    Settable {
        key: "meta.ttl_min",
        needs: Needs::Nothing,
        apply: ttls,
    },
    Settable {
        key: "meta.max_entries",
        needs: Needs::Nothing,
        apply: |m, c| {
            m.fs.set_meta_max_entries(c.fs.meta_max_entries);
            Ok(())
        },
    },
    Settable {
        key: "fuse.attr_ttl",
        needs: Needs::Nothing,
        apply: ttls,
    },
    Settable {
        key: "fuse.entry_ttl",
        needs: Needs::Nothing,
        apply: ttls,
    },
    Settable {
        key: "readahead.max",
        needs: Needs::Nothing,
        apply: |m, c| {
            m.fs.set_readahead_max(c.fs.readahead_max);
            Ok(())
        },
    },
    Settable {
        key: "prefetch.files",
        needs: Needs::Nothing,
        apply: prefetch,
    },
    Settable {
        key: "prefetch.max_file",
        needs: Needs::Nothing,
        apply: prefetch,
    },
    Settable {
        key: "ssd.write_rate",
        needs: Needs::Ssd,
        apply: |m, c| {
            ssd(m).set_write_rate(c.ssd.write_rate);
            Ok(())
        },
    },
    Settable {
        key: "ssd.write_burst",
        needs: Needs::Ssd,
        apply: |m, c| {
            ssd(m).set_write_burst(c.ssd.write_burst);
            Ok(())
        },
    },
    Settable {
        key: "ssd.cache_data",
        needs: Needs::Ssd,
        apply: |m, c| {
            ssd(m).set_admission(c.ssd.cache_data, c.ssd.cache_meta);
            Ok(())
        },
    },
    Settable {
        key: "ssd.cache_meta",
        needs: Needs::Ssd,
        apply: |m, c| {
            ssd(m).set_admission(c.ssd.cache_data, c.ssd.cache_meta);
            Ok(())
        },
    },
    Settable {
        key: "writeback.fsync",
        needs: Needs::Writeback,
        apply: |m, c| m.fs.set_fsync_mode(c.wb.fsync),
    },
    Settable {
        key: "writeback.close",
        needs: Needs::Writeback,
        apply: |m, c| m.fs.set_close_mode(c.wb.close),
    },
    Settable {
        key: "writeback.flushers",
        needs: Needs::Writeback,
        apply: |m, c| m.fs.set_flushers(c.wb.flushers),
    },
    Settable {
        key: "writeback.dirty_hard",
        needs: Needs::Writeback,
        apply: dirty_limits,
    },
    Settable {
        key: "writeback.dirty_soft",
        needs: Needs::Writeback,
        apply: dirty_limits,
    },
];

/// Why a key cannot be changed on a running mount.
pub fn fixed_reason(key: &str) -> &'static str {
    match key {
        "ram.block_size" => "requires remount: the block size keys every cached block and is part of the SSD tier's identity",
        "meta.cto" => "requires remount: with it off the kernel is told once that opens need no reply (FUSE no-open), and it never asks again",
        "readahead.threads" => "requires remount: the read-ahead thread pool is started at mount",
        "fuse.threads" => "requires remount: fuser's worker threads, each with its own /dev/fuse descriptor, are started at mount",
        "fuse.io_threads" => "requires remount: the I/O thread pool is started at mount",
        "fuse.read_ahead_kb" => "requires remount: it is set on the mount's kernel device when mounting",
        "fuse.no_open" => "requires remount: the kernel is told once, at the first open, that opens need no reply, and it never asks again",
        "fuse.direct_write_only" => "requires remount: each open file keeps the I/O mode it was opened with, so a mount's handles follow one rule",
        "allow_other" | "ro" => "requires remount: it is a kernel mount option",
        "metrics_addr" => "requires remount: the metrics listener is bound at mount",
        "ssd.enable" => "requires remount: the SSD tier is opened, and its index rebuilt, at mount",
        "ssd.max_size" | "ssd.max_fill_pct" | "ssd.min_free_pct" => {
            "requires remount: the SSD tier's capacity is computed when it is opened"
        }
        "ssd.segment_size" => "requires remount: segment size is part of the on-disk layout",
        "ssd.cluster_size" => "requires remount: the SSD writer's cluster buffers are sized when the tier opens, and a cluster bounds the largest entry",
        "writeback.mode" => "requires remount: switching between write-through and write-back opens or drains the journal",
        "writeback.journal_size" | "writeback.journal_segment" => {
            "requires remount: the journal's capacity and segment size are fixed when it is opened (on-disk layout)"
        }
        k if k.starts_with("sftp.") => "requires remount: the sftp connection is made with it at mount",
        k if k == "shared" || k.starts_with("shared.") => {
            "requires remount: the shared tier's bucket and chunk names are fixed when it is opened at mount"
        }
        _ => "requires remount: fixed when the mount starts (not settable at run time yet)",
    }
}

fn settable(key: &str) -> Option<&'static Settable> {
    SETTABLE.iter().find(|s| s.key == key)
}

/// The tunables of one mount: the configuration in force, and where to push changes.
pub struct Tunables {
    mount: Mount,
    config: Mutex<Config>,
}

impl Tunables {
    pub fn new(mount: Mount, config: Config) -> Tunables {
        Tunables {
            mount,
            config: Mutex::new(config),
        }
    }

    fn unknown(key: &str) -> String {
        format!("unknown tunable {key:?} (`tierfs ctl MOUNTPOINT get` lists them)")
    }

    fn describe(c: &Config, key: &str) -> Value {
        let value = c.get(key).unwrap_or_default();
        match settable(key) {
            Some(_) => json!({ "key": key, "value": value, "settable": true }),
            None => json!({
                "key": key, "value": value, "settable": false, "reason": fixed_reason(key)
            }),
        }
    }

    /// `get [KEY...]`: the named tunables (all without a key), with their values in force
    /// and whether `set` may change them.
    pub fn get(&self, keys: &[String]) -> Result<Value, String> {
        let c = self.config.lock();
        let list: Vec<Value> = if keys.is_empty() {
            Config::KEYS.iter().map(|k| Self::describe(&c, k)).collect()
        } else {
            let mut v = Vec::new();
            for k in keys {
                if !Config::KEYS.contains(&k.as_str()) {
                    return Err(Self::unknown(k));
                }
                v.push(Self::describe(&c, k));
            }
            v
        };
        Ok(json!({ "tunables": list }))
    }

    /// `set KEY=VALUE...`: all parsed and checked together (so dirty_soft and dirty_hard can
    /// move past each other in one request), then applied in order. Nothing is applied if
    /// any is refused.
    pub fn set(&self, assignments: &[String]) -> Result<Value, String> {
        if assignments.is_empty() {
            return Err("set: nothing to set (give KEY=VALUE)".into());
        }
        let mut cur = self.config.lock();
        let mut next = cur.clone();
        let mut keys: Vec<&'static Settable> = Vec::new();
        for a in assignments {
            let Some((key, value)) = a.split_once('=') else {
                return Err(format!("set: {a:?} is not KEY=VALUE"));
            };
            let (key, value) = (key.trim(), value.trim());
            if !Config::KEYS.contains(&key) {
                return Err(Self::unknown(key));
            }
            let Some(s) = settable(key) else {
                return Err(format!(
                    "{key} cannot be changed on a running mount: {}",
                    fixed_reason(key)
                ));
            };
            match s.needs {
                Needs::Ssd if self.mount.fs.ssd().is_none() => {
                    return Err(format!(
                        "{key}: this mount has no SSD tier (ssd.enable=off)"
                    ))
                }
                Needs::Writeback if !self.mount.fs.writeback_enabled() => {
                    return Err(format!(
                        "{key}: write-back is off on this mount (writeback.mode=through)"
                    ))
                }
                _ => {}
            }
            next.set(key, value)
                .map_err(|e| format!("bad value {key}={value}: {}", e.root_cause()))?;
            if keys.iter().any(|k| k.key == key) {
                return Err(format!("set: {key} given twice"));
            }
            keys.push(s);
        }
        // Set's defaults that follow other keys must not move a key fixed at mount.
        next.keep_fixed(&cur);
        next.validate().map_err(|e| format!("{e:#}"))?;
        let mut done = Vec::new();
        for s in &keys {
            (s.apply)(&self.mount, &next).map_err(|e| format!("{}: {e}", s.key))?;
            tracing::info!(
                "control: {} set to {} (was {})",
                s.key,
                next.get(s.key).unwrap_or_default(),
                cur.get(s.key).unwrap_or_default()
            );
            done.push(json!({
                "key": s.key,
                "value": next.get(s.key),
                "previous": cur.get(s.key),
            }));
        }
        *cur = next;
        Ok(json!({ "set": done }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value other than the default for every settable key.
    const SAMPLES: &[(&str, &str)] = &[
        ("ram.max", "12M"),
        ("ram.min", "8M"),
        ("meta.ttl", "7s"),
        ("meta.ttl_min", "2s"),
        ("meta.max_entries", "99"),
        ("fuse.attr_ttl", "3s"),
        ("fuse.entry_ttl", "4s"),
        ("readahead.max", "2M"),
        ("prefetch.files", "3"),
        ("prefetch.max_file", "64K"),
        ("ssd.write_rate", "5M"),
        ("ssd.write_burst", "6M"),
        ("ssd.cache_data", "off"),
        ("ssd.cache_meta", "off"),
        ("writeback.fsync", "journal"),
        ("writeback.close", "flush"),
        ("writeback.flushers", "9"),
        ("writeback.dirty_hard", "64M"),
        ("writeback.dirty_soft", "16M"),
    ];

    /// Setting a settable key at run time moves no key that is fixed at mount (which would
    /// then show a value that is not in force).
    #[test]
    fn settable_keys_move_no_fixed_key() {
        for s in SETTABLE {
            assert!(
                SAMPLES.iter().any(|(k, _)| *k == s.key),
                "add a sample value for {}",
                s.key
            );
        }
        let base = Config::default();
        for (key, value) in SAMPLES {
            assert!(settable(key).is_some(), "{key} is not settable");
            let mut next = base.clone();
            next.set(key, value).unwrap();
            next.keep_fixed(&base);
            assert_ne!(next.get(key), base.get(key), "{key}");
            for k in Config::KEYS.iter().filter(|k| settable(k).is_none()) {
                assert_eq!(next.get(k), base.get(k), "setting {key} moved {k}");
            }
        }
    }

    /// The `ctl set` column of docs/tunables.md says which keys are settable.
    #[test]
    fn docs_mark_the_settable_keys() {
        let docs = include_str!("../../../docs/tunables.md");
        for line in docs.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split(" | ").collect();
            let key = cells[0].trim_start_matches("| `").trim_end_matches('`');
            let marked = cells[3] == "yes";
            assert_eq!(
                marked,
                settable(key).is_some(),
                "docs/tunables.md marks {key} {}",
                cells[3]
            );
        }
    }
}
