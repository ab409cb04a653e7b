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
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
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
            port,
            child: None,
        };
        s.listen();
        s
    }

    /// sshd (again) on the same port.
    pub fn listen(&mut self) {
        let d = self.dir.path();
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
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(st)) = sshd.try_wait() {
                panic!("sshd exited ({st}): {}", log_of(&d.join("sshd.log")));
            }
            assert!(Instant::now() < deadline, "sshd not listening after 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(sshd);
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
