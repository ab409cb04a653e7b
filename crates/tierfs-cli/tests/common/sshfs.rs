//! A real network filesystem client as tierfs's store: sshfs (Debian's, default options) to
//! an sshd on 127.0.0.1 that serves a temporary directory through sftp-server. sshfs gives a
//! node of its own to each path and a new inode number once the kernel forgets one, and a new
//! device number at each mount: what FaultStore's renumbering only imitates. No delay is
//! added: tests check behaviour here; bench/ measures speed (with a real round trip).
//! scripts/deps installs sshfs and openssh-server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Sshfs {
    pub dir: tempfile::TempDir,
    /// The server's side: what sshd serves (a change here is a change behind our back).
    pub served: PathBuf,
    /// The sshfs mount: the directory tierfs mounts as its store.
    pub mnt: PathBuf,
    port: u16,
    sshd: Child,
    sshfs: Option<Child>,
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn log_of(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

impl Sshfs {
    /// sshd up on a free port of 127.0.0.1, and sshfs mounted over it.
    pub fn start() -> Sshfs {
        let dir = tempfile::Builder::new()
            .prefix("tierfs-sshfs-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let d = dir.path().to_path_buf();
        let (served, mnt) = (d.join("served"), d.join("sshfs"));
        std::fs::create_dir(&served).unwrap();
        std::fs::create_dir(&mnt).unwrap();
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
        // sshd's privilege separation directory (a boot-time directory, absent in a fresh
        // container).
        let _ = std::fs::create_dir_all("/run/sshd");
        let log = std::fs::File::create(d.join("sshd.log")).unwrap();
        let mut sshd = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("/usr/sbin/sshd (scripts/deps installs openssh-server)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = sshd.try_wait() {
                panic!("sshd exited ({st}): {}", log_of(&d.join("sshd.log")));
            }
            assert!(Instant::now() < deadline, "sshd not listening after 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut s = Sshfs {
            dir,
            served,
            mnt,
            port,
            sshd,
            sshfs: None,
        };
        s.mount();
        s
    }

    /// sshfs mounted (again): empty sshfs caches, a new device number.
    pub fn mount(&mut self) {
        let d = self.dir.path();
        // SAFETY: no preconditions.
        let user = if unsafe { libc::geteuid() } == 0 {
            "root".to_string()
        } else {
            std::env::var("USER").unwrap_or_else(|_| "root".into())
        };
        let log = std::fs::File::create(d.join("sshfs.log")).unwrap();
        let child = Command::new("sshfs")
            .arg("-f")
            .arg("-p")
            .arg(self.port.to_string())
            .arg(format!("{user}@127.0.0.1:{}", self.served.display()))
            .arg(&self.mnt)
            .arg("-o")
            .arg(format!(
                "IdentityFile={},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes",
                d.join("client_key").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("sshfs (scripts/deps installs it)");
        self.sshfs = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.mounted() {
                // The mount shows before sshfs's first answer: wait for the root to answer.
                if std::fs::metadata(&self.mnt).is_ok() {
                    return;
                }
            }
            if let Some(Ok(Some(st))) = self.sshfs.as_mut().map(|c| c.try_wait()) {
                panic!("sshfs exited ({st}): {}", log_of(&d.join("sshfs.log")));
            }
            assert!(Instant::now() < deadline, "sshfs not mounted after 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn mounted(&self) -> bool {
        let mnt = self.mnt.to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() > 2 && f[1] == mnt && f[2] == "fuse.sshfs"
            })
    }

    /// sshfs unmounted (lazily) and stopped; sshd stays.
    pub fn unmount(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .status();
        if let Some(mut c) = self.sshfs.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Sshfs {
    fn drop(&mut self) {
        self.unmount();
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}
