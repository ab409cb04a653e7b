//! The daemon's side of the control socket: a request is a command word and its arguments
//! (docs/control.md). A new command is one arm in [`Daemon::handle`] and its name in
//! [`COMMANDS`].

use crate::any_store::AnyStore;
use crate::control::error;
use crate::runtime::Tunables;
use serde_json::Value;
use std::sync::Arc;
use tierfs_fs::Fs;

/// The commands the daemon knows, for the message about an unknown one.
pub const COMMANDS: &[&str] = &["stats", "get", "set", "warm", "evict", "sync"];

pub struct Daemon {
    pub fs: Arc<Fs<AnyStore>>,
    pub tunables: Tunables,
}

impl Daemon {
    /// Answers one request: the command's JSON answer, or `{"error": "..."}`.
    pub fn handle(&self, words: &[String]) -> Value {
        let Some((cmd, args)) = words.split_first() else {
            return error("empty request");
        };
        let r = match cmd.as_str() {
            "stats" => serde_json::to_value(self.fs.stats())
                .map(|mut v| {
                    crate::store_open::add_store_stats(&mut v);
                    v
                })
                .map_err(|e| e.to_string()),
            "get" => self.tunables.get(args),
            // `tierfs unmount`: every dirty byte to the store, then the answer (no timeout:
            // the client waits as long as the drain takes, showing progress from `stats`).
            "sync" => self
                .fs
                .sync_all()
                .map(|()| serde_json::json!({ "synced": true })),
            "set" => self.tunables.set(args),
            // `tierfs warm` / `tierfs evict`: their own encoding of arguments (cache_cmd.rs).
            "warm" | "evict" => crate::cache_cmd::handle(&*self.fs, &words.join(" "))
                .ok_or_else(|| "unknown command".to_string())
                .and_then(|a| serde_json::from_str(&a).map_err(|e| e.to_string())),
            other => Err(format!(
                "unknown command {other:?} (commands: {})",
                COMMANDS.join(", ")
            )),
        };
        r.unwrap_or_else(error)
    }
}
