//! `tierfs stats`: the counters of a running mount, like `sysctl vm.swapcache` or arcstats.

use crate::control;
use anyhow::Result;
use std::path::Path;

pub fn run(mountpoint: &Path, json: bool) -> Result<()> {
    let socket = control::socket_for_mount(mountpoint)?;
    let v = control::request(&socket, &["stats"])?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut lines = Vec::new();
    flatten("", &v, &mut lines);
    let ram = &v["ram"];
    let (h, m) = (
        ram["hits"].as_u64().unwrap_or(0),
        ram["misses"].as_u64().unwrap_or(0),
    );
    if h + m > 0 {
        lines.push((
            "ram.hit_ratio".into(),
            format!("{:.4}", h as f64 / (h + m) as f64),
        ));
    }
    let ssd = &v["ssd"];
    let (h, m) = (
        ssd["hits"].as_u64().unwrap_or(0),
        ssd["misses"].as_u64().unwrap_or(0),
    );
    if h + m > 0 {
        lines.push((
            "ssd.hit_ratio".into(),
            format!("{:.4}", h as f64 / (h + m) as f64),
        ));
    }
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, val) in lines {
        println!("tierfs.{k:<width$}  {val}");
    }
    Ok(())
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}
