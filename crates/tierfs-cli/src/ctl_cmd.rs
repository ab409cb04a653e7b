//! `tierfs ctl MOUNTPOINT get [KEY...]` and `tierfs ctl MOUNTPOINT set KEY=VALUE...`: the
//! tunables of a running mount (see runtime.rs for what may change and docs/control.md).

use crate::control;
use anyhow::Result;
use serde_json::Value;
use std::path::Path;

fn s(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

pub fn get(mountpoint: &Path, keys: &[String], json: bool) -> Result<()> {
    let socket = control::socket_for_mount(mountpoint)?;
    let mut words = vec!["get"];
    words.extend(keys.iter().map(String::as_str));
    let v = control::request(&socket, &words)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let list = v["tunables"].as_array().cloned().unwrap_or_default();
    let kw = list.iter().map(|t| s(&t["key"]).len()).max().unwrap_or(0);
    let vw = list.iter().map(|t| s(&t["value"]).len()).max().unwrap_or(0);
    for t in &list {
        let how = if t["settable"] == Value::Bool(true) {
            "settable".to_string()
        } else {
            format!("fixed: {}", s(&t["reason"]))
        };
        println!("{:<kw$}  {:<vw$}  {how}", s(&t["key"]), s(&t["value"]));
    }
    Ok(())
}

pub fn set(mountpoint: &Path, assignments: &[String]) -> Result<()> {
    let socket = control::socket_for_mount(mountpoint)?;
    let mut words = vec!["set"];
    words.extend(assignments.iter().map(String::as_str));
    let v = control::request(&socket, &words)?;
    for t in v["set"].as_array().into_iter().flatten() {
        println!(
            "{} = {} (was {})",
            s(&t["key"]),
            s(&t["value"]),
            s(&t["previous"])
        );
    }
    Ok(())
}
