//! A real sshd on 127.0.0.1 serving a temporary directory through OpenSSH's sftp-server, with
//! keys generated for the test and an ssh_config for its clients (so nothing of the user's
//! ~/.ssh is read or written). Used by `sshfs` (sshfs as tierfs's store) and by tests/sftp.rs
//! (tierfs's own sftp store). scripts/deps installs openssh-server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Sshd {
    pub dir: tempfile::TempDir,
    /// What sshd serves (a change here is a change behind the client's back).
    pub served: PathBuf,
    pub port: u16,
    child: Option<Child>,
}

pub fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn log_of(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The login name to use: root runs the suite; anyone else logs in as themselves.
pub fn user() -> String {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        "root".to_string()
    } else {
        std::env::var("USER").unwrap_or_else(|_| "root".into())
    }
}

impl Sshd {
    /// Keys made, sshd listening on a free port of 127.0.0.1.
    pub fn start() -> Sshd {
        let dir = tempfile::Builder::new()
            .prefix("tierfs-sshd-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let d = dir.path().to_path_buf();
        let served = d.join("served");
        std::fs::create_dir(&served).unwrap();
        for k in ["host_key", "client_key"] {
            run_ok(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                    .arg(d.join(k)),
            );
        }
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).unwrap();
        let client = [
            "Host *".to_string(),
            format!("  IdentityFile {}", d.join("client_key").display()),
            "  IdentitiesOnly yes".into(),
            "  StrictHostKeyChecking no".into(),
            "  UserKnownHostsFile /dev/null".into(),
            "  LogLevel ERROR".into(),
        ]
        .join("\n");
        std::fs::write(d.join("ssh_config"), client + "\n").unwrap();
        let mut s = Sshd {
            dir,
            served,
            port: 0,
            child: None,
        };
        // A free port, given up again for sshd to take: another test's socket can take it
        // in between (sshd then fails to bind); a few tries with new ports.
        for attempt in 1.. {
            s.port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            s.configure();
            match s.try_listen() {
                Ok(()) => break,
                Err(e) if attempt < 5 => eprintln!("sshd: {e}; another port"),
                Err(e) => panic!("sshd: {e}"),
            }
        }
        s
    }

    /// sshd_config for `self.port`.
    fn configure(&self) {
        let d = self.dir.path();
        let port = self.port;
        let conf = [
            "ListenAddress 127.0.0.1".to_string(),
            format!("Port {port}"),
            format!("HostKey {}", d.join("host_key").display()),
            "PidFile none".into(),
            format!("AuthorizedKeysFile {}", d.join("authorized_keys").display()),
            "PermitRootLogin prohibit-password".into(),
            "PasswordAuthentication no".into(),
            "KbdInteractiveAuthentication no".into(),
            "UsePAM no".into(),
            // The temporary directory's modes are not sshd's business here.
            "StrictModes no".into(),
            "UseDNS no".into(),
            "Subsystem sftp /usr/lib/openssh/sftp-server".into(),
        ]
        .join("\n");
        std::fs::write(d.join("sshd_config"), conf + "\n").unwrap();
    }

    /// sshd (again) on the same port.
    pub fn listen(&mut self) {
        if let Err(e) = self.try_listen() {
            panic!("sshd: {e}");
        }
    }

    /// Starts sshd on `self.port` and waits until its log says it listens there (a TCP
    /// connect alone could reach another test's socket that took the port: the sftp store's
    /// mount then met "Connection refused"). Err: sshd exited (its log).
    fn try_listen(&mut self) -> Result<(), String> {
        let d = self.dir.path();
        let log_path = d.join("sshd.log");
        let seen = log_of(&log_path).len();
        // sshd's privilege separation directory (a boot-time directory, absent in a fresh
        // container).
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("sshd.log"))
            .unwrap();
        let mut sshd = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("/usr/sbin/sshd (scripts/deps installs openssh-server)");
        let deadline = Instant::now() + Duration::from_secs(20);
        let listening = format!("Server listening on 127.0.0.1 port {}.", self.port);
        loop {
            let log = log_of(&log_path);
            if log.get(seen..).is_some_and(|new| new.contains(&listening)) {
                break;
            }
            if let Ok(Some(st)) = sshd.try_wait() {
                return Err(format!("exited ({st}): {}", log.get(seen..).unwrap_or("")));
            }
            assert!(
                Instant::now() < deadline,
                "sshd not listening after 20 s: {log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(sshd);
        Ok(())
    }

    /// The listening sshd stopped: no new connection is accepted (sessions already open,
    /// each a process of its own, go on).
    pub fn stop_listening(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client_key")
    }

    /// The ssh_config file for this server's clients (its key, no host key checks).
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.path().join("ssh_config")
    }

    /// `sftp://USER@127.0.0.1:PORT/<served>/rel` (`rel` "" for the served directory).
    pub fn url(&self, rel: &str) -> String {
        let p = self.served.join(rel);
        let p = p.to_str().unwrap().trim_end_matches('/');
        format!("sftp://{}@127.0.0.1:{}{p}", user(), self.port)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop_listening();
    }
}
