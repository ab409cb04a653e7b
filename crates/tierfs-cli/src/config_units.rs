//! Values as tunables are written and shown: sizes (`512M`), durations (`5m`), counts,
//! booleans, `auto`, a metrics address; parsed with a one-line error, and formatted so that
//! the parser reads them back. Below `config` and `config_sftp`, which both use them.

use anyhow::{bail, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

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
pub(crate) fn parse_duration_upto(s: &str, max: Duration) -> Result<Duration> {
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

pub(crate) fn parse_bool(s: &str) -> Result<bool> {
    match s.trim() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("bad boolean {s:?} (use true or false)"),
    }
}

pub(crate) fn parse_count(s: &str, min: usize, max: usize) -> Result<usize> {
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
pub(crate) fn auto_or(value: &str) -> Option<String> {
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

pub(crate) fn format_bool(b: bool) -> String {
    if b { "on" } else { "off" }.into()
}
