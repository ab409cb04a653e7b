//! The control commands of `tierfs warm` and `tierfs evict`, both ends: the client encodes a
//! request per object, the daemon's control handler passes it to [`handle`].
//!
//! ```text
//! warm budget|nobudget PATH ->  {"ok":true,"size":..,"admitted_blocks":..,"admitted_bytes":..,
//!                               "present_blocks":..,"present_bytes":..,"racy_wait_ms":..}
//! evict PATH                ->  {"ok":true,"ram_blocks":..,"ssd_entries":..,"ssd_bytes":..}
//! any failure               ->  {"error":"one line","fatal":bool}
//! ```
//! PATH is relative to the mount's root ("." for the root), its bytes percent-encoded so that
//! any file name (spaces, newlines, bytes that are not UTF-8) fits on the one command line.
//! `fatal` says the error is about the mount (no SSD tier, device full), not this object.

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use tierfs_fs::{Fs, Store};

/// Percent-encodes a relative path: every byte but `A-Z a-z 0-9 / . _ - ~` becomes `%XX`.
pub fn encode_path(rel: &Path) -> String {
    let b = rel.as_os_str().as_bytes();
    if b.is_empty() {
        return ".".into();
    }
    let mut out = String::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_alphanumeric() || b"/._-~".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// The inverse of [`encode_path`]; None if `s` is not well-formed.
pub fn decode_path(s: &str) -> Option<PathBuf> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

fn error(msg: impl std::fmt::Display, fatal: bool) -> String {
    serde_json::json!({ "error": msg.to_string(), "fatal": fatal }).to_string()
}

fn ok(v: impl serde::Serialize) -> String {
    let mut v = serde_json::to_value(v).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        m.insert("ok".into(), true.into());
    }
    v.to_string()
}

/// Answers a `warm` or `evict` command; None for any other command.
pub fn handle<S: Store>(fs: &Fs<S>, cmd: &str) -> Option<String> {
    let mut words = cmd.split_whitespace();
    let verb = words.next()?;
    if verb != "warm" && verb != "evict" {
        return None;
    }
    // The budget word is always there for warm, so no file name can be taken for it.
    let budget = match (verb, words.next()) {
        ("warm", Some("budget")) => true,
        ("warm", Some("nobudget")) => false,
        ("warm", _) => return Some(error("warm: expected budget or nobudget", false)),
        (_, w) => {
            return Some(match (w, words.next()) {
                (Some(p), None) => evict(fs, p),
                _ => error("evict: expected one path", false),
            })
        }
    };
    let path = match (words.next(), words.next()) {
        (Some(p), None) => Some(p),
        _ => return Some(error("warm: expected one path", false)),
    };
    let Some(rel) = path.and_then(decode_path) else {
        return Some(error("warm: malformed path", false));
    };
    Some(match fs.warm_file(&rel, budget) {
        Ok(r) => ok(r),
        Err(e) => error(format!("{}: {e}", rel.display()), e.fatal()),
    })
}

fn evict<S: Store>(fs: &Fs<S>, path: &str) -> String {
    let Some(rel) = decode_path(path) else {
        return error("evict: malformed path", false);
    };
    match fs.evict_path(&rel) {
        Ok(r) => ok(r),
        Err(e) => error(format!("{}: {e}", rel.display()), false),
    }
}

/// The request line for one object.
pub fn request_line(verb: &str, rel: &Path, budget: bool) -> String {
    let flag = match (verb, budget) {
        ("warm", true) => " budget",
        ("warm", false) => " nobudget",
        _ => "",
    };
    format!("{verb}{flag} {}", encode_path(rel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn paths_round_trip() {
        for p in [
            "a/b c/d",
            "x\ny",
            "100%",
            "nobudget",
            "é",
            "plain/file.txt",
            "~tilde",
        ] {
            let enc = encode_path(Path::new(p));
            assert!(!enc.contains(' ') && !enc.contains('\n'), "{enc}");
            assert_eq!(decode_path(&enc).unwrap(), PathBuf::from(p));
        }
        let raw = OsStr::from_bytes(b"bad\xff\xfename");
        let enc = encode_path(Path::new(raw));
        assert_eq!(decode_path(&enc).unwrap().as_os_str(), raw);
        assert_eq!(encode_path(Path::new("")), ".");
        assert!(decode_path("%4").is_none());
        assert!(decode_path("%zz").is_none());
        assert_eq!(
            request_line("warm", Path::new("a b"), false),
            "warm nobudget a%20b"
        );
        assert_eq!(
            request_line("warm", Path::new("nobudget"), true),
            "warm budget nobudget"
        );
        assert_eq!(request_line("evict", Path::new("a"), false), "evict a");
    }
}
