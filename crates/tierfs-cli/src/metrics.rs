//! The Prometheus endpoint (`--metrics-addr`, off by default): `GET /metrics` answers every
//! number of `tierfs stats` in the Prometheus text format.
//!
//! One source of truth: the metrics are derived from the stats snapshot's JSON form, so a new
//! field of `tierfs stats` appears here by itself. `ram.hits` becomes
//! `tierfs_ram_hits_total` (a counter); the fields listed in [`tierfs_fs::GAUGES`] are gauges
//! without the suffix (`tierfs_ram_bytes`); booleans are 0/1 gauges; strings (the store id,
//! the write-back mode) become labels of `tierfs_info`.

use crate::any_store::AnyStore;
use anyhow::{anyhow, Result};
use serde_json::Value;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use tierfs_fs::{Fs, GAUGES};

fn walk<'a>(path: &mut Vec<&'a str>, v: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                path.push(k);
                walk(path, v, out);
                path.pop();
            }
        }
        Value::Null => {}
        _ => out.push((path.join("."), v)),
    }
}

/// A metric name from a dotted stats path: [a-zA-Z0-9_] only.
fn metric_name(path: &str) -> String {
    let body: String = path
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("tierfs_{body}")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The stats snapshot (as JSON) in the Prometheus text exposition format (version 0.0.4).
pub fn render(stats: &Value) -> String {
    let mut fields = Vec::new();
    walk(&mut Vec::new(), stats, &mut fields);
    let mut out = String::new();
    let mut labels = Vec::new();
    for (path, v) in &fields {
        let (kind, name, value) = match v {
            Value::String(s) => {
                labels.push(format!(
                    "{}=\"{}\"",
                    path.replace('.', "_"),
                    escape_label(s)
                ));
                continue;
            }
            Value::Bool(b) => ("gauge", metric_name(path), u8::from(*b).to_string()),
            Value::Number(n) if GAUGES.contains(&path.as_str()) || path == "sftp.in_flight" => {
                ("gauge", metric_name(path), n.to_string())
            }
            Value::Number(n) => ("counter", metric_name(path) + "_total", n.to_string()),
            _ => continue,
        };
        let _ = writeln!(out, "# HELP {name} {path} (tierfs stats)");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {value}");
    }
    let _ = writeln!(
        out,
        "# HELP tierfs_info The mount's identity (labels), always 1.\n# TYPE tierfs_info gauge\ntierfs_info{{{}}} 1",
        labels.join(",")
    );
    out
}

/// Binds the endpoint (before mounting: a bad or busy address fails the mount) and serves it
/// on a thread. Returns the address bound (port 0 asks for a free one).
pub fn start(addr: SocketAddr, fs: Arc<Fs<AnyStore>>) -> Result<SocketAddr> {
    let server =
        tiny_http::Server::http(addr).map_err(|e| anyhow!("metrics address {addr}: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow!("metrics address {addr}: not an IP listener"))?;
    std::thread::Builder::new()
        .name("tierfs-metrics".into())
        .spawn(move || {
            for rq in server.incoming_requests() {
                let _ = respond(rq, &fs);
            }
        })?;
    Ok(bound)
}

fn respond(rq: tiny_http::Request, fs: &Fs<AnyStore>) -> std::io::Result<()> {
    use tiny_http::{Header, Method, Response};
    let text = |s: String, ctype: &str, code: u16| {
        let h = Header::from_bytes("Content-Type", ctype).expect("valid header");
        Response::from_string(s)
            .with_status_code(code)
            .with_header(h)
    };
    if !matches!(rq.method(), Method::Get | Method::Head) {
        return rq.respond(text("only GET\n".into(), "text/plain", 405));
    }
    let path = rq.url().split('?').next().unwrap_or("");
    match path {
        "/metrics" => {
            let body = serde_json::to_value(fs.stats())
                .map(|mut v| {
                    crate::store_open::add_store_stats(&mut v);
                    render(&v)
                })
                .unwrap_or_else(|e| format!("# stats: {e}\n"));
            rq.respond(text(body, "text/plain; version=0.0.4; charset=utf-8", 200))
        }
        "/" => rq.respond(text(
            "tierfs: metrics at /metrics\n".into(),
            "text/plain",
            200,
        )),
        _ => rq.respond(text("not found: try /metrics\n".into(), "text/plain", 404)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_labels() {
        let v = serde_json::json!({
            "store_id": "a\"b",
            "ram": { "hits": 3, "bytes": 10 },
            "ssd": null,
            "writeback": { "mode": "back", "journal": { "syncs": 2 } },
        });
        let t = render(&v);
        assert!(
            t.contains("# TYPE tierfs_ram_hits_total counter\ntierfs_ram_hits_total 3\n"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE tierfs_ram_bytes gauge\ntierfs_ram_bytes 10\n"),
            "{t}"
        );
        assert!(
            t.contains("tierfs_writeback_journal_syncs_total 2\n"),
            "{t}"
        );
        assert!(
            t.contains("tierfs_info{store_id=\"a\\\"b\",writeback_mode=\"back\"} 1"),
            "{t}"
        );
        assert!(!t.contains("ssd"), "{t}");
    }
}
