//! A real network filesystem client as tierfs's store: sshfs (Debian's, default options) to
//! an sshd on 127.0.0.1 that serves a temporary directory through sftp-server. sshfs gives a
//! node of its own to each path and a new inode number once the kernel forgets one, and a new
//! device number at each mount: what FaultStore's renumbering only imitates. No delay is
//! added: tests check behaviour here; bench/ measures speed (with a real round trip).
//! scripts/deps installs sshfs and openssh-server (the server: `common::sshd`).

use super::sshd::{log_of, user, Sshd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Sshfs {
    pub sshd: Sshd,
    /// The server's side: what sshd serves (a change here is a change behind our back).
    pub served: PathBuf,
    /// The sshfs mount: the directory tierfs mounts as its store.
    pub mnt: PathBuf,
    sshfs: Option<Child>,
}

impl Sshfs {
    /// sshd up on a free port of 127.0.0.1, and sshfs mounted over it.
    pub fn start() -> Sshfs {
        let sshd = Sshd::start();
        let mnt = sshd.dir.path().join("sshfs");
        std::fs::create_dir(&mnt).unwrap();
        let mut s = Sshfs {
            served: sshd.served.clone(),
            sshd,
            mnt,
            sshfs: None,
        };
        s.mount();
        s
    }

    /// sshfs mounted (again): empty sshfs caches, a new device number.
    pub fn mount(&mut self) {
        let d = self.sshd.dir.path();
        let user = user();
        let log = std::fs::File::create(d.join("sshfs.log")).unwrap();
        let child = Command::new("sshfs")
            .arg("-f")
            .arg("-p")
            .arg(self.sshd.port.to_string())
            .arg(format!("{user}@127.0.0.1:{}", self.served.display()))
            .arg(&self.mnt)
            .arg("-o")
            .arg(format!(
                "IdentityFile={},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes",
                self.sshd.client_key().display()
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
    }
}
