//! What an sftp store is made from: the `sftp://[USER@]HOST[:PORT]/PATH` it was given and the
//! `sftp.*` tunables (how ssh is run, how long a request may take, how many may be in flight),
//! and the store id derived from them.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

/// `sftp.timeout`'s default: as long as an S3 request may take (crates/tierfs-s3's
/// `REQUEST_TIMEOUT`). A server that has not answered a request by then is taken as hung: the
/// connection is dropped and the store reconnects (docs/sftp.md).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// `sftp.max_in_flight`'s default: requests on the connection at once. 4 MiB of read-ahead in
/// 255 KiB READs is 17; several streams and a burst of stats fit in 128 with room to spare,
/// and OpenSSH's sftp-server queues what it has not read yet in the ssh channel's window.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 128;

/// `sftp://[USER@]HOST[:PORT]/PATH`, as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SftpUrl {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
    /// The directory served: `/abs/path`, or relative to the login's home directory when the
    /// URL said `/~/path` (`""`: the home directory itself).
    pub path: OsString,
}

impl SftpUrl {
    /// Parses `sftp://[USER@]HOST[:PORT][/PATH]`; `%XX` escapes in PATH are decoded, an IPv6
    /// HOST is written `[::1]`. No PATH (or `/`) is the server's root; `/~` and `/~/PATH` are
    /// the login's home directory and PATH inside it, as curl spells them.
    pub fn parse(url: &str) -> Result<SftpUrl, String> {
        let bad = |why: &str| format!("{url}: {why} (expected sftp://[USER@]HOST[:PORT]/PATH)");
        let rest = url
            .strip_prefix("sftp://")
            .ok_or_else(|| bad("not an sftp:// URL"))?;
        let (auth, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (user, hostport) = match auth.rsplit_once('@') {
            Some((u, h)) if !u.is_empty() => (Some(u.to_string()), h),
            Some(_) => return Err(bad("empty user name")),
            None => (None, auth),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            match after {
                "" => (h, None),
                p => (h, Some(p.strip_prefix(':').ok_or_else(|| bad("bad port"))?)),
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() || host.starts_with('-') {
            return Err(bad("no host"));
        }
        let port = match port {
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("bad port"))?,
            ),
            None => None,
        };
        let path = decode(path).ok_or_else(|| bad("bad %-escape in the path"))?;
        let path = match path.strip_prefix(b"/~") {
            Some(b"") => Vec::new(),
            Some(p) if p.starts_with(b"/") => p[1..].to_vec(),
            _ => path,
        };
        Ok(SftpUrl {
            user,
            host: host.to_string(),
            port,
            path: OsString::from_vec(path),
        })
    }

    /// The URL again, normalised (for the log, and `fsname` in /proc/mounts).
    pub fn display(&self) -> String {
        let mut s = "sftp://".to_string();
        if let Some(u) = &self.user {
            s += u;
            s.push('@');
        }
        if self.host.contains(':') {
            s += &format!("[{}]", self.host);
        } else {
            s += &self.host;
        }
        if let Some(p) = self.port {
            s += &format!(":{p}");
        }
        let p = self.path.to_string_lossy();
        if p.starts_with('/') {
            s += &p;
        } else if p.is_empty() {
            s += "/~";
        } else {
            s += &format!("/~/{p}");
        }
        s
    }

    /// `sftp-USER-HOST-PORT-PATH-HASH`: the same on every host that mounts the same URL, so a
    /// cache directory made on one is recognised on another (the hash covers user, host, port
    /// and path as given; what ~/.ssh/config makes of them is not part of it).
    pub fn store_id(&self) -> String {
        let user = self.user.as_deref().unwrap_or("");
        let port = self.port.map(|p| p.to_string()).unwrap_or_default();
        let path = self.path.to_string_lossy();
        tierfs_store::readable_id(
            &format!("sftp-{user}-{}-{port}-{path}", self.host),
            &format!("sftp\0{user}@{}:{port}/{path}", self.host),
        )
    }
}

/// `%XX` decoded; None for a bad escape.
fn decode(s: &str) -> Option<Vec<u8>> {
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
    Some(out)
}

/// How the store reaches the server (`sftp.*` tunables, docs/tunables.md).
#[derive(Clone, Debug)]
pub struct SftpConfig {
    pub url: SftpUrl,
    /// `sftp.ssh`: the ssh program (default `ssh`, from PATH).
    pub ssh: String,
    /// `sftp.ssh_config`: an ssh_config file given to ssh with `-F` (default: none, so ssh
    /// reads ~/.ssh/config and /etc/ssh/ssh_config as it always does).
    pub ssh_config: Option<String>,
    /// `sftp.ssh_options`: `-o` options for ssh (`Key=Value`), after the store's own.
    pub ssh_options: Vec<String>,
    /// `sftp.timeout`: how long one request may wait for its answer.
    pub timeout: Duration,
    /// `sftp.max_in_flight`: requests on the connection at once.
    pub max_in_flight: usize,
}

impl SftpConfig {
    pub fn new(url: SftpUrl) -> SftpConfig {
        SftpConfig {
            url,
            ssh: "ssh".into(),
            ssh_config: None,
            ssh_options: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// ssh's arguments: the subsystem `sftp` on the server, nothing else (no terminal, no
    /// forwardings, no password prompt: a daemon has no one to ask).
    pub(crate) fn ssh_args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["-x".into(), "-a".into(), "-T".into()];
        if let Some(f) = &self.ssh_config {
            a.extend(["-F".into(), f.clone()]);
        }
        // Options first given win in ssh: the user's sftp.ssh_options go before ours.
        for o in &self.ssh_options {
            a.extend(["-o".into(), o.clone()]);
        }
        let secs = self.timeout.as_secs().clamp(1, 3600);
        for o in [
            "BatchMode=yes".to_string(),
            "ClearAllForwardings=yes".into(),
            format!("ConnectTimeout={}", secs.min(10)),
            // A connection whose peer vanished (a cable, a reboot) is noticed even while no
            // request is waiting, within about the request timeout.
            format!("ServerAliveInterval={}", secs.div_ceil(3).max(1)),
            "ServerAliveCountMax=3".into(),
        ] {
            a.extend(["-o".into(), o]);
        }
        if let Some(p) = self.url.port {
            a.extend(["-p".into(), p.to_string()]);
        }
        if let Some(u) = &self.url.user {
            a.extend(["-l".into(), u.clone()]);
        }
        a.extend([
            "-s".into(),
            "--".into(),
            self.url.host.clone(),
            "sftp".into(),
        ]);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SftpUrl {
        SftpUrl::parse(s).unwrap()
    }

    #[test]
    fn urls() {
        let u = p("sftp://alice@nas.lan:2222/srv/data");
        assert_eq!(u.user.as_deref(), Some("alice"));
        assert_eq!((u.host.as_str(), u.port), ("nas.lan", Some(2222)));
        assert_eq!(u.path, "/srv/data");
        assert_eq!(u.display(), "sftp://alice@nas.lan:2222/srv/data");
        let u = p("sftp://nas");
        assert_eq!(
            (u.user, u.port, u.path.as_os_str()),
            (None, None, "/".as_ref())
        );
        assert_eq!(p("sftp://h/~").path, "");
        assert_eq!(p("sftp://h/~/x/y").path, "x/y");
        assert_eq!(p("sftp://h/~/x").display(), "sftp://h/~/x");
        assert_eq!(p("sftp://h/a%20b").path, "/a b");
        let u = p("sftp://[::1]:22/d");
        assert_eq!((u.host.as_str(), u.port), ("::1", Some(22)));
        assert_eq!(u.display(), "sftp://[::1]:22/d");
        for bad in [
            "s3://x",
            "sftp://",
            "sftp://h:0/",
            "sftp://h:x/",
            "sftp://@h/",
            "sftp://-oProxyCommand=x/",
            "sftp://h/%zz",
        ] {
            assert!(SftpUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn store_ids_are_stable_and_distinct() {
        let a = p("sftp://u@h:22/srv/data").store_id();
        assert!(a.starts_with("sftp-u-h-22-srv-data-"), "{a}");
        assert_eq!(a, p("sftp://u@h:22/srv/data").store_id());
        assert_ne!(a, p("sftp://u@h:23/srv/data").store_id());
        assert_ne!(a, p("sftp://h:22/srv/data").store_id());
    }

    #[test]
    fn ssh_is_asked_for_the_subsystem_only() {
        let mut c = SftpConfig::new(p("sftp://u@h:2/x"));
        c.ssh_config = Some("/t/cfg".into());
        c.ssh_options = vec!["IdentityFile=/k".into()];
        let a = c.ssh_args();
        let s = a.join(" ");
        assert!(
            s.starts_with("-x -a -T -F /t/cfg -o IdentityFile=/k -o BatchMode=yes"),
            "{s}"
        );
        assert!(s.ends_with("-p 2 -l u -s -- h sftp"), "{s}");
    }
}
